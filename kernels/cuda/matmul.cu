// Products: matrix-vector kernels with the dequantization fused (decode and
// small batches), cuBLASLt BF16 GEMM for prefill and large batches; weight
// preparation and embedding lookups.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "matmul.cuh"
#include "policy.h"
#include "quant.cuh"

namespace atelier::kernels::cuda {

#define CUBLAS_CHECK(stmt)                                                                                  \
  do {                                                                                                      \
    const cublasStatus_t atelier_st_ = (stmt);                                                              \
    if (atelier_st_ != CUBLAS_STATUS_SUCCESS)                                                               \
      throw std::runtime_error(std::string("cuBLASLt: ") + #stmt + " failed with status " +                \
                               std::to_string(static_cast<int>(atelier_st_)) + " at " + __FILE__ + ":" +   \
                               std::to_string(__LINE__));                                                   \
  } while (0)

// ---------------------------------------------------------------- scratch

Scratch::~Scratch() {
  if (p_) cudaFree(p_);  // errors ignored: the device may be lost
}

void* Scratch::get(size_t bytes) {
  if (bytes <= bytes_) return p_;
  if (frozen_) throw ScratchFrozen();
  ++generation_;
  if (p_) CUDA_CHECK(cudaFree(p_));
  p_ = nullptr;
  bytes_ = 0;
  bytes = (bytes + (size_t{1} << 20) - 1) >> 20 << 20;
  CUDA_CHECK(cudaMalloc(&p_, bytes));
  bytes_ = bytes;
  return p_;
}

// ---------------------------------------------------------------- matrix-vector

constexpr int kMvWarps = 4;  // weight rows per block, one warp each
constexpr int kMvUnroll = 4;  // groups of 8 weights a lane loads before it multiplies
// Blocks of the matrix-vector kernel an SM keeps resident (at most 72
// registers a thread on sm_90, as before row_dot: 8 bytes spilled for Q6_K):
// its loads in flight are what a decode step's bandwidth needs.
constexpr int kMvMinBlocks = 7;

// Eight activations x[k0 .. k0+7] as floats (16-byte loads for BF16 / F16
// rows when `vec`).
template <class XT>
__device__ __forceinline__ void load8x(const XT* x, bool vec, float (&v)[8]) {
  if constexpr (sizeof(XT) == 2) {
    if (vec) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(x));
      const XT* e = reinterpret_cast<const XT*>(&u);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = to_f(e[i]);
      return;
    }
  } else {
    if (vec) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(x)), b = __ldg(reinterpret_cast<const float4*>(x) + 1);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = to_f(x[i]);
}

// One lane's part of one weight row against R (<= kMatvecRows) activation
// rows xrow(0) .. xrow(nm - 1) (each a pointer to cols elements): the row's
// groups of 8 l, l + 32, ... in order (one FMA chain per activation row),
// then the float tail of rows whose length is not
// a multiple of 8; acc[m] is row m's partial sum, which the caller finishes
// with the fixed butterfly (warp_sum). Groups go kMvUnroll at a time: their
// weight loads issued together (a decode step is bandwidth-bound, and one
// 16-byte load in flight per warp leaves HBM idle), the FMAs in the same
// order as one group at a time. Every matrix-vector kernel goes through
// here, so a row's bits are the same whichever kernel, chunk or call
// computes it.
template <int WT, class XT, int R, class XRow>
__device__ __forceinline__ void row_dot(const uint8_t* row, int64_t cols, bool wvec, const XRow& xrow, int nm,
                                        bool xvec, float (&acc)[R]) {
  const int lane = threadIdx.x & 31;
  const int64_t groups = cols / 8;
#pragma unroll
  for (int m = 0; m < R; ++m) acc[m] = 0.0f;
  auto fma8 = [&](const float (&wv)[8], int64_t g) {
#pragma unroll
    for (int m = 0; m < R; ++m) {
      if (m < nm) {
        float xv[8];
        load8x<XT>(xrow(m) + g * 8, xvec, xv);
        float a = acc[m];
#pragma unroll
        for (int i = 0; i < 8; ++i) a = fmaf(wv[i], xv[i], a);
        acc[m] = a;
      }
    }
  };
  int64_t g = lane;
  for (; g + 32 * (kMvUnroll - 1) < groups; g += 32 * kMvUnroll) {
    float wv[kMvUnroll][8];
#pragma unroll
    for (int u = 0; u < kMvUnroll; ++u) load8<WT>(row, g + 32 * u, wvec, wv[u]);
#pragma unroll
    for (int u = 0; u < kMvUnroll; ++u) fma8(wv[u], g + 32 * u);
  }
  for (; g < groups; g += 32) {
    float wv[8];
    load8<WT>(row, g, wvec, wv);
    fma8(wv, g);
  }
  for (int64_t c = groups * 8 + lane; c < cols; c += 32) {
    const float wv = load1(WT, row, c);
#pragma unroll
    for (int m = 0; m < R; ++m)
      if (m < nm) acc[m] = fmaf(wv, to_f(xrow(m)[c]), acc[m]);
  }
}

// f(x's elements as a typed device pointer): the kernels' activation type.
template <class F>
void on_act_type(Act x, F&& f) {
  switch (act_code(x)) {
    case kF32: return f(static_cast<const float*>(x.data()));
    case kF16: return f(static_cast<const __half*>(x.data()));
    default: return f(static_cast<const __nv_bfloat16*>(x.data()));
  }
}
template <class P>
using pointee_t = std::remove_cv_t<std::remove_pointer_t<P>>;

