#include "image/unet.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace atelier::image {

namespace {

const std::string kP = "model.diffusion_model.";

struct ResBlock {
  Norm n1, n2;
  Conv2d c1, c2;
  Linear emb;
  std::unique_ptr<Conv2d> skip;
  int64_t c_in = 0, c_out = 0;

  static std::unique_ptr<ResBlock> load(const WeightStore& ws, const std::string& p, int64_t cin, int64_t cout,
                                        int64_t temb) {
    auto r = std::make_unique<ResBlock>();
    r->c_in = cin, r->c_out = cout;
    r->n1 = Norm::load(ws, p + "in_layers.0.", cin);
    r->c1 = Conv2d::load(ws, p + "in_layers.2.", cin, cout, 3);
    r->emb = Linear::load(ws, p + "emb_layers.1.", cout, temb);
    r->n2 = Norm::load(ws, p + "out_layers.0.", cout);
    r->c2 = Conv2d::load(ws, p + "out_layers.3.", cout, cout, 3);
    if (cin != cout) r->skip = std::make_unique<Conv2d>(Conv2d::load(ws, p + "skip_connection.", cin, cout, 1));
    return r;
  }

  // x: [n][c_in][h][w]; emb_silu: [n][temb] -> [n][c_out][h][w]
  std::vector<float> operator()(const std::vector<float>& x, int64_t n, int64_t h, int64_t w, const float* emb_silu,
                                kernels::Executor* ex) const {
    const int64_t hw = h * w;
    std::vector<float> t(x.size());
    kernels::group_norm(x.data(), t.data(), n, c_in, hw, 32, n1.g.data(), n1.b.data(), 1e-5f, true, ex);
    int64_t hh = h, ww = w;
    std::vector<float> y = c1(t.data(), n, hh, ww, ex);
    std::vector<float> e(static_cast<size_t>(n * c_out));
    emb(emb_silu, e.data(), n, ex);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t c = 0; c < c_out; ++c) {
        float* p = y.data() + (b * c_out + c) * hw;
        const float v = e[static_cast<size_t>(b * c_out + c)];
        for (int64_t i = 0; i < hw; ++i) p[i] += v;
      }
    kernels::group_norm(y.data(), y.data(), n, c_out, hw, 32, n2.g.data(), n2.b.data(), 1e-5f, true, ex);
    hh = h, ww = w;
    std::vector<float> z = c2(y.data(), n, hh, ww, ex);
    if (skip) {
      hh = h, ww = w;
      const std::vector<float> s = (*skip)(x.data(), n, hh, ww, ex);
      for (size_t i = 0; i < z.size(); ++i) z[i] += s[i];
    } else {
      for (size_t i = 0; i < z.size(); ++i) z[i] += x[i];
    }
    return z;
  }
};

struct TransformerBlock {
  Norm ln1, ln2, ln3;
  Linear q1, k1, v1, o1, q2, k2, v2, o2, ff1, ff2;
};

struct SpatialTransformer {
  Norm gn;
  Linear proj_in, proj_out;
  std::vector<TransformerBlock> blocks;
  int64_t c = 0, heads = 1, ctx_dim = 0;

  static std::unique_ptr<SpatialTransformer> load(const WeightStore& ws, const std::string& p, int64_t c, int64_t heads,
                                                  int64_t ctx, int depth) {
    auto s = std::make_unique<SpatialTransformer>();
    s->c = c, s->heads = heads, s->ctx_dim = ctx;
    s->gn = Norm::load(ws, p + "norm.", c);
    s->proj_in = Linear::load(ws, p + "proj_in.", c, c);
    s->proj_out = Linear::load(ws, p + "proj_out.", c, c);
    for (int d = 0; d < depth; ++d) {
      const std::string b = p + "transformer_blocks." + std::to_string(d) + ".";
      TransformerBlock t;
      t.ln1 = Norm::load(ws, b + "norm1.", c);
      t.ln2 = Norm::load(ws, b + "norm2.", c);
      t.ln3 = Norm::load(ws, b + "norm3.", c);
      t.q1 = Linear::load(ws, b + "attn1.to_q.", c, c, false);
      t.k1 = Linear::load(ws, b + "attn1.to_k.", c, c, false);
      t.v1 = Linear::load(ws, b + "attn1.to_v.", c, c, false);
      t.o1 = Linear::load(ws, b + "attn1.to_out.0.", c, c);
      t.q2 = Linear::load(ws, b + "attn2.to_q.", c, c, false);
      t.k2 = Linear::load(ws, b + "attn2.to_k.", c, ctx, false);
      t.v2 = Linear::load(ws, b + "attn2.to_v.", c, ctx, false);
      t.o2 = Linear::load(ws, b + "attn2.to_out.0.", c, c);
      t.ff1 = Linear::load(ws, b + "ff.net.0.proj.", 8 * c, c);
      t.ff2 = Linear::load(ws, b + "ff.net.2.", c, 4 * c);
      s->blocks.push_back(std::move(t));
    }
    return s;
  }

