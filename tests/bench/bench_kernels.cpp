// Matmul throughput per weight type, for one activation row (generation) and
// 32 (prompt processing): bm_matmul on a 4096 x 4096 matrix, bm_llama on the
// matrices of a 110M LLaMA (768 x 768, 2048 x 768, 768 x 2048, 32000 x 768;
// weight rows x columns). bytes/s counts the weight bytes read per call;
// items/s counts multiply-adds.
//   ./bench_kernels --benchmark_filter=Q8_0   ATELIER_SIMD=avx2 ./bench_kernels
#include <benchmark/benchmark.h>

#include <atelier/kernels.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <random>
#include <map>
#include <string>
#include <tuple>
#include <thread>
#include <vector>

namespace {

using namespace atelier::kernels;

// A small persistent pool, so thread start-up does not count.
class Pool : public Executor {
 public:
  explicit Pool(int n) : n_(n) {
    for (int i = 1; i < n_; ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  ~Pool() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      ++gen_;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int threads() const override { return n_; }
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      total_ = n;
      pending_ = n_ - 1;
      ++gen_;
    }
    cv_.notify_all();
    run_slice(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
  }

 private:
  void run_slice(int i) {
    const int64_t b = total_ * i / n_, e = total_ * (i + 1) / n_;
    if (b < e) (*fn_)(b, e);
  }
  void loop(int i) {
    uint64_t seen = 0;
    for (;;) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return gen_ != seen; });
      seen = gen_;
      if (stop_) return;
      lock.unlock();
      run_slice(i);
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }
  int n_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t total_ = 0;
  int pending_ = 0;
  uint64_t gen_ = 0;
  bool stop_ = false;
};

// Random weights of one type and shape, made once per process.
const std::vector<uint8_t>& weights(DType t, int64_t rows, int64_t cols) {
  static std::map<std::tuple<DType, int64_t, int64_t>, std::vector<uint8_t>> cache;
  auto& w = cache[{t, rows, cols}];
  if (!w.empty()) return w;
  const int64_t row_bytes = dtype_row_bytes(t, cols);
  w.resize(static_cast<size_t>(row_bytes * rows));
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& f : row) f = dist(rng);
    quantize_row(t, row.data(), w.data() + r * row_bytes, cols);
  }
  return w;
}

void run_matmul(benchmark::State& state, DType t, int64_t rows, int64_t cols, int64_t m_rows, int threads) {
  const int64_t row_bytes = dtype_row_bytes(t, cols);
  const auto& w = weights(t, rows, cols);
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> x(static_cast<size_t>(m_rows * cols)), y(static_cast<size_t>(m_rows * rows));
  for (auto& f : x) f = dist(rng);
  const WeightView view{t, w.data(), rows, cols, row_bytes};
  Pool pool(threads);
  for (auto _ : state) {
    matmul(view, x.data(), y.data(), m_rows, &pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * row_bytes * rows);
  state.SetItemsProcessed(state.iterations() * rows * cols * m_rows);
  state.SetLabel(std::string(dtype_name(t)) + " " + std::string(simd_level()));
}

void bm_matmul(benchmark::State& state, DType t) {
  run_matmul(state, t, 4096, 4096, state.range(0), static_cast<int>(state.range(1)));
}

void bm_llama(benchmark::State& state, DType t) {
  run_matmul(state, t, state.range(2), state.range(3), state.range(0), static_cast<int>(state.range(1)));
}

void args(benchmark::internal::Benchmark* b) {
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int m : {1, 32})
    for (int th : {1, hw}) b->Args({m, th});
  b->ArgNames({"rows", "threads"})->Unit(benchmark::kMillisecond)->UseRealTime();
}

void llama_args(benchmark::internal::Benchmark* b) {
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (auto [rows, cols] : {std::pair{768, 768}, {2048, 768}, {768, 2048}, {32000, 768}})
    for (int m : {1, 16, 32})
      for (int th : {1, hw}) b->Args({m, th, rows, cols});
  b->ArgNames({"rows", "threads", "out", "in"})->Unit(benchmark::kMicrosecond)->UseRealTime();
}

BENCHMARK_CAPTURE(bm_matmul, F32, DType::F32)->Apply(args);
BENCHMARK_CAPTURE(bm_matmul, F16, DType::F16)->Apply(args);
BENCHMARK_CAPTURE(bm_matmul, BF16, DType::BF16)->Apply(args);
BENCHMARK_CAPTURE(bm_matmul, Q8_0, DType::Q8_0)->Apply(args);
BENCHMARK_CAPTURE(bm_matmul, Q4_0, DType::Q4_0)->Apply(args);
BENCHMARK_CAPTURE(bm_matmul, Q4_K, DType::Q4_K)->Apply(args);
BENCHMARK_CAPTURE(bm_matmul, Q6_K, DType::Q6_K)->Apply(args);

BENCHMARK_CAPTURE(bm_llama, F32, DType::F32)->Apply(llama_args);
BENCHMARK_CAPTURE(bm_llama, F16, DType::F16)->Apply(llama_args);
BENCHMARK_CAPTURE(bm_llama, BF16, DType::BF16)->Apply(llama_args);
BENCHMARK_CAPTURE(bm_llama, Q8_0, DType::Q8_0)->Apply(llama_args);
BENCHMARK_CAPTURE(bm_llama, Q4_0, DType::Q4_0)->Apply(llama_args);
BENCHMARK_CAPTURE(bm_llama, Q4_K, DType::Q4_K)->Apply(llama_args);
BENCHMARK_CAPTURE(bm_llama, Q6_K, DType::Q6_K)->Apply(llama_args);

}  // namespace
