// Noise schedules and samplers against independent expectations: SD 1.5's
// published sigma range, Karras sigmas worked out by hand, the eps/v
// parameterizations against a model written in DDPM terms, and every sampler
// on a Gaussian data distribution, whose ideal denoiser and probability-flow
// ODE solution are closed-form.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "image/sampling.h"

using namespace atelier::image;

namespace {

const NoiseSchedule& sd() {
  static const NoiseSchedule s = NoiseSchedule::scaled_linear();
  return s;
}

// Data ~ N(mu, s^2) per element. With x = x0 + sigma n the ideal denoiser is
// E[x0 | x] = mu + s^2 / (s^2 + sigma^2) (x - mu), and the ODE
// dx/dsigma = (x - D(x)) / sigma keeps (x - mu) / sqrt(s^2 + sigma^2) fixed.
struct Gaussian {
  double mu, s;
  DenoiseFn denoiser() const {
    return [this](const float* x, double sigma, float* x0) {
      for (size_t i = 0; i < n; ++i) x0[i] = static_cast<float>(mu + s * s / (s * s + sigma * sigma) * (x[i] - mu));
    };
  }
  double exact(double x_start, double sigma_start, double sigma_end) const {
    return mu + (x_start - mu) * std::sqrt(s * s + sigma_end * sigma_end) / std::sqrt(s * s + sigma_start * sigma_start);
  }
  size_t n = 0;
};

double run_error(SamplerKind kind, const std::vector<double>& sigmas, const Gaussian& g,
                 const std::vector<float>& x_start) {
  auto sampler = Sampler::create(kind, sigmas, x_start);
  const DenoiseFn d = g.denoiser();
  while (!sampler->done()) sampler->step(d);
  double err = 0;
  for (size_t i = 0; i < x_start.size(); ++i)
    err = std::max(err, std::fabs(sampler->x()[i] - g.exact(x_start[i], sigmas.front(), 0.0)));
  return err;
}

}  // namespace

TEST(Sampling, Sd15SigmaRange) {
  // k-diffusion / A1111 report 14.6146 and 0.0292 for SD 1.x.
  EXPECT_EQ(sd().size(), 1000);
  EXPECT_NEAR(sd().sigma_max(), 14.6146, 1e-4);
  EXPECT_NEAR(sd().sigma_min(), 0.0292, 1e-4);
  const auto s = discrete_sigmas(sd(), 20);
  ASSERT_EQ(s.size(), 21u);
  EXPECT_NEAR(s[0], 14.6146, 1e-4);
  EXPECT_NEAR(s[19], 0.0292, 1e-4);
  EXPECT_EQ(s[20], 0.0);
  for (size_t i = 0; i + 1 < s.size(); ++i) EXPECT_GT(s[i], s[i + 1]);
  // First beta and alpha_cumprod by hand: beta_0 = 0.00085.
  EXPECT_NEAR(sd().alphas_cumprod()[0], 1 - 0.00085, 1e-7);
}

TEST(Sampling, KarrasByHand) {
  // rho 1: a straight line from 3 to 1.
  auto k = karras_sigmas(3, 1.0, 3.0, 1.0);
  ASSERT_EQ(k.size(), 4u);
  EXPECT_NEAR(k[0], 3.0, 1e-12);
  EXPECT_NEAR(k[1], 2.0, 1e-12);
  EXPECT_NEAR(k[2], 1.0, 1e-12);
  EXPECT_EQ(k[3], 0.0);
  // rho 2 from 9 to 1: square roots 3 -> 1, midpoint 2, squared 4.
  k = karras_sigmas(3, 1.0, 9.0, 2.0);
  EXPECT_NEAR(k[1], 4.0, 1e-12);
  // rho 7, SD's range, 4 steps: 14.6146^(1/7) = 1.466892, 0.0292^(1/7) = 0.603627;
  // step (0.603627 - 1.466892) / 3 = -0.287755: 1.179137^7 = 3.16920, 0.891382^7 = 0.447145.
  k = karras_sigmas(4, 0.0292, 14.6146);
  EXPECT_NEAR(k[0], 14.6146, 1e-9);
  EXPECT_NEAR(k[1], 3.16920, 1e-4);
  EXPECT_NEAR(k[2], 0.447145, 1e-5);
  EXPECT_NEAR(k[3], 0.0292, 1e-9);
  EXPECT_EQ(k[4], 0.0);
}

TEST(Sampling, TimestepSigmaMapping) {
  EXPECT_NEAR(sd().sigma_to_t(sd().sigma_max()), 999.0, 1e-9);
  EXPECT_NEAR(sd().sigma_to_t(sd().sigma_min()), 0.0, 1e-9);
  EXPECT_NEAR(sd().t_to_sigma(0), sd().sigma_min(), 1e-12);
  for (double t : {0.0, 0.5, 17.25, 500.0, 998.9, 999.0}) EXPECT_NEAR(sd().sigma_to_t(sd().t_to_sigma(t)), t, 1e-6) << t;
  // Halfway between timesteps 10 and 11 is the geometric mean of their sigmas.
  EXPECT_NEAR(sd().t_to_sigma(10.5), std::sqrt(sd().sigmas()[10] * sd().sigmas()[11]), 1e-12);
  // Out of range sigmas clamp to the ends.
  EXPECT_NEAR(sd().sigma_to_t(100.0), 999.0, 1e-9);
  EXPECT_NEAR(sd().sigma_to_t(1e-4), 0.0, 1e-9);
}

