// quantize_model and compare_text_models on stories260K: the quality
// report's source perplexity against a plain computation here (one token at
// a time through the model, softmax in double), the written file read back
// with the GGUF reader (types, metadata, lineage, values), and KL that
// grows as bits go.
#include <gtest/gtest.h>

#include <atelier/store.h>
#include <atelier/tools.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "api/text_model_impl.h"
#include "cli/cli_util.h"
#include "formats/gguf.h"
#include "text/kv_cache.h"
#include "text/llama.h"

using namespace atelier;
namespace fs = std::filesystem;

namespace {

const std::string kGguf = std::string(ATELIER_FIXTURES_DIR) + "/text/stories260K.gguf";
const std::string kGolden = std::string(ATELIER_FIXTURES_DIR) + "/text/golden-once-upon-a-time-greedy.txt";

// exp(mean -log p(next token)) with each position's logits from decoding one
// token at a time (not the all-positions path the report uses).
double reference_perplexity(const std::string& path, const std::string& text, int* n_tokens) {
  auto m = text::load_text_model(path, {});
  EXPECT_TRUE(m.ok()) << m.status().message;
  text::LoadedTextModel& M = *m.value();
  const std::vector<int32_t> toks = M.tokenizer->encode(text, true, false);
  *n_tokens = static_cast<int>(toks.size());
  text::KvCache cache(M.weights.hp, static_cast<int>(toks.size()), KvType::F32);
  text::LlamaRunner runner(M.weights, M.pool.get());
  std::vector<float> logits(static_cast<size_t>(M.weights.hp.n_vocab));
  double nll = 0;
  for (size_t i = 0; i + 1 < toks.size(); ++i) {
    runner.forward(&toks[i], 1, static_cast<int>(i), cache, logits.data());
    double mx = logits[0];
    for (float v : logits) mx = std::max(mx, double(v));
    double sum = 0;
    for (float v : logits) sum += std::exp(double(v) - mx);
    nll -= double(logits[static_cast<size_t>(toks[i + 1])]) - mx - std::log(sum);
  }
  return std::exp(nll / double(toks.size() - 1));
}

}  // namespace

TEST(Quantize, SourcePerplexityMatchesAPlainComputation) {
  int n = 0;
  const double ppl = reference_perplexity(kGguf, atelier::test::slurp(kGolden), &n);
  auto q = compare_text_models(kGguf, kGguf, kGolden);
  ASSERT_TRUE(q.ok()) << q.status().message;
  EXPECT_EQ(q->tokens, n);
  EXPECT_EQ(q->positions, n - 1);
  EXPECT_NEAR(q->perplexity_reference, ppl, 1e-4 * ppl);
  EXPECT_DOUBLE_EQ(q->perplexity_candidate, q->perplexity_reference);
  EXPECT_EQ(q->mean_kl, 0.0);
  EXPECT_EQ(q->top1_agreement, 1.0);
  // The golden text is the model's own greedy continuation: it finds it easy.
  EXPECT_GT(ppl, 1.0);
  EXPECT_LT(ppl, 5.0);
}

TEST(Quantize, WritesAVersionTheReaderDecodesWithItsLineage) {
  atelier::test::ScratchDir dir("atelier_quantize_engine");
  const std::string store = (dir.dir / "store").string();
  {
    auto st = Store::open(store, true);
    ASSERT_TRUE(st.ok());
    ASSERT_TRUE(st.value()->import({{kGguf, "model"}}, "stories260k").ok());
  }
  QuantizeSpec spec;
  spec.type = "q8_0";
  spec.store_dir = store;
  auto r = quantize_model("stories260k", spec);
  ASSERT_TRUE(r.ok()) << r.status().message;
  EXPECT_EQ(r->model, "stories260k@2");
  EXPECT_EQ(r->source, "stories260k@1");
  EXPECT_EQ(r->source_digest, "sha256:270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d");
  ASSERT_TRUE(r->has_quality);
  EXPECT_LT(r->quality.mean_kl, 0.01);
  EXPECT_GT(r->quality.top1_agreement, 0.9);
  // F32 -> Q8_0: 34 bytes per 32 weights instead of 128 (ffn_down's 172-wide rows stay F16).
  EXPECT_LT(r->bytes_per_token, r->source_bytes_per_token * 0.4);

  auto st = Store::open(store, false);
  ASSERT_TRUE(st.ok());
  auto v = st.value()->resolve("stories260k@2");
  ASSERT_TRUE(v.ok());
  EXPECT_NE(v->notes.find("sha256:270cba1bd510"), std::string::npos) << v->notes;
  EXPECT_NE(v->notes.find("q8_0"), std::string::npos) << v->notes;
  EXPECT_NE(v->notes.find("atelier 0.1.0"), std::string::npos) << v->notes;
  EXPECT_EQ(v->label, "q8_0");

  auto q = formats::GgufFile::open(v->files.at(0).path);
  auto s = formats::GgufFile::open(kGguf);
  EXPECT_EQ(q->get_int("general.file_type"), 7);  // LLAMA_FTYPE_MOSTLY_Q8_0
  EXPECT_EQ(q->get_string("atelier.quantize.source_digest"), r->source_digest);
  EXPECT_EQ(q->get_string("tokenizer.ggml.model"), s->get_string("tokenizer.ggml.model"));
  EXPECT_EQ(q->get_string_array("tokenizer.ggml.tokens"), s->get_string_array("tokenizer.ggml.tokens"));
  EXPECT_EQ(q->tensors().size(), s->tensors().size());
  EXPECT_EQ(q->tensor("blk.0.attn_q.weight").type, kernels::DType::Q8_0);
  EXPECT_EQ(q->tensor("blk.0.ffn_down.weight").type, kernels::DType::F16);  // 172 columns: no 32-wide block fits
  EXPECT_EQ(q->tensor("blk.0.attn_norm.weight").type, kernels::DType::F32);
  // Every matrix decodes to the source within Q8_0's step (amax / 127 per block, half of it by rounding, plus fp16).
  for (const auto& t : s->tensors()) {
    const auto& o = q->tensor(t.name);
    ASSERT_EQ(o.shape, t.shape);
    std::vector<float> a(static_cast<size_t>(t.elements())), b(a.size());
    kernels::dequantize_row(t.type, t.data, a.data(), t.elements());
    kernels::dequantize_row(o.type, o.data, b.data(), t.elements());
    const int64_t blk = o.type == kernels::DType::Q8_0 ? 32 : 1;
    for (int64_t i = 0; i < t.elements(); i += blk) {
      float amax = 0;
      for (int64_t j = i; j < i + blk; ++j) amax = std::max(amax, std::fabs(a[j]));
      for (int64_t j = i; j < i + blk; ++j)
        ASSERT_LE(std::fabs(a[j] - b[j]), amax / 127 * 0.51f + 1e-3f * amax + 1e-7f) << t.name << " [" << j << "]";
    }
  }

  // Fewer bits, more divergence: Q4_0 against the same source.
  spec.type = "q4_0";
  auto r4 = quantize_model("stories260k@1", spec);
  ASSERT_TRUE(r4.ok()) << r4.status().message;
  EXPECT_EQ(r4->model, "stories260k@3");
  EXPECT_GT(r4->quality.mean_kl, r->quality.mean_kl * 3);
  EXPECT_LT(r4->quality.top1_agreement, 1.0);
}

