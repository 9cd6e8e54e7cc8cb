// Synthetic SD 1.5 / 2.1-shaped checkpoints in the original single-file
// layout, for tests and benchmarks without a multi-gigabyte download. The
// tensor list is written from ldm's module tree (openaimodel.UNetModel,
// autoencoder's Encoder/Decoder, HF CLIPTextModel / OpenCLIP), not from the
// loader, so loading one is a check of the loader's names.
#include <cmath>
#include <cstring>

#include "core/error.h"
#include <atelier/splitmix.h>
#include "formats/safetensors.h"
#include "image/sd_model.h"

namespace atelier::image {

namespace {

enum class Init { weight, bias, norm_w, norm_b, embed, pos };

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  Init init;
  int64_t fan_in = 1;
};

int round_to(double x, int multiple) {
  const int r = static_cast<int>(std::lround(x / multiple)) * multiple;
  return r < multiple ? multiple : r;
}

struct Shapes {
  bool sd2 = false;
  int mc = 320, ctx = 768, clip_w = 768, clip_layers = 12, clip_heads = 12, vae_ch = 128;
};

Shapes shapes_of(const SdSynthSpec& s) {
  if (s.arch != "sd15" && s.arch != "sd21")
    throw InvalidArgumentError("unknown image architecture '" + s.arch + "' (allowed: sd15, sd21)");
  if (!(s.width_mult > 0 && s.width_mult <= 1.0)) throw InvalidArgumentError("--width-mult must be in (0, 1]");
  Shapes sh;
  sh.sd2 = s.arch == "sd21";
  sh.mc = round_to(320 * s.width_mult, 32);
  sh.clip_w = round_to((sh.sd2 ? 1024 : 768) * s.width_mult, 64);
  sh.ctx = sh.clip_w;
  sh.clip_layers = s.clip_layers > 0 ? s.clip_layers : (sh.sd2 ? 24 : 12);
  sh.clip_heads = sh.clip_w / 64;
  sh.vae_ch = round_to(128 * s.width_mult, 32);
  return sh;
}

class Schema {
 public:
  std::vector<TensorSpec> t;

  void mat(const std::string& n, int64_t out, int64_t in, bool bias = true) {
    t.push_back({n + ".weight", {out, in}, Init::weight, in});
    if (bias) t.push_back({n + ".bias", {out}, Init::bias});
  }
  void conv(const std::string& n, int64_t out, int64_t in, int64_t k, bool bias = true) {
    t.push_back({n + ".weight", {out, in, k, k}, Init::weight, in * k * k});
    if (bias) t.push_back({n + ".bias", {out}, Init::bias});
  }
  void norm(const std::string& n, int64_t c) {
    t.push_back({n + ".weight", {c}, Init::norm_w});
    t.push_back({n + ".bias", {c}, Init::norm_b});
  }

  // ldm openaimodel.ResBlock
  void unet_res(const std::string& p, int cin, int cout, int temb) {
    norm(p + "in_layers.0", cin);
    conv(p + "in_layers.2", cout, cin, 3);
    mat(p + "emb_layers.1", cout, temb);
    norm(p + "out_layers.0", cout);
    conv(p + "out_layers.3", cout, cout, 3);
    if (cin != cout) conv(p + "skip_connection", cout, cin, 1);
  }
  // ldm attention.SpatialTransformer, depth 1
  void unet_attn(const std::string& p, int c, int ctx, bool linear) {
    norm(p + "norm", c);
    if (linear) mat(p + "proj_in", c, c); else conv(p + "proj_in", c, c, 1);
    const std::string b = p + "transformer_blocks.0.";
    mat(b + "attn1.to_q", c, c, false);
    mat(b + "attn1.to_k", c, c, false);
    mat(b + "attn1.to_v", c, c, false);
    mat(b + "attn1.to_out.0", c, c);
    mat(b + "ff.net.0.proj", 8 * c, c);
    mat(b + "ff.net.2", c, 4 * c);
    mat(b + "attn2.to_q", c, c, false);
    mat(b + "attn2.to_k", c, ctx, false);
    mat(b + "attn2.to_v", c, ctx, false);
    mat(b + "attn2.to_out.0", c, c);
    norm(b + "norm1", c);
    norm(b + "norm2", c);
    norm(b + "norm3", c);
    if (linear) mat(p + "proj_out", c, c); else conv(p + "proj_out", c, c, 1);
  }

