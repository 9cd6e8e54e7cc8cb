// The LLaMA-family decoder: weights from GGUF (llama.* metadata) or a
// llama2.c checkpoint, and a forward pass over a step of one or more sequences,
// each with its own KV cache (contiguous or paged, text/kv_cache.h).
// Embeddings, RMSNorm, RoPE (normal or NeoX pairing), grouped-query
// attention, SwiGLU feed-forward, tied or separate output matrix; qwen3's
// per-head Q/K RMSNorm; mixtures of experts (text/moe.h: Mixtral's llama
// with experts, qwen3moe, gpt-oss with its biases, sinks and alternating
// sliding windows).
#pragma once

#include <atelier/backend.h>
#include <atelier/kernels.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "text/kv_cache.h"
#include "text/moe.h"

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
  bool rope_yarn = false;        // YaRN context extension (rope.scaling.type "yarn"), with yarn's parameters
  kernels::RopeYarn yarn;
  int sliding_window = 0;        // > 0: each position attends only the last this many (Mistral's attention.sliding_window)
  bool has_qkv_bias = false;     // qwen2
  // ---- qwen3, gemma3, phi3, qwen3moe, gpt-oss (issue 36)
  bool has_qk_norm = false;      // qwen3, qwen3moe, gemma3: RMSNorm over each head of q and k before RoPE (attn_q_norm / attn_k_norm)
  float embd_scale = 0.0f;       // > 0: the looked-up embeddings times this (gemma3: sqrt(n_embd))
  bool has_post_norms = false;   // gemma3: RMSNorm of the attention's and the feed-forward's outputs before each residual
  bool ffn_gelu = false;         // gemma3: gelu_tanh(gate) * up instead of silu(gate) * up
  float attn_scale = 0.0f;       // > 0: the attention's score scale instead of 1/sqrt(head_dim)
  // > 0: layers alternate local (sliding_window) and global: layer l is
  // global when l % swa_pattern == swa_pattern - 1 (gemma3: every 6th). 0:
  // sliding_window, if any, applies to every layer (Mistral).
  int swa_pattern = 0;
  float rope_freq_base_swa = 0.0f;  // > 0: the local layers' RoPE base (with freq_scale 1), gemma3's 10000
  float final_logit_softcap = 0.0f;  // > 0: logits = tanh(logits / c) * c (where the file says so)
  int rope_ctx_orig = 0;          // phi3 LongRoPE: a context above it takes rope_factors_long
  // Mixture of experts: n_expert > 0 replaces every layer's feed-forward by
  // n_expert_used of n_expert experts of n_ff_exp (text/moe.h).
  int n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
  kernels::MoeGating moe_gating = kernels::MoeGating::softmax;
  bool moe_norm = false;         // weights renormalised over the chosen experts
  bool moe_swiglu_oai = false;   // gpt-oss's clamped SwiGLU (alpha 1.702, limit 7)
};

// True when layer l attends a sliding window (hp.sliding_window > 0 and the
// layer is not one of swa_pattern's global layers).
inline bool is_local_layer(const LlamaHparams& hp, int l) {
  return hp.sliding_window > 0 && (hp.swa_pattern <= 0 || l % hp.swa_pattern < hp.swa_pattern - 1);
}

struct LlamaLayer {
  kernels::WeightView wq, wk, wv, wo, w_gate, w_up, w_down;
  std::vector<float> attn_norm, ffn_norm;
  std::vector<float> bq, bk, bv;  // empty unless has_qkv_bias
  std::vector<float> q_norm, k_norm;  // head_dim each, when has_qk_norm
  std::vector<float> attn_post_norm, ffn_post_norm;  // n_embd each, when has_post_norms
  std::vector<float> bo, sinks;       // gpt-oss: attention output bias (n_embd), per-head sink logits (n_head)
  // Experts (n_expert > 0): the router (n_expert x n_embd) and each expert's
  // slice of the 3-D ffn_{gate,up,down}_exps tensors; biases n_expert x rows (gpt-oss).
  kernels::WeightView gate_inp;
  std::vector<kernels::WeightView> gate_exps, up_exps, down_exps;
  std::vector<float> gate_inp_b, gate_exps_b, up_exps_b, down_exps_b;
};

