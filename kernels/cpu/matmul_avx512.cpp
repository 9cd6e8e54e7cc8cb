// AVX-512 matmul tiles: 512-bit FMA for float weights, 512-bit VNNI
// (dpbusd/dpwssd) for the integer dots, software prefetch for the weight
// streams. dpbf16ps is not used: it would round the activations to bf16.
#include <immintrin.h>

#include <cstring>

#include "matmul_internal.h"
#include "simd.h"
#include "quants.h"

namespace atelier::kernels::cpu {
namespace avx512 {

#define AI __attribute__((always_inline)) inline

// ---- integer-dot tiles (Q8_0, Q4_0, Q4_K, Q6_K) -----------------------------
//
// 512-bit VNNI: one dpbusd covers two 32-element blocks (Q8_0/Q4_0) or two
// sub-blocks of a K-quant. Per (m, r) the tile keeps one 16-lane f32
// accumulator; its lanes are reduced by reduce_rows, which sums each row's
// lanes in one fixed tree (the same tree whether 1 or 8 rows are reduced at
// once). Every tile shape therefore runs the same arithmetic per (m, r), in
// the same order: batch invariance. The tiles loop weight row outer, activation
// row inner, so only one weight row's decoded block is live at a time.

// 16 f32 lanes: 8 of `lo`, then 8 of `hi`.
AI __m512 bcast2_ps(float lo, float hi) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(lo)), _mm256_set1_ps(hi), 1);
}
AI __m512i bcast2_epi32(int lo, int hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(lo)), _mm256_set1_epi32(hi), 1);
}
// fp16 scales of two blocks widened to 8 + 8 f32 lanes
AI __m512 bcast2_ph(uint16_t lo, uint16_t hi) {
  const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(static_cast<short>(lo))),
                                            _mm_set1_epi16(static_cast<short>(hi)), 1);
  return _mm512_cvtph_ps(h);
}
AI __m512i load2x256(const void* lo, const void* hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(static_cast<const __m256i*>(lo))),
                            _mm256_loadu_si256(static_cast<const __m256i*>(hi)), 1);
}

// Software prefetch into L2 of the weight bytes [p, p + n), `ahead` bytes
// further on. The tiles stream NR rows at once, each only a few cache lines
// long at model widths (768 Q8_0 columns: 13 lines), too short for the
// hardware prefetcher; without this, matrix-vector products out of DRAM ran
// at a third of the bandwidth. `ahead` is kAheadTiles * NR row strides: the
// same row kAheadTiles tiles on. Prefetching only moves data, so the tile
// shape (and the distance) never changes the arithmetic.
constexpr int kAheadTiles = 4;
constexpr auto kHint = _MM_HINT_T1;
template <int N>
AI void prefetch(const void* p, int64_t ahead) {
  const char* c = static_cast<const char*>(p) + ahead;
  for (int i = 0; i < N; i += 64) _mm_prefetch(c + i, kHint);
}

// Horizontal sums of up to 4 accumulators at once: lanes 0..3 of the result
// are the sums of v[0..3]. Each row's 16 lanes go through the same tree
// (halves of 256, then of 128, then lane i + i+2, then i + i+1) whatever the
// other rows hold, so a row's sum never depends on its neighbours.
AI __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // [a0+a2, a1+a3, b0+b2, b1+b3] in 128-bit chunks
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
  // one 128-bit chunk per row
  const __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 u = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 v = _mm512_add_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), v));
}

// y[m][r0 .. r0 + NR) = the lane sums of acc[m][..]
template <int NM, int NR>
AI void store_rows(const MatmulArgs& a, int64_t m0, int64_t r0, __m512 (&acc)[NM][NR]) {
  const __m512 z = _mm512_setzero_ps();
  for (int m = 0; m < NM; ++m) {
    float* y = a.y + (m0 + m) * a.w->rows + r0;
#pragma GCC unroll 8
    for (int r = 0; r < NR; r += 4) {
      const __m128 s = reduce4(acc[m][r], r + 1 < NR ? acc[m][r + 1] : z, r + 2 < NR ? acc[m][r + 2] : z,
                               r + 3 < NR ? acc[m][r + 3] : z);
      const int n = NR - r < 4 ? NR - r : 4;
      if (n == 4) {
        _mm_storeu_ps(y + r, s);
      } else {
        // Not a masked store: GCC emits it as vextractf32x4 to memory with a
        // mask, which faults on this Zen 4 when a masked-out lane lies in an
        // unmapped page (the row's end at a page end; tested with a guard page).
        alignas(16) float t[4];
        _mm_store_ps(t, s);
        for (int i = 0; i < n; ++i) y[r + i] = t[i];
      }
    }
  }
}

template <int NM, int NR>
AI void zero(__m512 (&acc)[NM][NR]) {
  for (auto& row : acc)
    for (auto& v : row) v = _mm512_setzero_ps();
}

// Q8_0 activations laid out for the 512-bit tiles: per pair of blocks the
// 64 quants, the two scales broadcast to 8 + 8 lanes, and the two offsets
// (kBias * -sum) likewise; a lone last block has the upper lanes zero. Built
// once per driver call (expand), then loaded as is by every tile: the same
// operand values the tiles would otherwise rebuild for each weight tile.
struct alignas(64) XPair {
  int8_t qs[64];
  float d[16];
  int32_t bias[16];
};
static_assert(sizeof(XPair) == 192);

template <int kBias>
struct ExpandQ8_0 {
  static int64_t expand_row_bytes(const MatmulArgs& a) {
    return (a.w->cols / kQK + 1) / 2 * int64_t(sizeof(XPair));
  }
  static void expand(const MatmulArgs& a, int64_t m, void* dst) {
    const int64_t nb = a.w->cols / kQK;
    const auto* xb = reinterpret_cast<const ActQ8_0*>(act_row(a, m));
    auto* out = static_cast<XPair*>(dst);
    for (int64_t b = 0; b < nb; b += 2) {
      XPair& p = out[b / 2];
      std::memset(&p, 0, sizeof p);
      for (int h = 0; h < 2 && b + h < nb; ++h) {
        std::memcpy(p.qs + 32 * h, xb[b + h].qs, 32);
        for (int l = 0; l < 8; ++l) {
          p.d[8 * h + l] = xb[b + h].d;
          p.bias[8 * h + l] = -kBias * xb[b + h].sum;
        }
      }
    }
  }
  // the expanded row m of a tile
  static const XPair* row(const MatmulArgs& a, int64_t m) {
    return reinterpret_cast<const XPair*>(static_cast<const char*>(a.xe) + m * a.xe_row_bytes);
  }
};

