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

// ---- encoders -------------------------------------------------------------

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

// Fits x ~ scale * L + min (L in 0..nmax, min <= 0) by min/max, then a few
// least-squares refinements of scale and min for the chosen L. Returns the
// scale; *neg_min receives -min (stored positive, subtracted on decode).
float fit_scale_min(const float* x, int n, int nmax, float* neg_min) {
  float mn = x[0], mx = x[0];
  for (int i = 1; i < n; ++i) mn = std::min(mn, x[i]), mx = std::max(mx, x[i]);
  if (mn > 0) mn = 0;
  if (mx <= mn) {
    *neg_min = -mn;
    return 0.0f;
  }
  float scale = (mx - mn) / nmax;
  float best_scale = scale, best_min = mn, best_err = INFINITY;
  for (int iter = 0; iter < 6; ++iter) {
    const float iscale = 1.0f / scale;
    double sl = 0, sl2 = 0, sxl = 0, sx = 0, err = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - mn)), 0, nmax);
      const float e = scale * l + mn - x[i];
      err += e * e;
      sl += l, sl2 += double(l) * l, sxl += double(x[i]) * l, sx += x[i];
    }
    if (err < best_err) best_err = err, best_scale = scale, best_min = mn;
    const double det = n * sl2 - sl * sl;
    if (det <= 0) break;
    double s = (n * sxl - sx * sl) / det, m = (sl2 * sx - sl * sxl) / det;
    if (m > 0) m = 0, s = sl2 > 0 ? sxl / sl2 : 0;
    if (!(s > 0)) break;
    scale = float(s), mn = float(m);
  }
  *neg_min = -best_min;
  return best_scale;
}

// Symmetric scale with the signed extreme mapped to -nmax (GGML's make_qx_quants
// without the search): the wider negative range goes where the magnitude is.
float signed_scale(const float* x, int n, int nmax) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
  return amax == 0 ? 0.0f : max / -nmax;
}

// Quantizes per-sub-block (scale, min) pairs to `bits`-bit integers against
// super-block scales d = max/qmax and dmin = max_min/qmax.
void quantize_scale_pairs(const float* scales, const float* mins, int count, int qmax,
                          uint8_t* ls, uint8_t* lm, float* d, float* dmin) {
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < count; ++j) max_scale = std::max(max_scale, scales[j]), max_min = std::max(max_min, mins[j]);
  const float inv_scale = max_scale > 0 ? qmax / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? qmax / max_min : 0.0f;
  for (int j = 0; j < count; ++j) {
    ls[j] = (uint8_t)std::min(qmax, nearest_int(inv_scale * scales[j]));
    lm[j] = (uint8_t)std::min(qmax, nearest_int(inv_min * mins[j]));
  }
  *d = max_scale / qmax;
  *dmin = max_min / qmax;
}

// Final codes for a sub-block once its effective scale and min are known.
void codes_with(const float* x, int n, float dl, float ml, int nmax, uint8_t* L) {
  for (int i = 0; i < n; ++i)
    L[i] = dl == 0 ? 0 : (uint8_t)std::clamp(nearest_int((x[i] + ml) / dl), 0, nmax);
}

void quant_q2_K(const float* x, BlockQ2_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scales[16], mins[16];
    for (int j = 0; j < 16; ++j) scales[j] = fit_scale_min(x + 16 * j, 16, 3, &mins[j]);
    uint8_t ls[16], lm[16], L[kQK_K];
    float d, dmin;
    quantize_scale_pairs(scales, mins, 16, 15, ls, lm, &d, &dmin);
    y[i].d = f2h(d);
    y[i].dmin = f2h(dmin);
    d = h2f(y[i].d), dmin = h2f(y[i].dmin);
    for (int j = 0; j < 16; ++j) {
      y[i].scales[j] = ls[j] | (lm[j] << 4);
      codes_with(x + 16 * j, 16, d * ls[j], dmin * lm[j], 3, L + 16 * j);
    }
    for (int j = 0; j < kQK_K; j += 128)
      for (int l = 0; l < 32; ++l)
        y[i].qs[j / 4 + l] = L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6);
  }
}

