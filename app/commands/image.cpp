// `atelier image`: text to image, img2img and inpainting with Stable Diffusion
// 1.x/2.x checkpoints, or the QuickDraw CVAE (a prompt naming one of its 50
// classes). A progress bar on stderr (step, it/s, ETA), previews per step
// with --preview-dir, JSON Lines events with --json.
#include <atelier/models.h>

#include <CLI/CLI.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "commands/commands.h"
#include "commands/output.h"
#include "commands/request_options.h"

namespace atelier::app {

void add_image_commands(CLI::App& root, int& exit_code) {
  struct Options {
    ImageRequest request;
    std::string out, store, preview_dir;
    bool json = false;
    DeviceOptions device;
  };
  auto o = std::make_shared<Options>();
  CLI::App* image = root.add_subcommand("image", "Generate images from a prompt (PNG with its parameters embedded)");
  image->add_option("-m,--model", o->request.model, "Model: a store reference (NAME, NAME@VERSION, NAME:CHANNEL, sha256:DIGEST), an SD 1.x/2.x checkpoint (.safetensors, .ckpt, a diffusers folder) or the QuickDraw CVAE")->required();
  image->add_option("--store", o->store, "Model store folder (default: $ATELIER_HOME, else $XDG_DATA_HOME/atelier, else ~/.local/share/atelier)");
  image->add_option("-p,--prompt", o->request.prompt, "Prompt (QuickDraw: name one of its classes)")->required();
  image->add_option("--negative", o->request.negative_prompt, "Negative prompt");
  image->add_option("--steps", o->request.steps, "Denoising steps")->capture_default_str();
  image->add_option("--cfg", o->request.cfg_scale, "Classifier-free guidance scale")->capture_default_str();
  image->add_option("--sampler", o->request.sampler, "Sampler")->capture_default_str();
  image->add_option("-W,--width", o->request.width, "Width (multiple of 8, 8..4096)")->capture_default_str();
  image->add_option("-H,--height", o->request.height, "Height (multiple of 8, 8..4096)")->capture_default_str();
  add_seed_option(*image, o->request.seed, "Seed, 0..18446744073709551614 (default: random, printed)");
  image->add_option("--rng", o->request.rng, "Noise generator: torch's cuda (Philox) or cpu (mt19937)")
      ->check(CLI::IsMember({"cuda", "cpu"}))
      ->capture_default_str();
  image->add_option("--scheduler", o->request.scheduler, "Sigma schedule: discrete or karras")
      ->check(CLI::IsMember({"discrete", "karras"}))
      ->capture_default_str();
  image->add_option("--batch-count", o->request.batch_count, "Rounds of images (seeds S, S+1, ...)")->capture_default_str();
  image->add_option("--batch-size", o->request.batch_size, "Images denoised together per round (1..16)")->capture_default_str();
  image->add_option("--init", o->request.init_image, "img2img: the starting picture (resized to -W x -H)");
  image->add_option("--strength", o->request.strength, "img2img: denoising strength in (0, 1]")->capture_default_str();
  image->add_option("--mask", o->request.mask, "Inpainting: a picture, white = repaint (needs --init)");
  image->add_option("--tokenizer", o->request.tokenizer, "CLIP vocabulary bpe_simple_vocab_16e6.txt.gz (default: the store's, or beside the model)");
  image->add_option("--taesd", o->request.preview_decoder, "A TAESD decoder for the previews (default: linear latent-to-RGB)");
  image->add_option("--prediction", o->request.prediction, "What the UNet predicts: auto, eps or v")
      ->check(CLI::IsMember({"auto", "eps", "v"}))
      ->capture_default_str();
  image->add_option("--preview-dir", o->preview_dir, "Write each step's preview as DIR/IMAGE-STEP.png");
  image->add_option("--threads", o->request.threads, "Threads (default: one per core)")->check(CLI::Range(1, 1024));
  image->add_option("-o,--output", o->out, "Output PNG (a batch writes OUT-1.png ... OUT-N.png)")
      ->required()
      ->check(CLI::Validator([](std::string& v) { return v.empty() ? std::string("name the PNG file to write") : std::string(); }, "", ""));
  image->add_flag("--json", o->json, "One JSON line per image written");
  add_device_options(*image, o->device);
  image->callback([o, &exit_code] {
    // Images run on the CPU until the GPU's image path (issue 34): a GPU
    // named outright is refused before any work; auto says where it runs.
    auto dev = select_device(o->device.device, o->device.precision);
    if (!dev.ok()) {
      exit_code = fail(dev.status());
      return;
    }
    if (dev->name != "cpu" && !dev->automatic) {
      exit_code = fail(Status::error(StatusCode::Unsupported,
                                     "image generation does not run on a GPU yet (--device " + o->device.device +
                                         "): use --device cpu, or --device auto, which runs images on the CPU"));
      return;
    }
    const std::string where = dev->name == "cpu" ? dev->why : "auto: images run on the CPU (" + dev->name + " runs text only so far)";
    if (!o->json) std::fprintf(stderr, "device: cpu (%s)\n", where.c_str());
    // The output is checked before the render, not after it.
    o->request.output = o->out;
    if (!o->preview_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(o->preview_dir, ec);
      if (ec) {
        exit_code = fail(Status::error(StatusCode::Io, o->preview_dir + ": cannot create the preview folder: " + ec.message()));
        return;
      }
    }
    const bool tty = ::isatty(STDERR_FILENO);
    std::string preview_error;
    auto progress = [&](const ImageProgress& p) {
      if (!o->preview_dir.empty() && !p.preview_rgb.empty()) {
        char name[64];
        std::snprintf(name, sizeof name, "/%03d-%03d.png", p.image + 1, p.step);
        if (Status st = write_preview_png(p, o->preview_dir + name); !st.ok()) {
          preview_error = st.message;
          return false;
        }
      }
      if (o->json) {
        print_json_line({{"event", "step"}, {"image", p.image}, {"images", p.images}, {"step", p.step}, {"steps", p.steps},
                         {"seconds", p.seconds}});
        return true;
      }
      // step, it/s and ETA over all images of the request
      const double done = static_cast<double>(p.image) * p.steps + p.step, total = static_cast<double>(p.images) * p.steps;
      const double rate = p.seconds > 0 ? done / p.seconds : 0;
      const double eta = rate > 0 ? (total - done) / rate : 0;
      std::fprintf(stderr, "%simage %d/%d  step %d/%d  %.2f it/s  ETA %.0f s%s", tty ? "\r" : "", p.image + 1, p.images,
                   p.step, p.steps, rate, eta, tty ? "   " : "\n");
      return true;
    };
    Result<std::vector<ImageResult>> r = generate_image(o->request, o->store, progress);
    if (tty && !o->json) std::fprintf(stderr, "\n");
    if (!preview_error.empty()) {
      exit_code = fail(Status::error(StatusCode::Io, "writing a preview failed: " + preview_error));
      return;
    }
    if (!r.ok()) {
      exit_code = fail(r.status());
      return;
    }
    const int n = static_cast<int>(r->size());
    for (int i = 0; i < n; ++i) {
      const ImageResult& img = r.value()[i];
      const std::string path = numbered_output_path(o->out, i, n);
      if (Status st = write_png(img, o->request, path); !st.ok()) {
        exit_code = fail(st);
        return;
      }
      if (o->json)
        print_json_line({{"event", "image"},
                         {"file", path},
                         {"width", img.width},
                         {"height", img.height},
                         {"channels", img.channels},
                         {"seed", img.seed},
                         {"device", "cpu"},
                         {"device_why", where},
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
