// The CLIP text encoders of Stable Diffusion: OpenAI CLIP ViT-L/14 (SD1:
// Hugging Face CLIPTextModel names, quick_gelu) and OpenCLIP ViT-H/14 (SD2:
// OpenCLIP names, erf GELU, the penultimate layer's output). Both are
// pre-norm transformers over 77 positions with a causal mask:
//   x = tok_emb[id] + pos_emb
//   per layer: x += out(attn(ln1(x))) ; x += fc2(act(fc1(ln2(x))))
//   out = final_ln(x after `layers_used` layers)
// Every step is a backend op (the 77 x 77 causal attention is the backend's
// causal_attention over the fused qkv rows); activations live in one
// workspace buffer of the backend.
#pragma once

#include <atelier/backend.h>
#include <atelier/kernels.h>

#include <memory>

#include "image/sd_model.h"
#include "image/sd_weights.h"
#include "image/workspace.h"

namespace atelier::image {

// The text encoder's shape from tensor names and shapes (and, for what they
// cannot say, metadata); throws Error when neither layout is present.
ClipConfig detect_clip(const WeightStore& ws, int clip_skip);

class ClipTextEncoder {
 public:
  static std::unique_ptr<ClipTextEncoder> load(const WeightStore& ws, const ClipConfig& config);
  ~ClipTextEncoder();
  const ClipConfig& config() const { return cfg_; }
  int64_t weight_bytes() const;

  // One chunk: 77 ids -> out [77][width] (the hidden states after the final
  // layer norm, no emphasis).
  // On the CPU backend over `ex`, or on `backend`.
  void encode(const int32_t* ids, float* out, kernels::Executor* ex = nullptr) const;
  void encode(const int32_t* ids, float* out, kernels::Backend& backend) const;

  struct Layer;  // clip_text.cpp

 private:
  ClipTextEncoder();
  void check_ids(const int32_t* ids) const;
  int64_t workspace_floats() const;
  void run(Workspace::Lease& ws, const int32_t* ids, float* out) const;
  ClipConfig cfg_;
  mutable Workspace work_;
  Weight tokens_;                 // [vocab][width] in the file's type; rows widened on lookup
  Param positions_;               // [77][width]
  std::vector<std::unique_ptr<Layer>> layers_;
  Param final_w_, final_b_;
};

}  // namespace atelier::image
