// The CPU backend: each op forwards to the kernels of kernels.h, split over
// the executor's threads by whole rows, so its results are bit for bit those
// of calling the kernels directly (and a row's never depends on the others).
#include <atelier/backend.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

namespace atelier::kernels {

namespace {

class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(int64_t bytes) : bytes_(bytes) {
    if (bytes >= kHugePage) {
      map_bytes_ = static_cast<size_t>(bytes) + kHugePage;
      void* m = ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) throw std::bad_alloc();
      map_ = m;
      const auto first = (reinterpret_cast<uintptr_t>(m) + kHugePage - 1) / kHugePage * kHugePage;
      data_ = reinterpret_cast<void*>(first);
      // Only whole 2 MiB pages inside [data, data + bytes) become huge pages
      // (the mapping's partial tail stays in 4 KiB pages), so nothing is
      // resident that the buffer does not use. Advice: without THP it is a no-op.
      const size_t whole = static_cast<size_t>(bytes) / kHugePage * kHugePage;
      if (whole > 0) ::madvise(data_, whole, MADV_HUGEPAGE);
    } else {
      data_ = ::operator new(static_cast<size_t>(std::max<int64_t>(bytes, 64)), std::align_val_t{64});
    }
  }
  ~HostBuffer() override {
    if (map_) ::munmap(map_, map_bytes_);
    else ::operator delete(data_, std::align_val_t{64});
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* data() override { return data_; }
  int64_t bytes() const override { return bytes_; }

 private:
  // Weights and caches of 2 MiB or more are placed on 2 MiB boundaries in
  // transparent huge pages: a token's matrix-vector products stream the
  // whole model, and with 4 KiB pages every 4 KiB of that is a TLB miss the
  // prefetchers stop at (the 110M F32 products read ~20 % faster out of
  // huge pages on a Zen 3).
  static constexpr int64_t kHugePage = int64_t{2} << 20;
  int64_t bytes_;
  void* data_ = nullptr;
  void* map_ = nullptr;  // the mapping data_ lies in (large buffers)
  size_t map_bytes_ = 0;
};

// Row address of slot s in a KV layout (see KvLayout).
template <class T>
T* kv_row(void* base, const KvLayout& kv, int layer, int64_t slot) {
  const int64_t bt = kv.block_tokens;
  return static_cast<T*>(base) + (slot / bt) * kv.block_stride_elems + layer * kv.layer_stride_elems +
         (slot % bt) * kv.row_elems;
}

// Q8_0 rows (KvLayout of type Q8_0): the same element offsets, GGML blocks
// of 32 values in kQ8BlockBytes each.
Q8Rows kv_q8(void* base, const KvLayout& kv, int layer, int64_t slot) {
  const int64_t bt = kv.block_tokens;
  const int64_t e = (slot / bt) * kv.block_stride_elems + layer * kv.layer_stride_elems + (slot % bt) * kv.row_elems;
  return Q8Rows{static_cast<const uint8_t*>(base) + e / kQ8BlockElems * kQ8BlockBytes, 0};
}

// The run that starts at a slot, typed by the layout, handed to fn (one of
// the overloads below).
template <class Fn>
void with_run(const KvLayout& kv, void* base, int layer, int64_t slot, Fn&& fn) {
  if (kv.type == DType::F16) fn(kv_row<const uint16_t>(base, kv, layer, slot));
  else if (kv.type == DType::Q8_0) fn(kv_q8(base, kv, layer, slot));
  else fn(kv_row<const float>(base, kv, layer, slot));
}
template <class... A>
void run_dot(const float* rows, A... a) { dot_f32_heads(rows, a...); }
template <class... A>
void run_dot(const uint16_t* rows, A... a) { dot_f16_heads(rows, a...); }
template <class... A>
void run_dot(Q8Rows rows, A... a) { dot_q8_0_heads(rows, a...); }
template <class... A>
void run_dot_queries(const float* rows, A... a) { dot_f32_heads_queries(rows, a...); }
template <class... A>
void run_dot_queries(const uint16_t* rows, A... a) { dot_f16_heads_queries(rows, a...); }
template <class... A>
void run_dot_queries(Q8Rows rows, A... a) { dot_q8_0_heads_queries(rows, a...); }
template <class... A>
void run_axpy(const float* w, int64_t w_stride, const float* rows, A... a) { axpy_f32_heads(w, w_stride, rows, a...); }
template <class... A>
void run_axpy(const float* w, int64_t w_stride, const uint16_t* rows, A... a) { axpy_f16_heads(w, w_stride, rows, a...); }
template <class... A>
void run_axpy(const float* w, int64_t w_stride, Q8Rows rows, A... a) { axpy_q8_0_heads(w, w_stride, rows, a...); }
template <class... A>
void run_axpy_queries(int nq, const float* const* w, const int64_t* w_stride, const float* rows, A... a) {
  axpy_f32_heads_queries(nq, w, w_stride, rows, a...);
}
template <class... A>
void run_axpy_queries(int nq, const float* const* w, const int64_t* w_stride, const uint16_t* rows, A... a) {
  axpy_f16_heads_queries(nq, w, w_stride, rows, a...);
}
template <class... A>
void run_axpy_queries(int nq, const float* const* w, const int64_t* w_stride, Q8Rows rows, A... a) {
  axpy_q8_0_heads_queries(nq, w, w_stride, rows, a...);
}

// n activations from x's type to y's (F32, F16, BF16); a plain copy when
// they are the same.
void convert_acts(Act x, Act y, int64_t n) {
  if (n <= 0) return;
  if (x.type() == y.type()) {
    std::memmove(y.data(), x.data(), static_cast<size_t>(act_bytes(x.type(), n)));
    return;
  }
  constexpr int64_t kChunk = 4096;
  float tmp[kChunk];
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t m = std::min(kChunk, n - i);
    const Act xi = x + i, yi = y + i;
    if (x.type() == DType::F32) std::memcpy(tmp, xi.data(), static_cast<size_t>(m) * 4);
    else dequantize_row(x.type(), xi.data(), tmp, m);
    if (y.type() == DType::F32) std::memcpy(yi.data(), tmp, static_cast<size_t>(m) * 4);
    else quantize_row(y.type(), tmp, yi.data(), m);
  }
}

