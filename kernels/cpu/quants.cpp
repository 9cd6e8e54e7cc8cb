// Scalar encoders and decoders of every tensor type: the definition of each
// format, bit-exact with GGML's ggml-quants.c reference code.
#include "quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace atelier::kernels {

using namespace cpu;

namespace {

float h2f(uint16_t h) { return fp16_to_f32(h); }
uint16_t f2h(float f) { return f32_to_fp16(f); }

// ---- decoders -------------------------------------------------------------

void dequant_q4_0(const BlockQ4_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[i * kQK + j] = ((x[i].qs[j] & 0x0F) - 8) * d;
      y[i * kQK + j + kQK / 2] = ((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequant_q4_1(const BlockQ4_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d), m = h2f(x[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[i * kQK + j] = (x[i].qs[j] & 0x0F) * d + m;
      y[i * kQK + j + kQK / 2] = (x[i].qs[j] >> 4) * d + m;
    }
  }
}

void dequant_q5_0(const BlockQ5_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d);
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, 4);
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t xh0 = ((qh >> (j + 0)) << 4) & 0x10;
      const uint8_t xh1 = ((qh >> (j + 12))) & 0x10;
      y[i * kQK + j] = (((x[i].qs[j] & 0x0F) | xh0) - 16) * d;
      y[i * kQK + j + kQK / 2] = (((x[i].qs[j] >> 4) | xh1) - 16) * d;
    }
  }
}

void dequant_q5_1(const BlockQ5_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d), m = h2f(x[i].m);
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, 4);
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t xh0 = ((qh >> (j + 0)) << 4) & 0x10;
      const uint8_t xh1 = ((qh >> (j + 12))) & 0x10;
      y[i * kQK + j] = ((x[i].qs[j] & 0x0F) | xh0) * d + m;
      y[i * kQK + j + kQK / 2] = ((x[i].qs[j] >> 4) | xh1) * d + m;
    }
  }
}

void dequant_q8_0(const BlockQ8_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d);
    for (int j = 0; j < kQK; ++j) y[i * kQK + j] = x[i].qs[j] * d;
  }
}

void dequant_q8_1(const BlockQ8_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d);
    for (int j = 0; j < kQK; ++j) y[i * kQK + j] = x[i].qs[j] * d;
  }
}

void dequant_q2_K(const BlockQ2_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d), min = h2f(x[i].dmin);
    const uint8_t* q = x[i].qs;
    int is = 0;
    for (int n = 0; n < kQK_K; n += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        uint8_t sc = x[i].scales[is++];
        float dl = d * (sc & 0xF), ml = min * (sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * ((int8_t)((q[l] >> shift) & 3)) - ml;
        sc = x[i].scales[is++];
        dl = d * (sc & 0xF), ml = min * (sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * ((int8_t)((q[l + 16] >> shift) & 3)) - ml;
        shift += 2;
      }
      q += 32;
    }
  }
}

// Q3_K packs sixteen 6-bit scales into 12 bytes: low nibbles in bytes 0..7,
// the high 2 bits in bytes 8..11.
void unpack_q3_K_scales(const uint8_t* packed, int8_t* scales) {
  constexpr uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  uint32_t aux[4];
  std::memcpy(aux, packed, 12);
  const uint32_t tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  std::memcpy(scales, aux, 16);
}

