// Norms (statistics in FP32) and RoPE on the device.
#pragma once

#include "common.cuh"

namespace atelier::kernels::cuda {

void rms_norm(cudaStream_t s, Act x, const float* weight, Act y, int64_t rows, int64_t dim, float eps);
void add_rms_norm(cudaStream_t s, Act x, Act delta, const float* weight, Act y, int64_t rows, int64_t dim, float eps);
void layer_norm(cudaStream_t s, Act x, Act y, int64_t rows, int64_t dim, const float* gamma, const float* beta,
                float eps);
void rope(cudaStream_t s, Act x, int64_t rows, const int32_t* positions, const RopeParams& p);

}  // namespace atelier::kernels::cuda