// n images of c x hw elements between layouts (and types, as convert_acts).
void relayout_acts(Act x, Layout from, Act y, Layout to, int64_t n, int64_t c, int64_t hw) {
  if (from == to) return convert_acts(x, y, n * c * hw);
  // Element (i, ch, p) lies at i*c*hw + ch*hw + p (NCHW) or i*c*hw + p*c + ch (NHWC).
  const int64_t rows = from == Layout::NCHW ? c : hw, cols = from == Layout::NCHW ? hw : c;
  if (x.type() == DType::F32 && y.type() == DType::F32) {
    const float* xf = x.f32();
    float* yf = y.f32();
    for (int64_t b = 0; b < n; ++b)
      for (int64_t r = 0; r < rows; ++r) {
        const float* src = xf + (b * rows + r) * cols;
        float* dst = yf + b * rows * cols + r;
        for (int64_t j = 0; j < cols; ++j) dst[j * rows] = src[j];
      }
    return;
  }
  std::vector<float> a(static_cast<size_t>(n * c * hw)), t(a.size());
  convert_acts(x, Act(a.data(), DType::F32), n * c * hw);
  relayout_acts(Act(a.data(), DType::F32), from, Act(t.data(), DType::F32), to, n, c, hw);
  convert_acts(Act(t.data(), DType::F32), y, n * c * hw);
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(Executor* ex) : ex_(ex) {}

  DeviceInfo device() const override {
    DeviceInfo d;
    d.name = "cpu";
    d.description = "x86-64, " + std::string(simd_level()) + ", " + std::to_string(ex_ ? ex_->threads() : 1) +
                    (ex_ && ex_->threads() > 1 ? " threads" : " thread");
    d.host_memory = true;
    return d;
  }

  std::unique_ptr<Buffer> alloc(int64_t bytes) override { return std::make_unique<HostBuffer>(bytes); }

  // MADV_POPULATE_WRITE (Linux 5.14) faults the pages in writable as a write
  // would, without writing: the contents stay, so ops may run on them meanwhile.
  bool commit(Buffer& b, int64_t offset, int64_t bytes) override {
    if (offset < 0 || bytes < 0 || offset + bytes > b.bytes()) return false;
    if (bytes == 0) return true;
    static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t lo = (reinterpret_cast<uintptr_t>(b.data()) + static_cast<uintptr_t>(offset)) / page * page;
    const uintptr_t hi = reinterpret_cast<uintptr_t>(b.data()) + static_cast<uintptr_t>(offset + bytes);
    return ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE) == 0;
  }
  void upload(Buffer& dst, int64_t offset, const void* src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(dst.at<uint8_t>(offset), src, static_cast<size_t>(bytes));
  }
  void download(Buffer& src, int64_t offset, void* dst, int64_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src.at<uint8_t>(offset), static_cast<size_t>(bytes));
  }
  void synchronize() override {}  // every op has finished when it returns
  void clear(Buffer& b, uint8_t value) override { std::memset(b.data(), value, static_cast<size_t>(b.bytes())); }

  WeightView prepare_weights(const WeightView& w, std::unique_ptr<Buffer>& storage) override {
    const int64_t bytes = packed_weight_bytes(w);
    if (bytes == 0) return w;
    storage = alloc(bytes);
    return pack_weights(w, storage->data());
  }
  int64_t prepared_weight_bytes(const WeightView& w) override {
    const int64_t packed = packed_weight_bytes(w);
    return ((packed > 0 ? packed : w.rows * w.row_stride_bytes) + 63) / 64 * 64;
  }
  WeightView prepare_weights_at(const WeightView& w, Buffer& dst, int64_t offset) override {
    void* at = dst.at<uint8_t>(offset);
    if (packed_weight_bytes(w) > 0) return pack_weights(w, at);
    std::memcpy(at, w.data, static_cast<size_t>(w.rows * w.row_stride_bytes));
    WeightView v = w;
    v.data = at;
    return v;
  }

  void matmul(const WeightView& w, Act x, Act y, int64_t rows) override {
    kernels::matmul(w, x.f32(), y.f32(), rows, ex_);
  }
  void matmul_many(const WeightView* const* w, const Act* y, int count, Act x, int64_t rows) override {
    float* ys[8];
    if (count > 8) throw std::logic_error("matmul_many takes at most 8 products");
    for (int i = 0; i < count; ++i) ys[i] = y[i].f32();
    kernels::matmul_many(w, ys, count, x.f32(), rows, ex_);
  }
  void get_rows(const WeightView& table, const int32_t* ids, Act y, int64_t rows) override {
    float* yf = y.f32();
    for (int64_t r = 0; r < rows; ++r) dequantize_weight_row(table, ids[r], yf + r * table.cols);
  }
  void copy_rows(Act x, const int32_t* ids, Act y, int64_t rows, int64_t dim) override {
    const float* xf = x.f32();
    float* yf = y.f32();
    for_rows(rows, [&](int64_t r) {
      std::memcpy(yf + r * dim, xf + int64_t{ids[r]} * dim, sizeof(float) * static_cast<size_t>(dim));
    });
  }

  void rms_norm(Act x, const float* weight, Act y, int64_t rows, int64_t dim, float eps) override {
    const float* xf = x.f32();
    float* yf = y.f32();
    for_rows(rows, [&](int64_t r) { kernels::rms_norm(xf + r * dim, weight, yf + r * dim, dim, eps); });
  }
  void add_rms_norm(Act x, Act delta, const float* weight, Act y, int64_t rows, int64_t dim, float eps) override {
    float* xf = x.f32();
    const float* df = delta.f32();
    float* yf = y.f32();
    for_rows(rows, [&](int64_t r) {
      float* xr = xf + r * dim;
      const float* dr = df + r * dim;
      for (int64_t j = 0; j < dim; ++j) xr[j] += dr[j];
      if (weight) kernels::rms_norm(xr, weight, yf + r * dim, dim, eps);
    });
  }
  void layer_norm(Act x, Act y, int64_t rows, int64_t dim, const float* gamma, const float* beta, float eps) override {
    kernels::layer_norm(x.f32(), y.f32(), rows, dim, gamma, beta, eps, ex_);
  }
  void group_norm(Act x, Act y, int64_t n, int64_t c, int64_t hw, int64_t groups, const float* gamma,
                  const float* beta, float eps, bool silu) override {
    kernels::group_norm(x.f32(), y.f32(), n, c, hw, groups, gamma, beta, eps, silu, ex_);
  }

  void rope(Act x, int64_t rows, const int32_t* positions, const RopeParams& p) override {
    const int64_t width = p.n_heads * p.head_dim;
    float* xf = x.f32();
    for_rows(rows, [&](int64_t r) {
      kernels::rope(xf + r * width, p.n_heads, p.head_dim, p.rot_dim, positions[r], p.freq_base, p.freq_scale, p.neox,
                    p.freq_factors, p.yarn);
    });
  }
  void add(Act a, Act b, Act y, int64_t n) override {
    const float *af = a.f32(), *bf = b.f32();
    float* yf = y.f32();
    for (int64_t i = 0; i < n; ++i) yf[i] = af[i] + bf[i];
  }
  void add_bias(Act x, const float* bias, int64_t rows, int64_t dim) override {
    float* xf = x.f32();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < dim; ++j) xf[r * dim + j] += bias[j];
  }
  void activation(Activation a, Act x, Act y, int64_t n) override { kernels::activation(a, x.f32(), y.f32(), n, ex_); }
  void swiglu(Act gate, Act up, Act out, int64_t rows, int64_t dim) override {
    const float *gf = gate.f32(), *uf = up.f32();
    float* of = out.f32();
    // Row by row: the SIMD loop's tail would round a row's last elements
    // differently if rows were run as one long array.
    for_rows(rows, [&](int64_t r) { kernels::swiglu(gf + r * dim, uf + r * dim, of + r * dim, dim); });
  }
  void glu(Activation a, Act gate, Act up, Act out, int64_t rows, int64_t dim) override {
    const float *gf = gate.f32(), *uf = up.f32();
    float* of = out.f32();
    for_rows(rows, [&](int64_t r) { kernels::glu(a, gf + r * dim, uf + r * dim, of + r * dim, dim); });
  }
  void geglu(Act x, Act y, int64_t rows, int64_t dim) override { kernels::geglu(x.f32(), y.f32(), rows, dim, ex_); }
  void softmax(Act x, int64_t rows, int64_t n) override {
    float* xf = x.f32();
    for_rows(rows, [&](int64_t r) { kernels::softmax(xf + r * n, n); });
  }

  // The reference itself, row by row over the threads: the engine samples on
  // the host on the CPU (text::Sampler: the same rules, faster, and no
  // download to save), so this serves the op suite and tests' fake devices.
  void sample(Act logits, int64_t rows, int n_vocab, const SampleRow* params, const int32_t* penalty_tokens,
              int32_t* out_ids) override {
    float* lf = logits.f32();
    for_rows(rows, [&](int64_t r) { sample_ref(lf + r * n_vocab, 1, n_vocab, params + r, penalty_tokens, out_ids + r); });
  }

  void moe_route(Act logits, int64_t rows, const MoeRouting& r, int32_t* ids, float* weights) override {
    const float* lf = logits.f32();
    for_rows(rows, [&](int64_t i) { kernels::moe_route(lf + i * r.n_expert, r, ids + i * r.k, weights + i * r.k); });
  }
  void matmul_id(const WeightView* const* experts, const Act* y, const float* const* bias, int count, int n_expert,
                 Act x, int x_per_row, const int32_t* ids, int64_t rows, int k) override {
    float* ys[8];
    if (count > 8) {
      for (int i = 0; i < count; ++i) matmul_id(&experts[i], &y[i], bias ? &bias[i] : nullptr, 1, n_expert, x, x_per_row, ids, rows, k);
      return;
    }
    for (int i = 0; i < count; ++i) ys[i] = y[i].f32();
    kernels::matmul_id(experts, ys, bias, count, n_expert, x.f32(), x_per_row, ids, rows, k, ex_);
  }
  void moe_combine(Act y, const float* weights, Act out, int64_t rows, int k, int64_t dim) override {
    const float* yf = y.f32();
    float* of = out.f32();
    for_rows(rows, [&](int64_t r) { kernels::moe_combine(yf + r * k * dim, weights + r * k, of + r * dim, 1, k, dim); });
  }
  void swiglu_oai(Act gate, Act up, Act out, int64_t rows, int64_t dim, float alpha, float limit) override {
    const float *gf = gate.f32(), *uf = up.f32();
    float* of = out.f32();
    for_rows(rows, [&](int64_t r) { kernels::swiglu_oai(gf + r * dim, uf + r * dim, of + r * dim, dim, alpha, limit); });
  }

  void affine(Act x, Act y, int64_t n, const Affine& a) override {
    const float* xf = x.f32();
    float* yf = y.f32();
    const bool add = a.add != 0.0f, mul = a.mul != 1.0f, div = a.div != 1.0f;
    const bool clamp = a.lo != -INFINITY || a.hi != INFINITY;
    for (int64_t i = 0; i < n; ++i) {
      float v = xf[i];
      if (add) v += a.add;
      if (mul) v *= a.mul;
      if (div) v /= a.div;
      if (clamp) v = std::clamp(v, a.lo, a.hi);
      yf[i] = v;
    }
  }
  void copy(Act x, Act y, int64_t n) override { convert_acts(x, y, n); }
  void add_channel_bias(Act x, Act bias, int64_t n, int64_t c, int64_t hw) override {
    float* xf = x.f32();
    const float* bf = bias.f32();
    for (int64_t p = 0; p < n * c; ++p) {
      float* r = xf + p * hw;
      const float v = bf[p];
      for (int64_t i = 0; i < hw; ++i) r[i] += v;
    }
  }
  void concat_channels(Act a, int64_t ca, Act b, int64_t cb, Act y, int64_t n, int64_t hw) override {
    const float *af = a.f32(), *bf = b.f32();
    float* yf = y.f32();
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(af + i * ca * hw, ca * hw, yf + i * (ca + cb) * hw);
      std::copy_n(bf + i * cb * hw, cb * hw, yf + (i * (ca + cb) + ca) * hw);
    }
  }
  void timestep_embedding(const float* t, int64_t n, int64_t dim, Act out, bool flip_sin_to_cos,
                          float downscale_freq_shift, float max_period) override {
    kernels::timestep_embedding(t, n, dim, out.f32(), flip_sin_to_cos, downscale_freq_shift, max_period);
  }
  void relu(Act x, Act y, int64_t n) override {
    const float* xf = x.f32();
    float* yf = y.f32();
    for (int64_t i = 0; i < n; ++i) yf[i] = std::max(xf[i], 0.0f);
  }
  void tanh_clamp(Act x, Act y, int64_t n, float limit) override {
    const float* xf = x.f32();
    float* yf = y.f32();
    for (int64_t i = 0; i < n; ++i) yf[i] = std::tanh(xf[i] / limit) * limit;
  }
  void relayout(Act x, Layout from, Act y, Layout to, int64_t n, int64_t c, int64_t hw) override {
    relayout_acts(x, from, y, to, n, c, hw);
  }
  void pad2d(Act x, Act y, int64_t n, int64_t c, int64_t h, int64_t w, const Pad2d& p) override {
    const float* xf = x.f32();
    float* yf = y.f32();
    const int64_t planes = n * c, oh = p.top + h + p.bottom, ow = p.left + w + p.right;
    std::fill(yf, yf + planes * oh * ow, 0.0f);
    for (int64_t pl = 0; pl < planes; ++pl)
      for (int64_t r = 0; r < h; ++r)
        std::copy_n(xf + (pl * h + r) * w, w, yf + (pl * oh + p.top + r) * ow + p.left);
  }

  void store_kv(const KvLayout& kv, int layer, Act k, Act v, const int32_t* slots, int64_t rows) override {
    check_kv(kv);
    const int64_t n = kv.row_elems;
    const float *kf = k.f32(), *vf = v.f32();
    for_rows(rows, [&](int64_t r) { store_row(kv, layer, kf + r * n, vf + r * n, slots[r]); });
  }

  void rope_store_kv(Act q, Act k, Act v, int64_t rows, const int32_t* positions, const RopeParams& rq,
                     const RopeParams& rk, const KvLayout& kv, int layer, const int32_t* slots) override {
    check_kv(kv);
    const int64_t qw = rq.n_heads * rq.head_dim, n = kv.row_elems;
    float *qf = q.f32(), *kf = k.f32();
    const float* vf = v.f32();
    for_rows(rows, [&](int64_t r) {
      kernels::rope(qf + r * qw, rq.n_heads, rq.head_dim, rq.rot_dim, positions[r], rq.freq_base, rq.freq_scale,
                    rq.neox, rq.freq_factors, rq.yarn);
      kernels::rope(kf + r * n, rk.n_heads, rk.head_dim, rk.rot_dim, positions[r], rk.freq_base, rk.freq_scale,
                    rk.neox, rk.freq_factors, rk.yarn);
      store_row(kv, layer, kf + r * n, vf + r * n, slots[r]);
    });
  }
  void paged_attention(const KvLayout& kv, const PagedAttention& a, Act q, Act out) override {
    check_kv(kv);
    paged_attention_f32(kv, a, q.f32(), out.f32());
  }

  void attention(const AttentionShape& s, Act q, Act k, Act v, Act out) override {
    kernels::attention(s, q.f32(), k.f32(), v.f32(), out.f32(), ex_);
  }
  void causal_attention(const AttentionShape& s, Act q, Act k, Act v, int64_t stride, Act out) override {
    causal_attention_f32(s, q.f32(), k.f32(), v.f32(), stride, out.f32());
  }
  void conv2d(const Conv2dShape& s, Act x, DType w_type, const void* weight, const float* bias, Act y) override {
    kernels::conv2d(s, x.f32(), w_type, weight, bias, y.f32(), ex_);
  }
  void upsample_nearest2x(Act x, Act y, int64_t n, int64_t c, int64_t h, int64_t w) override {
    kernels::upsample_nearest2x(x.f32(), y.f32(), n * c, h, w, ex_);
  }

 private:
  // Rows split over the threads from 2 rows on (a decode step's single row
  // runs on the calling thread: waking the pool would cost more).
  template <class F>
  void for_rows(int64_t n, F&& f) {
    auto body = [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) f(i);
    };
    if (ex_ && n > 1) ex_->parallel_for(n, body);
    else body(0, n);
  }

  // The CPU's attention kernels read F32, F16 and Q8_0 caches; BF16 and
  // MXFP8 are the GPU's (store_kv_ref / paged_attention_ref read them all).
  static void check_kv(const KvLayout& kv) {
    if (kv.type != DType::F32 && kv.type != DType::F16 && kv.type != DType::Q8_0)
      throw std::invalid_argument("the CPU keeps its KV cache in f32, f16 or q8_0, not " +
                                  std::string(dtype_name(kv.type)) + ": use --kv-type f16 (or q8_0) on the CPU");
  }

  static void store_row(const KvLayout& kv, int layer, const float* k, const float* v, int32_t s) {
    if (s < 0) return;
    const int64_t n = kv.row_elems;
    if (kv.type == DType::F16) {
      f32_to_fp16_row(k, kv_row<uint16_t>(kv.k, kv, layer, s), n);
      f32_to_fp16_row(v, kv_row<uint16_t>(kv.v, kv, layer, s), n);
    } else if (kv.type == DType::Q8_0) {  // GGML's rounding (quantize_row), as llama.cpp's -ctk q8_0
      quantize_row(DType::Q8_0, k, const_cast<uint8_t*>(kv_q8(kv.k, kv, layer, s).blocks), n);
      quantize_row(DType::Q8_0, v, const_cast<uint8_t*>(kv_q8(kv.v, kv, layer, s).blocks), n);
    } else {
      std::memcpy(kv_row<float>(kv.k, kv, layer, s), k, sizeof(float) * static_cast<size_t>(n));
      std::memcpy(kv_row<float>(kv.v, kv, layer, s), v, sizeof(float) * static_cast<size_t>(n));
    }
  }

  void paged_attention_f32(const KvLayout& kv, const PagedAttention& a, const float* q, float* out);
  void causal_attention_f32(const AttentionShape& s, const float* q, const float* k, const float* v, int64_t stride,
                            float* out);

  Executor* ex_;
};

