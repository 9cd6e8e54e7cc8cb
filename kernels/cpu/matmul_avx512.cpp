// AVX-512 matmul tiles: 512-bit FMA for float weights, AVX512-VL VNNI
// (dpbusd/dpwssd on 256-bit vectors) for the integer dots. dpbf16ps is not
// used: it would round the activations to bf16.
#include <immintrin.h>

#include <cstring>

#include "matmul_internal.h"
#include "quants.h"

namespace atelier::kernels::cpu {
namespace avx512 {

#define ATELIER_VNNI 1
#include "matmul_x86_quant.inc"
#undef ATELIER_VNNI

// Weight loaders: 16 elements as f32; `mask` selects the valid ones of a
// partial last chunk (the rest read as zero). Full chunks use plain loads:
// masked loads cannot fold into the FMA and halve the tile's speed on Zen 4.
__attribute__((always_inline)) inline __m256i load_u16(const char* w, int64_t k, __mmask16 mask) {
  const uint16_t* p = reinterpret_cast<const uint16_t*>(w) + k;
  return mask == 0xFFFF ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi16(mask, p);
}

struct LoadF32 {
  __attribute__((always_inline)) static inline __m512 load(const char* w, int64_t k, __mmask16 mask) {
    const float* p = reinterpret_cast<const float*>(w) + k;
    return mask == 0xFFFF ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(mask, p);
  }
};
struct LoadF16 {
  __attribute__((always_inline)) static inline __m512 load(const char* w, int64_t k, __mmask16 mask) {
    return _mm512_cvtph_ps(load_u16(w, k, mask));
  }
};
struct LoadBF16 {
  __attribute__((always_inline)) static inline __m512 load(const char* w, int64_t k, __mmask16 mask) {
    const __m256i h = load_u16(w, k, mask);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
};

// Float-weight tiles: one 16-lane FMA accumulator per (m, r).
template <class Load>
struct KernelFloat {
  template <int NM, int NR>
  __attribute__((always_inline)) static inline void step(const char* const* w, const float* const* x, int64_t k, __mmask16 mask,
                   __m512 (&acc)[NM][NR]) {
    __m512 wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = Load::load(w[r], k, mask);
    for (int m = 0; m < NM; ++m) {
      const __m512 xv = mask == 0xFFFF ? _mm512_loadu_ps(x[m] + k) : _mm512_maskz_loadu_ps(mask, x[m] + k);
      for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_fmadd_ps(wv[r], xv, acc[m][r]);
    }
  }

  template <int NM, int NR>
  static void tile(const MatmulArgs& a, int64_t m0, int64_t r0) {
    const int64_t K = a.w->cols;
    const char* w[NR];
    const float* x[NM];
    for (int r = 0; r < NR; ++r) w[r] = weight_row(a, r0 + r);
    for (int m = 0; m < NM; ++m) x[m] = a.x + (m0 + m) * K;
    __m512 acc[NM][NR];
    for (auto& row : acc)
      for (auto& v : row) v = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) step<NM, NR>(w, x, k, 0xFFFF, acc);
    if (k < K) step<NM, NR>(w, x, k, static_cast<__mmask16>((1u << (K - k)) - 1), acc);
    for (int m = 0; m < NM; ++m)
      for (int r = 0; r < NR; ++r) a.y[(m0 + m) * a.w->rows + r0 + r] = _mm512_reduce_add_ps(acc[m][r]);
  }
};

}  // namespace avx512

// Tile shapes: activation rows x weight rows, sized to the 32 zmm registers.
RowsFn rows_fn_avx512(DType t) {
  using namespace avx512;
  switch (t) {
    case DType::F32: return &TileDriver<KernelFloat<LoadF32>, 6, 4>::run;
    case DType::F16: return &TileDriver<KernelFloat<LoadF16>, 6, 4>::run;
    case DType::BF16: return &TileDriver<KernelFloat<LoadBF16>, 6, 4>::run;
    case DType::Q8_0: return &TileDriver<KernelQ8_0, 4, 2>::run;
    case DType::Q4_0: return &TileDriver<KernelQ4_0, 4, 2>::run;
    case DType::Q4_K: return &TileDriver<KernelQ4_K, 4, 2>::run;
    case DType::Q6_K: return &TileDriver<KernelQ6_K, 4, 2>::run;
    default: return nullptr;
  }
}

}  // namespace atelier::kernels::cpu