// Q8_0 activations for Q8_0 weights: one scale per group of kActGroupQ8_0 (8)
// blocks (quants.h), laid out per group as 4 pairs of blocks: 64 quants and
// the offsets (kBias * -sum) broadcast to 8 + 8 lanes per pair, then the
// group's scale. Unused pairs of a short last group are zero.
constexpr int kGroupPairs = kActGroupQ8_0 / 2;
struct alignas(64) XGroup {
  int8_t qs[kGroupPairs][64];
  int32_t bias[kGroupPairs][16];
  float d;
};
static_assert(sizeof(XGroup) == 576);

// Q8_0 weights x Q8_0 activations, per group of 8 blocks:
//   acc += d_x * sum over pairs (d_w * (sum (w + 128) x  -  128 sum x))
// The weight scale needs one FMA per pair, the activation scale one per
// group: two FMA-pipe operations per 64 products (plus the dot itself)
// instead of three with a scale per block.
struct KernelQ8_0 {
  static constexpr int kBias = 16;  // per lane: 8 lanes x 16 = 128
  static int64_t expand_row_bytes(const MatmulArgs& a) {
    return (a.w->cols / kQK + kActGroupQ8_0 - 1) / kActGroupQ8_0 * int64_t(sizeof(XGroup));
  }
  static void expand(const MatmulArgs& a, int64_t m, void* dst) {
    const int64_t nb = a.w->cols / kQK;
    const auto* xb = reinterpret_cast<const ActQ8_0*>(act_row(a, m));
    auto* out = static_cast<XGroup*>(dst);
    for (int64_t b0 = 0; b0 < nb; b0 += kActGroupQ8_0) {
      XGroup& g = out[b0 / kActGroupQ8_0];
      std::memset(&g, 0, sizeof g);
      g.d = xb[b0].d;  // the same in every block of the group
      for (int64_t b = b0; b < nb && b < b0 + kActGroupQ8_0; ++b) {
        const int p = static_cast<int>((b - b0) / 2), h = static_cast<int>((b - b0) % 2);
        std::memcpy(g.qs[p] + 32 * h, xb[b].qs, 32);
        for (int l = 0; l < 8; ++l) g.bias[p][8 * h + l] = -kBias * xb[b].sum;
      }
    }
  }

  // One group: NP pairs of blocks, the last one a lone block when kLone.
  template <int NM, int NR, int NP, bool kLone>
  AI static void group(const BlockQ8_0* const* w, const XGroup* const* x, int64_t b0, int64_t ahead,
                       __m512 (&acc)[NM][NR]) {
    const __m512i off = _mm512_set1_epi8(-128);
    const int64_t g = b0 / kActGroupQ8_0;
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const BlockQ8_0* wb = w[r] + b0;
      prefetch<kActGroupQ8_0 * sizeof(BlockQ8_0)>(wb, ahead);
      __m512i wa[NP];
      __m512 wd[NP];
#pragma GCC unroll 4
      for (int p = 0; p < NP; ++p) {
        if (kLone && p == NP - 1) {
          wa[p] = _mm512_maskz_xor_epi32(0x00FF, _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[2 * p].qs))), off);
          wd[p] = _mm512_zextps256_ps512(_mm256_set1_ps(_cvtsh_ss(wb[2 * p].d)));
        } else {
          wa[p] = _mm512_xor_si512(load2x256(wb[2 * p].qs, wb[2 * p + 1].qs), off);  // w + 128 as u8
          wd[p] = bcast2_ph(wb[2 * p].d, wb[2 * p + 1].d);
        }
      }
#pragma GCC unroll 16
      for (int m = 0; m < NM; ++m) {
        const XGroup& xg = x[m][g];
        __m512 t = _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int p = 0; p < NP; ++p) {
          const __m512i s = _mm512_dpbusd_epi32(_mm512_load_si512(xg.bias[p]), wa[p], _mm512_load_si512(xg.qs[p]));
          t = _mm512_fmadd_ps(wd[p], _mm512_cvtepi32_ps(s), t);
        }
        acc[m][r] = _mm512_fmadd_ps(_mm512_set1_ps(xg.d), t, acc[m][r]);
      }
    }
  }

  template <int NM, int NR>
  static void tile(const MatmulArgs& a, int64_t m0, int64_t r0) {
    const int64_t nb = a.w->cols / kQK;
    const BlockQ8_0* w[NR];
    const XGroup* x[NM];
    for (int r = 0; r < NR; ++r) w[r] = reinterpret_cast<const BlockQ8_0*>(weight_row(a, r0 + r));
    for (int m = 0; m < NM; ++m)
      x[m] = reinterpret_cast<const XGroup*>(static_cast<const char*>(a.xe) + (m0 + m) * a.xe_row_bytes);
    __m512 acc[NM][NR];
    zero(acc);
    const int64_t ahead = kAheadTiles * NR * a.w->row_stride_bytes;
    int64_t b0 = 0;
    for (; b0 + kActGroupQ8_0 <= nb; b0 += kActGroupQ8_0) group<NM, NR, kGroupPairs, false>(w, x, b0, ahead, acc);
    switch (nb - b0) {  // a short last group
      case 1: group<NM, NR, 1, true>(w, x, b0, ahead, acc); break;
      case 2: group<NM, NR, 1, false>(w, x, b0, ahead, acc); break;
      case 3: group<NM, NR, 2, true>(w, x, b0, ahead, acc); break;
      case 4: group<NM, NR, 2, false>(w, x, b0, ahead, acc); break;
      case 5: group<NM, NR, 3, true>(w, x, b0, ahead, acc); break;
      case 6: group<NM, NR, 3, false>(w, x, b0, ahead, acc); break;
      case 7: group<NM, NR, 4, true>(w, x, b0, ahead, acc); break;
      default: break;
    }
    store_rows<NM, NR>(a, m0, r0, acc);
  }
};

