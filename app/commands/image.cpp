// `atelier image`: text to image. For now the QuickDraw CVAE (a prompt naming
// one of its 50 classes); the Stable Diffusion pipeline comes with issue 4.
#include <atelier/engine.h>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "commands/commands.h"
#include "commands/output.h"

namespace atelier::app {

namespace {

// OUT.png for one image; OUT-1.png ... OUT-N.png for a batch.
std::string output_path(const std::string& out, int index, int count) {
  if (count == 1) return out;
  const std::filesystem::path p(out);
  std::filesystem::path stem = p.parent_path() / p.stem();
  return stem.string() + "-" + std::to_string(index + 1) + p.extension().string();
}

}  // namespace

void add_image_commands(CLI::App& root, int& exit_code) {
  struct Options {
    ImageRequest request;
    std::string out, store;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  CLI::App* image = root.add_subcommand("image", "Generate images from a prompt (PNG with its parameters embedded)");
  image->add_option("-m,--model", o->request.model, "Model: a store reference (NAME, NAME@VERSION, NAME:CHANNEL, sha256:DIGEST) or a file (the QuickDraw CVAE .safetensors for now)")->required();
  image->add_option("--store", o->store, "Model store folder (default: $ATELIER_HOME, else $XDG_DATA_HOME/atelier, else ~/.local/share/atelier)");
  image->add_option("-p,--prompt", o->request.prompt, "Prompt (QuickDraw: name one of its classes)")->required();
  image->add_option("--negative", o->request.negative_prompt, "Negative prompt");
  image->add_option("--steps", o->request.steps, "Denoising steps")->capture_default_str();
  image->add_option("--cfg", o->request.cfg_scale, "Classifier-free guidance scale")->capture_default_str();
  image->add_option("--sampler", o->request.sampler, "Sampler")->capture_default_str();
  image->add_option("-W,--width", o->request.width, "Width (multiple of 8, 8..4096)")->capture_default_str();
  image->add_option("-H,--height", o->request.height, "Height (multiple of 8, 8..4096)")->capture_default_str();
  image->add_option("--seed", o->request.seed, "Seed (default: random, printed)");
  image->add_option("--rng", o->request.rng, "Noise generator: torch's cuda (Philox) or cpu (mt19937)")
      ->check(CLI::IsMember({"cuda", "cpu"}))
      ->capture_default_str();
  image->add_option("--batch-count", o->request.batch_count, "Images to generate (seeds S, S+1, ...)")->capture_default_str();
  image->add_option("-o,--output", o->out, "Output PNG (a batch writes OUT-1.png ... OUT-N.png)")->required();
  image->add_flag("--json", o->json, "One JSON line per image written");
  image->callback([o, &exit_code] {
    Result<std::vector<ImageResult>> r = generate_image(o->request, o->store);
    if (!r.ok()) {
      exit_code = fail(r.status());
      return;
    }
    const int n = static_cast<int>(r->size());
    for (int i = 0; i < n; ++i) {
      const ImageResult& img = r.value()[i];
      const std::string path = output_path(o->out, i, n);
      if (Status st = write_png(img, o->request, path); !st.ok()) {
        exit_code = fail(st);
        return;
      }
      if (o->json)
        print_json_line({{"file", path},
                         {"width", img.width},
                         {"height", img.height},
                         {"channels", img.channels},
                         {"seed", img.seed},
                         {"parameters", img.parameters}});
      else
        write_stdout(path + "\n");
    }
    if (!o->json && n > 0)
      std::fprintf(stderr, "wrote %d image%s (%dx%d, seed %llu%s)\n", n, n == 1 ? "" : "s", r.value()[0].width,
                   r.value()[0].height, static_cast<unsigned long long>(r.value()[0].seed), n == 1 ? "" : " and up");
    exit_code = 0;
  });
}

}  // namespace atelier::app
