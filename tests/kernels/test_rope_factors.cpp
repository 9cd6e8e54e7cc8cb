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
