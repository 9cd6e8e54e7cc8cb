// No kernel touches memory past the end of its buffers, even in the lanes of a
// masked vector access: every input and output here ends exactly where an
// unmapped page begins, so a read or write one element too far faults (and
// on Zen 4, a masked store GCC emits as `vextractf32x4 mem{k}` faults on its
// masked-out lanes: this test found that in the matmul tiles).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atelier/kernels.h>

#include <cstring>

#include "test_util.h"

namespace atelier::kernels {
namespace {
using namespace atelier::kernels::testing;

// n elements of T whose last one is the last before a PROT_NONE page.
template <class T>
class Guarded {
 public:
  explicit Guarded(size_t n) : n_(n) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    span_ = (n * sizeof(T) + page - 1) / page * page + page;
    base_ = static_cast<char*>(::mmap(nullptr, span_ + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    EXPECT_NE(base_, MAP_FAILED);
    EXPECT_EQ(0, ::mprotect(base_ + span_, page, PROT_NONE));
    data_ = reinterpret_cast<T*>(base_ + span_ - n * sizeof(T));
  }
  Guarded(const std::vector<T>& v) : Guarded(v.size()) { std::memcpy(data_, v.data(), v.size() * sizeof(T)); }
  ~Guarded() { ::munmap(base_, span_ + static_cast<size_t>(::sysconf(_SC_PAGESIZE))); }
  Guarded(const Guarded&) = delete;
  Guarded& operator=(const Guarded&) = delete;
  T* data() { return data_; }
  size_t size() const { return n_; }

 private:
  size_t n_, span_;
  char* base_;
  T* data_;
};

std::vector<float> guarded_copy_back(Guarded<float>& g) { return std::vector<float>(g.data(), g.data() + g.size()); }

TEST(GuardPages, MatmulStaysInsideItsBuffers) {
  const DType types[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K};
  TestExecutor ex(2);
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    for (DType t : types) {
      const int64_t cols = (t == DType::Q4_K || t == DType::Q6_K) ? 256 : (t == DType::Q8_0 || t == DType::Q4_0) ? 96 : 37;
      const int64_t row_bytes = dtype_row_bytes(t, cols);
      for (int64_t rows : {1, 3, 5, 9, 26}) {
        Guarded<uint8_t> w(static_cast<size_t>(row_bytes * rows));
        const auto f = random_floats(rows * cols, 3, 0.1f);
        for (int64_t r = 0; r < rows; ++r) quantize_row(t, f.data() + r * cols, w.data() + r * row_bytes, cols);
        const WeightView view{t, w.data(), rows, cols, row_bytes};
        for (int64_t batch : {1, 2, 3, 4, 7, 8, 9, 16, 17, 33}) {
          Guarded<float> x(random_floats(batch * cols, 5));
          Guarded<float> y(static_cast<size_t>(batch * rows));
          std::vector<float> ref(static_cast<size_t>(batch * rows));
          matmul(view, x.data(), y.data(), batch, batch % 2 ? &ex : nullptr);
          matmul(view, x.data(), ref.data(), batch);
          EXPECT_EQ(guarded_copy_back(y), ref) << level << " " << dtype_name(t) << " rows " << rows << " batch " << batch;
        }
        // The packed layout (a multiple of 64 bytes: the guarded copy starts 64-byte aligned).
        if (const int64_t packed_bytes = packed_weight_bytes(view); packed_bytes > 0) {
          Guarded<uint8_t> pw(static_cast<size_t>(packed_bytes));
          const WeightView packed = pack_weights(view, pw.data());
          for (int64_t batch : {1, 3, 4, 5, 16, 17}) {
            Guarded<float> x(random_floats(batch * cols, 6));
            Guarded<float> y(static_cast<size_t>(batch * rows));
            std::vector<float> ref(static_cast<size_t>(batch * rows));
            matmul(packed, x.data(), y.data(), batch, batch % 2 ? &ex : nullptr);
            matmul(packed, x.data(), ref.data(), batch);
            EXPECT_EQ(guarded_copy_back(y), ref) << level << " packed rows " << rows << " batch " << batch;
          }
        }
      }
    }
  }
}

TEST(GuardPages, RowOpsStayInsideTheirBuffers) {
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    for (int64_t n : {1, 7, 8, 15, 16, 17, 32, 40, 64, 65}) {
      // One head, and three query heads over one KV head (the last head's
      // reads end at the guard page).
      for (int n_head : {1, 3}) {
        for (int64_t rows : {1, 3, 8, 9}) {
          AttnHeads hs;
          hs.h1 = n_head;
          hs.group = n_head;
          hs.head_dim = n;
          Guarded<float> f(random_floats(rows * n, 1));
          std::vector<uint16_t> hv(static_cast<size_t>(rows * n));
          for (size_t i = 0; i < hv.size(); ++i) hv[i] = f32_to_fp16(f.data()[i]);
          Guarded<uint16_t> h(hv);
          Guarded<float> x(random_floats(n_head * n, 2)), a(random_floats(n_head * rows, 3));
          Guarded<float> out(static_cast<size_t>(n_head * rows)), y(static_cast<size_t>(n_head * n));
          dot_f32_heads(f.data(), n, rows, hs, x.data(), out.data(), rows);
          dot_f16_heads(h.data(), n, rows, hs, x.data(), out.data(), rows);
          const float* qs[3] = {x.data(), x.data(), x.data()};
          float* outs[3] = {out.data(), out.data(), out.data()};
          const int64_t strides[3] = {rows, rows, rows};
          dot_f32_heads_queries(f.data(), n, rows, hs, 3, qs, outs, strides);
          dot_f16_heads_queries(h.data(), n, rows, hs, 3, qs, outs, strides);
          std::memset(y.data(), 0, static_cast<size_t>(n_head * n) * sizeof(float));
          axpy_f32_heads(a.data(), rows, f.data(), n, rows, hs, y.data());
          axpy_f16_heads(a.data(), rows, h.data(), n, rows, hs, y.data());
          const float* as[3] = {a.data(), a.data(), a.data()};
          float* ys[3] = {y.data(), y.data(), y.data()};
          axpy_f32_heads_queries(3, as, strides, f.data(), n, rows, hs, ys);
          axpy_f16_heads_queries(3, as, strides, h.data(), n, rows, hs, ys);
          if (n % kQ8BlockElems == 0) {  // Q8_0 rows (whole blocks only): the last block's values end at the guard
            Guarded<uint8_t> q8(static_cast<size_t>(rows * n / kQ8BlockElems * kQ8BlockBytes));
            ASSERT_TRUE(quantize_row(DType::Q8_0, f.data(), q8.data(), rows * n));
            const Q8Rows r8{q8.data(), 0};
            dot_q8_0_heads(r8, n, rows, hs, x.data(), out.data(), rows);
            dot_q8_0_heads_queries(r8, n, rows, hs, 3, qs, outs, strides);
            axpy_q8_0_heads(a.data(), rows, r8, n, rows, hs, y.data());
            axpy_q8_0_heads_queries(3, as, strides, r8, n, rows, hs, ys);
          }
        }
      }
      {
        Guarded<float> xs(random_floats(n, 6));
        Guarded<int32_t> idx(static_cast<size_t>(n));
        indices_at_least(xs.data(), n, -1e30f, idx.data());  // every index: idx filled to its end
      }
      Guarded<float> x(random_floats(n, 4)), g(random_floats(n, 5)), o(static_cast<size_t>(n));
      rms_norm(x.data(), g.data(), o.data(), n, 1e-5f);
      softmax(o.data(), n);
      swiglu(x.data(), g.data(), o.data(), n);
      activation(Activation::gelu, x.data(), o.data(), n);
      Guarded<uint16_t> hh(static_cast<size_t>(n));
      f32_to_fp16_row(x.data(), hh.data(), n);
      fp16_to_f32_row(hh.data(), o.data(), n);
    }
  }
  SUCCEED();  // reaching here without a fault is the test
}

TEST(GuardPages, ImageOpsStayInsideTheirBuffers) {
  TestExecutor ex(2);
  for (const auto& level : available_levels()) {
    ScopedSimd simd(level);
    for (int64_t side : {1, 3, 5, 8, 9}) {
      Conv2dShape s;
      s.c_in = 3, s.h = side, s.w = side + 2, s.c_out = 7, s.kh = s.kw = 3, s.pad_h = s.pad_w = 1;
      Guarded<float> x(random_floats(s.c_in * s.h * s.w, 6)), w(random_floats(s.c_out * s.c_in * 9, 7, 0.2f));
      Guarded<float> b(random_floats(s.c_out, 8)), y(static_cast<size_t>(s.c_out * s.out_h() * s.out_w()));
      std::vector<float> ref(y.size());
      conv2d(s, x.data(), DType::F32, w.data(), b.data(), y.data(), &ex);
      conv2d_ref(s, x.data(), DType::F32, w.data(), b.data(), ref.data());
      const auto got = guarded_copy_back(y);
      for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 1e-4f * (1.0f + std::fabs(ref[i]))) << level << " " << i;
    }
    for (int64_t lq : {1, 5, 9}) {
      for (int64_t hd : {8, 17, 40}) {
        AttentionShape a;
        a.heads = 2, a.lq = lq, a.lk = lq + 3, a.head_dim = hd, a.scale = 0.3f;
        Guarded<float> q(random_floats(a.heads * a.lq * hd, 9)), k(random_floats(a.heads * a.lk * hd, 10));
        Guarded<float> v(random_floats(a.heads * a.lk * hd, 11)), o(static_cast<size_t>(a.heads * a.lq * hd));
        attention(a, q.data(), k.data(), v.data(), o.data(), &ex);
      }
    }
    Guarded<float> gx(random_floats(2 * 32 * 5, 12)), gy(2 * 32 * 5);
    group_norm(gx.data(), gy.data(), 2, 32, 5, 8, nullptr, nullptr, 1e-5f, true, &ex);
    layer_norm(gx.data(), gy.data(), 10, 32, nullptr, nullptr, 1e-5f, &ex);
    Guarded<float> gg(random_floats(3 * 2 * 13, 13)), go(3 * 13);
    geglu(gg.data(), go.data(), 3, 13, &ex);
    Guarded<float> ux(random_floats(3 * 5 * 7, 14)), uy(3 * 10 * 14);
    upsample_nearest2x(ux.data(), uy.data(), 3, 5, 7, &ex);
  }
  SUCCEED();
}

}  // namespace
}  // namespace atelier::kernels
