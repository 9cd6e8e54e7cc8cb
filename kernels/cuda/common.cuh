// Shared by every file of the CUDA module: errors (CUDA_CHECK, device loss),
// activation loads and stores in any of F32 / F16 / BF16, warp and block sums.
#pragma once

#include <atelier/backend.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace atelier::kernels::cuda {

// Throws for a failed CUDA call: std::runtime_error naming the statement,
// file and line. A sticky error (the context is unusable: an illegal
// address, a launch failure, an ECC error, a lost device) first marks the
// current device lost, and the message then starts with "CUDA device lost:",
// which the host side reads to requeue the device's jobs on another device.
[[noreturn]] void cuda_fail(cudaError_t e, const char* stmt, const char* file, int line);
// Whether an error leaves the CUDA context unusable (see cuda_fail).
bool is_sticky(cudaError_t e);
// Throws "CUDA device lost: ..." when `device` was marked lost.
void check_alive(int device);

#define CUDA_CHECK(stmt)                                                                     \
  do {                                                                                       \
    const cudaError_t atelier_cuda_e_ = (stmt);                                              \
    if (atelier_cuda_e_ != cudaSuccess) ::atelier::kernels::cuda::cuda_fail(atelier_cuda_e_, #stmt, __FILE__, __LINE__); \
  } while (0)
// After a launch: a bad configuration is reported here, a fault at the next sync.
#define CUDA_LAUNCHED() CUDA_CHECK(cudaGetLastError())

// Activation element types as kernels see them (DType's numbers).
constexpr int kF32 = 0, kF16 = 1, kBF16 = 30;

__device__ __forceinline__ float ld(const void* p, int t, int64_t i) {
  if (t == kF32) return static_cast<const float*>(p)[i];
  if (t == kF16) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}
__device__ __forceinline__ void st(void* p, int t, int64_t i, float v) {
  if (t == kF32) static_cast<float*>(p)[i] = v;
  else if (t == kF16) static_cast<__half*>(p)[i] = __float2half_rn(v);
  else static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
}
// The value v becomes once stored in type t (what a reader of it sees).
__device__ __forceinline__ float rounded(int t, float v) {
  if (t == kF32) return v;
  if (t == kF16) return __half2float(__float2half_rn(v));
  return __bfloat162float(__float2bfloat16_rn(v));
}

// Typed loads for the templated kernels (x of a product).
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

// Sums over a warp by a fixed butterfly: every lane gets the same bits.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// A block's sum (blockDim.x a multiple of 32, at most 1024), the same fixed
// tree for a given blockDim: each warp's butterfly, then the warps' sums in
// order. Every thread gets the result. `scratch`: 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float s = 0;
  for (int w = 0; w < warps; ++w) s += scratch[w];
  return s;
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < warps; ++w) m = fmaxf(m, scratch[w]);
  return m;
}

inline int act_code(const Act& a) {
  const DType t = a.type();
  if (t != DType::F32 && t != DType::F16 && t != DType::BF16)
    throw std::logic_error("CUDA backend: activations must be F32, F16 or BF16");
  return static_cast<int>(t);
}

// Blocks for n elements at `threads` per block (grid-stride loops cover the rest).
inline unsigned grid_for(int64_t n, int threads = 256) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : b > 65535 * 8 ? 65535 * 8 : b);
}

}  // namespace atelier::kernels::cuda
