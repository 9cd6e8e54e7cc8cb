#include "text/kv_cache.h"

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <pthread.h>
#include <sched.h>
#include <thread>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "text/llama.h"

namespace atelier::text {

// ---------------------------------------------------------------- contiguous cache

int64_t kv_bytes(KvType type, int64_t n) {
  switch (type) {
    case KvType::F32: return 4 * n;
    case KvType::F16: return 2 * n;
    case KvType::Q8_0: return n / kernels::kQ8BlockElems * kernels::kQ8BlockBytes;
    case KvType::BF16: return 2 * n;
    case KvType::FP8: return n / kernels::kMxfp8BlockElems * kernels::kMxfp8BlockBytes;  // MXFP8: 33 bytes per 32
  }
  return 4 * n;
}

void check_kv_type(const LlamaHparams& hp, KvType type) {
  if ((type == KvType::Q8_0 || type == KvType::FP8) && hp.head_dim % kernels::kQ8BlockElems != 0)
    throw Error(std::string("the ") + (type == KvType::Q8_0 ? "q8_0" : "fp8") +
                " KV cache needs a head size that is a multiple of 32, and this model's is " +
                std::to_string(hp.head_dim) + "; use the f16 KV cache for it");
}

namespace {
kernels::DType kv_dtype(KvType type) {
  switch (type) {
    case KvType::F32: return kernels::DType::F32;
    case KvType::F16: return kernels::DType::F16;
    case KvType::Q8_0: return kernels::DType::Q8_0;
    case KvType::BF16: return kernels::DType::BF16;
    case KvType::FP8: return kernels::DType::MXFP8;
  }
  return kernels::DType::F16;
}
}  // namespace

KvCache::KvCache(const LlamaHparams& hp, int n_ctx, KvType type, kernels::Backend& backend) : n_ctx_(n_ctx) {
  check_kv_type(hp, type);
  const int64_t row = int64_t{hp.n_head_kv} * hp.head_dim, per_kv = int64_t{hp.n_layer} * n_ctx_ * row;
  data_ = backend.alloc(2 * kv_bytes(type, per_kv));
  backend.clear(*data_);  // a per-sequence cache is small: commit its pages now, not in the first step
  layout_.type = kv_dtype(type);
  layout_.k = data_->data();
  layout_.v = data_->at<uint8_t>(kv_bytes(type, per_kv));
  layout_.row_elems = row;
  layout_.block_tokens = std::max(n_ctx_, 1);  // one block holding the whole context
  layout_.block_stride_elems = 0;
  layout_.layer_stride_elems = int64_t{n_ctx_} * row;
}

// ---------------------------------------------------------------- block pool

// The pool's buffer is committed lazily (a GiB costs nothing until used),
// and a block's first write used to fault its pages in inside a step: when
// 16 sequences crossed a block boundary together, the 110M model's steps
// went from 12 to 20-50 ms (2 MiB page faults on a VM took 0.2-5 ms each,
// and the other thread waited on the faulting one). This thread commits the
// pages of the blocks after the highest one allocated so far (fresh pools
// hand out the lowest ids first) while no sequence holds a block, so that a
// step writes into resident memory: the pool commits its first margin at
// load, and tops it up in the engine's idle moments. (Top-ups while 16
// sequences stepped, even at SCHED_IDLE, put the 20-70 ms steps back.) A
// pool that never idles faults its fresh blocks in as before. Commits never
// change the bytes, so a chunk that overlaps a step is harmless.
class KvPool::Committer {
 public:
  // Blocks [0, committed) are resident already.
  Committer(kernels::Backend& backend, kernels::Buffer& buffer, int64_t block_bytes, int committed)
      : backend_(backend), buffer_(buffer), block_bytes_(block_bytes), wanted_(committed), done_(committed * block_bytes) {
    thread_ = std::thread([this] { run(); });
  }
  ~Committer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  Committer(const Committer&) = delete;
  Committer& operator=(const Committer&) = delete;

