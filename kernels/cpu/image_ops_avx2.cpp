// AVX2 + FMA image ops: the avx2 level's conv2d and attention
// (image_ops_x86.inc over 8-lane ymm vectors: conv tiles of 6 channels x 16
// pixels, attention 4 queries x 24 keys, in 12 accumulators), and the inner
// loops the other levels share: the exponentials of the softmax and the
// element-wise activations. Partial last chunks go through a padded buffer,
// so every element sees the same arithmetic whatever n is.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "avx2_math.h"
#include "image_ops_internal.h"

namespace atelier::kernels::cpu::avx2 {

namespace {

float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): the exponential is
// the only transcendental, so it vectorizes with exp_ps.
__m256 erf_ps(__m256 x) {
  const __m256 sign = _mm256_and_ps(x, _mm256_set1_ps(-0.0f));
  const __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  const __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), ax, _mm256_set1_ps(1.0f)));
  __m256 p = _mm256_set1_ps(1.061405429f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
  p = _mm256_mul_ps(p, t);
  const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(ax, ax)));
  const __m256 r = _mm256_fnmadd_ps(p, e, _mm256_set1_ps(1.0f));
  return _mm256_or_ps(r, sign);
}

__m256 gelu_ps(__m256 x) {
  const __m256 h = _mm256_mul_ps(x, _mm256_set1_ps(0.5f));
  return _mm256_fmadd_ps(h, erf_ps(_mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752f))), h);
}

__m256 act_ps(Activation a, __m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  switch (a) {
    case Activation::silu:
      return _mm256_div_ps(x, _mm256_add_ps(one, exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), x))));
    case Activation::gelu: return gelu_ps(x);
    case Activation::quick_gelu:
      return _mm256_div_ps(x, _mm256_add_ps(one, exp_ps(_mm256_mul_ps(_mm256_set1_ps(-1.702f), x))));
    case Activation::gelu_tanh: {
      // tanh(u) = 1 - 2 / (exp(2u) + 1); exp_ps saturates, so large |u| gives +-1.
      const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
      const __m256 u = _mm256_mul_ps(_mm256_set1_ps(0.79788456080286536f),
                                     _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x));
      const __m256 e = exp_ps(_mm256_add_ps(u, u));
      const __m256 th = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
      const __m256 h = _mm256_mul_ps(x, _mm256_set1_ps(0.5f));
      return _mm256_fmadd_ps(h, th, h);
    }
  }
  return x;
}

}  // namespace

float exp_shift_sum(float* x, int64_t n, float m) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    _mm256_storeu_ps(x + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (i < n) {
    float buf[8];
    for (int j = 0; j < 8; ++j) buf[j] = i + j < n ? x[i + j] : -INFINITY;
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(buf), vm));
    // exp_ps clamps its argument, so -inf lanes give a tiny value: zero them.
    const __m256 keep = _mm256_cmp_ps(_mm256_loadu_ps(buf), _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    _mm256_storeu_ps(buf, _mm256_and_ps(e, keep));
    sum = _mm256_add_ps(sum, _mm256_loadu_ps(buf));
    std::memcpy(x + i, buf, static_cast<size_t>(n - i) * sizeof(float));
  }
  return hsum(sum);
}

void activation(Activation a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, act_ps(a, _mm256_loadu_ps(x + i)));
  if (i < n) {
    float buf[8] = {};
    std::memcpy(buf, x + i, static_cast<size_t>(n - i) * sizeof(float));
    _mm256_storeu_ps(buf, act_ps(a, _mm256_loadu_ps(buf)));
    std::memcpy(y + i, buf, static_cast<size_t>(n - i) * sizeof(float));
  }
}

void geglu_row(const float* value, const float* gate, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(value + i), gelu_ps(_mm256_loadu_ps(gate + i))));
  if (i < n) {
    float v[8] = {}, g[8] = {};
    std::memcpy(v, value + i, static_cast<size_t>(n - i) * sizeof(float));
    std::memcpy(g, gate + i, static_cast<size_t>(n - i) * sizeof(float));
    _mm256_storeu_ps(v, _mm256_mul_ps(_mm256_loadu_ps(v), gelu_ps(_mm256_loadu_ps(g))));
    std::memcpy(y + i, v, static_cast<size_t>(n - i) * sizeof(float));
  }
}

void glu_row(Activation a, const float* gate, const float* up, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(act_ps(a, _mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
  if (i < n) {
    float g[8] = {}, u[8] = {};
    std::memcpy(g, gate + i, static_cast<size_t>(n - i) * sizeof(float));
    std::memcpy(u, up + i, static_cast<size_t>(n - i) * sizeof(float));
    _mm256_storeu_ps(g, _mm256_mul_ps(act_ps(a, _mm256_loadu_ps(g)), _mm256_loadu_ps(u)));
    std::memcpy(y + i, g, static_cast<size_t>(n - i) * sizeof(float));
  }
}

namespace {

struct V {
  using reg = __m256;
  using mask = __m256i;
  static constexpr int L = 8, kMR = 6, kNV = 2, kNarrowTM = 1, kQR = 4;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg set1(float f) { return _mm256_set1_ps(f); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  static reg fmadd(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg max(reg a, reg b) { return _mm256_max_ps(a, b); }
  // Lanes [0, n) for n clamped to [0, 8], as all-ones int32 lanes.
  static mask tail(int64_t n) {
    const int c = static_cast<int>(std::clamp<int64_t>(n, 0, 8));
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static mask and_not(mask a, mask b) { return _mm256_andnot_si256(b, a); }
  // vmaskmovps: masked-off lanes read as 0 and never fault, as AVX-512's.
  static reg maskz_load(mask m, const float* p) { return _mm256_maskload_ps(p, m); }
  static void mask_store(float* p, mask m, reg v) { _mm256_maskstore_ps(p, m, v); }
  static reg load_or(mask m, const float* p, float fill) {
    return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
  static reg keep(mask m, reg v) { return _mm256_and_ps(_mm256_castsi256_ps(m), v); }
  static float reduce_max(reg v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
  }
  static float reduce_add(reg v) { return hsum(v); }
  static reg exp(reg x) { return exp_ps(x); }
  static reg widen_f16(const uint16_t* s) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s))); }
  static reg widen_bf16(const uint16_t* s) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
};

}  // namespace

#include "image_ops_x86.inc"

}  // namespace atelier::kernels::cpu::avx2
