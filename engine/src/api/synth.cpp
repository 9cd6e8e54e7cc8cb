// `atelier models synth`: LLaMA-shaped GGUF files with deterministic random
// weights, for benchmarks and tests that need a model of a given size and type
// without a download. Shapes follow llama2.c's TinyStories models and TinyLlama.
// --arch qwen3, gemma3 and phi3 write those architectures' tensors and keys
// as llama.cpp reads them (llama-arch.cpp, llama-model.cpp) at a preset's size;
// the mixtures of experts (--arch mixtral, qwen3moe, gpt-oss) write their
// architectures' real tensor layout (3-D expert tensors, gpt-oss's MXFP4
// experts, biases and sinks) at a tiny size or a few layers of the real width.
#include <atelier/tools.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <atelier/devices.h>

#include "core/error.h"
#include <atelier/splitmix.h>
#include "formats/gguf.h"
#include "image/sd_model.h"
#include "api/text_model_impl.h"
#include "text/precision.h"

namespace atelier {

namespace {

struct Preset {
  const char* name;
  int dim, hidden, layers, heads, kv_heads, vocab, ctx;
  bool tied;
  float rope_base = 10000.0f;
};

constexpr Preset kPresets[] = {
    {"260K", 64, 172, 5, 8, 4, 512, 512, true},
    {"15M", 288, 768, 6, 6, 6, 32000, 256, true},
    {"42M", 512, 1376, 8, 8, 8, 32000, 1024, true},
    {"110M", 768, 2048, 12, 12, 12, 32000, 1024, true},
    {"1B", 2048, 5632, 22, 32, 4, 32000, 2048, false},
    // Llama 3.1 8B's shapes (issue 33's benchmark model): GQA 32/8, vocabulary 128256.
    {"8B", 4096, 14336, 32, 32, 8, 128256, 131072, false, 500000.0f},
};

using Rng = SplitMix64;

uint64_t name_hash(const std::string& s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

kernels::DType parse_type(const std::string& t) {
  using kernels::DType;
  for (DType d : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K})
    if (kernels::dtype_name(d) == t) return d;
  throw InvalidArgumentError("unknown weight type '" + t + "' (allowed: f32, f16, bf16, q8_0, q4_0, q4_K, q6_K)");
}

// A SentencePiece-style vocabulary: specials, 256 byte tokens, printable
// characters with and without the space marker, then made-up words.
// `specials`: more control tokens after the byte tokens (a phi3 vocabulary
// has <|endoftext|>, which llama.cpp looks up by name for models named phi3).
void add_vocab(formats::GgufWriter& w, int n_vocab, Rng& rng, const std::vector<std::string>& specials = {}) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    tokens.push_back(buf);
    types.push_back(6);
  }
  for (const std::string& t : specials) {
    if (t.empty() || std::find(tokens.begin(), tokens.end(), t) != tokens.end())
      throw InvalidArgumentError("synth --special-token: '" + t + "' is empty or given twice");
    tokens.push_back(t);
    types.push_back(3);
  }
  std::set<std::string> seen(tokens.begin(), tokens.end());
  auto add = [&](const std::string& t) {
    if (static_cast<int>(tokens.size()) < n_vocab && seen.insert(t).second) {
      tokens.push_back(t);
      types.push_back(1);
    }
  };
  const std::string space = "\xE2\x96\x81";  // U+2581
  for (char c = ' ' + 1; c < 127; ++c) add(std::string(1, c));
  for (char c = 'a'; c <= 'z'; ++c) add(space + c);
  while (static_cast<int>(tokens.size()) < n_vocab) {
    std::string word = space;
    const int len = 2 + static_cast<int>(rng.next() % 6);
    for (int i = 0; i < len; ++i) word += static_cast<char>('a' + rng.next() % 26);
    add(word);
  }
  std::vector<float> scores(tokens.size());
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = -static_cast<float>(i);
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  w.set_f32_array("tokenizer.ggml.scores", scores);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_u32("tokenizer.ggml.unknown_token_id", 0);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
}

// The keys every synthetic text GGUF opens with, in this order (the golden
// files depend on it): architecture, name, seed, chat template, then the
// architecture's sizes.
struct HeaderSizes {
  int ctx, dim, ff, layers, heads, kv_heads;
};
void write_common_keys(formats::GgufWriter& w, const std::string& arch, const std::string& name, const SynthTextSpec& spec,
                       const HeaderSizes& z) {
  const std::string k = arch + ".";
  w.set_string("general.architecture", arch);
  w.set_string("general.name", name);
  w.set_u64("atelier.synthetic.seed", spec.seed);
  if (!spec.chat_template.empty()) w.set_string("tokenizer.chat_template", spec.chat_template);
  w.set_u32(k + "context_length", static_cast<uint32_t>(z.ctx));
  w.set_u32(k + "embedding_length", static_cast<uint32_t>(z.dim));
  w.set_u32(k + "feed_forward_length", static_cast<uint32_t>(z.ff));
  w.set_u32(k + "block_count", static_cast<uint32_t>(z.layers));
  w.set_u32(k + "attention.head_count", static_cast<uint32_t>(z.heads));
  w.set_u32(k + "attention.head_count_kv", static_cast<uint32_t>(z.kv_heads));
}

}  // namespace

