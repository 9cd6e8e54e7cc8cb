// The LLaMA runner on a device that is not the host (tests/fake_device.h):
// every parameter, activation, KV row and metadata array an op is handed is
// device memory; the logits are the CPU backend's, bit for bit; steady steps
// allocate nothing, wait for the device once (the logits' one download) and
// hand the ops the same metadata addresses and row counts whatever rows they
// hold (padded to a bucket with skip rows): what a CUDA graph needs to replay
// a captured step.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fake_device.h"
#include "formats/gguf.h"
#include "text/kv_cache.h"
#include "text/llama.h"
#include "text/sampler.h"

using namespace atelier;
using text::KvPool;
using text::PagedSeq;
using text::SeqInput;

namespace {

const std::string kDir = std::string(ATELIER_FIXTURES_DIR) + "/text/";

std::vector<int32_t> golden() {
  std::ifstream f(kDir + "golden-once-upon-a-time-greedy.ids");
  std::vector<int32_t> ids;
  for (int32_t id; f >> id;) ids.push_back(id);
  return ids;
}

// Three sequences through one pool: prompts of 9, 5 and 2 tokens prefilled
// in one step, then `decodes` steps in which sequence i decodes while
// step % (i + 1) == 0 (3, 2 or 1 rows a step). Returns every logits row.
struct Steps {
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<const void*>> meta;  // per decode step (fake device only)
  std::vector<std::vector<int64_t>> shapes;    // per decode step: the ops' row counts
  std::vector<int64_t> allocs, downloads;      // per decode step (fake device only)
};

Steps run_steps(const text::LlamaWeights& w, kernels::Backend& be, test::FakeDevice* fake, int decodes,
                int reserve_rows = 0) {
  const auto g = golden();
  KvPool pool(w.hp, 16, KvPool::block_bytes_for(w.hp, 16, KvType::F16) * 12, KvType::F16, be);
  text::LlamaRunner runner(w, be);
  if (reserve_rows > 0) runner.reserve(reserve_rows, 3);
  const int lens[3] = {9, 5, 2};
  std::vector<std::vector<int32_t>> toks(3);
  std::vector<std::unique_ptr<PagedSeq>> kv;
  std::vector<std::vector<float>> logits(3, std::vector<float>(static_cast<size_t>(w.hp.n_vocab)));
  for (int i = 0; i < 3; ++i) {
    toks[i].assign(g.begin() + i, g.begin() + i + lens[i]);
    kv.push_back(std::make_unique<PagedSeq>(pool));
  }
  std::vector<int> stored(3, 0);
  Steps out;
  for (int step = -1; step < decodes; ++step) {
    std::vector<SeqInput> in;
    std::vector<int> who;
    for (int i = 0; i < 3; ++i) {
      if (step >= 0 && step % (i + 1) != 0) continue;
      SeqInput s;
      s.pos0 = stored[i];
      s.n = static_cast<int>(toks[i].size()) - stored[i];
      s.tokens = toks[i].data() + stored[i];
      s.kv = kv[i].get();
      s.logits = logits[i].data();
      EXPECT_TRUE(kv[i]->reserve(stored[i] + s.n));
      in.push_back(s);
      who.push_back(i);
    }
    const int64_t a0 = fake ? fake->allocations() : 0, d0 = fake ? fake->downloads() : 0;
    runner.forward_batch(in);
    if (fake && (step >= 0 || reserve_rows > 0)) {
      out.meta.push_back(fake->take_metadata_pointers());
      out.shapes.push_back(fake->take_row_counts());
      out.allocs.push_back(fake->allocations() - a0);
      out.downloads.push_back(fake->downloads() - d0);
    } else if (fake) {  // the prefill step: its workspace grows here unless reserved
      fake->take_metadata_pointers();
      fake->take_row_counts();
    }
    for (size_t k = 0; k < who.size(); ++k) {
      const int i = who[k];
      stored[i] += in[k].n;
      out.logits.push_back(logits[i]);
      // Greedy: the next token is the argmax (the same on both devices when the logits are).
      toks[i].push_back(static_cast<int32_t>(std::max_element(logits[i].begin(), logits[i].end()) - logits[i].begin()));
    }
  }
  return out;
}

void expect_bitwise(const Steps& want, const Steps& got) {
  ASSERT_EQ(want.logits.size(), got.logits.size());
  for (size_t i = 0; i < want.logits.size(); ++i) ASSERT_EQ(want.logits[i], got.logits[i]) << "logits row " << i;
}

}  // namespace

