// The CUDA device: its backends (one stream each), buffers, memory, NVML
// telemetry, device loss, and the module's C entry points (atelier/devices.h).
#include <atelier/devices.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "attention.cuh"
#include "elementwise.cuh"
#include "matmul.cuh"
#include "moe.cuh"
#include "norm_rope.cuh"
#include "policy.h"
#include "sample.cuh"

namespace atelier::kernels::cuda {

namespace {

constexpr int kMaxDevices = 64;
std::atomic<bool> g_lost[kMaxDevices];
std::mutex g_lost_mu;
std::string g_lost_why[kMaxDevices];

void mark_lost(int device, const std::string& why) {
  if (device < 0 || device >= kMaxDevices) return;
  std::lock_guard<std::mutex> lock(g_lost_mu);
  if (!g_lost[device].load()) g_lost_why[device] = why;
  g_lost[device].store(true);
}

}  // namespace

bool is_sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorLaunchTimeout:
    case cudaErrorDevicesUnavailable:
    case cudaErrorDeviceUninitialized:
    case cudaErrorUnknown:
    case cudaErrorContextIsDestroyed:
    case cudaErrorCudartUnloading:
      return true;
    default:
      return false;
  }
}

void cuda_fail(cudaError_t e, const char* stmt, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  std::string what = std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ") from " + stmt + " at " +
                     (base ? base + 1 : file) + ":" + std::to_string(line);
  if (is_sticky(e)) {
    int dev = -1;
    cudaGetDevice(&dev);
    mark_lost(dev, what);
    throw std::runtime_error("CUDA device lost: cuda:" + std::to_string(dev) + ": " + what);
  }
  throw std::runtime_error("CUDA error: " + what);
}

void check_alive(int device) {
  if (device >= 0 && device < kMaxDevices && g_lost[device].load()) {
    std::lock_guard<std::mutex> lock(g_lost_mu);
    throw std::runtime_error("CUDA device lost: cuda:" + std::to_string(device) + ": " + g_lost_why[device]);
  }
}

namespace {

// The calling thread's current device, set only when it changes.
void use_device(int device) {
  thread_local int current = -1;
  if (current != device) {
    CUDA_CHECK(cudaSetDevice(device));
    current = device;
  }
}

class CudaBuffer final : public Buffer {
 public:
  CudaBuffer(int device, int64_t bytes) : device_(device), bytes_(bytes) {
    use_device(device);
    const cudaError_t e = cudaMalloc(&p_, static_cast<size_t>(std::max<int64_t>(bytes, 256)));
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it
      throw std::bad_alloc();
    }
    if (e != cudaSuccess) cuda_fail(e, "cudaMalloc", __FILE__, __LINE__);
  }
  ~CudaBuffer() override {
    if (p_) {
      int cur = -1;
      cudaGetDevice(&cur);
      if (cur != device_) cudaSetDevice(device_);
      cudaFree(p_);  // errors ignored: a lost device frees nothing
    }
  }
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  void* data() override { return p_; }
  int64_t bytes() const override { return bytes_; }

 private:
  int device_;
  int64_t bytes_;
  void* p_ = nullptr;
};

// ---- NVML, opened at run time (the driver's libnvidia-ml.so.1)

struct Nvml {
  using Dev = void*;
  struct Util {
    unsigned gpu, memory;
  };
  struct Mem {
    unsigned long long total, free, used;
  };
  int (*init)() = nullptr;
  int (*by_pci)(const char*, Dev*) = nullptr;
  int (*util)(Dev, Util*) = nullptr;
  int (*temp)(Dev, int, unsigned*) = nullptr;
  int (*mem)(Dev, Mem*) = nullptr;
  bool ok = false;

