// The CUDA backend's host-side choices (kernels/cuda/policy.h), checked
// without a GPU: the type and bytes a matrix takes on the device, which
// product kernel a call runs, the GEMM path's slices and attention chunks.
#include <gtest/gtest.h>

#include <random>
#include <vector>

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

// matmul_id grouped by expert: the plan the device's counting sort writes.
TEST(CudaPolicy, MoePlanGroupsSlotsByExpertInChunksOfTheMatvecRows) {
  // By hand: 4 tokens x k 2 over 4 experts; -1 and 9 are not routed.
  const std::vector<int32_t> ids = {2, 0, 2, 1, 0, 2, -1, 9};
  const MoePlan p = moe_plan(ids.data(), 8, 4, 2);
  EXPECT_EQ(p.order, (std::vector<int32_t>{1, 4, 3, 0, 2, 5}));
  EXPECT_EQ(p.chunks, (std::vector<MoeChunk>{{0, 0, 2}, {1, 2, 1}, {2, 3, 2}, {2, 5, 1}}));
  EXPECT_EQ(kMoeChunkRows, kMatvecRows);
  EXPECT_FALSE(moe_grouped(1, true));  // one token's k slots are k experts: nothing to share
  EXPECT_TRUE(moe_grouped(2, true));
  EXPECT_FALSE(moe_grouped(2048, false));  // ATELIER_CUDA_MOE_GROUPED=0
  EXPECT_EQ(moe_chunk_bound(0, 32), 0);
  EXPECT_EQ(moe_chunk_bound(4, 32), 4);  // never more chunks than slots
  // Random and adversarial routings (one expert takes all; every expert
  // one slot more than a chunk): every routed slot once, in expert then slot
  // order, chunks contiguous, one expert each, at most kMoeChunkRows, and no
  // more of them than the bound the grid is sized by.
  std::mt19937 rng(5);
  for (int n_expert : {1, 4, 32, 128, 512}) {
    for (int64_t slots : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{257 * 4}, int64_t{2048 * 8}}) {
      for (int how = 0; how < 3; ++how) {
        std::vector<int32_t> id(static_cast<size_t>(slots));
        for (int64_t s = 0; s < slots; ++s)
          id[static_cast<size_t>(s)] = how == 0 ? static_cast<int32_t>(rng() % static_cast<unsigned>(n_expert))
                                     : how == 1 ? 0
                                                : static_cast<int32_t>(s / (kMoeChunkRows + 1) % n_expert);
        const MoePlan q = moe_plan(id.data(), slots, n_expert);
        const std::string what = std::to_string(n_expert) + " experts, " + std::to_string(slots) + " slots, " +
                                 std::to_string(how);
        ASSERT_EQ(static_cast<int64_t>(q.order.size()), slots) << what;
        ASSERT_LE(static_cast<int64_t>(q.chunks.size()), moe_chunk_bound(slots, n_expert)) << what;
        EXPECT_EQ(moe_plan_bytes(slots, n_expert), 16 + 16 * moe_chunk_bound(slots, n_expert) + 4 * slots);
        int64_t at = 0;
        std::vector<int> seen(static_cast<size_t>(slots), 0);
        for (const MoeChunk& c : q.chunks) {
          ASSERT_EQ(c.start, at) << what;
          ASSERT_GE(c.count, 1);
          ASSERT_LE(c.count, kMoeChunkRows);
          for (int32_t i = c.start; i < c.start + c.count; ++i) {
            const int32_t s = q.order[static_cast<size_t>(i)];
            ASSERT_EQ(id[static_cast<size_t>(s)], c.expert) << what;
            ++seen[static_cast<size_t>(s)];
            if (i > 0) {
              const int32_t prev = q.order[static_cast<size_t>(i - 1)];
              ASSERT_TRUE(id[static_cast<size_t>(prev)] < c.expert || (id[static_cast<size_t>(prev)] == c.expert && prev < s))
                  << what;
            }
          }
          at += c.count;
        }
        EXPECT_EQ(seen, std::vector<int>(static_cast<size_t>(slots), 1)) << what;
      }
    }
  }
}

}  // namespace
}  // namespace atelier::kernels::cuda
