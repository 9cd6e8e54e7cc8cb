// atelier/splitmix.h — SplitMix64: a cheap, deterministic, platform-independent
// random stream for the synthetic models' weights (the same bytes for a seed
// everywhere: Backend::fill_random's host draw and the engine's `models synth`).
#pragma once

#include <cstdint>

namespace atelier {

struct SplitMix64 {
  uint64_t x;
  uint64_t next() {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float uniform_pm1() { return static_cast<float>(static_cast<double>(next() >> 11) * 0x1.0p-52 - 1.0); }
};

}  // namespace atelier
