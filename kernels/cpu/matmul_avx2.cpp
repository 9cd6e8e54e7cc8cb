// AVX2 + FMA + F16C matmul tiles. Compiled with -mavx2 -mfma -mf16c only;
// reached only when dispatch finds those features.
#include <immintrin.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "matmul_internal.h"
#include "simd.h"
#include "quants.h"

namespace atelier::kernels::cpu {
namespace avx2 {

#define ATELIER_VNNI 0
#include "matmul_x86_quant.inc"
#undef ATELIER_VNNI

// Weight loaders: 8 elements of a row as f32, and the zero-padded last
// partial chunk (n < 8), so every tile shape reads the same values.
struct LoadF32 {
  static constexpr int kBytes = 4;
  static __m256 load(const char* w, int64_t k) { return _mm256_loadu_ps(reinterpret_cast<const float*>(w) + k); }
  static __m256 tail(const char* w, int64_t k, int n) {
    float buf[8] = {};
    std::memcpy(buf, reinterpret_cast<const float*>(w) + k, n * sizeof(float));
    return _mm256_loadu_ps(buf);
  }
};
struct LoadF16 {
  static constexpr int kBytes = 2;
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
  static constexpr int kBytes = 2;
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

// Float-weight tiles: one 8-lane FMA accumulator per (m, r). The weight
// rows are prefetched 4 tiles ahead, a cache line per row at a time, as the
// integer tiles do: NR rows of a few KB each are too short a stream for the
// hardware prefetcher (F32 matrix-vector products out of DRAM ran at ~65 %
// of the bandwidth of a one-row-at-a-time loop on a Zen 3).
template <class Load>
struct KernelFloat {
  // Lanes below n set: the activations' zero-padded last partial step.
  static __m256i tail_mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  // How far ahead a tile of NM x NR prefetches its weight rows (0: none).
  template <int NM, int NR>
  static int64_t ahead_bytes(const MatmulArgs& a, int64_t m0, int64_t r0) {
    const int64_t stride = a.w->row_stride_bytes;
    return NM <= 2 ? 4 * NR * stride : m0 == 0 && r0 + 2 * NR <= a.w->rows ? NR * stride : 0;
  }

  template <int NM, int NR>
  __attribute__((always_inline)) static inline void step(const char* const* w, const float* const* x, int64_t k,
                                                         __m256 (&acc)[NM][NR]) {
    __m256 wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = Load::load(w[r], k);
    for (int m = 0; m < NM; ++m) {
      const __m256 xv = _mm256_loadu_ps(x[m] + k);
      for (int r = 0; r < NR; ++r) acc[m][r] = _mm256_fmadd_ps(wv[r], xv, acc[m][r]);
    }
  }

  template <int NM, int NR>
  static void tile(const MatmulArgs& a, int64_t m0, int64_t r0) {
    if constexpr (NM == 4 && NR == 3 && Load::kBytes == 2) return tile_4x3(a, m0, r0);
    const int64_t K = a.w->cols;
    const char* w[NR];
    const float* x[NM];
    for (int r = 0; r < NR; ++r) w[r] = weight_row(a, r0 + r);
    for (int m = 0; m < NM; ++m) x[m] = a.x + (m0 + m) * K;
    __m256 acc[NM][NR];
    for (auto& row : acc)
      for (auto& v : row) v = _mm256_setzero_ps();
    // Generation (1-2 rows, memory-bound) prefetches 4 tiles ahead. A
    // prompt's first tile of activation rows brings the next weight tile into
    // L2 and its other tiles find this one in cache (without it each weight
    // tile's first pass waited on memory: 768 x 2048 at 32 rows ran at 52 %
    // of the FMA peak against 74 % for an L3-resident 768 x 768).
    const int64_t ahead = ahead_bytes<NM, NR>(a, m0, r0);
    constexpr int64_t kLine = 64 / Load::kBytes;  // elements per cache line: whole 8-element steps
    int64_t k = 0;
    for (; k + kLine <= K; k += kLine) {
      if (ahead)
        for (int r = 0; r < NR; ++r) prefetch_w<64>(w[r] + k * Load::kBytes, ahead);
      for (int64_t s = 0; s < kLine; s += 8) step<NM, NR>(w, x, k + s, acc);
    }
    for (; k + 8 <= K; k += 8) step<NM, NR>(w, x, k, acc);
    if (k < K) {
      const int n = static_cast<int>(K - k);
      const __m256i mask = tail_mask(n);
      __m256 wv[NR];
      for (int r = 0; r < NR; ++r) wv[r] = Load::tail(w[r], k, n);
      for (int m = 0; m < NM; ++m) {
        const __m256 xv = _mm256_maskload_ps(x[m] + k, mask);
        for (int r = 0; r < NR; ++r) acc[m][r] = _mm256_fmadd_ps(wv[r], xv, acc[m][r]);
      }
    }
    store_tile<NM, NR>(a, m0, r0, acc);
  }