void CpuBackend::paged_attention_f32(const KvLayout& kv, const PagedAttention& a, const float* q, float* out) {
  const int64_t hd = a.head_dim, qd = a.n_head * hd;
  const int group = a.n_head / a.n_head_kv;
  // A task is a group of rows' heads h0..h1. A group is up to kRows
  // consecutive rows that share a block table (a prompt's rows of one
  // sequence; in generation every row is its own group): the task walks the
  // cached positions run by run (the rest of each block) and, for each run,
  // every row of the group that attends it, so a run's K and V rows are read
  // from memory once for the group instead of once per row (a 512-token chunk
  // at depth 8192 read the whole cache 512 times). Each row's arithmetic is
  // what it is alone: each position's dot is the one-row dot, and the V
  // accumulation is one FMA per position in position order, so neither the
  // grouping, the other rows of the step, nor the task split changes a bit.
  // Heads are split only as far as the threads need (below).
  constexpr int64_t kRows = 8;
  std::vector<int64_t> groups;  // first row of each group, then a.rows
  for (int64_t i = 0; i < a.rows; ++i)
    if (groups.empty() || i - groups.back() >= kRows || a.row_table[i] != a.row_table[groups.back()]) groups.push_back(i);
  const int64_t n_groups = static_cast<int64_t>(groups.size());
  groups.push_back(a.rows);
  const int threads = ex_ ? ex_->threads() : 1;
  // No more groups than threads (one sequence generating): one task of
  // n_head / threads heads per thread, not a head per task, so that each
  // task reads the cached rows in one pass instead of a sliver per head.
  const int64_t per_thread = (a.n_head + threads - 1) / threads;
  const int span = static_cast<int>(std::clamp<int64_t>(
      n_groups <= threads ? per_thread : a.n_head * n_groups / (4 * threads), 1, a.n_head));
  const int chunks = (a.n_head + span - 1) / span;
  const int bt = kv.block_tokens;
  auto task = [&](int64_t begin, int64_t end) {
    // Grown once per thread to the most seen, then reused.
    thread_local std::vector<float> scores;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t g0 = groups[static_cast<size_t>(t / chunks)], g1 = groups[static_cast<size_t>(t / chunks + 1)];
      const int h0 = static_cast<int>(t % chunks) * span, h1 = std::min(a.n_head, h0 + span);
      // Row i attends [first_i, len_i); its scores (per head, n_att_i each) start at base_i.
      int first[kRows], len[kRows], n_att[kRows];
      size_t base[kRows], total = 0;
      int lo = INT32_MAX, hi = 0;
      for (int64_t i = g0; i < g1; ++i) {
        const int64_t r = i - g0;
        len[r] = std::max(0, a.row_len[i]);
        first[r] = a.window > 0 ? std::max(0, len[r] - a.window) : 0;
        n_att[r] = len[r] - first[r];
        base[r] = total;
        total += static_cast<size_t>(h1 - h0) * static_cast<size_t>(std::max(n_att[r], 0));
        if (n_att[r] > 0) lo = std::min(lo, first[r]), hi = std::max(hi, len[r]);
      }
      if (hi <= lo) continue;
      if (scores.size() < total) scores.resize(total);
      const int32_t* table = a.block_tables + a.row_table[g0];
      AttnHeads heads;
      heads.h0 = h0;
      heads.h1 = h1;
      heads.group = group;
      heads.head_dim = hd;
      // Each row's part [max(p, first), min(p + n, len)) of the run [p, p + n).
      auto each_row_in_run = [&](int p, int n, auto&& fn) {
        for (int64_t i = g0; i < g1; ++i) {
          const int64_t r = i - g0;
          const int b = std::max(p, first[r]), e = std::min(p + n, len[r]);
          if (b < e) fn(i, r, b, e - b);
        }
      };
      // The rows whose part of the run [p, p + n) starts at p share [p, c),
      // c their shortest end in it (a prompt's rows differ only in how far
      // they reach): its K and V rows are read once for all of them
      // (dot_*_heads_queries, axpy_*_heads_queries: each row's result as its
      // own call's). Each row's rest of the run is its own call. Returns c.
      auto shared_rows = [&](int p, int n, bool (&shared)[kRows]) {
        int c = p + n;
        for (int64_t r = 0; r < g1 - g0; ++r)
          if (first[r] <= p && len[r] > p) c = std::min(c, len[r]);
        for (int64_t r = 0; r < g1 - g0; ++r) shared[r] = first[r] <= p && len[r] >= c && c > p;
        return c;
      };
      for (int p = lo; p < hi;) {
        const int n = std::min(bt - p % bt, hi - p);
        bool shared[kRows] = {};
        const int c = shared_rows(p, n, shared);
        const float* qs[kRows];
        float* scs[kRows];
        int64_t sss[kRows];
        int nq = 0;
        for (int64_t i = g0; i < g1; ++i) {
          const int64_t r = i - g0;
          if (shared[r]) qs[nq] = q + i * qd, scs[nq] = scores.data() + base[r] + (p - first[r]), sss[nq] = n_att[r], ++nq;
        }
        if (nq > 0) {
          const int64_t slot = int64_t{table[p / bt]} * bt + p % bt;
          with_run(kv, kv.k, a.layer, slot,
                   [&](auto rows) { run_dot_queries(rows, kv.row_elems, int64_t{c - p}, heads, nq, qs, scs, sss); });
        }
        each_row_in_run(p, n, [&](int64_t i, int64_t r, int b, int m) {
          if (shared[r]) m -= c - b, b = c;
          if (m <= 0) return;
          const int64_t slot = int64_t{table[b / bt]} * bt + b % bt;
          float* sc = scores.data() + base[r] + (b - first[r]);
          with_run(kv, kv.k, a.layer, slot, [&](auto rows) {
            run_dot(rows, kv.row_elems, int64_t{m}, heads, q + i * qd, sc, int64_t{n_att[r]});
          });
        });
        each_row_in_run(p, n, [&](int64_t, int64_t r, int b, int m) {
          float* sc = scores.data() + base[r] + (b - first[r]);
          for (int h = h0; h < h1; ++h)
            for (int j = 0; j < m; ++j) sc[(h - h0) * n_att[r] + j] *= a.scale;
        });
        p += n;
      }
      for (int64_t i = g0; i < g1; ++i) {
        const int64_t r = i - g0;
        if (n_att[r] <= 0) continue;  // an empty row is left as it is
        float* o = out + i * qd;
        for (int h = h0; h < h1; ++h) {
          float* sc = scores.data() + base[r] + static_cast<size_t>(h - h0) * static_cast<size_t>(n_att[r]);
          if (a.sinks) kernels::softmax_sink(sc, n_att[r], a.sinks[h]);
          else kernels::softmax(sc, n_att[r]);
          std::fill(o + h * hd, o + (h + 1) * hd, 0.0f);
        }
      }
      for (int p = lo; p < hi;) {
        const int n = std::min(bt - p % bt, hi - p);
        bool shared[kRows] = {};
        const int c = shared_rows(p, n, shared);
        const float* ws[kRows];
        int64_t wss[kRows];
        float* ys[kRows];
        int nq = 0;
        for (int64_t i = g0; i < g1; ++i) {
          const int64_t r = i - g0;
          if (shared[r]) ws[nq] = scores.data() + base[r] + (p - first[r]), wss[nq] = n_att[r], ys[nq] = out + i * qd, ++nq;
        }
        if (nq > 0) {
          const int64_t slot = int64_t{table[p / bt]} * bt + p % bt;
          with_run(kv, kv.v, a.layer, slot,
                   [&](auto rows) { run_axpy_queries(nq, ws, wss, rows, kv.row_elems, int64_t{c - p}, heads, ys); });
        }
        each_row_in_run(p, n, [&](int64_t i, int64_t r, int b, int m) {
          if (shared[r]) m -= c - b, b = c;
          if (m <= 0) return;
          const int64_t slot = int64_t{table[b / bt]} * bt + b % bt;
          const float* w = scores.data() + base[r] + (b - first[r]);
          with_run(kv, kv.v, a.layer, slot, [&](auto rows) {
            run_axpy(w, int64_t{n_att[r]}, rows, kv.row_elems, int64_t{m}, heads, out + i * qd);
          });
        });
        p += n;
      }
    }
  };
  const int64_t tasks = n_groups * chunks;
  if (ex_) ex_->parallel_for(tasks, task);
  else task(0, tasks);
}

