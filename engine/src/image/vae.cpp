#include "image/vae.h"

#include <algorithm>

#include "core/cancel.h"
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

  // On the backend: x -> out (c_out planes), a and b scratch; none may alias.
  void run(kernels::Backend& be, kernels::Act x, kernels::Act out, kernels::Act a, kernels::Act b, int64_t h,
           int64_t w) const {
    be.group_norm(x, a, 1, c_in, h * w, 32, n1.g.data(), n1.b.data(), 1e-6f, true);
    int64_t hh = h, ww = w;
    c1.run(be, a, b, 1, hh, ww);
    be.group_norm(b, b, 1, c_out, h * w, 32, n2.g.data(), n2.b.data(), 1e-6f, true);
    c2.run(be, b, out, 1, hh, ww);
    if (shortcut) {
      hh = h, ww = w;
      shortcut->run(be, x, a, 1, hh, ww);
      be.add(out, a, out, c_out * h * w);
    } else {
      be.add(out, x, out, c_out * h * w);
    }
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

  // In place on the backend; s holds 6 * c * hw activations of scratch.
  void run(kernels::Backend& be, kernels::Act x, int64_t hw, kernels::Act s) const {
    const int64_t n = c * hw;
    const kernels::Act g = s, t = s + n, qq = s + 2 * n, kk = s + 3 * n, vv = s + 4 * n, o = s + 5 * n;
    be.group_norm(x, g, 1, c, hw, 32, norm.g.data(), norm.b.data(), 1e-6f, false);
    be.relayout(g, be.layout(), t, kernels::Layout::NHWC, 1, c, hw);  // to tokens
    q.run(be, t, qq, hw);
    k.run(be, t, kk, hw);
    v.run(be, t, vv, hw);
    kernels::AttentionShape sh;
    sh.batch = 1, sh.heads = 1, sh.lq = hw, sh.lk = hw, sh.head_dim = c;
    be.attention(sh, qq, kk, vv, o);
    proj.run(be, o, t, hw);
    be.relayout(t, kernels::Layout::NHWC, g, be.layout(), 1, c, hw);  // back to images
    be.add(x, g, x, n);
  }
};

// Four activation slots of the largest tensor of a pass: a ResnetBlock reads
// one and writes three, and the next block reads what the last one wrote.
struct Slots {
  kernels::Act s[4] = {};
  int cur = 0;
  kernels::Act x() { return s[cur]; }
  kernels::Act free(int k) { return s[(cur + 1 + k) % 4]; }  // k = 0, 1, 2: the others
  void take(int k) { cur = (cur + 1 + k) % 4; }
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
  auto conv = [](const Conv2d& c) { return static_cast<int64_t>(c.w.nbytes() + c.b.size() * 4); };
  auto res = [&](const ResnetBlock& r) { return conv(r.c1) + conv(r.c2) + (r.shortcut ? conv(*r.shortcut) : 0); };
  for (const Half* h : {enc_.get(), dec_.get()}) {
    if (!h) continue;
    total += conv(h->conv_in) + conv(h->conv_out) + conv(h->quant) + res(h->mid1) + res(h->mid2);
    for (const Linear* l : {&h->attn.q, &h->attn.k, &h->attn.v, &h->attn.proj}) total += static_cast<int64_t>(l->w.nbytes());
    for (const auto& lv : h->levels)
      for (const auto& r : lv) total += res(r);
    for (const auto& c : h->resample)
      if (c) total += conv(*c);
  }
  return total;
}

std::vector<float> Vae::decode(const float* latent, int h, int w, kernels::Executor* ex) const {
  if (h <= 0 || w <= 0) throw Error("vae: bad latent size");
  std::vector<float> out;
  {
    auto ws = work_.acquire(ex, decode_floats(h, w));
    out = decode(ws, latent, h, w);
  }
  work_.release();  // the largest workspace of the model, used once per image
  return out;
}

std::vector<float> Vae::decode(const float* latent, int h, int w, kernels::Backend& backend) const {
  if (h <= 0 || w <= 0) throw Error("vae: bad latent size");
  std::vector<float> out;
  {
    auto ws = work_.acquire(backend, decode_floats(h, w));
    out = decode(ws, latent, h, w);
  }
  work_.release();
  return out;
}

std::vector<float> Vae::encode(const float* rgb, int h, int w, kernels::Executor* ex) const {
  check_encode(h, w);
  std::vector<float> out;
  {
    auto ws = work_.acquire(ex, encode_floats(h, w));
    out = encode(ws, rgb, h, w);
  }
  work_.release();
  return out;
}

