// The image-model ops at every SIMD level against their plain references
// (odd sizes, strides, block boundaries), thread invariance, and values
// worked out by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "test_util.h"

namespace atelier::kernels {
namespace {

using testing::available_levels;
using testing::random_floats;
using testing::ScopedSimd;
using testing::TestExecutor;

// max |a - b| / (abs + rel * max|b|) <= 1 over the whole tensor: the scale of
// the reference, not each element's, since sums cancel.
void expect_close(const std::vector<float>& a, const std::vector<float>& b, double rel, double abs,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double scale = 0;
  for (float v : b) scale = std::max(scale, double(std::fabs(v)));
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_LE(std::fabs(double(a[i]) - b[i]), abs + rel * scale) << what << " at " << i << ": " << a[i] << " vs " << b[i];
}

std::string conv_name(const Conv2dShape& s) {
  return "conv n" + std::to_string(s.n) + " c" + std::to_string(s.c_in) + "->" + std::to_string(s.c_out) + " " +
         std::to_string(s.h) + "x" + std::to_string(s.w) + " k" + std::to_string(s.kh) + "x" + std::to_string(s.kw) +
         " s" + std::to_string(s.stride_h) + " p" + std::to_string(s.pad_h);
}

TEST(ImageOps, Conv2dMatchesReference) {
  std::vector<Conv2dShape> shapes;
  auto add = [&](int64_t n, int64_t ci, int64_t h, int64_t w, int64_t co, int64_t k, int64_t st, int64_t pad) {
    Conv2dShape s;
    s.n = n, s.c_in = ci, s.h = h, s.w = w, s.c_out = co, s.kh = s.kw = k, s.stride_h = s.stride_w = st;
    s.pad_h = s.pad_w = pad;
    shapes.push_back(s);
  };
  add(1, 3, 7, 9, 5, 3, 1, 1);    // odd everything, 3x3 same
  add(2, 4, 11, 13, 6, 3, 2, 1);  // strided 2 over odd sizes (the downsamplers)
  add(1, 8, 12, 10, 16, 3, 2, 1);
  add(1, 5, 9, 9, 7, 1, 1, 0);    // 1x1 (skip connections, proj in/out)
  add(2, 64, 9, 17, 3, 3, 1, 1);  // more pixels than one tile, few outputs
  add(1, 3, 6, 6, 4, 3, 1, 0);    // valid (no padding)
  add(1, 2, 5, 8, 3, 2, 2, 0);    // even kernel
  Conv2dShape rect;
  rect.c_in = 3, rect.h = 8, rect.w = 11, rect.c_out = 4, rect.kh = 1, rect.kw = 3, rect.pad_w = 1, rect.stride_h = 2;
  shapes.push_back(rect);
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    for (const auto& s : shapes) {
      ASSERT_TRUE(s.valid());
      const int64_t K = s.c_in * s.kh * s.kw;
      const auto x = random_floats(s.n * s.c_in * s.h * s.w, 11);
      const auto w = random_floats(s.c_out * K, 12, 0.3f);
      const auto bias = random_floats(s.c_out, 13);
      const size_t ny = static_cast<size_t>(s.n * s.c_out * s.out_h() * s.out_w());
      for (bool with_bias : {true, false}) {
        std::vector<float> y(ny), ref(ny), y3(ny);
        const float* b = with_bias ? bias.data() : nullptr;
        conv2d(s, x.data(), DType::F32, w.data(), b, y.data());
        conv2d_ref(s, x.data(), DType::F32, w.data(), b, ref.data());
        expect_close(y, ref, 2e-6 * std::sqrt(double(K)), 1e-6, level + " " + conv_name(s));
        TestExecutor ex(3);
        conv2d(s, x.data(), DType::F32, w.data(), b, y3.data(), &ex);
        ASSERT_EQ(y, y3) << "thread split changed the result: " << conv_name(s);
      }
      // f16 weights: the reference widens the same halves.
      std::vector<uint16_t> wh(w.size());
      for (size_t i = 0; i < w.size(); ++i) wh[i] = f32_to_fp16(w[i]);
      std::vector<float> y(ny), ref(ny);
      conv2d(s, x.data(), DType::F16, wh.data(), bias.data(), y.data());
      conv2d_ref(s, x.data(), DType::F16, wh.data(), bias.data(), ref.data());
      expect_close(y, ref, 2e-6 * std::sqrt(double(K)), 1e-6, level + " f16 " + conv_name(s));
    }
  }
}

// The direct conv2d's blocking (avx512 and avx2): K chunks of 256 taps (c_in
// 40 x 3x3 = 360, a 1x1 over 300 channels, 630 taps in three chunks), pixel
// blocks of 256 and register tiles of 64 (avx512) or 16 (avx2) pixels (20x17 =
// 340 pixels, 1x1 to 5x5 images, 15 and 16 pixels),
// channel tiles of 6 (7, 13 outputs), strides, padding wider than the image,
// F16 and BF16 weights; every level against the reference, and the batch and
// thread split never change an image's bits.
TEST(ImageOps, Conv2dBlockingAndInvariance) {
  struct Case { int64_t n, ci, h, w, co, kh, kw, sh, sw, ph, pw; };
  const std::vector<Case> cases{
      {3, 40, 20, 17, 13, 3, 3, 1, 1, 1, 1},  // 360 taps = 256 + 104; 340 pixels = 256 + 84
      {2, 300, 5, 7, 7, 1, 1, 1, 1, 0, 0},    // 1x1, K 300 over two chunks, 35 pixels
      {2, 70, 9, 11, 6, 3, 3, 2, 2, 1, 1},    // strided 630 taps
      {3, 3, 1, 1, 19, 3, 3, 1, 1, 1, 1},     // one pixel, padding all round
      {1, 5, 4, 5, 2, 5, 5, 1, 1, 3, 3},      // padding wider than the kernel reach
      {2, 17, 16, 16, 12, 3, 3, 1, 1, 1, 1},  // exactly one 256-pixel block
      {1, 9, 33, 9, 8, 2, 3, 3, 1, 0, 2},     // rectangular kernel, mixed strides
      {2, 33, 4, 4, 13, 3, 3, 1, 1, 1, 1},    // 16 pixels: the narrow units (avx512 24 channels, avx2 2 vectors)
      {1, 20, 3, 5, 8, 3, 3, 1, 1, 1, 1},     // 15 pixels: one avx2 vector and a partial one
  };
  // Per case and weight type, the avx2 result: the avx512 one must equal it
  // (both are one FMA chain per pixel over the taps in order).
  std::map<std::string, std::vector<float>> avx2_result;
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    for (const Case& c : cases) {
      Conv2dShape s;
      s.n = c.n, s.c_in = c.ci, s.h = c.h, s.w = c.w, s.c_out = c.co, s.kh = c.kh, s.kw = c.kw;
      s.stride_h = c.sh, s.stride_w = c.sw, s.pad_h = c.ph, s.pad_w = c.pw;
      ASSERT_TRUE(s.valid()) << conv_name(s);
      const int64_t K = s.c_in * s.kh * s.kw, img_in = s.c_in * s.h * s.w, img_out = s.c_out * s.out_h() * s.out_w();
      const auto x = random_floats(s.n * img_in, 81);
      const auto w = random_floats(s.c_out * K, 82, 0.3f);
      const auto bias = random_floats(s.c_out, 83);
      std::vector<uint16_t> wh(w.size()), wb(w.size());
      for (size_t i = 0; i < w.size(); ++i) wh[i] = f32_to_fp16(w[i]), wb[i] = f32_to_bf16(w[i]);
      for (DType t : {DType::F32, DType::F16, DType::BF16}) {
        const void* wp = t == DType::F32 ? static_cast<const void*>(w.data())
                         : t == DType::F16 ? static_cast<const void*>(wh.data())
                                           : static_cast<const void*>(wb.data());
        const std::string what = level + " " + std::string(dtype_name(t)) + " " + conv_name(s);
        std::vector<float> y(static_cast<size_t>(s.n * img_out)), ref(y.size());
        conv2d(s, x.data(), t, wp, bias.data(), y.data());
        conv2d_ref(s, x.data(), t, wp, bias.data(), ref.data());
        expect_close(y, ref, 2e-6 * std::sqrt(double(K)), 1e-6, what);
        const std::string key = std::string(dtype_name(t)) + " " + conv_name(s);
        if (level == "avx2") avx2_result[key] = y;
        if (level == "avx512" && avx2_result.count(key)) {
          ASSERT_EQ(y, avx2_result[key]) << "avx512 differs from avx2: " << what;
        }
        for (int threads : {2, 3, 7}) {
          TestExecutor ex(threads);
          std::vector<float> yt(y.size());
          conv2d(s, x.data(), t, wp, bias.data(), yt.data(), &ex);
          ASSERT_EQ(y, yt) << threads << " threads changed " << what;
        }
        // Each image alone (batch 1) gives the bits it got in the batch.
        Conv2dShape one = s;
        one.n = 1;
        for (int64_t b = 0; b < s.n; ++b) {
          std::vector<float> yb(static_cast<size_t>(img_out));
          TestExecutor ex(2);
          conv2d(one, x.data() + b * img_in, t, wp, bias.data(), yb.data(), &ex);
          ASSERT_TRUE(std::equal(yb.begin(), yb.end(), y.begin() + b * img_out)) << "batch changed image " << b << " " << what;
        }
      }
    }
  }
}

