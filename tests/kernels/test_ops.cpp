// Element-wise ops at every SIMD level against their references and against
// values worked out by hand.
#include <gtest/gtest.h>

#include <limits>

#include <cmath>
#include <cstring>

#include "test_util.h"

namespace atelier::kernels {
namespace {

using testing::available_levels;
using testing::random_floats;
using testing::ScopedSimd;

const int64_t kSizes[] = {1, 7, 8, 9, 31, 64, 100, 4096};

void expect_close(const std::vector<float>& a, const std::vector<float>& b, float rel, float abs,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_LE(std::fabs(a[i] - b[i]), abs + rel * std::fabs(b[i])) << what << " at " << i;
}

TEST(Ops, RmsNorm) {
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    for (int64_t n : kSizes) {
      const auto x = random_floats(n, 1), w = random_floats(n, 2);
      std::vector<float> y(n), ref(n);
      rms_norm(x.data(), w.data(), y.data(), n, 1e-5f);
      rms_norm_ref(x.data(), w.data(), ref.data(), n, 1e-5f);
      expect_close(y, ref, 1e-5f, 0, level + " rms_norm");
      rms_norm(x.data(), nullptr, y.data(), n, 1e-5f);
      double ss = 0;
      for (float v : x) ss += double(v) * v;
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(y[i], x[i] / std::sqrt(ss / n + 1e-5), 1e-5 * std::fabs(y[i]));
    }
  }
}

TEST(Ops, Softmax) {
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    for (int64_t n : kSizes) {
      auto x = random_floats(n, 3, 5.0f);
      if (n > 4) x[3] = -INFINITY;  // a masked position
      auto ref = x;
      softmax(x.data(), n);
      softmax_ref(ref.data(), n);
      expect_close(x, ref, 2e-6f, 1e-9f, level + " softmax");
      double sum = 0;
      for (float v : x) sum += v;
      EXPECT_NEAR(sum, 1.0, 1e-5);
      if (n > 4) {
        EXPECT_EQ(x[3], 0.0f);
      }
    }
    std::vector<float> two{1.0f, 1.0f + std::log(3.0f)};
    softmax(two.data(), 2);
    EXPECT_NEAR(two[0], 0.25f, 1e-6f);
    EXPECT_NEAR(two[1], 0.75f, 1e-6f);
  }
}

TEST(Ops, Swiglu) {
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    for (int64_t n : kSizes) {
      auto g = random_floats(n, 4, 4.0f), u = random_floats(n, 5);
      if (n > 2) g[0] = -100.0f, g[1] = 100.0f;
      std::vector<float> y(n), ref(n);
      swiglu(g.data(), u.data(), y.data(), n);
      swiglu_ref(g.data(), u.data(), ref.data(), n);
      expect_close(y, ref, 1e-5f, 1e-30f, level + " swiglu");
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(ref[i], g[i] / (1 + std::exp(-double(g[i]))) * u[i], 1e-6 * (1 + std::fabs(ref[i])));
    }
  }
}

TEST(Ops, RopeByHand) {
  // head_dim 6, rot_dim 4: pairs rotate by pos * base^(-2i/4), dims 4..5 untouched.
  const float base = 10000.0f;
  for (bool neox : {false, true}) {
    std::vector<float> x{1, 2, 3, 4, 5, 6, -1, -2, -3, -4, -5, -6};
    auto ref = x;
    rope(x.data(), 2, 6, 4, 3, base, 1.0f, neox);
    rope_ref(ref.data(), 2, 6, 4, 3, base, 1.0f, neox);
    EXPECT_EQ(x, ref);
    for (int h = 0; h < 2; ++h) {
      const float sign = h ? -1.0f : 1.0f;
      for (int i = 0; i < 2; ++i) {
        const double theta = 3.0 * std::pow(10000.0, -2.0 * i / 4);
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + 2 : 2 * i + 1;
        const double a = sign * (i0 + 1), b = sign * (i1 + 1);
        EXPECT_NEAR(x[h * 6 + i0], a * std::cos(theta) - b * std::sin(theta), 1e-5);
        EXPECT_NEAR(x[h * 6 + i1], a * std::sin(theta) + b * std::cos(theta), 1e-5);
      }
      EXPECT_EQ(x[h * 6 + 4], sign * 5);
      EXPECT_EQ(x[h * 6 + 5], sign * 6);
    }
  }
  // freq_scale multiplies the position.
  auto a = random_floats(128, 6), b = a;
  rope(a.data(), 2, 64, 64, 10, 500000.0f, 0.5f, false);
  rope(b.data(), 2, 64, 64, 5, 500000.0f, 1.0f, false);
  EXPECT_EQ(a, b);
  // Position 0 is the identity.
  auto c = random_floats(64, 7), d = c;
  rope(c.data(), 1, 64, 64, 0, 10000.0f, 1.0f, true);
  EXPECT_EQ(c, d);
}

