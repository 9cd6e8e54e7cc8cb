// Run-time SIMD level selection. Private to kernels/cpu (and its tests).
#pragma once

#include <string_view>

namespace atelier::kernels::cpu {

enum class Simd : int { scalar = 0, avx2 = 1, avx512 = 2 };

// The level the dispatchers use now: the widest this CPU supports, capped by
// ATELIER_SIMD (read once) or by set_simd_level_for_testing. One relaxed
// atomic load after the first call.
Simd active_simd();
// The widest level this CPU (and OS) supports, ignoring any cap.
Simd detected_simd();
std::string_view simd_name(Simd s);

// Where the packed float tile prefetches its weights (matmul_float_packed_x86.inc):
// 16 lines ahead in the same group into L1 (faster on a Granite Rapids), or
// the next tile's lines into L2 (faster on a Zen 4). Picked by CPU vendor,
// AMD -> next_tile; ATELIER_PREFETCH=near|next_tile overrides (read once).
enum class FloatPrefetch : int { near = 0, next_tile = 1 };
FloatPrefetch float_prefetch();

// Test hook: "scalar", "avx2" or "avx512" caps the level (never above what the
// CPU supports); "" restores the default. Returns the level now active.
Simd set_simd_level_for_testing(std::string_view level);

}  // namespace atelier::kernels::cpu
