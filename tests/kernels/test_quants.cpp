// Formats: each decoder against blocks built byte by byte from GGML's layout
// description (expected values by the formula, not by the code under test),
// and quantize -> dequantize round trips for every type.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "test_util.h"
#include "../../kernels/cpu/ops_internal.h"
#include "../../kernels/cpu/quants.h"

namespace atelier::kernels {
namespace {

using Bytes = std::vector<uint8_t>;

void put16(Bytes& b, size_t off, uint16_t v) {
  b[off] = v & 0xFF;
  b[off + 1] = v >> 8;
}

std::vector<float> decode(DType t, const Bytes& b, int64_t n) {
  EXPECT_EQ(static_cast<int64_t>(b.size()), dtype_row_bytes(t, n));
  std::vector<float> out(static_cast<size_t>(n), NAN);
  dequantize_row(t, b.data(), out.data(), n);
  return out;
}

// fp16 bit patterns of exactly representable scales.
constexpr uint16_t kHalf = 0x3800;       // 0.5
constexpr uint16_t kQuarter = 0x3400;    // 0.25
constexpr uint16_t kEighth = 0x3000;     // 0.125
constexpr uint16_t kMinusOne = 0xBC00;   // -1.0
constexpr uint16_t kOnePointFive = 0x3E00;  // 1.5

TEST(Dtype, HalfAndBf16Conversions) {
  EXPECT_EQ(f32_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_fp16(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_fp16(65520.0f), 0x7C00);                 // tie rounds to even: inf
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.0f, -24)), 0x0001);     // smallest subnormal
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);     // tie to even: zero
  EXPECT_EQ(f32_to_fp16(std::ldexp(3.0f, -26)), 0x0001);
  EXPECT_EQ(fp16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_f32(0x3555), 0.333251953125f);
  EXPECT_TRUE(std::isinf(fp16_to_f32(0xFC00)));
  EXPECT_TRUE(std::isnan(fp16_to_f32(0x7E00)));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) continue;  // NaN
    ASSERT_EQ(f32_to_fp16(fp16_to_f32(static_cast<uint16_t>(h))), h) << h;
  }
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(bf16_to_f32(0xC040), -3.0f);
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3F80);  // halfway: even
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3F82);  // halfway: up to even
}

// FP8 E4M3 (OCP): every code decodes to its value (1-4-3, bias 7, 0x7f NaN),
// encoding rounds to nearest even and saturates; E4M3_ROWS rows carry their
// scale in a 16-byte header and are never a file's type.
TEST(Dtype, E4M3CodesAndRows) {
  EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);         // exponent 7, mantissa 0
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);       // the largest finite
  EXPECT_EQ(e4m3_to_f32(0x01), 0x1p-9f);      // the smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(c))), c == 0x80 ? 0x80 : c) << c;
  }
  EXPECT_EQ(f32_to_e4m3(1000.0f), 0x7e);      // saturates
  EXPECT_EQ(f32_to_e4m3(-1000.0f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);      // halfway between 1 and 1.125: to the even code
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3a);      // halfway between 1.125 and 1.25: to the even code
  EXPECT_EQ(dtype_row_bytes(DType::E4M3_ROWS, 4096), 16 + 4096);
  EXPECT_EQ(dtype_row_bytes(DType::E4M3_ROWS, 40), -1);
  EXPECT_FALSE(dtype_known(static_cast<uint32_t>(DType::E4M3_ROWS)));
  // A row: scale max|x| / 448, every element within half a code step of its value.
  std::vector<float> x = {0.5f, -2.0f, 0.001f, 1.75f, 0.0f, -0.3f, 0.9f, 1.1f, 2.0f, -1.5f, 0.25f, 0.125f, -0.6f, 1.9f, 0.05f, -2.0f};
  std::vector<uint8_t> row(static_cast<size_t>(dtype_row_bytes(DType::E4M3_ROWS, 16)));
  ASSERT_TRUE(quantize_row(DType::E4M3_ROWS, x.data(), row.data(), 16));
  float scale;
  std::memcpy(&scale, row.data(), 4);
  EXPECT_EQ(scale, 2.0f / 448.0f);
  std::vector<float> back(16);
  dequantize_row(DType::E4M3_ROWS, row.data(), back.data(), 16);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], std::fabs(x[i]) / 16 + scale * 0x1p-9f) << i;
  EXPECT_EQ(back[1], -2.0f);
}

