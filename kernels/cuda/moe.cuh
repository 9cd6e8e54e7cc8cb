// Mixtures of experts on the device: routing (moe_route), the experts'
// weighted sum (moe_combine) and gpt-oss's clamped SwiGLU. The experts'
// products (matmul_id) are in matmul.cuh, beside the kernels they share.
#pragma once

#include "common.cuh"

namespace atelier::kernels::cuda {

void moe_route(cudaStream_t s, Act logits, int64_t rows, const MoeRouting& r, int32_t* ids, float* weights);
void moe_combine(cudaStream_t s, Act y, const float* weights, Act out, int64_t rows, int k, int64_t dim);
void swiglu_oai(cudaStream_t s, Act gate, Act up, Act out, int64_t rows, int64_t dim, float alpha, float limit);

}  // namespace atelier::kernels::cuda
