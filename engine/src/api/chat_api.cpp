// The chat template faces of atelier/models.h over text/chat_template (the Jinja renderer).
#include <atelier/models.h>
#include <atelier/json_input.h>

#include <nlohmann/json.hpp>

#include "text/chat_template.h"

namespace atelier {

Result<std::string> render_chat_template(const std::string& template_text, const std::string& messages_json,
                                         const ChatTemplateOptions& options) {
  auto parsed = parse_json<nlohmann::ordered_json>(messages_json, "the messages");
  if (!parsed.ok()) return parsed.status();
  nlohmann::ordered_json messages = std::move(parsed.value());
  if (!messages.is_array())
    return Status::error(StatusCode::InvalidArgument, "the messages must be a JSON list of {\"role\", \"content\"} objects");
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  vars["messages"] = std::move(messages);
  vars["add_generation_prompt"] = options.add_generation_prompt;
  vars["bos_token"] = options.bos_token;
  vars["eos_token"] = options.eos_token;
  for (const auto& [name, value] : options.variables) vars[name] = value;
  return text::render_jinja(template_text, vars);
}

Result<std::string> render_chat_template(const std::string& template_text, const std::vector<ChatMessage>& messages,
                                         const ChatTemplateOptions& options) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  return render_chat_template(template_text, list.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), options);
}

Result<std::string> format_chat_prompt(const ModelInfo& model, const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  if (!model.chat_template.empty()) {
    ChatTemplateOptions o;
    o.add_generation_prompt = add_generation_prompt;
    o.bos_token = model.bos_token;
    o.eos_token = model.eos_token;
    return render_chat_template(model.chat_template, messages, o);
  }
  std::string out;
  for (const ChatMessage& m : messages) {
    if (m.role == "system") out += "System: " + m.content + "\n\n";
    else if (m.role == "assistant") out += "Assistant: " + m.content + "\n";
    else out += "User: " + m.content + "\n";
  }
  if (add_generation_prompt) out += "Assistant:";
  return out;
}

}  // namespace atelier
