// AVX2 + FMA + F16C element-wise ops. Partial last chunks go through masked
// loads, so every element sees the same arithmetic whatever n is.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "ops_internal.h"

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

// expf after Cephes: range reduction by ln 2, degree-5 polynomial; about
// 2 ulp over [-88, 88], 0 below.
__m256 exp_ps(__m256 x) {
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
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
float dot_f32(const float* a, const float* b, int64_t n) {
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

float dot_f16_f32(const uint16_t* a, const float* b, int64_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 4; ++j) acc[j] = _mm256_fmadd_ps(load_h(a + i + 8 * j), _mm256_loadu_ps(b + i + 8 * j), acc[j]);
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load_h(a + i), _mm256_loadu_ps(b + i), acc[0]);
  if (i < n)
    acc[0] = _mm256_fmadd_ps(load_h_tail(a + i, n - i), _mm256_maskload_ps(b + i, tail_mask(n - i)), acc[0]);
  return hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

void axpy_f16(float a, const uint16_t* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load_h(x + i), _mm256_loadu_ps(y + i)));
  if (i < n) {
    const __m256i mask = tail_mask(n - i);
    _mm256_maskstore_ps(y + i, mask, _mm256_fmadd_ps(va, load_h_tail(x + i, n - i), _mm256_maskload_ps(y + i, mask)));
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