TEST(ImageOps, Conv2dByHand) {
  // 1 channel 3x3 input, 3x3 kernel of ones, padding 1, stride 2: the
  // corners sum their 2x2 neighbourhoods, plus bias 0.5.
  Conv2dShape s;
  s.c_in = 1, s.h = 3, s.w = 3, s.c_out = 1, s.kh = s.kw = 3, s.stride_h = s.stride_w = 2, s.pad_h = s.pad_w = 1;
  const std::vector<float> x{1, 2, 3, 4, 5, 6, 7, 8, 9}, w(9, 1.0f);
  const float bias = 0.5f;
  ASSERT_EQ(s.out_h(), 2);
  ASSERT_EQ(s.out_w(), 2);
  std::vector<float> y(4);
  conv2d(s, x.data(), DType::F32, w.data(), &bias, y.data());
  EXPECT_EQ(y, (std::vector<float>{12.5f, 16.5f, 24.5f, 28.5f}));
}

TEST(ImageOps, GroupNorm) {
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    struct Case { int64_t n, c, hw, groups; };
    for (const Case& k : {Case{1, 6, 13, 3}, Case{2, 32, 17, 32}, Case{1, 64, 81, 4}, Case{2, 12, 1, 1}}) {
      auto x = random_floats(k.n * k.c * k.hw, 21, 2.0f);
      for (auto& v : x) v += 5.0f;  // an offset: the variance must not cancel
      const auto gamma = random_floats(k.c, 22), beta = random_floats(k.c, 23);
      for (bool silu : {false, true}) {
        std::vector<float> y(x.size()), ref(x.size());
        TestExecutor ex(2);
        group_norm(x.data(), y.data(), k.n, k.c, k.hw, k.groups, gamma.data(), beta.data(), 1e-5f, silu, &ex);
        group_norm_ref(x.data(), ref.data(), k.n, k.c, k.hw, k.groups, gamma.data(), beta.data(), 1e-5f, silu);
        expect_close(y, ref, 2e-6, 1e-6, level + " group_norm");
        // In place, without affine.
        std::vector<float> inplace = x;
        group_norm(inplace.data(), inplace.data(), k.n, k.c, k.hw, k.groups, nullptr, nullptr, 1e-5f, silu);
        group_norm_ref(x.data(), ref.data(), k.n, k.c, k.hw, k.groups, nullptr, nullptr, 1e-5f, silu);
        expect_close(inplace, ref, 2e-6, 1e-6, level + " group_norm in place");
      }
    }
  }
  // By hand: one group of {1, 3}: mean 2, var 1 -> {-1, 1} (eps 0).
  const std::vector<float> x{1, 3};
  std::vector<float> y(2);
  group_norm(x.data(), y.data(), 1, 2, 1, 1, nullptr, nullptr, 0.0f, false);
  EXPECT_FLOAT_EQ(y[0], -1.0f);
  EXPECT_FLOAT_EQ(y[1], 1.0f);
}

