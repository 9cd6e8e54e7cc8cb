// Key/value memory of the LLaMA decoder: what attention reads and writes.
//
//   KvSeq     the interface attention needs from one sequence's cache.
//   KvCache   a contiguous cache of n_ctx positions (one sequence, one owner).
//   KvPool    fixed-size blocks of block_tokens positions (every layer, K and
//             V) carved once from a byte budget; reference-counted, with a
//             prefix cache (blocks published under a chain hash of all tokens
//             from position 0 to the block's end) kept in LRU order once no
//             sequence uses them.
//   PagedSeq  one sequence's block table over a pool.
//
// Rows are n_head_kv*head_dim values: floats (F32), fp16 (F16) or GGML's
// Q8_0 blocks (Q8_0, kernels::KvLayout says how they are addressed).
// The bookkeeping (block ids, reference counts, prefix hashes, LRU) lives on
// the host; the rows themselves live in one backend buffer per pool or cache
// (kernels::KvLayout says where), written by the backend's store_kv and read
// by its paged_attention, so the decoder never touches a row itself.
// None of these classes is thread-safe: the executor thread that runs the
// forward pass owns the pool, its sequences and their block tables. (A
// pool's one helper thread only commits pages ahead of the blocks in use.)
#pragma once

#include <atelier/backend.h>
#include <atelier/requests.h>

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <memory>
#include <vector>

namespace atelier::text {

struct LlamaHparams;

// What the decoder needs from a sequence's cache, contiguous or paged: where
// the storage is, a slot per position to write, and a block table to read.
class KvSeq {
 public:
  virtual ~KvSeq() = default;
  virtual int capacity() const = 0;  // positions that can be stored now
  // The storage this sequence's rows live in (shared by the sequences of one pool).
  virtual const kernels::KvLayout& layout() const = 0;
  // The slot position pos is written to, or -1 when it must not be written
  // (a published, shared block already holds the same values). pos < capacity().
  virtual int32_t store_slot(int pos) const = 0;
  // Block ids in position order over layout(): position p is in block
  // block_table()[p / layout().block_tokens]. A contiguous cache is one block.
  virtual const int32_t* block_table() const = 0;
  virtual int n_blocks() const = 0;
};

// Per-sequence contiguous cache: for each layer, n_ctx rows of n_head_kv*head_dim.
class KvCache final : public KvSeq {
 public:
  // The rows in one buffer of `backend` (K of every layer, then V).
  KvCache(const LlamaHparams& hp, int n_ctx, KvType type, kernels::Backend& backend = kernels::default_cpu_backend());
  int n_ctx() const { return n_ctx_; }
  int capacity() const override { return n_ctx_; }
  const kernels::KvLayout& layout() const override { return layout_; }
  int32_t store_slot(int pos) const override { return pos; }
  const int32_t* block_table() const override { return &block0_; }
  int n_blocks() const override { return 1; }

 private:
  int n_ctx_;
  std::unique_ptr<kernels::Buffer> data_;
  kernels::KvLayout layout_;
  int32_t block0_ = 0;
};

// Fixed-size blocks of block_tokens positions (all layers, K and V) from one
// pool, sized by a byte budget: budget_bytes / block_bytes() blocks, allocated
// once. A block is in one of three states:
//   free     on the free list;
//   in use   refcount > 0 (held by one or more block tables);
//   cached   refcount 0 but published under a prefix hash: kept for reuse in
//            LRU order, counted as free (allocate() evicts the least recently
//            released one when the free list is empty).
class KvPool {
 public:
  // Throws atelier::Error for block_tokens < 1 or a negative budget. A budget
  // smaller than one block gives a pool of 0 blocks (every allocate() fails).
  // The rows in one buffer of `backend`.
  KvPool(const LlamaHparams& hp, int block_tokens, int64_t budget_bytes, KvType type,
         kernels::Backend& backend = kernels::default_cpu_backend());
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;
  ~KvPool();

  // Bytes of one block for these hyperparameters (for admission and sizing).
  static int64_t block_bytes_for(const LlamaHparams& hp, int block_tokens, KvType type);

  KvType type() const { return type_; }
  int block_tokens() const { return block_tokens_; }
  int total_blocks() const { return total_; }
  // Free now, counting cached-but-unreferenced prefix blocks as free (they are evictable).
  int free_blocks() const { return static_cast<int>(free_.size()) + cached_; }
  int64_t block_bytes() const { return block_bytes_; }
  int cached_blocks() const { return cached_; }  // unreferenced blocks kept for prefix reuse
  int used_blocks() const { return total_ - free_blocks(); }  // referenced by some sequence
  int ref_count(int block) const;
  bool published(int block) const;  // holds a published prefix (its contents are immutable)

  // Reference-counted blocks. allocate() returns a block with refcount 1, or
  // -1 when nothing is free even after evicting the least recently used
  // cached prefix block. Lowest ids first from a fresh pool.
  int allocate();
  void retain(int block);
  // At refcount 0 a block with a published prefix hash stays cached (LRU), else it is freed.
  void release(int block);

