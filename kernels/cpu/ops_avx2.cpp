// AVX2 + FMA + F16C element-wise ops. Partial last chunks go through masked
// loads, so every element sees the same arithmetic whatever n is.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include <atelier/kernels.h>

#include "avx2_math.h"
#include "ops_internal.h"
#include "quants.h"

namespace atelier::kernels::cpu::avx2 {

namespace {

__m256i tail_mask(int64_t n) {  // lanes [0, n) set, n < 8
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

float hmax(__m256 v) {
  __m128 lo = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_max_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_max_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

__m256 load_h(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
__m256 load_h_tail(const uint16_t* p, int64_t n) {
  uint16_t buf[8] = {};
  std::memcpy(buf, p, n * sizeof(uint16_t));
  return load_h(buf);
}

}  // namespace

void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  if (i < n) {
    const __m256 v = _mm256_maskload_ps(x + i, tail_mask(n - i));
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  const float scale = 1.0f / std::sqrt(hsum(acc) / static_cast<float>(n) + eps);
  const __m256 s = _mm256_set1_ps(scale);
  for (i = 0; i + 8 <= n; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), s);
    if (weight) v = _mm256_mul_ps(v, _mm256_loadu_ps(weight + i));
    _mm256_storeu_ps(y + i, v);
  }
  for (; i < n; ++i) y[i] = weight ? x[i] * scale * weight[i] : x[i] * scale;
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  __m256 mx = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + i));
  float max = hmax(mx);
  for (; i < n; ++i) max = std::fmax(max, x[i]);
  if (max == -INFINITY) max = 0;  // all masked: exp(-inf) = 0 everywhere
  const __m256 vmax = _mm256_set1_ps(max);
  __m256 sum = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax));
    _mm256_storeu_ps(x + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (i < n) {
    const __m256i mask = tail_mask(n - i);
    const __m256 v = _mm256_maskload_ps(x + i, mask);
    const __m256 e = _mm256_and_ps(exp_ps(_mm256_sub_ps(v, vmax)), _mm256_castsi256_ps(mask));
    _mm256_maskstore_ps(x + i, mask, e);
    sum = _mm256_add_ps(sum, e);
  }
  const float total = hsum(sum);
  const __m256 inv = _mm256_set1_ps(total > 0 ? 1.0f / total : 0.0f);
  for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  const float inv_s = total > 0 ? 1.0f / total : 0.0f;
  for (; i < n; ++i) x[i] *= inv_s;
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  auto step = [&](__m256 g, __m256 u) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, step(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i < n) {
    const __m256i mask = tail_mask(n - i);
    _mm256_maskstore_ps(out + i, mask, step(_mm256_maskload_ps(gate + i, mask), _mm256_maskload_ps(up + i, mask)));
  }
}

// Four 8-lane accumulators over 32-element steps, then one over 8, then a
// masked tail: a fixed order for each n.
namespace {
__attribute__((always_inline)) inline float dot_f32_one(const float* a, const float* b, int64_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 4; ++j)
      acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * j), _mm256_loadu_ps(b + i + 8 * j), acc[j]);
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc[0]);
  if (i < n) {
    const __m256i mask = tail_mask(n - i);
    acc[0] = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, mask), _mm256_maskload_ps(b + i, mask), acc[0]);
  }
  return hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}
}  // namespace

float dot_f32(const float* a, const float* b, int64_t n) { return dot_f32_one(a, b, n); }

void axpy_f32(float a, const float* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  if (i < n) {
    const __m256i mask = tail_mask(n - i);
    _mm256_maskstore_ps(y + i, mask,
                        _mm256_fmadd_ps(va, _mm256_maskload_ps(x + i, mask), _mm256_maskload_ps(y + i, mask)));
  }
}

namespace {
__attribute__((always_inline)) inline float dot_f16_one(const uint16_t* a, const float* b, int64_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 4; ++j) acc[j] = _mm256_fmadd_ps(load_h(a + i + 8 * j), _mm256_loadu_ps(b + i + 8 * j), acc[j]);
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load_h(a + i), _mm256_loadu_ps(b + i), acc[0]);
  if (i < n)
    acc[0] = _mm256_fmadd_ps(load_h_tail(a + i, n - i), _mm256_maskload_ps(b + i, tail_mask(n - i)), acc[0]);
  return hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}
}  // namespace

