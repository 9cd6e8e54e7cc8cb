// Shared plumbing of the matmul variants. Private to kernels/cpu.
#pragma once

#include <atelier/kernels.h>

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

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
  // Activations re-laid out by the kernel (Kernel::expand), once per call of
  // the driver, so that its tiles load them ready to use; nullptr if unused.
  const void* xe = nullptr;
  int64_t xe_row_bytes = 0;
};

// f(integral_constant<int, 0>) ... f(integral_constant<int, N - 1>): a loop
// over a tile's register arrays with constant indices from the start. GCC 12
// scalarizes an array of vectors only where every index is constant before
// its loop unrolling runs; an array indexed by a plain loop counter stayed in
// memory (a store, often a reload, per accumulator and step).
template <int N, class F>
__attribute__((always_inline)) inline void unroll(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) __attribute__((always_inline)) {
    (f(std::integral_constant<int, I>{}), ...);
  }(std::make_integer_sequence<int, N>{});
}

// Computes y[m][r] for every m < m_rows and r in [r0, r1).
using RowsFn = void (*)(const MatmulArgs&, int64_t r0, int64_t r1);

// nullptr when the level has no kernel for the type.
RowsFn rows_fn_scalar(DType t);
RowsFn rows_fn_avx2(DType t);
RowsFn rows_fn_avx512(DType t);
// The AVX-512 tile for WeightLayout::q8_0x16 (r0, r1 multiples of kPackRows,
// r1 may also be w->rows).
void q8_0x16_rows_avx512(const MatmulArgs& a, int64_t r0, int64_t r1);
// The AVX2 tile for WeightLayout::q8_0x8 (r0, r1 multiples of 8, r1 may also
// be w->rows).
void q8_0x8_rows_avx2(const MatmulArgs& a, int64_t r0, int64_t r1);
// The same for WeightLayout::q4_0x16 (AVX-512 VNNI) and q4_0x8 (AVX2).
void q4_0x16_rows_avx512(const MatmulArgs& a, int64_t r0, int64_t r1);
void q4_0x8_rows_avx2(const MatmulArgs& a, int64_t r0, int64_t r1);
void q4_Kx8_rows_avx2(const MatmulArgs& a, int64_t r0, int64_t r1);
// WeightLayout::q4_Kx16 (AVX-512 VNNI).
void q4_Kx16_rows_avx512(const MatmulArgs& a, int64_t r0, int64_t r1);
void q6_Kx16_rows_avx512(const MatmulArgs& a, int64_t r0, int64_t r1);
// WeightLayout::f32x16 and f16x16 (AVX-512), f16x8 and f32x8 (AVX2).
void f32x16_rows_avx512(const MatmulArgs& a, int64_t r0, int64_t r1);
void f16x16_rows_avx512(const MatmulArgs& a, int64_t r0, int64_t r1);
void f16x8_rows_avx2(const MatmulArgs& a, int64_t r0, int64_t r1);
void f32x8_rows_avx2(const MatmulArgs& a, int64_t r0, int64_t r1);

// Weight rows handed to the executor as one unit: divisible by every tile
// height used (1..8), so threads split on tile boundaries.
constexpr int64_t kRowUnit = 24;
// The same for packed weights: a tile's width of groups of 16 rows, 3 for
// batches of 4 rows or more, 4 for generation (1-3 rows).
constexpr int64_t kPackedRowUnit = 48, kPackedNarrowRowUnit = 64;
// q8_0x8: tiles of 1, 2 or 4 groups of 8 rows.
constexpr int64_t kPackedX8RowUnit = 32;
// Packed floats: tiles of 3 or 6 groups of 16 rows (x16), 2, 3 or 4 of 8 (x8).
constexpr int64_t kPackedFloatRowUnit = 96;

// Kernels may re-lay out the activations once per driver call (e.g. the
// broadcast scales and offsets of the integer dots): `expand_row_bytes(a)`
// and `expand(a, m, dst)` fill a per-thread buffer that the tiles read through
// a.xe. It only precomputes operands, never changes the arithmetic.
template <class Kernel>
concept Expands = requires(const MatmulArgs& a, void* p) {
  Kernel::expand_row_bytes(a);
  Kernel::expand(a, int64_t{0}, p);
};

