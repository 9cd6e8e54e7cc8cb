// atelier template render: a chat template applied to a conversation, exactly
// as the engine renders it for a chat job (Hugging Face apply_chat_template
// semantics). Prints the text with nothing added.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "commands/commands.h"
#include "commands/output.h"

namespace atelier::app {

namespace {
struct TemplateOptions {
  std::string template_file, model, store, messages_file;
  bool add_generation_prompt = false;
  std::vector<std::string> vars;
};

Result<std::string> read_file(const std::string& path, const char* what) {
  // A FIFO would block the read until killed; a folder reads as nothing.
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
    return Status::error(StatusCode::InvalidArgument,
                         path + " is not a regular file (a folder, FIFO or device): pass the " + what + " file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error(StatusCode::NotFound, path + ": cannot read the " + what + " file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int render(const TemplateOptions& o) {
  auto messages = read_file(o.messages_file, "messages");
  if (!messages.ok()) return fail(messages.status());
  ChatTemplateOptions options;
  options.add_generation_prompt = o.add_generation_prompt;
  std::string text;
  if (!o.template_file.empty()) {
    auto t = read_file(o.template_file, "template");
    if (!t.ok()) return fail(t.status());
    text = t.value();
  } else {
    auto resolved = resolve_model(o.model, o.store);
    if (!resolved.ok()) return fail(resolved.status());
    auto read = read_model_info(resolved->path, resolved->file("tokenizer"));
    if (!read.ok()) return fail(read.status());
    const ModelInfo& info = read.value();
    if (info.chat_template.empty())
      return fail(Status::error(StatusCode::NotFound, o.model + " has no chat template (GGUF tokenizer.chat_template); pass --template FILE"));
    text = info.chat_template;
    options.bos_token = info.bos_token;
    options.eos_token = info.eos_token;
  }
  for (const std::string& v : o.vars) {
    const size_t eq = v.find('=');
    if (eq == std::string::npos || eq == 0)
      return fail(Status::error(StatusCode::InvalidArgument, "--var " + v + ": expected NAME=VALUE"));
    const std::string name = v.substr(0, eq), value = v.substr(eq + 1);
    if (name == "bos_token") options.bos_token = value;
    else if (name == "eos_token") options.eos_token = value;
    else options.variables.emplace_back(name, value);
  }
  auto out = render_chat_template(text, messages.value(), options);
  if (!out.ok()) {
    std::fprintf(stderr, "atelier: error: %s\n", out.status().message.c_str());
    return 1;
  }
  write_stdout(out.value());
  return 0;
}
}  // namespace

void add_template_commands(CLI::App& root, int& exit_code) {
  CLI::App* tmpl = root.add_subcommand("template", "Chat templates");
  tmpl->require_subcommand(1);
  auto o = std::make_shared<TemplateOptions>();
  CLI::App* r = tmpl->add_subcommand("render", "Print a conversation rendered with a chat template (nothing added)");
  auto* t = r->add_option("--template", o->template_file, "A Jinja chat template file")->check(CLI::ExistingFile);
  auto* m = r->add_option("-m,--model", o->model, "A model whose chat template to use (store reference or file)");
  t->excludes(m);
  r->add_option("--store", o->store, "Model store folder, for -m NAME");
  r->add_option("--messages", o->messages_file, "JSON list of {\"role\", \"content\"} messages")->required();
  r->add_flag("--add-generation-prompt", o->add_generation_prompt, "End with the assistant's turn opening");
  r->add_option("--var", o->vars, "A variable the template sees, NAME=VALUE (bos_token, eos_token, ...)");
  r->callback([o, &exit_code] {
    if (o->template_file.empty() && o->model.empty()) throw CLI::RequiredError("--template or -m");
    exit_code = render(*o);
  });
}

}  // namespace atelier::app