// One warp per weight row r (row_dot), activation rows in chunks of
// kMatvecRows through the same code, so a row's bits depend on nothing but
// its own x and the weights.
template <int WT, class XT>
__global__ void __launch_bounds__(kMvWarps * 32, kMvMinBlocks)
    matvec_kernel(const uint8_t* __restrict__ w, int64_t w_rows, int64_t row_bytes, int64_t cols, bool wvec,
                  const XT* __restrict__ x, int64_t x_rows, bool xvec, void* __restrict__ y, int yt) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kMvWarps + (threadIdx.x >> 5);
  if (r >= w_rows) return;
  const uint8_t* row = w + r * row_bytes;
  for (int64_t m0 = 0; m0 < x_rows; m0 += kMatvecRows) {
    const int nm = static_cast<int>(x_rows - m0 < kMatvecRows ? x_rows - m0 : kMatvecRows);
    float acc[kMatvecRows];
    row_dot<WT, XT>(row, cols, wvec, [=](int m) { return x + (m0 + m) * cols; }, nm, xvec, acc);
#pragma unroll
    for (int m = 0; m < kMatvecRows; ++m) {
      if (m < nm) {
        const float v = warp_sum(acc[m]);
        if (lane == 0) st(y, yt, (m0 + m) * w_rows + r, v);
      }
    }
  }
}

template <int WT>
void launch_matvec(cudaStream_t s, const WeightView& w, Act x, Act y, int64_t rows) {
  const auto* wp = static_cast<const uint8_t*>(w.data);
  const bool wvec = reinterpret_cast<uintptr_t>(wp) % 16 == 0 && w.row_stride_bytes % 16 == 0;
  const size_t xe = static_cast<size_t>(x.elem_bytes());
  const bool xvec = reinterpret_cast<uintptr_t>(x.data()) % 16 == 0 && (w.cols * xe) % 16 == 0;
  const dim3 grid(static_cast<unsigned>((w.rows + kMvWarps - 1) / kMvWarps));
  on_act_type(x, [&](auto xp) {
    matvec_kernel<WT, pointee_t<decltype(xp)>><<<grid, kMvWarps * 32, 0, s>>>(wp, w.rows, w.row_stride_bytes, w.cols,
                                                                            wvec, xp, rows, xvec, y.data(), act_code(y));
  });
  CUDA_LAUNCHED();
}

void matvec(cudaStream_t s, const WeightView& w, Act x, Act y, int64_t rows) {
  switch (w.type) {
    case DType::BF16: return launch_matvec<kWBF16>(s, w, x, y, rows);
    case DType::F32: return launch_matvec<kWF32>(s, w, x, y, rows);
    case DType::F16: return launch_matvec<kWF16>(s, w, x, y, rows);
    case DType::Q8_0: return launch_matvec<kWQ8_0>(s, w, x, y, rows);
    case DType::Q4_0: return launch_matvec<kWQ4_0>(s, w, x, y, rows);
    case DType::Q4_K: return launch_matvec<kWQ4_K>(s, w, x, y, rows);
    case DType::Q5_K: return launch_matvec<kWQ5_K>(s, w, x, y, rows);
    case DType::Q6_K: return launch_matvec<kWQ6_K>(s, w, x, y, rows);
    case DType::MXFP4: return launch_matvec<kWMXFP4>(s, w, x, y, rows);
    case DType::E4M3_ROWS: return launch_matvec<kWE4M3>(s, w, x, y, rows);
    default:
      throw std::logic_error("CUDA matmul: weights of type " + std::string(dtype_name(w.type)) +
                             " were not prepared for this device (prepare_weights)");
  }
}

// ---------------------------------------------------------------- experts' products

// The experts' matrices of one set as a kernel parameter (one pointer each),
// so a step's routing never leaves the device and nothing is uploaded.
struct ExpertRows {
  const uint8_t* p[kMaxExperts];
};

// The launch arguments the experts' kernels share: each expert's matrix, and
// whether weights and activations take 16-byte loads.
struct ExpertArgs {
  ExpertRows w{};
  bool wvec = true, xvec = true;
  int64_t row_blocks = 0;  // blocks of kMvWarps weight rows (the grid's y, at most 65535)
};
ExpertArgs expert_args(const WeightView* ex, int n_expert, Act x) {
  ExpertArgs a;
  a.wvec = ex[0].row_stride_bytes % 16 == 0;
  for (int e = 0; e < n_expert; ++e) {
    a.w.p[e] = static_cast<const uint8_t*>(ex[e].data);
    a.wvec = a.wvec && reinterpret_cast<uintptr_t>(a.w.p[e]) % 16 == 0;
  }
  const size_t xe = static_cast<size_t>(x.elem_bytes());
  a.xvec = reinterpret_cast<uintptr_t>(x.data()) % 16 == 0 && (ex[0].cols * xe) % 16 == 0;
  a.row_blocks = std::min<int64_t>((ex[0].rows + kMvWarps - 1) / kMvWarps, 65535);
  return a;
}

