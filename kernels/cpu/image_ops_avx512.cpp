// AVX-512 conv2d and attention of the image ops (the avx512 level; avx2 and
// scalar keep the im2col + matmul paths in image_ops.cpp).
//
// conv2d: a GEMM over y[co][p] = sum_k W[co][k] * patch[k][p] (k = ci, ky, kx)
// vectorized over output pixels, so NCHW comes out directly:
//   - per work unit (image, block of kNC = 256 output pixels, range of output
//     channels), K is cut into chunks of kKC = 256 taps; the chunk's patches
//     are packed once ([k][256] floats, 256 KiB: L2) and reused by every
//     output channel of the unit;
//   - the chunk's weights are widened (F16/BF16 -> f32) 6 output channels at a
//     time into a 6 x 256 panel (6 KiB: L1) reused over the 4 pixel tiles,
//     with the rows of the tile after next prefetched into L2;
//   - the register tile is 6 channels x 64 pixels (24 zmm accumulators): per
//     tap 4 pixel-vector loads and 6 weight broadcasts feed 24 FMAs; units of
//     at most 16 pixels (4x4 images) use 24 channels x 16 pixels instead and
//     walk all of K per channel tile (their patches fit L2 whole);
//   - partial sums go to y between chunks (the first chunk starts from the
//     bias), so every pixel's value is the same sequence of f32 FMAs over k in
//     order whatever the tiling, the batch or the thread split: a lane's
//     arithmetic never sees another pixel.
// attention: per (batch, head) K is packed in strips of 48 keys ([d][48]) and
// V padded to 16-lane rows once; 32-query blocks walk 192-key blocks (their K
// and V stay in L2 across the block's four 8-query register tiles): scores of
// 8 queries x 48 keys in 24 accumulators, an online softmax per 192 keys
// (exp on 16 lanes at a time), then P V with 8 queries x up to 48 output
// dimensions in registers. Each query row's arithmetic depends only on its
// own row, so results do not depend on the tiling or threads.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "image_ops_internal.h"

namespace atelier::kernels::cpu::avx512 {

namespace {

// Lanes [0, n) for n clamped to [0, 16].
__mmask16 tail_mask(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1); }

// n floats of a weight row (F32, F16 or BF16) into f32.
void widen(DType t, const void* src, float* dst, int64_t n) {
  int64_t i = 0;
  if (t == DType::F32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  } else if (t == DType::F16) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
    if (i < n) {
      const __mmask16 m = tail_mask(n - i);
      _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s + i)));
    }
  } else {  // BF16: the upper half of an f32
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (; i + 16 <= n; i += 16) {
      const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
      _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
    if (i < n) {
      const __mmask16 m = tail_mask(n - i);
      const __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, s + i));
      _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
  }
}

// ---- conv2d ---------------------------------------------------------------------

constexpr int kMR = 6;              // output channels per register tile
constexpr int kNR = 64;             // output pixels per register tile (4 vectors)
constexpr int64_t kNC = 4 * kNR;    // output pixels per work unit
constexpr int64_t kKC = 256;        // taps per K chunk

// c[r][0..npx) (+)= sum_k a[r][k] * b[k][0..npx) for r < rows; a: [kMR][kc]
// (rows >= `rows` are zero), b: rows of ldb floats (lanes >= npx are zero).
// first: start from bias[r] (or 0) instead of c.
template <int MR, int NV>
void conv_tile(const float* a, int64_t kc, const float* b, int64_t ldb, float* c, int64_t ldc, int rows, int64_t npx,
               bool first, const float* bias) {
  __m512 acc[MR][NV];
  __mmask16 m[NV];
  for (int v = 0; v < NV; ++v) m[v] = tail_mask(npx - 16 * v);
#pragma GCC unroll 24
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      if (first)
        acc[r][v] = _mm512_set1_ps(bias && r < rows ? bias[r] : 0.0f);
      else
        acc[r][v] = r < rows ? _mm512_maskz_loadu_ps(m[v], c + r * ldc + 16 * v) : _mm512_setzero_ps();
    }
  for (int64_t k = 0; k < kc; ++k) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_ps(b + k * ldb + 16 * v);