void dequant_q3_K(const BlockQ3_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d_all = h2f(x[i].d);
    const uint8_t* q = x[i].qs;
    const uint8_t* hm = x[i].hmask;
    int8_t scales[16];
    unpack_q3_K_scales(x[i].scales, scales);
    uint8_t m = 1;
    int is = 0;
    for (int n = 0; n < kQK_K; n += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        float dl = d_all * (scales[is++] - 32);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * ((int8_t)((q[l + 0] >> shift) & 3) - ((hm[l + 0] & m) ? 0 : 4));
        dl = d_all * (scales[is++] - 32);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * ((int8_t)((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
        shift += 2;
        m <<= 1;
      }
      q += 32;
    }
  }
}

void dequant_q4_K(const BlockQ4_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* q = x[i].qs;
    const float d = h2f(x[i].d), min = h2f(x[i].dmin);
    int is = 0;
    uint8_t sc, m;
    for (int j = 0; j < kQK_K; j += 64) {
      get_scale_min_k4(is + 0, x[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = min * m;
      get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
      q += 32;
      is += 2;
    }
  }
}

void dequant_q5_K(const BlockQ5_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* ql = x[i].qs;
    const uint8_t* qh = x[i].qh;
    const float d = h2f(x[i].d), min = h2f(x[i].dmin);
    int is = 0;
    uint8_t sc, m;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < kQK_K; j += 64) {
      get_scale_min_k4(is + 0, x[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = min * m;
      get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      ql += 32;
      is += 2;
      u1 <<= 2;
      u2 <<= 2;
    }
  }
}

void dequant_q6_K(const BlockQ6_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(x[i].d);
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* sc = x[i].scales;
    for (int n = 0; n < kQK_K; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int8_t q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int8_t q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

void dequant_q8_K(const BlockQ8_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i)
    for (int j = 0; j < kQK_K; ++j) *y++ = x[i].d * x[i].qs[j];
}

void dequant_mxfp4(const BlockMXFP4* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = e8m0_half(x[i].e);
    for (int j = 0; j < kQK / 2; ++j) {
      y[i * kQK + j] = kMxfp4Values[x[i].qs[j] & 0x0F] * d;
      y[i * kQK + j + kQK / 2] = kMxfp4Values[x[i].qs[j] >> 4] * d;
    }
  }
}

// ---- encoders -------------------------------------------------------------

// GGML's quantize_row_mxfp4_ref: the scale is 2^(floor(log2 amax) - 2), so
// the block's largest magnitude lands in [4, 8) scale units (E2M1's top
// codes 4 and 6, or clipped to 6), then each value takes the nearest code
// (the first of equals). Where GGML casts
// a negative exponent (amax < 2^-125) to uint8_t (undefined), the scale byte
// is clamped to 0 here.
void quant_mxfp4(const float* x, BlockMXFP4* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float ef = amax > 0.0f ? std::floor(std::log2(amax)) - 2 + 127 : 0.0f;
    const uint8_t e = static_cast<uint8_t>(std::clamp(ef, 0.0f, 255.0f));
    const float d = e8m0_half(e);
    y[i].e = e;
    auto best = [d](float v) {
      int b = 0;
      float err = std::fabs(kMxfp4Values[0] * d - v);
      for (int k = 1; k < 16; ++k) {
        const float e2 = std::fabs(kMxfp4Values[k] * d - v);
        if (e2 < err) b = k, err = e2;
      }
      return static_cast<uint8_t>(b);
    };
    for (int j = 0; j < kQK / 2; ++j) y[i].qs[j] = static_cast<uint8_t>(best(x[j]) | best(x[j + kQK / 2]) << 4);
  }
}

void quant_q4_0(const float* x, BlockQ4_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.0f, max = 0.0f;  // max keeps its sign: it maps to -8
    for (int j = 0; j < kQK; ++j)
      if (amax < std::fabs(x[j])) amax = std::fabs(x[j]), max = x[j];
    const float d = max / -8, id = d ? 1.0f / d : 0.0f;
    y[i].d = f2h(d);
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t xi0 = std::min<int8_t>(15, (int8_t)(x[j] * id + 8.5f));
      const uint8_t xi1 = std::min<int8_t>(15, (int8_t)(x[j + kQK / 2] * id + 8.5f));
      y[i].qs[j] = xi0 | (xi1 << 4);
    }
  }
}

void quant_q4_1(const float* x, BlockQ4_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float min = x[0], max = x[0];
    for (int j = 1; j < kQK; ++j) min = std::min(min, x[j]), max = std::max(max, x[j]);
    const float d = (max - min) / 15, id = d ? 1.0f / d : 0.0f;
    y[i].d = f2h(d);
    y[i].m = f2h(min);
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t xi0 = std::min<int8_t>(15, (int8_t)((x[j] - min) * id + 0.5f));
      const uint8_t xi1 = std::min<int8_t>(15, (int8_t)((x[j + kQK / 2] - min) * id + 0.5f));
      y[i].qs[j] = xi0 | (xi1 << 4);
    }
  }
}

void quant_q5_0(const float* x, BlockQ5_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK; ++j)
      if (amax < std::fabs(x[j])) amax = std::fabs(x[j]), max = x[j];
    const float d = max / -16, id = d ? 1.0f / d : 0.0f;
    y[i].d = f2h(d);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t xi0 = std::min<int8_t>(31, (int8_t)(x[j] * id + 16.5f));
      const uint8_t xi1 = std::min<int8_t>(31, (int8_t)(x[j + kQK / 2] * id + 16.5f));
      y[i].qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
      qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
      qh |= ((xi1 & 0x10u) >> 4) << (j + kQK / 2);
    }
    std::memcpy(y[i].qh, &qh, 4);
  }
}