TEST(FakeDevice, GgufModelRunsOnDeviceMemoryOnlyWithTheCpuBits) {
  const auto cpu_w = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"));
  const Steps want = run_steps(cpu_w, kernels::default_cpu_backend(), nullptr, 6);

  test::FakeDevice fake;
  const auto w = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"), fake);
  const Steps got = run_steps(w, fake, &fake, 6);
  EXPECT_EQ(fake.violations(), std::vector<std::string>{});
  expect_bitwise(want, got);
}

TEST(FakeDevice, Llama2cModelRunsOnDeviceMemoryOnlyWithTheCpuBits) {
  const auto cpu_w = text::load_llama2c(kDir + "stories260K.bin");
  const Steps want = run_steps(cpu_w, kernels::default_cpu_backend(), nullptr, 4);

  test::FakeDevice fake;
  const auto w = text::load_llama2c(kDir + "stories260K.bin", fake);
  const Steps got = run_steps(w, fake, &fake, 4);
  EXPECT_EQ(fake.violations(), std::vector<std::string>{});
  expect_bitwise(want, got);
}

TEST(FakeDevice, SteadyStepsAllocateNothingDownloadOnceAndKeepTheirMetadataAddressesAndShapes) {
  test::FakeDevice fake;
  const auto w = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"), fake);
  // Decode steps of 3, 1, 2, 1, 3, ... rows after a 16-row prefill; 40 tokens
  // cross block boundaries (16 positions a block), so block tables grow.
  const Steps r = run_steps(w, fake, &fake, 30);
  ASSERT_EQ(r.meta.size(), 30u);
  for (size_t s = 0; s < r.meta.size(); ++s) {
    EXPECT_EQ(r.downloads[s], 1) << "decode step " << s << ": the logits of a step come down in one copy";
    EXPECT_EQ(r.allocs[s], 0) << "decode step " << s << " allocated device memory";
    EXPECT_EQ(r.meta[s], r.meta[0]) << "decode step " << s << " moved its metadata (rows differ from step 0's)";
    // 1 to 3 rows, each step padded to a power-of-two bucket with skip rows
    // (3 rows run as 4): one captured graph per bucket.
    for (int64_t n : r.shapes[s]) EXPECT_EQ(n & (n - 1), 0) << "decode step " << s << " ran an op on " << n << " rows";
    for (size_t o = 0; o < s; ++o)
      if (r.shapes[o].front() == r.shapes[s].front()) {
        EXPECT_EQ(r.shapes[s], r.shapes[o]) << "steps " << o << " and " << s;
      }
  }
}

// A device runner sizes its workspace once from max_batch and the prefill
// budget (LlamaRunner::reserve): then the prefill step allocates nothing
// either, and it hands the ops the metadata addresses the decode steps use.
TEST(FakeDevice, AReservedWorkspaceAllocatesNothingFromTheFirstStep) {
  test::FakeDevice fake;
  const auto w = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"), fake);
  const Steps r = run_steps(w, fake, &fake, 8, /*reserve_rows=*/16);
  ASSERT_EQ(r.meta.size(), 9u);  // the prefill and 8 decodes
  for (size_t s = 0; s < r.meta.size(); ++s) {
    EXPECT_EQ(r.allocs[s], 0) << "step " << s << " allocated device memory";
    EXPECT_EQ(r.meta[s], r.meta[0]) << "step " << s << " moved its metadata";
  }
}

// Activations of another type (BF16, as a GPU computes in): every op is
// handed BF16 activations (the fake device refuses any other), and the
// logits are the CPU's within BF16's rounding; they come down as F32.
TEST(FakeDevice, Bf16ActivationsGiveTheCpuLogitsWithinBf16Rounding) {
  const auto cpu_w = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"));
  const Steps want = run_steps(cpu_w, kernels::default_cpu_backend(), nullptr, 0);
  test::FakeDevice fake(nullptr, {kernels::DType::BF16, kernels::Layout::NHWC});
  const auto w = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"), fake);
  const Steps got = run_steps(w, fake, &fake, 0);
  EXPECT_EQ(fake.violations(), std::vector<std::string>{});
  ASSERT_EQ(want.logits.size(), got.logits.size());
  for (size_t i = 0; i < want.logits.size(); ++i) {
    double num = 0, den = 0;
    for (size_t j = 0; j < want.logits[i].size(); ++j) {
      num += (double{want.logits[i][j]} - got.logits[i][j]) * (double{want.logits[i][j]} - got.logits[i][j]);
      den += double{want.logits[i][j]} * want.logits[i][j];
    }
    const double rel = std::sqrt(num / den);
    EXPECT_LE(rel, 0.03) << "logits row " << i;
    EXPECT_GT(rel, 0.0) << "logits row " << i << ": BF16 activations changed nothing (not emulated?)";
  }
}

