// The CUDA backend's choices, as plain host functions (no CUDA headers), so
// the op suite's host tests check them without a GPU: what type a matrix is
// kept in on the device, its prepared bytes, and which product kernel a
// call takes by its row count.
#pragma once

#include <atelier/backend.h>
#include <atelier/kernels.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace atelier::kernels::cuda {

// The weight types the device kernels read in GGML's own blocks (the
// dequantization fused into the products; MXFP4: gpt-oss's experts).
inline bool kept_quantized(DType t) {
  return t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K ||
         t == DType::MXFP4;
}

// The type a matrix has on the device at precision p (Backend::set_weight_precision):
// quantized types above as they are; everything else (F32, F16, BF16, the
// other GGML types, CPU-packed views) as the precision's type: BF16 or F16
// (the tensor cores' 16-bit types), or E4M3_ROWS for fp8 where the rows are
// whole 16-element groups (cuBLASLt's FP8 alignment; BF16 otherwise). FP32
// accumulation in every case.
inline DType device_weight_type(const WeightView& w, WeightPrecision p = WeightPrecision::bf16) {
  if (w.layout == WeightLayout::rows && kept_quantized(w.type)) return w.type;
  if (w.layout == WeightLayout::rows && w.type == DType::E4M3_ROWS) return w.type;  // already prepared (fill_random)
  switch (p) {
    case WeightPrecision::fp16: return DType::F16;
    case WeightPrecision::fp8_e4m3: return w.cols % 16 == 0 ? DType::E4M3_ROWS : DType::BF16;
    default: return DType::BF16;
  }
}

// Bytes of a row on the device (GGML's row bytes; BF16 / F16: 2 per element;
// E4M3_ROWS: 16 + 1 per element).
inline int64_t device_row_bytes(const WeightView& w, WeightPrecision p = WeightPrecision::bf16) {
  return dtype_row_bytes(device_weight_type(w, p), w.cols);
}

// Backend::prepared_weight_bytes: rows back to back, rounded up to 64 bytes.
inline int64_t prepared_bytes(const WeightView& w, WeightPrecision p = WeightPrecision::bf16) {
  return (w.rows * device_row_bytes(w, p) + 63) / 64 * 64;
}

// Whether a device type is one of the float product types the GEMM path
// feeds cuBLASLt directly (no dequantized slice): BF16 and F16 (and
// E4M3_ROWS through the FP8 GEMM where the device has it).
inline bool gemm_direct(DType t) { return t == DType::BF16 || t == DType::F16; }

// Which product kernel a call runs (kernels/README.md, CUDA):
//   matvec: the module's matrix-vector kernels, chunks of kMatvecRows
//           activation rows per launch; a row's bits never depend on the
//           other rows (one warp per weight row, a fixed reduction tree).
//   gemm:   cuBLASLt BF16 x BF16 (F16 x F16 for FP16 weights) -> FP32
//           accumulation; quantized weights are first dequantized to BF16
//           in slices of the workspace; E4M3_ROWS weights run cuBLASLt's
//           FP8 GEMM with the activations quantized per row to E4M3 (both
//           scales applied after it), or the BF16 slices where it has none.
enum class MatmulPath { matvec, gemm };
constexpr int64_t kMatvecRows = 8;
// Quantized weights stay on the matrix-vector kernels longer: each chunk of
// 8 rows re-reads the (small) quantized matrix, where the GEMM path first
// writes and reads a BF16 copy of it (2-4x its bytes).
constexpr int64_t kMatvecRowsQuantized = 32;
inline MatmulPath matmul_path(DType device_type, int64_t rows, bool deterministic) {
  if (deterministic) return MatmulPath::matvec;
  return rows <= (kept_quantized(device_type) ? kMatvecRowsQuantized : kMatvecRows) ? MatmulPath::matvec
                                                                                    : MatmulPath::gemm;
}

// The GEMM path's dequantized BF16 slice of a quantized matrix: as many
// whole weight rows as fit kGemmSliceBytes (at least one).
constexpr int64_t kGemmSliceBytes = int64_t{64} << 20;
inline int64_t gemm_slice_rows(int64_t rows, int64_t cols) {
  const int64_t n = kGemmSliceBytes / (cols * 2);
  return n < 1 ? 1 : n > rows ? rows : n;
}

