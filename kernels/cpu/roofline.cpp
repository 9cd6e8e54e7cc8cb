// Measures the two roofs a benchmark compares against: streaming memory
// bandwidth and peak FMA throughput. Measured in the same run as the
// benchmark because this machine is shared and its figures drift.
#include <atelier/kernels.h>

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

namespace atelier::kernels {

namespace {
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void run(Executor* ex, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (ex) ex->parallel_for(n, fn);
  else fn(0, n);
}

// Independent accumulator chains hide the FMA latency (4 cycles, 2 ports).
constexpr int kChains = 12;

__attribute__((target("avx512f"))) float fma_loop_avx512(int64_t iters) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(0.01f * static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  // Not _mm512_reduce_add_ps: GCC 12 warns inside its own header for it.
  float out[16];
  _mm512_storeu_ps(out, s);
  float r = 0;
  for (float v : out) r += v;
  return r;
}

__attribute__((target("avx2,fma"))) float fma_loop_avx2(int64_t iters) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(0.01f * static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  __m256 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm256_add_ps(s, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  float r = 0;
  for (float v : out) r += v;
  return r;
}

// int8 dots: 64 multiply-adds per dpbusd, 32 per maddubs + madd + add.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) int dot_loop_avx512(int64_t iters) {
  __m512i acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  int out[16];
  __m512i s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_epi32(s, acc[i]);
  _mm512_storeu_si512(out, s);
  // Lanes wrap (defined for SIMD adds); summed the same way, unsigned, not as int (UB on overflow).
  uint32_t r = 0;
  for (int v : out) r += static_cast<uint32_t>(v);
  return static_cast<int>(r);
}

__attribute__((target("avx2"))) int dot_loop_avx2(int64_t iters) {
  __m256i acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_epi32(i);
  const __m256i a = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
  // Each chain's own bytes are the signed operand: with a constant one the
  // compiler hoisted maddubs + madd out of the loop, and the "peak" was
  // three adds a cycle (3.3x what any dot reaches). 12 chains of 11 cycles'
  // latency still keep the two multiply ports busy.
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kChains; ++i)
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(a, acc[i]), ones));
  int out[8];
  __m256i s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm256_add_epi32(s, acc[i]);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), s);
  // Lanes wrap (defined for SIMD adds); summed the same way, unsigned, not as int (UB on overflow).
  uint32_t r = 0;
  for (int v : out) r += static_cast<uint32_t>(v);
  return static_cast<int>(r);
}

float fma_loop_scalar(int64_t iters) {
  float acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = 0.01f * static_cast<float>(i);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kChains; ++i) acc[i] = acc[i] * 0.999999f + 1e-7f;
  float r = 0;
  for (float v : acc) r += v;
  return r;
}
}  // namespace

double measure_memory_bandwidth_gb_per_s(Executor* ex, int64_t bytes) {
  const int64_t n = std::max<int64_t>(bytes / 8, 1 << 20);
  std::unique_ptr<uint64_t[]> buf(new uint64_t[static_cast<size_t>(n)]);
  run(ex, n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) buf[static_cast<size_t>(i)] = static_cast<uint64_t>(i);  // fault pages in
  });
  const int threads = ex ? ex->threads() : 1;
  std::vector<uint64_t> sinks(static_cast<size_t>(threads) * 8, 0);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    run(ex, n, [&](int64_t b, int64_t e) {
      // Four independent sums so the loop is load-bound, not add-latency-bound.
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      int64_t i = b;
      for (; i + 4 <= e; i += 4) {
        s0 += buf[static_cast<size_t>(i)];
        s1 += buf[static_cast<size_t>(i + 1)];
        s2 += buf[static_cast<size_t>(i + 2)];
        s3 += buf[static_cast<size_t>(i + 3)];
      }
      for (; i < e; ++i) s0 += buf[static_cast<size_t>(i)];
      size_t slot = static_cast<size_t>(b * threads / n) * 8;
      sinks[slot] += s0 + s1 + s2 + s3;
    });
    double s = seconds_since(t0);
    best = std::max(best, static_cast<double>(n) * 8 / s / 1e9);
  }
  volatile uint64_t keep = 0;
  for (uint64_t v : sinks) keep = keep + v;
  (void)keep;
  return best;
}

namespace {
// Best of 3 runs of loop() once per thread, in giga-operations per second;
// loop() performs ops_per_loop operations and returns a value kept alive so
// the compiler cannot drop the work.
double best_gops(Executor* ex, double ops_per_loop, const std::function<double()>& loop) {
  const int threads = ex ? ex->threads() : 1;
  std::vector<double> sinks(static_cast<size_t>(threads), 0);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = Clock::now();
    run(ex, threads, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) sinks[static_cast<size_t>(t)] = loop();
    });
    best = std::max(best, ops_per_loop * threads / seconds_since(t0) / 1e9);
  }
  volatile double keep = 0;
  for (double v : sinks) keep = keep + v;
  (void)keep;
  return best;
}
}  // namespace

double measure_peak_gflop_per_s(Executor* ex) {
  const std::string_view level = simd_level();
  const int lanes = level == "avx512" ? 16 : level == "avx2" ? 8 : 1;
  const int64_t iters = level == "scalar" ? 2'000'000 : 4'000'000;
  return best_gops(ex, 2.0 * lanes * kChains * static_cast<double>(iters), [&]() -> double {
    return level == "avx512" ? fma_loop_avx512(iters) : level == "avx2" ? fma_loop_avx2(iters) : fma_loop_scalar(iters);
  });
}

double measure_peak_int8_gop_per_s(Executor* ex) {
  const std::string_view level = simd_level();
  if (level == "scalar") return measure_peak_gflop_per_s(ex);
  const int macs = level == "avx512" ? 64 : 32;  // per instruction (group)
  const int64_t iters = 4'000'000;
  return best_gops(ex, 2.0 * macs * kChains * static_cast<double>(iters), [&]() -> double {
    return level == "avx512" ? dot_loop_avx512(iters) : dot_loop_avx2(iters);
  });
}

}  // namespace atelier::kernels
