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
// shapes every time. Backend::run_step is checked as a CUDA graph would
// replay it: the first run of a key records every op with every argument
// (pointers, shapes, scalars, the host arrays of views), each later run of
// the key must issue exactly that sequence, and nothing inside a step may
// allocate, upload, download or synchronise; any difference is a violation.
#pragma once

#include <atelier/backend.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <ios>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <cstring>
#include <utility>
#include <vector>

namespace atelier::test {

// The activation type and image layout the fake device states. F32/NCHW
// (the default) runs every op on the CPU backend as it is; any other is
// emulated: each op's operands are converted to F32 NCHW, the CPU op runs,
// and its outputs are converted back (rounded to F16/BF16 after every op, as
// a device computing in that type stores them). NHWC with F32 is bit for bit
// the CPU's, so a model's layout handling is checked exactly.
struct FakeFormat {
  kernels::DType act = kernels::DType::F32;
  kernels::Layout layout = kernels::Layout::NCHW;
};

class FakeDevice final : public kernels::Backend {
 public:
  explicit FakeDevice(kernels::Executor* ex = nullptr, FakeFormat fmt = {})
      : cpu_(kernels::make_cpu_backend(ex)), fmt_(fmt) {}

  // Shared with the kernels::Device a test wraps around its backends
  // (fake_gpu.h): the bytes their buffers hold (what the device's free
  // memory loses), and an error every matrix product throws once set (a
  // device lost: the CUDA module's sticky error).
  struct Shared {
    std::atomic<int64_t> bytes{0};
    std::mutex mu;
    std::string fail;
    std::set<const FakeDevice*> live;  // the backends sharing it that still exist (under mu)
  };
  void share(std::shared_ptr<Shared> s) {
    shared_ = std::move(s);
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->live.insert(this);
  }
  ~FakeDevice() override {
    if (!shared_) return;
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->live.erase(this);
  }
  // Whether this backend is still alive (a device's record of the backends it made outlives them).
  static bool alive(const Shared& s, const FakeDevice* b) { return s.live.count(b) != 0; }

  // ---- what the tests read
  std::vector<std::string> violations() const {
    std::lock_guard<std::mutex> lock(mu_);
    return violations_;
  }
  int64_t allocations() const { return allocations_; }
  int64_t uploads() const { return uploads_; }
  int64_t downloads() const { return downloads_; }
  int64_t downloaded_bytes() const { return downloaded_bytes_; }
  int64_t sample_calls() const { return sample_calls_; }
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
  // Captured steps (run_step): the keys recorded and not dropped, how many
  // runs recorded a key and how many replayed one, and drop_graphs calls.
  size_t graph_keys() const { return graphs_.size(); }
  int64_t steps_recorded() const { return recorded_; }
  int64_t steps_replayed() const { return replayed_; }
  int64_t graph_drops() const { return drops_; }

  void run_step(uint64_t key, const std::function<void()>& ops) override {
    if (stepping() == this) {
      violation("run_step inside a step");
      ops();
      return;
    }
    stepping() = this;
    trace_.clear();
    try {
      ops();
    } catch (...) {
      stepping() = nullptr;
      throw;
    }
    stepping() = nullptr;
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      ++recorded_;
      graphs_.emplace(key, std::move(trace_));
      return;
    }
    ++replayed_;
    const std::vector<std::string>& want = it->second;
    const std::string k = "run_step key " + std::to_string(key) + ": ";
    if (want.size() != trace_.size())
      violation(k + std::to_string(trace_.size()) + " ops where the recording has " + std::to_string(want.size()));
    for (size_t i = 0; i < std::min(want.size(), trace_.size()); ++i)
      if (want[i] != trace_[i]) {
        violation(k + "op " + std::to_string(i) + " is " + trace_[i] + " where the recording has " + want[i]);
        break;  // the first difference says it
      }
  }
  void drop_graphs() override {
    ++drops_;
    graphs_.clear();
  }

  // The compute capability device() states (fake_gpu.h sets its own).
  void set_compute_capability(int cc) { cc_ = cc; }
  // The precision set_weight_precision last set (bf16 before any call), and
  // the one in force at each prepare_weights / prepare_weights_at since.
  kernels::WeightPrecision weight_precision() const { return precision_; }
  std::vector<kernels::WeightPrecision> prepared_precisions() const {
    std::lock_guard<std::mutex> lock(mu_);
    return prepared_;
  }

  // ---- Backend
  kernels::DeviceInfo device() const override {
    kernels::DeviceInfo d;
    d.name = "fake";
    d.description = "host memory posing as a device (tests)";
    d.host_memory = false;
    d.compute_capability = cc_;
    d.act_dtype = fmt_.act;
    d.layout = fmt_.layout;
    return d;
  }
  kernels::DType act_dtype() const override { return fmt_.act; }
  kernels::Layout layout() const override { return fmt_.layout; }

