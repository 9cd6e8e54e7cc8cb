// RoPE (plain, NeoX, partial rotary width, Llama 3.1 frequency factors,
// YaRN) against a reference written here from ggml's rope_f32/rope_yarn
// (ggml-cpu ops.cpp) in double: its own angles, ramp and rotation, sharing
// nothing with kernels/cpu/ops.cpp (whose rope_ref uses the kernel's own
// angle and apply helpers, so it cannot catch a mistake in them).
#include <atelier/kernels.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/test_util.h"

using namespace atelier::kernels;
using atelier::kernels::testing::available_levels;
using atelier::kernels::testing::ScopedSimd;

namespace {

struct Case {
  int64_t heads, head_dim, rot, pos;
  double base, freq_scale;
  bool neox;
  bool factors;
  int yarn;  // 0: none; 1: ext 1 (YaRN proper); 2: ext 0.5 (half the ramp); 3: ext 0
};

// ggml: theta_extrap = pos * base^(-i0 / n_dims) for the even index i0 (so
// pair p = i0 / 2 turns base^(-2p / n_dims) per position), divided by the
// pair's frequency factor; YaRN mixes it with freq_scale * theta_extrap by a
// ramp over the pairs between the corrected dimensions and, only when the
// mix is on (ext_factor != 0), scales cos and sin by 1 + 0.1 ln(1 / freq_scale).
std::vector<double> rope_plain(const std::vector<float>& x, const Case& c, const std::vector<float>& ff, const RopeYarn* y) {
  std::vector<double> out(x.begin(), x.end());
  const double pi = std::acos(-1.0);
  double ext = 0, mscale = 1, corr0 = 0, corr1 = 0;
  if (y) {
    ext = y->ext_factor;
    mscale = y->attn_factor;
    auto corr_dim = [&](double n_rot) {
      return static_cast<double>(c.rot) * std::log(y->n_ctx_orig / (n_rot * 2 * pi)) / (2 * std::log(c.base));
    };
    corr0 = std::max(0.0, std::floor(corr_dim(y->beta_fast)));
    corr1 = std::min(static_cast<double>(c.rot - 1), std::ceil(corr_dim(y->beta_slow)));
  }
  for (int64_t h = 0; h < c.heads; ++h) {
    double* v = out.data() + h * c.head_dim;
    for (int64_t i0 = 0; i0 < c.rot; i0 += 2) {
      const int64_t p = i0 / 2;
      double theta_extrap = static_cast<double>(c.pos) * std::pow(c.base, -static_cast<double>(i0) / static_cast<double>(c.rot));
      if (!ff.empty()) theta_extrap /= ff[static_cast<size_t>(p)];
      const double theta_interp = c.freq_scale * theta_extrap;
      double theta = theta_interp, ms = mscale;
      if (ext != 0) {
        const double ramp = 1 - std::min(1.0, std::max(0.0, (static_cast<double>(p) - corr0) / std::max(0.001, corr1 - corr0)));
        const double mix = ramp * ext;
        theta = theta_interp * (1 - mix) + theta_extrap * mix;
        ms *= 1 + 0.1 * std::log(1 / c.freq_scale);
      }
      const double cs = std::cos(theta) * ms, sn = std::sin(theta) * ms;
      const int64_t a = c.neox ? p : i0, b = c.neox ? p + c.rot / 2 : i0 + 1;
      const double x0 = v[a], x1 = v[b];
      v[a] = x0 * cs - x1 * sn;
      v[b] = x0 * sn + x1 * cs;
    }
  }
  return out;
}

std::vector<Case> cases(const std::vector<int>& yarns) {
  std::vector<Case> v;
  for (int64_t hd : {8, 64, 128})
    for (int64_t rot : {hd, hd / 2})
      for (int64_t pos : {0, 1, 17, 4095, 131071})
        for (bool neox : {false, true})
          for (int yarn : yarns) {
            const double fs = yarn ? 0.25 : (pos % 2 ? 1.0 : 0.5);
            v.push_back({3, hd, rot, pos, pos % 3 ? 10000.0 : 500000.0, fs, neox, (pos + hd) % 2 == 1, yarn});
          }
  return v;
}

}  // namespace

