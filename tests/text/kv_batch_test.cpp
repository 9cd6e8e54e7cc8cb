// Continuous batching on the model side, with the real stories260K model:
// 32 sequences stepped together through LlamaRunner::forward_batch over a
// paged KV pool (staggered starts, prefill chunks mixed with decodes) give
// bit-identical logits and the same greedy tokens as each sequence run alone
// through a contiguous KvCache, token by token. Also: pool accounting
// (refcounts, exhaustion, LRU eviction of cached prefix blocks) and prefix
// sharing (shared blocks, outputs unchanged).
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "text/kv_cache.h"
#include "text/llama.h"
#include "resident_pages.h"

using namespace atelier;
using text::KvCache;
using text::KvPool;
using text::PagedSeq;
using text::SeqInput;

namespace {

constexpr int kGen = 20;  // greedy tokens per sequence
const std::string kDir = std::string(ATELIER_FIXTURES_DIR) + "/text/";

const text::LlamaWeights& model() {
  static const text::LlamaWeights w = text::load_llama_gguf(formats::GgufFile::open(kDir + "stories260K.gguf"));
  return w;
}

std::vector<int32_t> golden() {
  std::ifstream f(kDir + "golden-once-upon-a-time-greedy.ids");
  std::vector<int32_t> ids;
  for (int32_t id; f >> id;) ids.push_back(id);
  return ids;
}

// 32 different prompts from the golden ids: BOS, then windows of varying
// offset and length (1..39 tokens); odd ones with their ids shifted so that
// not every prompt is natural text.
std::vector<std::vector<int32_t>> prompts() {
  const auto g = golden();
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < 32; ++i) {
    const int off = 1 + (7 * i) % 24, len = 1 + (11 * i) % 39;
    std::vector<int32_t> p = {1};
    for (int j = 0; j < len; ++j) {
      int32_t t = g.at(static_cast<size_t>(off + j));
      if (i % 2) t = 3 + (t + 13 * i) % 509;
      p.push_back(t);
    }
    out.push_back(std::move(p));
  }
  return out;
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

struct Stream {
  std::vector<int32_t> tokens;              // generated
  std::vector<std::vector<float>> logits;   // the logits each token was picked from
};

// The reference: alone, contiguous cache, one token per forward call.
Stream run_alone(const std::vector<int32_t>& prompt, bool f16) {
  const auto& w = model();
  KvCache cache(w.hp, static_cast<int>(prompt.size()) + kGen, (f16 ? KvType::F16 : KvType::F32));
  text::LlamaRunner runner(w, nullptr);
  std::vector<float> logits(static_cast<size_t>(w.hp.n_vocab));
  int pos = 0;
  for (; pos < static_cast<int>(prompt.size()); ++pos) runner.forward(&prompt[static_cast<size_t>(pos)], 1, pos, cache, logits.data());
  Stream s;
  for (;;) {
    int32_t id = argmax(logits);
    s.tokens.push_back(id);
    s.logits.push_back(logits);
    if (static_cast<int>(s.tokens.size()) == kGen) break;
    runner.forward(&id, 1, pos++, cache, logits.data());
  }
  return s;
}

const std::vector<Stream>& reference(bool f16) {
  static std::vector<Stream> ref[2];
  auto& r = ref[f16 ? 1 : 0];
  if (r.empty())
    for (const auto& p : prompts()) r.push_back(run_alone(p, f16));
  return r;
}

// A miniature continuous-batching scheduler: sequence i joins at step
// i % 7, prefills its prompt in chunks of 1 + (5 i) % 9 tokens, then decodes
// one token per step; the order of sequences in the step rotates.
struct Running {
  std::vector<int32_t> toks;  // prompt, then generated
  int n_prompt = 0, stored = 0, start = 0, chunk = 1;
  std::unique_ptr<PagedSeq> kv;
  std::vector<float> logits;
  Stream out;
  bool done = false;
};

std::vector<Stream> run_batched(const std::vector<std::vector<int32_t>>& ps, int block_tokens, bool f16, int threads,
                                int* max_rows = nullptr, bool publish = false) {
  const auto& w = model();
  ThreadPool pool(threads);
  const int64_t blocks = static_cast<int64_t>(ps.size()) * (64 / block_tokens + 1);
  KvPool kv(w.hp, block_tokens, KvPool::block_bytes_for(w.hp, block_tokens, (f16 ? KvType::F16 : KvType::F32)) * blocks, (f16 ? KvType::F16 : KvType::F32));
  text::LlamaRunner runner(w, &pool);
  std::vector<Running> seqs(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    Running& r = seqs[i];
    r.toks = ps[i];
    r.n_prompt = static_cast<int>(ps[i].size());
    r.start = static_cast<int>(i % 7);
    r.chunk = 1 + static_cast<int>(5 * i) % 9;
    r.kv = std::make_unique<PagedSeq>(kv);
    r.logits.resize(static_cast<size_t>(w.hp.n_vocab));
  }
  std::vector<SeqInput> step;
  std::vector<size_t> who, ns;
  for (int t = 0;; ++t) {
    step.clear();
    who.clear();
    ns.clear();
    for (size_t k = 0; k < seqs.size(); ++k) {
      const size_t i = (k + static_cast<size_t>(t) * 5) % seqs.size();
      Running& r = seqs[i];
      if (r.done || r.start > t) continue;
      SeqInput in;
      in.pos0 = r.stored;
      in.n = r.stored < r.n_prompt ? std::min(r.chunk, r.n_prompt - r.stored) : 1;
      in.tokens = r.toks.data() + r.stored;
      in.kv = r.kv.get();
      in.logits = r.stored + in.n >= r.n_prompt ? r.logits.data() : nullptr;
      EXPECT_TRUE(r.kv->reserve(r.stored + in.n));
      step.push_back(in);
      who.push_back(i);
    }
    if (step.empty()) break;
    int rows = 0;
    for (const auto& in : step) rows += in.n;
    if (max_rows) *max_rows = std::max(*max_rows, rows);
    runner.forward_batch(step);
    for (size_t k = 0; k < step.size(); ++k) {
      Running& r = seqs[who[k]];
      r.stored += step[k].n;
      if (publish) r.kv->publish(r.toks.data(), r.stored);
      if (!step[k].logits) continue;
      const int32_t id = argmax(r.logits);
      r.out.tokens.push_back(id);
      r.out.logits.push_back(r.logits);
      r.toks.push_back(id);
      if (static_cast<int>(r.out.tokens.size()) == kGen) {
        r.done = true;
        r.kv->release_all();
      }
    }
  }
  EXPECT_EQ(kv.free_blocks(), kv.total_blocks());
  std::vector<Stream> out;
  for (auto& r : seqs) out.push_back(std::move(r.out));
  return out;
}

void expect_same(const std::vector<Stream>& want, const std::vector<Stream>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(want[i].tokens, got[i].tokens) << what << ", sequence " << i;
    ASSERT_EQ(want[i].logits.size(), got[i].logits.size()) << what << ", sequence " << i;
    for (size_t j = 0; j < want[i].logits.size(); ++j)
      ASSERT_EQ(want[i].logits[j], got[i].logits[j]) << what << ", sequence " << i << ", token " << j;  // bitwise
  }
}