TEST(Dtype, RowBytes) {
  EXPECT_EQ(dtype_row_bytes(DType::Q4_K, 512), 288);
  EXPECT_EQ(dtype_row_bytes(DType::Q8_0, 33), -1);
  EXPECT_EQ(dtype_name(DType::Q6_K), "q6_K");
  EXPECT_TRUE(dtype_known(30));
  EXPECT_FALSE(dtype_known(4));
}

TEST(Dequantize, FloatTypes) {
  Bytes f32(8), f16(4), bf16(4);
  const float vals[2] = {1.5f, -0.25f};
  std::memcpy(f32.data(), vals, 8);
  put16(f16, 0, kOnePointFive);
  put16(f16, 2, 0xB400);
  put16(bf16, 0, 0x3FC0);
  put16(bf16, 2, 0xBE80);
  for (const auto& [t, b] : {std::pair{DType::F32, f32}, {DType::F16, f16}, {DType::BF16, bf16}}) {
    const auto y = decode(t, b, 2);
    EXPECT_EQ(y[0], 1.5f);
    EXPECT_EQ(y[1], -0.25f);
  }
}

TEST(Dequantize, Q4_0) {
  Bytes b(18);
  put16(b, 0, kHalf);
  for (int j = 0; j < 16; ++j) b[2 + j] = (j & 0xF) | (((j * 3 + 1) & 0xF) << 4);
  const auto y = decode(DType::Q4_0, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], ((j & 0xF) - 8) * 0.5f) << j;
    EXPECT_EQ(y[j + 16], (((j * 3 + 1) & 0xF) - 8) * 0.5f) << j;
  }
}

TEST(Dequantize, Q4_1) {
  Bytes b(20);
  put16(b, 0, kQuarter);
  put16(b, 2, kMinusOne);
  for (int j = 0; j < 16; ++j) b[4 + j] = ((15 - j) & 0xF) | (((j * 5) & 0xF) << 4);
  const auto y = decode(DType::Q4_1, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], ((15 - j) & 0xF) * 0.25f - 1.0f) << j;
    EXPECT_EQ(y[j + 16], ((j * 5) & 0xF) * 0.25f - 1.0f) << j;
  }
}

// Q5: element j < 16 takes bit j of qh as its fifth bit, element j + 16 bit j + 16.
uint32_t q5_high_bits() {
  uint32_t qh = 0;
  for (int i = 0; i < 32; ++i)
    if (i % 3 == 0 || i == 31) qh |= 1u << i;
  return qh;
}

TEST(Dequantize, Q5_0) {
  Bytes b(22);
  put16(b, 0, kHalf);
  const uint32_t qh = q5_high_bits();
  std::memcpy(b.data() + 2, &qh, 4);
  for (int j = 0; j < 16; ++j) b[6 + j] = (j & 0xF) | (((j * 7) & 0xF) << 4);
  const auto y = decode(DType::Q5_0, b, 32);
  for (int j = 0; j < 16; ++j) {
    const int q0 = (j & 0xF) | (((qh >> j) & 1) << 4);
    const int q1 = ((j * 7) & 0xF) | (((qh >> (j + 16)) & 1) << 4);
    EXPECT_EQ(y[j], (q0 - 16) * 0.5f) << j;
    EXPECT_EQ(y[j + 16], (q1 - 16) * 0.5f) << j;
  }
}

TEST(Dequantize, Q5_1) {
  Bytes b(24);
  put16(b, 0, kEighth);
  put16(b, 2, kMinusOne);
  const uint32_t qh = q5_high_bits();
  std::memcpy(b.data() + 4, &qh, 4);
  for (int j = 0; j < 16; ++j) b[8 + j] = ((j * 3) & 0xF) | (((j * 11) & 0xF) << 4);
  const auto y = decode(DType::Q5_1, b, 32);
  for (int j = 0; j < 16; ++j) {
    const int q0 = ((j * 3) & 0xF) | (((qh >> j) & 1) << 4);
    const int q1 = ((j * 11) & 0xF) | (((qh >> (j + 16)) & 1) << 4);
    EXPECT_EQ(y[j], q0 * 0.125f - 1.0f) << j;
    EXPECT_EQ(y[j + 16], q1 * 0.125f - 1.0f) << j;
  }
}

