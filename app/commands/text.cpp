// `atelier text` and `atelier tokenize`.
#include <atelier/models.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>

#include "commands/commands.h"
#include "commands/output.h"
#include "commands/request_options.h"

namespace atelier::app {

namespace {

// Flags bind straight into the engine's request values, so the defaults are the engine's.
struct TextOptions {
  TextRequest req;
  TextModelOptions model;
  bool echo = false;
  bool json = false;
  bool no_bos = false;
  std::string store;
  DeviceOptions device;
};

void add_model_options(CLI::App& cmd, std::string& model, std::string& tokenizer, std::string& store) {
  cmd.add_option("-m,--model", model,
                 "Model: a store reference (NAME, NAME@VERSION, NAME:CHANNEL, sha256:DIGEST) or a file (GGUF, llama2.c .bin)")
      ->required();
  cmd.add_option("--tokenizer", tokenizer, "llama2.c tokenizer file (default: the store version's tokenizer, else tokenizer.bin or tok512.bin beside the model)");
  cmd.add_option("--store", store, "Model store folder (default: $ATELIER_HOME, else $XDG_DATA_HOME/atelier, else ~/.local/share/atelier)");
}

int run_text(const TextOptions& o) {
  TextModelOptions mo = o.model;
  // The device before any work: a GPU named outright but missing is an error.
  auto dev = select_device(o.device.device, o.device.precision, mo.kv_type);
  if (!dev.ok()) return fail(dev.status());
  DeviceSelection where = dev.value();
  mo.device = where.name;
  ResolveOptions ro;
  ro.check_digest = true;  // refuse a damaged store blob before loading it
  auto resolved = resolve_model(o.req.model, o.store, ro);
  if (!resolved.ok()) return fail(resolved.status());
  if (mo.tokenizer_path.empty()) mo.tokenizer_path = resolved->file("tokenizer");
  auto model = TextModel::open(resolved->path, mo);
  if (!model.ok() && where.automatic && where.name != "cpu") {
    // auto: a model that does not fit the GPU runs on the CPU.
    where.why = "auto: " + where.name + " could not hold the model (" + model.status().message + "); running on the CPU";
    where.name = mo.device = "cpu";
    model = TextModel::open(resolved->path, mo);
  }
  if (!model.ok()) return fail(model.status());
  TextRequest req = o.req;
  req.add_bos = !o.no_bos;

  if (o.echo && !o.json) write_stdout(req.prompt);
  size_t printed = 0;
  auto on_token = [&](const TokenEvent& ev) {
    if (o.json) {
      print_json_line({{"type", "token"}, {"index", ev.index}, {"id", ev.id}, {"text", ev.text}, {"piece", ev.piece}});
    } else {
      write_stdout(ev.text);
    }
    printed += ev.text.size();
    return true;
  };
  auto result = model.value()->generate(req, on_token);
  if (!result.ok()) {
    if (!o.json && (o.echo || printed)) write_stdout("\n");
    return fail(result.status());
  }
  const TextResult& r = result.value();
  const TextStats& st = r.stats;
  if (o.json) {
    std::vector<int32_t> all_ids = r.prompt_ids;
    all_ids.insert(all_ids.end(), r.ids.begin(), r.ids.end());
    print_json_line({{"type", "result"},
                     {"text", r.text},
                     {"prompt", o.echo ? nlohmann::json(req.prompt) : nlohmann::json(nullptr)},
                     {"prompt_ids", r.prompt_ids},
                     {"ids", all_ids},
                     {"prompt_tokens", st.prompt_tokens},
                     {"prompt_tokens_per_s", st.prompt_tokens_per_s},
                     {"new_tokens", st.new_tokens},
                     {"new_tokens_per_s", st.new_tokens_per_s},
                     {"stop_reason", st.stop_reason},
                     {"seed", st.seed},
                     {"device", where.name},
                     {"device_why", where.why},
                     {"precision", where.precision}});
  } else {
    // Whatever was still held back (a partial stop string or UTF-8 sequence) at the end.
    if (printed < r.text.size()) write_stdout(r.text.substr(printed));
    write_stdout("\n");
    std::fprintf(stderr, "prompt: %d tokens, %.1f tokens/s | new: %d tokens, %.1f tokens/s | stop: %s | seed: %llu\n",
                 st.prompt_tokens, st.prompt_tokens_per_s, st.new_tokens, st.new_tokens_per_s, st.stop_reason.c_str(),
                 static_cast<unsigned long long>(st.seed));
    std::fprintf(stderr, "%s\n", device_line(where).c_str());
  }
  return 0;
}

struct TokOptions {
  std::string model, tokenizer, text, store;
  bool no_bos = false;
};

// Only the vocabulary is loaded, so vocabulary-only GGUFs and tokenizer.json
// files work; a llama2.c checkpoint brings its tokenizer file beside it.
int run_tokenize(const TokOptions& t) {
  const bool add_bos = !t.no_bos, parse_special = !t.no_bos;
  Result<std::vector<int32_t>> ids = Status{};
  auto resolved = resolve_model(t.model, t.store);
  if (!resolved.ok()) return fail(resolved.status());
  const std::string& path = resolved->path;
  const bool llama2c_checkpoint =
      t.tokenizer.empty() && (resolved->format == "llama2c" || (path.size() > 4 && path.substr(path.size() - 4) == ".bin"));
  if (llama2c_checkpoint) {
    TextModelOptions mo;
    mo.threads = 1;
    mo.tokenizer_path = resolved->file("tokenizer");
    auto model = TextModel::open(path, mo);
    if (!model.ok()) return fail(model.status());
    ids = model.value()->tokenize(t.text, add_bos, parse_special);
  } else {
    auto vocab = Vocabulary::open(t.tokenizer.empty() ? path : t.tokenizer);
    if (!vocab.ok()) return fail(vocab.status());
    ids = vocab.value()->tokenize(t.text, add_bos, parse_special);
  }
  if (!ids.ok()) return fail(ids.status());
  std::string line;
  for (size_t i = 0; i < ids.value().size(); ++i) line += (i ? " " : "") + std::to_string(ids.value()[i]);
  write_stdout(line + "\n");
  return 0;
}

}  // namespace

void add_text_commands(CLI::App& root, int& exit_code) {
  auto o = std::make_shared<TextOptions>();
  CLI::App* text = root.add_subcommand("text", "Generate text from a prompt, streaming tokens to stdout as they are sampled");
  add_model_options(*text, o->req.model, o->model.tokenizer_path, o->store);
  add_request_options(*text, o->req);
  text->add_option("--threads", o->model.threads, "Threads (default: one per core)")->check(CLI::Range(1, 1024));
  text->add_option("--ctx", o->model.context_tokens, "Context size in tokens (default: the model's training context)")->check(CLI::Range(1, 1 << 20));
  add_kv_type_option(*text, o->model.kv_type);
  add_device_options(*text, o->device);
  text->add_flag("--echo", o->echo, "Print the prompt before the new text");
  text->add_flag("--json", o->json, "Print JSON Lines events (one per token, then the result) instead of text");
  text->add_flag("--no-bos", o->no_bos, "Do not prepend the BOS token");
  text->callback([o, &exit_code] { exit_code = run_text(*o); });

  auto t = std::make_shared<TokOptions>();
  CLI::App* tok = root.add_subcommand("tokenize", "Print the token ids of a text, space-separated on one line");
  tok->add_option("-m,--model", t->model, "Model or vocabulary: a store reference, or a file: GGUF (vocabulary-only files too), tokenizer.json, or a llama2.c .bin")->required();
  tok->add_option("--tokenizer", t->tokenizer, "Tokenizer file to use instead of the model's (tokenizer.json, llama2.c tokenizer.bin)");
  tok->add_option("--store", t->store, "Model store folder, for -m NAME (default: $ATELIER_HOME, else $XDG_DATA_HOME/atelier, else ~/.local/share/atelier)");
  tok->add_flag("--no-bos", t->no_bos, "No BOS, and special tokens are not parsed (as llama.cpp's vocab tests expect)");
  tok->add_option("text", t->text, "Text to tokenize (put -- before it when it starts with -)")->required();
  tok->callback([t, &exit_code] { exit_code = run_tokenize(*t); });
}

}  // namespace atelier::app