  void operator()(std::vector<float>& x, int64_t n, int64_t hw, const UnetBatch& in, kernels::Executor* ex) const {
    const int64_t rows = n * hw;
    std::vector<float> g(x.size()), t(x.size()), nrm(x.size()), q(x.size()), k(x.size()), v(x.size()), a(x.size()),
        o(x.size());
    kernels::group_norm(x.data(), g.data(), n, c, hw, 32, gn.g.data(), gn.b.data(), 1e-6f, false, ex);
    to_tokens(g.data(), nrm.data(), n, c, hw);
    proj_in(nrm.data(), t.data(), rows, ex);
    kernels::AttentionShape self;
    self.batch = n, self.heads = heads, self.lq = hw, self.lk = hw, self.head_dim = c / heads;
    for (const auto& b : blocks) {
      kernels::layer_norm(t.data(), nrm.data(), rows, c, b.ln1.g.data(), b.ln1.b.data(), 1e-5f, ex);
      b.q1(nrm.data(), q.data(), rows, ex);
      b.k1(nrm.data(), k.data(), rows, ex);
      b.v1(nrm.data(), v.data(), rows, ex);
      kernels::attention(self, q.data(), k.data(), v.data(), a.data(), ex);
      b.o1(a.data(), o.data(), rows, ex);
      for (size_t i = 0; i < t.size(); ++i) t[i] += o[i];

      kernels::layer_norm(t.data(), nrm.data(), rows, c, b.ln2.g.data(), b.ln2.b.data(), 1e-5f, ex);
      b.q2(nrm.data(), q.data(), rows, ex);
      for (int64_t s = 0; s < n; ++s) {  // each sample its own context
        const auto& ctx = in.context[static_cast<size_t>(s)];
        const int64_t lk = static_cast<int64_t>(ctx.size()) / ctx_dim;
        std::vector<float> ck(static_cast<size_t>(lk * c)), cv(static_cast<size_t>(lk * c));
        b.k2(ctx.data(), ck.data(), lk, ex);
        b.v2(ctx.data(), cv.data(), lk, ex);
        kernels::AttentionShape cross;
        cross.batch = 1, cross.heads = heads, cross.lq = hw, cross.lk = lk, cross.head_dim = c / heads;
        kernels::attention(cross, q.data() + s * hw * c, ck.data(), cv.data(), a.data() + s * hw * c, ex);
      }
      b.o2(a.data(), o.data(), rows, ex);
      for (size_t i = 0; i < t.size(); ++i) t[i] += o[i];

      kernels::layer_norm(t.data(), nrm.data(), rows, c, b.ln3.g.data(), b.ln3.b.data(), 1e-5f, ex);
      std::vector<float> f(static_cast<size_t>(rows * 8 * c)), gg(static_cast<size_t>(rows * 4 * c));
      b.ff1(nrm.data(), f.data(), rows, ex);
      kernels::geglu(f.data(), gg.data(), rows, 4 * c, ex);
      b.ff2(gg.data(), o.data(), rows, ex);
      for (size_t i = 0; i < t.size(); ++i) t[i] += o[i];
    }
    proj_out(t.data(), o.data(), rows, ex);
    from_tokens(o.data(), g.data(), n, c, hw);
    for (size_t i = 0; i < x.size(); ++i) x[i] += g[i];
  }
};

}  // namespace

// One entry of input_blocks / output_blocks / middle_block, in order.
struct Unet::Block {
  std::unique_ptr<Conv2d> conv;        // conv_in, a downsampler (stride 2) or the final conv
  std::unique_ptr<ResBlock> res;
  std::unique_ptr<SpatialTransformer> attn;
  std::unique_ptr<ResBlock> res2;      // the middle block's second ResBlock
  std::unique_ptr<Conv2d> up;          // nearest 2x, then this conv
};