// y rows of a tile of packed groups of 16 (lane j = row j of the group);
// the padded last group by plain stores of its real rows (see store_rows).
template <int NM, int NG>
AI void store_packed(const MatmulArgs& a, int64_t m0, int64_t g0, __m512 (&acc)[NM][NG]) {
  for (int m = 0; m < NM; ++m) {
    float* y = a.y + (m0 + m) * a.w->rows;
    for (int g = 0; g < NG; ++g) {
      const int64_t r = (g0 + g) * kPackRows;
      if (r + kPackRows <= a.w->rows) {
        _mm512_storeu_ps(y + r, acc[m][g]);
      } else {
        alignas(64) float t[kPackRows];
        _mm512_store_ps(t, acc[m][g]);
        for (int64_t i = 0; r + i < a.w->rows; ++i) y[r + i] = t[i];
      }
    }
  }
}

// Q8_0 weights packed as WeightLayout::q8_0x16 x Q8_0 activations. Lane j
// of every register belongs to weight row j of a group of 16, so one dpbusd
// (u8 weights + 128, times 4 activation bytes broadcast to all lanes) adds 4
// products to each of 16 rows; 8 of them cover a block. Per lane:
//   t   += float(sum (w + 128) x - 128 sum x) * d_w    per block
//   acc += t * d_x                                     per group of 8 blocks
// (the activations share one scale per group, quants.h): one convert and
// one FMA per 8 dpbusd, and the lanes are the outputs (no horizontal sums).
// The integer sum is exact, so every tile shape gives the same bits.
// Tile: 4 activation rows x 3 groups (12 integer, 12 + 12 float
// accumulators); 6 x 2 and 4 x 4 measured the same or slower.
constexpr int kPackM = 4, kPackG = 3;

// Prefetch of the packed weights: a tile of kPackG groups is read once per
// tile of kPackM activation rows ("pass"), from DRAM the first time and from
// L2 after. Each pass prefetches its share of the NEXT tile's lines (block b
// in pass b % passes), so the DRAM stream keeps running during the L2 passes
// instead of only in the first one.
struct KernelQ8_0x16 {
  template <int NM, int NG>
  static void tile(const MatmulArgs& a, int64_t m0, int64_t g0) {
    const int64_t nb = a.w->cols / kQK;
    const char* base = static_cast<const char*>(a.w->data);
    const __m512i* q[NG];
    const uint16_t* sc[NG];
    for (int g = 0; g < NG; ++g) {
      q[g] = reinterpret_cast<const __m512i*>(base + (g0 + g) * a.w->row_stride_bytes);
      sc[g] = reinterpret_cast<const uint16_t*>(base + (g0 + g) * a.w->row_stride_bytes + nb * kPackBlockBytes);
    }
    const ActQ8_0* x[NM];
    for (int m = 0; m < NM; ++m) x[m] = reinterpret_cast<const ActQ8_0*>(act_row(a, m0 + m));
    __m512 acc[NM][NG];
    zero(acc);
    const int64_t passes = (a.m_rows + kPackM - 1) / kPackM, pass = m0 / kPackM;
    const int64_t ahead = NG * a.w->row_stride_bytes;  // the next tile, same offset
    for (int64_t b0 = 0; b0 < nb; b0 += kActGroupQ8_0) {
      // One activation scale per group of blocks (quants.h): the blocks'
      // weight-scaled sums are added first, then scaled by it once.
      __m512 t[NM][NG];
      zero(t);
      for (int64_t b = b0; b < b0 + kActGroupQ8_0 && b < nb; ++b) {
        if (b % passes == pass)
          for (int g = 0; g < NG; ++g)
            for (int k = 0; k < 8; ++k) _mm_prefetch(reinterpret_cast<const char*>(q[g] + 8 * b + k) + ahead, kHint);
        __m512i is[NM][NG];
        for (int m = 0; m < NM; ++m) {
          const __m512i bias = _mm512_set1_epi32(-128 * x[m][b].sum);
          for (int g = 0; g < NG; ++g) is[m][g] = bias;
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
#pragma GCC unroll 4
          for (int g = 0; g < NG; ++g) {
            const __m512i wv = _mm512_load_si512(q[g] + 8 * b + k);
#pragma GCC unroll 8
            for (int m = 0; m < NM; ++m) {
              int32_t xv;
              std::memcpy(&xv, x[m][b].qs + 4 * k, 4);
              is[m][g] = _mm512_dpbusd_epi32(is[m][g], wv, _mm512_set1_epi32(xv));
            }
          }
        }
        for (int g = 0; g < NG; ++g) {
          const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sc[g] + kPackRows * b)));
          for (int m = 0; m < NM; ++m) t[m][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[m][g]), dw, t[m][g]);
        }
      }
      for (int m = 0; m < NM; ++m) {
        const __m512 dx = _mm512_set1_ps(x[m][b0].d);
        for (int g = 0; g < NG; ++g) acc[m][g] = _mm512_fmadd_ps(t[m][g], dx, acc[m][g]);
      }
    }
    store_packed<NM, NG>(a, m0, g0, acc);
  }
};