  // The F16/BF16 prompt tile with its 12 accumulators as named values, one
  // step per loop iteration: over the arrays above GCC 12 kept them on the
  // stack (a store per accumulator and step). One Zen 3 core, 128 rows, F16
  // 768 x 768 and 2048 x 768: 30-34 -> 37-40 G MAC/s. The same chain per
  // (m, r) as tile<4, 3>. (F32 keeps the arrays: with all 16 registers taken
  // GCC folds the weight or activation loads into the FMAs, and the named
  // tile measured slower.)
  static void tile_4x3(const MatmulArgs& a, int64_t m0, int64_t r0) {
    const int64_t K = a.w->cols;
    const char* w0 = weight_row(a, r0);
    const char *w1 = weight_row(a, r0 + 1), *w2 = weight_row(a, r0 + 2);
    const float* x0 = a.x + m0 * K;
    const float *x1 = x0 + K, *x2 = x1 + K, *x3 = x2 + K;
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00, c20 = c00, c21 = c00,
           c22 = c00, c30 = c00, c31 = c00, c32 = c00;
    auto fma3 = [](__m256 xv, __m256 v0, __m256 v1, __m256 v2, __m256& a0, __m256& a1, __m256& a2)
        __attribute__((always_inline)) {
      a0 = _mm256_fmadd_ps(v0, xv, a0), a1 = _mm256_fmadd_ps(v1, xv, a1), a2 = _mm256_fmadd_ps(v2, xv, a2);
    };
    auto step = [&](int64_t k) __attribute__((always_inline)) {
      const __m256 v0 = Load::load(w0, k), v1 = Load::load(w1, k), v2 = Load::load(w2, k);
      fma3(_mm256_loadu_ps(x0 + k), v0, v1, v2, c00, c01, c02);
      fma3(_mm256_loadu_ps(x1 + k), v0, v1, v2, c10, c11, c12);
      fma3(_mm256_loadu_ps(x2 + k), v0, v1, v2, c20, c21, c22);
      fma3(_mm256_loadu_ps(x3 + k), v0, v1, v2, c30, c31, c32);
    };
    const int64_t ahead = ahead_bytes<4, 3>(a, m0, r0);
    constexpr int64_t kLine = 64 / Load::kBytes;
    int64_t k = 0;
    for (; k + kLine <= K; k += kLine) {
      if (ahead) {
        prefetch_w<64>(w0 + k * Load::kBytes, ahead);
        prefetch_w<64>(w1 + k * Load::kBytes, ahead);
        prefetch_w<64>(w2 + k * Load::kBytes, ahead);
      }
#pragma GCC unroll 1
      for (int64_t s = 0; s < kLine; s += 8) step(k + s);
    }
    for (; k + 8 <= K; k += 8) step(k);
    if (k < K) {
      const int n = static_cast<int>(K - k);
      const __m256i mask = tail_mask(n);
      const __m256 v0 = Load::tail(w0, k, n), v1 = Load::tail(w1, k, n), v2 = Load::tail(w2, k, n);
      fma3(_mm256_maskload_ps(x0 + k, mask), v0, v1, v2, c00, c01, c02);
      fma3(_mm256_maskload_ps(x1 + k, mask), v0, v1, v2, c10, c11, c12);
      fma3(_mm256_maskload_ps(x2 + k, mask), v0, v1, v2, c20, c21, c22);
      fma3(_mm256_maskload_ps(x3 + k, mask), v0, v1, v2, c30, c31, c32);
    }
    __m256 acc[4][3] = {{c00, c01, c02}, {c10, c11, c12}, {c20, c21, c22}, {c30, c31, c32}};
    store_tile<4, 3>(a, m0, r0, acc);
  }
};

// Float tiles over many activation rows. A driver runs every activation tile
// against one weight tile, so all the rows' activations stream through L2
// once per weight tile; past L2 they came from L3 (768 x 2048 at 128 rows, 1
// MB of activations: 33-35 G MAC/s on one Zen 4 core against 42-45 for 2048
// x 768, whose 393 KB fit; the same for F32 rows and packed F16). Rows go in
// chunks whose activations fill half of L2, each a whole run of BASE (a
// TileDriver; chunks of whole tiles): the weights are read once per chunk
// instead, and each (row, weight row) product is the same chain. R0, R1:
// BASE's range (rows or groups).
template <class Base>
struct RowChunkedDriver {
  static void run(const MatmulArgs& a, int64_t r0, int64_t r1) {
    constexpr int RM = Base::kRows;
    static const int64_t budget = [] {
      const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
      return std::max<int64_t>(l2 > 0 ? l2 / 2 : 0, int64_t{128} << 10);
    }();
    const int64_t K = a.w->cols;
    const int64_t chunk = std::max<int64_t>(RM, budget / (K * int64_t{sizeof(float)}) / RM * RM);
    if (a.m_rows <= chunk) return Base::run(a, r0, r1);
    for (int64_t m = 0; m < a.m_rows; m += chunk) {
      MatmulArgs e = a;
      e.x = a.x + m * K;
      e.y = a.y + m * a.w->rows;
      e.m_rows = std::min(chunk, a.m_rows - m);
      Base::run(e, r0, r1);
    }
  }
};

// y rows of a tile of packed groups of 8 (lane j = row j of the group).
// Inlined, with constant indices (see unroll): the tile's accumulators stay
// registers.
template <int NM, int NG>
__attribute__((always_inline)) inline void store_packed(const MatmulArgs& a, int64_t m0, int64_t g0,
                                                        __m256 (&acc)[NM][NG]) {
  unroll<NM>([&](auto m) {
    float* y = a.y + (m0 + m) * a.w->rows;
    unroll<NG>([&](auto g) {
      const int64_t r = (g0 + g) * kPackRowsX8;
      if (r + kPackRowsX8 <= a.w->rows) {
        _mm256_storeu_ps(y + r, acc[m][g]);
      } else {  // the padded last group: only the real rows
        alignas(32) float t[kPackRowsX8];
        _mm256_store_ps(t, acc[m][g]);
        for (int64_t i = 0; r + i < a.w->rows; ++i) y[r + i] = t[i];
      }
    });
  });
}

// Q8_0 weights packed as WeightLayout::q8_0x8 x Q8_0 activations. Lane j of
// every register belongs to weight row j of a group of 8: a register holds
// 4 columns of the 8 rows, and the 4 activation bytes of those columns are
// broadcast to all lanes. maddubs takes |w| (unsigned) times x with w's sign
// (|w| x <= 128 x 127, so a pair never saturates int16), madd sums the pairs:
// 8 of those steps cover a block with one int32 sum per row and no
// horizontal adds. Per lane and block:
//   acc += float(sum w x) * (d_w * d_x)
// The integer sum is exact and the float steps are the same for every tile
// shape, so the result is batch-, thread- and tile-invariant.
struct KernelQ8_0x8 {
  template <int NM, int NG>
  static void tile(const MatmulArgs& a, int64_t m0, int64_t g0) {
    const int64_t nb = a.w->cols / kQK;
    const char* base = static_cast<const char*>(a.w->data);
    const __m256i* q[NG];
    const uint16_t* sc[NG];
    for (int g = 0; g < NG; ++g) {
      q[g] = reinterpret_cast<const __m256i*>(base + (g0 + g) * a.w->row_stride_bytes);
      sc[g] = reinterpret_cast<const uint16_t*>(base + (g0 + g) * a.w->row_stride_bytes + nb * kPackBlockBytesX8);
    }
    const ActQ8_0* x[NM];
    for (int m = 0; m < NM; ++m) x[m] = reinterpret_cast<const ActQ8_0*>(act_row(a, m0 + m));
    __m256 acc[NM][NG];
    for (auto& row : acc)
      for (auto& v : row) v = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    // The next tile's groups, one 64-byte line per step (8 per block = the
    // block's 256 quant bytes), so the DRAM stream runs ahead of the loads.
    const int64_t ahead = NG * a.w->row_stride_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      __m256i is[NM][NG];
      unroll<NM>([&](auto m) { unroll<NG>([&](auto g) { is[m][g] = _mm256_setzero_si256(); }); });
      // Two of the block's 8 steps per iteration, not all 8 unrolled: unrolled,
      // GCC reassociated each row's 8 integer sums into a tree and parked the
      // partial products on the stack (a store and a reload per product).
#pragma GCC unroll 1
      for (int k = 0; k < 8; k += 2) {
        // A plain loop: GCC 12 drops an _mm_prefetch inside a lambda.
        for (int g = 0; g < NG; ++g) _mm_prefetch(reinterpret_cast<const char*>(q[g] + 8 * b + k) + ahead, _MM_HINT_T1);
        unroll<2>([&](auto h) {
          unroll<NG>([&](auto g) {
            const __m256i wv = _mm256_load_si256(q[g] + 8 * b + k + h);
            const __m256i wa = _mm256_sign_epi8(wv, wv);  // |w|; -128 stays 0x80 = 128 unsigned
            unroll<NM>([&](auto m) {
              int32_t xv;
              std::memcpy(&xv, x[m][b].qs + 4 * (k + h), 4);
              const __m256i xs = _mm256_sign_epi8(_mm256_set1_epi32(xv), wv);
              is[m][g] = _mm256_add_epi32(is[m][g], _mm256_madd_epi16(_mm256_maddubs_epi16(wa, xs), ones));
            });
          });
        });
      }
      for (int g = 0; g < NG; ++g) {
        const __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(sc[g] + kPackRowsX8 * b)));
        for (int m = 0; m < NM; ++m)
          acc[m][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[m][g]), _mm256_mul_ps(dw, _mm256_set1_ps(x[m][b].d)), acc[m][g]);
      }
    }
    store_packed<NM, NG>(a, m0, g0, acc);
  }
};