// Block (slot, 4 weight rows): slot s = r * k + j against expert ids[s]'s
// matrix, one warp per weight row, row_dot for one activation row (exactly
// matvec_kernel's arithmetic for a one-row call, then the fixed butterfly),
// so each slot's row is bit for bit the one-row matmul of its expert,
// whatever the other slots are; the bias (when given) is added to that sum
// before the one rounding to y's type.
template <int WT, class XT>
__global__ void __launch_bounds__(kMvWarps * 32)
    matvec_id_kernel(const __grid_constant__ ExpertRows w, int n_expert, int64_t w_rows, int64_t row_bytes,
                     int64_t cols, bool wvec, const XT* __restrict__ x, int x_per_row, int k,
                     const int32_t* __restrict__ ids, bool xvec, const float* __restrict__ bias,
                     void* __restrict__ y, int yt) {
  const int64_t slot = blockIdx.x;
  const int e = ids[slot];
  if (e < 0 || e >= n_expert) return;  // left untouched, as kernels::matmul_id
  const XT* xr = x + (x_per_row == 1 ? slot / k : slot) * cols;
  const int lane = threadIdx.x & 31;
  for (int64_t rb = blockIdx.y; rb * kMvWarps < w_rows; rb += gridDim.y) {
    const int64_t r = rb * kMvWarps + (threadIdx.x >> 5);
    if (r >= w_rows) continue;
    float acc[1];
    row_dot<WT, XT>(w.p[e] + r * row_bytes, cols, wvec, [&](int) { return xr; }, 1, xvec, acc);
    float v = warp_sum(acc[0]);
    if (lane == 0) {
      if (bias) v += bias[e * w_rows + r];
      st(y, yt, slot * w_rows + r, v);
    }
  }
}

template <int WT>
void launch_matvec_id(cudaStream_t s, const WeightView* ex, int n_expert, Act x, int x_per_row, const int32_t* ids,
                      int64_t slots, int k, const float* bias, Act y) {
  const ExpertArgs a = expert_args(ex, n_expert, x);
  const WeightView& w0 = ex[0];
  const dim3 grid(static_cast<unsigned>(slots), static_cast<unsigned>(a.row_blocks));
  on_act_type(x, [&](auto xp) {
    matvec_id_kernel<WT, pointee_t<decltype(xp)>><<<grid, kMvWarps * 32, 0, s>>>(
        a.w, n_expert, w0.rows, w0.row_stride_bytes, w0.cols, a.wvec, xp, x_per_row, k, ids, a.xvec, bias, y.data(),
        act_code(y));
  });
  CUDA_LAUNCHED();
}

// ---- grouped by expert (policy.h's moe_plan): a counting sort of the slots
// into scratch by one block, then one block per (chunk of up to
// kMoeChunkRows slots of one expert, 4 weight rows).

constexpr int kPlanWarps = 16;  // the sort's segments of slots, one warp each

// One block of kPlanWarps warps writes moe_plan(ids) at n_chunks / chunks /
// order. Warp w counts its segment's slots per expert (__match_any_sync:
// the lanes of one expert add once), warp 0 scans the experts (each lane a
// run of them) into each expert's first sorted index and first chunk and
// each warp's cursor within the expert, then every warp places its
// segment's slots in slot order: by expert, then slot, as moe_plan. Shared:
// (kPlanWarps + 3) * n_expert ints (38 KiB at 512 experts).
__global__ void __launch_bounds__(kPlanWarps * 32)
    moe_plan_kernel(const int32_t* __restrict__ ids, int64_t slots, int n_expert, int chunk, int32_t* n_chunks,
                    int4* __restrict__ chunks, int32_t* __restrict__ order) {
  extern __shared__ int sh[];
  int* cnt = sh;                           // [kPlanWarps][n_expert]: counts, then cursors
  int* tot = sh + kPlanWarps * n_expert;   // slots of expert e
  int* base = tot + n_expert;              // its first sorted index
  int* cbase = base + n_expert;            // its first chunk
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (int i = threadIdx.x; i < kPlanWarps * n_expert; i += blockDim.x) cnt[i] = 0;
  __syncthreads();
  const int64_t seg = (slots + kPlanWarps - 1) / kPlanWarps;
  const int64_t s_begin = min(slots, w * seg), s_end = min(slots, s_begin + seg);
  int* mine = cnt + w * n_expert;
  for (int64_t s0 = s_begin; s0 < s_end; s0 += 32) {
    const int64_t s = s0 + lane;
    int e = s < s_end ? ids[s] : -1;
    if (e >= n_expert) e = -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && lane == __ffs(peers) - 1) mine[e] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();
  if (w == 0) {
    const int per = (n_expert + 31) / 32;
    const int e0 = min(n_expert, lane * per), e1 = min(n_expert, e0 + per);
    int t_run = 0, c_run = 0;
    for (int e = e0; e < e1; ++e) {
      int t = 0;
      for (int k = 0; k < kPlanWarps; ++k) t += cnt[k * n_expert + e];
      tot[e] = t;
      t_run += t;
      c_run += (t + chunk - 1) / chunk;
    }
    int t_inc = t_run, c_inc = c_run;  // inclusive scans over the lanes
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int a = __shfl_up_sync(0xffffffffu, t_inc, d), c = __shfl_up_sync(0xffffffffu, c_inc, d);
      if (lane >= d) t_inc += a, c_inc += c;
    }
    int at = t_inc - t_run, cat = c_inc - c_run;
    for (int e = e0; e < e1; ++e) {
      base[e] = at;
      cbase[e] = cat;
      for (int k = 0; k < kPlanWarps; ++k) {  // warp k's first index among expert e's slots
        const int c = cnt[k * n_expert + e];
        cnt[k * n_expert + e] = at;
        at += c;
      }
      cat += (tot[e] + chunk - 1) / chunk;
    }
    if (lane == 31) *n_chunks = c_inc;
  }
  __syncthreads();
  for (int64_t s0 = s_begin; s0 < s_end; s0 += 32) {
    const int64_t s = s0 + lane;
    int e = s < s_end ? ids[s] : -1;
    if (e >= n_expert) e = -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    if (e >= 0) order[mine[e] + rank] = static_cast<int32_t>(s);
    __syncwarp();
    if (e >= 0 && lane == __ffs(peers) - 1) mine[e] += __popc(peers);
    __syncwarp();
  }
  // The chunk table: chunk c belongs to the last expert whose first chunk is
  // at or before it (experts with no chunk share their successor's).
  const int total = cbase[n_expert - 1] + (tot[n_expert - 1] + chunk - 1) / chunk;
  for (int c = threadIdx.x; c < total; c += blockDim.x) {
    int lo = 0, hi = n_expert - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (cbase[mid] <= c) lo = mid;
      else hi = mid - 1;
    }
    const int j = (c - cbase[lo]) * chunk;
    chunks[c] = make_int4(lo, base[lo] + j, min(chunk, tot[lo] - j), 0);
  }
}

