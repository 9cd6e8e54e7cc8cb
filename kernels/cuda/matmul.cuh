// Products and weights on the device: the matrix-vector kernels (decode),
// cuBLASLt BF16 GEMM (prefill, large batches), weight preparation, get_rows.
#pragma once

#include <cublasLt.h>

#include <map>
#include <tuple>

#include "common.cuh"

namespace atelier::kernels::cuda {

// Device memory reused by one stream's ops (the GEMM path's converted
// activations and dequantized slices, attention partials). Grows to the
// largest call seen and stays: a runner's first step of each shape bucket
// allocates, the later ones (and a CUDA graph captured after a warm-up)
// do not. Each growth moves it (generation() counts them): graphs captured
// before point at freed memory and are dropped. While a step is captured
// (freeze) it may not grow: get() throws ScratchFrozen instead of freeing
// and allocating inside the capture.
struct ScratchFrozen : std::runtime_error {
  ScratchFrozen() : std::runtime_error("the step's scratch memory must grow during a graph capture") {}
};
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch();
  void* get(size_t bytes);
  uint64_t generation() const { return generation_; }
  void freeze(bool on) { frozen_ = on; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
  uint64_t generation_ = 0;
  bool frozen_ = false;
};

// cuBLASLt on one stream: its handle, a workspace allocated once, and the
// algorithm chosen per shape (the heuristic's first, cached).
class Gemm {
 public:
  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  // D[n][ldd] (row n of `n` activation rows, `m` outputs) = X[n][k] W[m][k]^T:
  // W and X BF16 (W rows ldw elements apart, X rows k apart), D of type
  // d_type (CUDA_R_32F or CUDA_R_16BF), FP32 accumulation.
  void bf16(cudaStream_t s, const void* w, int64_t ldw, const void* x, void* d, cudaDataType_t d_type, int64_t ldd,
            int64_t m, int64_t n, int64_t k);
  // The same for W and X of type ab (CUDA_R_16BF, CUDA_R_16F, CUDA_R_8F_E4M3;
  // D of a type cuBLASLt pairs with it). may_fail: false instead of a throw
  // when cuBLASLt has no algorithm for it (remembered per shape).
  bool run(cudaStream_t s, cudaDataType_t ab, const void* w, int64_t ldw, const void* x, void* d,
           cudaDataType_t d_type, int64_t ldd, int64_t m, int64_t n, int64_t k, bool may_fail);
  // Whether E4M3_ROWS products above the matrix-vector sizes run cuBLASLt's
  // FP8 GEMM (compute capability 8.9+, unless ATELIER_CUDA_FP8_GEMM=0; the
  // backend sets it) rather than BF16 slices dequantized from them.
  bool fp8 = false;

 private:
  cublasLtHandle_t lt_ = nullptr;
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int>;

  std::map<Key, cublasLtMatmulAlgo_t> algos_;
  std::map<Key, bool> missing_;  // shapes (and types) cuBLASLt had no algorithm for
};

// y = x W^T for `rows` activation rows (Backend::matmul). w: a prepared view
// (policy.h's device types) or raw device rows of F32 / F16.
void matmul(cudaStream_t s, Gemm& gemm, Scratch& scratch, bool deterministic, const WeightView& w, Act x, Act y,
            int64_t rows);
// Backend::matmul_id: each slot's row the one-row matrix-vector product of
// its expert (bit for bit matmul's one-row call: batch-invariant at any row
// count). From 2 token rows the slots are grouped by expert on the device
// (a counting sort into scratch, policy.h's moe_plan), one launch per set
// over (chunk of up to kMatvecRows slots of one expert, 4 weight rows), so
// a weight row is read once per chunk; one token row (or
// ATELIER_CUDA_MOE_GROUPED=0) one launch per set over (slot, 4 weight rows).
// At most kMaxExperts experts (their pointers travel as a kernel parameter).
constexpr int kMaxExperts = 512;
void matmul_id(cudaStream_t s, Scratch& scratch, const WeightView* const* experts, const Act* y, const float* const* bias, int count,
               int n_expert, Act x, int x_per_row, const int32_t* ids, int64_t rows, int k);
// Backend::get_rows: decoded rows of a device table of any readable type.
void get_rows(cudaStream_t s, const WeightView& table, const int32_t* ids, Act y, int64_t rows);
// Writes w as the device keeps it (policy.h) at dst (device memory,
// prepared_bytes(w) bytes); returns its view. Synchronous (load time).
WeightView prepare_weights_at(cudaStream_t s, const WeightView& w, void* dst,
                              WeightPrecision p = WeightPrecision::bf16);
// Backend::fill_random drawn on the device (float types, E4M3_ROWS, Q8_0,
// Q4_0, Q4_K, Q5_K, Q6_K): each element or block from a hash of (seed + row,
// position), the same distribution as the host's draw (not its bits);
// false for another type (the host default draws it).
bool fill_random(cudaStream_t s, void* dst, DType t, int64_t rows, int64_t cols, uint64_t seed, float scale);

}  // namespace atelier::kernels::cuda
