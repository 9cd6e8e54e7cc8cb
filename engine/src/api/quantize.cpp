// `atelier models quantize` and the quality report: a store version's
// F32/F16/BF16 GGUF re-encoded tensor by tensor (kernels::quantize_row, the
// K-quants with GGML's error searches), written with the source's metadata
// through the GGUF writer `models synth` uses, installed as a new version
// with its lineage, then scored against the source on a text.
#include <atelier/store.h>
#include <atelier/tools.h>

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include "api/text_model_impl.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "text/kv_cache.h"
#include "text/llama.h"
#include "text/logit_metrics.h"

#ifndef ATELIER_VERSION
#define ATELIER_VERSION "unknown"
#endif
#include "atelier_build_id.h"  // ATELIER_GIT_DESCRIBE, written at build time (engine/build_id.cmake)

namespace atelier {

namespace fs = std::filesystem;
using kernels::DType;

namespace {

// The quality report's text when none is given: short stories in the style of
// TinyStories (simple words, short sentences), which stories260K was trained
// on, written for this report (about 400 tokens with a 512-word vocabulary).
constexpr const char* kDefaultText =
    "Once upon a time, there was a little boy named Tim. Tim liked to play with his red ball in the park. "
    "One day, Tim saw a big dog under a tree. The dog was sad because it was lost. Tim said, \"Do not be sad, "
    "dog. I will help you find your home.\" Tim and the dog walked to the end of the street. They saw a small "
    "house with a blue door. A kind lady came out and smiled. \"Thank you for finding my dog!\" she said. "
    "Tim was happy. He went home and told his mom about the dog.\n"
    "Lily was a little girl who loved to draw. Every day she drew the sun, the trees and the birds. One morning, "
    "her friend Ben came to see her. Ben wanted to draw too, but he did not have a pencil. Lily gave Ben her "
    "best pencil. They drew a big cat together. The cat had a long tail and a funny hat. Lily and Ben laughed "
    "and laughed. They learned that sharing is fun.\n"
    "Once upon a time, in a small town, there lived a happy bird. The bird liked to sing in the morning. One "
    "day it started to rain, and the bird could not fly. A girl named Sue saw the bird and took it inside. She "
    "gave it some water and a little bread. When the rain stopped, the bird flew up to the sky and sang a "
    "song for Sue. Sue smiled and waved goodbye.\n";

std::vector<DType> supported_types() {
  std::vector<DType> out;
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                  DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::MXFP4})
    if (kernels::matmul_supports(t)) out.push_back(t);
  return out;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// "q4_k" and "q4_K" alike.
bool parse_type(const std::string& s, DType* out) {
  for (DType t : supported_types())
    if (lower(std::string(kernels::dtype_name(t))) == lower(s)) {
      *out = t;
      return true;
    }
  return false;
}

std::string type_name(DType t) { return std::string(kernels::dtype_name(t)); }

// llama.cpp's llama_ftype numbers for general.file_type.
uint32_t file_type_of(const std::string& recipe, DType plain) {
  if (recipe == "q4_k_m") return 15;
  if (recipe == "mixed") return 1024;  // LLAMA_FTYPE_GUESSED: no single type
  switch (plain) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::Q4_0: return 2;
    case DType::Q4_1: return 3;
    case DType::Q8_0: return 7;
    case DType::Q5_0: return 8;
    case DType::Q5_1: return 9;
    case DType::Q2_K: return 10;
    case DType::Q3_K: return 11;  // Q3_K_S: every matrix Q3_K
    case DType::Q4_K: return 14;  // Q4_K_S
    case DType::Q5_K: return 16;  // Q5_K_S
    case DType::Q6_K: return 18;
    case DType::BF16: return 32;
    default: return 1024;
  }
}

