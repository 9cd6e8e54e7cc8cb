// `atelier models ...`: synthetic models for benchmarks, and a folder scan
// (the model store with pull/import/promote comes with its own issue).
#include <atelier/engine.h>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>

#include "commands/commands.h"
#include "commands/output.h"

namespace atelier::app {

void add_models_commands(CLI::App& root, int& exit_code) {
  CLI::App* models = root.add_subcommand("models", "Model files");
  models->require_subcommand(1);

  struct SynthOptions {
    SynthTextSpec spec;
    std::string out;
  };
  auto s = std::make_shared<SynthOptions>();
  CLI::App* synth = models->add_subcommand("synth", "Write a LLaMA-shaped GGUF with deterministic random weights (for benchmarks)");
  synth->add_option("--arch", s->spec.arch, "Architecture")->check(CLI::IsMember({"llama"}))->capture_default_str();
  synth->add_option("--params", s->spec.params, "Size preset")->check(CLI::IsMember(synth_param_presets()))->capture_default_str();
  synth->add_option("--type", s->spec.type, "Weight type of the matrices")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0", "q4_0", "q4_K", "q6_K"}))
      ->capture_default_str();
  synth->add_option("--seed", s->spec.seed, "Seed of the weights")->capture_default_str();
  synth->add_option("-o,--output", s->out, "Output .gguf file")->required();
  synth->callback([s, &exit_code] {
    Status st = synth_text_model(s->spec, s->out);
    if (!st.ok()) {
      exit_code = fail(st);
      return;
    }
    std::fprintf(stderr, "wrote %s\n", s->out.c_str());
    exit_code = 0;
  });

  struct ScanOptions {
    std::vector<std::string> dirs;
    bool json = false;
  };
  auto sc = std::make_shared<ScanOptions>();
  CLI::App* scan = models->add_subcommand("scan", "List the model files in folders, reading only their headers");
  scan->add_option("dirs", sc->dirs, "Folders")->required()->check(CLI::ExistingDirectory);
  scan->add_flag("--json", sc->json, "JSON Lines output");
  scan->callback([sc, &exit_code] {
    for (const ModelFile& m : scan_model_folders(sc->dirs)) {
      if (sc->json)
        print_json_line({{"path", m.path}, {"kind", m.kind}, {"format", m.format}, {"bytes", m.bytes}, {"summary", m.summary}});
      else
        std::printf("%-60s %-8s %10.1f MB  %s\n", m.path.c_str(), m.format.c_str(), m.bytes / 1e6, m.summary.c_str());
    }
    exit_code = 0;
  });
}

}  // namespace atelier::app
