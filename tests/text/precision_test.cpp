// The mixed-precision policy (engine/src/text/precision.h), row by row of
// its table: the CPU keeps every file type; a GPU turns float matrices into
// BF16 (FP16 below sm_80, or as asked), FP8 E4M3 only where the device has
// FP8; the five common quantized types stay quantized; others become the
// float product type; refusals name what would run.
#include <gtest/gtest.h>

#include "core/error.h"
#include "text/precision.h"

using namespace atelier;
using namespace atelier::text;
using kernels::DType;

namespace {

DeviceCaps gpu(int cc) {
  DeviceCaps c;
  c.gpu = true;
  c.compute_capability = cc;
  return c;
}

std::string refusal(const DeviceCaps& caps, PrecisionChoice p, KvType kv = KvType::F16) {
  try {
    precision_plan(caps, p, kv);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::InvalidArgument);
    return e.what();
  }
  return "";
}

}  // namespace

TEST(PrecisionPolicy, TheCpuComputesInEveryFilesOwnTypes) {
  const PrecisionPlan p = precision_plan({}, PrecisionChoice::Auto, KvType::F16);
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_K, DType::Q2_K})
    EXPECT_EQ(p.matrix(t), MatrixPrecision::File) << kernels::dtype_name(t);
  EXPECT_EQ(p.activations, DType::F32);
  EXPECT_EQ(p.matrix_bytes(DType::F32, 3, 64), 3 * 64 * 4);
  EXPECT_EQ(precision_label(p), "weights:file act:f32 kv:f16 acc:f32");
  // F32 KV stays a CPU option.
  EXPECT_EQ(precision_plan({}, PrecisionChoice::Auto, KvType::F32).kv, KvType::F32);
}

TEST(PrecisionPolicy, TheCpuRefusesGpuPrecisionsNamingWhatRuns) {
  for (PrecisionChoice c : {PrecisionChoice::BF16, PrecisionChoice::FP16, PrecisionChoice::FP8}) {
    const std::string why = refusal({}, c);
    EXPECT_NE(why.find(std::string("--precision ") + precision_choice_name(c)), std::string::npos) << why;
    EXPECT_NE(why.find("--precision auto"), std::string::npos) << why;
  }
}

TEST(PrecisionPolicy, AGpuRunsFloatMatricesInBf16AndKeepsTheCommonQuantizedTypes) {
  const PrecisionPlan p = precision_plan(gpu(90), PrecisionChoice::Auto, KvType::F16);
  for (DType t : {DType::F32, DType::F16, DType::BF16}) EXPECT_EQ(p.matrix(t), MatrixPrecision::BF16);
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K})
    EXPECT_EQ(p.matrix(t), MatrixPrecision::File) << kernels::dtype_name(t);
  // Types without a fused GPU product are dequantized to the float type at load.
  for (DType t : {DType::Q2_K, DType::Q3_K, DType::Q4_1, DType::Q5_0})
    EXPECT_EQ(p.matrix(t), MatrixPrecision::BF16) << kernels::dtype_name(t);
  EXPECT_EQ(p.activations, DType::BF16);
  // A 4096 x 4096 F32 matrix takes half its file bytes; a Q4_K one its own.
  EXPECT_EQ(p.matrix_bytes(DType::F32, 4096, 4096), int64_t{4096} * 4096 * 2);
  EXPECT_EQ(p.matrix_bytes(DType::Q4_K, 4096, 4096), int64_t{4096} * 16 * 144);
  EXPECT_EQ(precision_label(p), "weights:bf16 quant:kept act:bf16 kv:f16 acc:f32");
}

TEST(PrecisionPolicy, OlderGpusGetFp16AndBf16IsRefusedThere) {
  const PrecisionPlan p = precision_plan(gpu(75), PrecisionChoice::Auto, KvType::F16);
  EXPECT_EQ(p.matrix(DType::F32), MatrixPrecision::FP16);
  EXPECT_EQ(p.activations, DType::F16);
  EXPECT_NE(refusal(gpu(75), PrecisionChoice::BF16).find("--precision fp16"), std::string::npos);
  EXPECT_EQ(precision_plan(gpu(90), PrecisionChoice::FP16, KvType::Q8_0).matrix(DType::BF16), MatrixPrecision::FP16);
}

TEST(PrecisionPolicy, Fp8IsE4m3WithRowScalesOnlyWhereTheDeviceHasFp8) {
  for (int cc : {89, 90}) {
    const PrecisionPlan p = precision_plan(gpu(cc), PrecisionChoice::FP8, KvType::F16);
    EXPECT_EQ(p.matrix(DType::F32), MatrixPrecision::FP8_E4M3);
    EXPECT_EQ(p.matrix(DType::Q6_K), MatrixPrecision::File);  // a quantized file stays as it is
    EXPECT_EQ(p.activations, DType::BF16);
    // A byte each and a 16-byte header (the f32 scale) per row: DType::E4M3_ROWS, what the CUDA module allocates.
    EXPECT_EQ(p.matrix_bytes(DType::F16, 10, 64), 10 * 64 + 10 * 16);
    EXPECT_EQ(p.matrix_bytes(DType::F16, 10, 64), 10 * kernels::dtype_row_bytes(DType::E4M3_ROWS, 64));
  }
  for (int cc : {80, 86}) {
    const std::string why = refusal(gpu(cc), PrecisionChoice::FP8);
    EXPECT_NE(why.find("8.9"), std::string::npos) << why;
    EXPECT_NE(why.find(std::to_string(cc / 10) + "." + std::to_string(cc % 10)), std::string::npos) << why;
  }
}

TEST(PrecisionPolicy, AGpuKeepsItsKvInF16OrQ8) {
  EXPECT_EQ(precision_plan(gpu(90), PrecisionChoice::Auto, KvType::Q8_0).kv, KvType::Q8_0);
  EXPECT_NE(refusal(gpu(90), PrecisionChoice::Auto, KvType::F32).find("f16"), std::string::npos);
}

// --kv-type bf16 / fp8 are a GPU's (the CPU's attention reads f32, f16 and
// q8_0 caches): the CPU refuses them naming what to use, as a GPU refuses f32.
TEST(PrecisionPolicy, TheCpuRefusesBf16AndFp8KvNamingWhatToUse) {
  for (KvType kv : {KvType::BF16, KvType::FP8}) {
    const std::string why = refusal({}, PrecisionChoice::Auto, kv);
    EXPECT_NE(why.find(std::string("--kv-type ") + (kv == KvType::BF16 ? "bf16" : "fp8") + " is for a GPU"),
              std::string::npos) << why;
    EXPECT_NE(why.find("--kv-type f16"), std::string::npos) << why;
    const PrecisionPlan p = precision_plan(gpu(80), PrecisionChoice::Auto, kv);
    EXPECT_EQ(p.kv, kv);
    EXPECT_EQ(precision_label(p), std::string("weights:bf16 quant:kept act:bf16 kv:") +
                                      (kv == KvType::BF16 ? "bf16" : "fp8") + " acc:f32");
  }
  EXPECT_NE(refusal(gpu(90), PrecisionChoice::Auto, KvType::F32).find("fp8"), std::string::npos);
}

TEST(PrecisionPolicy, ChoicesByName) {
  PrecisionChoice c;
  for (const char* n : {"auto", "bf16", "fp16", "fp8"}) {
    ASSERT_TRUE(precision_choice_from_name(n, &c)) << n;
    EXPECT_STREQ(precision_choice_name(c), n);
  }
  EXPECT_FALSE(precision_choice_from_name("fp4", &c));
}
