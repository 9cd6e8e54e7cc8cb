// matmul: optimized vs matmul_ref at every SIMD level, matmul_ref vs a
// double-precision dot of the decoded weights, batch and thread invariance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "test_util.h"

namespace atelier::kernels {
namespace {

using testing::available_levels;
using testing::random_floats;
using testing::ScopedSimd;
using testing::TestExecutor;

const DType kTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K, DType::MXFP4};

struct Weights {
  DType type;
  int64_t rows, cols, stride;
  std::vector<uint8_t> data;
  std::vector<float> decoded;  // rows x cols

  WeightView view() const { return {type, data.data(), rows, cols, stride}; }
};

Weights make_weights(DType t, int64_t rows, int64_t cols, uint32_t seed, int64_t pad_bytes = 0) {
  Weights w{t, rows, cols, dtype_row_bytes(t, cols) + pad_bytes, {}, {}};
  w.data.assign(static_cast<size_t>(w.stride * rows), 0xAB);
  w.decoded.resize(static_cast<size_t>(rows * cols));
  const auto f = random_floats(rows * cols, seed, 0.05f);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(quantize_row(t, f.data() + r * cols, w.data.data() + r * w.stride, cols));
    dequantize_row(t, w.data.data() + r * w.stride, w.decoded.data() + r * cols, cols);
  }
  return w;
}

// Activation block size of each weight type (0: f32 activations).
int64_t act_block(DType t) {
  switch (t) {
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::MXFP4: return 32;
    case DType::Q4_K:
    case DType::Q6_K: return 256;
    default: return 0;
  }
}

std::vector<int64_t> cols_for(DType t) {
  if (act_block(t) == 32) return {32, 96, 256, 512, 2816};
  if (act_block(t) == 256) return {256, 512, 2816};
  return {1, 7, 32, 96, 100, 256, 512, 2816};
}

// Float rounding allowance, relative to sum |w x|.
constexpr double kFloatTol = 3e-5;

struct Truth {
  std::vector<double> y;       // exact-ish dot of decoded weights and x
  std::vector<double> scale;   // sum |w x|
  std::vector<double> act_err; // bound on the activation quantization error
};

Truth truth(const Weights& w, const std::vector<float>& x, int64_t m_rows) {
  Truth t;
  const int64_t blk = act_block(w.type);
  for (int64_t m = 0; m < m_rows; ++m) {
    const float* xr = x.data() + m * w.cols;
    for (int64_t r = 0; r < w.rows; ++r) {
      const float* wr = w.decoded.data() + r * w.cols;
      double y = 0, s = 0, e = 0;
      for (int64_t k = 0; k < w.cols; ++k) y += double(wr[k]) * xr[k], s += std::fabs(double(wr[k]) * xr[k]);
      if (blk)  // |x - dx * q| <= dx / 2 with dx = amax / 127 per block
        for (int64_t b = 0; b < w.cols; b += blk) {
          double amax = 0, wsum = 0;
          for (int64_t k = b; k < b + blk; ++k) amax = std::fmax(amax, std::fabs(xr[k])), wsum += std::fabs(wr[k]);
          e += amax / 127 / 2 * wsum;
        }
      t.y.push_back(y);
      t.scale.push_back(s);
      t.act_err.push_back(e);
    }
  }
  return t;
}

TEST(Matmul, SupportedTypes) {
  for (DType t : kTypes) EXPECT_TRUE(matmul_supports(t)) << dtype_name(t);
  EXPECT_FALSE(matmul_supports(DType::Q5_K));
}

TEST(Matmul, SimdLevelSwitches) {
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    EXPECT_EQ(simd_level(), level);
  }
}