// Compares rope and rope_ref with the reference on CASES; the first mismatch as text ("" when none).
std::string compare(const std::vector<Case>& cs, int* checked) {
  std::mt19937 rng(2024);
  std::uniform_real_distribution<float> val(-2.0f, 2.0f), fac(1.0f, 8.0f);
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    for (const Case& c : cs) {
      std::vector<float> x(static_cast<size_t>(c.heads * c.head_dim));
      for (float& f : x) f = val(rng);
      std::vector<float> ff;
      if (c.factors)
        for (int64_t i = 0; i < c.rot / 2; ++i) ff.push_back(fac(rng));
      RopeYarn y;
      y.ext_factor = c.yarn == 1 ? 1.0f : c.yarn == 2 ? 0.5f : 0.0f;
      y.attn_factor = 1.25f;
      y.beta_fast = 32.0f, y.beta_slow = 1.0f;
      y.n_ctx_orig = 4096;
      const RopeYarn* yp = c.yarn ? &y : nullptr;
      const auto want = rope_plain(x, c, ff, yp);
      std::vector<float> got = x, got_ref = x;
      rope(got.data(), c.heads, c.head_dim, c.rot, c.pos, static_cast<float>(c.base), static_cast<float>(c.freq_scale), c.neox,
           ff.empty() ? nullptr : ff.data(), yp);
      rope_ref(got_ref.data(), c.heads, c.head_dim, c.rot, c.pos, static_cast<float>(c.base), static_cast<float>(c.freq_scale),
               c.neox, ff.empty() ? nullptr : ff.data(), yp);
      for (size_t i = 0; i < x.size(); ++i) {
        // float inputs and outputs around a double rotation: a few ulps of |x|.
        const double tol = 4e-6 * (1 + std::fabs(want[i]));
        for (const auto& [name, g] : {std::pair{"rope", got[i]}, std::pair{"rope_ref", got_ref[i]}})
          if (!(std::fabs(g - want[i]) <= tol)) {
            char buf[256];
            std::snprintf(buf, sizeof buf, "%s at %s: hd %lld rot %lld pos %lld neox %d factors %d yarn %d, element %zu: got %.7g, want %.7g",
                          name, level.c_str(), static_cast<long long>(c.head_dim), static_cast<long long>(c.rot),
                          static_cast<long long>(c.pos), c.neox, c.factors, c.yarn, i, g, want[i]);
            return buf;
          }
      }
      ++*checked;
    }
  }
  return "";
}

TEST(RopeReference, EveryVariantMatchesGgmlsFormulaInDouble) {
  int checked = 0;
  const std::string bad = compare(cases({0, 1, 2}), &checked);
  EXPECT_EQ(bad, "");
  std::printf("%d RoPE variants checked against the double reference\n", checked);
}

// YaRN with ext_factor 0 (a GGUF's rope.scaling.yarn_ext_factor = 0): ggml
// scales cos and sin by attn_factor alone, the 1 + 0.1 ln(1 / freq_scale) term
// only when the mix is on. (rope_angles once applied it always; this test
// found it.)
TEST(RopeReference, YarnWithExtFactorZeroMatchesGgml) {
  int checked = 0;
  const std::string bad = compare(cases({3}), &checked);
  EXPECT_TRUE(bad.empty()) << "YaRN with ext_factor 0 (no attention-scale correction, as ggml): " << bad;
  EXPECT_GT(checked, 0);
}

// Two hand-worked values, so the reference itself is pinned: head_dim 4,
// pos 2, base 100: pair 0 turns 2 rad, pair 1 turns 2 / 10 = 0.2 rad.
TEST(RopeReference, HandWorkedRotation) {
  std::vector<float> x = {1, 0, 0, 1};
  rope(x.data(), 1, 4, 4, 2, 100.0f, 1.0f, false);
  EXPECT_NEAR(x[0], std::cos(2.0), 1e-6);
  EXPECT_NEAR(x[1], std::sin(2.0), 1e-6);
  EXPECT_NEAR(x[2], -std::sin(0.2), 1e-6);
  EXPECT_NEAR(x[3], std::cos(0.2), 1e-6);
  // NeoX pairs (0, 2) and (1, 3).
  std::vector<float> y = {1, 0, 0, 1};
  rope(y.data(), 1, 4, 4, 2, 100.0f, 1.0f, true);
  EXPECT_NEAR(y[0], std::cos(2.0), 1e-6);
  EXPECT_NEAR(y[2], std::sin(2.0), 1e-6);
  EXPECT_NEAR(y[1], -std::sin(0.2), 1e-6);
  EXPECT_NEAR(y[3], std::cos(0.2), 1e-6);
}
