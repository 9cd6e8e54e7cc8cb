// The diffusion pipeline around a stand-in model whose network is a simple
// row-wise formula: batching, guidance, img2img, inpainting and prompt
// padding, independent of any real checkpoint.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "image/sd_pipeline.h"
#include "image/stand_in_model.h"

namespace atelier::image {
namespace {

using FakeModel = test::StandInModel;

std::shared_ptr<const Conditioning> cond_of(float v, int tokens = 77) {
  auto c = std::make_shared<Conditioning>();
  c->tokens = tokens;
  c->values.assign(static_cast<size_t>(tokens) * 8, v);
  return c;
}

TaskOptions options(uint64_t seed, SamplerKind kind = SamplerKind::euler_ancestral, int size = 32) {
  TaskOptions o;
  o.width = o.height = size;
  o.steps = 6;
  o.seed = seed;
  o.sampler = kind;
  return o;
}

std::vector<float> run_alone(FakeModel& m, const TaskOptions& o, std::shared_ptr<const Conditioning> c,
                             std::shared_ptr<const Conditioning> u) {
  ImageTask t(o, 4, m.schedule(), std::move(c), std::move(u));
  while (!t.done()) run_step(m, {&t});
  return t.result_latent();
}

TEST(SdPipeline, TasksBatchedTogetherGiveTheirAloneResults) {
  FakeModel m;
  auto c = cond_of(0.3f), u = cond_of(-0.2f);
  TaskOptions a = options(1), b = options(2, SamplerKind::heun), d = options(3, SamplerKind::dpmpp_2m);
  b.cfg_scale = 1.0f;  // unguided: one row
  d.init_latent.assign(4 * 4 * 4, 0.5f);
  d.strength = 0.5f;
  const auto ra = run_alone(m, a, c, u), rb = run_alone(m, b, c, u), rd = run_alone(m, d, c, u);

  FakeModel batched;
  ImageTask ta(a, 4, batched.schedule(), c, u), tb(b, 4, batched.schedule(), c, u), td(d, 4, batched.schedule(), c, u);
  int calls = 0;
  while (!ta.done() || !tb.done() || !td.done()) {
    run_step(batched, {&ta, &tb, &td});
    ++calls;
  }
  // The first call holds every task's rows: 2 (guided) + 1 + 2.
  ASSERT_FALSE(batched.rows.empty());
  EXPECT_EQ(batched.rows.front(), 5);
  EXPECT_EQ(batched.calls, calls);  // one network call per step: all three share a size
  auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(same(ra, ta.result_latent()));
  EXPECT_TRUE(same(rb, tb.result_latent()));
  EXPECT_TRUE(same(rd, td.result_latent()));
  // and the seeds matter
  EXPECT_FALSE(same(ra, run_alone(m, options(9), c, u)));
}

TEST(SdPipeline, DifferentSizesGoToSeparateCalls) {
  FakeModel m;
  auto c = cond_of(0.1f);
  ImageTask small(options(1, SamplerKind::euler, 16), 4, m.schedule(), c, nullptr);
  ImageTask large(options(1, SamplerKind::euler, 24), 4, m.schedule(), c, nullptr);
  EXPECT_EQ(run_step(m, {&small, &large}), 2);
  EXPECT_EQ(m.calls, 2);
}

TEST(SdPipeline, Img2ImgRunsA1111sShareOfTheSteps) {
  FakeModel m;
  auto c = cond_of(0.1f);
  for (auto [steps, strength, expect] : {std::tuple{20, 0.5f, 11}, {20, 1.0f, 20}, {10, 0.75f, 8}, {4, 0.1f, 1}}) {
    TaskOptions o = options(5, SamplerKind::euler);
    o.steps = steps;
    o.strength = strength;
    o.init_latent.assign(4 * 4 * 4, 0.1f);
    ImageTask t(o, 4, m.schedule(), c, nullptr);
    // A1111: t_enc = int(min(strength, 0.999) * steps) -> t_enc + 1 steps
    EXPECT_EQ(t.steps(), expect) << steps << " " << strength;
  }
}

TEST(SdPipeline, InpaintingKeepsTheUnmaskedLatent) {
  FakeModel m;
  auto c = cond_of(0.1f);
  TaskOptions o = options(5, SamplerKind::euler_ancestral);
  o.init_latent.resize(4 * 4 * 4);
  for (size_t i = 0; i < o.init_latent.size(); ++i) o.init_latent[i] = 0.01f * static_cast<float>(i);
  o.strength = 1.0f;
  o.latent_mask.assign(16, 0.0f);
  for (int i = 0; i < 8; ++i) o.latent_mask[static_cast<size_t>(i)] = 1.0f;  // repaint the top half
  const auto x = run_alone(m, o, c, nullptr);
  for (int ch = 0; ch < 4; ++ch)
    for (int i = 0; i < 16; ++i) {
      const size_t k = static_cast<size_t>(ch * 16 + i);
      if (i >= 8) EXPECT_EQ(x[k], o.init_latent[k]) << k;
      else EXPECT_NE(x[k], o.init_latent[k]) << k;
    }
}

TEST(SdPipeline, BadOptionsAreRefused) {
  FakeModel m;
  auto c = cond_of(0.1f);
  TaskOptions o = options(1);
  o.width = 30;
  EXPECT_THROW(ImageTask(o, 4, m.schedule(), c, nullptr), Error);
  o = options(1);
  o.latent_mask.assign(16, 1.0f);  // a mask without an init image
  EXPECT_THROW(ImageTask(o, 4, m.schedule(), c, nullptr), Error);
  o = options(1);
  EXPECT_THROW(ImageTask(o, 4, m.schedule(), c, cond_of(0.1f, 154)), Error);  // lengths differ
}

TEST(SdPipeline, PromptAndNegativeArePaddedToTheSameLength) {
  auto tok = tok::ClipTokenizer::open(std::string(ATELIER_FIXTURES_DIR) + "/clip/bpe_simple_vocab_16e6.txt.gz");
  FakeModel m;
  std::string longp;
  for (int i = 0; i < 100; ++i) longp += "cat ";
  auto [pos, neg] = encode_prompts(m, *tok, longp, "blurry");
  EXPECT_EQ(pos.tokens, 154);
  EXPECT_EQ(neg.tokens, 154);
  EXPECT_EQ(pos.values.size(), 154u * 8);
  // the negative's second chunk is the empty prompt's encoding
  auto [e, e2] = encode_prompts(m, *tok, "", "");
  EXPECT_EQ(0, std::memcmp(neg.values.data() + 77 * 8, e.values.data(), 77 * 8 * sizeof(float)));
}

// Issue 14 mutant: CFG with the conditional and unconditional predictions
// swapped. With the stand-in model, eps_cond - eps_uncond = 0.3 - (-0.2) =
// 0.5 everywhere (the x and t terms are the same in both rows), so by hand
// eps(s) = eps_uncond + s * 0.5 and eps(1) = eps_cond (unguided). One Euler
// step ends at x0 = x - sigma * eps, linear in eps: with the same seed,
// (x0(7) - x0(1)) / (x0(2) - x0(1)) = (6 * 0.5) / (1 * 0.5) = 6 and x0 falls
// as the guidance pushes eps toward the prompt. (Swapped: 3.5, and it rises.)
TEST(SdPipeline, GuidancePushesTowardThePromptByItsScale) {
  FakeModel m;
  auto c = cond_of(0.3f), u = cond_of(-0.2f);
  auto x0 = [&](float scale) {
    TaskOptions o = options(11, SamplerKind::euler);
    o.steps = 1;
    o.cfg_scale = scale;
    return run_alone(m, o, c, u);
  };
  const auto x1 = x0(1.0f), x2 = x0(2.0f), x7 = x0(7.0f);
  ASSERT_EQ(x1.size(), x7.size());
  for (size_t i = 0; i < x1.size(); ++i) {
    const double d2 = static_cast<double>(x2[i]) - x1[i], d7 = static_cast<double>(x7[i]) - x1[i];
    ASSERT_LT(d2, 0) << i << ": guidance moved away from the prompt";
    EXPECT_NEAR(d7 / d2, 6.0, 1e-3) << i;
  }
}

}  // namespace
}  // namespace atelier::image
