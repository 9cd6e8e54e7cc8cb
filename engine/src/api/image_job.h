// What generate_image and the engine's scheduler share about image jobs:
// request validation, A1111's infotext, loading a Stable Diffusion checkpoint
// for the pipeline, and ImageRun, one request's images in flight (rounds of
// batch_size tasks advanced a network call at a time by image::run_step, so
// the scheduler can batch the steps of several jobs and cancel between them).
// Internal to the engine; everything here may throw atelier::Error.
#pragma once

#include <atelier/models.h>
#include <atelier/kernels.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "image/sd_pipeline.h"

namespace atelier {

Status validate_image_request(const ImageRequest& r);
// Unsupported (with what the file is) when REF resolves to a text model; the
// resolution's own error when it does not resolve. No hashing (cheap at submit).
Status check_image_model_kind(const std::string& ref, const std::string& store_dir);
// OUTPUT ("" = the default, fine) can be written: its folder exists and is
// writable, and it is not itself a folder. Checked before a render starts.
Status check_image_output(const std::string& output);
uint64_t pick_image_seed();  // 32 random bits, like A1111's random seeds
std::string format_scale(float v);
// AUTOMATIC1111's infotext, which other tools (ComfyUI loaders, civitai, PNG
// Info) parse: the prompt, an optional negative line, then key: value pairs.
std::string a1111_parameters(const std::string& prompt, const std::string& negative, int steps, const std::string& sampler,
                             float cfg, uint64_t seed, int w, int h, const std::string& hash, const std::string& model,
                             const std::string& schedule = "", const std::string& extra = "");

// An image model reference: a diffusers folder as it is (no single file to
// hash or to keep in the store), else resolve_model with the digest checked
// (a damaged blob is refused; the digest also gives A1111's model hash).
Result<ResolvedModel> resolve_image_model(const std::string& ref, const std::string& store_dir);

// True when PATH is a one-pass generator (the QuickDraw CVAE) rather than a
// diffusion model: generate_image runs it whole, no steps to batch.
bool is_one_pass_image_model(const ResolvedModel& resolved, const std::string& path);

// A Stable Diffusion checkpoint ready for the pipeline, with its CLIP vocabulary.
struct LoadedDiffusion {
  std::unique_ptr<image::DiffusionModel> model;
  std::unique_ptr<tok::ClipTokenizer> tokenizer;
  std::string hash;  // A1111's model hash: 10 hex digits of the file's sha256 ("" for a diffusers folder)
  std::string name;  // for the infotext: name@version in the store, else the file's stem
};
// PATH is the resolved file (or diffusers folder); the request gives the
// prediction override, the TAESD preview decoder and the vocabulary.
std::unique_ptr<LoadedDiffusion> load_diffusion(const ImageRequest& request, const ResolvedModel& resolved,
                                                const std::string& path, kernels::Executor* pool);

// One request's images: batch_count rounds of batch_size tasks, image i with seed + i.
class ImageRun {
 public:
  // Refuses (InvalidArgument, before any work) a request whose working memory
  // and weights exceed the device's memory, or MEMORY_CAP_BYTES when > 0.
  ImageRun(LoadedDiffusion& model, const ImageRequest& request, int64_t memory_cap_bytes = 0);
  uint64_t seed() const { return seed0_; }
  int images() const { return request_.batch_count * request_.batch_size; }
  // The current round's tasks that still need network calls.
  std::vector<image::ImageTask*> live();
  // One report per task of the current round (after a step), with previews when asked.
  std::vector<ImageProgress> progress(double seconds, bool previews);
  // When the round's tasks are done: decodes them into results and starts the
  // next round. True once every image is decoded.
  bool advance();
  bool done() const { return round_ >= request_.batch_count; }
  std::vector<ImageResult>& results() { return results_; }

 private:
  void start_round();

  LoadedDiffusion& m_;
  ImageRequest request_;
  image::TaskOptions base_;
  std::shared_ptr<const image::Conditioning> cond_, uncond_;
  uint64_t seed0_ = 0;
  int round_ = 0;
  std::vector<std::unique_ptr<image::ImageTask>> tasks_;
  std::vector<ImageResult> results_;
};

}  // namespace atelier