TEST(Ops, DotAndAxpy) {
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    for (int64_t n : kSizes) {
      const auto a = random_floats(n, 8), b = random_floats(n, 9);
      double exact = 0, mag = 0;
      for (int64_t i = 0; i < n; ++i) exact += double(a[i]) * b[i], mag += std::fabs(double(a[i]) * b[i]);
      const float d = dot_f32(a.data(), b.data(), n);
      EXPECT_NEAR(d, exact, 1e-6 * mag + 1e-30) << level << " n " << n;
      // Deterministic whatever the alignment of the operands.
      std::vector<float> buf(n + 3);
      for (int off = 1; off < 4; ++off) {
        std::memcpy(buf.data() + off, a.data(), n * sizeof(float));
        const float d2 = dot_f32(buf.data() + off, b.data(), n);
        EXPECT_EQ(std::memcmp(&d, &d2, 4), 0) << level << " n " << n << " offset " << off;
      }
      auto y = b;
      axpy_f32(0.75f, a.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(y[i], b[i] + 0.75 * a[i], 1e-6 * (1 + std::fabs(y[i])));

      std::vector<uint16_t> h(n);
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_fp16(a[i]);
      double exact_h = 0;
      for (int64_t i = 0; i < n; ++i) exact_h += double(fp16_to_f32(h[i])) * b[i];
      EXPECT_NEAR(dot_f16_f32(h.data(), b.data(), n), exact_h, 1e-6 * mag + 1e-30) << level << " n " << n;
      y = b;
      axpy_f16(-2.0f, h.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(y[i], b[i] - 2.0 * fp16_to_f32(h[i]), 1e-6 * (1 + std::fabs(y[i])));
    }
  }
}

TEST(Ops, HalfRowsMatchScalarConversion) {
  // Random bit patterns (NaNs skipped) plus values near the edges of the range.
  std::vector<float> x;
  std::mt19937 rng(12);
  while (x.size() < 5000) {
    uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    if (!std::isnan(f)) x.push_back(std::ldexp(std::fmod(f, 2.0f), static_cast<int>(rng() % 50) - 30));
  }
  for (float f : {65504.0f, 65519.0f, 65520.0f, 1e-8f, 2.98e-8f, -6.1e-5f, 0.0f, -0.0f, INFINITY})
    x.push_back(f);
  const int64_t n = static_cast<int64_t>(x.size());
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    for (int64_t len : {n, int64_t{13}}) {
      std::vector<uint16_t> h(len);
      f32_to_fp16_row(x.data(), h.data(), len);
      for (int64_t i = 0; i < len; ++i) ASSERT_EQ(h[i], f32_to_fp16(x[i])) << level << " " << x[i];
      std::vector<float> back(len);
      fp16_to_f32_row(h.data(), back.data(), len);
      for (int64_t i = 0; i < len; ++i) ASSERT_EQ(back[i], fp16_to_f32(h[i])) << level;
    }
  }
}


// The attention run ops give each (row, head) the bits it gets in a run of
// one row and one head (so how the KV cache splits positions into runs, and
// the heads into tasks, never matters), for any run length, stride, head
// size (tails included), head range and grouped-query layout. The sums equal
// the one-row axpy bit for bit at every level; the dots are within rounding
// of the one-row dot (the SIMD levels sum 8 pairs' lanes together, in another
// order); at the scalar level everything equals its *_ref.
// A task's query heads h0..h1 of n_head over n_head_kv KV heads, and a run
// of cached rows (stride apart, a few padding elements on) as f32 and fp16.
struct HeadShape {
  int n_head, n_head_kv, h0, h1;
};
AttnHeads heads_of(const HeadShape& sh, int64_t hd) {
  AttnHeads hs;
  hs.h0 = sh.h0;
  hs.h1 = sh.h1;
  hs.group = sh.n_head / sh.n_head_kv;
  hs.head_dim = hd;
  return hs;
}
struct CachedRun {
  std::vector<float> f;
  std::vector<uint16_t> h;
};
CachedRun cached_run(int64_t stride, int64_t n_rows, uint32_t seed) {
  CachedRun c{random_floats(stride * n_rows, seed), {}};
  c.h.resize(c.f.size());
  for (size_t i = 0; i < c.f.size(); ++i) c.h[i] = f32_to_fp16(c.f[i]);
  return c;
}

