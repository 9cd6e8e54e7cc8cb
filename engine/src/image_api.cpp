// The image API: request validation, the QuickDraw CVAE generator end to end,
// and PNG output carrying the generation parameters. The Stable Diffusion
// pipeline plugs in here once it lands.
#include <atelier/engine.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "formats/safetensors.h"
#include "image/png.h"
#include "image/quickdraw.h"
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
                             float cfg, uint64_t seed, int w, int h, const std::string& hash, const std::string& model) {
  std::string s = prompt + "\n";
  if (!negative.empty()) s += "Negative prompt: " + negative + "\n";
  s += "Steps: " + std::to_string(steps) + ", Sampler: " + sampler + ", CFG scale: " + format_scale(cfg) +
       ", Seed: " + std::to_string(seed) + ", Size: " + std::to_string(w) + "x" + std::to_string(h) +
       ", Model hash: " + hash + ", Model: " + model;
  return s;
}

uint64_t pick_seed() {
  std::random_device rd;
  return rd();  // 32 bits, like A1111's random seeds
}

}  // namespace

Result<std::vector<ImageResult>> generate_image(const ImageRequest& request) { return generate_image(request, ""); }

Result<std::vector<ImageResult>> generate_image(const ImageRequest& request, const std::string& store_dir) {
  if (Status st = validate_image_request(request); !st.ok()) return st;
  ResolveOptions ro;
  ro.check_digest = true;  // a damaged blob is refused; the digest also gives A1111's model hash
  auto resolved = resolve_model(request.model, store_dir, ro);
  if (!resolved.ok()) return resolved.status();
  const std::string& path = resolved->path;
  return guarded([&]() -> Result<std::vector<ImageResult>> {
    static const char* kOnlyQuickDraw =
        "only the QuickDraw CVAE is supported until the Stable Diffusion pipeline lands";
    // Store blobs have no extension: look at the header, not the name.
    if (!resolved->in_store ? std::filesystem::path(path).extension() != ".safetensors" : resolved->format != "safetensors")
      return Status::error(StatusCode::Unsupported, request.model + ": " + kOnlyQuickDraw);
    {
      auto file = formats::SafetensorsFile::open(path);
      if (!image::QuickDrawModel::is_quickdraw(*file))
        return Status::error(StatusCode::Unsupported, request.model + ": " + kOnlyQuickDraw);
    }
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
    }
    return out;
  });
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
                            {"seed", result.seed},
                            {"rng", request.rng},
                            {"batch_count", request.batch_count}};
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
