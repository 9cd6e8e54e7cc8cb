// The CUDA backend's host-side choices (kernels/cuda/policy.h), checked
// without a GPU: the type and bytes a matrix takes on the device, which
// product kernel a call runs, the GEMM path's slices and attention chunks,
// and the tiled prefill's plan (kernels/cuda/flash_plan.h), the code the
// device's plan kernel runs, segment by segment.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../../kernels/cuda/flash_plan.h"
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

// ---- the tiled prefill's plan

struct Rows {
  std::vector<int32_t> len, table;
  void seq(int32_t t, int32_t from, int32_t to) {  // rows of sequence t at lengths from .. to
    for (int32_t l = from; l <= to; ++l) len.push_back(l), table.push_back(t);
  }
};

struct Plan {
  std::vector<int32_t> tiled;
  std::vector<FlashTile> tiles;
};

// Written apart from flash_plan.h, the obvious way: walk the rows, extend a
// run while the next row is the same sequence one position further (rows of
// length 0 are never in a run), tile runs of 16 or more from their start.
Plan naive_plan(const Rows& r) {
  Plan p;
  const size_t n = r.len.size();
  p.tiled.assign(n, 0);
  size_t i = 0;
  while (i < n) {
    size_t j = i + 1;
    if (r.len[i] > 0)
      while (j < n && r.table[j] == r.table[i] && r.len[j] == r.len[j - 1] + 1) ++j;
    if (j - i >= 16) {
      for (size_t k = i; k < j; ++k) p.tiled[k] = 1;
      for (size_t k = i; k < j; k += 64) p.tiles.push_back({static_cast<int32_t>(k), static_cast<int32_t>(std::min<size_t>(64, j - k))});
    }
    i = j;
  }
  return p;
}

// flash_plan_host over several segment counts (1: one pass; the device's
// 256; counts that cut runs anywhere, and more segments than rows) gives
// the naive plan.
void expect_plan(const Rows& r, const Plan& want, const std::string& what) {
  const auto rows = static_cast<int64_t>(r.len.size());
  for (int64_t segments : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{7}, int64_t{kFlashPlanThreads}, rows + 5}) {
    std::vector<int32_t> start(r.len.size(), -7), end(r.len.size(), -7), tiled(r.len.size(), -7);
    std::vector<FlashTile> tiles(static_cast<size_t>(flash_max_tiles(rows)) + 1, FlashTile{-1, -1});
    const int64_t n = flash_plan_host(r.len.data(), r.table.data(), rows, segments, start.data(), end.data(),
                                      tiled.data(), tiles.data());
    const std::string at = what + ", " + std::to_string(segments) + " segments";
    EXPECT_LE(n, flash_max_tiles(rows)) << at;
    EXPECT_EQ(tiled, want.tiled) << at;
    ASSERT_EQ(n, static_cast<int64_t>(want.tiles.size())) << at;
    for (size_t t = 0; t < want.tiles.size(); ++t) {
      EXPECT_EQ(tiles[t].row, want.tiles[t].row) << at << ", tile " << t;
      EXPECT_EQ(tiles[t].rows, want.tiles[t].rows) << at << ", tile " << t;
    }
    EXPECT_EQ(tiles.back().row, -1) << at << ": written past flash_max_tiles";
  }
}

TEST(CudaFlashPlan, RunsOfOneSequenceAtRisingLengthsAreTiledFrom16Rows) {
  Rows r;
  r.seq(3, 1, 15);  // a chunk of 15: flash-decoding
  r.seq(4, 1, 16);  // 16: one tile
  Plan want = naive_plan(r);
  EXPECT_EQ(std::count(want.tiled.begin(), want.tiled.end(), 1), 16);  // the reference itself, by hand
  ASSERT_EQ(want.tiles.size(), 1u);
  EXPECT_EQ(want.tiles[0].row, 15);
  EXPECT_EQ(want.tiles[0].rows, 16);
  expect_plan(r, want, "15 and 16");
}