  static const Nvml& get() {
    static const Nvml n = [] {
      Nvml m;
      void* h = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
      if (!h) return m;
      m.init = reinterpret_cast<int (*)()>(::dlsym(h, "nvmlInit_v2"));
      m.by_pci = reinterpret_cast<int (*)(const char*, Dev*)>(::dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2"));
      m.util = reinterpret_cast<int (*)(Dev, Util*)>(::dlsym(h, "nvmlDeviceGetUtilizationRates"));
      m.temp = reinterpret_cast<int (*)(Dev, int, unsigned*)>(::dlsym(h, "nvmlDeviceGetTemperature"));
      m.mem = reinterpret_cast<int (*)(Dev, Mem*)>(::dlsym(h, "nvmlDeviceGetMemoryInfo"));
      m.ok = m.init && m.by_pci && m.util && m.temp && m.mem && m.init() == 0;
      return m;
    }();
    return n;
  }
};

// ATELIER_CUDA_PROFILE=1: each op's time on the stream, by op, weight type
// and row count, printed to stderr when the backend ends (the device
// check's breakdown of a step: which ops fall short of the bandwidth or
// the tensor cores). Two events around every op; graphs are off meanwhile
// (an op inside a replayed graph has no launch to time).
class OpProfile {
 public:
  ~OpProfile() {
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
    for (const auto& p : pending_) cudaEventDestroy(p.a), cudaEventDestroy(p.b);
  }
  // Starts timing op `key` on stream s; bytes / flops: what it must read / compute (0: unknown).
  void begin(cudaStream_t s, std::string key, double bytes, double flops) {
    if (pending_.size() >= 4096) resolve(s);  // a long run without a synchronize
    Pending p{event(), event(), std::move(key), bytes, flops};
    CUDA_CHECK(cudaEventRecord(p.a, s));
    open_ = std::move(p);
  }
  // Ends the open op (from a destructor: never throws; an error here is the
  // op's own, which its next CUDA_CHECK reports).
  void end(cudaStream_t s) noexcept {
    if (cudaEventRecord(open_.b, s) != cudaSuccess) return;
    pending_.push_back(std::move(open_));
    open_ = Pending{};
  }
  // The finished ops' times into the table (waits for the stream).
  void resolve(cudaStream_t s) {
    if (pending_.empty()) return;
    CUDA_CHECK(cudaStreamSynchronize(s));
    for (auto& p : pending_) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, p.a, p.b));
      Stat& st = stats_[p.key];
      st.calls++, st.ms += ms, st.bytes += p.bytes, st.flops += p.flops;
      free_.push_back(p.a), free_.push_back(p.b);
    }
    pending_.clear();
  }
  void print(int device) const {
    if (stats_.empty()) return;
    double total = 0;
    for (const auto& [k, st] : stats_) total += st.ms;
    std::vector<std::pair<std::string, Stat>> rows(stats_.begin(), stats_.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    std::fprintf(stderr, "cuda profile cuda:%d: %.3f ms on the stream in all\n", device, total);
    std::fprintf(stderr, "cuda profile %-44s %8s %10s %9s %6s %9s %9s\n", "op", "calls", "total ms", "mean us", "share",
                 "GB/s", "TFLOP/s");
    for (const auto& [k, st] : rows) {
      const double s = st.ms / 1e3;
      std::fprintf(stderr, "cuda profile %-44s %8lld %10.3f %9.2f %5.1f%% %9.1f %9.1f\n", k.c_str(),
                   static_cast<long long>(st.calls), st.ms, 1e3 * st.ms / static_cast<double>(st.calls),
                   100 * st.ms / total, s > 0 ? st.bytes / s / 1e9 : 0.0, s > 0 ? st.flops / s / 1e12 : 0.0);
    }
  }

 private:
  struct Pending {
    cudaEvent_t a = nullptr, b = nullptr;
    std::string key;
    double bytes = 0, flops = 0;
  };
  struct Stat {
    int64_t calls = 0;
    double ms = 0, bytes = 0, flops = 0;
  };
  cudaEvent_t event() {
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreate(&e));
    return e;
  }
  std::vector<cudaEvent_t> free_;
  std::vector<Pending> pending_;
  Pending open_;
  std::map<std::string, Stat> stats_;
};

// A row count as the profile's bucket: what separates decode, small batches and prefill.
std::string rows_bucket(int64_t rows) {
  if (rows <= 1) return "1";
  if (rows <= 8) return "2-8";
  if (rows <= 32) return "9-32";
  if (rows <= 256) return "33-256";
  return ">256";
}

class CudaDevice;

