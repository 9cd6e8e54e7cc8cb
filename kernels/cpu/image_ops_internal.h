// The per-level image ops: AVX2 helpers and conv2d / attention
// (image_ops_avx2.cpp), the AVX-512 conv2d / attention (image_ops_avx512.cpp),
// both from image_ops_x86.inc. Private to kernels/cpu.
#pragma once

#include <atelier/kernels.h>

#include <cstdint>

namespace atelier::kernels::cpu {

// Runs fn over [0, n) on the executor when there is one and more than one unit.
template <class Fn>
void run_parallel(Executor* ex, int64_t n, Fn&& fn) {
  if (n <= 0) return;
  if (!ex || n == 1) {  // a one-thread pool still slices under a cancel flag (engine core/cancel.h)
    fn(int64_t{0}, n);
    return;
  }
  ex->parallel_for(n, [&](int64_t b, int64_t e) { fn(b, e); });
}

}  // namespace atelier::kernels::cpu

namespace atelier::kernels::cpu::avx2 {

// x[i] = exp(x[i] - m) for i < n; returns the sum of the new values.
float exp_shift_sum(float* x, int64_t n, float m);
void activation(Activation a, const float* x, float* y, int64_t n);
// y[i] = value[i] * gelu(gate[i]) (erf GELU).
void geglu_row(const float* value, const float* gate, float* y, int64_t n);
void glu_row(Activation a, const float* gate, const float* up, float* y, int64_t n);
// The avx2 level's conv2d and attention (image_ops_x86.inc, 8 lanes); same
// contracts as the avx512 ones below.
void conv2d(const Conv2dShape& s, const float* x, DType w_type, const void* weight, const float* bias, float* y,
            Executor* ex);
void attention(const AttentionShape& s, const float* q, const float* k, const float* v, float* out, Executor* ex);

}  // namespace atelier::kernels::cpu::avx2

namespace atelier::kernels::cpu::avx512 {

// The avx512 level's conv2d (direct blocked GEMM over output pixels; F32, F16
// or BF16 weights) and attention (register-tiled flash attention); same
// contracts as the public entry points (shape already validated).
void conv2d(const Conv2dShape& s, const float* x, DType w_type, const void* weight, const float* bias, float* y,
            Executor* ex);
void attention(const AttentionShape& s, const float* q, const float* k, const float* v, float* out, Executor* ex);

}  // namespace atelier::kernels::cpu::avx512
