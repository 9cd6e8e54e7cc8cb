#include "text/llama.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/llama2c.h"

namespace atelier::text {

using kernels::DType;
using kernels::WeightView;

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// The views the backend's matmul is fastest with (on the CPU,
// kernels::pack_weights, or the rows as they are), every matrix read from
// the file in one buffer (Backend::prepare_weights_at): the packed Q8_0
// tile on AVX-512 is about 3x faster than the GGML layout's for batched
// decoding, and the buffer's huge pages stream faster than the mapping's.
// Each matrix's pages then leave this process's mapping, so the model is
// not resident twice (they stay in the page cache; a later read would
// fault them back in from the file). A matrix converted at load (in
// `owned`) is packed on its own, or used as it is where the device reads
// host memory (a device that does not gets its own copy).
void prepare_matrices(kernels::Backend& be, LlamaWeights& w, const std::vector<WeightView*>& ms) {
  std::vector<int64_t> at;
  int64_t total = 0;
  for (const WeightView* m : ms) {
    // A view anywhere in a converted buffer (a fused matrix's rows) is not the file's.
    const auto* p = static_cast<const uint8_t*>(m->data);
    const bool from_file = std::none_of(w.owned.begin(), w.owned.end(),
                                        [&](const auto& o) { return p >= o->data() && p < o->data() + o->size(); });
    at.push_back(from_file ? total : -1);
    if (from_file) total += be.prepared_weight_bytes(*m);
  }
  std::shared_ptr<kernels::Buffer> buf;
  if (total > 0) buf = be.alloc(total);
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  for (size_t i = 0; i < ms.size(); ++i) {
    WeightView& v = *ms[i];
    if (at[i] < 0) {
      std::unique_ptr<kernels::Buffer> storage;
      v = be.prepare_weights(v, storage);
      if (storage) w.prepared.push_back(std::move(storage));
      continue;
    }
    const WeightView p = be.prepare_weights_at(v, *buf, at[i]);
    const auto begin = reinterpret_cast<uintptr_t>(v.data), end = begin + static_cast<uintptr_t>(v.rows * v.row_stride_bytes);
    const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;  // whole pages of v only
    if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
    v = p;
  }
  if (buf) w.prepared.push_back(std::move(buf));
}

// Every matrix of w prepared for `be`. The embedding table stays as stored
// where the device reads host memory (rows are looked up, not multiplied:
// the mapping's pages of rows never used cost nothing); a device that does
// not gets its copy. A table tied to the output matrix is looked up in its
// prepared copy (Backend::get_rows reads every layout), so the file's copy
// is released.
void prepare_all(kernels::Backend& be, LlamaWeights& w) {
  const bool tied = w.output.data == w.tok_embd.data;
  std::vector<WeightView*> matrices = {&w.output};
  if (!tied && !be.device().host_memory) matrices.push_back(&w.tok_embd);
  for (LlamaLayer& L : w.layers) {
    for (WeightView* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      if (m->data) matrices.push_back(m);
    if (L.gate_inp.data) matrices.push_back(&L.gate_inp);
    for (auto* set : {&L.gate_exps, &L.up_exps, &L.down_exps})  // each expert prepared as a matrix of its own
      for (WeightView& e : *set) matrices.push_back(&e);
  }
  prepare_matrices(be, w, matrices);
  if (tied) w.tok_embd = w.output;
}

class GgufLoader {
 public:
  GgufLoader(const formats::GgufFile& f, LlamaWeights& w, kernels::Backend& be) : f_(f), w_(w), be_(be) {}

  // A 2-D matrix of `rows` rows of `cols`. Types matmul cannot read directly are
  // converted once at load (to Q8_0 when the row allows it, else F32).
  WeightView matrix(const std::string& name, int64_t cols, int64_t rows) {
    const formats::GgufTensor& t = f_.tensor(name);
    check_shape(t, {cols, rows});
    count(t);
    WeightView v{t.type, t.data, rows, cols, kernels::dtype_row_bytes(t.type, cols)};
    if (kernels::matmul_supports(t.type)) return v;
    return convert(v);
  }

  std::vector<float> vector(const std::string& name, int64_t n) {
    const formats::GgufTensor& t = f_.tensor(name);
    check_shape(t, {n});
    count(t);
    std::vector<float> out(static_cast<size_t>(n));
    kernels::dequantize_row(t.type, t.data, out.data(), n);
    return out;
  }

  // Rows [first, first + n) of a matrix: a view into the same memory.
  static WeightView rows_of(const WeightView& m, int64_t first, int64_t n) {
    return WeightView{m.type, static_cast<const uint8_t*>(m.data) + first * m.row_stride_bytes, n, m.cols,
                      m.row_stride_bytes};
  }

  std::vector<float> optional_vector(const std::string& name, int64_t n) {
    return f_.find_tensor(name) ? vector(name, n) : std::vector<float>{};
  }

  // A 3-D expert tensor [cols, rows, n_expert] (GGUF order): n_expert
  // matrices of `rows` rows of `cols`, expert e's rows right after expert
  // e - 1's (ggml's mul_mat_id layout), each viewed as a 2-D matrix.
  std::vector<WeightView> experts(const std::string& name, int64_t cols, int64_t rows, int64_t n_expert) {
    const formats::GgufTensor& t = f_.tensor(name);
    check_shape(t, {cols, rows, n_expert});
    count(t);
    const int64_t row_bytes = kernels::dtype_row_bytes(t.type, cols);
    std::vector<WeightView> out;
    for (int64_t e = 0; e < n_expert; ++e) {
      WeightView v{t.type, static_cast<const uint8_t*>(t.data) + e * rows * row_bytes, rows, cols, row_bytes};
      out.push_back(kernels::matmul_supports(t.type) ? v : convert(v));
    }
    return out;
  }
  // n_expert rows of n (a per-expert bias, [n, n_expert] in GGUF order), flattened.
  std::vector<float> expert_vectors(const std::string& name, int64_t n, int64_t n_expert) {
    const formats::GgufTensor& t = f_.tensor(name);
    check_shape(t, {n, n_expert});
    count(t);
    std::vector<float> out(static_cast<size_t>(n * n_expert));
    const int64_t row_bytes = kernels::dtype_row_bytes(t.type, n);
    for (int64_t e = 0; e < n_expert; ++e)
      kernels::dequantize_row(t.type, static_cast<const uint8_t*>(t.data) + e * row_bytes, out.data() + e * n, n);
    return out;
  }

  std::string type_summary() const {
    std::string s;
    for (const auto& [name, n] : type_counts_) s += (s.empty() ? "" : ", ") + name + " (" + std::to_string(n) + ")";
    return s;
  }

 private:
  void check_shape(const formats::GgufTensor& t, const std::vector<int64_t>& want) {
    if (t.shape != want)
      throw Error(f_.path() + ": tensor '" + t.name + "' has shape " + shape_str(t.shape) + ", expected " +
                  shape_str(want) + " from the file's hyperparameters; the file is inconsistent");
  }
  void count(const formats::GgufTensor& t) {
    ++type_counts_[std::string(kernels::dtype_name(t.type))];
    w_.n_params += t.elements();
  }
  WeightView convert(const WeightView& v) {
    const bool to_q8 = v.cols % 32 == 0;
    const DType dst = to_q8 ? DType::Q8_0 : DType::F32;
    const int64_t row_bytes = kernels::dtype_row_bytes(dst, v.cols);
    auto buf = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(row_bytes * v.rows));
    std::vector<float> row(static_cast<size_t>(v.cols));
    for (int64_t r = 0; r < v.rows; ++r) {
      kernels::dequantize_row(v.type, static_cast<const uint8_t*>(v.data) + r * v.row_stride_bytes, row.data(), v.cols);
      kernels::quantize_row(dst, row.data(), buf->data() + r * row_bytes, v.cols);
    }
    w_.owned.push_back(buf);
    return WeightView{dst, buf->data(), v.rows, v.cols, row_bytes};
  }

  const formats::GgufFile& f_;
  LlamaWeights& w_;
  kernels::Backend& be_;
  std::map<std::string, int> type_counts_;
};

}  // namespace