TEST(Dequantize, Q8_0AndQ8_1) {
  Bytes b0(34), b1(36);
  put16(b0, 0, kEighth);
  put16(b1, 0, kEighth);
  put16(b1, 2, 0x5140);  // s: ignored when decoding
  for (int j = 0; j < 32; ++j) b0[2 + j] = b1[4 + j] = static_cast<uint8_t>(static_cast<int8_t>(j * 7 - 100));
  const auto y0 = decode(DType::Q8_0, b0, 32);
  const auto y1 = decode(DType::Q8_1, b1, 32);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(y0[j], (j * 7 - 100) * 0.125f);
    EXPECT_EQ(y1[j], (j * 7 - 100) * 0.125f);
  }
}

TEST(Dequantize, Q8_K) {
  Bytes b(292, 0);
  const float d = 0.01f;
  std::memcpy(b.data(), &d, 4);
  for (int j = 0; j < 256; ++j) b[4 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 128));
  const auto y = decode(DType::Q8_K, b, 256);
  for (int j = 0; j < 256; ++j) EXPECT_EQ(y[j], d * (j - 128));
}

// 2-bit codes of Q2_K/Q3_K: element e lives in qs[(e / 128) * 32 + e % 32] at
// bit 2 * ((e % 128) / 32).
void put_2bit(uint8_t* qs, int e, int code) { qs[(e / 128) * 32 + e % 32] |= (code & 3) << (2 * ((e % 128) / 32)); }

TEST(Dequantize, Q2_K) {
  Bytes b(84, 0);  // scales[16] qs[64] d dmin
  const float d = 0.5f, dmin = 0.25f;
  put16(b, 80, kHalf);
  put16(b, 82, kQuarter);
  auto scale = [](int s) { return s % 16; };
  auto min = [](int s) { return (s * 5 + 2) % 16; };
  for (int s = 0; s < 16; ++s) b[s] = scale(s) | (min(s) << 4);
  auto code = [](int e) { return (e * 7 + 3 + e / 64) % 4; };
  for (int e = 0; e < 256; ++e) put_2bit(b.data() + 16, e, code(e));
  const auto y = decode(DType::Q2_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 16;
    EXPECT_FLOAT_EQ(y[e], d * scale(s) * code(e) - dmin * min(s)) << e;
  }
}

TEST(Dequantize, Q3_K) {
  Bytes b(110, 0);  // hmask[32] qs[64] scales[12] d
  const float d = 0.5f;
  put16(b, 108, kHalf);
  auto scale6 = [](int s) { return (s * 11 + 5) % 64; };  // stored value; effective = value - 32
  uint8_t* sc = b.data() + 96;
  for (int s = 0; s < 16; ++s) {
    const int v = scale6(s);
    if (s < 8) sc[s] |= v & 0xF;          // low nibbles: bytes 0..7, low then high halves
    else sc[s - 8] |= (v & 0xF) << 4;
    sc[8 + s % 4] |= (v >> 4) << (2 * (s / 4));  // high 2 bits: bytes 8..11
  }
  auto code3 = [](int e) { return (e * 5 + e / 32) % 8; };  // 3-bit value; effective = value - 4
  for (int e = 0; e < 256; ++e) {
    put_2bit(b.data() + 32, e, code3(e) & 3);
    if (code3(e) & 4) b[e % 32] |= 1 << (e / 32);  // hmask bit set: no -4
  }
  const auto y = decode(DType::Q3_K, b, 256);
  for (int e = 0; e < 256; ++e)
    EXPECT_FLOAT_EQ(y[e], d * (scale6(e / 16) - 32) * (code3(e) - 4)) << e;
}

// Q4_K/Q5_K: eight 6-bit (scale, min) pairs in 12 bytes.
void pack_k4(uint8_t* q, const int* sc, const int* mn) {
  for (int j = 0; j < 4; ++j) {
    q[j] = sc[j] & 63;
    q[j + 4] = mn[j] & 63;
  }
  for (int j = 4; j < 8; ++j) {
    q[j + 4] = (sc[j] & 0xF) | ((mn[j] & 0xF) << 4);
    q[j - 4] |= (sc[j] >> 4) << 6;
    q[j] |= (mn[j] >> 4) << 6;
  }
}

