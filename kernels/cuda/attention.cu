// The KV cache and attention: store_kv (F32 / F16 / BF16 / Q8_0 / MXFP8 rows), the
// fused RoPE + store, paged attention with an online softmax split into
// chunks of kAttnChunk positions (flash-decoding; one launch covers decode
// and prefill rows alike), and dense attention for the text encoders and
// image models.
#include <algorithm>
#include <string>

#include "attention.cuh"
#include "policy.h"
#include "quant.cuh"
#include "rope.cuh"

namespace atelier::kernels::cuda {

namespace {

struct KvDev {
  int type = 0;
  uint8_t* k = nullptr;
  uint8_t* v = nullptr;
  int64_t row_elems = 0, block_stride = 0, layer_stride = 0;
  int bt = 1;
};

KvDev kv_dev(const KvLayout& kv) {
  KvDev d;
  d.type = static_cast<int>(kv.type);
  d.k = static_cast<uint8_t*>(kv.k);
  d.v = static_cast<uint8_t*>(kv.v);
  d.row_elems = kv.row_elems;
  d.block_stride = kv.block_stride_elems;
  d.layer_stride = kv.layer_stride_elems;
  d.bt = kv.block_tokens;
  return d;
}

// Element offset of slot `slot`'s row (KvLayout).
__device__ __forceinline__ int64_t kv_elem(const KvDev& kv, int layer, int64_t slot) {
  return (slot / kv.bt) * kv.block_stride + layer * kv.layer_stride + (slot % kv.bt) * kv.row_elems;
}

// DType::MXFP8 (the fp8 cache): 33-byte blocks of 32, the E8M0 scale byte
// then the E4M3 codes (kernels.h).
constexpr int kKvMXFP8 = static_cast<int>(DType::MXFP8);

// 2^(s - 127) for an E8M0 byte (NaN for 255), exactly kernels::e8m0_to_f32.
__device__ __forceinline__ float e8m0_value(uint32_t s) {
  return s == 255 ? __uint_as_float(0x7fc00000u) : s == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(s << 23);
}

__device__ __forceinline__ float kv_ld(int type, const uint8_t* base, int64_t e) {
  if (type == kWQ8_0) {
    const uint8_t* b = base + (e >> 5) * 34;
    return h2f(b) * static_cast<float>(reinterpret_cast<const int8_t*>(b + 2)[e & 31]);
  }
  if (type == kKvMXFP8) {  // e4m3(code) * 2^(s - 127): exact unless subnormal, as dequantize_row(MXFP8)
    const uint8_t* b = base + (e >> 5) * 33;
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b[1 + (e & 31)]), __NV_E4M3);
    return __half2float(__half(h)) * e8m0_value(b[0]);
  }
  return ld(base, type, e);
}

// Stores one row (row_elems values of x at element xo) at element e of a
// cache of `type`, by the block's threads. Q8_0: one warp per block of 32,
// GGML's encoder (d = amax / 127, q = round(x / d), d kept as fp16).
__device__ __forceinline__ void kv_store_row(int type, uint8_t* base, int64_t e, const void* x, int xt, int64_t xo,
                                             int64_t n) {
  if (type == kWQ8_0) {
    const int lane = threadIdx.x & 31;
    for (int64_t blk = threadIdx.x >> 5; blk < n / 32; blk += blockDim.x >> 5) {
      const float v = ld(x, xt, xo + blk * 32 + lane);
      const float amax = warp_max(fabsf(v));
      const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
      uint8_t* b = base + ((e >> 5) + blk) * 34;
      if (lane == 0) *reinterpret_cast<__half*>(b) = __float2half_rn(d);
      reinterpret_cast<int8_t*>(b + 2)[lane] = static_cast<int8_t>(roundf(v * id));
    }
    return;
  }
  if (type == kKvMXFP8) {
    // One warp per block of 32: kernels::quantize_row(MXFP8) byte for byte.
    // The scale from the finite values' max |x| (frexpf is exact), then each
    // x * 2^(127 - s) (exact) to E4M3, nearest even, saturating (SATFINITE:
    // an infinity becomes +-448, NaN stays NaN).
    const int lane = threadIdx.x & 31;
    for (int64_t blk = threadIdx.x >> 5; blk < n / 32; blk += blockDim.x >> 5) {
      const float v = ld(x, xt, xo + blk * 32 + lane);
      const float amax = warp_max(isfinite(v) ? fabsf(v) : 0.0f);
      int s = 0;
      if (amax > 0.0f) {
        int ex = 0;
        const float m = frexpf(amax, &ex);
        s = min(max((m <= 0.875f ? ex - 9 : ex - 8) + 127, 0), 254);
      }
      uint8_t* b = base + ((e >> 5) + blk) * 33;
      if (lane == 0) b[0] = static_cast<uint8_t>(s);
      b[1 + lane] = __nv_cvt_float_to_fp8(v * ldexpf(1.0f, 127 - s), __NV_SATFINITE, __NV_E4M3);
    }
    return;
  }
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) st(base, type, e + j, ld(x, xt, xo + j));
}