UnetConfig detect_unet(const WeightStore& ws, const SdOptions& opt, bool sd2_default) {
  if (ws.has(kP + "label_emb.0.0.weight") || !ws.names_with_prefix("conditioner.embedders.").empty())
    throw UnsupportedError(ws.path() + ": this is an SDXL checkpoint; only Stable Diffusion 1.x and 2.x are supported");
  const TensorRef* conv_in = ws.find(kP + "input_blocks.0.0.weight");
  if (!conv_in)
    throw Error(ws.path() + ": no UNet (" + kP + "input_blocks.0.0.weight is missing); not a Stable Diffusion checkpoint?");
  if (conv_in->shape.size() != 4) throw Error(ws.path() + ": UNet conv_in has shape " + WeightStore::shape_str(conv_in->shape));
  UnetConfig c;
  c.model_channels = static_cast<int>(conv_in->shape[0]);
  c.in_channels = static_cast<int>(conv_in->shape[1]);
  if (!ws.has(kP + "input_blocks.11.0.in_layers.0.weight") || ws.has(kP + "input_blocks.12.0.in_layers.0.weight") ||
      !ws.has(kP + "output_blocks.11.0.in_layers.0.weight"))
    throw UnsupportedError(ws.path() + ": the UNet is not laid out as SD 1.x/2.x's (12 input blocks: 4 levels of 2 res blocks)");
  for (int level = 0; level < 4; ++level) {
    const std::string b = kP + "input_blocks." + std::to_string(3 * level + 1) + ".";
    const TensorRef& conv = ws.get(b + "0.in_layers.2.weight");
    if (conv.shape.empty() || conv.shape[0] % c.model_channels)
      throw Error(ws.path() + ": " + b + "0.in_layers.2.weight has shape " + WeightStore::shape_str(conv.shape));
    c.channel_mult[static_cast<size_t>(level)] = static_cast<int>(conv.shape[0] / c.model_channels);
    c.attention[static_cast<size_t>(level)] = ws.has(b + "1.norm.weight");
  }
  const TensorRef& out = ws.get(kP + "out.2.weight");
  c.out_channels = static_cast<int>(out.shape.at(0));
  const std::string t0 = kP + "middle_block.1.";
  const TensorRef& to_k = ws.get(t0 + "transformer_blocks.0.attn2.to_k.weight");
  if (to_k.shape.size() != 2) throw Error(ws.path() + ": cross-attention to_k has shape " + WeightStore::shape_str(to_k.shape));
  c.context_dim = static_cast<int>(to_k.shape[1]);
  c.linear_proj = ws.get(t0 + "proj_in.weight").shape.size() == 2;
  c.transformer_depth = 0;
  while (ws.has(t0 + "transformer_blocks." + std::to_string(c.transformer_depth) + ".norm1.weight")) ++c.transformer_depth;

  // Heads: options, then metadata, then the diffusers config, then the version's rule.
  int fixed = opt.unet_heads, head_dim = opt.unet_head_dim;
  std::vector<int> per_level;
  if (fixed <= 0 && head_dim <= 0) {
    if (auto m = ws.meta("atelier.unet.num_heads")) fixed = parse_positive(*m, ws.path() + ": atelier.unet.num_heads");
    else if (auto d = ws.meta("atelier.unet.head_dim")) head_dim = parse_positive(*d, ws.path() + ": atelier.unet.head_dim");
    else if (auto j = ws.meta("diffusers.unet.attention_head_dim")) {
      // diffusers' attention_head_dim is a head count (its long-standing misnomer).
      const auto v = nlohmann::json::parse(*j, nullptr, false);
      if (v.is_number_integer()) fixed = v.get<int>();
      else if (v.is_array() && v.size() == 4 && std::all_of(v.begin(), v.end(), [](const auto& e) { return e.is_number_integer(); }))
        for (const auto& e : v) per_level.push_back(e.get<int>());
      else throw Error(ws.path() + ": unet/config.json attention_head_dim " + *j + " is neither a number nor 4 numbers");
    } else if (sd2_default || c.context_dim == 1024 || c.linear_proj) {
      head_dim = 64;
    } else {
      fixed = 8;
    }
  }
  for (int level = 0; level < 4; ++level) {
    const int ch = c.channels(level);
    int h = !per_level.empty() ? per_level[static_cast<size_t>(level)] : fixed > 0 ? fixed : ch / head_dim;
    if (h <= 0 || ch % h)
      throw Error(ws.path() + ": " + std::to_string(ch) + " UNet channels at level " + std::to_string(level) +
                  " do not split into " + std::to_string(h) + " heads (set the head count)");
    c.heads[static_cast<size_t>(level)] = h;
  }
  return c;
}