// Q4_0 weights packed as WeightLayout::q4_0x16 x Q8_0 activations: lane j
// is weight row j of a group of 16; a register holds 4 of GGML's nibble
// bytes of each row (4 columns in the low nibbles, 4 columns 16 further in
// the high ones), so two dpbusd (the nibbles, q + 8, as the unsigned
// operand; 4 activation bytes broadcast) add 4 + 4 products to every row.
// Per lane and block:
//   acc += float(sum nibble x  -  8 sum x) * (d_w * d_x)
// exact integers, the same float steps for every tile shape.
struct KernelQ4_0x16 {
  template <int NM, int NG>
  static void tile(const MatmulArgs& a, int64_t m0, int64_t g0) {
    const int64_t nb = a.w->cols / kQK;
    constexpr int64_t kBlockBytes = kPackRows * kQK / 2;  // 256: 4 registers
    const char* base = static_cast<const char*>(a.w->data);
    const __m512i* q[NG];
    const uint16_t* sc[NG];
    for (int g = 0; g < NG; ++g) {
      q[g] = reinterpret_cast<const __m512i*>(base + (g0 + g) * a.w->row_stride_bytes);
      sc[g] = reinterpret_cast<const uint16_t*>(base + (g0 + g) * a.w->row_stride_bytes + nb * kBlockBytes);
    }
    const ActQ8_0* x[NM];
    for (int m = 0; m < NM; ++m) x[m] = reinterpret_cast<const ActQ8_0*>(act_row(a, m0 + m));
    __m512 acc[NM][NG];
    zero(acc);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const int64_t ahead = NG * a.w->row_stride_bytes;  // the next tile's groups
    for (int64_t b = 0; b < nb; ++b) {
      __m512i is[NM][NG];
      for (int m = 0; m < NM; ++m) {
        const __m512i bias = _mm512_set1_epi32(-8 * x[m][b].sum);
        for (int g = 0; g < NG; ++g) is[m][g] = bias;
      }
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
#pragma GCC unroll 4
        for (int g = 0; g < NG; ++g) {
          _mm_prefetch(reinterpret_cast<const char*>(q[g] + 4 * b + t) + ahead, kHint);
          const __m512i v = _mm512_load_si512(q[g] + 4 * b + t);
          const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
#pragma GCC unroll 4
          for (int m = 0; m < NM; ++m) {
            int32_t xl, xh;
            std::memcpy(&xl, x[m][b].qs + 4 * t, 4);
            std::memcpy(&xh, x[m][b].qs + 16 + 4 * t, 4);
            is[m][g] = _mm512_dpbusd_epi32(is[m][g], lo, _mm512_set1_epi32(xl));
            is[m][g] = _mm512_dpbusd_epi32(is[m][g], hi, _mm512_set1_epi32(xh));
          }
        }
      }
      for (int g = 0; g < NG; ++g) {
        const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sc[g] + kPackRows * b)));
        for (int m = 0; m < NM; ++m)
          acc[m][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[m][g]), _mm512_mul_ps(dw, _mm512_set1_ps(x[m][b].d)), acc[m][g]);
      }
    }
    store_packed<NM, NG>(a, m0, g0, acc);
  }
};

// Q4_K weights packed as WeightLayout::q4_Kx16 x Q8_K activations: lane j
// is weight row j of a group of 16. Per super-block and sub-block pair c, a
// register holds 4 quant bytes of each row: 4 columns of sub-block 2c in the
// low nibbles, the same columns of 2c + 1 in the high ones, so two dpbusd
// (4 activation bytes broadcast each) add 4 + 4 products to every row. Per
// lane and super-block, all in exact int32:
//   tot  = sum_j sc_j * (q_j . x_j)           (mullo by the row's scales)
//   mins = sum_j m_j * sum(x_j)               (4 dpwssd on the min pairs)
//   acc += d_x * (d_w * float(tot) - dmin_w * float(mins))
// the same float steps for every tile shape.
struct KernelQ4_Kx16 {
  template <int NM, int NG>
  static void tile(const MatmulArgs& a, int64_t m0, int64_t g0) {
    const int64_t nb = a.w->cols / kQK_K;
    constexpr int64_t kQuantBytes = kPackRows * kQK_K / 2;  // 2048: 32 registers
    constexpr int64_t kMeta = kPackRows * kQ4KMetaBytes;    // 320
    const char* base = static_cast<const char*>(a.w->data);
    const __m512i* q[NG];
    const uint8_t* meta[NG];
    for (int g = 0; g < NG; ++g) {
      q[g] = reinterpret_cast<const __m512i*>(base + (g0 + g) * a.w->row_stride_bytes);
      meta[g] = reinterpret_cast<const uint8_t*>(base + (g0 + g) * a.w->row_stride_bytes + nb * kQuantBytes);
    }
    const BlockQ8_K* x[NM];
    for (int m = 0; m < NM; ++m) x[m] = reinterpret_cast<const BlockQ8_K*>(act_row(a, m0 + m));
    __m512 acc[NM][NG];
    zero(acc);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const int64_t ahead = NG * a.w->row_stride_bytes;  // the next tile's groups
    for (int64_t b = 0; b < nb; ++b) {
      __m512i tot[NM][NG];
      for (auto& row : tot)
        for (auto& v : row) v = _mm512_setzero_si512();
      for (int c = 0; c < 4; ++c) {
        __m512i ilo[NM][NG], ihi[NM][NG];
        for (int m = 0; m < NM; ++m)
          for (int g = 0; g < NG; ++g) ilo[m][g] = ihi[m][g] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int t = 0; t < 8; ++t) {
#pragma GCC unroll 4
          for (int g = 0; g < NG; ++g) {
            const __m512i* src = q[g] + 32 * b + 8 * c + t;
            _mm_prefetch(reinterpret_cast<const char*>(src) + ahead, kHint);
            const __m512i v = _mm512_load_si512(src);
            const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
#pragma GCC unroll 4
            for (int m = 0; m < NM; ++m) {
              int32_t xl, xh;
              std::memcpy(&xl, x[m][b].qs + 64 * c + 4 * t, 4);
              std::memcpy(&xh, x[m][b].qs + 64 * c + 32 + 4 * t, 4);
              ilo[m][g] = _mm512_dpbusd_epi32(ilo[m][g], lo, _mm512_set1_epi32(xl));
              ihi[m][g] = _mm512_dpbusd_epi32(ihi[m][g], hi, _mm512_set1_epi32(xh));
            }
          }
        }
        for (int g = 0; g < NG; ++g) {
          const uint8_t* sc = meta[g] + b * kMeta + 4 * kPackRows;
          const __m512i sl = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + kPackRows * 2 * c)));
          const __m512i sh = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + kPackRows * (2 * c + 1))));
          for (int m = 0; m < NM; ++m)
            tot[m][g] = _mm512_add_epi32(tot[m][g], _mm512_add_epi32(_mm512_mullo_epi32(ilo[m][g], sl),
                                                                     _mm512_mullo_epi32(ihi[m][g], sh)));
        }
      }
      // The mins: per pair of sub-blocks (2i, 2i + 1) the activation sums as
      // an int16 pair, against each row's (m_2i, m_2i+1).
      int32_t xs[NM][4];
      for (int m = 0; m < NM; ++m) q8_K_pair_sums(x[m][b], xs[m]);
      for (int g = 0; g < NG; ++g) {
        const uint8_t* mt = meta[g] + b * kMeta;
        __m512i mins[NM];
        for (int m = 0; m < NM; ++m) mins[m] = _mm512_setzero_si512();
        for (int i = 0; i < 4; ++i) {
          const __m512i mv = _mm512_cvtepu8_epi16(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(mt + 12 * kPackRows + 2 * kPackRows * i)));
          for (int m = 0; m < NM; ++m) mins[m] = _mm512_dpwssd_epi32(mins[m], mv, _mm512_set1_epi32(xs[m][i]));
        }
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mt)));
        const __m512 dminv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mt + 2 * kPackRows)));
        for (int m = 0; m < NM; ++m) {
          __m512 sv = _mm512_mul_ps(_mm512_cvtepi32_ps(tot[m][g]), dv);
          sv = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins[m]), dminv, sv);
          acc[m][g] = _mm512_fmadd_ps(sv, _mm512_set1_ps(x[m][b].d), acc[m][g]);
        }
      }
    }
    store_packed<NM, NG>(a, m0, g0, acc);
  }
};