void CpuBackend::causal_attention_f32(const AttentionShape& s, const float* q, const float* k, const float* v,
                                      int64_t stride, float* out) {
  const int64_t T = s.lq, hd = s.head_dim, H = s.heads, w = H * hd;
  const float scale = s.scale > 0 ? s.scale : 1.0f / std::sqrt(static_cast<float>(hd));
  // One task per (sequence, head), each on one thread: scores = q K^T by
  // matmul with K read in place (rows of hd floats, `stride` apart), the
  // causal softmax row by row, then P V by matmul against V transposed.
  auto task = [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> qh, vt, scores, oh;
    qh.resize(static_cast<size_t>(T * hd));
    vt.resize(static_cast<size_t>(hd * T));
    scores.resize(static_cast<size_t>(T * T));
    oh.resize(static_cast<size_t>(T * hd));
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / H, head = t % H;
      const float *qb = q + b * T * stride, *kb = k + b * T * stride, *vb = v + b * T * stride;
      float* ob = out + b * T * w;
      for (int64_t i = 0; i < T; ++i)
        for (int64_t d = 0; d < hd; ++d) {
          qh[static_cast<size_t>(i * hd + d)] = qb[i * stride + head * hd + d];
          vt[static_cast<size_t>(d * T + i)] = vb[i * stride + head * hd + d];
        }
      WeightView kv;
      kv.data = kb + head * hd;
      kv.rows = T, kv.cols = hd, kv.row_stride_bytes = stride * 4;
      kernels::matmul(kv, qh.data(), scores.data(), T, nullptr);
      for (int64_t i = 0; i < T; ++i) {
        float* r = scores.data() + i * T;
        for (int64_t j = 0; j <= i; ++j) r[j] *= scale;
        kernels::softmax(r, i + 1);
        for (int64_t j = i + 1; j < T; ++j) r[j] = 0;
      }
      WeightView vv;
      vv.data = vt.data();
      vv.rows = hd, vv.cols = T, vv.row_stride_bytes = T * 4;
      kernels::matmul(vv, scores.data(), oh.data(), T, nullptr);
      for (int64_t i = 0; i < T; ++i)
        for (int64_t d = 0; d < hd; ++d) ob[i * w + head * hd + d] = oh[static_cast<size_t>(i * hd + d)];
    }
  };
  const int64_t tasks = s.batch * H;
  if (ex_ && tasks > 1) ex_->parallel_for(tasks, task);
  else task(0, tasks);
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(Executor* ex) { return std::make_unique<CpuBackend>(ex); }

