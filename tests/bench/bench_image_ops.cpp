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

void run_conv(benchmark::State& state, int64_t c, int64_t side, bool ref, DType wt = DType::F32, int64_t k = 3) {
  Conv2dShape s;
  s.c_in = s.c_out = c, s.h = s.w = side, s.kh = s.kw = k, s.pad_h = s.pad_w = k / 2;
  const auto x = randn(c * side * side, 1), w = randn(c * c * k * k, 2), b = randn(c, 3);
  std::vector<uint16_t> wh(w.size());
  for (size_t i = 0; i < w.size(); ++i) wh[i] = f32_to_fp16(w[i]);
  const void* wp = wt == DType::F16 ? static_cast<const void*>(wh.data()) : w.data();
  std::vector<float> y(static_cast<size_t>(c * side * side));
  for (auto _ : state) {
    if (ref)
      conv2d_ref(s, x.data(), wt, wp, b.data(), y.data());
    else
      conv2d(s, x.data(), wt, wp, b.data(), y.data(), &pool());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * c * c * k * k * side * side);
}

void Image_conv3x3_320ch_64x64(benchmark::State& st) { run_conv(st, 320, 64, false); }
void Image_conv3x3_64ch_256x256(benchmark::State& st) { run_conv(st, 64, 256, false); }
void Image_conv3x3_64ch_32x32(benchmark::State& st) { run_conv(st, 64, 32, false); }
void Image_conv3x3_64ch_32x32_ref(benchmark::State& st) { run_conv(st, 64, 32, true); }
// f16 weights (as SD checkpoints ship them): the VAE decoder's 512-channel
// level at 64x64 (512x512 images), the UNet's 640 / 1280-channel levels, a
// 1x1 projection.
void Image_conv3x3_512ch_64x64_f16(benchmark::State& st) { run_conv(st, 512, 64, false, DType::F16); }
void Image_conv3x3_320ch_64x64_f16(benchmark::State& st) { run_conv(st, 320, 64, false, DType::F16); }
void Image_conv3x3_640ch_32x32_f16(benchmark::State& st) { run_conv(st, 640, 32, false, DType::F16); }
void Image_conv3x3_1280ch_16x16_f16(benchmark::State& st) { run_conv(st, 1280, 16, false, DType::F16); }
void Image_conv3x3_1280ch_8x8_f16(benchmark::State& st) { run_conv(st, 1280, 8, false, DType::F16); }
void Image_conv3x3_1280ch_4x4_f16(benchmark::State& st) { run_conv(st, 1280, 4, false, DType::F16); }
void Image_conv1x1_640ch_32x32_f16(benchmark::State& st) { run_conv(st, 640, 32, false, DType::F16, 1); }

void run_attention(benchmark::State& state, int64_t lq, int64_t lk, int64_t heads = 8, int64_t d = 40) {
  AttentionShape s;
  s.heads = heads, s.head_dim = d, s.lq = lq, s.lk = lk;
  const int64_t width = heads * d;
  const auto q = randn(lq * width, 4), k = randn(lk * width, 5), v = randn(lk * width, 6);
  std::vector<float> out(q.size());
  for (auto _ : state) {
    attention(s, q.data(), k.data(), v.data(), out.data(), &pool());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * 2 * lq * lk * width);
}

void Image_attention_4096x4096(benchmark::State& st) { run_attention(st, 4096, 4096); }
void Image_attention_4096x77(benchmark::State& st) { run_attention(st, 4096, 77); }
// The UNet's second and third levels at 512x512 (8 heads of 80, of 160), the
// VAE's mid-block attention at 512x512 (one head of 512 over 4096 tokens).
void Image_attention_1024x1024_d80(benchmark::State& st) { run_attention(st, 1024, 1024, 8, 80); }
void Image_attention_256x256_d160(benchmark::State& st) { run_attention(st, 256, 256, 8, 160); }
void Image_attention_4096x4096_1x512(benchmark::State& st) { run_attention(st, 4096, 4096, 1, 512); }

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
BENCHMARK(Image_conv3x3_512ch_64x64_f16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Image_conv3x3_320ch_64x64_f16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Image_conv3x3_640ch_32x32_f16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Image_conv3x3_1280ch_16x16_f16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Image_conv3x3_1280ch_8x8_f16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Image_conv3x3_1280ch_4x4_f16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Image_conv1x1_640ch_32x32_f16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Image_attention_4096x4096)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Image_attention_4096x77)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Image_attention_1024x1024_d80)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Image_attention_256x256_d160)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Image_attention_4096x4096_1x512)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Image_group_norm_silu_320ch_64x64)->Unit(benchmark::kMillisecond)->UseRealTime();
