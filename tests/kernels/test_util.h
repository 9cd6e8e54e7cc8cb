// Helpers shared by the kernel tests: a thread-splitting Executor, SIMD level
// switching, random data.
#pragma once

#include <atelier/kernels.h>

#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../../kernels/cpu/simd.h"

namespace atelier::kernels::testing {

// Splits [0, n) into `threads` deliberately uneven contiguous ranges and runs
// each on its own std::thread.
class TestExecutor : public Executor {
 public:
  explicit TestExecutor(int threads) : threads_(threads) {}
  int threads() const override { return threads_; }
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) override {
    std::vector<int64_t> cut{0};
    for (int t = 1; t < threads_; ++t) cut.push_back(std::min<int64_t>(n, n * t * t / (threads_ * threads_)));
    cut.push_back(n);
    std::vector<std::thread> pool;
    for (size_t i = 0; i + 1 < cut.size(); ++i)
      if (cut[i] < cut[i + 1]) pool.emplace_back([&, i] { fn(cut[i], cut[i + 1]); });
    for (auto& t : pool) t.join();
  }

 private:
  int threads_;
};

// The SIMD levels this CPU can run, widest last.
inline std::vector<std::string> available_levels() {
  std::vector<std::string> out{"scalar"};
  const auto hw = cpu::detected_simd();
  if (hw >= cpu::Simd::avx2) out.push_back("avx2");
  if (hw >= cpu::Simd::avx512) out.push_back("avx512");
  return out;
}

// Caps the SIMD level for the lifetime of the object.
class ScopedSimd {
 public:
  explicit ScopedSimd(const std::string& level) { cpu::set_simd_level_for_testing(level); }
  ~ScopedSimd() { cpu::set_simd_level_for_testing(""); }
};

inline std::vector<float> random_floats(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& f : v) f = dist(rng);
  return v;
}

}  // namespace atelier::kernels::testing