// Block (chunk, 4 weight rows): the chunk's slots (one expert, at most
// kMatvecRows) against that expert's matrix, one warp per weight row, each
// weight group loaded once for the chunk and each slot's sum exactly
// matvec_id_kernel's (one FMA chain per lane over groups l, l + 32, ...,
// the float tail, the fixed butterfly, the bias before the one rounding):
// bit for bit the one-row product, whichever chunk a slot lands in.
template <int WT, class XT>
__global__ void __launch_bounds__(kMvWarps * 32)
    matvec_grouped_kernel(const __grid_constant__ ExpertRows w, int64_t w_rows, int64_t row_bytes, int64_t cols,
                          bool wvec, const XT* __restrict__ x, int x_per_row, int k,
                          const int32_t* __restrict__ n_chunks, const int4* __restrict__ chunks,
                          const int32_t* __restrict__ order, bool xvec, const float* __restrict__ bias,
                          void* __restrict__ y, int yt) {
  if (static_cast<int>(blockIdx.x) >= *n_chunks) return;  // the grid is the bound
  const int4 ch = chunks[blockIdx.x];
  const int e = ch.x, nm = ch.z;
  int64_t slot[kMatvecRows];
  const XT* xr[kMatvecRows];
#pragma unroll
  for (int m = 0; m < kMatvecRows; ++m) {
    slot[m] = m < nm ? order[ch.y + m] : 0;
    xr[m] = x + (x_per_row == 1 ? slot[m] / k : slot[m]) * cols;
  }
  const int lane = threadIdx.x & 31;
  for (int64_t rb = blockIdx.y; rb * kMvWarps < w_rows; rb += gridDim.y) {
    const int64_t r = rb * kMvWarps + (threadIdx.x >> 5);
    if (r >= w_rows) continue;
    float acc[kMatvecRows];
    row_dot<WT, XT>(w.p[e] + r * row_bytes, cols, wvec, [&](int m) { return xr[m]; }, nm, xvec, acc);
#pragma unroll
    for (int m = 0; m < kMatvecRows; ++m) {
      if (m < nm) {
        float v = warp_sum(acc[m]);
        if (lane == 0) {
          if (bias) v += bias[e * w_rows + r];
          st(y, yt, slot[m] * w_rows + r, v);
        }
      }
    }
  }
}

// The plan in scratch (policy.h's moe_plan_bytes), made once per call for
// all its sets.
struct MoeGroups {
  const int32_t* n_chunks;
  const int4* chunks;
  const int32_t* order;
  int64_t bound;
};

MoeGroups plan_moe_groups(cudaStream_t s, Scratch& scratch, const int32_t* ids, int64_t slots, int n_expert) {
  auto* p = static_cast<uint8_t*>(scratch.get(static_cast<size_t>(moe_plan_bytes(slots, n_expert))));
  MoeGroups g;
  g.bound = moe_chunk_bound(slots, n_expert);
  g.n_chunks = reinterpret_cast<const int32_t*>(p);
  g.chunks = reinterpret_cast<const int4*>(p + 16);
  g.order = reinterpret_cast<const int32_t*>(p + 16 + 16 * g.bound);
  const size_t shared = static_cast<size_t>(kPlanWarps + 3) * static_cast<size_t>(n_expert) * sizeof(int);
  moe_plan_kernel<<<1, kPlanWarps * 32, shared, s>>>(ids, slots, n_expert, kMoeChunkRows, reinterpret_cast<int32_t*>(p),
                                                     reinterpret_cast<int4*>(p + 16),
                                                     reinterpret_cast<int32_t*>(p + 16 + 16 * g.bound));
  CUDA_LAUNCHED();
  return g;
}

template <int WT>
void launch_matvec_grouped(cudaStream_t s, const WeightView* ex, int n_expert, Act x, int x_per_row,
                           const MoeGroups& g, int k, const float* bias, Act y) {
  const ExpertArgs a = expert_args(ex, n_expert, x);
  const WeightView& w0 = ex[0];
  const dim3 grid(static_cast<unsigned>(g.bound), static_cast<unsigned>(a.row_blocks));
  on_act_type(x, [&](auto xp) {
    matvec_grouped_kernel<WT, pointee_t<decltype(xp)>><<<grid, kMvWarps * 32, 0, s>>>(
        a.w, w0.rows, w0.row_stride_bytes, w0.cols, a.wvec, xp, x_per_row, k, g.n_chunks, g.chunks, g.order, a.xvec,
        bias, y.data(), act_code(y));
  });
  CUDA_LAUNCHED();
}