TEST(ImageOps, LayerNorm) {
  for (int64_t dim : {1, 7, 64, 768, 1001}) {
    const int64_t rows = 37;
    auto x = random_floats(rows * dim, 31, 3.0f);
    for (auto& v : x) v -= 10.0f;
    const auto g = random_floats(dim, 32), b = random_floats(dim, 33);
    std::vector<float> y(x.size()), ref(x.size());
    TestExecutor ex(3);
    layer_norm(x.data(), y.data(), rows, dim, g.data(), b.data(), 1e-5f, &ex);
    layer_norm_ref(x.data(), ref.data(), rows, dim, g.data(), b.data(), 1e-5f);
    expect_close(y, ref, 2e-6, 1e-6, "layer_norm " + std::to_string(dim));
  }
}

TEST(ImageOps, Activations) {
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    for (int64_t n : {1, 7, 8, 9, 100, 40000}) {
      auto x = random_floats(n, 41, 4.0f);
      if (n > 3) x[0] = -90.0f, x[1] = 90.0f, x[2] = 0.0f;
      for (Activation a : {Activation::silu, Activation::gelu, Activation::gelu_tanh, Activation::quick_gelu}) {
        std::vector<float> y(n), ref(n);
        TestExecutor ex(2);
        activation(a, x.data(), y.data(), n, &ex);
        activation_ref(a, x.data(), ref.data(), n);
        for (int64_t i = 0; i < n; ++i)
          ASSERT_NEAR(y[i], ref[i], 1e-6 + 2e-6 * std::fabs(x[i])) << level << " act " << int(a) << " x=" << x[i];
      }
    }
  }
  // Published values: silu(1) = 1/(1+e^-1), gelu(1) = Phi(1), tanh-GELU(1).
  const float one = 1.0f;
  float y;
  activation(Activation::silu, &one, &y, 1);
  EXPECT_NEAR(y, 0.7310585786300049, 1e-6);
  activation(Activation::gelu, &one, &y, 1);
  EXPECT_NEAR(y, 0.8413447460685429, 1e-6);
  activation(Activation::gelu_tanh, &one, &y, 1);
  EXPECT_NEAR(y, 0.8411919906082768, 1e-6);
  activation(Activation::quick_gelu, &one, &y, 1);
  EXPECT_NEAR(y, 1.0 / (1.0 + std::exp(-1.702)), 1e-6);  // 0.845843
}

