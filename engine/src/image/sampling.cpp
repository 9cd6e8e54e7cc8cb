#include "image/sampling.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/error.h"

namespace atelier::image {

// ---- schedules ------------------------------------------------------------------

NoiseSchedule NoiseSchedule::scaled_linear(int n, double beta_start, double beta_end) {
  if (n < 2) throw Error("noise schedule: need at least 2 timesteps");
  NoiseSchedule s;
  double prod = 1.0;
  const double a = std::sqrt(beta_start), b = std::sqrt(beta_end);
  for (int t = 0; t < n; ++t) {
    const double r = a + (b - a) * t / (n - 1);
    prod *= 1.0 - r * r;
    const double ac = static_cast<float>(prod);
    s.alphas_cumprod_.push_back(ac);
    s.sigmas_.push_back(std::sqrt((1.0 - ac) / ac));
    s.log_sigmas_.push_back(std::log(s.sigmas_.back()));
  }
  return s;
}

double NoiseSchedule::t_to_sigma(double t) const {
  t = std::clamp(t, 0.0, double(size() - 1));
  const int lo = static_cast<int>(std::floor(t)), hi = static_cast<int>(std::ceil(t));
  const double w = t - lo;
  return std::exp((1.0 - w) * log_sigmas_[size_t(lo)] + w * log_sigmas_[size_t(hi)]);
}

double NoiseSchedule::sigma_to_t(double sigma) const {
  const double ls = std::log(sigma);
  // The last timestep whose log sigma is <= ls, kept below the top so that hi exists.
  int lo = 0;
  for (int i = 0; i < size(); ++i)
    if (ls - log_sigmas_[size_t(i)] >= 0) lo = i;
  lo = std::min(lo, size() - 2);
  const double l = log_sigmas_[size_t(lo)], h = log_sigmas_[size_t(lo + 1)];
  const double w = std::clamp((l - ls) / (l - h), 0.0, 1.0);
  return (1.0 - w) * lo + w * (lo + 1);
}

std::vector<double> discrete_sigmas(const NoiseSchedule& s, int steps) {
  if (steps < 1) throw Error("sampler: steps must be at least 1");
  std::vector<double> out;
  const double t_max = s.size() - 1;
  for (int i = 0; i < steps; ++i) out.push_back(s.t_to_sigma(steps == 1 ? t_max : t_max * (1.0 - double(i) / (steps - 1))));
  out.push_back(0.0);
  return out;
}

std::vector<double> karras_sigmas(int steps, double sigma_min, double sigma_max, double rho) {
  if (steps < 1) throw Error("sampler: steps must be at least 1");
  std::vector<double> out;
  const double a = std::pow(sigma_max, 1.0 / rho), b = std::pow(sigma_min, 1.0 / rho);
  for (int i = 0; i < steps; ++i) out.push_back(std::pow(a + (steps == 1 ? 0.0 : double(i) / (steps - 1)) * (b - a), rho));
  out.push_back(0.0);
  return out;
}

std::vector<double> ddim_sigmas(const NoiseSchedule& s, int steps) {
  if (steps < 1 || steps > s.size()) throw Error("sampler: DDIM steps must be between 1 and " + std::to_string(s.size()));
  const int c = s.size() / steps;
  std::vector<double> out;
  for (int i = steps - 1; i >= 0; --i) out.push_back(s.sigmas()[size_t(std::min(i * c + 1, s.size() - 1))]);
  out.push_back(0.0);
  return out;
}

std::vector<double> lcm_sigmas(const NoiseSchedule& s, int steps, int original_steps) {
  if (original_steps < 1 || steps < 1 || steps > original_steps)
    throw Error("sampler: LCM steps must be between 1 and " + std::to_string(original_steps));
  const int skip = s.size() / original_steps;
  std::vector<int> origin;  // descending: 999, 979, ..., 19
  for (int k = original_steps; k >= 1; --k) origin.push_back(k * skip - 1);
  std::vector<double> out;
  for (int i = 0; i < steps; ++i) {
    const auto idx = static_cast<size_t>(std::floor(double(i) * original_steps / steps));
    out.push_back(s.sigmas()[size_t(origin[idx])]);
  }
  out.push_back(0.0);
  return out;
}

// ---- denoiser -------------------------------------------------------------------

DenoiseFn make_denoiser(ModelFn model, const NoiseSchedule& schedule, Prediction prediction, size_t n) {
  return [model = std::move(model), &schedule, prediction, n](const float* x, double sigma, float* x0) {
    const double c_in = 1.0 / std::sqrt(sigma * sigma + 1.0);
    std::vector<float> scaled(n), out(n);
    for (size_t i = 0; i < n; ++i) scaled[i] = static_cast<float>(x[i] * c_in);
    model(scaled.data(), schedule.sigma_to_t(sigma), out.data());
    x0_from_output(x, out.data(), sigma, prediction, n, x0);
  };
}

void x0_from_output(const float* x, const float* out, double sigma, Prediction prediction, size_t n, float* x0) {
  if (prediction == Prediction::epsilon) {
    for (size_t i = 0; i < n; ++i) x0[i] = static_cast<float>(x[i] - sigma * out[i]);
  } else {
    const double c_in = 1.0 / std::sqrt(sigma * sigma + 1.0), c_skip = 1.0 / (sigma * sigma + 1.0), c_out = -sigma * c_in;
    for (size_t i = 0; i < n; ++i) x0[i] = static_cast<float>(x[i] * c_skip + out[i] * c_out);
  }
}

// ---- samplers -------------------------------------------------------------------

namespace {

struct Named {
  const char* name;
  SamplerKind kind;
};
const Named kNames[] = {
    {"euler", SamplerKind::euler},        {"euler_a", SamplerKind::euler_ancestral},
    {"euler_ancestral", SamplerKind::euler_ancestral}, {"euler a", SamplerKind::euler_ancestral},
    {"heun", SamplerKind::heun},          {"dpmpp_2m", SamplerKind::dpmpp_2m},
    {"dpm++ 2m", SamplerKind::dpmpp_2m},  {"ddim", SamplerKind::ddim},
    {"lcm", SamplerKind::lcm},
};

// The Euler step from sigma to sigma_next along d = (x - x0) / sigma. Also
// DDIM's deterministic update: in these coordinates DDIM (eta 0) is exactly
// x0 + sigma_next * eps.
class EulerSampler : public Sampler {
 public:
  using Sampler::Sampler;
  void advance(const float* x0) override {
    const double s = sigmas_[size_t(i_)], sn = sigmas_[size_t(i_) + 1];
    for (size_t k = 0; k < x_.size(); ++k) x_[k] = static_cast<float>(x0[k] + (x_[k] - x0[k]) * (sn / s));
    ++i_;
    set_eval_to_x();
  }
};

// Euler ancestral, eta 1 (k-diffusion sample_euler_ancestral): step down to
// sigma_down, then add fresh noise of sigma_up.
class EulerAncestralSampler : public Sampler {
 public:
  using Sampler::Sampler;
  void advance(const float* x0) override {
    const double s = sigmas_[size_t(i_)], sn = sigmas_[size_t(i_) + 1];
    const double up = std::min(sn, std::sqrt(sn * sn * (s * s - sn * sn) / (s * s)));
    const double down = std::sqrt(sn * sn - up * up);
    for (size_t k = 0; k < x_.size(); ++k) x_[k] = static_cast<float>(x0[k] + (x_[k] - x0[k]) * (down / s));
    if (sn > 0) {
      noise_buf_.resize(x_.size());
      noise_(noise_buf_.data(), noise_buf_.size());
      for (size_t k = 0; k < x_.size(); ++k) x_[k] = static_cast<float>(x_[k] + noise_buf_[k] * up);
    }
    ++i_;
    set_eval_to_x();
  }