void quant_q5_1(const float* x, BlockQ5_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float min = x[0], max = x[0];
    for (int j = 1; j < kQK; ++j) min = std::min(min, x[j]), max = std::max(max, x[j]);
    const float d = (max - min) / 31, id = d ? 1.0f / d : 0.0f;
    y[i].d = f2h(d);
    y[i].m = f2h(min);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t xi0 = std::min<uint8_t>(31, (uint8_t)((x[j] - min) * id + 0.5f));
      const uint8_t xi1 = std::min<uint8_t>(31, (uint8_t)((x[j + kQK / 2] - min) * id + 0.5f));
      y[i].qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
      qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
      qh |= ((xi1 & 0x10u) >> 4) << (j + kQK / 2);
    }
    std::memcpy(y[i].qh, &qh, 4);
  }
}

template <class Block>
void quant_q8(const float* x, Block* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127, id = d ? 1.0f / d : 0.0f;
    y[i].d = f2h(d);
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      y[i].qs[j] = (int8_t)std::roundf(x[j] * id);
      sum += y[i].qs[j];
    }
    if constexpr (std::is_same_v<Block, BlockQ8_1>) y[i].s = f2h(sum * d);
  }
}

// ---- K-quant encoders with GGML's error searches ----------------------------
// The sub-block fits are GGML's (ggml-quants.c, quantize_row_q*_K_ref, what
// llama-quantize runs without an importance matrix), written afresh:
// make_qkx2_quants for the (scale, min) types Q2_K, Q4_K, Q5_K;
// make_q3_quants for Q3_K; make_qx_quants (weights x^2) for Q6_K. On top of
// GGML, the super-block scales (d, dmin) are chosen among GGML's own choice
// and a few neighbours by the block's decoded squared error, then each
// sub-block's integer scale (and min) moves by one step where that lowers its
// error: a block never comes out worse (in squared error) than GGML's
// encoding of it.

constexpr float kGroupMaxEps = 1e-15f;  // GGML's GROUP_MAX_EPS: a sub-block below this is all zero

// make_qkx2_quants: weighted fit x ~ scale * L + min (L in 0..nmax, min <= 0)
// over nstep + 1 candidate inverse scales (nmax + rmin + rdelta * is) /
// (max - min), each refined by the weighted least-squares (scale, min) of its
// codes; the one with the least weighted error (absolute with use_mad, else
// squared) wins. Returns the scale; *neg_min receives -min. n <= 32.
float search_scale_min(const float* x, const float* w, int n, int nmax, float rmin, float rdelta, int nstep,
                       bool use_mad, uint8_t* L, float* neg_min) {
  float mn = x[0], mx = x[0], sum_w = w[0], sum_x = w[0] * x[0];
  for (int i = 1; i < n; ++i) {
    mn = std::min(mn, x[i]), mx = std::max(mx, x[i]);
    sum_w += w[i], sum_x += w[i] * x[i];
  }
  if (mn > 0) mn = 0;
  if (mx == mn) {
    std::memset(L, 0, static_cast<size_t>(n));
    *neg_min = -mn;
    return 0.0f;
  }
  auto cost = [use_mad](float e) { return use_mad ? std::fabs(e) : e * e; };
  float iscale = nmax / (mx - mn), scale = 1 / iscale, best = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(std::clamp(nearest_int(iscale * (x[i] - mn)), 0, nmax));
    best += w[i] * cost(scale * L[i] + mn - x[i]);
  }
  uint8_t aux[32];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (mx - mn);
    float sl = 0, sl2 = 0, sxl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - mn)), 0, nmax);
      aux[i] = static_cast<uint8_t>(l);
      sl += w[i] * l, sl2 += w[i] * l * l, sxl += w[i] * l * x[i];
    }
    const float D = sum_w * sl2 - sl * sl;
    if (!(D > 0)) continue;
    float s = (sum_w * sxl - sum_x * sl) / D, m = (sl2 * sum_x - sl * sxl) / D;
    if (m > 0) m = 0, s = sxl / sl2;  // the min is clamped at 0: refit the scale alone
    float err = 0;
    for (int i = 0; i < n; ++i) err += w[i] * cost(s * aux[i] + m - x[i]);
    if (err < best) {
      std::memcpy(L, aux, static_cast<size_t>(n));
      best = err, scale = s, mn = m;
    }
  }
  *neg_min = -mn;
  return scale;
}

