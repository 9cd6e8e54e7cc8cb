// The GPU's ceilings, measured in the device check's own run (issue 33), so
// each benchmark figure is read beside what this GPU did at that moment:
//   hbm_read_gb_s      a streaming read kernel (16-byte loads, every byte once)
//   copy_gb_s          cudaMemcpyAsync device to device, read + write bytes
//   bf16_8192_tflops   cuBLASLt BF16 x BF16 -> BF16, FP32 accumulation, 8192^3
//   bf16_prefill_tflops  the same at 2048 tokens x 14336 x 4096 (an 8B's FFN in prefill)
//   fp8_8192_tflops    cuBLASLt E4M3 x E4M3 -> BF16 at 8192^3 (compute capability 8.9+)
//   fp8_prefill_tflops the same at 2048 x 14336 x 4096
// One "ceiling NAME VALUE" line each (device-check.sh reads them), "ceiling
// NAME n/a: why" where one cannot run. Best of several timed repetitions
// after a warm-up. Built by tests/cuda/pack.sh (nvcc, cuBLASLt) and by CMake
// where the CUDA module is (so CI compiles it).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::printf("error %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

__global__ void read_kernel(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const uint4 v = __ldcs(p + i);  // streaming: no reuse
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads; practically never written
}

__global__ void fill_kernel(uint8_t* p, size_t n, uint8_t v) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    p[i] = static_cast<uint8_t>(v + (i * 2654435761u >> 24) % 7);  // small finite values in any 8/16-bit type
}

template <class F>
float best_ms(int reps, F&& f) {
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  f();  // warm-up
  float best = 1e30f;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    best = std::min(best, ms);
  }
  cudaEventDestroy(a), cudaEventDestroy(b);
  return best;
}

// D (m x n) = W^T X with W k x m and X k x n (column-major: the "TN" form
// FP8 needs), the heuristic's first algorithm; TFLOP/s, or < 0 with why.
double gemm_tflops(cublasLtHandle_t lt, void* ws, size_t ws_bytes, cudaDataType_t ab, int64_t m, int64_t n, int64_t k,
                   std::string* why) {
  const size_t e = ab == CUDA_R_8F_E4M3 ? 1 : 2;
  void *w = nullptr, *x = nullptr, *d = nullptr;
  if (cudaMalloc(&w, m * k * e) != cudaSuccess || cudaMalloc(&x, k * n * e) != cudaSuccess ||
      cudaMalloc(&d, m * n * 2) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(w), cudaFree(x), cudaFree(d);
    *why = "out of memory";
    return -1;
  }
  // Bytes around 0x3c (BF16: about 0.01) or 0x30 (E4M3: about 0.5): finite
  // values, which is all the timing needs.
  fill_kernel<<<4096, 256>>>(static_cast<uint8_t*>(w), m * k * e, e == 1 ? 0x30 : 0x3c);
  fill_kernel<<<4096, 256>>>(static_cast<uint8_t*>(x), k * n * e, e == 1 ? 0x30 : 0x3c);
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  cublasLtMatrixLayoutCreate(&a, ab, k, m, k);
  cublasLtMatrixLayoutCreate(&b, ab, k, n, k);
  cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, m, n, m);
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulPreferenceCreate(&pref);
  const uint64_t wsb = ws_bytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 1, &res, &found);
  double tflops = -1;
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
    *why = "cuBLASLt has no algorithm (status " + std::to_string(static_cast<int>(hs)) + ")";
  } else {
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    const float ms = best_ms(10, [&] {
      st = cublasLtMatmul(lt, op, &one, w, a, x, b, &zero, d, c, d, c, &res.algo, ws, ws_bytes, 0);
    });
    if (st != CUBLAS_STATUS_SUCCESS || cudaDeviceSynchronize() != cudaSuccess)
      *why = "cublasLtMatmul failed (status " + std::to_string(static_cast<int>(st)) + ")";
    else
      tflops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / (ms * 1e-3) / 1e12;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(a), cublasLtMatrixLayoutDestroy(b), cublasLtMatrixLayoutDestroy(c);
  cublasLtMatmulDescDestroy(op);
  cudaFree(w), cudaFree(x), cudaFree(d);
  return tflops;
}

}  // namespace