class CudaBackend final : public Backend {
 public:
  CudaBackend(const CudaDevice& dev, int priority);
  ~CudaBackend() override {
    if (profile_) {
      try {
        profile_->resolve(stream_);
        profile_->print(device_);
      } catch (const std::exception&) {  // a lost device: no times
      }
    }
    for (auto& [key, g] : graphs_)
      if (g.exec) cudaGraphExecDestroy(g.exec);  // errors ignored: the device may be lost
    if (staged_) cudaEventDestroy(staged_);
    if (pinned_) cudaFreeHost(pinned_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  DeviceInfo device() const override;
  DType act_dtype() const override { return DType::BF16; }
  Layout layout() const override { return Layout::NHWC; }

  std::unique_ptr<Buffer> alloc(int64_t bytes) override {
    enter();
    return std::make_unique<CudaBuffer>(device_, bytes);
  }
  void upload(Buffer& dst, int64_t offset, const void* src, int64_t bytes) override {
    enter();
    if (bytes <= 0) return;
    check_range(dst, offset, bytes, "upload");
    if (bytes <= kPinnedBytes) {
      // Through pinned memory: the copy is queued on the stream without a
      // host synchronisation (the staging is reused once its last copy ran).
      CUDA_CHECK(cudaEventSynchronize(staged_));
      std::memcpy(pinned_, src, static_cast<size_t>(bytes));
      CUDA_CHECK(cudaMemcpyAsync(dst.at<uint8_t>(offset), pinned_, static_cast<size_t>(bytes), cudaMemcpyHostToDevice,
                                 stream_));
      CUDA_CHECK(cudaEventRecord(staged_, stream_));
      return;
    }
    CUDA_CHECK(cudaMemcpyAsync(dst.at<uint8_t>(offset), src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice,
                               stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void download(Buffer& src, int64_t offset, void* dst, int64_t bytes) override {
    enter();
    if (bytes <= 0) return;
    check_range(src, offset, bytes, "download");
    CUDA_CHECK(cudaMemcpyAsync(dst, src.at<uint8_t>(offset), static_cast<size_t>(bytes), cudaMemcpyDeviceToHost,
                               stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (profile_) profile_->resolve(stream_);
  }
  void synchronize() override {
    enter();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (profile_) profile_->resolve(stream_);
  }
  void clear(Buffer& b, uint8_t value) override {
    enter();
    CUDA_CHECK(cudaMemsetAsync(b.data(), value, static_cast<size_t>(b.bytes()), stream_));
  }
  // cudaMalloc commits at allocation: nothing to do.

  // A step as a CUDA graph (backend.h): the first run of a key issues the
  // ops (a warm-up: kernels load, cuBLASLt picks its algorithms, the scratch
  // grows to the step's size), the second captures them on this stream
  // (thread-local mode: an allocation or synchronisation inside fails the
  // capture instead of happening), instantiates and launches the graph, and
  // every later run launches it: one launch for the whole step.
  void run_step(uint64_t key, const std::function<void()>& ops) override;
  void drop_graphs() override {
    for (auto& [k, g] : graphs_)
      if (g.exec) cudaGraphExecDestroy(g.exec);
    graphs_.clear();
  }

  // The precision policy's choice for float matrices (text/precision.h):
  // BF16 unless told otherwise; FP8 only where the device has it.
  void set_weight_precision(WeightPrecision p) override {
    if (p == WeightPrecision::fp8_e4m3 && cc_ < 89)
      throw std::invalid_argument("FP8 weights need a GPU of compute capability 8.9 or newer (Ada, Hopper); this one is " +
                                  std::to_string(cc_ / 10) + "." + std::to_string(cc_ % 10) +
                                  ": use --precision bf16 or fp16");
    precision_ = p;
  }
  WeightView prepare_weights(const WeightView& w, std::unique_ptr<Buffer>& storage) override {
    storage = alloc(prepared_bytes(w, precision_));
    return prepare_weights_at(w, *storage, 0);
  }
  int64_t prepared_weight_bytes(const WeightView& w) override { return prepared_bytes(w, precision_); }
  WeightView prepare_weights_at(const WeightView& w, Buffer& dst, int64_t offset) override {
    enter();
    if (offset < 0 || offset % 64 != 0 || offset + prepared_bytes(w, precision_) > dst.bytes())
      throw std::logic_error("CUDA prepare_weights_at: offset outside the buffer or not 64-byte aligned");
    return cuda::prepare_weights_at(stream_, w, dst.at<uint8_t>(offset), precision_);
  }
  void fill_random(Buffer& dst, int64_t offset, DType t, int64_t rows, int64_t cols, uint64_t seed,
                   float scale) override {
    enter();
    const int64_t rb = dtype_row_bytes(t, cols);
    if (rb > 0 && offset >= 0 && offset + rows * rb <= dst.bytes() &&
        cuda::fill_random(stream_, dst.at<uint8_t>(offset), t, rows, cols, seed, scale))
      return;
    Backend::fill_random(dst, offset, t, rows, cols, seed, scale);  // the host's draw (it checks the range)
  }

  void matmul(const WeightView& w, Act x, Act y, int64_t rows) override {
    enter();
    Timed timed(*this, [&] { return matmul_cost(w, rows); });
    cuda::matmul(stream_, gemm_, scratch_, deterministic_, w, x, y, rows);
  }
  void matmul_many(const WeightView* const* w, const Act* y, int count, Act x, int64_t rows) override {
    enter();
    for (int i = 0; i < count; ++i) {
      Timed timed(*this, [&] { return matmul_cost(*w[i], rows); });
      cuda::matmul(stream_, gemm_, scratch_, deterministic_, *w[i], x, y[i], rows);
    }
  }
  void get_rows(const WeightView& table, const int32_t* ids, Act y, int64_t rows) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"get_rows"}; });
    cuda::get_rows(stream_, table, ids, y, rows);
  }
  void copy_rows(Act x, const int32_t* ids, Act y, int64_t rows, int64_t dim) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"copy_rows"}; });
    cuda::copy_rows(stream_, x, ids, y, rows, dim);
  }
  void rms_norm(Act x, const float* weight, Act y, int64_t rows, int64_t dim, float eps) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"rms_norm"}; });
    cuda::rms_norm(stream_, x, weight, y, rows, dim, eps);
  }
  void add_rms_norm(Act x, Act delta, const float* weight, Act y, int64_t rows, int64_t dim, float eps) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"add_rms_norm"}; });
    cuda::add_rms_norm(stream_, x, delta, weight, y, rows, dim, eps);
  }
  void layer_norm(Act x, Act y, int64_t rows, int64_t dim, const float* gamma, const float* beta, float eps) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"layer_norm"}; });
    cuda::layer_norm(stream_, x, y, rows, dim, gamma, beta, eps);
  }
  void rope(Act x, int64_t rows, const int32_t* positions, const RopeParams& p) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"rope"}; });
    cuda::rope(stream_, x, rows, positions, p);
  }
  void add(Act a, Act b, Act y, int64_t n) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"add"}; });
    cuda::add(stream_, a, b, y, n);
  }
  void add_bias(Act x, const float* bias, int64_t rows, int64_t dim) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"add_bias"}; });
    cuda::add_bias(stream_, x, bias, rows, dim);
  }
  void activation(Activation a, Act x, Act y, int64_t n) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"activation"}; });
    cuda::activation(stream_, a, x, y, n);
  }
  void swiglu(Act gate, Act up, Act out, int64_t rows, int64_t dim) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"swiglu"}; });
    cuda::swiglu(stream_, gate, up, out, rows, dim);
  }
  void glu(Activation a, Act gate, Act up, Act out, int64_t rows, int64_t dim) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"glu"}; });
    cuda::glu(stream_, a, gate, up, out, rows, dim);
  }
  void geglu(Act x, Act y, int64_t rows, int64_t dim) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"geglu"}; });
    cuda::geglu(stream_, x, y, rows, dim);
  }
  void softmax(Act x, int64_t rows, int64_t n) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"softmax"}; });
    cuda::softmax(stream_, x, rows, n);
  }
  void affine(Act x, Act y, int64_t n, const Affine& a) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"affine"}; });
    cuda::affine(stream_, x, y, n, a);
  }
  void relu(Act x, Act y, int64_t n) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"relu"}; });
    cuda::relu(stream_, x, y, n);
  }
  void tanh_clamp(Act x, Act y, int64_t n, float limit) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"tanh_clamp"}; });
    cuda::tanh_clamp(stream_, x, y, n, limit);
  }
  void copy(Act x, Act y, int64_t n) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"copy"}; });
    cuda::copy(stream_, x, y, n);
  }
  void relayout(Act x, Layout from, Act y, Layout to, int64_t n, int64_t c, int64_t hw) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"relayout"}; });
    cuda::relayout(stream_, x, from, y, to, n, c, hw);
  }
  void sample(Act logits, int64_t rows, int n_vocab, const SampleRow* params, const int32_t* penalty_tokens,
              int32_t* out_ids) override {
    enter();
    cuda::sample(stream_, logits, rows, n_vocab, params, penalty_tokens, out_ids);
  }
  void moe_route(Act logits, int64_t rows, const MoeRouting& r, int32_t* ids, float* weights) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"moe_route"}; });
    cuda::moe_route(stream_, logits, rows, r, ids, weights);
  }
  void matmul_id(const WeightView* const* experts, const Act* y, const float* const* bias, int count, int n_expert,
                 Act x, int x_per_row, const int32_t* ids, int64_t rows, int k) override {
    enter();
    Timed timed(*this, [&] {
      return OpCost{"matmul_id " + std::string(dtype_name(experts[0][0].type)) + " rows " + rows_bucket(rows)};
    });
    cuda::matmul_id(stream_, scratch_, experts, y, bias, count, n_expert, x, x_per_row, ids, rows, k);
  }
  void moe_combine(Act y, const float* weights, Act out, int64_t rows, int k, int64_t dim) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"moe_combine"}; });
    cuda::moe_combine(stream_, y, weights, out, rows, k, dim);
  }
  void swiglu_oai(Act gate, Act up, Act out, int64_t rows, int64_t dim, float alpha, float limit) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"swiglu_oai"}; });
    cuda::swiglu_oai(stream_, gate, up, out, rows, dim, alpha, limit);
  }
  void store_kv(const KvLayout& kv, int layer, Act k, Act v, const int32_t* slots, int64_t rows) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"store_kv"}; });
    cuda::store_kv(stream_, kv, layer, k, v, slots, rows);
  }
  void rope_store_kv(Act q, Act k, Act v, int64_t rows, const int32_t* positions, const RopeParams& rq,
                     const RopeParams& rk, const KvLayout& kv, int layer, const int32_t* slots) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"rope_store_kv rows " + rows_bucket(rows)}; });
    cuda::rope_store_kv(stream_, q, k, v, rows, positions, rq, rk, kv, layer, slots);
  }
  void paged_attention(const KvLayout& kv, const PagedAttention& a, Act q, Act out) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"paged_attention rows " + rows_bucket(a.rows)}; });
    cuda::paged_attention(stream_, scratch_, kv, a, q, out, flash_prefill_);
  }
  void attention(const AttentionShape& s, Act q, Act k, Act v, Act out) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"attention"}; });
    cuda::dense_attention(stream_, s, q, k, v, s.heads * s.head_dim, false, out);
  }
  void causal_attention(const AttentionShape& s, Act q, Act k, Act v, int64_t stride, Act out) override {
    enter();
    Timed timed(*this, [&] { return OpCost{"causal_attention"}; });
    cuda::dense_attention(stream_, s, q, k, v, stride, true, out);
  }

  // ---- image-only ops: issue 34
  void group_norm(Act, Act, int64_t, int64_t, int64_t, int64_t, const float*, const float*, float, bool) override {
    image_op("group_norm");
  }
  void add_channel_bias(Act, Act, int64_t, int64_t, int64_t) override { image_op("add_channel_bias"); }
  void concat_channels(Act, int64_t, Act, int64_t, Act, int64_t, int64_t) override { image_op("concat_channels"); }
  void timestep_embedding(const float*, int64_t, int64_t, Act, bool, float, float) override {
    image_op("timestep_embedding");
  }
  void pad2d(Act, Act, int64_t, int64_t, int64_t, int64_t, const Pad2d&) override { image_op("pad2d"); }
  void conv2d(const Conv2dShape&, Act, DType, const void*, const float*, Act) override { image_op("conv2d"); }
  void upsample_nearest2x(Act, Act, int64_t, int64_t, int64_t, int64_t) override { image_op("upsample_nearest2x"); }

 private:
  static constexpr int64_t kPinnedBytes = int64_t{1} << 20;

  // What an op costs, for the profile: its key, the bytes it must read and
  // the FLOPs it must do (0: not counted).
  struct OpCost {
    std::string key;
    double bytes = 0, flops = 0;
  };
  static OpCost matmul_cost(const WeightView& w, int64_t rows) {
    const bool gemm = matmul_path(w.type, rows, false) == MatmulPath::gemm && w.type != DType::F32;
    return OpCost{"matmul " + std::string(dtype_name(w.type)) + " rows " + rows_bucket(rows) + (gemm ? " gemm" : ""),
                  static_cast<double>(w.rows) * static_cast<double>(w.row_stride_bytes),
                  2.0 * static_cast<double>(rows) * static_cast<double>(w.rows) * static_cast<double>(w.cols)};
  }
  // Times the op it lives through when profiling (describe() runs only then).
  class Timed {
   public:
    template <class F>
    Timed(CudaBackend& b, F&& describe) {
      if (!b.profile_) return;
      OpCost c = describe();
      b.profile_->begin(b.stream_, std::move(c.key), c.bytes, c.flops);
      b_ = &b;
    }
    ~Timed() {
      if (b_) b_->profile_->end(b_->stream_);
    }
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;

   private:
    CudaBackend* b_ = nullptr;
  };

  void enter() {
    check_alive(device_);
    use_device(device_);
  }
  [[noreturn]] static void image_op(const char* op) {
    throw std::runtime_error(std::string(op) +
                             " is not on the CUDA backend yet (issue 34): run image jobs with --device cpu");
  }
  static void check_range(Buffer& b, int64_t offset, int64_t bytes, const char* what) {
    if (offset < 0 || offset + bytes > b.bytes())
      throw std::logic_error(std::string("CUDA ") + what + ": bytes outside the buffer");
  }

  // A key's graph: runs before it was captured, and whether capturing it
  // failed (it then runs uncaptured: the ops once more, every time).
  struct StepGraph {
    cudaGraphExec_t exec = nullptr;
    int runs = 0;
    bool uncapturable = false;
    uint64_t last_use = 0;
  };
  // At most this many graphs live (the least recently used goes first): a
  // runner has one per rows bucket, logits bucket and attention bound.
  static constexpr size_t kMaxGraphs = 64;
  StepGraph& graph_for(uint64_t key);
  void capture(uint64_t key, const std::function<void()>& ops);
  void run_uncaptured(uint64_t key, const std::function<void()>& ops);
  void capture_failed(const std::string& why);

  const CudaDevice& dev_;
  int device_;
  bool deterministic_;
  bool graphs_on_;
  bool flash_prefill_;
  std::unordered_map<uint64_t, StepGraph> graphs_;
  uint64_t use_clock_ = 0;
  uint64_t scratch_generation_ = 0;  // the scratch's generation the live graphs point into
  bool capture_failure_logged_ = false;
  int cc_ = 0;  // compute capability, major * 10 + minor
  WeightPrecision precision_ = WeightPrecision::bf16;
  cudaStream_t stream_ = nullptr;
  void* pinned_ = nullptr;
  cudaEvent_t staged_ = nullptr;
  Gemm gemm_;
  Scratch scratch_;
  std::unique_ptr<OpProfile> profile_;  // ATELIER_CUDA_PROFILE=1
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int index) : index_(index) {
    use_device(index);
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, index));
    name_ = p.name;
    cc_major_ = p.major;
    cc_minor_ = p.minor;
    total_ = static_cast<int64_t>(p.totalGlobalMem);
    char pci[32] = {0};
    if (cudaDeviceGetPCIBusId(pci, sizeof pci, index) == cudaSuccess) pci_ = pci;
    // ATELIER_CUDA_DETERMINISTIC=1: every product on the matrix-vector
    // kernels, so each op is batch-invariant (slower prefill).
    const char* det = std::getenv("ATELIER_CUDA_DETERMINISTIC");
    deterministic_ = det && *det && std::strcmp(det, "0") != 0;
    // ATELIER_CUDA_GRAPHS=0: every step's ops launched one by one (the
    // device check's A/B of what graphs save).
    const char* graphs = std::getenv("ATELIER_CUDA_GRAPHS");
    graphs_ = !(graphs && std::strcmp(graphs, "0") == 0);
    // ATELIER_CUDA_FLASH_PREFILL=0: every paged-attention row on the
    // flash-decoding kernel (the device check's A/B of the tiled prefill;
    // deterministic mode keeps it off too).
    flash_prefill_ = flash_prefill_on(std::getenv("ATELIER_CUDA_FLASH_PREFILL"), deterministic_);
  }

  int index() const { return index_; }
  bool deterministic() const { return deterministic_; }
  bool graphs() const { return graphs_; }
  bool flash_prefill() const { return flash_prefill_; }
  int compute_capability() const { return cc_major_ * 10 + cc_minor_; }

  DeviceInfo info() const override {
    DeviceInfo d;
    d.name = "cuda:" + std::to_string(index_);
    char mem[32];
    std::snprintf(mem, sizeof mem, "%.1f GiB", static_cast<double>(total_) / (1 << 30));
    d.description = name_ + ", compute capability " + std::to_string(cc_major_) + "." + std::to_string(cc_minor_) +
                    ", " + mem + (deterministic_ ? ", deterministic" : "") + (graphs_ ? "" : ", CUDA graphs off") +
                    (flash_prefill_ || deterministic_ ? "" : ", flash prefill off");
    if (g_lost[index_].load()) d.description += " (lost: " + lost_why() + ")";
    d.host_memory = false;
    d.compute_capability = cc_major_ * 10 + cc_minor_;
    // Batch invariance (kernels/README.md, CUDA): every op but matmul keeps
    // it; matmul keeps it up to kMatvecRows rows (kMatvecRowsQuantized for
    // quantized weights), beyond them cuBLASLt picks its kernel (and split)
    // by the row count. Deterministic mode keeps it everywhere.
    d.batch_invariant = deterministic_;
    d.act_dtype = DType::BF16;
    d.layout = Layout::NHWC;
    return d;
  }
  DeviceMemory memory() const override {
    check_alive(index_);
    use_device(index_);
    size_t free = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free, &total));
    DeviceMemory m;
    m.total_bytes = static_cast<int64_t>(total);
    m.free_bytes = static_cast<int64_t>(free);
    m.reserved_bytes = kReservedBytes;
    return m;
  }
  std::unique_ptr<Backend> make_backend(Executor*, int priority) override {
    check_alive(index_);
    return std::make_unique<CudaBackend>(*this, priority);
  }
  DeviceTelemetry telemetry() const override {
    DeviceTelemetry t;
    const Nvml& n = Nvml::get();
    if (!n.ok || pci_.empty()) return t;
    Nvml::Dev h = nullptr;
    Nvml::Util u{};
    Nvml::Mem m{};
    unsigned temp = 0;
    if (n.by_pci(pci_.c_str(), &h) != 0 || n.util(h, &u) != 0 || n.temp(h, 0, &temp) != 0 || n.mem(h, &m) != 0)
      return t;
    t.available = true;
    t.utilization_percent = u.gpu;
    t.temperature_c = temp;
    t.memory_used_bytes = static_cast<int64_t>(m.used);
    t.memory_total_bytes = static_cast<int64_t>(m.total);
    return t;
  }

 private:
  std::string lost_why() const {
    std::lock_guard<std::mutex> lock(g_lost_mu);
    return g_lost_why[index_];
  }
  int index_;
  std::string name_, pci_;
  int cc_major_ = 0, cc_minor_ = 0;
  int64_t total_ = 0;
  bool deterministic_ = false;
  bool graphs_ = true;
  bool flash_prefill_ = true;
};

