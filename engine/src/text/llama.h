// The LLaMA-family decoder: weights from GGUF (llama.* metadata) or a
// llama2.c checkpoint, a KV cache, and a forward pass over a chunk of tokens.
// Embeddings, RMSNorm, RoPE (normal or NeoX pairing), grouped-query
// attention, SwiGLU feed-forward, tied or separate output matrix.
#pragma once

#include <atelier/kernels.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace atelier::formats {
class GgufFile;
class MappedFile;
}  // namespace atelier::formats
namespace atelier::tok {
class Tokenizer;
}

namespace atelier::text {

struct LlamaHparams {
  std::string architecture = "llama";
  std::string name;
  int n_vocab = 0, n_ctx_train = 0, n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, n_ff = 0;
  int head_dim = 0, n_rot = 0;
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // 1 / linear scaling factor
  bool rope_neox = false;
  bool has_qkv_bias = false;     // qwen2
};

struct LlamaLayer {
  kernels::WeightView wq, wk, wv, wo, w_gate, w_up, w_down;
  std::vector<float> attn_norm, ffn_norm;
  std::vector<float> bq, bk, bv;  // empty unless has_qkv_bias
};

struct LlamaWeights {
  LlamaHparams hp;
  kernels::WeightView tok_embd;  // n_vocab rows of n_embd
  kernels::WeightView output;    // n_vocab rows of n_embd (== tok_embd when tied)
  std::vector<float> output_norm;
  std::vector<float> rope_freq_factors;  // n_rot/2 divisors (Llama 3.1+ rope_freqs.weight) or empty
  std::vector<LlamaLayer> layers;
  std::string format;            // "gguf" or "llama2c"
  std::string weight_types;      // summary for ModelInfo
  int64_t n_params = 0;
  int64_t matrix_bytes = 0;      // bytes read per generated token
  // Owners of the memory the views point into.
  std::shared_ptr<formats::GgufFile> gguf;
  std::shared_ptr<formats::MappedFile> map;
  std::vector<std::shared_ptr<std::vector<uint8_t>>> owned;  // matrices converted at load
};

// Throw atelier::Error (Unsupported architecture, missing tensors, shape mismatches).
LlamaWeights load_llama_gguf(std::shared_ptr<formats::GgufFile> file);
LlamaWeights load_llama2c(const std::string& path);

// Per-sequence key/value cache: for each layer, n_ctx rows of n_head_kv*head_dim.
class KvCache {
 public:
  KvCache(const LlamaHparams& hp, int n_ctx, bool f16);
  int n_ctx() const { return n_ctx_; }
  bool f16() const { return f16_; }
  void store(int layer, int pos, const float* k, const float* v);
  // Row pointers (float* when !f16, uint16_t* when f16).
  const void* k_row(int layer, int pos) const;
  const void* v_row(int layer, int pos) const;

 private:
  int n_ctx_, row_, n_layer_;
  bool f16_;
  std::vector<float> k32_, v32_;
  std::vector<uint16_t> k16_, v16_;
};

// Scratch buffers and the forward pass. One per running sequence.
class LlamaRunner {
 public:
  LlamaRunner(const LlamaWeights& w, kernels::Executor* ex);
  // Runs n tokens at positions pos0..pos0+n-1 through the model, appending
  // to the cache. When logits is non-null, writes the last token's n_vocab logits.
  void forward(const int32_t* tokens, int n, int pos0, KvCache& cache, float* logits);

 private:
  void ensure_scratch(int n);
  void attention(int n, int pos0, int layer, const KvCache& cache);

  const LlamaWeights& w_;
  kernels::Executor* ex_;
  int cap_ = 0;
  std::vector<float> x_, xn_, q_, k_, v_, att_out_, tmp_, gate_, up_;
};

}  // namespace atelier::text