__global__ void store_kv_kernel(KvDev kv, int layer, const void* k, const void* v, int xt, const int32_t* slots) {
  const int64_t r = blockIdx.x;
  const int32_t slot = slots[r];
  if (slot < 0) return;
  const int64_t e = kv_elem(kv, layer, slot);
  kv_store_row(kv.type, kv.k, e, k, xt, r * kv.row_elems, kv.row_elems);
  kv_store_row(kv.type, kv.v, e, v, xt, r * kv.row_elems, kv.row_elems);
}

__global__ void rope_store_kv_kernel(void* q, void* k, const void* v, int xt, const int32_t* positions, RopeArgs rq,
                                     RopeArgs rk, KvDev kv, int layer, const int32_t* slots) {
  extern __shared__ float cs[];  // cos then sin of q's pairs, then k's
  const int64_t r = blockIdx.x;
  const int64_t pos = positions[r];
  float *cq = cs, *sq = cs + rq.rot_dim / 2, *ck = cs + rq.rot_dim, *sk = ck + rk.rot_dim / 2;
  rope_angles(rq, pos, cq, sq);
  rope_angles(rk, pos, ck, sk);
  __syncthreads();
  rope_apply(q, xt, r * int64_t{rq.n_heads} * rq.head_dim, rq, cq, sq);
  rope_apply(k, xt, r * kv.row_elems, rk, ck, sk);
  __syncthreads();  // the roped k, as stored, is what the cache gets
  const int32_t slot = slots[r];
  if (slot < 0) return;
  const int64_t e = kv_elem(kv, layer, slot);
  kv_store_row(kv.type, kv.k, e, k, xt, r * kv.row_elems, kv.row_elems);
  kv_store_row(kv.type, kv.v, e, v, xt, r * kv.row_elems, kv.row_elems);
}

// ---------------------------------------------------------------- paged attention

constexpr int kAttnWarps = 4;
constexpr int kPagedDims = 8;   // head_dim <= 256: 8 dims per lane
constexpr int kDenseDims = 16;  // head_dim <= 512 (the VAE's mid attention)

struct PagedDev {
  int n_head, group, layer, window, chunks;  // chunks: partial slots per (row, head)
  int64_t head_dim;
  float scale;
  const int32_t *row_len, *row_table, *block_tables;
  const float* sinks;  // n_head logits (gpt-oss) or nullptr: joins the denominator once, at the combine
};

// Online softmax of one warp over its positions, then the block's warps
// combined in order: (m, l, acc) of the block's positions in shared memory.
template <int D>
struct WarpState {
  float m = -INFINITY, l = 0.0f, acc[D];
};

template <int D>
__device__ __forceinline__ void online_step(WarpState<D>& w, float score, const float (&vv)[D]) {
  const float m_new = fmaxf(w.m, score);
  const float corr = expf(w.m - m_new), p = expf(score - m_new);
  w.l = w.l * corr + p;
#pragma unroll
  for (int t = 0; t < D; ++t) w.acc[t] = w.acc[t] * corr + p * vv[t];
  w.m = m_new;
}

// The block's warps' states combined in warp order: returns (M, L) and the
// combined accumulator of dimension d in acc_out[d] (shared).
template <int D>
__device__ __forceinline__ void combine_warps(const WarpState<D>& w, int64_t hd, float* sm, float* sacc, float& M,
                                              float& L) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sm[warp] = w.m, sm[kAttnWarps + warp] = w.l;