  std::unique_ptr<kernels::Buffer> alloc(int64_t bytes) override {
    ++allocations_;
    outside_step("alloc");
    return std::make_unique<FakeBuffer>(*this, cpu_->alloc(bytes));
  }
  void upload(kernels::Buffer& dst, int64_t offset, const void* src, int64_t bytes) override {
    ++uploads_;
    outside_step("upload");
    own(dst, "upload dst");
    host(src, "upload src");
    cpu_->upload(inner(dst), offset, src, bytes);
  }
  void download(kernels::Buffer& src, int64_t offset, void* dst, int64_t bytes) override {
    ++downloads_;
    downloaded_bytes_ += bytes;
    ++syncs_;  // a download waits for the stream
    outside_step("download");
    own(src, "download src");
    host(dst, "download dst");
    cpu_->download(inner(src), offset, dst, bytes);
  }
  void synchronize() override {
    ++syncs_;
    outside_step("synchronize");
    cpu_->synchronize();
  }
  void clear(kernels::Buffer& b, uint8_t value) override {
    outside_step("clear");
    own(b, "clear");
    cpu_->clear(inner(b), value);
  }
  bool commit(kernels::Buffer& b, int64_t offset, int64_t bytes) override {
    own(b, "commit");  // another thread's, while ops run: allowed (a CUDA buffer is committed at alloc)
    return cpu_->commit(inner(b), offset, bytes);
  }

