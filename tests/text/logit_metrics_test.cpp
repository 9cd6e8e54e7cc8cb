// The quality report's metric math against hand-computed values (checked
// with Python's math module), and the forward pass's all-positions logits
// against one-token-at-a-time decoding.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "text/llama.h"
#include "text/logit_metrics.h"

using namespace atelier;

TEST(LogitMetrics, LogProbAndKlMatchHandValues) {
  // softmax([0, ln 3]) = [1/4, 3/4]; softmax([5, 5]) = [1/2, 1/2].
  const float p[] = {0.0f, std::log(3.0f)};
  const float q[] = {5.0f, 5.0f};
  EXPECT_NEAR(text::log_prob(p, 2, 0), std::log(0.25), 1e-7);
  EXPECT_NEAR(text::log_prob(p, 2, 1), std::log(0.75), 1e-7);
  // KL = 1/4 ln(1/2) + 3/4 ln(3/2).
  EXPECT_NEAR(text::kl_divergence(p, q, 2), 0.13081203594113697, 1e-7);
  // [1,2,3] against [3,2,1]: equal log-sum-exp, so KL = 2 (p3 - p1).
  const float a[] = {1, 2, 3}, b[] = {3, 2, 1};
  EXPECT_NEAR(text::kl_divergence(a, b, 3), 1.1504207652088825, 1e-7);
  EXPECT_NEAR(text::log_prob(a, 3, 0), -2.40760596444438, 1e-7);
  EXPECT_EQ(text::kl_divergence(a, a, 3), 0.0);
  EXPECT_EQ(text::argmax(a, 3), 2);
  EXPECT_EQ(text::argmax(b, 3), 0);
}

TEST(LogitMetrics, LargeLogitsDoNotOverflow) {
  const float p[] = {1000.0f, 1000.0f + std::log(3.0f)};
  const float q[] = {-1000.0f, -1000.0f};
  EXPECT_NEAR(text::log_prob(p, 2, 1), std::log(0.75), 1e-5);
  EXPECT_NEAR(text::kl_divergence(p, q, 2), 0.13081203594113697, 1e-5);
}

TEST(LogitMetrics, PerplexityMeanKlAndAgreement) {
  // Two positions: the next tokens have p = 1/4 and 3/4 under the reference,
  // so its perplexity is exp(-(ln 1/4 + ln 3/4) / 2) = sqrt(16/3).
  const float p[] = {0.0f, std::log(3.0f)};
  const float q[] = {5.0f, 5.0f};
  text::LogitComparison c;
  c.add(p, q, 2, 0);
  c.add(p, p, 2, 1);
  EXPECT_EQ(c.positions, 2);
  EXPECT_NEAR(c.perplexity_reference(), 2.309401076758503, 1e-7);
  // The candidate: p = 1/2, then 3/4: exp(-(ln 1/2 + ln 3/4) / 2) = sqrt(8/3).
  EXPECT_NEAR(c.perplexity_candidate(), std::sqrt(8.0 / 3.0), 1e-7);
  EXPECT_NEAR(c.mean_kl(), 0.13081203594113697 / 2, 1e-7);
  EXPECT_NEAR(c.kl_max, 0.13081203594113697, 1e-7);
  // argmax of q ([5, 5]) is 0, of p is 1: one of two positions agrees.
  EXPECT_DOUBLE_EQ(c.top1_agreement(), 0.5);
  EXPECT_EQ(text::LogitComparison{}.perplexity_reference(), 0.0);
}

TEST(LogitMetrics, AllPositionsLogitsMatchDecodingOneTokenAtATime) {
  auto w = text::load_llama_gguf(formats::GgufFile::open(std::string(ATELIER_FIXTURES_DIR) + "/text/stories260K.gguf"));
  const std::vector<int32_t> toks = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 300, 12, 99, 7, 450, 301, 2, 77};
  const int n = static_cast<int>(toks.size());
  const int64_t nv = w.hp.n_vocab;
  ThreadPool pool(2);
  // All rows in two steps (a chunk of 11, then 7), through all_logits.
  std::vector<float> all(static_cast<size_t>(n * nv), NAN);
  {
    text::KvCache cache(w.hp, n, KvType::F32);
    text::LlamaRunner runner(w, &pool);
    for (int p = 0; p < n; p += 11) {
      text::SeqInput s;
      s.tokens = toks.data() + p;
      s.n = std::min(11, n - p);
      s.pos0 = p;
      s.kv = &cache;
      s.logits = all.data() + p * nv;
      s.all_logits = true;
      runner.forward_batch(&s, 1);
    }
  }
  text::KvCache cache(w.hp, n, KvType::F32);
  text::LlamaRunner runner(w, &pool);
  std::vector<float> one(static_cast<size_t>(nv));
  for (int i = 0; i < n; ++i) {
    runner.forward(toks.data() + i, 1, i, cache, one.data());
    for (int64_t v = 0; v < nv; ++v)
      ASSERT_NEAR(all[static_cast<size_t>(i * nv + v)], one[static_cast<size_t>(v)], 1e-4f * (1 + std::fabs(one[v])))
          << "position " << i << " token " << v;
  }
}
