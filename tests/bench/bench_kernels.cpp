// Matmul throughput per weight type, for one activation row (generation) and
// 32 (prompt processing): bm_matmul on a 4096 x 4096 matrix, bm_llama on the
// matrices of a 110M LLaMA (768 x 768, 2048 x 768, 768 x 2048, 32000 x 768;
// weight rows x columns). bytes/s counts the weight bytes read per call;
// items/s counts multiply-adds. bm_decode_attention: one generated token's
// attention over `depth` cached positions (paged_attention, 12 heads of 64
// as in the 110M model, the 12 layers in turn so that the cache streams from
// memory as in generation), in blocks of `block` positions as the engine's
// KV pool holds them (0: one contiguous block, as bench text's cache);
// bytes/s counts the K and V bytes read, bw_fraction that rate over the
// memory bandwidth this process measured.
//   ./bench_kernels --benchmark_filter=Q8_0   ATELIER_SIMD=avx2 ./bench_kernels
#include <benchmark/benchmark.h>

#include <atelier/backend.h>
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

void bm_decode_attention(benchmark::State& state, DType t) {
  constexpr int kLayers = 12, kHeads = 12;
  constexpr int64_t kHeadDim = 64, kRow = kHeads * kHeadDim;
  const int depth = static_cast<int>(state.range(0));
  const int block = state.range(1) > 0 ? static_cast<int>(state.range(1)) : depth;
  const int threads = static_cast<int>(state.range(2));
  const int n_blocks = (depth + block - 1) / block;
  const int64_t block_elems = int64_t{kLayers} * block * kRow, elems = n_blocks * block_elems;
  // K and V in the backend's buffers (huge pages, as the engine's KV pool),
  // random values in the cache's type (one long row: every offset is whole
  // Q8_0 blocks).
  Pool pool(threads);
  auto be = make_cpu_backend(&pool);
  const auto k = be->alloc(dtype_row_bytes(t, elems)), v = be->alloc(dtype_row_bytes(t, elems));
  {
    uint32_t s = 3;  // xorshift: hundreds of MB of values, made in well under a second
    std::vector<float> f(static_cast<size_t>(block_elems));
    for (auto* buf : {k.get(), v.get()})
      for (int b = 0; b < n_blocks; ++b) {
        for (auto& x : f) {
          s ^= s << 13, s ^= s >> 17, s ^= s << 5;
          x = static_cast<float>(s >> 8) * 0x1p-23f - 1.0f;  // uniform in [-1, 1)
        }
        quantize_row(t, f.data(), buf->at<uint8_t>(dtype_row_bytes(t, b * block_elems)), block_elems);
      }
  }
  KvLayout kv;
  kv.type = t;
  kv.k = k->data();
  kv.v = v->data();
  kv.row_elems = kRow;
  kv.block_tokens = block;
  kv.block_stride_elems = block_elems;
  kv.layer_stride_elems = int64_t{block} * kRow;
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  for (int b = 0; b < n_blocks; ++b) table[static_cast<size_t>(b)] = b;
  const int32_t len = depth, table_at = 0;
  std::vector<float> q(kRow), out(kRow);
  std::mt19937 rng(4);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& x : q) x = dist(rng);
  PagedAttention a;
  a.rows = 1;
  a.n_head = a.n_head_kv = kHeads;
  a.head_dim = kHeadDim;
  a.scale = 0.125f;
  a.max_len = depth;
  a.row_len = &len;
  a.row_table = &table_at;
  a.block_tables = table.data();
  static const double bandwidth_gb_per_s = measure_memory_bandwidth_gb_per_s(&pool);
  for (auto _ : state) {
    for (int l = 0; l < kLayers; ++l) {
      a.layer = l;
      be->paged_attention(kv, a, Act(q.data(), DType::F32), Act(out.data(), DType::F32));
    }
    benchmark::DoNotOptimize(out.data());
  }
  const int64_t bytes = state.iterations() * kLayers * 2 * dtype_row_bytes(t, int64_t{depth} * kRow);
  state.SetBytesProcessed(bytes);
  state.counters["bw_fraction"] =
      benchmark::Counter(static_cast<double>(bytes) / 1e9 / bandwidth_gb_per_s, benchmark::Counter::kIsRate);
  state.SetLabel(std::string(dtype_name(t)) + " " + std::string(simd_level()));
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

void attention_args(benchmark::internal::Benchmark* b) {
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int depth : {2048, 8192})
    for (int block : {16, 64, 256, 0}) b->Args({depth, block, hw});
  b->ArgNames({"depth", "block", "threads"})->Unit(benchmark::kMicrosecond)->UseRealTime();
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

BENCHMARK_CAPTURE(bm_decode_attention, F16, DType::F16)->Apply(attention_args);
BENCHMARK_CAPTURE(bm_decode_attention, Q8_0, DType::Q8_0)->Apply(attention_args);
BENCHMARK_CAPTURE(bm_decode_attention, F32, DType::F32)->Apply(attention_args);

}  // namespace