  // Whether some sequence holds a block (then nothing is committed).
  void set_busy(bool busy) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (busy == busy_) return;
      busy_ = busy;
    }
    if (!busy) cv_.notify_one();
  }

  // Blocks [0, blocks) committed, once the pool is idle (BLOCKS <= the pool's total).
  void want(int blocks) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (blocks <= wanted_) return;
      wanted_ = blocks;
    }
    cv_.notify_one();
  }

 private:
  void run() {
#if defined(__linux__)
    // Only when a core would otherwise idle: a commit while both cores step
    // takes the time from the step it was meant to spare.
    sched_param none{};
    ::pthread_setschedparam(::pthread_self(), SCHED_IDLE, &none);
#endif
    constexpr int64_t kChunk = int64_t{2} << 20;  // one huge page per call: short calls, stop stays prompt
    int64_t done = done_;                          // bytes committed
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || (!busy_ && wanted_ * block_bytes_ > done); });
      if (stop_) return;
      const int64_t target = wanted_ * block_bytes_;
      lock.unlock();
      bool ok = true, go = true;
      while (ok && go && done < target) {
        const int64_t n = std::min(kChunk - done % kChunk, target - done);
        ok = backend_.commit(buffer_, done, n);
        done += n;
        std::lock_guard<std::mutex> check(mu_);
        if (stop_) return;
        go = !busy_;
      }
      lock.lock();
      if (!ok) return;  // the device cannot: first touch commits, as without this thread
    }
  }

  kernels::Backend& backend_;
  kernels::Buffer& buffer_;
  const int64_t block_bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  int wanted_;
  const int64_t done_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

int64_t KvPool::block_bytes_for(const LlamaHparams& hp, int block_tokens, KvType type) {
  return kv_bytes(type, int64_t{hp.n_layer} * 2 * block_tokens * hp.n_head_kv * hp.head_dim);
}

KvPool::KvPool(const LlamaHparams& hp, int block_tokens, int64_t budget_bytes, KvType type, kernels::Backend& backend)
    : block_tokens_(block_tokens), n_layer_(hp.n_layer), row_(hp.n_head_kv * hp.head_dim), type_(type) {
  if (block_tokens < 1)
    throw Error("the KV block size must be at least 1 token (got " + std::to_string(block_tokens) + ")");
  if (budget_bytes < 0) throw Error("the KV memory budget must not be negative");
  if (n_layer_ < 1 || row_ < 1) throw Error("the model has no key/value rows to cache");
  check_kv_type(hp, type);
  block_bytes_ = block_bytes_for(hp, block_tokens, type);
  // Slots (block * block_tokens + offset) are int32 on the device.
  total_ = static_cast<int>(std::min<int64_t>(budget_bytes / block_bytes_, INT_MAX / 2 / block_tokens));
  const size_t elems = static_cast<size_t>(total_) * static_cast<size_t>(n_layer_) * 2 *
                       static_cast<size_t>(block_tokens_) * static_cast<size_t>(row_);
  // Uninitialised on purpose: a pool of a GiB costs nothing until its blocks
  // are written (pages are committed on first touch), and every position is
  // stored before it is read.
  data_ = backend.alloc(kv_bytes(type_, static_cast<int64_t>(elems)));
  // Per block, per layer: block_tokens K rows, then block_tokens V rows.
  layout_.type = kv_dtype(type_);
  layout_.k = data_->data();
  layout_.v = data_->at<uint8_t>(kv_bytes(type_, int64_t{block_tokens_} * row_));
  layout_.row_elems = row_;
  layout_.block_tokens = block_tokens_;
  layout_.layer_stride_elems = 2 * int64_t{block_tokens_} * row_;
  layout_.block_stride_elems = int64_t{n_layer_} * layout_.layer_stride_elems;
  const size_t nb = static_cast<size_t>(total_);
  ref_.assign(nb, 0);
  free_.reserve(nb);
  for (int b = total_ - 1; b >= 0; --b) free_.push_back(b);
  has_hash_.assign(nb, 0);
  hash_.assign(nb, 0);
  tokens_.assign(nb * static_cast<size_t>(block_tokens_), 0);
  by_hash_.reserve(nb);
  prev_.assign(nb, -1);
  next_.assign(nb, -1);
  // Ahead: up to 512 blocks (8192 positions at 16 a block) and 256 MiB, so
  // that the pages are mostly committed while the engine is idle, not while
  // steps want both cores.
  commit_ahead_ = static_cast<int>(std::min<int64_t>({int64_t{512}, std::max<int64_t>(1, (int64_t{256} << 20) / block_bytes_), total_}));
  if (total_ > 0) {
    // The first margin now, at load: the first requests never fault.
    wanted_ = commit_ahead_;
    backend.commit(*data_, 0, int64_t{wanted_} * block_bytes_);
    committer_ = std::make_unique<Committer>(backend, *data_, block_bytes_, wanted_);
  }
}