LlamaWeights load_llama_gguf(std::shared_ptr<formats::GgufFile> file, kernels::Backend& backend) {
  const formats::GgufFile& f = *file;
  LlamaWeights w;
  w.format = "gguf";
  w.gguf = file;
  LlamaHparams& hp = w.hp;
  hp.architecture = f.get_string("general.architecture");
  const std::string& arch = hp.architecture;
  const bool gpt_oss = arch == "gpt-oss";
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "gemma3" && arch != "phi3" &&
      arch != "qwen3moe" && !gpt_oss)
    throw UnsupportedError(f.path() + ": architecture '" + arch +
                "' is not supported (supported: llama — Llama 2/3, Mistral, TinyLlama, Mixtral — qwen2, qwen3, qwen3moe, "
                "gemma3, phi3 and gpt-oss)");
  hp.name = f.get_string("general.name", "");
  const std::string p = arch + ".";
  hp.n_embd = static_cast<int>(f.get_int(p + "embedding_length"));
  hp.n_layer = static_cast<int>(f.get_int(p + "block_count"));
  hp.n_ff = static_cast<int>(f.get_int(p + "feed_forward_length"));
  hp.n_head = static_cast<int>(f.get_int(p + "attention.head_count"));
  hp.n_head_kv = static_cast<int>(f.get_int(p + "attention.head_count_kv", hp.n_head));
  hp.n_ctx_train = static_cast<int>(f.get_int(p + "context_length", 2048));
  hp.rms_eps = static_cast<float>(f.get_float(p + "attention.layer_norm_rms_epsilon", 1e-5));
  hp.rope_freq_base = static_cast<float>(f.get_float(p + "rope.freq_base", 10000.0));
  hp.sliding_window = static_cast<int>(f.get_int(p + "attention.sliding_window", 0));
  hp.rope_neox = arch != "llama";
  hp.has_qkv_bias = arch == "qwen2" || gpt_oss;
  // issue 36's dense architectures, as llama.cpp builds them (src/models/*.cpp).
  hp.has_qk_norm = arch == "qwen3" || arch == "gemma3" || arch == "qwen3moe";
  if (arch == "gemma3") {
    hp.embd_scale = std::sqrt(static_cast<float>(hp.n_embd));
    hp.has_post_norms = true;
    hp.ffn_gelu = true;
    // Every 6th layer global, the others local with RoPE base 10000 (llama.cpp
    // fixes both for gemma3; later files may name them).
    hp.swa_pattern = static_cast<int>(f.get_int(p + "attention.sliding_window_pattern", 6));
    hp.rope_freq_base_swa = static_cast<float>(f.get_float(p + "rope.freq_base_swa", 10000.0));
    hp.final_logit_softcap = static_cast<float>(f.get_float(p + "final_logit_softcapping", 0.0));
    if (hp.swa_pattern < 0 || !(hp.final_logit_softcap >= 0) || !(hp.rope_freq_base_swa > 0))
      throw Error(f.path() + ": gemma3 sliding_window_pattern, rope.freq_base_swa or final_logit_softcapping out of range; "
                  "the file is inconsistent");
  }
  // llama.cpp does not apply phi3's attention.sliding_window (its converter
  // wrote values the models were not trained with; llama.cpp PR 13676): nor do we.
  if (arch == "phi3") hp.sliding_window = 0;
  if (gpt_oss) hp.swa_pattern = 2;  // llama.cpp's set_swa_pattern(2): even layers slide, odd ones see everything
  // Experts: llama (Mixtral) and qwen3moe softmax then renormalise the
  // chosen k; gpt-oss takes the top k logits and softmaxes them (llama.cpp's
  // gating per architecture).
  hp.n_expert = static_cast<int>(f.get_int(p + "expert_count", 0));
  hp.n_expert_used = static_cast<int>(f.get_int(p + "expert_used_count", 0));
  hp.n_ff_exp = static_cast<int>(f.get_int(p + "expert_feed_forward_length", 0));
  hp.moe_gating = gpt_oss ? kernels::MoeGating::softmax_weights : kernels::MoeGating::softmax;
  hp.moe_norm = !gpt_oss;
  hp.moe_swiglu_oai = gpt_oss;
  auto bad = [&](const std::string& what) { return Error(f.path() + ": " + what + "; the file is inconsistent"); };
  if (hp.n_embd <= 0 || hp.n_layer <= 0 || hp.n_ff <= 0 || hp.n_head <= 0 || hp.n_head_kv <= 0 ||
      hp.n_embd > (1 << 16) || hp.n_layer > 1024 || hp.n_ff > (1 << 18) || hp.n_head > 1024)
    throw bad("hyperparameters out of range (embedding " + std::to_string(hp.n_embd) + ", layers " +
              std::to_string(hp.n_layer) + ", heads " + std::to_string(hp.n_head) + ")");
  if (hp.n_head % hp.n_head_kv != 0) throw bad("head_count is not a multiple of head_count_kv");
  if (hp.sliding_window < 0) throw bad("attention.sliding_window is negative");
  if ((arch == "qwen3moe" || gpt_oss) && hp.n_expert <= 0) throw bad(arch + " needs expert_count > 0");
  if (hp.n_expert > 0) {
    if (hp.n_ff_exp <= 0) hp.n_ff_exp = hp.n_ff;  // Mixtral: the experts are feed_forward_length wide
    if (hp.n_expert > 1024 || hp.n_expert_used <= 0 || hp.n_expert_used > hp.n_expert || hp.n_ff_exp > (1 << 18))
      throw bad("expert_count " + std::to_string(hp.n_expert) + " / expert_used_count " +
                std::to_string(hp.n_expert_used) + " out of range (1 <= used <= count <= 1024)");
  }
  hp.head_dim = static_cast<int>(f.get_int(p + "attention.key_length", hp.n_embd / hp.n_head));
  if (hp.head_dim <= 0 || hp.head_dim % 2 != 0) throw bad("attention head size must be even and positive");
  if (arch == "gemma3")  // Gemma 3 27B (62 layers) scales scores by its n_embd / n_head, not its head size
    hp.attn_scale = 1.0f / std::sqrt(static_cast<float>(hp.n_layer == 62 ? hp.n_embd / hp.n_head : hp.head_dim));
  hp.n_rot = static_cast<int>(f.get_int(p + "rope.dimension_count", hp.head_dim));
  if (hp.n_rot <= 0 || hp.n_rot > hp.head_dim || hp.n_rot % 2 != 0) throw bad("rope.dimension_count out of range");
  // Linear RoPE scaling (position interpolation); the older key name too.
  std::string scaling = f.get_string(p + "rope.scaling.type", "");
  double factor = f.get_float(p + "rope.scaling.factor", f.get_float(p + "rope.scale_linear", 1.0));
  const bool llama3_scaling = scaling == "llama3" && f.find_tensor("rope_freqs.weight");  // applied through rope_freqs
  if (!scaling.empty() && scaling != "none" && scaling != "linear" && scaling != "yarn" && !llama3_scaling)
    throw UnsupportedError(f.path() + ": rope scaling '" + scaling +
                           "' is not supported (supported: none, linear, yarn, and Llama 3.1 frequency factors)");
  if (factor > 0 && (scaling.empty() || scaling == "linear" || scaling == "yarn"))
    hp.rope_freq_scale = static_cast<float>(1.0 / factor);
  hp.rope_ctx_orig = static_cast<int>(f.get_int(p + "rope.scaling.original_context_length", hp.n_ctx_train));
  // A RoPE magnitude factor without YaRN (phi3's LongRoPE): YaRN's cos/sin
  // scaling with no extrapolation mix, as llama.cpp's attn_factor.
  const double attn_factor = f.get_float(p + "rope.scaling.attn_factor", 1.0);
  if (scaling != "yarn" && attn_factor != 1.0) {
    if (!(attn_factor > 0) || !std::isfinite(attn_factor)) throw bad("rope.scaling.attn_factor must be positive");
    hp.rope_yarn = true;
    hp.yarn.ext_factor = 0.0f;
    hp.yarn.attn_factor = static_cast<float>(attn_factor);
    hp.yarn.n_ctx_orig = std::max(hp.rope_ctx_orig, 1);
  }
  if (scaling == "yarn") {
    hp.rope_yarn = true;
    hp.yarn.n_ctx_orig = static_cast<int>(f.get_int(p + "rope.scaling.original_context_length", hp.n_ctx_train));
    hp.yarn.attn_factor = static_cast<float>(f.get_float(p + "rope.scaling.attn_factor", 1.0));
    hp.yarn.ext_factor = static_cast<float>(f.get_float(p + "rope.scaling.yarn_ext_factor", 1.0));
    hp.yarn.beta_fast = static_cast<float>(f.get_float(p + "rope.scaling.yarn_beta_fast", 32.0));
    hp.yarn.beta_slow = static_cast<float>(f.get_float(p + "rope.scaling.yarn_beta_slow", 1.0));
    if (!(factor >= 1) || hp.yarn.n_ctx_orig <= 0 || !(hp.yarn.beta_fast > hp.yarn.beta_slow) || !(hp.yarn.beta_slow > 0))
      throw bad("yarn rope scaling needs factor >= 1, original_context_length > 0 and beta_fast > beta_slow > 0");
  }

  const formats::GgufTensor& emb = f.tensor("token_embd.weight");
  if (emb.shape.size() != 2) throw bad("token_embd.weight must be 2-D");
  hp.n_vocab = static_cast<int>(emb.shape[1]);

  GgufLoader ld(f, w, backend);
  const int64_t d = hp.n_embd, qd = int64_t{hp.n_head} * hp.head_dim, kvd = int64_t{hp.n_head_kv} * hp.head_dim;
  w.tok_embd = ld.matrix("token_embd.weight", d, hp.n_vocab);
  w.output_norm = ld.vector("output_norm.weight", d);
  // Llama 3.1+ stretches RoPE's low frequencies with per-pair divisors.
  w.rope_freq_factors = ld.optional_vector("rope_freqs.weight", hp.n_rot / 2);
  for (float f : w.rope_freq_factors)
    if (!(f > 0.0f) || !std::isfinite(f)) throw bad("rope_freqs.weight holds a non-positive or non-finite factor");
  w.rope_factors_short = ld.optional_vector("rope_factors_short.weight", hp.n_rot / 2);
  w.rope_factors_long = ld.optional_vector("rope_factors_long.weight", hp.n_rot / 2);
  for (const auto* fs : {&w.rope_factors_short, &w.rope_factors_long})
    for (float f : *fs)
      if (!(f > 0.0f) || !std::isfinite(f)) throw bad("rope_factors_short/long hold a non-positive or non-finite factor");
  if (w.rope_factors_short.empty() != w.rope_factors_long.empty())
    throw bad("rope_factors_short.weight and rope_factors_long.weight come together");
  if (w.rope_freq_factors.empty()) w.rope_freq_factors = w.rope_factors_short;  // select_rope_factors may change it
  w.output = f.find_tensor("output.weight") ? ld.matrix("output.weight", d, hp.n_vocab) : w.tok_embd;
  w.layers.resize(static_cast<size_t>(hp.n_layer));
  for (int l = 0; l < hp.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    LlamaLayer& L = w.layers[static_cast<size_t>(l)];
    L.attn_norm = ld.vector(b + "attn_norm.weight", d);
    if (arch == "phi3" && f.find_tensor(b + "attn_qkv.weight")) {
      // Fused q|k|v rows: three views of one matrix (each output row is its own dot product, so nothing changes).
      const WeightView qkv = ld.matrix(b + "attn_qkv.weight", d, qd + 2 * kvd);
      L.wq = ld.rows_of(qkv, 0, qd);
      L.wk = ld.rows_of(qkv, qd, kvd);
      L.wv = ld.rows_of(qkv, qd + kvd, kvd);
    } else {
      L.wq = ld.matrix(b + "attn_q.weight", d, qd);
      L.wk = ld.matrix(b + "attn_k.weight", d, kvd);
      L.wv = ld.matrix(b + "attn_v.weight", d, kvd);
    }
    L.wo = ld.matrix(b + "attn_output.weight", qd, d);
    if (hp.has_qk_norm) {
      L.q_norm = ld.vector(b + "attn_q_norm.weight", hp.head_dim);
      L.k_norm = ld.vector(b + "attn_k_norm.weight", hp.head_dim);
    }
    if (hp.has_post_norms) {
      L.attn_post_norm = ld.vector(b + "post_attention_norm.weight", d);
      L.ffn_post_norm = ld.vector(b + "post_ffw_norm.weight", d);
    }
    if (hp.has_qkv_bias) {
      L.bq = ld.optional_vector(b + "attn_q.bias", qd);
      L.bk = ld.optional_vector(b + "attn_k.bias", kvd);
      L.bv = ld.optional_vector(b + "attn_v.bias", kvd);
    }
    L.ffn_norm = ld.vector(b + (gpt_oss ? "post_attention_norm.weight" : "ffn_norm.weight"), d);
    if (gpt_oss) {
      L.bo = ld.vector(b + "attn_output.bias", d);
      L.sinks = ld.vector(b + "attn_sinks.weight", hp.n_head);
    }
    if (hp.n_expert > 0) {
      const int64_t ne = hp.n_expert, fe = hp.n_ff_exp;
      L.gate_inp = ld.matrix(b + "ffn_gate_inp.weight", d, ne);
      L.gate_exps = ld.experts(b + "ffn_gate_exps.weight", d, fe, ne);
      L.up_exps = ld.experts(b + "ffn_up_exps.weight", d, fe, ne);
      L.down_exps = ld.experts(b + "ffn_down_exps.weight", fe, d, ne);
      if (gpt_oss) {
        L.gate_inp_b = ld.vector(b + "ffn_gate_inp.bias", ne);
        L.gate_exps_b = ld.expert_vectors(b + "ffn_gate_exps.bias", fe, ne);
        L.up_exps_b = ld.expert_vectors(b + "ffn_up_exps.bias", fe, ne);
        L.down_exps_b = ld.expert_vectors(b + "ffn_down_exps.bias", d, ne);
      }
      continue;
    }
    if (arch == "phi3") {  // fused gate|up rows (llama.cpp's ggml_swiglu: the first half is the gate)
      const WeightView gate_up = ld.matrix(b + "ffn_up.weight", d, 2 * int64_t{hp.n_ff});
      L.w_gate = ld.rows_of(gate_up, 0, hp.n_ff);
      L.w_up = ld.rows_of(gate_up, hp.n_ff, hp.n_ff);
    } else {
      L.w_gate = ld.matrix(b + "ffn_gate.weight", d, hp.n_ff);
      L.w_up = ld.matrix(b + "ffn_up.weight", d, hp.n_ff);
    }
    L.w_down = ld.matrix(b + "ffn_down.weight", hp.n_ff, d);
  }
  w.weight_types = ld.type_summary();
  prepare_all(backend, w);
  return w;
}