#pragma unroll
  for (int t = 0; t < D; ++t) {
    const int64_t d = lane + 32 * t;
    if (d < hd) sacc[warp * hd + d] = w.acc[t];
  }
  __syncthreads();
  M = -INFINITY;
  for (int i = 0; i < kAttnWarps; ++i) M = fmaxf(M, sm[i]);
  L = 0.0f;
  for (int i = 0; i < kAttnWarps; ++i) L += sm[kAttnWarps + i] * expf(sm[i] - M);
}

__global__ void __launch_bounds__(kAttnWarps * 32)
    paged_attn_kernel(KvDev kv, PagedDev a, const void* q, int qt, void* out, int ot, float* part, int64_t row0) {
  extern __shared__ float sh[];  // 2 * kAttnWarps floats, then kAttnWarps * head_dim
  const int64_t i = row0 + blockIdx.z;
  const int h = blockIdx.y, c = blockIdx.x;
  const int len = a.row_len[i];
  if (len <= 0) return;
  const int first = a.window > 0 ? max(0, len - a.window) : 0;
  const int nch = attn_chunks(len - first);
  if (c >= nch) return;
  const int p0 = first + c * kAttnChunk, p1 = min(len, p0 + kAttnChunk);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t hd = a.head_dim, qd = int64_t{a.n_head} * hd;
  const int64_t kvo = int64_t{h / a.group} * hd;
  float qv[kPagedDims];
#pragma unroll
  for (int t = 0; t < kPagedDims; ++t) {
    const int64_t d = lane + 32 * t;
    qv[t] = d < hd ? ld(q, qt, i * qd + h * hd + d) : 0.0f;
  }
  const int32_t* table = a.block_tables + a.row_table[i];
  WarpState<kPagedDims> w;
#pragma unroll
  for (int t = 0; t < kPagedDims; ++t) w.acc[t] = 0.0f;
  for (int p = p0 + warp; p < p1; p += kAttnWarps) {
    const int64_t slot = int64_t{table[p / kv.bt]} * kv.bt + p % kv.bt;
    const int64_t e = kv_elem(kv, a.layer, slot) + kvo;
    float s = 0.0f, vv[kPagedDims];
#pragma unroll
    for (int t = 0; t < kPagedDims; ++t) {
      const int64_t d = lane + 32 * t;
      if (d < hd) s = fmaf(qv[t], kv_ld(kv.type, kv.k, e + d), s);
      vv[t] = d < hd ? kv_ld(kv.type, kv.v, e + d) : 0.0f;
    }
    online_step(w, warp_sum(s) * a.scale, vv);
  }
  float M, L;
  combine_warps(w, hd, sh, sh + 2 * kAttnWarps, M, L);
  const float* sacc = sh + 2 * kAttnWarps;
  // A row of one chunk is final here: its sink (when given) joins now, as
  // paged_combine_kernel adds it for longer rows.
  float sink_corr = 1.0f;
  if (nch == 1 && a.sinks) {
    const float sk = a.sinks[h], M2 = fmaxf(M, sk);
    sink_corr = expf(M - M2);
    L = L * sink_corr + expf(sk - M2);
  }
  float* dst = nullptr;
  if (nch > 1) {
    dst = part + ((blockIdx.z * int64_t{gridDim.y} + h) * a.chunks + c) * (hd + 2);
    if (threadIdx.x == 0) dst[0] = M, dst[1] = L;
  }
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.0f;
    for (int i2 = 0; i2 < kAttnWarps; ++i2) acc += sacc[i2 * hd + d] * expf(sh[i2] - M);
    if (nch > 1) dst[2 + d] = acc;
    else st(out, ot, i * qd + h * hd + d, acc * sink_corr / L);
  }
}