KvPool::~KvPool() = default;

void KvPool::check(int block) const {
  if (block < 0 || block >= total_)
    throw Error("KV block " + std::to_string(block) + " is outside the pool (0.." + std::to_string(total_ - 1) + ")");
}

int KvPool::ref_count(int block) const {
  check(block);
  return ref_[static_cast<size_t>(block)];
}

bool KvPool::published(int block) const {
  check(block);
  return has_hash_[static_cast<size_t>(block)] != 0;
}

void KvPool::lru_unlink(int b) {
  const size_t i = static_cast<size_t>(b);
  if (prev_[i] >= 0) next_[static_cast<size_t>(prev_[i])] = next_[i];
  else head_ = next_[i];
  if (next_[i] >= 0) prev_[static_cast<size_t>(next_[i])] = prev_[i];
  else tail_ = prev_[i];
  prev_[i] = next_[i] = -1;
  --cached_;
}

void KvPool::lru_push_back(int b) {
  const size_t i = static_cast<size_t>(b);
  prev_[i] = tail_;
  next_[i] = -1;
  if (tail_ >= 0) next_[static_cast<size_t>(tail_)] = b;
  else head_ = b;
  tail_ = b;
  ++cached_;
}

void KvPool::unpublish(int b) {
  const size_t i = static_cast<size_t>(b);
  if (!has_hash_[i]) return;
  auto it = by_hash_.find(hash_[i]);
  if (it != by_hash_.end() && it->second == b) by_hash_.erase(it);
  has_hash_[i] = 0;
}

int KvPool::allocate() {
  int b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (head_ >= 0) {
    b = head_;  // evict the least recently used cached prefix block
    lru_unlink(b);
    unpublish(b);
  } else {
    return -1;
  }
  ref_[static_cast<size_t>(b)] = 1;
  note_use();
  if (b >= high_) {
    high_ = b + 1;
    // Topped up in one go once half the margin is used, not block by block.
    if (committer_ && high_ + commit_ahead_ / 2 > wanted_) {
      wanted_ = std::min(total_, high_ + commit_ahead_);
      committer_->want(wanted_);
    }
  }
  return b;
}

void KvPool::retain(int block) {
  check(block);
  int& r = ref_[static_cast<size_t>(block)];
  if (r == 0) {
    if (!has_hash_[static_cast<size_t>(block)]) throw Error("retain of free KV block " + std::to_string(block));
    lru_unlink(block);  // a cached block is in use again
    note_use();
  }
  ++r;
}

void KvPool::release(int block) {
  check(block);
  int& r = ref_[static_cast<size_t>(block)];
  if (r <= 0) throw Error("release of KV block " + std::to_string(block) + " that holds no reference");
  if (--r > 0) return;
  if (has_hash_[static_cast<size_t>(block)]) lru_push_back(block);
  else free_.push_back(block);
  note_use();
}

void KvPool::note_use() {
  if (committer_) committer_->set_busy(used_blocks() > 0);
}

uint64_t KvPool::chain_hash(uint64_t previous, const int32_t* tokens, int n) {
  // splitmix64 finalizer over (state + token), seeded with the previous hash.
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  uint64_t h = mix(previous ^ 0x6a09e667f3bcc909ULL);
  for (int i = 0; i < n; ++i) h = mix(h + 0x9e3779b97f4a7c15ULL + static_cast<uint32_t>(tokens[i]));
  return mix(h ^ static_cast<uint64_t>(static_cast<uint32_t>(n)));
}