  // Prefix sharing. chain_hash covers ALL tokens from position 0 through the
  // end of a FULL block; the block's own tokens are stored and compared too.
  // lookup_prefix: -1 or a block id, retained for the caller (a cached block
  // becomes in use again).
  int lookup_prefix(uint64_t chain_hash, const int32_t* block_tokens_ids);
  // Publishes a full block (every position stored). A no-op when the block is
  // already published or when another block already holds this hash.
  void publish_prefix(int block, uint64_t chain_hash, const int32_t* block_tokens_ids);
  // Chain hash of a block: previous = 0 for the first block, else the
  // previous block's chain hash.
  static uint64_t chain_hash(uint64_t previous, const int32_t* tokens, int n);

  // Prefix-cache statistics: lookups that found a block / all lookups.
  int64_t prefix_lookups() const { return lookups_; }
  int64_t prefix_hits() const { return hits_; }

  // Where the blocks' rows live: block b, layer l, K or V, block_tokens slots.
  const kernels::KvLayout& layout() const { return layout_; }
  // Blocks a helper thread keeps committed (resident) ahead of the highest
  // block allocated so far, so that no step faults a fresh block's pages in.
  int commit_ahead_blocks() const { return commit_ahead_; }
  int row_elems() const { return row_; }

 private:
  void check(int block) const;
  void lru_unlink(int block);
  void lru_push_back(int block);
  void unpublish(int block);

  class Committer;
  void note_use();  // after a block's references changed: the committer works only while no block is used

  int block_tokens_, n_layer_, row_;
  KvType type_;
  int64_t block_bytes_;
  int total_ = 0;
  std::unique_ptr<kernels::Buffer> data_;
  kernels::KvLayout layout_;
  std::vector<int> ref_;
  std::vector<int> free_;  // stack; back() is allocated next
  // Prefix cache: per block, whether published, its hash and its tokens.
  std::vector<uint8_t> has_hash_;
  std::vector<uint64_t> hash_;
  std::vector<int32_t> tokens_;  // total_ * block_tokens_
  std::unordered_map<uint64_t, int> by_hash_;
  // LRU list of cached blocks (intrusive, doubly linked): head_ is the least recently used.
  std::vector<int> prev_, next_;
  int head_ = -1, tail_ = -1, cached_ = 0;
  int64_t lookups_ = 0, hits_ = 0;
  // high_: 1 + the highest block ever allocated; wanted_: blocks [0, wanted_) committed or asked for
  int commit_ahead_ = 0, high_ = 0, wanted_ = 0;
  std::unique_ptr<Committer> committer_;  // after data_: stopped before the buffer goes
};

// One sequence's block table over a pool. Position p lives in
// blocks()[p / block_tokens] at slot p % block_tokens.
class PagedSeq final : public KvSeq {
 public:
  explicit PagedSeq(KvPool& pool);
  ~PagedSeq() override;  // releases its blocks
  PagedSeq(const PagedSeq&) = delete;
  PagedSeq& operator=(const PagedSeq&) = delete;

  KvPool& pool() { return pool_; }
  // The block table; the scheduler may append allocated blocks or shared
  // prefix blocks (each holding one reference that this sequence releases).
  std::vector<int>& blocks() { return blocks_; }
  const std::vector<int>& blocks() const { return blocks_; }

  int capacity() const override { return static_cast<int>(blocks_.size()) * pool_.block_tokens(); }
  const kernels::KvLayout& layout() const override { return pool_.layout(); }
  // -1 for a position in a published (shared, immutable) block: such a
  // block already holds the same values for the same tokens at the same positions.
  int32_t store_slot(int pos) const override;
  const int32_t* block_table() const override { return blocks_.data(); }
  int n_blocks() const override { return static_cast<int>(blocks_.size()); }

  // For preemption or the end of the sequence: give every block back (last
  // block first, so that cached prefixes are evicted from their tail).
  void release_all();
  // Sliding-window attention: gives back every block whose positions all lie
  // before pos (no later query attends them; a published one stays cached
  // for prefix reuse). Their table entries become kReleased, so every later
  // position keeps its block index; attention never reads them. Returns the
  // blocks released by this call.
  int release_before(int pos);
  static constexpr int kReleased = -1;

  // Helpers for the scheduler (optional; blocks() can be managed by hand).
  // Blocks needed to hold n_positions.
  int blocks_for(int n_positions) const;
  // Allocates blocks until capacity() >= n_positions. On failure (pool
  // exhausted) releases the blocks this call added and returns false.
  bool reserve(int n_positions);
  // With an empty block table: appends the longest run of published blocks
  // matching the FULL blocks of tokens[0, n) and returns the positions they
  // cover (a multiple of block_tokens; those need no prefill). Pass
  // n = prompt length - 1 so that at least the last prompt token is computed
  // (its logits are needed).
  int attach_prefix(const int32_t* tokens, int n);
  // Publishes every full block among the first n_stored positions (whose K/V
  // are stored) that this sequence has not published yet. tokens: the
  // sequence's tokens from position 0 (prompt, then generated ones).
  void publish(const int32_t* tokens, int n_stored);

 private:
  KvPool& pool_;
  std::vector<int> blocks_;
  std::vector<uint64_t> hashes_;  // chain hashes of the first hashes_.size() blocks
  size_t released_ = 0;           // blocks_[0, released_) are kReleased
};

// Bytes of n values cached as `type` (n a multiple of 32 for Q8_0).
int64_t kv_bytes(KvType type, int64_t n);
// Throws atelier::Error when the model's head size does not suit the type.
void check_kv_type(const LlamaHparams& hp, KvType type);

}  // namespace atelier::text