struct LlamaWeights {
  LlamaHparams hp;
  kernels::WeightView tok_embd;  // n_vocab rows of n_embd
  kernels::WeightView output;    // n_vocab rows of n_embd (== tok_embd when tied)
  std::vector<float> output_norm;
  std::vector<float> rope_freq_factors;  // n_rot/2 divisors (Llama 3.1+ rope_freqs.weight) or empty
  // phi3 LongRoPE: both sets of divisors (rope_factors_short/long.weight);
  // select_rope_factors puts one of them in rope_freq_factors.
  std::vector<float> rope_factors_short, rope_factors_long;
  std::vector<LlamaLayer> layers;
  std::string format;            // "gguf" or "llama2c"
  std::string weight_types;      // summary for ModelInfo
  int64_t n_params = 0;
  // Owners of the memory the views point into.
  std::shared_ptr<formats::GgufFile> gguf;
  std::shared_ptr<formats::MappedFile> map;
  std::vector<std::shared_ptr<std::vector<uint8_t>>> owned;  // matrices converted at load
  std::vector<std::shared_ptr<kernels::Buffer>> prepared;     // the matrices as the backend prepared them at load
};

// Throw atelier::Error (Unsupported architecture, missing tensors, shape mismatches).
// The matrices are prepared for `backend` (Backend::prepare_weights_at, in one buffer: packed
// for this CPU's fastest tile on the CPU backend); on a device that does not read host
// memory every parameter is copied to it (the embedding table too), so no op is handed
// a file mapping or a host vector.
LlamaWeights load_llama_gguf(std::shared_ptr<formats::GgufFile> file,
                             kernels::Backend& backend = kernels::default_cpu_backend());
// phi3's LongRoPE: the long factors for a context of more than
// hp.rope_ctx_orig tokens per sequence, else the short ones (llama.cpp's
// choice by its context size). Call before any runner is made; a model
// without them is left as it is.
void select_rope_factors(LlamaWeights& w, int n_ctx);
LlamaWeights load_llama2c(const std::string& path, kernels::Backend& backend = kernels::default_cpu_backend());

// One sequence's share of a forward_batch step.
struct SeqInput {
  const int32_t* tokens = nullptr;
  int n = 0;                // tokens of this sequence in this step (prefill chunk or 1 for decode)
  int pos0 = 0;             // position of tokens[0]
  KvSeq* kv = nullptr;
  float* logits = nullptr;  // non-null: receive the logits of this sequence's LAST token (n_vocab floats)
  // With logits: receive every token's logits instead (n x n_vocab floats,
  // row i for tokens[i]), for teacher-forced scoring (perplexity, KL).
  // Generation leaves it off: only the rows asked for go through the output matrix.
  bool all_logits = false;
  // A device apart from the host: this sequence's next token is sampled on
  // the device (kernels::Backend::sample) by these parameters, its
  // penalty_count (token, count) pairs at sample_pairs (host), into
  // *sampled; its logits are not downloaded (`logits` is then not written).
  // Not with all_logits. The host-memory backend samples there too.
  const kernels::SampleRow* sample = nullptr;
  const int32_t* sample_pairs = nullptr;
  int32_t* sampled = nullptr;
};

// The forward pass on a backend. Activations and the step's metadata
// (token ids, positions, KV slots, block tables) live in one workspace buffer
// of the backend, sized for the largest step seen and then reused; every
// arithmetic step is one row-batched backend op over all the step's rows.
// One per executor (or per running sequence).
class LlamaRunner {
 public:
  // On the CPU backend over `ex` (nullptr: the calling thread).
  LlamaRunner(const LlamaWeights& w, kernels::Executor* ex);
  // On `backend` (the weights prepared for it, the caches' storage on it).
  LlamaRunner(const LlamaWeights& w, kernels::Backend& backend);
  // Drops the backend's recorded steps (they point into this runner's buffers).
  ~LlamaRunner();
  LlamaRunner(const LlamaRunner&) = delete;
  LlamaRunner& operator=(const LlamaRunner&) = delete;
  // Runs n tokens at positions pos0..pos0+n-1 through the model, appending
  // to the cache. When logits is non-null, writes the last token's n_vocab logits.
  // The same as forward_batch with one sequence.
  void forward(const int32_t* tokens, int n, int pos0, KvSeq& cache, float* logits);
  // One step over several sequences: all their rows go through each op
  // together; attention of each row reads only its own sequence's cache.
  // Batch-invariant: a sequence's logits and cache contents are bit-identical
  // whatever else shares the step and however many threads run it.
  // Entries with n == 0 are skipped. Throws atelier::Error (nothing is
  // computed) for a token outside the vocabulary, a missing cache, one cache
  // named twice, or positions beyond a cache's capacity().
  void forward_batch(const std::vector<SeqInput>& seqs);
  void forward_batch(const SeqInput* seqs, int count);
  // Sizes the step's workspace and metadata once for steps of up to `rows`
  // rows (max_batch decodes plus the prefill budget) and `logits_rows`
  // logits rows, so that no step up to them allocates or moves an address
  // (a device runner calls it at load; the CPU grows them as steps come).
  void reserve(int rows, int logits_rows);
  // The device bytes reserve(rows, logits_rows) takes for a model of `hp`
  // with activations of `act` (the workspace and the step's metadata, with
  // its first 1024 block-table entries): a device runner's estimate of a
  // text model's working memory, counted before its KV pool is sized.
  static int64_t workspace_bytes(const LlamaHparams& hp, int rows, int logits_rows, kernels::DType act);

