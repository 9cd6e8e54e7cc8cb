// Stable Diffusion 1.x / 2.x: the model (text encoder, UNet, VAE) the
// pipeline calls. Loading and version detection here; the networks live in
// clip_text, unet and vae; synthetic checkpoints in sd_synth.cpp.
//
// Sources (SdModel::open):
//   - a single file in the original (CompVis/Stability) layout, .safetensors
//     (F32/F16/BF16) or .ckpt/.pth (PyTorch zip through the restricted
//     unpickler): `model.diffusion_model.*` (UNet), `first_stage_model.*`
//     (VAE), `cond_stage_model.transformer.text_model.*` (SD1: Hugging Face
//     CLIPTextModel names) or `cond_stage_model.model.*` (SD2: OpenCLIP
//     names, fused `attn.in_proj_weight`);
//   - a diffusers folder (unet/, vae/, text_encoder/, optional scheduler/),
//     whose names are mapped to the original ones on open (sd_weights.h).
//   Other tensors (model_ema.*, position ids, logit_scale) are ignored.
// Version: SD2 when the UNet's cross-attention context is 1024 wide, the text
// encoder uses OpenCLIP names, or proj_in is a linear layer; SD1 otherwise.
// SDXL (conditioner.embedders / label_emb) is refused with a clear message.
// UNets with 9 (inpainting) or 8 input channels load: in_channels() tells the
// pipeline what to concatenate to the latent.
//
// What the weights cannot say, and where it comes from (first match wins):
//   - prediction (eps or v): SdOptions::prediction; safetensors metadata
//     `modelspec.prediction_type` / `prediction_type` ("v", "v_prediction",
//     "epsilon"); diffusers scheduler/scheduler_config.json; else SD1 eps and
//     SD2 v (SD 2.x's flagship 768-v checkpoints; SD 2.x "base" 512 models
//     are eps and need the option).
//   - UNet heads: SdOptions; metadata `atelier.unet.num_heads` /
//     `atelier.unet.head_dim`; diffusers unet config attention_head_dim (an
//     int is a head count, a list is heads per level, as diffusers uses it);
//     else SD1 8 heads, SD2 64-wide heads.
//   - text encoder heads and activation: metadata `atelier.clip.num_heads`,
//     diffusers text_encoder config; else width / 64 heads, quick_gelu for
//     the OpenAI (SD1) model and GELU for OpenCLIP.
//
// Conventions: tensors are f32, NCHW, one image per `[c][h][w]` block. Latents
// are in the UNet's scale (the VAE's mean times vae_scale(), 0.18215).
// Matrices keep the file's type (F16 stays F16: half the memory) unless
// SdOptions::precision says otherwise; matrices in the kept type are read in
// place from the mapped file (not copied), and each network's pages leave the
// process while another network runs (SdOptions::release_idle_weights): the
// text encoder's after encode_prompt, the VAE's after its call, the UNet's
// when either of those starts; the next call faults them back in from the
// page cache (~0.1 s for the UNet), so one network is resident at a time.
// Every call is const and keeps no scratch in the object (the VAE drops its
// workspace after each call), so several threads may use one model. Errors throw
// atelier::Error (the engine API turns them into a Status).
#pragma once

#include <atelier/kernels.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "image/sampling.h"
#include "image/sd_weights.h"

