// The generic op suite (after llama.cpp's tests/test-backend-ops.cpp): every
// op of atelier/backend.h, on every backend this build has (today the CPU
// backend at each SIMD level this CPU runs, on 1 and 3 threads), against the
// plain references, by relative error (||y - ref|| / ||ref||), over shapes,
// weight and cache types and odd sizes; and batch invariance: a row's result
// is bit-identical whether it runs alone or among other rows.
//
// Data goes through the backend's own buffers (upload, op, download), so a
// device backend runs the same suite unchanged: add it to backends(). The
// fake device (tests/fake_device.h) is one such entry: it fails any test
// that hands an op host memory.
#include <atelier/backend.h>
#include <atelier/devices.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "fake_device.h"
#include "resident_pages.h"

#include "kernels/test_util.h"

namespace atelier::kernels {
namespace {

using testing::random_floats;

struct BackendCase {
  std::string name;
  std::string simd;  // level to cap the kernels at while it runs
  int threads;
  bool fake = false;  // tests/fake_device.h over the CPU backend: a device that is not the host
  test::FakeFormat fmt = {};  // its activation type and image layout
  bool cuda = false;  // the CUDA module's device (kernels/cuda): text ops only, BF16 activations
};

// The CUDA device when this machine has one: the module from
// $ATELIER_CUDA_MODULE, else this build's (ATELIER_CUDA_MODULE_PATH), else
// beside the test binary. Without one the CUDA cases are absent, said once.
Device* cuda_device_for_tests() {
  static Device* d = [] {
#ifdef ATELIER_CUDA_MODULE_PATH
    ::setenv("ATELIER_CUDA_MODULE", ATELIER_CUDA_MODULE_PATH, 0);
#endif
    const DeviceChoice c = open_device("cuda");
    if (!c.device) std::printf("[ note ] no CUDA op cases: %s\n", c.why.substr(0, c.why.find('\n')).c_str());
    return c.device;
  }();
  return d;
}

std::vector<BackendCase> backends() {
  std::vector<BackendCase> out;
  for (const auto& level : testing::available_levels())
    for (int t : {1, 3}) out.push_back({"cpu-" + level + "-" + std::to_string(t) + "t", level, t});
  const std::string top = testing::available_levels().front();
  out.push_back({"fake-device", top, 3, true});
  out.push_back({"fake-device-nhwc", top, 3, true, {DType::F32, Layout::NHWC}});
  out.push_back({"fake-device-bf16-nhwc", top, 3, true, {DType::BF16, Layout::NHWC}});
  if (cuda_device_for_tests()) out.push_back({"cuda", top, 1, false, {}, true});
  return out;
}

// A device array of floats as the ops take it: `f` F32 (parameters: norm
// weights, biases, timesteps, F32 KV), `a` the same values as the backend's
// activations (one buffer with f where those are F32).
struct DevArr {
  float* f = nullptr;
  Act a;
  operator float*() const { return f; }
  operator Act() const { return a; }
  DevArr operator+(int64_t n) const { return DevArr{f + n, a + n}; }
};

// One backend under test, with its buffers. On the fake device, any op
// handed host memory (the suite's own slip, or a backend's) fails the test.
// Data goes up in the backend's activation type and image layout and comes
// back as F32 (NCHW for images), so every test reads the same either way.
class Dev {
 public:
  explicit Dev(const BackendCase& c) : simd_(c.simd), ex_(c.threads) {
    invariant_ = true;
    if (c.cuda) {
      be_ = cuda_device_for_tests()->make_backend(nullptr, 0);
      invariant_ = be_->device().batch_invariant;
    } else if (c.fake) {
      auto f = std::make_unique<test::FakeDevice>(&ex_, c.fmt);
      fake_ = f.get();
      be_ = std::move(f);
    } else {
      be_ = make_cpu_backend(c.threads > 1 ? &ex_ : nullptr);
    }
  }
  ~Dev() {
    if (fake_) {
      EXPECT_EQ(fake_->violations(), std::vector<std::string>{});
    }
    bufs_.clear();
    be_.reset();
  }
  Backend& be() { return *be_; }
  // Whether every op is batch-invariant here (a CUDA device states it).
  static bool invariant() { return invariant_; }
  bool exact() const { return be_->act_dtype() == DType::F32; }
  // The relative error the activation type's rounding allows (0: F32's).
  double act_tol() const { return be_->act_dtype() == DType::F32 ? 0 : be_->act_dtype() == DType::F16 ? 2e-3 : 3e-2; }
  // v as the device holds it: rounded to the activation type (a reference
  // computed from these sees the inputs the device saw).
  std::vector<float> rounded(const std::vector<float>& v) {
    if (exact()) return v;
    std::vector<uint8_t> b(static_cast<size_t>(act_bytes(be_->act_dtype(), static_cast<int64_t>(v.size()))));
    std::vector<float> out(v.size());
    Backend& cpu = default_cpu_backend();
    const auto n = static_cast<int64_t>(v.size());
    cpu.copy(Act(const_cast<float*>(v.data()), DType::F32), Act(b.data(), be_->act_dtype()), n);
    cpu.copy(Act(b.data(), be_->act_dtype()), Act(out.data(), DType::F32), n);
    return out;
  }
  // A device copy of host data (kept alive with the Dev).
  template <class T>
  T* put(const std::vector<T>& v) {
    bufs_.push_back(be_->alloc(static_cast<int64_t>(std::max<size_t>(v.size(), 1) * sizeof(T))));
    be_->upload(*bufs_.back(), 0, v.data(), static_cast<int64_t>(v.size() * sizeof(T)));
    return bufs_.back()->template at<T>(0);
  }
  DevArr put(const std::vector<float>& v) { return put_image(v, 0, 0, 0); }
  // n images of c x hw floats, NCHW on the host, in the backend's layout.
  DevArr img(const std::vector<float>& v, int64_t n, int64_t c, int64_t hw) { return put_image(v, n, c, hw); }
  template <class T>
  auto zeros(size_t n) {
    return put(std::vector<T>(n));
  }
  template <class T>
  std::vector<T> get(const T* p, size_t n) {
    for (auto& b : bufs_)
      if (b->template at<T>(0) == p) {
        std::vector<T> out(n);
        be_->download(*b, 0, out.data(), static_cast<int64_t>(n * sizeof(T)));
        return out;
      }
    ADD_FAILURE() << "not a buffer of this backend";
    return {};
  }
  // The activations of p (n of them) as floats.
  std::vector<float> get(const DevArr& p, size_t n) { return get_image(p.a, static_cast<int64_t>(n), 0, 0, 0); }
  std::vector<float> get(Act p, size_t n) { return get_image(p, static_cast<int64_t>(n), 0, 0, 0); }
  std::vector<float> get_img(const DevArr& p, int64_t n, int64_t c, int64_t hw) { return get_image(p.a, n * c * hw, n, c, hw); }

 private:
  // c > 0: n images of c x hw; else n = v.size() plain elements.
  DevArr put_image(const std::vector<float>& v, int64_t n, int64_t c, int64_t hw) {
    const int64_t count = static_cast<int64_t>(v.size());
    DevArr d;
    d.f = put<float>(v);
    const bool same = exact() && (c == 0 || be_->layout() == Layout::NCHW);
    if (same) {
      d.a = Act(d.f, DType::F32);
      return d;
    }
    // Converted and laid out on the host with the CPU backend's own copy and
    // relayout (exact conversions), then uploaded.
    Backend& cpu = default_cpu_backend();
    std::vector<uint8_t> bytes(static_cast<size_t>(act_bytes(be_->act_dtype(), std::max<int64_t>(count, 1))));
    const Act host_in(const_cast<float*>(v.data()), DType::F32), host_out(bytes.data(), be_->act_dtype());
    if (c > 0) cpu.relayout(host_in, Layout::NCHW, host_out, be_->layout(), n, c, hw);
    else cpu.copy(host_in, host_out, count);
    d.a = Act(put(bytes), be_->act_dtype());
    return d;
  }
  std::vector<float> get_image(Act p, int64_t count, int64_t n, int64_t c, int64_t hw) {
    for (auto& b : bufs_)
      if (b->data() == p.data()) {
        std::vector<uint8_t> bytes(static_cast<size_t>(act_bytes(p.type(), count)));
        be_->download(*b, 0, bytes.data(), static_cast<int64_t>(bytes.size()));
        std::vector<float> out(static_cast<size_t>(count));
        Backend& cpu = default_cpu_backend();
        const Act host_in(bytes.data(), p.type()), host_out(out.data(), DType::F32);
        if (c > 0) cpu.relayout(host_in, be_->layout(), host_out, Layout::NCHW, n, c, hw);
        else cpu.copy(host_in, host_out, count);
        return out;
      }
    ADD_FAILURE() << "not a buffer of this backend";
    return {};
  }

 private:
  testing::ScopedSimd simd_;
  testing::TestExecutor ex_;
  std::unique_ptr<Backend> be_;
  test::FakeDevice* fake_ = nullptr;
  std::vector<std::unique_ptr<Buffer>> bufs_;
  static inline thread_local bool invariant_ = true;
};

double rel_err(const std::vector<float>& y, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = double{y[i]} - ref[i];
    num += d * d;
    den += double{ref[i]} * ref[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Within tol, or within the activation type's rounding where that is more.
#define EXPECT_REL(y, ref, tol) EXPECT_LE(rel_err(y, ref), std::max<double>(tol, dev.act_tol())) << what
// Bit for bit on a backend computing in F32; within the activation type's
// rounding otherwise.
#define EXPECT_ACT_EQ(y, ref)                                                      \
  do {                                                                             \
    if (dev.exact()) {                                                             \
      EXPECT_EQ(y, ref);                                                           \
    } else {                                                                       \
      EXPECT_LE(rel_err(y, ref), dev.act_tol());                                   \
    }                                                                              \
  } while (0)

std::vector<float> rows_of(const std::vector<float>& v, int64_t r0, int64_t n, int64_t dim) {
  return std::vector<float>(v.begin() + r0 * dim, v.begin() + (r0 + n) * dim);
}

// Runs `op(rows, in_row0)` on all rows, then on row subsets ({0..2}, {r}),
// and checks each row's output bits match.
void expect_batch_invariant(const std::vector<float>& all, int64_t rows, int64_t dim,
                            const std::function<std::vector<float>(int64_t row0, int64_t n)>& op,
                            const std::string& what) {
  if (!Dev::invariant()) return;  // the device states it does not keep it (DeviceInfo::batch_invariant)
  for (int64_t r0 : {int64_t{0}, rows / 2, rows - 1}) {
    const int64_t n = std::min<int64_t>(r0 == 0 ? 3 : 1, rows - r0);
    const auto part = op(r0, n);
    EXPECT_EQ(part, rows_of(all, r0, n, dim)) << what << ": rows " << r0 << ".." << r0 + n - 1;
  }
}

class BackendOps : public ::testing::TestWithParam<BackendCase> {};

// ---------------------------------------------------------------- matmul

struct Weights {
  std::vector<uint8_t> bytes;
  WeightView view;
};

Weights make_weights(DType t, int64_t rows, int64_t cols, uint32_t seed) {
  Weights w;
  const int64_t rb = dtype_row_bytes(t, cols);
  w.bytes.resize(static_cast<size_t>(rb * rows));
  const auto f = random_floats(rows * cols, seed, 0.5f);
  for (int64_t r = 0; r < rows; ++r) quantize_row(t, f.data() + r * cols, w.bytes.data() + r * rb, cols);
  w.view = WeightView{t, w.bytes.data(), rows, cols, rb};
  return w;
}

TEST_P(BackendOps, MatmulEveryWeightType) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K, DType::MXFP4}) {
    const int64_t cols = dtype_block_elems(t) == 256 ? 512 : 96;
    for (int64_t out : {int64_t{1}, int64_t{37}, int64_t{70}}) {
      for (int64_t rows : {int64_t{1}, int64_t{5}, int64_t{17}}) {
        const std::string what = std::string(dtype_name(t)) + " " + std::to_string(out) + "x" + std::to_string(cols) +
                                 ", " + std::to_string(rows) + " rows";
        Dev dev(GetParam());
        const Weights w = make_weights(t, out, cols, 11);
        std::unique_ptr<Buffer> storage;
        const WeightView pw = dev.be().prepare_weights(w.view, storage);
        const auto x = random_floats(rows * cols, 12);
        std::vector<float> ref(static_cast<size_t>(rows * out));
        matmul_ref(w.view, x.data(), ref.data(), rows);
        auto dx = dev.put(x);
        auto dy = dev.zeros<float>(ref.size());
        dev.be().matmul(pw, dx, dy, rows);
        const auto y = dev.get(dy, ref.size());
        // The packed Q8_0 view sums in another order (and groups activation scales).
        EXPECT_REL(y, ref, t == DType::F32 || t == DType::F16 || t == DType::BF16 ? 1e-5 : 2e-3);
        expect_batch_invariant(
            y, rows, out,
            [&](int64_t r0, int64_t n) {
              auto py = dev.zeros<float>(static_cast<size_t>(n * out));
              dev.be().matmul(pw, dx + r0 * cols, py, n);
              return dev.get(py, static_cast<size_t>(n * out));
            },
            what);
      }
    }
  }
}

// A model's matrices prepared into one buffer (how the loader prepares them)
// multiply bit for bit as each one prepared alone, whatever their offsets.
TEST_P(BackendOps, MatricesPreparedInOneBufferMultiplyAsPreparedAlone) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K}) {
    Dev dev(GetParam());
    const int64_t cols = dtype_block_elems(t) == 256 ? 512 : 96;
    const Weights ws[] = {make_weights(t, 37, cols, 21), make_weights(t, 1, cols, 22), make_weights(t, 70, cols, 23)};
    int64_t total = 0;
    std::vector<int64_t> at;
    for (const Weights& w : ws) {
      const int64_t n = dev.be().prepared_weight_bytes(w.view);
      // The CPU keeps every byte (or packs more); CUDA keeps float matrices as BF16 (kernels/cuda/policy.h).
      if (!GetParam().cuda) {
        EXPECT_GE(n, w.view.rows * w.view.row_stride_bytes) << dtype_name(t);
      }
      EXPECT_EQ(n % 64, 0) << dtype_name(t);
      at.push_back(total);
      total += n;
    }
    auto buf = dev.be().alloc(total);
    std::vector<WeightView> grouped;
    for (size_t i = 0; i < 3; ++i) grouped.push_back(dev.be().prepare_weights_at(ws[i].view, *buf, at[i]));
    for (int64_t rows : {int64_t{1}, int64_t{5}}) {
      auto dx = dev.put(random_floats(rows * cols, 24));
      for (size_t i = 0; i < 3; ++i) {
        std::unique_ptr<Buffer> storage;
        const WeightView alone = dev.be().prepare_weights(ws[i].view, storage);
        const size_t n = static_cast<size_t>(rows * ws[i].view.rows);
        auto ya = dev.zeros<float>(n), yg = dev.zeros<float>(n);
        dev.be().matmul(alone, dx, ya, rows);
        dev.be().matmul(grouped[i], dx, yg, rows);
        EXPECT_EQ(dev.get(yg, n), dev.get(ya, n)) << dtype_name(t) << " matrix " << i << ", " << rows << " rows";
      }
    }
  }
}