int KvPool::lookup_prefix(uint64_t chain_hash, const int32_t* block_tokens_ids) {
  ++lookups_;
  auto it = by_hash_.find(chain_hash);
  if (it == by_hash_.end()) return -1;
  const int b = it->second;
  const int32_t* stored = tokens_.data() + static_cast<size_t>(b) * static_cast<size_t>(block_tokens_);
  if (std::memcmp(stored, block_tokens_ids, sizeof(int32_t) * static_cast<size_t>(block_tokens_)) != 0) return -1;
  retain(b);
  ++hits_;
  return b;
}

void KvPool::publish_prefix(int block, uint64_t chain_hash, const int32_t* block_tokens_ids) {
  check(block);
  const size_t i = static_cast<size_t>(block);
  if (ref_[i] <= 0) throw Error("publish of KV block " + std::to_string(block) + " that holds no reference");
  if (has_hash_[i]) return;
  if (!by_hash_.emplace(chain_hash, block).second) return;  // another block holds this prefix
  has_hash_[i] = 1;
  hash_[i] = chain_hash;
  std::memcpy(tokens_.data() + i * static_cast<size_t>(block_tokens_), block_tokens_ids,
              sizeof(int32_t) * static_cast<size_t>(block_tokens_));
}

// ---------------------------------------------------------------- paged sequence

PagedSeq::PagedSeq(KvPool& pool) : pool_(pool) {}

PagedSeq::~PagedSeq() { release_all(); }

void PagedSeq::release_all() {
  // Last block first: in the LRU order of cached prefix blocks the tail of a
  // prefix is then evicted before its head, which keeps the head reusable.
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it)
    if (*it != kReleased) pool_.release(*it);
  blocks_.clear();
  hashes_.clear();
  released_ = 0;
}

int PagedSeq::release_before(int pos) {
  const size_t upto = std::min(blocks_.size(), static_cast<size_t>(std::max(0, pos) / pool_.block_tokens()));
  const int before = static_cast<int>(released_);
  // Oldest first, the only order a moving window allows.
  for (; released_ < upto; ++released_) {
    pool_.release(blocks_[released_]);
    blocks_[released_] = kReleased;
  }
  return static_cast<int>(released_) - before;
}

int32_t PagedSeq::store_slot(int pos) const {
  const int bt = pool_.block_tokens();
  const int b = blocks_[static_cast<size_t>(pos / bt)];
  return pool_.published(b) ? -1 : b * bt + pos % bt;
}

int PagedSeq::blocks_for(int n_positions) const {
  const int bt = pool_.block_tokens();
  return n_positions <= 0 ? 0 : (n_positions + bt - 1) / bt;
}

bool PagedSeq::reserve(int n_positions) {
  const size_t had = blocks_.size();
  while (capacity() < n_positions) {
    const int b = pool_.allocate();
    if (b < 0) {
      while (blocks_.size() > had) {
        pool_.release(blocks_.back());
        blocks_.pop_back();
      }
      return false;
    }
    blocks_.push_back(b);
  }
  return true;
}

int PagedSeq::attach_prefix(const int32_t* tokens, int n) {
  if (!blocks_.empty()) throw Error("attach_prefix needs an empty block table");
  hashes_.clear();
  const int bt = pool_.block_tokens();
  uint64_t h = 0;
  for (int i = 0; (i + 1) * bt <= n; ++i) {
    const int32_t* t = tokens + static_cast<size_t>(i) * static_cast<size_t>(bt);
    h = KvPool::chain_hash(h, t, bt);
    const int b = pool_.lookup_prefix(h, t);
    if (b < 0) break;
    blocks_.push_back(b);
    hashes_.push_back(h);
  }
  return static_cast<int>(blocks_.size()) * bt;
}

void PagedSeq::publish(const int32_t* tokens, int n_stored) {
  const int bt = pool_.block_tokens();
  const size_t full = static_cast<size_t>(std::min(n_stored, capacity()) / bt);
  if (hashes_.size() > full) hashes_.resize(full);
  while (hashes_.size() < full) {
    const size_t i = hashes_.size();
    const int32_t* t = tokens + i * static_cast<size_t>(bt);
    const uint64_t h = KvPool::chain_hash(i == 0 ? 0 : hashes_.back(), t, bt);
    if (blocks_[i] != kReleased) pool_.publish_prefix(blocks_[i], h, t);
    hashes_.push_back(h);
  }
}

}  // namespace atelier::text