// Several queries against one run: each query's scores are its own call's,
// bit for bit, at every level (1..11 queries: one group of kAttnQueries and
// a rest), and nothing outside each query's score rows is written.
TEST(Ops, AttentionScoresOfSeveralQueriesMatchOneQueryCalls) {
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    for (int64_t hd : {1, 7, 16, 31, 64, 65}) {
      for (const HeadShape& sh : {HeadShape{1, 1, 0, 1}, HeadShape{12, 12, 0, 12}, HeadShape{12, 12, 5, 11},
                                  HeadShape{8, 2, 3, 7}}) {
        const AttnHeads hs = heads_of(sh, hd);
        const int nh = sh.h1 - sh.h0;
        const int64_t stride = sh.n_head_kv * hd + 3, n_rows = 21;
        const CachedRun run = cached_run(stride, n_rows, 7);
        const std::vector<float>& f = run.f;
        const std::vector<uint16_t>& h = run.h;
        for (int nq : {1, 2, 5, 8, 11}) {
          const auto qv = random_floats(nq * sh.n_head * hd, 8 + nq);
          std::vector<const float*> q(nq);
          std::vector<int64_t> ss(nq);
          std::vector<std::vector<float>> got32(nq), got16(nq);
          std::vector<float*> p32(nq), p16(nq);
          for (int j = 0; j < nq; ++j) {
            q[j] = qv.data() + j * sh.n_head * hd;
            ss[j] = n_rows + j;  // each query's own score stride
            got32[j].assign(nh * ss[j], -1.0f);
            got16[j].assign(nh * ss[j], -1.0f);
            p32[j] = got32[j].data();
            p16[j] = got16[j].data();
          }
          dot_f32_heads_queries(f.data(), stride, n_rows, hs, nq, q.data(), p32.data(), ss.data());
          dot_f16_heads_queries(h.data(), stride, n_rows, hs, nq, q.data(), p16.data(), ss.data());
          for (int j = 0; j < nq; ++j) {
            std::vector<float> e32(nh * ss[j], -1.0f), e16 = e32;
            dot_f32_heads(f.data(), stride, n_rows, hs, q[j], e32.data(), ss[j]);
            dot_f16_heads(h.data(), stride, n_rows, hs, q[j], e16.data(), ss[j]);
            ASSERT_EQ(0, std::memcmp(e32.data(), got32[j].data(), e32.size() * 4))
                << level << " hd " << hd << " heads " << sh.h0 << ".." << sh.h1 << " queries " << nq << " query " << j;
            ASSERT_EQ(0, std::memcmp(e16.data(), got16[j].data(), e16.size() * 4))
                << level << " hd " << hd << " heads " << sh.h0 << ".." << sh.h1 << " queries " << nq << " query " << j;
          }
        }
      }
    }
  }
}