TEST(ImageOps, Geglu) {
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    for (int64_t dim : {1, 5, 8, 13, 320}) {
      const int64_t rows = 9;
      const auto x = random_floats(rows * 2 * dim, 51, 2.0f);
      std::vector<float> y(rows * dim), ref(rows * dim);
      TestExecutor ex(2);
      geglu(x.data(), y.data(), rows, dim, &ex);
      geglu_ref(x.data(), ref.data(), rows, dim);
      expect_close(y, ref, 2e-6, 1e-6, level + " geglu");
    }
  }
  // value 2, gate 1: 2 * Phi(1) * 1.
  const float x[2] = {2.0f, 1.0f};
  float y;
  geglu(x, &y, 1, 1);
  EXPECT_NEAR(y, 2 * 0.8413447460685429, 2e-6);
}

TEST(ImageOps, UpsampleNearest2x) {
  const int64_t planes = 3, h = 5, w = 7;
  const auto x = random_floats(planes * h * w, 61);
  std::vector<float> y(planes * 4 * h * w), ref(y.size());
  TestExecutor ex(3);
  upsample_nearest2x(x.data(), y.data(), planes, h, w, &ex);
  upsample_nearest2x_ref(x.data(), ref.data(), planes, h, w);
  EXPECT_EQ(y, ref);
  const float one[4] = {1, 2, 3, 4};
  float up[16];
  upsample_nearest2x(one, up, 1, 2, 2);
  EXPECT_EQ(std::vector<float>(up, up + 16), (std::vector<float>{1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}));
}

TEST(ImageOps, AttentionMatchesReference) {
  struct Case { int64_t batch, heads, lq, lk, d; };
  // Key lengths across the 512-key block boundary, query lengths across the
  // 64-row block; 77 keys (cross-attention to CLIP tokens).
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    for (const Case& c : {Case{1, 1, 1, 1, 8}, Case{2, 3, 70, 77, 40}, Case{1, 2, 65, 1100, 16}, Case{1, 8, 130, 130, 5}}) {
      AttentionShape s;
      s.batch = c.batch, s.heads = c.heads, s.lq = c.lq, s.lk = c.lk, s.head_dim = c.d;
      const int64_t width = c.heads * c.d;
      const auto q = random_floats(c.batch * c.lq * width, 71, 2.0f);
      const auto k = random_floats(c.batch * c.lk * width, 72, 2.0f);
      const auto v = random_floats(c.batch * c.lk * width, 73);
      std::vector<float> y(q.size()), ref(q.size()), y3(q.size());
      attention(s, q.data(), k.data(), v.data(), y.data());
      attention_ref(s, q.data(), k.data(), v.data(), ref.data());
      expect_close(y, ref, 1e-5, 1e-6, level + " attention lq " + std::to_string(c.lq) + " lk " + std::to_string(c.lk));
      TestExecutor ex(3);
      attention(s, q.data(), k.data(), v.data(), y3.data(), &ex);
      ASSERT_EQ(y, y3) << "thread split changed attention";
    }
  }
}

