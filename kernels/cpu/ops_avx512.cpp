// AVX-512 runs of rows: the attention's score dots and value sums over
// contiguous cached positions (dot_*_rows, axpy_*_rows).
//
// Dots: 8 positions at a time, each with its own 16-lane accumulator (one FMA
// per 16 elements, in element order) summed by one fixed tree per position
// (reduce8). A position's result therefore depends only on its own row and x,
// never on how many positions the run has or where the run starts: the paged
// and the contiguous KV caches give the same scores. At head size 64 this is
// about twice the AVX2 one-row dot (one horizontal sum per 8 positions instead
// of one per position).
//
// Sums: one FMA per position per element in position order, exactly as the
// AVX2 and scalar code do, so results are bit-identical to them; the wider
// registers only halve the instruction count.
#include <immintrin.h>

#include "ops_internal.h"

namespace atelier::kernels::cpu::avx512 {

namespace {

#define AI __attribute__((always_inline)) inline

AI __mmask16 tail16(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }

struct F32 {
  using T = float;
  AI static __m512 load(const float* p) { return _mm512_loadu_ps(p); }
  AI static __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
};
struct F16 {
  using T = uint16_t;
  AI static __m512 load(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  AI static __m512 load(const uint16_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
};

// Lane sums of 8 accumulators: out[i] = sum of v[i]'s 16 lanes. Every
// position goes through the same tree (halves of 256, then 128, then pairs),
// whatever the other seven hold.
AI __m256 reduce8(const __m512 (&v)[8]) {
  __m256 h[8];
  for (int i = 0; i < 8; ++i) h[i] = _mm256_add_ps(_mm512_castps512_ps256(v[i]), _mm512_extractf32x8_ps(v[i], 1));
  // 128-bit halves: [h0.lo+h0.hi | h4.lo+h4.hi] etc.
  __m256 q[4];
  for (int i = 0; i < 4; ++i)
    q[i] = _mm256_add_ps(_mm256_permute2f128_ps(h[i], h[i + 4], 0x20), _mm256_permute2f128_ps(h[i], h[i + 4], 0x31));
  // q[i] lanes: position i (lanes 0..3), position i + 4 (lanes 4..7)
  const __m256 a = _mm256_hadd_ps(q[0], q[1]);  // [p0 01, p0 23, p1 01, p1 23 | p4.., p5..]
  const __m256 b = _mm256_hadd_ps(q[2], q[3]);  // [p2 .., p3 .. | p6 .., p7 ..]
  return _mm256_hadd_ps(a, b);                  // [p0, p1, p2, p3 | p4, p5, p6, p7]
}

template <class L>
AI void dot_rows(const typename L::T* rows, int64_t stride, int64_t n_rows, const float* x, int64_t n, float* out) {
  const int64_t full = n / 16 * 16;
  const __mmask16 tm = tail16(n - full);
  int64_t r = 0;
  for (; r < n_rows; r += 8) {
    const int nr = n_rows - r < 8 ? static_cast<int>(n_rows - r) : 8;
    __m512 acc[8];
    for (auto& v : acc) v = _mm512_setzero_ps();
    const typename L::T* p[8];
    for (int j = 0; j < 8; ++j) p[j] = rows + (r + (j < nr ? j : 0)) * stride;  // dummies repeat row r
    for (int64_t i = 0; i < full; i += 16) {
      const __m512 xv = _mm512_loadu_ps(x + i);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) acc[j] = _mm512_fmadd_ps(L::load(p[j] + i), xv, acc[j]);
    }
    if (tm) {
      const __m512 xv = _mm512_maskz_loadu_ps(tm, x + full);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) acc[j] = _mm512_fmadd_ps(L::load(p[j] + full, tm), xv, acc[j]);
    }
    const __m256 s = reduce8(acc);
    if (nr == 8) _mm256_storeu_ps(out + r, s);
    else _mm256_mask_storeu_ps(out + r, static_cast<__mmask8>((1u << nr) - 1), s);
  }
}

template <class L>
AI void axpy_rows(const float* a, const typename L::T* rows, int64_t stride, int64_t n_rows, float* y, int64_t n) {
  constexpr int kV = 4;  // 64 elements of y in registers
  int64_t i = 0;
  for (; i + 16 * kV <= n; i += 16 * kV) {
    __m512 acc[kV];
    for (int j = 0; j < kV; ++j) acc[j] = _mm512_loadu_ps(y + i + 16 * j);
    for (int64_t r = 0; r < n_rows; ++r) {
      const __m512 va = _mm512_set1_ps(a[r]);
      const typename L::T* p = rows + r * stride + i;
      for (int j = 0; j < kV; ++j) acc[j] = _mm512_fmadd_ps(va, L::load(p + 16 * j), acc[j]);
    }
    for (int j = 0; j < kV; ++j) _mm512_storeu_ps(y + i + 16 * j, acc[j]);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : tail16(n - i);
    __m512 acc = _mm512_maskz_loadu_ps(m, y + i);
    for (int64_t r = 0; r < n_rows; ++r) acc = _mm512_fmadd_ps(_mm512_set1_ps(a[r]), L::load(rows + r * stride + i, m), acc);
    _mm512_mask_storeu_ps(y + i, m, acc);
  }
}

#undef AI

}  // namespace

void dot_f32_rows(const float* rows, int64_t stride, int64_t n_rows, const float* x, int64_t n, float* out) {
  dot_rows<F32>(rows, stride, n_rows, x, n, out);
}
void dot_f16_rows(const uint16_t* rows, int64_t stride, int64_t n_rows, const float* x, int64_t n, float* out) {
  dot_rows<F16>(rows, stride, n_rows, x, n, out);
}
void axpy_f32_rows(const float* a, const float* rows, int64_t stride, int64_t n_rows, float* y, int64_t n) {
  axpy_rows<F32>(a, rows, stride, n_rows, y, n);
}
void axpy_f16_rows(const float* a, const uint16_t* rows, int64_t stride, int64_t n_rows, float* y, int64_t n) {
  axpy_rows<F16>(a, rows, stride, n_rows, y, n);
}

}  // namespace atelier::kernels::cpu::avx512