TEST_P(BackendOps, MatmulManyIsOneMatmulPerMatrix) {
  Dev dev(GetParam());
  const int64_t cols = 128, rows = 6;
  const Weights a = make_weights(DType::Q8_0, 48, cols, 1), b = make_weights(DType::Q8_0, 24, cols, 2);
  std::unique_ptr<Buffer> sa, sb;
  const WeightView pa = dev.be().prepare_weights(a.view, sa), pb = dev.be().prepare_weights(b.view, sb);
  auto dx = dev.put(random_floats(rows * cols, 3));
  auto ya = dev.zeros<float>(rows * 48), yb = dev.zeros<float>(rows * 24);
  auto za = dev.zeros<float>(rows * 48), zb = dev.zeros<float>(rows * 24);
  const WeightView* w[] = {&pa, &pb};
  const Act y[] = {ya, yb};
  dev.be().matmul_many(w, y, 2, dx, rows);
  dev.be().matmul(pa, dx, za, rows);
  dev.be().matmul(pb, dx, zb, rows);
  EXPECT_ACT_EQ(dev.get(ya, rows * 48), dev.get(za, rows * 48));
  EXPECT_ACT_EQ(dev.get(yb, rows * 24), dev.get(zb, rows * 24));
}

TEST_P(BackendOps, GetRowsAndCopyRows) {
  for (DType t : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_K}) {
    const std::string what = std::string(dtype_name(t));
    Dev dev(GetParam());
    const int64_t cols = dtype_block_elems(t) == 256 ? 256 : 64;
    const Weights w = make_weights(t, 50, cols, 5);
    const std::vector<int32_t> ids = {7, 0, 49, 7, 13};
    std::vector<float> ref(ids.size() * static_cast<size_t>(cols));
    for (size_t r = 0; r < ids.size(); ++r)
      dequantize_row(t, w.bytes.data() + ids[r] * w.view.row_stride_bytes, ref.data() + r * cols, cols);
    auto dy = dev.zeros<float>(ref.size());
    WeightView table = w.view;  // the rows as stored, in the device's memory
    table.data = dev.put(w.bytes);
    dev.be().get_rows(table, dev.put(ids), dy, static_cast<int64_t>(ids.size()));
    EXPECT_ACT_EQ(dev.get(dy, ref.size()), ref);
    // And a gather of those rows.
    const std::vector<int32_t> pick = {4, 1};
    auto dz = dev.zeros<float>(2 * static_cast<size_t>(cols));
    dev.be().copy_rows(dy, dev.put(pick), dz, 2, cols);
    auto want = rows_of(ref, 4, 1, cols);
    const auto r1 = rows_of(ref, 1, 1, cols);
    want.insert(want.end(), r1.begin(), r1.end());
    EXPECT_ACT_EQ(dev.get(dz, want.size()), want);
  }
}

// ---------------------------------------------------------------- norms

TEST_P(BackendOps, RmsNormAndAddRmsNorm) {
  for (int64_t dim : {int64_t{1}, int64_t{33}, int64_t{768}}) {
    const int64_t rows = 9;
    const std::string what = "dim " + std::to_string(dim);
    Dev dev(GetParam());
    const auto x = random_floats(rows * dim, 1), delta = random_floats(rows * dim, 2), w = random_floats(dim, 3);
    std::vector<float> ref(x.size()), sum(x.size()), ref2(x.size());
    for (int64_t r = 0; r < rows; ++r) rms_norm_ref(x.data() + r * dim, w.data(), ref.data() + r * dim, dim, 1e-5f);
    for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + delta[i];
    for (int64_t r = 0; r < rows; ++r) rms_norm_ref(sum.data() + r * dim, w.data(), ref2.data() + r * dim, dim, 1e-5f);
    auto dx = dev.put(x), dw = dev.put(w), dy = dev.zeros<float>(x.size());
    dev.be().rms_norm(dx, dw, dy, rows, dim, 1e-5f);
    const auto y = dev.get(dy, x.size());
    EXPECT_REL(y, ref, 1e-6);
    expect_batch_invariant(
        y, rows, dim,
        [&](int64_t r0, int64_t n) {
          auto p = dev.zeros<float>(static_cast<size_t>(n * dim));
          dev.be().rms_norm(dx + r0 * dim, dw, p, n, dim, 1e-5f);
          return dev.get(p, static_cast<size_t>(n * dim));
        },
        what);
    auto dd = dev.put(delta), dy2 = dev.zeros<float>(x.size());
    dev.be().add_rms_norm(dx, dd, dw, dy2, rows, dim, 1e-5f);
    EXPECT_ACT_EQ(dev.get(dx, x.size()), sum);  // the residual, exactly (in F32)
    EXPECT_REL(dev.get(dy2, x.size()), ref2, 1e-6);
    dev.be().add_rms_norm(dx, dd, nullptr, dy2, rows, dim, 1e-5f);  // only the add
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += delta[i];
    EXPECT_ACT_EQ(dev.get(dx, x.size()), sum);
  }
}

TEST_P(BackendOps, LayerNormAndGroupNorm) {
  Dev dev(GetParam());
  {
    const int64_t rows = 7, dim = 77;
    const std::string what = "layer norm";
    const auto x = random_floats(rows * dim, 1), g = random_floats(dim, 2), b = random_floats(dim, 3);
    std::vector<float> ref(x.size());
    layer_norm_ref(x.data(), ref.data(), rows, dim, g.data(), b.data(), 1e-5f);
    auto dx = dev.put(x), dg = dev.put(g), db = dev.put(b), dy = dev.zeros<float>(x.size());
    dev.be().layer_norm(dx, dy, rows, dim, dg, db, 1e-5f);
    const auto y = dev.get(dy, x.size());
    EXPECT_REL(y, ref, 1e-5);
    expect_batch_invariant(
        y, rows, dim,
        [&](int64_t r0, int64_t n) {
          auto p = dev.zeros<float>(static_cast<size_t>(n * dim));
          dev.be().layer_norm(dx + r0 * dim, p, n, dim, dg, db, 1e-5f);
          return dev.get(p, static_cast<size_t>(n * dim));
        },
        what);
  }
  for (bool silu : {false, true}) {
    if (GetParam().cuda) break;  // group_norm: issue 34
    const int64_t n = 3, c = 12, hw = 37, groups = 4;
    const std::string what = std::string("group norm") + (silu ? " + silu" : "");
    const auto x = random_floats(n * c * hw, 4), g = random_floats(c, 5), b = random_floats(c, 6);
    std::vector<float> ref(x.size());
    group_norm_ref(x.data(), ref.data(), n, c, hw, groups, g.data(), b.data(), 1e-5f, silu);
    auto dx = dev.img(x, n, c, hw), dg = dev.put(g), db = dev.put(b), dy = dev.zeros<float>(x.size());
    dev.be().group_norm(dx, dy, n, c, hw, groups, dg, db, 1e-5f, silu);
    const auto y = dev.get_img(dy, n, c, hw);
    EXPECT_REL(y, ref, 1e-5);
    expect_batch_invariant(
        y, n, c * hw,
        [&](int64_t r0, int64_t k) {
          auto p = dev.zeros<float>(static_cast<size_t>(k * c * hw));
          dev.be().group_norm(dx + r0 * c * hw, p, k, c, hw, groups, dg, db, 1e-5f, silu);
          return dev.get_img(p, k, c, hw);
        },
        what);
  }
}

// ---------------------------------------------------------------- element-wise

TEST_P(BackendOps, RopeWithPositions) {
  for (bool neox : {false, true}) {
    for (bool factors : {false, true}) {
      const std::string what = std::string(neox ? "neox" : "normal") + (factors ? " + factors" : "");
      Dev dev(GetParam());
      RopeParams p;
      p.n_heads = 3;
      p.head_dim = 16;
      p.rot_dim = 12;
      p.freq_base = 10000.0f;
      p.freq_scale = 0.5f;
      p.neox = neox;
      std::vector<float> f(6);
      for (size_t i = 0; i < f.size(); ++i) f[i] = 1.0f + static_cast<float>(i);
      const int64_t rows = 6, width = p.n_heads * p.head_dim;
      const std::vector<int32_t> pos = {0, 1, 5, 100, 4095, 7};
      const auto x = random_floats(rows * width, 9);
      std::vector<float> ref = x;
      for (int64_t r = 0; r < rows; ++r)
        rope_ref(ref.data() + r * width, p.n_heads, p.head_dim, p.rot_dim, pos[static_cast<size_t>(r)], p.freq_base,
                 p.freq_scale, p.neox, factors ? f.data() : nullptr);
      if (factors) p.freq_factors = dev.put(f);
      auto dx = dev.put(x);
      const int32_t* dpos = dev.put(pos);
      dev.be().rope(dx, rows, dpos, p);
      const auto y = dev.get(dx, x.size());
      EXPECT_REL(y, ref, 1e-5);
      expect_batch_invariant(
          y, rows, width,
          [&](int64_t r0, int64_t n) {
            auto px = dev.put(rows_of(x, r0, n, width));
            dev.be().rope(px, n, dpos + r0, p);
            return dev.get(px, static_cast<size_t>(n * width));
          },
          what);
    }
  }
}

