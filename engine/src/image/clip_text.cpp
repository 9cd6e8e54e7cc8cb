#include "image/clip_text.h"

#include <algorithm>
#include <cmath>

#include "core/cancel.h"
#include "core/error.h"

namespace atelier::image {

struct ClipTextEncoder::Layer {
  Param ln1_w, ln1_b, ln2_w, ln2_b;
  Weight qkv, out, fc1, fc2;  // qkv: q, k, v rows stacked
  Param qkv_b, out_b, fc1_b, fc2_b;
};

namespace {

struct Names {
  std::string tokens, positions, final_norm;
  std::string layer(int l) const { return layer_prefix + std::to_string(l) + "."; }
  std::string layer_prefix;
};

// The two layouts: Hugging Face's CLIPTextModel (SD1; some old SD1 files lack
// the `text_model.` level) and OpenCLIP (SD2).
Names names_of(const WeightStore& ws, bool* open_clip) {
  Names n;
  for (const char* p : {"cond_stage_model.transformer.text_model.", "cond_stage_model.transformer."}) {
    const std::string s = p;
    if (ws.has(s + "embeddings.token_embedding.weight")) {
      *open_clip = false;
      n.tokens = s + "embeddings.token_embedding.weight";
      n.positions = s + "embeddings.position_embedding.weight";
      n.final_norm = s + "final_layer_norm.";
      n.layer_prefix = s + "encoder.layers.";
      return n;
    }
  }
  const std::string s = "cond_stage_model.model.";
  if (ws.has(s + "token_embedding.weight")) {
    *open_clip = true;
    n.tokens = s + "token_embedding.weight";
    n.positions = s + "positional_embedding";
    n.final_norm = s + "ln_final.";
    n.layer_prefix = s + "transformer.resblocks.";
    return n;
  }
  throw Error(ws.path() + ": no text encoder (neither cond_stage_model.transformer.text_model.* as in SD 1.x nor "
                          "cond_stage_model.model.* as in SD 2.x); not a Stable Diffusion 1.x/2.x checkpoint?");
}

}  // namespace

ClipConfig detect_clip(const WeightStore& ws, int clip_skip) {
  ClipConfig c;
  const Names n = names_of(ws, &c.open_clip);
  const TensorRef& tok = ws.get(n.tokens);
  const TensorRef& pos = ws.get(n.positions);
  if (tok.shape.size() != 2 || pos.shape.size() != 2 || pos.shape[1] != tok.shape[1])
    throw Error(ws.path() + ": text encoder embeddings have shapes " + WeightStore::shape_str(tok.shape) + " and " +
                WeightStore::shape_str(pos.shape));
  c.vocab = static_cast<int>(tok.shape[0]);
  c.width = static_cast<int>(tok.shape[1]);
  c.positions = static_cast<int>(pos.shape[0]);
  if (c.positions != 77) throw UnsupportedError(ws.path() + ": text encoder with " + std::to_string(c.positions) + " positions (expected 77)");
  const std::string ln = c.open_clip ? "ln_1.weight" : "layer_norm1.weight";
  c.layers = 0;
  while (ws.has(n.layer(c.layers) + ln)) ++c.layers;
  if (c.layers == 0) throw Error(ws.path() + ": text encoder has no layers (" + n.layer(0) + ln + " missing)");
  c.heads = c.width / 64;
  if (auto m = ws.meta("atelier.clip.num_heads")) c.heads = parse_positive(*m, ws.path() + ": atelier.clip.num_heads");
  else if (auto d = ws.meta("diffusers.text.num_attention_heads")) c.heads = parse_positive(*d, ws.path() + ": text_encoder num_attention_heads");
  if (c.heads <= 0 || c.width % c.heads)
    throw Error(ws.path() + ": text encoder width " + std::to_string(c.width) + " does not split into " + std::to_string(c.heads) + " heads");
  c.quick_gelu = !c.open_clip;
  if (auto a = ws.meta("diffusers.text.hidden_act")) {
    if (*a == "quick_gelu") c.quick_gelu = true;
    else if (*a == "gelu") c.quick_gelu = false;
    else throw UnsupportedError(ws.path() + ": text encoder activation '" + *a + "' (supported: quick_gelu, gelu)");
  }
  // OpenCLIP in SD2 (FrozenOpenCLIPEmbedder, layer="penultimate") stops one
  // layer early; diffusers' SD2 text_encoder already has that layer removed.
  c.layers_used = c.layers - (c.open_clip ? 1 : 0) - (clip_skip > 1 ? clip_skip - 1 : 0);
  if (c.layers_used < 1)
    throw Error(ws.path() + ": clip skip " + std::to_string(clip_skip) + " leaves no text encoder layer (it has " +
                std::to_string(c.layers) + ")");
  return c;
}

ClipTextEncoder::ClipTextEncoder() = default;
ClipTextEncoder::~ClipTextEncoder() = default;

std::unique_ptr<ClipTextEncoder> ClipTextEncoder::load(const WeightStore& ws, const ClipConfig& cfg) {
  bool open_clip = false;
  const Names n = names_of(ws, &open_clip);
  std::unique_ptr<ClipTextEncoder> e(new ClipTextEncoder());
  e->cfg_ = cfg;
  const int64_t w = cfg.width;
  e->tokens_ = ws.matrix(n.tokens, cfg.vocab, w);
  std::vector<float> positions(static_cast<size_t>(cfg.positions * w));
  ws.rows_f32(n.positions, 0, cfg.positions, positions.data());
  e->positions_ = ws.param(std::move(positions));
  for (int l = 0; l < cfg.layers_used; ++l) {
    const std::string p = n.layer(l);
    auto L = std::make_unique<Layer>();
    if (open_clip) {
      L->ln1_w = ws.vec(p + "ln_1.weight", w), L->ln1_b = ws.vec(p + "ln_1.bias", w);
      L->ln2_w = ws.vec(p + "ln_2.weight", w), L->ln2_b = ws.vec(p + "ln_2.bias", w);
      L->qkv = ws.matrix(p + "attn.in_proj_weight", 3 * w, w);
      L->qkv_b = ws.vec(p + "attn.in_proj_bias", 3 * w);
      L->out = ws.matrix(p + "attn.out_proj.weight", w, w);
      L->out_b = ws.vec(p + "attn.out_proj.bias", w);
      const int64_t hidden = ws.get(p + "mlp.c_fc.weight").shape.at(0);
      L->fc1 = ws.matrix(p + "mlp.c_fc.weight", hidden, w);
      L->fc1_b = ws.vec(p + "mlp.c_fc.bias", hidden);
      L->fc2 = ws.matrix(p + "mlp.c_proj.weight", w, hidden);
      L->fc2_b = ws.vec(p + "mlp.c_proj.bias", w);
    } else {
      L->ln1_w = ws.vec(p + "layer_norm1.weight", w), L->ln1_b = ws.vec(p + "layer_norm1.bias", w);
      L->ln2_w = ws.vec(p + "layer_norm2.weight", w), L->ln2_b = ws.vec(p + "layer_norm2.bias", w);
      const std::string a = p + "self_attn.";
      L->qkv = ws.stacked({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"}, w, w);
      std::vector<float> qkv_b;
      for (const char* b : {"q_proj.bias", "k_proj.bias", "v_proj.bias"}) {
        const Param v = ws.vec(a + b, w);
        qkv_b.insert(qkv_b.end(), v.host().begin(), v.host().end());
      }
      L->qkv_b = ws.param(std::move(qkv_b));
      L->out = ws.matrix(a + "out_proj.weight", w, w);
      L->out_b = ws.vec(a + "out_proj.bias", w);
      const int64_t hidden = ws.get(p + "mlp.fc1.weight").shape.at(0);
      L->fc1 = ws.matrix(p + "mlp.fc1.weight", hidden, w);
      L->fc1_b = ws.vec(p + "mlp.fc1.bias", hidden);
      L->fc2 = ws.matrix(p + "mlp.fc2.weight", w, hidden);
      L->fc2_b = ws.vec(p + "mlp.fc2.bias", w);
    }
    e->layers_.push_back(std::move(L));
  }
  e->final_w_ = ws.vec(n.final_norm + "weight", w);
  e->final_b_ = ws.vec(n.final_norm + "bias", w);
  return e;
}

int64_t ClipTextEncoder::weight_bytes() const {
  int64_t b = static_cast<int64_t>(tokens_.nbytes() + positions_.size() * 4);
  for (const auto& l : layers_)
    b += static_cast<int64_t>(l->qkv.nbytes() + l->out.nbytes() + l->fc1.nbytes() + l->fc2.nbytes());
  return b;
}

void ClipTextEncoder::check_ids(const int32_t* ids) const {
  for (int64_t t = 0; t < cfg_.positions; ++t)
    if (ids[t] < 0 || ids[t] >= cfg_.vocab)
      throw Error("text encoder: token id " + std::to_string(ids[t]) + " outside the vocabulary of " + std::to_string(cfg_.vocab));
}

int64_t ClipTextEncoder::workspace_floats() const {
  int64_t hidden = 0;
  for (const auto& L : layers_) hidden = std::max(hidden, L->fc1.rows);
  const int64_t T = cfg_.positions, w = cfg_.width;
  return T * (6 * w + 3 * w + hidden) + T;
}

void ClipTextEncoder::encode(const int32_t* ids, float* out, kernels::Executor* ex) const {
  check_ids(ids);
  auto ws = work_.acquire(ex, workspace_floats());
  run(ws, ids, out);
}

void ClipTextEncoder::encode(const int32_t* ids, float* out, kernels::Backend& backend) const {
  check_ids(ids);
  auto ws = work_.acquire(backend, workspace_floats());
  run(ws, ids, out);
}

void ClipTextEncoder::run(Workspace::Lease& ws, const int32_t* ids, float* out) const {
  kernels::Backend& be = ws.be();
  const int64_t T = cfg_.positions, w = cfg_.width, H = cfg_.heads, hd = w / H;
  int64_t max_hidden = 0;
  for (const auto& L : layers_) max_hidden = std::max(max_hidden, L->fc1.rows);
  const kernels::Act x = ws.take(T * w), h = ws.take(T * w), qkv = ws.take(T * 3 * w), attn = ws.take(T * w),
                     tmp = ws.take(T * w), m = ws.take(T * max_hidden);
  const kernels::Act out_f32 = ws.take_f32(T * w);  // the host's F32 output passes through here
  int32_t* d_ids = ws.take_i32(T);
  ws.upload(d_ids, ids, T * int64_t{sizeof(int32_t)});
  be.get_rows(tokens_.view(), d_ids, x, T);
  be.add_bias(x, positions_.data(), 1, T * w);  // row t += position t (a bias over the T x w block)
  kernels::AttentionShape as;
  as.batch = 1;
  as.heads = H;
  as.lq = as.lk = T;
  as.head_dim = hd;
  as.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const kernels::Activation act = cfg_.quick_gelu ? kernels::Activation::quick_gelu : kernels::Activation::gelu;
  for (const auto& L : layers_) {
    throw_if_cancelled();  // a cancellation point between layers (core/cancel.h)
    be.layer_norm(x, h, T, w, L->ln1_w.data(), L->ln1_b.data(), 1e-5f);
    be.matmul(L->qkv.view(), h, qkv, T);
    be.add_bias(qkv, L->qkv_b.data(), T, 3 * w);
    be.causal_attention(as, qkv, qkv + w, qkv + 2 * w, 3 * w, attn);
    be.matmul(L->out.view(), attn, tmp, T);
    be.add_bias(tmp, L->out_b.data(), T, w);
    be.add(x, tmp, x, T * w);

    be.layer_norm(x, h, T, w, L->ln2_w.data(), L->ln2_b.data(), 1e-5f);
    const int64_t hidden = L->fc1.rows;
    be.matmul(L->fc1.view(), h, m, T);
    be.add_bias(m, L->fc1_b.data(), T, hidden);
    be.activation(act, m, m, T * hidden);
    be.matmul(L->fc2.view(), m, tmp, T);
    be.add_bias(tmp, L->fc2_b.data(), T, w);
    be.add(x, tmp, x, T * w);
  }
  be.layer_norm(x, h, T, w, final_w_.data(), final_b_.data(), 1e-5f);
  be.copy(h, out_f32, T * w);
  ws.download(out_f32.data(), out, T * w * int64_t{sizeof(float)});
}

}  // namespace atelier::image