TEST(Dequantize, Q4_K) {
  Bytes b(144, 0);  // d dmin scales[12] qs[128]
  const float d = 0.5f, dmin = 0.125f;
  put16(b, 0, kHalf);
  put16(b, 2, kEighth);
  const int sc[8] = {1, 63, 17, 40, 5, 62, 33, 48}, mn[8] = {0, 7, 63, 21, 50, 16, 1, 37};
  pack_k4(b.data() + 4, sc, mn);
  auto code = [](int e) { return (e * 13 + e / 32) % 16; };
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32;  // sub-block: low nibbles for even j, high for odd
    b[16 + (j / 2) * 32 + e % 32] |= code(e) << (4 * (j % 2));
  }
  const auto y = decode(DType::Q4_K, b, 256);
  for (int e = 0; e < 256; ++e) EXPECT_FLOAT_EQ(y[e], d * sc[e / 32] * code(e) - dmin * mn[e / 32]) << e;
}

TEST(Dequantize, Q5_K) {
  Bytes b(176, 0);  // d dmin scales[12] qh[32] qs[128]
  const float d = 0.25f, dmin = 0.5f;
  put16(b, 0, kQuarter);
  put16(b, 2, kHalf);
  const int sc[8] = {63, 2, 31, 16, 47, 8, 59, 24}, mn[8] = {3, 60, 12, 0, 44, 63, 28, 9};
  pack_k4(b.data() + 4, sc, mn);
  auto code = [](int e) { return (e * 7 + e / 16) % 32; };
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32;
    b[48 + (j / 2) * 32 + e % 32] |= (code(e) & 0xF) << (4 * (j % 2));
    if (code(e) & 16) b[16 + e % 32] |= 1 << j;  // fifth bit: qh[e % 32] bit j
  }
  const auto y = decode(DType::Q5_K, b, 256);
  for (int e = 0; e < 256; ++e) EXPECT_FLOAT_EQ(y[e], d * sc[e / 32] * code(e) - dmin * mn[e / 32]) << e;
}

TEST(Dequantize, Q6_K) {
  Bytes b(210, 0);  // ql[128] qh[64] scales[16] d
  const float d = 0.25f;
  put16(b, 208, kQuarter);
  for (int s = 0; s < 16; ++s) b[192 + s] = static_cast<uint8_t>(static_cast<int8_t>(s * 9 - 70));
  auto code = [](int e) { return (e * 29 + e / 64) % 64; };  // stored 6 bits; effective = code - 32
  for (int e = 0; e < 256; ++e) {
    const int n = e / 128, t = (e % 128) / 32, l = e % 32;
    b[64 * n + l + 32 * (t % 2)] |= (code(e) & 0xF) << (4 * (t / 2));
    b[128 + 32 * n + l] |= (code(e) >> 4) << (2 * t);
  }
  const auto y = decode(DType::Q6_K, b, 256);
  for (int e = 0; e < 256; ++e) EXPECT_FLOAT_EQ(y[e], d * (e / 16 * 9 - 70) * (code(e) - 32)) << e;
}

// MXFP4 (GGML type 39): an E8M0 scale byte, then 16 bytes of E2M1 codes (low
// nibbles values 0..15, high nibbles 16..31); value = e2m1(code) * 2^(e - 127).
// E2M1: sign bit 3, then 0, 0.5, 1, 1.5, 2, 3, 4, 6 (OCP MX spec v1.0).
TEST(Dequantize, MXFP4) {
  const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int e : {127, 120, 130, 1}) {  // 1: a subnormal float scale (2^-126)
    Bytes b(17, 0);
    b[0] = static_cast<uint8_t>(e);
    auto code = [](int i) { return (i * 5 + i / 16) % 16; };
    for (int i = 0; i < 32; ++i) b[1 + i % 16] |= static_cast<uint8_t>(code(i) << (i < 16 ? 0 : 4));
    const auto y = decode(DType::MXFP4, b, 32);
    for (int i = 0; i < 32; ++i) {
      const float mag = e2m1[code(i) & 7] * std::ldexp(1.0f, e - 127);
      EXPECT_EQ(y[i], code(i) & 8 ? -mag : mag) << "e " << e << " value " << i;
    }
  }
  EXPECT_EQ(dtype_name(DType::MXFP4), "mxfp4");
  EXPECT_EQ(dtype_row_bytes(DType::MXFP4, 64), 34);
  EXPECT_TRUE(dtype_known(39));
}

