#include "formats/tensor_types.h"

#include <array>
#include <utility>

namespace atelier::formats {

namespace {
struct Info {
  ElemType type;
  std::string_view name;
  uint32_t size;
};
constexpr std::array<Info, 15> kInfo = {{
    {ElemType::F64, "F64", 8},     {ElemType::F32, "F32", 4},         {ElemType::F16, "F16", 2},
    {ElemType::BF16, "BF16", 2},   {ElemType::F8_E4M3, "F8_E4M3", 1}, {ElemType::F8_E5M2, "F8_E5M2", 1},
    {ElemType::I64, "I64", 8},     {ElemType::I32, "I32", 4},         {ElemType::I16, "I16", 2},
    {ElemType::I8, "I8", 1},       {ElemType::U64, "U64", 8},         {ElemType::U32, "U32", 4},
    {ElemType::U16, "U16", 2},     {ElemType::U8, "U8", 1},           {ElemType::BOOL, "BOOL", 1},
}};
const Info& info(ElemType t) {
  for (const Info& i : kInfo)
    if (i.type == t) return i;
  return kInfo[1];  // unreachable for a valid enum value
}
}  // namespace

uint32_t elem_size(ElemType t) { return info(t).size; }
std::string_view elem_name(ElemType t) { return info(t).name; }

std::optional<ElemType> elem_from_name(std::string_view name) {
  for (const Info& i : kInfo)
    if (i.name == name) return i.type;
  return std::nullopt;
}

bool supported_for_math(ElemType t) { return t == ElemType::F32 || t == ElemType::F16 || t == ElemType::BF16; }

std::optional<kernels::DType> kernel_dtype(ElemType t) {
  switch (t) {
    case ElemType::F32: return kernels::DType::F32;
    case ElemType::F16: return kernels::DType::F16;
    case ElemType::BF16: return kernels::DType::BF16;
    default: return std::nullopt;
  }
}

}  // namespace atelier::formats
