// The image API: request validation, model detection, the QuickDraw CVAE and
// the Stable Diffusion pipeline (image/sd_pipeline.h around image/sd_model.h)
// end to end, and PNG output carrying the generation parameters.
#include <atelier/models.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <chrono>
#include <random>

#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>

#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/safetensors.h"
#include "formats/sniff.h"
#include "image/image_io.h"
#include "image/png.h"
#include "image/quickdraw.h"
#include "api/image_job.h"
#include "api/text_model_impl.h"

namespace atelier {

namespace {

// "GGUF" or "llama2.c" when PATH holds a text model, else "" (by content).
std::string text_model_kind(const std::string& path) {
  switch (formats::sniff_model_file(path).kind) {
    case formats::FileKind::gguf: return "GGUF";
    case formats::FileKind::llama2c: return "llama2.c";
    default: return "";
  }
}

// The SD pipeline on the calling thread: each round's images advanced together.
Result<std::vector<ImageResult>> generate_sd(const ImageRequest& request, const ResolvedModel& resolved,
                                             const std::string& path, const ImageProgressFn& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  ThreadPool pool(request.threads);
  auto model = load_diffusion(request, resolved, path, &pool);
  ImageRun run(*model, request);
  while (!run.done()) {
    image::run_step(*model->model, run.live());
    if (progress) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (const ImageProgress& p : run.progress(s, true))
        if (!progress(p)) return Status::error(StatusCode::Cancelled, "image generation cancelled");
    }
    run.advance();
  }
  return std::move(run.results());
}

}  // namespace

Result<std::vector<ImageResult>> generate_image(const ImageRequest& request) { return generate_image(request, ""); }

Result<std::vector<ImageResult>> generate_image(const ImageRequest& request, const std::string& store_dir,
                                                const ImageProgressFn& progress) {
  if (Status st = validate_image_request(request); !st.ok()) return st;
  if (Status st = check_image_output(request.output); !st.ok()) return st;
  const Result<ResolvedModel> resolved = resolve_image_model(request.model, store_dir);
  if (!resolved.ok()) return resolved.status();
  const std::string& path = resolved->path;
  return guarded([&]() -> Result<std::vector<ImageResult>> {
    // Store blobs have no extension: look at the header, not the name.
    const bool quickdraw = is_one_pass_image_model(resolved.value(), path);
    if (!quickdraw) {
      if (const std::string kind = text_model_kind(path); !kind.empty())
        return Status::error(StatusCode::Unsupported,
                             request.model + " is a text model (" + kind +
                                 "): image generation needs a Stable Diffusion 1.x/2.x checkpoint (.safetensors, .ckpt "
                                 "or a diffusers folder) or the QuickDraw CVAE");
      return generate_sd(request, resolved.value(), path, progress);
    }
    if (!request.init_image.empty() || !request.mask.empty())
      return Status::error(StatusCode::InvalidArgument,
                           request.model + " is the QuickDraw CVAE, which draws a class from its name: it takes no init image or "
                                           "mask (img2img and inpainting need a Stable Diffusion checkpoint)");
    const auto t0 = std::chrono::steady_clock::now();
    auto model = image::QuickDrawModel::open(path);
    int label = 0;
    try {
      label = model->match_label(request.prompt);
    } catch (const image::LabelError& e) {
      return Status::error(StatusCode::InvalidArgument, e.what());
    }
    const std::string hash = resolved->digest.substr(7, 10);  // after "sha256:"
    const std::string name = resolved->in_store ? resolved->display : std::filesystem::path(path).stem().string();
    const uint64_t base = request.seed == SamplingParams::kRandomSeed ? pick_image_seed() : request.seed;
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
        p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        p.image = i;
        p.images = request.batch_count;
        p.step = p.steps = 1;
        if (!progress(p)) return Status::error(StatusCode::Cancelled, "image generation cancelled");
      }
    }
    return out;
  });
}

