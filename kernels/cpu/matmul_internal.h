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
// at most RM activation rows by RN weight rows. Every tile shape performs the
// same per-(m, r) arithmetic, which is what makes the result batch-invariant.
template <class Kernel, int RM, int RN>
struct TileDriver {
  using TileFn = void (*)(const MatmulArgs&, int64_t, int64_t);

  template <int... I>
  static constexpr std::array<TileFn, RM * RN> make(std::integer_sequence<int, I...>) {
    return {&Kernel::template tile<I / RN + 1, I % RN + 1>...};
  }
  static constexpr std::array<TileFn, RM * RN> kTable = make(std::make_integer_sequence<int, RM * RN>{});

  static void run(const MatmulArgs& a, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r += RN) {
      const int nr = static_cast<int>(r1 - r < RN ? r1 - r : RN);
      for (int64_t m = 0; m < a.m_rows; m += RM) {
        const int nm = static_cast<int>(a.m_rows - m < RM ? a.m_rows - m : RM);
        kTable[(nm - 1) * RN + (nr - 1)](a, m, r);
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
