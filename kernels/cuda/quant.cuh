// GGML's weight formats decoded on the device, 8 consecutive elements at a
// time (the unit the product kernels stream): the definitions of
// kernels/cpu/quants.cpp's dequantize_row, value for value.
#pragma once

#include <cuda_fp8.h>

#include "common.cuh"

namespace atelier::kernels::cuda {

// Weight type codes as kernel template arguments (DType's numbers).
constexpr int kWF32 = 0, kWF16 = 1, kWQ4_0 = 2, kWQ8_0 = 8, kWQ4_K = 12, kWQ5_K = 13, kWQ6_K = 14, kWBF16 = 30,
              kWMXFP4 = 39, kWE4M3 = 1000;  // DType::E4M3_ROWS: a 16-byte header (the row's f32 scale), then E4M3 codes

// Two E4M3 codes (the low byte first) as floats.
__device__ __forceinline__ float2 e4m3x2_to_f2(uint16_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

__device__ __forceinline__ float h2f(const uint8_t* p) {
  // A 2-byte aligned fp16 (GGML's scales).
  return __half2float(*reinterpret_cast<const __half*>(p));
}

// A small unsigned integer q (q < 2^23) as a float, exactly float(q): its
// bits OR'ed into 2^23's mantissa, then 2^23 - bias subtracted (returns q -
// bias). An I2F conversion runs at a quarter of the FP32 rate (16 a clock
// per SM), which would bound quantized decode; this is two full-rate ops.
__device__ __forceinline__ float small_int_f(uint32_t q, int bias = 0) {
  return __uint_as_float(0x4B000000u | q) - (8388608.0f + static_cast<float>(bias));
}

// MXFP4's E8M0 scale halved (GGML_E8M0_TO_FP32_HALF, kernels/cpu/quants.h's
// e8m0_half: e 0 and 1 are subnormal floats) and its E2M1 codes doubled
// (kMxfp4Values), so code * scale is the value, exactly.
__device__ __forceinline__ float e8m0_half(uint8_t e) {
  return __uint_as_float(e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23);
}
__device__ __forceinline__ float mxfp4_code(int q) {
  // 0, 1, 2, 3, 4, 6, 8, 12, then the same negated (bit 3 the sign; code 8
  // is +0, as the CPU's int8 table gives it).
  const int m = q & 7;
  const float v = static_cast<float>(m < 5 ? m : m == 5 ? 6 : m == 6 ? 8 : 12);
  return q & 8 ? 0.0f - v : v;
}

// The 6-bit scale and min of sub-block j of a Q4_K / Q5_K super-block.
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t* q, int& d, int& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Elements 8g .. 8g+7 of a row (g < cols / 8, the row's start `row`) into w.
// `vec`: the row start is 16-byte aligned and BF16 groups may be read as one
// 16-byte load.
template <int WT>
__device__ __forceinline__ void load8(const uint8_t* row, int64_t g, bool vec, float (&w)[8]) {
  if constexpr (WT == kWBF16) {
    const auto* p = reinterpret_cast<const __nv_bfloat16*>(row) + g * 8;
    if (vec) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
      const uint32_t parts[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        w[2 * i] = __uint_as_float(parts[i] << 16);
        w[2 * i + 1] = __uint_as_float(parts[i] & 0xffff0000u);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) w[i] = __bfloat162float(p[i]);
    }
  } else if constexpr (WT == kWE4M3) {
    // 8 codes at byte 16 + 8g (8-byte aligned: rows are 16 + a multiple of 16 bytes).
    const float scale = *reinterpret_cast<const float*>(row);
    const uint2 u = *reinterpret_cast<const uint2*>(row + 16 + g * 8);
    const uint32_t parts[2] = {u.x, u.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float2 a = e4m3x2_to_f2(static_cast<uint16_t>(parts[i] & 0xffffu));
      const float2 b = e4m3x2_to_f2(static_cast<uint16_t>(parts[i] >> 16));
      w[4 * i] = a.x * scale, w[4 * i + 1] = a.y * scale, w[4 * i + 2] = b.x * scale, w[4 * i + 3] = b.y * scale;
    }
  } else if constexpr (WT == kWF32) {
    const float* p = reinterpret_cast<const float*>(row) + g * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = p[i];
  } else if constexpr (WT == kWF16) {
    const __half* p = reinterpret_cast<const __half*>(row) + g * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = __half2float(p[i]);
  } else if constexpr (WT == kWQ8_0) {
    // Block of 34 bytes: fp16 d, 32 int8. Groups of 8 lie inside one block.
    const uint8_t* b = row + (g >> 2) * 34;
    const float d = h2f(b);
    const uint16_t* q = reinterpret_cast<const uint16_t*>(b + 2 + (g & 3) * 8);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint16_t two = q[i];
      // int8 q + 128 (the byte with its sign bit flipped) is in [0, 255].
      w[2 * i] = small_int_f((two & 0xffu) ^ 0x80u, 128) * d;
      w[2 * i + 1] = small_int_f((two >> 8) ^ 0x80u, 128) * d;
    }
  } else if constexpr (WT == kWQ4_0) {
    // Block of 18 bytes: fp16 d, 16 bytes; element j < 16 the low nibble of
    // byte j, element j >= 16 the high nibble of byte j - 16.
    const uint8_t* b = row + (g >> 2) * 18;
    const float d = h2f(b);
    const int o = static_cast<int>(g & 3) * 8;
    const uint16_t* q = reinterpret_cast<const uint16_t*>(b + 2 + (o & 15));
    const int shift = o < 16 ? 0 : 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint16_t two = q[i];
      w[2 * i] = small_int_f((two >> shift) & 0xFu, 8) * d;
      w[2 * i + 1] = small_int_f((two >> (8 + shift)) & 0xFu, 8) * d;
    }
  } else if constexpr (WT == kWMXFP4) {
    // Block of 17 bytes: the E8M0 scale byte, 16 bytes; element j < 16 the
    // low nibble of byte j, element j >= 16 the high nibble of byte j - 16
    // (as Q4_0). Blocks are byte aligned: byte loads.
    const uint8_t* b = row + (g >> 2) * 17;
    const float d = e8m0_half(b[0]);
    const int o = static_cast<int>(g & 3) * 8;
    const uint8_t* q = b + 1 + (o & 15);
    const int shift = o < 16 ? 0 : 4;
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = mxfp4_code((q[i] >> shift) & 0xF) * d;
  } else if constexpr (WT == kWQ4_K || WT == kWQ5_K) {
    // Super-blocks of 256 (144 / 176 bytes): fp16 d, dmin, 12 scale bytes,
    // [Q5_K: 32 bytes of high bits], 128 nibble bytes. Element e: 64-chunk
    // j = e / 64; within it the first 32 are low nibbles of bytes 32j..,
    // the next 32 high nibbles of the same bytes.
    constexpr int kBytes = WT == kWQ4_K ? 144 : 176;
    const uint8_t* b = row + (g >> 5) * kBytes;
    const int e0 = static_cast<int>(g & 31) * 8;
    const int j = e0 >> 6, l0 = e0 & 63, hi = l0 >= 32, l = l0 & 31;
    int sc, m;
    scale_min_k4(2 * j + hi, b + 4, sc, m);
    const float d = h2f(b) * static_cast<float>(sc), mn = h2f(b + 2) * static_cast<float>(m);
    const uint8_t* qs = b + (WT == kWQ4_K ? 16 : 48) + j * 32 + l;
    const uint2 u = *reinterpret_cast<const uint2*>(qs);  // 8-byte aligned: l is a multiple of 8
    const uint8_t* qb = reinterpret_cast<const uint8_t*>(&u);
    if constexpr (WT == kWQ4_K) {
#pragma unroll
      for (int i = 0; i < 8; ++i) w[i] = d * small_int_f(hi ? qb[i] >> 4 : qb[i] & 0xFu) - mn;
    } else {
      const uint2 h = *reinterpret_cast<const uint2*>(b + 16 + l);
      const uint8_t* hb = reinterpret_cast<const uint8_t*>(&h);
      const int bit = 2 * j + hi;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t q = (hi ? qb[i] >> 4 : qb[i] & 0xFu) + (((hb[i] >> bit) & 1u) << 4);
        w[i] = d * small_int_f(q) - mn;
      }
    }
  } else if constexpr (WT == kWQ6_K) {
    // Super-blocks of 256 (210 bytes): ql[128], qh[64], int8 scales[16], fp16 d.
    // Element e: half n = e / 128, r = e % 128, quarter k = r / 32, l = r % 32:
    // low 4 bits from ql[64n + l (+32 for k odd)] (>> 4 for k >= 2), high 2
    // bits from qh[32n + l] >> 2k; scale scales[8n + l / 16 + 2k].
    const uint8_t* b = row + (g >> 5) * 210;
    const int e0 = static_cast<int>(g & 31) * 8;
    const int n = e0 >> 7, r = e0 & 127, k = r >> 5, l = r & 31;
    const float d = h2f(b + 208) * static_cast<float>(reinterpret_cast<const int8_t*>(b + 192)[8 * n + (l >> 4) + 2 * k]);
    const uint8_t* ql = b + 64 * n + l + (k & 1) * 32;
    const uint8_t* qh = b + 128 + 32 * n + l;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t lo = k >= 2 ? ql[i] >> 4 : ql[i] & 0xFu;
      w[i] = d * small_int_f(lo | (((qh[i] >> (2 * k)) & 3u) << 4), 32);
    }
  }
}