float dot_f16_f32(const uint16_t* a, const float* b, int64_t n) { return dot_f16_one(a, b, n); }

void axpy_f16(float a, const uint16_t* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load_h(x + i), _mm256_loadu_ps(y + i)));
  if (i < n) {
    const __m256i mask = tail_mask(n - i);
    _mm256_maskstore_ps(y + i, mask, _mm256_fmadd_ps(va, load_h_tail(x + i, n - i), _mm256_maskload_ps(y + i, mask)));
  }
}

// ---- runs of rows (attention over contiguous cached positions) -------------
// The score dots: attn_dots_x86.inc with V = 8 lanes (8 positions' sums
// reduced together). The value sums go through exactly the one-row axpy
// above, keeping y in registers across the rows (each element still sees one
// FMA per row, in row order).

namespace {
// Lane sums of 8 accumulators: out[i] = ((v0+v1)+(v2+v3)) + ((v4+v5)+(v6+v7))
// over v[i]'s lanes, the same tree for every position whatever the others hold.
__attribute__((always_inline)) inline __m256 lane_sums8(const __m256 (&v)[8]) {
  const __m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);  // [v0 01, v0 23, v1 01, v1 23 | 45, 67 ..]
  const __m256 c = _mm256_hadd_ps(v[4], v[5]), d = _mm256_hadd_ps(v[6], v[7]);
  const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);  // [v0..v3 0123 | v0..v3 4567]
  return _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31));
}

struct V {
  using reg = __m256;
  struct Tail {
    __m256i mask;
    int64_t n;
  };
  static constexpr int64_t kLanes = 8;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg fmadd(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Tail tail(int64_t n) { return {tail_mask(n), n}; }
  static reg loadx(const float* p) { return _mm256_loadu_ps(p); }
  static reg loadx(const float* p, const Tail& t) { return _mm256_maskload_ps(p, t.mask); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static reg load(const float* p, const Tail& t) { return _mm256_maskload_ps(p, t.mask); }
  static reg load(const uint16_t* p) { return load_h(p); }
  static reg load(const uint16_t* p, const Tail& t) { return load_h_tail(p, t.n); }
  // A Q8_0 block: its values, and its scale converted once; load_q8(b, k) is
  // values 8k..8k+7 as fp16(d) * q (exact in f32).
  struct Q8Block {
    const int8_t* q;
    float d;
  };
  static Q8Block q8_block(Q8Rows p) { return {q8_values(p), _cvtsh_ss(q8_scale_bits(p))}; }
  static reg load_q8(const Q8Block& b, int k) {
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.q + 8 * k));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_set1_ps(b.d));
  }
  static __m256 reduce8(const reg (&v)[8]) { return lane_sums8(v); }
  static void store8(float* out, __m256 s, int nr) {
    if (nr == 8) _mm256_storeu_ps(out, s);
    else _mm256_maskstore_ps(out, tail_mask(nr), s);
  }
};
}  // namespace

#include "attn_dots_x86.inc"

namespace {
struct RowsF32 {
  static __m256 load(const float* p) { return _mm256_loadu_ps(p); }
  static __m256 tail(const float* p, int64_t n) { return _mm256_maskload_ps(p, tail_mask(n)); }
};
struct RowsF16 {
  static __m256 load(const uint16_t* p) { return load_h(p); }
  static __m256 tail(const uint16_t* p, int64_t n) { return load_h_tail(p, n); }
};

template <class L, class P>
__attribute__((always_inline)) inline void axpy_rows(const float* a, P rows, int64_t stride, int64_t n_rows,
                                                     float* y, int64_t n) {
  constexpr int kV = 8;  // 64 elements of y held in registers
  int64_t i = 0;
  for (; i + 8 * kV <= n; i += 8 * kV) {
    __m256 acc[kV];
    for (int j = 0; j < kV; ++j) acc[j] = _mm256_loadu_ps(y + i + 8 * j);
    for (int64_t r = 0; r < n_rows; ++r) {
      const __m256 va = _mm256_set1_ps(a[r]);
      const P x = rows + r * stride + i;
      for (int j = 0; j < kV; ++j) acc[j] = _mm256_fmadd_ps(va, L::load(x + 8 * j), acc[j]);
    }
    for (int j = 0; j < kV; ++j) _mm256_storeu_ps(y + i + 8 * j, acc[j]);
  }
  for (; i + 8 <= n; i += 8) {
    __m256 acc = _mm256_loadu_ps(y + i);
    for (int64_t r = 0; r < n_rows; ++r) acc = _mm256_fmadd_ps(_mm256_set1_ps(a[r]), L::load(rows + r * stride + i), acc);
    _mm256_storeu_ps(y + i, acc);
  }
  if (i < n) {
    const __m256i mask = tail_mask(n - i);
    __m256 acc = _mm256_maskload_ps(y + i, mask);
    for (int64_t r = 0; r < n_rows; ++r)
      acc = _mm256_fmadd_ps(_mm256_set1_ps(a[r]), L::tail(rows + r * stride + i, n - i), acc);
    _mm256_maskstore_ps(y + i, mask, acc);
  }
}
}  // namespace