Status check_image_model_kind(const std::string& ref, const std::string& store_dir) {
  return guarded([&]() -> Status {
  std::error_code ec;
  if (std::filesystem::is_directory(ref, ec)) return {};  // a diffusers folder
  auto resolved = resolve_model(ref, store_dir);
  if (!resolved.ok()) return resolved.status();
  if (resolved->kind == "text" || !text_model_kind(resolved->path).empty())
    return Status::error(StatusCode::Unsupported,
                         ref + " is a text model (" + (resolved->format.empty() ? text_model_kind(resolved->path) : resolved->format) +
                             "): image generation needs a Stable Diffusion 1.x/2.x checkpoint (.safetensors, .ckpt or a "
                             "diffusers folder) or the QuickDraw CVAE");
  if (!resolved->in_store) {  // a plain file: at least a model's header, or the render fails long after the 201
    const formats::Sniffed s = formats::sniff_model_file(resolved->path);
    if (s.kind != formats::FileKind::safetensors && s.kind != formats::FileKind::pytorch_zip)
      return Status::error(s.io ? StatusCode::Io : StatusCode::InvalidArgument,
                           ref + " is not an image model file: image generation needs a Stable Diffusion 1.x/2.x "
                                 "checkpoint (.safetensors, .ckpt or a diffusers folder) or the QuickDraw CVAE");
  }
  return {};
  });
}

Status check_image_output(const std::string& output) {
  if (output.empty()) return {};
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(output, ec))
    return Status::error(StatusCode::InvalidArgument, output + " is a folder: name the PNG file to write (e.g. " +
                                                          (fs::path(output) / "image.png").string() + ")");
  const fs::path parent = fs::path(output).parent_path().empty() ? fs::path(".") : fs::path(output).parent_path();
  if (!fs::is_directory(parent, ec))
    return Status::error(StatusCode::NotFound, output + ": the folder " + parent.string() + " does not exist; create it first or write elsewhere");
  if (::access(parent.c_str(), W_OK) != 0)
    return Status::error(StatusCode::Io, output + ": the folder " + parent.string() + " is not writable (" + std::strerror(errno) + ")");
  return {};
}

Result<std::string> file_inside(const std::string& folder, const std::string& name) {
  namespace fs = std::filesystem;
  const auto refuse = [&](const std::string& why) {
    return Status::error(StatusCode::InvalidArgument, "\"" + name + "\" " + why);
  };
  if (name.empty()) return refuse("is empty: name a file");
  if (name.find('\0') != std::string::npos) return refuse("holds a NUL byte");
  const fs::path p(name);
  if (p.is_absolute()) return refuse("is an absolute path: name a file inside " + folder);
  for (const auto& part : p)
    if (part == "..") return refuse("leaves the folder (a \"..\" part): name a file inside " + folder);
  // lstat each existing part below FOLDER: a link there could point anywhere.
  fs::path at(folder);
  for (const auto& part : p.lexically_normal()) {
    if (part.empty() || part == ".") continue;
    at /= part;
    struct stat st {};
    if (::lstat(at.c_str(), &st) != 0) break;  // the rest does not exist yet
    if (S_ISLNK(st.st_mode)) return refuse("goes through the symbolic link " + at.string() + ", which is not followed");
  }
  return (fs::path(folder) / p).lexically_normal().string();
}

std::string numbered_output_path(const std::string& out, int index, int count) {
  if (count == 1) return out;
  const std::filesystem::path p(out);
  return ((p.parent_path() / p.stem()).string() + "-" + std::to_string(index + 1) + p.extension().string());
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
  } catch (const Error& e) {
    return Status::error(e.code() == StatusCode::Cancelled ? StatusCode::Cancelled : StatusCode::Io, e.what());
  } catch (const std::exception& e) {
    return Status::error(StatusCode::Io, e.what());
  }
  return {};
}

}  // namespace atelier