 private:
  std::vector<float> noise_buf_;
};

// Heun (k-diffusion sample_heun, no churn): an Euler predictor to sigma_next,
// then the average of both slopes; Euler alone on the last step to 0.
class HeunSampler : public Sampler {
 public:
  using Sampler::Sampler;
  void advance(const float* x0) override {
    const double s = sigmas_[size_t(i_)], sn = sigmas_[size_t(i_) + 1];
    const size_t n = x_.size();
    if (!second_) {
      d_.resize(n);
      for (size_t k = 0; k < n; ++k) d_[k] = static_cast<float>((x_[k] - x0[k]) / s);
      if (sn == 0) {
        for (size_t k = 0; k < n; ++k) x_[k] = static_cast<float>(x_[k] + d_[k] * (sn - s));
        ++i_;
        set_eval_to_x();
        return;
      }
      eval_x_.resize(n);
      for (size_t k = 0; k < n; ++k) eval_x_[k] = static_cast<float>(x_[k] + d_[k] * (sn - s));
      eval_sigma_ = sn;
      second_ = true;
      return;
    }
    for (size_t k = 0; k < n; ++k) {
      const double d2 = (eval_x_[k] - x0[k]) / sn;
      x_[k] = static_cast<float>(x_[k] + (d_[k] + d2) / 2 * (sn - s));
    }
    second_ = false;
    ++i_;
    set_eval_to_x();
  }