Unet::Unet() = default;
Unet::~Unet() = default;

std::unique_ptr<Unet> Unet::load(const WeightStore& ws, const UnetConfig& cfg) {
  std::unique_ptr<Unet> u(new Unet());
  u->cfg_ = cfg;
  const int64_t mc = cfg.model_channels, temb = cfg.time_embed_dim(), ctx = cfg.context_dim;
  u->temb1_ = ws.matrix(kP + "time_embed.0.weight", temb, mc);
  u->temb1_b_ = ws.vec(kP + "time_embed.0.bias", temb);
  u->temb2_ = ws.matrix(kP + "time_embed.2.weight", temb, temb);
  u->temb2_b_ = ws.vec(kP + "time_embed.2.bias", temb);
  auto first = std::make_unique<Block>();
  first->conv = std::make_unique<Conv2d>(Conv2d::load(ws, kP + "input_blocks.0.0.", cfg.in_channels, mc, 3));
  u->input_.push_back(std::move(first));
  std::vector<int64_t> skip = {mc};
  int64_t ch = mc;
  int idx = 1;
  const int levels = static_cast<int>(cfg.channel_mult.size());
  for (int level = 0; level < levels; ++level) {
    const auto L = static_cast<size_t>(level);
    for (int r = 0; r < cfg.res_blocks; ++r, ++idx) {
      const std::string b = kP + "input_blocks." + std::to_string(idx) + ".";
      auto blk = std::make_unique<Block>();
      blk->res = ResBlock::load(ws, b + "0.", ch, cfg.channels(level), temb);
      ch = cfg.channels(level);
      if (cfg.attention[L]) blk->attn = SpatialTransformer::load(ws, b + "1.", ch, cfg.heads[L], ctx, cfg.transformer_depth);
      u->input_.push_back(std::move(blk));
      skip.push_back(ch);
    }
    if (level + 1 < levels) {
      auto blk = std::make_unique<Block>();
      blk->conv = std::make_unique<Conv2d>(Conv2d::load(ws, kP + "input_blocks." + std::to_string(idx) + ".0.op.", ch, ch, 3, 2));
      u->input_.push_back(std::move(blk));
      skip.push_back(ch);
      ++idx;
    }
  }
  u->middle_ = std::make_unique<Block>();
  u->middle_->res = ResBlock::load(ws, kP + "middle_block.0.", ch, ch, temb);
  u->middle_->attn = SpatialTransformer::load(ws, kP + "middle_block.1.", ch, cfg.heads.back(), ctx, cfg.transformer_depth);
  u->middle_->res2 = ResBlock::load(ws, kP + "middle_block.2.", ch, ch, temb);
  idx = 0;
  for (int level = levels - 1; level >= 0; --level) {
    const auto L = static_cast<size_t>(level);
    for (int r = 0; r <= cfg.res_blocks; ++r, ++idx) {
      const std::string b = kP + "output_blocks." + std::to_string(idx) + ".";
      auto blk = std::make_unique<Block>();
      const int64_t sc = skip.back();
      skip.pop_back();
      blk->res = ResBlock::load(ws, b + "0.", ch + sc, cfg.channels(level), temb);
      ch = cfg.channels(level);
      int sub = 1;
      if (cfg.attention[L])
        blk->attn = SpatialTransformer::load(ws, b + std::to_string(sub++) + ".", ch, cfg.heads[L], ctx, cfg.transformer_depth);
      if (level > 0 && r == cfg.res_blocks)
        blk->up = std::make_unique<Conv2d>(Conv2d::load(ws, b + std::to_string(sub) + ".conv.", ch, ch, 3));
      u->output_.push_back(std::move(blk));
    }
  }
  u->out_norm_w_ = ws.vec(kP + "out.0.weight", mc);
  u->out_norm_b_ = ws.vec(kP + "out.0.bias", mc);
  u->out_conv_ = std::make_unique<Block>();
  u->out_conv_->conv = std::make_unique<Conv2d>(Conv2d::load(ws, kP + "out.2.", mc, cfg.out_channels, 3));
  return u;
}

