// The SD 1.x / 2.x UNet (ldm openaimodel.UNetModel with SpatialTransformer
// blocks), in the original layout's names (`model.diffusion_model.*`):
//   time_embed (timestep_embedding(t, C) -> linear, SiLU, linear)
//   input_blocks: conv_in; per level: 2 x (ResBlock [+ SpatialTransformer]),
//                 then a stride-2 conv except at the last level
//   middle_block: ResBlock, SpatialTransformer, ResBlock
//   output_blocks: per level from the last: 3 x (ResBlock over [h | skip]
//                 [+ SpatialTransformer]), then nearest-2x + conv except at level 0
//   out: GroupNorm + SiLU, conv
// ResBlock: x + (or 1x1 skip conv of x) conv(gn_silu(conv(gn_silu(x)) + linear(silu(emb)))),
//   GroupNorm 32 groups, eps 1e-5.
// SpatialTransformer: x + proj_out(blocks(proj_in(gn(x)))) with GroupNorm eps
//   1e-6; block: self-attention, cross-attention on the context, GEGLU
//   feed-forward, each pre-LayerNorm (eps 1e-5) and residual. proj_in/out are
//   1x1 convs (SD1) or linears (SD2): the same per-pixel matrix either way.
// Every op runs over the whole batch (convs with n = batch, linears over
// batch x pixels rows, attention per sample): the kernels compute each image,
// row and head independently, so a sample's output does not depend on the
// batch.
#pragma once

#include <atelier/kernels.h>

#include <memory>

#include "image/sd_model.h"
#include "image/sd_weights.h"
#include "image/workspace.h"

namespace atelier::image {

// The UNet's shape from names and shapes; heads from options / metadata.
// sd2_default: the version's default head rule (64-wide heads) when nothing says.
UnetConfig detect_unet(const WeightStore& ws, const SdOptions& options, bool sd2_default);

class Unet {
 public:
  static std::unique_ptr<Unet> load(const WeightStore& ws, const UnetConfig& config);
  ~Unet();
  const UnetConfig& config() const { return cfg_; }
  int64_t weight_bytes() const;

  // See SdModel::unet.
  void forward(const UnetBatch& in, float* out, kernels::Executor* ex = nullptr) const;
  // The same on `backend`: every step a backend op, activations, skips and
  // inputs in one workspace buffer of it (grown to the largest batch and
  // latent size seen, then reused).
  void forward(const UnetBatch& in, float* out, kernels::Backend& backend) const;
  // Bytes of the workspace forward() takes for BATCH samples of a latent
  // HEIGHT x WIDTH, each with CTX_TOKENS of context (for admission: a job
  // that cannot fit is refused before it starts).
  int64_t workspace_bytes(int batch, int height, int width, int ctx_tokens) const;

  struct Block;  // unet.cpp

 private:
  Unet();
  struct Plan {
    int64_t slot = 0;            // floats of the largest activation
    std::vector<int64_t> skips;  // floats of each input block's output
    int64_t attn = 0;            // n * c * hw of the largest SpatialTransformer
    int64_t attn_scratch = 0;    // the largest SpatialTransformer's scratch (its c and hw)
    int64_t emb = 0;             // n * c_out of the widest ResBlock
    int64_t ctx = 0, max_lk = 0; // the contexts' floats, the longest one's tokens
    int64_t stage = 0;           // F32 staging of the inputs and the output
    int64_t floats = 0;          // the whole workspace
  };
  void check(const UnetBatch& in) const;
  Plan plan(const UnetBatch& in) const;
  Plan plan_sizes(int64_t n, int64_t h, int64_t w, int64_t ctx_floats, int64_t max_lk) const;
  void forward(Workspace::Lease& ws, const Plan& p, const UnetBatch& in, float* out) const;
  mutable Workspace work_;
  UnetConfig cfg_;
  Weight temb1_, temb2_;
  Param temb1_b_, temb2_b_;
  std::vector<std::unique_ptr<Block>> input_, output_;
  std::unique_ptr<Block> middle_;
  Param out_norm_w_, out_norm_b_;
  std::unique_ptr<Block> out_conv_;
};

}  // namespace atelier::image
