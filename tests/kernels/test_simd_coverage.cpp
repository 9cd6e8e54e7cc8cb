// Which SIMD levels this run's kernel tests compare against the scalar
// references (issue 14): every suite loops over available_levels(), which
// leaves out the levels this CPU lacks. A level left out is reported as a
// skip with its reason, so a run on a machine without AVX-512 (or AVX2) does
// not read as full coverage.
#include <gtest/gtest.h>

#include "kernels/test_util.h"

namespace {
bool has(const std::string& level) {
  for (const auto& l : atelier::kernels::testing::available_levels())
    if (l == level) return true;
  return false;
}
}  // namespace

TEST(SimdCoverage, Avx2KernelsAreTestedOnThisMachine) {
  if (!has("avx2")) GTEST_SKIP() << "this CPU has no AVX2+FMA+F16C: the AVX2 kernels were not tested in this run";
  SUCCEED() << "the AVX2 kernels ran against the scalar references";
}

TEST(SimdCoverage, Avx512KernelsAreTestedOnThisMachine) {
  if (!has("avx512"))
    GTEST_SKIP() << "this CPU has no AVX-512 (F, BW, VL, DQ, VNNI): the AVX-512 kernels were not tested in this run";
  SUCCEED() << "the AVX-512 kernels ran against the scalar references";
}
