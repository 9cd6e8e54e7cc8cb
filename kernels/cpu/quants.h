// Block layouts of the quantized types, byte for byte as GGML lays them out
// (ggml-common.h), plus the activation blocks the matmul kernels use.
// Private to kernels/cpu.
#pragma once

#include <atelier/kernels.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace atelier::kernels::cpu {

constexpr int kQK = 32;    // QK4_0 = QK4_1 = QK5_0 = QK5_1 = QK8_0 = QK8_1
constexpr int kQK_K = 256;  // super-block of the K-quants
constexpr int kKScaleSize = 12;

struct BlockQ4_0 { uint16_t d; uint8_t qs[kQK / 2]; };
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[kQK / 2]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[kQK / 2]; };
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[kQK / 2]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[kQK]; };
struct BlockQ8_1 { uint16_t d, s; int8_t qs[kQK]; };  // s = d * sum(qs)
struct BlockQ2_K { uint8_t scales[kQK_K / 16]; uint8_t qs[kQK_K / 4]; uint16_t d, dmin; };
struct BlockQ3_K { uint8_t hmask[kQK_K / 8]; uint8_t qs[kQK_K / 4]; uint8_t scales[12]; uint16_t d; };
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[kKScaleSize]; uint8_t qs[kQK_K / 2]; };
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
struct BlockQ6_K { uint8_t ql[kQK_K / 2]; uint8_t qh[kQK_K / 4]; int8_t scales[kQK_K / 16]; uint16_t d; };
struct BlockQ8_K { float d; int8_t qs[kQK_K]; int16_t bsums[kQK_K / 16]; };
struct BlockMXFP4 { uint8_t e; uint8_t qs[kQK / 2]; };

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockMXFP4) == 17);

// MXFP4's E2M1 codes as integers, doubled (0, 0.5, 1, 1.5, 2, 3, 4, 6 and
// their negatives become 0..12), GGML's kvalues_mxfp4: a block's values are
// kMxfp4Values[code] * e8m0_half(e), so a dot with int8 activations is an
// integer sum times one scale.
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
// 2^(e - 127) / 2 (the halving undoes kMxfp4Values' doubling), exactly as
// GGML_E8M0_TO_FP32_HALF: e 0 and 1 are subnormal floats.
static inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? uint32_t{0x00200000} << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Activation block for Q8_0/Q4_0 weights: a Q8_0 block with its scale kept in
// f32 (no fp16 rounding) and the sum of its quants (Q4_0's -8 offset and the
// VNNI unsigned trick need it).
struct ActQ8_0 { float d; int32_t sum; int8_t qs[kQK]; };
static_assert(sizeof(ActQ8_0) == 40);

// static: these are also compiled into the per-ISA files, whose copies must
// never be picked by the linker for baseline callers.
// GGML's nearest_int: round half to even through the float mantissa trick,
// valid for |f| < 2^22 (the quantizers clamp far below that).
static inline int nearest_int(float f) {
  float val = f + 12582912.f;
  int32_t i;
  std::memcpy(&i, &val, 4);
  return (i & 0x007fffff) - 0x00400000;
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block.
static inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}

// Activation quantizers shared by every SIMD level and matmul_ref, so all of
// them see the same integers. n is a multiple of the block size.
// quantize_act_q8_0 shares one scale among each `group` consecutive blocks
// (the last group may be shorter): 1 for Q4_0 weights, kActGroupQ8_0 for
// Q8_0 weights, whose AVX-512 tile then applies the activation scale once per
// group instead of once per block (a third fewer multiplies in the
// compute-bound batched case). GGML's Q8_K activations, used for the K-quants,
// make the same trade: one scale per 256 values.
constexpr int kActGroupQ8_0 = 8;