TEST_P(BackendOps, AddsAndActivations) {
  Dev dev(GetParam());
  const int64_t rows = 5, dim = 45, n = rows * dim;
  const auto a = random_floats(n, 1, 3.0f), b = random_floats(n, 2), bias = random_floats(dim, 3);
  auto da = dev.put(a), db = dev.put(b), dy = dev.zeros<float>(static_cast<size_t>(n));
  std::vector<float> ref(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ref[static_cast<size_t>(i)] = a[static_cast<size_t>(i)] + b[static_cast<size_t>(i)];
  dev.be().add(da, db, dy, n);
  EXPECT_ACT_EQ(dev.get(dy, ref.size()), ref);
  for (int64_t i = 0; i < n; ++i) ref[static_cast<size_t>(i)] += bias[static_cast<size_t>(i % dim)];
  dev.be().add_bias(dy, dev.put(bias), rows, dim);
  EXPECT_ACT_EQ(dev.get(dy, ref.size()), ref);
  for (Activation act : {Activation::silu, Activation::gelu, Activation::gelu_tanh, Activation::quick_gelu}) {
    const std::string what = "activation " + std::to_string(static_cast<int>(act));
    std::vector<float> want(static_cast<size_t>(n));
    activation_ref(act, a.data(), want.data(), n);
    dev.be().activation(act, da, dy, n);
    EXPECT_REL(dev.get(dy, want.size()), want, 1e-5);
  }
  {
    const std::string what = "swiglu";
    std::vector<float> want(static_cast<size_t>(n));
    for (int64_t r = 0; r < rows; ++r) swiglu_ref(a.data() + r * dim, b.data() + r * dim, want.data() + r * dim, dim);
    dev.be().swiglu(da, db, dy, rows, dim);
    const auto y = dev.get(dy, want.size());
    EXPECT_REL(y, want, 1e-5);
    expect_batch_invariant(
        y, rows, dim,
        [&](int64_t r0, int64_t k) {
          auto p = dev.zeros<float>(static_cast<size_t>(k * dim));
          dev.be().swiglu(da + r0 * dim, db + r0 * dim, p, k, dim);
          return dev.get(p, static_cast<size_t>(k * dim));
        },
        what);
  }
  for (Activation act : {Activation::gelu_tanh, Activation::silu, Activation::gelu}) {
    const std::string what = "glu " + std::to_string(static_cast<int>(act));
    std::vector<float> want(static_cast<size_t>(n));
    for (int64_t r = 0; r < rows; ++r) glu_ref(act, a.data() + r * dim, b.data() + r * dim, want.data() + r * dim, dim);
    dev.be().glu(act, da, db, dy, rows, dim);
    const auto y = dev.get(dy, want.size());
    EXPECT_REL(y, want, 1e-5);
    expect_batch_invariant(
        y, rows, dim,
        [&](int64_t r0, int64_t k) {
          auto p = dev.zeros<float>(static_cast<size_t>(k * dim));
          dev.be().glu(act, da + r0 * dim, db + r0 * dim, p, k, dim);
          return dev.get(p, static_cast<size_t>(k * dim));
        },
        what);
  }
  {
    const std::string what = "geglu";
    const int64_t half = 23, grows = 4;
    const auto x = random_floats(grows * 2 * half, 7, 2.0f);
    std::vector<float> want(static_cast<size_t>(grows * half));
    geglu_ref(x.data(), want.data(), grows, half);
    auto dx = dev.put(x), dg = dev.zeros<float>(want.size());
    dev.be().geglu(dx, dg, grows, half);
    const auto y = dev.get(dg, want.size());
    EXPECT_REL(y, want, 1e-5);
    expect_batch_invariant(
        y, grows, half,
        [&](int64_t r0, int64_t k) {
          auto p = dev.zeros<float>(static_cast<size_t>(k * half));
          dev.be().geglu(dx + r0 * 2 * half, p, k, half);
          return dev.get(p, static_cast<size_t>(k * half));
        },
        what);
  }
  {
    const std::string what = "softmax";
    std::vector<float> want = a;
    for (int64_t r = 0; r < rows; ++r) softmax_ref(want.data() + r * dim, dim);
    auto dx = dev.put(a);
    dev.be().softmax(dx, rows, dim);
    const auto y = dev.get(dx, want.size());
    EXPECT_REL(y, want, 1e-5);
    expect_batch_invariant(
        y, rows, dim,
        [&](int64_t r0, int64_t k) {
          auto p = dev.put(rows_of(a, r0, k, dim));
          dev.be().softmax(p, k, dim);
          return dev.get(p, static_cast<size_t>(k * dim));
        },
        what);
  }
}

TEST_P(BackendOps, AffineRelayoutPad) {
  if (GetParam().cuda) GTEST_SKIP() << "image ops are not on the CUDA backend yet (issue 34)";
  Dev dev(GetParam());
  auto x = dev.rounded(random_floats(2 * 3 * 5, 1, 2.0f));  // values the activation type holds exactly
  x[0] = -0.0f;
  auto dx = dev.put(x);
  auto dy = dev.zeros<float>(x.size());
  Affine a;  // the identity: every bit through, -0 included
  dev.be().affine(dx, dy, 30, a);
  const auto id = dev.get(dy, x.size());
  EXPECT_EQ(std::memcmp(id.data(), x.data(), x.size() * sizeof(float)), 0);
  a.add = 1.0f, a.mul = 0.5f, a.div = 0.18215f, a.lo = 0.0f, a.hi = 1.0f;
  dev.be().affine(dx, dy, 30, a);
  const auto y = dev.get(dy, x.size());
  std::vector<float> want_a(x.size());
  for (size_t i = 0; i < x.size(); ++i) want_a[i] = std::clamp((x[i] + 1.0f) * 0.5f / 0.18215f, 0.0f, 1.0f);
  EXPECT_EQ(y, dev.rounded(want_a));
  dev.be().relu(dx, dy, 30);
  const auto r = dev.get(dy, x.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(r[i], x[i] > 0 ? x[i] : (i == 0 ? -0.0f : 0.0f)) << i;
  dev.be().tanh_clamp(dx, dy, 30, 3.0f);
  std::vector<float> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = static_cast<float>(std::tanh(double{x[i]} / 3.0) * 3.0);
  const std::string what = "tanh_clamp";
  EXPECT_REL(dev.get(dy, x.size()), want, 1e-6);
  // 2 images of 3 channels of 5 pixels, NCHW -> NHWC (planes to token-major rows) and back.
  {
    Backend& be = dev.be();
    auto di = dev.img(x, 2, 3, 5), dt = dev.zeros<float>(x.size()), db = dev.zeros<float>(x.size());
    be.relayout(di, be.layout(), dt, Layout::NHWC, 2, 3, 5);
    const auto t = dev.get(dt, x.size());  // token-major whatever the backend's layout
    std::vector<float> want_t(x.size());
    for (int b = 0; b < 2; ++b)
      for (int r = 0; r < 3; ++r)
        for (int c = 0; c < 5; ++c) want_t[static_cast<size_t>((b * 5 + c) * 3 + r)] = x[static_cast<size_t>((b * 3 + r) * 5 + c)];
    EXPECT_ACT_EQ(t, want_t);
    be.relayout(dt, Layout::NHWC, db, be.layout(), 2, 3, 5);
    EXPECT_ACT_EQ(dev.get_img(db, 2, 3, 5), x);
    // And from the host's F32 NCHW into the backend's activations (a model's way in).
    auto df = dev.put(x);
    be.relayout(Act(df.f, DType::F32), Layout::NCHW, db, be.layout(), 2, 3, 5);
    EXPECT_ACT_EQ(dev.get_img(db, 2, 3, 5), x);
  }
  Pad2d p;
  p.bottom = 1, p.right = 2, p.top = 1;
  auto dp = dev.zeros<float>(2 * 5 * 9);
  dev.be().pad2d(dev.img(x, 2, 1, 15), dp, 2, 1, 3, 5, p);  // 2 images of one 3 x 5 channel
  const auto pd = dev.get_img(dp, 2, 1, 5 * 7);
  std::vector<float> want_p(pd.size());
  for (int c = 0; c < 2; ++c)
    for (int r = 0; r < 5; ++r)
      for (int q = 0; q < 7; ++q) {
        const bool in = r >= 1 && r < 4 && q < 5;
        want_p[static_cast<size_t>((c * 5 + r) * 7 + q)] = in ? x[static_cast<size_t>((c * 3 + r - 1) * 5 + q)] : 0.0f;
      }
  EXPECT_ACT_EQ(pd, want_p);
}

TEST_P(BackendOps, CopyChannelBiasConcatTimestep) {
  if (GetParam().cuda) GTEST_SKIP() << "image ops are not on the CUDA backend yet (issue 34)";
  Dev dev(GetParam());
  const int64_t n = 2, pa = 3, pb = 2, hw = 5;
  const auto a = random_floats(n * pa * hw, 1), b = random_floats(n * pb * hw, 2), bias = random_floats(n * pa, 3);
  auto da = dev.img(a, n, pa, hw), db = dev.img(b, n, pb, hw), dy = dev.zeros<float>(static_cast<size_t>(n * (pa + pb) * hw));
  auto dc = dev.zeros<float>(a.size());
  dev.be().copy(da, dc, static_cast<int64_t>(a.size()));
  EXPECT_ACT_EQ(dev.get_img(dc, n, pa, hw), a);
  dev.be().add_channel_bias(dc, dev.put(bias), n, pa, hw);
  const auto biased = dev.get_img(dc, n, pa, hw);
  std::vector<float> want_b(a.size());
  for (int64_t p = 0; p < n * pa; ++p)
    for (int64_t i = 0; i < hw; ++i)
      want_b[static_cast<size_t>(p * hw + i)] = a[static_cast<size_t>(p * hw + i)] + bias[static_cast<size_t>(p)];
  EXPECT_ACT_EQ(biased, want_b);
  dev.be().concat_channels(da, pa, db, pb, dy, n, hw);
  const auto cat = dev.get_img(dy, n, pa + pb, hw);
  std::vector<float> want_c(cat.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = 0; p < pa + pb; ++p)
      for (int64_t j = 0; j < hw; ++j)
        want_c[static_cast<size_t>((i * (pa + pb) + p) * hw + j)] =
            p < pa ? a[static_cast<size_t>((i * pa + p) * hw + j)] : b[static_cast<size_t>((i * pb + p - pa) * hw + j)];
  EXPECT_ACT_EQ(cat, want_c);
  const std::vector<float> t = {0.0f, 999.0f, 37.5f};
  const int64_t dim = 33;
  std::vector<float> ref(t.size() * dim), want(ref.size());
  timestep_embedding(t.data(), 3, dim, want.data());
  auto de = dev.zeros<float>(ref.size());
  dev.be().timestep_embedding(dev.put(t), 3, dim, de);
  EXPECT_ACT_EQ(dev.get(de, ref.size()), want);
  // Against the definition in double.
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t i = 0; i < dim / 2; ++i) {
      const double f = std::exp(-std::log(10000.0) * static_cast<double>(i) / static_cast<double>(dim / 2));
      EXPECT_NEAR(want[static_cast<size_t>(r * dim + i)], std::cos(t[static_cast<size_t>(r)] * f), 2e-3);
      EXPECT_NEAR(want[static_cast<size_t>(r * dim + dim / 2 + i)], std::sin(t[static_cast<size_t>(r)] * f), 2e-3);
    }
}

// ---------------------------------------------------------------- KV and attention

// A paged cache of n_blocks blocks (layers x K/V x block_tokens rows) in one buffer.
struct Cache {
  KvLayout layout;
  int64_t elems = 0;
};

Cache paged_layout(DType t, int n_layer, int block_tokens, int n_blocks, int64_t row) {
  Cache c;
  c.layout.type = t;
  c.layout.row_elems = row;
  c.layout.block_tokens = block_tokens;
  c.layout.layer_stride_elems = 2 * int64_t{block_tokens} * row;
  c.layout.block_stride_elems = n_layer * c.layout.layer_stride_elems;
  c.elems = n_blocks * c.layout.block_stride_elems;
  return c;
}

// Bytes of n cached values of type t (Q8_0: GGML blocks of 32; MXFP8: 33 bytes per 32).
int64_t kv_bytes_of(DType t, int64_t n) {
  if (t == DType::Q8_0) return n / kQ8BlockElems * kQ8BlockBytes;
  if (t == DType::MXFP8) return n / kMxfp8BlockElems * kMxfp8BlockBytes;
  return n * (t == DType::F16 || t == DType::BF16 ? 2 : 4);
}

// K of block 0 at base, V block_tokens rows after it.
void place(Cache& c, void* base) {
  c.layout.k = base;
  c.layout.v = static_cast<uint8_t*>(base) + kv_bytes_of(c.layout.type, int64_t{c.layout.block_tokens} * c.layout.row_elems);
}

// Paged attention of a's rows alone and in sub-batches gives y (all rows
// at once) bit for bit. a's arrays and dq are device arrays of dev.
void expect_attention_batch_invariant(Dev& dev, const KvLayout& kv, const PagedAttention& a, const DevArr& dq,
                                      const std::vector<float>& y, const std::string& what) {
  const int64_t qd = a.n_head * a.head_dim;
  expect_batch_invariant(
      y, a.rows, qd,
      [&](int64_t r0, int64_t n) {
        PagedAttention b = a;
        b.rows = n;
        b.row_len = a.row_len + r0;
        b.row_table = a.row_table + r0;
        auto p = dev.zeros<float>(static_cast<size_t>(n * qd));
        dev.be().paged_attention(kv, b, dq + r0 * qd, p);
        return dev.get(p, static_cast<size_t>(n * qd));
      },
      what);
}

TEST_P(BackendOps, StoreKvBySlotMapping) {
  for (DType t : {DType::F32, DType::F16}) {
    const std::string what = std::string(dtype_name(t));
    Dev dev(GetParam());
    const int64_t row = 24;
    Cache c = paged_layout(t, 2, 4, 5, row);
    const size_t bytes = static_cast<size_t>(c.elems) * (t == DType::F16 ? 2 : 4);
    std::vector<uint8_t> host(bytes, 0x5a);
    place(c, dev.put(host));
    const std::vector<int32_t> slots = {0, 19, -1, 5, 6};
    const auto k = dev.rounded(random_floats(5 * row, 1)), v = dev.rounded(random_floats(5 * row, 2));
    dev.be().store_kv(c.layout, 1, dev.put(k), dev.put(v), dev.put(slots), 5);
    std::vector<uint8_t> got = dev.get(static_cast<uint8_t*>(c.layout.k), bytes);
    Cache r = c;
    place(r, host.data());
    store_kv_ref(r.layout, 1, k.data(), v.data(), slots.data(), 5);
    EXPECT_EQ(got, host) << what;  // every stored byte, and nothing else touched
  }
}

TEST_P(BackendOps, RopeStoreKvIsTheThreeOps) {
  for (DType t : {DType::F32, DType::F16}) {
    Dev dev(GetParam());
    RopeParams rq;
    rq.n_heads = 4, rq.head_dim = 8, rq.rot_dim = 8;
    RopeParams rk = rq;
    rk.n_heads = 2;
    const int64_t rows = 5, qw = 32, kw = 16;
    Cache a = paged_layout(t, 2, 4, 3, kw), b = a;
    const size_t bytes = static_cast<size_t>(a.elems) * (t == DType::F16 ? 2 : 4);
    place(a, dev.put(std::vector<uint8_t>(bytes, 0)));
    place(b, dev.put(std::vector<uint8_t>(bytes, 0)));
    const std::vector<int32_t> pos = {0, 3, 9, 2, 11}, slots = {0, 3, -1, 2, 11};
    const auto q = random_floats(rows * qw, 1), k = random_floats(rows * kw, 2), v = random_floats(rows * kw, 3);
    auto q1 = dev.put(q), k1 = dev.put(k), q2 = dev.put(q), k2 = dev.put(k), dv = dev.put(v);
    const int32_t *dp = dev.put(pos), *ds = dev.put(slots);
    dev.be().rope_store_kv(q1, k1, dv, rows, dp, rq, rk, a.layout, 1, ds);
    dev.be().rope(q2, rows, dp, rq);
    dev.be().rope(k2, rows, dp, rk);
    dev.be().store_kv(b.layout, 1, k2, dv, ds, rows);
    EXPECT_ACT_EQ(dev.get(q1, q.size()), dev.get(q2, q.size()));
    EXPECT_ACT_EQ(dev.get(k1, k.size()), dev.get(k2, k.size()));
    // The fused op stores K as roped, before it is rounded to the activation
    // type (as a device fusing them does); the three ops store the rounded K.
    if (dev.exact()) {
      EXPECT_EQ(dev.get(static_cast<uint8_t*>(a.layout.k), bytes), dev.get(static_cast<uint8_t*>(b.layout.k), bytes));
    }
  }
}

TEST_P(BackendOps, PagedAttentionOverBlockTables) {
  for (DType t : {DType::F32, DType::F16}) {
    for (int bt : {1, 4, 16}) {
      for (int n_head_kv : {1, 2, 4}) {
        const std::string what = std::string(dtype_name(t)) + ", block " + std::to_string(bt) + ", kv heads " +
                                 std::to_string(n_head_kv);
        Dev dev(GetParam());
        const int n_head = 4, n_layer = 2, layer = 1;
        const int64_t hd = 18, row = n_head_kv * hd, qd = n_head * hd;
        const int n_blocks = 100 / bt + 4;  // both sequences fit, with room to spare
        Cache c = paged_layout(t, n_layer, bt, n_blocks, row);
        const size_t esize = t == DType::F16 ? 2 : 4;
        std::vector<uint8_t> store(static_cast<size_t>(c.elems) * esize);
        Cache h = c;
        place(h, store.data());
        // Two sequences: blocks taken in a scrambled order, 37 and 61 positions.
        const std::vector<int> lens = {37, 61};
        std::vector<int32_t> tables, seq_table;
        int next = n_blocks - 1;
        for (int len : lens) {
          seq_table.push_back(static_cast<int32_t>(tables.size()));
          for (int b = 0; b < (len + bt - 1) / bt; ++b) tables.push_back(next--);
        }
        for (size_t s = 0; s < lens.size(); ++s) {
          const int len = lens[s];
          std::vector<int32_t> slots;
          for (int p = 0; p < len; ++p) slots.push_back(tables[static_cast<size_t>(seq_table[s] + p / bt)] * bt + p % bt);
          const auto k = random_floats(len * row, 10 + static_cast<uint32_t>(s)), v = random_floats(len * row, 20 + static_cast<uint32_t>(s));
          store_kv_ref(h.layout, layer, k.data(), v.data(), slots.data(), len);
        }
        if (t == DType::F16) place(c, dev.put(std::vector<uint16_t>(reinterpret_cast<uint16_t*>(store.data()), reinterpret_cast<uint16_t*>(store.data()) + c.elems)));
        else place(c, dev.put(std::vector<float>(reinterpret_cast<float*>(store.data()), reinterpret_cast<float*>(store.data()) + c.elems)));
        // Query rows: prefill-like rows of each sequence at assorted lengths.
        std::vector<int32_t> row_len, row_table;
        for (int len : {1, 2, 37, 16, 17}) row_len.push_back(len), row_table.push_back(seq_table[0]);
        for (int len : {61, 1, 33}) row_len.push_back(len), row_table.push_back(seq_table[1]);
        // A prompt chunk: 11 consecutive rows of one sequence (the CPU
        // backend reads a run of the cache once per group of 8 such rows).
        for (int len = 50; len <= 60; ++len) row_len.push_back(len), row_table.push_back(seq_table[1]);
        const int64_t rows = static_cast<int64_t>(row_len.size());
        const auto q = random_floats(rows * qd, 30);
        // Sliding windows too: at, below and across the block edges.
        for (int window : {0, 1, 16, 17, 33}) {
        SCOPED_TRACE("window " + std::to_string(window));
        PagedAttention a;
        a.window = window;
        a.rows = rows;
        a.n_head = n_head;
        a.n_head_kv = n_head_kv;
        a.head_dim = hd;
        a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
        a.layer = layer;
        a.max_len = 61;
        PagedAttention ha = a;
        ha.row_len = row_len.data();
        ha.row_table = row_table.data();
        ha.block_tables = tables.data();
        std::vector<float> ref(static_cast<size_t>(rows * qd));
        paged_attention_ref(h.layout, ha, q.data(), ref.data());
        a.row_len = dev.put(row_len);
        a.row_table = dev.put(row_table);
        a.block_tables = dev.put(tables);
        auto dq = dev.put(q), dout = dev.zeros<float>(ref.size());
        dev.be().paged_attention(c.layout, a, dq, dout);
        const auto y = dev.get(dout, ref.size());
        EXPECT_REL(y, ref, 1e-5);
        expect_attention_batch_invariant(dev, c.layout, a, dq, y, what);
        if (window == 1) {
          // By hand: one attended position, so each head's output is that position's V row.
          for (int64_t r = 0; r < rows; ++r) {
            const size_t sq = static_cast<size_t>(row_table[static_cast<size_t>(r)] == seq_table[0] ? 0 : 1);
            const auto v = random_floats(lens[sq] * row, 20 + static_cast<uint32_t>(sq));
            const int p = row_len[static_cast<size_t>(r)] - 1;
            for (int hh = 0; hh < n_head; ++hh)
              for (int64_t j = 0; j < hd; ++j)
                EXPECT_NEAR(y[static_cast<size_t>(r * qd + hh * hd + j)], v[static_cast<size_t>(p * row + (hh / (n_head / n_head_kv)) * hd + j)],
                            (t == DType::F16 ? 2e-3 : 1e-6) + dev.act_tol() * 0.5);  // values to 2.5
          }
        }
        }
      }
    }
  }
}

// The rows of the KV-type tests' paged-attention calls: one sequence's
// decode rows at lengths 1, 2, 31, 32, 33, 45, then a prompt chunk 36..45.
std::vector<int32_t> one_sequence_rows() {
  std::vector<int32_t> len = {1, 2, 31, 32, 33, 45};
  for (int n = 36; n <= 45; ++n) len.push_back(n);
  return len;
}
// Those rows over the block table `table` (all on the device), window 0 or not.
PagedAttention one_sequence_call(Dev& dev, const std::vector<int32_t>& row_len, const std::vector<int32_t>& row_table,
                                 const std::vector<int32_t>& table, int n_head, int n_head_kv, int64_t hd, int layer,
                                 int max_len, int window) {
  PagedAttention a;
  a.window = window;
  a.rows = static_cast<int64_t>(row_len.size());
  a.n_head = n_head;
  a.n_head_kv = n_head_kv;
  a.head_dim = hd;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  a.layer = layer;
  a.max_len = max_len;
  a.row_len = dev.put(row_len);
  a.row_table = dev.put(row_table);
  a.block_tables = dev.put(table);
  return a;
}
// paged_attention_ref of that call over a host copy of the cache (kv), with
// the host's row lengths, tables and queries.
std::vector<float> one_sequence_ref(const KvLayout& kv, PagedAttention a, const std::vector<int32_t>& row_len,
                                    const std::vector<int32_t>& row_table, const std::vector<int32_t>& table,
                                    const std::vector<float>& q) {
  a.row_len = row_len.data();
  a.row_table = row_table.data();
  a.block_tables = table.data();
  std::vector<float> ref(static_cast<size_t>(a.rows * a.n_head * a.head_dim));
  paged_attention_ref(kv, a, q.data(), ref.data());
  return ref;
}

// A Q8_0 cache: store_kv writes each row as GGML's Q8_0 blocks
// (quantize_row), and paged attention over it is, bit for bit, paged
// attention over an F32 cache holding the dequantized rows (dequantize_row);
// the plain reference agrees.
TEST_P(BackendOps, PagedAttentionOverAQ8_0CacheReadsItsDequantizedRows) {
  for (int bt : {1, 16}) {
    for (int n_head_kv : {1, 2}) {
      for (int64_t hd : {32, 64}) {
        const std::string what = "block " + std::to_string(bt) + ", kv heads " + std::to_string(n_head_kv) + ", hd " +
                                 std::to_string(hd);
        Dev dev(GetParam());
        const int n_head = 4, n_layer = 2, layer = 1, len = 45;
        const int64_t row = n_head_kv * hd, qd = n_head * hd;
        const int n_blocks = (len + bt - 1) / bt + 2;
        Cache c8 = paged_layout(DType::Q8_0, n_layer, bt, n_blocks, row), c32 = paged_layout(DType::F32, n_layer, bt, n_blocks, row);
        place(c8, dev.zeros<uint8_t>(static_cast<size_t>(kv_bytes_of(DType::Q8_0, c8.elems))));
        place(c32, dev.zeros<float>(static_cast<size_t>(c32.elems)));
        std::vector<int32_t> table, slots;
        for (int b = 0; b < (len + bt - 1) / bt; ++b) table.push_back(n_blocks - 1 - b);  // scrambled
        for (int p = 0; p < len; ++p) slots.push_back(table[static_cast<size_t>(p / bt)] * bt + p % bt);
        const auto k = dev.rounded(random_floats(len * row, 40, 2.0f)), v = dev.rounded(random_floats(len * row, 41, 2.0f));
        std::vector<uint8_t> k8(static_cast<size_t>(kv_bytes_of(DType::Q8_0, len * row))), v8 = k8;
        ASSERT_TRUE(quantize_row(DType::Q8_0, k.data(), k8.data(), len * row));
        ASSERT_TRUE(quantize_row(DType::Q8_0, v.data(), v8.data(), len * row));
        std::vector<float> kd(k.size()), vd(v.size());
        dequantize_row(DType::Q8_0, k8.data(), kd.data(), len * row);
        dequantize_row(DType::Q8_0, v8.data(), vd.data(), len * row);
        const int32_t* ds = dev.put(slots);
        dev.be().store_kv(c8.layout, layer, dev.put(k), dev.put(v), ds, len);
        dev.be().store_kv(c32.layout, layer, dev.put(kd), dev.put(vd), ds, len);
        // Each stored row is that row's quantize_row bytes, at its slot.
        auto kbytes = dev.get(static_cast<uint8_t*>(c8.layout.k), static_cast<size_t>(kv_bytes_of(DType::Q8_0, c8.elems)));
        const int64_t row_bytes = kv_bytes_of(DType::Q8_0, row);
        for (int p = 0; p < len; ++p) {
          const int64_t sl = slots[static_cast<size_t>(p)];
          const int64_t e = (sl / bt) * c8.layout.block_stride_elems + layer * c8.layout.layer_stride_elems + (sl % bt) * row;
          ASSERT_EQ(0, std::memcmp(kbytes.data() + kv_bytes_of(DType::Q8_0, e), k8.data() + p * row_bytes, static_cast<size_t>(row_bytes)))
              << what << " position " << p;
        }
        const std::vector<int32_t> row_len = one_sequence_rows(), row_table(row_len.size(), 0);
        const int64_t rows = static_cast<int64_t>(row_len.size());
        const auto q = random_floats(rows * qd, 42);
        for (int window : {0, 17}) {
          const PagedAttention a =
              one_sequence_call(dev, row_len, row_table, table, n_head, n_head_kv, hd, layer, len, window);
          auto dq = dev.put(q), o8 = dev.zeros<float>(static_cast<size_t>(rows * qd)), o32 = dev.zeros<float>(static_cast<size_t>(rows * qd));
          dev.be().paged_attention(c8.layout, a, dq, o8);
          dev.be().paged_attention(c32.layout, a, dq, o32);
          const auto y8 = dev.get(o8, static_cast<size_t>(rows * qd)), y32 = dev.get(o32, static_cast<size_t>(rows * qd));
          // (The F32 cache's rows went through the activation type on their way in.)
          if (dev.exact()) {
            ASSERT_EQ(0, std::memcmp(y8.data(), y32.data(), y8.size() * 4)) << what << " window " << window;
          } else {
            EXPECT_LE(rel_err(y8, y32), dev.act_tol()) << what << " window " << window;
          }
          expect_attention_batch_invariant(dev, c8.layout, a, dq, y8, what);
          Cache h = c8;  // the reference reads the host copy
          place(h, kbytes.data());
          EXPECT_REL(y8, one_sequence_ref(h.layout, a, row_len, row_table, table, q), 1e-5);
        }
      }
    }
  }
}

// A GPU's KV types (--kv-type bf16 / fp8): BF16 rows and MXFP8 blocks
// (DType::MXFP8). store_kv writes each row as quantize_row's bytes (the
// device's encoder is the host's, byte for byte), and paged attention over
// them is the reference over the same bytes (decoded by dequantize_row:
// sums in double) within 1e-5 (the activation type's rounding on a
// BF16 device). The CPU backend refuses them, naming what to use.
TEST_P(BackendOps, PagedAttentionOverBf16AndFp8Caches) {
  for (DType t : {DType::BF16, DType::MXFP8}) {
    for (int bt : {1, 16}) {
      for (int64_t hd : {32, 64}) {
        const std::string what = std::string(dtype_name(t)) + ", block " + std::to_string(bt) + ", hd " + std::to_string(hd);
        Dev dev(GetParam());
        const int n_head = 4, n_head_kv = 2, n_layer = 2, layer = 1, len = 45;
        const int64_t row = n_head_kv * hd, qd = n_head * hd;
        const int n_blocks = (len + bt - 1) / bt + 2;
        Cache c = paged_layout(t, n_layer, bt, n_blocks, row);
        const size_t bytes = static_cast<size_t>(kv_bytes_of(t, c.elems));
        place(c, dev.zeros<uint8_t>(bytes));
        std::vector<int32_t> table, slots;
        for (int b = 0; b < (len + bt - 1) / bt; ++b) table.push_back(n_blocks - 1 - b);  // scrambled
        for (int p = 0; p < len; ++p) slots.push_back(table[static_cast<size_t>(p / bt)] * bt + p % bt);
        // K with a few large channels (some models' K rows reach the hundreds).
        auto k = random_floats(len * row, 50, 2.0f);
        for (int p = 0; p < len; ++p) k[static_cast<size_t>(p * row + 3)] *= 150.0f;
        k = dev.rounded(k);
        const auto v = dev.rounded(random_floats(len * row, 51, 2.0f));
        const int32_t* ds = dev.put(slots);
        if (!GetParam().fake && !GetParam().cuda) {  // the CPU backend
          try {
            dev.be().store_kv(c.layout, layer, dev.put(k), dev.put(v), ds, len);
            ADD_FAILURE() << what << ": the CPU backend stored a GPU-only KV type";
          } catch (const std::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find("--kv-type f16"), std::string::npos) << e.what();
          }
          continue;
        }
        dev.be().store_kv(c.layout, layer, dev.put(k), dev.put(v), ds, len);
        auto kbytes = dev.get(static_cast<uint8_t*>(c.layout.k), bytes);
        std::vector<uint8_t> want(bytes, 0);
        Cache h = c;
        place(h, want.data());
        store_kv_ref(h.layout, layer, k.data(), v.data(), slots.data(), len);
        ASSERT_EQ(kbytes, want) << what;  // K and V of every row, byte for byte, and nothing else
        const std::vector<int32_t> row_len = one_sequence_rows(), row_table(row_len.size(), 0);
        const int64_t rows = static_cast<int64_t>(row_len.size());
        const auto q = random_floats(rows * qd, 52);
        for (int window : {0, 17}) {
          const PagedAttention a =
              one_sequence_call(dev, row_len, row_table, table, n_head, n_head_kv, hd, layer, len, window);
          auto dq = dev.put(q), out = dev.zeros<float>(static_cast<size_t>(rows * qd));
          dev.be().paged_attention(c.layout, a, dq, out);
          const auto y = dev.get(out, static_cast<size_t>(rows * qd));
          expect_attention_batch_invariant(dev, c.layout, a, dq, y, what);
          EXPECT_REL(y, one_sequence_ref(h.layout, a, row_len, row_table, table, q), 1e-5);
        }
      }
    }
  }
}