namespace {

// Mixtures of experts: "tiny" for the golden-logit tests; the others keep
// one real model's layer widths (Qwen3-30B-A3B, gpt-oss-20b) over a few
// layers and a 32000-token vocabulary, for the speed comparison.
struct MoePreset {
  const char* arch;
  const char* name;
  int dim, layers, heads, kv_heads, head_dim, n_expert, n_used, ff_exp, vocab, ctx, window;
};
constexpr MoePreset kMoePresets[] = {
    {"mixtral", "tiny", 64, 3, 4, 2, 16, 4, 2, 96, 512, 512, 0},
    {"qwen3moe", "tiny", 64, 3, 4, 2, 16, 8, 2, 32, 512, 512, 0},
    {"gpt-oss", "tiny", 64, 4, 4, 2, 16, 8, 2, 64, 512, 512, 4},
    {"qwen3moe", "A3B-2L", 2048, 2, 32, 4, 128, 128, 8, 768, 32000, 4096, 0},
    {"gpt-oss", "20B-2L", 2880, 2, 64, 8, 64, 32, 4, 2880, 32000, 4096, 128},
};

Status synth_moe_model(const SynthTextSpec& spec, const std::string& out_path) {
  const MoePreset* preset = nullptr;
  std::string names;
  for (const auto& p : kMoePresets)
    if (spec.arch == p.arch) {
      names += (names.empty() ? "" : ", ") + std::string(p.name);
      if (spec.params == p.name) preset = &p;
    }
  if (!preset)
    return Status::error(StatusCode::InvalidArgument,
                         "synth --params '" + spec.params + "' is not a preset of --arch " + spec.arch + " (allowed: " + names + ")");
  return guarded([&]() -> Status {
    using kernels::DType;
    const DType type = parse_type(spec.type);
    const MoePreset& P = *preset;
    const bool oss = spec.arch == "gpt-oss", qwen = spec.arch == "qwen3moe";
    const std::string arch = spec.arch == "mixtral" ? "llama" : spec.arch;  // Mixtral is llama with experts
    const std::string k = arch + ".";
    formats::GgufWriter w;
    Rng vocab_rng{spec.seed};
    write_common_keys(w, arch, "synthetic-" + spec.arch + "-" + P.name + "-" + spec.type, spec,
                      {P.ctx, P.dim, P.ff_exp, P.layers, P.heads, P.kv_heads});
    w.set_u32(k + "attention.key_length", static_cast<uint32_t>(P.head_dim));
    w.set_u32(k + "attention.value_length", static_cast<uint32_t>(P.head_dim));
    w.set_u32(k + "rope.dimension_count", static_cast<uint32_t>(P.head_dim));
    w.set_f32(k + "attention.layer_norm_rms_epsilon", 1e-6f);
    w.set_u32(k + "expert_count", static_cast<uint32_t>(P.n_expert));
    w.set_u32(k + "expert_used_count", static_cast<uint32_t>(P.n_used));
    if (qwen || oss) w.set_u32(k + "expert_feed_forward_length", static_cast<uint32_t>(P.ff_exp));
    if (oss) {  // gpt-oss-20b's RoPE: base 150000, YaRN x32 over 4096 positions; windows on every other layer
      w.set_f32(k + "rope.freq_base", 150000.0f);
      w.set_string(k + "rope.scaling.type", "yarn");
      w.set_f32(k + "rope.scaling.factor", 32.0f);
      w.set_u32(k + "rope.scaling.original_context_length", 4096);
      w.set_u32(k + "attention.sliding_window", static_cast<uint32_t>(P.window));
    } else {
      w.set_f32(k + "rope.freq_base", qwen ? 1000000.0f : 10000.0f);
    }
    add_vocab(w, P.vocab, vocab_rng, spec.special_tokens);

    // Uniform weights of std 1/sqrt(cols) (activations keep their scale);
    // `planes` > 1: a 3-D expert tensor [cols, rows, planes].
    auto tensor = [&](const std::string& name, int64_t cols, int64_t rows, int64_t planes, DType t) {
      if (cols % kernels::dtype_block_elems(t) != 0) t = cols % 32 == 0 ? DType::Q8_0 : DType::F16;
      const int64_t row_bytes = kernels::dtype_row_bytes(t, cols);
      std::vector<uint8_t> data(static_cast<size_t>(row_bytes * rows * planes));
      std::vector<float> row(static_cast<size_t>(cols));
      Rng rng{name_hash(name, spec.seed)};
      const float a = std::sqrt(3.0f / static_cast<float>(cols));
      for (int64_t r = 0; r < rows * planes; ++r) {
        for (auto& v : row) v = a * rng.uniform_pm1();
        if (!kernels::quantize_row(t, row.data(), data.data() + r * row_bytes, cols))
          throw Error("no quantizer for type " + std::string(kernels::dtype_name(t)));
      }
      std::vector<int64_t> shape = {cols, rows};
      if (planes > 1) shape.push_back(planes);
      w.add_tensor(name, shape, t, data.data(), data.size());
    };
    // Norm weights near 1, biases and sinks small (F32, as llama.cpp keeps them).
    auto vec = [&](const std::string& name, std::vector<int64_t> shape, float center, float spread) {
      int64_t n = 1;
      for (int64_t x : shape) n *= x;
      std::vector<float> v(static_cast<size_t>(n));
      Rng rng{name_hash(name, spec.seed)};
      for (auto& x : v) x = center + spread * rng.uniform_pm1();
      w.add_tensor(name, shape, DType::F32, v.data(), v.size() * sizeof(float));
    };
    const int64_t d = P.dim, qd = int64_t{P.heads} * P.head_dim, kvd = int64_t{P.kv_heads} * P.head_dim;
    const int64_t ne = P.n_expert, fe = P.ff_exp;
    const DType experts = oss ? DType::MXFP4 : type;  // gpt-oss ships its experts in MXFP4
    tensor("token_embd.weight", d, P.vocab, 1, type);
    vec("output_norm.weight", {d}, 1.0f, 0.1f);
    tensor("output.weight", d, P.vocab, 1, type);
    for (int l = 0; l < P.layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      vec(b + "attn_norm.weight", {d}, 1.0f, 0.1f);
      tensor(b + "attn_q.weight", d, qd, 1, type);
      tensor(b + "attn_k.weight", d, kvd, 1, type);
      tensor(b + "attn_v.weight", d, kvd, 1, type);
      tensor(b + "attn_output.weight", qd, d, 1, type);
      if (qwen) {
        vec(b + "attn_q_norm.weight", {P.head_dim}, 1.0f, 0.1f);
        vec(b + "attn_k_norm.weight", {P.head_dim}, 1.0f, 0.1f);
      }
      if (oss) {
        for (const auto& [n, len] : {std::pair{"attn_q.bias", qd}, std::pair{"attn_k.bias", kvd},
                                     std::pair{"attn_v.bias", kvd}, std::pair{"attn_output.bias", d}})
          vec(b + n, {len}, 0.0f, 0.1f);
        vec(b + "attn_sinks.weight", {P.heads}, 0.0f, 1.0f);
      }
      vec(b + (oss ? "post_attention_norm.weight" : "ffn_norm.weight"), {d}, 1.0f, 0.1f);
      tensor(b + "ffn_gate_inp.weight", d, ne, 1, DType::F32);  // the router stays F32 (llama-quantize leaves it)
      tensor(b + "ffn_gate_exps.weight", d, fe, ne, experts);
      tensor(b + "ffn_up_exps.weight", d, fe, ne, experts);
      tensor(b + "ffn_down_exps.weight", fe, d, ne, experts);
      if (oss) {
        vec(b + "ffn_gate_inp.bias", {ne}, 0.0f, 0.1f);
        vec(b + "ffn_gate_exps.bias", {fe, ne}, 0.0f, 0.1f);
        vec(b + "ffn_up_exps.bias", {fe, ne}, 0.0f, 0.1f);
        vec(b + "ffn_down_exps.bias", {d, ne}, 0.0f, 0.1f);
      }
    }
    w.write(out_path);
    return Status{};
  });
}

}  // namespace

