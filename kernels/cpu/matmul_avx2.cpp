// AVX2 + FMA + F16C matmul tiles. Compiled with -mavx2 -mfma -mf16c only;
// reached only when dispatch finds those features.
#include <immintrin.h>

#include <cstring>

#include "matmul_internal.h"
#include "quants.h"

namespace atelier::kernels::cpu {
namespace avx2 {

#define ATELIER_VNNI 0
#include "matmul_x86_quant.inc"
#undef ATELIER_VNNI

// Weight loaders: 8 elements of a row as f32, and the zero-padded last
// partial chunk (n < 8), so every tile shape reads the same values.
struct LoadF32 {
  static __m256 load(const char* w, int64_t k) { return _mm256_loadu_ps(reinterpret_cast<const float*>(w) + k); }
  static __m256 tail(const char* w, int64_t k, int n) {
    float buf[8] = {};
    std::memcpy(buf, reinterpret_cast<const float*>(w) + k, n * sizeof(float));
    return _mm256_loadu_ps(buf);
  }
};
struct LoadF16 {
  static __m256 load(const char* w, int64_t k) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(w) + k)));
  }
  static __m256 tail(const char* w, int64_t k, int n) {
    uint16_t buf[8] = {};
    std::memcpy(buf, reinterpret_cast<const uint16_t*>(w) + k, n * sizeof(uint16_t));
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(buf)));
  }
};
struct LoadBF16 {
  static __m256 widen(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
  static __m256 load(const char* w, int64_t k) {
    return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(w) + k)));
  }
  static __m256 tail(const char* w, int64_t k, int n) {
    uint16_t buf[8] = {};
    std::memcpy(buf, reinterpret_cast<const uint16_t*>(w) + k, n * sizeof(uint16_t));
    return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(buf)));
  }
};

// Float-weight tiles: one 8-lane FMA accumulator per (m, r).
template <class Load>
struct KernelFloat {
  template <int NM, int NR>
  static void tile(const MatmulArgs& a, int64_t m0, int64_t r0) {
    const int64_t K = a.w->cols;
    const char* w[NR];
    const float* x[NM];
    for (int r = 0; r < NR; ++r) w[r] = weight_row(a, r0 + r);
    for (int m = 0; m < NM; ++m) x[m] = a.x + (m0 + m) * K;
    __m256 acc[NM][NR];
    for (auto& row : acc)
      for (auto& v : row) v = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
      __m256 wv[NR];
      for (int r = 0; r < NR; ++r) wv[r] = Load::load(w[r], k);
      for (int m = 0; m < NM; ++m) {
        const __m256 xv = _mm256_loadu_ps(x[m] + k);
        for (int r = 0; r < NR; ++r) acc[m][r] = _mm256_fmadd_ps(wv[r], xv, acc[m][r]);
      }
    }
    if (k < K) {
      const int n = static_cast<int>(K - k);
      const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      __m256 wv[NR];
      for (int r = 0; r < NR; ++r) wv[r] = Load::tail(w[r], k, n);
      for (int m = 0; m < NM; ++m) {
        const __m256 xv = _mm256_maskload_ps(x[m] + k, mask);
        for (int r = 0; r < NR; ++r) acc[m][r] = _mm256_fmadd_ps(wv[r], xv, acc[m][r]);
      }
    }
    store_tile<NM, NR>(a, m0, r0, acc);
  }
};

}  // namespace avx2

// Tile shapes: activation rows x weight rows, sized to the 16 ymm registers.
RowsFn rows_fn_avx2(DType t) {
  using namespace avx2;
  switch (t) {
    case DType::F32: return &TileDriver<KernelFloat<LoadF32>, 4, 3>::run;
    case DType::F16: return &TileDriver<KernelFloat<LoadF16>, 4, 3>::run;
    case DType::BF16: return &TileDriver<KernelFloat<LoadBF16>, 4, 3>::run;
    case DType::Q8_0: return &TileDriver<KernelQ8_0, 4, 2, 4, 2, 2>::run;
    case DType::Q4_0: return &TileDriver<KernelQ4_0, 4, 2, 4, 2, 2>::run;
    case DType::Q4_K: return &TileDriver<KernelQ4_K, 4, 2, 4, 2, 2>::run;
    case DType::Q6_K: return &TileDriver<KernelQ6_K, 4, 2, 4, 2, 2>::run;
    default: return nullptr;
  }
}

}  // namespace atelier::kernels::cpu