Backend& default_cpu_backend() {
  static CpuBackend cpu(nullptr);
  return cpu;
}

const char* layout_name(Layout l) { return l == Layout::NHWC ? "nhwc" : "nchw"; }

uint64_t new_graph_scope() {
  static std::atomic<uint64_t> next{0};
  return ++next;
}

const char* weight_precision_name(WeightPrecision p) {
  switch (p) {
    case WeightPrecision::fp16: return "fp16";
    case WeightPrecision::fp8_e4m3: return "fp8-e4m3";
    default: return "bf16";
  }
}

void conv_weights_for(Layout layout, DType w_type, const void* oihw, void* dst, int64_t c_out, int64_t c_in, int64_t kh,
                      int64_t kw) {
  const int64_t e = w_type == DType::F32 ? 4 : 2, k = kh * kw;
  const auto* src = static_cast<const uint8_t*>(oihw);
  auto* out = static_cast<uint8_t*>(dst);
  if (layout == Layout::NCHW || k == 1) {
    std::memcpy(out, src, static_cast<size_t>(c_out * c_in * k * e));
    return;
  }
  for (int64_t o = 0; o < c_out; ++o)
    for (int64_t i = 0; i < c_in; ++i)
      for (int64_t p = 0; p < k; ++p)
        std::memcpy(out + ((o * k + p) * c_in + i) * e, src + ((o * c_in + i) * k + p) * e, static_cast<size_t>(e));
}