TEST_P(BackendOps, ContiguousCacheIsOneBlock) {
  // A contiguous cache (one block of n_ctx slots, K and V apart) reads as a
  // block table {0}, bit for bit the same as a paged copy of it.
  Dev dev(GetParam());
  const int n_ctx = 40, n_layer = 1;
  const int64_t hd = 16, row = 2 * hd, qd = 2 * hd;
  const auto k = random_floats(n_ctx * row, 1), v = random_floats(n_ctx * row, 2);
  KvLayout flat;
  flat.type = DType::F32;
  flat.row_elems = row;
  flat.block_tokens = n_ctx;
  flat.layer_stride_elems = n_ctx * row;
  const DevArr dk = dev.put(k), dv = dev.put(v);
  flat.k = dk.f;
  flat.v = dv.f;
  Cache paged = paged_layout(DType::F32, n_layer, 8, 5, row);
  place(paged, dev.zeros<float>(static_cast<size_t>(paged.elems)));
  std::vector<int32_t> slots(n_ctx);
  for (int p = 0; p < n_ctx; ++p) slots[static_cast<size_t>(p)] = p;
  dev.be().store_kv(paged.layout, 0, dk, dv, dev.put(slots), n_ctx);
  const std::vector<int32_t> lens = {40, 9}, zero = {0, 0}, one_block = {0}, blocks = {0, 1, 2, 3, 4};
  PagedAttention a;
  a.rows = 2;
  a.n_head = 2;
  a.n_head_kv = 2;
  a.head_dim = hd;
  a.scale = 0.25f;
  a.max_len = n_ctx;
  a.row_len = dev.put(lens);
  a.row_table = dev.put(zero);
  a.block_tables = dev.put(one_block);
  auto dq = dev.put(random_floats(2 * qd, 3)), y1 = dev.zeros<float>(2 * qd), y2 = dev.zeros<float>(2 * qd);
  dev.be().paged_attention(flat, a, dq, y1);
  a.block_tables = dev.put(blocks);
  dev.be().paged_attention(paged.layout, a, dq, y2);
  EXPECT_ACT_EQ(dev.get(y1, 2 * qd), dev.get(y2, 2 * qd));
}

// gpt-oss's attention sinks: a per-head logit in each softmax's
// denominator, with and without a sliding window; rows alone as among others.
TEST_P(BackendOps, PagedAttentionWithSinks) {
  Dev dev(GetParam());
  const int n_ctx = 40;
  const int64_t hd = 16, n_head = 4, n_head_kv = 2, row = n_head_kv * hd, qd = n_head * hd;
  const auto k = random_floats(n_ctx * row, 1), v = random_floats(n_ctx * row, 2);
  const auto q = dev.rounded(random_floats(3 * qd, 3, 2.0f));
  const std::vector<float> sinks = {0.5f, -1.0f, 3.0f, 0.0f};
  KvLayout flat;
  flat.type = DType::F32;
  flat.row_elems = row;
  flat.block_tokens = n_ctx;
  flat.layer_stride_elems = n_ctx * row;
  const DevArr dk = dev.put(k), dv = dev.put(v);
  flat.k = dk.f;
  flat.v = dv.f;
  KvLayout host = flat;
  host.k = const_cast<float*>(k.data());
  host.v = const_cast<float*>(v.data());
  const std::vector<int32_t> lens = {40, 9, 1}, tables = {0, 0, 0}, one_block = {0};
  for (int window : {0, 8}) {
    const std::string what = "sinks, window " + std::to_string(window);
    PagedAttention a;
    a.rows = 3;
    a.n_head = n_head;
    a.n_head_kv = n_head_kv;
    a.head_dim = hd;
    a.scale = 0.25f;
    a.max_len = n_ctx;
    a.window = window;
    a.sinks = sinks.data();
    a.row_len = lens.data();
    a.row_table = tables.data();
    a.block_tables = one_block.data();
    std::vector<float> want(static_cast<size_t>(3 * qd));
    paged_attention_ref(host, a, q.data(), want.data());
    a.sinks = dev.put(sinks);
    a.row_len = dev.put(lens);
    a.row_table = dev.put(tables);
    a.block_tables = dev.put(one_block);
    auto dq = dev.put(q), dy = dev.zeros<float>(static_cast<size_t>(3 * qd));
    dev.be().paged_attention(flat, a, dq, dy);
    const auto y = dev.get(dy, want.size());
    EXPECT_REL(y, want, 1e-5);
    // The sink only ever lowers the weights: each output is smaller than without it.
    double with = 0, without = 0;
    a.sinks = nullptr;
    auto dz = dev.zeros<float>(static_cast<size_t>(3 * qd));
    dev.be().paged_attention(flat, a, dq, dz);
    const auto z = dev.get(dz, want.size());
    for (size_t i = 0; i < y.size(); ++i) with += std::fabs(y[i]), without += std::fabs(z[i]);
    EXPECT_LT(with, without) << what;
    a.sinks = dev.put(sinks);
    expect_batch_invariant(
        y, 3, qd,
        [&](int64_t r0, int64_t n) {
          PagedAttention b = a;
          b.rows = n;
          b.row_len = dev.put(std::vector<int32_t>(lens.begin() + r0, lens.begin() + r0 + n));
          b.row_table = dev.put(std::vector<int32_t>(tables.begin() + r0, tables.begin() + r0 + n));
          auto p = dev.zeros<float>(static_cast<size_t>(n * qd));
          dev.be().paged_attention(flat, b, dq + r0 * qd, p);
          return dev.get(p, static_cast<size_t>(n * qd));
        },
        what);
  }
}