text::LlamaHparams tiny_hp() {
  text::LlamaHparams hp;
  hp.n_layer = 2;
  hp.n_head = 2;
  hp.n_head_kv = 2;
  hp.head_dim = 4;
  return hp;
}

}  // namespace

TEST(KvBatch, PromptsAreDistinct) {
  auto ps = prompts();
  ASSERT_EQ(ps.size(), 32u);
  std::sort(ps.begin(), ps.end());
  EXPECT_EQ(std::unique(ps.begin(), ps.end()), ps.end());
}

TEST(KvBatch, ThirtyTwoSequencesBatchedMatchAloneF32) {
  const auto& want = reference(false);
  for (int bt : {1, 4, 16}) {
    int max_rows = 0;
    expect_same(want, run_batched(prompts(), bt, false, 2, &max_rows), "f32, block " + std::to_string(bt));
    EXPECT_GT(max_rows, 32);  // prefill chunks and decodes really shared steps
  }
  expect_same(want, run_batched(prompts(), 4, false, 3), "f32, block 4, 3 threads");
  expect_same(want, run_batched(prompts(), 16, false, 1, nullptr, true), "f32, block 16, publishing");
}

TEST(KvBatch, ThirtyTwoSequencesBatchedMatchAloneF16) {
  const auto& want = reference(true);
  for (int bt : {1, 4, 16}) expect_same(want, run_batched(prompts(), bt, true, 2), "f16, block " + std::to_string(bt));
  // And the F16 cache really is half precision.
  EXPECT_NE(want[5].logits[0], reference(false)[5].logits[0]);
}

