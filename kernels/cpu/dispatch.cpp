// Picks the SIMD level once: CPU features (via __builtin_cpu_supports, which
// also checks that the OS saves the wide registers) capped by ATELIER_SIMD.
#include "simd.h"

#include <atelier/kernels.h>

#include <cpuid.h>

#include <atomic>
#include <cstdlib>

namespace atelier::kernels {
namespace cpu {
namespace {

std::atomic<int> g_level{-1};

Simd parse_cap(std::string_view s, Simd fallback) {
  if (s == "scalar") return Simd::scalar;
  if (s == "avx2") return Simd::avx2;
  if (s == "avx512") return Simd::avx512;
  return fallback;
}

Simd capped(Simd want) {
  const Simd hw = detected_simd();
  return static_cast<int>(want) < static_cast<int>(hw) ? want : hw;
}

}  // namespace

Simd detected_simd() {
  static const Simd level = [] {
    __builtin_cpu_init();
    // F16C through CPUID: clang 14's __builtin_cpu_supports does not know "f16c" (the fuzz build uses clang).
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                        __builtin_cpu_supports("avx512vnni");
    return avx512 ? Simd::avx512 : avx2 ? Simd::avx2 : Simd::scalar;
  }();
  return level;
}

Simd active_simd() {
  int level = g_level.load(std::memory_order_relaxed);
  if (level < 0) {
    const char* env = std::getenv("ATELIER_SIMD");
    level = static_cast<int>(capped(parse_cap(env ? env : "", Simd::avx512)));
    g_level.store(level, std::memory_order_relaxed);
  }
  return static_cast<Simd>(level);
}

FloatPrefetch float_prefetch() {
  static const FloatPrefetch style = [] {
    const char* env = std::getenv("ATELIER_PREFETCH");
    const std::string_view v = env ? env : "";
    if (v == "near") return FloatPrefetch::near;
    if (v == "next_tile") return FloatPrefetch::next_tile;
    __builtin_cpu_init();
    return __builtin_cpu_is("amd") ? FloatPrefetch::next_tile : FloatPrefetch::near;
  }();
  return style;
}

std::string_view simd_name(Simd s) {
  switch (s) {
    case Simd::avx512: return "avx512";
    case Simd::avx2: return "avx2";
    case Simd::scalar: return "scalar";
  }
  return "scalar";
}

Simd set_simd_level_for_testing(std::string_view level) {
  g_level.store(-1, std::memory_order_relaxed);
  if (level.empty()) return active_simd();
  const Simd s = capped(parse_cap(level, Simd::avx512));
  g_level.store(static_cast<int>(s), std::memory_order_relaxed);
  return s;
}

}  // namespace cpu

std::string_view simd_level() { return cpu::simd_name(cpu::active_simd()); }

}  // namespace atelier::kernels
