// SD's AutoencoderKL (ldm diffusionmodules/model.py Encoder and Decoder),
// original names under `first_stage_model.`:
//   encoder: conv_in; per level 2 ResnetBlocks, then (except the last) a
//            stride-2 conv after padding right/bottom by one; mid (ResnetBlock,
//            AttnBlock, ResnetBlock); GroupNorm+SiLU; conv_out -> 2 x latent
//            channels (mean | logvar); quant_conv (1x1)
//   decoder: post_quant_conv (1x1); conv_in; mid; per level from the last 3
//            ResnetBlocks, then (except level 0) nearest 2x + conv;
//            GroupNorm+SiLU; conv_out -> RGB
// ResnetBlock: x (or nin_shortcut(x)) + conv2(gn_silu(conv1(gn_silu(x)))),
// GroupNorm 32 groups, eps 1e-6. AttnBlock: one head over all pixels,
// 1x1-conv q/k/v/proj_out (linears in diffusers files: the same matrices).
#pragma once

#include <atelier/kernels.h>

#include <memory>

#include "image/sd_model.h"
#include "image/sd_weights.h"
#include "image/workspace.h"

namespace atelier::image {

VaeConfig detect_vae(const WeightStore& ws);

class Vae {
 public:
  static std::unique_ptr<Vae> load(const WeightStore& ws, const VaeConfig& config);
  ~Vae();
  const VaeConfig& config() const { return cfg_; }
  int64_t weight_bytes() const;

  // See SdModel::vae_decode / vae_encode.
  std::vector<float> decode(const float* latent, int h, int w, kernels::Executor* ex = nullptr) const;
  std::vector<float> encode(const float* rgb, int h, int w, kernels::Executor* ex = nullptr) const;
  // The same on `backend` (every step a backend op, activations in one
  // reused workspace buffer of it).
  std::vector<float> decode(const float* latent, int h, int w, kernels::Backend& backend) const;
  std::vector<float> encode(const float* rgb, int h, int w, kernels::Backend& backend) const;

  // Floats of the workspace decode() of a latent H x W / encode() of a picture H x W takes.
  int64_t decode_floats(int h, int w) const;
  int64_t encode_floats(int h, int w) const;
  bool has_encoder() const { return enc_ != nullptr; }

  struct Half;  // vae.cpp: one of encoder / decoder

 private:
  Vae();
  struct Sizes {
    int64_t slot = 0, attn = 0;  // elements of the largest activation, of the mid attention's
    int64_t stage = 0;           // F32 staging of the host's input and output
  };
  Sizes decode_sizes(int64_t h, int64_t w) const;
  Sizes encode_sizes(int64_t h, int64_t w) const;
  void check_encode(int h, int w) const;
  std::vector<float> decode(Workspace::Lease& ws, const float* latent, int h, int w) const;
  std::vector<float> encode(Workspace::Lease& ws, const float* rgb, int h, int w) const;
  VaeConfig cfg_;
  mutable Workspace work_;
  std::unique_ptr<Half> enc_, dec_;
};

}  // namespace atelier::image
