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
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K})
    EXPECT_EQ(device_weight_type(view(t, 4, 256)), t) << dtype_name(t);
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q4_1, DType::Q5_0, DType::Q2_K, DType::Q3_K})
    EXPECT_EQ(device_weight_type(view(t, 4, 256)), DType::BF16) << dtype_name(t);
  WeightView packed = view(DType::Q8_0, 16, 256);
  packed.layout = WeightLayout::q8_0x16;  // a CPU-packed view is decoded, never read as blocks
  EXPECT_EQ(device_weight_type(packed), DType::BF16);
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
