// The K-quant encoders' error searches (kernels/cpu/quants.cpp) on real
// weights (every tensor of stories260K.gguf, its values taken 256 at a time)
// and on Gaussian rows: the decoded error is no worse than a plain min/max
// fit of each sub-block (what the encoders did before the search, here even
// with unquantized sub-block scales), and within a stated margin of a
// brute-force search over a fine grid of sub-block scales (and mins).
#include <gtest/gtest.h>

#include <atelier/kernels.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "formats/gguf.h"

using namespace atelier;
using kernels::DType;

namespace {

struct Format {
  DType type;
  int sub;        // values per sub-block
  int nmax;       // asymmetric: codes 0..nmax; symmetric: codes -nmax..nmax-1
  bool with_min;  // x ~ s * L + m (m <= 0) rather than x ~ s * L
};

const Format kFormats[] = {
    {DType::Q2_K, 16, 3, true}, {DType::Q3_K, 16, 4, false}, {DType::Q4_K, 32, 15, true},
    {DType::Q5_K, 32, 31, true}, {DType::Q6_K, 16, 32, false},
};

int nearest(float v) { return static_cast<int>(std::lrint(v)); }

// Squared error of one sub-block under scale s and min m, codes rounded to nearest.
double sub_error(const float* x, const Format& f, double s, double m) {
  double e = 0;
  for (int i = 0; i < f.sub; ++i) {
    int l = 0;
    if (s != 0) l = f.with_min ? std::clamp(nearest(float((x[i] - m) / s)), 0, f.nmax)
                               : std::clamp(nearest(float(x[i] / s)), -f.nmax, f.nmax - 1);
    const double d = s * l + m - x[i];
    e += d * d;
  }
  return e;
}

// The plain fit: min/max of the sub-block (the signed extreme at -nmax for the symmetric types).
double simple_error(const float* x, const Format& f) {
  float mn = x[0], mx = x[0], amax = 0, smax = 0;
  for (int i = 0; i < f.sub; ++i) {
    mn = std::min(mn, x[i]), mx = std::max(mx, x[i]);
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), smax = x[i];
  }
  if (f.with_min) {
    mn = std::min(mn, 0.0f);
    return sub_error(x, f, mx > mn ? (mx - mn) / f.nmax : 0.0, mn);
  }
  return sub_error(x, f, amax > 0 ? smax / -f.nmax : 0.0, 0);
}

// Brute force: 401 scales from 0.5x to 1.5x of the min/max scale (both signs
// for the symmetric types); with a min, 41 mins around the sub-block minimum
// (each clamped to <= 0) for every scale.
double brute_error(const float* x, const Format& f) {
  float mn = x[0], mx = x[0], amax = 0;
  for (int i = 0; i < f.sub; ++i) mn = std::min(mn, x[i]), mx = std::max(mx, x[i]), amax = std::max(amax, std::fabs(x[i]));
  double best = simple_error(x, f);
  if (amax == 0) return best;
  for (int k = 0; k <= 400; ++k) {
    const double g = 0.5 + k / 400.0;
    if (f.with_min) {
      const double m0 = std::min(mn, 0.0f), s = (mx - m0) / f.nmax * g;
      for (int j = -20; j <= 20; ++j) best = std::min(best, sub_error(x, f, s, std::min(0.0, m0 + s * j / 20.0)));
    } else {
      const double s = amax / f.nmax * g;
      best = std::min({best, sub_error(x, f, s, 0), sub_error(x, f, -s, 0)});
    }
  }
  return best;
}

struct Errors {
  double ours = 0, simple = 0, brute = 0;
};

// Over whole super-blocks of DATA (256 values each); the brute force on the
// first max_brute_blocks only (and ours and simple on the same ones for the ratio).
Errors measure(const std::vector<float>& data, const Format& f, Errors* brute_part, int max_brute_blocks) {
  Errors e;
  const int64_t nb = static_cast<int64_t>(data.size()) / 256;
  std::vector<uint8_t> q(static_cast<size_t>(kernels::dtype_row_bytes(f.type, 256)));
  std::vector<float> back(256);
  for (int64_t b = 0; b < nb; ++b) {
    const float* x = data.data() + b * 256;
    EXPECT_TRUE(kernels::quantize_row(f.type, x, q.data(), 256));
    kernels::dequantize_row(f.type, q.data(), back.data(), 256);
    double ours = 0, simple = 0;
    for (int i = 0; i < 256; ++i) ours += double(back[i] - x[i]) * (back[i] - x[i]);
    for (int j = 0; j < 256; j += f.sub) simple += simple_error(x + j, f);
    e.ours += ours, e.simple += simple;
    if (b < max_brute_blocks) {
      brute_part->ours += ours, brute_part->simple += simple;
      for (int j = 0; j < 256; j += f.sub) brute_part->brute += brute_error(x + j, f);
    }
  }
  return e;
}

