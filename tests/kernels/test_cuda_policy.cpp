// The CUDA backend's host-side choices (kernels/cuda/policy.h), checked
// without a GPU: the type and bytes a matrix takes on the device, which
// product kernel a call runs, the GEMM path's slices and attention chunks.
#include <gtest/gtest.h>

#include "../../kernels/cuda/policy.h"

namespace atelier::kernels::cuda {
namespace {

WeightView view(DType t, int64_t rows, int64_t cols) {
  return WeightView{t, nullptr, rows, cols, dtype_row_bytes(t, cols)};
}

TEST(CudaPolicy, QuantizedTypesStayFloatTypesBecomeBf16) {
  // MXFP4: gpt-oss's experts, read in blocks by the matrix-vector kernels.
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::MXFP4})
    EXPECT_EQ(device_weight_type(view(t, 4, 256)), t) << dtype_name(t);
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q4_1, DType::Q5_0, DType::Q2_K, DType::Q3_K})
    EXPECT_EQ(device_weight_type(view(t, 4, 256)), DType::BF16) << dtype_name(t);
  WeightView packed = view(DType::Q8_0, 16, 256);
  packed.layout = WeightLayout::q8_0x16;  // a CPU-packed view is decoded, never read as blocks
  EXPECT_EQ(device_weight_type(packed), DType::BF16);
}

// Backend::set_weight_precision: float matrices as F16 for fp16, as E4M3
// with a 16-byte scale header per row for fp8 (BF16 where a row is not whole
// 16-element groups); quantized types stay whatever the precision.
TEST(CudaPolicy, PrecisionPicksTheFloatMatricesType) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q4_1}) {
    EXPECT_EQ(device_weight_type(view(t, 4, 256), WeightPrecision::bf16), DType::BF16) << dtype_name(t);
    EXPECT_EQ(device_weight_type(view(t, 4, 256), WeightPrecision::fp16), DType::F16) << dtype_name(t);
    EXPECT_EQ(device_weight_type(view(t, 4, 256), WeightPrecision::fp8_e4m3), DType::E4M3_ROWS) << dtype_name(t);
  }
  EXPECT_EQ(device_weight_type(view(DType::F32, 4, 40), WeightPrecision::fp8_e4m3), DType::BF16);
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K})
    for (WeightPrecision p : {WeightPrecision::fp16, WeightPrecision::fp8_e4m3})
      EXPECT_EQ(device_weight_type(view(t, 4, 256), p), t) << dtype_name(t);
  // 4096 x 4096 at fp8: 16 + 4096 bytes a row; at fp16 2 a element.
  EXPECT_EQ(prepared_bytes(view(DType::F32, 4096, 4096), WeightPrecision::fp8_e4m3), 4096LL * (4096 + 16));
  EXPECT_EQ(prepared_bytes(view(DType::BF16, 4096, 4096), WeightPrecision::fp16), 4096LL * 4096 * 2);
  // The E4M3 rows' matrix products go through the same row-count split as BF16's.
  EXPECT_EQ(matmul_path(DType::E4M3_ROWS, 8, false), MatmulPath::matvec);
  EXPECT_EQ(matmul_path(DType::E4M3_ROWS, 9, false), MatmulPath::gemm);
}

TEST(CudaPolicy, PreparedBytesAreTheDeviceRowsRoundedTo64) {
  // 4096 x 4096 F32 -> BF16: 2 bytes an element.
  EXPECT_EQ(prepared_bytes(view(DType::F32, 4096, 4096)), 4096 * 4096 * 2);
  // Q4_K: 144 bytes per 256 elements, rows back to back: 3 x 2 blocks = 864 -> 896.
  EXPECT_EQ(prepared_bytes(view(DType::Q4_K, 3, 512)), 896);
  // Q8_0: 34 bytes per 32: 1 x 3 blocks = 102 -> 128.
  EXPECT_EQ(prepared_bytes(view(DType::Q8_0, 1, 96)), 128);
  // Q6_K kept: 210 bytes per 256.
  EXPECT_EQ(prepared_bytes(view(DType::Q6_K, 14336, 4096)), 14336LL * 16 * 210);
  // MXFP4 kept: 17 bytes per 32; gpt-oss's 2880-wide expert rows are 90 blocks (1530 bytes): 2 rows 3060 -> 3072.
  EXPECT_EQ(prepared_bytes(view(DType::MXFP4, 2, 2880)), 3072);
  // An odd float width: 37 x 33 BF16 = 2442 -> 2496.
  EXPECT_EQ(prepared_bytes(view(DType::F16, 37, 33)), 2496);
}

TEST(CudaPolicy, ProductKernelByRows) {
  EXPECT_EQ(matmul_path(DType::BF16, 1, false), MatmulPath::matvec);
  EXPECT_EQ(matmul_path(DType::BF16, 8, false), MatmulPath::matvec);
  EXPECT_EQ(matmul_path(DType::BF16, 9, false), MatmulPath::gemm);
  EXPECT_EQ(matmul_path(DType::Q4_K, 32, false), MatmulPath::matvec);
  EXPECT_EQ(matmul_path(DType::Q4_K, 33, false), MatmulPath::gemm);
  EXPECT_EQ(matmul_path(DType::BF16, 2048, true), MatmulPath::matvec);  // deterministic: never cuBLASLt
}

TEST(CudaPolicy, GemmSlicesAndAttentionChunks) {
  EXPECT_EQ(gemm_slice_rows(14336, 4096), 14336 < (kGemmSliceBytes / 8192) ? 14336 : kGemmSliceBytes / 8192);
  EXPECT_EQ(gemm_slice_rows(10, 4096), 10);
  EXPECT_EQ(gemm_slice_rows(5, int64_t{1} << 40), 1);  // at least a row
  EXPECT_EQ(attn_chunks(0), 0);
  EXPECT_EQ(attn_chunks(1), 1);
  EXPECT_EQ(attn_chunks(kAttnChunk), 1);
  EXPECT_EQ(attn_chunks(kAttnChunk + 1), 2);
  EXPECT_EQ(attn_chunks(4096), 4096 / kAttnChunk);
}

}  // namespace
}  // namespace atelier::kernels::cuda
