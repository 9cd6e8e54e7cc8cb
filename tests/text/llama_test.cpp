// The LLaMA forward pass on the real stories260K model: GGUF and llama2.c
// give the same logits, a prompt processed in one batch gives bit-identical
// logits to one token at a time, and an F16 KV cache stays close to F32.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "text/llama.h"

using namespace atelier;

namespace {
const std::string kDir = std::string(ATELIER_FIXTURES_DIR) + "/text/";
const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376};

std::vector<float> last_logits(const text::LlamaWeights& w, const std::vector<int32_t>& toks, int chunk,
                               KvType kv = KvType::F32, int threads = 1) {
  ThreadPool pool(threads);
  text::KvCache cache(w.hp, static_cast<int>(toks.size()), kv);
  text::LlamaRunner runner(w, &pool);
  std::vector<float> logits(static_cast<size_t>(w.hp.n_vocab));
  for (size_t p = 0; p < toks.size(); p += static_cast<size_t>(chunk)) {
    const int n = static_cast<int>(std::min(toks.size() - p, static_cast<size_t>(chunk)));
    runner.forward(toks.data() + p, n, static_cast<int>(p), cache, logits.data());
  }
  return logits;
}

// stories260K.gguf rewritten with EXTRA applied to its writer (more metadata
// or tensors), at a temporary PATH the caller removes.
std::string rewrite_stories(const std::string& name, const std::function<void(formats::GgufWriter&)>& extra) {
  auto src = formats::GgufFile::open(kDir + "stories260K.gguf");
  formats::GgufWriter wr;
  for (const auto& [k, v] : src->metadata()) wr.set_value(k, v);
  for (const auto& t : src->tensors()) wr.add_tensor(t.name, t.shape, t.type, t.data, t.bytes);
  extra(wr);
  const auto path = (std::filesystem::temp_directory_path() / name).string();
  wr.write(path);
  return path;
}
}  // namespace

TEST(Llama, HyperparametersFromGguf) {
  auto w = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"));
  EXPECT_EQ(w.hp.n_embd, 64);
  EXPECT_EQ(w.hp.n_ff, 172);
  EXPECT_EQ(w.hp.n_layer, 5);
  EXPECT_EQ(w.hp.n_head, 8);
  EXPECT_EQ(w.hp.n_head_kv, 4);
  EXPECT_EQ(w.hp.n_vocab, 512);
  EXPECT_FALSE(w.hp.rope_neox);
}

TEST(Llama, GgufAndLlama2cGiveSameLogits) {
  auto g = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"));
  auto b = text::load_llama2c(kDir + "stories260K.bin");
  auto lg = last_logits(g, kPrompt, 64);
  auto lb = last_logits(b, kPrompt, 64);
  ASSERT_EQ(lg.size(), lb.size());
  for (size_t i = 0; i < lg.size(); ++i) ASSERT_NEAR(lg[i], lb[i], 1e-4f) << i;
}

TEST(Llama, BatchedPrefillIsBitIdenticalToTokenByToken) {
  auto w = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"));
  const auto one = last_logits(w, kPrompt, 1);
  for (int chunk : {2, 3, 10}) {
    for (int threads : {1, 2, 3}) {
      const auto batched = last_logits(w, kPrompt, chunk, KvType::F32, threads);
      ASSERT_EQ(one, batched) << "chunk " << chunk << ", threads " << threads;
    }
  }
}

TEST(Llama, F16KvCacheStaysClose) {
  auto w = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"));
  auto a = last_logits(w, kPrompt, 4, KvType::F32);
  auto b = last_logits(w, kPrompt, 4, KvType::F16);
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[i] - b[i])));
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(a[i])));
  }
  EXPECT_LT(max_diff, 0.01 * max_abs);
  EXPECT_GT(max_diff, 0.0);  // the cache really was stored in half precision
}

// The Q8_0 cache needs heads of whole 32-value blocks. stories260K's heads
// are 8 wide, so it is refused with a message saying what to use; the same
// weights read as 2 query heads and 1 KV head of 32 run with it, close to
// the F32 cache, and a prompt in one batch gives the logits of one token at
// a time, bit for bit (rows are quantized one by one, whatever the batch).
TEST(Llama, Q8_0KvCacheStaysCloseAndNeedsWholeBlocks) {
  auto w8 = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"));
  try {
    text::KvCache cache(w8.hp, 16, KvType::Q8_0);
    FAIL() << "a head size of 8 was accepted for q8_0";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("f16"), std::string::npos) << e.what();
  }
  const auto path = rewrite_stories("atelier_heads32.gguf", [](formats::GgufWriter& wr) {
    wr.set_u32("llama.attention.head_count", 2);
    wr.set_u32("llama.attention.head_count_kv", 1);
  });
  auto w = text::load_llama_gguf(formats::GgufFile::open(path));
  std::filesystem::remove(path);
  ASSERT_EQ(w.hp.head_dim, 32);
  const auto a = last_logits(w, kPrompt, 4, KvType::F32);
  const auto b = last_logits(w, kPrompt, 4, KvType::Q8_0);
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[i] - b[i])));
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(a[i])));
  }
  EXPECT_LT(max_diff, 0.05 * max_abs);
  EXPECT_GT(max_diff, 0.0);  // the cache really was quantized
  EXPECT_EQ(last_logits(w, kPrompt, 10, KvType::Q8_0, 3), last_logits(w, kPrompt, 1, KvType::Q8_0));
}

