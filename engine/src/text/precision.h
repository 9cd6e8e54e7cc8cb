// The mixed-precision policy, in one place (issue 33): what each weight type
// of a GGUF file computes in on each kind of device, and what stays FP32.
//
//   device          weights in the file          products                         accumulate
//   the CPU         every type                   the file's own type (as today)   f32
//   a GPU, auto     F32 / F16 / BF16 matrices    BF16 (FP16 below sm_80)          f32
//   --precision bf16                             BF16 (needs sm_80+)              f32
//   --precision fp16                             FP16                             f32
//   --precision fp8                              E4M3, one f32 scale per row      f32
//                                                (needs FP8: sm_89+, Ada/Hopper)
//   a GPU, any      Q8_0 Q4_0 Q4_K Q5_K Q6_K     stay quantized (dequantized      f32
//                                                inside the product)
//   a GPU, any      other quantized types        the float product type above,
//                                                dequantized at load
//
// Whatever the weights: norms, softmax, RoPE, residual sums and sampling
// probabilities in FP32; logits F32. Activations: F32 on the CPU, the
// product type (BF16 or FP16; BF16 for FP8 weights) on a GPU. KV cache: the
// configured type (F16 by default; Q8_0 as an option; F32 on the CPU only).
//
// A job records precision_label() of its plan beside the model digest, the
// device and the engine build.
#pragma once

#include <atelier/backend.h>
#include <atelier/requests.h>

#include <string>

namespace atelier::text {

// --precision.
enum class PrecisionChoice { Auto, BF16, FP16, FP8 };
const char* precision_choice_name(PrecisionChoice p);  // "auto", "bf16", "fp16", "fp8"
bool precision_choice_from_name(const std::string& name, PrecisionChoice* p);

// What a device computes products in, read from its DeviceInfo.
struct DeviceCaps {
  bool gpu = false;             // not host memory: the GPU rows of the table
  int compute_capability = 0;   // CUDA major * 10 + minor (80 Ampere, 89 Ada, 90 Hopper); 0: unknown / not CUDA
  bool bf16() const { return compute_capability == 0 || compute_capability >= 80; }
  bool fp8() const { return compute_capability >= 89; }
};
DeviceCaps device_caps(const kernels::DeviceInfo& info);

// What one matrix's products run in.
enum class MatrixPrecision { File, BF16, FP16, FP8_E4M3 };
const char* matrix_precision_name(MatrixPrecision m);  // "file", "bf16", "fp16", "fp8-e4m3"

// The quantized types a GPU keeps quantized (the common Q4_K_M, Q5_K_M,
// Q6_K and Q8_0 files' types).
bool gpu_keeps_quantized(kernels::DType t);

// The policy of one device and choice: the float matrices' product type,
// activations, KV. Throws atelier::Error (InvalidArgument) when the choice
// cannot run there, naming what would: fp8 on a device without FP8, bf16
// below sm_80, bf16/fp16/fp8 on the CPU.
struct PrecisionPlan {
  bool gpu = false;
  MatrixPrecision floats = MatrixPrecision::File;  // F32 / F16 / BF16 matrices
  kernels::DType activations = kernels::DType::F32;
  KvType kv = KvType::F16;
  // What a matrix of the file's type T computes in.
  MatrixPrecision matrix(kernels::DType t) const;
  // Bytes a rows x cols matrix of the file's type T takes on the device (FP8:
  // a byte per element and a 16-byte header, its f32 scale, per row).
  int64_t matrix_bytes(kernels::DType t, int64_t rows, int64_t cols) const;
};
PrecisionPlan precision_plan(const DeviceCaps& caps, PrecisionChoice choice, KvType kv);

// The backend's side of a plan (Backend::set_weight_precision): the float
// matrices' product type (BF16 for a CPU plan, which the CPU ignores).
kernels::WeightPrecision weight_precision(const PrecisionPlan& plan);

// What a model load on `be` computes in for --precision `choice` (a name of
// PrecisionChoice): the plan of be's device, handed to be (set_weight_precision)
// before any matrix is prepared. Throws atelier::Error (InvalidArgument)
// for an unknown name or a choice the device cannot run (precision_plan's
// message: fp8 on a device without FP8 names what would run).
PrecisionPlan apply_precision(kernels::Backend& be, const std::string& choice, KvType kv);

// One line for job records, --json and /props: "weights:file act:f32 kv:f16 acc:f32" on
// the CPU; "weights:bf16 quant:kept act:bf16 kv:f16 acc:f32" on a GPU.
std::string precision_label(const PrecisionPlan& plan);

}  // namespace atelier::text