// The encoder (GGML's quantize_row_mxfp4_ref) on a hand-built block: the
// scale is 2^(floor(log2 amax) - 2) and each value its nearest code.
TEST(Quantize, MXFP4HandBuiltBlock) {
  std::vector<float> x(32);
  // amax 5.5 -> floor(log2 5.5) = 2 -> e = 127, scale 1: codes are the E2M1 values themselves.
  const float vals[32] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 5.5f, -0.5f, -1, -1.5f, -2, -3, -4, -5.4f, 0.2f,
                          0.3f, 0.74f, 0.76f, 1.24f, 2.4f, 2.6f, 3.4f, 3.6f, 4.9f, 5.1f, -0.26f, -0.24f, 1.25f, 0, 0, 0};
  std::copy(vals, vals + 32, x.begin());
  const int want[32] = {0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 0,
                        1, 1, 2, 2, 4, 5, 5, 6, 6, 7, 9, 0, 2, 0, 0, 0};
  // 5.5: |6 - 5.5| < |4 - 5.5|; 0.2 -> 0; -0.24 -> +0 (code 0 before -0); a tie (1.25) takes the first code.
  std::vector<uint8_t> q(17);
  ASSERT_TRUE(quantize_row(DType::MXFP4, x.data(), q.data(), 32));
  EXPECT_EQ(q[0], 127);
  for (int i = 0; i < 32; ++i) EXPECT_EQ((q[1 + i % 16] >> (i < 16 ? 0 : 4)) & 15, want[i]) << "value " << i;
  // A block 64x larger takes e + 6 and the same codes.
  for (float& v : x) v *= 64;
  std::vector<uint8_t> q64(17);
  ASSERT_TRUE(quantize_row(DType::MXFP4, x.data(), q64.data(), 32));
  EXPECT_EQ(q64[0], 133);
  EXPECT_TRUE(std::equal(q.begin() + 1, q.end(), q64.begin() + 1));
}

// ---- round trips -------------------------------------------------------------

struct RoundTripCase {
  DType type;
  double max_rel_rmse;  // RMS error over RMS of the data
};

class RoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(RoundTrip, ErrorWithinBound) {
  const auto [t, bound] = GetParam();
  const int64_t n = 4096;
  for (uint32_t seed : {1u, 2u, 3u}) {
    auto x = testing::random_floats(n, seed, 0.02f);
    if (seed == 3)  // outliers and a constant block, as real weights have
      for (int64_t i = 0; i < n; ++i) x[i] = i < 256 ? 0.5f : (i % 97 == 0 ? x[i] * 20 : x[i]);
    std::vector<uint8_t> q(static_cast<size_t>(dtype_row_bytes(t, n)));
    ASSERT_TRUE(quantize_row(t, x.data(), q.data(), n));
    std::vector<float> y(n);
    dequantize_row(t, q.data(), y.data(), n);
    double err = 0, ref = 0;
    for (int64_t i = 0; i < n; ++i) err += (x[i] - y[i]) * double(x[i] - y[i]), ref += double(x[i]) * x[i];
    const double rel = std::sqrt(err / ref);
    EXPECT_LT(rel, bound) << dtype_name(t) << " seed " << seed;
  }
  // Zeros stay zeros.
  std::vector<float> zeros(n, 0.0f), y(n, 1.0f);
  std::vector<uint8_t> q(static_cast<size_t>(dtype_row_bytes(t, n)));
  ASSERT_TRUE(quantize_row(t, zeros.data(), q.data(), n));
  dequantize_row(t, q.data(), y.data(), n);
  for (float v : y) ASSERT_EQ(v, 0.0f) << dtype_name(t);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, RoundTrip,
                         // Bounds about 20 % above what these quantizers reach on Gaussian data.
                         ::testing::Values(RoundTripCase{DType::F32, 1e-12}, RoundTripCase{DType::F16, 3e-4},
                                           RoundTripCase{DType::BF16, 2.5e-3}, RoundTripCase{DType::Q8_0, 0.0065},
                                           RoundTripCase{DType::Q8_1, 0.0065}, RoundTripCase{DType::Q8_K, 0.0095},
                                           RoundTripCase{DType::Q6_K, 0.023}, RoundTripCase{DType::Q5_0, 0.052},
                                           RoundTripCase{DType::Q5_1, 0.046}, RoundTripCase{DType::Q5_K, 0.044},
                                           RoundTripCase{DType::Q4_0, 0.105}, RoundTripCase{DType::Q4_1, 0.095},
                                           RoundTripCase{DType::Q4_K, 0.09}, RoundTripCase{DType::Q3_K, 0.19},
                                           RoundTripCase{DType::Q2_K, 0.34}, RoundTripCase{DType::MXFP4, 0.2}),
                         [](const auto& info) { return std::string(dtype_name(info.param.type)); });

