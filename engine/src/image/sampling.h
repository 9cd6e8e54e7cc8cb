// Noise schedules and diffusion samplers, in k-diffusion's formulation (what
// A1111 and ComfyUI run): a latent at noise level sigma is x = x0 + sigma * n
// (the DDPM latent divided by sqrt(alpha_cumprod)), and a denoiser returns its
// estimate of x0 at (x, sigma).
//
// Samplers advance one model evaluation at a time (`Sampler::eval_x`,
// `eval_sigma`, then `feed`), so a scheduler can gather the pending
// evaluations of many jobs into one batched UNet call and cancel between
// steps; `Sampler::step(denoise)` is the loop for a single job.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace atelier::image {

// The DDPM training schedule of a model: per timestep t = 0..N-1,
// alphas_cumprod[t] and sigma(t) = sqrt((1 - a) / a), increasing in t.
class NoiseSchedule {
 public:
  // SD 1.x/2.x: betas = linspace(sqrt(beta_start), sqrt(beta_end), n)^2,
  // alphas_cumprod = cumprod(1 - beta), rounded to f32 as the checkpoints'
  // registered buffers are (so the sigmas match A1111/ComfyUI's).
  static NoiseSchedule scaled_linear(int n = 1000, double beta_start = 0.00085, double beta_end = 0.012);

  int size() const { return static_cast<int>(sigmas_.size()); }
  const std::vector<double>& alphas_cumprod() const { return alphas_cumprod_; }
  const std::vector<double>& sigmas() const { return sigmas_; }
  double sigma_min() const { return sigmas_.front(); }
  double sigma_max() const { return sigmas_.back(); }
  // k-diffusion's DiscreteSchedule: linear interpolation in log sigma between
  // neighbouring timesteps; t is fractional in [0, N-1], clamped.
  double t_to_sigma(double t) const;
  double sigma_to_t(double sigma) const;

 private:
  std::vector<double> alphas_cumprod_, sigmas_, log_sigmas_;
};

// Sigma sequences for `steps` steps: steps + 1 values, descending, ending in 0.
// discrete: t evenly spaced from N-1 down to 0 (k-diffusion get_sigmas, A1111's
// "Automatic"/"normal" for these samplers).
std::vector<double> discrete_sigmas(const NoiseSchedule& s, int steps);
// Karras et al. 2022 (eq. 5): (smax^(1/rho) + i/(steps-1) (smin^(1/rho) - smax^(1/rho)))^rho.
std::vector<double> karras_sigmas(int steps, double sigma_min, double sigma_max, double rho = 7.0);
// DDIM's "uniform" timesteps (ldm make_ddim_timesteps): t = 1, 1 + c, 1 + 2c, ...
// with c = N / steps, taken in descending order. The last step goes to sigma 0
// (ldm stops at alphas_cumprod[0], sigma 0.029: the difference is that last
// bit of noise, scaled by 0.9996).
std::vector<double> ddim_sigmas(const NoiseSchedule& s, int steps);
// LCM's timesteps (diffusers LCMScheduler, original_steps = 50): of
// t = 20k - 1 (k = 50..1), `steps` evenly picked from the largest.
std::vector<double> lcm_sigmas(const NoiseSchedule& s, int steps, int original_steps = 50);

// What the network predicts.
enum class Prediction { epsilon, v };

// The network as the pipeline calls it: `scaled_x` = x / sqrt(sigma^2 + 1)
// (the DDPM latent), `timestep` = sigma_to_t(sigma); writes its raw output
// (eps or v) for n floats.
using ModelFn = std::function<void(const float* scaled_x, double timestep, float* out)>;
// x0 estimate at (x, sigma), n floats.
using DenoiseFn = std::function<void(const float* x, double sigma, float* x0)>;

// Wraps a network into a denoiser (k-diffusion CompVisDenoiser /
// CompVisVDenoiser):
//   epsilon: x0 = x - sigma * eps
//   v:       x0 = x / (sigma^2 + 1) - sigma / sqrt(sigma^2 + 1) * v
DenoiseFn make_denoiser(ModelFn model, const NoiseSchedule& schedule, Prediction prediction, size_t n);
// The same formulas on an output already computed: x0 from x at sigma and the
// network's raw output (eps or v), n floats. (The pipeline batches the network
// calls itself and applies guidance to the outputs first.)
void x0_from_output(const float* x, const float* out, double sigma, Prediction prediction, size_t n, float* x0);

enum class SamplerKind { euler, euler_ancestral, heun, dpmpp_2m, ddim, lcm };
// "euler", "euler_a", "heun", "dpmpp_2m", "ddim", "lcm" (also A1111's names:
// "Euler a", "DPM++ 2M", ...); false when unknown.
bool parse_sampler(std::string_view name, SamplerKind* out);
std::string_view sampler_name(SamplerKind k);

// Standard normal noise for the stochastic samplers (Euler ancestral, LCM):
// fills n floats. The pipeline passes the job's torch-compatible generator.
using NoiseFn = std::function<void(float* out, size_t n)>;

class Sampler {
 public:
  // x_init: the starting latent at sigmas[0] (txt2img: noise * sigmas[0]);
  // sigmas: descending, last 0 (the *_sigmas functions). `noise` is needed by
  // euler_ancestral and lcm (nullptr elsewhere). DPM++ 2M Karras is dpmpp_2m
  // on karras_sigmas.
  static std::unique_ptr<Sampler> create(SamplerKind kind, std::vector<double> sigmas, std::vector<float> x_init,
                                         NoiseFn noise = nullptr);
  virtual ~Sampler() = default;

  SamplerKind kind() const { return kind_; }
  int steps() const { return static_cast<int>(sigmas_.size()) - 1; }
  int step_index() const { return i_; }  // steps completed
  bool done() const { return i_ >= steps(); }

  // The next model evaluation: the denoiser's input and noise level.
  const std::vector<float>& eval_x() const { return eval_x_; }
  double eval_sigma() const { return eval_sigma_; }
  // The x0 estimate at (eval_x(), eval_sigma()); advances the state. A step
  // completes when step_index() grows (Heun needs two evaluations, the others one).
  void feed(const float* x0);

  // Evaluations until the current step completes. No-op when done().
  void step(const DenoiseFn& denoise);

  // The current latent (the result once done()).
  const std::vector<float>& x() const { return x_; }

  // For the implementations (sampling.cpp); use create().
  Sampler(SamplerKind kind, std::vector<double> sigmas, std::vector<float> x, NoiseFn noise);

 protected:
  // Consumes an x0 estimate; sets eval_x_/eval_sigma_ for the next one and
  // increments i_ when a step completes.
  virtual void advance(const float* x0) = 0;
  void set_eval_to_x() { eval_x_ = x_, eval_sigma_ = done() ? 0.0 : sigmas_[static_cast<size_t>(i_)]; }

  SamplerKind kind_;
  std::vector<double> sigmas_;
  std::vector<float> x_, eval_x_;
  double eval_sigma_ = 0;
  int i_ = 0;
  NoiseFn noise_;
};

}  // namespace atelier::image