TEST(Llama, UnsupportedArchitectureIsNamed) {
  formats::GgufWriter wr;
  wr.set_string("general.architecture", "mamba");
  const auto path = (std::filesystem::temp_directory_path() / "atelier_mamba.gguf").string();
  wr.write(path);
  try {
    text::load_llama_gguf(formats::GgufFile::open(path));
    FAIL() << "expected an error";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("architecture 'mamba' is not supported"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

TEST(Llama, InconsistentShapesAreReported) {
  // A file whose metadata says 128-dim but whose embedding rows are 64 wide.
  auto src = formats::GgufFile::open(kDir + "stories260K.gguf");
  formats::GgufWriter wr;
  for (const auto& [k, v] : src->metadata()) wr.set_value(k, v);
  wr.set_u32("llama.embedding_length", 128);
  for (const auto& t : src->tensors()) wr.add_tensor(t.name, t.shape, t.type, t.data, t.bytes);
  const auto path = (std::filesystem::temp_directory_path() / "atelier_badshape.gguf").string();
  wr.write(path);
  try {
    text::load_llama_gguf(formats::GgufFile::open(path));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has shape"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

TEST(Llama, RopeFrequencyFactorsAreApplied) {
  // stories260K rewritten with a rope_freqs tensor (n_rot/2 = 4 divisors).
  auto write_with = [&](const std::vector<float>& factors, const std::string& name) {
    return rewrite_stories(name, [&](formats::GgufWriter& wr) {
      wr.add_tensor("rope_freqs.weight", {4}, kernels::DType::F32, factors.data(), factors.size() * sizeof(float));
    });
  };
  const auto base = last_logits(text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf")), kPrompt, 4);
  const auto ones_path = write_with({1, 1, 1, 1}, "atelier_rope_ones.gguf");
  const auto eights_path = write_with({1, 1, 8, 8}, "atelier_rope_eights.gguf");
  auto ones = text::load_llama_gguf(formats::GgufFile::open(ones_path));
  EXPECT_EQ(ones.rope_freq_factors.size(), 4u);
  EXPECT_EQ(last_logits(ones, kPrompt, 4), base);
  EXPECT_NE(last_logits(text::load_llama_gguf(formats::GgufFile::open(eights_path)), kPrompt, 4), base);
  std::filesystem::remove(ones_path);
  std::filesystem::remove(eights_path);
}

// Sliding-window attention from the GGUF metadata (Mistral): a sequence no
// longer than the window gives exactly the full-attention logits, a longer
// one does not (the kernel itself is checked against a plain reference and by
// hand in tests/kernels).
TEST(Llama, SlidingWindowFromTheMetadata) {
  const auto path = rewrite_stories("atelier_sliding_window.gguf",
                                    [](formats::GgufWriter& wr) { wr.set_u32("llama.attention.sliding_window", 4); });
  auto full = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"));
  auto windowed = text::load_llama_gguf(formats::GgufFile::open(path));
  std::filesystem::remove(path);
  EXPECT_EQ(full.hp.sliding_window, 0);
  ASSERT_EQ(windowed.hp.sliding_window, 4);
  const std::vector<int32_t> four(kPrompt.begin(), kPrompt.begin() + 4);
  EXPECT_EQ(last_logits(windowed, four, 1), last_logits(full, four, 1));
  const auto w10 = last_logits(windowed, kPrompt, 1);
  EXPECT_NE(w10, last_logits(full, kPrompt, 1));
  // Batched prefill over the window gives the same bits as token by token.
  EXPECT_EQ(last_logits(windowed, kPrompt, 10), w10);
}

// YaRN scaling from the metadata (rope.scaling.type "yarn", factor,
// original_context_length): it is read, and it changes the logits past the
// first position (position 0 has no angle to scale, but YaRN's attention
// factor scales every rotated pair, so there it differs too).
TEST(Llama, YarnScalingFromTheMetadata) {
  const auto path = rewrite_stories("atelier_yarn.gguf", [](formats::GgufWriter& wr) {
    wr.set_string("llama.rope.scaling.type", "yarn");
    wr.set_f32("llama.rope.scaling.factor", 4.0f);
    wr.set_u32("llama.rope.scaling.original_context_length", 512);
  });
  auto plain = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"));
  auto yarn = text::load_llama_gguf(formats::GgufFile::open(path));
  std::filesystem::remove(path);
  ASSERT_TRUE(yarn.hp.rope_yarn);
  EXPECT_EQ(yarn.hp.yarn.n_ctx_orig, 512);
  EXPECT_FLOAT_EQ(yarn.hp.rope_freq_scale, 0.25f);
  EXPECT_FALSE(plain.hp.rope_yarn);
  EXPECT_NE(last_logits(yarn, kPrompt, 1), last_logits(plain, kPrompt, 1));
  EXPECT_EQ(last_logits(yarn, kPrompt, 10), last_logits(yarn, kPrompt, 1));
}