 private:
  bool second_ = false;
  std::vector<float> d_;
};

// DPM-Solver++(2M) (k-diffusion sample_dpmpp_2m): second order from the
// previous step's x0 estimate; first order on the first step; the step to
// sigma 0 returns the x0 estimate.
class DpmPp2mSampler : public Sampler {
 public:
  using Sampler::Sampler;
  void advance(const float* x0) override {
    const double s = sigmas_[size_t(i_)], sn = sigmas_[size_t(i_) + 1];
    const size_t n = x_.size();
    if (sn == 0) {
      std::copy(x0, x0 + n, x_.begin());
    } else {
      const double t = -std::log(s), tn = -std::log(sn), h = tn - t;
      const double ratio = sn / s, coef = -std::expm1(-h);
      if (old_.empty()) {
        for (size_t k = 0; k < n; ++k) x_[k] = static_cast<float>(ratio * x_[k] + coef * x0[k]);
      } else {
        const double h_last = t - (-std::log(sigmas_[size_t(i_) - 1]));
        const double r = h_last / h;
        for (size_t k = 0; k < n; ++k) {
          const double dd = (1 + 1 / (2 * r)) * x0[k] - (1 / (2 * r)) * old_[k];
          x_[k] = static_cast<float>(ratio * x_[k] + coef * dd);
        }
      }
    }
    old_.assign(x0, x0 + n);
    ++i_;
    set_eval_to_x();
  }

 private:
  std::vector<float> old_;
};

// LCM (ComfyUI / k-diffusion sample_lcm): jump to the x0 estimate, then
// re-noise to the next sigma with fresh noise.
class LcmSampler : public Sampler {
 public:
  using Sampler::Sampler;
  void advance(const float* x0) override {
    const double sn = sigmas_[size_t(i_) + 1];
    std::copy(x0, x0 + x_.size(), x_.begin());
    if (sn > 0) {
      noise_buf_.resize(x_.size());
      noise_(noise_buf_.data(), noise_buf_.size());
      for (size_t k = 0; k < x_.size(); ++k) x_[k] = static_cast<float>(x_[k] + noise_buf_[k] * sn);
    }
    ++i_;
    set_eval_to_x();
  }

 private:
  std::vector<float> noise_buf_;
};

}  // namespace

bool parse_sampler(std::string_view name, SamplerKind* out) {
  std::string lower;
  for (char c : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& n : kNames)
    if (lower == n.name) {
      *out = n.kind;
      return true;
    }
  return false;
}

std::string_view sampler_name(SamplerKind k) {
  switch (k) {
    case SamplerKind::euler: return "euler";
    case SamplerKind::euler_ancestral: return "euler_a";
    case SamplerKind::heun: return "heun";
    case SamplerKind::dpmpp_2m: return "dpmpp_2m";
    case SamplerKind::ddim: return "ddim";
    case SamplerKind::lcm: return "lcm";
  }
  return "?";
}

Sampler::Sampler(SamplerKind kind, std::vector<double> sigmas, std::vector<float> x, NoiseFn noise)
    : kind_(kind), sigmas_(std::move(sigmas)), x_(std::move(x)), noise_(std::move(noise)) {
  set_eval_to_x();
}

std::unique_ptr<Sampler> Sampler::create(SamplerKind kind, std::vector<double> sigmas, std::vector<float> x_init,
                                         NoiseFn noise) {
  if (sigmas.size() < 2) throw Error("sampler: need at least one step (two sigmas)");
  for (size_t i = 0; i + 1 < sigmas.size(); ++i)
    if (!(sigmas[i] > 0) || !(sigmas[i + 1] < sigmas[i]) || sigmas[i + 1] < 0)
      throw Error("sampler: sigmas must be positive and strictly decreasing to the last, which may be 0");
  if ((kind == SamplerKind::euler_ancestral || kind == SamplerKind::lcm) && !noise)
    throw Error("sampler: " + std::string(sampler_name(kind)) + " needs a noise source");
  switch (kind) {
    case SamplerKind::euler:
    case SamplerKind::ddim:
      return std::unique_ptr<Sampler>(new EulerSampler(kind, std::move(sigmas), std::move(x_init), std::move(noise)));
    case SamplerKind::euler_ancestral:
      return std::unique_ptr<Sampler>(
          new EulerAncestralSampler(kind, std::move(sigmas), std::move(x_init), std::move(noise)));
    case SamplerKind::heun:
      return std::unique_ptr<Sampler>(new HeunSampler(kind, std::move(sigmas), std::move(x_init), std::move(noise)));
    case SamplerKind::dpmpp_2m:
      return std::unique_ptr<Sampler>(new DpmPp2mSampler(kind, std::move(sigmas), std::move(x_init), std::move(noise)));
    case SamplerKind::lcm:
      return std::unique_ptr<Sampler>(new LcmSampler(kind, std::move(sigmas), std::move(x_init), std::move(noise)));
  }
  throw Error("sampler: unknown kind");
}

void Sampler::feed(const float* x0) {
  if (done()) throw Error("sampler: fed after the last step");
  advance(x0);
}

void Sampler::step(const DenoiseFn& denoise) {
  const int target = i_ + 1;
  std::vector<float> x0(x_.size());
  while (!done() && i_ < target) {
    denoise(eval_x_.data(), eval_sigma_, x0.data());
    feed(x0.data());
  }
}

}  // namespace atelier::image