// The flash attention's blocking: query tiles of 8 (avx512) or 4 (avx2) in
// blocks of 32 (lq 1, 3, 5, 7, 33, 36, 100), key strips of 48 or 24 in
// softmax blocks of 192 (lk 23, 25, 47, 49, 191, 193, 400, 77), head dims off
// the 16- and 8-lane grids (9, 17, 80, 160) and the VAE's 512;
// against the reference at every level, and each image and head keeps its
// bits whatever the batch or the thread split.
TEST(ImageOps, AttentionBlockingAndInvariance) {
  struct Case { int64_t batch, heads, lq, lk, d; };
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    for (const Case& c : {Case{2, 2, 33, 193, 17}, Case{3, 1, 7, 47, 80}, Case{2, 2, 100, 400, 40},
                          Case{1, 3, 1, 49, 160}, Case{2, 1, 40, 77, 512}, Case{2, 8, 64, 77, 40},
                          Case{2, 2, 5, 25, 24}, Case{1, 1, 3, 23, 9}, Case{1, 2, 36, 191, 8}}) {
      AttentionShape s;
      s.batch = c.batch, s.heads = c.heads, s.lq = c.lq, s.lk = c.lk, s.head_dim = c.d;
      const int64_t width = c.heads * c.d;
      // Large logits (scale 3 over 17..512 dims): the online softmax's
      // running maximum moves between key blocks.
      const auto q = random_floats(c.batch * c.lq * width, 91, 3.0f);
      const auto k = random_floats(c.batch * c.lk * width, 92, 3.0f);
      const auto v = random_floats(c.batch * c.lk * width, 93);
      const std::string what = level + " attention lq " + std::to_string(c.lq) + " lk " + std::to_string(c.lk) +
                               " d " + std::to_string(c.d);
      std::vector<float> y(q.size()), ref(q.size());
      attention(s, q.data(), k.data(), v.data(), y.data());
      attention_ref(s, q.data(), k.data(), v.data(), ref.data());
      expect_close(y, ref, 1e-5, 1e-6, what);
      for (int threads : {2, 5}) {
        TestExecutor ex(threads);
        std::vector<float> yt(y.size());
        attention(s, q.data(), k.data(), v.data(), yt.data(), &ex);
        ASSERT_EQ(y, yt) << threads << " threads changed " << what;
      }
      AttentionShape one = s;
      one.batch = 1;
      for (int64_t b = 0; b < c.batch; ++b) {
        std::vector<float> yb(static_cast<size_t>(c.lq * width));
        attention(one, q.data() + b * c.lq * width, k.data() + b * c.lk * width, v.data() + b * c.lk * width, yb.data());
        ASSERT_TRUE(std::equal(yb.begin(), yb.end(), y.begin() + b * c.lq * width)) << "batch changed image " << b << " " << what;
      }
    }
  }
}

TEST(ImageOps, AttentionByHand) {
  // Two keys; the query prefers the second by log(3) after scaling:
  // out = (1 * v0 + 3 * v1) / 4.
  AttentionShape s;
  s.lq = 1, s.lk = 2, s.head_dim = 1, s.scale = 1.0f;
  const float q = 1.0f, k[2] = {0.0f, std::log(3.0f)}, v[2] = {4.0f, 8.0f};
  float out;
  attention(s, &q, k, v, &out);
  EXPECT_NEAR(out, 7.0f, 1e-5f);
}

TEST(ImageOps, TimestepEmbeddingByHand) {
  // dim 6, half 3: freqs = 10000^(-i/3) = 1, 0.0464159, 0.00215443.
  const float t[2] = {0.0f, 500.0f};
  std::vector<float> e(12);
  timestep_embedding(t, 2, 6, e.data());
  const double f[3] = {1.0, std::pow(10000.0, -1.0 / 3), std::pow(10000.0, -2.0 / 3)};
  for (int i = 0; i < 3; ++i) {
    EXPECT_FLOAT_EQ(e[i], 1.0f);  // cos(0): SD's order puts cos first
    EXPECT_FLOAT_EQ(e[3 + i], 0.0f);
    EXPECT_NEAR(e[6 + i], std::cos(500.0 * f[i]), 2e-4) << i;  // f32 argument rounding at t=500
    EXPECT_NEAR(e[9 + i], std::sin(500.0 * f[i]), 2e-4) << i;
  }
  // sin first without the flip; odd dim pads a zero; freq shift 1.
  std::vector<float> o(5);
  const float t1 = 1.0f;
  timestep_embedding(&t1, 1, 5, o.data(), false, 1.0f);
  const double g = std::pow(10000.0, -1.0 / (2 - 1));  // i = 1 over (half - shift) = 1
  EXPECT_NEAR(o[0], std::sin(1.0), 1e-6);
  EXPECT_NEAR(o[1], std::sin(g), 1e-6);
  EXPECT_NEAR(o[2], std::cos(1.0), 1e-6);
  EXPECT_NEAR(o[3], std::cos(g), 1e-6);
  EXPECT_EQ(o[4], 0.0f);
}

}  // namespace
}  // namespace atelier::kernels