// ATELIER_CUDA_MOE_GROUPED=0: every call on matvec_id_kernel (the A/B).
bool moe_grouped_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("ATELIER_CUDA_MOE_GROUPED");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

// One set of experts on the grouped kernel (g: the device's plan) or the per-slot one.
template <int WT>
void launch_expert_set(cudaStream_t s, bool grouped, const WeightView* ex, int n_expert, Act x, int x_per_row,
                       const MoeGroups& g, const int32_t* ids, int64_t slots, int k, const float* bias, Act y) {
  if (grouped) launch_matvec_grouped<WT>(s, ex, n_expert, x, x_per_row, g, k, bias, y);
  else launch_matvec_id<WT>(s, ex, n_expert, x, x_per_row, ids, slots, k, bias, y);
}

void matmul_id(cudaStream_t s, Scratch& scratch, const WeightView* const* experts, const Act* y, const float* const* bias,
               int count, int n_expert, Act x, int x_per_row, const int32_t* ids, int64_t rows, int k) {
  if (rows <= 0 || k <= 0 || count <= 0) return;
  if (n_expert <= 0 || n_expert > kMaxExperts)
    throw std::logic_error("CUDA matmul_id: " + std::to_string(n_expert) + " experts (1 to " +
                           std::to_string(kMaxExperts) + ")");
  if (x_per_row != 1 && x_per_row != k) throw std::logic_error("CUDA matmul_id: x_per_row must be 1 or k");
  const int64_t slots = rows * k;
  if (slots > int64_t{0x7fffffff}) throw std::logic_error("CUDA matmul_id: too many routed rows");
  // Grouped by expert (one sort for all the sets), or a block per slot.
  const bool grouped = moe_grouped(rows, moe_grouped_enabled());
  MoeGroups g{};
  for (int i = 0; i < count && grouped && !g.order; ++i)
    if (experts[i][0].rows > 0) g = plan_moe_groups(s, scratch, ids, slots, n_expert);
  for (int i = 0; i < count; ++i) {
    const WeightView* ex = experts[i];
    const WeightView& w0 = ex[0];
    for (int e = 0; e < n_expert; ++e) {
      const WeightView& v = ex[e];
      if (v.layout != WeightLayout::rows || v.type != w0.type || v.rows != w0.rows || v.cols != w0.cols ||
          v.row_stride_bytes != w0.row_stride_bytes)
        throw std::logic_error("CUDA matmul_id: the experts of a set differ in type, shape or layout "
                               "(each must be prepare_weights' view of one slice)");
    }
    if (w0.rows <= 0) continue;
    const float* b = bias ? bias[i] : nullptr;
    switch (w0.type) {
      case DType::BF16: launch_expert_set<kWBF16>(s, grouped, ex, n_expert, x, x_per_row, g, ids, slots, k, b, y[i]); break;
      case DType::F32: launch_expert_set<kWF32>(s, grouped, ex, n_expert, x, x_per_row, g, ids, slots, k, b, y[i]); break;
      case DType::F16: launch_expert_set<kWF16>(s, grouped, ex, n_expert, x, x_per_row, g, ids, slots, k, b, y[i]); break;
      case DType::Q8_0: launch_expert_set<kWQ8_0>(s, grouped, ex, n_expert, x, x_per_row, g, ids, slots, k, b, y[i]); break;
      case DType::Q4_0: launch_expert_set<kWQ4_0>(s, grouped, ex, n_expert, x, x_per_row, g, ids, slots, k, b, y[i]); break;
      case DType::Q4_K: launch_expert_set<kWQ4_K>(s, grouped, ex, n_expert, x, x_per_row, g, ids, slots, k, b, y[i]); break;
      case DType::Q5_K: launch_expert_set<kWQ5_K>(s, grouped, ex, n_expert, x, x_per_row, g, ids, slots, k, b, y[i]); break;
      case DType::Q6_K: launch_expert_set<kWQ6_K>(s, grouped, ex, n_expert, x, x_per_row, g, ids, slots, k, b, y[i]); break;
      case DType::MXFP4: launch_expert_set<kWMXFP4>(s, grouped, ex, n_expert, x, x_per_row, g, ids, slots, k, b, y[i]); break;
      default:
        throw std::logic_error("CUDA matmul_id: experts of type " + std::string(dtype_name(w0.type)) +
                               " were not prepared for this device (prepare_weights)");
    }
  }
}

// ---------------------------------------------------------------- conversions

__global__ void convert_kernel(const void* x, int xt, void* y, int yt, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    st(y, yt, i, ld(x, xt, i));
}

// Rows of a weight matrix (type wt, src_stride bytes apart) decoded to BF16
// rows of cols elements.
__global__ void rows_to_bf16_kernel(const uint8_t* src, int wt, int64_t src_stride, int64_t cols, int64_t rows,
                                    __nv_bfloat16* dst) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    dst[i] = __float2bfloat16_rn(load1(wt, src + r * src_stride, c));
  }
}

// ---------------------------------------------------------------- cuBLASLt

Gemm::Gemm() {
  CUBLAS_CHECK(cublasLtCreate(&lt_));
  ws_bytes_ = size_t{32} << 20;  // NVIDIA's recommendation for Hopper
  CUDA_CHECK(cudaMalloc(&ws_, ws_bytes_));
}