 private:
  void ensure_workspace(int rows, int n_logits);
  void ensure_meta(int n_storages, int64_t table_entries);
  void upload_vectors();
  // A buffer the ops point into moved: every recorded step is stale.
  void invalidate_steps();
  // The key of Backend::run_step for a step of this shape (step_ids_).
  uint64_t step_key(int rows, int logits_rows, int max_len, bool sampling);
  // The sampling section (Backend::sample's params, ids and penalty pairs)
  // for logits_rows rows and n_pairs pairs.
  void ensure_sampling(int logits_rows, int64_t n_pairs);

  const LlamaWeights& w_;
  std::unique_ptr<kernels::Backend> own_backend_;  // the CPU backend of the Executor constructor
  kernels::Backend& be_;
  // The weights' vectors (norms, biases, RoPE factors) in one buffer of the
  // backend, uploaded once, so every op reads device memory (the matrices
  // are the backend's own through prepare_weights).
  struct LayerVectors {
    const float *attn_norm = nullptr, *ffn_norm = nullptr, *bq = nullptr, *bk = nullptr, *bv = nullptr;
    const float *q_norm = nullptr, *k_norm = nullptr, *attn_post_norm = nullptr, *ffn_post_norm = nullptr;
    const float *bo = nullptr, *sinks = nullptr;
    MoeVectors moe;
  };
  std::unique_ptr<MoeFfn> moe_;  // the experts' workspace and step (n_expert > 0)
  std::unique_ptr<kernels::Buffer> vectors_;
  std::vector<LayerVectors> layer_vectors_;
  const float *output_norm_ = nullptr, *rope_factors_ = nullptr;
  // Activations: rows x (x, xn, tmp: n_embd; q, att: n_head*head_dim;
  // k, v: n_head_kv*head_dim; gate, up: n_ff); logits: n_logits x n_vocab.
  std::unique_ptr<kernels::Buffer> work_;
  int cap_ = 0, cap_logits_ = 0;
  // Activations are the backend's act_dtype(); logits are F32 (sampled on the host).
  kernels::Act x_, xn_, tmp_, q_, att_, k_, v_, gate_, up_, logits_;
  int64_t logits_offset_ = 0;  // bytes into work_
  // The step's int32 metadata, staged on the host and uploaded in one copy:
  // sections at offsets fixed by the capacities (rows and logits of the
  // workspace, KV storages, block-table entries), so the ops' metadata
  // addresses do not move from step to step until a capacity grows.
  struct MetaOffsets {
    int64_t ids = 0, pos = 0, table = 0, logit = 0, slots = 0, tables = 0;
  };
  std::unique_ptr<kernels::Buffer> meta_;
  MetaOffsets meta_at_;
  int meta_rows_ = 0, meta_logits_ = 0, cap_storages_ = 0;
  int64_t cap_tables_ = 0;
  std::vector<int32_t> meta_host_;
  bool host_memory_ = true;
  int max_len_bound_ = 0;  // a device's attention length bound: grows by powers of two
  std::vector<float> logits_host_;  // a device's logits, downloaded once per step
  // Backend::sample's arguments: cap_sample_rows_ SampleRows, as many int32
  // ids, then cap_pairs_ (token, count) pairs; staged on the host, one upload
  // before the step.
  std::unique_ptr<kernels::Buffer> samp_;
  int cap_sample_rows_ = 0;
  int64_t cap_pairs_ = 0;
  std::vector<uint8_t> samp_host_;
  std::vector<int32_t> ids_host_;
  std::vector<const KvSeq*> storages_;  // one sequence per distinct KV storage of the step
  // A device's steps run through Backend::run_step (a CUDA graph per key).
  // A key is graph_scope_ << 32 | a number per distinct step shape: the
  // values the ops' arguments take beyond this runner's fixed buffers (rows
  // and logits buckets, the attention bound, each KV storage's layout).
  // Numbers are never reused: when a buffer moves the map is emptied and
  // the next shapes get new numbers.
  uint64_t graph_scope_ = 0;
  std::map<std::vector<int64_t>, uint32_t> step_ids_;
  uint32_t next_step_id_ = 0;
};

}  // namespace atelier::text
