// A device that is not the host, without a GPU (issue 32): host memory behind
// a Backend whose DeviceInfo says host_memory = false. Every op runs on the
// CPU backend underneath (so results are the CPU's, bit for bit), but first
// each pointer an op is handed is checked to lie in a buffer this device
// allocated: a mapped file's page, a std::vector or a stack array passed to
// an op is what a CUDA kernel would fault on, and is recorded here as a
// violation. It also counts allocations, uploads, downloads and
// synchronisations, and records the int32 metadata pointers and row counts
// the ops are handed, so a test can check that steady steps allocate
// nothing, synchronise once and hand a CUDA graph the same addresses and
// shapes every time.
#pragma once

#include <atelier/backend.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace atelier::test {

class FakeDevice final : public kernels::Backend {
 public:
  explicit FakeDevice(kernels::Executor* ex = nullptr) : cpu_(kernels::make_cpu_backend(ex)) {}

  // ---- what the tests read
  std::vector<std::string> violations() const {
    std::lock_guard<std::mutex> lock(mu_);
    return violations_;
  }
  int64_t allocations() const { return allocations_; }
  int64_t uploads() const { return uploads_; }
  int64_t downloads() const { return downloads_; }
  int64_t synchronizations() const { return syncs_; }
  int64_t live_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t n = 0;
    for (const auto& [b, e] : live_) n += static_cast<int64_t>(e - b);
    return n;
  }
  // The int32 device arrays (positions, slots, lengths, tables, ids) the ops
  // were handed since the last call, in call order.
  std::vector<const void*> take_metadata_pointers() { return std::exchange(meta_ptrs_, {}); }
  // The row counts the row-batched ops were called with since the last call
  // (a captured graph replays one shape).
  std::vector<int64_t> take_row_counts() { return std::exchange(row_counts_, {}); }

  // ---- Backend
  kernels::DeviceInfo device() const override {
    kernels::DeviceInfo d;
    d.name = "fake";
    d.description = "host memory posing as a device (tests)";
    d.host_memory = false;
    return d;
  }

  std::unique_ptr<kernels::Buffer> alloc(int64_t bytes) override {
    ++allocations_;
    return std::make_unique<FakeBuffer>(*this, cpu_->alloc(bytes));
  }
  void upload(kernels::Buffer& dst, int64_t offset, const void* src, int64_t bytes) override {
    ++uploads_;
    own(dst, "upload dst");
    host(src, "upload src");
    cpu_->upload(inner(dst), offset, src, bytes);
  }
  void download(kernels::Buffer& src, int64_t offset, void* dst, int64_t bytes) override {
    ++downloads_;
    ++syncs_;  // a download waits for the stream
    own(src, "download src");
    host(dst, "download dst");
    cpu_->download(inner(src), offset, dst, bytes);
  }
  void synchronize() override {
    ++syncs_;
    cpu_->synchronize();
  }
  void clear(kernels::Buffer& b, uint8_t value) override {
    own(b, "clear");
    cpu_->clear(inner(b), value);
  }
  bool commit(kernels::Buffer& b, int64_t offset, int64_t bytes) override {
    own(b, "commit");
    return cpu_->commit(inner(b), offset, bytes);
  }

  // Weights are copied into this device's memory whatever the CPU would do
  // with them (it may hand back the host rows themselves).
  kernels::WeightView prepare_weights(const kernels::WeightView& w, std::unique_ptr<kernels::Buffer>& storage) override {
    storage = alloc(cpu_->prepared_weight_bytes(w));
    return prepare_weights_at(w, *storage, 0);
  }
  int64_t prepared_weight_bytes(const kernels::WeightView& w) override { return cpu_->prepared_weight_bytes(w); }
  kernels::WeightView prepare_weights_at(const kernels::WeightView& w, kernels::Buffer& dst, int64_t offset) override {
    own(dst, "prepare_weights_at dst");
    kernels::WeightView v = cpu_->prepare_weights_at(w, inner(dst), offset);
    if (v.data == w.data) {  // the CPU kept the source rows: a device copies them
      ADD_FAILURE() << "prepare_weights_at returned its source";
    }
    return v;
  }

  void matmul(const kernels::WeightView& w, const float* x, float* y, int64_t rows) override {
    dev(w.data, "matmul w"), dev(x, "matmul x"), dev(y, "matmul y");
    row_counts_.push_back(rows);
    cpu_->matmul(w, x, y, rows);
  }
  void matmul_many(const kernels::WeightView* const* w, float* const* y, int count, const float* x,
                   int64_t rows) override {
    dev(x, "matmul_many x");
    for (int i = 0; i < count; ++i) dev(w[i]->data, "matmul_many w"), dev(y[i], "matmul_many y");
    row_counts_.push_back(rows);
    cpu_->matmul_many(w, y, count, x, rows);
  }
  void get_rows(const kernels::WeightView& table, const int32_t* ids, float* y, int64_t rows) override {
    dev(table.data, "get_rows table"), meta(ids, "get_rows ids"), dev(y, "get_rows y");
    row_counts_.push_back(rows);
    cpu_->get_rows(table, ids, y, rows);
  }
  void copy_rows(const float* x, const int32_t* ids, float* y, int64_t rows, int64_t dim) override {
    dev(x, "copy_rows x"), meta(ids, "copy_rows ids"), dev(y, "copy_rows y");
    row_counts_.push_back(rows);
    cpu_->copy_rows(x, ids, y, rows, dim);
  }
  void rms_norm(const float* x, const float* weight, float* y, int64_t rows, int64_t dim, float eps) override {
    dev(x, "rms_norm x"), dev(weight, "rms_norm weight"), dev(y, "rms_norm y");
    row_counts_.push_back(rows);
    cpu_->rms_norm(x, weight, y, rows, dim, eps);
  }
  void add_rms_norm(float* x, const float* delta, const float* weight, float* y, int64_t rows, int64_t dim,
                    float eps) override {
    dev(x, "add_rms_norm x"), dev(delta, "add_rms_norm delta"), opt(weight, "add_rms_norm weight");
    dev(y, "add_rms_norm y");
    row_counts_.push_back(rows);
    cpu_->add_rms_norm(x, delta, weight, y, rows, dim, eps);
  }
  void layer_norm(const float* x, float* y, int64_t rows, int64_t dim, const float* gamma, const float* beta,
                  float eps) override {
    dev(x, "layer_norm x"), dev(y, "layer_norm y"), opt(gamma, "layer_norm gamma"), opt(beta, "layer_norm beta");
    cpu_->layer_norm(x, y, rows, dim, gamma, beta, eps);
  }
  void group_norm(const float* x, float* y, int64_t n, int64_t c, int64_t hw, int64_t groups, const float* gamma,
                  const float* beta, float eps, bool silu) override {
    dev(x, "group_norm x"), dev(y, "group_norm y"), opt(gamma, "group_norm gamma"), opt(beta, "group_norm beta");
    cpu_->group_norm(x, y, n, c, hw, groups, gamma, beta, eps, silu);
  }
  void rope(float* x, int64_t rows, const int32_t* positions, const kernels::RopeParams& p) override {
    dev(x, "rope x"), meta(positions, "rope positions"), opt(p.freq_factors, "rope freq_factors");
    row_counts_.push_back(rows);
    cpu_->rope(x, rows, positions, p);
  }
  void add(const float* a, const float* b, float* y, int64_t n) override {
    dev(a, "add a"), dev(b, "add b"), dev(y, "add y");
    cpu_->add(a, b, y, n);
  }
  void add_bias(float* x, const float* bias, int64_t rows, int64_t dim) override {
    dev(x, "add_bias x"), dev(bias, "add_bias bias");
    row_counts_.push_back(rows);
    cpu_->add_bias(x, bias, rows, dim);
  }
  void activation(kernels::Activation a, const float* x, float* y, int64_t n) override {
    dev(x, "activation x"), dev(y, "activation y");
    cpu_->activation(a, x, y, n);
  }
  void swiglu(const float* gate, const float* up, float* out, int64_t rows, int64_t dim) override {
    dev(gate, "swiglu gate"), dev(up, "swiglu up"), dev(out, "swiglu out");
    row_counts_.push_back(rows);
    cpu_->swiglu(gate, up, out, rows, dim);
  }
  void geglu(const float* x, float* y, int64_t rows, int64_t dim) override {
    dev(x, "geglu x"), dev(y, "geglu y");
    cpu_->geglu(x, y, rows, dim);
  }
  void softmax(float* x, int64_t rows, int64_t n) override {
    dev(x, "softmax x");
    cpu_->softmax(x, rows, n);
  }
  void affine(const float* x, float* y, int64_t n, const kernels::Affine& a) override {
    dev(x, "affine x"), dev(y, "affine y");
    cpu_->affine(x, y, n, a);
  }
  void relu(const float* x, float* y, int64_t n) override {
    dev(x, "relu x"), dev(y, "relu y");
    cpu_->relu(x, y, n);
  }
  void tanh_clamp(const float* x, float* y, int64_t n, float limit) override {
    dev(x, "tanh_clamp x"), dev(y, "tanh_clamp y");
    cpu_->tanh_clamp(x, y, n, limit);
  }
  void copy(const float* x, float* y, int64_t n) override {
    dev(x, "copy x"), dev(y, "copy y");
    cpu_->copy(x, y, n);
  }
  void add_plane_bias(float* x, const float* bias, int64_t planes, int64_t hw) override {
    dev(x, "add_plane_bias x"), dev(bias, "add_plane_bias bias");
    cpu_->add_plane_bias(x, bias, planes, hw);
  }
  void concat_planes(const float* a, int64_t planes_a, const float* b, int64_t planes_b, float* y, int64_t n,
                     int64_t hw) override {
    dev(a, "concat_planes a"), dev(b, "concat_planes b"), dev(y, "concat_planes y");
    cpu_->concat_planes(a, planes_a, b, planes_b, y, n, hw);
  }
  void timestep_embedding(const float* t, int64_t n, int64_t dim, float* out, bool flip_sin_to_cos,
                          float downscale_freq_shift, float max_period) override {
    dev(t, "timestep_embedding t"), dev(out, "timestep_embedding out");
    cpu_->timestep_embedding(t, n, dim, out, flip_sin_to_cos, downscale_freq_shift, max_period);
  }
  void transpose(const float* x, float* y, int64_t batch, int64_t rows, int64_t cols) override {
    dev(x, "transpose x"), dev(y, "transpose y");
    cpu_->transpose(x, y, batch, rows, cols);
  }
  void pad2d(const float* x, float* y, int64_t planes, int64_t h, int64_t w, const kernels::Pad2d& p) override {
    dev(x, "pad2d x"), dev(y, "pad2d y");
    cpu_->pad2d(x, y, planes, h, w, p);
  }
  void store_kv(const kernels::KvLayout& kv, int layer, const float* k, const float* v, const int32_t* slots,
                int64_t rows) override {
    kv_dev(kv, "store_kv"), dev(k, "store_kv k"), dev(v, "store_kv v"), meta(slots, "store_kv slots");
    row_counts_.push_back(rows);
    cpu_->store_kv(kv, layer, k, v, slots, rows);
  }
  void rope_store_kv(float* q, float* k, const float* v, int64_t rows, const int32_t* positions,
                     const kernels::RopeParams& rq, const kernels::RopeParams& rk, const kernels::KvLayout& kv,
                     int layer, const int32_t* slots) override {
    dev(q, "rope_store_kv q"), dev(k, "rope_store_kv k"), dev(v, "rope_store_kv v");
    meta(positions, "rope_store_kv positions"), meta(slots, "rope_store_kv slots");
    opt(rq.freq_factors, "rope_store_kv freq_factors"), kv_dev(kv, "rope_store_kv");
    row_counts_.push_back(rows);
    cpu_->rope_store_kv(q, k, v, rows, positions, rq, rk, kv, layer, slots);
  }
  void paged_attention(const kernels::KvLayout& kv, const kernels::PagedAttention& a, const float* q,
                       float* out) override {
    kv_dev(kv, "paged_attention"), dev(q, "paged_attention q"), dev(out, "paged_attention out");
    meta(a.row_len, "paged_attention row_len"), meta(a.row_table, "paged_attention row_table");
    meta(a.block_tables, "paged_attention block_tables");
    row_counts_.push_back(a.rows);
    cpu_->paged_attention(kv, a, q, out);
  }
  void attention(const kernels::AttentionShape& s, const float* q, const float* k, const float* v,
                 float* out) override {
    dev(q, "attention q"), dev(k, "attention k"), dev(v, "attention v"), dev(out, "attention out");
    cpu_->attention(s, q, k, v, out);
  }
  void causal_attention(const kernels::AttentionShape& s, const float* q, const float* k, const float* v,
                        int64_t stride, float* out) override {
    dev(q, "causal_attention q"), dev(k, "causal_attention k"), dev(v, "causal_attention v");
    dev(out, "causal_attention out");
    cpu_->causal_attention(s, q, k, v, stride, out);
  }
  void conv2d(const kernels::Conv2dShape& s, const float* x, kernels::DType w_type, const void* weight,
              const float* bias, float* y) override {
    dev(x, "conv2d x"), dev(weight, "conv2d weight"), opt(bias, "conv2d bias"), dev(y, "conv2d y");
    cpu_->conv2d(s, x, w_type, weight, bias, y);
  }
  void upsample_nearest2x(const float* x, float* y, int64_t planes, int64_t h, int64_t w) override {
    dev(x, "upsample_nearest2x x"), dev(y, "upsample_nearest2x y");
    cpu_->upsample_nearest2x(x, y, planes, h, w);
  }

 private:
  // A buffer of this device: the CPU backend's buffer, its range registered while it lives.
  class FakeBuffer final : public kernels::Buffer {
   public:
    FakeBuffer(FakeDevice& d, std::unique_ptr<kernels::Buffer> b) : d_(d), b_(std::move(b)) {
      std::lock_guard<std::mutex> lock(d_.mu_);
      d_.live_[begin()] = begin() + static_cast<uintptr_t>(b_->bytes());
    }
    ~FakeBuffer() override {
      std::lock_guard<std::mutex> lock(d_.mu_);
      d_.live_.erase(begin());
    }
    void* data() override { return b_->data(); }
    int64_t bytes() const override { return b_->bytes(); }
    kernels::Buffer& inner() { return *b_; }
    const FakeDevice* owner() const { return &d_; }

   private:
    uintptr_t begin() const { return reinterpret_cast<uintptr_t>(b_->data()); }
    FakeDevice& d_;
    std::unique_ptr<kernels::Buffer> b_;
  };

  bool on_device(const void* p) const {
    std::lock_guard<std::mutex> lock(mu_);
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = live_.upper_bound(a);
    if (it == live_.begin()) return false;
    --it;
    return a >= it->first && a < it->second;
  }
  void violation(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (violations_.size() < 64) violations_.push_back(what);
  }
  void dev(const void* p, const char* what) {
    if (!p || !on_device(p)) violation(std::string(what) + ": not device memory of this backend");
  }
  void opt(const void* p, const char* what) {
    if (p) dev(p, what);
  }
  void meta(const void* p, const char* what) {
    dev(p, what);
    meta_ptrs_.push_back(p);
  }
  void host(const void* p, const char* what) {
    if (p && on_device(p)) violation(std::string(what) + ": device memory where host memory belongs");
  }
  void kv_dev(const kernels::KvLayout& kv, const char* what) {
    dev(kv.k, (std::string(what) + " kv.k").c_str());
    dev(kv.v, (std::string(what) + " kv.v").c_str());
  }
  void own(kernels::Buffer& b, const char* what) {
    auto* f = dynamic_cast<FakeBuffer*>(&b);
    if (!f || f->owner() != this) violation(std::string(what) + ": a buffer this device did not allocate");
  }
  kernels::Buffer& inner(kernels::Buffer& b) {
    auto* f = dynamic_cast<FakeBuffer*>(&b);
    return f ? f->inner() : b;
  }

  std::unique_ptr<kernels::Backend> cpu_;
  mutable std::mutex mu_;
  std::map<uintptr_t, uintptr_t> live_;  // buffer begin -> end
  std::vector<std::string> violations_;
  std::vector<const void*> meta_ptrs_;
  std::vector<int64_t> row_counts_;
  int64_t allocations_ = 0, uploads_ = 0, downloads_ = 0, syncs_ = 0;
};

}  // namespace atelier::test
