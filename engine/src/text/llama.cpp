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

class GgufLoader {
 public:
  GgufLoader(const formats::GgufFile& f, LlamaWeights& w) : f_(f), w_(w) {}

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

  std::vector<float> optional_vector(const std::string& name, int64_t n) {
    return f_.find_tensor(name) ? vector(name, n) : std::vector<float>{};
  }

  // The copy of v that this CPU's matmul is fastest with (kernels::pack_weights),
  // or v itself when there is none. Done once at load: the packed Q8_0 tile
  // on AVX-512 is about 3x faster than the GGML layout's for batched decoding.
  // With release_source the file's pages of v, no longer read, leave this
  // process's mapping, so the model is not resident twice (they stay in the
  // page cache; a later read would fault them back in from the file).
  WeightView packed(const WeightView& v, bool release_source) {
    const int64_t bytes = kernels::packed_weight_bytes(v);
    if (bytes == 0) return v;
    auto buf = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(bytes + 64));
    void* aligned = buf->data() + (64 - reinterpret_cast<uintptr_t>(buf->data()) % 64) % 64;
    // Only the file's pages: a matrix converted at load lives in `owned`.
    const bool from_file = std::none_of(w_.owned.begin(), w_.owned.end(), [&](const auto& o) { return o->data() == v.data; });
    w_.owned.push_back(buf);
    const WeightView p = kernels::pack_weights(v, aligned);
    if (release_source && from_file) {
      const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
      const auto begin = reinterpret_cast<uintptr_t>(v.data), end = begin + static_cast<uintptr_t>(v.rows * v.row_stride_bytes);
      const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;  // whole pages of v only
      if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
    }
    return p;
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
  std::map<std::string, int> type_counts_;
};

}  // namespace

LlamaWeights load_llama_gguf(std::shared_ptr<formats::GgufFile> file) {
  const formats::GgufFile& f = *file;
  LlamaWeights w;
  w.format = "gguf";
  w.gguf = file;
  LlamaHparams& hp = w.hp;
  hp.architecture = f.get_string("general.architecture");
  const std::string& arch = hp.architecture;
  if (arch != "llama" && arch != "qwen2")
    throw UnsupportedError(f.path() + ": architecture '" + arch +
                "' is not supported (supported: llama — Llama 2/3, Mistral, TinyLlama — and qwen2)");
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
  hp.rope_neox = arch == "qwen2";
  hp.has_qkv_bias = arch == "qwen2";
  auto bad = [&](const std::string& what) { return Error(f.path() + ": " + what + "; the file is inconsistent"); };
  if (hp.n_embd <= 0 || hp.n_layer <= 0 || hp.n_ff <= 0 || hp.n_head <= 0 || hp.n_head_kv <= 0 ||
      hp.n_embd > (1 << 16) || hp.n_layer > 1024 || hp.n_ff > (1 << 18) || hp.n_head > 1024)
    throw bad("hyperparameters out of range (embedding " + std::to_string(hp.n_embd) + ", layers " +
              std::to_string(hp.n_layer) + ", heads " + std::to_string(hp.n_head) + ")");
  if (hp.n_head % hp.n_head_kv != 0) throw bad("head_count is not a multiple of head_count_kv");
  hp.head_dim = static_cast<int>(f.get_int(p + "attention.key_length", hp.n_embd / hp.n_head));
  if (hp.head_dim <= 0 || hp.head_dim % 2 != 0) throw bad("attention head size must be even and positive");
  hp.n_rot = static_cast<int>(f.get_int(p + "rope.dimension_count", hp.head_dim));
  if (hp.n_rot <= 0 || hp.n_rot > hp.head_dim || hp.n_rot % 2 != 0) throw bad("rope.dimension_count out of range");
  // Linear RoPE scaling (position interpolation); the older key name too.
  std::string scaling = f.get_string(p + "rope.scaling.type", "");
  double factor = f.get_float(p + "rope.scaling.factor", f.get_float(p + "rope.scale_linear", 1.0));
  const bool llama3_scaling = scaling == "llama3" && f.find_tensor("rope_freqs.weight");  // applied through rope_freqs
  if (!scaling.empty() && scaling != "none" && scaling != "linear" && !llama3_scaling)
    throw UnsupportedError(f.path() + ": rope scaling '" + scaling +
                           "' is not supported (supported: none, linear, and Llama 3.1 frequency factors)");
  if (factor > 0 && (scaling.empty() || scaling == "linear")) hp.rope_freq_scale = static_cast<float>(1.0 / factor);

  const formats::GgufTensor& emb = f.tensor("token_embd.weight");
  if (emb.shape.size() != 2) throw bad("token_embd.weight must be 2-D");
  hp.n_vocab = static_cast<int>(emb.shape[1]);

  GgufLoader ld(f, w);
  const int64_t d = hp.n_embd, qd = int64_t{hp.n_head} * hp.head_dim, kvd = int64_t{hp.n_head_kv} * hp.head_dim;
  w.tok_embd = ld.matrix("token_embd.weight", d, hp.n_vocab);
  w.output_norm = ld.vector("output_norm.weight", d);
  // Llama 3.1+ stretches RoPE's low frequencies with per-pair divisors.
  w.rope_freq_factors = ld.optional_vector("rope_freqs.weight", hp.n_rot / 2);
  for (float f : w.rope_freq_factors)
    if (!(f > 0.0f) || !std::isfinite(f)) throw bad("rope_freqs.weight holds a non-positive or non-finite factor");
  w.output = f.find_tensor("output.weight") ? ld.matrix("output.weight", d, hp.n_vocab) : w.tok_embd;
  w.layers.resize(static_cast<size_t>(hp.n_layer));
  for (int l = 0; l < hp.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    LlamaLayer& L = w.layers[static_cast<size_t>(l)];
    L.attn_norm = ld.vector(b + "attn_norm.weight", d);
    L.wq = ld.matrix(b + "attn_q.weight", d, qd);
    L.wk = ld.matrix(b + "attn_k.weight", d, kvd);
    L.wv = ld.matrix(b + "attn_v.weight", d, kvd);
    L.wo = ld.matrix(b + "attn_output.weight", qd, d);
    if (hp.has_qkv_bias) {
      L.bq = ld.optional_vector(b + "attn_q.bias", qd);
      L.bk = ld.optional_vector(b + "attn_k.bias", kvd);
      L.bv = ld.optional_vector(b + "attn_v.bias", kvd);
    }
    L.ffn_norm = ld.vector(b + "ffn_norm.weight", d);
    L.w_gate = ld.matrix(b + "ffn_gate.weight", d, hp.n_ff);
    L.w_up = ld.matrix(b + "ffn_up.weight", d, hp.n_ff);
    L.w_down = ld.matrix(b + "ffn_down.weight", hp.n_ff, d);
  }
  w.weight_types = ld.type_summary();
  // The embedding table stays as stored (rows are looked up, not multiplied).
  w.output = ld.packed(w.output, w.output.data != w.tok_embd.data);  // a tied table is still read for embeddings
  for (LlamaLayer& L : w.layers)
    for (WeightView* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) *m = ld.packed(*m, true);
  return w;
}

