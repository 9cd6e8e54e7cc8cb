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
  if (!options.tools_json.empty()) {
    auto tools = parse_json<nlohmann::ordered_json>(options.tools_json, "the tools");
    if (!tools.ok()) return tools.status();
    if (!tools.value().is_array()) return Status::error(StatusCode::InvalidArgument, "the tools must be a JSON list");
    vars["tools"] = std::move(tools.value());
  }
  if (!options.variables_json.empty()) {
    auto more = parse_json<nlohmann::ordered_json>(options.variables_json, "the template variables");
    if (!more.ok()) return more.status();
    if (!more.value().is_object())
      return Status::error(StatusCode::InvalidArgument, "the template variables must be a JSON object (name: value)");
    for (auto& [name, value] : more.value().items()) vars[name] = value;
  }
  return text::render_jinja(template_text, vars);
}

namespace {

nlohmann::ordered_json messages_json(const std::vector<ChatMessage>& messages) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) {
    nlohmann::ordered_json j = {{"role", m.role}, {"content", m.content}};
    if (!m.reasoning.empty()) j["reasoning_content"] = m.reasoning;
    list.push_back(std::move(j));
  }
  return list;
}

std::string dump(const nlohmann::ordered_json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

}  // namespace

Result<std::string> render_chat_template(const std::string& template_text, const std::vector<ChatMessage>& messages,
                                         const ChatTemplateOptions& options) {
  return render_chat_template(template_text, dump(messages_json(messages)), options);
}

Result<std::string> format_chat_prompt(const ModelInfo& model, const std::string& messages_text, ChatTemplateOptions o) {
  if (!model.chat_template.empty()) {
    o.bos_token = model.bos_token;
    o.eos_token = model.eos_token;
    if (model.chat_template.find("<|channel|>") != std::string::npos) {
      // gpt-oss's template reads an assistant's reasoning as `thinking`, and keeps
      // it only before a tool call (as llama.cpp passes reasoning_content to it).
      auto list = parse_json<nlohmann::ordered_json>(messages_text, "the messages");
      if (list.ok() && list.value().is_array()) {
        for (auto& m : list.value())
          if (m.is_object() && m.contains("reasoning_content") && m["reasoning_content"].is_string() && m.contains("tool_calls") &&
              !m.contains("thinking"))
            m["thinking"] = m["reasoning_content"];
        return render_chat_template(model.chat_template, dump(list.value()), o);
      }
    }
    return render_chat_template(model.chat_template, messages_text, o);
  }
  auto parsed = parse_json<nlohmann::ordered_json>(messages_text, "the messages");
  if (!parsed.ok()) return parsed.status();
  if (!parsed.value().is_array())
    return Status::error(StatusCode::InvalidArgument, "the messages must be a JSON list of {\"role\", \"content\"} objects");
  std::string out;
  for (const auto& m : parsed.value()) {
    const std::string role = m.is_object() && m.contains("role") && m["role"].is_string() ? m["role"].get<std::string>() : "";
    const std::string content =
        m.is_object() && m.contains("content") && m["content"].is_string() ? m["content"].get<std::string>() : "";
    if (role == "system") out += "System: " + content + "\n\n";
    else if (role == "assistant") out += "Assistant: " + content + "\n";
    else out += "User: " + content + "\n";
  }
  if (o.add_generation_prompt) out += "Assistant:";
  return out;
}

Result<std::string> format_chat_prompt(const ModelInfo& model, const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  ChatTemplateOptions o;
  o.add_generation_prompt = add_generation_prompt;
  return format_chat_prompt(model, dump(messages_json(messages)), o);
}

}  // namespace atelier