// make_qx_quants with rmse_type 1: symmetric codes in -nmax..nmax-1 with the
// signed extreme at -nmax, then 18 nearby inverse scales, each with the
// least-squares scale of its codes under weights x^2; the best fit wins.
// Returns the (signed) scale.
float search_signed(const float* x, int n, int nmax) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
  if (amax < kGroupMaxEps) return 0.0f;
  auto fit = [&](float iscale, float* sumlx, float* suml2) {
    *sumlx = *suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      *sumlx += w * x[i] * l, *suml2 += w * l * l;
    }
  };
  float sumlx, suml2;
  fit(-nmax / max, &sumlx, &suml2);
  float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    fit(-(nmax + 0.1f * is) / max, &sumlx, &suml2);
    // sumlx^2 / suml2 is the error reduction of the fit: larger is better.
    if (suml2 > 0 && sumlx * sumlx > best * suml2) scale = sumlx / suml2, best = scale * sumlx;
  }
  return scale;
}

// make_q3_quants with do_rmse: codes in -nmax..nmax-1 from the signed extreme,
// then up to five passes that move single codes while that improves the
// weighted (x^2) least-squares fit. Returns the (signed) scale.
float search_q3(const float* x, int n, int nmax) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
  if (amax < kGroupMaxEps) return 0.0f;
  const float iscale = -nmax / max;
  int L[32];
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * L[i], suml2 += w * L[i] * L[i];
  }
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (!(slx > 0)) continue;
      float sl2 = suml2 - w * L[i] * L[i];
      const int nl = std::clamp(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
      if (nl == L[i]) continue;
      slx += w * x[i] * nl, sl2 += w * nl * nl;
      if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
        L[i] = nl, sumlx = slx, suml2 = sl2;
        ++changed;
      }
    }
    if (!changed) break;
  }
  return suml2 > 0 ? sumlx / suml2 : 0.0f;
}

// Neighbours of GGML's super-block scale tried beside it (factor 1 first, so
// ties keep GGML's encoding).
constexpr float kScaleFactors[] = {1.0f, 0.98f, 1.02f, 0.96f, 1.04f};
constexpr float kMinFactors[] = {1.0f, 0.97f, 1.03f};

// Super-block encoding of `nsub` sub-blocks of `sub` values with unsigned
// codes 0..nmax and (scale, min) pairs quantized to 0..qmax: the integer
// pairs, fp16 d and dmin, and the final codes.
struct PairBlock {
  uint8_t ls[16] = {}, lm[16] = {}, L[kQK_K] = {};
  uint16_t d = 0, dmin = 0;
};

// Nearest codes of one sub-block for scale dl and min ml (decoded dl * l - ml)
// and their squared error, as the decoder computes them.
float pair_codes(const float* x, int n, float dl, float ml, int nmax, uint8_t* L) {
  float err = 0;
  for (int k = 0; k < n; ++k) {
    const int l = dl == 0 ? 0 : std::clamp(nearest_int((x[k] + ml) / dl), 0, nmax);
    L[k] = static_cast<uint8_t>(l);
    const float e = dl * l - ml - x[k];
    err += e * e;
  }
  return err;
}

// Encodes with super-scales max/qmax * (fd, fm) and returns the block's
// squared error as the decoder will see it.
float encode_pairs(const float* x, const float* scales, const float* mins, int nsub, int sub, int qmax, int nmax,
                   float fd, float fm, PairBlock& b) {
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < nsub; ++j) max_scale = std::max(max_scale, scales[j]), max_min = std::max(max_min, mins[j]);
  const float inv_scale = max_scale > 0 ? qmax / (max_scale * fd) : 0.0f;
  const float inv_min = max_min > 0 ? qmax / (max_min * fm) : 0.0f;
  for (int j = 0; j < nsub; ++j) {
    b.ls[j] = static_cast<uint8_t>(std::clamp(nearest_int(inv_scale * scales[j]), 0, qmax));
    b.lm[j] = static_cast<uint8_t>(std::clamp(nearest_int(inv_min * mins[j]), 0, qmax));
  }
  b.d = f2h(max_scale > 0 ? max_scale * fd / qmax : 0.0f);
  b.dmin = f2h(max_min > 0 ? max_min * fm / qmax : 0.0f);
  const float d = h2f(b.d), dmin = h2f(b.dmin);
  float err = 0;
  for (int j = 0; j < nsub; ++j) err += pair_codes(x + sub * j, sub, d * b.ls[j], dmin * b.lm[j], nmax, b.L + sub * j);
  return err;
}