void select_rope_factors(LlamaWeights& w, int n_ctx) {
  if (w.rope_factors_long.empty()) return;
  w.rope_freq_factors = n_ctx > w.hp.rope_ctx_orig ? w.rope_factors_long : w.rope_factors_short;
}

LlamaWeights load_llama2c(const std::string& path, kernels::Backend& backend) {
  formats::Llama2cModel m = formats::load_llama2c(path);
  const formats::Llama2cConfig& c = m.config;
  LlamaWeights w;
  w.format = "llama2c";
  w.map = m.map;
  LlamaHparams& hp = w.hp;
  hp.name = "llama2.c";
  hp.n_vocab = c.vocab_size;
  hp.n_ctx_train = c.seq_len;
  hp.n_embd = c.dim;
  hp.n_layer = c.n_layers;
  hp.n_head = c.n_heads;
  hp.n_head_kv = c.n_kv_heads;
  hp.n_ff = c.hidden_dim;
  hp.head_dim = c.dim / c.n_heads;
  hp.n_rot = hp.head_dim;
  const int64_t d = c.dim, hd = hp.head_dim, qd = int64_t{c.n_heads} * hd, kvd = int64_t{c.n_kv_heads} * hd;
  const int64_t ff = c.hidden_dim;
  auto view = [&](const float* base, int layer, int64_t rows, int64_t cols) {
    w.n_params += rows * cols;
    return WeightView{DType::F32, base + layer * rows * cols, rows, cols, cols * 4};
  };
  auto vec = [&](const float* base, int layer, int64_t n) {
    w.n_params += n;
    return std::vector<float>(base + layer * n, base + (layer + 1) * n);
  };
  const formats::Llama2cWeights& W = m.weights;
  w.tok_embd = view(W.token_embedding, 0, c.vocab_size, d);
  w.output = c.shared_classifier ? w.tok_embd : view(W.wcls, 0, c.vocab_size, d);
  w.output_norm = vec(W.rms_final, 0, d);
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    LlamaLayer& L = w.layers[static_cast<size_t>(l)];
    L.attn_norm = vec(W.rms_att, l, d);
    L.wq = view(W.wq, l, qd, d);
    L.wk = view(W.wk, l, kvd, d);
    L.wv = view(W.wv, l, kvd, d);
    L.wo = view(W.wo, l, d, qd);
    L.ffn_norm = vec(W.rms_ffn, l, d);
    L.w_gate = view(W.w1, l, ff, d);
    L.w_down = view(W.w2, l, d, ff);
    L.w_up = view(W.w3, l, ff, d);
  }
  w.weight_types = "f32 (" + std::to_string(2 + 9 * c.n_layers + (c.shared_classifier ? 0 : 1)) + ")";
  prepare_all(backend, w);
  return w;
}