// The chunks of a row combined in order (rows of one chunk were written whole).
__global__ void paged_combine_kernel(PagedDev a, const float* part, void* out, int ot, int64_t row0) {
  const int64_t i = row0 + blockIdx.y;
  const int h = blockIdx.x;
  const int len = a.row_len[i];
  if (len <= 0) return;
  const int first = a.window > 0 ? max(0, len - a.window) : 0;
  const int nch = attn_chunks(len - first);
  if (nch <= 1) return;
  const int64_t hd = a.head_dim;
  const float* base = part + (blockIdx.y * int64_t{gridDim.x} + h) * a.chunks * (hd + 2);
  float M = -INFINITY;
  for (int c = 0; c < nch; ++c) M = fmaxf(M, base[c * (hd + 2)]);
  if (a.sinks) M = fmaxf(M, a.sinks[h]);
  float L = 0.0f;
  for (int c = 0; c < nch; ++c) L += base[c * (hd + 2) + 1] * expf(base[c * (hd + 2)] - M);
  if (a.sinks) L += expf(a.sinks[h] - M);  // the sink: in the denominator once, no value
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.0f;
    for (int c = 0; c < nch; ++c) acc += base[c * (hd + 2) + 2 + d] * expf(base[c * (hd + 2)] - M);
    st(out, ot, i * int64_t{a.n_head} * hd + h * hd + d, acc / L);
  }
}

// ---------------------------------------------------------------- dense attention

__global__ void __launch_bounds__(kAttnWarps * 32)
    dense_attn_kernel(const void* q, const void* k, const void* v, int xt, int64_t stride, int64_t lq, int64_t lk,
                      int64_t hd, float scale, bool causal, void* out, int ot) {
  extern __shared__ float sh[];
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, heads = gridDim.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t qo = (b * lq + i) * stride + h * hd;
  float qv[kDenseDims];
#pragma unroll
  for (int t = 0; t < kDenseDims; ++t) {
    const int64_t d = lane + 32 * t;
    qv[t] = d < hd ? ld(q, xt, qo + d) : 0.0f;
  }
  const int64_t n = causal ? i + 1 : lk;
  WarpState<kDenseDims> w;
#pragma unroll
  for (int t = 0; t < kDenseDims; ++t) w.acc[t] = 0.0f;
  for (int64_t j = warp; j < n; j += kAttnWarps) {
    const int64_t ko = (b * lk + j) * stride + h * hd;
    float s = 0.0f, vv[kDenseDims];
#pragma unroll
    for (int t = 0; t < kDenseDims; ++t) {
      const int64_t d = lane + 32 * t;
      if (d < hd) s = fmaf(qv[t], ld(k, xt, ko + d), s);
      vv[t] = d < hd ? ld(v, xt, ko + d) : 0.0f;
    }
    online_step(w, warp_sum(s) * scale, vv);
  }
  float M, L;
  combine_warps(w, hd, sh, sh + 2 * kAttnWarps, M, L);
  const float* sacc = sh + 2 * kAttnWarps;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.0f;
    for (int i2 = 0; i2 < kAttnWarps; ++i2) acc += sacc[i2 * hd + d] * expf(sh[i2] - M);
    st(out, ot, (b * lq + i) * heads * hd + h * hd + d, acc / L);
  }
}

}  // namespace

void check_kv(const KvLayout& kv, int64_t head_dim) {
  if (kv.type != DType::F32 && kv.type != DType::F16 && kv.type != DType::BF16 && kv.type != DType::Q8_0 &&
      kv.type != DType::MXFP8)
    throw std::logic_error("CUDA KV cache: type " + std::string(dtype_name(kv.type)) +
                           " (the device keeps F32, F16, BF16, Q8_0 or MXFP8)");
  if ((kv.type == DType::Q8_0 || kv.type == DType::MXFP8) &&
      (kv.row_elems % 32 != 0 || (head_dim > 0 && head_dim % 32 != 0)))
    throw std::logic_error(std::string("CUDA KV cache: ") + (kv.type == DType::Q8_0 ? "Q8_0" : "MXFP8") +
                           " rows need head_dim a multiple of 32");
}

void store_kv(cudaStream_t s, const KvLayout& kv, int layer, Act k, Act v, const int32_t* slots, int64_t rows) {
  if (rows <= 0) return;
  check_kv(kv, 0);
  if (k.type() != v.type()) throw std::logic_error("CUDA store_kv: k and v of different types");
  store_kv_kernel<<<static_cast<unsigned>(rows), 128, 0, s>>>(kv_dev(kv), layer, k.data(), v.data(), act_code(k), slots);
  CUDA_LAUNCHED();
}