namespace {

class CpuDevice final : public Device {
 public:
  DeviceInfo info() const override { return default_cpu_backend().device(); }
  DeviceMemory memory() const override {
    DeviceMemory m;
    // /proc/meminfo's kB lines; sysconf for the total where it cannot be read.
    if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
      char key[64];
      long long kb = 0;
      while (std::fscanf(f, "%63s %lld kB", key, &kb) == 2) {
        if (std::strcmp(key, "MemTotal:") == 0) m.total_bytes = kb * 1024;
        if (std::strcmp(key, "MemAvailable:") == 0) m.free_bytes = kb * 1024;
      }
      std::fclose(f);
    }
    if (m.total_bytes == 0) m.total_bytes = int64_t{::sysconf(_SC_PHYS_PAGES)} * ::sysconf(_SC_PAGESIZE);
    if (m.free_bytes == 0) m.free_bytes = int64_t{::sysconf(_SC_AVPHYS_PAGES)} * ::sysconf(_SC_PAGESIZE);
    return m;
  }
  std::unique_ptr<Backend> make_backend(Executor* ex, int) override { return make_cpu_backend(ex); }
};

}  // namespace

Device& cpu_device() {
  static CpuDevice d;
  return d;
}

// ---------------------------------------------------------------- references

namespace {
// Bytes at a KV row's start, any type the references read: element offsets
// (KvLayout) scaled by the type's block (Q8_0 / MXFP8 rows start on a block).
uint8_t* kv_row_bytes(void* base, const KvLayout& kv, int layer, int64_t slot) {
  const int64_t bt = kv.block_tokens;
  const int64_t e = (slot / bt) * kv.block_stride_elems + layer * kv.layer_stride_elems + (slot % bt) * kv.row_elems;
  return static_cast<uint8_t*>(base) + e / dtype_block_elems(kv.type) * dtype_block_bytes(kv.type);
}
}  // namespace

