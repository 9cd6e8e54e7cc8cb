// The CUDA backend's choices, as plain host functions (no CUDA headers), so
// the op suite's host tests check them without a GPU: what type a matrix is
// kept in on the device, its prepared bytes, and which product kernel a
// call takes by its row count.
#pragma once

#include <atelier/kernels.h>

#include <cstdint>

namespace atelier::kernels::cuda {

// The weight types the device kernels read in GGML's own blocks (the
// dequantization fused into the products).
inline bool kept_quantized(DType t) {
  return t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
}

// The type a matrix has on the device: quantized types above as they are,
// everything else (F32, F16, BF16, the other GGML types, CPU-packed views)
// as BF16: the tensor cores' type, FP32 accumulation.
inline DType device_weight_type(const WeightView& w) {
  return w.layout == WeightLayout::rows && kept_quantized(w.type) ? w.type : DType::BF16;
}

// Bytes of a row on the device (GGML's row bytes, BF16: 2 per element).
inline int64_t device_row_bytes(const WeightView& w) { return dtype_row_bytes(device_weight_type(w), w.cols); }

// Backend::prepared_weight_bytes: rows back to back, rounded up to 64 bytes.
inline int64_t prepared_bytes(const WeightView& w) { return (w.rows * device_row_bytes(w) + 63) / 64 * 64; }

// Which product kernel a call runs (kernels/README.md, CUDA):
//   matvec: the module's matrix-vector kernels, chunks of kMatvecRows
//           activation rows per launch; a row's bits never depend on the
//           other rows (one warp per weight row, a fixed reduction tree).
//   gemm:   cuBLASLt BF16 x BF16 -> FP32 accumulation; quantized weights are
//           first dequantized to BF16 in slices of the workspace.
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

// Paged attention splits each row's positions into chunks of this many
// (flash-decoding): the chunks of one row are combined in order, so a row's
// result depends only on its own length, never on the other rows.
constexpr int kAttnChunk = 512;
constexpr int attn_chunks(int64_t positions) {
  return positions <= 0 ? 0 : static_cast<int>((positions + kAttnChunk - 1) / kAttnChunk);
}

// Memory held back from admission: cuBLASLt's workspace, the GEMM path's
// slices and the attention partials, plus the driver's own margin.
constexpr int64_t kReservedBytes = int64_t{512} << 20;

}  // namespace atelier::kernels::cuda
