// AVX2 + FMA inner loops of the image ops: the exponentials of the attention
// softmax and the element-wise activations. Partial last chunks go through a
// padded buffer, so every element sees the same arithmetic whatever n is.
#include <immintrin.h>

#include <cmath>
#include <cstring>

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

}  // namespace atelier::kernels::cpu::avx2