CudaBackend::CudaBackend(const CudaDevice& dev, int priority)
    : dev_(dev), device_(dev.index()), deterministic_(dev.deterministic()), graphs_on_(dev.graphs()), flash_prefill_(dev.flash_prefill()) {
  use_device(device_);
  // CUDA's priorities: lower numbers run first, from `least` (0) down to `greatest`.
  int least = 0, greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  const int p = std::clamp(least - priority, greatest, least);
  CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, p));
  CUDA_CHECK(cudaMallocHost(&pinned_, static_cast<size_t>(kPinnedBytes)));
  CUDA_CHECK(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(staged_, stream_));
  // FP8 products on cuBLASLt's FP8 GEMM where the device has FP8 tensor
  // cores; ATELIER_CUDA_FP8_GEMM=0 takes the BF16 slices instead (an A/B).
  cc_ = dev.compute_capability();
  const char* fp8 = std::getenv("ATELIER_CUDA_FP8_GEMM");
  gemm_.fp8 = cc_ >= 89 && !(fp8 && std::strcmp(fp8, "0") == 0);
  const char* prof = std::getenv("ATELIER_CUDA_PROFILE");
  if (prof && *prof && std::strcmp(prof, "0") != 0) {
    profile_ = std::make_unique<OpProfile>();
    graphs_on_ = false;  // a replayed graph's ops have no launches to time
  }
}