// ---------------------------------------------------------------- mixture of experts

TEST_P(BackendOps, MoeRouteEveryGating) {
  Dev dev(GetParam());
  const int64_t rows = 7;
  for (MoeGating g : {MoeGating::softmax, MoeGating::sigmoid, MoeGating::softmax_weights}) {
    for (bool norm : {false, true}) {
      for (auto [n_expert, k] : {std::pair{8, 2}, std::pair{32, 4}, std::pair{128, 8}}) {
        const std::string what = "gating " + std::to_string(static_cast<int>(g)) + (norm ? " norm" : "") + " " +
                                 std::to_string(k) + " of " + std::to_string(n_expert);
        MoeRouting r;
        r.n_expert = n_expert;
        r.k = k;
        r.gating = g;
        r.norm = norm;
        r.scale = norm ? 1.0f : 2.5f;
        const auto logits = dev.rounded(random_floats(rows * n_expert, 40 + n_expert, 3.0f));
        std::vector<int32_t> want_ids(static_cast<size_t>(rows * k));
        std::vector<float> want_w(want_ids.size());
        for (int64_t i = 0; i < rows; ++i)
          moe_route_ref(logits.data() + i * n_expert, r, want_ids.data() + i * k, want_w.data() + i * k);
        auto dl = dev.put(logits);
        int32_t* ids = dev.zeros<int32_t>(want_ids.size());
        float* w = dev.zeros<float>(want_w.size());
        dev.be().moe_route(dl, rows, r, ids, w);
        EXPECT_EQ(dev.get(ids, want_ids.size()), want_ids) << what;
        const auto got_w = dev.get(w, want_w.size());
        EXPECT_LE(rel_err(got_w, want_w), 1e-6) << what;
        if (norm)
          for (int64_t i = 0; i < rows; ++i) {
            double sum = 0;
            for (int j = 0; j < k; ++j) sum += got_w[static_cast<size_t>(i * k + j)];
            EXPECT_NEAR(sum, 1.0, 1e-6) << what;
          }
        // A row alone routes as among others, bit for bit.
        int32_t* ids1 = dev.zeros<int32_t>(static_cast<size_t>(k));
        float* w1 = dev.zeros<float>(static_cast<size_t>(k));
        dev.be().moe_route(dl + (rows - 1) * n_expert, 1, r, ids1, w1);
        EXPECT_EQ(dev.get(ids1, static_cast<size_t>(k)),
                  std::vector<int32_t>(want_ids.end() - k, want_ids.end())) << what;
        EXPECT_EQ(dev.get(w1, static_cast<size_t>(k)), std::vector<float>(got_w.end() - k, got_w.end())) << what;
      }
    }
  }
}


// ---------------------------------------------------------------- sampling

// Rows of every kind Backend::sample serves (by row % 8): greedy, top-k,
// top-p over the whole vocabulary, min-p, all of them with penalties,
// greedy with penalties, top-k 1, a plain draw at temperature 1.5. Logits
// have ties at the maximum (greedy's lowest id) and draws r of their own.
struct SampleCase {
  std::vector<float> logits;
  std::vector<SampleRow> rows;
  std::vector<int32_t> pairs;
};
SampleCase sample_case(int64_t rows, int n_vocab, uint32_t seed) {
  SampleCase c;
  c.logits = random_floats(rows * n_vocab, seed, 4.0f);
  const auto u = random_floats(rows * 64, seed + 1, 1.0f);
  for (int64_t i = 0; i < rows; ++i) {
    float* l = c.logits.data() + i * n_vocab;
    const int32_t top = static_cast<int32_t>(std::max_element(l, l + n_vocab) - l);
    l[(top + 7) % n_vocab] = l[(top + n_vocab - 3) % n_vocab] = l[top];  // ties at the maximum
    SampleRow r;
    r.r = 0.5 + 0.5 * u[static_cast<size_t>(i * 64)];  // in [0, 1)
    switch (i % 8) {
      case 0: break;  // greedy
      case 1: r.temperature = 0.8f, r.top_k = 40; break;
      case 2: r.temperature = 1.0f, r.top_p = 0.9f; break;
      case 3: r.temperature = 0.7f, r.min_p = 0.05f; break;
      case 4: r.temperature = 0.8f, r.top_k = 50, r.top_p = 0.95f, r.min_p = 0.05f; [[fallthrough]];
      case 5:
        r.repeat_penalty = 1.3f, r.frequency_penalty = 0.2f, r.presence_penalty = 0.4f;
        r.penalty_offset = static_cast<int32_t>(c.pairs.size() / 2);
        for (int j = 0; r.penalty_count < 20; ++j) {  // distinct tokens: the top, its ties, spread out; counts 1..3
          const int32_t t = j < 4 ? (top + j * 7) % n_vocab : (j * 7919 + static_cast<int>(i)) % n_vocab;
          bool seen = false;
          for (int32_t q = 0; q < r.penalty_count; ++q) seen = seen || c.pairs[static_cast<size_t>(2 * (r.penalty_offset + q))] == t;
          if (seen) continue;
          c.pairs.push_back(t);
          c.pairs.push_back(1 + j % 3);
          ++r.penalty_count;
        }
        break;
      case 6: r.temperature = 1.0f, r.top_k = 1; break;
      default: r.temperature = 1.5f; break;
    }
    c.rows.push_back(r);
  }
  if (c.pairs.empty()) c.pairs = {0, 0};
  return c;
}
// The reference's token for row i of c (its own copy of the logits).
int32_t sample_ref_row(const SampleCase& c, int64_t i, int n_vocab, const SampleRow& r) {
  std::vector<float> l(c.logits.begin() + i * n_vocab, c.logits.begin() + (i + 1) * n_vocab);
  int32_t id = -1;
  sample_ref(l.data(), 1, n_vocab, &r, c.pairs.data(), &id);
  return id;
}
// A device's token for a row is the reference's, or (a device not bit for
// bit the host's) one the reference gives with r, top_p or min_p moved by
// 2e-6: floating-point rounding put it at that boundary. Greedy rows exactly.
void expect_sampled(const SampleCase& c, int n_vocab, const std::vector<int32_t>& got, bool exact, const std::string& what) {
  int near = 0;
  for (size_t i = 0; i < c.rows.size(); ++i) {
    const SampleRow& r = c.rows[i];
    const int32_t want = sample_ref_row(c, static_cast<int64_t>(i), n_vocab, r);
    if (got[i] == want) continue;
    bool ok = false;
    if (!exact && r.temperature > 0) {
      for (int k = 0; k < 6 && !ok; ++k) {
        SampleRow m = r;
        const double d = (k % 2 ? -2e-6 : 2e-6);
        if (k < 2) m.r = std::clamp(r.r + d, 0.0, 0.9999999);
        else if (k < 4) m.top_p = static_cast<float>(r.top_p * (1 + d));
        else m.min_p = static_cast<float>(r.min_p * (1 + d));
        ok = sample_ref_row(c, static_cast<int64_t>(i), n_vocab, m) == got[i];
      }
    }
    if (ok) ++near;
    else ADD_FAILURE() << what << ": row " << i << " (kind " << i % 8 << ") sampled " << got[i] << ", the reference " << want;
  }
  EXPECT_LE(near, std::max<size_t>(1, c.rows.size() / 50)) << what << ": too many rows at a boundary";
}
// Runs the op over c on dev; the ids.
std::vector<int32_t> sample_on(Dev& dev, const SampleCase& c, int64_t rows, int n_vocab) {
  float* l = dev.put<float>(c.logits);
  const SampleRow* params = dev.put<SampleRow>(c.rows);
  const int32_t* pairs = dev.put<int32_t>(c.pairs);
  int32_t* ids = dev.zeros<int32_t>(static_cast<size_t>(rows));
  dev.be().sample(Act(l, DType::F32), rows, n_vocab, params, pairs, ids);
  return dev.get(ids, static_cast<size_t>(rows));
}

TEST_P(BackendOps, SampleIsTheReferencesSelection) {
  Dev dev(GetParam());
  for (int n_vocab : {1000, 32000}) {
    const int64_t rows = 16;
    const SampleCase c = sample_case(rows, n_vocab, 70 + n_vocab);
    const std::string what = "vocab " + std::to_string(n_vocab);
    const auto got = sample_on(dev, c, rows, n_vocab);
    expect_sampled(c, n_vocab, got, !GetParam().cuda, what);
    // A skipped row gets -1; a row alone gets what it got among others.
    SampleCase one = c;
    one.logits.assign(c.logits.end() - n_vocab, c.logits.end());
    one.rows = {c.rows.back()};
    EXPECT_EQ(sample_on(dev, one, 1, n_vocab), std::vector<int32_t>{got.back()}) << what;
    one.rows[0].skip = 1;
    EXPECT_EQ(sample_on(dev, one, 1, n_vocab), std::vector<int32_t>{-1}) << what;
  }
}

// The experts' products: each (token, slot) row against its expert, as one
// one-row matmul of that expert gives it (bit for bit on an F32 device),
// near matmul_id_ref, for every weight type, one or two sets (gate and up),
// biases, inputs per token or per slot; a token alone as among others.
TEST_P(BackendOps, MatmulIdIsOneMatmulPerRoutedRow) {
  for (DType t : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::MXFP4}) {
    const int64_t cols = dtype_block_elems(t) == 256 ? 256 : 96;
    const int n_expert = 6, k = 2;
    const int64_t out0 = 40, out1 = 24;
    for (int64_t rows : {int64_t{1}, int64_t{5}, int64_t{17}}) {
      for (int x_per_row : {1, k}) {
        const std::string what = std::string(dtype_name(t)) + ", " + std::to_string(rows) + " rows, x per row " +
                                 std::to_string(x_per_row);
        Dev dev(GetParam());
        std::vector<Weights> raw;
        std::vector<std::unique_ptr<Buffer>> storage(2 * n_expert);
        std::vector<WeightView> set0, set1, host0, host1;
        for (int e = 0; e < n_expert; ++e) {
          raw.push_back(make_weights(t, out0, cols, 100 + e));
          raw.push_back(make_weights(t, out1, cols, 200 + e));
        }
        for (int e = 0; e < n_expert; ++e) {
          host0.push_back(raw[2 * e].view);
          host1.push_back(raw[2 * e + 1].view);
          set0.push_back(dev.be().prepare_weights(raw[2 * e].view, storage[2 * e]));
          set1.push_back(dev.be().prepare_weights(raw[2 * e + 1].view, storage[2 * e + 1]));
        }
        // Routing: distinct experts per token, spread so some expert gets none.
        std::vector<int32_t> ids(static_cast<size_t>(rows * k));
        for (int64_t r = 0; r < rows; ++r) {
          const auto first = static_cast<int32_t>((r * 7) % (n_expert - 1));
          ids[static_cast<size_t>(r * k)] = first;
          ids[static_cast<size_t>(r * k + 1)] = static_cast<int32_t>((first + 1 + r % 3) % (n_expert - 1));
        }
        const auto bias1 = random_floats(n_expert * out1, 7);
        const auto x = dev.rounded(random_floats(rows * x_per_row * cols, 8));
        std::vector<float> want0(static_cast<size_t>(rows * k * out0)), want1(static_cast<size_t>(rows * k * out1));
        {
          const WeightView* sets[] = {host0.data(), host1.data()};
          float* ys[] = {want0.data(), want1.data()};
          const float* biases[] = {nullptr, bias1.data()};
          matmul_id_ref(sets, ys, biases, 2, n_expert, x.data(), x_per_row, ids.data(), rows, k);
        }
        auto dx = dev.put(x);
        auto y0 = dev.zeros<float>(want0.size()), y1 = dev.zeros<float>(want1.size());
        const int32_t* dids = dev.put(ids);
        const WeightView* sets[] = {set0.data(), set1.data()};
        const Act ys[] = {y0, y1};
        const float* biases[] = {nullptr, dev.put(bias1)};
        dev.be().matmul_id(sets, ys, biases, 2, n_expert, dx, x_per_row, dids, rows, k);
        const auto got0 = dev.get(y0, want0.size()), got1 = dev.get(y1, want1.size());
        const double tol = t == DType::F32 || t == DType::F16 ? 1e-5 : 3e-3;
        EXPECT_REL(got0, want0, tol);
        EXPECT_REL(got1, want1, tol);
        // Each slot as its own one-row matmul (and bias add) of its expert.
        std::vector<float> one0(want0.size()), one1(want1.size());
        for (int64_t s = 0; s < rows * k; ++s) {
          const int e = ids[static_cast<size_t>(s)];
          const int64_t src = x_per_row == 1 ? s / k : s;
          auto p0 = dev.zeros<float>(static_cast<size_t>(out0)), p1 = dev.zeros<float>(static_cast<size_t>(out1));
          dev.be().matmul(set0[static_cast<size_t>(e)], dx + src * cols, p0, 1);
          dev.be().matmul(set1[static_cast<size_t>(e)], dx + src * cols, p1, 1);
          const auto a0 = dev.get(p0, static_cast<size_t>(out0)), a1 = dev.get(p1, static_cast<size_t>(out1));
          std::copy(a0.begin(), a0.end(), one0.begin() + s * out0);
          for (int64_t c = 0; c < out1; ++c) one1[static_cast<size_t>(s * out1 + c)] = a1[static_cast<size_t>(c)] + bias1[static_cast<size_t>(e * out1 + c)];
        }
        EXPECT_ACT_EQ(got0, one0);
        EXPECT_ACT_EQ(got1, one1);
        // The last token alone.
        auto z0 = dev.zeros<float>(static_cast<size_t>(k * out0));
        const Act zs[] = {z0};
        dev.be().matmul_id(sets, zs, biases, 1, n_expert, dx + (rows - 1) * x_per_row * cols, x_per_row,
                           dev.put(std::vector<int32_t>(ids.end() - k, ids.end())), 1, k);
        EXPECT_EQ(dev.get(z0, static_cast<size_t>(k * out0)), std::vector<float>(got0.end() - k * out0, got0.end())) << what;
      }
    }
  }
}