TEST(KvBatch, SingleForwardEqualsBatchOfOne) {
  const auto& w = model();
  const auto p = prompts()[20];
  KvCache a(w.hp, 64, KvType::F32);
  KvPool pool(w.hp, 4, KvPool::block_bytes_for(w.hp, 4, KvType::F32) * 16, KvType::F32);
  PagedSeq b(pool);
  ASSERT_TRUE(b.reserve(static_cast<int>(p.size())));
  text::LlamaRunner runner(w, nullptr);
  std::vector<float> la(static_cast<size_t>(w.hp.n_vocab)), lb(la.size());
  runner.forward(p.data(), static_cast<int>(p.size()), 0, a, la.data());
  runner.forward_batch({SeqInput{p.data(), static_cast<int>(p.size()), 0, &b, lb.data()}});
  EXPECT_EQ(la, lb);
}

TEST(KvBatch, BadStepsAreRefusedBeforeComputing) {
  const auto& w = model();
  const std::vector<int32_t> toks = {1, 403, 407};
  KvPool pool(w.hp, 4, KvPool::block_bytes_for(w.hp, 4, KvType::F32) * 4, KvType::F32);
  PagedSeq s(pool);
  text::LlamaRunner runner(w, nullptr);
  // No blocks reserved: capacity 0.
  EXPECT_THROW(runner.forward_batch({SeqInput{toks.data(), 3, 0, &s, nullptr}}), Error);
  ASSERT_TRUE(s.reserve(3));
  EXPECT_EQ(s.capacity(), 4);
  EXPECT_THROW(runner.forward_batch({SeqInput{toks.data(), 3, 2, &s, nullptr}}), Error);
  EXPECT_THROW(runner.forward_batch({SeqInput{toks.data(), 1, 0, &s, nullptr}, SeqInput{toks.data() + 1, 1, 1, &s, nullptr}}),
               Error);
  const std::vector<int32_t> bad = {1, 512};
  EXPECT_THROW(runner.forward_batch({SeqInput{bad.data(), 2, 0, &s, nullptr}}), Error);
  EXPECT_THROW(runner.forward_batch({SeqInput{toks.data(), 1, 0, nullptr, nullptr}}), Error);
  runner.forward_batch({SeqInput{toks.data(), 0, 0, nullptr, nullptr}});  // empty entries are skipped
}

