// The GGUF reader on real files: stories260K (checked against numbers the
// fixture README states and, tensor by tensor, against the llama2.c .bin of
// the same weights) and every llama.cpp vocabulary file.
#include "core/error.h"
#include "formats/formats_test_util.h"
#include "formats/gguf.h"
#include "formats/llama2c.h"
#include "resident_pages.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

using atelier::Error;
using atelier::formats::GgufFile;
using atelier::formats::GgufTensor;
using atelier::formats::GgufType;
using atelier::kernels::DType;
using atelier::test::fixture;

namespace {

std::unique_ptr<GgufFile> open_stories() { return GgufFile::open(fixture("text/stories260K.gguf")); }

TEST(GgufFixture, Stories260KHeaderAndMetadata) {
  auto f = open_stories();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->data_offset() % f->alignment(), 0u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  // The README's numbers: dim 64, hidden 172, 5 layers, 8 heads, 4 KV heads, vocab 512.
  EXPECT_EQ(f->get_int("llama.embedding_length"), 64);
  EXPECT_EQ(f->get_int("llama.feed_forward_length"), 172);
  EXPECT_EQ(f->get_int("llama.block_count"), 5);
  EXPECT_EQ(f->get_int("llama.attention.head_count"), 8);
  EXPECT_EQ(f->get_int("llama.attention.head_count_kv"), 4);
  EXPECT_NEAR(f->get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-9);
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "llama");
  auto tokens = f->get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 512u);
  EXPECT_EQ(f->get_float_array("tokenizer.ggml.scores").size(), 512u);
  EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type").size(), 512u);
  EXPECT_EQ(tokens[0], "<unk>");
  EXPECT_EQ(tokens[1], "<s>");
  EXPECT_EQ(tokens[2], "</s>");
  // Fallbacks and type errors.
  EXPECT_EQ(f->get_int("no.such.key", 7), 7);
  EXPECT_EQ(f->get_string("no.such.key", "x"), "x");
  EXPECT_DOUBLE_EQ(f->get_float("no.such.key", 2.5), 2.5);
  EXPECT_TRUE(f->get_bool("no.such.key", true));
  EXPECT_FALSE(f->has("no.such.key"));
  try {
    f->get_int("no.such.key");
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stories260K.gguf: metadata key no.such.key is missing"), std::string::npos)
        << e.what();
  }
  try {
    f->get_int("general.architecture");
    FAIL() << "expected Error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("general.architecture"), std::string::npos) << m;
    EXPECT_NE(m.find("integer"), std::string::npos) << m;
    EXPECT_NE(m.find("string"), std::string::npos) << m;
  }
  EXPECT_THROW(f->get_string_array("tokenizer.ggml.scores"), Error);
  EXPECT_THROW(f->get_int_array("tokenizer.ggml.scores"), Error);  // float array is not an integer array
  EXPECT_THROW(f->tensor("no.such.tensor"), Error);
  EXPECT_EQ(f->find_tensor("no.such.tensor"), nullptr);
}

// Once parsed, the header's pages leave this process (the metadata lives on
// in the parsed values), and a loader can drop those too; the tensors stay
// readable in place.
TEST(GgufFixture, HeaderPagesAndDroppedMetadataAreLetGo) {
  auto f = open_stories();
  const GgufTensor& t = f->tensors().front();
  const uint8_t* base = t.data - f->data_offset() - t.offset;  // the mapping's start
  ASSERT_GT(f->data_offset(), 4096u) << "the fixture's header should span more than a page";
  EXPECT_FALSE(atelier::test::page_mapped(base));
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "llama");  // parsed: no page needed
  volatile uint8_t first_byte = base[0];                      // the probe sees a page once it is read
  (void)first_byte;
  EXPECT_TRUE(atelier::test::page_mapped(base));
  f->drop_metadata();
  try {
    f->get_string("tokenizer.ggml.model");
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), atelier::StatusCode::Internal) << e.what();
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.model"), std::string::npos) << e.what();
  }
  const GgufTensor& again = f->tensor(t.name);  // tensors are not metadata
  EXPECT_EQ(again.data, t.data);
}