TEST_P(BackendOps, MoeCombineAndSwigluOai) {
  Dev dev(GetParam());
  const int64_t rows = 5, dim = 45;
  const int k = 3;
  {
    const std::string what = "moe_combine";
    const auto y = dev.rounded(random_floats(rows * k * dim, 1, 2.0f));
    const auto w = random_floats(rows * k, 2);
    std::vector<float> want(static_cast<size_t>(rows * dim));
    moe_combine_ref(y.data(), w.data(), want.data(), rows, k, dim);
    auto dy = dev.put(y), dout = dev.zeros<float>(want.size());
    const float* dw = dev.put(w);
    dev.be().moe_combine(dy, dw, dout, rows, k, dim);
    const auto got = dev.get(dout, want.size());
    EXPECT_REL(got, want, 1e-6);
    expect_batch_invariant(
        got, rows, dim,
        [&](int64_t r0, int64_t n) {
          auto p = dev.zeros<float>(static_cast<size_t>(n * dim));
          dev.be().moe_combine(dy + r0 * k * dim, dw + r0 * k, p, n, k, dim);
          return dev.get(p, static_cast<size_t>(n * dim));
        },
        what);
  }
  {
    const std::string what = "swiglu_oai";
    auto g = random_floats(rows * dim, 3, 10.0f), u = random_floats(rows * dim, 4, 10.0f);  // beyond the limit too
    g = dev.rounded(g), u = dev.rounded(u);
    std::vector<float> want(g.size());
    swiglu_oai_ref(g.data(), u.data(), want.data(), rows * dim, 1.702f, 7.0f);
    auto dg = dev.put(g), du = dev.put(u), dout = dev.zeros<float>(want.size());
    dev.be().swiglu_oai(dg, du, dout, rows, dim, 1.702f, 7.0f);
    const auto got = dev.get(dout, want.size());
    EXPECT_REL(got, want, 1e-6);
    // The clamps: a gate above the limit acts as the limit, an up beyond it as +-limit.
    for (size_t i = 0; i < got.size(); ++i)
      if (g[i] > 7.0f && u[i] > 7.0f) {
        EXPECT_NEAR(got[i], 7.0 / (1 + std::exp(-1.702 * 7)) * 8, 0.1) << what;
      }
    expect_batch_invariant(
        got, rows, dim,
        [&](int64_t r0, int64_t n) {
          auto p = dev.zeros<float>(static_cast<size_t>(n * dim));
          dev.be().swiglu_oai(dg + r0 * dim, du + r0 * dim, p, n, dim, 1.702f, 7.0f);
          return dev.get(p, static_cast<size_t>(n * dim));
        },
        what);
  }
}

TEST_P(BackendOps, ImageAttention) {
  Dev dev(GetParam());
  for (int64_t lk : {int64_t{77}, int64_t{130}}) {
    AttentionShape s;
    s.batch = 2;
    s.heads = 3;
    s.lq = 21;
    s.lk = lk;
    s.head_dim = 40;
    const std::string what = "lk " + std::to_string(lk);
    const int64_t w = s.heads * s.head_dim;
    const auto q = random_floats(s.batch * s.lq * w, 1), k = random_floats(s.batch * lk * w, 2),
               v = random_floats(s.batch * lk * w, 3);
    std::vector<float> ref(q.size());
    attention_ref(s, q.data(), k.data(), v.data(), ref.data());
    auto dq = dev.put(q), dk = dev.put(k), dv = dev.put(v), dy = dev.zeros<float>(q.size());
    dev.be().attention(s, dq, dk, dv, dy);
    const auto y = dev.get(dy, q.size());
    EXPECT_REL(y, ref, 1e-5);
    expect_batch_invariant(
        y, s.batch, s.lq * w,
        [&](int64_t r0, int64_t n) {
          AttentionShape one = s;
          one.batch = n;
          auto p = dev.zeros<float>(static_cast<size_t>(n * s.lq * w));
          dev.be().attention(one, dq + r0 * s.lq * w, dk + r0 * lk * w, dv + r0 * lk * w, p);
          return dev.get(p, static_cast<size_t>(n * s.lq * w));
        },
        what);
  }
}

TEST_P(BackendOps, CausalAttentionOverFusedQkv) {
  Dev dev(GetParam());
  for (int64_t T : {int64_t{1}, int64_t{13}, int64_t{77}}) {
    AttentionShape s;
    s.batch = 2;
    s.heads = 3;
    s.lq = s.lk = T;
    s.head_dim = 24;
    const std::string what = "T " + std::to_string(T);
    const int64_t w = s.heads * s.head_dim, stride = 3 * w;
    const auto qkv = random_floats(s.batch * T * stride, 4);
    std::vector<float> ref(static_cast<size_t>(s.batch * T * w));
    causal_attention_ref(s, qkv.data(), qkv.data() + w, qkv.data() + 2 * w, stride, ref.data());
    auto dqkv = dev.put(qkv), dy = dev.zeros<float>(ref.size());
    dev.be().causal_attention(s, dqkv, dqkv + w, dqkv + 2 * w, stride, dy);
    const auto y = dev.get(dy, ref.size());
    EXPECT_REL(y, ref, 1e-5);
    expect_batch_invariant(
        y, s.batch, T * w,
        [&](int64_t r0, int64_t n) {
          AttentionShape one = s;
          one.batch = n;
          auto p = dev.zeros<float>(static_cast<size_t>(n * T * w));
          auto base = dqkv + r0 * T * stride;
          dev.be().causal_attention(one, base, base + w, base + 2 * w, stride, p);
          return dev.get(p, static_cast<size_t>(n * T * w));
        },
        what);
  }
}

// ---------------------------------------------------------------- images

TEST_P(BackendOps, Conv2dEveryWeightType) {
  if (GetParam().cuda) GTEST_SKIP() << "image ops are not on the CUDA backend yet (issue 34)";
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    for (int64_t k : {int64_t{1}, int64_t{3}}) {
      Dev dev(GetParam());
      Conv2dShape s;
      s.n = 2;
      s.c_in = 5;
      s.h = 9;
      s.w = 7;
      s.c_out = 6;
      s.kh = s.kw = k;
      s.pad_h = s.pad_w = k / 2;
      s.stride_h = s.stride_w = k == 3 ? 2 : 1;
      const std::string what = std::string(dtype_name(t)) + " " + std::to_string(k) + "x" + std::to_string(k);
      const int64_t wn = s.c_out * s.c_in * k * k;
      const Weights wt = make_weights(t, 1, wn, 4);
      const auto x = random_floats(s.n * s.c_in * s.h * s.w, 5), bias = random_floats(s.c_out, 6);
      const int64_t out_plane = s.c_out * s.out_h() * s.out_w();
      std::vector<float> ref(static_cast<size_t>(s.n * out_plane));
      conv2d_ref(s, x.data(), t, wt.bytes.data(), bias.data(), ref.data());
      auto dx = dev.img(x, s.n, s.c_in, s.h * s.w), db = dev.put(bias), dy = dev.zeros<float>(ref.size());
      std::vector<uint8_t> ordered(wt.bytes.size());  // the weights in the backend's layout order
      conv_weights_for(dev.be().layout(), t, wt.bytes.data(), ordered.data(), s.c_out, s.c_in, k, k);
      const uint8_t* dw = dev.put(ordered);
      dev.be().conv2d(s, dx, t, dw, db, dy);
      const int64_t out_hw = s.out_h() * s.out_w();
      const auto y = dev.get_img(dy, s.n, s.c_out, out_hw);
      EXPECT_REL(y, ref, 1e-5);
      expect_batch_invariant(
          y, s.n, out_plane,
          [&](int64_t r0, int64_t n) {
            Conv2dShape one = s;
            one.n = n;
            auto p = dev.zeros<float>(static_cast<size_t>(n * out_plane));
            dev.be().conv2d(one, dx + r0 * s.c_in * s.h * s.w, t, dw, db, p);
            return dev.get_img(p, n, s.c_out, out_hw);
          },
          what);
    }
  }
}

TEST_P(BackendOps, UpsampleNearest2x) {
  if (GetParam().cuda) GTEST_SKIP() << "image ops are not on the CUDA backend yet (issue 34)";
  Dev dev(GetParam());
  const int64_t n = 2, c = 3, h = 3, w = 7;
  const auto x = random_floats(n * c * h * w, 1);
  std::vector<float> ref(static_cast<size_t>(n * c * 4 * h * w));
  upsample_nearest2x_ref(x.data(), ref.data(), n * c, h, w);
  auto dy = dev.zeros<float>(ref.size());
  dev.be().upsample_nearest2x(dev.img(x, n, c, h * w), dy, n, c, h, w);
  EXPECT_ACT_EQ(dev.get_img(dy, n, c, 4 * h * w), ref);
}

// commit(): the bytes stay as they were, out-of-range requests are refused,
// and on a host-memory device the committed pages are resident (mincore)
// while pages past them, never touched, are not.
TEST_P(BackendOps, CommitKeepsBytesAndMakesPagesResident) {
  if (GetParam().cuda) GTEST_SKIP() << "cudaMalloc commits at allocation (host pages only)";
  Dev dev(GetParam());
  const int64_t bytes = int64_t{16} << 20;
  auto buf = dev.be().alloc(bytes);
  std::vector<uint8_t> a(5000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 13 + 1);
  dev.be().upload(*buf, 4000, a.data(), static_cast<int64_t>(a.size()));
  EXPECT_FALSE(dev.be().commit(*buf, bytes - 10, 11));
  EXPECT_FALSE(dev.be().commit(*buf, -1, 10));
  const int64_t committed = int64_t{6} << 20;
  const bool ok = dev.be().commit(*buf, 0, committed);
  std::vector<uint8_t> b(a.size());
  dev.be().download(*buf, 4000, b.data(), static_cast<int64_t>(b.size()));
  EXPECT_EQ(a, b);
  if (!ok || !dev.be().device().host_memory) return;  // a kernel before 5.14: nothing to check
  auto resident = [&](int64_t off) { return atelier::test::page_mapped(buf->at<uint8_t>(off)); };
  for (const int64_t off : {int64_t{0}, committed / 2, committed - 1}) EXPECT_TRUE(resident(off)) << off;
  // 4 MiB past the committed bytes (beyond any 2 MiB page they share).
  for (const int64_t off : {committed + (int64_t{4} << 20), bytes - 1}) EXPECT_FALSE(resident(off)) << off;
}

TEST_P(BackendOps, BuffersRoundTrip) {
  Dev dev(GetParam());
  const DeviceInfo info = dev.be().device();
  EXPECT_FALSE(info.name.empty());
  // A small buffer, and one past 2 MiB (the CPU's are then whole huge pages and a partial one).
  for (const int64_t bytes : {int64_t{1000}, (int64_t{5} << 20) + 123}) {
    auto buf = dev.be().alloc(bytes);
    ASSERT_GE(buf->bytes(), bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buf->data()) % 64, 0u);
    std::vector<uint8_t> a(300), b(300);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 7);
    for (const int64_t off : {int64_t{123}, bytes - 300}) {
      dev.be().upload(*buf, off, a.data(), 300);
      dev.be().synchronize();
      dev.be().download(*buf, off, b.data(), 300);
      EXPECT_EQ(a, b) << bytes << " bytes, at " << off;
    }
    dev.be().clear(*buf, 0x3c);
    std::vector<uint8_t> c(static_cast<size_t>(buf->bytes()));
    dev.be().download(*buf, 0, c.data(), buf->bytes());
    EXPECT_EQ(c, std::vector<uint8_t>(c.size(), 0x3c)) << bytes << " bytes";
  }
}

INSTANTIATE_TEST_SUITE_P(KernelBackends, BackendOps, ::testing::ValuesIn(backends()),
                         [](const ::testing::TestParamInfo<BackendCase>& i) {
                           std::string n = i.param.name;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// ---------------------------------------------------------------- CUDA, GPU-sized

std::vector<BackendCase> cuda_cases() {
  if (!cuda_device_for_tests()) return {};
  return {{"cuda", testing::available_levels().front(), 1, false, {}, true}};
}

class CudaShapes : public ::testing::TestWithParam<BackendCase> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CudaShapes);

// Every weight type the device keeps, at a model's widths (K 4096, 14336 and
// 4352, not a power of two), for the row counts of decode, small batches and
// prefill, against sums in double over the weights as the device holds them
// (BF16 for float matrices) and the BF16 activations it was handed; logits
// in F32, so the tolerance is the accumulation's.
TEST_P(CudaShapes, MatmulAtModelSizes) {
  for (DType t : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::MXFP4}) {
    for (int64_t cols : {int64_t{4096}, int64_t{14336}, int64_t{4352}}) {
      Dev dev(GetParam());
      const int64_t out = 96;
      const Weights w = make_weights(t, out, cols, 31);
      std::unique_ptr<Buffer> storage;
      const WeightView pw = dev.be().prepare_weights(w.view, storage);
      std::vector<float> wf(static_cast<size_t>(out * cols));
      for (int64_t r = 0; r < out; ++r)
        dequantize_row(t, w.bytes.data() + r * w.view.row_stride_bytes, wf.data() + r * cols, cols);
      if (t == DType::F32 || t == DType::F16) wf = dev.rounded(wf);  // kept as BF16 on the device
      for (int64_t rows : {int64_t{1}, int64_t{3}, int64_t{16}, int64_t{64}, int64_t{257}}) {
        const std::string what = std::string(dtype_name(t)) + " " + std::to_string(out) + "x" + std::to_string(cols) +
                                 ", " + std::to_string(rows) + " rows";
        const auto x = dev.rounded(random_floats(rows * cols, 32));
        std::vector<float> ref(static_cast<size_t>(rows * out));
        for (int64_t m = 0; m < rows; ++m)
          for (int64_t r = 0; r < out; ++r) {
            double acc = 0;
            for (int64_t c = 0; c < cols; ++c) acc += double{x[m * cols + c]} * wf[r * cols + c];
            ref[m * out + r] = static_cast<float>(acc);
          }
        auto dx = dev.put(x);
        float* dy = dev.put<float>(std::vector<float>(ref.size()));
        dev.be().matmul(pw, dx, Act(dy, DType::F32), rows);
        // cuBLASLt's BF16 GEMM may round the F32 accumulator's partial sums differently; 1e-4 is far above either.
        EXPECT_LE(rel_err(dev.get(dy, ref.size()), ref), 1e-4) << what;
      }
    }
  }
}