#pragma GCC unroll 24
    for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * kc + k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 24
  for (int r = 0; r < MR; ++r)
    if (r < rows)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(c + r * ldc + 16 * v, m[v], acc[r][v]);
}

// Packs taps [k0, k0 + kc) of output pixels [p0, p0 + np) of one image into
// dst[k][ldb] (pixels np.. up to the next multiple of 16 zero).
void pack_patches(const Conv2dShape& s, const float* xb, int64_t p0, int64_t np, int64_t k0, int64_t kc, float* dst,
                  int64_t ldb) {
  const int64_t ow = s.out_w(), khw = s.kh * s.kw;
  for (int64_t k = k0; k < k0 + kc; ++k) {
    const int64_t ci = k / khw, ky = (k % khw) / s.kw, kx = k % s.kw;
    float* row = dst + (k - k0) * ldb;
    int64_t q = 0, p = p0;
    while (q < np) {
      const int64_t oy = p / ow, ox = p % ow, run = std::min(ow - ox, np - q);
      const int64_t iy = oy * s.stride_h - s.pad_h + ky;
      float* d = row + q;
      if (iy < 0 || iy >= s.h) {
        std::fill(d, d + run, 0.0f);
      } else {
        const float* src = xb + (ci * s.h + iy) * s.w;
        const int64_t ix0 = ox * s.stride_w - s.pad_w + kx;
        if (s.stride_w == 1) {
          // 16 at a time: masked loads keep the lanes inside the row (the
          // others read as the zero padding; masked-off lanes never fault).
          const int64_t lo = std::clamp<int64_t>(-ix0, 0, run), hi = std::clamp<int64_t>(s.w - ix0, lo, run);
          for (int64_t t = 0; t < run; t += 16) {
            const __mmask16 valid = __mmask16(tail_mask(hi - t) & ~tail_mask(lo - t));
            _mm512_mask_storeu_ps(d + t, tail_mask(run - t), _mm512_maskz_loadu_ps(valid, src + ix0 + t));
          }
        } else {
          for (int64_t t = 0; t < run; ++t) {
            const int64_t ix = ix0 + t * s.stride_w;
            d[t] = ix >= 0 && ix < s.w ? src[ix] : 0.0f;
          }
        }
      }
      q += run;
      p += run;
    }
    std::fill(row + np, row + (np + 15) / 16 * 16, 0.0f);  // the tiles read whole vectors
  }
}

// ---- attention --------------------------------------------------------------------

constexpr int kQR = 8;            // queries per register tile
constexpr int64_t kQB = 32;       // queries per work unit (4 register tiles)
constexpr int64_t kKS = 48;       // keys per score strip (3 vectors)
constexpr int64_t kKB = 4 * kKS;  // keys per softmax block