void axpy_f32_rows(const float* a, const float* rows, int64_t stride, int64_t n_rows, float* y, int64_t n) {
  axpy_rows<RowsF32>(a, rows, stride, n_rows, y, n);
}

void axpy_f16_rows(const float* a, const uint16_t* rows, int64_t stride, int64_t n_rows, float* y, int64_t n) {
  axpy_rows<RowsF16>(a, rows, stride, n_rows, y, n);
}

// Whole blocks (a Q8_0 KvLayout's heads are): per row and block one scale,
// then 4 registers of y. Each element still sees one FMA per row in row
// order, of the value axpy_f32_rows would read from the dequantized row.
void axpy_q8_0_rows(const float* a, Q8Rows rows, int64_t stride, int64_t n_rows, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += kQ8BlockElems) {
    __m256 acc[4];
    for (int k = 0; k < 4; ++k) acc[k] = _mm256_loadu_ps(y + i + 8 * k);
    for (int64_t r = 0; r < n_rows; ++r) {
      const V::Q8Block b = V::q8_block(rows + r * stride + i);
      const __m256 va = _mm256_set1_ps(a[r]);
      for (int k = 0; k < 4; ++k) acc[k] = _mm256_fmadd_ps(va, V::load_q8(b, k), acc[k]);
    }
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(y + i + 8 * k, acc[k]);
  }
}

// ---- value sums of several rows over one run --------------------------------