// Q6_K weights packed as WeightLayout::q6_Kx16 x Q8_K activations: lane j
// is weight row j of a group of 16. A code (0..63) is rebuilt per register
// of 4 columns x 16 rows from its ql nibble and its 2 qh bits (GGML's
// arrangement: ql byte l holds columns l and l + 64 of a 128-column half,
// ql byte l + 32 columns l + 32 and l + 96, qh byte l their four high bit
// pairs), then one dpbusd adds 4 products to every row. Per lane and
// 16-column group s, in exact int32:
//   is_s  = sum q x - 32 sum x            (starts from -32 bsum_s)
//   tot  += sc_s * is_s                   (mullo by the rows' scales)
//   acc  += d_x * (d_w * float(tot))      per super-block
// the same steps for every tile shape.
struct KernelQ6_Kx16 {
  template <int NM, int NG>
  static void tile(const MatmulArgs& a, int64_t m0, int64_t g0) {
    const int64_t nb = a.w->cols / kQK_K;
    constexpr int64_t kRegs = kQK_K * 3 / 4 / 4;             // 48 registers of quants a super-block
    constexpr int64_t kMeta = kPackRows * kQ6KMetaBytes;     // 288
    const char* base = static_cast<const char*>(a.w->data);
    const __m512i* q[NG];
    const uint8_t* meta[NG];
    for (int g = 0; g < NG; ++g) {
      q[g] = reinterpret_cast<const __m512i*>(base + (g0 + g) * a.w->row_stride_bytes);
      meta[g] = reinterpret_cast<const uint8_t*>(base + (g0 + g) * a.w->row_stride_bytes + nb * kRegs * 64);
    }
    const BlockQ8_K* x[NM];
    for (int m = 0; m < NM; ++m) x[m] = reinterpret_cast<const BlockQ8_K*>(act_row(a, m0 + m));
    __m512 acc[NM][NG];
    zero(acc);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const int64_t ahead = NG * a.w->row_stride_bytes;  // the next tile's groups
    for (int64_t b = 0; b < nb; ++b) {
      __m512i tot[NM][NG];
      for (auto& row : tot)
        for (auto& v : row) v = _mm512_setzero_si512();
      for (int n = 0; n < 2; ++n)
        for (int h = 0; h < 2; ++h)
#pragma GCC unroll 4
          for (int k = 0; k < 4; ++k) {
            const int s = 8 * n + 2 * k + h;  // columns 128 n + 32 k + 16 h .. + 15
            __m512i is[NM][NG];
            for (int m = 0; m < NM; ++m) {
              const __m512i bias = _mm512_set1_epi32(-32 * x[m][b].bsums[s]);
              for (int g = 0; g < NG; ++g) is[m][g] = bias;
            }
#pragma GCC unroll 4
            for (int tt = 0; tt < 4; ++tt) {
              const int t = 4 * h + tt;
#pragma GCC unroll 2
              for (int g = 0; g < NG; ++g) {
                const __m512i* r = q[g] + kRegs * b;
                const __m512i* pl = r + 16 * n + (k & 1) * 8 + t;
                const __m512i* ph = r + 32 + 8 * n + t;
                if (k < 2) _mm_prefetch(reinterpret_cast<const char*>(pl) + ahead, kHint);
                if (k == 0) _mm_prefetch(reinterpret_cast<const char*>(ph) + ahead, kHint);
                const __m512i ql = _mm512_load_si512(pl), qh = _mm512_load_si512(ph);
                const __m512i lo = _mm512_and_si512(k >= 2 ? _mm512_srli_epi16(ql, 4) : ql, m4);
                const __m512i hs = k == 0   ? _mm512_slli_epi16(qh, 4)
                                   : k == 1 ? _mm512_slli_epi16(qh, 2)
                                   : k == 2 ? qh
                                            : _mm512_srli_epi16(qh, 2);
                const __m512i w = _mm512_or_si512(lo, _mm512_and_si512(hs, m30));
#pragma GCC unroll 4
                for (int m = 0; m < NM; ++m) {
                  int32_t xv;
                  std::memcpy(&xv, x[m][b].qs + 128 * n + 32 * k + 4 * t, 4);
                  is[m][g] = _mm512_dpbusd_epi32(is[m][g], w, _mm512_set1_epi32(xv));
                }
              }
            }
            for (int g = 0; g < NG; ++g) {
              const __m512i sc = _mm512_cvtepi8_epi32(
                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(meta[g] + b * kMeta + 2 * kPackRows + kPackRows * s)));
              for (int m = 0; m < NM; ++m) tot[m][g] = _mm512_add_epi32(tot[m][g], _mm512_mullo_epi32(is[m][g], sc));
            }
          }
      for (int g = 0; g < NG; ++g) {
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(meta[g] + b * kMeta)));
        for (int m = 0; m < NM; ++m)
          acc[m][g] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(tot[m][g]), dv), _mm512_set1_ps(x[m][b].d), acc[m][g]);
      }
    }
    store_packed<NM, NG>(a, m0, g0, acc);
  }
};