// --precision fp16 and fp8 (Backend::set_weight_precision): F32 matrices
// prepared as F16, or as E4M3 with a scale per row, at model widths and
// every row count, against sums in double over the weights as the device
// keeps them (the host's f32_to_fp16 / quantize_row(E4M3_ROWS), which the
// device's conversion must match). The FP8 GEMM above the matrix-vector
// sizes also quantizes the activations per row to E4M3: its reference does
// the same; where cuBLASLt has no FP8 algorithm the BF16 slices take them
// (the BF16 reference).
TEST_P(CudaShapes, FloatMatricesAtEachPrecision) {
  for (WeightPrecision p : {WeightPrecision::fp16, WeightPrecision::fp8_e4m3}) {
    Dev dev(GetParam());
    if (p == WeightPrecision::fp8_e4m3 && dev.be().device().compute_capability < 89) {
      std::printf("note: %s has no FP8 (compute capability below 8.9): the fp8 case is skipped\n",
                  dev.be().device().description.c_str());
      continue;
    }
    dev.be().set_weight_precision(p);
    for (int64_t cols : {int64_t{4096}, int64_t{14336}}) {
      const int64_t out = 80;
      const Weights w = make_weights(DType::F32, out, cols, 37);
      std::unique_ptr<Buffer> storage;
      const WeightView pw = dev.be().prepare_weights(w.view, storage);
      const DType want = p == WeightPrecision::fp16 ? DType::F16 : DType::E4M3_ROWS;
      ASSERT_EQ(pw.type, want) << weight_precision_name(p);
      // The device's bytes are the host's conversion, byte for byte.
      const int64_t rb = dtype_row_bytes(want, cols);
      std::vector<uint8_t> host_bytes(static_cast<size_t>(rb * out)), dev_bytes(host_bytes.size());
      const auto* wf32 = reinterpret_cast<const float*>(w.bytes.data());
      for (int64_t r = 0; r < out; ++r) quantize_row(want, wf32 + r * cols, host_bytes.data() + r * rb, cols);
      // The prepared rows live in `storage` at offset 0.
      dev.be().download(*storage, 0, dev_bytes.data(), rb * out);
      int64_t differ = 0;
      for (size_t i = 0; i < host_bytes.size(); ++i) differ += host_bytes[i] != dev_bytes[i];
      EXPECT_EQ(differ, 0) << weight_precision_name(p) << " " << cols << ": bytes differing from the host's conversion";
      std::vector<float> wf(static_cast<size_t>(out * cols));
      for (int64_t r = 0; r < out; ++r) dequantize_row(want, host_bytes.data() + r * rb, wf.data() + r * cols, cols);
      for (int64_t rows : {int64_t{1}, int64_t{3}, int64_t{16}, int64_t{64}, int64_t{257}}) {
        const std::string what = std::string(weight_precision_name(p)) + " " + std::to_string(out) + "x" +
                                 std::to_string(cols) + ", " + std::to_string(rows) + " rows";
        const auto x = dev.rounded(random_floats(rows * cols, 38));
        // x as the FP8 GEMM quantizes it: per row, scale = max |x| / 448.
        std::vector<float> xq(x.size());
        for (int64_t m = 0; m < rows; ++m) {
          float amax = 0;
          for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(x[m * cols + c]));
          const float scale = amax > 0 ? amax / 448.0f : 1.0f, inv = 1.0f / scale;
          for (int64_t c = 0; c < cols; ++c) xq[m * cols + c] = e4m3_to_f32(f32_to_e4m3(x[m * cols + c] * inv)) * scale;
        }
        auto ref_of = [&](const std::vector<float>& xs) {
          std::vector<float> ref(static_cast<size_t>(rows * out));
          for (int64_t m = 0; m < rows; ++m)
            for (int64_t r = 0; r < out; ++r) {
              double acc = 0;
              for (int64_t c = 0; c < cols; ++c) acc += double{xs[m * cols + c]} * wf[r * cols + c];
              ref[m * out + r] = static_cast<float>(acc);
            }
          return ref;
        };
        const auto ref = ref_of(x);
        auto dx = dev.put(x);
        float* dy = dev.put<float>(std::vector<float>(ref.size()));
        dev.be().matmul(pw, dx, Act(dy, DType::F32), rows);
        const auto y = dev.get(dy, ref.size());
        if (p == WeightPrecision::fp8_e4m3 && rows > 8) {
          const double e_q = rel_err(y, ref_of(xq)), e_b = rel_err(y, ref);
          EXPECT_TRUE(e_q <= 2e-3 || e_b <= 1e-4) << what << ": " << e_q << " from the E4M3-activation reference, "
                                                  << e_b << " from the BF16 one";
          std::printf("note: %s: relative error %.2e from the E4M3-activation reference, %.2e from the BF16 one\n",
                      what.c_str(), e_q, e_b);
        } else {
          // F16 products (x converted BF16 -> F16 exactly) or the fused-dequant matrix-vector kernel.
          EXPECT_LE(rel_err(y, ref), 1e-4) << what;
        }
      }
    }
  }
}

// Paged attention at model sizes: head_dim 64 / 80 / 128, grouped-query
// (8 heads over 2), contexts 1 to 4096 in blocks of 16, a sliding window,
// every KV type, with and without gpt-oss's sinks (rows of one chunk and of
// several: the sink joins where the chunks are combined), against the
// double-precision reference.
TEST_P(CudaShapes, PagedAttentionAtModelSizes) {
  const std::vector<float> sinks = {0.5f, -1.0f, 3.0f, 0.0f, 8.0f, -20.0f, 1.5f, 2.0f};  // 8.0: above most scores
  for (DType kt : {DType::F32, DType::F16, DType::Q8_0}) {
    for (int64_t hd : {int64_t{64}, int64_t{80}, int64_t{128}}) {
      if (kt == DType::Q8_0 && hd % 32 != 0) continue;
      for (int variant = 0; variant < 4; ++variant) {
        const int window = variant % 2 ? 700 : 0;
        const bool with_sinks = variant >= 2;
        Dev dev(GetParam());
        const int n_head = 8, n_kv = 2, bt = 16;
        const std::vector<int32_t> lens = {1, 100, 1024, 4096, 3000};
        const int64_t rows = static_cast<int64_t>(lens.size()), row_elems = n_kv * hd;
        int blocks = 0;
        std::vector<int32_t> tables, row_table;
        for (int32_t len : lens) {  // each row its own blocks, in a shuffled order
          row_table.push_back(static_cast<int32_t>(tables.size()));
          const int nb = (len + bt - 1) / bt;
          for (int b = 0; b < nb; ++b) tables.push_back(blocks + (b * 7) % nb);
          blocks += nb;
        }
        const int64_t slots = int64_t{blocks} * bt;
        const int64_t bytes = dtype_row_bytes(kt, slots * row_elems);
        std::vector<uint8_t> hk(static_cast<size_t>(bytes)), hv(hk.size());
        KvLayout host;
        host.type = kt, host.k = hk.data(), host.v = hv.data(), host.row_elems = row_elems, host.block_tokens = bt;
        host.block_stride_elems = bt * row_elems;
        std::vector<int32_t> all(static_cast<size_t>(slots));
        for (int64_t i = 0; i < slots; ++i) all[static_cast<size_t>(i)] = static_cast<int32_t>(i);
        store_kv_ref(host, 0, random_floats(slots * row_elems, 41).data(), random_floats(slots * row_elems, 42).data(),
                     all.data(), slots);
        const auto q = dev.rounded(random_floats(rows * n_head * hd, 43));
        PagedAttention a;
        a.rows = rows, a.n_head = n_head, a.n_head_kv = n_kv, a.head_dim = hd;
        a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
        a.max_len = 4096, a.window = window;
        a.row_len = lens.data(), a.row_table = row_table.data(), a.block_tables = tables.data();
        a.sinks = with_sinks ? sinks.data() : nullptr;
        std::vector<float> ref(static_cast<size_t>(rows * n_head * hd));
        paged_attention_ref(host, a, q.data(), ref.data());
        KvLayout kv = host;
        kv.k = dev.put(hk), kv.v = dev.put(hv);
        PagedAttention da = a;
        da.row_len = dev.put(lens), da.row_table = dev.put(row_table), da.block_tables = dev.put(tables);
        if (with_sinks) da.sinks = dev.put<float>(sinks);
        auto dq = dev.put(q);
        float* dout = dev.put<float>(std::vector<float>(ref.size()));
        dev.be().paged_attention(kv, da, dq, Act(dout, DType::F32));
        const std::string what = std::string(dtype_name(kt)) + " head_dim " + std::to_string(hd) + " window " +
                                 std::to_string(window) + (with_sinks ? " sinks" : "");
        EXPECT_LE(rel_err(dev.get(dout, ref.size()), ref), 1e-4) << what;
        // A row alone gives its bits among the others (chunks are per row).
        PagedAttention one = da;
        one.rows = 1, one.row_len = da.row_len + 3, one.row_table = da.row_table + 3;
        float* d1 = dev.put<float>(std::vector<float>(static_cast<size_t>(n_head * hd)));
        dev.be().paged_attention(kv, one, dq + 3 * n_head * hd, Act(d1, DType::F32));
        EXPECT_EQ(dev.get(d1, static_cast<size_t>(n_head * hd)),
                  rows_of(dev.get(dout, ref.size()), 3, 1, n_head * hd)) << what;
      }
    }
  }
}

// Runs of prefill rows (16 or more consecutive rows of one sequence at
// rising lengths: flash_plan.h) take the tiled tensor-core kernel; every
// other row the flash-decoding one. Against the double-precision reference
// over the values the cache holds (its bytes decoded on the host), for one
// sequence of 16, 17, 64, 257 and 2048 rows, several sequences in one call,
// and a call mixing decode rows, rows of length 0 (untouched) and runs; KV
// F16 / BF16 / Q8_0 / F32, head_dim 64 / 80 / 96 / 128, grouped-query 32/8
// and 8/8, sliding windows (40: every row's window edge moves by one per
// row, so an off-by-one mask moves each output by ~1/sqrt(40)) and sinks,
// contexts to 4096. Tolerances by the compute type the kernel picks from the
// cache's: F16 (F16, Q8_0 caches: P rounded to 11 bits) 3e-3 overall and 1e-2
// per row; BF16 (BF16, F32: K and P to 8 bits) 1e-2 and 3e-2.
// A tiled row differs in its bits from the same row computed alone (the
// flash-decoding kernel, in FP32) unless the device keeps batch invariance
// (ATELIER_CUDA_DETERMINISTIC=1) or ATELIER_CUDA_FLASH_PREFILL=0, where the
// bits must be equal: so the case also tells which kernel ran.
struct PrefillCase {
  DType kv;
  int64_t hd;
  int n_head, n_kv, window;
  bool sinks;
};

// rows: (sequence, length) per query row; a sequence's context is its longest row.
void check_prefill(const BackendCase& bc, const PrefillCase& pc, const std::vector<std::pair<int, int32_t>>& rows_in,
                   const std::string& what) {
  Dev dev(bc);
  const int bt = 16;
  const int64_t hd = pc.hd, row_elems = pc.n_kv * hd, qd = pc.n_head * hd;
  const auto rows = static_cast<int64_t>(rows_in.size());
  int n_seq = 0;
  for (const auto& r : rows_in) n_seq = std::max(n_seq, r.first + 1);
  std::vector<int32_t> ctx(static_cast<size_t>(n_seq), 1);
  for (const auto& r : rows_in) ctx[static_cast<size_t>(r.first)] = std::max(ctx[static_cast<size_t>(r.first)], r.second);
  std::vector<int32_t> tables, seq_table;
  int blocks = 0;
  for (int32_t len : ctx) {  // each sequence its own blocks, in a shuffled order
    seq_table.push_back(static_cast<int32_t>(tables.size()));
    const int nb = (len + bt - 1) / bt;
    for (int b = 0; b < nb; ++b) tables.push_back(blocks + (b * 7) % nb);
    blocks += nb;
  }
  const int64_t n_vals = int64_t{blocks} * bt * row_elems;
  // The cache's bytes of type pc.kv, and the values they hold for the reference.
  const auto k = random_floats(n_vals, 51, 1.5f), v = random_floats(n_vals, 52);
  const int64_t bytes = dtype_row_bytes(pc.kv, n_vals);
  std::vector<uint8_t> kb(static_cast<size_t>(bytes)), vb(kb.size());
  ASSERT_TRUE(quantize_row(pc.kv, k.data(), kb.data(), n_vals));
  ASSERT_TRUE(quantize_row(pc.kv, v.data(), vb.data(), n_vals));
  std::vector<float> kf(k.size()), vf(v.size());
  dequantize_row(pc.kv, kb.data(), kf.data(), n_vals);
  dequantize_row(pc.kv, vb.data(), vf.data(), n_vals);
  KvLayout host;
  host.type = DType::F32, host.k = kf.data(), host.v = vf.data(), host.row_elems = row_elems, host.block_tokens = bt;
  host.block_stride_elems = bt * row_elems;
  std::vector<int32_t> row_len, row_table;
  for (const auto& r : rows_in) row_len.push_back(r.second), row_table.push_back(seq_table[static_cast<size_t>(r.first)]);
  std::vector<float> sinks(static_cast<size_t>(pc.n_head));
  const float pattern[8] = {0.5f, -1.0f, 3.0f, 0.0f, 8.0f, -20.0f, 1.5f, 2.0f};
  for (int h = 0; h < pc.n_head; ++h) sinks[static_cast<size_t>(h)] = pattern[h % 8];
  const auto q = dev.rounded(random_floats(rows * qd, 53));
  PagedAttention a;
  a.rows = rows, a.n_head = pc.n_head, a.n_head_kv = pc.n_kv, a.head_dim = hd;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  a.max_len = *std::max_element(ctx.begin(), ctx.end()), a.window = pc.window;
  a.row_len = row_len.data(), a.row_table = row_table.data(), a.block_tables = tables.data();
  a.sinks = pc.sinks ? sinks.data() : nullptr;
  const float untouched = 7.0f;  // what rows of length 0 must keep
  std::vector<float> ref(static_cast<size_t>(rows * qd), untouched);
  paged_attention_ref(host, a, q.data(), ref.data());
  KvLayout kv = host;
  kv.type = pc.kv, kv.k = dev.put(kb), kv.v = dev.put(vb);
  PagedAttention da = a;
  da.row_len = dev.put(row_len), da.row_table = dev.put(row_table), da.block_tables = dev.put(tables);
  if (pc.sinks) da.sinks = dev.put<float>(sinks);
  auto dq = dev.put(q);
  float* dout = dev.put<float>(std::vector<float>(ref.size(), untouched));
  dev.be().paged_attention(kv, da, dq, Act(dout, DType::F32));
  const auto y = dev.get(dout, ref.size());
  const bool f16 = pc.kv == DType::F16 || pc.kv == DType::Q8_0;
  const double tol = f16 ? 3e-3 : 1e-2, tol_row = f16 ? 1e-2 : 3e-2;
  EXPECT_LE(rel_err(y, ref), tol) << what;
  double worst = 0;
  int64_t worst_row = -1;
  for (int64_t r = 0; r < rows; ++r) {
    if (row_len[static_cast<size_t>(r)] <= 0) {
      EXPECT_EQ(rows_of(y, r, 1, qd), std::vector<float>(static_cast<size_t>(qd), untouched)) << what << ": row " << r
                                                                                             << " of length 0 written";
      continue;
    }
    const double e = rel_err(rows_of(y, r, 1, qd), rows_of(ref, r, 1, qd));
    if (!(e <= worst)) worst = e, worst_row = r;
  }
  EXPECT_LE(worst, tol_row) << what << ": row " << worst_row << " (length "
                            << (worst_row >= 0 ? row_len[static_cast<size_t>(worst_row)] : 0) << ")";
  // The last row of the longest run, alone: the flash-decoding kernel's bits.
  int64_t best = -1, run = 0, best_run = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const bool cont = r > 0 && row_len[static_cast<size_t>(r)] > 0 && row_len[static_cast<size_t>(r - 1)] > 0 &&
                      row_table[static_cast<size_t>(r)] == row_table[static_cast<size_t>(r - 1)] &&
                      row_len[static_cast<size_t>(r)] == row_len[static_cast<size_t>(r - 1)] + 1;
    run = cont ? run + 1 : 1;
    if (run > best_run) best_run = run, best = r;
  }
  if (best_run >= 16) {
    const char* env = std::getenv("ATELIER_CUDA_FLASH_PREFILL");
    const bool tiled = !Dev::invariant() && !(env && std::string(env) == "0");
    PagedAttention one = da;
    one.rows = 1, one.row_len = da.row_len + best, one.row_table = da.row_table + best;
    float* d1 = dev.put<float>(std::vector<float>(static_cast<size_t>(qd)));
    dev.be().paged_attention(kv, one, dq + best * qd, Act(d1, DType::F32));
    const auto alone = dev.get(d1, static_cast<size_t>(qd));
    if (tiled) {
      EXPECT_NE(alone, rows_of(y, best, 1, qd)) << what << ": row " << best << " did not take the tile kernel";
    } else {
      EXPECT_EQ(alone, rows_of(y, best, 1, qd)) << what << ": row " << best << " (the tile path is off)";
    }
  }
}