// Q4_0 weights packed as WeightLayout::q4_0x8 x Q8_0 activations: lane j is
// weight row j of a group of 8, a register holds 4 of GGML's nibble bytes of
// each row (4 columns in the low nibbles, 4 columns 16 further in the high
// ones). The nibbles (0..15, q + 8) are maddubs' unsigned operand as they
// are: a pair is at most 2 x 15 x 127, so the 8 maddubs of a block add up in
// int16 lanes without saturating (<= 30480), then one madd gives the int32
// per row. Per lane and block:
//   acc += float(sum nibble x  -  8 sum x) * (d_w * d_x)
// exact integers, the same float steps for every tile shape.
struct KernelQ4_0x8 {
  template <int NM, int NG>
  static void tile(const MatmulArgs& a, int64_t m0, int64_t g0) {
    const int64_t nb = a.w->cols / kQK;
    constexpr int64_t kBlockBytes = kPackRowsX8 * kQK / 2;  // 128: 4 registers
    const char* base = static_cast<const char*>(a.w->data);
    const __m256i* q[NG];
    const uint16_t* sc[NG];
    for (int g = 0; g < NG; ++g) {
      q[g] = reinterpret_cast<const __m256i*>(base + (g0 + g) * a.w->row_stride_bytes);
      sc[g] = reinterpret_cast<const uint16_t*>(base + (g0 + g) * a.w->row_stride_bytes + nb * kBlockBytes);
    }
    const ActQ8_0* x[NM];
    for (int m = 0; m < NM; ++m) x[m] = reinterpret_cast<const ActQ8_0*>(act_row(a, m0 + m));
    __m256 acc[NM][NG];
    for (auto& row : acc)
      for (auto& v : row) v = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0x0F);
    const int64_t ahead = NG * a.w->row_stride_bytes;  // the next tile's groups
    for (int64_t b = 0; b < nb; ++b) {
      __m256i p[NM][NG];
      unroll<NM>([&](auto m) { unroll<NG>([&](auto g) { p[m][g] = _mm256_setzero_si256(); }); });
      // One step per iteration, not the block's 4 unrolled (as in KernelQ8_0x8:
      // unrolled, the sums went through the stack). A prefetch every step, so
      // two per line.
#pragma GCC unroll 1
      for (int t = 0; t < 4; ++t) {
        for (int g = 0; g < NG; ++g) _mm_prefetch(reinterpret_cast<const char*>(q[g] + 4 * b + t) + ahead, _MM_HINT_T1);
        unroll<NG>([&](auto g) {
          const __m256i v = _mm256_load_si256(q[g] + 4 * b + t);
          const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
          unroll<NM>([&](auto m) {
            int32_t xl, xh;
            std::memcpy(&xl, x[m][b].qs + 4 * t, 4);
            std::memcpy(&xh, x[m][b].qs + 16 + 4 * t, 4);
            p[m][g] = _mm256_add_epi16(p[m][g], _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)),
                                                                 _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh))));
          });
        });
      }
      for (int g = 0; g < NG; ++g) {
        const __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(sc[g] + kPackRowsX8 * b)));
        for (int m = 0; m < NM; ++m) {
          const __m256i is = _mm256_add_epi32(_mm256_madd_epi16(p[m][g], ones), _mm256_set1_epi32(-8 * x[m][b].sum));
          acc[m][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dw, _mm256_set1_ps(x[m][b].d)), acc[m][g]);
        }
      }
    }
    store_packed<NM, NG>(a, m0, g0, acc);
  }
};