template <class Kernel, class Fn>
inline void with_expanded(const MatmulArgs& a, Fn&& fn) {
  if constexpr (Expands<Kernel>) {
    thread_local std::vector<unsigned char> buf;
    const int64_t row = (Kernel::expand_row_bytes(a) + 63) / 64 * 64;
    buf.resize(static_cast<size_t>(row * a.m_rows + 64));
    unsigned char* base = buf.data() + ((64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64);
    for (int64_t m = 0; m < a.m_rows; ++m) Kernel::expand(a, m, base + m * row);
    MatmulArgs e = a;
    e.xe = base;
    e.xe_row_bytes = row;
    fn(e);
  } else {
    fn(a);
  }
}

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
  static constexpr int kRows = RM;  // activation rows of a full tile
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

  // Whether run_tiles can ask for an NM x NR tile: NR up to RN, or up to
  // the narrow width when the whole batch is NM < RM rows. Only those are
  // instantiated (the rest of the table is null): about a quarter of the
  // shapes were never run, and compiling them took a fair share of the
  // AVX-512 file's 100 s.
  static constexpr bool reachable(int nm, int nr) {
    if (nr <= RN) return true;
    if constexpr (sizeof...(NarrowRN) == 0) return false;
    else {
      constexpr int narrow[] = {NarrowRN...};
      return nm < RM && nr <= narrow[nm - 1];
    }
  }
  template <int NM, int NR>
  static constexpr TileFn entry() {
    if constexpr (reachable(NM, NR)) return &Kernel::template tile<NM, NR>;
    else return nullptr;
  }
  template <int... I>
  static constexpr std::array<TileFn, RM * kN> make(std::integer_sequence<int, I...>) {
    return {entry<I / kN + 1, I % kN + 1>()...};
  }
  static constexpr std::array<TileFn, RM * kN> kTable = make(std::make_integer_sequence<int, RM * kN>{});

  // With the activations already expanded.
  static void run_tiles(const MatmulArgs& a, int64_t r0, int64_t r1) {
    const int rn = width(a.m_rows);
    for (int64_t r = r0; r < r1; r += rn) {
      const int nr = static_cast<int>(r1 - r < rn ? r1 - r : rn);
      for (int64_t m = 0; m < a.m_rows; m += RM) {
        const int nm = static_cast<int>(a.m_rows - m < RM ? a.m_rows - m : RM);
        kTable[(nm - 1) * kN + (nr - 1)](a, m, r);
      }
    }
  }

  static void run(const MatmulArgs& a, int64_t r0, int64_t r1) {
    with_expanded<Kernel>(a, [&](const MatmulArgs& e) { run_tiles(e, r0, r1); });
  }
};

// Batches of TM rows or more (continuous batching: one row per sequence) in
// tiles of TM activation rows by TN weight rows, so each weight row is read
// for TM activation rows at a time; smaller batches go to Base (a
// TileDriver). The same per-(m, r) arithmetic as Base's tiles.
template <class Kernel, int TM, int TN, class Base>
struct TallTileDriver {
  using TileFn = void (*)(const MatmulArgs&, int64_t, int64_t);
  template <int... I>
  static constexpr std::array<TileFn, TM * TN> make(std::integer_sequence<int, I...>) {
    return {&Kernel::template tile<I / TN + 1, I % TN + 1>...};
  }
  static constexpr std::array<TileFn, TM * TN> kTable = make(std::make_integer_sequence<int, TM * TN>{});

  static void run(const MatmulArgs& a, int64_t r0, int64_t r1) {
    with_expanded<Kernel>(a, [&](const MatmulArgs& e) {
      if (e.m_rows < TM) return Base::run_tiles(e, r0, r1);
      for (int64_t r = r0; r < r1; r += TN) {
        const int nr = static_cast<int>(r1 - r < TN ? r1 - r : TN);
        for (int64_t m = 0; m < e.m_rows; m += TM) {
          const int nm = static_cast<int>(e.m_rows - m < TM ? e.m_rows - m : TM);
          kTable[(nm - 1) * TN + (nr - 1)](e, m, r);
        }
      }
    });
  }
};

static inline const char* weight_row(const MatmulArgs& a, int64_t r) {
  return static_cast<const char*>(a.w->data) + r * a.w->row_stride_bytes;
}
static inline const char* act_row(const MatmulArgs& a, int64_t m) {
  return static_cast<const char*>(a.xq) + m * a.xq_row_bytes;
}

}  // namespace atelier::kernels::cpu
