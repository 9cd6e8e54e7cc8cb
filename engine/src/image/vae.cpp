#include "image/vae.h"

#include <algorithm>

#include "core/error.h"

namespace atelier::image {

namespace {

const std::string kP = "first_stage_model.";

struct ResnetBlock {
  Norm n1, n2;
  Conv2d c1, c2;
  std::unique_ptr<Conv2d> shortcut;
  int64_t c_in = 0, c_out = 0;

  static ResnetBlock load(const WeightStore& ws, const std::string& p, int64_t cin, int64_t cout) {
    ResnetBlock r;
    r.c_in = cin, r.c_out = cout;
    r.n1 = Norm::load(ws, p + "norm1.", cin);
    r.c1 = Conv2d::load(ws, p + "conv1.", cin, cout, 3);
    r.n2 = Norm::load(ws, p + "norm2.", cout);
    r.c2 = Conv2d::load(ws, p + "conv2.", cout, cout, 3);
    if (cin != cout) r.shortcut = std::make_unique<Conv2d>(Conv2d::load(ws, p + "nin_shortcut.", cin, cout, 1));
    return r;
  }

  std::vector<float> operator()(const std::vector<float>& x, int64_t h, int64_t w, kernels::Executor* ex) const {
    std::vector<float> t(x.size());
    kernels::group_norm(x.data(), t.data(), 1, c_in, h * w, 32, n1.g.data(), n1.b.data(), 1e-6f, true, ex);
    int64_t hh = h, ww = w;
    std::vector<float> y = c1(t.data(), 1, hh, ww, ex);
    kernels::group_norm(y.data(), y.data(), 1, c_out, h * w, 32, n2.g.data(), n2.b.data(), 1e-6f, true, ex);
    std::vector<float> z = c2(y.data(), 1, hh, ww, ex);
    if (shortcut) {
      hh = h, ww = w;
      const std::vector<float> s = (*shortcut)(x.data(), 1, hh, ww, ex);
      for (size_t i = 0; i < z.size(); ++i) z[i] += s[i];
    } else {
      for (size_t i = 0; i < z.size(); ++i) z[i] += x[i];
    }
    return z;
  }
};

struct AttnBlock {
  Norm norm;
  Linear q, k, v, proj;
  int64_t c = 0;

  static AttnBlock load(const WeightStore& ws, const std::string& p, int64_t c) {
    AttnBlock a;
    a.c = c;
    a.norm = Norm::load(ws, p + "norm.", c);
    a.q = Linear::load(ws, p + "q.", c, c);
    a.k = Linear::load(ws, p + "k.", c, c);
    a.v = Linear::load(ws, p + "v.", c, c);
    a.proj = Linear::load(ws, p + "proj_out.", c, c);
    return a;
  }