// ---------------------------------------------------------------- forward pass

LlamaRunner::LlamaRunner(const LlamaWeights& w, kernels::Executor* ex)
    : w_(w), own_backend_(kernels::make_cpu_backend(ex)), be_(*own_backend_) {
  upload_vectors();
}

LlamaRunner::LlamaRunner(const LlamaWeights& w, kernels::Backend& backend) : w_(w), be_(backend) { upload_vectors(); }

LlamaRunner::~LlamaRunner() {
  if (!step_ids_.empty()) be_.drop_graphs();
}

void LlamaRunner::invalidate_steps() {
  if (step_ids_.empty()) return;
  step_ids_.clear();
  be_.drop_graphs();
}

uint64_t LlamaRunner::step_key(int rows, int logits_rows, int max_len, bool sampling) {
  // Everything the step's op arguments take that is not fixed for the
  // runner's buffers (those move only with invalidate_steps): the shapes,
  // the attention bound, and the KV storages in the order their metadata
  // sections lie (their addresses and strides are op arguments).
  std::vector<int64_t> shape = {rows, logits_rows, max_len, sampling, static_cast<int64_t>(storages_.size())};
  for (const KvSeq* s : storages_) {
    const kernels::KvLayout& kv = s->layout();
    shape.insert(shape.end(), {static_cast<int64_t>(kv.type), static_cast<int64_t>(reinterpret_cast<uintptr_t>(kv.k)),
                               static_cast<int64_t>(reinterpret_cast<uintptr_t>(kv.v)), kv.row_elems, kv.block_tokens,
                               kv.block_stride_elems, kv.layer_stride_elems});
  }
  auto it = step_ids_.find(shape);
  if (it == step_ids_.end()) {
    if (next_step_id_ == UINT32_MAX) {  // numbers run out: a new scope (never seen in practice)
      graph_scope_ = kernels::new_graph_scope();
      next_step_id_ = 0;
      step_ids_.clear();
    }
    it = step_ids_.emplace(std::move(shape), next_step_id_++).first;
  }
  return graph_scope_ << 32 | it->second;
}