// llama.cpp's use_more_bits (src/llama-quant.cpp): the first and last eighth
// of the layers and every third one between get more bits in Q4_K_M.
bool use_more_bits(int i_layer, int n_layers) {
  return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

int layer_of(const std::string& name) {
  int l = -1;
  if (std::sscanf(name.c_str(), "blk.%d.", &l) != 1) return -1;
  return l;
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

double bits_per_weight(DType t) {
  return 8.0 * static_cast<double>(kernels::dtype_block_bytes(t)) / static_cast<double>(kernels::dtype_block_elems(t));
}

// A type for a row width that cannot hold the wanted one: llama.cpp's
// fallback (src/llama-quant.cpp: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0,
// Q2_K/Q3_K -> IQ4_NL, 4.5 bits), or where the matmul kernels do not run that
// type (the loader would convert it to Q8_0 anyway), the smallest type they
// run with at least as many bits per weight and 32-wide blocks; F16 when no
// 32-wide block fits the row either.
DType fallback(DType t, int64_t cols) {
  double bits = bits_per_weight(t);
  switch (t) {
    case DType::Q2_K:
    case DType::Q3_K: bits = 4.5; break;  // IQ4_NL
    case DType::Q4_K: bits = bits_per_weight(DType::Q5_0); break;
    case DType::Q5_K: bits = bits_per_weight(DType::Q5_1); break;
    case DType::Q6_K: bits = bits_per_weight(DType::Q8_0); break;
    default: break;
  }
  DType best = DType::F16;
  for (DType c : supported_types()) {
    const int64_t be = kernels::dtype_block_elems(c);
    if (be == 1 || cols % be != 0 || bits_per_weight(c) < bits) continue;
    if (best == DType::F16 || bits_per_weight(c) < bits_per_weight(best)) best = c;
  }
  return best;
}

struct Plan {
  DType wanted, type;
};

// The type of each matrix under the spec: a plain type everywhere, or a recipe.
class Planner {
 public:
  Planner(const formats::GgufFile& f, const std::string& recipe, DType plain) : recipe_(recipe), plain_(plain) {
    has_output_ = f.find_tensor("output.weight") != nullptr;
    for (const auto& t : f.tensors()) {
      if (contains(t.name, "attn_v.weight")) ++n_attn_v_;
      n_layer_ = std::max(n_layer_, layer_of(t.name) + 1);
    }
  }

  Plan plan(const std::string& name, int64_t cols) {
    const DType wanted = want(name, cols);
    DType t = wanted;
    if (cols % kernels::dtype_block_elems(t) != 0) t = fallback(t, cols);
    return {wanted, t};
  }

 private:
  DType want(const std::string& name, int64_t cols) {
    if (recipe_.empty()) return plain_;
    const bool is_output = name == "output.weight" || (!has_output_ && name == "token_embd.weight");
    if (recipe_ == "mixed") {
      // Attention F16, feed-forward Q8_0, embeddings 4-bit (Q4_K, else Q4_0
      // for rows that are not a multiple of 256), an untied output Q8_0.
      if (name == "token_embd.weight") return cols % 256 == 0 ? DType::Q4_K : DType::Q4_0;
      if (name == "output.weight") return DType::Q8_0;
      if (contains(name, ".attn_")) return DType::F16;
      if (contains(name, ".ffn_")) return DType::Q8_0;
      return DType::Q8_0;
    }
    // q4_k_m: llama.cpp's llama_tensor_get_type for LLAMA_FTYPE_MOSTLY_Q4_K_M
    // (no experts, no 70B special case).
    if (is_output) return cols % 256 != 0 ? DType::Q8_0 : DType::Q6_K;
    if (contains(name, "attn_v.weight")) {
      const int i = i_attn_v_++;
      return use_more_bits(i, n_attn_v_) ? DType::Q6_K : DType::Q4_K;
    }
    if (contains(name, "ffn_down")) {
      const int l = layer_of(name);
      return l >= 0 && use_more_bits(l, n_layer_) ? DType::Q6_K : DType::Q4_K;
    }
    if (contains(name, "attn_qkv.weight")) return DType::Q5_K;
    return DType::Q4_K;
  }

  std::string recipe_;
  DType plain_;
  bool has_output_ = false;
  int n_attn_v_ = 0, i_attn_v_ = 0, n_layer_ = 0;
};

bool is_float_type(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// Teacher-forced logits of every position of TOKENS (row i after tokens[0..i]).
std::vector<float> all_logits(text::LoadedTextModel& m, const std::vector<int32_t>& tokens) {
  const int n = static_cast<int>(tokens.size());
  const int64_t nv = m.weights.hp.n_vocab;
  std::vector<float> out(static_cast<size_t>(n) * nv);
  // On a device (m.backend) the cache and the steps are its own (KV in its
  // type: F16 unless the load asked for Q8_0); on the CPU an F32 cache.
  std::optional<text::KvCache> cache_on;
  std::optional<text::LlamaRunner> runner_on;
  if (m.backend) {
    cache_on.emplace(m.weights.hp, n, m.options.kv_type, *m.backend);
    runner_on.emplace(m.weights, *m.backend);
  } else {
    cache_on.emplace(m.weights.hp, n, KvType::F32);
    runner_on.emplace(m.weights, m.pool.get());
  }
  text::KvCache& cache = *cache_on;
  text::LlamaRunner& runner = *runner_on;
  constexpr int kChunk = 128;  // bounds the step's activations and logits
  for (int p = 0; p < n; p += kChunk) {
    text::SeqInput s;
    s.tokens = tokens.data() + p;
    s.n = std::min(kChunk, n - p);
    s.pos0 = p;
    s.kv = &cache;
    s.logits = out.data() + static_cast<size_t>(p) * nv;
    s.all_logits = true;
    runner.forward_batch(&s, 1);
  }
  return out;
}

std::string read_text(const std::string& path) {
  if (path.empty()) return kDefaultText;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw NotFoundError(path + ": no such text file (--text takes a plain text file)");
  std::ifstream in(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) throw IoError(path + ": could not read the text file");
  return s;
}

// The weight bytes a token reads: every matrix, but of a mixture of experts'
// 3-D expert tensors only its share (expert_used_count of expert_count).
int64_t bytes_per_token(const formats::GgufFile& f) {
  int64_t n = 0;
  const bool tied = f.find_tensor("output.weight") == nullptr;
  const std::string p = f.get_string("general.architecture", "") + ".";
  const int64_t experts = f.get_int(p + "expert_count", 0), used = f.get_int(p + "expert_used_count", 0);
  for (const auto& t : f.tensors()) {
    if (t.shape.size() == 3 && experts > 0 && t.shape[2] == experts) {
      n += static_cast<int64_t>(t.bytes) / experts * used;
      continue;
    }
    if (t.shape.size() != 2) continue;
    if (t.name == "token_embd.weight" && !tied) continue;  // one row of it per token
    n += static_cast<int64_t>(t.bytes);
  }
  return n;
}

// "; e.g. NAME@1" naming the model's versions that hold only float tensors
// (a model's plain name resolves to its newest version, which after a
// quantize is the quantized one).
std::string float_versions_hint(const std::string& store_dir, const ResolvedModel& S) {
  if (!S.in_store) return "";
  auto st = Store::open(store_dir, false);
  if (!st.ok()) return "";
  auto models = st.value()->list();
  if (!models.ok()) return "";
  std::string refs;
  for (const auto& m : models.value()) {
    if (m.name != S.name) continue;
    for (const auto& v : m.versions) {
      bool all_float = !v.quantization.empty();
      std::stringstream types(v.quantization);
      for (std::string t; std::getline(types, t, ',');) {
        t.erase(0, t.find_first_not_of(' '));
        DType d;
        all_float = all_float && parse_type(t, &d) && is_float_type(d);
      }
      if (all_float) refs += (refs.empty() ? "" : ", ") + m.name + "@" + std::to_string(v.number);
    }
  }
  return refs.empty() ? "" : "; e.g. " + refs;
}

std::string tool_id() { return engine_build(); }

}  // namespace

// Here because this file is compiled with the version and the git describe.
std::string engine_build() { return std::string("atelier ") + ATELIER_VERSION + " (git " + ATELIER_GIT_DESCRIBE + ")"; }

std::vector<std::string> quantize_types() {
  std::vector<std::string> out;
  for (DType t : supported_types()) out.push_back(type_name(t));
  return out;
}

std::vector<std::string> quantize_recipes() { return {"q4_k_m", "mixed"}; }

Result<QualityReport> compare_text_models(const std::string& reference_path, const std::string& candidate_path,
                                          const std::string& text_path, int max_tokens, int threads,
                                          const CompareDevices& on) {
  if (max_tokens < 2) return Status::error(StatusCode::InvalidArgument, "the quality report needs at least 2 tokens of text");
  TextModelOptions o;
  o.threads = threads;
  o.device = on.reference_device.empty() ? on.device : on.reference_device;
  o.precision = on.reference_precision;
  auto ref = text::load_text_model(reference_path, o);
  if (!ref.ok()) return ref.status();
  o.device = on.device;
  o.precision = on.precision;
  auto cand = text::load_text_model(candidate_path, o);
  if (!cand.ok()) return cand.status();
  return guarded([&]() -> Result<QualityReport> {
    text::LoadedTextModel& R = *ref.value();
    text::LoadedTextModel& C = *cand.value();
    if (R.weights.hp.n_vocab != C.weights.hp.n_vocab)
      return Status::error(StatusCode::InvalidArgument,
                           "the models' vocabularies differ (" + std::to_string(R.weights.hp.n_vocab) + " and " +
                               std::to_string(C.weights.hp.n_vocab) + " tokens): compare versions of the same model");
    const std::string content = read_text(text_path);
    std::vector<int32_t> tokens = R.tokenizer->encode(content, true, false);
    int limit = max_tokens;
    for (int ctx : {R.weights.hp.n_ctx_train, C.weights.hp.n_ctx_train})
      if (ctx > 0) limit = std::min(limit, ctx);
    if (static_cast<int>(tokens.size()) > limit) tokens.resize(static_cast<size_t>(limit));
    if (tokens.size() < 2)
      return Status::error(StatusCode::InvalidArgument, (text_path.empty() ? std::string("the text") : text_path) +
                                                            " gives fewer than 2 tokens; give a longer text");
    const std::vector<float> lr = all_logits(R, tokens), lc = all_logits(C, tokens);
    const int64_t nv = R.weights.hp.n_vocab;
    text::LogitComparison cmp;
    for (size_t i = 0; i + 1 < tokens.size(); ++i)
      cmp.add(lr.data() + i * nv, lc.data() + i * nv, nv, tokens[i + 1]);
    QualityReport q;
    q.text = text_path.empty() ? "the built-in TinyStories-style text" : text_path;
    q.tokens = static_cast<int>(tokens.size());
    q.positions = static_cast<int>(cmp.positions);
    q.perplexity_reference = cmp.perplexity_reference();
    q.perplexity_candidate = cmp.perplexity_candidate();
    q.mean_kl = cmp.mean_kl();
    q.max_kl = cmp.kl_max;
    q.top1_agreement = cmp.top1_agreement();
    return q;
  });
}

Result<QuantizeResult> quantize_model(const std::string& ref, const QuantizeSpec& spec) {
  auto bad = [](const std::string& m) { return Status::error(StatusCode::InvalidArgument, m); };
  auto join = [](const std::vector<std::string>& v) {
    std::string r;
    for (const auto& s : v) r += (r.empty() ? "" : ", ") + s;
    return r;
  };
  if (spec.type.empty() == spec.recipe.empty())
    return bad("give either --type TYPE (" + join(quantize_types()) + ") or --recipe NAME (" + join(quantize_recipes()) + ")");
  DType plain = DType::F32;
  std::string recipe;
  if (!spec.type.empty() && !parse_type(spec.type, &plain))
    return bad("unknown weight type '" + spec.type + "' (the kernels run: " + join(quantize_types()) + ")");
  if (!spec.recipe.empty()) {
    recipe = lower(spec.recipe);
    const auto r = quantize_recipes();
    if (std::find(r.begin(), r.end(), recipe) == r.end())
      return bad("unknown recipe '" + spec.recipe + "' (recipes: " + join(r) + "; or a plain --type)");
  }
  const std::string label = recipe.empty() ? type_name(plain) : recipe;
  auto note = [&](const std::string& s) {
    if (spec.on_note) spec.on_note(s);
  };

  ResolveOptions ro;
  ro.check_digest = true;  // a damaged blob is refused, and a plain file gets the digest its lineage records
  auto src = resolve_model(ref, spec.store_dir, ro);
  if (!src.ok()) return src.status();
  const ResolvedModel& S = src.value();
  if (S.format == "synthetic")
    return bad(S.display + " is a synthetic model (no file to re-encode): name the type in the reference instead "
               "(synth:PARAMS:q4_k_m, :q8_0, ...), or write it as a file with `atelier models synth` and quantize that");
  if (S.in_store && S.kind != "text") return bad(S.display + " is a " + S.kind + " model; quantize takes a text model (GGUF)");
  const std::string target = spec.name.empty() ? S.name : spec.name;
  if (spec.quality && !spec.text_path.empty()) {
    std::error_code ec;
    if (!fs::is_regular_file(spec.text_path, ec))
      return Status::error(StatusCode::NotFound, spec.text_path + ": no such text file (--text takes a plain text file)");
  }
  if (target.empty()) return bad(ref + " is a file outside the store: give the new model's name with --name");

  return guarded([&]() -> Result<QuantizeResult> {
    std::shared_ptr<formats::GgufFile> f;
    try {
      f = formats::GgufFile::open(S.path);
    } catch (const Error& e) {
      return Status::error(StatusCode::InvalidArgument,
                           S.display + " is not a GGUF file (" + e.what() + "); quantize reads F32/F16/BF16 GGUF text models");
    }
    const std::string arch = f->get_string("general.architecture", "");
    if (arch.empty() || !f->find_tensor("token_embd.weight"))
      return bad(S.display + " is not a text model GGUF (no general.architecture or token_embd.weight)");
    for (const auto& t : f->tensors())
      if (!is_float_type(t.type))
        return bad(S.display + " is already quantized (" + t.name + " is " + type_name(t.type) +
                   "); quantize from an F32, F16 or BF16 version (requantizing loses quality twice)" +
                   float_versions_hint(spec.store_dir, S));

    QuantizeResult res;
    res.source = S.display;
    res.source_digest = S.digest;
    res.recipe = label;
    res.tool = tool_id();
    res.source_file_bytes = static_cast<int64_t>(fs::file_size(S.path));
    res.source_bytes_per_token = bytes_per_token(*f);

    formats::GgufWriter w;
    for (const auto& [key, value] : f->metadata()) {
      if (key == "general.file_type" || key == "general.quantization_version" || key.rfind("atelier.quantize.", 0) == 0)
        continue;
      w.set_value(key, value);
    }
    w.set_u32("general.file_type", file_type_of(recipe, plain));
    w.set_u32("general.quantization_version", 2);  // GGML's, for the K-quant block layouts
    w.set_string("atelier.quantize.recipe", label);
    w.set_string("atelier.quantize.source", S.display);
    w.set_string("atelier.quantize.source_digest", S.digest);
    w.set_string("atelier.quantize.tool", res.tool);

    Planner planner(*f, recipe, plain);
    ThreadPool pool(spec.threads);
    for (const auto& t : f->tensors()) {
      const int64_t cols = t.shape.empty() ? 1 : t.shape[0];
      const int64_t rows = cols > 0 ? t.elements() / cols : 0;
      QuantizedTensor qt;
      qt.name = t.name;
      qt.cols = cols;
      qt.rows = rows;
      // 1-D tensors (norms, biases) stay F32, and so do a mixture of experts'
      // router (ffn_gate_inp, as llama-quantize leaves it) and per-expert
      // biases (2-D, not matrices): only `.weight` matrices are quantized. A
      // 3-D expert tensor is rows of its experts' matrices one after another,
      // so each row, and each expert, is encoded on its own.
      DType out = DType::F32;
      const bool matrix = t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, ".weight") == 0 &&
                          !contains(t.name, "ffn_gate_inp.");
      if (t.shape.size() >= 2 && matrix) {
        const Plan p = planner.plan(t.name, cols);
        out = p.type;
        if (p.type != p.wanted) {
          qt.wanted = type_name(p.wanted);
          res.fallbacks.push_back(t.name + ": " + qt.wanted + " -> " + type_name(p.type) + " (rows of " + std::to_string(cols) +
                                  " are not a multiple of " + std::to_string(kernels::dtype_block_elems(p.wanted)) + ")");
        }
      }
      qt.type = type_name(out);
      const int64_t in_row = kernels::dtype_row_bytes(t.type, cols), out_row = kernels::dtype_row_bytes(out, cols);
      std::vector<uint8_t> data(static_cast<size_t>(out_row * rows));
      std::atomic<bool> failed{false};
      pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
        std::vector<float> row(static_cast<size_t>(cols));
        for (int64_t r = r0; r < r1; ++r) {
          kernels::dequantize_row(t.type, t.data + r * in_row, row.data(), cols);
          if (!kernels::quantize_row(out, row.data(), data.data() + r * out_row, cols)) failed = true;
        }
      });
      if (failed) throw Error("no quantizer for " + qt.type + " with rows of " + std::to_string(cols) + " (" + t.name + ")");
      qt.bytes = static_cast<int64_t>(data.size());
      w.add_tensor(t.name, t.shape, out, data.data(), data.size());
      res.tensors.push_back(qt);
    }
    for (const auto& fb : res.fallbacks) note("fallback: " + fb);

    // Written beside the store's blobs (same file system), then imported.
    auto store = Store::open(spec.store_dir, true);
    if (!store.ok()) return store.status();
    const fs::path tmp_dir = fs::path(store.value()->root()) / "downloads";
    fs::create_directories(tmp_dir);
    const fs::path tmp = tmp_dir / ("quantize-" + std::to_string(::getpid()) + "-" + label + ".gguf");
    struct Cleanup {
      fs::path p;
      ~Cleanup() {
        std::error_code ec;
        fs::remove(p, ec);
      }
    } cleanup{tmp};
    note("writing " + label + " ...");
    w.write(tmp.string());
    res.file_bytes = static_cast<int64_t>(fs::file_size(tmp));
    {
      auto out = formats::GgufFile::open(tmp.string());
      res.bytes_per_token = bytes_per_token(*out);
    }

    StoreImportOptions io;
    io.label = label;
    io.kind = "text";
    io.notes = "quantized " + label + " from " + S.display + " (" + S.digest + ") by " + res.tool +
               (res.fallbacks.empty() ? "" : "; " + std::to_string(res.fallbacks.size()) + " tensor(s) fell back to a wider type");
    auto n = store.value()->import({{tmp.string(), "model"}}, target, io);
    if (!n.ok()) return n.status();
    res.version = n.value();
    res.model = target + "@" + std::to_string(res.version);
    auto v = store.value()->resolve(res.model);
    if (!v.ok()) return v.status();
    res.digest = "sha256:" + v.value().digest;
    const std::string installed = v.value().files.empty() ? std::string() : v.value().files[0].path;

    if (spec.quality) {
      note("scoring " + res.model + " against " + S.display + " ...");
      auto q = compare_text_models(S.path, installed, spec.text_path, spec.max_tokens, spec.threads);
      if (!q.ok()) return Status::error(q.status().code, res.model + " was installed, but its quality report failed: " + q.status().message);
      res.has_quality = true;
      res.quality = q.value();
    }
    return res;
  });
}

}  // namespace atelier
