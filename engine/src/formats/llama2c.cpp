// llama2.c checkpoints and tokenizers, read as Karpathy's run.c reads them.
//
// Checkpoint (the "legacy" export, version 0): 7 int32
//   dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
// (vocab_size < 0: the file carries a separate classifier, wcls), then float32:
//   token_embedding[vocab][dim]  rms_att[L][dim]  wq[L][dim][dim]
//   wk[L][kv_dim][dim]  wv[L][kv_dim][dim]  wo[L][dim][dim]  rms_ffn[L][dim]
//   w1[L][hidden][dim]  w2[L][dim][hidden]  w3[L][hidden][dim]  rms_final[dim]
//   freq_cis_real[seq_len][head/2]  freq_cis_imag[seq_len][head/2]  (skipped)
//   wcls[vocab][dim]  (only when not shared)
// The header is validated and the file size compared with what it implies
// before any pointer is formed.
//
// Tokenizer: int32 max_token_length, then per token: float score, int32 len,
// len bytes.
#include "formats/llama2c.h"

#include "core/error.h"
#include "formats/mapped_file.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace atelier::formats {

namespace {

// Sanity limits: far above any llama2.c model (the largest, Llama 2 70B
// exported, has dim 8192, hidden 28672, 80 layers, vocab 32000, seq 4096).
constexpr int kMaxDim = 1 << 16;
constexpr int kMaxHidden = 1 << 20;
constexpr int kMaxLayers = 1 << 10;
constexpr int kMaxVocab = 1 << 22;
constexpr int kMaxSeqLen = 1 << 22;
constexpr int32_t kExportMagic = 0x616b3432;  // "ak42": llama2.c export versions 1 and 2

void check_range(const std::string& path, const char* name, int v, int max) {
  if (v <= 0 || v > max)
    throw Error(path + ": not a valid llama2.c checkpoint: header field " + name + " = " + std::to_string(v) +
                " (expected 1 to " + std::to_string(max) + ")");
}

}  // namespace

uint64_t llama2c_checkpoint_bytes(const int32_t h[7]) {
  auto in = [](int32_t v, int32_t max) { return v > 0 && v <= max; };
  if (h[5] == std::numeric_limits<int32_t>::min()) return 0;
  const int32_t vocab_i = h[5] < 0 ? -h[5] : h[5];
  if (!in(h[0], kMaxDim) || !in(h[1], kMaxHidden) || !in(h[2], kMaxLayers) || !in(h[3], h[0]) || !in(h[4], h[3]) ||
      !in(vocab_i, kMaxVocab) || !in(h[6], kMaxSeqLen))
    return 0;
  if (h[0] % h[3] != 0 || h[3] % h[4] != 0 || (h[0] / h[3]) % 2 != 0) return 0;
  const uint64_t dim = static_cast<uint64_t>(h[0]), hidden = static_cast<uint64_t>(h[1]);
  const uint64_t L = static_cast<uint64_t>(h[2]), vocab = static_cast<uint64_t>(vocab_i);
  const uint64_t head = dim / static_cast<uint64_t>(h[3]);
  const uint64_t kv_dim = head * static_cast<uint64_t>(h[4]), q_dim = head * static_cast<uint64_t>(h[3]);
  const uint64_t floats = vocab * dim + 2 * L * dim + 2 * L * q_dim * dim + 2 * L * kv_dim * dim + 3 * L * hidden * dim +
                          dim + static_cast<uint64_t>(h[6]) * head + (h[5] > 0 ? 0 : vocab * dim);
  return 7 * sizeof(int32_t) + floats * sizeof(float);
}