void LlamaRunner::upload_vectors() {
  host_memory_ = be_.device().host_memory;
  graph_scope_ = kernels::new_graph_scope();
  // Each vector 64-byte aligned (16 floats), in one buffer; an empty one stays nullptr.
  auto round = [](size_t floats) { return static_cast<int64_t>((floats + 15) / 16 * 16); };
  std::vector<const std::vector<float>*> all = {&w_.output_norm, &w_.rope_freq_factors};
  constexpr size_t kPerLayer = 15;
  for (const LlamaLayer& L : w_.layers)
    for (const std::vector<float>* v : {&L.attn_norm, &L.ffn_norm, &L.bq, &L.bk, &L.bv, &L.q_norm, &L.k_norm,
                                        &L.attn_post_norm, &L.ffn_post_norm, &L.bo, &L.sinks, &L.gate_inp_b,
                                        &L.gate_exps_b, &L.up_exps_b, &L.down_exps_b})
      all.push_back(v);
  int64_t total = 0;
  for (const auto* v : all) total += round(v->size());
  vectors_ = be_.alloc(std::max<int64_t>(total, 16) * int64_t{sizeof(float)});
  std::vector<const float*> where;
  int64_t at = 0;
  for (const auto* v : all) {
    if (v->empty()) {
      where.push_back(nullptr);
      continue;
    }
    be_.upload(*vectors_, at * int64_t{sizeof(float)}, v->data(), static_cast<int64_t>(v->size() * sizeof(float)));
    where.push_back(vectors_->at<float>(at * int64_t{sizeof(float)}));
    at += round(v->size());
  }
  output_norm_ = where[0];
  rope_factors_ = where[1];
  layer_vectors_.resize(w_.layers.size());
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    const float* const* p = &where[2 + kPerLayer * l];
    layer_vectors_[l] = {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], {p[11], p[12], p[13], p[14]}};
  }
  if (w_.hp.n_expert > 0) moe_ = std::make_unique<MoeFfn>(be_);
}

void LlamaRunner::ensure_workspace(int n, int n_logits) {
  const LlamaHparams& hp = w_.hp;
  if (n <= cap_ && n_logits <= cap_logits_) return;
  // Grown to the largest step seen (and never shrunk), so a steady state of
  // steps allocates nothing.
  cap_ = std::max(cap_, n);
  cap_logits_ = std::max(cap_logits_, n_logits);
  const int64_t N = cap_, d = hp.n_embd, qd = int64_t{hp.n_head} * hp.head_dim,
                kvd = int64_t{hp.n_head_kv} * hp.head_dim, ff = hp.n_ff;
  // Each array 64-byte aligned; activations of the backend's type, logits F32.
  const kernels::DType at = be_.act_dtype();
  auto round = [](int64_t bytes) { return (bytes + 63) / 64 * 64; };
  const int64_t sizes[] = {N * d, N * d, N * d, N * qd, N * qd, N * kvd, N * kvd, N * ff, N * ff,
                           int64_t{cap_logits_} * hp.n_vocab};
  int64_t total = 0;
  for (int i = 0; i < 10; ++i) total += round(kernels::act_bytes(i == 9 ? kernels::DType::F32 : at, sizes[i]));
  invalidate_steps();  // before the free: no recorded step may outlive the memory it points into
  work_.reset();
  work_ = be_.alloc(total);
  be_.clear(*work_);  // its pages committed here, once per growth, rather than inside the ops
  kernels::Act* dst[] = {&x_, &xn_, &tmp_, &q_, &att_, &k_, &v_, &gate_, &up_, &logits_};
  int64_t offset = 0;
  for (int i = 0; i < 10; ++i) {
    const kernels::DType t = i == 9 ? kernels::DType::F32 : at;
    *dst[i] = kernels::Act(work_->at<uint8_t>(offset), t);
    if (i == 9) logits_offset_ = offset;
    offset += round(kernels::act_bytes(t, sizes[i]));
  }
}

namespace {
int bucket_rows(int n) {
  int b = 1;
  while (b < n) b *= 2;
  return b;
}
}  // namespace

void LlamaRunner::ensure_meta(int n_storages, int64_t table_entries) {
  // Sections at offsets that depend on capacities only (not on this step's
  // rows), so every step up to them hands the ops the same device addresses,
  // as a captured CUDA graph replays them.
  const bool same = meta_ && meta_rows_ == cap_ && meta_logits_ == cap_logits_ && n_storages <= cap_storages_ &&
                    table_entries <= cap_tables_;
  if (same) return;
  meta_rows_ = cap_;
  meta_logits_ = cap_logits_;
  cap_storages_ = std::max(cap_storages_, n_storages);
  // Block tables grow with the contexts: room for 1024 entries at least (4 KiB),
  // doubled when outgrown, so decoding moves them seldom.
  if (table_entries > cap_tables_) cap_tables_ = std::max({table_entries, 2 * cap_tables_, int64_t{1024}});
  const int64_t C = cap_;
  meta_at_.ids = 0;
  meta_at_.pos = C;
  meta_at_.table = 2 * C;
  meta_at_.logit = 3 * C;
  meta_at_.slots = 3 * C + cap_logits_;
  meta_at_.tables = meta_at_.slots + 2 * C * cap_storages_;
  invalidate_steps();
  meta_.reset();
  meta_ = be_.alloc((meta_at_.tables + cap_tables_) * int64_t{sizeof(int32_t)});
  meta_host_.assign(static_cast<size_t>(meta_at_.tables + cap_tables_), 0);
}