DeviceInfo CudaBackend::device() const { return dev_.info(); }

CudaBackend::StepGraph& CudaBackend::graph_for(uint64_t key) {
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    if (graphs_.size() >= kMaxGraphs) {
      auto old = std::min_element(graphs_.begin(), graphs_.end(),
                                  [](const auto& a, const auto& b) { return a.second.last_use < b.second.last_use; });
      if (old->second.exec) cudaGraphExecDestroy(old->second.exec);
      graphs_.erase(old);
    }
    it = graphs_.emplace(key, StepGraph{}).first;
  }
  it->second.last_use = ++use_clock_;
  return it->second;
}

void CudaBackend::run_step(uint64_t key, const std::function<void()>& ops) {
  enter();
  if (!graphs_on_) return ops();
  // The scratch moved since the live graphs were captured: they point at freed memory.
  if (scratch_.generation() != scratch_generation_) {
    drop_graphs();
    scratch_generation_ = scratch_.generation();
  }
  StepGraph& g = graph_for(key);
  if (g.exec) {
    CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
    return;
  }
  if (g.runs == 0 || g.uncapturable) return run_uncaptured(key, ops);
  capture(key, ops);
}

void CudaBackend::run_uncaptured(uint64_t key, const std::function<void()>& ops) {
  graph_for(key).runs++;
  ops();
  if (scratch_.generation() != scratch_generation_) {  // it grew: the other keys' graphs are stale
    const StepGraph kept = graphs_[key];
    drop_graphs();
    graphs_[key] = kept;
    scratch_generation_ = scratch_.generation();
  }
}

