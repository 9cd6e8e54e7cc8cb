// Shared plumbing of the matmul variants. Private to kernels/cpu.
#pragma once

#include <atelier/kernels.h>

#include <array>
#include <cstdint>
#include <utility>

namespace atelier::kernels::cpu {

// How a weight type wants its activations: raw f32, Q8_0 blocks (ActQ8_0) or
// Q8_K blocks (BlockQ8_K).
enum class ActKind { f32, q8_0, q8_K };

struct MatmulArgs {
  const WeightView* w = nullptr;
  const float* x = nullptr;  // n_x_rows rows of w->cols floats
  const void* xq = nullptr;  // quantized activations (ActKind q8_0 / q8_K)
  int64_t xq_row_bytes = 0;  // stride of one quantized activation row
  float* y = nullptr;        // n_x_rows rows of w->rows floats
  int64_t m_rows = 0;        // n_x_rows
};

// Computes y[m][r] for every m < m_rows and r in [r0, r1).
using RowsFn = void (*)(const MatmulArgs&, int64_t r0, int64_t r1);

// nullptr when the level has no kernel for the type.
RowsFn rows_fn_scalar(DType t);
RowsFn rows_fn_avx2(DType t);
RowsFn rows_fn_avx512(DType t);

// Weight rows handed to the executor as one unit: divisible by every tile
// height used (1..8), so threads split on tile boundaries.
constexpr int64_t kRowUnit = 24;

// Runs Kernel::tile<NM, NR>(args, m0, r0) over the rows [r0, r1) in tiles of
// at most RM activation rows by RN weight rows. When the whole batch is
// smaller than RM (generation: 1..RM-1 activation rows), the tiles are
// NarrowRN[m_rows - 1] weight rows wide instead: more independent
// accumulators for the latency-bound matrix-vector case. Every tile shape
// performs the same per-(m, r) arithmetic, which is what makes the result
// batch-invariant.
template <class Kernel, int RM, int RN, int... NarrowRN>
struct TileDriver {
  static_assert(sizeof...(NarrowRN) == 0 || sizeof...(NarrowRN) == RM - 1);
  using TileFn = void (*)(const MatmulArgs&, int64_t, int64_t);

  static constexpr int max_rn() {
    int n = RN;
    for (int v : {RN, NarrowRN...}) n = v > n ? v : n;
    return n;
  }
  static constexpr int kN = max_rn();
  // NR used for a batch of m rows
  static constexpr int width(int64_t m_rows) {
    if constexpr (sizeof...(NarrowRN) == 0) return RN;
    else {
      constexpr int narrow[] = {NarrowRN...};
      return m_rows < RM ? narrow[m_rows - 1] : RN;
    }
  }

  template <int... I>
  static constexpr std::array<TileFn, RM * kN> make(std::integer_sequence<int, I...>) {
    return {&Kernel::template tile<I / kN + 1, I % kN + 1>...};
  }
  static constexpr std::array<TileFn, RM * kN> kTable = make(std::make_integer_sequence<int, RM * kN>{});

  static void run(const MatmulArgs& a, int64_t r0, int64_t r1) {
    const int rn = width(a.m_rows);
    for (int64_t r = r0; r < r1; r += rn) {
      const int nr = static_cast<int>(r1 - r < rn ? r1 - r : rn);
      for (int64_t m = 0; m < a.m_rows; m += RM) {
        const int nm = static_cast<int>(a.m_rows - m < RM ? a.m_rows - m : RM);
        kTable[(nm - 1) * kN + (nr - 1)](a, m, r);
      }
    }
  }
};

static inline const char* weight_row(const MatmulArgs& a, int64_t r) {
  return static_cast<const char*>(a.w->data) + r * a.w->row_stride_bytes;
}
static inline const char* act_row(const MatmulArgs& a, int64_t m) {
  return static_cast<const char*>(a.xq) + m * a.xq_row_bytes;
}

}  // namespace atelier::kernels::cpu