TEST(Sampling, EpsilonAndVParameterizations) {
  // A model written in DDPM terms: x_t = sqrt(abar) x0 + sqrt(1 - abar) eps,
  // v = sqrt(abar) eps - sqrt(1 - abar) x0, abar from the betas by hand.
  std::vector<double> abar;
  double prod = 1;
  for (int t = 0; t < 1000; ++t) {
    const double b = std::pow(std::sqrt(0.00085) + (std::sqrt(0.012) - std::sqrt(0.00085)) * t / 999.0, 2);
    abar.push_back(prod *= 1 - b);
  }
  const std::vector<float> x0_true{0.3f, -1.2f, 2.0f}, eps_true{1.0f, -0.5f, 0.25f};
  for (Prediction p : {Prediction::epsilon, Prediction::v}) {
    for (int t : {0, 250, 999}) {
      const ModelFn model = [&](const float* xt, double timestep, float* out) {
        ASSERT_NEAR(timestep, t, 1e-6);
        const double a = abar[size_t(t)];
        for (size_t i = 0; i < 3; ++i) {
          // The input must be the DDPM latent of (x0_true, eps_true).
          ASSERT_NEAR(xt[i], std::sqrt(a) * x0_true[i] + std::sqrt(1 - a) * eps_true[i], 1e-4);
          out[i] = static_cast<float>(p == Prediction::epsilon ? eps_true[i]
                                                                : std::sqrt(a) * eps_true[i] - std::sqrt(1 - a) * x0_true[i]);
        }
      };
      const double sigma = sd().sigmas()[size_t(t)];
      std::vector<float> x(3), x0(3);
      for (size_t i = 0; i < 3; ++i) x[i] = static_cast<float>(x0_true[i] + sigma * eps_true[i]);
      make_denoiser(model, sd(), p, 3)(x.data(), sigma, x0.data());
      for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(x0[i], x0_true[i], 2e-4 * (1 + sigma)) << int(p) << " t " << t;
    }
  }
}

TEST(Sampling, OdeSamplersConvergeToTheExactSolution) {
  Gaussian g{0.7, 0.5};
  std::vector<float> x_start;
  for (double z : {-2.0, -1.0, -0.3, 0.0, 0.4, 1.0, 2.5}) x_start.push_back(static_cast<float>(g.mu + z * 14.6146));
  g.n = x_start.size();
  auto err = [&](SamplerKind k, int steps) {
    return run_error(k, karras_sigmas(steps, 0.0292, 14.6146), g, x_start);
  };
  const double e10 = err(SamplerKind::euler, 10), e40 = err(SamplerKind::euler, 40);
  const double h10 = err(SamplerKind::heun, 10), h40 = err(SamplerKind::heun, 40);
  const double d10 = err(SamplerKind::dpmpp_2m, 10), d40 = err(SamplerKind::dpmpp_2m, 40);
  std::printf("max error at 10 / 40 steps: euler %.2e / %.2e, heun %.2e / %.2e, dpm++2m %.2e / %.2e\n", e10, e40, h10,
              h40, d10, d40);
  // Each converges, the second-order ones faster, and they beat Euler at equal steps.
  EXPECT_LT(e40, e10 / 2.5);
  EXPECT_LT(h40, h10 / 6);
  EXPECT_LT(d40, d10 / 6);
  EXPECT_LT(h10, e10);
  EXPECT_LT(d10, e10);
  EXPECT_LT(d40, 1e-2);
  EXPECT_LT(h40, 1e-2);
  // DDIM on its own timesteps is the same first-order update.
  const double dd10 = run_error(SamplerKind::ddim, ddim_sigmas(sd(), 10), g, x_start);
  const double dd50 = run_error(SamplerKind::ddim, ddim_sigmas(sd(), 50), g, x_start);
  EXPECT_LT(dd50, dd10 / 2.5);
  // Discrete sigmas converge too (slower: few of their steps fall where
  // sigma is near the data's scale). The last step to 0 is first order for
  // every sampler (x0 from sigma_min), which leaves ~2e-3 here.
  const double dd40 = run_error(SamplerKind::dpmpp_2m, discrete_sigmas(sd(), 40), g, x_start);
  const double dd160 = run_error(SamplerKind::dpmpp_2m, discrete_sigmas(sd(), 160), g, x_start);
  EXPECT_LT(dd160, dd40 / 4);
  EXPECT_LT(dd160, 1e-2);
}