// expf: n = round(x log2 e), r = x - n ln 2 (two-part ln 2), degree-6
// polynomial (Cephes), times 2^n by vscalefps (underflows to 0 smoothly).
inline __m512 exp512(__m512 x) {
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

// s[r][0..48) = sum_d q[r][d] * ks[d][0..48) for the 8 rows of q ([8][D]).
void qk_tile(const float* q, int64_t D, const float* ks, float* s, int64_t lds) {
  __m512 acc[kQR][3];
#pragma GCC unroll 8
  for (int r = 0; r < kQR; ++r)
    for (int v = 0; v < 3; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    const __m512 k0 = _mm512_loadu_ps(ks + d * kKS), k1 = _mm512_loadu_ps(ks + d * kKS + 16),
                 k2 = _mm512_loadu_ps(ks + d * kKS + 32);
#pragma GCC unroll 8
    for (int r = 0; r < kQR; ++r) {
      const __m512 qv = _mm512_set1_ps(q[r * D + d]);
      acc[r][0] = _mm512_fmadd_ps(qv, k0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(qv, k1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(qv, k2, acc[r][2]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kQR; ++r)
    for (int v = 0; v < 3; ++v) _mm512_storeu_ps(s + r * lds + 16 * v, acc[r][v]);
}

// o[r][0..16 NV) += sum_{j < nk} p[r][j] * vp[j][0..16 NV) for 8 rows.
template <int NV>
void pv_tile(const float* p, int64_t ldp, int64_t nk, const float* vp, int64_t ldv, float* o, int64_t ldo) {
  __m512 acc[kQR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < kQR; ++r)
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_loadu_ps(o + r * ldo + 16 * v);
  for (int64_t j = 0; j < nk; ++j) {
    __m512 vv[NV];
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) vv[v] = _mm512_loadu_ps(vp + j * ldv + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < kQR; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r * ldp + j]);
#pragma GCC unroll 3
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(pr, vv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kQR; ++r)
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(o + r * ldo + 16 * v, acc[r][v]);
}

}  // namespace

void conv2d(const Conv2dShape& s, const float* x, DType w_type, const void* weight, const float* bias, float* y,
            Executor* ex) {
  const int64_t K = s.c_in * s.kh * s.kw, P = s.out_h() * s.out_w();
  const int64_t blocks = (P + kNC - 1) / kNC, co_tiles = (s.c_out + kMR - 1) / kMR;
  const int64_t elem = w_type == DType::F32 ? 4 : 2;
  // Enough units for the threads: small images (the UNet's 8x8..16x16
  // levels) split the output channels too. Only the work split depends on
  // the thread count, never a value.
  const int64_t threads = ex ? std::max(1, ex->threads()) : 1;
  // Each group packs the patches again, so no more groups than needed.
  const int64_t groups = std::clamp<int64_t>((2 * threads + s.n * blocks - 1) / (s.n * blocks), 1, co_tiles);
  run_parallel(ex, s.n * blocks * groups, [&](int64_t u0, int64_t u1) {
    thread_local std::vector<float> bpack, apack;
    apack.resize(static_cast<size_t>(4 * kMR * kKC));
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t g = u % groups, blk = (u / groups) % blocks, b = u / (groups * blocks);
      const int64_t t0 = g * co_tiles / groups, t1 = (g + 1) * co_tiles / groups;
      const int64_t p0 = blk * kNC, np = std::min(kNC, P - p0);
      const float* xb = x + b * s.c_in * s.h * s.w;
      // A unit of at most 16 pixels (the UNet's 4x4 level) has one vector per
      // row: 24 output channels at a time keep 24 FMA chains going, and its
      // patches for the whole of K fit in L2 (16 floats a tap), so each tile
      // of channels runs all its chunks in turn and reads its weight rows
      // front to back (streams the hardware prefetcher follows).
      const bool narrow = np <= 16 && K * 16 * sizeof(float) <= (size_t{768} << 10);
      const int64_t tm = narrow ? 4 : 1, mr = tm * kMR, ldb = narrow ? 16 : kNC;
      bpack.resize(static_cast<size_t>(narrow ? K * ldb : kKC * kNC));
      if (narrow) pack_patches(s, xb, p0, np, 0, K, bpack.data(), ldb);
      auto tiles = [&](int64_t t, int64_t k0, int64_t kc, const float* bchunk) {
        const int64_t co0 = t * kMR;
        const int rows = static_cast<int>(std::min({mr, s.c_out - co0, (t1 - t) * kMR}));  // within the group
        // The weights of the tile after next into L2: each row piece is only
        // kc * 2..4 bytes, too short for the hardware prefetcher, and on
        // small images (the UNet's 8x8 level) every weight is used by one
        // tile only, straight from DRAM.
        // (Narrow units walk K per tile: there the same rows' chunk after next.)
        {
          const int64_t r0 = narrow ? co0 : co0 + 2 * mr, r1 = std::min(s.c_out, r0 + mr);
          const int64_t pk = narrow ? k0 + 2 * kKC : k0, pn = std::min(kc, K - pk);
          for (int64_t r = r0; r < r1; ++r) {
            const char* row = static_cast<const char*>(weight) + (r * K + pk) * elem;
            for (int64_t off = 0; off < pn * elem; off += 64) _mm_prefetch(row + off, _MM_HINT_T1);
          }
        }
        for (int r = 0; r < mr; ++r) {
          float* dst = apack.data() + r * kc;
          if (r < rows)
            widen(w_type, static_cast<const uint8_t*>(weight) + ((co0 + r) * K + k0) * elem, dst, kc);
          else
            std::fill(dst, dst + kc, 0.0f);
        }
        const float* bi = bias ? bias + co0 : nullptr;
        float* yc = y + (b * s.c_out + co0) * P + p0;
        const bool first = k0 == 0;
        if (narrow) return conv_tile<4 * kMR, 1>(apack.data(), kc, bchunk, ldb, yc, P, rows, np, first, bi);
        for (int64_t q = 0; q < np; q += kNR) {
          const int64_t npx = std::min<int64_t>(kNR, np - q);
          const float* bp = bchunk + q;
          if (npx > 48)
            conv_tile<kMR, 4>(apack.data(), kc, bp, ldb, yc + q, P, rows, npx, first, bi);
          else if (npx > 32)
            conv_tile<kMR, 3>(apack.data(), kc, bp, ldb, yc + q, P, rows, npx, first, bi);
          else if (npx > 16)
            conv_tile<kMR, 2>(apack.data(), kc, bp, ldb, yc + q, P, rows, npx, first, bi);
          else
            conv_tile<kMR, 1>(apack.data(), kc, bp, ldb, yc + q, P, rows, npx, first, bi);
        }
      };
      if (narrow) {
        for (int64_t t = t0; t < t1; t += tm)
          for (int64_t k0 = 0; k0 < K; k0 += kKC) tiles(t, k0, std::min(kKC, K - k0), bpack.data() + k0 * ldb);
      } else {
        for (int64_t k0 = 0; k0 < K; k0 += kKC) {
          const int64_t kc = std::min(kKC, K - k0);
          pack_patches(s, xb, p0, np, k0, kc, bpack.data(), ldb);
          for (int64_t t = t0; t < t1; t += tm) tiles(t, k0, kc, bpack.data());
        }
      }
    }
  });
}

void attention(const AttentionShape& s, const float* q, const float* k, const float* v, float* out, Executor* ex) {
  const int64_t D = s.head_dim, stride = s.heads * D, bh = s.batch * s.heads;
  const int64_t Dp = (D + 15) / 16 * 16, strips = (s.lk + kKS - 1) / kKS, lkp = strips * kKS;
  const float scale = s.scale > 0 ? s.scale : 1.0f / std::sqrt(static_cast<float>(D));
  // K in strips of 48 keys ([strip][d][48], keys past lk zero); V rows padded
  // to Dp lanes with zeros.
  std::vector<float> kp(static_cast<size_t>(bh * lkp * D)), vp(static_cast<size_t>(bh * s.lk * Dp));
  run_parallel(ex, bh, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / s.heads, h = u % s.heads;
      float* kd = kp.data() + u * lkp * D;
      for (int64_t st = 0; st < strips; ++st)
        for (int64_t jj = 0; jj < kKS; ++jj) {
          const int64_t j = st * kKS + jj;
          float* dst = kd + st * D * kKS + jj;
          if (j < s.lk) {
            const float* src = k + (b * s.lk + j) * stride + h * D;
            for (int64_t d = 0; d < D; ++d) dst[d * kKS] = src[d];
          } else {
            for (int64_t d = 0; d < D; ++d) dst[d * kKS] = 0.0f;
          }
        }
      float* vd = vp.data() + u * s.lk * Dp;
      for (int64_t j = 0; j < s.lk; ++j) {
        std::memcpy(vd + j * Dp, v + (b * s.lk + j) * stride + h * D, static_cast<size_t>(D) * sizeof(float));
        std::fill(vd + j * Dp + D, vd + (j + 1) * Dp, 0.0f);
      }
    }
  });

  const int64_t q_blocks = (s.lq + kQB - 1) / kQB;
  run_parallel(ex, bh * q_blocks, [&](int64_t u0, int64_t u1) {
    thread_local std::vector<float> qt, sc, o, mx, den;
    qt.resize(static_cast<size_t>(kQB * D));
    sc.resize(static_cast<size_t>(kQR * kKB));
    o.resize(static_cast<size_t>(kQB * Dp));
    mx.resize(kQB);
    den.resize(kQB);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t head = u / q_blocks, i0 = (u % q_blocks) * kQB, nq = std::min(kQB, s.lq - i0);
      const int64_t b = head / s.heads, h = head % s.heads, tiles = (nq + kQR - 1) / kQR;
      for (int64_t i = 0; i < tiles * kQR; ++i) {
        float* dst = qt.data() + i * D;
        if (i < nq) {
          const float* src = q + (b * s.lq + i0 + i) * stride + h * D;
          for (int64_t d = 0; d < D; ++d) dst[d] = src[d] * scale;
        } else {
          std::fill(dst, dst + D, 0.0f);
        }
      }
      std::fill(o.begin(), o.end(), 0.0f);
      std::fill(mx.begin(), mx.end(), -INFINITY);
      std::fill(den.begin(), den.end(), 0.0f);
      const float* kh = kp.data() + head * lkp * D;
      const float* vh = vp.data() + head * s.lk * Dp;
      for (int64_t j0 = 0; j0 < s.lk; j0 += kKB) {
        const int64_t nk = std::min(kKB, s.lk - j0), ns = (nk + kKS - 1) / kKS, nvec = (nk + 15) / 16;
        for (int64_t t = 0; t < tiles; ++t) {
          const float* qtile = qt.data() + t * kQR * D;
          for (int64_t st = 0; st < ns; ++st)
            qk_tile(qtile, D, kh + (j0 / kKS + st) * D * kKS, sc.data() + st * kKS, kKB);
          float* ot = o.data() + t * kQR * Dp;
          for (int r = 0; r < kQR; ++r) {
            float* row = sc.data() + r * kKB;
            __m512 vmax = _mm512_set1_ps(-INFINITY);
            for (int64_t c = 0; c < nvec; ++c)
              vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail_mask(nk - 16 * c), row + 16 * c));
            const int64_t qi = t * kQR + r;
            const float m_old = mx[qi], m_new = std::max(m_old, _mm512_reduce_max_ps(vmax));
            const __m512 vm = _mm512_set1_ps(m_new);
            __m512 vsum = _mm512_setzero_ps();
            for (int64_t c = 0; c < nvec; ++c) {
              const __mmask16 msk = tail_mask(nk - 16 * c);
              const __m512 e = _mm512_maskz_mov_ps(msk, exp512(_mm512_sub_ps(_mm512_loadu_ps(row + 16 * c), vm)));
              _mm512_storeu_ps(row + 16 * c, e);
              vsum = _mm512_add_ps(vsum, e);
            }
            const float corr = std::exp(m_old - m_new);  // 0 on the first block (m_old = -inf)
            den[qi] = den[qi] * corr + _mm512_reduce_add_ps(vsum);
            mx[qi] = m_new;
            if (corr != 1.0f) {
              const __m512 vc = _mm512_set1_ps(corr);
              for (int64_t c = 0; c < Dp; c += 16)
                _mm512_storeu_ps(ot + r * Dp + c, _mm512_mul_ps(vc, _mm512_loadu_ps(ot + r * Dp + c)));
            }
          }
          const float* vb = vh + j0 * Dp;
          for (int64_t c = 0; c < Dp; c += 48) {
            const int64_t nv = std::min<int64_t>(3, (Dp - c) / 16);
            if (nv == 3)
              pv_tile<3>(sc.data(), kKB, nk, vb + c, Dp, ot + c, Dp);
            else if (nv == 2)
              pv_tile<2>(sc.data(), kKB, nk, vb + c, Dp, ot + c, Dp);
            else
              pv_tile<1>(sc.data(), kKB, nk, vb + c, Dp, ot + c, Dp);
          }
        }
      }
      for (int64_t i = 0; i < nq; ++i) {
        float* dst = out + (b * s.lq + i0 + i) * stride + h * D;
        const float inv = 1.0f / den[i];
        for (int64_t d = 0; d < D; ++d) dst[d] = o[i * Dp + d] * inv;
      }
    }
  });
}

}  // namespace atelier::kernels::cpu::avx512