// Every type, every level, odd shapes; also matmul_ref against the truth.
TEST(Matmul, MatchesReferenceOnRandomShapes) {
  const int64_t m_list[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 33};
  uint32_t seed = 100;
  for (DType t : kTypes) {
    for (int64_t rows : {1, 3, 17, 250}) {
      for (int64_t cols : cols_for(t)) {
        const Weights w = make_weights(t, rows, cols, ++seed);
        for (int64_t m_rows : m_list) {
          if (rows * cols * m_rows > 2'000'000 && m_rows != 33 && m_rows % 4 != 1) continue;  // keep it quick
          const auto x = random_floats(m_rows * cols, ++seed);
          std::vector<float> ref(static_cast<size_t>(m_rows * rows));
          matmul_ref(w.view(), x.data(), ref.data(), m_rows);
          const Truth tr = truth(w, x, m_rows);
          for (size_t i = 0; i < ref.size(); ++i)
            ASSERT_LE(std::fabs(ref[i] - tr.y[i]), tr.act_err[i] * 1.001 + kFloatTol * tr.scale[i] + 1e-30)
                << "matmul_ref vs truth: " << dtype_name(t) << " rows " << rows << " cols " << cols << " m "
                << m_rows << " at " << i;
          for (const auto& level : available_levels()) {
            ScopedSimd simd(level);
            std::vector<float> y(ref.size(), NAN);
            TestExecutor ex(2);
            matmul(w.view(), x.data(), y.data(), m_rows, &ex);
            for (size_t i = 0; i < ref.size(); ++i)
              ASSERT_LE(std::fabs(y[i] - ref[i]), kFloatTol * tr.scale[i] + 1e-30)
                  << level << " " << dtype_name(t) << " rows " << rows << " cols " << cols << " m " << m_rows
                  << " at " << i << ": " << y[i] << " vs " << ref[i];
          }
        }
      }
    }
  }
}

// Row m of y is bit-identical whether x row m is alone or inside a batch of
// 1..41 rows (the tall 8-row tiles of continuous batching and their tails
// included), and however many threads split the weight rows.
TEST(Matmul, BatchAndThreadInvariant) {
  const int64_t rows = 100, total = 48;
  for (DType t : kTypes) {
    for (int64_t cols : {int64_t{512}, act_block(t) ? int64_t{256} : int64_t{100}}) {
      const Weights w = make_weights(t, rows, cols, 7 + static_cast<uint32_t>(t));
      const auto x = random_floats(total * cols, 11);
      for (const auto& level : available_levels()) {
        ScopedSimd simd(level);
        std::vector<float> single(static_cast<size_t>(total * rows));
        for (int64_t m = 0; m < total; ++m) matmul(w.view(), x.data() + m * cols, single.data() + m * rows, 1);
        for (int64_t batch = 1; batch <= 41; ++batch) {
          for (int threads = 1; threads <= 4; ++threads) {
            const int64_t start = (batch * 5 + threads) % (total - batch + 1);
            std::vector<float> y(static_cast<size_t>(batch * rows));
            TestExecutor ex(threads);
            matmul(w.view(), x.data() + start * cols, y.data(), batch, &ex);
            ASSERT_EQ(0, std::memcmp(y.data(), single.data() + start * rows, y.size() * sizeof(float)))
                << level << " " << dtype_name(t) << " cols " << cols << " batch " << batch << " threads "
                << threads;
          }
        }
      }
    }
  }
}

// Every tile shape the drivers pick (1..8 weight rows wide for batches of 1..3
// rows, the full tiles for larger batches, the tall 8-row tiles for batches of
// 8 or more, and all the partial tiles at the
// end of a row range) gives the same bits as the single-row product, for
// every row count up to two full decode tiles plus a tail, and odd block
// counts (a lone last Q8_0/Q4_0 block).
TEST(Matmul, TileShapesInvariant) {
  for (DType t : kTypes) {
    const int64_t cols = act_block(t) == 256 ? 512 : act_block(t) == 32 ? 96 : 37;
    const int64_t total = 41;  // tall tiles (8 rows) and their tails
    const auto x = random_floats(total * cols, 31);
    for (int64_t rows = 1; rows <= 19; ++rows) {
      const Weights w = make_weights(t, rows, cols, 40 + static_cast<uint32_t>(rows));
      for (const auto& level : available_levels()) {
        ScopedSimd simd(level);
        std::vector<float> single(static_cast<size_t>(total * rows));
        for (int64_t m = 0; m < total; ++m) matmul(w.view(), x.data() + m * cols, single.data() + m * rows, 1);
        for (int64_t batch = 2; batch <= total; ++batch) {
          std::vector<float> y(static_cast<size_t>(batch * rows));
          matmul(w.view(), x.data(), y.data(), batch);
          ASSERT_EQ(0, std::memcmp(y.data(), single.data(), y.size() * sizeof(float)))
              << level << " " << dtype_name(t) << " rows " << rows << " batch " << batch;
        }
      }
    }
  }
}

TEST(Matmul, HonoursRowStride) {
  for (DType t : kTypes) {
    const int64_t cols = 256, rows = 29, m_rows = 5;
    const Weights padded = make_weights(t, rows, cols, 3, 40);
    const auto x = random_floats(m_rows * cols, 5);
    std::vector<float> ref(m_rows * rows);
    matmul_ref(padded.view(), x.data(), ref.data(), m_rows);
    const Truth tr = truth(padded, x, m_rows);
    for (const auto& level : available_levels()) {
      ScopedSimd simd(level);
      std::vector<float> y(ref.size());
      matmul(padded.view(), x.data(), y.data(), m_rows);
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_LE(std::fabs(y[i] - ref[i]), kFloatTol * tr.scale[i] + 1e-30) << level << " " << dtype_name(t);
    }
  }
}