TEST(Quantize, RefusesBadInput) {
  atelier::test::ScratchDir dir("atelier_quantize_bad");
  const std::string store = (dir.dir / "store").string();
  QuantizeSpec spec;
  spec.store_dir = store;
  spec.type = "q4_0";
  // A file outside the store needs --name.
  auto noname = quantize_model(kGguf, spec);
  ASSERT_FALSE(noname.ok());
  EXPECT_NE(noname.status().message.find("--name"), std::string::npos) << noname.status().message;
  spec.type = "q7_0";
  spec.name = "x";
  auto unknown = quantize_model(kGguf, spec);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code, StatusCode::InvalidArgument);
  EXPECT_NE(unknown.status().message.find("q4_K"), std::string::npos) << unknown.status().message;
  spec.type = "q8_0";
  spec.recipe = "mixed";
  EXPECT_EQ(quantize_model(kGguf, spec).status().code, StatusCode::InvalidArgument);  // both
}

// A mixture of experts (issue 36): the 3-D expert tensors are quantized row
// by row (so expert by expert), the router stays F32, the per-token bytes
// count expert_used_count of expert_count experts, and the version loads
// and runs close to its source.
TEST(Quantize, MixtureOfExpertsKeepsTheRouterAndCountsTheUsedExperts) {
  atelier::test::ScratchDir dir("atelier_quantize_moe");
  const std::string store = (dir.dir / "store").string(), src = (dir.dir / "qwen3moe.gguf").string();
  SynthTextSpec s;
  s.arch = "qwen3moe";
  s.params = "tiny";
  s.type = "f32";
  ASSERT_TRUE(synth_text_model(s, src).ok());
  QuantizeSpec spec;
  spec.type = "q8_0";
  spec.store_dir = store;
  spec.name = "moe";
  spec.max_tokens = 64;
  auto r = quantize_model(src, spec);
  ASSERT_TRUE(r.ok()) << r.status().message;
  auto st = Store::open(store, false);
  auto v = st.value()->resolve("moe@1");
  ASSERT_TRUE(v.ok());
  auto q = formats::GgufFile::open(v->files[0].path);
  auto f = formats::GgufFile::open(src);
  const auto& router = q->tensor("blk.0.ffn_gate_inp.weight");
  EXPECT_EQ(router.type, kernels::DType::F32);
  const auto& exps = q->tensor("blk.1.ffn_down_exps.weight");
  EXPECT_EQ(exps.type, kernels::DType::Q8_0);
  ASSERT_EQ(exps.shape, (std::vector<int64_t>{32, 64, 8}));
  // Expert 5's first row decodes to its source row (Q8_0's error bound).
  const auto& orig = f->tensor("blk.1.ffn_down_exps.weight");
  std::vector<float> a(32), b(32);
  kernels::dequantize_row(orig.type, orig.data + (5 * 64) * 32 * 4, a.data(), 32);
  kernels::dequantize_row(exps.type, exps.data + (5 * 64) * 34, b.data(), 32);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(a[i], b[i], 0.01) << i;
  // Per token: 2 of the 8 experts' bytes (the F32 source: 3 x 2 x 64 x 32 x 4 bytes of experts per layer).
  int64_t all_experts = 0;
  for (const auto& t : f->tensors())
    if (t.shape.size() == 3) all_experts += static_cast<int64_t>(t.bytes);
  EXPECT_EQ(all_experts, 3 * 3 * 8 * 64 * 32 * 4);
  int64_t dense = 0;
  for (const auto& t : f->tensors())
    if (t.shape.size() == 2 && t.name != "token_embd.weight") dense += static_cast<int64_t>(t.bytes);  // one row of it per token
  EXPECT_EQ(r->source_bytes_per_token, dense + all_experts / 4);
  ASSERT_TRUE(r->has_quality);
  EXPECT_LT(r->quality.mean_kl, 0.01);
}
