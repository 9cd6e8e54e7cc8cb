// Attention and the KV cache on the device: store_kv, paged attention (decode
// and prefill, split over long contexts), dense attention (causal and not).
#pragma once

#include "common.cuh"
#include "matmul.cuh"

namespace atelier::kernels::cuda {

// KV types the device reads and writes: F32, F16, BF16, Q8_0 (GGML blocks).
void check_kv(const KvLayout& kv, int64_t head_dim);
void store_kv(cudaStream_t s, const KvLayout& kv, int layer, Act k, Act v, const int32_t* slots, int64_t rows);
// rope(q), rope(k), store_kv(k, v) in one launch (norm_rope.cu's rope).
void rope_store_kv(cudaStream_t s, Act q, Act k, Act v, int64_t rows, const int32_t* positions, const RopeParams& rq,
                   const RopeParams& rk, const KvLayout& kv, int layer, const int32_t* slots);
// flash: runs of at least kFlashMinRun prefill rows (flash_plan.h) take the
// tiled tensor-core kernel, planned on the device; false: every row the
// flash-decoding kernel (batch-invariant: ATELIER_CUDA_DETERMINISTIC).
void paged_attention(cudaStream_t s, Scratch& scratch, const KvLayout& kv, const PagedAttention& a, Act q, Act out,
                     bool flash);
// causal: position i sees 0..i (lq == lk); q, k, v rows `stride` elements
// apart (attention: heads * head_dim), sequences lq * stride apart.
void dense_attention(cudaStream_t s, const AttentionShape& sh, Act q, Act k, Act v, int64_t stride, bool causal,
                     Act out);

}  // namespace atelier::kernels::cuda