void CudaBackend::capture_failed(const std::string& why) {
  if (capture_failure_logged_) return;
  capture_failure_logged_ = true;
  std::fprintf(stderr, "atelier: cuda:%d: a step could not be captured as a CUDA graph (%s); such steps run op by op\n",
               device_, why.c_str());
}

void CudaBackend::capture(uint64_t key, const std::function<void()>& ops) {
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  std::string failure;
  bool grow = false;
  scratch_.freeze(true);
  try {
    ops();
  } catch (const ScratchFrozen&) {
    grow = true;
  } catch (const std::exception& e) {
    failure = e.what();
  }
  scratch_.freeze(false);
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  // A device lost inside the capture stays lost (cuda_fail marked it); any
  // other failure leaves the context usable: clear it and run the ops.
  if (failure.rfind("CUDA device lost", 0) == 0) {
    if (graph) cudaGraphDestroy(graph);
    throw std::runtime_error(failure);
  }
  if (ended != cudaSuccess && is_sticky(ended)) cuda_fail(ended, "cudaStreamEndCapture", __FILE__, __LINE__);
  if (grow || !failure.empty() || ended != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    // The scratch had to grow (a shape its warm-up did not size): the next
    // run tries again; anything else is this key's for good.
    if (!grow) {
      graph_for(key).uncapturable = true;
      capture_failed(!failure.empty() ? failure : std::string(cudaGetErrorName(ended)));
    }
    return run_uncaptured(key, ops);
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) {
    if (is_sticky(made)) cuda_fail(made, "cudaGraphInstantiate", __FILE__, __LINE__);
    cudaGetLastError();
    graph_for(key).uncapturable = true;
    capture_failed(std::string("cudaGraphInstantiate: ") + cudaGetErrorName(made));
    return run_uncaptured(key, ops);
  }
  StepGraph& g = graph_for(key);
  g.exec = exec;
  CUDA_CHECK(cudaGraphLaunch(exec, stream_));
}