// Q4_K weights packed as WeightLayout::q4_Kx8 x Q8_K activations: lane j is
// weight row j of a group of 8; per super-block and sub-block pair c a
// register holds 4 quant bytes of each row (4 columns of sub-block 2c in the
// low nibbles, of 2c + 1 in the high ones). maddubs products of a sub-block
// add up in int16 lanes over its 8 registers (at most 8 x 2 x 15 x 127 =
// 30480), then one madd by the rows' scale (in both halves of each 32-bit
// lane) gives sc_j (q_j . x_j) per row. Per lane and super-block, exact int32:
//   tot = sum_j sc_j (q_j . x_j),  mins = sum_j m_j sum(x_j) (4 madd on the
//   min pairs)
//   acc += d_x * (d_w * float(tot) - dmin_w * float(mins))
// the same steps for every tile shape.
struct KernelQ4_Kx8 {
  template <int NM, int NG>
  static void tile(const MatmulArgs& a, int64_t m0, int64_t g0) {
    const int64_t nb = a.w->cols / kQK_K;
    constexpr int64_t kRegs = kPackRowsX8 * kQK_K / 2 / 32;  // 32 registers of quants a super-block
    constexpr int64_t kMeta = kPackRowsX8 * kQ4KMetaBytes;   // 160
    constexpr int R = kPackRowsX8;
    const char* base = static_cast<const char*>(a.w->data);
    const __m256i* q[NG];
    const uint8_t* meta[NG];
    for (int g = 0; g < NG; ++g) {
      q[g] = reinterpret_cast<const __m256i*>(base + (g0 + g) * a.w->row_stride_bytes);
      meta[g] = reinterpret_cast<const uint8_t*>(base + (g0 + g) * a.w->row_stride_bytes + nb * kRegs * 32);
    }
    const BlockQ8_K* x[NM];
    for (int m = 0; m < NM; ++m) x[m] = reinterpret_cast<const BlockQ8_K*>(act_row(a, m0 + m));
    __m256 acc[NM][NG];
    for (auto& row : acc)
      for (auto& v : row) v = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const int64_t ahead = NG * a.w->row_stride_bytes;  // the next tile's groups
    // Eight bytes (one per row) as int16 pairs (v, v) in the 8 lanes.
    auto pairs = [](const uint8_t* p) {
      __m128i b;
      int64_t v;
      std::memcpy(&v, p, 8);
      b = _mm_cvtsi64_si128(v);
      const __m256i w = _mm256_cvtepu8_epi32(b);
      return _mm256_or_si256(w, _mm256_slli_epi32(w, 16));
    };
    for (int64_t b = 0; b < nb; ++b) {
      __m256i tot[NM][NG];
      for (auto& row : tot)
        for (auto& v : row) v = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        __m256i plo[NM][NG], phi[NM][NG];
        for (int m = 0; m < NM; ++m)
          for (int g = 0; g < NG; ++g) plo[m][g] = phi[m][g] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int t = 0; t < 8; ++t) {
#pragma GCC unroll 2
          for (int g = 0; g < NG; ++g) {
            const __m256i* src = q[g] + kRegs * b + 8 * c + t;
            if (t % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(src) + ahead, _MM_HINT_T1);
            const __m256i v = _mm256_load_si256(src);
            const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
#pragma GCC unroll 2
            for (int m = 0; m < NM; ++m) {
              int32_t xl, xh;
              std::memcpy(&xl, x[m][b].qs + 64 * c + 4 * t, 4);
              std::memcpy(&xh, x[m][b].qs + 64 * c + 32 + 4 * t, 4);
              plo[m][g] = _mm256_add_epi16(plo[m][g], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)));
              phi[m][g] = _mm256_add_epi16(phi[m][g], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
            }
          }
        }
        for (int g = 0; g < NG; ++g) {
          const uint8_t* sc = meta[g] + b * kMeta + 4 * R;
          const __m256i sl = pairs(sc + R * 2 * c), sh = pairs(sc + R * (2 * c + 1));
          for (int m = 0; m < NM; ++m)
            tot[m][g] = _mm256_add_epi32(tot[m][g], _mm256_add_epi32(_mm256_madd_epi16(plo[m][g], sl),
                                                                     _mm256_madd_epi16(phi[m][g], sh)));
        }
      }
      // The mins: per pair of sub-blocks the activation sums as an int16
      // pair, against each row's (m_2i, m_2i+1).
      int32_t xs[NM][4];
      for (int m = 0; m < NM; ++m) q8_K_pair_sums(x[m][b], xs[m]);
      for (int g = 0; g < NG; ++g) {
        const uint8_t* mt = meta[g] + b * kMeta;
        __m256i mins[NM];
        for (int m = 0; m < NM; ++m) mins[m] = _mm256_setzero_si256();
        for (int i = 0; i < 4; ++i) {
          const __m256i mv = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mt + 12 * R + 2 * R * i)));
          for (int m = 0; m < NM; ++m) mins[m] = _mm256_add_epi32(mins[m], _mm256_madd_epi16(mv, _mm256_set1_epi32(xs[m][i])));
        }
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mt)));
        const __m256 dminv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mt + 2 * R)));
        for (int m = 0; m < NM; ++m) {
          __m256 sv = _mm256_mul_ps(_mm256_cvtepi32_ps(tot[m][g]), dv);
          sv = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins[m]), dminv, sv);
          acc[m][g] = _mm256_fmadd_ps(sv, _mm256_set1_ps(x[m][b].d), acc[m][g]);
        }
      }
    }
    store_packed<NM, NG>(a, m0, g0, acc);
  }
};