LlamaWeights load_llama2c(const std::string& path) {
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
  return w;
}

// ---------------------------------------------------------------- forward pass

LlamaRunner::LlamaRunner(const LlamaWeights& w, kernels::Executor* ex) : w_(w), ex_(ex) {}

void LlamaRunner::ensure_scratch(int n, int n_logits) {
  const LlamaHparams& hp = w_.hp;
  if (n > cap_) {
    const size_t N = static_cast<size_t>(n);
    const size_t d = static_cast<size_t>(hp.n_embd), qd = static_cast<size_t>(hp.n_head * hp.head_dim),
                 kvd = static_cast<size_t>(hp.n_head_kv * hp.head_dim), ff = static_cast<size_t>(hp.n_ff);
    x_.resize(N * d);
    xn_.resize(N * d);
    q_.resize(N * qd);
    k_.resize(N * kvd);
    v_.resize(N * kvd);
    att_out_.resize(N * qd);
    tmp_.resize(N * d);
    gate_.resize(N * ff);
    up_.resize(N * ff);
    row_seq_.resize(N);
    row_pos_.resize(N);
    cap_ = n;
  }
  if (n_logits > cap_logits_) {
    logits_.resize(static_cast<size_t>(n_logits) * static_cast<size_t>(hp.n_vocab));
    cap_logits_ = n_logits;
  }
}