std::vector<float> stories_weights() {
  auto f = formats::GgufFile::open(std::string(ATELIER_FIXTURES_DIR) + "/text/stories260K.gguf");
  std::vector<float> all;
  for (const auto& t : f->tensors()) {
    if (t.shape.size() != 2 || t.type != DType::F32) continue;
    const auto* p = reinterpret_cast<const float*>(t.data);
    all.insert(all.end(), p, p + t.elements() / 256 * 256);
  }
  return all;
}

std::vector<float> gaussian(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 0.02f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = g(rng);
  return v;
}

// Our RMSE may exceed the brute force's by this fraction: the brute force
// keeps each sub-block's scale (and min) exact, while the format stores them
// in 4 (Q2_K), 6 or 8 (Q6_K) bits against one fp16 super-block scale; and
// GGML's fits weigh large values more (|x| for Q2_K, x^2 for Q3_K/Q6_K).
// Measured (stories260K / Gaussian): Q2_K 1.108 / 1.064, Q3_K 1.005 / 1.028,
// Q4_K 1.026 / 1.026, Q5_K 1.059 / 1.066, Q6_K 1.086 / 1.091.
double margin(DType t) {
  switch (t) {
    case DType::Q2_K: return 0.14;
    case DType::Q3_K: return 0.05;
    case DType::Q4_K: return 0.05;
    case DType::Q5_K: return 0.09;
    default: return 0.12;
  }
}

void check(const std::vector<float>& data, const char* what) {
  for (const Format& f : kFormats) {
    Errors part;
    const Errors all = measure(data, f, &part, 48);
    const double n = static_cast<double>(data.size() / 256 * 256);
    const std::string name(kernels::dtype_name(f.type));
    SCOPED_TRACE(std::string(what) + " " + name);
    std::printf("%-10s %-5s rmse ours %.6g  simple %.6g (%.1f%% better)  | first blocks: ours %.6g brute %.6g (ratio %.4f)\n",
                what, name.c_str(), std::sqrt(all.ours / n), std::sqrt(all.simple / n), 100 * (1 - std::sqrt(all.ours / all.simple)),
                std::sqrt(part.ours), std::sqrt(part.brute), std::sqrt(part.ours / part.brute));
    EXPECT_LT(all.ours, all.simple) << "the search must beat the plain min/max fit";
    EXPECT_LE(std::sqrt(part.ours / part.brute), 1 + margin(f.type)) << "too far from the brute-force search";
  }
}

}  // namespace

// Not under ASan: the encoders live in kernels/, which the ASan build leaves
// uninstrumented, so it would check only this file's brute force (80 s each at -O0).
constexpr const char* kNotUnderAsan = "kernels/ is not instrumented under ASan; the plain build runs this";

TEST(QuantSearch, RealWeightsBeatTheSimpleFitAndNearBruteForce) {
  if (ATELIER_UNDER_ASAN) GTEST_SKIP() << kNotUnderAsan;
  check(stories_weights(), "stories260K");
}

TEST(QuantSearch, GaussianRowsBeatTheSimpleFitAndNearBruteForce) {
  if (ATELIER_UNDER_ASAN) GTEST_SKIP() << kNotUnderAsan;
  check(gaussian(256 * 256, 7), "gaussian");
}

namespace {

// GGML's Q4_K encoder (ggml-quants.c quantize_row_q4_K_ref, no importance
// matrix), written plainly here from its published algorithm: what
// llama-quantize writes. Ours chooses among this encoding and its neighbours
// by decoded error, so no block may decode worse than this one does. (A
// search that takes the first improving candidate instead of the best one
// breaks this on most blocks while staying inside the brute-force margin.)
float ggml_make_qkx2_quants(int n, int nmax, const float* x, const float* w, uint8_t* L, float* the_min, float rmin,
                            float rdelta, int nstep) {
  float mn = x[0], mx = x[0], sum_w = w[0], sum_x = w[0] * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < mn) mn = x[i];
    if (x[i] > mx) mx = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (mn > 0) mn = 0;
  if (mx == mn) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -mn;
    return 0.f;
  }
  float iscale = nmax / (mx - mn), scale = 1 / iscale, best_error = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(std::clamp(nearest(iscale * (x[i] - mn)), 0, nmax));
    const float diff = scale * L[i] + mn - x[i];
    best_error += w[i] * diff * diff;
  }
  uint8_t aux[32];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (mx - mn);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest(iscale * (x[i] - mn)), 0, nmax);
      aux[i] = static_cast<uint8_t>(l);
      sum_l += w[i] * l, sum_l2 += w[i] * l * l, sum_xl += w[i] * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D, this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) this_min = 0, this_scale = sum_xl / sum_l2;
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * aux[i] + this_min - x[i];
        cur_error += w[i] * diff * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = aux[i];
        best_error = cur_error, scale = this_scale, mn = this_min;
      }
    }
  }
  *the_min = -mn;
  return scale;
}

