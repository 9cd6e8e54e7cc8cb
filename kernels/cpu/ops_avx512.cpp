// AVX-512 attention runs: the score dots and value sums over contiguous
// cached positions (dot_*_heads, axpy_*_heads).
//
// Dots: attn_dots_x86.inc with V = 16 f32 lanes (its comment says how a
// pair's score is kept independent of the run).
//
// Sums: one FMA per position per element in position order, exactly as the
// AVX2 and scalar code do, so results are bit-identical to them; the wider
// registers only halve the instruction count.
#include <immintrin.h>

#include <atelier/kernels.h>

#include "ops_internal.h"

namespace atelier::kernels::cpu::avx512 {

namespace {

#define AI __attribute__((always_inline)) inline

AI __mmask16 tail16(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }

struct F32 {
  using T = const float*;
  AI static __m512 load(const float* p) { return _mm512_loadu_ps(p); }
  AI static __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
};
struct F16 {
  using T = const uint16_t*;
  AI static __m512 load(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  AI static __m512 load(const uint16_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
};

// Lane sums of 8 accumulators: out[i] = sum of v[i]'s 16 lanes. Every
// position goes through the same tree (halves of 256, then 128, then pairs),
// whatever the other seven hold.
AI __m256 lane_sums8(const __m512 (&v)[8]) {
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

struct V {
  using reg = __m512;
  using Tail = __mmask16;
  static constexpr int64_t kLanes = 16;
  AI static reg zero() { return _mm512_setzero_ps(); }
  AI static reg fmadd(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  AI static Tail tail(int64_t n) { return tail16(n); }
  AI static reg loadx(const float* p) { return _mm512_loadu_ps(p); }
  AI static reg loadx(const float* p, Tail m) { return _mm512_maskz_loadu_ps(m, p); }
  AI static reg load(const float* p) { return F32::load(p); }
  AI static reg load(const float* p, Tail m) { return F32::load(p, m); }
  AI static reg load(const uint16_t* p) { return F16::load(p); }
  AI static reg load(const uint16_t* p, Tail m) { return F16::load(p, m); }
  // A Q8_0 block: its values, and its scale converted once; load_q8(b, k) is
  // values 16k..16k+15 as fp16(d) * q (exact in f32).
  struct Q8Block {
    const int8_t* q;
    float d;
  };
  AI static Q8Block q8_block(Q8Rows p) { return {q8_values(p), _cvtsh_ss(q8_scale_bits(p))}; }
  AI static reg load_q8(const Q8Block& b, int k) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.q + 16 * k));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(b.d));
  }
  AI static __m256 reduce8(const reg (&v)[8]) { return lane_sums8(v); }
  AI static void store8(float* out, __m256 s, int nr) {
    if (nr == 8) _mm256_storeu_ps(out, s);
    else _mm256_mask_storeu_ps(out, static_cast<__mmask8>((1u << nr) - 1), s);
  }
};

}  // namespace

#include "attn_dots_x86.inc"

namespace {

template <class L>
AI void axpy_rows(const float* a, typename L::T rows, int64_t stride, int64_t n_rows, float* y, int64_t n) {
  constexpr int kV = 4;  // 64 elements of y in registers
  int64_t i = 0;
  for (; i + 16 * kV <= n; i += 16 * kV) {
    __m512 acc[kV];
    for (int j = 0; j < kV; ++j) acc[j] = _mm512_loadu_ps(y + i + 16 * j);
    for (int64_t r = 0; r < n_rows; ++r) {
      const __m512 va = _mm512_set1_ps(a[r]);
      const typename L::T p = rows + r * stride + i;
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

// 16 compares a step, the hits' indices compressed out of a lane-index vector.
int64_t indices_at_least(const float* x, int64_t n, float bound, int32_t* idx) {
  const __m512 b = _mm512_set1_ps(bound);
  const __m512i step = _mm512_set1_epi32(16);
  __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int64_t k = 0, i = 0;
  for (; i + 16 <= n; i += 16, lanes = _mm512_add_epi32(lanes, step)) {
    const __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), b, _CMP_GE_OQ);
    if (!m) continue;
    _mm512_mask_compressstoreu_epi32(idx + k, m, lanes);
    k += __builtin_popcount(m);
  }
  if (i < n) {
    const __mmask16 t = tail16(n - i);
    const __mmask16 m = _mm512_mask_cmp_ps_mask(t, _mm512_maskz_loadu_ps(t, x + i), b, _CMP_GE_OQ);
    _mm512_mask_compressstoreu_epi32(idx + k, m, lanes);
    k += __builtin_popcount(m);
  }
  return k;
}

void axpy_f32_rows(const float* a, const float* rows, int64_t stride, int64_t n_rows, float* y, int64_t n) {
  axpy_rows<F32>(a, rows, stride, n_rows, y, n);
}
void axpy_f16_rows(const float* a, const uint16_t* rows, int64_t stride, int64_t n_rows, float* y, int64_t n) {
  axpy_rows<F16>(a, rows, stride, n_rows, y, n);
}
// Whole blocks, as the AVX2 one: per row and block one scale, 2 registers of y.
void axpy_q8_0_rows(const float* a, Q8Rows rows, int64_t stride, int64_t n_rows, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += kQ8BlockElems) {
    __m512 acc[2] = {_mm512_loadu_ps(y + i), _mm512_loadu_ps(y + i + 16)};
    for (int64_t r = 0; r < n_rows; ++r) {
      const V::Q8Block b = V::q8_block(rows + r * stride + i);
      const __m512 va = _mm512_set1_ps(a[r]);
      for (int k = 0; k < 2; ++k) acc[k] = _mm512_fmadd_ps(va, V::load_q8(b, k), acc[k]);
    }
    _mm512_storeu_ps(y + i, acc[0]);
    _mm512_storeu_ps(y + i + 16, acc[1]);
  }
}

}  // namespace atelier::kernels::cpu::avx512