int main() {
  int dev = 0;
  cudaDeviceProp p{};
  if (!ok(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties")) return 1;
  std::printf("gpu %s, compute capability %d.%d, %.1f GiB, %d SMs\n", p.name, p.major, p.minor,
              p.totalGlobalMem / 1073741824.0, p.multiProcessorCount);
  const int cc = p.major * 10 + p.minor;

  // HBM read and device copy over 4 GiB (far above any L2).
  const size_t bytes = size_t{4} << 30;
  void *buf = nullptr, *buf2 = nullptr;
  unsigned* sink = nullptr;
  if (!ok(cudaMalloc(&buf, bytes), "cudaMalloc 4 GiB") || !ok(cudaMalloc(&buf2, bytes), "cudaMalloc 4 GiB") ||
      !ok(cudaMalloc(&sink, sizeof(unsigned)), "cudaMalloc"))
    return 1;
  cudaMemset(buf, 1, bytes);
  cudaMemset(buf2, 2, bytes);
  const size_t n16 = bytes / 16;
  const int blocks = p.multiProcessorCount * 8;
  const float read_ms = best_ms(10, [&] { read_kernel<<<blocks, 512>>>(static_cast<const uint4*>(buf), n16, sink); });
  if (!ok(cudaDeviceSynchronize(), "read kernel")) return 1;
  std::printf("ceiling hbm_read_gb_s %.1f\n", bytes / (read_ms * 1e-3) / 1e9);
  const float copy_ms = best_ms(10, [&] { cudaMemcpyAsync(buf2, buf, bytes, cudaMemcpyDeviceToDevice, 0); });
  if (!ok(cudaDeviceSynchronize(), "device copy")) return 1;
  std::printf("ceiling copy_gb_s %.1f\n", 2.0 * bytes / (copy_ms * 1e-3) / 1e9);
  cudaFree(buf), cudaFree(buf2), cudaFree(sink);

  cublasLtHandle_t lt = nullptr;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
    std::printf("error cublasLtCreate failed\n");
    return 1;
  }
  const size_t ws_bytes = size_t{32} << 20;
  void* ws = nullptr;
  if (!ok(cudaMalloc(&ws, ws_bytes), "cudaMalloc workspace")) return 1;
  struct Shape {
    const char* name;
    int64_t m, n, k;  // outputs, tokens, inner
  } shapes[] = {{"8192", 8192, 8192, 8192}, {"prefill", 14336, 2048, 4096}};
  for (const Shape& s : shapes) {
    std::string why;
    const double t = gemm_tflops(lt, ws, ws_bytes, CUDA_R_16BF, s.m, s.n, s.k, &why);
    if (t > 0) std::printf("ceiling bf16_%s_tflops %.1f\n", s.name, t);
    else std::printf("ceiling bf16_%s_tflops n/a: %s\n", s.name, why.c_str());
  }
  for (const Shape& s : shapes) {
    if (cc < 89) {
      std::printf("ceiling fp8_%s_tflops n/a: compute capability %d.%d has no FP8\n", s.name, p.major, p.minor);
      continue;
    }
    std::string why;
    const double t = gemm_tflops(lt, ws, ws_bytes, CUDA_R_8F_E4M3, s.m, s.n, s.k, &why);
    if (t > 0) std::printf("ceiling fp8_%s_tflops %.1f\n", s.name, t);
    else std::printf("ceiling fp8_%s_tflops n/a: %s\n", s.name, why.c_str());
  }
  cudaFree(ws);
  cublasLtDestroy(lt);
  return 0;
}