Llama2cModel load_llama2c(const std::string& path) {
  Llama2cModel m;
  m.map = std::make_shared<MappedFile>(path);
  const uint8_t* base = m.map->data();
  const uint64_t size = m.map->size();
  constexpr uint64_t kHeader = 7 * sizeof(int32_t);
  if (size < kHeader)
    throw Error(path + ": truncated: a llama2.c checkpoint starts with a 28-byte header but the file has " +
                std::to_string(size) + " bytes");
  int32_t h[7];
  std::memcpy(h, base, sizeof h);
  if (h[0] == kExportMagic)
    throw Error(path + ": this is a llama2.c version 1/2 export (magic \"ak42\"); only the legacy (version 0) "
                "format that run.c reads is supported — export it again with `export.py --version 0`");
  if (std::memcmp(base, "GGUF", 4) == 0)
    throw Error(path + ": this is a GGUF file, not a llama2.c checkpoint");

  Llama2cConfig& c = m.config;
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.shared_classifier = h[5] > 0;
  if (h[5] == std::numeric_limits<int32_t>::min())
    throw Error(path + ": not a valid llama2.c checkpoint: header field vocab_size = " + std::to_string(h[5]));
  c.vocab_size = h[5] < 0 ? -h[5] : h[5];
  c.seq_len = h[6];

  check_range(path, "dim", c.dim, kMaxDim);
  check_range(path, "hidden_dim", c.hidden_dim, kMaxHidden);
  check_range(path, "n_layers", c.n_layers, kMaxLayers);
  check_range(path, "n_heads", c.n_heads, c.dim);
  check_range(path, "n_kv_heads", c.n_kv_heads, c.n_heads);
  check_range(path, "vocab_size", c.vocab_size, kMaxVocab);
  check_range(path, "seq_len", c.seq_len, kMaxSeqLen);
  if (c.dim % c.n_heads != 0)
    throw Error(path + ": not a valid llama2.c checkpoint: dim " + std::to_string(c.dim) +
                " is not divisible by n_heads " + std::to_string(c.n_heads));
  if (c.n_heads % c.n_kv_heads != 0)
    throw Error(path + ": not a valid llama2.c checkpoint: n_heads " + std::to_string(c.n_heads) +
                " is not a multiple of n_kv_heads " + std::to_string(c.n_kv_heads));
  const uint64_t head = static_cast<uint64_t>(c.dim / c.n_heads);
  if (head % 2 != 0)
    throw Error(path + ": not a valid llama2.c checkpoint: head size " + std::to_string(head) +
                " is odd; rotary embeddings need an even head size");

  // Counts in floats; every product fits in 64 bits given the limits above.
  const uint64_t dim = static_cast<uint64_t>(c.dim);
  const uint64_t hidden = static_cast<uint64_t>(c.hidden_dim);
  const uint64_t L = static_cast<uint64_t>(c.n_layers);
  const uint64_t vocab = static_cast<uint64_t>(c.vocab_size);
  const uint64_t kv_dim = head * static_cast<uint64_t>(c.n_kv_heads);
  const uint64_t q_dim = head * static_cast<uint64_t>(c.n_heads);

  struct Part {
    const float** dst;
    uint64_t floats;
  };
  Llama2cWeights& w = m.weights;
  const float* skip_freq = nullptr;
  const Part parts[] = {
      {&w.token_embedding, vocab * dim},
      {&w.rms_att, L * dim},
      {&w.wq, L * q_dim * dim},
      {&w.wk, L * kv_dim * dim},
      {&w.wv, L * kv_dim * dim},
      {&w.wo, L * dim * q_dim},
      {&w.rms_ffn, L * dim},
      {&w.w1, L * hidden * dim},
      {&w.w2, L * dim * hidden},
      {&w.w3, L * hidden * dim},
      {&w.rms_final, dim},
      {&skip_freq, static_cast<uint64_t>(c.seq_len) * head},  // freq_cis_real + freq_cis_imag
      {&w.wcls, c.shared_classifier ? 0 : vocab * dim},
  };
  uint64_t total = 0;
  for (const Part& p : parts) total += p.floats;
  const uint64_t expected = kHeader + total * sizeof(float);
  if (size < expected)
    throw Error(path + ": truncated: the header (dim " + std::to_string(c.dim) + ", " + std::to_string(c.n_layers) +
                " layers, vocab " + std::to_string(c.vocab_size) + ") implies " + std::to_string(expected) +
                " bytes but the file has " + std::to_string(size) +
                " — the download is incomplete; fetch it again");
  if (size > expected)
    throw Error(path + ": not a valid llama2.c checkpoint: the header implies " + std::to_string(expected) +
                " bytes but the file has " + std::to_string(size) + " (" + std::to_string(size - expected) +
                " extra); the header or the file is corrupt");

  // The mapping is page-aligned and the header is 28 bytes, so every float is 4-byte aligned.
  const float* p = reinterpret_cast<const float*>(base + kHeader);
  for (const Part& part : parts) {
    *part.dst = p;
    p += part.floats;
  }
  if (c.shared_classifier) w.wcls = w.token_embedding;
  return m;
}