TEST(GgufFixture, Stories260KTensors) {
  auto f = open_stories();
  ASSERT_EQ(f->tensors().size(), 48u);
  for (const GgufTensor& t : f->tensors()) {
    EXPECT_EQ(t.type, DType::F32) << t.name;
    EXPECT_EQ(t.bytes, static_cast<uint64_t>(t.elements()) * 4) << t.name;
    EXPECT_EQ(t.offset % f->alignment(), 0u) << t.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 4, 0u) << t.name;
  }
  using Shape = std::vector<int64_t>;
  EXPECT_EQ(f->tensor("token_embd.weight").shape, (Shape{64, 512}));
  EXPECT_EQ(f->tensor("output_norm.weight").shape, (Shape{64}));
  for (int l = 0; l < 5; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    EXPECT_EQ(f->tensor(p + "attn_norm.weight").shape, (Shape{64}));
    EXPECT_EQ(f->tensor(p + "attn_q.weight").shape, (Shape{64, 64}));
    EXPECT_EQ(f->tensor(p + "attn_k.weight").shape, (Shape{64, 32}));
    EXPECT_EQ(f->tensor(p + "attn_v.weight").shape, (Shape{64, 32}));
    EXPECT_EQ(f->tensor(p + "attn_output.weight").shape, (Shape{64, 64}));
    EXPECT_EQ(f->tensor(p + "ffn_norm.weight").shape, (Shape{64}));
    EXPECT_EQ(f->tensor(p + "ffn_gate.weight").shape, (Shape{64, 172}));
    EXPECT_EQ(f->tensor(p + "ffn_up.weight").shape, (Shape{64, 172}));
    EXPECT_EQ(f->tensor(p + "ffn_down.weight").shape, (Shape{172, 64}));
  }
  // 47 named above; the 48th is the explicit output matrix.
  EXPECT_EQ(f->tensor("output.weight").shape, (Shape{64, 512}));
}

// Whether `a` (n floats) is bit-identical to `b`.
bool same_bits(const void* a, const void* b, size_t n_floats) { return std::memcmp(a, b, n_floats * 4) == 0; }

// llama.cpp's convert_hf_to_gguf.py permute() (Hugging Face rotate-half order
// -> GGML "normal" interleaved order) applied to a [rows x cols] matrix of
// n_head heads: out row (h, i, j) = in row (h, j, i) with dims (head, head_dim/2, 2) vs (head, 2, head_dim/2).
std::vector<float> hf_to_interleaved(const float* w, int rows, int cols, int n_head) {
  std::vector<float> out(static_cast<size_t>(rows) * cols);
  const int hd = rows / n_head, half = hd / 2;
  for (int h = 0; h < n_head; ++h)
    for (int i = 0; i < half; ++i)
      for (int j = 0; j < 2; ++j) {
        int dst = h * hd + i * 2 + j;  // (h, i, j) in reshape (n_head, half, 2)
        int src = h * hd + j * half + i;  // (h, j, i) in reshape (n_head, 2, half)
        std::memcpy(&out[static_cast<size_t>(dst) * cols], w + static_cast<size_t>(src) * cols, cols * 4);
      }
  return out;
}

