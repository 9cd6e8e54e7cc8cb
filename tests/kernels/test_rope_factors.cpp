// RoPE with Llama 3.1-style per-pair frequency divisors, against angles
// worked out here from the formula.
#include <atelier/kernels.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

using namespace atelier::kernels;

TEST(RopeFactors, MatchFormula) {
  const int64_t head_dim = 8, rot = 8, pos = 5;
  const float factors[4] = {1.0f, 2.0f, 4.0f, 8.0f};
  std::vector<float> x(2 * head_dim);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(i) - 0.5f;
  std::vector<float> want = x;
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < rot / 2; ++i) {
      const double theta = pos * std::pow(10000.0, -2.0 * i / rot) / factors[i];
      float& a = want[static_cast<size_t>(h * head_dim + 2 * i)];
      float& b = want[static_cast<size_t>(h * head_dim + 2 * i + 1)];
      const double a0 = a, b0 = b;
      a = static_cast<float>(a0 * std::cos(theta) - b0 * std::sin(theta));
      b = static_cast<float>(a0 * std::sin(theta) + b0 * std::cos(theta));
    }
  std::vector<float> got = x, got_ref = x;
  rope(got.data(), 2, head_dim, rot, pos, 10000.0f, 1.0f, false, factors);
  rope_ref(got_ref.data(), 2, head_dim, rot, pos, 10000.0f, 1.0f, false, factors);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-6f) << i;
    EXPECT_NEAR(got_ref[i], want[i], 1e-6f) << i;
  }
}

TEST(RopeFactors, OnesChangeNothing) {
  const float ones[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  std::vector<float> a(64), b;
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(static_cast<float>(i));
  b = a;
  rope(a.data(), 2, 32, 32, 77, 500000.0f, 1.0f, true, nullptr);
  rope(b.data(), 2, 32, 32, 77, 500000.0f, 1.0f, true, ones);
  EXPECT_EQ(a, b);
}

// rope keeps recent angle tables per position; every call must still use its
// own parameters. Each call below differs from the one before it in one
// parameter only: the position (also one sharing a table slot), the base, the
// scale, the rotary width, factors or none, and factors rewritten in place at
// the same address.
TEST(RopeFactors, KeptTablesFollowEveryParameter) {
  struct Call {
    int64_t pos, rot;
    float base, scale;
    bool with_factors;
    float factor0;
  };
  const Call c0{3, 32, 10000.0f, 1.0f, true, 1.0f};
  std::vector<Call> calls{c0};
  auto vary = [&](auto change) {
    Call c = c0;
    change(c);
    calls.push_back(c);
    calls.push_back(c0);
  };
  vary([](Call& c) { c.pos = 11; });  // 11 & 7 == 3: the same slot
  vary([](Call& c) { c.pos = 4; });
  vary([](Call& c) { c.base = 500000.0f; });
  vary([](Call& c) { c.scale = 0.25f; });
  vary([](Call& c) { c.rot = 16; });
  vary([](Call& c) { c.with_factors = false; });
  vary([](Call& c) { c.factor0 = 3.0f; });
  std::vector<float> factors(16, 1.0f);
  for (size_t k = 0; k < calls.size(); ++k) {
    const Call& c = calls[k];
    factors[0] = c.factor0;
    std::vector<float> got(64), want;
    for (size_t i = 0; i < got.size(); ++i) got[i] = std::cos(0.3f * static_cast<float>(i));
    want = got;
    const float* f = c.with_factors ? factors.data() : nullptr;
    rope(got.data(), 2, 32, c.rot, c.pos, c.base, c.scale, false, f);
    rope_ref(want.data(), 2, 32, c.rot, c.pos, c.base, c.scale, false, f);
    ASSERT_EQ(got, want) << "call " << k;
  }
}

// YaRN (rope.scaling.type "yarn"): with rot_dim 64, base 10000 and an original
// context of 4096, a pair turning beta times over it sits at
// d(beta) = 64 ln(4096 / (2 pi beta)) / (2 ln 10000): d(32) = 10.47 and
// d(1) = 22.5, so pairs 0..10 keep the extrapolated angle, pairs 23..31 take
// the interpolated one (x freq_scale), and every cos/sin is scaled by
// 1 + 0.1 ln(1 / freq_scale). Worked out here, and the kernel equals its reference.
TEST(RopeYarn, OuterPairsByHand) {
  const int64_t hd = 64, rot = 64, pos = 1000;
  const float scale = 0.25f;
  RopeYarn y;
  y.n_ctx_orig = 4096;
  std::vector<float> x(static_cast<size_t>(hd));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.3f * static_cast<float>(i));
  std::vector<float> got = x, ref = x;
  rope(got.data(), 1, hd, rot, pos, 10000.0f, scale, false, nullptr, &y);
  rope_ref(ref.data(), 1, hd, rot, pos, 10000.0f, scale, false, nullptr, &y);
  EXPECT_EQ(got, ref);
  const double mscale = 1.0 + 0.1 * std::log(1.0 / scale);
  for (int i : {0, 5, 10, 23, 28, 31}) {
    const double theta_e = pos * std::pow(10000.0, -2.0 * i / rot);
    const double theta = i <= 10 ? theta_e : scale * theta_e;
    const double a0 = x[static_cast<size_t>(2 * i)], b0 = x[static_cast<size_t>(2 * i + 1)];
    const float c = static_cast<float>(std::cos(theta) * mscale), s = static_cast<float>(std::sin(theta) * mscale);
    EXPECT_NEAR(got[static_cast<size_t>(2 * i)], a0 * c - b0 * s, 1e-5) << "pair " << i;
    EXPECT_NEAR(got[static_cast<size_t>(2 * i + 1)], a0 * s + b0 * c, 1e-5) << "pair " << i;
  }
  // Pairs inside the ramp lie between the two angles: neither one alone.
  const int i = 16;
  const double theta_e = pos * std::pow(10000.0, -2.0 * i / rot);
  for (double theta : {theta_e, scale * theta_e}) {
    const double a0 = x[2 * i], b0 = x[2 * i + 1];
    EXPECT_GT(std::abs(got[2 * i] - (a0 * std::cos(theta) - b0 * std::sin(theta)) * mscale), 1e-4);
  }
}