namespace atelier::image {

enum class SdVersion { sd1, sd2 };
std::string_view sd_version_name(SdVersion v);  // "SD 1.x", "SD 2.x"

struct ClipConfig {
  bool open_clip = false;  // OpenCLIP names (SD2 single file) instead of Hugging Face's
  int vocab = 49408, positions = 77, width = 768, layers = 12, heads = 12;
  int layers_used = 12;    // SD2 runs 23 of 24 (penultimate), then the final norm either way
  bool quick_gelu = true;  // OpenAI CLIP; OpenCLIP uses the erf GELU
};

struct UnetConfig {
  int in_channels = 4, out_channels = 4, model_channels = 320;
  std::vector<int> channel_mult = {1, 2, 4, 4};
  int res_blocks = 2;
  std::vector<bool> attention = {true, true, true, false};  // per level
  std::vector<int> heads = {8, 8, 8, 8};                     // per level; the middle block uses the last
  int transformer_depth = 1;
  int context_dim = 768;
  bool linear_proj = false;  // SD2: proj_in/proj_out are Linear (the same math as SD1's 1x1 convs)
  int time_embed_dim() const { return 4 * model_channels; }
  int channels(int level) const { return model_channels * channel_mult.at(static_cast<size_t>(level)); }
};

struct VaeConfig {
  int channels = 128;
  std::vector<int> channel_mult = {1, 2, 4, 4};
  int res_blocks = 2;
  int latent_channels = 4;
  bool has_encoder = true;
  float scale = 0.18215f;  // SD 1.x/2.x scaling factor
};

struct SdOptions {
  std::optional<Prediction> prediction;  // unset: metadata, else per version (see above)
  WeightPrecision precision = WeightPrecision::keep;
  int clip_skip = 1;       // A1111's "clip skip": 2 drops one more layer (SD1's penultimate)
  int unet_heads = 0;      // > 0: a fixed head count at every level
  int unet_head_dim = 0;   // > 0: heads = channels / head_dim
  // Drop each network's mapped pages from the process while the others run
  // (see the top of the file); false keeps every page once read.
  bool release_idle_weights = true;
};

// What a checkpoint is, from tensor names and shapes only (no weights read).
struct SdInfo {
  SdVersion version = SdVersion::sd1;
  Prediction prediction = Prediction::epsilon;
  ClipConfig clip;
  UnetConfig unet;
  VaeConfig vae;
  std::string summary;  // "SD 1.x, UNet 320 ch (in 4), context 768, CLIP 12x768, eps"
};

// One UNet call over a batch. Each sample has its own timestep and its own
// context (n_tokens x context_dim floats; 77 per prompt chunk; samples may
// differ in token count).
struct UnetBatch {
  int batch = 1, height = 0, width = 0;  // latent size
  const float* x = nullptr;              // [batch][in_channels][height][width]
  const float* timesteps = nullptr;      // [batch], DDPM timesteps (0..999, fractional allowed)
  std::vector<std::span<const float>> context;  // [batch]
};

class ClipTextEncoder;  // clip_text.h
class Unet;             // unet.h
class Vae;              // vae.h

class SdModel {
 public:
  // Reads names and shapes and decides the version (see the top of the file).
  static SdInfo inspect(const std::string& path, const SdOptions& options = {});
  // Loads everything. Throws Error naming the path and what is missing,
  // malformed or unsupported. Every parameter is placed on `backend` (a
  // copy where it does not read host memory; the file's pages on the CPU).
  static std::unique_ptr<SdModel> open(const std::string& path, const SdOptions& options = {},
                                       kernels::Backend& backend = kernels::default_cpu_backend());
  ~SdModel();

  const SdInfo& info() const { return info_; }
  SdVersion version() const { return info_.version; }
  Prediction prediction() const { return info_.prediction; }
  int latent_channels() const { return info_.vae.latent_channels; }
  int unet_in_channels() const { return info_.unet.in_channels; }
  int context_dim() const { return info_.unet.context_dim; }
  float vae_scale() const { return info_.vae.scale; }
  // The tokenizer's pad id for this text encoder: SD1 pads with
  // <|endoftext|> (49407), OpenCLIP (SD2) with 0.
  int32_t pad_token() const { return info_.version == SdVersion::sd2 ? 0 : 49407; }
  // Bytes the loaded weights take.
  int64_t weight_bytes() const;
  // Bytes of working memory (the UNet's and the VAE's workspaces, the
  // latents and the picture) for ROWS UNet samples of latent H x W, a decode
  // of one, and with ENCODE an encode of an 8H x 8W picture.
  int64_t working_bytes(int rows, int h, int w, bool encode) const;

