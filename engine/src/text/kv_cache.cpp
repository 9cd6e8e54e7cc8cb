#include "text/kv_cache.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include "core/error.h"
#include "text/llama.h"

namespace atelier::text {

// ---------------------------------------------------------------- contiguous cache

KvCache::KvCache(const LlamaHparams& hp, int n_ctx, bool f16)
    : n_ctx_(n_ctx), row_(hp.n_head_kv * hp.head_dim), n_layer_(hp.n_layer), f16_(f16) {
  const size_t n = static_cast<size_t>(n_layer_) * static_cast<size_t>(n_ctx_) * static_cast<size_t>(row_);
  if (f16_) {
    k16_.resize(n);
    v16_.resize(n);
  } else {
    k32_.resize(n);
    v32_.resize(n);
  }
}

void KvCache::store(int layer, int pos, const float* k, const float* v) {
  const size_t off = (static_cast<size_t>(layer) * n_ctx_ + static_cast<size_t>(pos)) * row_;
  if (f16_) {
    kernels::f32_to_fp16_row(k, k16_.data() + off, row_);
    kernels::f32_to_fp16_row(v, v16_.data() + off, row_);
  } else {
    std::memcpy(k32_.data() + off, k, sizeof(float) * static_cast<size_t>(row_));
    std::memcpy(v32_.data() + off, v, sizeof(float) * static_cast<size_t>(row_));
  }
}

const void* KvCache::k_row(int layer, int pos) const {
  const size_t off = (static_cast<size_t>(layer) * n_ctx_ + static_cast<size_t>(pos)) * row_;
  return f16_ ? static_cast<const void*>(k16_.data() + off) : static_cast<const void*>(k32_.data() + off);
}

const void* KvCache::v_row(int layer, int pos) const {
  const size_t off = (static_cast<size_t>(layer) * n_ctx_ + static_cast<size_t>(pos)) * row_;
  return f16_ ? static_cast<const void*>(v16_.data() + off) : static_cast<const void*>(v32_.data() + off);
}

KvSeq::Run KvCache::run(int layer, int pos) const {
  return Run{k_row(layer, pos), v_row(layer, pos), n_ctx_ - pos, row_};
}

// ---------------------------------------------------------------- block pool

int64_t KvPool::block_bytes_for(const LlamaHparams& hp, int block_tokens, bool f16) {
  return int64_t{hp.n_layer} * 2 * block_tokens * hp.n_head_kv * hp.head_dim *
         static_cast<int64_t>(f16 ? sizeof(uint16_t) : sizeof(float));
}

KvPool::KvPool(const LlamaHparams& hp, int block_tokens, int64_t budget_bytes, bool f16)
    : block_tokens_(block_tokens), n_layer_(hp.n_layer), row_(hp.n_head_kv * hp.head_dim), f16_(f16) {
  if (block_tokens < 1)
    throw Error("the KV block size must be at least 1 token (got " + std::to_string(block_tokens) + ")");
  if (budget_bytes < 0) throw Error("the KV memory budget must not be negative");
  if (n_layer_ < 1 || row_ < 1) throw Error("the model has no key/value rows to cache");
  block_bytes_ = block_bytes_for(hp, block_tokens, f16);
  total_ = static_cast<int>(std::min<int64_t>(budget_bytes / block_bytes_, INT_MAX / 2));
  const size_t elems = static_cast<size_t>(total_) * static_cast<size_t>(n_layer_) * 2 *
                       static_cast<size_t>(block_tokens_) * static_cast<size_t>(row_);
  // Uninitialised on purpose: a pool of a GiB costs nothing until its blocks
  // are written (pages are committed on first touch), and every position is
  // stored before it is read.
  if (f16_) data16_.reset(new uint16_t[elems]);
  else data32_.reset(new float[elems]);
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
}

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
  return b;
}

void KvPool::retain(int block) {
  check(block);
  int& r = ref_[static_cast<size_t>(block)];
  if (r == 0) {
    if (!has_hash_[static_cast<size_t>(block)]) throw Error("retain of free KV block " + std::to_string(block));
    lru_unlink(block);  // a cached block is in use again
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

size_t KvPool::row_offset(int block, int layer, int kv, int slot) const {
  return (((static_cast<size_t>(block) * static_cast<size_t>(n_layer_) + static_cast<size_t>(layer)) * 2 +
           static_cast<size_t>(kv)) * static_cast<size_t>(block_tokens_) + static_cast<size_t>(slot)) *
         static_cast<size_t>(row_);
}

void* KvPool::k_row(int block, int layer, int slot) {
  const size_t off = row_offset(block, layer, 0, slot);
  return f16_ ? static_cast<void*>(data16_.get() + off) : static_cast<void*>(data32_.get() + off);
}

void* KvPool::v_row(int block, int layer, int slot) {
  const size_t off = row_offset(block, layer, 1, slot);
  return f16_ ? static_cast<void*>(data16_.get() + off) : static_cast<void*>(data32_.get() + off);
}

const void* KvPool::k_row(int block, int layer, int slot) const {
  return const_cast<KvPool*>(this)->k_row(block, layer, slot);
}

const void* KvPool::v_row(int block, int layer, int slot) const {
  return const_cast<KvPool*>(this)->v_row(block, layer, slot);
}

// ---------------------------------------------------------------- paged sequence

PagedSeq::PagedSeq(KvPool& pool) : pool_(pool) {}

PagedSeq::~PagedSeq() { release_all(); }

void PagedSeq::release_all() {
  // Last block first: in the LRU order of cached prefix blocks the tail of a
  // prefix is then evicted before its head, which keeps the head reusable.
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) pool_.release(*it);
  blocks_.clear();
  hashes_.clear();
}

void PagedSeq::store(int layer, int pos, const float* k, const float* v) {
  const int bt = pool_.block_tokens();
  const int b = blocks_[static_cast<size_t>(pos / bt)], slot = pos % bt;
  if (pool_.published(b)) return;  // shared and immutable: already holds these values
  const int n = pool_.row_elems();
  if (pool_.f16()) {
    kernels::f32_to_fp16_row(k, static_cast<uint16_t*>(pool_.k_row(b, layer, slot)), n);
    kernels::f32_to_fp16_row(v, static_cast<uint16_t*>(pool_.v_row(b, layer, slot)), n);
  } else {
    std::memcpy(pool_.k_row(b, layer, slot), k, sizeof(float) * static_cast<size_t>(n));
    std::memcpy(pool_.v_row(b, layer, slot), v, sizeof(float) * static_cast<size_t>(n));
  }
}

const void* PagedSeq::k_row(int layer, int pos) const {
  const int bt = pool_.block_tokens();
  return static_cast<const KvPool&>(pool_).k_row(blocks_[static_cast<size_t>(pos / bt)], layer, pos % bt);
}

const void* PagedSeq::v_row(int layer, int pos) const {
  const int bt = pool_.block_tokens();
  return static_cast<const KvPool&>(pool_).v_row(blocks_[static_cast<size_t>(pos / bt)], layer, pos % bt);
}

KvSeq::Run PagedSeq::run(int layer, int pos) const {
  // A block's rows of one layer (K, then V) are row_elems apart (KvPool::row_offset).
  const int bt = pool_.block_tokens();
  return Run{k_row(layer, pos), v_row(layer, pos), bt - pos % bt, pool_.row_elems()};
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
    pool_.publish_prefix(blocks_[i], h, t);
    hashes_.push_back(h);
  }
}

}  // namespace atelier::text