  void unet(const Shapes& s) {
    const std::string p = "model.diffusion_model.";
    const int mult[4] = {1, 2, 4, 4};
    const int temb = 4 * s.mc;
    mat(p + "time_embed.0", temb, s.mc);
    mat(p + "time_embed.2", temb, temb);
    conv(p + "input_blocks.0.0", s.mc, 4, 3);
    std::vector<int> skip = {s.mc};
    int ch = s.mc, idx = 1;
    for (int level = 0; level < 4; ++level) {
      for (int r = 0; r < 2; ++r, ++idx) {
        const std::string b = p + "input_blocks." + std::to_string(idx) + ".";
        unet_res(b + "0.", ch, s.mc * mult[level], temb);
        ch = s.mc * mult[level];
        if (level < 3) unet_attn(b + "1.", ch, s.ctx, s.sd2);
        skip.push_back(ch);
      }
      if (level < 3) {
        conv(p + "input_blocks." + std::to_string(idx) + ".0.op", ch, ch, 3);
        skip.push_back(ch);
        ++idx;
      }
    }
    unet_res(p + "middle_block.0.", ch, ch, temb);
    unet_attn(p + "middle_block.1.", ch, s.ctx, s.sd2);
    unet_res(p + "middle_block.2.", ch, ch, temb);
    idx = 0;
    for (int level = 3; level >= 0; --level) {
      for (int r = 0; r < 3; ++r, ++idx) {
        const std::string b = p + "output_blocks." + std::to_string(idx) + ".";
        const int sc = skip.back();
        skip.pop_back();
        unet_res(b + "0.", ch + sc, s.mc * mult[level], temb);
        ch = s.mc * mult[level];
        int sub = 1;
        if (level < 3) unet_attn(b + std::to_string(sub++) + ".", ch, s.ctx, s.sd2);
        if (level > 0 && r == 2) conv(b + std::to_string(sub) + ".conv", ch, ch, 3);
      }
    }
    norm(p + "out.0", s.mc);
    conv(p + "out.2", 4, s.mc, 3);
  }

  // ldm diffusionmodules.model ResnetBlock / AttnBlock
  void vae_res(const std::string& p, int cin, int cout) {
    norm(p + "norm1", cin);
    conv(p + "conv1", cout, cin, 3);
    norm(p + "norm2", cout);
    conv(p + "conv2", cout, cout, 3);
    if (cin != cout) conv(p + "nin_shortcut", cout, cin, 1);
  }
  void vae_mid(const std::string& p, int c) {
    vae_res(p + "mid.block_1.", c, c);
    norm(p + "mid.attn_1.norm", c);
    for (const char* n : {"q", "k", "v", "proj_out"}) conv(p + "mid.attn_1." + n, c, c, 1);
    vae_res(p + "mid.block_2.", c, c);
  }

  void vae(const Shapes& s) {
    const std::string p = "first_stage_model.";
    const int mult[4] = {1, 2, 4, 4};
    conv(p + "encoder.conv_in", s.vae_ch, 3, 3);
    int ch = s.vae_ch;
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 2; ++j) {
        vae_res(p + "encoder.down." + std::to_string(i) + ".block." + std::to_string(j) + ".", ch, s.vae_ch * mult[i]);
        ch = s.vae_ch * mult[i];
      }
      if (i < 3) conv(p + "encoder.down." + std::to_string(i) + ".downsample.conv", ch, ch, 3);
    }
    vae_mid(p + "encoder.", ch);
    norm(p + "encoder.norm_out", ch);
    conv(p + "encoder.conv_out", 8, ch, 3);
    conv(p + "quant_conv", 8, 8, 1);
    conv(p + "post_quant_conv", 4, 4, 1);
    ch = s.vae_ch * mult[3];
    conv(p + "decoder.conv_in", ch, 4, 3);
    vae_mid(p + "decoder.", ch);
    for (int i = 3; i >= 0; --i) {
      for (int j = 0; j < 3; ++j) {
        vae_res(p + "decoder.up." + std::to_string(i) + ".block." + std::to_string(j) + ".", ch, s.vae_ch * mult[i]);
        ch = s.vae_ch * mult[i];
      }
      if (i > 0) conv(p + "decoder.up." + std::to_string(i) + ".upsample.conv", ch, ch, 3);
    }
    norm(p + "decoder.norm_out", ch);
    conv(p + "decoder.conv_out", 3, ch, 3);
  }

  void clip(const Shapes& s) {
    const int w = s.clip_w;
    if (!s.sd2) {
      const std::string p = "cond_stage_model.transformer.text_model.";
      t.push_back({p + "embeddings.token_embedding.weight", {49408, w}, Init::embed});
      t.push_back({p + "embeddings.position_embedding.weight", {77, w}, Init::pos});
      for (int l = 0; l < s.clip_layers; ++l) {
        const std::string b = p + "encoder.layers." + std::to_string(l) + ".";
        for (const char* n : {"q_proj", "k_proj", "v_proj", "out_proj"}) mat(b + "self_attn." + n, w, w);
        norm(b + "layer_norm1", w);
        mat(b + "mlp.fc1", 4 * w, w);
        mat(b + "mlp.fc2", w, 4 * w);
        norm(b + "layer_norm2", w);
      }
      norm(p + "final_layer_norm", w);
    } else {
      const std::string p = "cond_stage_model.model.";
      t.push_back({p + "token_embedding.weight", {49408, w}, Init::embed});
      t.push_back({p + "positional_embedding", {77, w}, Init::pos});
      for (int l = 0; l < s.clip_layers; ++l) {
        const std::string b = p + "transformer.resblocks." + std::to_string(l) + ".";
        t.push_back({b + "attn.in_proj_weight", {3 * w, w}, Init::weight, w});
        t.push_back({b + "attn.in_proj_bias", {3 * w}, Init::bias});
        mat(b + "attn.out_proj", w, w);
        norm(b + "ln_1", w);
        mat(b + "mlp.c_fc", 4 * w, w);
        mat(b + "mlp.c_proj", w, 4 * w);
        norm(b + "ln_2", w);
      }
      norm(p + "ln_final", w);
      t.push_back({p + "text_projection", {w, w}, Init::weight, w});
    }
  }
};