// F16 and F32 weights packed as WeightLayout::f16x8 / f32x8
// (matmul_float_packed_x86.inc over 8 lanes).
struct FloatV {
  using reg = __m256;
  static constexpr int64_t kRows = kPackRowsX8;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static reg fmadd(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
};
struct PackedF16 {
  static constexpr int kBytes = 2;
  static __m256 load(const char* p) { return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p))); }
};
struct PackedF32 {
  static constexpr int kBytes = 4;
  static __m256 load(const char* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
};
namespace packed_float {
using V = FloatV;
#define ATELIER_FLOAT_COLUMN_LOOP 1
#include "matmul_float_packed_x86.inc"
#undef ATELIER_FLOAT_COLUMN_LOOP
}  // namespace packed_float
using packed_float::KernelFloatPacked;

}  // namespace avx2

// Packed Q4_K: 2 activation rows x 1 group (16 accumulators would not fit
// in the 16 ymm registers at 2 x 2); 1 row x 2 groups for generation.
void q4_Kx8_rows_avx2(const MatmulArgs& a, int64_t r0, int64_t r1) {
  using Driver = TileDriver<avx2::KernelQ4_Kx8, 2, 1, 2>;
  Driver::run(a, r0 / kPackRowsX8, (r1 + kPackRowsX8 - 1) / kPackRowsX8);
}