namespace {
int64_t sampling_bytes(int64_t rows, int64_t pairs) {
  return rows * int64_t{sizeof(kernels::SampleRow) + sizeof(int32_t)} + pairs * 2 * int64_t{sizeof(int32_t)};
}
}  // namespace

int64_t LlamaRunner::workspace_bytes(const LlamaHparams& hp, int rows, int logits_rows, kernels::DType act) {
  const int64_t N = rows, d = hp.n_embd, qd = int64_t{hp.n_head} * hp.head_dim, kvd = int64_t{hp.n_head_kv} * hp.head_dim,
                ff = hp.n_ff;
  auto round = [](int64_t bytes) { return (bytes + 63) / 64 * 64; };
  const int64_t sizes[] = {N * d, N * d, N * d, N * qd, N * qd, N * kvd, N * kvd, N * ff, N * ff};
  int64_t total = round(kernels::act_bytes(kernels::DType::F32, int64_t{logits_rows} * hp.n_vocab));
  for (int64_t z : sizes) total += round(kernels::act_bytes(act, z));
  // The metadata: ids, positions, table offsets, slots and lengths of one
  // storage (5 rows' worth), the logit rows, 1024 block-table entries.
  total += (5 * N + logits_rows + 1024) * int64_t{sizeof(int32_t)};
  // Sampling on the device: a SampleRow and an id per logits row, 64 penalty pairs a row.
  total += sampling_bytes(logits_rows, int64_t{64} * logits_rows);
  return total + MoeFfn::workspace_bytes(hp, N, act);
}

void LlamaRunner::ensure_sampling(int logits_rows, int64_t n_pairs) {
  if (samp_ && logits_rows <= cap_sample_rows_ && n_pairs <= cap_pairs_) return;
  cap_sample_rows_ = std::max(cap_sample_rows_, logits_rows);
  // Room for 64 pairs a row (llama.cpp's default window) at least, doubled when outgrown.
  const int64_t want = std::max<int64_t>(n_pairs, int64_t{64} * cap_sample_rows_);
  if (want > cap_pairs_) cap_pairs_ = std::max(want, 2 * cap_pairs_);
  const int64_t bytes = sampling_bytes(cap_sample_rows_, cap_pairs_);
  invalidate_steps();
  samp_.reset();
  samp_ = be_.alloc(bytes);
  samp_host_.assign(static_cast<size_t>(bytes), 0);
}

void LlamaRunner::reserve(int rows, int logits_rows) {
  const int rr = host_memory_ ? rows : bucket_rows(rows), lr = host_memory_ ? logits_rows : bucket_rows(logits_rows);
  ensure_workspace(rr, lr);
  ensure_meta(1, 1);  // block tables: their initial capacity (1024 entries)
  if (!host_memory_) ensure_sampling(lr, 0);
  if (moe_ && moe_->reserve(w_.hp, rr)) invalidate_steps();
}

void LlamaRunner::forward(const int32_t* tokens, int n, int pos0, KvSeq& cache, float* logits) {
  SeqInput s;
  s.tokens = tokens;
  s.n = n;
  s.pos0 = pos0;
  s.kv = &cache;
  s.logits = logits;
  forward_batch(&s, 1);
}

void LlamaRunner::forward_batch(const std::vector<SeqInput>& seqs) {
  forward_batch(seqs.data(), static_cast<int>(seqs.size()));
}

