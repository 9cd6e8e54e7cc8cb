// Image-op throughput on Stable Diffusion shapes: conv2d 3x3 (320 channels at
// 64x64, the first UNet level at 512x512; 64 channels at 256x256, the
// TAESD decoder's last level), attention over 4096 tokens (8 heads of 40,
// SD 1.5's first transformer level) and against 77 CLIP tokens. items/s =
// multiply-adds; the reference runs for comparison on a smaller conv.
//   ./bench_kernels --benchmark_filter=Image
#include <benchmark/benchmark.h>

#include <atelier/kernels.h>

#include "core/thread_pool.h"

#include <random>
#include <vector>

namespace {

using namespace atelier::kernels;

std::vector<float> randn(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.1f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& f : v) f = d(rng);
  return v;
}

atelier::ThreadPool& pool() {
  static atelier::ThreadPool p;
  return p;
}

void run_conv(benchmark::State& state, int64_t c, int64_t side, bool ref) {
  Conv2dShape s;
  s.c_in = s.c_out = c, s.h = s.w = side, s.kh = s.kw = 3, s.pad_h = s.pad_w = 1;
  const auto x = randn(c * side * side, 1), w = randn(c * c * 9, 2), b = randn(c, 3);
  std::vector<float> y(static_cast<size_t>(c * side * side));
  for (auto _ : state) {
    if (ref)
      conv2d_ref(s, x.data(), DType::F32, w.data(), b.data(), y.data());
    else
      conv2d(s, x.data(), DType::F32, w.data(), b.data(), y.data(), &pool());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * c * c * 9 * side * side);
}

void Image_conv3x3_320ch_64x64(benchmark::State& st) { run_conv(st, 320, 64, false); }
void Image_conv3x3_64ch_256x256(benchmark::State& st) { run_conv(st, 64, 256, false); }
void Image_conv3x3_64ch_32x32(benchmark::State& st) { run_conv(st, 64, 32, false); }
void Image_conv3x3_64ch_32x32_ref(benchmark::State& st) { run_conv(st, 64, 32, true); }

void run_attention(benchmark::State& state, int64_t lq, int64_t lk) {
  AttentionShape s;
  s.heads = 8, s.head_dim = 40, s.lq = lq, s.lk = lk;
  const auto q = randn(lq * 320, 4), k = randn(lk * 320, 5), v = randn(lk * 320, 6);
  std::vector<float> out(q.size());
  for (auto _ : state) {
    attention(s, q.data(), k.data(), v.data(), out.data(), &pool());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * 2 * lq * lk * 320);
}

void Image_attention_4096x4096(benchmark::State& st) { run_attention(st, 4096, 4096); }
void Image_attention_4096x77(benchmark::State& st) { run_attention(st, 4096, 77); }

void Image_group_norm_silu_320ch_64x64(benchmark::State& state) {
  const auto x = randn(320 * 4096, 7), g = randn(320, 8), b = randn(320, 9);
  std::vector<float> y(x.size());
  for (auto _ : state) {
    group_norm(x.data(), y.data(), 1, 320, 4096, 32, g.data(), b.data(), 1e-5f, true, &pool());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * 2 * int64_t(x.size() * sizeof(float)));
}

}  // namespace

BENCHMARK(Image_conv3x3_320ch_64x64)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Image_conv3x3_64ch_256x256)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Image_conv3x3_64ch_32x32)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Image_conv3x3_64ch_32x32_ref)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Image_attention_4096x4096)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Image_attention_4096x77)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Image_group_norm_silu_320ch_64x64)->Unit(benchmark::kMillisecond)->UseRealTime();