TEST(Sampling, AncestralSamplesTheDataDistribution) {
  Gaussian g{0.7, 0.5};
  const size_t n = 40000;
  g.n = n;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  const double s0 = 14.6146;
  std::vector<float> x(n);
  for (auto& v : x) v = static_cast<float>(g.mu + normal(rng) * std::sqrt(s0 * s0 + g.s * g.s));
  NoiseFn noise = [&](float* out, size_t m) {
    for (size_t i = 0; i < m; ++i) out[i] = normal(rng);
  };
  // The SDE's discretization error shrinks the spread at few steps (std
  // 0.444 at 30 steps); at 300 it is within 3%.
  auto spread = [&](int steps, double* mean_out) {
    auto sampler = Sampler::create(SamplerKind::euler_ancestral, karras_sigmas(steps, 0.0292, s0), x, noise);
    const DenoiseFn d = g.denoiser();
    while (!sampler->done()) sampler->step(d);
    double mean = 0, var = 0;
    for (float v : sampler->x()) mean += v;
    mean /= double(n);
    for (float v : sampler->x()) var += (v - mean) * (v - mean);
    *mean_out = mean;
    return std::sqrt(var / double(n));
  };
  double m30, m300;
  const double sd30 = spread(30, &m30), sd300 = spread(300, &m300);
  std::printf("euler a: 30 steps mean %.4f std %.4f; 300 steps mean %.4f std %.4f (0.7, 0.5)\n", m30, sd30, m300, sd300);
  EXPECT_NEAR(m30, g.mu, 0.02);
  EXPECT_NEAR(m300, g.mu, 0.02);
  EXPECT_NEAR(sd300, g.s, 0.03 * g.s);
  EXPECT_LT(std::fabs(sd300 - g.s), std::fabs(sd30 - g.s));
  // Without noise the ancestral sampler is a different (wrong) sampler: the
  // check above would fail if the noise term were dropped.
  EXPECT_THROW(Sampler::create(SamplerKind::euler_ancestral, karras_sigmas(3, 0.1, 1.0), x), atelier::Error);
}

TEST(Sampling, LcmOnAPointDistribution) {
  // All data at 0.7: the ideal denoiser returns 0.7 from anywhere, so LCM's
  // jumps end exactly there whatever noise is added in between.
  Gaussian g{0.7, 0.0};
  g.n = 5;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  int noise_calls = 0;
  NoiseFn noise = [&](float* out, size_t m) {
    ++noise_calls;
    for (size_t i = 0; i < m; ++i) out[i] = normal(rng);
  };
  const auto sigmas = lcm_sigmas(sd(), 4);
  ASSERT_EQ(sigmas.size(), 5u);
  EXPECT_NEAR(sigmas[0], sd().sigmas()[999], 1e-12);
  EXPECT_NEAR(sigmas[1], sd().sigmas()[759], 1e-12);  // diffusers: 999, 759, 499, 259
  EXPECT_NEAR(sigmas[3], sd().sigmas()[259], 1e-12);
  auto s = Sampler::create(SamplerKind::lcm, sigmas, std::vector<float>(5, 3.0f), noise);
  const DenoiseFn d = g.denoiser();
  while (!s->done()) s->step(d);
  for (float v : s->x()) EXPECT_FLOAT_EQ(v, 0.7f);
  EXPECT_EQ(noise_calls, 3);  // re-noised after every step but the last
}

TEST(Sampling, StepAtATime) {
  Gaussian g{0.0, 1.0};
  g.n = 2;
  const auto sigmas = karras_sigmas(3, 0.1, 10.0);
  auto heun = Sampler::create(SamplerKind::heun, sigmas, {5.0f, -5.0f});
  // Heun: two evaluations per step (at sigma, then at the next sigma), one on the last step to 0.
  std::vector<double> seen;
  std::vector<float> x0(2);
  const DenoiseFn d = g.denoiser();
  while (!heun->done()) {
    seen.push_back(heun->eval_sigma());
    d(heun->eval_x().data(), heun->eval_sigma(), x0.data());
    heun->feed(x0.data());
  }
  EXPECT_EQ(seen, (std::vector<double>{sigmas[0], sigmas[1], sigmas[1], sigmas[2], sigmas[2]}));
  EXPECT_EQ(heun->step_index(), 3);
  EXPECT_THROW(heun->feed(x0.data()), atelier::Error);
  // Feeding by hand equals step().
  auto a = Sampler::create(SamplerKind::dpmpp_2m, sigmas, {5.0f, -5.0f});
  auto b = Sampler::create(SamplerKind::dpmpp_2m, sigmas, {5.0f, -5.0f});
  while (!a->done()) {
    a->step(d);
    d(b->eval_x().data(), b->eval_sigma(), x0.data());
    b->feed(x0.data());
    EXPECT_EQ(a->x(), b->x());
  }
  SamplerKind k;
  EXPECT_TRUE(parse_sampler("Euler a", &k));
  EXPECT_EQ(k, SamplerKind::euler_ancestral);
  EXPECT_TRUE(parse_sampler("DPM++ 2M", &k));
  EXPECT_EQ(k, SamplerKind::dpmpp_2m);
  EXPECT_FALSE(parse_sampler("plms", &k));
  EXPECT_THROW(Sampler::create(SamplerKind::euler, {1.0, 2.0, 0.0}, {0.0f}), atelier::Error);
}
