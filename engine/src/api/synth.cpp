// `atelier models synth`: LLaMA-shaped GGUF files with deterministic random
// weights, for benchmarks and tests that need a model of a given size and type
// without a download. Shapes follow llama2.c's TinyStories models and TinyLlama.
#include <atelier/tools.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"
#include "core/splitmix.h"
#include "formats/gguf.h"
#include "image/sd_model.h"
#include "api/text_model_impl.h"

namespace atelier {

namespace {

struct Preset {
  const char* name;
  int dim, hidden, layers, heads, kv_heads, vocab, ctx;
  bool tied;
};

constexpr Preset kPresets[] = {
    {"260K", 64, 172, 5, 8, 4, 512, 512, true},
    {"15M", 288, 768, 6, 6, 6, 32000, 256, true},
    {"42M", 512, 1376, 8, 8, 8, 32000, 1024, true},
    {"110M", 768, 2048, 12, 12, 12, 32000, 1024, true},
    {"1B", 2048, 5632, 22, 32, 4, 32000, 2048, false},
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
void add_vocab(formats::GgufWriter& w, int n_vocab, Rng& rng, const std::vector<std::string>& specials) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  for (const auto& t : specials) {
    if (t.empty() || std::find(tokens.begin(), tokens.end(), t) != tokens.end())
      throw InvalidArgumentError("synth --special-token: '" + t + "' is empty or given twice");
    tokens.push_back(t);
    types.push_back(3);
  }
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    tokens.push_back(buf);
    types.push_back(6);
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

}  // namespace

std::vector<std::string> synth_param_presets() {
  std::vector<std::string> r;
  for (const auto& p : kPresets) r.emplace_back(p.name);
  return r;
}

Status synth_text_model(const SynthTextSpec& spec, const std::string& out_path) {
  if (spec.arch != "llama") return Status::error(StatusCode::InvalidArgument, "synth --arch: only 'llama' is supported for text models");
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
    const Preset& P = *preset;
    formats::GgufWriter w;
    Rng vocab_rng{spec.seed};
    w.set_string("general.architecture", "llama");
    w.set_string("general.name", std::string("synthetic-llama-") + P.name + "-" + spec.type);
    w.set_u64("atelier.synthetic.seed", spec.seed);
    if (!spec.chat_template.empty()) w.set_string("tokenizer.chat_template", spec.chat_template);
    w.set_u32("llama.context_length", static_cast<uint32_t>(P.ctx));
    w.set_u32("llama.embedding_length", static_cast<uint32_t>(P.dim));
    w.set_u32("llama.feed_forward_length", static_cast<uint32_t>(P.hidden));
    w.set_u32("llama.block_count", static_cast<uint32_t>(P.layers));
    w.set_u32("llama.attention.head_count", static_cast<uint32_t>(P.heads));
    w.set_u32("llama.attention.head_count_kv", static_cast<uint32_t>(P.kv_heads));
    w.set_u32("llama.rope.dimension_count", static_cast<uint32_t>(P.dim / P.heads));
    w.set_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    w.set_f32("llama.rope.freq_base", 10000.0f);
    add_vocab(w, P.vocab, vocab_rng, spec.special_tokens);

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
    auto norm = [&](const std::string& name) {
      std::vector<float> v(static_cast<size_t>(P.dim));
      Rng rng{name_hash(name, spec.seed)};
      for (auto& x : v) x = 1.0f + 0.1f * rng.uniform_pm1();
      w.add_tensor(name, {P.dim}, kernels::DType::F32, v.data(), v.size() * sizeof(float));
    };
    const int64_t hd = P.dim / P.heads, kvd = hd * P.kv_heads;
    matrix("token_embd.weight", P.dim, P.vocab);
    norm("output_norm.weight");
    if (!P.tied) matrix("output.weight", P.dim, P.vocab);
    for (int l = 0; l < P.layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      norm(b + "attn_norm.weight");
      matrix(b + "attn_q.weight", P.dim, P.dim);
      matrix(b + "attn_k.weight", P.dim, kvd);
      matrix(b + "attn_v.weight", P.dim, kvd);
      matrix(b + "attn_output.weight", P.dim, P.dim);
      norm(b + "ffn_norm.weight");
      matrix(b + "ffn_gate.weight", P.dim, P.hidden);
      matrix(b + "ffn_up.weight", P.dim, P.hidden);
      matrix(b + "ffn_down.weight", P.hidden, P.dim);
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

}  // namespace atelier