TEST(Quantize, Q8_1StoresScaledSum) {
  const auto x = testing::random_floats(64, 9);
  std::vector<uint8_t> q(72);
  ASSERT_TRUE(quantize_row(DType::Q8_1, x.data(), q.data(), 64));
  for (int b = 0; b < 2; ++b) {
    uint16_t d, s;
    std::memcpy(&d, &q[36 * b], 2);
    std::memcpy(&s, &q[36 * b + 2], 2);
    int sum = 0;
    for (int j = 0; j < 32; ++j) sum += static_cast<int8_t>(q[36 * b + 4 + j]);
    EXPECT_NEAR(fp16_to_f32(s), sum * fp16_to_f32(d), std::fabs(sum * fp16_to_f32(d)) * 2e-3 + 1e-6);
  }
}

TEST(Quantize, Q8_KBlockSums) {
  const auto x = testing::random_floats(256, 4);
  std::vector<uint8_t> q(292);
  ASSERT_TRUE(quantize_row(DType::Q8_K, x.data(), q.data(), 256));
  for (int g = 0; g < 16; ++g) {
    int sum = 0;
    for (int j = 0; j < 16; ++j) sum += static_cast<int8_t>(q[4 + g * 16 + j]);
    int16_t stored;
    std::memcpy(&stored, &q[260 + 2 * g], 2);
    EXPECT_EQ(stored, sum);
  }
}

TEST(Quantize, RejectsPartialBlocks) {
  float x[40] = {};
  uint8_t q[64];
  EXPECT_FALSE(quantize_row(DType::Q4_0, x, q, 40));
}


// The AVX2 activation quantizers (used by matmul at the avx2 and avx512
// levels) write exactly the scalar quantizers' bytes: random blocks over many
// magnitudes, exact halves (k + 0.5 after scaling), zeros, a lone extreme of
// either sign, repeated extremes of opposite signs, tiny values. (A block
// whose 1/d overflows, e.g. subnormal inputs, is undefined in the scalar
// quantizer: roundf(inf) cast to int8.)
TEST(Quants, SimdActivationQuantizersMatchScalar) {
  if (cpu::detected_simd() < cpu::Simd::avx2) GTEST_SKIP() << "no AVX2";
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-40, 40), k(-127, 127), kind(0, 6);
  const int64_t n = 256;
  std::vector<float> x(n);
  std::vector<cpu::ActQ8_0> a0(n / 32), b0(n / 32);
  std::vector<cpu::BlockQ8_K> ak(1), bk(1);
  for (int iter = 0; iter < 20000; ++iter) {
    const float scale = std::ldexp(1.0f, e(rng));
    const int mode = kind(rng);
    for (int64_t i = 0; i < n; ++i) {
      switch (mode) {
        case 0: x[i] = u(rng) * scale; break;
        case 1: x[i] = (static_cast<float>(k(rng)) + 0.5f) / 127.0f * scale; break;  // halves
        case 2: x[i] = static_cast<float>(k(rng)) * scale; break;                    // integers
        case 3: x[i] = i % 5 == 0 ? 0.0f : u(rng) * scale; break;
        case 4: x[i] = u(rng) * 1e-30f; break;                                         // tiny (1/d stays finite)
        case 5: x[i] = (i % 3 == 0 ? -1.0f : 1.0f) * scale; break;                     // tied extremes
        default: x[i] = 0.0f; break;
      }
    }
    if (mode == 0 && iter % 2) x[static_cast<size_t>(iter % n)] = -2 * scale;  // a lone negative extreme
    std::memset(a0.data(), 0, a0.size() * sizeof(cpu::ActQ8_0));
    std::memset(b0.data(), 0, b0.size() * sizeof(cpu::ActQ8_0));
    std::memset(ak.data(), 0, sizeof(cpu::BlockQ8_K));
    std::memset(bk.data(), 0, sizeof(cpu::BlockQ8_K));
    for (int group : {1, cpu::kActGroupQ8_0, 3}) {
      cpu::quantize_act_q8_0(x.data(), a0.data(), n, group);
      cpu::avx2::quantize_act_q8_0(x.data(), b0.data(), n, group);
      ASSERT_EQ(0, std::memcmp(a0.data(), b0.data(), a0.size() * sizeof(cpu::ActQ8_0))) << "q8_0 iter " << iter << " group " << group;
    }
    cpu::quantize_act_q8_K(x.data(), ak.data(), n);
    cpu::avx2::quantize_act_q8_K(x.data(), bk.data(), n);
    ASSERT_EQ(0, std::memcmp(ak.data(), bk.data(), sizeof(cpu::BlockQ8_K))) << "q8_K iter " << iter;
  }
}

}  // namespace
}  // namespace atelier::kernels

