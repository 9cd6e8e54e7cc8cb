// The KV cache and attention: store_kv (F32 / F16 / BF16 / Q8_0 / MXFP8 rows), the
// fused RoPE + store, paged attention with an online softmax split into
// chunks of kAttnChunk positions (flash-decoding), runs of prefill rows
// tiled onto the tensor cores (flash attention, flash_plan.h), and dense
// attention for the text encoders and image models.
#include <algorithm>
#include <atomic>
#include <string>
#include <type_traits>

#include "attention.cuh"
#include "flash_plan.h"
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
  const int32_t* tiled;  // per row, 1: the tile kernel computes it (flash_plan.h); nullptr: none is
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

// Rows row0 .. row0 + nrows - 1, blockIdx.z and every gridDim.z-th after it
// (gridDim.z == nrows unless tiled rows are skipped: then fewer blocks walk
// the rows, so a prefill's tiled rows cost no block each).
__global__ void __launch_bounds__(kAttnWarps * 32)
    paged_attn_kernel(KvDev kv, PagedDev a, const void* q, int qt, void* out, int ot, float* part, int64_t row0,
                      int64_t nrows) {
  extern __shared__ float sh[];  // 2 * kAttnWarps floats, then kAttnWarps * head_dim
  for (int64_t z = blockIdx.z; z < nrows; z += gridDim.z) {
  const int64_t i = row0 + z;
  const int h = blockIdx.y, c = blockIdx.x;
  if (a.tiled && a.tiled[i]) continue;
  const int len = a.row_len[i];
  if (len <= 0) continue;
  const int first = a.window > 0 ? max(0, len - a.window) : 0;
  const int nch = attn_chunks(len - first);
  if (c >= nch) continue;
  __syncthreads();  // the previous row's reads of sh are done
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
    dst = part + ((z * int64_t{gridDim.y} + h) * a.chunks + c) * (hd + 2);
    if (threadIdx.x == 0) dst[0] = M, dst[1] = L;
  }
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.0f;
    for (int i2 = 0; i2 < kAttnWarps; ++i2) acc += sacc[i2 * hd + d] * expf(sh[i2] - M);
    if (nch > 1) dst[2 + d] = acc;
    else st(out, ot, i * qd + h * hd + d, acc * sink_corr / L);
  }
  }
}