// Several rows' value sums over one run: each row's y is its own
// axpy_*_heads call's, bit for bit, at every level (1..11 rows: tiles of 4,
// a group of kAttnQueries and a rest; head sizes with 16-, 8- and masked
// parts; runs across the 16-position blocks), F32, F16 and Q8_0 runs.
TEST(Ops, ValueSumsOfSeveralRowsMatchOneRowCalls) {
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    for (int64_t hd : {1, 7, 8, 24, 31, 32, 64, 65, 128}) {
      for (const HeadShape& sh : {HeadShape{1, 1, 0, 1}, HeadShape{12, 12, 5, 11}, HeadShape{8, 2, 0, 8},
                                  HeadShape{9, 3, 1, 9}}) {
        const AttnHeads hs = heads_of(sh, hd);
        const int nh = sh.h1 - sh.h0;
        const int64_t stride = sh.n_head_kv * hd + 32, n_rows = 37;
        const CachedRun run = cached_run(stride, n_rows, 21);
        std::vector<uint8_t> q8;
        if (hd % kQ8BlockElems == 0) {
          q8.resize(static_cast<size_t>(stride * n_rows / kQ8BlockElems * kQ8BlockBytes));
          ASSERT_TRUE(quantize_row(DType::Q8_0, run.f.data(), q8.data(), stride * n_rows));
        }
        for (int64_t len : {int64_t{1}, int64_t{16}, int64_t{17}, n_rows}) {
          for (int nq : {1, 3, 4, 5, 8, 11}) {
            std::vector<std::vector<float>> as(nq);
            std::vector<const float*> a(nq);
            std::vector<int64_t> a_stride(nq);
            for (int j = 0; j < nq; ++j) {
              a_stride[j] = len + j;  // each row's own score stride
              as[j] = random_floats(nh * a_stride[j], 22 + j);
              a[j] = as[j].data();
            }
            const std::string what = level + " hd " + std::to_string(hd) + " heads " + std::to_string(sh.h0) + ".." +
                                     std::to_string(sh.h1) + " len " + std::to_string(len) + " rows " + std::to_string(nq);
            auto check = [&](const char* type, auto&& many, auto&& one) {
              std::vector<std::vector<float>> got(nq), want(nq);
              std::vector<float*> y(nq);
              for (int j = 0; j < nq; ++j) {
                got[j] = random_floats(sh.n_head * hd, 40 + j);
                want[j] = got[j];
                y[j] = got[j].data();
              }
              many(y.data());
              for (int j = 0; j < nq; ++j) {
                one(j, want[j].data());
                ASSERT_EQ(0, std::memcmp(want[j].data(), got[j].data(), want[j].size() * 4)) << type << " " << what << " row " << j;
              }
            };
            check("f32", [&](float* const* y) { axpy_f32_heads_queries(nq, a.data(), a_stride.data(), run.f.data(), stride, len, hs, y); },
                  [&](int j, float* y) { axpy_f32_heads(a[j], a_stride[j], run.f.data(), stride, len, hs, y); });
            check("f16", [&](float* const* y) { axpy_f16_heads_queries(nq, a.data(), a_stride.data(), run.h.data(), stride, len, hs, y); },
                  [&](int j, float* y) { axpy_f16_heads(a[j], a_stride[j], run.h.data(), stride, len, hs, y); });
            if (!q8.empty()) {
              const Q8Rows rows{q8.data(), 0};
              check("q8_0", [&](float* const* y) { axpy_q8_0_heads_queries(nq, a.data(), a_stride.data(), rows, stride, len, hs, y); },
                    [&](int j, float* y) { axpy_q8_0_heads(a[j], a_stride[j], rows, stride, len, hs, y); });
            }
          }
        }
      }
    }
  }
}