// The GPU's KV types: BF16 2 bytes a value; FP8 MXFP8 blocks (kernels.h:
// 32 E4M3 values and one E8M0 scale, 33 bytes), laid out as Q8_0's
// (element offsets, V one block's rows after K); FP8 needs 32-wide heads.
TEST(KvPool, Bf16AndFp8CachesAreSizedAndLaidOutByTheirBlocks) {
  text::LlamaHparams hp = tiny_hp();
  hp.head_dim = 32;  // 2 layers, 2 kv heads: 64 values a row
  EXPECT_EQ(KvPool::block_bytes_for(hp, 4, KvType::BF16), 2 * 2 * 4 * 64 * 2);
  EXPECT_EQ(KvPool::block_bytes_for(hp, 4, KvType::FP8), 2 * 2 * 4 * 64 / 32 * 33);
  EXPECT_EQ(text::kv_bytes(KvType::FP8, 64), 66);
  EXPECT_EQ(text::kv_bytes(KvType::BF16, 10), 20);
  EXPECT_EQ(text::kv_bytes(KvType::Q8_0, 64), 68);
  for (KvType t : {KvType::BF16, KvType::FP8}) {
    KvPool pool(hp, 4, 3 * KvPool::block_bytes_for(hp, 4, t), t);
    EXPECT_EQ(pool.total_blocks(), 3) << static_cast<int>(t);
    const kernels::KvLayout& l = pool.layout();
    EXPECT_EQ(l.type, t == KvType::BF16 ? kernels::DType::BF16 : kernels::DType::MXFP8);
    EXPECT_EQ(l.row_elems, 64);
    EXPECT_EQ(l.block_tokens, 4);
    EXPECT_EQ(static_cast<const uint8_t*>(l.v) - static_cast<const uint8_t*>(l.k), text::kv_bytes(t, 4 * 64));
    KvCache flat(hp, 10, t);
    EXPECT_EQ(flat.layout().type, l.type);
    EXPECT_EQ(static_cast<const uint8_t*>(flat.layout().v) - static_cast<const uint8_t*>(flat.layout().k),
              text::kv_bytes(t, 2 * 10 * 64));
  }
  hp.head_dim = 8;  // stories260K's heads
  try {
    KvPool(hp, 4, 4096, KvType::FP8);
    ADD_FAILURE() << "an fp8 cache of 8-wide heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp8 KV cache needs a head size that is a multiple of 32"), std::string::npos)
        << e.what();
  }
}