// Moves each sub-block's integer scale and min by one step where that lowers
// the sub-block's error under the chosen d and dmin (the rounding of
// scale / d to the nearest integer is not the best integer for the codes).
void refine_pairs(const float* x, int nsub, int sub, int qmax, int nmax, PairBlock& b) {
  const float d = h2f(b.d), dmin = h2f(b.dmin);
  uint8_t L[32];
  for (int j = 0; j < nsub; ++j) {
    float best = pair_codes(x + sub * j, sub, d * b.ls[j], dmin * b.lm[j], nmax, L);
    const int ls0 = b.ls[j], lm0 = b.lm[j];
    for (int ds = -1; ds <= 1; ++ds)
      for (int dm = -1; dm <= 1; ++dm) {
        const int ls = ls0 + ds, lm = lm0 + dm;
        if ((ds == 0 && dm == 0) || ls < 0 || ls > qmax || lm < 0 || lm > qmax) continue;
        const float e = pair_codes(x + sub * j, sub, d * ls, dmin * lm, nmax, L);
        if (e < best) {
          best = e;
          b.ls[j] = static_cast<uint8_t>(ls), b.lm[j] = static_cast<uint8_t>(lm);
          std::memcpy(b.L + sub * j, L, static_cast<size_t>(sub));
        }
      }
  }
}

void best_pairs(const float* x, const float* scales, const float* mins, int nsub, int sub, int qmax, int nmax,
                PairBlock& best) {
  PairBlock cand;
  float best_err = INFINITY;
  for (float fd : kScaleFactors)
    for (float fm : kMinFactors) {
      const float err = encode_pairs(x, scales, mins, nsub, sub, qmax, nmax, fd, fm, cand);
      if (err < best_err) best_err = err, best = cand;
    }
  refine_pairs(x, nsub, sub, qmax, nmax, best);
}

void quant_q2_K(const float* x, BlockQ2_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scales[16], mins[16], w[16];
    uint8_t L[16];
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) w[l] = std::fabs(x[16 * j + l]);
      scales[j] = search_scale_min(x + 16 * j, w, 16, 3, -0.5f, 0.1f, 15, true, L, &mins[j]);
    }
    PairBlock b;
    best_pairs(x, scales, mins, 16, 16, 15, 3, b);
    y[i].d = b.d;
    y[i].dmin = b.dmin;
    for (int j = 0; j < 16; ++j) y[i].scales[j] = static_cast<uint8_t>(b.ls[j] | (b.lm[j] << 4));
    for (int j = 0; j < kQK_K; j += 128)
      for (int l = 0; l < 32; ++l)
        y[i].qs[j / 4 + l] = b.L[j + l] | (b.L[j + l + 32] << 2) | (b.L[j + l + 64] << 4) | (b.L[j + l + 96] << 6);
  }
}

// Signed super-block encoding (Q3_K, Q6_K): 16 sub-blocks of 16 codes in
// -nmax..nmax-1, integer scales in -q..q-1 with the signed extreme at -q.
struct SignedBlock {
  int ls[16] = {};
  int8_t L[kQK_K] = {};  // biased by nmax
  uint16_t d = 0;
};

// Nearest codes (biased by nmax) of 16 values for scale dl, and their squared error.
float signed_codes(const float* x, float dl, int nmax, int8_t* L) {
  float err = 0;
  for (int k = 0; k < 16; ++k) {
    const int l = dl == 0 ? 0 : std::clamp(nearest_int(x[k] / dl), -nmax, nmax - 1);
    L[k] = static_cast<int8_t>(l + nmax);
    const float e = dl * l - x[k];
    err += e * e;
  }
  return err;
}

float encode_signed(const float* x, const float* scales, float max_scale, int q, int nmax, float f, SignedBlock& b) {
  const float iscale = -q / max_scale * f;
  for (int j = 0; j < 16; ++j) b.ls[j] = std::clamp(nearest_int(iscale * scales[j]), -q, q - 1);
  b.d = f2h(1 / iscale);
  const float d = h2f(b.d);
  float err = 0;
  for (int j = 0; j < 16; ++j) err += signed_codes(x + 16 * j, d * b.ls[j], nmax, b.L + 16 * j);
  return err;
}

// As refine_pairs, for the signed integer sub-block scales.
void refine_signed(const float* x, int q, int nmax, SignedBlock& b) {
  const float d = h2f(b.d);
  int8_t L[16];
  for (int j = 0; j < 16; ++j) {
    float best = signed_codes(x + 16 * j, d * b.ls[j], nmax, L);
    const int ls0 = b.ls[j];
    for (int ls : {ls0 - 1, ls0 + 1}) {
      if (ls < -q || ls > q - 1) continue;
      const float e = signed_codes(x + 16 * j, d * ls, nmax, L);
      if (e < best) {
        best = e;
        b.ls[j] = ls;
        std::memcpy(b.L + 16 * j, L, 16);
      }
    }
  }
}

