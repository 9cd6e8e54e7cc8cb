// llama2.c checkpoints (Karpathy's `.bin`: 7 int32 header fields, then float32
// tensors) and their tokenizer files (`tokenizer.bin`/`tok512.bin`).
// Bounds-checked like every model reader: sizes are checked against the
// header before any tensor pointer is formed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace atelier::formats {

class MappedFile;

struct Llama2cConfig {
  int dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0;
  int vocab_size = 0, seq_len = 0;
  bool shared_classifier = true;  // header vocab_size > 0 means shared (tied) output weights
};

// Pointers into the mapping, laid out as llama2.c's run.c reads them.
// Per-layer tensors are stacked: e.g. wq holds n_layers matrices of dim x dim.
struct Llama2cWeights {
  const float* token_embedding = nullptr;  // vocab x dim
  const float* rms_att = nullptr;          // layers x dim
  const float* wq = nullptr;               // layers x (n_heads*head) x dim
  const float* wk = nullptr;               // layers x (n_kv_heads*head) x dim
  const float* wv = nullptr;
  const float* wo = nullptr;               // layers x dim x (n_heads*head)
  const float* rms_ffn = nullptr;          // layers x dim
  const float* w1 = nullptr;               // layers x hidden x dim (gate)
  const float* w2 = nullptr;               // layers x dim x hidden (down)
  const float* w3 = nullptr;               // layers x hidden x dim (up)
  const float* rms_final = nullptr;        // dim
  const float* wcls = nullptr;             // vocab x dim (== token_embedding when shared)
};

struct Llama2cModel {
  Llama2cConfig config;
  Llama2cWeights weights;
  std::shared_ptr<MappedFile> map;  // keeps the pointers valid
};

// Throws atelier::Error naming the file on any problem.
Llama2cModel load_llama2c(const std::string& path);

// The size in bytes of a legacy llama2.c checkpoint with this 7-int32 header
// (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len), or 0
// when the header is not a plausible one (the range and divisibility checks
// load_llama2c makes). llama2.c files have no magic number: a header whose
// implied size is exactly the file's is how the sniffer (sniff.h) knows one.
uint64_t llama2c_checkpoint_bytes(const int32_t header[7]);

// llama2.c tokenizer: pieces with spaces as ' ' (not U+2581) and a score each.
struct Llama2cVocab {
  int max_token_length = 0;
  std::vector<std::string> pieces;
  std::vector<float> scores;
};
// vocab_size: the model's; the file must hold exactly that many tokens (0: as many as it holds).
Llama2cVocab load_llama2c_tokenizer(const std::string& path, int vocab_size);

}  // namespace atelier::formats