// ---- MXFP8 (DType::MXFP8: the fp8 KV cache), against a decoder written
// from the format's definition here (not e4m3_to_f32 / dequantize_row).
namespace atelier::kernels {
namespace {

// OCP E4M3: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
// subnormal (m / 8 * 2^-6); 0x7f / 0xff are NaN.
double e4m3_by_hand(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return NAN;
  const double mag = e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1 + m / 8.0) * std::pow(2.0, e - 7);
  return s ? -mag : mag;
}
std::vector<double> mxfp8_by_hand(const uint8_t* b, int64_t n) {
  std::vector<double> out;
  for (int64_t i = 0; i < n / 32; ++i, b += 33)
    for (int j = 0; j < 32; ++j) out.push_back(e4m3_by_hand(b[1 + j]) * std::pow(2.0, b[0] - 127));
  return out;
}
Bytes mxfp8(const std::vector<float>& x) {
  Bytes b(static_cast<size_t>(dtype_row_bytes(DType::MXFP8, static_cast<int64_t>(x.size()))));
  EXPECT_TRUE(quantize_row(DType::MXFP8, x.data(), b.data(), static_cast<int64_t>(x.size())));
  return b;
}

TEST(Mxfp8, BlocksOf32InThirtyThreeBytesADeviceOnlyType) {
  EXPECT_EQ(dtype_name(DType::MXFP8), "mxfp8");
  EXPECT_EQ(dtype_block_elems(DType::MXFP8), 32);
  EXPECT_EQ(dtype_row_bytes(DType::MXFP8, 128), 4 * 33);
  EXPECT_EQ(dtype_row_bytes(DType::MXFP8, 48), -1);
  EXPECT_FALSE(dtype_known(static_cast<uint32_t>(DType::MXFP8)));  // never read from a file
}

// Random blocks over 12 decades (K rows of some models reach the
// thousands): each value within half an E4M3 step of itself (2^-4
// relative for normals, half the subnormal step 2^-10 of the scale below),
// the block's largest never clipped, and dequantize_row is the hand decoder.
TEST(Mxfp8, RoundTripsWithinHalfAStepAndNeverClipsTheLargest) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int decade = -6; decade <= 6; ++decade) {
    std::vector<float> x(256);
    for (float& v : x) v = u(rng) * std::pow(10.0f, static_cast<float>(decade));
    x[7] = std::pow(10.0f, static_cast<float>(decade)) * 3.7f;  // an outlier in block 0
    const Bytes b = mxfp8(x);
    const auto want = mxfp8_by_hand(b.data(), 256);
    std::vector<float> got(256);
    dequantize_row(DType::MXFP8, b.data(), got.data(), 256);
    for (int i = 0; i < 256; ++i) {
      ASSERT_EQ(static_cast<double>(got[static_cast<size_t>(i)]), want[static_cast<size_t>(i)]) << i;
      const double scale = std::pow(2.0, b[static_cast<size_t>(i / 32 * 33)] - 127);
      const double err = std::fabs(want[static_cast<size_t>(i)] - x[static_cast<size_t>(i)]);
      EXPECT_LE(err, std::max(std::fabs(x[static_cast<size_t>(i)]) * 0x1p-4, 0x1p-10 * scale))
          << "decade " << decade << " value " << i << " " << x[static_cast<size_t>(i)];
    }
    for (int blk = 0; blk < 8; ++blk) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[static_cast<size_t>(blk * 32 + j)]));
      const double scale = std::pow(2.0, b[static_cast<size_t>(blk * 33)] - 127);
      EXPECT_LE(amax, 448 * scale) << "block " << blk << ": the largest value clipped";
      EXPECT_GT(amax, 224 * scale) << "block " << blk << ": the scale is not the smallest that holds it";
    }
  }
}

