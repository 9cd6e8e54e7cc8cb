// Element types of tensors in Hugging Face safetensors files and PyTorch
// checkpoints. Every type such a file may hold is listed, so a reader can
// open a file that also carries, say, int64 position ids; only F32, F16 and
// BF16 are supported for math (supported_for_math), and kernel_dtype() maps
// exactly those to the kernels' DType.
#pragma once

#include <atelier/kernels.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace atelier::formats {

enum class ElemType {
  F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U64, U32, U16, U8, BOOL,
};

// Bytes per element (1..8).
uint32_t elem_size(ElemType t);
// The safetensors spelling: "F32", "BF16", "I64", ...
std::string_view elem_name(ElemType t);
// Parses a safetensors dtype string; nullopt for an unknown one.
std::optional<ElemType> elem_from_name(std::string_view name);
bool supported_for_math(ElemType t);  // F32, F16, BF16
// The kernels' DType for a supported type; nullopt otherwise.
std::optional<kernels::DType> kernel_dtype(ElemType t);

// a * b, or false when it overflows int64 (both must be >= 0).
inline bool mul_overflows(int64_t a, int64_t b, int64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace atelier::formats
