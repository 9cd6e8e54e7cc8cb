#include "image/rng.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace atelier::image {

namespace {

// ---------------------------------------------------------------- Philox ---

struct U4 {
  uint32_t x, y, z, w;
};

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

inline U4 philox_round(U4 c, uint32_t k0, uint32_t k1) {
  const uint64_t p0 = uint64_t(kPhiloxM0) * c.x;
  const uint64_t p1 = uint64_t(kPhiloxM1) * c.z;
  const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
  const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
  return {hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
}

// curand_Philox4x32_10: ten rounds, the key bumped between them.
inline U4 philox4x32_10(U4 c, uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 9; ++r) {
    c = philox_round(c, k0, k1);
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return philox_round(c, k0, k1);
}

// cuRAND's _curand_box_muller (float): u, v in float as the device computes
// them (nvcc contracts x * C + C/2 into one fma); log/sincos here are
// correctly rounded, the GPU's __sincosf differs by ~1e-6.
constexpr float kTwoPow32Inv = 2.3283064e-10f;
constexpr float kTwoPow32Inv2Pi = 2.3283064e-10f * 6.2831855f;

inline void curand_box_muller(uint32_t a, uint32_t b, float* out_sin, float* out_cos) {
  const float u = std::fmaf(static_cast<float>(a), kTwoPow32Inv, kTwoPow32Inv / 2.0f);
  const float v = std::fmaf(static_cast<float>(b), kTwoPow32Inv2Pi, kTwoPow32Inv2Pi / 2.0f);
  const float s = std::sqrt(-2.0f * static_cast<float>(std::log(static_cast<double>(u))));
  *out_sin = static_cast<float>(std::sin(static_cast<double>(v))) * s;
  *out_cos = static_cast<float>(std::cos(static_cast<double>(v))) * s;
}

// --------------------------------------------- float ops, never fused -----
// The AVX2 kernel does separate _mm256_mul_ps / _mm256_add_ps; a compiler
// allowed to contract (e.g. -march=native with FMA) must not fuse them here.

inline float fmul(float a, float b) {
  volatile float r = a * b;
  return r;
}
inline float fadd(float a, float b) {
  volatile float r = a + b;
  return r;
}
inline float fsub(float a, float b) {
  volatile float r = a - b;
  return r;
}
inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// avx_mathfun.h log256_ps (Cephes logf), one lane. Arguments are in (0, 1].
float cephes_logf(float x) {
  x = std::max(x, from_bits(0x00800000u));  // min_norm_pos
  int32_t imm0 = int32_t(bits(x) >> 23);
  x = from_bits((bits(x) & ~0x7f800000u) | bits(0.5f));
  imm0 -= 0x7f;
  float e = static_cast<float>(imm0);
  e = fadd(e, 1.0f);
  const bool mask = x < 0.707106781186547524f;
  const float tmp0 = mask ? x : 0.0f;
  x = fsub(x, 1.0f);
  e = fsub(e, mask ? 1.0f : 0.0f);
  x = fadd(x, tmp0);
  const float z = fmul(x, x);
  float y = 7.0376836292E-2f;
  y = fadd(fmul(y, x), -1.1514610310E-1f);
  y = fadd(fmul(y, x), 1.1676998740E-1f);
  y = fadd(fmul(y, x), -1.2420140846E-1f);
  y = fadd(fmul(y, x), +1.4249322787E-1f);
  y = fadd(fmul(y, x), -1.6668057665E-1f);
  y = fadd(fmul(y, x), +2.0000714765E-1f);
  y = fadd(fmul(y, x), -2.4999993993E-1f);
  y = fadd(fmul(y, x), +3.3333331174E-1f);
  y = fmul(y, x);
  y = fmul(y, z);
  y = fadd(y, fmul(e, -2.12194440e-4f));
  y = fsub(y, fmul(z, 0.5f));
  x = fadd(x, y);
  x = fadd(x, fmul(e, 0.693359375f));
  return x;
}

// avx_mathfun.h sincos256_ps (Cephes sinf/cosf), one lane.
void cephes_sincosf(float x, float* s, float* c) {
  uint32_t sign_bit_sin = bits(x) & 0x80000000u;
  x = from_bits(bits(x) & 0x7fffffffu);
  float y = fmul(x, 1.27323954473516f);  // 4/pi
  int32_t imm2 = static_cast<int32_t>(y);  // cvttps: truncation
  imm2 = (imm2 + 1) & ~1;
  y = static_cast<float>(imm2);
  int32_t imm4 = imm2;
  const uint32_t swap_sign_bit_sin = (uint32_t(imm2) & 4u) << 29;
  const bool poly_mask = (imm2 & 2) == 0;
  x = fadd(x, fmul(y, -0.78515625f));
  x = fadd(x, fmul(y, -2.4187564849853515625e-4f));
  x = fadd(x, fmul(y, -3.77489497744594108e-8f));
  imm4 -= 2;
  const uint32_t sign_bit_cos = (~uint32_t(imm4) & 4u) << 29;
  sign_bit_sin ^= swap_sign_bit_sin;
  const float z = fmul(x, x);
  float yc = 2.443315711809948E-005f;
  yc = fadd(fmul(yc, z), -1.388731625493765E-003f);
  yc = fadd(fmul(yc, z), 4.166664568298827E-002f);
  yc = fmul(yc, z);
  yc = fmul(yc, z);
  yc = fsub(yc, fmul(z, 0.5f));
  yc = fadd(yc, 1.0f);
  float ys = -1.9515295891E-4f;
  ys = fadd(fmul(ys, z), 8.3321608736E-3f);
  ys = fadd(fmul(ys, z), -1.6666654611E-1f);
  ys = fmul(ys, z);
  ys = fmul(ys, x);
  ys = fadd(ys, x);
  // and/andnot selection followed by the kernel's adds of +0
  const float ysin2 = poly_mask ? ys : 0.0f;
  const float ysin1 = poly_mask ? 0.0f : yc;
  const float y2 = fsub(ys, ysin2);
  const float y1 = fsub(yc, ysin1);
  *s = from_bits(bits(fadd(ysin1, ysin2)) ^ sign_bit_sin);
  *c = from_bits(bits(fadd(y1, y2)) ^ sign_bit_cos);
}

// normal_fill_16_AVX2 with mean 0, std 1 (the final fmadd(n, 1, 0) is exact).
void normal_fill_16_avx2(float* data) {
  const float two_pi = static_cast<float>(2.0 * 3.14159265358979323846);
  for (int j = 0; j < 8; ++j) {
    const float u1 = fsub(1.0f, data[j]);
    const float u2 = data[j + 8];
    const float radius = std::sqrt(fmul(-2.0f, cephes_logf(u1)));
    const float theta = fmul(two_pi, u2);
    float st, ct;
    cephes_sincosf(theta, &st, &ct);
    data[j] = fadd(fmul(radius, ct), 0.0f);
    data[j + 8] = fadd(fmul(radius, st), 0.0f);
  }
}

// The generic normal_fill_16<float>, with correctly rounded logf/cosf/sinf.
void normal_fill_16_scalar(float* data) {
  for (int j = 0; j < 8; ++j) {
    const float u1 = fsub(1.0f, data[j]);
    const float u2 = data[j + 8];
    const float lg = static_cast<float>(std::log(static_cast<double>(u1)));
    const float radius = std::sqrt(fmul(-2.0f, lg));
    // 2.0f * c10::pi<double> * u2 is computed in double, then stored as float.
    const float theta = static_cast<float>(2.0 * 3.14159265358979323846 * static_cast<double>(u2));
    const float ct = static_cast<float>(std::cos(static_cast<double>(theta)));
    const float st = static_cast<float>(std::sin(static_cast<double>(theta)));
    data[j] = fadd(fmul(fmul(radius, ct), 1.0f), 0.0f);
    data[j + 8] = fadd(fmul(fmul(radius, st), 1.0f), 0.0f);
  }
}

}  // namespace

TorchRandn::TorchRandn(RngKind kind, uint64_t seed) : TorchRandn(kind, seed, CudaGrid{}) {}

TorchRandn::TorchRandn(RngKind kind, uint64_t seed, CudaGrid grid, CpuKernel cpu_kernel)
    : kind_(kind), seed_(seed), grid_(grid), cpu_kernel_(cpu_kernel) {
  // at::mt19937(seed): init_with_uint32 on the low 32 bits.
  mt_[0] = static_cast<uint32_t>(seed);
  for (uint32_t j = 1; j < 624; ++j)
    mt_[j] = 1812433253u * (mt_[j - 1] ^ (mt_[j - 1] >> 30)) + j;
  mt_index_ = 624;
}

std::vector<float> TorchRandn::randn(int64_t numel) {
  if (numel < 0) throw std::invalid_argument("randn: negative numel");
  if (numel == 0) return {};
  return kind_ == RngKind::Cuda ? randn_cuda(numel) : randn_cpu(numel);
}

// ------------------------------------------------------------------ CUDA ---

std::vector<float> TorchRandn::randn_cuda(int64_t numel) {
  // ATen distribution_nullary_kernel / calc_execution_policy.
  constexpr uint64_t kBlock = 256;
  constexpr uint64_t kUnroll = 4;  // one float4 per curand_normal4
  const uint64_t n = static_cast<uint64_t>(numel);
  uint64_t blocks = (n + kBlock - 1) / kBlock;
  if (grid_.sm_count > 0) {
    const uint64_t per_sm = static_cast<uint64_t>(std::max(grid_.max_threads_per_sm, 0)) / kBlock;
    blocks = std::min(blocks, std::max<uint64_t>(1, uint64_t(grid_.sm_count) * per_sm));
  }
  const uint64_t threads = blocks * kBlock;
  const uint64_t stride = threads * kUnroll;
  const uint64_t draws_per_thread = (n - 1) / stride + 1;

  std::vector<float> out(n);
  const uint32_t k0 = static_cast<uint32_t>(seed_), k1 = static_cast<uint32_t>(seed_ >> 32);
  const uint64_t base = philox_offset_ / 4;  // curand_init skipahead(offset)
  for (uint64_t idx = 0; idx < threads && idx < n; ++idx) {
    for (uint64_t d = 0; d < draws_per_thread; ++d) {
      const uint64_t first = idx + d * stride;
      if (first >= n) break;
      const uint64_t ctr = base + d;
      const U4 r = philox4x32_10({uint32_t(ctr), uint32_t(ctr >> 32), uint32_t(idx), uint32_t(idx >> 32)}, k0, k1);
      float v[4];
      curand_box_muller(r.x, r.y, &v[0], &v[1]);
      curand_box_muller(r.z, r.w, &v[2], &v[3]);
      for (uint64_t ii = 0; ii < kUnroll; ++ii) {
        const uint64_t li = first + ii * threads;
        if (li < n) out[li] = v[ii];
      }
    }
  }
  // The generator's offset advances by 4 per curand4 draw of a thread.
  philox_offset_ += draws_per_thread * 4;
  return out;
}

// ------------------------------------------------------------------- CPU ---

uint32_t TorchRandn::random_u32() {
  if (mt_index_ >= 624) {
    for (int i = 0; i < 624; ++i) {
      const uint32_t y = (mt_[i] & 0x80000000u) | (mt_[(i + 1) % 624] & 0x7fffffffu);
      mt_[i] = mt_[(i + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    mt_index_ = 0;
  }
  uint32_t y = mt_[mt_index_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint64_t TorchRandn::random_u64() {
  const uint64_t hi = random_u32();
  const uint64_t lo = random_u32();
  return (hi << 32) | lo;
}

double TorchRandn::uniform_double() {
  return static_cast<double>(random_u64() & ((uint64_t(1) << 53) - 1)) * (1.0 / double(uint64_t(1) << 53));
}

std::vector<float> TorchRandn::randn_cpu(int64_t numel) {
  const size_t n = static_cast<size_t>(numel);
  std::vector<float> out(n);
  if (numel < 16) {
    // cpu_serial_kernel with at::normal_distribution<double>: Box-Muller in
    // double, the sin half cached on the generator for the next sample.
    for (size_t i = 0; i < n; ++i) {
      double ret;
      if (has_next_double_normal_) {
        has_next_double_normal_ = false;
        ret = next_double_normal_;
      } else {
        const double u1 = uniform_double();
        const double u2 = uniform_double();
        const double r = std::sqrt(-2.0 * std::log1p(-u2));
        const double theta = 2.0 * 3.14159265358979323846 * u1;
        next_double_normal_ = r * std::sin(theta);
        has_next_double_normal_ = true;
        ret = r * std::cos(theta);
      }
      out[i] = static_cast<float>(ret);
    }
    return out;
  }
  auto uniform_float = [this] {
    return static_cast<float>(random_u32() & 0xFFFFFFu) * (1.0f / 16777216.0f);
  };
  auto fill16 = cpu_kernel_ == CpuKernel::Avx2 ? normal_fill_16_avx2 : normal_fill_16_scalar;
  for (size_t i = 0; i < n; ++i) out[i] = uniform_float();
  for (size_t i = 0; i + 16 <= n; i += 16) fill16(out.data() + i);
  if (n % 16 != 0) {
    float* tail = out.data() + n - 16;
    for (int i = 0; i < 16; ++i) tail[i] = uniform_float();
    fill16(tail);
  }
  return out;
}

}  // namespace atelier::image