void LlamaRunner::attention(int rows, int layer, const SeqInput* seqs) {
  const LlamaHparams& hp = w_.hp;
  const int hd = hp.head_dim, qd = hp.n_head * hd, group = hp.n_head / hp.n_head_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Each task is one row's heads h0..h1: it reads only the row's own
  // sequence's cache, and each head's arithmetic depends only on that row and
  // head, so the result is the same whatever else is in the step and however
  // the tasks are split. A task walks each run of cached positions once for
  // all its heads, position by position (the *_heads ops), so the run's K and
  // V rows stream through in address order. Heads are split only as far as
  // the threads need (generation: one row, one head per task).
  const int threads = ex_ ? ex_->threads() : 1;
  const int span = std::clamp(hp.n_head * rows / (4 * threads), 1, hp.n_head);
  const int chunks = (hp.n_head + span - 1) / span;
  auto task = [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(span) * static_cast<size_t>(max_len_));
    for (int64_t t = begin; t < end; ++t) {
      const int i = static_cast<int>(t / chunks), h0 = static_cast<int>(t % chunks) * span;
      const int h1 = std::min(hp.n_head, h0 + span);
      const KvSeq& cache = *seqs[row_seq_[static_cast<size_t>(i)]].kv;
      const bool f16 = cache.f16();
      const int len = row_pos_[static_cast<size_t>(i)] + 1;
      const float* q = q_.data() + static_cast<size_t>(i) * qd;
      float* out = att_out_.data() + static_cast<size_t>(i) * qd;
      auto head_scores = [&](int h) { return scores.data() + static_cast<size_t>(h - h0) * static_cast<size_t>(len); };
      // Runs of contiguous cached rows (the whole context for a KvCache, the
      // rest of a block for a PagedSeq). Each position's dot is the one-row
      // dot, and the V accumulation is one FMA per position in position order,
      // so the result does not depend on how the positions are grouped.
      kernels::AttnHeads heads;
      heads.h0 = h0;
      heads.h1 = h1;
      heads.group = group;
      heads.head_dim = hd;
      for (int p = 0; p < len;) {
        const KvSeq::Run run = cache.run(layer, p);
        const int n = std::min(run.n, len - p);
        float* s = scores.data() + p;
        if (f16) kernels::dot_f16_heads(static_cast<const uint16_t*>(run.k), run.stride, n, heads, q, s, len);
        else kernels::dot_f32_heads(static_cast<const float*>(run.k), run.stride, n, heads, q, s, len);
        for (int h = h0; h < h1; ++h)
          for (int j = 0; j < n; ++j) s[(h - h0) * len + j] *= scale;
        p += n;
      }
      for (int h = h0; h < h1; ++h) {
        kernels::softmax(head_scores(h), len);
        std::fill(out + h * hd, out + (h + 1) * hd, 0.0f);
      }
      for (int p = 0; p < len;) {
        const KvSeq::Run run = cache.run(layer, p);
        const int n = std::min(run.n, len - p);
        const float* a = scores.data() + p;
        if (f16) kernels::axpy_f16_heads(a, len, static_cast<const uint16_t*>(run.v), run.stride, n, heads, out);
        else kernels::axpy_f32_heads(a, len, static_cast<const float*>(run.v), run.stride, n, heads, out);
        p += n;
      }
    }
  };
  const int64_t tasks = int64_t{rows} * chunks;
  if (ex_) ex_->parallel_for(tasks, task);
  else task(0, tasks);
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
  int rows = 0, n_logits = 0, max_len = 0;
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
    rows += in.n;
    max_len = std::max(max_len, in.pos0 + in.n);
    if (in.logits) ++n_logits;
  }
  if (rows == 0) return;
  ensure_scratch(rows, n_logits);
  max_len_ = max_len;

  const int64_t d = hp.n_embd, qd = int64_t{hp.n_head} * hp.head_dim, kvd = int64_t{hp.n_head_kv} * hp.head_dim;
  for (int s = 0, r = 0; s < count; ++s) {
    const SeqInput& in = seqs[s];
    for (int i = 0; i < in.n; ++i, ++r) {
      row_seq_[static_cast<size_t>(r)] = s;
      row_pos_[static_cast<size_t>(r)] = in.pos0 + i;
      const uint8_t* row = static_cast<const uint8_t*>(w_.tok_embd.data) + int64_t{in.tokens[i]} * w_.tok_embd.row_stride_bytes;
      kernels::dequantize_row(w_.tok_embd.type, row, x_.data() + r * d, d);
    }
  }
  auto add_rows = [&](float* dst, const float* src, int64_t n) {
    for (int64_t j = 0; j < n; ++j) dst[j] += src[j];
  };
  auto add_bias = [&](float* dst, const std::vector<float>& b, int64_t width) {
    if (b.empty()) return;
    for (int r = 0; r < rows; ++r) add_rows(dst + r * width, b.data(), width);
  };
  // Row-wise work (norms, residual adds, SwiGLU, RoPE and KV stores, the
  // logits copy) is split over the threads too: at 16 decode rows, done on
  // one thread while the other waited, it was about a tenth of the step.
  auto for_each = [&](int64_t n, auto&& f) {
    auto body = [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) f(i);
    };
    if (ex_ && n > 1) ex_->parallel_for(n, body);
    else body(0, n);
  };
  auto for_rows = [&](auto&& f) { for_each(rows, f); };
  const float* factors = w_.rope_freq_factors.empty() ? nullptr : w_.rope_freq_factors.data();
  for_rows([&](int64_t r) {
    kernels::rms_norm(x_.data() + r * d, w_.layers[0].attn_norm.data(), xn_.data() + r * d, d, hp.rms_eps);
  });
  for (int l = 0; l < hp.n_layer; ++l) {
    const LlamaLayer& L = w_.layers[static_cast<size_t>(l)];
    {
      const WeightView* w[] = {&L.wq, &L.wk, &L.wv};
      float* y[] = {q_.data(), k_.data(), v_.data()};
      kernels::matmul_many(w, y, 3, xn_.data(), rows, ex_);
    }
    add_bias(q_.data(), L.bq, qd);
    add_bias(k_.data(), L.bk, kvd);
    add_bias(v_.data(), L.bv, kvd);
    // Each row stores its own position (at 16 decode rows: about 1 ms of a 12 ms step).
    for_rows([&](int64_t r) {
      const int pos = row_pos_[static_cast<size_t>(r)];
      kernels::rope(q_.data() + r * qd, hp.n_head, hp.head_dim, hp.n_rot, pos, hp.rope_freq_base, hp.rope_freq_scale,
                    hp.rope_neox, factors);
      kernels::rope(k_.data() + r * kvd, hp.n_head_kv, hp.head_dim, hp.n_rot, pos, hp.rope_freq_base,
                    hp.rope_freq_scale, hp.rope_neox, factors);
      seqs[row_seq_[static_cast<size_t>(r)]].kv->store(l, pos, k_.data() + r * kvd, v_.data() + r * kvd);
    });
    attention(rows, l, seqs);
    kernels::matmul(L.wo, att_out_.data(), tmp_.data(), rows, ex_);
    for_rows([&](int64_t r) {
      add_rows(x_.data() + r * d, tmp_.data() + r * d, d);
      kernels::rms_norm(x_.data() + r * d, L.ffn_norm.data(), xn_.data() + r * d, d, hp.rms_eps);
    });
    {
      const WeightView* w[] = {&L.w_gate, &L.w_up};
      float* y[] = {gate_.data(), up_.data()};
      kernels::matmul_many(w, y, 2, xn_.data(), rows, ex_);
    }
    const int64_t ff = hp.n_ff;
    for_rows([&](int64_t r) { kernels::swiglu(gate_.data() + r * ff, up_.data() + r * ff, gate_.data() + r * ff, ff); });
    kernels::matmul(L.w_down, gate_.data(), tmp_.data(), rows, ex_);
    // The residual, and the next layer's attention norm with it.
    const float* next_norm = l + 1 < hp.n_layer ? w_.layers[static_cast<size_t>(l) + 1].attn_norm.data() : nullptr;
    for_rows([&](int64_t r) {
      add_rows(x_.data() + r * d, tmp_.data() + r * d, d);
      if (next_norm) kernels::rms_norm(x_.data() + r * d, next_norm, xn_.data() + r * d, d, hp.rms_eps);
    });
  }
  if (n_logits == 0) return;
  // The last row of every sequence that wants logits, gathered, through one
  // matmul (row-invariant, so each row's logits are those it would get alone).
  int g = 0;
  for (int s = 0, r = 0; s < count; ++s) {
    const SeqInput& in = seqs[s];
    r += in.n;
    if (in.n <= 0 || !in.logits) continue;
    kernels::rms_norm(x_.data() + (r - 1) * d, w_.output_norm.data(), xn_.data() + g * d, d, hp.rms_eps);
    ++g;
  }
  kernels::matmul(w_.output, xn_.data(), logits_.data(), n_logits, ex_);
  std::vector<float*> dst;
  for (int s = 0; s < count; ++s)
    if (seqs[s].n > 0 && seqs[s].logits) dst.push_back(seqs[s].logits);
  // 16 rows of a 32000-word vocabulary are 2 MB: copied by both threads.
  const size_t nv = static_cast<size_t>(hp.n_vocab);
  for_each(n_logits, [&](int64_t k) {
    std::memcpy(dst[static_cast<size_t>(k)], logits_.data() + static_cast<size_t>(k) * nv, sizeof(float) * nv);
  });
}

}  // namespace atelier::text