  // Weights are copied into this device's memory whatever the CPU would do
  // with them (it may hand back the host rows themselves).
  kernels::WeightView prepare_weights(const kernels::WeightView& w, std::unique_ptr<kernels::Buffer>& storage) override {
    storage = alloc(cpu_->prepared_weight_bytes(w));
    return prepare_weights_at(w, *storage, 0);
  }
  int64_t prepared_weight_bytes(const kernels::WeightView& w) override { return cpu_->prepared_weight_bytes(w); }
  // The CPU's products stand in whatever the precision (the fake records it;
  // the CUDA module's conversions are checked on a GPU: CudaShapes).
  void set_weight_precision(kernels::WeightPrecision p) override { precision_ = p; }
  kernels::WeightView prepare_weights_at(const kernels::WeightView& w, kernels::Buffer& dst, int64_t offset) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      prepared_.push_back(precision_);
    }
    own(dst, "prepare_weights_at dst");
    kernels::WeightView v = cpu_->prepare_weights_at(w, inner(dst), offset);
    if (v.data == w.data) {  // the CPU kept the source rows: a device copies them
      ADD_FAILURE() << "prepare_weights_at returned its source";
    }
    return v;
  }

  void matmul(const kernels::WeightView& w, kernels::Act x, kernels::Act y, int64_t rows) override {
    check_lost();
    rec("matmul", w, x, y, rows);
    dev(w.data, "matmul w"), act(x, "matmul x"), any(y, "matmul y");
    row_counts_.push_back(rows);
    Emu e(*this);
    cpu_->matmul(w, e.in(x, rows * w.cols), e.out(y, rows * w.rows), rows);
  }
  void matmul_many(const kernels::WeightView* const* w, const kernels::Act* y, int count, kernels::Act x,
                   int64_t rows) override {
    check_lost();
    rec("matmul_many", count, x, rows);
    for (int i = 0; i < count; ++i) rec("matmul_many.i", *w[i], y[i]);
    act(x, "matmul_many x");
    for (int i = 0; i < count; ++i) dev(w[i]->data, "matmul_many w"), act(y[i], "matmul_many y");
    row_counts_.push_back(rows);
    Emu e(*this);
    std::vector<kernels::Act> ys;
    for (int i = 0; i < count; ++i) ys.push_back(e.out(y[i], rows * w[i]->rows));
    cpu_->matmul_many(w, ys.data(), count, e.in(x, rows * w[0]->cols), rows);
  }
  void get_rows(const kernels::WeightView& table, const int32_t* ids, kernels::Act y, int64_t rows) override {
    rec("get_rows", table, ids, y, rows);
    dev(table.data, "get_rows table"), meta(ids, "get_rows ids"), act(y, "get_rows y");
    row_counts_.push_back(rows);
    Emu e(*this);
    cpu_->get_rows(table, ids, e.out(y, rows * table.cols), rows);
  }
  void copy_rows(kernels::Act x, const int32_t* ids, kernels::Act y, int64_t rows, int64_t dim) override {
    rec("copy_rows", x, ids, y, rows, dim);
    act(x, "copy_rows x"), meta(ids, "copy_rows ids"), act(y, "copy_rows y");
    row_counts_.push_back(rows);
    int64_t x_rows = 0;
    for (int64_t r = 0; r < rows; ++r) x_rows = std::max<int64_t>(x_rows, int64_t{ids[r]} + 1);
    Emu e(*this);
    cpu_->copy_rows(e.in(x, x_rows * dim), ids, e.out(y, rows * dim), rows, dim);
  }
  void rms_norm(kernels::Act x, const float* weight, kernels::Act y, int64_t rows, int64_t dim, float eps) override {
    rec("rms_norm", x, weight, y, rows, dim, eps);
    act(x, "rms_norm x"), dev(weight, "rms_norm weight"), act(y, "rms_norm y");
    row_counts_.push_back(rows);
    Emu e(*this);
    cpu_->rms_norm(e.in(x, rows * dim), weight, e.out(y, rows * dim), rows, dim, eps);
  }
  void add_rms_norm(kernels::Act x, kernels::Act delta, const float* weight, kernels::Act y, int64_t rows, int64_t dim,
                    float eps) override {
    rec("add_rms_norm", x, delta, weight, y, rows, dim, eps);
    act(x, "add_rms_norm x"), act(delta, "add_rms_norm delta"), opt(weight, "add_rms_norm weight");
    act(y, "add_rms_norm y");
    row_counts_.push_back(rows);
    Emu e(*this);
    cpu_->add_rms_norm(e.out(x, rows * dim), e.in(delta, rows * dim), weight, e.out(y, rows * dim), rows, dim, eps);
  }
  void layer_norm(kernels::Act x, kernels::Act y, int64_t rows, int64_t dim, const float* gamma, const float* beta,
                  float eps) override {
    rec("layer_norm", x, y, rows, dim, gamma, beta, eps);
    act(x, "layer_norm x"), act(y, "layer_norm y"), opt(gamma, "layer_norm gamma"), opt(beta, "layer_norm beta");
    Emu e(*this);
    cpu_->layer_norm(e.in(x, rows * dim), e.out(y, rows * dim), rows, dim, gamma, beta, eps);
  }
  void group_norm(kernels::Act x, kernels::Act y, int64_t n, int64_t c, int64_t hw, int64_t groups, const float* gamma,
                  const float* beta, float eps, bool silu) override {
    rec("group_norm", x, y, n, c, hw, groups, gamma, beta, eps, silu);
    act(x, "group_norm x"), act(y, "group_norm y"), opt(gamma, "group_norm gamma"), opt(beta, "group_norm beta");
    Emu e(*this);
    cpu_->group_norm(e.img_in(x, n, c, hw), e.img_out(y, n, c, hw), n, c, hw, groups, gamma, beta, eps, silu);
  }
  void rope(kernels::Act x, int64_t rows, const int32_t* positions, const kernels::RopeParams& p) override {
    rec("rope", x, rows, positions, p);
    act(x, "rope x"), meta(positions, "rope positions"), opt(p.freq_factors, "rope freq_factors");
    row_counts_.push_back(rows);
    Emu e(*this);
    cpu_->rope(e.out(x, rows * p.n_heads * p.head_dim), rows, positions, p);
  }
  void add(kernels::Act a, kernels::Act b, kernels::Act y, int64_t n) override {
    rec("add", a, b, y, n);
    act(a, "add a"), act(b, "add b"), act(y, "add y");
    Emu e(*this);
    cpu_->add(e.in(a, n), e.in(b, n), e.out(y, n), n);
  }
  void add_bias(kernels::Act x, const float* bias, int64_t rows, int64_t dim) override {
    rec("add_bias", x, bias, rows, dim);
    any(x, "add_bias x"), dev(bias, "add_bias bias");  // F32 router logits too
    row_counts_.push_back(rows);
    Emu e(*this);
    cpu_->add_bias(e.out(x, rows * dim), bias, rows, dim);
  }
  void activation(kernels::Activation a, kernels::Act x, kernels::Act y, int64_t n) override {
    rec("activation", a, x, y, n);
    act(x, "activation x"), act(y, "activation y");
    Emu e(*this);
    cpu_->activation(a, e.in(x, n), e.out(y, n), n);
  }
  void swiglu(kernels::Act gate, kernels::Act up, kernels::Act out, int64_t rows, int64_t dim) override {
    rec("swiglu", gate, up, out, rows, dim);
    act(gate, "swiglu gate"), act(up, "swiglu up"), act(out, "swiglu out");
    row_counts_.push_back(rows);
    Emu e(*this);
    cpu_->swiglu(e.in(gate, rows * dim), e.in(up, rows * dim), e.out(out, rows * dim), rows, dim);
  }
  void glu(kernels::Activation a, kernels::Act gate, kernels::Act up, kernels::Act out, int64_t rows,
           int64_t dim) override {
    rec("glu", a, gate, up, out, rows, dim);
    act(gate, "glu gate"), act(up, "glu up"), act(out, "glu out");
    row_counts_.push_back(rows);
    Emu e(*this);
    cpu_->glu(a, e.in(gate, rows * dim), e.in(up, rows * dim), e.out(out, rows * dim), rows, dim);
  }
  void geglu(kernels::Act x, kernels::Act y, int64_t rows, int64_t dim) override {
    rec("geglu", x, y, rows, dim);
    act(x, "geglu x"), act(y, "geglu y");
    Emu e(*this);
    cpu_->geglu(e.in(x, rows * 2 * dim), e.out(y, rows * dim), rows, dim);
  }
  void softmax(kernels::Act x, int64_t rows, int64_t n) override {
    rec("softmax", x, rows, n);
    act(x, "softmax x");
    Emu e(*this);
    cpu_->softmax(e.out(x, rows * n), rows, n);
  }
  // The CPU backend's sample, which is kernels::sample_ref (the reference's arithmetic).
  void sample(kernels::Act logits, int64_t rows, int n_vocab, const kernels::SampleRow* params,
              const int32_t* penalty_tokens, int32_t* out_ids) override {
    rec("sample", logits, rows, n_vocab, static_cast<const void*>(params), static_cast<const void*>(penalty_tokens),
        static_cast<const void*>(out_ids));
    dev(logits.data(), "sample logits"), dev(params, "sample params"), meta(penalty_tokens, "sample penalty_tokens"),
        meta(out_ids, "sample out_ids");
    if (logits.type() != kernels::DType::F32) violation("sample: logits that are not F32");
    row_counts_.push_back(rows);
    ++sample_calls_;
    cpu_->sample(logits, rows, n_vocab, params, penalty_tokens, out_ids);
  }
  void moe_route(kernels::Act logits, int64_t rows, const kernels::MoeRouting& r, int32_t* ids,
                 float* weights) override {
    rec("moe_route", logits, rows, r, ids, weights);
    any(logits, "moe_route logits"), meta(ids, "moe_route ids"), dev(weights, "moe_route weights");
    row_counts_.push_back(rows);
    Emu e(*this);
    cpu_->moe_route(e.in(logits, rows * r.n_expert), rows, r, ids, weights);
  }
  void matmul_id(const kernels::WeightView* const* experts, const kernels::Act* y, const float* const* bias, int count,
                 int n_expert, kernels::Act x, int x_per_row, const int32_t* ids, int64_t rows, int k) override {
    rec("matmul_id", count, n_expert, x, x_per_row, ids, rows, k);
    for (int i = 0; i < count; ++i) {
      rec("matmul_id.y", y[i], bias ? bias[i] : nullptr);
      for (int ex = 0; ex < n_expert; ++ex) rec("matmul_id.expert", experts[i][ex]);
    }
    act(x, "matmul_id x"), meta(ids, "matmul_id ids");
    for (int i = 0; i < count; ++i) {
      act(y[i], "matmul_id y");
      if (bias) opt(bias[i], "matmul_id bias");
      for (int ex = 0; ex < n_expert; ++ex) dev(experts[i][ex].data, "matmul_id expert");
    }
    row_counts_.push_back(rows);
    Emu e(*this);
    std::vector<kernels::Act> ys;
    for (int i = 0; i < count; ++i) ys.push_back(e.out(y[i], rows * k * experts[i][0].rows));
    cpu_->matmul_id(experts, ys.data(), bias, count, n_expert, e.in(x, rows * x_per_row * experts[0][0].cols),
                    x_per_row, ids, rows, k);
  }
  void moe_combine(kernels::Act y, const float* weights, kernels::Act out, int64_t rows, int k, int64_t dim) override {
    rec("moe_combine", y, weights, out, rows, k, dim);
    act(y, "moe_combine y"), dev(weights, "moe_combine weights"), act(out, "moe_combine out");
    row_counts_.push_back(rows);
    Emu e(*this);
    cpu_->moe_combine(e.in(y, rows * k * dim), weights, e.out(out, rows * dim), rows, k, dim);
  }
  void swiglu_oai(kernels::Act gate, kernels::Act up, kernels::Act out, int64_t rows, int64_t dim, float alpha,
                  float limit) override {
    rec("swiglu_oai", gate, up, out, rows, dim, alpha, limit);
    act(gate, "swiglu_oai gate"), act(up, "swiglu_oai up"), act(out, "swiglu_oai out");
    row_counts_.push_back(rows);
    Emu e(*this);
    cpu_->swiglu_oai(e.in(gate, rows * dim), e.in(up, rows * dim), e.out(out, rows * dim), rows, dim, alpha, limit);
  }
  void affine(kernels::Act x, kernels::Act y, int64_t n, const kernels::Affine& a) override {
    rec("affine", x, y, n, a);
    act(x, "affine x"), act(y, "affine y");
    Emu e(*this);
    cpu_->affine(e.in(x, n), e.out(y, n), n, a);
  }
  void relu(kernels::Act x, kernels::Act y, int64_t n) override {
    rec("relu", x, y, n);
    act(x, "relu x"), act(y, "relu y");
    Emu e(*this);
    cpu_->relu(e.in(x, n), e.out(y, n), n);
  }
  void tanh_clamp(kernels::Act x, kernels::Act y, int64_t n, float limit) override {
    rec("tanh_clamp", x, y, n, limit);
    any(x, "tanh_clamp x"), any(y, "tanh_clamp y");  // F32 logits too (final soft-capping)
    Emu e(*this);
    cpu_->tanh_clamp(e.in(x, n), e.out(y, n), n, limit);
  }
  // copy and relayout convert between types and layouts themselves: the CPU's run on this memory directly.
  void copy(kernels::Act x, kernels::Act y, int64_t n) override {
    rec("copy", x, y, n);
    any(x, "copy x"), any(y, "copy y");
    cpu_->copy(x, y, n);
  }
  void relayout(kernels::Act x, kernels::Layout from, kernels::Act y, kernels::Layout to, int64_t n, int64_t c,
                int64_t hw) override {
    rec("relayout", x, from, y, to, n, c, hw);
    any(x, "relayout x"), any(y, "relayout y");
    cpu_->relayout(x, from, y, to, n, c, hw);
  }
  void add_channel_bias(kernels::Act x, kernels::Act bias, int64_t n, int64_t c, int64_t hw) override {
    rec("add_channel_bias", x, bias, n, c, hw);
    act(x, "add_channel_bias x"), act(bias, "add_channel_bias bias");
    Emu e(*this);
    cpu_->add_channel_bias(e.img_out(x, n, c, hw), e.in(bias, n * c), n, c, hw);
  }
  void concat_channels(kernels::Act a, int64_t ca, kernels::Act b, int64_t cb, kernels::Act y, int64_t n,
                       int64_t hw) override {
    rec("concat_channels", a, ca, b, cb, y, n, hw);
    act(a, "concat_channels a"), act(b, "concat_channels b"), act(y, "concat_channels y");
    Emu e(*this);
    cpu_->concat_channels(e.img_in(a, n, ca, hw), ca, e.img_in(b, n, cb, hw), cb, e.img_out(y, n, ca + cb, hw), n, hw);
  }
  void timestep_embedding(const float* t, int64_t n, int64_t dim, kernels::Act out, bool flip_sin_to_cos,
                          float downscale_freq_shift, float max_period) override {
    rec("timestep_embedding", t, n, dim, out, flip_sin_to_cos, downscale_freq_shift, max_period);
    dev(t, "timestep_embedding t"), act(out, "timestep_embedding out");
    Emu e(*this);
    cpu_->timestep_embedding(t, n, dim, e.out(out, n * dim), flip_sin_to_cos, downscale_freq_shift, max_period);
  }
  void pad2d(kernels::Act x, kernels::Act y, int64_t n, int64_t c, int64_t h, int64_t w,
             const kernels::Pad2d& p) override {
    rec("pad2d", x, y, n, c, h, w, p);
    act(x, "pad2d x"), act(y, "pad2d y");
    Emu e(*this);
    cpu_->pad2d(e.img_in(x, n, c, h * w), e.img_out(y, n, c, (p.top + h + p.bottom) * (p.left + w + p.right)), n, c, h,
                w, p);
  }
  void store_kv(const kernels::KvLayout& kv, int layer, kernels::Act k, kernels::Act v, const int32_t* slots,
                int64_t rows) override {
    rec("store_kv", kv, layer, k, v, slots, rows);
    kv_dev(kv, "store_kv"), act(k, "store_kv k"), act(v, "store_kv v"), meta(slots, "store_kv slots");
    row_counts_.push_back(rows);
    Emu e(*this);
    if (gpu_kv(kv))
      kernels::store_kv_ref(kv, layer, e.in(k, rows * kv.row_elems).f32(), e.in(v, rows * kv.row_elems).f32(), slots,
                            rows);
    else cpu_->store_kv(kv, layer, e.in(k, rows * kv.row_elems), e.in(v, rows * kv.row_elems), slots, rows);
  }
  void rope_store_kv(kernels::Act q, kernels::Act k, kernels::Act v, int64_t rows, const int32_t* positions,
                     const kernels::RopeParams& rq, const kernels::RopeParams& rk, const kernels::KvLayout& kv,
                     int layer, const int32_t* slots) override {
    rec("rope_store_kv", q, k, v, rows, positions, rq, rk, kv, layer, slots);
    act(q, "rope_store_kv q"), act(k, "rope_store_kv k"), act(v, "rope_store_kv v");
    meta(positions, "rope_store_kv positions"), meta(slots, "rope_store_kv slots");
    opt(rq.freq_factors, "rope_store_kv freq_factors"), kv_dev(kv, "rope_store_kv");
    row_counts_.push_back(rows);
    Emu e(*this);
    if (gpu_kv(kv)) {  // rope, then the reference's store (the CPU's store_kv refuses these types)
      const kernels::Act qf = e.out(q, rows * rq.n_heads * rq.head_dim), kf = e.out(k, rows * kv.row_elems);
      cpu_->rope(qf, rows, positions, rq);
      cpu_->rope(kf, rows, positions, rk);
      kernels::store_kv_ref(kv, layer, kf.f32(), e.in(v, rows * kv.row_elems).f32(), slots, rows);
      return;
    }
    cpu_->rope_store_kv(e.out(q, rows * rq.n_heads * rq.head_dim), e.out(k, rows * kv.row_elems),
                        e.in(v, rows * kv.row_elems), rows, positions, rq, rk, kv, layer, slots);
  }
  void paged_attention(const kernels::KvLayout& kv, const kernels::PagedAttention& a, kernels::Act q,
                       kernels::Act out) override {
    rec("paged_attention", kv, a, q, out);
    kv_dev(kv, "paged_attention"), act(q, "paged_attention q"), act(out, "paged_attention out");
    meta(a.row_len, "paged_attention row_len"), meta(a.row_table, "paged_attention row_table");
    meta(a.block_tables, "paged_attention block_tables");
    opt(a.sinks, "paged_attention sinks");
    row_counts_.push_back(a.rows);
    row_counts_.push_back(a.max_len);  // a launch bound: constant while a captured step replays
    const int64_t n = a.rows * a.n_head * a.head_dim;
    Emu e(*this);
    if (gpu_kv(kv)) kernels::paged_attention_ref(kv, a, e.in(q, n).f32(), e.out(out, n).f32());
    else cpu_->paged_attention(kv, a, e.in(q, n), e.out(out, n));
  }
  void attention(const kernels::AttentionShape& s, kernels::Act q, kernels::Act k, kernels::Act v,
                 kernels::Act out) override {
    rec("attention", s, q, k, v, out);
    act(q, "attention q"), act(k, "attention k"), act(v, "attention v"), act(out, "attention out");
    const int64_t w = s.heads * s.head_dim;
    Emu e(*this);
    cpu_->attention(s, e.in(q, s.batch * s.lq * w), e.in(k, s.batch * s.lk * w), e.in(v, s.batch * s.lk * w),
                    e.out(out, s.batch * s.lq * w));
  }
  void causal_attention(const kernels::AttentionShape& s, kernels::Act q, kernels::Act k, kernels::Act v,
                        int64_t stride, kernels::Act out) override {
    rec("causal_attention", s, q, k, v, stride, out);
    act(q, "causal_attention q"), act(k, "causal_attention k"), act(v, "causal_attention v");
    act(out, "causal_attention out");
    const int64_t w = s.heads * s.head_dim, extent = (s.batch * s.lq - 1) * stride + w;
    Emu e(*this);
    cpu_->causal_attention(s, e.in(q, extent), e.in(k, extent), e.in(v, extent), stride,
                           e.out(out, s.batch * s.lq * w));
  }
  void conv2d(const kernels::Conv2dShape& s, kernels::Act x, kernels::DType w_type, const void* weight,
              const float* bias, kernels::Act y) override {
    rec("conv2d", s, x, w_type, weight, bias, y);
    act(x, "conv2d x"), dev(weight, "conv2d weight"), opt(bias, "conv2d bias"), act(y, "conv2d y");
    // This device's weights are in its layout's order (conv_weights_for); the CPU reads OIHW.
    std::vector<uint8_t> oihw;
    if (fmt_.layout == kernels::Layout::NHWC && s.kh * s.kw > 1) {
      const int64_t e = w_type == kernels::DType::F32 ? 4 : 2, k = s.kh * s.kw;
      oihw.resize(static_cast<size_t>(s.c_out * s.c_in * k * e));
      const auto* src = static_cast<const uint8_t*>(weight);
      for (int64_t o = 0; o < s.c_out; ++o)
        for (int64_t i = 0; i < s.c_in; ++i)
          for (int64_t p = 0; p < k; ++p)
            std::memcpy(&oihw[static_cast<size_t>(((o * s.c_in + i) * k + p) * e)], src + ((o * k + p) * s.c_in + i) * e,
                        static_cast<size_t>(e));
      weight = oihw.data();
    }
    Emu e(*this);
    cpu_->conv2d(s, e.img_in(x, s.n, s.c_in, s.h * s.w), w_type, weight, bias,
                 e.img_out(y, s.n, s.c_out, s.out_h() * s.out_w()));
  }
  void upsample_nearest2x(kernels::Act x, kernels::Act y, int64_t n, int64_t c, int64_t h, int64_t w) override {
    rec("upsample_nearest2x", x, y, n, c, h, w);
    act(x, "upsample_nearest2x x"), act(y, "upsample_nearest2x y");
    Emu e(*this);
    cpu_->upsample_nearest2x(e.img_in(x, n, c, h * w), e.img_out(y, n, c, 4 * h * w), n, c, h, w);
  }

 private:
  // A buffer of this device: the CPU backend's buffer, its range registered while it lives.
  // KV types only a GPU keeps (BF16, MXFP8: --kv-type bf16 / fp8): stored
  // and read by the references (store_kv_ref, paged_attention_ref: the
  // types' definitions, sums in double), as the CUDA module's kv_store_row
  // and kv_ld encode and decode them.
  static bool gpu_kv(const kernels::KvLayout& kv) {
    return kv.type == kernels::DType::BF16 || kv.type == kernels::DType::MXFP8;
  }

  class FakeBuffer final : public kernels::Buffer {
   public:
    FakeBuffer(FakeDevice& d, std::unique_ptr<kernels::Buffer> b) : d_(d), b_(std::move(b)), shared_(d.shared_) {
      std::lock_guard<std::mutex> lock(d_.mu_);
      d_.live_[begin()] = begin() + static_cast<uintptr_t>(b_->bytes());
      if (shared_) shared_->bytes += b_->bytes();
    }
    ~FakeBuffer() override {
      if (shared_) shared_->bytes -= b_->bytes();
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
    std::shared_ptr<Shared> shared_;
  };
  void check_lost() {
    if (!shared_) return;
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (!shared_->fail.empty()) throw std::runtime_error(shared_->fail);
  }

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
  // An activation of this device's type (matmul's output may be F32 logits).
  void act(kernels::Act a, const char* what) {
    dev(a.data(), what);
    if (a.type() != fmt_.act)
      violation(std::string(what) + ": " + std::string(kernels::dtype_name(a.type())) + " activations where " +
                std::string(kernels::dtype_name(fmt_.act)) + " belong");
  }
  void any(kernels::Act a, const char* what) {
    dev(a.data(), what);
    if (a.type() != fmt_.act && a.type() != kernels::DType::F32)
      violation(std::string(what) + ": activations of type " + std::string(kernels::dtype_name(a.type())));
  }
  // One op's operands as the CPU backend sees them: F32 NCHW host copies
  // when this device's format is another (written back when the op ends),
  // the device memory itself otherwise.
  class Emu {
   public:
    explicit Emu(FakeDevice& d) : d_(d), pass_(d.fmt_.act == kernels::DType::F32 && d.fmt_.layout == kernels::Layout::NCHW) {}
    ~Emu() {
      for (auto it = ops_.rbegin(); it != ops_.rend(); ++it) {
        if (!it->out) continue;
        const kernels::Act f(it->v.data(), kernels::DType::F32);
        if (it->c > 0) d_.cpu_->relayout(f, kernels::Layout::NCHW, it->dev, d_.fmt_.layout, it->n, it->c, it->hw);
        else d_.cpu_->copy(f, it->dev, it->n);
      }
    }
    Emu(const Emu&) = delete;
    Emu& operator=(const Emu&) = delete;
    kernels::Act in(kernels::Act a, int64_t n) { return take(a, n, 0, 0, false); }
    kernels::Act out(kernels::Act a, int64_t n) { return take(a, n, 0, 0, true); }
    kernels::Act img_in(kernels::Act a, int64_t n, int64_t c, int64_t hw) { return take(a, n, c, hw, false); }
    kernels::Act img_out(kernels::Act a, int64_t n, int64_t c, int64_t hw) { return take(a, n, c, hw, true); }

   private:
    struct Operand {
      kernels::Act dev;
      int64_t n, c, hw;
      bool out;
      std::vector<float> v;
    };
    // c > 0: an image of n x c x hw in the device's layout; else n elements.
    kernels::Act take(kernels::Act a, int64_t n, int64_t c, int64_t hw, bool out) {
      if (pass_ || !a) return a;
      const bool image = c > 0 && d_.fmt_.layout != kernels::Layout::NCHW;
      const bool convert = a.type() != kernels::DType::F32;
      if (!image && !convert) return a;
      Operand o{a, n, image ? c : 0, hw, out, std::vector<float>(static_cast<size_t>(c > 0 ? n * c * hw : n))};
      const kernels::Act f(o.v.data(), kernels::DType::F32);
      if (image) d_.cpu_->relayout(a, d_.fmt_.layout, f, kernels::Layout::NCHW, n, c, hw);
      else d_.cpu_->copy(a, f, static_cast<int64_t>(o.v.size()));
      if (!image) o.n = static_cast<int64_t>(o.v.size());
      ops_.push_back(std::move(o));
      return f;
    }
    FakeDevice& d_;
    bool pass_;
    std::vector<Operand> ops_;
  };

  void opt(const void* p, const char* what) {
    if (p) dev(p, what);
  }

  // ---- the step recorder (run_step)
  // The device this thread is running a step of (only that thread's calls are the step's).
  static const FakeDevice*& stepping() {
    thread_local const FakeDevice* d = nullptr;
    return d;
  }
  void outside_step(const char* what) {
    if (stepping() == this) violation(std::string(what) + " inside a captured step (run_step)");
  }
  // Each argument as a graph would keep it: pointers, numbers (floats in
  // hex, exact), and the values behind host pointers (read at capture).
  static void put(std::ostream& o, const void* p) { o << p; }
  static void put(std::ostream& o, kernels::Act a) { o << a.data() << ':' << int(a.type()); }
  static void put(std::ostream& o, float v) { o << std::hexfloat << v << std::defaultfloat; }
  static void put(std::ostream& o, bool v) { o << v; }
  static void put(std::ostream& o, int v) { o << v; }
  static void put(std::ostream& o, int64_t v) { o << v; }
  static void put(std::ostream& o, uint8_t v) { o << int(v); }
  static void put(std::ostream& o, kernels::DType v) { o << int(v); }
  static void put(std::ostream& o, kernels::Layout v) { o << int(v); }
  static void put(std::ostream& o, kernels::Activation v) { o << int(v); }
  static void put(std::ostream& o, const kernels::WeightView& w) {
    o << "W{" << int(w.type) << ',' << w.data << ',' << w.rows << ',' << w.cols << ',' << w.row_stride_bytes << ','
      << int(w.layout) << '}';
  }
  static void put(std::ostream& o, const kernels::KvLayout& kv) {
    o << "KV{" << int(kv.type) << ',' << kv.k << ',' << kv.v << ',' << kv.row_elems << ',' << kv.block_tokens << ','
      << kv.block_stride_elems << ',' << kv.layer_stride_elems << '}';
  }
  static void put(std::ostream& o, const kernels::RopeParams& p) {
    o << "Rope{" << p.n_heads << ',' << p.head_dim << ',' << p.rot_dim << ',';
    put(o, p.freq_base), o << ',', put(o, p.freq_scale);
    o << ',' << p.neox << ',' << p.freq_factors;
    if (p.yarn) {
      o << ",yarn ", put(o, p.yarn->ext_factor), o << ' ', put(o, p.yarn->attn_factor), o << ' ';
      put(o, p.yarn->beta_fast), o << ' ', put(o, p.yarn->beta_slow), o << ' ' << p.yarn->n_ctx_orig;
    }
    o << '}';
  }
  static void put(std::ostream& o, const kernels::PagedAttention& a) {
    o << "Att{" << a.rows << ',' << a.n_head << ',' << a.n_head_kv << ',' << a.head_dim << ',';
    put(o, a.scale);
    o << ',' << a.layer << ',' << a.max_len << ',' << a.window << ',' << a.sinks << ',' << a.row_len << ','
      << a.row_table << ',' << a.block_tables << '}';
  }
  static void put(std::ostream& o, const kernels::Affine& a) {
    o << "Affine{", put(o, a.add), o << ',', put(o, a.mul), o << ',', put(o, a.div), o << ',', put(o, a.lo);
    o << ',', put(o, a.hi), o << '}';
  }
  static void put(std::ostream& o, const kernels::MoeRouting& r) {
    o << "Route{" << r.n_expert << ',' << r.k << ',' << int(r.gating) << ',' << r.norm << ',';
    put(o, r.scale), o << '}';
  }
  static void put(std::ostream& o, const kernels::AttentionShape& a) {
    o << "AttShape{" << a.batch << ',' << a.heads << ',' << a.lq << ',' << a.lk << ',' << a.head_dim << ',';
    put(o, a.scale), o << '}';
  }
  static void put(std::ostream& o, const kernels::Conv2dShape& c) {
    o << "Conv{" << c.n << ',' << c.c_in << ',' << c.h << ',' << c.w << ',' << c.c_out << ',' << c.kh << ',' << c.kw
      << ',' << c.stride_h << ',' << c.stride_w << ',' << c.pad_h << ',' << c.pad_w << '}';
  }
  static void put(std::ostream& o, const kernels::Pad2d& p) {
    o << "Pad{" << p.top << ',' << p.bottom << ',' << p.left << ',' << p.right << '}';
  }
  // One op of a step: its name and every argument, in order.
  template <class... A>
  void rec(const char* op, const A&... a) {
    if (stepping() != this) return;
    std::ostringstream o;
    o << op << '(';
    ((put(o, a), o << ' '), ...);
    o << ')';
    trace_.push_back(o.str());
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
  FakeFormat fmt_;
  int cc_ = 0;
  std::atomic<kernels::WeightPrecision> precision_{kernels::WeightPrecision::bf16};
  std::vector<kernels::WeightPrecision> prepared_;  // under mu_
  std::shared_ptr<Shared> shared_;
  mutable std::mutex mu_;
  std::map<uintptr_t, uintptr_t> live_;  // buffer begin -> end
  std::vector<std::string> violations_;
  std::vector<const void*> meta_ptrs_;
  std::vector<int64_t> row_counts_;
  int64_t allocations_ = 0, uploads_ = 0, downloads_ = 0, syncs_ = 0, downloaded_bytes_ = 0, sample_calls_ = 0;
  std::map<uint64_t, std::vector<std::string>> graphs_;  // run_step key -> its recorded ops
  std::vector<std::string> trace_;                       // the step running now
  int64_t recorded_ = 0, replayed_ = 0, drops_ = 0;
};

}  // namespace atelier::test