Gemm::~Gemm() {
  if (ws_) cudaFree(ws_);
  if (lt_) cublasLtDestroy(lt_);
}

namespace {
int alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && a % static_cast<uintptr_t>(al) != 0) al /= 2;
  return al;
}
}  // namespace

void Gemm::bf16(cudaStream_t s, const void* w, int64_t ldw, const void* x, void* d, cudaDataType_t d_type,
                int64_t ldd, int64_t m, int64_t n, int64_t k) {
  run(s, CUDA_R_16BF, w, ldw, x, d, d_type, ldd, m, n, k, false);
}

bool Gemm::run(cudaStream_t s, cudaDataType_t ab, const void* w, int64_t ldw, const void* x, void* d,
               cudaDataType_t d_type, int64_t ldd, int64_t m, int64_t n, int64_t k, bool may_fail) {
  // Column-major, as cuBLAS sees it: D (m x n, ld ldd) = W^T (W: k x m, ld
  // ldw) times X (k x n, ld k). (FP8 needs this "TN" form: it is the only
  // one Hopper's FP8 kernels take.)
  const int aw = alignment_of(w), ax = alignment_of(x), ad = alignment_of(d);
  const Key key{m, n, k, ldw, ldd, static_cast<int>(d_type), aw * 1000000 + ax * 1000 + ad, static_cast<int>(ab)};
  if (may_fail && missing_.count(key)) return false;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a, ab, static_cast<uint64_t>(k), static_cast<uint64_t>(m), ldw));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b, ab, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c, d_type, static_cast<uint64_t>(m), static_cast<uint64_t>(n), ldd));
  const auto release = [&] {
    cublasLtMatrixLayoutDestroy(a), cublasLtMatrixLayoutDestroy(b), cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(op);
  };
  auto it = algos_.find(key);
  if (it == algos_.end()) {
    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t wsb = ws_bytes_;
    const uint32_t ua = static_cast<uint32_t>(aw), ub = static_cast<uint32_t>(ax), ud = static_cast<uint32_t>(ad);
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &ua, sizeof ua));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ub, sizeof ub));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ud, sizeof ud));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ud, sizeof ud));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt_, op, a, b, c, c, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
      release();
      if (may_fail) {
        missing_[key] = true;
        return false;
      }
      throw std::runtime_error(std::string("cuBLASLt has no ") +
                               (ab == CUDA_R_16F ? "FP16" : ab == CUDA_R_8F_E4M3 ? "FP8" : "BF16") +
                               " algorithm for " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
    }
    it = algos_.emplace(key, res.algo).first;
  }
  const float one = 1.0f, zero = 0.0f;
  const cublasStatus_t st = cublasLtMatmul(lt_, op, &one, w, a, x, b, &zero, d, c, d, c, &it->second, ws_, ws_bytes_, s);
  release();
  CUBLAS_CHECK(st);
  return true;
}

// ---------------------------------------------------------------- matmul

// ---- FP8 (E4M3_ROWS weights): activations quantized per row, cuBLASLt's
// FP8 GEMM into F32, then both scales (the weight row's, the activation
// row's) applied while writing y.

// One block per activation row: amax, scale = amax / 448, the codes.
__global__ void quantize_rows_e4m3_kernel(const void* x, int xt, int64_t k, __nv_fp8_storage_t* q, float* scales) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  float m = 0;
  for (int64_t c = threadIdx.x; c < k; c += blockDim.x) m = fmaxf(m, fabsf(ld(x, xt, r * k + c)));
  m = block_max(m, red);
  const float scale = m > 0 ? m / 448.0f : 1.0f, inv = 1.0f / scale;
  for (int64_t c = threadIdx.x; c < k; c += blockDim.x)
    q[r * k + c] = __nv_cvt_float_to_fp8(ld(x, xt, r * k + c) * inv, __NV_SATFINITE, __NV_E4M3);
  if (threadIdx.x == 0) scales[r] = scale;
}

// y[n][r0 + j] = d[n][j] * xs[n] * (weight row r0 + j's scale), j < mr.
__global__ void fp8_epilogue_kernel(const float* d, int64_t mr, int64_t rows, const float* xs, const uint8_t* w,
                                    int64_t w_stride, int64_t r0, int64_t m, void* y, int yt) {
  const int64_t total = rows * mr;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / mr, j = i % mr;
    const float ws = *reinterpret_cast<const float*>(w + (r0 + j) * w_stride);
    st(y, yt, n * m + r0 + j, d[i] * xs[n] * ws);
  }
}