int64_t Unet::weight_bytes() const {
  int64_t total = static_cast<int64_t>(temb1_.bytes.size() + temb2_.bytes.size());
  auto lin = [](const Linear& l) { return static_cast<int64_t>(l.w.bytes.size() + l.b.size() * 4); };
  auto conv = [](const Conv2d* c) { return c ? static_cast<int64_t>(c->w.bytes.size() + c->b.size() * 4) : 0; };
  auto res = [&](const ResBlock* r) { return r ? conv(&r->c1) + conv(&r->c2) + conv(r->skip.get()) + lin(r->emb) : 0; };
  auto blk = [&](const Block& b) {
    int64_t s = conv(b.conv.get()) + conv(b.up.get()) + res(b.res.get()) + res(b.res2.get());
    if (b.attn) {
      s += lin(b.attn->proj_in) + lin(b.attn->proj_out);
      for (const auto& t : b.attn->blocks)
        for (const Linear* l : {&t.q1, &t.k1, &t.v1, &t.o1, &t.q2, &t.k2, &t.v2, &t.o2, &t.ff1, &t.ff2}) s += lin(*l);
    }
    return s;
  };
  for (const auto& b : input_) total += blk(*b);
  for (const auto& b : output_) total += blk(*b);
  return total + blk(*middle_) + blk(*out_conv_);
}

void Unet::forward(const UnetBatch& in, float* out, kernels::Executor* ex) const {
  const int64_t n = in.batch;
  if (n <= 0 || in.height <= 0 || in.width <= 0 || !in.x || !in.timesteps)
    throw Error("unet: empty batch or missing input");
  const int64_t down = int64_t{1} << (cfg_.channel_mult.size() - 1);
  if (in.height % down || in.width % down)
    throw Error("unet: latent size " + std::to_string(in.width) + "x" + std::to_string(in.height) + " must be a multiple of " +
                std::to_string(down) + " (images: multiples of " + std::to_string(8 * down) + ")");
  if (static_cast<int64_t>(in.context.size()) != n) throw Error("unet: one context per sample needed");
  for (const auto& c : in.context)
    if (c.empty() || c.size() % static_cast<size_t>(cfg_.context_dim))
      throw Error("unet: a context must hold whole tokens of " + std::to_string(cfg_.context_dim) + " floats");

  // Time embedding; every ResBlock applies SiLU then its own linear.
  const int64_t mc = cfg_.model_channels, temb = cfg_.time_embed_dim();
  std::vector<float> t0(static_cast<size_t>(n * mc)), t1(static_cast<size_t>(n * temb)), emb(t1.size());
  kernels::timestep_embedding(in.timesteps, n, mc, t0.data());
  kernels::matmul(temb1_.view(), t0.data(), t1.data(), n, ex);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < temb; ++i) t1[static_cast<size_t>(b * temb + i)] += temb1_b_[static_cast<size_t>(i)];
  kernels::activation(kernels::Activation::silu, t1.data(), t1.data(), n * temb, ex);
  kernels::matmul(temb2_.view(), t1.data(), emb.data(), n, ex);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < temb; ++i) emb[static_cast<size_t>(b * temb + i)] += temb2_b_[static_cast<size_t>(i)];
  kernels::activation(kernels::Activation::silu, emb.data(), emb.data(), n * temb, ex);

  int64_t h = in.height, w = in.width, c = cfg_.in_channels;
  std::vector<float> x(in.x, in.x + n * c * h * w);
  struct Skip {
    std::vector<float> x;
    int64_t c;
  };
  std::vector<Skip> skips;
  auto run = [&](const Block& b) {
    if (b.conv) {
      x = (*b.conv)(x.data(), n, h, w, ex);
      c = b.conv->c_out;
    }
    if (b.res) {
      x = (*b.res)(x, n, h, w, emb.data(), ex);
      c = b.res->c_out;
    }
    if (b.attn) (*b.attn)(x, n, h * w, in, ex);
    if (b.res2) x = (*b.res2)(x, n, h, w, emb.data(), ex);
    if (b.up) {
      std::vector<float> u(x.size() * 4);
      kernels::upsample_nearest2x(x.data(), u.data(), n * c, h, w, ex);
      h *= 2, w *= 2;
      x = (*b.up)(u.data(), n, h, w, ex);
    }
  };
  for (const auto& b : input_) {
    run(*b);
    skips.push_back({x, c});
  }
  run(*middle_);
  for (const auto& b : output_) {
    // torch.cat([h, skip], dim=1), per sample
    const Skip s = std::move(skips.back());
    skips.pop_back();
    const int64_t hw = h * w;
    std::vector<float> cat(static_cast<size_t>(n * (c + s.c) * hw));
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(x.data() + i * c * hw, c * hw, cat.data() + i * (c + s.c) * hw);
      std::copy_n(s.x.data() + i * s.c * hw, s.c * hw, cat.data() + (i * (c + s.c) + c) * hw);
    }
    x = std::move(cat);
    c += s.c;
    run(*b);
  }
  kernels::group_norm(x.data(), x.data(), n, c, h * w, 32, out_norm_w_.data(), out_norm_b_.data(), 1e-5f, true, ex);
  const std::vector<float> y = (*out_conv_->conv)(x.data(), n, h, w, ex);
  std::copy(y.begin(), y.end(), out);
}