// Q4_0 weights x Q8_0 activations, two blocks per step: unsigned nibbles
// times x, minus 8 * sum(x).
struct KernelQ4_0 : ExpandQ8_0<1> {
  template <int NM, int NR, bool kOne>
  AI static void step(const BlockQ4_0* const* w, const XPair* const* x, int64_t b, int64_t ahead,
                      __m512 (&acc)[NM][NR]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const BlockQ4_0* wb = w[r] + b;
      prefetch<2 * sizeof(BlockQ4_0)>(wb, ahead);
      __m512i wn;
      __m512 wd;
      if constexpr (kOne) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[0].qs));
        // low nibbles are elements 0..15, high nibbles 16..31
        wn = _mm512_zextsi256_si512(_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F)));
        wd = _mm512_zextps256_ps512(_mm256_set1_ps(_cvtsh_ss(wb[0].d)));
      } else {
        const __m256i q = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[0].qs))),
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[1].qs)), 1);
        // [q0, q1, q0 >> 4, q1 >> 4] -> [q0, q0 >> 4, q1, q1 >> 4] in 128-bit chunks
        const __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1);
        wn = _mm512_and_si512(_mm512_shuffle_i64x2(u, u, _MM_SHUFFLE(3, 1, 2, 0)), m4);
        wd = bcast2_ph(wb[0].d, wb[1].d);
      }
#pragma GCC unroll 16
      for (int m = 0; m < NM; ++m) {
        const XPair& xp = x[m][b / 2];
        const __m512i s = _mm512_dpbusd_epi32(_mm512_load_si512(xp.bias), wn, _mm512_load_si512(xp.qs));
        acc[m][r] = _mm512_fmadd_ps(_mm512_mul_ps(wd, _mm512_load_ps(xp.d)), _mm512_cvtepi32_ps(s), acc[m][r]);
      }
    }
  }

  template <int NM, int NR>
  static void tile(const MatmulArgs& a, int64_t m0, int64_t r0) {
    const int64_t nb = a.w->cols / kQK;
    const BlockQ4_0* w[NR];
    const XPair* x[NM];
    for (int r = 0; r < NR; ++r) w[r] = reinterpret_cast<const BlockQ4_0*>(weight_row(a, r0 + r));
    for (int m = 0; m < NM; ++m) x[m] = row(a, m0 + m);
    __m512 acc[NM][NR];
    zero(acc);
    int64_t b = 0;
    const int64_t ahead = kAheadTiles * NR * a.w->row_stride_bytes;
    for (; b + 2 <= nb; b += 2) step<NM, NR, false>(w, x, b, ahead, acc);
    if (b < nb) step<NM, NR, true>(w, x, b, ahead, acc);
    store_rows<NM, NR>(a, m0, r0, acc);
  }
};

// Q4_K weights x Q8_K activations. Per super-block:
//   d * sum_j sc_j * (q_j . x_j)  -  dmin * sum_j m_j * sum(x_j)
// both sums exact in int32 lanes; one zmm covers sub-blocks 2c and 2c + 1
// (the low and high nibbles of the same 32 bytes).
struct KernelQ4_K {
  template <int NM, int NR>
  static void tile(const MatmulArgs& a, int64_t m0, int64_t r0) {
    const int64_t nb = a.w->cols / kQK_K;
    const int64_t ahead = kAheadTiles * NR * a.w->row_stride_bytes;
    const BlockQ4_K* w[NR];
    const BlockQ8_K* x[NM];
    for (int r = 0; r < NR; ++r) w[r] = reinterpret_cast<const BlockQ4_K*>(weight_row(a, r0 + r));
    for (int m = 0; m < NM; ++m) x[m] = reinterpret_cast<const BlockQ8_K*>(act_row(a, m0 + m));
    __m512 acc[NM][NR];
    zero(acc);
    __m128 accm[NM][NR];  // the dmin terms
    for (auto& row : accm)
      for (auto& v : row) v = _mm_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i sidx[4];  // words: 16 x scale 2c, 16 x scale 2c + 1
    for (int c = 0; c < 4; ++c)
      sidx[c] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(static_cast<short>(2 * c))),
                                   _mm256_set1_epi16(static_cast<short>(2 * c + 1)), 1);
    for (int64_t b = 0; b < nb; ++b) {
      __m128i bsum[NM];
      __m512 xd[NM];
#pragma GCC unroll 8
      for (int m = 0; m < NM; ++m) {
        const BlockQ8_K& xb = x[m][b];
        xd[m] = _mm512_set1_ps(xb.d);
        // sums of x over each 32-element sub-block
        bsum[m] = _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.bsums)),
                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.bsums + 8)));
      }
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        const BlockQ4_K& blk = w[r][b];
        prefetch<sizeof(BlockQ4_K)>(&blk, ahead);
        __m512i q[4], sc[4];
        for (int c = 0; c < 4; ++c) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs + 32 * c));
          q[c] = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1), m4);
        }
        // Unpack the 6-bit scales (bytes 0..7) and mins (bytes 8..15) in one go.
        uint32_t u[4];
        std::memcpy(u, blk.scales, 12);
        constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
        u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
        const uint32_t aux = u[1] & kmask1;
        u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
        u[2] = aux;
        u[0] &= kmask1;
        const __m128i sm = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, static_cast<int>(u[1]), static_cast<int>(u[0])));
        for (int c = 0; c < 4; ++c) sc[c] = _mm512_permutexvar_epi16(sidx[c], _mm512_castsi128_si512(sm));
        const __m128i mins = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, static_cast<int>(u[3]), static_cast<int>(u[2])));
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(blk.d));
        const __m128 dmin = _mm_set1_ps(_cvtsh_ss(blk.dmin));
#pragma GCC unroll 8
        for (int m = 0; m < NM; ++m) {
          const int8_t* xq = x[m][b].qs;
          __m512i sumi = _mm512_setzero_si512();
          for (int c = 0; c < 4; ++c)
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q[c], _mm512_loadu_si512(xq + 64 * c)), sc[c]);
          acc[m][r] = _mm512_fmadd_ps(_mm512_mul_ps(d, xd[m]), _mm512_cvtepi32_ps(sumi), acc[m][r]);
          accm[m][r] = _mm_fmadd_ps(_mm_mul_ps(dmin, _mm512_castps512_ps128(xd[m])),
                                    _mm_cvtepi32_ps(_mm_madd_epi16(mins, bsum[m])), accm[m][r]);
        }
      }
    }
    // fold the min terms into lanes 0..3 (subtracted), then the usual reduction
    for (int m = 0; m < NM; ++m)
      for (int r = 0; r < NR; ++r)
        acc[m][r] = _mm512_sub_ps(acc[m][r], _mm512_zextps128_ps512(accm[m][r]));
    store_rows<NM, NR>(a, m0, r0, acc);
  }
};