// The packed layouts (kernels.h): per group of R rows (x16: R = 16, the
// AVX-512 VNNI tiles; x8: R = 8, the AVX2 tiles), nb blocks of R rows' quant
// bytes (Q bytes a row: 32 for Q8_0, 16 for Q4_0's nibble pairs), byte c of
// row j of block b at Q R b + 4 R (c / 4) + 4 j + c % 4 (one register holds 4
// bytes of every row), then nb x R fp16 scales (row j of block b at R b + j);
// the group's stride rounded up to 64 bytes. q8_0x16 stores q + 128, the
// unsigned operand of dpbusd; q8_0x8 stores q, whose sign maddubs moves onto
// x; Q4_0 keeps GGML's bytes (element c in the low nibble of byte c, element
// c + 16 in the high one: the low nibbles of a register are 4 columns, the
// high nibbles 4 columns 16 further).
constexpr int kPackRows = 16;  // q8_0x16
constexpr int64_t kPackBlockBytes = kPackRows * kQK;  // 512
constexpr int kPackRowsX8 = 8;  // q8_0x8
constexpr int64_t kPackBlockBytesX8 = kPackRowsX8 * kQK;  // 256
//
// q4_Kx16 (Q4_K, AVX-512 VNNI; q4_Kx8 the same for 8 rows, AVX2): per
// super-block the 16 rows' 128 quant bytes
// interleaved as above (the low nibbles of 4 bytes are 4 columns of
// sub-block 2c, the high nibbles the same columns of 2c + 1), and after all
// the quants, per super-block 20 bytes a row of scales (kQ4KMetaBytes):
// the 16 d (fp16), the 16 dmin (fp16), the 6-bit sub-block scales as bytes
// [j][row] and the mins as byte pairs [j / 2][row][j % 2] (the int16 pairs
// of one dpwssd).
// q6_Kx16 (Q6_K, AVX-512 VNNI): per super-block the rows' ql (128) then qh
// (64) bytes interleaved as above, and after all the quants, per super-block
// the 16 d (fp16) and the 16-element scales as bytes [s][row]: 210 bytes a
// row, as GGML's.
constexpr int kQ4KMetaBytes = 20, kQ6KMetaBytes = 18;
inline int packed_group_rows(WeightLayout l) {
  return l == WeightLayout::q8_0x8 || l == WeightLayout::q4_0x8 || l == WeightLayout::q4_Kx8 || l == WeightLayout::f16x8 ||
                 l == WeightLayout::f32x8
             ? kPackRowsX8
             : kPackRows;
}
inline DType packed_type(WeightLayout l) {
  if (l == WeightLayout::f32x16 || l == WeightLayout::f32x8) return DType::F32;
  if (l == WeightLayout::f16x16 || l == WeightLayout::f16x8) return DType::F16;
  if (l == WeightLayout::q4_Kx16 || l == WeightLayout::q4_Kx8) return DType::Q4_K;
  if (l == WeightLayout::q6_Kx16) return DType::Q6_K;
  return l == WeightLayout::q4_0x16 || l == WeightLayout::q4_0x8 ? DType::Q4_0 : DType::Q8_0;
}
inline bool packed_float(WeightLayout l) {
  return l == WeightLayout::f32x16 || l == WeightLayout::f16x16 || l == WeightLayout::f16x8 || l == WeightLayout::f32x8;
}
// Quant bytes of one row's block (a float layout: one element's), and the
// bytes of its scales (none for floats).
inline int packed_quant_bytes(WeightLayout l) {
  const DType t = packed_type(l);
  if (packed_float(l)) return t == DType::F32 ? 4 : 2;
  return t == DType::Q6_K ? kQK_K * 3 / 4 : t == DType::Q4_K ? kQK_K / 2 : t == DType::Q4_0 ? kQK / 2 : kQK;
}
inline int packed_meta_bytes(WeightLayout l) {
  const DType t = packed_type(l);
  if (packed_float(l)) return 0;
  return t == DType::Q4_K ? kQ4KMetaBytes : t == DType::Q6_K ? kQ6KMetaBytes : 2;
}
inline int64_t packed_group_bytes(WeightLayout l, int64_t cols) {
  const int64_t nb = cols / dtype_block_elems(packed_type(l)), rows = packed_group_rows(l);
  return (nb * rows * (packed_quant_bytes(l) + packed_meta_bytes(l)) + 63) / 64 * 64;
}
// Offset of quant byte c of block b of row j (within its group) in a group.
inline int64_t packed_quant_offset(WeightLayout l, int64_t b, int64_t j, int c) {
  const int rows = packed_group_rows(l);
  return b * rows * packed_quant_bytes(l) + (c / 4) * 4 * rows + j * 4 + c % 4;
}
// The byte stored for a GGML quant byte, and back (an involution).
inline uint8_t packed_code(WeightLayout l, uint8_t byte) {
  return static_cast<uint8_t>(l == WeightLayout::q8_0x16 ? byte ^ 0x80 : byte);
}
// The packed Q4_K tiles' min operands: per pair of 32-element sub-blocks
// (2i, 2i + 1), their activation sums as the int16 pair of one madd/dpwssd.
static inline void q8_K_pair_sums(const BlockQ8_K& x, int32_t out[4]) {
  for (int i = 0; i < 4; ++i) {
    const int16_t* bs = x.bsums + 4 * i;
    const auto lo = static_cast<uint16_t>(bs[0] + bs[1]), hi = static_cast<uint16_t>(bs[2] + bs[3]);
    out[i] = static_cast<int32_t>(static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16));
  }
}
void quantize_act_q8_0(const float* x, ActQ8_0* y, int64_t n, int group);
void quantize_act_q8_K(const float* x, BlockQ8_K* y, int64_t n);

}  // namespace atelier::kernels::cpu