// ---- FLOPs (2 per multiply-add), mirroring Unet::load's walk
double unet_flops(const UnetConfig& cfg, int latent_h, int latent_w, int context_tokens) {
  double f = 0;
  int64_t h = latent_h, w = latent_w;
  const double temb = cfg.time_embed_dim(), ctx = cfg.context_dim, lk = context_tokens;
  auto conv = [&](double cin, double cout, double k, int64_t oh, int64_t ow) { f += 2.0 * cin * cout * k * k * oh * ow; };
  auto res = [&](double cin, double cout) {
    conv(cin, cout, 3, h, w);
    conv(cout, cout, 3, h, w);
    if (cin != cout) conv(cin, cout, 1, h, w);
    f += 2.0 * temb * cout;
  };
  auto attn = [&](double c) {
    const double hw = static_cast<double>(h * w);
    f += 2.0 * 2 * hw * c * c;  // proj_in, proj_out
    for (int d = 0; d < cfg.transformer_depth; ++d) {
      f += 2.0 * hw * c * c * 4 + 2.0 * 2 * hw * hw * c;               // self: q k v out; q k^T and p v
      f += 2.0 * hw * c * c * 2 + 2.0 * 2 * lk * ctx * c + 2.0 * 2 * hw * lk * c;  // cross
      f += 2.0 * hw * c * 8 * c + 2.0 * hw * 4 * c * c;                // GEGLU feed-forward
    }
  };
  f += 2.0 * (cfg.model_channels * temb + temb * temb);
  conv(cfg.in_channels, cfg.model_channels, 3, h, w);
  std::vector<double> skip = {static_cast<double>(cfg.model_channels)};
  double ch = cfg.model_channels;
  const int levels = static_cast<int>(cfg.channel_mult.size());
  for (int level = 0; level < levels; ++level) {
    for (int r = 0; r < cfg.res_blocks; ++r) {
      res(ch, cfg.channels(level));
      ch = cfg.channels(level);
      if (cfg.attention[static_cast<size_t>(level)]) attn(ch);
      skip.push_back(ch);
    }
    if (level + 1 < levels) {
      h = (h + 1) / 2, w = (w + 1) / 2;
      conv(ch, ch, 3, h, w);
      skip.push_back(ch);
    }
  }
  res(ch, ch);
  attn(ch);
  res(ch, ch);
  for (int level = levels - 1; level >= 0; --level) {
    for (int r = 0; r <= cfg.res_blocks; ++r) {
      res(ch + skip.back(), cfg.channels(level));
      skip.pop_back();
      ch = cfg.channels(level);
      if (cfg.attention[static_cast<size_t>(level)]) attn(ch);
      if (level > 0 && r == cfg.res_blocks) {
        h *= 2, w *= 2;
        conv(ch, ch, 3, h, w);
      }
    }
  }
  conv(cfg.model_channels, cfg.out_channels, 3, h, w);
  return f;
}

}  // namespace atelier::image