// Q6_K weights x Q8_K activations: codes 0..63 times x with 16-element scales,
// minus 32 * sum_s sc_s * bsum_s. One zmm covers 64 elements (4 scales).
struct KernelQ6_K {
  template <int NM, int NR>
  static void tile(const MatmulArgs& a, int64_t m0, int64_t r0) {
    const int64_t nb = a.w->cols / kQK_K;
    const int64_t ahead = kAheadTiles * NR * a.w->row_stride_bytes;
    const BlockQ6_K* w[NR];
    const BlockQ8_K* x[NM];
    for (int r = 0; r < NR; ++r) w[r] = reinterpret_cast<const BlockQ6_K*>(weight_row(a, r0 + r));
    for (int m = 0; m < NM; ++m) x[m] = reinterpret_cast<const BlockQ8_K*>(act_row(a, m0 + m));
    __m512 acc[NM][NR];
    zero(acc);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    __m512i sidx[4];  // words: 8 each of scales 4j .. 4j + 3
    for (int j = 0; j < 4; ++j)
      sidx[j] = _mm512_setr_epi64(0x0001000100010001LL * (4 * j), 0x0001000100010001LL * (4 * j),
                                  0x0001000100010001LL * (4 * j + 1), 0x0001000100010001LL * (4 * j + 1),
                                  0x0001000100010001LL * (4 * j + 2), 0x0001000100010001LL * (4 * j + 2),
                                  0x0001000100010001LL * (4 * j + 3), 0x0001000100010001LL * (4 * j + 3));
    for (int64_t b = 0; b < nb; ++b) {
      __m512 xd[NM];
      for (int m = 0; m < NM; ++m) xd[m] = _mm512_set1_ps(x[m][b].d);
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        const BlockQ6_K& blk = w[r][b];
        prefetch<sizeof(BlockQ6_K)>(&blk, ahead);
        __m512i q[4], sc[4];  // q[j]: elements 64j .. 64j + 63
        for (int n = 0; n < 2; ++n) {
          const __m512i ql = _mm512_loadu_si512(blk.ql + 64 * n);
          const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh + 32 * n));
          const __m512i qh2 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
          // (ql & 0x0F) | ((qh << 4) & 0x30): ternary logic A & C | B
          q[2 * n] = _mm512_ternarylogic_epi32(ql, _mm512_and_si512(_mm512_slli_epi16(qh2, 4), m30), m4, 0xEC);
          q[2 * n + 1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), _mm512_and_si512(qh2, m30), m4, 0xEC);
        }
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.scales)));
        for (int j = 0; j < 4; ++j) sc[j] = _mm512_permutexvar_epi16(sidx[j], _mm512_castsi256_si512(sc16));
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(blk.d));
#pragma GCC unroll 8
        for (int m = 0; m < NM; ++m) {
          const BlockQ8_K& xb = x[m][b];
          const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.bsums));
          // -32 * sum sc * bsum
          __m512i sumi = _mm512_zextsi256_si512(
              _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5)));
          for (int j = 0; j < 4; ++j)
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q[j], _mm512_loadu_si512(xb.qs + 64 * j)), sc[j]);
          acc[m][r] = _mm512_fmadd_ps(_mm512_mul_ps(d, xd[m]), _mm512_cvtepi32_ps(sumi), acc[m][r]);
        }
      }
    }
    store_rows<NM, NR>(a, m0, r0, acc);
  }
};

// Weight loaders: 16 elements as f32; `mask` selects the valid ones of a
// partial last chunk (the rest read as zero). Full chunks use plain loads:
// masked loads cannot fold into the FMA and halve the tile's speed on Zen 4.
__attribute__((always_inline)) inline __m256i load_u16(const char* w, int64_t k, __mmask16 mask) {
  const uint16_t* p = reinterpret_cast<const uint16_t*>(w) + k;
  return mask == 0xFFFF ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi16(mask, p);
}

struct LoadF32 {
  static constexpr int kBytes = 4;
  __attribute__((always_inline)) static inline __m512 load(const char* w, int64_t k, __mmask16 mask) {
    const float* p = reinterpret_cast<const float*>(w) + k;
    return mask == 0xFFFF ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(mask, p);
  }
};
struct LoadF16 {
  static constexpr int kBytes = 2;
  __attribute__((always_inline)) static inline __m512 load(const char* w, int64_t k, __mmask16 mask) {
    return _mm512_cvtph_ps(load_u16(w, k, mask));
  }
};
struct LoadBF16 {
  static constexpr int kBytes = 2;
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
                   int64_t ahead, __m512 (&acc)[NM][NR]) {
    __m512 wv[NR];
    for (int r = 0; r < NR; ++r) {
      prefetch<16 * Load::kBytes>(w[r] + k * Load::kBytes, ahead);
      wv[r] = Load::load(w[r], k, mask);
    }
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
    const int64_t ahead = kAheadTiles * NR * a.w->row_stride_bytes;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) step<NM, NR>(w, x, k, 0xFFFF, ahead, acc);
    if (k < K) step<NM, NR>(w, x, k, static_cast<__mmask16>((1u << (K - k)) - 1), ahead, acc);
    for (int m = 0; m < NM; ++m)
      for (int r = 0; r < NR; ++r) a.y[(m0 + m) * a.w->rows + r0 + r] = _mm512_reduce_add_ps(acc[m][r]);
  }
};


// Float weights packed as WeightLayout::f32x16 / f16x16
// (matmul_float_packed_x86.inc over 16 lanes). The row-dot tile above
// streams each activation row from L2 once per 4 weight rows and ran at
// ~45 % of the FMA peak, bound by L2.
struct FloatV {
  using reg = __m512;
  static constexpr int64_t kRows = kPackRows;
  AI static reg zero() { return _mm512_setzero_ps(); }
  AI static reg bcast(const float* p) { return _mm512_set1_ps(*p); }
  AI static reg fmadd(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
};
struct PackedF32 {
  static constexpr int kBytes = 4;
  AI static __m512 load(const char* p) { return _mm512_load_ps(p); }
};
struct PackedF16 {
  static constexpr int kBytes = 2;
  AI static __m512 load(const char* p) { return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p))); }
};
namespace packed_float {
using V = FloatV;
#define ATELIER_FLOAT_COLUMN_LOOP 0
#include "matmul_float_packed_x86.inc"
#undef ATELIER_FLOAT_COLUMN_LOOP
}  // namespace packed_float
using packed_float::KernelFloatPacked;

