// The mixed-precision policy (precision.h).
#include "text/precision.h"

#include "core/error.h"

namespace atelier::text {

using kernels::DType;

const char* precision_choice_name(PrecisionChoice p) {
  switch (p) {
    case PrecisionChoice::Auto: return "auto";
    case PrecisionChoice::BF16: return "bf16";
    case PrecisionChoice::FP16: return "fp16";
    case PrecisionChoice::FP8: return "fp8";
  }
  return "auto";
}

bool precision_choice_from_name(const std::string& name, PrecisionChoice* p) {
  for (PrecisionChoice c : {PrecisionChoice::Auto, PrecisionChoice::BF16, PrecisionChoice::FP16, PrecisionChoice::FP8})
    if (name == precision_choice_name(c)) return *p = c, true;
  return false;
}

DeviceCaps device_caps(const kernels::DeviceInfo& info) {
  DeviceCaps c;
  c.gpu = !info.host_memory;
  c.compute_capability = info.compute_capability;
  return c;
}

const char* matrix_precision_name(MatrixPrecision m) {
  switch (m) {
    case MatrixPrecision::File: return "file";
    case MatrixPrecision::BF16: return "bf16";
    case MatrixPrecision::FP16: return "fp16";
    case MatrixPrecision::FP8_E4M3: return "fp8-e4m3";
  }
  return "file";
}

bool gpu_keeps_quantized(DType t) {
  return t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
}

MatrixPrecision PrecisionPlan::matrix(DType t) const {
  if (!gpu) return MatrixPrecision::File;
  if (gpu_keeps_quantized(t)) return MatrixPrecision::File;
  return floats;  // F32 / F16 / BF16, and the quantized types a GPU does not keep
}

int64_t PrecisionPlan::matrix_bytes(DType t, int64_t rows, int64_t cols) const {
  switch (matrix(t)) {
    case MatrixPrecision::File: return rows * dtype_row_bytes(t, cols);
    case MatrixPrecision::BF16:
    case MatrixPrecision::FP16: return rows * cols * 2;
    case MatrixPrecision::FP8_E4M3: return rows * (cols + kernels::kE4M3RowHeaderBytes);  // DType::E4M3_ROWS
  }
  return rows * dtype_row_bytes(t, cols);
}

PrecisionPlan precision_plan(const DeviceCaps& caps, PrecisionChoice choice, KvType kv) {
  PrecisionPlan p;
  p.gpu = caps.gpu;
  p.kv = kv;
  if (!caps.gpu) {
    if (choice != PrecisionChoice::Auto)
      throw InvalidArgumentError(std::string("--precision ") + precision_choice_name(choice) +
                                 " is for a GPU: the CPU computes in each file's own weight types (use --precision auto, "
                                 "or a quantized file such as Q8_0 for a smaller, faster model)");
    if (kv == KvType::BF16 || kv == KvType::FP8)
      throw InvalidArgumentError(std::string("--kv-type ") + (kv == KvType::BF16 ? "bf16" : "fp8") +
                                 " is for a GPU: the CPU keeps its KV cache in f16 (default), f32 or q8_0 (half of "
                                 "f16's memory); use --kv-type f16 or q8_0, or --device cuda");
    return p;  // file types, F32 activations
  }
  if (kv == KvType::F32)
    throw InvalidArgumentError(
        "--kv-type f32 is for the CPU: a GPU keeps its KV cache in f16 (default), bf16, q8_0 or fp8");
  const std::string cc = std::to_string(caps.compute_capability / 10) + "." + std::to_string(caps.compute_capability % 10);
  switch (choice) {
    case PrecisionChoice::Auto: p.floats = caps.bf16() ? MatrixPrecision::BF16 : MatrixPrecision::FP16; break;
    case PrecisionChoice::BF16:
      if (!caps.bf16())
        throw InvalidArgumentError("--precision bf16 needs a GPU of compute capability 8.0 or newer (this one is " + cc +
                                   "); use --precision fp16");
      p.floats = MatrixPrecision::BF16;
      break;
    case PrecisionChoice::FP16: p.floats = MatrixPrecision::FP16; break;
    case PrecisionChoice::FP8:
      if (!caps.fp8())
        throw InvalidArgumentError("--precision fp8 needs a GPU with FP8 (compute capability 8.9 or newer: Ada, Hopper; this one is " +
                                   cc + "); use --precision auto (bf16/fp16) or a Q8_0 file");
      p.floats = MatrixPrecision::FP8_E4M3;
      break;
  }
  p.activations = p.floats == MatrixPrecision::FP16 ? DType::F16 : DType::BF16;
  return p;
}


std::string precision_label(const PrecisionPlan& p) {
  std::string s = std::string("weights:") + matrix_precision_name(p.floats);
  if (p.gpu) s += " quant:kept";
  s += std::string(" act:") + std::string(kernels::dtype_name(p.activations)) + " kv:" + kv_type_name(p.kv) + " acc:f32";
  return s;
}

kernels::WeightPrecision weight_precision(const PrecisionPlan& plan) {
  switch (plan.floats) {
    case MatrixPrecision::FP16: return kernels::WeightPrecision::fp16;
    case MatrixPrecision::FP8_E4M3: return kernels::WeightPrecision::fp8_e4m3;
    default: return kernels::WeightPrecision::bf16;
  }
}

PrecisionPlan apply_precision(kernels::Backend& be, const std::string& choice, KvType kv) {
  PrecisionChoice c;
  if (!precision_choice_from_name(choice.empty() ? "auto" : choice, &c))
    throw InvalidArgumentError("--precision must be auto, bf16, fp16 or fp8 (got '" + choice + "')");
  const PrecisionPlan plan = precision_plan(device_caps(be.device()), c, kv);
  if (plan.gpu) be.set_weight_precision(weight_precision(plan));
  return plan;
}

}  // namespace atelier::text

namespace atelier {

// The API's KV type names (requests.h), defined here so that the text
// library's labels and the API spell them one way.
const char* kv_type_name(KvType t) {
  switch (t) {
    case KvType::F32: return "f32";
    case KvType::F16: return "f16";
    case KvType::Q8_0: return "q8_0";
    case KvType::BF16: return "bf16";
    case KvType::FP8: return "fp8";
  }
  return "f16";
}

bool kv_type_from_name(const std::string& name, KvType* t) {
  for (KvType k : {KvType::F32, KvType::F16, KvType::Q8_0, KvType::BF16, KvType::FP8})
    if (name == kv_type_name(k)) return *t = k, true;
  return false;
}

}  // namespace atelier