// A device runner estimates a text model's working memory before it sizes
// the KV pool: the estimate is what reserve() then allocates, byte for byte,
// in each activation type.
TEST(FakeDevice, TheWorkspaceEstimateIsWhatReserveAllocates) {
  for (const kernels::DType act : {kernels::DType::F32, kernels::DType::BF16}) {
    test::FakeDevice fake(nullptr, {act, kernels::Layout::NHWC});
    const auto w = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"), fake);
    text::LlamaRunner runner(w, fake);
    const int64_t before = fake.live_bytes();
    runner.reserve(24, 5);  // a device pads to buckets: 32 rows, 8 logits rows
    EXPECT_EQ(fake.live_bytes() - before, text::LlamaRunner::workspace_bytes(w.hp, 32, 8, act))
        << kernels::dtype_name(act);
  }
}

// ---- captured steps (Backend::run_step: a CUDA graph per key)

namespace {

int bucket(int n) {
  int b = 1;
  while (b < n) b *= 2;
  return b;
}

// A generation: three sequences (prompts of 9, 5 and 2 golden tokens)
// prefilled in one step, then `decodes` greedy steps in which sequence i
// decodes while step % (i + 1) == 0 (3, 2 or 1 rows). Each sequence in one
// shared pool, or (own_caches) in a contiguous cache of its own, so a step's
// rows lie in one to three KV storages. The runner is reserved for 16 rows
// and 3 logits rows, as the device runner reserves at load.
struct Generation {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logits;   // every logits row, in order
  std::set<std::vector<int64_t>> shapes;    // the distinct (rows, logits rows, attention bound, storages) a device runs
  int steps = 0;
  size_t keys = 0;  // the fake device's recorded keys before the runner ended
  int64_t drops = 0;
};

Generation generate(const text::LlamaWeights& w, kernels::Backend& be, int decodes, bool own_caches,
                    test::FakeDevice* fake = nullptr) {
  const auto g = golden();
  const int lens[3] = {9, 5, 2}, ctx = 9 + decodes + 1;
  KvPool pool(w.hp, 16, KvPool::block_bytes_for(w.hp, 16, KvType::F16) * (3 * (ctx / 16 + 2)), KvType::F16, be);
  text::LlamaRunner runner(w, be);
  runner.reserve(16, 3);
  std::vector<std::unique_ptr<text::KvSeq>> kv;
  Generation out;
  out.tokens.resize(3);
  std::vector<std::vector<float>> logits(3, std::vector<float>(static_cast<size_t>(w.hp.n_vocab)));
  for (int i = 0; i < 3; ++i) {
    out.tokens[i].assign(g.begin() + i, g.begin() + i + lens[i]);
    if (own_caches) kv.push_back(std::make_unique<text::KvCache>(w.hp, ctx, KvType::F16, be));
    else kv.push_back(std::make_unique<PagedSeq>(pool));
  }
  std::vector<int> stored(3, 0);
  int bound = 0;  // the runner's attention bound on a device: a power of two, at least 256, never shrinking
  for (int step = -1; step < decodes; ++step) {
    std::vector<SeqInput> in;
    std::vector<int> who;
    int rows = 0, max_len = 0;
    std::set<int> storages;
    for (int i = 0; i < 3; ++i) {
      if (step >= 0 && step % (i + 1) != 0) continue;
      SeqInput s;
      s.pos0 = stored[i];
      s.n = static_cast<int>(out.tokens[i].size()) - stored[i];
      s.tokens = out.tokens[i].data() + stored[i];
      s.kv = kv[i].get();
      s.logits = logits[i].data();
      if (!own_caches) {
        EXPECT_TRUE(static_cast<PagedSeq*>(kv[i].get())->reserve(stored[i] + s.n));
      }
      in.push_back(s);
      who.push_back(i);
      rows += s.n;
      max_len = std::max(max_len, s.pos0 + s.n);
      storages.insert(own_caches ? i : -1);
    }
    if (max_len > bound) bound = bucket(std::max(max_len, 256));
    std::vector<int64_t> shape = {bucket(rows), bucket(static_cast<int>(in.size())), bound};
    shape.insert(shape.end(), storages.begin(), storages.end());
    out.shapes.insert(shape);
    runner.forward_batch(in);
    ++out.steps;
    for (size_t k = 0; k < who.size(); ++k) {
      const int i = who[k];
      stored[i] += in[k].n;
      out.logits.push_back(logits[i]);
      out.tokens[i].push_back(
          static_cast<int32_t>(std::max_element(logits[i].begin(), logits[i].end()) - logits[i].begin()));
    }
  }
  if (fake) out.keys = fake->graph_keys(), out.drops = fake->graph_drops();
  return out;
}

}  // namespace

