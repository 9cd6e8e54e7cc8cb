// AVX2 helpers of the image ops (image_ops_avx2.cpp). Private to kernels/cpu.
#pragma once

#include <atelier/kernels.h>

#include <cstdint>

namespace atelier::kernels::cpu::avx2 {

// x[i] = exp(x[i] - m) for i < n; returns the sum of the new values.
float exp_shift_sum(float* x, int64_t n, float m);
void activation(Activation a, const float* x, float* y, int64_t n);
// y[i] = value[i] * gelu(gate[i]) (erf GELU).
void geglu_row(const float* value, const float* gate, float* y, int64_t n);

}  // namespace atelier::kernels::cpu::avx2
