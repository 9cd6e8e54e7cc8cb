#include "image/unet.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "core/cancel.h"
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

  // On the backend: x -> out, with a, b (activation slots) and e (n * c_out
  // activations) as scratch; emb_silu: [n][temb].
  void run(kernels::Backend& be, kernels::Act x, kernels::Act out, kernels::Act a, kernels::Act b, kernels::Act e,
           int64_t n, int64_t h, int64_t w, kernels::Act emb_silu) const {
    const int64_t hw = h * w;
    be.group_norm(x, a, n, c_in, hw, 32, n1.g.data(), n1.b.data(), 1e-5f, true);
    int64_t hh = h, ww = w;
    c1.run(be, a, b, n, hh, ww);
    emb.run(be, emb_silu, e, n);
    be.add_channel_bias(b, e, n, c_out, hw);
    be.group_norm(b, b, n, c_out, hw, 32, n2.g.data(), n2.b.data(), 1e-5f, true);
    hh = h, ww = w;
    c2.run(be, b, out, n, hh, ww);
    if (skip) {
      hh = h, ww = w;
      skip->run(be, x, a, n, hh, ww);
      be.add(out, a, out, n * c_out * hw);
    } else {
      be.add(out, x, out, n * c_out * hw);
    }
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

  // In place on the backend. s: scratch_floats(n * c * hw, c) floats, then
  // 2 * lk * c for the largest context; ctx[i]: sample i's context (lk[i]
  // tokens). t, nrm and o live through the block; one region holds what is
  // never live together: g (at the ends), q, k, v, a (attention), and the
  // feed-forward's f (8c wide) and gg (4c), run a third of the rows at a
  // time to fit there (a matmul row's bits do not depend on the row count).
  static constexpr int64_t kFfRowAlign = 64;
  static int64_t ff_chunk_rows(int64_t rows) { return ((rows + 2) / 3 + kFfRowAlign - 1) / kFfRowAlign * kFfRowAlign; }
  static int64_t scratch_floats(int64_t m, int64_t c) { return 3 * m + 4 * m + 12 * c * kFfRowAlign; }
  void run(kernels::Backend& be, kernels::Act x, int64_t n, int64_t hw, kernels::Act s, const kernels::Act* ctx,
           const int64_t* lk) const {
    const int64_t rows = n * hw, m = n * c * hw, chunk = ff_chunk_rows(rows);
    const kernels::Act t = s, nrm = s + m, o = s + 2 * m, r = s + 3 * m;
    const kernels::Act g = r, q = r, k = r + m, v = r + 2 * m, a = r + 3 * m, f = r, gg = r + 8 * c * chunk;
    const kernels::Act ck = s + scratch_floats(m, c);
    be.group_norm(x, g, n, c, hw, 32, gn.g.data(), gn.b.data(), 1e-6f, false);
    be.relayout(g, be.layout(), nrm, kernels::Layout::NHWC, n, c, hw);  // to tokens
    proj_in.run(be, nrm, t, rows);
    kernels::AttentionShape self;
    self.batch = n, self.heads = heads, self.lq = hw, self.lk = hw, self.head_dim = c / heads;
    for (const auto& b : blocks) {
      be.layer_norm(t, nrm, rows, c, b.ln1.g.data(), b.ln1.b.data(), 1e-5f);
      b.q1.run(be, nrm, q, rows);
      b.k1.run(be, nrm, k, rows);
      b.v1.run(be, nrm, v, rows);
      be.attention(self, q, k, v, a);
      b.o1.run(be, a, o, rows);
      be.add(t, o, t, m);

      be.layer_norm(t, nrm, rows, c, b.ln2.g.data(), b.ln2.b.data(), 1e-5f);
      b.q2.run(be, nrm, q, rows);
      for (int64_t i = 0; i < n; ++i) {  // each sample its own context
        const kernels::Act cv = ck + lk[i] * c;
        b.k2.run(be, ctx[i], ck, lk[i]);
        b.v2.run(be, ctx[i], cv, lk[i]);
        kernels::AttentionShape cross;
        cross.batch = 1, cross.heads = heads, cross.lq = hw, cross.lk = lk[i], cross.head_dim = c / heads;
        be.attention(cross, q + i * hw * c, ck, cv, a + i * hw * c);
      }
      b.o2.run(be, a, o, rows);
      be.add(t, o, t, m);

      be.layer_norm(t, nrm, rows, c, b.ln3.g.data(), b.ln3.b.data(), 1e-5f);
      for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        const int64_t nr = std::min(chunk, rows - r0);
        b.ff1.run(be, nrm + r0 * c, f, nr);
        be.geglu(f, gg, nr, 4 * c);
        b.ff2.run(be, gg, o + r0 * c, nr);
      }
      be.add(t, o, t, m);
    }
    proj_out.run(be, t, o, rows);
    be.relayout(o, kernels::Layout::NHWC, g, be.layout(), n, c, hw);  // back to images
    be.add(x, g, x, m);
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
  int64_t total = static_cast<int64_t>(temb1_.nbytes() + temb2_.nbytes());
  auto lin = [](const Linear& l) { return static_cast<int64_t>(l.w.nbytes() + l.b.size() * 4); };
  auto conv = [](const Conv2d* c) { return c ? static_cast<int64_t>(c->w.nbytes() + c->b.size() * 4) : 0; };
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

void Unet::check(const UnetBatch& in) const {
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
}

// The shapes of a forward pass, walked as forward walks them.
Unet::Plan Unet::plan(const UnetBatch& in) const {
  int64_t ctx = 0, max_lk = 0;
  for (const auto& c : in.context) {
    ctx += static_cast<int64_t>(c.size());
    max_lk = std::max(max_lk, static_cast<int64_t>(c.size()) / cfg_.context_dim);
  }
  return plan_sizes(in.batch, in.height, in.width, ctx, max_lk);
}

int64_t Unet::workspace_bytes(int batch, int height, int width, int ctx_tokens) const {
  const Plan p = plan_sizes(batch, height, width, int64_t{batch} * ctx_tokens * cfg_.context_dim, ctx_tokens);
  return p.floats * int64_t{sizeof(float)};
}

Unet::Plan Unet::plan_sizes(int64_t n, int64_t h, int64_t w, int64_t ctx_floats, int64_t max_lk) const {
  Plan p;
  const int64_t in_h = h, in_w = w;
  int64_t c = cfg_.in_channels;
  p.slot = n * c * h * w;
  std::vector<int64_t> skip_c;
  auto see = [&] { p.slot = std::max(p.slot, n * c * h * w); };
  auto walk = [&](const Block& b) {
    if (b.conv) {
      p.slot = std::max(p.slot, b.conv->out_elems(n, h, w));
      const int64_t k = b.conv->k, pad = b.conv->pad, st = b.conv->stride;
      h = (h + 2 * pad - k) / st + 1, w = (w + 2 * pad - k) / st + 1;
      c = b.conv->c_out;
    }
    for (const ResBlock* r : {b.res.get(), b.res2.get()})
      if (r) {
        c = r->c_out;
        p.emb = std::max(p.emb, n * c);
      }
    see();
    if (b.attn) {
      p.attn = std::max(p.attn, n * c * h * w);
      p.attn_scratch = std::max(p.attn_scratch, SpatialTransformer::scratch_floats(n * c * h * w, c));
    }
    if (b.up) {
      h *= 2, w *= 2;
      see();
    }
  };
  for (const auto& b : input_) {
    walk(*b);
    p.skips.push_back(n * c * h * w);
    skip_c.push_back(c);
  }
  walk(*middle_);
  for (const auto& b : output_) {
    c += skip_c.back();
    skip_c.pop_back();
    see();
    walk(*b);
  }
  p.slot = std::max(p.slot, out_conv_->conv->out_elems(n, h, w));
  p.ctx = ctx_floats;
  p.max_lk = max_lk;
  int64_t skips = 0;
  for (int64_t z : p.skips) skips += (z + 15) / 16 * 16;
  const int64_t mc = cfg_.model_channels, temb = cfg_.time_embed_dim();
  int64_t max_c = 0;
  for (int level = 0; level < static_cast<int>(cfg_.channel_mult.size()); ++level) max_c = std::max<int64_t>(max_c, cfg_.channels(level));
  p.stage = std::max({n * cfg_.in_channels * in_h * in_w, n * cfg_.out_channels * in_h * in_w, p.ctx});
  p.floats = 4 * p.slot + skips + p.attn_scratch + 2 * p.max_lk * max_c + p.emb + p.ctx + n + n * mc + 2 * n * temb +
             p.stage;
  return p;
}

void Unet::forward(const UnetBatch& in, float* out, kernels::Executor* ex) const {
  check(in);
  const Plan p = plan(in);
  auto ws = work_.acquire(ex, p.floats);
  forward(ws, p, in, out);
}

void Unet::forward(const UnetBatch& in, float* out, kernels::Backend& backend) const {
  check(in);
  const Plan p = plan(in);
  auto ws = work_.acquire(backend, p.floats);
  forward(ws, p, in, out);
}

void Unet::forward(Workspace::Lease& ws, const Plan& p, const UnetBatch& in, float* out) const {
  kernels::Backend& be = ws.be();
  const int64_t n = in.batch;
  const int64_t mc = cfg_.model_channels, temb = cfg_.time_embed_dim();
  int64_t max_c = 0;
  for (int level = 0; level < static_cast<int>(cfg_.channel_mult.size()); ++level) max_c = std::max<int64_t>(max_c, cfg_.channels(level));
  // The workspace: four activation slots, the skips, the transformer's
  // scratch, the ResBlocks' embedding projection, the inputs.
  kernels::Act S[4];
  for (kernels::Act& s : S) s = ws.take(p.slot);
  std::vector<kernels::Act> skip_at;  // host handles of workspace regions, one per skip (a few dozen)
  skip_at.reserve(p.skips.size());
  for (int64_t z : p.skips) skip_at.push_back(ws.take(z));
  const kernels::Act attn_scratch = ws.take(p.attn_scratch + 2 * p.max_lk * max_c);
  const kernels::Act e = ws.take(std::max<int64_t>(p.emb, 1));
  float* ts = ws.take_floats(n);
  const kernels::Act t0 = ws.take(n * mc), t1 = ws.take(n * temb), emb = ws.take(n * temb);
  const kernels::Act ctx_all = ws.take(p.ctx);
  // The host's F32 NCHW inputs and output pass through here.
  const kernels::Act stage = ws.take_f32(p.stage);
  std::vector<kernels::Act> ctx(static_cast<size_t>(n));
  std::vector<int64_t> lk(static_cast<size_t>(n));
  for (int64_t i = 0, off = 0; i < n; ++i) {
    const auto& c = in.context[static_cast<size_t>(i)];
    ws.upload(stage.data(), c.data(), static_cast<int64_t>(c.size() * sizeof(float)));
    be.copy(stage, ctx_all + off, static_cast<int64_t>(c.size()));
    ctx[static_cast<size_t>(i)] = ctx_all + off;
    lk[static_cast<size_t>(i)] = static_cast<int64_t>(c.size()) / cfg_.context_dim;
    off += static_cast<int64_t>(c.size());
  }
  ws.upload(ts, in.timesteps, n * int64_t{sizeof(float)});

  // Time embedding; every ResBlock applies SiLU then its own linear.
  be.timestep_embedding(ts, n, mc, t0);
  be.matmul(temb1_.view(), t0, t1, n);
  be.add_bias(t1, temb1_b_.data(), n, temb);
  be.activation(kernels::Activation::silu, t1, t1, n * temb);
  be.matmul(temb2_.view(), t1, emb, n);
  be.add_bias(emb, temb2_b_.data(), n, temb);
  be.activation(kernels::Activation::silu, emb, emb, n * temb);

  int64_t h = in.height, w = in.width, c = cfg_.in_channels;
  int cur = 0;
  auto X = [&] { return S[cur]; };
  auto other = [&](int k) { return S[(cur + 1 + k) % 4]; };
  auto move_to = [&](int k) { cur = (cur + 1 + k) % 4; };
  ws.upload(stage.data(), in.x, n * c * h * w * int64_t{sizeof(float)});
  be.relayout(stage, kernels::Layout::NCHW, X(), be.layout(), n, c, h * w);
  auto run = [&](const Block& b) {
    throw_if_cancelled();  // a cancellation point between blocks (core/cancel.h)
    if (b.conv) {
      b.conv->run(be, X(), other(0), n, h, w);
      move_to(0);
      c = b.conv->c_out;
    }
    if (b.res) {
      b.res->run(be, X(), other(2), other(0), other(1), e, n, h, w, emb);
      move_to(2);
      c = b.res->c_out;
    }
    if (b.attn) b.attn->run(be, X(), n, h * w, attn_scratch, ctx.data(), lk.data());
    if (b.res2) {
      b.res2->run(be, X(), other(2), other(0), other(1), e, n, h, w, emb);
      move_to(2);
    }
    if (b.up) {
      be.upsample_nearest2x(X(), other(0), n, c, h, w);
      move_to(0);
      h *= 2, w *= 2;
      b.up->run(be, X(), other(0), n, h, w);
      move_to(0);
    }
  };
  std::vector<int64_t> skip_c;
  skip_c.reserve(p.skips.size());
  for (size_t i = 0; i < input_.size(); ++i) {
    run(*input_[i]);
    be.copy(X(), skip_at[i], n * c * h * w);
    skip_c.push_back(c);
  }
  run(*middle_);
  for (const auto& b : output_) {
    // torch.cat([h, skip], dim=1), per sample
    const int64_t sc = skip_c.back();
    skip_c.pop_back();
    be.concat_channels(X(), c, skip_at[skip_c.size()], sc, other(0), n, h * w);
    move_to(0);
    c += sc;
    run(*b);
  }
  be.group_norm(X(), X(), n, c, h * w, 32, out_norm_w_.data(), out_norm_b_.data(), 1e-5f, true);
  out_conv_->conv->run(be, X(), other(0), n, h, w);
  move_to(0);
  be.relayout(X(), be.layout(), stage, kernels::Layout::NCHW, n, out_conv_->conv->c_out, h * w);
  ws.download(stage.data(), out, n * out_conv_->conv->c_out * h * w * int64_t{sizeof(float)});
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