TEST(Ops, AttentionRunsMatchOneRowOneHeadCalls) {
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    for (int64_t hd : {1, 7, 8, 31, 64, 65, 128}) {
      for (const HeadShape& sh : {HeadShape{1, 1, 0, 1}, HeadShape{12, 12, 0, 12}, HeadShape{12, 12, 5, 11},
                                  HeadShape{8, 2, 0, 8}, HeadShape{8, 2, 3, 7}, HeadShape{9, 3, 1, 9}}) {
        const AttnHeads hs = heads_of(sh, hd);
        const int nh = sh.h1 - sh.h0;
        const int64_t stride = sh.n_head_kv * hd + 5, n_rows = 37;
        const CachedRun run = cached_run(stride, n_rows, 3);
        const std::vector<float>& f = run.f;
        const std::vector<uint16_t>& h = run.h;
        const auto q = random_floats(sh.n_head * hd, 4);
        const int64_t a_stride = n_rows + 3;
        const auto a = random_floats(nh * a_stride, 5);
        for (int64_t len : {int64_t{1}, int64_t{2}, int64_t{9}, n_rows}) {
          const int64_t ss = len + 2;
          std::vector<float> d32(nh * ss, -1.0f), d16 = d32;
          std::vector<float> y32 = random_floats(sh.n_head * hd, 6), y16 = y32, e32 = y32, e16 = y32;
          dot_f32_heads(f.data(), stride, len, hs, q.data(), d32.data(), ss);
          dot_f16_heads(h.data(), stride, len, hs, q.data(), d16.data(), ss);
          axpy_f32_heads(a.data(), a_stride, f.data(), stride, len, hs, y32.data());
          axpy_f16_heads(a.data(), a_stride, h.data(), stride, len, hs, y16.data());
          for (int hh = sh.h0; hh < sh.h1; ++hh) {
            const int64_t kv = (hh / hs.group) * hd, k = hh - sh.h0;
            const float* x = q.data() + hh * hd;
            AttnHeads one;
            one.h0 = hh;
            one.h1 = hh + 1;
            one.group = hs.group;
            one.head_dim = hd;
            for (int64_t r = 0; r < len; ++r) {
              const float got32 = d32[k * ss + r], got16 = d16[k * ss + r];
              float s32 = 0, s16 = 0;
              dot_f32_heads(f.data() + r * stride, stride, 1, one, q.data(), &s32, 1);
              dot_f16_heads(h.data() + r * stride, stride, 1, one, q.data(), &s16, 1);
              ASSERT_EQ(0, std::memcmp(&s32, &got32, 4)) << level << " hd " << hd << " head " << hh << " row " << r;
              ASSERT_EQ(0, std::memcmp(&s16, &got16, 4)) << level << " hd " << hd << " head " << hh << " row " << r;
              const float o32 = dot_f32(f.data() + r * stride + kv, x, hd);
              const float o16 = dot_f16_f32(h.data() + r * stride + kv, x, hd);
              double mag = 0;
              for (int64_t i = 0; i < hd; ++i) mag += std::fabs(double(f[r * stride + kv + i]) * x[i]);
              ASSERT_NEAR(o32, got32, 1e-6 * mag + 1e-30) << level << " hd " << hd << " row " << r;
              ASSERT_NEAR(o16, got16, 1e-6 * mag + 1e-30) << level << " hd " << hd << " row " << r;
              if (level == "scalar") {
                ASSERT_EQ(0, std::memcmp(&o32, &got32, 4)) << level << " hd " << hd << " row " << r;
                ASSERT_EQ(0, std::memcmp(&o16, &got16, 4)) << level << " hd " << hd << " row " << r;
              }
              axpy_f32(a[k * a_stride + r], f.data() + r * stride + kv, e32.data() + hh * hd, hd);
              axpy_f16(a[k * a_stride + r], h.data() + r * stride + kv, e16.data() + hh * hd, hd);
            }
            // Padding between the heads' score rows stays untouched.
            for (int64_t r = len; r < ss; ++r) ASSERT_EQ(d32[k * ss + r], -1.0f) << level;
          }
          ASSERT_EQ(0, std::memcmp(e32.data(), y32.data(), y32.size() * 4)) << level << " hd " << hd << " len " << len;
          ASSERT_EQ(0, std::memcmp(e16.data(), y16.data(), y16.size() * 4)) << level << " hd " << hd << " len " << len;
          if (level == "scalar") {
            std::vector<float> r32(nh * ss, -1.0f), r16 = r32, ry32 = random_floats(sh.n_head * hd, 6), ry16 = ry32;
            dot_f32_heads_ref(f.data(), stride, len, hs, q.data(), r32.data(), ss);
            dot_f16_heads_ref(h.data(), stride, len, hs, q.data(), r16.data(), ss);
            axpy_f32_heads_ref(a.data(), a_stride, f.data(), stride, len, hs, ry32.data());
            axpy_f16_heads_ref(a.data(), a_stride, h.data(), stride, len, hs, ry16.data());
            ASSERT_EQ(0, std::memcmp(r32.data(), d32.data(), r32.size() * 4));
            ASSERT_EQ(0, std::memcmp(r16.data(), d16.data(), r16.size() * 4));
            ASSERT_EQ(0, std::memcmp(ry32.data(), y32.data(), ry32.size() * 4));
            ASSERT_EQ(0, std::memcmp(ry16.data(), y16.data(), ry16.size() * 4));
          }
        }
      }
    }
  }
}

