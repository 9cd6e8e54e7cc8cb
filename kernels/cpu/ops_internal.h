// AVX2 variants of the element-wise ops (ops_avx2.cpp). Private to kernels/cpu.
#pragma once

#include <atelier/kernels.h>

#include <cstdint>
#include <type_traits>

namespace atelier::kernels::cpu {
// Where a run's element lies (for prefetches) and the bytes of n elements,
// for the three kinds of cached rows (kernels.h's Q8Rows for Q8_0).
inline const char* run_bytes_at(const float* p) { return reinterpret_cast<const char*>(p); }
inline const char* run_bytes_at(const uint16_t* p) { return reinterpret_cast<const char*>(p); }
// Offsets are never negative: unsigned, the block and the value within it are
// a shift and a mask (signed, GCC emits a rounding fix-up for each, per row).
inline const char* run_bytes_at(Q8Rows p) {
  return reinterpret_cast<const char*>(p.blocks) + static_cast<uint64_t>(p.elem) / kQ8BlockElems * kQ8BlockBytes;
}
template <class P>
constexpr int64_t run_slice_bytes(int64_t n) {
  if constexpr (std::is_same_v<P, Q8Rows>) return (n + kQ8BlockElems - 1) / kQ8BlockElems * kQ8BlockBytes;
  else return n * static_cast<int64_t>(sizeof(*P{}));
}
// The first n_elems elements of n_rows rows of a run (stride elements
// apart) towards L1: attention asks for rows a block of work ahead, where
// the hardware prefetchers lose a stream split among heads and threads.
template <class P>
inline void prefetch_slices(P first, int64_t stride, int64_t n_rows, int64_t n_elems) {
  const int64_t bytes = run_slice_bytes<P>(n_elems);
  for (int64_t r = 0; r < n_rows; ++r) {
    const char* p = run_bytes_at(first + r * stride);
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 3);
    __builtin_prefetch(p + bytes - 1, 0, 3);  // the last line, when the slice straddles one more
  }
}
// Element p of a Q8_0 run: its block's fp16 scale and int8 value.
inline uint16_t q8_scale_bits(Q8Rows p) {
  const char* b = run_bytes_at(p);
  return static_cast<uint16_t>(static_cast<uint8_t>(b[0]) | static_cast<uint8_t>(b[1]) << 8);
}
inline const int8_t* q8_values(Q8Rows p) {
  return reinterpret_cast<const int8_t*>(run_bytes_at(p)) + 2 + static_cast<uint64_t>(p.elem) % kQ8BlockElems;
}
}  // namespace atelier::kernels::cpu

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
void dot_q8_0_heads(Q8Rows rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, const float* q, float* scores,
                    int64_t scores_stride);
void dot_q8_0_heads_queries(Q8Rows rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, int nq,
                            const float* const* q, float* const* scores, const int64_t* scores_stride);
void axpy_q8_0_rows(const float* a, Q8Rows rows, int64_t stride, int64_t n_rows, float* y, int64_t n);
// Up to kAttnQueries rows at once (a[j], y[j]), each exactly its own *_rows call.
void axpy_f32_rows_queries(int nq, const float* const* a, const float* rows, int64_t stride, int64_t n_rows,
                           float* const* y, int64_t n);
void axpy_f16_rows_queries(int nq, const float* const* a, const uint16_t* rows, int64_t stride, int64_t n_rows,
                           float* const* y, int64_t n);
void axpy_q8_0_rows_queries(int nq, const float* const* a, Q8Rows rows, int64_t stride, int64_t n_rows,
                            float* const* y, int64_t n);
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
void dot_q8_0_heads(Q8Rows rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, const float* q, float* scores,
                    int64_t scores_stride);
void dot_q8_0_heads_queries(Q8Rows rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, int nq,
                            const float* const* q, float* const* scores, const int64_t* scores_stride);
void axpy_q8_0_rows(const float* a, Q8Rows rows, int64_t stride, int64_t n_rows, float* y, int64_t n);
}  // namespace atelier::kernels::cpu::avx512