// Element c of a row of type wt (any of the types above), for get_rows and
// the tails of float rows.
__device__ __forceinline__ float load1(int wt, const uint8_t* row, int64_t c) {
  if (wt == kWF32) return reinterpret_cast<const float*>(row)[c];
  if (wt == kWF16) return __half2float(reinterpret_cast<const __half*>(row)[c]);
  if (wt == kWBF16) return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(row)[c]);
  if (wt == kWE4M3) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(row[16 + c]), __NV_E4M3);
    return __half2float(__half(h)) * *reinterpret_cast<const float*>(row);
  }
  float w[8];
  switch (wt) {
    case kWQ8_0: load8<kWQ8_0>(row, c / 8, false, w); break;
    case kWQ4_0: load8<kWQ4_0>(row, c / 8, false, w); break;
    case kWQ4_K: load8<kWQ4_K>(row, c / 8, false, w); break;
    case kWQ5_K: load8<kWQ5_K>(row, c / 8, false, w); break;
    case kWMXFP4: load8<kWMXFP4>(row, c / 8, false, w); break;
    default: load8<kWQ6_K>(row, c / 8, false, w); break;
  }
  return w[c % 8];
}

inline bool device_readable(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q8_0: case DType::Q4_0:
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::MXFP4: case DType::E4M3_ROWS: return true;
    default: return false;
  }
}

}  // namespace atelier::kernels::cuda