TEST(KvPool, SizedByBudgetAndAccounted) {
  const auto hp = tiny_hp();
  // 2 layers * (K+V) * 4 tokens * 8 values.
  EXPECT_EQ(KvPool::block_bytes_for(hp, 4, KvType::F32), 2 * 2 * 4 * 8 * 4);
  EXPECT_EQ(KvPool::block_bytes_for(hp, 4, KvType::F16), 2 * 2 * 4 * 8 * 2);
  KvPool pool(hp, 4, 5 * 512 + 511, KvType::F32);
  EXPECT_EQ(pool.block_tokens(), 4);
  EXPECT_EQ(pool.block_bytes(), 512);
  EXPECT_EQ(pool.total_blocks(), 5);
  EXPECT_EQ(pool.free_blocks(), 5);
  EXPECT_EQ(KvPool(hp, 4, 5 * 256, KvType::F16).total_blocks(), 5);
  EXPECT_EQ(KvPool(hp, 4, 100, KvType::F32).total_blocks(), 0);
  EXPECT_THROW(KvPool(hp, 0, 4096, KvType::F32), Error);

  std::vector<int> got;
  for (int i = 0; i < 5; ++i) got.push_back(pool.allocate());
  EXPECT_EQ(got, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(pool.free_blocks(), 0);
  EXPECT_EQ(pool.allocate(), -1);
  EXPECT_EQ(pool.ref_count(2), 1);
  pool.retain(2);
  EXPECT_EQ(pool.ref_count(2), 2);
  pool.release(2);
  EXPECT_EQ(pool.free_blocks(), 0);
  pool.release(2);
  EXPECT_EQ(pool.ref_count(2), 0);
  EXPECT_EQ(pool.free_blocks(), 1);
  EXPECT_EQ(pool.cached_blocks(), 0);  // never published: freed, not cached
  EXPECT_EQ(pool.allocate(), 2);
  EXPECT_EQ(pool.allocate(), -1);
  EXPECT_THROW(pool.release(7), Error);
  for (int b : got) pool.release(b);
  EXPECT_EQ(pool.free_blocks(), 5);
  EXPECT_THROW(pool.release(0), Error);  // no reference left
}

// The pool commits its first blocks' pages at construction and, once no
// sequence holds a block, the margin after the highest block allocated
// (kv_cache.cpp: the steps must not fault fresh blocks in). Observed from
// outside with mincore on the pool's memory.
TEST(KvPool, CommitsItsFirstBlocksAtOnceAndTopsUpWhileIdle) {
  text::LlamaHparams hp;
  hp.n_layer = 4;
  hp.n_head = hp.n_head_kv = 2;
  hp.head_dim = 64;
  const int64_t block = KvPool::block_bytes_for(hp, 16, KvType::F32);
  ASSERT_EQ(block, int64_t{64} << 10);  // 4 layers * (K+V) * 16 tokens * 128 floats
  KvPool pool(hp, 16, int64_t{256} << 20, KvType::F32);
  ASSERT_EQ(pool.total_blocks(), 4096);
  const int ahead = pool.commit_ahead_blocks();
  ASSERT_EQ(ahead, 512);  // 32 MiB of 64 KiB blocks
  auto resident = [&](int b) {
    return test::page_mapped(static_cast<const uint8_t*>(pool.layout().k) + static_cast<int64_t>(b) * block);
  };
  {  // Committing ahead needs MADV_POPULATE_WRITE (Linux 5.14).
    const long page = ::sysconf(_SC_PAGESIZE);
    void* probe = ::mmap(nullptr, static_cast<size_t>(page), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(probe, MAP_FAILED);
    const bool can = ::madvise(probe, static_cast<size_t>(page), MADV_POPULATE_WRITE) == 0;
    ::munmap(probe, static_cast<size_t>(page));
    if (!can) GTEST_SKIP() << "this kernel cannot commit pages ahead";
  }
  EXPECT_TRUE(resident(0));
  EXPECT_TRUE(resident(ahead - 1));
  EXPECT_FALSE(resident(ahead + 64));  // 4 MiB past the margin
  std::vector<int> held;
  for (int i = 0; i < 300; ++i) held.push_back(pool.allocate());
  ASSERT_EQ(held.back(), 299);
  // Block 256 took the highest block past half the margin: blocks up to
  // 257 + 512 are due, but not while blocks are held.
  const int due = 257 + ahead;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(resident(due - 64));
  for (int b : held) pool.release(b);
  bool topped = false;
  // The committer is SCHED_IDLE: under `ctest -j2` it may wait for a core.
  for (int i = 0; i < 1200 && !(topped = resident(due - 1)); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(topped) << "the margin after block 256 was not committed within 60 s of the pool going idle";
  EXPECT_FALSE(resident(due + 64));
}

TEST(KvPool, PrefixBlocksAreCachedAndEvictedLeastRecentlyUsedFirst) {
  const auto hp = tiny_hp();
  KvPool pool(hp, 4, 3 * 512, KvType::F32);
  const int32_t ta[4] = {1, 2, 3, 4}, tb[4] = {5, 6, 7, 8}, tc[4] = {9, 10, 11, 12};
  const uint64_t ha = KvPool::chain_hash(0, ta, 4), hb = KvPool::chain_hash(ha, tb, 4), hc = KvPool::chain_hash(0, tc, 4);
  EXPECT_NE(ha, hb);
  EXPECT_NE(KvPool::chain_hash(0, tb, 4), hb);  // the chain covers what comes before
  const int a = pool.allocate(), b = pool.allocate(), c = pool.allocate();
  pool.publish_prefix(a, ha, ta);
  pool.publish_prefix(b, hb, tb);
  pool.publish_prefix(c, hc, tc);
  EXPECT_TRUE(pool.published(a));
  // Another block offering the same prefix is not published over the first.
  EXPECT_EQ(pool.lookup_prefix(ha, ta), a);
  EXPECT_EQ(pool.ref_count(a), 2);
  pool.release(a);
  // A hash match with other tokens is a collision, not a hit.
  const int32_t other[4] = {1, 2, 3, 5};
  EXPECT_EQ(pool.lookup_prefix(ha, other), -1);
  EXPECT_EQ(pool.lookup_prefix(hc ^ 1, tc), -1);

  // Release order b, a, c: b is the least recently used.
  pool.release(b);
  pool.release(a);
  pool.release(c);
  EXPECT_EQ(pool.cached_blocks(), 3);
  EXPECT_EQ(pool.free_blocks(), 3);
  // Using a again makes it in use, then most recent when released.
  EXPECT_EQ(pool.lookup_prefix(ha, ta), a);
  EXPECT_EQ(pool.cached_blocks(), 2);
  EXPECT_EQ(pool.free_blocks(), 2);
  pool.release(a);  // LRU order now: b, c, a
  EXPECT_EQ(pool.allocate(), b);  // evicts b
  EXPECT_FALSE(pool.published(b));
  EXPECT_EQ(pool.lookup_prefix(hb, tb), -1);
  EXPECT_EQ(pool.allocate(), c);
  EXPECT_EQ(pool.cached_blocks(), 1);
  EXPECT_EQ(pool.free_blocks(), 1);
  const int a2 = pool.lookup_prefix(ha, ta);
  EXPECT_EQ(a2, a);
  EXPECT_EQ(pool.allocate(), -1);  // everything in use: nothing to evict
  EXPECT_EQ(pool.prefix_hits(), 3);
  for (int blk : {a, b, c}) pool.release(blk);
  EXPECT_EQ(pool.free_blocks(), 3);
  EXPECT_EQ(pool.cached_blocks(), 1);  // a still holds its prefix
}

TEST(KvPool, PagedSeqReserveRollsBackWhenExhausted) {
  const auto hp = tiny_hp();
  KvPool pool(hp, 4, 3 * 512, KvType::F32);
  {
    PagedSeq s(pool), t(pool);
    ASSERT_TRUE(s.reserve(5));
    EXPECT_EQ(s.blocks().size(), 2u);
    EXPECT_EQ(s.capacity(), 8);
    EXPECT_FALSE(t.reserve(9));  // needs 3, only 1 left
    EXPECT_TRUE(t.blocks().empty());
    EXPECT_EQ(pool.free_blocks(), 1);
    s.release_all();
    EXPECT_EQ(pool.free_blocks(), 3);
    ASSERT_TRUE(t.reserve(9));
  }
  EXPECT_EQ(pool.free_blocks(), 3);  // destructors give blocks back
}

// Sliding windows: whole blocks behind a position go back to the pool (a
// published one to the prefix cache), their table entries stay as
// kReleased so later positions keep their block index, and nothing is given
// back twice.
TEST(KvPool, ReleaseBeforeGivesBackOnlyWholeBlocksBehindThePosition) {
  const auto hp = tiny_hp();
  KvPool pool(hp, 4, 3 * 512, KvType::F32);
  const std::vector<int32_t> toks = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  {
    PagedSeq s(pool);
    ASSERT_TRUE(s.reserve(8));
    s.publish(toks.data(), 8);
    const int first = s.blocks()[0], second = s.blocks()[1];
    EXPECT_EQ(s.release_before(3), 0);  // position 3 is still in block 0
    EXPECT_EQ(s.release_before(4), 1);
    EXPECT_EQ(s.blocks()[0], PagedSeq::kReleased);
    EXPECT_EQ(s.blocks()[1], second);
    EXPECT_EQ(pool.ref_count(first), 0);
    EXPECT_TRUE(pool.published(first));  // kept for prefix reuse
    EXPECT_EQ(pool.cached_blocks(), 1);
    EXPECT_EQ(pool.free_blocks(), 2);
    EXPECT_EQ(s.capacity(), 8);                 // positions keep their indices
    ASSERT_TRUE(s.reserve(12));                 // one new block, not two
    EXPECT_EQ(s.blocks().size(), 3u);
    EXPECT_EQ(s.store_slot(9), s.blocks()[2] * 4 + 1);
    EXPECT_EQ(pool.free_blocks(), 1);
    s.publish(toks.data(), 12);                 // skips the released entry
    EXPECT_EQ(s.release_before(4), 0);          // nothing twice
    EXPECT_EQ(s.release_before(100), 2);        // never past the table
    EXPECT_EQ(pool.free_blocks(), 3);
  }  // the destructor releases nothing more (a second release would throw)
  EXPECT_EQ(pool.free_blocks(), 3);
  EXPECT_EQ(pool.cached_blocks(), 3);
}

TEST(KvPool, ReleasedPrefixIsEvictedFromItsTail) {
  const auto hp = tiny_hp();
  KvPool pool(hp, 4, 3 * 512, KvType::F32);
  const std::vector<int32_t> toks = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  int first = -1, second = -1;
  {
    PagedSeq s(pool);
    ASSERT_TRUE(s.reserve(9));
    s.publish(toks.data(), 9);  // 2 full blocks published, the third is partial
    first = s.blocks()[0];
    second = s.blocks()[1];
    EXPECT_TRUE(pool.published(first));
    EXPECT_TRUE(pool.published(second));
    EXPECT_FALSE(pool.published(s.blocks()[2]));
  }
  EXPECT_EQ(pool.cached_blocks(), 2);
  EXPECT_EQ(pool.free_blocks(), 3);
  const int fresh = pool.allocate();       // the unpublished block, from the free list
  EXPECT_EQ(pool.allocate(), second);      // then the tail of the prefix
  PagedSeq t(pool);
  EXPECT_EQ(t.attach_prefix(toks.data(), 8), 4);  // its head is still there
  EXPECT_EQ(t.blocks()[0], first);
  pool.release(fresh);
  pool.release(second);
}

// Two sequences with a common 40-token prefix share its full blocks; the
// second one's outputs equal its unshared run bit for bit.
TEST(KvBatch, PrefixSharingKeepsOutputs) {
  const auto& w = model();
  const auto g = golden();
  for (bool f16 : {false, true}) {
    SCOPED_TRACE(f16 ? "f16" : "f32");
    std::vector<int32_t> pa(g.begin(), g.begin() + 40), pb = pa;
    pa.insert(pa.end(), g.begin() + 50, g.begin() + 55);
    pb.insert(pb.end(), g.begin() + 55, g.begin() + 61);
    const int bt = 16;
    KvPool pool(w.hp, bt, KvPool::block_bytes_for(w.hp, bt, (f16 ? KvType::F16 : KvType::F32)) * 64, (f16 ? KvType::F16 : KvType::F32));
    ThreadPool threads(2);
    text::LlamaRunner runner(w, &threads);

    // Generate with a paged sequence, publishing full blocks as they fill.
    auto generate = [&](PagedSeq& seq, std::vector<int32_t> toks, int from) {
      Stream s;
      std::vector<float> logits(static_cast<size_t>(w.hp.n_vocab));
      const int n_prompt = static_cast<int>(toks.size());
      EXPECT_TRUE(seq.reserve(n_prompt));
      runner.forward(toks.data() + from, n_prompt - from, from, seq, logits.data());
      seq.publish(toks.data(), n_prompt);
      for (int pos = n_prompt;; ++pos) {
        const int32_t id = argmax(logits);
        s.tokens.push_back(id);
        s.logits.push_back(logits);
        toks.push_back(id);
        if (static_cast<int>(s.tokens.size()) == kGen) break;
        EXPECT_TRUE(seq.reserve(pos + 1));
        runner.forward(&id, 1, pos, seq, logits.data());
        seq.publish(toks.data(), pos + 1);
      }
      return s;
    };

    PagedSeq a(pool), b(pool);
    const Stream sa = generate(a, pa, 0);
    expect_same({run_alone(pa, f16)}, {sa}, "a");
    EXPECT_EQ(b.attach_prefix(pb.data(), static_cast<int>(pb.size()) - 1), 32);  // 2 full blocks of the 40 common tokens
    ASSERT_EQ(b.blocks().size(), 2u);
    EXPECT_EQ(b.blocks()[0], a.blocks()[0]);
    EXPECT_EQ(b.blocks()[1], a.blocks()[1]);
    EXPECT_EQ(pool.ref_count(a.blocks()[0]), 2);
    EXPECT_EQ(pool.ref_count(a.blocks()[1]), 2);
    EXPECT_EQ(pool.ref_count(a.blocks()[2]), 1);  // positions 32..47 differ after 40
    const int used_before = pool.used_blocks();
    const Stream sb = generate(b, pb, 32);
    expect_same({run_alone(pb, f16)}, {sb}, "b shared");
    EXPECT_NE(b.blocks()[2], a.blocks()[2]);
    // b needed only blocks for positions 32.. (46 + 19 = 65 positions: 5 blocks, 2 shared).
    EXPECT_EQ(pool.used_blocks() - used_before, 3);

    // After both end, the published blocks stay cached and serve a third
    // sequence: b's whole token stream as a prompt reuses 3 full blocks + more.
    std::vector<int32_t> pc = pb;
    pc.insert(pc.end(), sb.tokens.begin(), sb.tokens.end() - 1);  // exactly what b stored
    a.release_all();
    b.release_all();
    EXPECT_EQ(pool.free_blocks(), pool.total_blocks());
    EXPECT_GE(pool.cached_blocks(), 6);
    PagedSeq c(pool);
    const int covered = c.attach_prefix(pc.data(), static_cast<int>(pc.size()) - 1);
    EXPECT_EQ(covered, 64);  // 65 positions stored by b: 4 full blocks, last token recomputed
    const Stream sc = generate(c, pc, covered);
    expect_same({run_alone(pc, f16)}, {sc}, "c from cache");
    // Recomputing over shared blocks (here from position 0) leaves them as
    // they are (writes into published blocks are skipped) and changes nothing.
    PagedSeq d(pool);
    EXPECT_EQ(d.attach_prefix(pc.data(), static_cast<int>(pc.size()) - 1), 64);
    EXPECT_EQ(pool.ref_count(d.blocks()[0]), 2);
    expect_same({sc}, {generate(d, pc, 0)}, "d recomputed over shared blocks");
  }
}

// Issue 14 mutant: a chain hash that ignores the first token of each block.
// Two prompts whose first blocks differ only in their first token and whose
// second blocks are equal: the second sequence must not find the first one's
// second block (its K/V were computed after another prefix).
TEST(KvPool, TheSameBlockAfterADifferentPrefixIsNotShared) {
  const auto hp = tiny_hp();
  for (int i = 0; i < 4; ++i) {  // each position of a block counts, the first one too
    int32_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 4};
    b[i] = 9;
    EXPECT_NE(KvPool::chain_hash(0, a, 4), KvPool::chain_hash(0, b, 4)) << "position " << i;
    EXPECT_NE(KvPool::chain_hash(7, a, 4), KvPool::chain_hash(7, b, 4)) << "position " << i;
  }
  KvPool pool(hp, 4, 8 * 512, KvType::F32);
  const std::vector<int32_t> first = {1, 2, 3, 4, 5, 6, 7, 8, 9}, second = {100, 2, 3, 4, 5, 6, 7, 8, 9};
  PagedSeq s1(pool);
  ASSERT_TRUE(s1.reserve(9));
  s1.publish(first.data(), 8);
  PagedSeq s2(pool);
  EXPECT_EQ(s2.attach_prefix(second.data(), 8), 0) << "shared a block computed after another prefix";
  PagedSeq s3(pool);
  EXPECT_EQ(s3.attach_prefix(first.data(), 8), 8);  // the same prefix is shared
}
