// The mixture-of-experts feed-forward of a decoder layer (llama.cpp's
// build_moe_ffn): the router's logits, top-k routing with the model's gating,
// the chosen experts' gate and up products (each expert's matrix once over
// the rows routed to it: Backend::matmul_id), the activation, the down
// products, and the routing weights' sum of them. Every step is one
// row-batched backend op; a token's result never depends on the others of
// the step (routing is per token, the products batch-invariant).
#pragma once

#include <atelier/backend.h>

#include <cstdint>
#include <memory>

namespace atelier::text {

struct LlamaHparams;
struct LlamaLayer;

// A layer's expert biases in device memory (nullptr: none).
struct MoeVectors {
  const float *gate_inp_b = nullptr, *gate_exps_b = nullptr, *up_exps_b = nullptr, *down_exps_b = nullptr;
};

class MoeFfn {
 public:
  explicit MoeFfn(kernels::Backend& be) : be_(be) {}
  // out = the experts' weighted sum for rows of xn (rows x n_embd); out may not be xn.
  void forward(const LlamaHparams& hp, const LlamaLayer& L, const MoeVectors& V, kernels::Act xn, kernels::Act out,
               int64_t rows);
  // Sizes the workspace for steps of up to `rows` rows (no step up to it allocates).
  void reserve(const LlamaHparams& hp, int64_t rows);
  // Device bytes of that workspace.
  static int64_t workspace_bytes(const LlamaHparams& hp, int64_t rows, kernels::DType act);

 private:
  kernels::Backend& be_;
  std::unique_ptr<kernels::Buffer> work_;
  int64_t cap_ = 0;
  kernels::Act logits_, gate_, up_, down_;
  int32_t* ids_ = nullptr;
  float* weights_ = nullptr;
};

}  // namespace atelier::text