// A generation of 300 decode steps after a prefill, on the fake device in
// both formats: every replay of a key issues exactly the ops (and arguments)
// its recording did, nothing inside a step allocates or synchronizes, and a
// handful of recordings serve every step: one per (rows bucket, logits
// bucket, attention bound). The positions pass 256, so the bound moves once
// (256 -> 512) and each decode bucket is recorded again under it. In F32 the
// tokens and logits are the CPU's, bit for bit.
TEST(FakeDevice, ADecodeGenerationReplaysOneRecordingPerBucket) {
  const auto cpu_w = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"));
  const int decodes = 300;
  const Generation want = generate(cpu_w, kernels::default_cpu_backend(), decodes, false);
  for (const test::FakeFormat fmt : {test::FakeFormat{}, test::FakeFormat{kernels::DType::BF16, kernels::Layout::NHWC}}) {
    SCOPED_TRACE(kernels::dtype_name(fmt.act));
    test::FakeDevice fake(nullptr, fmt);
    const auto w = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"), fake);
    const Generation got = generate(w, fake, decodes, false, &fake);
    EXPECT_EQ(fake.violations(), std::vector<std::string>{});
    // The prefill (16 rows, 3 logits rows), then decode buckets of 1, 2 and 4
    // rows under the bounds 256 and 512: 1 + 3 + 3.
    EXPECT_EQ(got.shapes.size(), 7u);
    EXPECT_EQ(got.keys, got.shapes.size());
    EXPECT_EQ(fake.steps_recorded(), static_cast<int64_t>(got.shapes.size()));
    EXPECT_EQ(fake.steps_replayed(), got.steps - static_cast<int64_t>(got.shapes.size()));
    EXPECT_EQ(got.drops, 0) << "a reserved runner moved a buffer";
    // A runner that ends drops the recordings (they point into its buffers).
    EXPECT_EQ(fake.graph_keys(), 0u);
    if (fmt.act == kernels::DType::F32) {
      EXPECT_EQ(got.tokens, want.tokens);
      ASSERT_EQ(got.logits.size(), want.logits.size());
      for (size_t i = 0; i < want.logits.size(); ++i) ASSERT_EQ(want.logits[i], got.logits[i]) << "logits row " << i;
    }
  }
}

// Sequences in caches of their own: a step's KV storages (their addresses
// are op arguments) are part of its key, so steps of the same buckets over
// different caches get recordings of their own, and a replay never writes
// one sequence's rows into another's cache.
TEST(FakeDevice, StepsOverDifferentKvStoragesAreRecordedApart) {
  const auto cpu_w = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"));
  const Generation want = generate(cpu_w, kernels::default_cpu_backend(), 12, true);
  test::FakeDevice fake;
  const auto w = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"), fake);
  const Generation got = generate(w, fake, 12, true, &fake);
  EXPECT_EQ(fake.violations(), std::vector<std::string>{});
  // Steps 0, 6: all three; 2, 4, 8, 10: 0 and 1; 3, 9: 0 and 2; the rest 0 alone; and the prefill.
  EXPECT_EQ(got.shapes.size(), 5u);
  EXPECT_EQ(got.keys, got.shapes.size());
  EXPECT_EQ(got.tokens, want.tokens);
}

