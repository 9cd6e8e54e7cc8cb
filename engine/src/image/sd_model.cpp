#include "image/sd_model.h"

#include <chrono>
#include <cmath>

#include "core/error.h"
#include "core/process_memory.h"
#include "image/clip_text.h"
#include "image/unet.h"
#include "image/vae.h"

namespace atelier::image {

std::string_view sd_version_name(SdVersion v) { return v == SdVersion::sd2 ? "SD 2.x" : "SD 1.x"; }

namespace {

std::optional<Prediction> parse_prediction(const std::string& s) {
  if (s == "v" || s == "v_prediction" || s == "v-prediction") return Prediction::v;
  if (s == "epsilon" || s == "eps") return Prediction::epsilon;
  return std::nullopt;
}

SdInfo detect(const WeightStore& ws, const SdOptions& opt) {
  SdInfo info;
  info.clip = detect_clip(ws, opt.clip_skip);
  const bool clip_says_sd2 = info.clip.open_clip || info.clip.width == 1024;
  info.unet = detect_unet(ws, opt, clip_says_sd2);
  info.vae = detect_vae(ws);
  if (info.clip.width != info.unet.context_dim)
    throw Error(ws.path() + ": the text encoder is " + std::to_string(info.clip.width) + " wide but the UNet's "
                "cross-attention expects " + std::to_string(info.unet.context_dim) + " (mixed-up components?)");
  const auto arch = ws.meta("atelier.arch");
  const bool sd2 = clip_says_sd2 || info.unet.context_dim == 1024 || info.unet.linear_proj || (arch && *arch == "sd21");
  info.version = sd2 ? SdVersion::sd2 : SdVersion::sd1;
  if (info.unet.out_channels != info.vae.latent_channels)
    throw Error(ws.path() + ": the UNet predicts " + std::to_string(info.unet.out_channels) + " channels but the VAE has " +
                std::to_string(info.vae.latent_channels));

  info.prediction = sd2 ? Prediction::v : Prediction::epsilon;
  if (opt.prediction) {
    info.prediction = *opt.prediction;
  } else {
    for (const char* key : {"modelspec.prediction_type", "prediction_type", "diffusers.prediction_type"})
      if (auto m = ws.meta(key)) {
        const auto p = parse_prediction(*m);
        if (!p) throw Error(ws.path() + ": metadata " + key + " = '" + *m + "' is not a prediction type (epsilon or v)");
        info.prediction = *p;
        break;
      }
  }
  const auto& u = info.unet;
  info.summary = std::string(sd_version_name(info.version)) + ", UNet " + std::to_string(u.model_channels) + " ch (in " +
                 std::to_string(u.in_channels) + (u.in_channels == 9 ? ", inpainting" : "") + "), context " +
                 std::to_string(u.context_dim) + ", CLIP " + std::to_string(info.clip.layers_used) + "/" +
                 std::to_string(info.clip.layers) + " layers x " + std::to_string(info.clip.width) + ", VAE " +
                 std::to_string(info.vae.channels) + " ch" + (info.vae.has_encoder ? "" : " (decoder only)") + ", " +
                 (info.prediction == Prediction::v ? "v-prediction" : "eps-prediction");
  return info;
}

}  // namespace

SdInfo SdModel::inspect(const std::string& path, const SdOptions& options) {
  const auto ws = WeightStore::open(path, options.precision);
  return detect(*ws, options);
}

SdModel::SdModel() = default;
SdModel::~SdModel() = default;

std::unique_ptr<SdModel> SdModel::open(const std::string& path, const SdOptions& options, kernels::Backend& backend) {
  std::unique_ptr<SdModel> m(new SdModel());
  m->ws_ = WeightStore::open(path, options.precision);
  const WeightStore& ws = *m->ws_;
  m->release_idle_ = options.release_idle_weights;
  m->info_ = detect(ws, options);
  // Each network's pages leave the process once it is loaded: loading reads
  // them all, and only the network that runs next needs its own.
  m->clip_ = ClipTextEncoder::load(ws, m->info_.clip);
  m->clip_pages_ = m->ws_->take_in_place();
  m->unet_ = Unet::load(ws, m->info_.unet);
  m->unet_pages_ = m->ws_->take_in_place();
  m->vae_ = Vae::load(ws, m->info_.vae);
  m->vae_pages_ = m->ws_->take_in_place();
  m->ws_->place(backend);
  if (m->release_idle_)
    for (Part p : {Part::text_encoder, Part::unet, Part::vae}) m->release_weights(p);
  trace_memory("sd model loaded");
  return m;
}

const PageSpans& SdModel::spans(Part part) const {
  switch (part) {
    case Part::text_encoder: return clip_pages_;
    case Part::unet: return unet_pages_;
    case Part::vae: break;
  }
  return vae_pages_;
}

uint64_t SdModel::in_place_bytes(Part part) const { return spans(part).bytes(); }

uint64_t SdModel::release_weights(Part part) const { return ws_->release(spans(part)); }

int64_t SdModel::weight_bytes() const { return clip_->weight_bytes() + unet_->weight_bytes() + vae_->weight_bytes(); }

int64_t SdModel::working_bytes(int rows, int h, int w, bool encode) const {
  const int64_t f = sizeof(float), pixels = int64_t{64} * h * w;
  int64_t bytes = unet_->workspace_bytes(rows, h, w, info_.clip.positions);
  bytes += vae_->decode_floats(h, w) * f;
  if (encode && vae_->has_encoder()) bytes += vae_->encode_floats(8 * h, 8 * w) * f;
  // The samplers' latents (a few copies per row) and the decoded picture.
  bytes += 8 * int64_t{rows} * latent_channels() * h * w * f + 2 * 3 * pixels * f;
  return bytes;
}

std::vector<float> SdModel::encode_prompt(const int32_t* ids, const float* weights, int n_tokens,
                                          kernels::Executor* ex) const {
  return encode_prompt(ids, weights, n_tokens, *kernels::make_cpu_backend(ex));
}

std::vector<float> SdModel::encode_prompt(const int32_t* ids, const float* weights, int n_tokens,
                                          kernels::Backend& be) const {
  const int T = info_.clip.positions;
  if (n_tokens <= 0 || n_tokens % T)
    throw Error("encode_prompt: " + std::to_string(n_tokens) + " tokens; expected whole chunks of " + std::to_string(T));
  const int64_t w = info_.clip.width;
  // A job's prompt is encoded while other jobs' images step: the UNet's
  // pages go first (the next step faults them back), so the text encoder
  // and the UNet are never resident together.
  if (release_idle_) release_weights(Part::unet);
  std::vector<float> out(static_cast<size_t>(n_tokens * w));
  for (int c = 0; c < n_tokens / T; ++c) {
    float* z = out.data() + static_cast<int64_t>(c) * T * w;
    clip_->encode(ids + c * T, z, be);
    if (!weights) continue;
    const float* wt = weights + c * T;
    bool all_one = true;
    for (int t = 0; t < T; ++t) all_one = all_one && wt[t] == 1.0f;
    if (all_one) continue;
    // A1111 (sd_hijack_clip): scale each token, then restore the chunk's mean.
    const int64_t n = T * w;
    double before = 0, after = 0;
    for (int64_t i = 0; i < n; ++i) before += z[i];
    for (int t = 0; t < T; ++t)
      for (int64_t i = 0; i < w; ++i) z[t * w + i] *= wt[t];
    for (int64_t i = 0; i < n; ++i) after += z[i];
    const float k = after != 0 ? static_cast<float>((before / n) / (after / n)) : 1.0f;
    for (int64_t i = 0; i < n; ++i) z[i] *= k;
  }
  if (release_idle_) release_weights(Part::text_encoder);
  trace_memory("prompt encoded");
  return out;
}

void SdModel::unet(const UnetBatch& in, float* out, kernels::Backend& be) const { unet_->forward(in, out, be); }
void SdModel::unet(const UnetBatch& in, float* out, kernels::Executor* ex) const { unet_->forward(in, out, ex); }

// The VAE runs between the UNet's steps of different images, or after them:
// while it does, its workspace (the largest of the three at full resolution)
// and the UNet's weights would otherwise be resident together.
std::vector<float> SdModel::vae_decode(const float* latent, int h, int w, kernels::Executor* ex) const {
  return vae_decode(latent, h, w, *kernels::make_cpu_backend(ex));
}

std::vector<float> SdModel::vae_decode(const float* latent, int h, int w, kernels::Backend& be) const {
  trace_memory("vae decode start");
  if (release_idle_) release_weights(Part::unet);
  auto rgb = vae_->decode(latent, h, w, be);
  if (release_idle_) release_weights(Part::vae);
  trim_heap();
  trace_memory("vae decode end");
  return rgb;
}

std::vector<float> SdModel::vae_encode(const float* rgb, int h, int w, kernels::Executor* ex) const {
  return vae_encode(rgb, h, w, *kernels::make_cpu_backend(ex));
}

std::vector<float> SdModel::vae_encode(const float* rgb, int h, int w, kernels::Backend& be) const {
  if (release_idle_) release_weights(Part::unet);
  auto lat = vae_->encode(rgb, h, w, be);
  if (release_idle_) release_weights(Part::vae);
  return lat;
}

UnetTiming time_unet(const SdModel& model, int batch, int latent_h, int latent_w, int reps, kernels::Backend& ex) {
  if (batch <= 0 || reps <= 0) throw Error("time_unet: batch and reps must be positive");
  const auto& cfg = model.info().unet;
  const size_t per = static_cast<size_t>(cfg.in_channels) * latent_h * latent_w;
  std::vector<float> x(per * batch), out(static_cast<size_t>(cfg.out_channels) * latent_h * latent_w * batch), t(batch);
  uint32_t r = 12345;
  for (float& v : x) {
    r = r * 1664525u + 1013904223u;
    v = static_cast<float>(r >> 8) / 8388608.0f - 1.0f;
  }
  for (int b = 0; b < batch; ++b) t[static_cast<size_t>(b)] = 999.0f - 999.0f * b / batch;
  const std::vector<float> ctx(static_cast<size_t>(77) * cfg.context_dim, 0.0f);
  UnetBatch in;
  in.batch = batch, in.height = latent_h, in.width = latent_w, in.x = x.data(), in.timesteps = t.data();
  in.context.assign(static_cast<size_t>(batch), std::span<const float>(ctx));
  model.unet(in, out.data(), ex);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) model.unet(in, out.data(), ex);
  UnetTiming tm;
  tm.seconds_per_step = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
  tm.flops_per_step = unet_flops(cfg, latent_h, latent_w) * batch;
  tm.gflop_per_s = tm.flops_per_step / tm.seconds_per_step / 1e9;
  return tm;
}

}  // namespace atelier::image