std::vector<std::string> synth_param_presets() {
  std::vector<std::string> r;
  for (const auto& p : kPresets) r.emplace_back(p.name);
  for (const auto& p : kMoePresets)
    if (std::find(r.begin(), r.end(), p.name) == r.end()) r.emplace_back(p.name);
  return r;
}

std::vector<std::string> synth_text_archs() { return {"llama", "qwen3", "gemma3", "phi3", "mixtral", "qwen3moe", "gpt-oss"}; }

Status synth_text_model(const SynthTextSpec& spec, const std::string& out_path) {
  if (spec.arch == "mixtral" || spec.arch == "qwen3moe" || spec.arch == "gpt-oss") return synth_moe_model(spec, out_path);
  const std::vector<std::string> archs = synth_text_archs();
  if (std::find(archs.begin(), archs.end(), spec.arch) == archs.end())
    return Status::error(StatusCode::InvalidArgument,
                         "synth --arch '" + spec.arch + "' is not a text architecture (allowed: llama, qwen3, gemma3, phi3, mixtral, qwen3moe, gpt-oss)");
  const Preset* preset = nullptr;
  for (const auto& p : kPresets)
    if (spec.params == p.name) preset = &p;
  if (!preset) {
    std::string all;
    for (const auto& n : synth_param_presets()) all += (all.empty() ? "" : ", ") + n;
    return Status::error(StatusCode::InvalidArgument, "synth --params '" + spec.params + "' is not a preset (allowed: " + all + ")");
  }
  return guarded([&]() -> Status {
    const kernels::DType type = parse_type(spec.type);
    const std::string& arch = spec.arch;
    Preset P = *preset;
    // gemma3's every 6th layer is global: at least one of them.
    if (arch == "gemma3") P.layers = (P.layers + 5) / 6 * 6;
    if (arch == "gemma3") P.tied = true;  // Gemma's output matrix is its embedding table
    // qwen3 and gemma3 heads are wider than n_embd / n_head (Qwen3-0.6B: 16 x 128 over 1024).
    const bool wide_heads = arch == "qwen3" || arch == "gemma3";
    const int64_t hd = (wide_heads ? 2 : 1) * (P.dim / P.heads), qd = hd * P.heads, kvd = hd * P.kv_heads;
    formats::GgufWriter w;
    Rng vocab_rng{spec.seed};
    const std::string k = arch + ".";
    write_common_keys(w, arch, "synthetic-" + arch + "-" + P.name + "-" + spec.type, spec,
                      {P.ctx, P.dim, P.hidden, P.layers, P.heads, P.kv_heads});
    if (wide_heads) {
      w.set_u32(k + "attention.key_length", static_cast<uint32_t>(hd));
      w.set_u32(k + "attention.value_length", static_cast<uint32_t>(hd));
    }
    w.set_u32(k + "rope.dimension_count", static_cast<uint32_t>(hd));
    w.set_f32(k + "attention.layer_norm_rms_epsilon", arch == "llama" || arch == "phi3" ? 1e-5f : 1e-6f);
    w.set_f32(k + "rope.freq_base", arch == "gemma3" || arch == "qwen3" ? 1000000.0f : P.rope_base);
    if (arch == "gemma3")  // local layers see the last few tokens (Gemma 3: 512 or 1024); their RoPE base is 10000
      w.set_u32(k + "attention.sliding_window", static_cast<uint32_t>(std::max(4, P.ctx / 128)));
    if (arch == "phi3") {  // LongRoPE: trained at half the context, stretched to all of it
      const int orig = P.ctx / 2;
      w.set_u32(k + "rope.scaling.original_context_length", static_cast<uint32_t>(orig));
      w.set_f32(k + "rope.scaling.attn_factor",
                static_cast<float>(std::sqrt(1.0 + std::log(double(P.ctx) / orig) / std::log(double(orig)))));
    }
    std::vector<std::string> specials = arch == "phi3" ? std::vector<std::string>{"<|endoftext|>", "<|end|>"} : std::vector<std::string>{};
    specials.insert(specials.end(), spec.special_tokens.begin(), spec.special_tokens.end());
    add_vocab(w, P.vocab, vocab_rng, specials);

    // Matrices: uniform weights with std 1/sqrt(cols), so activations keep their scale.
    auto matrix = [&](const std::string& name, int64_t cols, int64_t rows) {
      // Rows a block type cannot hold (e.g. 1376 for K-quants) fall back to q8_0 or f16, as llama.cpp's quantizer does.
      kernels::DType t = type;
      if (cols % kernels::dtype_block_elems(t) != 0) t = cols % 32 == 0 ? kernels::DType::Q8_0 : kernels::DType::F16;
      const int64_t row_bytes = kernels::dtype_row_bytes(t, cols);
      std::vector<uint8_t> data(static_cast<size_t>(row_bytes * rows));
      std::vector<float> row(static_cast<size_t>(cols));
      Rng rng{name_hash(name, spec.seed)};
      const float a = std::sqrt(3.0f / static_cast<float>(cols));
      for (int64_t r = 0; r < rows; ++r) {
        for (auto& v : row) v = a * rng.uniform_pm1();
        if (!kernels::quantize_row(t, row.data(), data.data() + r * row_bytes, cols))
          throw Error("no quantizer for type " + std::string(kernels::dtype_name(t)));
      }
      w.add_tensor(name, {cols, rows}, t, data.data(), data.size());
    };
    // Norm weights near 1 (Gemma's GGUF stores 1 + w, as llama.cpp's converter writes it).
    auto norm = [&](const std::string& name, int64_t n = 0) {
      std::vector<float> v(static_cast<size_t>(n > 0 ? n : P.dim));
      Rng rng{name_hash(name, spec.seed)};
      for (auto& x : v) x = 1.0f + 0.1f * rng.uniform_pm1();
      w.add_tensor(name, {static_cast<int64_t>(v.size())}, kernels::DType::F32, v.data(), v.size() * sizeof(float));
    };
    matrix("token_embd.weight", P.dim, P.vocab);
    norm("output_norm.weight");
    if (!P.tied) matrix("output.weight", P.dim, P.vocab);
    if (arch == "phi3") {  // divisors of each pair's frequency: near 1 (short), growing to 8 (long)
      std::vector<float> s_f(static_cast<size_t>(hd / 2)), l_f(s_f.size());
      Rng rng{name_hash("rope_factors", spec.seed)};
      for (size_t i = 0; i < s_f.size(); ++i) {
        s_f[i] = 1.0f + 0.1f * (rng.uniform_pm1() + 1.0f);
        l_f[i] = 1.0f + 7.0f * static_cast<float>(i) / static_cast<float>(s_f.size()) + 0.1f * (rng.uniform_pm1() + 1.0f);
      }
      w.add_tensor("rope_factors_short.weight", {hd / 2}, kernels::DType::F32, s_f.data(), s_f.size() * sizeof(float));
      w.add_tensor("rope_factors_long.weight", {hd / 2}, kernels::DType::F32, l_f.data(), l_f.size() * sizeof(float));
    }
    for (int l = 0; l < P.layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      norm(b + "attn_norm.weight");
      if (arch == "phi3") {
        matrix(b + "attn_qkv.weight", P.dim, qd + 2 * kvd);
      } else {
        matrix(b + "attn_q.weight", P.dim, qd);
        matrix(b + "attn_k.weight", P.dim, kvd);
        matrix(b + "attn_v.weight", P.dim, kvd);
      }
      if (wide_heads) {
        norm(b + "attn_q_norm.weight", hd);
        norm(b + "attn_k_norm.weight", hd);
      }
      matrix(b + "attn_output.weight", qd, P.dim);
      if (arch == "gemma3") norm(b + "post_attention_norm.weight");
      norm(b + "ffn_norm.weight");
      if (arch == "phi3") {
        matrix(b + "ffn_up.weight", P.dim, 2 * int64_t{P.hidden});  // gate rows, then up rows
      } else {
        matrix(b + "ffn_gate.weight", P.dim, P.hidden);
        matrix(b + "ffn_up.weight", P.dim, P.hidden);
      }
      matrix(b + "ffn_down.weight", P.hidden, P.dim);
      if (arch == "gemma3") norm(b + "post_ffw_norm.weight");
    }
    w.write(out_path);
    return Status{};
  });
}

