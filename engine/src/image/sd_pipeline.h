// The latent-diffusion pipeline around a model: prompt conditioning (CLIP
// chunks, emphasis, negative prompt), initial noise from torch's generators,
// txt2img / img2img / inpainting, classifier-free guidance, the samplers of
// sampling.h, a preview after every step, and step-level batching.
//
// One ImageTask is one image: its own seed, noise generator and sampler.
// `run_step` advances a set of tasks by one model evaluation each, gathering
// every task with the same latent size and conditioning length into ONE
// network call (cond and uncond rows of every task side by side), each row
// with its own timestep. The network is row-independent, so a task's image
// does not depend on which other tasks shared its calls (tested); a task can
// join or leave between any two calls, which is what lets the engine's
// scheduler batch different jobs' steps and cancel within one step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "image/preview.h"
#include "image/rng.h"
#include "image/sampling.h"
#include "tokenizer/clip.h"

namespace atelier::image {

// What the pipeline needs from a latent diffusion model. Latents are the
// model's sampling space (for SD: the VAE latent times its scaling factor);
// every array is planar, batch-major, f32.
class DiffusionModel {
 public:
  virtual ~DiffusionModel() = default;
  virtual int latent_channels() const = 0;
  virtual int context_dim() const = 0;
  virtual Prediction prediction() const = 0;
  virtual int32_t pad_id() const = 0;  // CLIP padding: 49407 (SD 1.x), 0 (OpenCLIP, SD 2.x)
  virtual const NoiseSchedule& schedule() const = 0;
  // One chunk (77 ids with emphasis weights) -> 77 x context_dim floats.
  virtual void encode_text(const tok::PromptChunk& chunk, float* out) = 0;
  // n rows: x [n][C][h][w] (already scaled by 1/sqrt(sigma^2 + 1)),
  // timesteps [n], context [n][ctx_tokens][context_dim] -> out [n][C][h][w]
  // (eps or v). Row i's output must depend only on row i's inputs.
  virtual void unet(int n, int h, int w, const float* x, const float* timesteps, int ctx_tokens, const float* context,
                    float* out) = 0;
  // latent [C][h][w] -> rgb [3][8h][8w] in [0, 1].
  virtual std::vector<float> decode(const float* latent, int h, int w) = 0;
  // rgb [3][H][W] in [0, 1] (H, W multiples of 8) -> latent [C][H/8][W/8] (the mean).
  virtual std::vector<float> encode(const float* rgb, int height, int width) = 0;
  // Optional fast preview decoder (TAESD); nullptr: a linear latent-to-RGB projection.
  virtual const TaesdNet* preview_decoder() const { return nullptr; }
  // Bytes a request needs while it runs, beyond what is loaded: unet() over
  // ROWS samples of latent H x W, decode() of one, and encode() of one
  // picture 8H x 8W when ENCODE. 0: not known (no admission check).
  virtual int64_t working_bytes(int rows, int h, int w, bool encode) const {
    (void)rows, (void)h, (void)w, (void)encode;
    return 0;
  }
  // Bytes the loaded weights take (0: not known).
  virtual int64_t weight_bytes() const { return 0; }
};

// A prompt's conditioning: ctx_tokens (77 per chunk) x context_dim floats.
struct Conditioning {
  int tokens = 0;
  std::vector<float> values;
};
// Encodes the prompt A1111's way (emphasis, 75-token chunks, BREAK); with a
// negative prompt, both are padded with empty chunks to the same length.
std::pair<Conditioning, Conditioning> encode_prompts(DiffusionModel& model, const tok::ClipTokenizer& tok,
                                                     const std::string& prompt, const std::string& negative);

struct TaskOptions {
  int width = 512, height = 512;     // pixels, multiples of 8
  int steps = 20;
  float cfg_scale = 7.0f;            // 1: no unconditional evaluation
  SamplerKind sampler = SamplerKind::euler_ancestral;
  bool karras = false;               // Karras sigmas instead of the sampler's default schedule
  RngKind rng = RngKind::Cuda;
  uint64_t seed = 0;
  // img2img: the init image's latent ([C][h/8][w/8]) and denoising strength
  // in (0, 1]: the last floor(strength * steps) steps of the schedule run.
  std::vector<float> init_latent;
  float strength = 0.75f;
  // Inpainting (with init_latent): [h/8][w/8], 1 = repaint, 0 = keep.
  std::vector<float> latent_mask;
};

class ImageTask {
 public:
  // Throws Error on bad options (sizes, strength, mask shape).
  ImageTask(const TaskOptions& options, int latent_channels, const NoiseSchedule& schedule,
            std::shared_ptr<const Conditioning> cond, std::shared_ptr<const Conditioning> uncond);
  // The sampler's noise source points at this task's generator: never moved.
  ImageTask(const ImageTask&) = delete;
  ImageTask& operator=(const ImageTask&) = delete;

  int latent_h() const { return h_; }
  int latent_w() const { return w_; }
  int ctx_tokens() const { return cond_->tokens; }
  bool guided() const { return uncond_ != nullptr && cfg_ != 1.0f; }
  int steps() const { return sampler_->steps(); }
  int step_index() const { return sampler_->step_index(); }
  bool done() const { return sampler_->done(); }
  uint64_t seed() const { return seed_; }
  const Sampler& sampler() const { return *sampler_; }

  // The last x0 estimate (the previews' source); empty before the first call.
  const std::vector<float>& last_x0() const { return last_x0_; }
  // The finished latent (inpainting: kept regions restored).
  std::vector<float> result_latent() const;

  // For run_step.
  void fill_inputs(float* x_rows, float* t_rows, float* ctx_rows, const NoiseSchedule& schedule) const;
  void consume(const float* out_rows, Prediction prediction);

 private:
  int c_ = 0, h_ = 0, w_ = 0;
  float cfg_ = 1.0f;
  uint64_t seed_ = 0;
  std::shared_ptr<const Conditioning> cond_, uncond_;
  std::unique_ptr<TorchRandn> rng_;
  std::unique_ptr<Sampler> sampler_;
  std::vector<float> init_latent_, mask_, last_x0_;
};

// One model evaluation for every task that is not done, batched by (latent
// size, conditioning length): one network call per group, rows in task order.
// Returns how many network rows ran.
int run_step(DiffusionModel& model, const std::vector<ImageTask*>& tasks);

// A preview of a latent (preview.h): the model's TAESD decoder, else SD's
// linear latent-to-RGB factors (4-channel latents; other channel counts:
// grey from the first channel) at latent resolution.
Preview make_preview(DiffusionModel& model, const std::vector<float>& latent, int h, int w);

}  // namespace atelier::image
