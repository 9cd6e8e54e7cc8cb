// Type traits and scalar fp16/bf16 conversions: the facts every layer needs
// to size a tensor before touching its bytes.
#include <atelier/kernels.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace atelier::kernels {

namespace {
struct TypeInfo {
  DType type;
  std::string_view name;
  int64_t block_elems;
  int64_t block_bytes;
};

// Block sizes as GGML defines them (ggml-common.h): QK4_0 = QK8_0 = 32, QK_K = 256.
constexpr TypeInfo kTypes[] = {
    {DType::F32, "f32", 1, 4},
    {DType::F16, "f16", 1, 2},
    {DType::Q4_0, "q4_0", 32, 2 + 16},
    {DType::Q4_1, "q4_1", 32, 2 + 2 + 16},
    {DType::Q5_0, "q5_0", 32, 2 + 4 + 16},
    {DType::Q5_1, "q5_1", 32, 2 + 2 + 4 + 16},
    {DType::Q8_0, "q8_0", 32, 2 + 32},
    {DType::Q8_1, "q8_1", 32, 2 + 2 + 32},
    {DType::Q2_K, "q2_K", 256, 16 + 64 + 2 + 2},
    {DType::Q3_K, "q3_K", 256, 32 + 64 + 12 + 2},
    {DType::Q4_K, "q4_K", 256, 2 + 2 + 12 + 128},
    {DType::Q5_K, "q5_K", 256, 2 + 2 + 12 + 32 + 128},
    {DType::Q6_K, "q6_K", 256, 128 + 64 + 16 + 2},
    {DType::Q8_K, "q8_K", 256, 4 + 256 + 32},
    {DType::BF16, "bf16", 1, 2},
    {DType::MXFP4, "mxfp4", 32, 1 + 16},
    // Blocks of 16 codes; dtype_row_bytes adds the row's scale header.
    {DType::E4M3_ROWS, "e4m3-rows", 16, 16},
    {DType::MXFP8, "mxfp8", kMxfp8BlockElems, kMxfp8BlockBytes},
};

const TypeInfo* find(DType t) {
  for (const auto& info : kTypes)
    if (info.type == t) return &info;
  return nullptr;
}
}  // namespace

bool dtype_known(uint32_t id) {
  return id != static_cast<uint32_t>(DType::E4M3_ROWS) && id != static_cast<uint32_t>(DType::MXFP8) && find(static_cast<DType>(id)) != nullptr;
}

std::string_view dtype_name(DType t) {
  const TypeInfo* info = find(t);
  return info ? info->name : std::string_view("unknown");
}

int64_t dtype_block_elems(DType t) {
  const TypeInfo* info = find(t);
  return info ? info->block_elems : 0;
}

int64_t dtype_block_bytes(DType t) {
  const TypeInfo* info = find(t);
  return info ? info->block_bytes : 0;
}

int64_t dtype_row_bytes(DType t, int64_t n) {
  const TypeInfo* info = find(t);
  if (!info || n < 0 || n % info->block_elems != 0) return -1;
  return n / info->block_elems * info->block_bytes + (t == DType::E4M3_ROWS ? kE4M3RowHeaderBytes : 0);
}

float e4m3_to_f32(uint8_t c) {
  const int e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + static_cast<float>(m) / 8, e - 7);
  return (c & 0x80) ? -mag : mag;
}

uint8_t f32_to_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  // The codes 0..0x7e are the finite magnitudes in increasing order: the
  // nearest one, ties to the even code (saturating above 448).
  int lo = 0, hi = 0x7e;
  if (a >= 448.0f) return sign | 0x7e;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (e4m3_to_f32(static_cast<uint8_t>(mid)) <= a ? lo : hi) = mid;
  }
  const float dl = a - e4m3_to_f32(static_cast<uint8_t>(lo)), dh = e4m3_to_f32(static_cast<uint8_t>(hi)) - a;
  const int c = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
  return static_cast<uint8_t>(sign | c);
}

uint8_t mxfp8_scale_byte(float amax) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 0;  // an all-zero block
  // amax = m 2^x with m in [0.5, 1); 448 = 0.875 * 2^9, so amax <= 448 * 2^e
  // first holds at e = x - 9 when m <= 0.875, else at e = x - 8. Exact
  // (frexp), so the device's frexpf picks the same byte.
  int x = 0;
  const float m = std::frexp(amax, &x);
  const int e = (m <= 0.875f ? x - 9 : x - 8) + 127;
  return static_cast<uint8_t>(e < 0 ? 0 : e > 254 ? 254 : e);
}

float e8m0_to_f32(uint8_t s) {
  return s == 255 ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.0f, static_cast<int>(s) - 127);
}

float fp16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // subnormal or zero in fp16
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t e = abs >> 23;
    uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 113 - e + 13
    uint32_t half = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = ((abs >> 13) - ((127 - 15) << 10));
  uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) ++half;
  return static_cast<uint16_t>(sign | half);
}

float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace atelier::kernels
