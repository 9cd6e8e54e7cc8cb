// The image API: request validation, model detection, the QuickDraw CVAE and
// the Stable Diffusion pipeline (image/sd_pipeline.h around image/sd_model.h)
// end to end, and PNG output carrying the generation parameters.
#include <atelier/engine.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <chrono>
#include <random>

#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/safetensors.h"
#include "image/image_io.h"
#include "image/png.h"
#include "image/quickdraw.h"
#include "image/sd_model.h"
#include "image/sd_pipeline.h"
#include "image/taesd.h"
#include "text_model_impl.h"

namespace atelier {

namespace {

Status validate_image_request(const ImageRequest& r) {
  auto bad = [](std::string m) { return Status::error(StatusCode::InvalidArgument, std::move(m)); };
  if (r.model.empty()) return bad("no model given: pass a model file (-m)");
  for (auto [name, v] : {std::pair{"width", r.width}, std::pair{"height", r.height}})
    if (v < 8 || v > 4096 || v % 8 != 0)
      return bad(std::string(name) + " " + std::to_string(v) +
                 " is not allowed: use a multiple of 8 between 8 and 4096 (e.g. " +
                 std::to_string(std::clamp((v + 4) / 8 * 8, 8, 4096)) + ")");
  if (r.batch_count < 1 || r.batch_count > 100)
    return bad("batch count " + std::to_string(r.batch_count) + " is out of range: use 1..100");
  if (r.steps < 1 || r.steps > 1000) return bad("steps " + std::to_string(r.steps) + " is out of range: use 1..1000");
  if (!std::isfinite(r.cfg_scale) || r.cfg_scale < 0 || r.cfg_scale > 100)
    return bad("CFG scale must be a number between 0 and 100");
  if (r.rng != "cuda" && r.rng != "cpu") return bad("rng \"" + r.rng + "\" is unknown: use cuda or cpu");
  if (r.batch_size < 1 || r.batch_size > 16)
    return bad("batch size " + std::to_string(r.batch_size) + " is out of range: use 1..16");
  image::SamplerKind kind;
  if (!image::parse_sampler(r.sampler, &kind))
    return bad("sampler \"" + r.sampler + "\" is unknown: use euler, euler_a, heun, dpmpp_2m, ddim or lcm");
  if (r.scheduler != "discrete" && r.scheduler != "karras")
    return bad("scheduler \"" + r.scheduler + "\" is unknown: use discrete or karras");
  if (r.prediction != "auto" && r.prediction != "eps" && r.prediction != "v")
    return bad("prediction \"" + r.prediction + "\" is unknown: use auto, eps or v");
  if (!r.init_image.empty() && !(r.strength > 0.0f && r.strength <= 1.0f))
    return bad("strength must be in (0, 1] (the share of the steps that repaint the init image)");
  if (!r.mask.empty() && r.init_image.empty()) return bad("a mask needs an init image (--init) to inpaint");
  for (const std::string* f : {&r.init_image, &r.mask, &r.tokenizer, &r.preview_decoder})
    if (!f->empty() && !std::filesystem::exists(*f)) return Status::error(StatusCode::NotFound, *f + ": no such file");
  return {};
}

std::string format_scale(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
  return buf;
}

// AUTOMATIC1111's infotext, which other tools (ComfyUI loaders, civitai,
// PNG Info) parse: the prompt, an optional negative line, then key: value pairs.
std::string a1111_parameters(const std::string& prompt, const std::string& negative, int steps, const std::string& sampler,
                             float cfg, uint64_t seed, int w, int h, const std::string& hash, const std::string& model,
                             const std::string& schedule = "", const std::string& extra = "") {
  std::string s = prompt + "\n";
  if (!negative.empty()) s += "Negative prompt: " + negative + "\n";
  s += "Steps: " + std::to_string(steps) + ", Sampler: " + sampler;
  if (!schedule.empty()) s += ", Schedule type: " + schedule;
  s += ", CFG scale: " + format_scale(cfg) + ", Seed: " + std::to_string(seed) + ", Size: " + std::to_string(w) + "x" +
       std::to_string(h);
  if (!hash.empty()) s += ", Model hash: " + hash;
  s += ", Model: " + model;
  if (!extra.empty()) s += ", " + extra;
  return s;
}

uint64_t pick_seed() {
  std::random_device rd;
  return rd();  // 32 bits, like A1111's random seeds
}

// A1111's sampler names, as its infotext writes them.
std::string a1111_sampler_name(image::SamplerKind k) {
  switch (k) {
    case image::SamplerKind::euler: return "Euler";
    case image::SamplerKind::euler_ancestral: return "Euler a";
    case image::SamplerKind::heun: return "Heun";
    case image::SamplerKind::dpmpp_2m: return "DPM++ 2M";
    case image::SamplerKind::ddim: return "DDIM";
    case image::SamplerKind::lcm: return "LCM";
  }
  return "Euler";
}

// The pipeline's view of a loaded SD checkpoint.
class SdDiffusion final : public image::DiffusionModel {
 public:
  SdDiffusion(std::unique_ptr<image::SdModel> m, std::unique_ptr<image::TaesdNet> taesd, ThreadPool* pool)
      : m_(std::move(m)), taesd_(std::move(taesd)), pool_(pool), schedule_(image::NoiseSchedule::scaled_linear()) {}
  int latent_channels() const override { return m_->latent_channels(); }
  int context_dim() const override { return m_->context_dim(); }
  image::Prediction prediction() const override { return m_->prediction(); }
  int32_t pad_id() const override { return m_->pad_token(); }
  const image::NoiseSchedule& schedule() const override { return schedule_; }
  void encode_text(const tok::PromptChunk& chunk, float* out) override {
    const std::vector<float> v = m_->encode_prompt(chunk.ids.data(), chunk.weights.data(), tok::ClipTokenizer::kContext, pool_);
    std::copy(v.begin(), v.end(), out);
  }
  void unet(int n, int h, int w, const float* x, const float* t, int ctx_tokens, const float* ctx, float* out) override {
    image::UnetBatch b;
    b.batch = n;
    b.height = h;
    b.width = w;
    b.x = x;
    b.timesteps = t;
    const size_t per = static_cast<size_t>(ctx_tokens) * static_cast<size_t>(m_->context_dim());
    for (int i = 0; i < n; ++i) b.context.emplace_back(ctx + i * per, per);
    m_->unet(b, out, pool_);
  }
  std::vector<float> decode(const float* latent, int h, int w) override { return m_->vae_decode(latent, h, w, pool_); }
  std::vector<float> encode(const float* rgb, int height, int width) override {
    return m_->vae_encode(rgb, height, width, pool_);
  }
  const image::TaesdNet* preview_decoder() const override { return taesd_.get(); }
  const image::SdModel& model() const { return *m_; }