std::vector<float> Vae::encode(const float* rgb, int h, int w, kernels::Backend& backend) const {
  check_encode(h, w);
  std::vector<float> out;
  {
    auto ws = work_.acquire(backend, encode_floats(h, w));
    out = encode(ws, rgb, h, w);
  }
  work_.release();
  return out;
}

// The largest tensor of a decode (walking its shapes), and the mid attention's.
Vae::Sizes Vae::decode_sizes(int64_t h, int64_t w) const {
  const Half& d = *dec_;
  Sizes z;
  z.stage = h * w;  // the latent's pixels; made the staging's size below
  z.slot = cfg_.latent_channels * h * w;
  z.slot = std::max(z.slot, d.mid_c * h * w);
  z.attn = d.mid_c * h * w;
  int64_t c = d.mid_c;
  for (int i = static_cast<int>(d.levels.size()) - 1; i >= 0; --i) {
    for (const auto& r : d.levels[static_cast<size_t>(i)]) {
      z.slot = std::max(z.slot, r.c_out * h * w);
      c = r.c_out;
    }
    if (d.resample[static_cast<size_t>(i)]) {
      h *= 2, w *= 2;
      z.slot = std::max(z.slot, c * h * w);
    }
  }
  z.slot = std::max(z.slot, int64_t{3} * h * w);
  z.stage = std::max(int64_t{3} * h * w, cfg_.latent_channels * z.stage);
  return z;
}

Vae::Sizes Vae::encode_sizes(int64_t h, int64_t w) const {
  const Half& e = *enc_;
  Sizes z;
  z.stage = int64_t{3} * h * w;
  z.slot = std::max(int64_t{3} * h * w, e.conv_in.c_out * h * w);
  int64_t c = e.conv_in.c_out;
  for (size_t i = 0; i < e.levels.size(); ++i) {
    for (const auto& r : e.levels[i]) {
      z.slot = std::max(z.slot, r.c_out * h * w);
      c = r.c_out;
    }
    if (const auto& dn = e.resample[i]) {
      z.slot = std::max(z.slot, c * (h + 1) * (w + 1));
      h = (h + 1 - dn->k) / dn->stride + 1, w = (w + 1 - dn->k) / dn->stride + 1;
    }
  }
  z.attn = e.mid_c * h * w;
  z.slot = std::max({z.slot, e.mid_c * h * w, 2 * int64_t{cfg_.latent_channels} * h * w});
  z.stage = std::max(z.stage, 2 * int64_t{cfg_.latent_channels} * h * w);
  return z;
}

int64_t Vae::decode_floats(int h, int w) const {
  const Sizes z = decode_sizes(h, w);
  return 4 * z.slot + 6 * z.attn + z.stage;
}

int64_t Vae::encode_floats(int h, int w) const {
  const Sizes z = encode_sizes(h, w);
  return 4 * z.slot + 6 * z.attn + z.stage;
}

void Vae::check_encode(int h_in, int w_in) const {
  if (!enc_) throw Error("vae: this checkpoint has no VAE encoder (img2img needs one)");
  const int64_t down = int64_t{1} << (cfg_.channel_mult.size() - 1);
  if (h_in <= 0 || w_in <= 0 || h_in % down || w_in % down)
    throw Error("vae: the encoder needs a width and height that are multiples of " + std::to_string(down) + ", got " +
                std::to_string(w_in) + "x" + std::to_string(h_in));
}