// false: every scale is zero (the block decodes to zeros).
bool best_signed(const float* x, const float* scales, int q, int nmax, SignedBlock& best) {
  float amax = 0, max_scale = 0;
  for (int j = 0; j < 16; ++j)
    if (std::fabs(scales[j]) > amax) amax = std::fabs(scales[j]), max_scale = scales[j];
  if (amax < kGroupMaxEps) return false;
  SignedBlock cand;
  float best_err = INFINITY;
  for (float f : kScaleFactors) {
    const float err = encode_signed(x, scales, max_scale, q, nmax, f, cand);
    if (err < best_err) best_err = err, best = cand;
  }
  refine_signed(x, q, nmax, best);
  return true;
}

void quant_q3_K(const float* x, BlockQ3_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scales[16];
    for (int j = 0; j < 16; ++j) scales[j] = search_q3(x + 16 * j, 16, 4);
    SignedBlock b;
    std::memset(y[i].scales, 0, 12);
    std::memset(y[i].hmask, 0, sizeof(y[i].hmask));
    if (!best_signed(x, scales, 32, 4, b)) {
      std::memset(&y[i], 0, sizeof(BlockQ3_K));  // d = 0 decodes to zeros
      continue;
    }
    y[i].d = b.d;
    for (int j = 0; j < 16; ++j) {
      const int l = b.ls[j] + 32;
      if (j < 8) y[i].scales[j] = l & 0xF;
      else y[i].scales[j - 8] |= (l & 0xF) << 4;
      y[i].scales[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
    }
    uint8_t L[kQK_K];
    for (int j = 0; j < kQK_K; ++j) L[j] = static_cast<uint8_t>(b.L[j]);
    for (int j = 0; j < kQK_K; ++j)
      if (L[j] > 3) y[i].hmask[j % 32] |= 1 << (j / 32), L[j] -= 4;
    for (int j = 0; j < kQK_K; j += 128)
      for (int l = 0; l < 32; ++l)
        y[i].qs[j / 4 + l] = L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6);
  }
}

// Q4_K and Q5_K share the 12-byte packing of eight 6-bit (scale, min) pairs.
void pack_k4_scales(const uint8_t* ls, const uint8_t* lm, uint8_t* out) {
  std::memset(out, 0, kKScaleSize);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      out[j] = ls[j];
      out[j + 4] = lm[j];
    } else {
      out[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
      out[j - 4] |= (ls[j] >> 4) << 6;
      out[j - 0] |= (lm[j] >> 4) << 6;
    }
  }
}

template <int kBits, class Block>
void quant_qk_K(const float* x, Block* y, int64_t nb) {
  constexpr int nmax = (1 << kBits) - 1;
  // GGML's grids: Q4_K 21 steps from nmax - 1, Q5_K 16 from nmax - 0.5.
  constexpr float rmin = kBits == 4 ? -1.0f : -0.5f;
  constexpr int nstep = kBits == 4 ? 20 : 15;
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scales[8], mins[8], w[32];
    uint8_t L[32];
    for (int j = 0; j < 8; ++j) {
      // Weights |x| + rms of the sub-block: large values matter more, small ones still count.
      float sum_x2 = 0;
      for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
      const float av_x = std::sqrt(sum_x2 / 32);
      for (int l = 0; l < 32; ++l) w[l] = av_x + std::fabs(x[32 * j + l]);
      scales[j] = search_scale_min(x + 32 * j, w, 32, nmax, rmin, 0.1f, nstep, false, L, &mins[j]);
    }
    PairBlock b;
    best_pairs(x, scales, mins, 8, 32, 63, nmax, b);
    y[i].d = b.d;
    y[i].dmin = b.dmin;
    pack_k4_scales(b.ls, b.lm, y[i].scales);
    if constexpr (kBits == 4) {
      for (int j = 0; j < kQK_K; j += 64)
        for (int l = 0; l < 32; ++l) y[i].qs[j / 2 + l] = b.L[j + l] | (b.L[j + l + 32] << 4);
    } else {
      std::memset(y[i].qh, 0, sizeof(y[i].qh));
      uint8_t m1 = 1, m2 = 2;
      uint8_t* ql = y[i].qs;
      for (int n = 0; n < kQK_K; n += 64) {
        for (int j = 0; j < 32; ++j) {
          int l1 = b.L[n + j], l2 = b.L[n + j + 32];
          if (l1 > 15) l1 -= 16, y[i].qh[j] |= m1;
          if (l2 > 15) l2 -= 16, y[i].qh[j] |= m2;
          ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
        }
        m1 <<= 2, m2 <<= 2, ql += 32;
      }
    }
  }
}