void rope_store_kv(cudaStream_t s, Act q, Act k, Act v, int64_t rows, const int32_t* positions, const RopeParams& rq,
                   const RopeParams& rk, const KvLayout& kv, int layer, const int32_t* slots) {
  if (rows <= 0) return;
  check_kv(kv, rk.head_dim);
  if (q.type() != k.type() || k.type() != v.type()) throw std::logic_error("CUDA rope_store_kv: mixed activation types");
  const size_t shared = static_cast<size_t>(rq.rot_dim + rk.rot_dim) * sizeof(float);
  rope_store_kv_kernel<<<static_cast<unsigned>(rows), 256, shared, s>>>(
      q.data(), k.data(), v.data(), act_code(q), positions, rope_args(rq), rope_args(rk), kv_dev(kv), layer, slots);
  CUDA_LAUNCHED();
}

void paged_attention(cudaStream_t s, Scratch& scratch, const KvLayout& kv, const PagedAttention& a, Act q, Act out) {
  if (a.rows <= 0 || a.max_len <= 0) return;
  check_kv(kv, a.head_dim);
  if (a.head_dim > 32 * kPagedDims) throw std::logic_error("CUDA paged attention: head_dim above 256");
  if (a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0)
    throw std::logic_error("CUDA paged attention: n_head must be a multiple of n_head_kv");
  PagedDev d{a.n_head,  a.n_head / a.n_head_kv, a.layer, a.window, 0, a.head_dim, a.scale, a.row_len,
             a.row_table, a.block_tables, a.sinks};
  d.chunks = std::max(1, attn_chunks(a.window > 0 ? std::min(a.max_len, a.window) : a.max_len));
  const size_t shared = (2 * kAttnWarps + kAttnWarps * static_cast<size_t>(a.head_dim)) * sizeof(float);
  // Rows in groups whose partials fit 64 MiB (each row's result is the same
  // whatever group it is in).
  const int64_t per_row = int64_t{a.n_head} * d.chunks * (a.head_dim + 2) * 4;
  const int64_t group = d.chunks > 1 ? std::clamp<int64_t>((int64_t{64} << 20) / per_row, 1, a.rows) : a.rows;
  float* part = d.chunks > 1 ? static_cast<float*>(scratch.get(static_cast<size_t>(group * per_row))) : nullptr;
  for (int64_t r0 = 0; r0 < a.rows; r0 += group) {
    const int64_t n = std::min(group, a.rows - r0);
    const dim3 grid(static_cast<unsigned>(d.chunks), static_cast<unsigned>(a.n_head), static_cast<unsigned>(n));
    paged_attn_kernel<<<grid, kAttnWarps * 32, shared, s>>>(kv_dev(kv), d, q.data(), act_code(q), out.data(),
                                                             act_code(out), part, r0);
    CUDA_LAUNCHED();
    if (d.chunks > 1) {
      paged_combine_kernel<<<dim3(static_cast<unsigned>(a.n_head), static_cast<unsigned>(n)), 128, 0, s>>>(
          d, part, out.data(), act_code(out), r0);
      CUDA_LAUNCHED();
    }
  }
}

void dense_attention(cudaStream_t s, const AttentionShape& sh, Act q, Act k, Act v, int64_t stride, bool causal,
                     Act out) {
  if (sh.batch <= 0 || sh.lq <= 0 || sh.heads <= 0) return;
  if (sh.head_dim > 32 * kDenseDims) throw std::logic_error("CUDA attention: head_dim above 512");
  if (q.type() != k.type() || k.type() != v.type()) throw std::logic_error("CUDA attention: mixed activation types");
  const float scale = sh.scale > 0 ? sh.scale : 1.0f / std::sqrt(static_cast<float>(sh.head_dim));
  const size_t shared = (2 * kAttnWarps + kAttnWarps * static_cast<size_t>(sh.head_dim)) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(sh.lq), static_cast<unsigned>(sh.heads), static_cast<unsigned>(sh.batch));
  dense_attn_kernel<<<grid, kAttnWarps * 32, shared, s>>>(q.data(), k.data(), v.data(), act_code(q), stride, sh.lq,
                                                           causal ? sh.lq : sh.lk, sh.head_dim, scale, causal,
                                                           out.data(), act_code(out));
  CUDA_LAUNCHED();
}

}  // namespace atelier::kernels::cuda