// Weights re-laid out by pack_weights (Q8_0, Q4_0, Q4_K, Q6_K, F32, F16; groups of 16 rows at
// avx512, 8 at avx2; each packed at its level): the same products as the
// GGML layout within float rounding at every SIMD level (the scalar level,
// and avx2 for the x16 layouts, unpack row by row), matmul_ref reads every
// layout to the same bits, and the packed tiles are batch-, thread- and
// tile-invariant, including the zero-padded last group.
struct Packed {
  std::vector<uint8_t> buf;
  WeightView view;
};
Packed pack(const Weights& w) {
  Packed p;
  const int64_t bytes = packed_weight_bytes(w.view());
  p.buf.resize(static_cast<size_t>(bytes + 64));
  p.view = pack_weights(w.view(), p.buf.data() + (64 - reinterpret_cast<uintptr_t>(p.buf.data()) % 64) % 64);
  return p;
}

// The levels of this CPU that pack (all but scalar), and the layout each
// writes for type t.
std::vector<std::string> packing_levels() {
  std::vector<std::string> out;
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    const bool packs = packed_weight_bytes(make_weights(DType::Q8_0, 16, 32, 1).view()) > 0;
    EXPECT_EQ(packs, level != "scalar") << level;
    EXPECT_EQ(packed_weight_bytes(make_weights(DType::Q4_K, 16, 256, 1).view()) > 0, packs) << level;
    EXPECT_EQ(packed_weight_bytes(make_weights(DType::Q6_K, 16, 256, 1).view()) > 0, level == "avx512") << level;
    EXPECT_EQ(packed_weight_bytes(make_weights(DType::F32, 16, 7, 1).view()) > 0, packs) << level;
    EXPECT_EQ(packed_weight_bytes(make_weights(DType::F16, 16, 7, 1).view()) > 0, packs) << level;
    EXPECT_EQ(packed_weight_bytes(make_weights(DType::BF16, 16, 256, 1).view()), 0) << level << " packs BF16";
    if (packs) out.push_back(level);
  }
  return out;
}
// The layout type t gets at a packing level (rows: none).
WeightLayout layout_at(const std::string& level, DType t) {
  if (t == DType::F32) return level == "avx512" ? WeightLayout::f32x16 : WeightLayout::f32x8;
  if (t == DType::F16) return level == "avx512" ? WeightLayout::f16x16 : WeightLayout::f16x8;
  if (t == DType::Q4_K) return level == "avx512" ? WeightLayout::q4_Kx16 : WeightLayout::q4_Kx8;
  if (t == DType::Q6_K) return level == "avx512" ? WeightLayout::q6_Kx16 : WeightLayout::rows;
  if (t == DType::Q8_0) return level == "avx512" ? WeightLayout::q8_0x16 : WeightLayout::q8_0x8;
  return level == "avx512" ? WeightLayout::q4_0x16 : WeightLayout::q4_0x8;
}