// By hand: scale 2^0 holds 448 exactly; 449 needs 2^1. Ties go to the even
// code; infinities saturate to +-448 units, NaN stays NaN; a zero block is
// 33 zero bytes; a negated block is the same scale with the signs flipped.
TEST(Mxfp8, HandBlocksScaleTiesSaturationZerosAndSigns) {
  std::vector<float> x(32, 0.0f);
  x[0] = 448.0f, x[1] = 1.0f, x[2] = 1.0625f, x[3] = 1.1875f, x[4] = -2.0f, x[5] = 0.001953125f;  // 2^-9: subnormal
  Bytes b = mxfp8(x);
  EXPECT_EQ(b[0], 127);
  EXPECT_EQ(b[1], 0x7e);         // 448
  EXPECT_EQ(b[2], 0x38);         // 1.0
  EXPECT_EQ(b[3], 0x38);         // 1.0625: halfway between 1 (0x38) and 1.125 (0x39): even
  EXPECT_EQ(b[4], 0x3a);         // 1.1875: halfway between 1.125 (0x39) and 1.25 (0x3a): even
  EXPECT_EQ(b[5], 0x80 | 0x40);  // -2
  EXPECT_EQ(b[6], 0x01);         // the smallest subnormal
  x[0] = 449.0f;
  b = mxfp8(x);
  EXPECT_EQ(b[0], 128);
  EXPECT_EQ(b[2], 0x30);  // 1.0 / 2 = 0.5
  std::vector<float> neg(32);
  for (int i = 0; i < 32; ++i) neg[static_cast<size_t>(i)] = -x[static_cast<size_t>(i)];
  const Bytes nb = mxfp8(neg);
  EXPECT_EQ(nb[0], b[0]);
  for (int i = 1; i < 33; ++i)
    if (x[static_cast<size_t>(i - 1)] != 0.0f) {
      EXPECT_EQ(nb[static_cast<size_t>(i)], b[static_cast<size_t>(i)] ^ 0x80) << i;
    }
  std::vector<float> sat(32, 0.5f);
  sat[3] = INFINITY, sat[4] = -INFINITY, sat[5] = NAN, sat[6] = 3.0f;
  const Bytes sb = mxfp8(sat);
  const auto d = mxfp8_by_hand(sb.data(), 32);
  const double scale = std::pow(2.0, sb[0] - 127);
  EXPECT_EQ(sb[0], 127 - 7);  // from the finite values: 3 <= 448 * 2^-7
  EXPECT_EQ(d[3], 448 * scale);
  EXPECT_EQ(d[4], -448 * scale);
  EXPECT_TRUE(std::isnan(d[5]));
  EXPECT_EQ(d[6], 3.0);
  EXPECT_EQ(mxfp8(std::vector<float>(64, 0.0f)), Bytes(66, 0));
  // Tiny values (below the E8M0 range's 2^-127 * 448) keep the smallest scale.
  const Bytes tb = mxfp8(std::vector<float>(32, 1e-40f));
  EXPECT_EQ(tb[0], 0);
  // The scale byte on its own.
  EXPECT_EQ(mxfp8_scale_byte(448.0f), 127);
  EXPECT_EQ(mxfp8_scale_byte(448.5f), 128);
  EXPECT_EQ(mxfp8_scale_byte(0.0f), 0);
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
}

}  // namespace
}  // namespace atelier::kernels