  void operator()(std::vector<float>& x, int64_t hw, kernels::Executor* ex) const {
    std::vector<float> g(x.size()), t(x.size()), qq(x.size()), kk(x.size()), vv(x.size()), o(x.size());
    kernels::group_norm(x.data(), g.data(), 1, c, hw, 32, norm.g.data(), norm.b.data(), 1e-6f, false, ex);
    to_tokens(g.data(), t.data(), 1, c, hw);
    q(t.data(), qq.data(), hw, ex);
    k(t.data(), kk.data(), hw, ex);
    v(t.data(), vv.data(), hw, ex);
    kernels::AttentionShape s;
    s.batch = 1, s.heads = 1, s.lq = hw, s.lk = hw, s.head_dim = c;
    kernels::attention(s, qq.data(), kk.data(), vv.data(), o.data(), ex);
    proj(o.data(), t.data(), hw, ex);
    from_tokens(t.data(), g.data(), 1, c, hw);
    for (size_t i = 0; i < x.size(); ++i) x[i] += g[i];
  }
};

}  // namespace

struct Vae::Half {
  Conv2d conv_in, conv_out;
  std::vector<std::vector<ResnetBlock>> levels;  // encoder: down.i; decoder: up.i (index = level)
  std::vector<std::unique_ptr<Conv2d>> resample;  // per level: downsample / upsample conv, or null
  ResnetBlock mid1, mid2;
  AttnBlock attn;
  Norm norm_out;
  Conv2d quant;  // quant_conv (encoder) / post_quant_conv (decoder)
  int64_t mid_c = 0;
};

VaeConfig detect_vae(const WeightStore& ws) {
  VaeConfig c;
  const TensorRef* out = ws.find(kP + "decoder.conv_out.weight");
  const TensorRef* pq = ws.find(kP + "post_quant_conv.weight");
  if (!out || !pq)
    throw Error(ws.path() + ": no VAE decoder (" + kP + "decoder.conv_out.weight / post_quant_conv.weight missing)");
  if (out->shape.size() != 4 || pq->shape.empty()) throw Error(ws.path() + ": VAE decoder.conv_out has shape " + WeightStore::shape_str(out->shape));
  c.channels = static_cast<int>(out->shape[1]);
  c.latent_channels = static_cast<int>(pq->shape[0]);
  int levels = 0;
  while (ws.has(kP + "decoder.up." + std::to_string(levels) + ".block.0.conv1.weight")) ++levels;
  if (levels == 0) throw Error(ws.path() + ": VAE decoder has no up blocks");
  c.channel_mult.assign(static_cast<size_t>(levels), 1);
  for (int i = 0; i < levels; ++i) {
    const TensorRef& t = ws.get(kP + "decoder.up." + std::to_string(i) + ".block.0.conv1.weight");
    if (t.shape.empty() || t.shape[0] % c.channels) throw Error(ws.path() + ": VAE up." + std::to_string(i) + " has shape " + WeightStore::shape_str(t.shape));
    c.channel_mult[static_cast<size_t>(i)] = static_cast<int>(t.shape[0] / c.channels);
  }
  c.res_blocks = 0;
  while (ws.has(kP + "decoder.up.0.block." + std::to_string(c.res_blocks + 1) + ".conv1.weight")) ++c.res_blocks;
  c.has_encoder = ws.has(kP + "encoder.conv_in.weight") && ws.has(kP + "quant_conv.weight");
  if (c.latent_channels != 4)
    throw UnsupportedError(ws.path() + ": a VAE with " + std::to_string(c.latent_channels) + " latent channels (SD 1.x/2.x use 4)");
  return c;
}

Vae::Vae() = default;
Vae::~Vae() = default;

std::unique_ptr<Vae> Vae::load(const WeightStore& ws, const VaeConfig& cfg) {
  std::unique_ptr<Vae> v(new Vae());
  v->cfg_ = cfg;
  const int levels = static_cast<int>(cfg.channel_mult.size());
  const int64_t L = cfg.latent_channels;
  auto ch_at = [&](int i) { return static_cast<int64_t>(cfg.channels) * cfg.channel_mult[static_cast<size_t>(i)]; };
  {
    auto d = std::make_unique<Half>();
    const std::string p = kP + "decoder.";
    int64_t ch = ch_at(levels - 1);
    d->quant = Conv2d::load(ws, kP + "post_quant_conv.", L, L, 1);
    d->conv_in = Conv2d::load(ws, p + "conv_in.", L, ch, 3);
    d->mid_c = ch;
    d->mid1 = ResnetBlock::load(ws, p + "mid.block_1.", ch, ch);
    d->attn = AttnBlock::load(ws, p + "mid.attn_1.", ch);
    d->mid2 = ResnetBlock::load(ws, p + "mid.block_2.", ch, ch);
    d->levels.resize(static_cast<size_t>(levels));
    d->resample.resize(static_cast<size_t>(levels));
    for (int i = levels - 1; i >= 0; --i) {
      for (int j = 0; j <= cfg.res_blocks; ++j) {
        d->levels[static_cast<size_t>(i)].push_back(
            ResnetBlock::load(ws, p + "up." + std::to_string(i) + ".block." + std::to_string(j) + ".", ch, ch_at(i)));
        ch = ch_at(i);
      }
      if (i > 0) d->resample[static_cast<size_t>(i)] = std::make_unique<Conv2d>(Conv2d::load(ws, p + "up." + std::to_string(i) + ".upsample.conv.", ch, ch, 3));
    }
    d->norm_out = Norm::load(ws, p + "norm_out.", ch);
    d->conv_out = Conv2d::load(ws, p + "conv_out.", ch, 3, 3);
    v->dec_ = std::move(d);
  }
  if (cfg.has_encoder) {
    auto e = std::make_unique<Half>();
    const std::string p = kP + "encoder.";
    int64_t ch = cfg.channels;
    e->conv_in = Conv2d::load(ws, p + "conv_in.", 3, ch, 3);
    e->levels.resize(static_cast<size_t>(levels));
    e->resample.resize(static_cast<size_t>(levels));
    for (int i = 0; i < levels; ++i) {
      for (int j = 0; j < cfg.res_blocks; ++j) {
        e->levels[static_cast<size_t>(i)].push_back(
            ResnetBlock::load(ws, p + "down." + std::to_string(i) + ".block." + std::to_string(j) + ".", ch, ch_at(i)));
        ch = ch_at(i);
      }
      if (i + 1 < levels) {
        auto c = std::make_unique<Conv2d>(Conv2d::load(ws, p + "down." + std::to_string(i) + ".downsample.conv.", ch, ch, 3, 2));
        c->pad = 0;  // ldm pads (0, 1, 0, 1) by hand before this conv
        e->resample[static_cast<size_t>(i)] = std::move(c);
      }
    }
    e->mid_c = ch;
    e->mid1 = ResnetBlock::load(ws, p + "mid.block_1.", ch, ch);
    e->attn = AttnBlock::load(ws, p + "mid.attn_1.", ch);
    e->mid2 = ResnetBlock::load(ws, p + "mid.block_2.", ch, ch);
    e->norm_out = Norm::load(ws, p + "norm_out.", ch);
    e->conv_out = Conv2d::load(ws, p + "conv_out.", ch, 2 * L, 3);
    e->quant = Conv2d::load(ws, kP + "quant_conv.", 2 * L, 2 * L, 1);
    v->enc_ = std::move(e);
  }
  return v;
}

int64_t Vae::weight_bytes() const {
  int64_t total = 0;
  auto conv = [](const Conv2d& c) { return static_cast<int64_t>(c.w.bytes.size() + c.b.size() * 4); };
  auto res = [&](const ResnetBlock& r) { return conv(r.c1) + conv(r.c2) + (r.shortcut ? conv(*r.shortcut) : 0); };
  for (const Half* h : {enc_.get(), dec_.get()}) {
    if (!h) continue;
    total += conv(h->conv_in) + conv(h->conv_out) + conv(h->quant) + res(h->mid1) + res(h->mid2);
    for (const Linear* l : {&h->attn.q, &h->attn.k, &h->attn.v, &h->attn.proj}) total += static_cast<int64_t>(l->w.bytes.size());
    for (const auto& lv : h->levels)
      for (const auto& r : lv) total += res(r);
    for (const auto& c : h->resample)
      if (c) total += conv(*c);
  }
  return total;
}

std::vector<float> Vae::decode(const float* latent, int h_in, int w_in, kernels::Executor* ex) const {
  if (h_in <= 0 || w_in <= 0) throw Error("vae: bad latent size");
  const Half& d = *dec_;
  int64_t h = h_in, w = w_in;
  const int64_t L = cfg_.latent_channels;
  std::vector<float> z(latent, latent + L * h * w);
  for (float& v : z) v /= cfg_.scale;
  std::vector<float> x = d.quant(z.data(), 1, h, w, ex);
  x = d.conv_in(x.data(), 1, h, w, ex);
  x = d.mid1(x, h, w, ex);
  d.attn(x, h * w, ex);
  x = d.mid2(x, h, w, ex);
  int64_t c = d.mid_c;
  for (int i = static_cast<int>(d.levels.size()) - 1; i >= 0; --i) {
    for (const auto& r : d.levels[static_cast<size_t>(i)]) {
      x = r(x, h, w, ex);
      c = r.c_out;
    }
    if (const auto& up = d.resample[static_cast<size_t>(i)]) {
      std::vector<float> u(x.size() * 4);
      kernels::upsample_nearest2x(x.data(), u.data(), c, h, w, ex);
      h *= 2, w *= 2;
      x = (*up)(u.data(), 1, h, w, ex);
    }
  }
  kernels::group_norm(x.data(), x.data(), 1, c, h * w, 32, d.norm_out.g.data(), d.norm_out.b.data(), 1e-6f, true, ex);
  x = d.conv_out(x.data(), 1, h, w, ex);
  for (float& v : x) v = std::clamp((v + 1.0f) * 0.5f, 0.0f, 1.0f);
  return x;
}

std::vector<float> Vae::encode(const float* rgb, int h_in, int w_in, kernels::Executor* ex) const {
  if (!enc_) throw Error("vae: this checkpoint has no VAE encoder (img2img needs one)");
  const int64_t down = int64_t{1} << (cfg_.channel_mult.size() - 1);
  if (h_in <= 0 || w_in <= 0 || h_in % down || w_in % down)
    throw Error("vae: the encoder needs a width and height that are multiples of " + std::to_string(down) + ", got " +
                std::to_string(w_in) + "x" + std::to_string(h_in));
  const Half& e = *enc_;
  int64_t h = h_in, w = w_in;
  std::vector<float> x(rgb, rgb + 3 * h * w);
  for (float& v : x) v = 2.0f * v - 1.0f;
  x = e.conv_in(x.data(), 1, h, w, ex);
  int64_t c = e.conv_in.c_out;
  for (size_t i = 0; i < e.levels.size(); ++i) {
    for (const auto& r : e.levels[i]) {
      x = r(x, h, w, ex);
      c = r.c_out;
    }
    if (const auto& dn = e.resample[i]) {
      // torch.nn.functional.pad(x, (0, 1, 0, 1)): one zero column right, one row below.
      std::vector<float> p(static_cast<size_t>(c * (h + 1) * (w + 1)), 0.0f);
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t y = 0; y < h; ++y)
          std::copy_n(x.data() + (ch * h + y) * w, w, p.data() + (ch * (h + 1) + y) * (w + 1));
      h += 1, w += 1;
      x = (*dn)(p.data(), 1, h, w, ex);
    }
  }
  x = e.mid1(x, h, w, ex);
  e.attn(x, h * w, ex);
  x = e.mid2(x, h, w, ex);
  kernels::group_norm(x.data(), x.data(), 1, c, h * w, 32, e.norm_out.g.data(), e.norm_out.b.data(), 1e-6f, true, ex);
  x = e.conv_out(x.data(), 1, h, w, ex);
  x = e.quant(x.data(), 1, h, w, ex);
  // The distribution's mean: the first latent_channels planes (the rest is log-variance).
  const int64_t n = cfg_.latent_channels * h * w;
  std::vector<float> mean(x.begin(), x.begin() + n);
  for (float& v : mean) v *= cfg_.scale;
  return mean;
}

}  // namespace atelier::image