void LlamaRunner::forward_batch(const SeqInput* seqs, int count) {
  const LlamaHparams& hp = w_.hp;
  // Check everything before computing anything.
  int rows = 0, n_logits = 0, max_len = 0, n_sampled = 0;
  int64_t table_entries = 0, n_pairs = 0;
  storages_.clear();
  for (int s = 0; s < count; ++s) {
    const SeqInput& in = seqs[s];
    if (in.n <= 0) continue;
    if (!in.kv) throw Error("sequence " + std::to_string(s) + " of the step has no KV cache");
    if (!in.tokens) throw Error("sequence " + std::to_string(s) + " of the step has no tokens");
    if (in.pos0 < 0 || in.pos0 + in.n > in.kv->capacity())
      throw Error("the sequence needs " + std::to_string(in.pos0 + in.n) + " positions but the context holds " +
                  std::to_string(in.kv->capacity()));
    for (int i = 0; i < in.n; ++i)
      if (in.tokens[i] < 0 || in.tokens[i] >= hp.n_vocab)
        throw Error("token id " + std::to_string(in.tokens[i]) + " is outside the vocabulary (0.." +
                    std::to_string(hp.n_vocab - 1) + ")");
    for (int o = 0; o < s; ++o)
      if (seqs[o].n > 0 && seqs[o].kv == in.kv)
        throw Error("sequences " + std::to_string(o) + " and " + std::to_string(s) + " of the step share one KV cache");
    if (in.sample && (in.all_logits || !in.sampled))
      throw Error("sequence " + std::to_string(s) + " of the step asks for sampling on the device " +
                  (in.all_logits ? "with every token's logits" : "with nowhere to put the token"));
    rows += in.n;
    max_len = std::max(max_len, in.pos0 + in.n);
    if (in.logits || in.sample) n_logits += in.all_logits ? in.n : 1;
    if (in.sample) {
      ++n_sampled;
      n_pairs += in.sample->penalty_count;
    }
    table_entries += in.kv->n_blocks();
    if (std::none_of(storages_.begin(), storages_.end(), [&](const KvSeq* o) { return o->layout().k == in.kv->layout().k; }))
      storages_.push_back(in.kv);
  }
  if (rows == 0) return;
  // A device apart from the host runs a step padded to a bucket of rows (a
  // power of two) and of logits rows, so that a CUDA graph captured for a
  // bucket replays every step that fits it: the op shapes and the metadata
  // addresses are the bucket's. The padding rows are the skip rows the ops
  // already know: slot -1 (nothing stored), length 0 (no attention), token 0
  // at position 0; their logits are never downloaded. The CPU runs the rows it has.
  const int rr = host_memory_ ? rows : bucket_rows(rows);
  const int lr = host_memory_ || n_logits == 0 ? n_logits : bucket_rows(n_logits);
  ensure_workspace(rr, lr);

  // The step's metadata, in one int32 array: token ids, positions, each
  // row's block-table offset, the rows whose logits are wanted, then per KV
  // storage the rows' slots (-1: not this storage's, or a shared block) and
  // attention lengths (0: not this storage's), then the block tables.
  // storage g's rows at o_slots + 2 * C * g (slots) and + C (lengths).
  const int n_storages = static_cast<int>(storages_.size());
  ensure_meta(n_storages, table_entries);
  const int64_t R = rows, C = cap_;
  const int64_t o_ids = meta_at_.ids, o_pos = meta_at_.pos, o_table = meta_at_.table, o_logit = meta_at_.logit,
                o_slots = meta_at_.slots, o_tables = meta_at_.tables;
  const int64_t n_meta = o_tables + table_entries;
  int32_t* m = meta_host_.data();
  for (int g = 0; g < n_storages; ++g) {
    std::fill(m + o_slots + 2 * C * g, m + o_slots + 2 * C * g + rr, -1);
    std::fill(m + o_slots + 2 * C * g + C, m + o_slots + 2 * C * g + C + rr, 0);
  }
  for (int64_t r = R; r < rr; ++r) m[o_ids + r] = 0, m[o_pos + r] = 0, m[o_table + r] = 0;
  std::fill(m + o_logit + n_logits, m + o_logit + lr, 0);
  // The logits rows: the host's first (one download), then the device-sampled ones.
  const int n_host = n_logits - n_sampled;
  int64_t t = o_tables;
  for (int s = 0, r = 0, lg = 0, ls = n_host; s < count; ++s) {
    const SeqInput& in = seqs[s];
    if (in.n <= 0) continue;
    const int g = static_cast<int>(std::find_if(storages_.begin(), storages_.end(), [&](const KvSeq* o) {
                                     return o->layout().k == in.kv->layout().k;
                                   }) - storages_.begin());
    const int32_t* table = in.kv->block_table();
    std::copy(table, table + in.kv->n_blocks(), m + t);
    for (int i = 0; i < in.n; ++i, ++r) {
      const int pos = in.pos0 + i;
      m[o_ids + r] = in.tokens[i];
      m[o_pos + r] = pos;
      m[o_table + r] = static_cast<int32_t>(t - o_tables);
      m[o_slots + 2 * C * g + r] = in.kv->store_slot(pos);
      m[o_slots + 2 * C * g + C + r] = pos + 1;
    }
    t += in.kv->n_blocks();
    if (in.sample) {
      m[o_logit + ls++] = r - 1;
    } else if (in.logits) {
      if (in.all_logits)
        for (int i = in.n; i > 0; --i) m[o_logit + lg++] = r - i;
      else
        m[o_logit + lg++] = r - 1;
    }
  }
  be_.upload(*meta_, 0, m, n_meta * int64_t{sizeof(int32_t)});
  // Sampling on the device: a SampleRow per logits row of the bucket (the
  // host's rows and the padding skipped), the penalty pairs, one upload.
  const bool sampling = n_sampled > 0;
  kernels::SampleRow* dparams = nullptr;
  int32_t *dids = nullptr, *dpairs = nullptr;
  if (sampling) {
    ensure_sampling(lr, n_pairs);
    auto* rows_host = reinterpret_cast<kernels::SampleRow*>(samp_host_.data());
    const int64_t o_ids = int64_t{cap_sample_rows_} * int64_t{sizeof(kernels::SampleRow)};
    const int64_t o_pairs = o_ids + int64_t{cap_sample_rows_} * int64_t{sizeof(int32_t)};
    auto* pairs_host = reinterpret_cast<int32_t*>(samp_host_.data() + o_pairs);
    kernels::SampleRow skip;
    skip.skip = 1;
    for (int i = 0; i < lr; ++i) rows_host[i] = skip;
    int64_t pair = 0;
    for (int s = 0, j = n_host; s < count; ++s) {
      const SeqInput& in = seqs[s];
      if (in.n <= 0 || !in.sample) continue;
      kernels::SampleRow& row = rows_host[j++];
      row = *in.sample;
      row.skip = 0;
      row.penalty_offset = static_cast<int32_t>(pair);
      if (row.penalty_count > 0)
        std::memcpy(pairs_host + 2 * pair, in.sample_pairs, static_cast<size_t>(row.penalty_count) * 2 * sizeof(int32_t));
      pair += row.penalty_count;
    }
    // Up to the pairs' end (the ids in between are the op's to write).
    be_.upload(*samp_, 0, samp_host_.data(), o_pairs + pair * 2 * int64_t{sizeof(int32_t)});
    dparams = samp_->at<kernels::SampleRow>(0);
    dids = samp_->at<int32_t>(o_ids);
    dpairs = samp_->at<int32_t>(o_pairs);
  }
  const int32_t* dm = meta_->at<int32_t>(0);

  const int64_t d = hp.n_embd, qd = int64_t{hp.n_head} * hp.head_dim, kvd = int64_t{hp.n_head_kv} * hp.head_dim;
  const int64_t ff = hp.n_ff;
  kernels::RopeParams rq;
  rq.n_heads = hp.n_head;
  rq.head_dim = hp.head_dim;
  rq.rot_dim = hp.n_rot;
  rq.freq_base = hp.rope_freq_base;
  rq.freq_scale = hp.rope_freq_scale;
  rq.neox = hp.rope_neox;
  rq.freq_factors = rope_factors_;
  rq.yarn = hp.rope_yarn ? &hp.yarn : nullptr;
  kernels::RopeParams rk = rq;
  rk.n_heads = hp.n_head_kv;
  kernels::PagedAttention att;
  att.rows = rr;
  att.n_head = hp.n_head;
  att.n_head_kv = hp.n_head_kv;
  att.head_dim = hp.head_dim;
  att.scale = 1.0f / std::sqrt(static_cast<float>(hp.head_dim));
  // The kernels read each row's length on the device; max_len only bounds
  // them. A device gets a bound that moves seldom (a power of two), so a
  // captured step's launch shape holds for every step under it.
  if (!host_memory_ && max_len > max_len_bound_) max_len_bound_ = bucket_rows(std::max(max_len, 256));
  att.max_len = host_memory_ ? max_len : max_len_bound_;
  att.window = hp.sliding_window;
  att.row_table = dm + o_table;
  att.block_tables = dm + o_tables;
  // The experts' workspace sized before the step, never inside it.
  if (moe_ && moe_->reserve(hp, rr)) invalidate_steps();

  // The layer loop and the logits: on a device one Backend::run_step (a
  // CUDA graph per key replays it), so nothing in it may allocate,
  // synchronize, or hand the ops a value that the key does not name.
  auto ops = [&] {
    be_.get_rows(w_.tok_embd, dm + o_ids, x_, rr);
    if (hp.embd_scale > 0) {
      kernels::Affine scale;
      scale.mul = hp.embd_scale;
      be_.affine(x_, x_, rr * d, scale);
    }
    be_.rms_norm(x_, layer_vectors_[0].attn_norm, xn_, rr, d, hp.rms_eps);
    if (hp.attn_scale > 0) att.scale = hp.attn_scale;
    for (int l = 0; l < hp.n_layer; ++l) {
      const LlamaLayer& L = w_.layers[static_cast<size_t>(l)];
      const LayerVectors& V = layer_vectors_[static_cast<size_t>(l)];
      {
        const WeightView* w[] = {&L.wq, &L.wk, &L.wv};
        const kernels::Act y[] = {q_, k_, v_};
        be_.matmul_many(w, y, 3, xn_, rr);
      }
      if (V.bq) be_.add_bias(q_, V.bq, rr, qd);
      if (V.bk) be_.add_bias(k_, V.bk, rr, kvd);
      if (V.bv) be_.add_bias(v_, V.bv, rr, kvd);
      if (V.q_norm) {  // each head of q and k normalized on its own (rows of head_dim)
        be_.rms_norm(q_, V.q_norm, q_, rr * hp.n_head, hp.head_dim, hp.rms_eps);
        be_.rms_norm(k_, V.k_norm, k_, rr * hp.n_head_kv, hp.head_dim, hp.rms_eps);
      }
      // Local layers: the window, and their own RoPE base where the model has one.
      const bool local = is_local_layer(hp, l);
      att.window = local ? hp.sliding_window : 0;
      if (hp.rope_freq_base_swa > 0) {
        rq.freq_base = rk.freq_base = local ? hp.rope_freq_base_swa : hp.rope_freq_base;
        rq.freq_scale = rk.freq_scale = local ? 1.0f : hp.rope_freq_scale;
      }
      att.layer = l;
      att.sinks = V.sinks;
      if (n_storages == 1) {  // the usual step: every row in one pool
        be_.rope_store_kv(q_, k_, v_, rr, dm + o_pos, rq, rk, storages_[0]->layout(), l, dm + o_slots);
      } else {
        be_.rope(q_, rr, dm + o_pos, rq);
        be_.rope(k_, rr, dm + o_pos, rk);
        for (int g = 0; g < n_storages; ++g)
          be_.store_kv(storages_[static_cast<size_t>(g)]->layout(), l, k_, v_, dm + o_slots + 2 * C * g, rr);
      }
      for (int g = 0; g < n_storages; ++g) {
        att.row_len = dm + o_slots + 2 * C * g + C;
        be_.paged_attention(storages_[static_cast<size_t>(g)]->layout(), att, q_, att_);
      }
      be_.matmul(L.wo, att_, tmp_, rr);
      if (V.bo) be_.add_bias(tmp_, V.bo, rr, d);
      if (V.attn_post_norm) be_.rms_norm(tmp_, V.attn_post_norm, tmp_, rr, d, hp.rms_eps);
      be_.add_rms_norm(x_, tmp_, V.ffn_norm, xn_, rr, d, hp.rms_eps);
      if (moe_) {
        moe_->forward(hp, L, V.moe, xn_, tmp_, rr);
      } else {
        const WeightView* w[] = {&L.w_gate, &L.w_up};
        const kernels::Act y[] = {gate_, up_};
        be_.matmul_many(w, y, 2, xn_, rr);
        if (hp.ffn_gelu)
          be_.glu(kernels::Activation::gelu_tanh, gate_, up_, gate_, rr, ff);
        else
          be_.swiglu(gate_, up_, gate_, rr, ff);
        be_.matmul(L.w_down, gate_, tmp_, rr);
      }
      if (V.ffn_post_norm) be_.rms_norm(tmp_, V.ffn_post_norm, tmp_, rr, d, hp.rms_eps);
      // The residual, and the next layer's attention norm with it.
      const float* next_norm = l + 1 < hp.n_layer ? layer_vectors_[static_cast<size_t>(l) + 1].attn_norm : nullptr;
      be_.add_rms_norm(x_, tmp_, next_norm, xn_, rr, d, hp.rms_eps);
    }
    if (lr == 0) return;
    // The last row of every sequence that wants logits (every row with all_logits), gathered, through one
    // matmul (row-invariant, so each row's logits are those it would get alone).
    be_.copy_rows(x_, dm + o_logit, tmp_, lr, d);
    be_.rms_norm(tmp_, output_norm_, xn_, lr, d, hp.rms_eps);
    be_.matmul(w_.output, xn_, logits_, lr);
    if (hp.final_logit_softcap > 0) be_.tanh_clamp(logits_, logits_, lr * hp.n_vocab, hp.final_logit_softcap);
    if (sampling) be_.sample(logits_, lr, hp.n_vocab, dparams, dpairs, dids);
  };
  if (host_memory_) ops();
  else be_.run_step(step_key(rr, lr, att.max_len, sampling), ops);
  if (n_logits == 0) return;
  const int64_t nv = hp.n_vocab, row_bytes = nv * int64_t{sizeof(float)};
  const int64_t logits_offset = logits_offset_;
  // A device apart from the host: the host's logits rows in one download
  // (one wait for the stream), then handed out; the device's tokens in
  // another. On the host each sequence's rows are copied straight to it.
  if (sampling) {
    ids_host_.resize(static_cast<size_t>(n_sampled));
    const int64_t o_ids = int64_t{cap_sample_rows_} * int64_t{sizeof(kernels::SampleRow)};
    be_.download(*samp_, o_ids + int64_t{n_host} * int64_t{sizeof(int32_t)}, ids_host_.data(),
                 int64_t{n_sampled} * int64_t{sizeof(int32_t)});
    for (int s = 0, j = 0; s < count; ++s)
      if (seqs[s].n > 0 && seqs[s].sample) *seqs[s].sampled = ids_host_[static_cast<size_t>(j++)];
  }
  if (n_host == 0) return;
  const float* host = nullptr;
  if (!host_memory_) {
    logits_host_.resize(static_cast<size_t>(int64_t{n_host} * nv));
    be_.download(*work_, logits_offset, logits_host_.data(), n_host * row_bytes);
    host = logits_host_.data();
  }
  for (int s = 0, k = 0; s < count; ++s) {
    if (seqs[s].n <= 0 || !seqs[s].logits || seqs[s].sample) continue;
    const int n_rows = seqs[s].all_logits ? seqs[s].n : 1;
    if (host)
      std::memcpy(seqs[s].logits, host + k * nv, static_cast<size_t>(n_rows * row_bytes));
    else
      be_.download(*work_, logits_offset + k * row_bytes, seqs[s].logits, n_rows * row_bytes);
    k += n_rows;
  }
}

}  // namespace atelier::text