namespace {

size_t round256(size_t n) { return (n + 255) / 256 * 256; }

// False where cuBLASLt has no FP8 algorithm for the shape (the caller then
// takes the BF16 slices).
bool fp8_gemm(cudaStream_t s, Gemm& gemm, Scratch& scratch, const WeightView& w, Act x, Act y, int64_t rows) {
  const int64_t k = w.cols, m = w.rows;
  if (k % 16 != 0 || w.row_stride_bytes % 16 != 0) return false;
  // Slices of weight rows (multiples of 16) whose F32 product fits 64 MiB.
  int64_t slice = std::max<int64_t>(16, kGemmSliceBytes / std::max<int64_t>(1, rows * 4) / 16 * 16);
  slice = std::min(slice, m);
  const size_t q_bytes = round256(static_cast<size_t>(rows * k)), s_bytes = round256(static_cast<size_t>(rows * 4));
  const size_t d_bytes = round256(static_cast<size_t>(rows * slice * 4));
  auto* base = static_cast<uint8_t*>(scratch.get(q_bytes + s_bytes + d_bytes));
  auto* q = reinterpret_cast<__nv_fp8_storage_t*>(base);
  auto* xs = reinterpret_cast<float*>(base + q_bytes);
  auto* d = reinterpret_cast<float*>(base + q_bytes + s_bytes);
  quantize_rows_e4m3_kernel<<<static_cast<unsigned>(rows), 256, 0, s>>>(x.data(), act_code(x), k, q, xs);
  CUDA_LAUNCHED();
  const auto* wp = static_cast<const uint8_t*>(w.data);
  for (int64_t r0 = 0; r0 < m; r0 += slice) {
    const int64_t mr = std::min(slice, m - r0);
    const uint8_t* codes = wp + r0 * w.row_stride_bytes + kE4M3RowHeaderBytes;
    if (!gemm.run(s, CUDA_R_8F_E4M3, codes, w.row_stride_bytes, q, d, CUDA_R_32F, mr, mr, rows, k, true)) {
      if (r0 == 0) return false;
      throw std::logic_error("cuBLASLt's FP8 GEMM took one slice of a matrix and not the next");
    }
    fp8_epilogue_kernel<<<grid_for(rows * mr), 256, 0, s>>>(d, mr, rows, xs, wp, w.row_stride_bytes, r0, m, y.data(),
                                                            act_code(y));
    CUDA_LAUNCHED();
  }
  return true;
}

}  // namespace

void matmul(cudaStream_t s, Gemm& gemm, Scratch& scratch, bool deterministic, const WeightView& w, Act x, Act y,
            int64_t rows) {
  if (rows <= 0 || w.rows <= 0) return;
  if (w.layout != WeightLayout::rows) throw std::logic_error("CUDA matmul: a CPU-packed weight view");
  if (w.type == DType::F32 || matmul_path(w.type, rows, deterministic) == MatmulPath::matvec)
    return matvec(s, w, x, y, rows);
  if (w.type == DType::E4M3_ROWS && gemm.fp8 && fp8_gemm(s, gemm, scratch, w, x, y, rows)) return;

  // GEMM: X as the weights' 16-bit type (F16 for F16 weights, else BF16),
  // D as F32 or that type where y is one of them (else through an F32 copy).
  const bool half = w.type == DType::F16;
  const DType ab = half ? DType::F16 : DType::BF16;
  const cudaDataType_t ab_cuda = half ? CUDA_R_16F : CUDA_R_16BF;
  const int ab_code = half ? kF16 : kBF16;
  const int64_t k = w.cols, m = w.rows;
  const bool quant = !gemm_direct(w.type);  // dequantized to BF16 slices first
  const int64_t slice = quant ? gemm_slice_rows(m, k) : m;
  const bool x_direct = x.type() == ab, y_direct = y.type() == DType::F32 || y.type() == ab;
  const size_t x_bytes = x_direct ? 0 : round256(static_cast<size_t>(rows * k * 2));
  const size_t w_bytes = quant ? round256(static_cast<size_t>(slice * k * 2)) : 0;
  const size_t y_bytes = y_direct ? 0 : round256(static_cast<size_t>(rows * m * 4));
  auto* base = static_cast<uint8_t*>(scratch.get(std::max<size_t>(x_bytes + w_bytes + y_bytes, 256)));
  const void* xb = x.data();
  if (!x_direct) {
    convert_kernel<<<grid_for(rows * k), 256, 0, s>>>(x.data(), act_code(x), base, ab_code, rows * k);
    CUDA_LAUNCHED();
    xb = base;
  }
  void* d = y_direct ? y.data() : base + x_bytes + w_bytes;
  const cudaDataType_t dt = y.type() == DType::F32 || !y_direct ? CUDA_R_32F : ab_cuda;
  const int64_t d_elem = dt == CUDA_R_32F ? 4 : 2;
  for (int64_t r0 = 0; r0 < m; r0 += slice) {
    const int64_t mr = std::min(slice, m - r0);
    const uint8_t* wp = static_cast<const uint8_t*>(w.data) + r0 * w.row_stride_bytes;
    int64_t ldw = w.row_stride_bytes / 2;
    if (quant) {
      rows_to_bf16_kernel<<<grid_for(mr * k), 256, 0, s>>>(wp, static_cast<int>(w.type), w.row_stride_bytes, k, mr,
                                                            reinterpret_cast<__nv_bfloat16*>(base + x_bytes));
      CUDA_LAUNCHED();
      wp = base + x_bytes;
      ldw = k;
    }
    gemm.run(s, ab_cuda, wp, ldw, xb, static_cast<uint8_t*>(d) + r0 * d_elem, dt, m, mr, rows, k, false);
  }
  if (!y_direct) {
    convert_kernel<<<grid_for(rows * m), 256, 0, s>>>(d, kF32, y.data(), act_code(y), rows * m);
    CUDA_LAUNCHED();
  }
}

// ---------------------------------------------------------------- get_rows

__global__ void get_rows_kernel(const uint8_t* table, int wt, int64_t stride, int64_t cols, const int32_t* ids,
                                void* y, int yt) {
  const int64_t r = blockIdx.x;
  const uint8_t* row = table + int64_t{ids[r]} * stride;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) st(y, yt, r * cols + c, load1(wt, row, c));
}