TEST(GgufFixture, Stories260KMatchesLlama2cBinBitForBit) {
  auto g = open_stories();
  auto m = atelier::formats::load_llama2c(fixture("text/stories260K.bin"));
  const auto& c = m.config;
  ASSERT_EQ(c.dim, 64);
  ASSERT_EQ(c.hidden_dim, 172);
  ASSERT_EQ(c.n_layers, 5);
  ASSERT_EQ(c.n_heads, 8);
  ASSERT_EQ(c.n_kv_heads, 4);
  ASSERT_EQ(c.vocab_size, 512);
  EXPECT_TRUE(c.shared_classifier);
  const auto& w = m.weights;
  const size_t dim = 64, hidden = 172, kv_dim = 32, vocab = 512;

  auto expect_same = [&](const std::string& name, const float* bin, size_t n) {
    const GgufTensor& t = g->tensor(name);
    ASSERT_EQ(static_cast<size_t>(t.elements()), n) << name;
    EXPECT_TRUE(same_bits(t.data, bin, n)) << name << " differs from the .bin";
  };
  expect_same("token_embd.weight", w.token_embedding, vocab * dim);
  expect_same("output.weight", w.wcls, vocab * dim);  // the GGUF stores the tied matrix explicitly
  expect_same("output_norm.weight", w.rms_final, dim);
  for (size_t l = 0; l < 5; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    expect_same(p + "attn_norm.weight", w.rms_att + l * dim, dim);
    expect_same(p + "ffn_norm.weight", w.rms_ffn + l * dim, dim);
    // Q and K: the GGUF holds them exactly as the .bin does (no permutation):
    // both are in Meta's interleaved RoPE order, the GGML "normal" (non-NeoX)
    // ordering. If they ever differ, say whether it is the HF permutation.
    const float* wq = w.wq + l * dim * dim;
    const float* wk = w.wk + l * kv_dim * dim;
    expect_same(p + "attn_q.weight", wq, dim * dim);
    expect_same(p + "attn_k.weight", wk, kv_dim * dim);
    if (!same_bits(g->tensor(p + "attn_q.weight").data, wq, dim * dim)) {
      auto perm = hf_to_interleaved(wq, 64, 64, 8);
      ADD_FAILURE() << p << "attn_q equals permute(.bin wq): "
                    << same_bits(g->tensor(p + "attn_q.weight").data, perm.data(), dim * dim);
    }
    expect_same(p + "attn_v.weight", w.wv + l * kv_dim * dim, kv_dim * dim);
    expect_same(p + "attn_output.weight", w.wo + l * dim * dim, dim * dim);
    expect_same(p + "ffn_gate.weight", w.w1 + l * hidden * dim, hidden * dim);
    expect_same(p + "ffn_down.weight", w.w2 + l * dim * hidden, dim * hidden);
    expect_same(p + "ffn_up.weight", w.w3 + l * hidden * dim, hidden * dim);
  }
  // Not a vacuous comparison: the permutation is not the identity for these weights.
  auto perm = hf_to_interleaved(w.wq, 64, 64, 8);
  EXPECT_FALSE(same_bits(perm.data(), w.wq, dim * dim));
}

TEST(GgufFixture, EveryVocabFileHasTokenizerKeys) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(fixture("vocab"))) {
    if (entry.path().extension() != ".gguf") continue;
    ++files;
    SCOPED_TRACE(entry.path().string());
    auto f = GgufFile::open(entry.path().string());
    EXPECT_TRUE(f->version() == 2 || f->version() == 3);
    EXPECT_FALSE(f->get_string("general.architecture").empty());
    const std::string model = f->get_string("tokenizer.ggml.model");
    EXPECT_TRUE(model == "llama" || model == "gpt2" || model == "bert") << model;
    auto tokens = f->get_string_array("tokenizer.ggml.tokens");
    EXPECT_GT(tokens.size(), 1000u);
    if (f->has("tokenizer.ggml.token_type")) {
      EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type").size(), tokens.size());
    }
    if (f->has("tokenizer.ggml.scores")) {
      EXPECT_EQ(f->get_float_array("tokenizer.ggml.scores").size(), tokens.size());
    }
    if (model == "gpt2") {
      EXPECT_GT(f->get_string_array("tokenizer.ggml.merges").size(), 1000u);
      EXPECT_FALSE(f->get_string("tokenizer.ggml.pre").empty());
    }
    if (model == "llama") {
      EXPECT_EQ(f->get_float_array("tokenizer.ggml.scores").size(), tokens.size());
    }
    for (const char* id : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"}) {
      if (!f->has(id)) continue;
      int64_t v = f->get_int(id);
      EXPECT_GE(v, 0) << id;
      EXPECT_LT(v, static_cast<int64_t>(tokens.size())) << id;
    }
  }
  EXPECT_EQ(files, 10);  // every kind but llama-bpe, whose vocabulary is a tokenizer.json
}

}  // namespace
