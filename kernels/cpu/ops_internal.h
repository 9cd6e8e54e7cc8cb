// AVX2 variants of the element-wise ops (ops_avx2.cpp). Private to kernels/cpu.
#pragma once

#include <cstdint>

namespace atelier::kernels {
struct AttnHeads;
}

namespace atelier::kernels::cpu::avx2 {

void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps);
void softmax(float* x, int64_t n);
void swiglu(const float* gate, const float* up, float* out, int64_t n);
float dot_f32(const float* a, const float* b, int64_t n);
void axpy_f32(float a, const float* x, float* y, int64_t n);
float dot_f16_f32(const uint16_t* a, const float* b, int64_t n);
void axpy_f16(float a, const uint16_t* x, float* y, int64_t n);
void f32_to_fp16_row(const float* x, uint16_t* y, int64_t n);
void dot_f32_heads(const float* rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, const float* q,
                   float* scores, int64_t scores_stride);
void dot_f16_heads(const uint16_t* rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, const float* q,
                   float* scores, int64_t scores_stride);
void dot_f32_heads_queries(const float* rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, int nq,
                           const float* const* q, float* const* scores, const int64_t* scores_stride);
void dot_f16_heads_queries(const uint16_t* rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, int nq,
                           const float* const* q, float* const* scores, const int64_t* scores_stride);
void axpy_f32_rows(const float* a, const float* rows, int64_t stride, int64_t n_rows, float* y, int64_t n);
void axpy_f16_rows(const float* a, const uint16_t* rows, int64_t stride, int64_t n_rows, float* y, int64_t n);
// Bit-identical to cpu::quantize_act_q8_0 / quantize_act_q8_K (quants.cpp);
// the block types are quants.h's ActQ8_0 / BlockQ8_K.
void quantize_act_q8_0(const float* x, void* y, int64_t n, int group);
void quantize_act_q8_K(const float* x, void* y, int64_t n);
void fp16_to_f32_row(const uint16_t* x, float* y, int64_t n);
int64_t indices_at_least(const float* x, int64_t n, float bound, int32_t* idx);

}  // namespace atelier::kernels::cpu::avx2

// AVX-512 attention runs (ops_avx512.cpp). The dots (attn_dots_x86.inc, as
// AVX2's) sum their lanes in another order than AVX2's; the value sums (one
// FMA per position per element, in order) are bit-identical to AVX2's.
namespace atelier::kernels::cpu::avx512 {
int64_t indices_at_least(const float* x, int64_t n, float bound, int32_t* idx);
void dot_f32_heads(const float* rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, const float* q,
                   float* scores, int64_t scores_stride);
void dot_f16_heads(const uint16_t* rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, const float* q,
                   float* scores, int64_t scores_stride);
void dot_f32_heads_queries(const float* rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, int nq,
                           const float* const* q, float* const* scores, const int64_t* scores_stride);
void dot_f16_heads_queries(const uint16_t* rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, int nq,
                           const float* const* q, float* const* scores, const int64_t* scores_stride);
void axpy_f32_rows(const float* a, const float* rows, int64_t stride, int64_t n_rows, float* y, int64_t n);
void axpy_f16_rows(const float* a, const uint16_t* rows, int64_t stride, int64_t n_rows, float* y, int64_t n);
}  // namespace atelier::kernels::cpu::avx512