std::mutex g_devices_mu;
CudaDevice* g_devices[kMaxDevices] = {};

void set_why(char* why, int why_len, const std::string& s) {
  if (!why || why_len <= 0) return;
  std::snprintf(why, static_cast<size_t>(why_len), "%s", s.c_str());
}

}  // namespace

}  // namespace atelier::kernels::cuda

using namespace atelier::kernels::cuda;

extern "C" {

__attribute__((visibility("default"))) int atelier_cuda_abi_version() { return ATELIER_CUDA_ABI_VERSION; }

__attribute__((visibility("default"))) int atelier_cuda_device_count(char* why, int why_len) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    std::string what = std::string("the CUDA runtime found no usable GPU: ") + cudaGetErrorString(e) + " (" +
                       cudaGetErrorName(e) + ")";
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice)
      what += ". No NVIDIA driver, or one older than CUDA 13 needs: install the NVIDIA driver (version 580 or newer for CUDA 13) and check nvidia-smi lists the GPU; "
              "--device cpu runs without one.";
    set_why(why, why_len, what);
    return -1;
  }
  return n;
}

__attribute__((visibility("default"))) atelier::kernels::Device* atelier_cuda_open_device(int index, char* why,
                                                                                         int why_len) {
  if (index < 0 || index >= kMaxDevices) {
    set_why(why, why_len, "cuda:" + std::to_string(index) + ": no such device");
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(g_devices_mu);
  if (g_devices[index]) return g_devices[index];
  try {
    g_devices[index] = new CudaDevice(index);  // kept for the process
    return g_devices[index];
  } catch (const std::exception& e) {
    set_why(why, why_len, "cuda:" + std::to_string(index) + " could not be opened: " + e.what());
    return nullptr;
  }
}

}  // extern "C"