TEST(Matmul, PackedMatchesReference) {
  const auto packers = packing_levels();
  if (packers.empty()) GTEST_SKIP() << "no packed layout on this CPU (" << simd_level() << ")";
  uint32_t seed = 500;
  for (DType t : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K}) {
    for (const auto& pack_level : packers) {
      if (layout_at(pack_level, t) == WeightLayout::rows) continue;
      for (int64_t rows : {1, 7, 8, 9, 15, 16, 17, 47, 49, 250}) {
        for (int64_t cols : {7, 32, 96, 100, 256, 2816}) {
          if (cols % dtype_block_elems(t) != 0) continue;
          const Weights w = make_weights(t, rows, cols, ++seed);
          Packed p;
          {
            ScopedSimd simd(pack_level);
            p = pack(w);
          }
          const std::string what = std::string(dtype_name(t)) + " packed at " + pack_level + ", rows " +
                                   std::to_string(rows) + " cols " + std::to_string(cols);
          ASSERT_EQ(p.view.layout, layout_at(pack_level, t)) << what;
          EXPECT_EQ(weight_bytes(p.view), weight_bytes(w.view()));
          // An embedding lookup in the packed table decodes each row as the original does.
          std::vector<float> row(static_cast<size_t>(cols)), row_packed(row.size());
          for (int64_t r = 0; r < rows; ++r) {
            dequantize_weight_row(w.view(), r, row.data());
            dequantize_weight_row(p.view, r, row_packed.data());
            ASSERT_EQ(0, std::memcmp(row.data(), w.decoded.data() + r * cols, row.size() * sizeof(float))) << what;
            ASSERT_EQ(0, std::memcmp(row.data(), row_packed.data(), row.size() * sizeof(float))) << what << " row " << r;
          }
          for (int64_t m_rows : {1, 2, 3, 4, 5, 8, 16, 17, 33}) {
            const auto x = random_floats(m_rows * cols, ++seed);
            std::vector<float> ref(static_cast<size_t>(m_rows * rows)), ref_packed(ref.size());
            matmul_ref(w.view(), x.data(), ref.data(), m_rows);
            matmul_ref(p.view, x.data(), ref_packed.data(), m_rows);
            ASSERT_EQ(0, std::memcmp(ref.data(), ref_packed.data(), ref.size() * sizeof(float)))
                << "matmul_ref of the packed view, " << what;
            const Truth tr = truth(w, x, m_rows);
            for (const auto& level : available_levels()) {
              ScopedSimd simd(level);
              std::vector<float> y(ref.size(), NAN);
              TestExecutor ex(2);
              matmul(p.view, x.data(), y.data(), m_rows, &ex);
              for (size_t i = 0; i < ref.size(); ++i)
                ASSERT_LE(std::fabs(y[i] - ref[i]), kFloatTol * tr.scale[i] + 1e-30)
                    << level << " on " << what << " m " << m_rows << " at " << i;
            }
          }
        }
      }
    }
  }
}

// Batches whose activations outgrow half of L2 run in row chunks on the
// float tiles (matmul_avx2.cpp's RowChunkedDriver): long, odd rows (a tail
// in every row) and more rows than several chunks, against the single-row
// products bit for bit, unpacked and packed.
TEST(Matmul, LongRowsInRowChunksInvariant) {
  const int64_t rows = 7, cols = 4099, total = 150;  // 150 rows of 16 KB: past 1 MB on any machine
  const auto x = random_floats(total * cols, 53);
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    const Weights w = make_weights(t, rows, cols, 61 + static_cast<uint32_t>(t));
    for (const auto& level : available_levels()) {
      ScopedSimd simd(level);
      std::vector<float> single(static_cast<size_t>(total * rows));
      for (int64_t m = 0; m < total; ++m) matmul(w.view(), x.data() + m * cols, single.data() + m * rows, 1);
      for (int threads : {1, 2}) {
        std::vector<float> y(static_cast<size_t>(total * rows));
        TestExecutor ex(threads);
        matmul(w.view(), x.data(), y.data(), total, &ex);
        ASSERT_EQ(0, std::memcmp(y.data(), single.data(), y.size() * sizeof(float)))
            << level << " " << dtype_name(t) << " threads " << threads;
      }
    }
  }
  // The packed float tiles chunk their rows too (avx2's f16x8): 19 rows, three groups.
  for (const auto& pack_level : packing_levels()) {
    for (DType t : {DType::F32, DType::F16}) {
      if (layout_at(pack_level, t) == WeightLayout::rows) continue;
      ScopedSimd simd(pack_level);
      const Weights w = make_weights(t, 19, cols, 71 + static_cast<uint32_t>(t));
      const Packed p = pack(w);
      std::vector<float> single(static_cast<size_t>(total * 19));
      for (int64_t m = 0; m < total; ++m) matmul(p.view, x.data() + m * cols, single.data() + m * 19, 1);
      std::vector<float> y(single.size());
      TestExecutor ex(2);
      matmul(p.view, x.data(), y.data(), total, &ex);
      ASSERT_EQ(0, std::memcmp(y.data(), single.data(), y.size() * sizeof(float)))
          << pack_level << " packed " << dtype_name(t);
    }
  }
}