// A Q8_0 run (GGML blocks, the q8_0 KV cache) reads as the F32 run holding
// its dequantized values (dequantize_row, GGML's decoding): scores, several
// queries' scores and value sums are the F32 ops' on that run, bit for bit,
// at every level, and the plain references agree with the scalar level.
TEST(Ops, Q8_0RunsReadAsTheirDequantizedValues) {
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    for (int64_t hd : {32, 64, 128}) {
      for (const HeadShape& sh : {HeadShape{1, 1, 0, 1}, HeadShape{12, 12, 5, 11}, HeadShape{8, 2, 0, 8},
                                  HeadShape{9, 3, 1, 9}}) {
        const AttnHeads hs = heads_of(sh, hd);
        const int nh = sh.h1 - sh.h0;
        const int64_t stride = sh.n_head_kv * hd + 32, n_rows = 37;  // rows 32 values apart beyond their heads
        const auto f = random_floats(stride * n_rows, 11, 3.0f);
        std::vector<uint8_t> q8(static_cast<size_t>(stride * n_rows / kQ8BlockElems * kQ8BlockBytes));
        ASSERT_TRUE(quantize_row(DType::Q8_0, f.data(), q8.data(), stride * n_rows));
        std::vector<float> deq(f.size());
        dequantize_row(DType::Q8_0, q8.data(), deq.data(), stride * n_rows);
        const Q8Rows rows{q8.data(), 0};
        const auto q = random_floats(sh.n_head * hd, 12);
        const int64_t a_stride = n_rows + 3;
        const auto a = random_floats(nh * a_stride, 13);
        for (int64_t len : {int64_t{1}, int64_t{9}, n_rows}) {
          const std::string what = level + " hd " + std::to_string(hd) + " heads " + std::to_string(sh.h0) + ".." +
                                   std::to_string(sh.h1) + " len " + std::to_string(len);
          const int64_t ss = len + 2;
          std::vector<float> d8(nh * ss, -1.0f), d32 = d8;
          dot_q8_0_heads(rows, stride, len, hs, q.data(), d8.data(), ss);
          dot_f32_heads(deq.data(), stride, len, hs, q.data(), d32.data(), ss);
          ASSERT_EQ(0, std::memcmp(d8.data(), d32.data(), d8.size() * 4)) << what;
          std::vector<float> y8 = random_floats(sh.n_head * hd, 14), y32 = y8;
          axpy_q8_0_heads(a.data(), a_stride, rows, stride, len, hs, y8.data());
          axpy_f32_heads(a.data(), a_stride, deq.data(), stride, len, hs, y32.data());
          ASSERT_EQ(0, std::memcmp(y8.data(), y32.data(), y8.size() * 4)) << what;
          for (int nq : {2, 5, 11}) {
            const auto qv = random_floats(nq * sh.n_head * hd, 15 + nq);
            std::vector<const float*> qs(nq);
            std::vector<int64_t> sss(nq, ss);
            std::vector<std::vector<float>> g8(nq, std::vector<float>(nh * ss, -1.0f)), g32 = g8;
            std::vector<float*> p8(nq), p32(nq);
            for (int j = 0; j < nq; ++j) qs[j] = qv.data() + j * sh.n_head * hd, p8[j] = g8[j].data(), p32[j] = g32[j].data();
            dot_q8_0_heads_queries(rows, stride, len, hs, nq, qs.data(), p8.data(), sss.data());
            dot_f32_heads_queries(deq.data(), stride, len, hs, nq, qs.data(), p32.data(), sss.data());
            for (int j = 0; j < nq; ++j)
              ASSERT_EQ(0, std::memcmp(g8[j].data(), g32[j].data(), g8[j].size() * 4)) << what << " queries " << nq;
          }
          if (level == "scalar") {
            std::vector<float> r8(nh * ss, -1.0f), ry8 = random_floats(sh.n_head * hd, 14);
            dot_q8_0_heads_ref(rows, stride, len, hs, q.data(), r8.data(), ss);
            axpy_q8_0_heads_ref(a.data(), a_stride, rows, stride, len, hs, ry8.data());
            ASSERT_EQ(0, std::memcmp(r8.data(), d8.data(), r8.size() * 4)) << what;
            ASSERT_EQ(0, std::memcmp(ry8.data(), y8.data(), ry8.size() * 4)) << what;
          }
        }
      }
    }
  }
}

// The candidate scan returns exactly the plain loop's indices at every level,
// for any length (tails included) and bound, NaNs never selected.
TEST(Ops, IndicesAtLeastMatchThePlainLoop) {
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    for (int64_t n : {0, 1, 7, 8, 15, 16, 17, 31, 33, 256, 1000}) {
      auto x = random_floats(std::max<int64_t>(n, 1), 9);
      for (int64_t i = 0; i < n; i += 13) x[static_cast<size_t>(i)] = std::nanf("");
      for (float bound : {-std::numeric_limits<float>::infinity(), -0.5f, 0.0f, 0.9f, 2.0f}) {
        std::vector<int32_t> got(static_cast<size_t>(n) + 1, -1), want(static_cast<size_t>(n) + 1, -1);
        const int64_t k = indices_at_least(x.data(), n, bound, got.data());
        const int64_t kr = indices_at_least_ref(x.data(), n, bound, want.data());
        ASSERT_EQ(k, kr) << level << " n " << n << " bound " << bound;
        ASSERT_EQ(got, want) << level << " n " << n << " bound " << bound;
        for (int64_t j = 0; j < k; ++j) ASSERT_GE(x[static_cast<size_t>(got[static_cast<size_t>(j)])], bound);
      }
    }
  }
}

}  // namespace
}  // namespace atelier::kernels