  // Text conditioning: n_tokens (a multiple of 77: one chunk each, as
  // tok::tokenize_weighted makes them) ids and per-token emphasis weights
  // (nullptr: all 1) -> [n_tokens][context_dim]. Each chunk: the encoder's
  // output scaled token-wise by its weights, then rescaled so its mean equals
  // the unweighted mean (A1111).
  //
  // Each run call takes the backend it runs on (the one the model was
  // opened onto, or one of the same device's other lanes); the Executor
  // forms run on a CPU backend over `ex` (tests, tools).
  std::vector<float> encode_prompt(const int32_t* ids, const float* weights, int n_tokens,
                                   kernels::Backend& backend) const;
  std::vector<float> encode_prompt(const int32_t* ids, const float* weights, int n_tokens,
                                   kernels::Executor* ex = nullptr) const;
  // out: [batch][out_channels][height][width]. Sample b's output is bit for
  // bit the same whatever else shares the batch.
  void unet(const UnetBatch& in, float* out, kernels::Backend& backend) const;
  void unet(const UnetBatch& in, float* out, kernels::Executor* ex = nullptr) const;
  // latent [4][h][w] in the UNet's scale -> RGB [3][8h][8w] in [0, 1].
  std::vector<float> vae_decode(const float* latent, int h, int w, kernels::Backend& backend) const;
  std::vector<float> vae_decode(const float* latent, int h, int w, kernels::Executor* ex = nullptr) const;
  // RGB [3][h][w] in [0, 1] (h, w multiples of 8) -> the latent distribution's
  // mean times vae_scale(), [4][h/8][w/8].
  std::vector<float> vae_encode(const float* rgb, int h, int w, kernels::Backend& backend) const;
  std::vector<float> vae_encode(const float* rgb, int h, int w, kernels::Executor* ex = nullptr) const;

  const ClipTextEncoder& text_encoder() const { return *clip_; }
  const Unet& unet_net() const { return *unet_; }
  const Vae& vae_net() const { return *vae_; }

  // The networks' weights read in place from the mapped file (bytes of
  // whole ranges; what release_idle_weights drops between uses).
  enum class Part { text_encoder, unet, vae };
  uint64_t in_place_bytes(Part part) const;
  // Drops a network's mapped pages from the process now (they fault back
  // in when used). Returns the bytes of whole pages released.
  uint64_t release_weights(Part part) const;

 private:
  SdModel();
  const PageSpans& spans(Part part) const;
  SdInfo info_;
  std::unique_ptr<WeightStore> ws_;  // the mappings the in-place weights point into
  PageSpans clip_pages_, unet_pages_, vae_pages_;
  bool release_idle_ = true;
  std::unique_ptr<ClipTextEncoder> clip_;
  std::unique_ptr<Unet> unet_;
  std::unique_ptr<Vae> vae_;
};

// Multiply-adds x 2 of one UNet evaluation of one sample at a latent size
// (convolutions, linear layers, attention products; norms and element-wise
// ops are left out: < 1%). For `bench image`'s achieved FLOP/s.
double unet_flops(const UnetConfig& config, int latent_h, int latent_w, int context_tokens = 77);

// Times UNet evaluations of `batch` samples at a latent size (random latents,
// spread timesteps, a 77-token context of zeros): one warm-up call, then
// `reps` timed ones. For `bench image`.
struct UnetTiming {
  double seconds_per_step = 0;   // one call over the whole batch
  double flops_per_step = 0;     // unet_flops x batch
  double gflop_per_s = 0;
};
UnetTiming time_unet(const SdModel& model, int batch, int latent_h, int latent_w, int reps,
                     kernels::Backend& backend);

// ---- synthetic checkpoints (sd_synth.cpp)
struct SdSynthSpec {
  std::string arch = "sd15";  // "sd15" (OpenAI CLIP L/14, 768 context) or "sd21" (OpenCLIP H/14, 1024, v)
  double width_mult = 1.0;    // channels scaled, rounded to multiples of 32 (group norm's 32 groups)
  int unet_heads = 0;         // 0: SD1 8 heads / SD2 64-wide heads (fewer for narrow models)
  int clip_layers = 0;        // 0: 12 (sd15) / 24 (sd21)
  std::string type = "f16";   // f32, f16, bf16
  uint64_t seed = 1;
};
// Writes a single-file checkpoint in the original layout with deterministic
// random weights (each tensor from the seed and its name; scaled by
// 1/sqrt(fan_in) so activations stay O(1) through the network). Metadata
// records the head counts and the prediction type. Throws Error.
void write_synthetic_sd(const SdSynthSpec& spec, const std::string& path);
// Parameters the spec's checkpoint will hold (for messages, before writing).
int64_t synthetic_sd_parameters(const SdSynthSpec& spec);

}  // namespace atelier::image