// The checker itself: a step whose ops change an argument under one key (a
// scalar that varies per step but is not in the key) is caught, as is an
// allocation or a synchronization inside a step; the same ops replayed are not.
TEST(FakeDevice, AReplayThatDiffersFromItsRecordingIsCaught) {
  test::FakeDevice fake;
  auto buf = fake.alloc(4 * 64 * 2);
  const kernels::Act x(buf->data(), kernels::DType::F32), y = x + 64;
  auto weight = fake.alloc(4 * 64);
  fake.clear(*buf, 0), fake.clear(*weight, 0);
  const float* wp = weight->at<float>(0);
  for (int step = 0; step < 3; ++step)
    fake.run_step(1, [&] { fake.rms_norm(x, wp, y, 2, 32, 1e-5f); });
  EXPECT_EQ(fake.violations(), std::vector<std::string>{});
  EXPECT_EQ(fake.steps_recorded(), 1);
  EXPECT_EQ(fake.steps_replayed(), 2);

  for (int step = 0; step < 2; ++step)
    fake.run_step(2, [&] { fake.rms_norm(x, wp, y, 2, 32, step == 0 ? 1e-5f : 1e-6f); });
  ASSERT_EQ(fake.violations().size(), 1u);
  EXPECT_NE(fake.violations()[0].find("run_step key 2: op 0 is rms_norm"), std::string::npos) << fake.violations()[0];

  fake.run_step(3, [&] {
    fake.rms_norm(x, wp, y, 2, 32, 1e-5f);
    fake.synchronize();
    auto more = fake.alloc(64);
  });
  const auto v = fake.violations();
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[1], "synchronize inside a captured step (run_step)");
  EXPECT_EQ(v[2], "alloc inside a captured step (run_step)");

  fake.run_step(2, [&] {});  // fewer ops than recorded
  EXPECT_EQ(fake.violations().size(), 4u);
  fake.drop_graphs();
  fake.run_step(2, [&] {});  // recorded afresh
  EXPECT_EQ(fake.violations().size(), 4u);
}

// A runner that was not reserved grows its workspace when a larger step
// comes: the buffers the recordings point into move, so they are dropped
// and the next step of a bucket seen before is recorded afresh (a replay of
// the old recording would write freed memory). The logits stay the CPU's.
TEST(FakeDevice, AWorkspaceThatGrowsDropsTheRecordings) {
  const auto g = golden();
  auto run = [&](const text::LlamaWeights& w, kernels::Backend& be, test::FakeDevice* fake) {
    text::KvCache cache(w.hp, 64, KvType::F16, be);
    text::LlamaRunner runner(w, be);
    std::vector<float> logits(static_cast<size_t>(w.hp.n_vocab));
    std::vector<std::vector<float>> out;
    // 1, 1, then 6 rows (the workspace grows from 1 to 8), then 1, 1 again.
    const int n[] = {1, 1, 6, 1, 1};
    int pos = 0;
    for (int i = 0; i < 5; ++i) {
      runner.forward(g.data() + pos, n[i], pos, cache, logits.data());
      pos += n[i];
      out.push_back(logits);
      if (fake && i == 1) {
        EXPECT_EQ(fake->steps_replayed(), 1);
      }
    }
    if (fake) {
      EXPECT_GE(fake->graph_drops(), 1);
      EXPECT_EQ(fake->steps_replayed(), 2) << "the last step replays the recording made after the growth";
    }
    return out;
  };
  const auto cpu_w = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"));
  const auto want = run(cpu_w, kernels::default_cpu_backend(), nullptr);
  test::FakeDevice fake;
  const auto w = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"), fake);
  const auto got = run(w, fake, &fake);
  EXPECT_EQ(fake.violations(), std::vector<std::string>{});
  EXPECT_EQ(got, want);
}