// Packed Q4_0: as packed Q8_0.
void q4_0x8_rows_avx2(const MatmulArgs& a, int64_t r0, int64_t r1) {
  using Driver = TileDriver<avx2::KernelQ4_0x8, 4, 1, 4, 2, 1>;
  Driver::run(a, r0 / kPackRowsX8, (r1 + kPackRowsX8 - 1) / kPackRowsX8);
}

// Packed Q8_0: tiles of 4 activation rows x 1 group of 8 weight rows (the
// weights' |w| is shared by the 4 rows); generation (1-3 rows) takes 4, 2, 1
// groups: more independent chains for the memory-bound case.
void q8_0x8_rows_avx2(const MatmulArgs& a, int64_t r0, int64_t r1) {
  using Driver = TileDriver<avx2::KernelQ8_0x8, 4, 1, 4, 2, 1>;
  Driver::run(a, r0 / kPackRowsX8, (r1 + kPackRowsX8 - 1) / kPackRowsX8);
}

// Packed F16 and F32: tiles of 6 activation rows x 2 groups of 8 (12 of the
// 16 ymm registers accumulate); 4, 4, 3, 3, 2 groups for 1-5 rows.
template <class Load>
void float_x8_rows_avx2(const MatmulArgs& a, int64_t r0, int64_t r1) {
  using namespace avx2;
  const int64_t g0 = r0 / kPackRowsX8, g1 = (r1 + kPackRowsX8 - 1) / kPackRowsX8;
  if (float_prefetch() == FloatPrefetch::near)
    RowChunkedDriver<TileDriver<KernelFloatPacked<Load, FloatPrefetch::near>, 6, 2, 4, 4, 3, 3, 2>>::run(a, g0, g1);
  else
    RowChunkedDriver<TileDriver<KernelFloatPacked<Load, FloatPrefetch::next_tile>, 6, 2, 4, 4, 3, 3, 2>>::run(a, g0, g1);
}
void f16x8_rows_avx2(const MatmulArgs& a, int64_t r0, int64_t r1) { float_x8_rows_avx2<avx2::PackedF16>(a, r0, r1); }
void f32x8_rows_avx2(const MatmulArgs& a, int64_t r0, int64_t r1) { float_x8_rows_avx2<avx2::PackedF32>(a, r0, r1); }

// Tile shapes: activation rows x weight rows, sized to the 16 ymm registers.
RowsFn rows_fn_avx2(DType t) {
  using namespace avx2;
  switch (t) {
    case DType::F32: return &RowChunkedDriver<TileDriver<KernelFloat<LoadF32>, 4, 3>>::run;
    case DType::F16: return &RowChunkedDriver<TileDriver<KernelFloat<LoadF16>, 4, 3>>::run;
    case DType::BF16: return &RowChunkedDriver<TileDriver<KernelFloat<LoadBF16>, 4, 3>>::run;
    case DType::Q8_0: return &TileDriver<KernelQ8_0, 4, 2, 4, 2, 2>::run;
    case DType::Q4_0: return &TileDriver<KernelQ4_0, 4, 2, 4, 2, 2>::run;
    case DType::Q4_K: return &TileDriver<KernelQ4_K, 4, 2, 4, 2, 2>::run;
    case DType::Q6_K: return &TileDriver<KernelQ6_K, 4, 2, 4, 2, 2>::run;
    case DType::MXFP4: return &TileDriver<KernelMXFP4, 4, 2, 4, 2, 2>::run;
    default: return nullptr;
  }
}

}  // namespace atelier::kernels::cpu