std::vector<float> Vae::decode(Workspace::Lease& ws, const float* latent, int h_in, int w_in) const {
  kernels::Backend& be = ws.be();
  const Half& d = *dec_;
  int64_t h = h_in, w = w_in;
  const int64_t L = cfg_.latent_channels;
  const Sizes z = decode_sizes(h, w);
  Slots S;
  for (kernels::Act& p : S.s) p = ws.take(z.slot);
  const kernels::Act attn = ws.take(6 * z.attn);
  // The host's F32 NCHW latent in and pixels out pass through here.
  const kernels::Act stage = ws.take_f32(z.stage);
  ws.upload(stage.data(), latent, L * h * w * int64_t{sizeof(float)});
  be.relayout(stage, kernels::Layout::NCHW, S.x(), be.layout(), 1, L, h * w);
  kernels::Affine unscale;
  unscale.div = cfg_.scale;
  be.affine(S.x(), S.x(), L * h * w, unscale);
  d.quant.run(be, S.x(), S.free(0), 1, h, w);
  S.take(0);
  d.conv_in.run(be, S.x(), S.free(0), 1, h, w);
  S.take(0);
  auto res = [&](const ResnetBlock& r) {
    throw_if_cancelled();  // a cancellation point between blocks (core/cancel.h)
    r.run(be, S.x(), S.free(2), S.free(0), S.free(1), h, w);
    S.take(2);
  };
  res(d.mid1);
  d.attn.run(be, S.x(), h * w, attn);
  res(d.mid2);
  int64_t c = d.mid_c;
  for (int i = static_cast<int>(d.levels.size()) - 1; i >= 0; --i) {
    for (const auto& r : d.levels[static_cast<size_t>(i)]) {
      res(r);
      c = r.c_out;
    }
    if (const auto& up = d.resample[static_cast<size_t>(i)]) {
      be.upsample_nearest2x(S.x(), S.free(0), 1, c, h, w);
      S.take(0);
      h *= 2, w *= 2;
      up->run(be, S.x(), S.free(0), 1, h, w);
      S.take(0);
    }
  }
  be.group_norm(S.x(), S.x(), 1, c, h * w, 32, d.norm_out.g.data(), d.norm_out.b.data(), 1e-6f, true);
  d.conv_out.run(be, S.x(), S.free(0), 1, h, w);
  S.take(0);
  kernels::Affine to_unit;  // [-1, 1] -> [0, 1]
  to_unit.add = 1.0f, to_unit.mul = 0.5f, to_unit.lo = 0.0f, to_unit.hi = 1.0f;
  be.affine(S.x(), S.x(), 3 * h * w, to_unit);
  std::vector<float> rgb(static_cast<size_t>(3 * h * w));
  be.relayout(S.x(), be.layout(), stage, kernels::Layout::NCHW, 1, 3, h * w);
  ws.download(stage.data(), rgb.data(), 3 * h * w * int64_t{sizeof(float)});
  return rgb;
}

std::vector<float> Vae::encode(Workspace::Lease& ws, const float* rgb, int h_in, int w_in) const {
  kernels::Backend& be = ws.be();
  const Half& e = *enc_;
  int64_t h = h_in, w = w_in;
  const Sizes z = encode_sizes(h, w);
  Slots S;
  for (kernels::Act& p : S.s) p = ws.take(z.slot);
  const kernels::Act attn = ws.take(6 * z.attn);
  const kernels::Act stage = ws.take_f32(z.stage);
  ws.upload(stage.data(), rgb, 3 * h * w * int64_t{sizeof(float)});
  be.relayout(stage, kernels::Layout::NCHW, S.x(), be.layout(), 1, 3, h * w);
  kernels::Affine from_unit;  // [0, 1] -> [-1, 1]: (v - 0.5) * 2 rounds as 2 v - 1 does
  from_unit.add = -0.5f, from_unit.mul = 2.0f;
  be.affine(S.x(), S.x(), 3 * h * w, from_unit);
  e.conv_in.run(be, S.x(), S.free(0), 1, h, w);
  S.take(0);
  auto res = [&](const ResnetBlock& r) {
    throw_if_cancelled();  // a cancellation point between blocks (core/cancel.h)
    r.run(be, S.x(), S.free(2), S.free(0), S.free(1), h, w);
    S.take(2);
  };
  int64_t c = e.conv_in.c_out;
  for (size_t i = 0; i < e.levels.size(); ++i) {
    for (const auto& r : e.levels[i]) {
      res(r);
      c = r.c_out;
    }
    if (const auto& dn = e.resample[i]) {
      // torch.nn.functional.pad(x, (0, 1, 0, 1)): one zero column right, one row below.
      kernels::Pad2d pad;
      pad.bottom = 1, pad.right = 1;
      be.pad2d(S.x(), S.free(0), 1, c, h, w, pad);
      S.take(0);
      h += 1, w += 1;
      dn->run(be, S.x(), S.free(0), 1, h, w);
      S.take(0);
    }
  }
  res(e.mid1);
  e.attn.run(be, S.x(), h * w, attn);
  res(e.mid2);
  be.group_norm(S.x(), S.x(), 1, c, h * w, 32, e.norm_out.g.data(), e.norm_out.b.data(), 1e-6f, true);
  e.conv_out.run(be, S.x(), S.free(0), 1, h, w);
  S.take(0);
  e.quant.run(be, S.x(), S.free(0), 1, h, w);
  S.take(0);
  // The distribution's mean: the first latent_channels channels (the rest
  // is log-variance, scaled too: element-wise, it changes nothing of the mean).
  const int64_t n = cfg_.latent_channels * h * w;
  kernels::Affine scale;
  scale.mul = cfg_.scale;
  be.affine(S.x(), S.x(), 2 * n, scale);
  be.relayout(S.x(), be.layout(), stage, kernels::Layout::NCHW, 1, 2 * cfg_.latent_channels, h * w);
  std::vector<float> mean(static_cast<size_t>(n));
  ws.download(stage.data(), mean.data(), n * int64_t{sizeof(float)});
  return mean;
}

}  // namespace atelier::image
