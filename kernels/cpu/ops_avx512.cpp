// AVX-512 attention runs: the score dots and value sums over contiguous
// cached positions (dot_*_heads, axpy_*_heads).
//
// Dots: 8 (position, head) pairs at a time, each with its own 16-lane
// accumulator (one FMA per 16 elements, in element order) summed by one fixed
// tree per pair (reduce8). A pair's result therefore depends only on its own
// row and query, never on how many positions or heads the run has or where it
// starts: the paged and the contiguous KV caches give the same scores, and so
// does any split of the heads. At head size 64 this is about twice the AVX2
// one-row dot (one horizontal sum per 8 pairs instead of one per pair).
//
// Sums: one FMA per position per element in position order, exactly as the
// AVX2 and scalar code do, so results are bit-identical to them; the wider
// registers only halve the instruction count.
//
// Several heads are walked position by position (every head of a cached row,
// then the next row): the run streams through once in address order, which
// the hardware prefetchers follow; head by head, each pass would stride
// through the rows, taking a sliver of each.
#include <immintrin.h>

#include <atelier/kernels.h>

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

// Position by position, every head: (position, head) pairs in address order,
// 8 at a time through dot_rows' per-pair arithmetic (its FMA chain and lane
// tree), so each pair's score is the one a one-head run gives.
template <class L>
AI void dot_heads(const typename L::T* rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, const float* q,
                  float* scores, int64_t scores_stride) {
  const int64_t n = hs.head_dim, full = n / 16 * 16;
  if (hs.h1 - hs.h0 == 1) return dot_rows<L>(rows + (hs.h0 / hs.group) * n, stride, n_rows, q + hs.h0 * n, n, scores);
  const __mmask16 tm = tail16(n - full);
  constexpr int64_t kPrefetchRows = 2;
  const int64_t row_bytes = ((hs.h1 - 1) / hs.group + 1) * n * static_cast<int64_t>(sizeof(typename L::T));
  int64_t r = 0;
  int h = hs.h0;
  while (r < n_rows) {
    const typename L::T* p[8];
    const float* x[8];
    float* o[8];
    int cnt = 0;
    for (; cnt < 8 && r < n_rows; ++cnt) {
      if (h == hs.h0 && r + kPrefetchRows < n_rows) {
        // A row's first pair: fetch the row kPrefetchRows on (every line of
        // it). In place, the score pass read 8-20 % faster with this; the
        // value pass measured no gain from the same.
        const char* ahead = reinterpret_cast<const char*>(rows + (r + kPrefetchRows) * stride);
        for (int64_t o = 0; o < row_bytes; o += 64) _mm_prefetch(ahead + o, _MM_HINT_T0);
      }
      p[cnt] = rows + r * stride + (h / hs.group) * n;
      x[cnt] = q + h * n;
      o[cnt] = scores + (h - hs.h0) * scores_stride + r;
      if (++h == hs.h1) h = hs.h0, ++r;
    }
    for (int j = cnt; j < 8; ++j) p[j] = p[0], x[j] = x[0];  // dummies repeat the first pair
    __m512 acc[8];
    for (auto& v : acc) v = _mm512_setzero_ps();
    for (int64_t i = 0; i < full; i += 16) {
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) acc[j] = _mm512_fmadd_ps(L::load(p[j] + i), _mm512_loadu_ps(x[j] + i), acc[j]);
    }
    if (tm) {
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j)
        acc[j] = _mm512_fmadd_ps(L::load(p[j] + full, tm), _mm512_maskz_loadu_ps(tm, x[j] + full), acc[j]);
    }
    alignas(32) float s[8];
    _mm256_store_ps(s, reduce8(acc));
    for (int j = 0; j < cnt; ++j) *o[j] = s[j];
  }
}

// Position by position, every head, y in memory (a head's floats per position
// come from L1); per element the same FMA sequence as axpy_rows.
template <class L>
AI void axpy_heads(const float* a, int64_t a_stride, const typename L::T* rows, int64_t stride, int64_t n_rows,
                   const AttnHeads& hs, float* y) {
  const int64_t n = hs.head_dim;
  if (hs.h1 - hs.h0 == 1) return axpy_rows<L>(a, rows + (hs.h0 / hs.group) * n, stride, n_rows, y + hs.h0 * n, n);
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int h = hs.h0; h < hs.h1; ++h) {
      const __m512 va = _mm512_set1_ps(a[(h - hs.h0) * a_stride + r]);
      const typename L::T* p = rows + r * stride + (h / hs.group) * n;
      float* yh = y + h * n;
      int64_t i = 0;
      for (; i + 16 <= n; i += 16) _mm512_storeu_ps(yh + i, _mm512_fmadd_ps(va, L::load(p + i), _mm512_loadu_ps(yh + i)));
      if (i < n) {
        const __mmask16 m = tail16(n - i);
        _mm512_mask_storeu_ps(yh + i, m, _mm512_fmadd_ps(va, L::load(p + i, m), _mm512_maskz_loadu_ps(m, yh + i)));
      }
    }
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

void dot_f32_heads(const float* rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, const float* q,
                   float* scores, int64_t scores_stride) {
  dot_heads<F32>(rows, stride, n_rows, hs, q, scores, scores_stride);
}
void dot_f16_heads(const uint16_t* rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, const float* q,
                   float* scores, int64_t scores_stride) {
  dot_heads<F16>(rows, stride, n_rows, hs, q, scores, scores_stride);
}
void axpy_f32_heads(const float* a, int64_t a_stride, const float* rows, int64_t stride, int64_t n_rows,
                    const AttnHeads& hs, float* y) {
  axpy_heads<F32>(a, a_stride, rows, stride, n_rows, hs, y);
}
void axpy_f16_heads(const float* a, int64_t a_stride, const uint16_t* rows, int64_t stride, int64_t n_rows,
                    const AttnHeads& hs, float* y) {
  axpy_heads<F16>(a, a_stride, rows, stride, n_rows, hs, y);
}

}  // namespace atelier::kernels::cpu::avx512