void store_kv_ref(const KvLayout& kv, int layer, const float* k, const float* v, const int32_t* slots, int64_t rows) {
  const int64_t n = kv.row_elems;
  for (int64_t r = 0; r < rows; ++r) {
    if (slots[r] < 0) continue;
    // quantize_row is each type's definition (Q8_0: GGML's blocks; MXFP8:
    // DType::MXFP8's encoder; F16 / BF16 rounded to nearest even).
    quantize_row(kv.type, k + r * n, kv_row_bytes(kv.k, kv, layer, slots[r]), n);
    quantize_row(kv.type, v + r * n, kv_row_bytes(kv.v, kv, layer, slots[r]), n);
  }
}

void causal_attention_ref(const AttentionShape& s, const float* q, const float* k, const float* v, int64_t stride,
                          float* out) {
  const int64_t T = s.lq, hd = s.head_dim, w = s.heads * hd;
  const double scale = s.scale > 0 ? s.scale : 1.0 / std::sqrt(static_cast<double>(hd));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> p(static_cast<size_t>(i + 1));
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (int64_t c = 0; c < hd; ++c)
            d += double{q[(b * T + i) * stride + h * hd + c]} * k[(b * T + j) * stride + h * hd + c];
          p[static_cast<size_t>(j)] = d * scale;
          mx = std::max(mx, d * scale);
        }
        for (double& x : p) sum += (x = std::exp(x - mx));
        for (int64_t c = 0; c < hd; ++c) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += p[static_cast<size_t>(j)] * v[(b * T + j) * stride + h * hd + c];
          out[(b * T + i) * w + h * hd + c] = static_cast<float>(acc / sum);
        }
      }
}