TEST(Matmul, PackedBatchThreadAndTileInvariant) {
  const auto packers = packing_levels();
  if (packers.empty()) GTEST_SKIP() << "no packed layout on this CPU (" << simd_level() << ")";
  const int64_t total = 41;
  for (DType t : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K}) {
    for (const auto& pack_level : packers) {
      if (layout_at(pack_level, t) == WeightLayout::rows) continue;
      ScopedSimd simd(pack_level);
      for (int64_t rows : {1, 7, 16, 33, 100, 250}) {
        for (int64_t cols : {7, 32, 256, 768}) {
          if (cols % dtype_block_elems(t) != 0) continue;
          const Weights w = make_weights(t, rows, cols, 900 + static_cast<uint32_t>(rows + cols));
          const Packed p = pack(w);
          ASSERT_EQ(p.view.layout, layout_at(pack_level, t));
          const auto x = random_floats(total * cols, 13);
          std::vector<float> single(static_cast<size_t>(total * rows));
          for (int64_t m = 0; m < total; ++m) matmul(p.view, x.data() + m * cols, single.data() + m * rows, 1);
          for (int64_t batch = 1; batch <= total; ++batch) {
            for (int threads = 1; threads <= 3; ++threads) {
              const int64_t start = (batch * 5 + threads) % (total - batch + 1);
              std::vector<float> y(static_cast<size_t>(batch * rows));
              TestExecutor ex(threads);
              matmul(p.view, x.data() + start * cols, y.data(), batch, &ex);
              ASSERT_EQ(0, std::memcmp(y.data(), single.data() + start * rows, y.size() * sizeof(float)))
                  << dtype_name(t) << " packed at " << pack_level << " rows " << rows << " cols " << cols << " batch "
                  << batch << " threads " << threads;
            }
          }
        }
      }
    }
  }
}

// matmul_many gives each matrix's matmul bits, for matrices of different
// heights sharing one activation quantization and one split over the
// threads, packed or not, and falls back to one call each when the types
// differ.
TEST(Matmul, ManyEqualsOneByOne) {
  for (DType t : {DType::F32, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K}) {
    const int64_t cols = 512;
    std::vector<Weights> ws;
    for (int64_t rows : {100, 33, 7}) ws.push_back(make_weights(t, rows, cols, 70 + static_cast<uint32_t>(rows)));
    std::vector<Packed> packed;
    for (const auto& w : ws)
      if (packed_weight_bytes(w.view()) > 0) packed.push_back(pack(w));
    std::vector<std::vector<WeightView>> sets{{ws[0].view(), ws[1].view(), ws[2].view()}};
    if (packed.size() == 3) sets.push_back({packed[0].view, packed[1].view, packed[2].view});
    for (const auto& views : sets) {
      for (int64_t m_rows : {1, 3, 16, 17}) {
        const auto x = random_floats(m_rows * cols, 5);
        for (const auto& level : available_levels()) {
          ScopedSimd simd(level);
          for (int threads : {1, 2, 3}) {
            TestExecutor ex(threads);
            std::vector<std::vector<float>> one(3), many(3);
            const WeightView* w[3];
            float* y[3];
            for (int i = 0; i < 3; ++i) {
              one[i].assign(static_cast<size_t>(m_rows * views[i].rows), NAN);
              many[i].assign(one[i].size(), NAN);
              matmul(views[i], x.data(), one[i].data(), m_rows, &ex);
              w[i] = &views[i];
              y[i] = many[i].data();
            }
            matmul_many(w, y, 3, x.data(), m_rows, &ex);
            for (int i = 0; i < 3; ++i)
              ASSERT_EQ(0, std::memcmp(one[i].data(), many[i].data(), one[i].size() * sizeof(float)))
                  << level << " " << dtype_name(t) << " matrix " << i << " m " << m_rows << " threads " << threads;
          }
        }
      }
    }
  }
  // Mixed types: one matmul each.
  const Weights a = make_weights(DType::Q8_0, 9, 256, 1), b = make_weights(DType::Q6_K, 5, 256, 2);
  const auto x = random_floats(2 * 256, 3);
  std::vector<float> ya(18), yb(10), ra(18), rb(10);
  const WeightView va = a.view(), vb = b.view();
  const WeightView* w[] = {&va, &vb};
  float* y[] = {ya.data(), yb.data()};
  matmul_many(w, y, 2, x.data(), 2);
  matmul(va, x.data(), ra.data(), 2);
  matmul(vb, x.data(), rb.data(), 2);
  EXPECT_EQ(ya, ra);
  EXPECT_EQ(yb, rb);
}

// Types without a kernel still multiply correctly (decoded on the fly).
TEST(Matmul, UnsupportedTypesFallBack) {
  const Weights w = make_weights(DType::Q5_K, 9, 512, 21);
  const auto x = random_floats(3 * 512, 22);
  std::vector<float> y(27);
  matmul(w.view(), x.data(), y.data(), 3);
  const Truth tr = truth(w, x, 3);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_LE(std::fabs(y[i] - tr.y[i]), kFloatTol * tr.scale[i]);
}

}  // namespace
}  // namespace atelier::kernels
