#include "image/sd_pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <tuple>

#include "core/error.h"

namespace atelier::image {

namespace {

Conditioning encode_chunks(DiffusionModel& model, const std::vector<tok::PromptChunk>& chunks) {
  Conditioning c;
  const size_t per = static_cast<size_t>(tok::ClipTokenizer::kContext) * static_cast<size_t>(model.context_dim());
  c.tokens = static_cast<int>(chunks.size()) * tok::ClipTokenizer::kContext;
  c.values.resize(per * chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) model.encode_text(chunks[i], c.values.data() + i * per);
  return c;
}

}  // namespace

std::pair<Conditioning, Conditioning> encode_prompts(DiffusionModel& model, const tok::ClipTokenizer& tok,
                                                     const std::string& prompt, const std::string& negative) {
  auto pos = tok::tokenize_weighted(tok, prompt, model.pad_id());
  auto neg = tok::tokenize_weighted(tok, negative, model.pad_id());
  // A1111: the shorter side is padded with the empty prompt's chunk, so cond
  // and uncond rows have the same length and can share one network call.
  const auto empty = tok::tokenize_weighted(tok, "", model.pad_id()).front();
  while (pos.size() < neg.size()) pos.push_back(empty);
  while (neg.size() < pos.size()) neg.push_back(empty);
  return {encode_chunks(model, pos), encode_chunks(model, neg)};
}

ImageTask::ImageTask(const TaskOptions& o, int latent_channels, const NoiseSchedule& schedule,
                     std::shared_ptr<const Conditioning> cond, std::shared_ptr<const Conditioning> uncond)
    : c_(latent_channels), cfg_(o.cfg_scale), seed_(o.seed), cond_(std::move(cond)), uncond_(std::move(uncond)) {
  if (o.width < 8 || o.height < 8 || o.width % 8 || o.height % 8)
    throw Error("image size " + std::to_string(o.width) + "x" + std::to_string(o.height) + " is not a multiple of 8");
  if (o.steps < 1) throw Error("steps must be at least 1");
  if (!cond_ || cond_->tokens <= 0) throw Error("the prompt's conditioning is empty");
  if (uncond_ && uncond_->tokens != cond_->tokens) throw Error("prompt and negative prompt conditioning differ in length");
  h_ = o.height / 8;
  w_ = o.width / 8;
  const size_t n = static_cast<size_t>(c_) * h_ * w_;
  const bool img2img = !o.init_latent.empty();
  if (img2img && o.init_latent.size() != n)
    throw Error("the init image's latent has " + std::to_string(o.init_latent.size()) + " values, expected " + std::to_string(n));
  if (img2img && !(o.strength > 0.0f && o.strength <= 1.0f)) throw Error("strength must be in (0, 1]");
  if (!o.latent_mask.empty()) {
    if (!img2img) throw Error("a mask needs an init image");
    if (o.latent_mask.size() != static_cast<size_t>(h_) * w_) throw Error("the mask does not match the latent size");
  }

  std::vector<double> sigmas;
  switch (o.sampler) {
    case SamplerKind::ddim: sigmas = ddim_sigmas(schedule, o.steps); break;
    case SamplerKind::lcm: sigmas = lcm_sigmas(schedule, o.steps); break;
    default:
      sigmas = o.karras ? karras_sigmas(o.steps, schedule.sigma_min(), schedule.sigma_max())
                        : discrete_sigmas(schedule, o.steps);
  }
  if (img2img) {
    // A1111's setup_img2img_steps: t_enc = int(min(strength, 0.999) * steps),
    // the schedule's last t_enc + 2 sigmas.
    const int t_enc = static_cast<int>(std::min(o.strength, 0.999f) * static_cast<float>(o.steps));
    sigmas.erase(sigmas.begin(), sigmas.begin() + (o.steps - t_enc - 1));
  }

  // torch.manual_seed(seed); randn([C, h, w]) for the initial noise; the
  // ancestral samplers draw their later noise from the same generator.
  rng_ = std::make_unique<TorchRandn>(o.rng, o.seed);
  const std::vector<float> noise = rng_->randn(static_cast<int64_t>(n));
  std::vector<float> x(n);
  const double s0 = sigmas.front();
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>((img2img ? o.init_latent[i] : 0.0f) + noise[i] * s0);
  init_latent_ = o.init_latent;
  if (!o.latent_mask.empty()) {
    mask_.resize(n);
    for (size_t i = 0; i < n; ++i) mask_[i] = std::clamp(o.latent_mask[i % (static_cast<size_t>(h_) * w_)], 0.0f, 1.0f);
  }
  NoiseFn noise_fn = [this](float* out, size_t count) {
    const std::vector<float> v = rng_->randn(static_cast<int64_t>(count));
    std::memcpy(out, v.data(), count * sizeof(float));
  };
  sampler_ = Sampler::create(o.sampler, std::move(sigmas), std::move(x), std::move(noise_fn));
}

std::vector<float> ImageTask::result_latent() const {
  std::vector<float> x = sampler_->x();
  if (!mask_.empty())
    for (size_t i = 0; i < x.size(); ++i) x[i] = init_latent_[i] * (1.0f - mask_[i]) + x[i] * mask_[i];
  return x;
}

void ImageTask::fill_inputs(float* x_rows, float* t_rows, float* ctx_rows, const NoiseSchedule& schedule) const {
  const size_t n = static_cast<size_t>(c_) * h_ * w_;
  const double sigma = sampler_->eval_sigma();
  const double c_in = 1.0 / std::sqrt(sigma * sigma + 1.0);
  const float t = static_cast<float>(schedule.sigma_to_t(sigma));
  const std::vector<float>& ex = sampler_->eval_x();
  const int rows = guided() ? 2 : 1;
  for (int r = 0; r < rows; ++r) {
    for (size_t i = 0; i < n; ++i) x_rows[r * n + i] = static_cast<float>(ex[i] * c_in);
    t_rows[r] = t;
    const Conditioning& c = r == 0 ? *cond_ : *uncond_;
    std::memcpy(ctx_rows + r * c.values.size(), c.values.data(), c.values.size() * sizeof(float));
  }
}

void ImageTask::consume(const float* out, Prediction prediction) {
  const size_t n = static_cast<size_t>(c_) * h_ * w_;
  std::vector<float> model_out(out, out + n);
  if (guided())  // classifier-free guidance on the raw output (linear, so the same as on x0)
    for (size_t i = 0; i < n; ++i) model_out[i] = out[n + i] + cfg_ * (out[i] - out[n + i]);
  const double sigma = sampler_->eval_sigma();
  const std::vector<float>& x = sampler_->eval_x();
  last_x0_.resize(n);
  x0_from_output(x.data(), model_out.data(), sigma, prediction, n, last_x0_.data());
  // Inpainting with a regular model (A1111): the kept region's x0 is the init latent.
  if (!mask_.empty())
    for (size_t i = 0; i < n; ++i) last_x0_[i] = init_latent_[i] * (1.0f - mask_[i]) + last_x0_[i] * mask_[i];
  sampler_->feed(last_x0_.data());
}

int run_step(DiffusionModel& model, const std::vector<ImageTask*>& tasks) {
  std::map<std::tuple<int, int, int>, std::vector<ImageTask*>> groups;
  for (ImageTask* t : tasks)
    if (t && !t->done()) groups[{t->latent_h(), t->latent_w(), t->ctx_tokens()}].push_back(t);
  int total_rows = 0;
  const int c = model.latent_channels();
  const size_t dim = static_cast<size_t>(model.context_dim());
  for (auto& [key, group] : groups) {
    const auto [h, w, ctx] = key;
    const size_t n = static_cast<size_t>(c) * h * w, per_ctx = static_cast<size_t>(ctx) * dim;
    int rows = 0;
    for (ImageTask* t : group) rows += t->guided() ? 2 : 1;
    std::vector<float> x(n * rows), ts(rows), cx(per_ctx * rows), out(n * rows);
    int r = 0;
    for (ImageTask* t : group) {
      t->fill_inputs(x.data() + r * n, ts.data() + r, cx.data() + r * per_ctx, model.schedule());
      r += t->guided() ? 2 : 1;
    }
    model.unet(rows, h, w, x.data(), ts.data(), ctx, cx.data(), out.data());
    r = 0;
    for (ImageTask* t : group) {
      t->consume(out.data() + r * n, model.prediction());
      r += t->guided() ? 2 : 1;
    }
    total_rows += rows;
  }
  return total_rows;
}

Preview make_preview(DiffusionModel& model, const std::vector<float>& latent, int h, int w) {
  if (const TaesdNet* dec = model.preview_decoder()) return taesd_preview(*dec, latent.data(), h, w);
  const int c = static_cast<int>(latent.size() / (static_cast<size_t>(h) * w));
  if (c == 4) return latent_preview(latent.data(), c, h, w, LatentRgbProjection::sd15());
  LatentRgbProjection grey;
  grey.factors.assign(static_cast<size_t>(c), {0.0f, 0.0f, 0.0f});
  grey.factors[0] = {1.0f, 1.0f, 1.0f};
  return latent_preview(latent.data(), c, h, w, grey);
}

}  // namespace atelier::image