// Mixtures of experts (matmul_id) grouped by expert: a step's routed slots
// (row * k + j) sorted by expert by a counting sort on the device (stable:
// ascending slot within an expert; ids outside [0, n_expert) left out), and
// each expert's run cut into chunks of at most kMoeChunkRows slots; one
// block row of the grouped kernel per chunk reads each weight row once for
// the chunk's slots, each slot with the one-row product's arithmetic. The
// grid is sized by moe_chunk_bound (no host sync: the device writes the
// chunk count, blocks past it return). moe_plan is what the device's
// planning kernel writes, as a plain function (CudaPolicy tests).
constexpr int kMoeChunkRows = static_cast<int>(kMatvecRows);
// Grouped from this many token rows (one row's k slots are k distinct
// experts: nothing to share), unless ATELIER_CUDA_MOE_GROUPED=0.
constexpr int64_t kMoeGroupedMinRows = 2;
inline bool moe_grouped(int64_t rows, bool enabled) { return enabled && rows >= kMoeGroupedMinRows; }
struct MoeChunk {
  int32_t expert = 0, start = 0, count = 0;  // start: index into the sorted slots
  bool operator==(const MoeChunk&) const = default;
};
// The most chunks any routing of `slots` slots over n_expert experts makes:
// sum over experts of ceil(c_e / chunk) <= ceil(slots / chunk) + (experts
// hit), and never more than one per slot.
inline int64_t moe_chunk_bound(int64_t slots, int n_expert, int chunk = kMoeChunkRows) {
  if (slots <= 0) return 0;
  return std::min<int64_t>(slots, (slots + chunk - 1) / chunk + std::min<int64_t>(n_expert, slots));
}
struct MoePlan {
  std::vector<int32_t> order;    // the routed slots, by expert then slot
  std::vector<MoeChunk> chunks;  // by expert, then position in its run
};
inline MoePlan moe_plan(const int32_t* ids, int64_t slots, int n_expert, int chunk = kMoeChunkRows) {
  MoePlan p;
  std::vector<int64_t> count(static_cast<size_t>(n_expert), 0), next(static_cast<size_t>(n_expert), 0);
  for (int64_t s = 0; s < slots; ++s)
    if (ids[s] >= 0 && ids[s] < n_expert) ++count[static_cast<size_t>(ids[s])];
  int64_t at = 0;
  for (int e = 0; e < n_expert; ++e) {
    next[static_cast<size_t>(e)] = at;
    for (int64_t j = 0; j < count[static_cast<size_t>(e)]; j += chunk)
      p.chunks.push_back({e, static_cast<int32_t>(at + j),
                          static_cast<int32_t>(std::min<int64_t>(chunk, count[static_cast<size_t>(e)] - j))});
    at += count[static_cast<size_t>(e)];
  }
  p.order.resize(static_cast<size_t>(at));
  for (int64_t s = 0; s < slots; ++s)
    if (ids[s] >= 0 && ids[s] < n_expert) p.order[static_cast<size_t>(next[static_cast<size_t>(ids[s])]++)] = static_cast<int32_t>(s);
  return p;
}
// The plan's scratch: the chunk count (16 bytes), the chunk table (16 bytes
// a chunk, at the bound), then the sorted slots (int32).
inline int64_t moe_plan_bytes(int64_t slots, int n_expert) {
  return 16 + 16 * moe_chunk_bound(slots, n_expert) + 4 * slots;
}

// Paged attention splits each row's positions into chunks of this many
// (flash-decoding): the chunks of one row are combined in order, so a row's
// result depends only on its own length, never on the other rows.
constexpr int kAttnChunk = 512;
constexpr int attn_chunks(int64_t positions) {
  return positions <= 0 ? 0 : static_cast<int>((positions + kAttnChunk - 1) / kAttnChunk);
}

// Whether paged attention sends runs of prefill rows to the tiled
// tensor-core kernel (flash_plan.h): on unless ATELIER_CUDA_FLASH_PREFILL=0
// (`env`, the device check's A/B), and never in deterministic mode, whose
// batch invariance the tile path would break (a row's bits would depend on
// how the scheduler chunked its prompt).
inline bool flash_prefill_on(const char* env, bool deterministic) {
  return !deterministic && !(env && env[0] == '0' && env[1] == '\0');
}

// Memory held back from admission: cuBLASLt's workspace, the GEMM path's
// slices and the attention partials, plus the driver's own margin.
constexpr int64_t kReservedBytes = int64_t{512} << 20;

}  // namespace atelier::kernels::cuda