// A tile of NQ rows x NC registers of y (at most 8 accumulators): each cached
// register is loaded (and converted) once for the NQ rows, where one row at a
// time converted it once per row. Per element of y: one FMA per position in
// position order, from y's value, as axpy_rows and axpy_q8_0_rows.
namespace {
struct ChunksF32 {
  template <int NC>
  static void load(const float* p, __m256 (&v)[NC]) {
    for (int c = 0; c < NC; ++c) v[c] = _mm256_loadu_ps(p + 8 * c);
  }
};
struct ChunksF16 {
  template <int NC>
  static void load(const uint16_t* p, __m256 (&v)[NC]) {
    for (int c = 0; c < NC; ++c) v[c] = load_h(p + 8 * c);
  }
};
struct ChunksQ8 {  // the NC registers lie in one block (head sizes are whole blocks)
  template <int NC>
  static void load(Q8Rows p, __m256 (&v)[NC]) {
    const V::Q8Block b = V::q8_block(p);
    for (int c = 0; c < NC; ++c) v[c] = V::load_q8(b, c);
  }
};

template <class L, class P, int NQ, int NC>
__attribute__((always_inline)) inline void axpy_queries_tile(const float* const* a, P rows, int64_t stride,
                                                             int64_t n_rows, float* const* y, int64_t i) {
  __m256 acc[NQ][NC];
#pragma GCC unroll 8
  for (int q = 0; q < NQ; ++q)
#pragma GCC unroll 2
    for (int c = 0; c < NC; ++c) acc[q][c] = _mm256_loadu_ps(y[q] + i + 8 * c);
  for (int64_t r = 0; r < n_rows; ++r) {
    __m256 v[NC];
    L::template load<NC>(rows + r * stride + i, v);
#pragma GCC unroll 8
    for (int q = 0; q < NQ; ++q) {
      const __m256 va = _mm256_set1_ps(a[q][r]);
#pragma GCC unroll 2
      for (int c = 0; c < NC; ++c) acc[q][c] = _mm256_fmadd_ps(va, v[c], acc[q][c]);
    }
  }
#pragma GCC unroll 8
  for (int q = 0; q < NQ; ++q)
#pragma GCC unroll 2
    for (int c = 0; c < NC; ++c) _mm256_storeu_ps(y[q] + i + 8 * c, acc[q][c]);
}

// Elements [i, i + 8 NC) of every row, 4 rows a tile.
template <class L, class P, int NC>
void axpy_queries_cols(int nq, const float* const* a, P rows, int64_t stride, int64_t n_rows, float* const* y,
                       int64_t i) {
  for (int q0 = 0; q0 < nq; q0 += 4) {
    const float* const* aq = a + q0;
    float* const* yq = y + q0;
    switch (nq - q0) {
      case 1: axpy_queries_tile<L, P, 1, NC>(aq, rows, stride, n_rows, yq, i); break;
      case 2: axpy_queries_tile<L, P, 2, NC>(aq, rows, stride, n_rows, yq, i); break;
      case 3: axpy_queries_tile<L, P, 3, NC>(aq, rows, stride, n_rows, yq, i); break;
      default: axpy_queries_tile<L, P, 4, NC>(aq, rows, stride, n_rows, yq, i); break;
    }
  }
}

// The rows in tiles, 16 elements a tile, then 8; a rest under 8 goes row by
// row through the one-row op ONE (its masked tail: the same per-element
// FMAs). A lone row (one, or one after tiles of 4) is ONE's whole: its 8
// registers of y run 8 FMA chains, where a 1 x 2 tile ran 2 (generation,
// 10 % slower). Q8_0 heads are whole blocks, so they never reach the rest.
template <class L, class P, class One>
void axpy_rows_queries(int nq, const float* const* a, P rows, int64_t stride, int64_t n_rows, float* const* y,
                       int64_t n, One one) {
  const int tiled = nq % 4 == 1 ? nq - 1 : nq;
  int64_t i = 0;
  if (tiled > 0) {
    for (; i + 16 <= n; i += 16) axpy_queries_cols<L, P, 2>(tiled, a, rows, stride, n_rows, y, i);
    for (; i + 8 <= n; i += 8) axpy_queries_cols<L, P, 1>(tiled, a, rows, stride, n_rows, y, i);
    if (i < n)
      for (int j = 0; j < tiled; ++j) one(a[j], rows + i, stride, n_rows, y[j] + i, n - i);
  }
  if (tiled < nq) one(a[nq - 1], rows, stride, n_rows, y[nq - 1], n);
}
}  // namespace

void axpy_f32_rows_queries(int nq, const float* const* a, const float* rows, int64_t stride, int64_t n_rows,
                           float* const* y, int64_t n) {
  axpy_rows_queries<ChunksF32>(nq, a, rows, stride, n_rows, y, n, axpy_f32_rows);
}

void axpy_f16_rows_queries(int nq, const float* const* a, const uint16_t* rows, int64_t stride, int64_t n_rows,
                           float* const* y, int64_t n) {
  axpy_rows_queries<ChunksF16>(nq, a, rows, stride, n_rows, y, n, axpy_f16_rows);
}

void axpy_q8_0_rows_queries(int nq, const float* const* a, Q8Rows rows, int64_t stride, int64_t n_rows,
                            float* const* y, int64_t n) {
  axpy_rows_queries<ChunksQ8>(nq, a, rows, stride, n_rows, y, n, axpy_q8_0_rows);
}

// ---- top-k candidate scan ---------------------------------------------------

// 8 compares a step; the indices of a step's hits come from its mask (rare
// once a sampler's bound has risen, so most steps write nothing).
int64_t indices_at_least(const float* x, int64_t n, float bound, int32_t* idx) {
  const __m256 b = _mm256_set1_ps(bound);
  int64_t k = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    unsigned m = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), b, _CMP_GE_OQ)));
    while (m) {
      idx[k++] = static_cast<int32_t>(i + __builtin_ctz(m));
      m &= m - 1;
    }
  }
  for (; i < n; ++i)
    if (x[i] >= bound) idx[k++] = static_cast<int32_t>(i);
  return k;
}

// ---- activation quantizers --------------------------------------------------