// Sampling on the device (SeqInput::sample, Backend::sample): two of three
// sequences sample there (one at temperature with top-k, top-p, min-p and
// penalties, one greedy with penalties), the third's logits come to the
// host. Each step downloads the host row's logits and the two ids, nothing
// more, replays its recording, and every token is the one text::Sampler
// picks from the CPU runner's logits with the same seed and history.
TEST(FakeDevice, DeviceSampledRowsComeDownAsIdsAndOnlyTheHostRowsLogits) {
  const auto cpu_w = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"));
  test::FakeDevice fake;
  const auto w = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"), fake);
  const int nv = w.hp.n_vocab;
  KvPool cpu_pool(w.hp, 16, KvPool::block_bytes_for(w.hp, 16, KvType::F16) * 12, KvType::F16,
                  kernels::default_cpu_backend());
  KvPool pool(w.hp, 16, KvPool::block_bytes_for(w.hp, 16, KvType::F16) * 12, KvType::F16, fake);
  text::LlamaRunner cpu(cpu_w, kernels::default_cpu_backend()), dev(w, fake);
  dev.reserve(8, 4);
  SamplingParams sp[3];
  sp[0].temperature = 0.9f, sp[0].top_k = 20, sp[0].top_p = 0.9f, sp[0].min_p = 0.02f, sp[0].repeat_penalty = 1.3f,
  sp[0].frequency_penalty = 0.2f, sp[0].seed = 5;
  sp[1].temperature = 0.8f, sp[1].seed = 6;  // sampled on the host
  sp[2].temperature = 0.0f, sp[2].repeat_penalty = 1.5f, sp[2].presence_penalty = 0.5f;
  std::vector<std::unique_ptr<text::Sampler>> host_s, dev_s;
  std::vector<std::vector<int32_t>> toks(3);
  std::vector<std::unique_ptr<PagedSeq>> cpu_kv, dev_kv;
  const auto g = golden();
  for (int i = 0; i < 3; ++i) {
    toks[i].assign(g.begin() + i, g.begin() + i + 4);
    host_s.push_back(std::make_unique<text::Sampler>(sp[i]));
    dev_s.push_back(std::make_unique<text::Sampler>(sp[i]));
    for (int32_t t : toks[i]) host_s[i]->accept(t), dev_s[i]->accept(t);
    cpu_kv.push_back(std::make_unique<PagedSeq>(cpu_pool));
    dev_kv.push_back(std::make_unique<PagedSeq>(pool));
  }
  std::vector<std::vector<float>> cpu_logits(3, std::vector<float>(static_cast<size_t>(nv))), dev_logits = cpu_logits;
  int stored = 0;
  for (int step = 0; step < 12; ++step) {
    const int n = static_cast<int>(toks[0].size()) - stored;
    std::vector<SeqInput> ci(3), di(3);
    std::vector<kernels::SampleRow> rows(3);
    std::vector<std::vector<int32_t>> pairs(3);
    int32_t ids[3] = {-1, -1, -1};
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(cpu_kv[i]->reserve(stored + n) && dev_kv[i]->reserve(stored + n));
      ci[i].tokens = di[i].tokens = toks[i].data() + stored;
      ci[i].n = di[i].n = n;
      ci[i].pos0 = di[i].pos0 = stored;
      ci[i].kv = cpu_kv[i].get();
      di[i].kv = dev_kv[i].get();
      ci[i].logits = cpu_logits[i].data();
      di[i].logits = dev_logits[i].data();
      if (i != 1) {
        rows[i] = dev_s[i]->device_row(pairs[i]);
        di[i].sample = &rows[i];
        di[i].sample_pairs = pairs[i].data();
        di[i].sampled = &ids[i];
      }
    }
    cpu.forward_batch(ci);
    const int64_t bytes0 = fake.downloaded_bytes(), calls0 = fake.sample_calls();
    dev.forward_batch(di);
    if (step > 0) {
      EXPECT_EQ(fake.downloaded_bytes() - bytes0, int64_t{nv} * 4 + 2 * 4)
          << "step " << step << ": one logits row and two ids come down";
    }
    EXPECT_EQ(fake.sample_calls() - calls0, 1) << "step " << step;
    for (int i = 0; i < 3; ++i) {
      std::vector<float> l = cpu_logits[i];
      const int32_t want = host_s[i]->sample(l.data(), nv);
      int32_t got;
      if (i == 1) {
        ASSERT_EQ(dev_logits[i], cpu_logits[i]) << "step " << step;
        got = dev_s[i]->sample(dev_logits[i].data(), nv);
      } else {
        got = ids[i];
        dev_s[i]->take_draw();
      }
      EXPECT_EQ(got, want) << "step " << step << ", sequence " << i;
      host_s[i]->accept(want), dev_s[i]->accept(want);
      toks[i].push_back(want);
    }
    stored += n;
  }
  EXPECT_GT(fake.steps_replayed(), 0);
  EXPECT_EQ(fake.violations(), std::vector<std::string>{});
}