#undef AI

}  // namespace avx512

#ifndef ATELIER_TALL_M
#define ATELIER_TALL_M 8
#define ATELIER_TALL_N 2
#endif
constexpr int kTallM = ATELIER_TALL_M, kTallN = ATELIER_TALL_N;

// Q8_0 batched decode: 16 activation rows per tile. The tile walks the
// groups of 256 columns in order, so a group's expanded activations (16 rows
// x 576 bytes) stay in L1 across the tile's weight rows. Up to 1024 columns
// all 16 rows fit in L1 anyway and one weight row per tile is fastest; wider
// rows (the FFN's down projection) take 4 weight rows per tile so the
// activations are not re-read from L2 for every weight row (-25 % time at
// 2048 columns). Same per-(m, r) arithmetic either way.
void q8_0_rows_avx512(const MatmulArgs& a, int64_t r0, int64_t r1) {
  using namespace avx512;
  using Narrow = TileDriver<KernelQ8_0, 4, 4, 8, 4, 4>;
  if (a.w->cols > 1024) TallTileDriver<KernelQ8_0, 16, 4, Narrow>::run(a, r0, r1);
  else TallTileDriver<KernelQ8_0, 16, 1, Narrow>::run(a, r0, r1);
}

// Packed Q8_0: tiles of activation rows x groups of 16 weight rows; per
// (m, group) an integer and a float accumulator. Generation (1-3 rows) takes
// 4 groups: more independent dpbusd chains for the memory-bound case.
void q8_0x16_rows_avx512(const MatmulArgs& a, int64_t r0, int64_t r1) {
  using namespace avx512;
  using Driver = TileDriver<KernelQ8_0x16, kPackM, kPackG, 4, 4, 4>;
  Driver::run(a, r0 / kPackRows, (r1 + kPackRows - 1) / kPackRows);
}

// Packed Q4_0: 4 activation rows x 2 groups of 16 weight rows; generation
// (1-3 rows) 4, 4, 2 groups.
void q4_0x16_rows_avx512(const MatmulArgs& a, int64_t r0, int64_t r1) {
  using namespace avx512;
  using Driver = TileDriver<KernelQ4_0x16, 4, 2, 4, 4, 2>;
  Driver::run(a, r0 / kPackRows, (r1 + kPackRows - 1) / kPackRows);
}

// Packed Q4_K: 4 activation rows x 1 group of 16 weight rows (each decoded
// register serves 4 rows; 8 % faster than 2 x 2 on one core); generation
// (1-3 rows) 4, 2, 1 groups.
void q4_Kx16_rows_avx512(const MatmulArgs& a, int64_t r0, int64_t r1) {
  using namespace avx512;
  using Driver = TileDriver<KernelQ4_Kx16, 4, 1, 4, 2, 1>;
  Driver::run(a, r0 / kPackRows, (r1 + kPackRows - 1) / kPackRows);
}

// Packed Q6_K: 4 activation rows x 1 group of 16 weight rows (each rebuilt
// register serves 4 rows); generation (1-3 rows) 2, 1, 1 groups.
void q6_Kx16_rows_avx512(const MatmulArgs& a, int64_t r0, int64_t r1) {
  using namespace avx512;
  using Driver = TileDriver<KernelQ6_Kx16, 4, 1, 2, 1, 1>;
  Driver::run(a, r0 / kPackRows, (r1 + kPackRows - 1) / kPackRows);
}

// Packed float weights: tiles of 8 activation rows x 3 groups of 16 weight
// rows (6 x 4 and 12 x 2 measured slower or the same); 1-4 rows take 6
// groups, more independent FMA chains for the memory-bound case.
template <class Load>
void float_x16_rows_avx512(const MatmulArgs& a, int64_t r0, int64_t r1) {
  using namespace avx512;
  const int64_t g0 = r0 / kPackRows, g1 = (r1 + kPackRows - 1) / kPackRows;
  if (float_prefetch() == FloatPrefetch::near)
    TileDriver<KernelFloatPacked<Load, FloatPrefetch::near>, 8, 3, 6, 6, 6, 6, 3, 3, 3>::run(a, g0, g1);
  else
    TileDriver<KernelFloatPacked<Load, FloatPrefetch::next_tile>, 8, 3, 6, 6, 6, 6, 3, 3, 3>::run(a, g0, g1);
}
void f32x16_rows_avx512(const MatmulArgs& a, int64_t r0, int64_t r1) { float_x16_rows_avx512<avx512::PackedF32>(a, r0, r1); }
void f16x16_rows_avx512(const MatmulArgs& a, int64_t r0, int64_t r1) { float_x16_rows_avx512<avx512::PackedF16>(a, r0, r1); }

// Tile shapes: activation rows x weight rows, sized to the 32 zmm registers.
RowsFn rows_fn_avx512(DType t) {
  using namespace avx512;
  switch (t) {
    case DType::F32: return &TileDriver<KernelFloat<LoadF32>, 6, 4, 8, 8, 6, 4, 4>::run;
    case DType::F16: return &TileDriver<KernelFloat<LoadF16>, 6, 4, 8, 8, 6, 4, 4>::run;
    case DType::BF16: return &TileDriver<KernelFloat<LoadBF16>, 6, 4, 8, 8, 6, 4, 4>::run;
    case DType::Q8_0: return &q8_0_rows_avx512;
    case DType::Q4_0: return &TallTileDriver<KernelQ4_0, kTallM, kTallN, TileDriver<KernelQ4_0, 4, 4, 8, 4, 4>>::run;
    case DType::Q4_K: return &TileDriver<KernelQ4_K, 4, 2, 8, 4, 4>::run;
    case DType::Q6_K: return &TileDriver<KernelQ6_K, 4, 2, 8, 4, 4>::run;
    default: return nullptr;
  }
}

}  // namespace atelier::kernels::cpu
