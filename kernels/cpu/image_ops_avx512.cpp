// The avx512 level's conv2d (direct blocked GEMM over output pixels) and
// attention (register-tiled flash attention): image_ops_x86.inc over 16-lane
// zmm vectors. Tiles: conv 6 channels x 64 pixels (24 accumulators), 24 x 16
// for 4x4 images; attention 8 queries x 48 keys.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "image_ops_internal.h"

namespace atelier::kernels::cpu::avx512 {

namespace {

struct V {
  using reg = __m512;
  using mask = __mmask16;
  static constexpr int L = 16, kMR = 6, kNV = 4, kNarrowTM = 4, kQR = 8;
  static reg zero() { return _mm512_setzero_ps(); }
  static reg set1(float f) { return _mm512_set1_ps(f); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static reg fmadd(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg max(reg a, reg b) { return _mm512_max_ps(a, b); }
  // Lanes [0, n) for n clamped to [0, 16].
  static mask tail(int64_t n) { return n >= 16 ? mask(0xFFFF) : n <= 0 ? mask(0) : mask((1u << n) - 1); }
  static mask and_not(mask a, mask b) { return mask(a & ~b); }
  static reg maskz_load(mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  static void mask_store(float* p, mask m, reg v) { _mm512_mask_storeu_ps(p, m, v); }
  static reg load_or(mask m, const float* p, float fill) { return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), m, p); }
  static reg keep(mask m, reg v) { return _mm512_maskz_mov_ps(m, v); }
  static float reduce_max(reg v) { return _mm512_reduce_max_ps(v); }
  static float reduce_add(reg v) { return _mm512_reduce_add_ps(v); }
  static reg widen_f16(const uint16_t* s) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s))); }
  static reg widen_bf16(const uint16_t* s) {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
  // expf: n = round(x log2 e), r = x - n ln 2 (two-part ln 2), degree-6
  // polynomial (Cephes), times 2^n by vscalefps (underflows to 0 smoothly).
  static reg exp(reg x) {
    x = _mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f));
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
  }
};

}  // namespace

#include "image_ops_x86.inc"

}  // namespace atelier::kernels::cpu::avx512