void quant_q6_K(const float* x, BlockQ6_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scales[16];
    for (int j = 0; j < 16; ++j) scales[j] = search_signed(x + 16 * j, 16, 32);
    SignedBlock b;
    if (!best_signed(x, scales, 128, 32, b)) {
      std::memset(&y[i], 0, sizeof(BlockQ6_K));  // d = 0 decodes to zeros
      continue;
    }
    y[i].d = b.d;
    for (int j = 0; j < 16; ++j) y[i].scales[j] = static_cast<int8_t>(b.ls[j]);
    const auto* L = reinterpret_cast<const uint8_t*>(b.L);
    uint8_t* ql = y[i].ql;
    uint8_t* qh = y[i].qh;
    for (int j = 0; j < kQK_K; j += 128) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t q1 = L[j + l + 0] & 0xF, q2 = L[j + l + 32] & 0xF;
        const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
        ql[l + 0] = q1 | (q3 << 4);
        ql[l + 32] = q2 | (q4 << 4);
        qh[l] = (L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                ((L[j + l + 96] >> 4) << 6);
      }
      ql += 64;
      qh += 32;
    }
  }
}

}  // namespace

namespace cpu {

void quantize_act_q8_0(const float* x, ActQ8_0* y, int64_t n, int group) {
  const int64_t nb = n / kQK;
  for (int64_t g = 0; g < nb; g += group) {
    const int64_t ge = std::min<int64_t>(nb, g + group);
    float amax = 0.0f;
    for (int64_t j = g * kQK; j < ge * kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127, id = d ? 1.0f / d : 0.0f;
    for (int64_t i = g; i < ge; ++i) {
      y[i].d = d;
      int32_t sum = 0;
      for (int j = 0; j < kQK; ++j) {
        y[i].qs[j] = (int8_t)std::roundf(x[i * kQK + j] * id);
        sum += y[i].qs[j];
      }
      y[i].sum = sum;
    }
  }
}

// GGML's quantize_row_q8_K_ref: the signed extreme maps to -127, bsums per 16.
void quantize_act_q8_K(const float* x, BlockQ8_K* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    float max = 0, amax = 0;
    for (int j = 0; j < kQK_K; ++j)
      if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), max = x[j];
    if (amax == 0) {
      y[i].d = 0;
      std::memset(y[i].qs, 0, kQK_K);
      std::memset(y[i].bsums, 0, sizeof(y[i].bsums));
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < kQK_K; ++j) y[i].qs[j] = (int8_t)std::min(127, nearest_int(iscale * x[j]));
    for (int j = 0; j < kQK_K / 16; ++j) {
      int sum = 0;
      for (int k = 0; k < 16; ++k) sum += y[i].qs[j * 16 + k];
      y[i].bsums[j] = (int16_t)sum;
    }
    y[i].d = 1 / iscale;
  }
}

}  // namespace cpu

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  const int64_t be = dtype_block_elems(t);
  if (be <= 0 || n % be != 0) return;
  const int64_t nb = n / be;
  switch (t) {
    case DType::F32: std::memcpy(dst, src, n * sizeof(float)); break;
    case DType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(h[i]);
      break;
    }
    case DType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
      break;
    }
    case DType::Q4_0: dequant_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb); break;
    case DType::Q4_1: dequant_q4_1(static_cast<const BlockQ4_1*>(src), dst, nb); break;
    case DType::Q5_0: dequant_q5_0(static_cast<const BlockQ5_0*>(src), dst, nb); break;
    case DType::Q5_1: dequant_q5_1(static_cast<const BlockQ5_1*>(src), dst, nb); break;
    case DType::Q8_0: dequant_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb); break;
    case DType::Q8_1: dequant_q8_1(static_cast<const BlockQ8_1*>(src), dst, nb); break;
    case DType::Q2_K: dequant_q2_K(static_cast<const BlockQ2_K*>(src), dst, nb); break;
    case DType::Q3_K: dequant_q3_K(static_cast<const BlockQ3_K*>(src), dst, nb); break;
    case DType::Q4_K: dequant_q4_K(static_cast<const BlockQ4_K*>(src), dst, nb); break;
    case DType::Q5_K: dequant_q5_K(static_cast<const BlockQ5_K*>(src), dst, nb); break;
    case DType::Q6_K: dequant_q6_K(static_cast<const BlockQ6_K*>(src), dst, nb); break;
    case DType::Q8_K: dequant_q8_K(static_cast<const BlockQ8_K*>(src), dst, nb); break;
    case DType::MXFP4: dequant_mxfp4(static_cast<const BlockMXFP4*>(src), dst, nb); break;
    case DType::E4M3_ROWS: {
      float scale;
      std::memcpy(&scale, src, sizeof scale);
      const auto* c = static_cast<const uint8_t*>(src) + kE4M3RowHeaderBytes;
      for (int64_t i = 0; i < n; ++i) dst[i] = scale * e4m3_to_f32(c[i]);
      break;
    }
    case DType::MXFP8: {
      const auto* b = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < nb; ++i, b += kMxfp8BlockBytes) {
        const float d = e8m0_to_f32(b[0]);
        for (int j = 0; j < kMxfp8BlockElems; ++j) dst[i * kMxfp8BlockElems + j] = e4m3_to_f32(b[1 + j]) * d;
      }
      break;
    }
  }
}