Schema schema_of(const Shapes& s) {
  Schema sc;
  sc.clip(s);
  sc.unet(s);
  sc.vae(s);
  return sc;
}

using Rng = SplitMix64;

uint64_t name_hash(const std::string& s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ (seed * 0x9e3779b97f4a7c15ull);
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

int64_t synthetic_sd_parameters(const SdSynthSpec& spec) {
  int64_t n = 0;
  for (const auto& t : schema_of(shapes_of(spec)).t) {
    int64_t e = 1;
    for (int64_t d : t.shape) e *= d;
    n += e;
  }
  return n;
}

void write_synthetic_sd(const SdSynthSpec& spec, const std::string& path) {
  const Shapes sh = shapes_of(spec);
  formats::ElemType type;
  kernels::DType kt;
  if (spec.type == "f32") type = formats::ElemType::F32, kt = kernels::DType::F32;
  else if (spec.type == "f16") type = formats::ElemType::F16, kt = kernels::DType::F16;
  else if (spec.type == "bf16") type = formats::ElemType::BF16, kt = kernels::DType::BF16;
  else throw InvalidArgumentError("unknown weight type '" + spec.type + "' for an image model (allowed: f32, f16, bf16)");
  int unet_heads = spec.unet_heads;
  int unet_head_dim = 0;
  if (unet_heads <= 0) {
    if (sh.sd2) unet_head_dim = std::min(64, sh.mc);
    else unet_heads = 8;
  }
  if (unet_heads > 0 && sh.mc % unet_heads)
    throw InvalidArgumentError(std::to_string(sh.mc) + " UNet channels do not split into " + std::to_string(unet_heads) + " heads");

  formats::SafetensorsWriter w;
  std::vector<float> f;
  std::vector<uint8_t> bytes;
  for (const auto& t : schema_of(sh).t) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    f.resize(static_cast<size_t>(n));
    Rng rng{name_hash(t.name, spec.seed)};
    // Uniform with the standard deviation each role needs: weights 1/sqrt(fan_in).
    float scale = 0, offset = 0;
    switch (t.init) {
      case Init::weight: scale = std::sqrt(3.0f / static_cast<float>(t.fan_in)); break;
      case Init::bias: scale = 0.02f; break;
      case Init::norm_w: scale = 0.1f, offset = 1.0f; break;
      case Init::norm_b: scale = 0.05f; break;
      case Init::embed: scale = 0.035f; break;
      case Init::pos: scale = 0.017f; break;
    }
    for (auto& v : f) v = offset + scale * rng.uniform_pm1();
    bytes.resize(static_cast<size_t>(n) * formats::elem_size(type));
    if (kt == kernels::DType::F32) std::memcpy(bytes.data(), f.data(), bytes.size());
    else kernels::quantize_row(kt, f.data(), bytes.data(), n);
    w.add_tensor(t.name, type, t.shape, bytes.data(), bytes.size());
  }
  w.set_metadata("atelier.synthetic", "1");
  w.set_metadata("atelier.arch", spec.arch);
  w.set_metadata("atelier.seed", std::to_string(spec.seed));
  if (unet_heads > 0) w.set_metadata("atelier.unet.num_heads", std::to_string(unet_heads));
  else w.set_metadata("atelier.unet.head_dim", std::to_string(unet_head_dim));
  w.set_metadata("atelier.clip.num_heads", std::to_string(sh.clip_heads));
  w.set_metadata("modelspec.prediction_type", sh.sd2 ? "v" : "epsilon");
  w.write(path);
}

}  // namespace atelier::image