void sample_ref(float* logits, int64_t rows, int n_vocab, const SampleRow* params, const int32_t* penalty_tokens,
                int32_t* out_ids) {
  struct Cand {
    int32_t id;
    float logit, p;
  };
  std::vector<Cand> c;
  for (int64_t row = 0; row < rows; ++row) {
    const SampleRow& p = params[row];
    if (p.skip) {
      out_ids[row] = -1;
      continue;
    }
    float* l = logits + row * n_vocab;
    if (p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f)
      for (int32_t i = 0; i < p.penalty_count; ++i) {
        const int32_t id = penalty_tokens[2 * (p.penalty_offset + i)], n = penalty_tokens[2 * (p.penalty_offset + i) + 1];
        if (id < 0 || id >= n_vocab) continue;
        float& x = l[id];
        if (p.repeat_penalty != 1.0f) x = x > 0 ? x / p.repeat_penalty : x * p.repeat_penalty;
        x -= static_cast<float>(n) * p.frequency_penalty + (n > 0 ? p.presence_penalty : 0.0f);
      }
    if (p.temperature <= 0.0f) {  // greedy: the first maximum
      int32_t best = 0;
      for (int32_t i = 1; i < n_vocab; ++i)
        if (l[i] > l[best]) best = i;
      out_ids[row] = best;
      continue;
    }
    c.resize(static_cast<size_t>(n_vocab));
    for (int32_t i = 0; i < n_vocab; ++i) c[static_cast<size_t>(i)] = {i, l[i], 0.0f};
    auto order = [](const Cand& a, const Cand& b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); };
    size_t n = c.size();
    if (p.top_k > 0 && p.top_k < n_vocab) {
      n = static_cast<size_t>(p.top_k);
      std::partial_sort(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(n), c.end(), order);
    } else {
      std::sort(c.begin(), c.end(), order);
    }
    c.resize(n);
    auto softmax = [&] {
      double sum = 0;
      const float mx = c[0].logit;
      for (Cand& x : c) sum += (x.p = std::exp(x.logit - mx));
      for (Cand& x : c) x.p = static_cast<float>(x.p / sum);
    };
    softmax();
    if (p.top_p < 1.0f) {
      double cum = 0;
      for (size_t i = 0; i < c.size(); ++i)
        if ((cum += c[i].p) >= p.top_p) {
          c.resize(i + 1);
          break;
        }
    }
    if (p.min_p > 0.0f) {
      const float threshold = c[0].p * p.min_p;
      size_t keep = 1;
      while (keep < c.size() && c[keep].p >= threshold) ++keep;
      c.resize(keep);
    }
    for (Cand& x : c) x.logit /= p.temperature;
    softmax();
    double cum = 0;
    out_ids[row] = c.back().id;
    for (const Cand& x : c)
      if (p.r < (cum += x.p)) {
        out_ids[row] = x.id;
        break;
      }
  }
}

void paged_attention_ref(const KvLayout& kv, const PagedAttention& a, const float* q, float* out) {
  const int64_t hd = a.head_dim, qd = a.n_head * hd;
  const int group = a.n_head / a.n_head_kv;
  const int bt = kv.block_tokens;
  const int64_t be = dtype_block_elems(kv.type), bb = dtype_block_bytes(kv.type);
  auto elem = [&](void* base, int64_t slot, int64_t j) -> double {  // dequantize_row of the value's block
    float block[32];
    dequantize_row(kv.type, kv_row_bytes(base, kv, a.layer, slot) + j / be * bb, block, be);
    return block[j % be];
  };
  for (int64_t i = 0; i < a.rows; ++i) {
    const int len = a.row_len[i];
    if (len <= 0) continue;
    const int32_t* table = a.block_tables + a.row_table[i];
    for (int h = 0; h < a.n_head; ++h) {
      const int64_t kvh = h / group;
      // Every position gets a score; those before the window weigh nothing.
      std::vector<double> s(static_cast<size_t>(len), -INFINITY);
      double mx = -INFINITY;
      for (int p = 0; p < len; ++p) {
        if (a.window > 0 && p < len - a.window) continue;
        const int64_t slot = int64_t{table[p / bt]} * bt + p % bt;
        double d = 0;
        for (int64_t j = 0; j < hd; ++j) d += double{q[i * qd + h * hd + j]} * elem(kv.k, slot, kvh * hd + j);
        s[static_cast<size_t>(p)] = d * a.scale;
        mx = std::max(mx, s[static_cast<size_t>(p)]);
      }
      if (a.sinks) mx = std::max<double>(mx, a.sinks[h]);
      double sum = a.sinks ? std::exp(a.sinks[h] - mx) : 0.0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int64_t j = 0; j < hd; ++j) {
        double acc = 0;
        for (int p = 0; p < len; ++p) {
          if (s[static_cast<size_t>(p)] == 0) continue;
          const int64_t slot = int64_t{table[p / bt]} * bt + p % bt;
          acc += s[static_cast<size_t>(p)] * elem(kv.v, slot, kvh * hd + j);
        }
        out[i * qd + h * hd + j] = static_cast<float>(acc / sum);
      }
    }
  }
}

}  // namespace atelier::kernels