// One sequence's rows at lengths from .. from + n - 1.
void add_run(std::vector<std::pair<int, int32_t>>& rows, int seq, int32_t from, int32_t n) {
  for (int32_t i = 0; i < n; ++i) rows.emplace_back(seq, from + i);
}

TEST_P(CudaShapes, PrefillRunsOnTheTileKernel) {
  const std::vector<PrefillCase> cases = {
      {DType::F16, 128, 32, 8, 0, false},  {DType::BF16, 128, 32, 8, 0, false}, {DType::Q8_0, 128, 8, 8, 0, false},
      {DType::F16, 80, 32, 8, 0, false},   {DType::F32, 96, 8, 8, 0, false},    {DType::F16, 64, 8, 8, 40, false},
      {DType::BF16, 64, 8, 8, 0, true},    {DType::F16, 128, 32, 8, 1000, true}, {DType::Q8_0, 64, 8, 8, 40, true},
  };
  for (const PrefillCase& pc : cases) {
    const bool light = pc.n_head <= 8;  // the reference's cost: rows x heads x context x head_dim
    const std::string what = std::string(dtype_name(pc.kv)) + " head_dim " + std::to_string(pc.hd) + " heads " +
                             std::to_string(pc.n_head) + "/" + std::to_string(pc.n_kv) + " window " +
                             std::to_string(pc.window) + (pc.sinks ? " sinks" : "");
    // One sequence: 16 rows from the start, 17 and 64 after a cached prefix,
    // 257 (to 4096 where the reference is light), 2048 from the start.
    for (auto [n, from] : std::vector<std::pair<int32_t, int32_t>>{
             {16, 1}, {17, 100}, {64, 1000}, {257, light ? 3840 : 1}, {2048, 1}}) {
      if (n == 2048 && !(light && (pc.hd <= 64 || pc.window > 0))) continue;
      std::vector<std::pair<int, int32_t>> rows;
      add_run(rows, 0, from, n);
      check_prefill(GetParam(), pc, rows, what + ", " + std::to_string(n) + " rows from length " + std::to_string(from));
    }
    {  // several sequences in one call
      std::vector<std::pair<int, int32_t>> rows;
      add_run(rows, 0, 1, 40);
      add_run(rows, 1, 700, 100);
      add_run(rows, 2, 3000, 16);
      add_run(rows, 3, 65, 65);
      check_prefill(GetParam(), pc, rows, what + ", several sequences");
    }
    {  // decode rows, rows of length 0, runs too short and long enough
      std::vector<std::pair<int, int32_t>> rows;
      rows.emplace_back(0, 1);
      rows.emplace_back(1, 333);
      rows.emplace_back(2, 0);
      rows.emplace_back(3, 4096);
      add_run(rows, 4, 1, 80);
      rows.emplace_back(5, 17);
      add_run(rows, 6, 200, 15);  // 15: the flash-decoding kernel
      rows.emplace_back(7, 0);
      add_run(rows, 8, 2000, 70);
      add_run(rows, 8, 2070, 1);  // continues the run: 71 rows, tiles of 64 and 7
      rows.emplace_back(9, 1);
      check_prefill(GetParam(), pc, rows, what + ", mixed decode and prefill");
    }
  }
}

// The experts' products at gpt-oss's width (2880, not a power of two; MXFP4
// experts, Q8_0 and BF16 too), 32 experts, 4 per token, inputs per token
// (gate, up) and per slot (down), for decode, a batch and a prompt's rows:
// against sums in double over the weights as the device holds them, and
// each slot's row bit for bit the one-row matmul of its expert (F32 outputs,
// so nothing rounds the comparison away) and what the token gets alone.
TEST_P(CudaShapes, MatmulIdAtModelSizes) {
  const int n_expert = 32, k = 4;
  const int64_t cols = 2880, out = 64;
  for (DType t : {DType::MXFP4, DType::Q8_0, DType::F16}) {
    Dev dev(GetParam());
    std::vector<Weights> raw;
    std::vector<std::unique_ptr<Buffer>> storage(static_cast<size_t>(n_expert));
    std::vector<WeightView> set;
    std::vector<std::vector<float>> wf(static_cast<size_t>(n_expert));
    for (int e = 0; e < n_expert; ++e) raw.push_back(make_weights(t, out, cols, 500 + e));
    for (int e = 0; e < n_expert; ++e) {
      set.push_back(dev.be().prepare_weights(raw[static_cast<size_t>(e)].view, storage[static_cast<size_t>(e)]));
      auto& f = wf[static_cast<size_t>(e)];
      f.resize(static_cast<size_t>(out * cols));
      for (int64_t r = 0; r < out; ++r)
        dequantize_row(t, raw[static_cast<size_t>(e)].bytes.data() + r * raw[static_cast<size_t>(e)].view.row_stride_bytes,
                       f.data() + r * cols, cols);
      if (t == DType::F16) f = dev.rounded(f);  // kept as BF16 on the device
    }
    const auto bias = random_floats(n_expert * out, 77);
    for (int64_t rows : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{257}}) {
      for (int x_per_row : {1, k}) {
        const std::string what = std::string(dtype_name(t)) + ", " + std::to_string(rows) + " rows, x per row " +
                                 std::to_string(x_per_row);
        std::vector<int32_t> ids(static_cast<size_t>(rows * k));
        for (int64_t r = 0; r < rows; ++r)  // k distinct experts per token, skewed toward the low ones
          for (int j = 0; j < k; ++j)
            ids[static_cast<size_t>(r * k + j)] = static_cast<int32_t>((r * r * 5 + j * 9 + r) % n_expert);
        const auto x = dev.rounded(random_floats(rows * x_per_row * cols, 78));
        std::vector<float> ref(static_cast<size_t>(rows * k * out));
        for (int64_t sl = 0; sl < rows * k; ++sl) {
          const int e = ids[static_cast<size_t>(sl)];
          const float* xr = x.data() + (x_per_row == 1 ? sl / k : sl) * cols;
          for (int64_t r = 0; r < out; ++r) {
            double acc = bias[static_cast<size_t>(e * out + r)];
            for (int64_t c = 0; c < cols; ++c) acc += double{xr[c]} * wf[static_cast<size_t>(e)][static_cast<size_t>(r * cols + c)];
            ref[static_cast<size_t>(sl * out + r)] = static_cast<float>(acc);
          }
        }
        auto dx = dev.put(x);
        const int32_t* dids = dev.put(ids);
        float* dy = dev.put<float>(std::vector<float>(ref.size()));
        const WeightView* sets[] = {set.data()};
        const Act ys[] = {Act(dy, DType::F32)};
        const float* biases[] = {dev.put<float>(bias)};
        dev.be().matmul_id(sets, ys, biases, 1, n_expert, dx, x_per_row, dids, rows, k);
        const auto got = dev.get(dy, ref.size());
        EXPECT_LE(rel_err(got, ref), 1e-4) << what;
        // The first and last slots as one-row matmuls of their experts (before the bias, added in F32).
        for (int64_t sl : {int64_t{0}, rows * k - 1}) {
          const int e = ids[static_cast<size_t>(sl)];
          float* p = dev.put<float>(std::vector<float>(static_cast<size_t>(out)));
          dev.be().matmul(set[static_cast<size_t>(e)], dx + (x_per_row == 1 ? sl / k : sl) * cols, Act(p, DType::F32), 1);
          auto one = dev.get(p, static_cast<size_t>(out));
          for (int64_t r = 0; r < out; ++r) one[static_cast<size_t>(r)] += bias[static_cast<size_t>(e * out + r)];
          EXPECT_EQ(one, std::vector<float>(got.begin() + sl * out, got.begin() + (sl + 1) * out)) << what << " slot " << sl;
        }
        // The last token alone.
        float* d1 = dev.put<float>(std::vector<float>(static_cast<size_t>(k * out)));
        const Act ys1[] = {Act(d1, DType::F32)};
        dev.be().matmul_id(sets, ys1, biases, 1, n_expert, dx + (rows - 1) * x_per_row * cols, x_per_row,
                           dids + (rows - 1) * k, 1, k);
        EXPECT_EQ(dev.get(d1, static_cast<size_t>(k * out)), std::vector<float>(got.end() - k * out, got.end())) << what;
      }
    }
  }
}


// Sampling at real vocabularies (Llama 3's 128256, Llama 2's 32000) for
// decode and batch row counts: every row the reference's token or one at a
// floating-point boundary (expect_sampled), and the device's own
// determinism: the same rows again, and a row alone, give the same tokens.
TEST_P(CudaShapes, SampleAtVocabularySizes) {
  for (int n_vocab : {128256, 32000}) {
    for (int64_t rows : {int64_t{1}, int64_t{3}, int64_t{64}, int64_t{257}}) {
      Dev dev(GetParam());
      const SampleCase c = sample_case(rows, n_vocab, 90 + static_cast<uint32_t>(rows));
      const std::string what = "vocab " + std::to_string(n_vocab) + ", " + std::to_string(rows) + " rows";
      const auto got = sample_on(dev, c, rows, n_vocab);
      expect_sampled(c, n_vocab, got, false, what);
      EXPECT_EQ(sample_on(dev, c, rows, n_vocab), got) << what << ": run again";
      SampleCase one = c;
      one.logits.assign(c.logits.end() - n_vocab, c.logits.end());
      one.rows = {c.rows.back()};
      EXPECT_EQ(sample_on(dev, one, 1, n_vocab), std::vector<int32_t>{got.back()}) << what << ": the last row alone";
    }
  }
}

// matmul_id grouped by expert on the device (from 2 token rows; policy.h's
// moe_plan): two sets (gate and up: one sort shared, one with biases, one
// without) over routings that fill chunks unevenly (every slot on one expert:
// 129 chunks of one matrix; skewed; unrouted -1 slots), each token's k rows
// bit for bit what that token alone gets (one row: the per-slot kernel), and
// an unrouted slot's output untouched. ATELIER_CUDA_MOE_GROUPED=0 runs the
// old kernel throughout (the device check runs both).
TEST_P(CudaShapes, MatmulIdGroupedByExpertIsEachTokensOwnCall) {
  const int n_expert = 64, k = 4;
  const int64_t cols = 1004, out = 40;  // a float tail: 1004 is not a multiple of 8
  for (DType t : {DType::F16, DType::Q8_0}) {
    const int64_t c = t == DType::Q8_0 ? 1024 : cols;
    Dev dev(GetParam());
    std::vector<Weights> raw;
    std::vector<std::unique_ptr<Buffer>> storage(static_cast<size_t>(2 * n_expert));
    std::vector<WeightView> gate, up;
    for (int e = 0; e < 2 * n_expert; ++e) raw.push_back(make_weights(t, out, c, 900 + e));
    for (int e = 0; e < n_expert; ++e) {
      gate.push_back(dev.be().prepare_weights(raw[static_cast<size_t>(e)].view, storage[static_cast<size_t>(e)]));
      up.push_back(dev.be().prepare_weights(raw[static_cast<size_t>(n_expert + e)].view, storage[static_cast<size_t>(n_expert + e)]));
    }
    const float* bias[] = {dev.put<float>(random_floats(n_expert * out, 91)), nullptr};
    const WeightView* sets[] = {gate.data(), up.data()};
    for (int how = 0; how < 3; ++how) {
      const int64_t rows = how == 0 ? 257 : how == 1 ? 33 : 9;
      const std::string what = std::string(dtype_name(t)) + ", routing " + std::to_string(how);
      std::vector<int32_t> ids(static_cast<size_t>(rows * k));
      for (int64_t sl = 0; sl < rows * k; ++sl)
        ids[static_cast<size_t>(sl)] = how == 0 ? 3                                                    // one expert
                                       : how == 1 ? static_cast<int32_t>((sl * sl * 7 + sl) % 5 * 13)  // 5 experts
                                                  : (sl % 3 == 1 ? -1 : static_cast<int32_t>(sl % n_expert));
      const auto x = dev.rounded(random_floats(rows * c, 92));
      auto dx = dev.put(x);
      const int32_t* dids = dev.put(ids);
      const float sentinel = 12345.0f;
      const size_t n = static_cast<size_t>(rows * k * out);
      float* y0 = dev.put<float>(std::vector<float>(n, sentinel));
      float* y1 = dev.put<float>(std::vector<float>(n, sentinel));
      const Act ys[] = {Act(y0, DType::F32), Act(y1, DType::F32)};
      dev.be().matmul_id(sets, ys, bias, 2, n_expert, dx, 1, dids, rows, k);
      const auto g0 = dev.get(y0, n), g1 = dev.get(y1, n);
      for (int64_t r = 0; r < rows; ++r) {
        float* a0 = dev.put<float>(std::vector<float>(static_cast<size_t>(k * out), sentinel));
        float* a1 = dev.put<float>(std::vector<float>(static_cast<size_t>(k * out), sentinel));
        const Act ya[] = {Act(a0, DType::F32), Act(a1, DType::F32)};
        dev.be().matmul_id(sets, ya, bias, 2, n_expert, dx + r * c, 1, dids + r * k, 1, k);
        const size_t b = static_cast<size_t>(r * k * out), e = b + static_cast<size_t>(k * out);
        ASSERT_EQ(dev.get(a0, static_cast<size_t>(k * out)), std::vector<float>(g0.begin() + static_cast<long>(b), g0.begin() + static_cast<long>(e)))
            << what << " token " << r;
        ASSERT_EQ(dev.get(a1, static_cast<size_t>(k * out)), std::vector<float>(g1.begin() + static_cast<long>(b), g1.begin() + static_cast<long>(e)))
            << what << " token " << r;
      }
      for (int64_t sl = 0; sl < rows * k; ++sl)
        if (ids[static_cast<size_t>(sl)] < 0) {
          EXPECT_EQ(g0[static_cast<size_t>(sl * out)], sentinel) << what << " slot " << sl;
        }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaShapes, ::testing::ValuesIn(cuda_cases()),
                         [](const ::testing::TestParamInfo<BackendCase>& i) { return i.param.name; });

}  // namespace
}  // namespace atelier::kernels

namespace atelier::kernels {
namespace {

// The host as a device: its memory is the machine's (checked against
// sysconf, which reads it another way), and its lane backends are CPU
// backends whose buffers any other CPU backend can read.
TEST(CpuDevice, MemoryIsTheMachinesAndLaneBackendsShareBuffers) {
  const DeviceMemory m = cpu_device().memory();
  const double phys = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGESIZE));
  EXPECT_NEAR(double(m.total_bytes), phys, phys * 0.01);
  EXPECT_GT(m.free_bytes, 0);
  EXPECT_LE(m.free_bytes, m.total_bytes);
  EXPECT_EQ(m.reserved_bytes, 0);
  EXPECT_TRUE(cpu_device().info().host_memory);
  auto text = cpu_device().make_backend(nullptr, 1), image = cpu_device().make_backend(nullptr, 0);
  auto buf = text->alloc(128);
  const float x[4] = {1, 2, 3, 4};
  text->upload(*buf, 0, x, sizeof x);
  float y[4] = {};
  image->copy(Act(buf->at<float>(0), DType::F32), Act(buf->at<float>(64), DType::F32), 4);  // byte offsets
  image->download(*buf, 64, y, sizeof y);
  EXPECT_EQ(std::vector<float>(y, y + 4), std::vector<float>(x, x + 4));
}

}  // namespace
}  // namespace atelier::kernels