void get_rows(cudaStream_t s, const WeightView& table, const int32_t* ids, Act y, int64_t rows) {
  if (rows <= 0) return;
  if (table.layout != WeightLayout::rows || !device_readable(table.type))
    throw std::logic_error("CUDA get_rows: a table of type " + std::string(dtype_name(table.type)) +
                           " not prepared for this device");
  get_rows_kernel<<<static_cast<unsigned>(rows), 256, 0, s>>>(static_cast<const uint8_t*>(table.data),
                                                               static_cast<int>(table.type), table.row_stride_bytes,
                                                               table.cols, ids, y.data(), act_code(y));
  CUDA_LAUNCHED();
}

// ---------------------------------------------------------------- preparing weights

// Rows of F32 (or F16 / BF16: type st) `src_stride` bytes apart, as
// E4M3_ROWS rows of dst_stride bytes: one block per row finds its max |x|
// (the scale: max / 448), then writes the header and the codes (round to
// nearest even, saturating), as kernels::quantize_row(E4M3_ROWS) does.
__global__ void rows_to_e4m3_kernel(const uint8_t* src, int wt, int64_t src_stride, int64_t cols, uint8_t* dst,
                                    int64_t dst_stride) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const uint8_t* row = src + r * src_stride;
  float m = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, fabsf(load1(wt, row, c)));
  m = block_max(m, red);
  const float scale = m > 0 ? m / 448.0f : 1.0f;
  uint8_t* out = dst + r * dst_stride;
  if (threadIdx.x < 4) reinterpret_cast<float*>(out)[threadIdx.x] = threadIdx.x == 0 ? scale : 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    out[16 + c] = __nv_cvt_float_to_fp8(load1(wt, row, c) / scale, __NV_SATFINITE, __NV_E4M3);
}

// Rows of type wt decoded and stored as F16 (yt kF16) or BF16 rows of cols elements.
__global__ void rows_to_16_kernel(const uint8_t* src, int wt, int64_t src_stride, int64_t cols, int64_t rows, void* dst,
                                  int yt) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    st(dst, yt, i, load1(wt, src + r * src_stride, c));
  }
}

WeightView prepare_weights_at(cudaStream_t s, const WeightView& w, void* dst, WeightPrecision p) {
  const DType dt = device_weight_type(w, p);
  const int64_t dst_row = dtype_row_bytes(dt, w.cols);
  WeightView v = w;
  v.type = dt;
  v.data = dst;
  v.row_stride_bytes = dst_row;
  v.layout = WeightLayout::rows;
  if (w.rows <= 0) return v;
  if (dt == w.type && w.layout == WeightLayout::rows) {  // kept as it is: GGML's rows, back to back
    CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_row), w.data, static_cast<size_t>(w.row_stride_bytes),
                                 static_cast<size_t>(dst_row), static_cast<size_t>(w.rows), cudaMemcpyDefault, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    return v;
  }
  // To the precision's type on the device, in slices of rows: F32 / F16 /
  // BF16 rows go up as they are; any other type or layout is decoded to F32
  // on the host first.
  const bool raw = w.layout == WeightLayout::rows &&
                   (w.type == DType::F32 || w.type == DType::F16 || w.type == DType::BF16);
  const int64_t src_row = raw ? dtype_row_bytes(w.type, w.cols) : w.cols * 4;
  const int64_t slice = std::max<int64_t>(1, std::min<int64_t>(w.rows, (int64_t{32} << 20) / src_row));
  const int src_type = raw ? static_cast<int>(w.type) : kWF32;
  void* stage = nullptr;
  CUDA_CHECK(cudaMalloc(&stage, static_cast<size_t>(slice * src_row)));
  std::vector<float> host;
  try {
    for (int64_t r0 = 0; r0 < w.rows; r0 += slice) {
      const int64_t n = std::min(slice, w.rows - r0);
      if (raw) {
        CUDA_CHECK(cudaMemcpy2D(stage, static_cast<size_t>(src_row),
                                static_cast<const uint8_t*>(w.data) + r0 * w.row_stride_bytes,
                                static_cast<size_t>(w.row_stride_bytes), static_cast<size_t>(src_row),
                                static_cast<size_t>(n), cudaMemcpyDefault));
      } else {
        host.resize(static_cast<size_t>(n * w.cols));
        for (int64_t r = 0; r < n; ++r) dequantize_weight_row(w, r0 + r, host.data() + r * w.cols);
        CUDA_CHECK(cudaMemcpy(stage, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
      }
      uint8_t* out = static_cast<uint8_t*>(dst) + r0 * dst_row;
      if (dt == DType::E4M3_ROWS) {
        rows_to_e4m3_kernel<<<static_cast<unsigned>(n), 256, 0, s>>>(static_cast<const uint8_t*>(stage), src_type,
                                                                     src_row, w.cols, out, dst_row);
      } else {
        rows_to_16_kernel<<<grid_for(n * w.cols), 256, 0, s>>>(static_cast<const uint8_t*>(stage), src_type, src_row,
                                                               w.cols, n, out, dt == DType::F16 ? kF16 : kBF16);
      }
      CUDA_LAUNCHED();
      CUDA_CHECK(cudaStreamSynchronize(s));
    }
  } catch (...) {
    cudaFree(stage);
    throw;
  }
  CUDA_CHECK(cudaFree(stage));
  return v;
}

}  // namespace atelier::kernels::cuda