namespace {
// Keeps the compiler from fusing a product into the next add (-ffp-contract):
// the scalar quantizers round the product first.
__attribute__((always_inline)) inline __m256 rounded(__m256 v) {
  __asm__("" : "+x"(v));
  return v;
}
// roundf: to nearest, halves away from zero. trunc, then add sign(t) when
// the (exact) fraction is at least one half; |t| <= 127 here.
__m256 round_half_away(__m256 t) {
  const __m256 r = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 sign = _mm256_and_ps(t, _mm256_set1_ps(-0.0f));
  const __m256 absf = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(t, r));
  const __m256 up = _mm256_and_ps(_mm256_cmp_ps(absf, _mm256_set1_ps(0.5f), _CMP_GE_OQ), _mm256_set1_ps(1.0f));
  return _mm256_add_ps(r, _mm256_or_ps(up, sign));
}
// 32 int32 lanes (4 vectors) to 32 int8 in order
__m256i pack32(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
  const __m256i v = _mm256_packs_epi16(ab, cd);
  return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}
}  // namespace

void quantize_act_q8_0(const float* x, void* out, int64_t n, int group) {
  auto* y = static_cast<ActQ8_0*>(out);
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const int64_t nb = n / kQK;
  for (int64_t g = 0; g < nb; g += group) {
    const int64_t ge = std::min<int64_t>(nb, g + group);
    __m256 amax = _mm256_setzero_ps();
    // max(|x|, amax): a NaN x leaves amax as std::max(amax, NaN) does
    for (int64_t j = g * kQK; j < ge * kQK; j += 8) amax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), absmask), amax);
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127, id = d ? 1.0f / d : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    for (int64_t i = g; i < ge; ++i) {
      y[i].d = d;
      __m256i q[4];
      for (int j = 0; j < 4; ++j)
        q[j] = _mm256_cvttps_epi32(round_half_away(rounded(_mm256_mul_ps(_mm256_loadu_ps(x + i * kQK + 8 * j), vid))));
      y[i].sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs), pack32(q[0], q[1], q[2], q[3]));
    }
  }
}

void quantize_act_q8_K(const float* x, void* out, int64_t n) {
  auto* y = static_cast<BlockQ8_K*>(out);
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < kQK_K; j += 8) amax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), absmask), amax);
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float am = _mm_cvtss_f32(m);
    if (am == 0) {
      y[i].d = 0;
      std::memset(y[i].qs, 0, kQK_K);
      std::memset(y[i].bsums, 0, sizeof(y[i].bsums));
      continue;
    }
    // the first element of greatest magnitude, with its sign (as the scalar scan finds it)
    float max = 0;
    for (int j = 0; j < kQK_K; ++j)
      if (std::fabs(x[j]) == am) {
        max = x[j];
        break;
      }
    const float iscale = -127.f / max;
    const __m256 vs = _mm256_set1_ps(iscale), magic = _mm256_set1_ps(12582912.f);
    const __m256i mant = _mm256_set1_epi32(0x007fffff), bias = _mm256_set1_epi32(0x00400000),
                  top = _mm256_set1_epi32(127);
    for (int j = 0; j < kQK_K; j += 32) {
      __m256i q[4];
      for (int k = 0; k < 4; ++k) {
        // nearest_int: the float add rounds half to even, the mantissa holds the integer
        const __m256 val = _mm256_add_ps(rounded(_mm256_mul_ps(vs, _mm256_loadu_ps(x + j + 8 * k))), magic);
        q[k] = _mm256_min_epi32(_mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(val), mant), bias), top);
      }
      for (int k = 0; k < 2; ++k)
        y[i].bsums[j / 16 + k] = static_cast<int16_t>(hsum_epi32(_mm256_add_epi32(q[2 * k], q[2 * k + 1])));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs + j), pack32(q[0], q[1], q[2], q[3]));
    }
    y[i].d = 1 / iscale;
  }
}

void f32_to_fp16_row(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  if (i < n) {
    uint16_t buf[8];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(buf),
                     _mm256_cvtps_ph(_mm256_maskload_ps(x + i, tail_mask(n - i)), _MM_FROUND_TO_NEAREST_INT));
    std::memcpy(y + i, buf, (n - i) * sizeof(uint16_t));
  }
}

void fp16_to_f32_row(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_h(x + i));
  if (i < n) _mm256_maskstore_ps(y + i, tail_mask(n - i), load_h_tail(x + i, n - i));
}

}  // namespace atelier::kernels::cpu::avx2