TEST(CudaFlashPlan, LongRunsAreCutInTilesOf64FromTheirStart) {
  for (int32_t n : {17, 64, 65, 257, 2048}) {
    Rows r;
    r.seq(0, 101, 100 + n);  // a later chunk of a prompt: 100 positions cached before it
    const Plan want = naive_plan(r);
    ASSERT_EQ(want.tiles.size(), static_cast<size_t>((n + 63) / 64));
    EXPECT_EQ(want.tiles.back().rows, n % 64 ? n % 64 : 64);
    expect_plan(r, want, std::to_string(n) + " rows");
  }
}

TEST(CudaFlashPlan, RunsEndAtAnotherSequenceALengthJumpOrLength0) {
  Rows r;
  r.seq(0, 1, 20);    // 20 rows of sequence 0 ...
  r.seq(7, 21, 40);   // ... then sequence 7 going on at the next length: another run
  r.seq(7, 50, 69);   // a jump in length: another run
  r.seq(7, 70, 75);   // continues it (26 rows)
  r.len.push_back(0), r.table.push_back(7);  // length 0: untouched, never tiled
  r.seq(7, 76, 90);   // 15 rows after it: too short
  r.len.push_back(0), r.table.push_back(2);
  r.seq(2, 1, 30);    // length 1 after a length-0 row of the same table: a new run of 30
  r.seq(2, 30, 45);   // the same length again: a break (16 rows)
  const Plan want = naive_plan(r);
  std::vector<std::pair<int32_t, int32_t>> tiles;
  for (const auto& t : want.tiles) tiles.emplace_back(t.row, t.rows);
  EXPECT_EQ(tiles, (std::vector<std::pair<int32_t, int32_t>>{{0, 20}, {20, 20}, {40, 26}, {83, 30}, {113, 16}}));
  EXPECT_EQ(want.tiled[66], 0);  // the length-0 rows
  EXPECT_EQ(want.tiled[82], 0);
  expect_plan(r, want, "breaks");
}

TEST(CudaFlashPlan, AMixedDecodeAndPrefillStep) {
  Rows r;
  for (int32_t s = 0; s < 40; ++s) r.seq(100 + s, 300 + 7 * s, 300 + 7 * s);  // decode rows: runs of 1
  r.seq(1, 1, 2048);                                                          // a whole prompt
  r.seq(2, 513, 529);                                                         // a chunk of 17
  for (int32_t s = 0; s < 9; ++s) r.seq(200 + s, 5 + s, 5 + s);               // more decode rows
  r.len.insert(r.len.begin() + 3, 0), r.table.insert(r.table.begin() + 3, 0);  // a row of length 0
  const Plan want = naive_plan(r);
  EXPECT_EQ(want.tiles.size(), 32u + 1u);
  for (int i = 0; i < 41; ++i) EXPECT_EQ(want.tiled[static_cast<size_t>(i)], 0) << i;
  expect_plan(r, want, "mixed");
  Rows none;  // decode only: nothing tiled
  for (int32_t s = 0; s < 300; ++s) none.seq(s, 1000, 1000);
  expect_plan(none, naive_plan(none), "decode only");
}

// ATELIER_CUDA_FLASH_PREFILL=0 turns the tile path off; deterministic mode
// always does (batch invariance: a row's bits may not depend on its chunk).
TEST(CudaFlashPlan, SwitchesAndDeterministicMode) {
  EXPECT_TRUE(flash_prefill_on(nullptr, false));
  EXPECT_TRUE(flash_prefill_on("1", false));
  EXPECT_TRUE(flash_prefill_on("", false));
  EXPECT_FALSE(flash_prefill_on("0", false));
  EXPECT_FALSE(flash_prefill_on(nullptr, true));
  EXPECT_FALSE(flash_prefill_on("1", true));
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