Llama2cVocab load_llama2c_tokenizer(const std::string& path, int vocab_size) {
  if (vocab_size < 0 || vocab_size > kMaxVocab)
    throw Error(path + ": cannot read a llama2.c tokenizer for a vocabulary of " + std::to_string(vocab_size) +
                " tokens");
  MappedFile map(path);
  const uint8_t* base = map.data();
  const uint64_t size = map.size();
  uint64_t pos = 0;
  auto truncated = [&](const std::string& what, uint64_t need) {
    throw Error(path + ": truncated: " + what + " needs " + std::to_string(need) + " bytes at offset " +
                std::to_string(pos) + " but the file ends at " + std::to_string(size) +
                " — the tokenizer file is incomplete or not the one for this model");
  };
  auto read_i32 = [&](const std::string& what) {
    if (size - pos < 4) truncated(what, 4);
    int32_t v;
    std::memcpy(&v, base + pos, 4);
    pos += 4;
    return v;
  };

  Llama2cVocab v;
  v.max_token_length = read_i32("max_token_length");
  if (v.max_token_length <= 0 || v.max_token_length > (1 << 16))
    throw Error(path + ": not a llama2.c tokenizer: max_token_length = " + std::to_string(v.max_token_length));
  // Each token takes at least 8 bytes (score + length).
  const bool to_end = vocab_size == 0;  // read every token the file holds
  if (to_end && (size - pos) / 8 > static_cast<uint64_t>(kMaxVocab))
    throw Error(path + ": not a llama2.c tokenizer: it would hold more than " + std::to_string(kMaxVocab) + " tokens");
  if (static_cast<uint64_t>(vocab_size) > (size - pos) / 8)
    throw Error(path + ": truncated: the model has " + std::to_string(vocab_size) +
                " tokens but this tokenizer file has room for at most " + std::to_string((size - pos) / 8) +
                " — is it the tokenizer of this model?");
  v.pieces.reserve(static_cast<size_t>(vocab_size));
  v.scores.reserve(static_cast<size_t>(vocab_size));
  for (int i = 0; to_end ? pos < size : i < vocab_size; ++i) {
    const std::string tok = "token " + std::to_string(i);
    if (size - pos < 4) truncated(tok + " score", 4);
    float score;
    std::memcpy(&score, base + pos, 4);
    pos += 4;
    if (std::isnan(score)) throw Error(path + ": corrupt: " + tok + " has a NaN score");
    int32_t len = read_i32(tok + " length");
    if (len < 0 || len > v.max_token_length)
      throw Error(path + ": corrupt: " + tok + " has length " + std::to_string(len) + " (max_token_length is " +
                  std::to_string(v.max_token_length) + ")");
    if (size - pos < static_cast<uint64_t>(len)) truncated(tok + " bytes", static_cast<uint64_t>(len));
    v.pieces.emplace_back(reinterpret_cast<const char*>(base + pos), static_cast<size_t>(len));
    v.scores.push_back(score);
    pos += static_cast<uint64_t>(len);
  }
  if (pos != size)
    throw Error(path + ": the tokenizer file has " + std::to_string(size - pos) + " bytes after token " +
                std::to_string(vocab_size - 1) + "; it holds more tokens than the model's vocabulary of " +
                std::to_string(vocab_size) + " — is it the tokenizer of this model?");
  return v;
}

}  // namespace atelier::formats
