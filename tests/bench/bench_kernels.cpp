// Matmul throughput per weight type, for one activation row (generation) and
// 32 (prompt processing): bm_matmul on a 4096 x 4096 matrix, bm_llama on the
// matrices of a 110M LLaMA (768 x 768, 2048 x 768, 768 x 2048, 32000 x 768;
// weight rows x columns). bytes/s counts the weight bytes read per call;
// items/s counts multiply-adds.
//   ./bench_kernels --benchmark_filter=Q8_0   ATELIER_SIMD=avx2 ./bench_kernels
#include <benchmark/benchmark.h>

#include <atelier/kernels.h>

#include "core/thread_pool.h"

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

// The engine's thread pool: the kernels run on it in the product.
using Pool = atelier::ThreadPool;

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

// pack: the weights re-laid out as the engine does at load (pack_weights),
// where this CPU has a packed layout for the type.
void run_matmul(benchmark::State& state, DType t, int64_t rows, int64_t cols, int64_t m_rows, int threads,
                bool pack = false) {
  const int64_t row_bytes = dtype_row_bytes(t, cols);
  const auto& w = weights(t, rows, cols);
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> x(static_cast<size_t>(m_rows * cols)), y(static_cast<size_t>(m_rows * rows));
  for (auto& f : x) f = dist(rng);
  WeightView view{t, w.data(), rows, cols, row_bytes};
  std::vector<uint8_t> packed;
  if (pack) {
    if (packed_weight_bytes(view) == 0) return state.SkipWithError("no packed layout for this type at this SIMD level");
    packed.resize(static_cast<size_t>(packed_weight_bytes(view)) + 64);
    view = pack_weights(view, packed.data() + (64 - reinterpret_cast<uintptr_t>(packed.data()) % 64) % 64);
  }
  Pool pool(threads);
  for (auto _ : state) {
    matmul(view, x.data(), y.data(), m_rows, &pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * row_bytes * rows);
  state.SetItemsProcessed(state.iterations() * rows * cols * m_rows);
  state.SetLabel(std::string(dtype_name(t)) + (pack ? " packed " : " ") + std::string(simd_level()));
}

void bm_matmul(benchmark::State& state, DType t) {
  run_matmul(state, t, 4096, 4096, state.range(0), static_cast<int>(state.range(1)));
}

void bm_llama(benchmark::State& state, DType t) {
  run_matmul(state, t, state.range(2), state.range(3), state.range(0), static_cast<int>(state.range(1)));
}

void bm_llama_packed(benchmark::State& state, DType t) {
  run_matmul(state, t, state.range(2), state.range(3), state.range(0), static_cast<int>(state.range(1)), true);
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
    for (int m : {1, 16, 32, 128})  // 128: a prompt's rows
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
BENCHMARK_CAPTURE(bm_llama_packed, F32, DType::F32)->Apply(llama_args);
BENCHMARK_CAPTURE(bm_llama_packed, F16, DType::F16)->Apply(llama_args);
BENCHMARK_CAPTURE(bm_llama_packed, Q8_0, DType::Q8_0)->Apply(llama_args);
BENCHMARK_CAPTURE(bm_llama_packed, Q4_0, DType::Q4_0)->Apply(llama_args);
BENCHMARK_CAPTURE(bm_llama_packed, Q4_K, DType::Q4_K)->Apply(llama_args);
BENCHMARK_CAPTURE(bm_llama_packed, Q6_K, DType::Q6_K)->Apply(llama_args);
BENCHMARK_CAPTURE(bm_llama, Q4_0, DType::Q4_0)->Apply(llama_args);
BENCHMARK_CAPTURE(bm_llama, Q4_K, DType::Q4_K)->Apply(llama_args);
BENCHMARK_CAPTURE(bm_llama, Q6_K, DType::Q6_K)->Apply(llama_args);

}  // namespace