bool quantize_row(DType t, const float* src, void* dst, int64_t n) {
  const int64_t be = dtype_block_elems(t);
  if (be <= 0 || n % be != 0) return false;
  const int64_t nb = n / be;
  switch (t) {
    case DType::F32: std::memcpy(dst, src, n * sizeof(float)); return true;
    case DType::F16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_fp16(src[i]);
      return true;
    }
    case DType::BF16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(src[i]);
      return true;
    }
    case DType::Q4_0: quant_q4_0(src, static_cast<BlockQ4_0*>(dst), nb); return true;
    case DType::Q4_1: quant_q4_1(src, static_cast<BlockQ4_1*>(dst), nb); return true;
    case DType::Q5_0: quant_q5_0(src, static_cast<BlockQ5_0*>(dst), nb); return true;
    case DType::Q5_1: quant_q5_1(src, static_cast<BlockQ5_1*>(dst), nb); return true;
    case DType::Q8_0: quant_q8(src, static_cast<BlockQ8_0*>(dst), nb); return true;
    case DType::Q8_1: quant_q8(src, static_cast<BlockQ8_1*>(dst), nb); return true;
    case DType::Q2_K: quant_q2_K(src, static_cast<BlockQ2_K*>(dst), nb); return true;
    case DType::Q3_K: quant_q3_K(src, static_cast<BlockQ3_K*>(dst), nb); return true;
    case DType::Q4_K: quant_qk_K<4>(src, static_cast<BlockQ4_K*>(dst), nb); return true;
    case DType::Q5_K: quant_qk_K<5>(src, static_cast<BlockQ5_K*>(dst), nb); return true;
    case DType::Q6_K: quant_q6_K(src, static_cast<BlockQ6_K*>(dst), nb); return true;
    case DType::Q8_K: cpu::quantize_act_q8_K(src, static_cast<BlockQ8_K*>(dst), n); return true;
    case DType::MXFP4: quant_mxfp4(src, static_cast<BlockMXFP4*>(dst), nb); return true;
    case DType::E4M3_ROWS: {  // one row: n is the row's length
      float amax = 0;
      for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(src[i]));
      const float scale = amax > 0 ? amax / 448.0f : 1.0f;
      auto* b = static_cast<uint8_t*>(dst);
      std::memset(b, 0, kE4M3RowHeaderBytes);
      std::memcpy(b, &scale, sizeof scale);
      for (int64_t i = 0; i < n; ++i) b[kE4M3RowHeaderBytes + i] = f32_to_e4m3(src[i] / scale);
      return true;
    }
    case DType::MXFP8: {  // DType::MXFP8; the CUDA module's kv_store_row gives the same bytes
      auto* b = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < nb; ++i, src += kMxfp8BlockElems, b += kMxfp8BlockBytes) {
        float amax = 0.0f;  // of the finite values: an infinity saturates, it does not zero the block
        for (int j = 0; j < kMxfp8BlockElems; ++j)
          if (std::isfinite(src[j])) amax = std::max(amax, std::fabs(src[j]));
        b[0] = mxfp8_scale_byte(amax);
        const float inv = std::ldexp(1.0f, 127 - static_cast<int>(b[0]));  // exact: a power of two
        for (int j = 0; j < kMxfp8BlockElems; ++j) b[1 + j] = f32_to_e4m3(src[j] * inv);
      }
      return true;
    }
  }
  return false;
}

}  // namespace atelier::kernels