void quant_q3_K(const float* x, BlockQ3_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scales[16];
    float amax = 0, max_scale = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = signed_scale(x + 16 * j, 16, 4);
      if (std::fabs(scales[j]) > amax) amax = std::fabs(scales[j]), max_scale = scales[j];
    }
    std::memset(y[i].scales, 0, 12);
    int8_t ls[16];
    if (max_scale != 0) {
      const float iscale = -32.0f / max_scale;
      for (int j = 0; j < 16; ++j) ls[j] = (int8_t)std::clamp(nearest_int(iscale * scales[j]), -32, 31);
      y[i].d = f2h(1 / iscale);
    } else {
      std::memset(ls, 0, 16);
      y[i].d = f2h(0.0f);
    }
    for (int j = 0; j < 16; ++j) {
      const int l = ls[j] + 32;
      if (j < 8) y[i].scales[j] = l & 0xF;
      else y[i].scales[j - 8] |= (l & 0xF) << 4;
      y[i].scales[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
    }
    const float d = h2f(y[i].d);
    int8_t L[kQK_K];
    for (int j = 0; j < 16; ++j) {
      const float dl = d * ls[j];
      for (int k = 0; k < 16; ++k)
        L[16 * j + k] = dl == 0 ? 4 : (int8_t)(std::clamp(nearest_int(x[16 * j + k] / dl), -4, 3) + 4);
    }
    std::memset(y[i].hmask, 0, sizeof(y[i].hmask));
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
void quant_qk_K(const float* x, Block* y, int64_t nb, uint8_t* L) {
  constexpr int nmax = (1 << kBits) - 1;
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scales[8], mins[8];
    for (int j = 0; j < 8; ++j) scales[j] = fit_scale_min(x + 32 * j, 32, nmax, &mins[j]);
    uint8_t ls[8], lm[8];
    float d, dmin;
    quantize_scale_pairs(scales, mins, 8, 63, ls, lm, &d, &dmin);
    y[i].d = f2h(d);
    y[i].dmin = f2h(dmin);
    pack_k4_scales(ls, lm, y[i].scales);
    d = h2f(y[i].d), dmin = h2f(y[i].dmin);
    for (int j = 0; j < 8; ++j) codes_with(x + 32 * j, 32, d * ls[j], dmin * lm[j], nmax, L + 32 * j);
    if constexpr (kBits == 4) {
      for (int j = 0; j < kQK_K; j += 64)
        for (int l = 0; l < 32; ++l) y[i].qs[j / 2 + l] = L[j + l] | (L[j + l + 32] << 4);
    } else {
      std::memset(y[i].qh, 0, sizeof(y[i].qh));
      uint8_t m1 = 1, m2 = 2;
      uint8_t* ql = y[i].qs;
      for (int n = 0; n < kQK_K; n += 64) {
        for (int j = 0; j < 32; ++j) {
          int l1 = L[n + j], l2 = L[n + j + 32];
          if (l1 > 15) l1 -= 16, y[i].qh[j] |= m1;
          if (l2 > 15) l2 -= 16, y[i].qh[j] |= m2;
          ql[j] = l1 | (l2 << 4);
        }
        m1 <<= 2, m2 <<= 2, ql += 32;
      }
    }
  }
}

void quant_q6_K(const float* x, BlockQ6_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scales[16];
    float amax = 0, max_scale = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = signed_scale(x + 16 * j, 16, 32);
      if (std::fabs(scales[j]) > amax) amax = std::fabs(scales[j]), max_scale = scales[j];
    }
    uint8_t L[kQK_K];
    if (max_scale == 0) {
      std::memset(&y[i], 0, sizeof(BlockQ6_K));  // d = 0 decodes to zeros
      continue;
    }
    const float iscale = -128.0f / max_scale;
    y[i].d = f2h(1 / iscale);
    for (int j = 0; j < 16; ++j) y[i].scales[j] = (int8_t)std::min(127, nearest_int(iscale * scales[j]));
    const float d = h2f(y[i].d);
    for (int j = 0; j < 16; ++j) {
      const float dl = d * y[i].scales[j];
      for (int k = 0; k < 16; ++k)
        L[16 * j + k] = dl == 0 ? 32 : (uint8_t)(std::clamp(nearest_int(x[16 * j + k] / dl), -32, 31) + 32);
    }
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
    case DType::Q4_K: {
      uint8_t L[kQK_K];
      quant_qk_K<4>(src, static_cast<BlockQ4_K*>(dst), nb, L);
      return true;
    }
    case DType::Q5_K: {
      uint8_t L[kQK_K];
      quant_qk_K<5>(src, static_cast<BlockQ5_K*>(dst), nb, L);
      return true;
    }
    case DType::Q6_K: quant_q6_K(src, static_cast<BlockQ6_K*>(dst), nb); return true;
    case DType::Q8_K: cpu::quantize_act_q8_K(src, static_cast<BlockQ8_K*>(dst), n); return true;
  }
  return false;
}

}  // namespace atelier::kernels