// The chunks of a row combined in order (rows of one chunk were written
// whole); rows as paged_attn_kernel walks them, over blockIdx.y.
__global__ void paged_combine_kernel(PagedDev a, const float* part, void* out, int ot, int64_t row0, int64_t nrows) {
  for (int64_t z = blockIdx.y; z < nrows; z += gridDim.y) {
  const int64_t i = row0 + z;
  const int h = blockIdx.x;
  if (a.tiled && a.tiled[i]) continue;
  const int len = a.row_len[i];
  if (len <= 0) continue;
  const int first = a.window > 0 ? max(0, len - a.window) : 0;
  const int nch = attn_chunks(len - first);
  if (nch <= 1) continue;
  const int64_t hd = a.head_dim;
  const float* base = part + (z * int64_t{a.n_head} + h) * a.chunks * (hd + 2);
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
}

// ---------------------------------------------------------------- tiled prefill (flash attention)
//
// FlashAttention-2's schedule over the paged cache: a block per (tile of up
// to 64 consecutive rows of one sequence, query head); its 4 warps own 16
// query rows each. Per step the block reads kFlashCols positions of K and V
// through the block table into shared memory, converted to the compute type
// (F16 for F16 / Q8_0 caches, BF16 otherwise), and each warp computes
// S = Q K^T and O += P V with mma.sync m16n8k16 (FP32 accumulation), an
// online softmax per row in FP32 between them (base-2 exponentials, the
// scale folded in), the causal mask from each row's own length and the
// sliding window per row. A sink (gpt-oss) joins each row's denominator
// once, at the end.

constexpr int kFlashThreads = 128;
constexpr float kLog2e = 1.4426950408889634f;

struct FlashDev {
  int n_head, group, layer, window;
  int64_t head_dim;
  float scale_log2;  // scale * log2(e): scores in base 2
  const int32_t *row_len, *row_table, *block_tables;
  const float* sinks;
  const FlashTile* tiles;
  const int32_t* count;  // the plan's tile count (device)
  bool vec;              // 16-byte loads of 8 cached values (aligned rows, head_dim % 8 == 0)
};

__device__ __forceinline__ uint32_t pack2(__half, float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack2(__nv_bfloat16, float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 8 floats as 8 values of CT at dst (16-byte aligned shared memory).
template <class CT>
__device__ __forceinline__ void store8(CT* dst, const float (&f)[8]) {
  uint4 u;
  u.x = pack2(CT{}, f[0], f[1]), u.y = pack2(CT{}, f[2], f[3]), u.z = pack2(CT{}, f[4], f[5]),
  u.w = pack2(CT{}, f[6], f[7]);
  *reinterpret_cast<uint4*>(dst) = u;
}

// Cached elements e .. e + 7 (those below `valid`; zeros past it) as CT at
// dst. Every type goes through kv_ld, one element at a time, except the
// 16-byte loads of F16 / BF16 rows already in the compute type and of F32.
template <class CT>
__device__ __forceinline__ void kv_load8(int type, bool vec, const uint8_t* base, int64_t e, int64_t valid, CT* dst) {
  constexpr int kSame = std::is_same_v<CT, __half> ? kF16 : kBF16;
  float f[8];
  if (vec && type == kSame) {
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(base + e * 2);
    return;
  }
  if (vec && type == kF32) {
    const float4 x = *reinterpret_cast<const float4*>(base + e * 4), y = *reinterpret_cast<const float4*>(base + e * 4 + 16);
    f[0] = x.x, f[1] = x.y, f[2] = x.z, f[3] = x.w, f[4] = y.x, f[5] = y.y, f[6] = y.z, f[7] = y.w;
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) f[k] = k < valid ? kv_ld(type, base, e + k) : 0.0f;
  }
  store8(dst, f);
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}

// c += a b: a 16x16 (row-major fragment), b 16x8 (column), c 16x8 FP32.
__device__ __forceinline__ void mma16816(__half, float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma16816(__nv_bfloat16, float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Positions per K/V step: 64, or 32 above head_dim 128 (shared memory and
// registers: the accumulator is DP / 2 floats a thread).
template <int DP>
constexpr int flash_cols() {
  return DP > 128 ? 32 : 64;
}
// Shared memory of a block: Q, K, V tiles (rows padded by 8 values, so the
// 8 rows an ldmatrix reads fall in distinct banks) and the step's slot offsets.
template <class CT, int DP>
constexpr size_t flash_shared_bytes() {
  return static_cast<size_t>(kFlashTileRows + 2 * flash_cols<DP>()) * (DP + 8) * sizeof(CT) +
         static_cast<size_t>(flash_cols<DP>()) * sizeof(int64_t);
}

template <class CT, int DP>
__global__ void __launch_bounds__(kFlashThreads)
    flash_prefill_kernel(KvDev kv, FlashDev a, const void* q, int qt, void* out, int ot) {
  constexpr int BM = kFlashTileRows, BN = flash_cols<DP>(), LD = DP + 8, CPR = DP / 8;
  extern __shared__ __align__(16) unsigned char flash_sh[];
  CT* sq = reinterpret_cast<CT*>(flash_sh);
  CT* sk = sq + BM * LD;
  CT* sv = sk + BN * LD;
  int64_t* sbase = reinterpret_cast<int64_t*>(sv + BN * LD);
  const int count = *a.count;
  if (static_cast<int>(blockIdx.x) >= count) return;
  const FlashTile tile = a.tiles[count - 1 - static_cast<int>(blockIdx.x)];  // the longest contexts first
  const int h = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t hd = a.head_dim, qd = int64_t{a.n_head} * hd, kvo = int64_t{h / a.group} * hd;
  const int n = tile.rows, len0 = a.row_len[tile.row];  // row j of the tile: length len0 + j
  const int32_t* table = a.block_tables + a.row_table[tile.row];

  // Q, rows past the tile and dimensions past head_dim zero.
  for (int c = tid; c < BM * CPR; c += kFlashThreads) {
    const int r = c / CPR, d0 = (c % CPR) * 8;
    float f[8];
#pragma unroll
    for (int k = 0; k < 8; ++k)
      f[k] = r < n && d0 + k < hd ? ld(q, qt, (int64_t{tile.row} + r) * qd + h * hd + d0 + k) : 0.0f;
    store8(sq + r * LD + d0, f);
  }

  // This warp's rows j0 .. j1 (none when j1 < j0) and this thread's two:
  // ra (fragment rows g) and rb (g + 8), by their lengths and window starts.
  const int j0 = warp * 16, j1 = min(j0 + 15, n - 1);
  const int g = lane >> 2, tig = lane & 3;
  const int W = a.window;
  const int len_a = len0 + j0 + g, len_b = len_a + 8;
  const int first_a = W > 0 ? max(0, len_a - W) : 0, first_b = W > 0 ? max(0, len_b - W) : 0;
  const int warp_lo = W > 0 ? max(0, len0 + j0 - W) : 0;       // the first position a row of the warp sees
  const int warp_hi = len0 + j1;                               // past the last one
  const int warp_lo_all = W > 0 ? max(0, len0 + j1 - W) : 0;   // from here on every row sees it...
  const int warp_hi_all = len0 + j0;                           // ...up to here
  const int kv_lo = W > 0 ? max(0, len0 - W) : 0, kv_hi = len0 + n - 1;

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float acc[DP / 8][4];
#pragma unroll
  for (int t = 0; t < DP / 8; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;

  for (int p0 = kv_lo; p0 < kv_hi; p0 += BN) {
    __syncthreads();  // Q is written; the previous step's K and V are read
    if (tid < BN) {
      const int p = p0 + tid;
      sbase[tid] = p < kv_hi ? kv_elem(kv, a.layer, int64_t{table[p / kv.bt]} * kv.bt + p % kv.bt) + kvo : -1;
    }
    __syncthreads();
    for (int c = tid; c < BN * CPR; c += kFlashThreads) {
      const int r = c / CPR, d0 = (c % CPR) * 8;
      const int64_t e = sbase[r];
      CT *dk = sk + r * LD + d0, *dv = sv + r * LD + d0;
      if (e < 0 || d0 >= hd) {
        *reinterpret_cast<uint4*>(dk) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(dv) = make_uint4(0, 0, 0, 0);
      } else {
        kv_load8(kv.type, a.vec, kv.k, e + d0, hd - d0, dk);
        kv_load8(kv.type, a.vec, kv.v, e + d0, hd - d0, dv);
      }
    }
    __syncthreads();
    if (j1 < j0 || p0 >= warp_hi || p0 + BN <= warp_lo) continue;  // nothing this warp's rows see

    // S = Q K^T: fragment nt holds positions p0 + 8 nt + 2 tig (+1) of rows g, g + 8.
    float s[BN / 8][4];
#pragma unroll
    for (int t = 0; t < BN / 8; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) {
      uint32_t qa[4];
      ldsm_x4(qa, sq + (j0 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int nt = 0; nt < BN / 16; ++nt) {
        uint32_t kb[4];
        ldsm_x4(kb, sk + (nt * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
        mma16816(CT{}, s[2 * nt], qa, kb[0], kb[1]);
        mma16816(CT{}, s[2 * nt + 1], qa, kb[2], kb[3]);
      }
    }
    // Scores in base 2; masked (causal, window, past the last row) to -inf.
    const bool whole = p0 + BN <= warp_hi_all && p0 >= warp_lo_all;
#pragma unroll
    for (int t = 0; t < BN / 8; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[t][e] * a.scale_log2;
        if (!whole) {
          const int p = p0 + t * 8 + 2 * tig + (e & 1);
          const bool seen = e < 2 ? p < len_a && p >= first_a : p < len_b && p >= first_b;
          if (!seen) v = -INFINITY;
        }
        s[t][e] = v;
      }
    // The online softmax: each row's max over its 4 threads, the old
    // accumulator rescaled, P = 2^(s - max).
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int t = 0; t < BN / 8; ++t) {
      mx[0] = fmaxf(mx[0], fmaxf(s[t][0], s[t][1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[t][2], s[t][3]));
    }
    float corr[2], base[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      base[i] = mx[i] == -INFINITY ? 0.0f : mx[i];  // a row that saw nothing yet: 2^-inf = 0, never NaN
      corr[i] = exp2f(m[i] - base[i]);
      m[i] = mx[i];
      l[i] *= corr[i];
    }
#pragma unroll
    for (int t = 0; t < BN / 8; ++t) {
      s[t][0] = exp2f(s[t][0] - base[0]), s[t][1] = exp2f(s[t][1] - base[0]);
      s[t][2] = exp2f(s[t][2] - base[1]), s[t][3] = exp2f(s[t][3] - base[1]);
      l[0] += s[t][0] + s[t][1];
      l[1] += s[t][2] + s[t][3];
    }
#pragma unroll
    for (int t = 0; t < DP / 8; ++t) {
      acc[t][0] *= corr[0], acc[t][1] *= corr[0];
      acc[t][2] *= corr[1], acc[t][3] *= corr[1];
    }
    // O += P V: S's accumulator fragments are P's A fragments (16 positions each).
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint32_t pa[4] = {pack2(CT{}, s[2 * kk][0], s[2 * kk][1]), pack2(CT{}, s[2 * kk][2], s[2 * kk][3]),
                              pack2(CT{}, s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack2(CT{}, s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dt = 0; dt < DP / 16; ++dt) {
        uint32_t vb[4];
        ldsm_x4_trans(vb, sv + (kk * 16 + (lane & 15)) * LD + dt * 16 + (lane >> 4) * 8);
        mma16816(CT{}, acc[2 * dt], pa, vb[0], vb[1]);
        mma16816(CT{}, acc[2 * dt + 1], pa, vb[2], vb[3]);
      }
    }
  }
  if (j1 < j0) return;
  // Each row's sum over its 4 threads; the sink (base 2) in the denominator once.
  float fac[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float L = l[i];
    L += __shfl_xor_sync(0xffffffffu, L, 1);
    L += __shfl_xor_sync(0xffffffffu, L, 2);
    if (a.sinks) {
      const float sk = a.sinks[h] * kLog2e, M2 = fmaxf(m[i], sk), c = exp2f(m[i] - M2);
      L = L * c + exp2f(sk - M2);
      fac[i] = c / L;
    } else {
      fac[i] = 1.0f / L;
    }
  }
#pragma unroll
  for (int t = 0; t < DP / 8; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = j0 + g + (e >= 2 ? 8 : 0);
      const int64_t d = t * 8 + 2 * tig + (e & 1);
      if (j <= j1 && d < hd) st(out, ot, (int64_t{tile.row} + j) * qd + h * hd + d, acc[t][e] * fac[e >> 1]);
    }
}

// Scans of one value per thread over a block of kFlashPlanThreads: the
// exclusive prefix under op (identity `id`) and the total. sh: 32 values.
template <class Op>
__device__ __forceinline__ int64_t block_exclusive_scan(int64_t v, int64_t id, Op op, int64_t* sh, int64_t& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int64_t x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int64_t y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x = op(y, x);
  }
  int64_t before = __shfl_up_sync(0xffffffffu, x, 1);
  if (lane == 0) before = id;
  if (lane == 31) sh[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int64_t w = lane < warps ? sh[lane] : id;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w = op(y, w);
    }
    if (lane < warps) sh[lane] = w;  // inclusive over the warps
  }
  __syncthreads();
  const int64_t r = op(warp == 0 ? id : sh[warp - 1], before);
  total = sh[warps - 1];
  __syncthreads();  // sh is free for the next scan
  return r;
}

// flash_plan.h's four passes, one segment of the rows per thread, the
// segments' carries by block scans. One block.
__global__ void __launch_bounds__(kFlashPlanThreads)
    flash_plan_kernel(const int32_t* len, const int32_t* table, int64_t rows, int32_t* start, int32_t* end,
                      int32_t* tiled, FlashTile* tiles, int32_t* count) {
  __shared__ int64_t sh[32], seg[kFlashPlanThreads];
  const int S = kFlashPlanThreads, s = threadIdx.x;
  int64_t a, b, first, last, total;
  flash_segment(s, S, rows, a, b);
  flash_breaks(len, table, a, b, rows, first, last);
  const int64_t carry = block_exclusive_scan(last, -1, [](int64_t x, int64_t y) { return x > y ? x : y; }, sh, total);
  flash_starts(len, table, a, b, carry, start);
  // The first run start after each segment: a min scan over the segments in reverse order.
  seg[s] = first;
  __syncthreads();
  const int64_t later = seg[S - 1 - s];
  const int64_t next = block_exclusive_scan(later, rows, [](int64_t x, int64_t y) { return x < y ? x : y; }, sh, total);
  seg[S - 1 - s] = next;  // every read of seg came before the scan's barriers
  __syncthreads();
  const int64_t mine = flash_ends(len, table, a, b, seg[s], start, end);
  const int64_t base = block_exclusive_scan(mine, 0, [](int64_t x, int64_t y) { return x + y; }, sh, total);
  flash_assign(a, b, base, start, end, tiled, tiles);
  if (s == 0) *count = static_cast<int32_t>(total);
}

// The tile kernel for compute type CT and head_dim padded to DP (a
// multiple of 16); its shared memory allowed once per device.
template <class CT, int DP>
void launch_flash(cudaStream_t s, const KvDev& kv, const FlashDev& f, int64_t max_tiles, const void* q, int qt,
                  void* out, int ot) {
  constexpr size_t shared = flash_shared_bytes<CT, DP>();
  static std::atomic<uint64_t> allowed{0};  // a bit per device
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if (!(allowed.load() & bit)) {
    CUDA_CHECK(cudaFuncSetAttribute(flash_prefill_kernel<CT, DP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(shared)));
    allowed.fetch_or(bit);
  }
  flash_prefill_kernel<CT, DP><<<dim3(static_cast<unsigned>(max_tiles), static_cast<unsigned>(f.n_head)),
                                 kFlashThreads, shared, s>>>(kv, f, q, qt, out, ot);
  CUDA_LAUNCHED();
}

template <class CT>
void launch_flash_dim(cudaStream_t s, const KvDev& kv, const FlashDev& f, int64_t max_tiles, const void* q, int qt,
                      void* out, int ot) {
  const int64_t hd = f.head_dim;
  if (hd <= 64) launch_flash<CT, 64>(s, kv, f, max_tiles, q, qt, out, ot);
  else if (hd <= 80) launch_flash<CT, 80>(s, kv, f, max_tiles, q, qt, out, ot);
  else if (hd <= 96) launch_flash<CT, 96>(s, kv, f, max_tiles, q, qt, out, ot);
  else if (hd <= 128) launch_flash<CT, 128>(s, kv, f, max_tiles, q, qt, out, ot);
  else launch_flash<CT, 256>(s, kv, f, max_tiles, q, qt, out, ot);
}

// Blocks of the flash-decoding kernel walking the rows when tiled rows are
// skipped (each takes every kDecodeRowSlots-th row).
constexpr int64_t kDecodeRowSlots = 256;

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

void paged_attention(cudaStream_t s, Scratch& scratch, const KvLayout& kv, const PagedAttention& a, Act q, Act out,
                     bool flash) {
  if (a.rows <= 0 || a.max_len <= 0) return;
  check_kv(kv, a.head_dim);
  if (a.head_dim > 32 * kPagedDims) throw std::logic_error("CUDA paged attention: head_dim above 256");
  if (a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0)
    throw std::logic_error("CUDA paged attention: n_head must be a multiple of n_head_kv");
  // The tile path needs a run of kFlashMinRun rows, so at least that many
  // rows and positions; which rows form runs only the device knows.
  const bool tiles = flash && a.rows >= kFlashMinRun && a.max_len >= kFlashMinRun && a.rows <= INT32_MAX;
  PagedDev d{a.n_head,  a.n_head / a.n_head_kv, a.layer, a.window, 0, a.head_dim, a.scale, a.row_len,
             a.row_table, a.block_tables, a.sinks, nullptr};
  d.chunks = std::max(1, attn_chunks(a.window > 0 ? std::min(a.max_len, a.window) : a.max_len));
  const size_t shared = (2 * kAttnWarps + kAttnWarps * static_cast<size_t>(a.head_dim)) * sizeof(float);
  // Rows in groups whose partials fit 64 MiB (each row's result is the same
  // whatever group it is in).
  const int64_t per_row = int64_t{a.n_head} * d.chunks * (a.head_dim + 2) * 4;
  const int64_t group = d.chunks > 1 ? std::clamp<int64_t>((int64_t{64} << 20) / per_row, 1, a.rows) : a.rows;
  // Scratch: the plan (start, end, tiled per row; the tiles; their count),
  // then the partials.
  const int64_t max_tiles = flash_max_tiles(a.rows);
  const size_t plan_bytes =
      tiles ? (static_cast<size_t>(3 * a.rows + 1) * 4 + static_cast<size_t>(max_tiles) * sizeof(FlashTile) + 255) / 256 * 256
            : 0;
  const size_t part_bytes = d.chunks > 1 ? static_cast<size_t>(group * per_row) : 0;
  uint8_t* base = plan_bytes + part_bytes > 0 ? static_cast<uint8_t*>(scratch.get(plan_bytes + part_bytes)) : nullptr;
  float* part = d.chunks > 1 ? reinterpret_cast<float*>(base + plan_bytes) : nullptr;
  const KvDev kd = kv_dev(kv);
  if (tiles) {
    auto* start = reinterpret_cast<int32_t*>(base);
    int32_t *end = start + a.rows, *tiled = end + a.rows, *count = tiled + a.rows;
    auto* tile_list = reinterpret_cast<FlashTile*>(count + 1);  // 4-byte fields: aligned
    flash_plan_kernel<<<1, kFlashPlanThreads, 0, s>>>(a.row_len, a.row_table, a.rows, start, end, tiled, tile_list,
                                                      count);
    CUDA_LAUNCHED();
    FlashDev f{a.n_head, a.n_head / a.n_head_kv, a.layer, a.window, a.head_dim, a.scale * kLog2e, a.row_len,
               a.row_table, a.block_tables, a.sinks, tile_list, count, false};
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    f.vec = a.head_dim % 8 == 0 && kv.row_elems % 8 == 0 && kv.block_stride_elems % 8 == 0 &&
            kv.layer_stride_elems % 8 == 0 && aligned(kv.k) && aligned(kv.v);
    // The compute type from the cache's: F16 for F16 and Q8_0 (its values
    // fit F16's range, with 3 more mantissa bits than BF16), BF16 for BF16
    // and F32 (BF16's range, as the activations').
    if (kv.type == DType::F16 || kv.type == DType::Q8_0)
      launch_flash_dim<__half>(s, kd, f, max_tiles, q.data(), act_code(q), out.data(), act_code(out));
    else
      launch_flash_dim<__nv_bfloat16>(s, kd, f, max_tiles, q.data(), act_code(q), out.data(), act_code(out));
    d.tiled = tiled;
  }
  for (int64_t r0 = 0; r0 < a.rows; r0 += group) {
    const int64_t n = std::min(group, a.rows - r0);
    const int64_t slots = tiles ? std::min(n, kDecodeRowSlots) : n;
    const dim3 grid(static_cast<unsigned>(d.chunks), static_cast<unsigned>(a.n_head), static_cast<unsigned>(slots));
    paged_attn_kernel<<<grid, kAttnWarps * 32, shared, s>>>(kd, d, q.data(), act_code(q), out.data(), act_code(out),
                                                             part, r0, n);
    CUDA_LAUNCHED();
    if (d.chunks > 1) {
      paged_combine_kernel<<<dim3(static_cast<unsigned>(a.n_head), static_cast<unsigned>(slots)), 128, 0, s>>>(
          d, part, out.data(), act_code(out), r0, n);
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