Status synth_image_model(const SynthImageSpec& spec, const std::string& out_path) {
  if (spec.arch != "sd15" && spec.arch != "sd21")
    return Status::error(StatusCode::InvalidArgument, "synth --arch '" + spec.arch + "': image models are sd15 or sd21");
  if (!(spec.width_mult > 0 && spec.width_mult <= 1.0))
    return Status::error(StatusCode::InvalidArgument, "synth --width-mult must be in (0, 1]");
  if (spec.type != "f32" && spec.type != "f16" && spec.type != "bf16")
    return Status::error(StatusCode::InvalidArgument, "synth --type '" + spec.type + "': image models take f32, f16 or bf16");
  if (spec.unet_heads < 0) return Status::error(StatusCode::InvalidArgument, "synth --heads must be positive");
  image::SdSynthSpec s;
  s.arch = spec.arch;
  s.width_mult = spec.width_mult;
  s.unet_heads = spec.unet_heads;
  s.type = spec.type;
  s.seed = spec.seed;
  try {
    image::write_synthetic_sd(s, out_path);
  } catch (const Error& e) {  // a bad head count (InvalidArgument) or the file system (Io)
    return Status::error(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return Status::error(StatusCode::Io, "out of memory while building the synthetic checkpoint; try a smaller --width-mult");
  }
  return Status{};
}

// ---------------------------------------------------------------- models made on a device

namespace {

const Preset* find_preset(const std::string& params) {
  for (const auto& p : kPresets)
    if (params == p.name) return &p;
  return nullptr;
}

std::string dense_presets() {
  std::string all;
  for (const auto& p : kPresets) all += (all.empty() ? "" : ", ") + std::string(p.name);
  return all;
}

// The weight types a model made on a device takes, as they are spelled canonically.
constexpr const char* kSynthTypes[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_K", "q6_K", "q4_k_m", "fp8"};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// TYPE in its canonical spelling (any case accepted), or "".
std::string canonical_type(const std::string& type) {
  for (const char* t : kSynthTypes)
    if (lower(type) == lower(t)) return t;
  return "";
}

std::string type_list() {
  std::string all;
  for (const char* t : kSynthTypes) all += (all.empty() ? "" : ", ") + std::string(t);
  return all + " (fp8 on a GPU with FP8)";
}

// What the matrices become: the type's own (q4_k_m: llama.cpp's recipe keeps
// its most sensitive matrices, the output, attn_v and ffn_down, in Q6_K and
// the rest in Q4_K; fp8: E4M3 with a scale per row, DType::E4M3_ROWS, the
// matrices --precision fp8 gives a GPU), and float matrices in the product
// type of the device's plan (what loading a file at that precision gives).
struct MatrixTypes {
  kernels::DType base = kernels::DType::BF16;
  bool k_m = false;
  kernels::DType of(bool sensitive, int64_t cols) const {
    using kernels::DType;
    DType t = k_m && sensitive ? DType::Q6_K : base;
    // Rows a block type cannot hold fall back to q8_0 or f16, as llama.cpp's quantizer does.
    if (cols % kernels::dtype_block_elems(t) != 0) t = cols % 32 == 0 ? DType::Q8_0 : DType::F16;
    return t;
  }
};
MatrixTypes matrix_types(const std::string& type, const text::PrecisionPlan& prec) {
  using kernels::DType;
  MatrixTypes m;
  if (type == "fp8") {
    m.base = DType::E4M3_ROWS;
  } else if (type == "q4_k_m") {
    m.base = DType::Q4_K;
    m.k_m = true;
  } else {
    m.base = parse_type(type);
  }
  if (m.base == DType::BF16 || m.base == DType::F16 || m.base == DType::F32) {
    if (prec.floats == text::MatrixPrecision::FP16) m.base = DType::F16;
    if (prec.floats == text::MatrixPrecision::FP8_E4M3) m.base = DType::E4M3_ROWS;
  }
  return m;
}

struct PlannedMatrix {
  std::string name;
  kernels::WeightView* view;  // null when only the layout is wanted
  int64_t rows, cols;
  kernels::DType t;
};

// Every matrix of preset P in the order they are drawn; views into W's
// layers when W is given (W->layers sized here).
std::vector<PlannedMatrix> plan_matrices(const Preset& P, const MatrixTypes& types, text::LlamaWeights* w) {
  std::vector<PlannedMatrix> plans;
  auto plan = [&](const std::string& name, kernels::WeightView* v, int64_t cols, int64_t rows, bool sensitive) {
    plans.push_back({name, v, rows, cols, types.of(sensitive, cols)});
  };
  const int64_t hd = P.dim / P.heads, kvd = hd * P.kv_heads;
  plan("token_embd.weight", w ? &w->tok_embd : nullptr, P.dim, P.vocab, false);
  if (w) w->layers.resize(static_cast<size_t>(P.layers));
  for (int l = 0; l < P.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    text::LlamaLayer* L = w ? &w->layers[static_cast<size_t>(l)] : nullptr;
    plan(b + "attn_q.weight", L ? &L->wq : nullptr, P.dim, P.dim, false);
    plan(b + "attn_k.weight", L ? &L->wk : nullptr, P.dim, kvd, false);
    plan(b + "attn_v.weight", L ? &L->wv : nullptr, P.dim, kvd, true);
    plan(b + "attn_output.weight", L ? &L->wo : nullptr, P.dim, P.dim, false);
    plan(b + "ffn_gate.weight", L ? &L->w_gate : nullptr, P.dim, P.hidden, false);
    plan(b + "ffn_up.weight", L ? &L->w_up : nullptr, P.dim, P.hidden, false);
    plan(b + "ffn_down.weight", L ? &L->w_down : nullptr, P.hidden, P.dim, true);
  }
  if (!P.tied) plan("output.weight", w ? &w->output : nullptr, P.dim, P.vocab, true);
  return plans;
}

int64_t aligned_bytes(const PlannedMatrix& p) { return (kernels::dtype_row_bytes(p.t, p.cols) * p.rows + 63) / 64 * 64; }

text::LlamaHparams synth_hparams(const Preset& P, const std::string& type) {
  text::LlamaHparams hp;
  hp.architecture = "llama";
  hp.name = std::string("synthetic-llama-") + P.name + "-" + type;
  hp.n_vocab = P.vocab;
  hp.n_ctx_train = P.ctx;
  hp.n_embd = P.dim;
  hp.n_layer = P.layers;
  hp.n_head = P.heads;
  hp.n_head_kv = P.kv_heads;
  hp.n_ff = P.hidden;
  hp.head_dim = hp.n_rot = P.dim / P.heads;
  hp.rope_freq_base = P.rope_base;
  return hp;
}

void fill_header_info(ModelInfo& info, const text::LlamaHparams& hp, const std::string& path) {
  info.path = path;
  info.format = "synthetic";
  info.architecture = hp.architecture;
  info.name = hp.name;
  info.tokenizer = "llama";
  info.n_vocab = hp.n_vocab;
  info.n_ctx_train = hp.n_ctx_train;
  info.n_embd = hp.n_embd;
  info.n_layers = hp.n_layer;
  info.n_heads = hp.n_head;
  info.n_kv_heads = hp.n_head_kv;
  info.n_ff = hp.n_ff;
  info.bos_token = "<s>";
  info.eos_token = "</s>";
}

// The reference a model made by synth_text_model_on names (bench text's
// --synth: the canonical form when the fields parse).
std::string reference_of(const std::string& params, const std::string& type, uint64_t seed) {
  SynthModelRef r;
  r.params = params;
  r.type = type;
  r.seed = seed;
  return r.canonical();
}

}  // namespace

bool is_synth_model_ref(std::string_view ref) { return ref.substr(0, 6) == "synth:"; }

std::string SynthModelRef::canonical() const {
  return "synth:" + params + ":" + type + ":seed=" + std::to_string(seed);
}

std::string SynthModelRef::digest() const {
  // v1: the generator of this file (presets, name-hashed seeds, Backend::fill_random's draw).
  return "synthetic-v1:" + canonical().substr(6);
}

Result<SynthModelRef> parse_synth_model_ref(const std::string& ref) {
  auto bad = [&](const std::string& why) {
    return Status::error(StatusCode::InvalidArgument,
                         "bad synthetic model reference \"" + ref + "\": " + why +
                             "; write synth:PARAMS[:TYPE][:seed=N], e.g. synth:8B, synth:8B:q4_k_m, synth:110M:bf16:seed=7");
  };
  if (!is_synth_model_ref(ref)) return bad("it does not start with synth:");
  std::vector<std::string> fields;
  for (size_t at = 6;;) {
    const size_t colon = ref.find(':', at);
    fields.push_back(ref.substr(at, colon == std::string::npos ? std::string::npos : colon - at));
    if (colon == std::string::npos) break;
    at = colon + 1;
  }
  SynthModelRef r;
  r.params = fields[0];
  if (!find_preset(r.params)) {
    const bool moe = std::any_of(std::begin(kMoePresets), std::end(kMoePresets), [&](const MoePreset& p) { return r.params == p.name; });
    return bad("PARAMS '" + r.params + "' is not a dense preset (" + dense_presets() + ")" +
               (moe ? "; mixtures of experts are made as files: `atelier models synth --arch ARCH --params " + r.params + "`" : ""));
  }
  bool typed = false, seeded = false;
  for (size_t i = 1; i < fields.size(); ++i) {
    const std::string& f = fields[i];
    if (f.rfind("seed=", 0) == 0) {
      const std::string n = f.substr(5);
      if (seeded || n.empty() || n.size() > 19 || !std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return bad(seeded ? "the seed is given twice" : "the seed '" + n + "' is not a whole number below 10^19");
      r.seed = std::stoull(n);
      seeded = true;
    } else if (const std::string t = canonical_type(f); !t.empty() && !typed) {
      r.type = t;
      typed = true;
    } else {
      return bad(typed && !canonical_type(f).empty() ? "the type is given twice"
                                                     : "'" + f + "' is neither a type (" + type_list() + ") nor seed=N");
    }
  }
  return r;
}

namespace {
Result<std::pair<const Preset*, std::string>> preset_and_type(const std::string& params, const std::string& type) {
  const Preset* preset = find_preset(params);
  if (!preset)
    return Status::error(StatusCode::InvalidArgument, "--synth '" + params + "' is not a preset (allowed: " + dense_presets() + ")");
  const std::string t = canonical_type(type);
  if (t.empty()) return Status::error(StatusCode::InvalidArgument, "unknown weight type '" + type + "' (allowed: " + type_list() + ")");
  return std::make_pair(preset, t);
}
}  // namespace

Result<SynthLayout> synth_layout(const SynthModelRef& ref, const text::PrecisionPlan& prec) {
  auto pt = preset_and_type(ref.params, ref.type);
  if (!pt.ok()) return pt.status();
  return guarded([&]() -> Result<SynthLayout> {
    const Preset& P = *pt->first;
    SynthLayout L;
    L.hp = synth_hparams(P, pt->second);
    fill_header_info(L.info, L.hp, ref.canonical());
    for (const PlannedMatrix& p : plan_matrices(P, matrix_types(pt->second, prec), nullptr)) {
      L.matrices.push_back({p.name, p.t, p.rows, p.cols});
      L.weight_bytes += aligned_bytes(p);
      L.info.n_params += p.rows * p.cols;
    }
    L.weight_bytes += int64_t{P.dim} * (2 * P.layers + 1) * 4;  // the norms (F32, host and device)
    return L;
  });
}

int64_t synth_model_bytes(const std::string& ref) {
  auto r = parse_synth_model_ref(ref);
  if (!r.ok()) return 0;
  auto L = synth_layout(r.value(), text::PrecisionPlan{});
  return L.ok() ? L->weight_bytes : 0;
}

// The preset's model made on a device (BACKEND's, else the one the options
// name): one device buffer of matrices drawn in place by
// Backend::fill_random (uniform, std 1/sqrt(cols), as the files above), norms
// near 1, the synthetic vocabulary (SynthModelRef).
Result<std::shared_ptr<text::LoadedTextModel>> synth_text_model_on(const std::string& params, const std::string& type_in,
                                                                   uint64_t seed, const TextModelOptions& options,
                                                                   kernels::Backend* backend) {
  auto pt = preset_and_type(params, type_in);
  if (!pt.ok()) return pt.status();
  const Preset& P = *pt->first;
  const std::string type = pt->second;
  const bool fp8 = type == "fp8";
  return guarded([&]() -> Result<std::shared_ptr<text::LoadedTextModel>> {
    auto m = std::make_shared<text::LoadedTextModel>();
    m->options = options;
    kernels::Backend* be = backend ? backend : &kernels::default_cpu_backend();
    if (!backend && !options.device.empty() && options.device != "cpu") {
      const kernels::DeviceChoice d = kernels::open_device(options.device);
      if (!d.device) throw UnsupportedError("--device " + options.device + ": " + d.why);
      m->backend = d.device->make_backend(nullptr, 0);
      be = m->backend.get();
    }
    // --precision (or --type fp8) on a device: the plan reaches the backend first.
    const text::PrecisionPlan prec =
        be->device().host_memory ? text::precision_plan({}, text::PrecisionChoice::Auto, options.kv_type)  // refuses bf16/fp8 KV
                                 : text::apply_precision(*be, fp8 ? "fp8" : options.precision, options.kv_type);
    if (fp8 && !prec.gpu)
      throw InvalidArgumentError("--type fp8 (synth:" + params + ":fp8) runs on a GPU with FP8 (compute capability 8.9 or newer): add --device cuda");
    text::LlamaWeights& w = m->weights;
    w.hp = synth_hparams(P, type);
    w.format = "synthetic";
    text::check_kv_type(w.hp, options.kv_type);
    auto norm = [&](const std::string& name) {
      std::vector<float> v(static_cast<size_t>(P.dim));
      Rng rng{name_hash(name, seed)};
      for (auto& x : v) x = 1.0f + 0.1f * rng.uniform_pm1();
      return v;
    };
    std::vector<PlannedMatrix> plans = plan_matrices(P, matrix_types(type, prec), &w);
    w.output_norm = norm("output_norm.weight");
    for (int l = 0; l < P.layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      text::LlamaLayer& L = w.layers[static_cast<size_t>(l)];
      L.attn_norm = norm(b + "attn_norm.weight");
      L.ffn_norm = norm(b + "ffn_norm.weight");
    }
    int64_t total = 0;
    for (const PlannedMatrix& p : plans) total += aligned_bytes(p);
    std::shared_ptr<kernels::Buffer> buf = be->alloc(total);
    int64_t read_per_token = 0, offset = 0;
    std::map<std::string, int> types;
    for (const PlannedMatrix& p : plans) {
      be->fill_random(*buf, offset, p.t, p.rows, p.cols, name_hash(p.name, seed), std::sqrt(3.0f / static_cast<float>(p.cols)));
      kernels::WeightView& v = *p.view;
      v.type = p.t;
      v.data = static_cast<const uint8_t*>(buf->data()) + offset;
      v.rows = p.rows;
      v.cols = p.cols;
      v.row_stride_bytes = kernels::dtype_row_bytes(p.t, p.cols);
      offset += aligned_bytes(p);
      w.n_params += p.rows * p.cols;
      if (p.name != "token_embd.weight") read_per_token += v.row_stride_bytes * p.rows;
      ++types[std::string(kernels::dtype_name(p.t))];
    }
    if (P.tied) {
      w.output = w.tok_embd;
      read_per_token += w.tok_embd.row_stride_bytes * w.tok_embd.rows;
    }
    be->synchronize();
    w.prepared.push_back(buf);
    for (const auto& [t, n] : types) w.weight_types += (w.weight_types.empty() ? "" : ", ") + t + " (" + std::to_string(n) + ")";
    m->tokenizer = tok::Tokenizer::synthetic(P.vocab);
    ModelInfo& info = m->info;
    fill_header_info(info, w.hp, reference_of(params, type, seed));
    info.weight_types = w.weight_types;
    info.n_params = w.n_params;
    info.weight_bytes = info.active_weight_bytes = read_per_token;
    m->n_ctx = options.context_tokens > 0 ? options.context_tokens : default_context_tokens(w.hp.n_ctx_train);
    m->pool = std::make_unique<ThreadPool>(options.threads);
    return m;
  });
}

}  // namespace atelier