// One 256-value block in GGML's Q4_K layout: fp16 d, fp16 dmin, 12 bytes of
// 6-bit (scale, min) pairs, 128 bytes of 4-bit codes.
std::vector<uint8_t> ggml_q4_K_block(const float* x) {
  float scales[8], mins[8], w[32], max_scale = 0, max_min = 0;
  uint8_t L[256];
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) w[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = ggml_make_qkx2_quants(32, 15, x + 32 * j, w, L + 32 * j, &mins[j], -1.f, 0.1f, 20);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  std::vector<uint8_t> out(144, 0);
  uint8_t* sc = out.data() + 4;
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f, inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = static_cast<uint8_t>(std::min(63, nearest(inv_scale * scales[j])));
    lm[j] = static_cast<uint8_t>(std::min(63, nearest(inv_min * mins[j])));
    if (j < 4) {
      sc[j] = ls[j], sc[j + 4] = lm[j];
    } else {
      sc[j + 4] = static_cast<uint8_t>((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
      sc[j - 4] |= static_cast<uint8_t>((ls[j] >> 4) << 6);
      sc[j] |= static_cast<uint8_t>((lm[j] >> 4) << 6);
    }
  }
  const uint16_t d = kernels::f32_to_fp16(max_scale / 63.f), dmin = kernels::f32_to_fp16(max_min / 63.f);
  std::memcpy(out.data(), &d, 2);
  std::memcpy(out.data() + 2, &dmin, 2);
  for (int j = 0; j < 8; ++j) {
    const float dj = kernels::fp16_to_f32(d) * ls[j];
    if (!dj) continue;
    const float dm = kernels::fp16_to_f32(dmin) * lm[j];
    for (int i = 0; i < 32; ++i) L[32 * j + i] = static_cast<uint8_t>(std::clamp(nearest((x[32 * j + i] + dm) / dj), 0, 15));
  }
  uint8_t* q = out.data() + 16;
  for (int j = 0; j < 256; j += 64, q += 32)
    for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
  return out;
}

double block_error(const float* x, const uint8_t* q) {
  float back[256];
  kernels::dequantize_row(DType::Q4_K, q, back, 256);
  double e = 0;
  for (int i = 0; i < 256; ++i) e += double(back[i] - x[i]) * (back[i] - x[i]);
  return e;
}

void check_never_worse_than_ggml(const std::vector<float>& data) {
  ASSERT_EQ(kernels::dtype_row_bytes(DType::Q4_K, 256), 144);
  std::vector<uint8_t> ours(144);
  int64_t worse = 0, better = 0;
  const int64_t nb = static_cast<int64_t>(data.size()) / 256;
  for (int64_t b = 0; b < nb; ++b) {
    const float* x = data.data() + b * 256;
    ASSERT_TRUE(kernels::quantize_row(DType::Q4_K, x, ours.data(), 256));
    const double e_ours = block_error(x, ours.data()), e_ggml = block_error(x, ggml_q4_K_block(x).data());
    // A few ulps of slack: the two sum the same squares in float orders of their own.
    if (e_ours > e_ggml * (1 + 1e-5)) ++worse;
    if (e_ours < e_ggml * (1 - 1e-5)) ++better;
  }
  std::printf("Q4_K over %lld blocks: %lld better than GGML's encoding, %lld worse\n", static_cast<long long>(nb),
              static_cast<long long>(better), static_cast<long long>(worse));
  EXPECT_EQ(worse, 0) << "blocks that decode worse than GGML's own Q4_K encoding of them";
  EXPECT_GT(better, 0) << "the search on top of GGML's should improve some blocks";
}

}  // namespace

TEST(QuantSearch, Q4KBlocksNeverDecodeWorseThanGgmlsEncoding) {
  check_never_worse_than_ggml(stories_weights());
  check_never_worse_than_ggml(gaussian(256 * 64, 11));
}

// A block of zeros, a constant block and one huge outlier encode without
// NaNs and decode to what they can hold.
TEST(QuantSearch, DegenerateBlocks) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(std::string(kernels::dtype_name(f.type)));
    std::vector<uint8_t> q(static_cast<size_t>(kernels::dtype_row_bytes(f.type, 256)));
    std::vector<float> back(256);
    std::vector<float> zeros(256, 0.0f);
    ASSERT_TRUE(kernels::quantize_row(f.type, zeros.data(), q.data(), 256));
    kernels::dequantize_row(f.type, q.data(), back.data(), 256);
    for (float v : back) ASSERT_EQ(v, 0.0f);
    std::vector<float> spike = gaussian(256, 3);
    spike[77] = 50.0f;
    ASSERT_TRUE(kernels::quantize_row(f.type, spike.data(), q.data(), 256));
    kernels::dequantize_row(f.type, q.data(), back.data(), 256);
    for (float v : back) ASSERT_TRUE(std::isfinite(v));
    EXPECT_NEAR(back[77], 50.0f, 50.0f * 0.1f);
  }
}