 private:
  std::unique_ptr<image::SdModel> m_;
  std::unique_ptr<image::TaesdNet> taesd_;
  ThreadPool* pool_;
  image::NoiseSchedule schedule_;
};

// CLIP's vocabulary for an SD model: the request's, the store version's
// "tokenizer" file, or one beside the model (single file: its folder;
// diffusers: tokenizer/merges.txt, the same merges as plain text).
std::string find_clip_vocab(const ImageRequest& r, const ResolvedModel& m, const std::string& model_path) {
  if (!r.tokenizer.empty()) return r.tokenizer;
  if (std::string f = m.file("tokenizer"); !f.empty()) return f;
  namespace fs = std::filesystem;
  const fs::path p(model_path);
  for (const fs::path& c : {p / "tokenizer" / "merges.txt", p.parent_path() / "bpe_simple_vocab_16e6.txt.gz",
                            p.parent_path() / "tokenizer" / "merges.txt"}) {
    std::error_code ec;
    if (fs::is_regular_file(c, ec)) return c.string();
  }
  throw Error(model_path + ": the Stable Diffusion text encoder needs CLIP's vocabulary (bpe_simple_vocab_16e6.txt.gz); "
              "pass it with --tokenizer FILE or put it beside the model");
}

image::RgbImage load_resized(const std::string& path, int w, int h) {
  image::RgbImage img = image::read_rgb_file(path);
  if (img.width != w || img.height != h) img = image::resize_rgb(img, w, h);
  return img;
}

// The SD pipeline end to end: batch_count rounds of batch_size images, every
// image its own seed, all of a round advanced together one network call per step.
Result<std::vector<ImageResult>> generate_sd(const ImageRequest& request, const ResolvedModel& resolved,
                                             const std::string& path, const ImageProgressFn& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  ThreadPool pool(request.threads);
  image::SdOptions so;
  if (request.prediction == "eps") so.prediction = image::Prediction::epsilon;
  if (request.prediction == "v") so.prediction = image::Prediction::v;
  std::unique_ptr<image::TaesdNet> taesd;
  if (!request.preview_decoder.empty())
    taesd = image::TaesdNet::open(request.preview_decoder, image::TaesdNet::Kind::decoder);
  SdDiffusion model(image::SdModel::open(path, so), std::move(taesd), &pool);
  const auto tok = tok::ClipTokenizer::open(find_clip_vocab(request, resolved, path));
  auto [cond, uncond] = image::encode_prompts(model, *tok, request.prompt, request.negative_prompt);
  auto c = std::make_shared<const image::Conditioning>(std::move(cond));
  auto u = std::make_shared<const image::Conditioning>(std::move(uncond));

  image::TaskOptions base;
  base.width = request.width;
  base.height = request.height;
  base.steps = request.steps;
  base.cfg_scale = request.cfg_scale;
  image::parse_sampler(request.sampler, &base.sampler);
  base.karras = request.scheduler == "karras";
  base.rng = request.rng == "cpu" ? image::RngKind::Cpu : image::RngKind::Cuda;
  if (!request.init_image.empty()) {
    const auto rgb = image::to_planar(load_resized(request.init_image, request.width, request.height));
    base.init_latent = model.encode(rgb.data(), request.height, request.width);
    base.strength = request.strength;
    if (!request.mask.empty()) {
      // White repaints; averaged over each 8x8 latent cell.
      const image::RgbImage m = load_resized(request.mask, request.width / 8, request.height / 8);
      base.latent_mask.resize(static_cast<size_t>(m.width) * m.height);
      for (size_t i = 0; i < base.latent_mask.size(); ++i)
        base.latent_mask[i] = (m.pixels[3 * i] + m.pixels[3 * i + 1] + m.pixels[3 * i + 2]) / (3.0f * 255.0f);
    }
  }

  const std::string hash = resolved.digest.size() > 7 ? resolved.digest.substr(7, 10) : "";
  const std::string name = resolved.in_store ? resolved.display : std::filesystem::path(path).stem().string();
  const uint64_t seed0 = request.seed == SamplingParams::kRandomSeed ? pick_seed() : request.seed;
  const int images = request.batch_count * request.batch_size;
  std::string extra;
  if (!request.init_image.empty()) extra = "Denoising strength: " + format_scale(request.strength);
  std::vector<ImageResult> out;
  for (int round = 0; round < request.batch_count; ++round) {
    std::vector<std::unique_ptr<image::ImageTask>> tasks;
    std::vector<image::ImageTask*> live;
    for (int k = 0; k < request.batch_size; ++k) {
      image::TaskOptions o = base;
      o.seed = seed0 + static_cast<uint64_t>(round * request.batch_size + k);
      tasks.push_back(std::make_unique<image::ImageTask>(o, model.latent_channels(), model.schedule(), c,
                                                         request.cfg_scale == 1.0f ? nullptr : u));
      live.push_back(tasks.back().get());
    }
    while (!tasks.front()->done()) {
      image::run_step(model, live);
      if (!progress) continue;
      for (int k = 0; k < request.batch_size; ++k) {
        const image::ImageTask& t = *tasks[static_cast<size_t>(k)];
        ImageProgress p;
        p.image = round * request.batch_size + k;
        p.images = images;
        p.step = t.step_index();
        p.steps = t.steps();
        p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const image::Preview pv = image::make_preview(model, t.last_x0(), t.latent_h(), t.latent_w());
        p.preview_width = pv.width;
        p.preview_height = pv.height;
        p.preview_rgb = pv.rgb;
        if (!progress(p)) return Status::error(StatusCode::Cancelled, "image generation cancelled");
      }
    }
    for (const auto& t : tasks) {
      const std::vector<float> lat = t->result_latent();
      const std::vector<float> rgb = model.decode(lat.data(), t->latent_h(), t->latent_w());
      const image::RgbImage img = image::from_planar(rgb.data(), request.width, request.height);
      ImageResult r;
      r.width = img.width;
      r.height = img.height;
      r.channels = 3;
      r.pixels = img.pixels;
      r.seed = t->seed();
      r.parameters = a1111_parameters(request.prompt, request.negative_prompt, request.steps,
                                      a1111_sampler_name(base.sampler), request.cfg_scale, r.seed, request.width,
                                      request.height, hash, name, base.karras ? "Karras" : "", extra);
      out.push_back(std::move(r));
    }
  }
  return out;
}

}  // namespace

Result<std::vector<ImageResult>> generate_image(const ImageRequest& request) { return generate_image(request, ""); }

Result<std::vector<ImageResult>> generate_image(const ImageRequest& request, const std::string& store_dir,
                                                const ImageProgressFn& progress) {
  if (Status st = validate_image_request(request); !st.ok()) return st;
  ResolvedModel folder;
  Result<ResolvedModel> resolved = folder;
  std::error_code ec;
  if (std::filesystem::is_directory(request.model, ec)) {
    // A diffusers folder: no single file to hash or to keep in the store.
    folder.path = folder.display = request.model;
    resolved = folder;
  } else {
    ResolveOptions ro;
    ro.check_digest = true;  // a damaged blob is refused; the digest also gives A1111's model hash
    resolved = resolve_model(request.model, store_dir, ro);
    if (!resolved.ok()) return resolved.status();
  }
  const std::string& path = resolved->path;
  return guarded([&]() -> Result<std::vector<ImageResult>> {
    // Store blobs have no extension: look at the header, not the name.
    bool quickdraw = false;
    if (!std::filesystem::is_directory(path, ec)) {
      const bool safetensors = resolved->in_store ? resolved->format == "safetensors"
                                                  : std::filesystem::path(path).extension() == ".safetensors";
      if (safetensors) quickdraw = image::QuickDrawModel::is_quickdraw(*formats::SafetensorsFile::open(path));
    }
    if (!quickdraw) return generate_sd(request, resolved.value(), path, progress);
    auto model = image::QuickDrawModel::open(path);
    int label = 0;
    try {
      label = model->match_label(request.prompt);
    } catch (const image::LabelError& e) {
      return Status::error(StatusCode::InvalidArgument, e.what());
    }
    const std::string hash = resolved->digest.substr(7, 10);  // after "sha256:"
    const std::string name = resolved->in_store ? resolved->display : std::filesystem::path(path).stem().string();
    const uint64_t base = request.seed == SamplingParams::kRandomSeed ? pick_seed() : request.seed;
    constexpr int kSide = image::QuickDrawModel::kSide;
    std::vector<ImageResult> out;
    for (int i = 0; i < request.batch_count; ++i) {
      ImageResult r;
      r.seed = base + static_cast<uint64_t>(i);
      const std::vector<float> grey = model->decode(label, image::QuickDrawModel::latent_from_seed(r.seed));
      r.width = request.width;
      r.height = request.height;
      r.channels = 1;
      r.pixels = image::resize_grey_to_u8(grey, kSide, kSide, request.width, request.height);
      r.parameters = a1111_parameters(request.prompt, request.negative_prompt, 1, "CVAE decoder", 1.0f, r.seed,
                                      request.width, request.height, hash, name);
      out.push_back(std::move(r));
      if (progress) {
        ImageProgress p;
        p.image = i;
        p.images = request.batch_count;
        p.step = p.steps = 1;
        if (!progress(p)) return Status::error(StatusCode::Cancelled, "image generation cancelled");
      }
    }
    return out;
  });
}

Status write_preview_png(const ImageProgress& p, const std::string& path) {
  if (p.preview_width <= 0 || p.preview_height <= 0 ||
      p.preview_rgb.size() != static_cast<size_t>(p.preview_width) * p.preview_height * 3)
    return Status::error(StatusCode::InvalidArgument, "write_preview_png: the progress report carries no preview");
  try {
    image::write_png_file(path, {p.preview_width, p.preview_height, 3, p.preview_rgb.data()}, {});
  } catch (const std::exception& e) {
    return Status::error(StatusCode::Io, e.what());
  }
  return {};
}

Status write_png(const ImageResult& result, const ImageRequest& request, const std::string& path) {
  if (result.width <= 0 || result.height <= 0 || (result.channels != 1 && result.channels != 3) ||
      result.pixels.size() != static_cast<size_t>(result.width) * result.height * result.channels)
    return Status::error(StatusCode::InvalidArgument, "write_png: the image is empty or its size does not match its pixels");
  const nlohmann::json j = {{"model", request.model},
                            {"prompt", request.prompt},
                            {"negative_prompt", request.negative_prompt},
                            {"width", request.width},
                            {"height", request.height},
                            {"steps", request.steps},
                            {"cfg_scale", request.cfg_scale},
                            {"sampler", request.sampler},
                            {"scheduler", request.scheduler},
                            {"seed", result.seed},
                            {"rng", request.rng},
                            {"batch_count", request.batch_count},
                            {"batch_size", request.batch_size},
                            {"init_image", request.init_image},
                            {"strength", request.strength},
                            {"mask", request.mask},
                            {"prediction", request.prediction}};
  try {
    image::write_png_file(path, {result.width, result.height, result.channels, result.pixels.data()},
                          {{"parameters", result.parameters},
                           {"atelier", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)}});
  } catch (const std::bad_alloc&) {
    return Status::error(StatusCode::Io, "out of memory while encoding " + path);
  } catch (const std::exception& e) {
    return Status::error(StatusCode::Io, e.what());
  }
  return {};
}

}  // namespace atelier
