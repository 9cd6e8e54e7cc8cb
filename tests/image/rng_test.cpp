// TorchRandn against the PyTorch randn vectors in
// fixtures/rng/torch_randn_vectors.json, with the file's tolerances: CUDA
// values within 5e-6 per element, CPU values bit-exact.
#include <gtest/gtest.h>
#include <openssl/sha.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "image/rng.h"

using atelier::image::CpuKernel;
using atelier::image::CudaGrid;
using atelier::image::RngKind;
using atelier::image::TorchRandn;
using nlohmann::json;

namespace {

constexpr double kCudaAtol = 5e-6;

const json& vectors() {
  static const json j = [] {
    std::ifstream f(ATELIER_FIXTURES_DIR "/rng/torch_randn_vectors.json");
    if (!f) return json();
    return json::parse(f);
  }();
  return j;
}

// SHA-256 from OpenSSL, for the files' sha256_f32le digests.
std::string sha256_hex(const void* data, size_t len) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(static_cast<const unsigned char*>(data), len, digest);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : digest) {
    out += hex[c >> 4];
    out += hex[c & 15];
  }
  return out;
}

int64_t numel_of(const json& c) {
  int64_t n = 1;
  for (const auto& d : c.at("shape")) n *= d.get<int64_t>();
  return n;
}

std::string describe(const json& c) {
  std::string s = c.at("generator").get<std::string>() + " seed " + std::to_string(c.at("seed").get<uint64_t>()) +
                  " shape " + c.at("shape").dump();
  if (c.contains("call_index")) s += " call " + std::to_string(c.at("call_index").get<int>());
  if (c.contains("cpu_kernel")) s += " kernel " + c.at("cpu_kernel").get<std::string>();
  if (c.contains("gpu_grid")) s += " sms " + std::to_string(c.at("gpu_grid").at("sm_count").get<int>());
  return s;
}

// Replays the case's generator history and returns the call's full output.
std::vector<float> produce(const json& cases, size_t pos) {
  const json& c = cases[pos];
  const bool cuda = c.at("generator") == "cuda_philox";
  CudaGrid grid;
  if (c.contains("gpu_grid")) {
    grid.sm_count = c["gpu_grid"].at("sm_count").get<int>();
    grid.max_threads_per_sm = c["gpu_grid"].at("max_threads_per_sm").get<int>();
  }
  const CpuKernel kernel = c.value("cpu_kernel", std::string("avx2")) == "scalar" ? CpuKernel::Scalar : CpuKernel::Avx2;
  TorchRandn rng(cuda ? RngKind::Cuda : RngKind::Cpu, c.at("seed").get<uint64_t>(), grid, kernel);

  // Earlier torch.randn calls on the same generator: the preceding entries of
  // the file with the same generator and seed and call_index 0..k-1.
  const int k = c.value("call_index", 0);
  EXPECT_GE(pos, size_t(k));
  for (int i = 0; i < k; ++i) {
    const json& prev = cases[pos - k + i];
    EXPECT_EQ(prev.at("generator"), c.at("generator"));
    EXPECT_EQ(prev.at("seed"), c.at("seed"));
    EXPECT_EQ(prev.value("call_index", -1), i);
    rng.randn(numel_of(prev));
  }
  if (c.contains("philox_offset_before_call")) {
    EXPECT_EQ(rng.philox_offset(), c["philox_offset_before_call"].get<uint64_t>());
  }
  if (c.contains("calls_before")) {
    const std::string calls = c["calls_before"];
    if (calls.rfind("5 x randint(0, 0xFFFFFFFF)", 0) == 0) {
      for (int i = 0; i < 5; ++i) rng.random_u32();
    } else if (calls == "5 x randint, normal_(8 elements), 1 x randint") {
      for (int i = 0; i < 5; ++i) rng.random_u32();
      rng.randn(8);
      rng.random_u32();
    } else {
      ADD_FAILURE() << "unknown calls_before: " << calls;
    }
  }
  return rng.randn(numel_of(c));
}

std::string label(const char* what, size_t index) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s [%zu]", what, index);
  return buf;
}

struct Checked {
  int compared = 0;
  int failed = 0;
};

void compare(const std::string& what, bool cuda, float got, float want, double std_scale, Checked* ck) {
  ++ck->compared;
  bool ok;
  if (cuda) {
    ok = std::fabs(double(got) - double(want)) <= kCudaAtol * std_scale;
  } else {
    uint32_t a, b;
    std::memcpy(&a, &got, 4);
    std::memcpy(&b, &want, 4);
    ok = a == b || (got == 0.0f && want == 0.0f);
  }
  if (!ok) {
    ++ck->failed;
    if (ck->failed <= 8)
      ADD_FAILURE() << what << ": got " << got << " want " << want << " (diff " << double(got) - double(want) << ")";
  }
}

bool check_case(const json& cases, size_t pos) {
  const json& c = cases[pos];
  const bool cuda = c.at("generator") == "cuda_philox";
  const std::string name = describe(c);
  SCOPED_TRACE(name);
  const std::vector<float> out = produce(cases, pos);
  const int64_t n = numel_of(c);
  EXPECT_EQ(int64_t(out.size()), n);
  if (int64_t(out.size()) != n) return false;
  Checked ck;

  if (c.contains("element_indices")) {
    const auto& idx = c["element_indices"];
    if (c.contains("standard_normal_values")) {
      // normal_(mean, std) = fma(randn, std, mean) in float32 on the GPU.
      const auto& sn = c["standard_normal_values"];
      const auto& vals = c.at("values");
      const float mean = 5.0f, stdv = static_cast<float>(std::sqrt(5.0));
      for (size_t i = 0; i < idx.size(); ++i) {
        const float r = out.at(idx[i].get<size_t>());
        compare(label("standard normal", idx[i].get<size_t>()), cuda, r, sn[i].get<float>(), 1.0, &ck);
        compare(label("normal_(5, sqrt 5)", idx[i].get<size_t>()), cuda, std::fmaf(r, stdv, mean), vals[i].get<float>(),
                stdv, &ck);
      }
    } else {
      const auto& vals = c.at("values");
      for (size_t i = 0; i < idx.size(); ++i)
        compare(label("element", idx[i].get<size_t>()), cuda, out.at(idx[i].get<size_t>()), vals[i].get<float>(),
                1.0, &ck);
    }
  } else if (c.contains("values")) {
    const auto& vals = c["values"];
    EXPECT_EQ(int64_t(vals.size()), n);
    for (size_t i = 0; i < vals.size() && i < out.size(); ++i)
      compare(label("element", i), cuda, out[i], vals[i].get<float>(), 1.0, &ck);
  } else {
    const auto& first = c.at("values_first16");
    const auto& last = c.at("values_last4");
    for (size_t i = 0; i < first.size(); ++i)
      compare(label("element", i), cuda, out[i], first[i].get<float>(), 1.0, &ck);
    for (size_t i = 0; i < last.size(); ++i) {
      const size_t at = out.size() - last.size() + i;
      compare(label("element", at), cuda, out[at], last[i].get<float>(), 1.0, &ck);
    }
    double sum = 0;
    for (float v : out) sum += v;
    if (c.contains("sum_exact")) {
      // Implied by the per-element tolerance (exact for the CPU's bit-exact values).
      const double tol = cuda ? kCudaAtol * double(n) : 1e-9 * double(n);
      EXPECT_NEAR(sum, c["sum_exact"].get<double>(), tol) << "sum";
      if (std::fabs(sum - c["sum_exact"].get<double>()) > tol) ++ck.failed;
    }
    if (!cuda && c.contains("sha256_f32le")) {
      // Host byte order: little-endian on every platform Atelier builds for.
      const std::string got = sha256_hex(out.data(), out.size() * sizeof(float));
      EXPECT_EQ(got, c["sha256_f32le"].get<std::string>()) << "sha256 of all " << n << " float32 values";
      if (got != c["sha256_f32le"].get<std::string>()) ++ck.failed;
    }
  }
  std::printf("  %-60s %s (%d values)\n", name.c_str(), ck.failed == 0 ? "pass" : "FAIL", ck.compared);
  return ck.failed == 0;
}

void run_generator(const std::string& generator) {
  const json& j = vectors();
  ASSERT_TRUE(j.is_object()) << "cannot read " ATELIER_FIXTURES_DIR "/rng/torch_randn_vectors.json";
  const json& cases = j.at("cases");
  int total = 0, passed = 0;
  for (size_t pos = 0; pos < cases.size(); ++pos) {
    if (cases[pos].at("generator") != generator) continue;
    ++total;
    if (check_case(cases, pos)) ++passed;
  }
  std::printf("%s: %d/%d entries pass\n", generator.c_str(), passed, total);
  EXPECT_GT(total, 0);
  EXPECT_EQ(passed, total);
}

}  // namespace

TEST(TorchRandn, CudaPhiloxMatchesVectors) { run_generator("cuda_philox"); }

TEST(TorchRandn, CpuMt19937MatchesVectors) { run_generator("cpu_mt19937"); }


TEST(TorchRandn, SuccessiveCallsContinueTheStream) {
  // CPU: numel >= 16 and a multiple of 16 consumes exactly numel draws.
  TorchRandn a(RngKind::Cpu, 7), b(RngKind::Cpu, 7);
  const auto first = a.randn(32);
  const auto second = a.randn(32);
  const auto both = b.randn(64);
  for (size_t i = 0; i < 32; ++i) {
    EXPECT_EQ(first[i], both[i]);
    EXPECT_EQ(second[i], both[32 + i]);
  }
  // CUDA: a small call advances the Philox offset by 4.
  TorchRandn c(RngKind::Cuda, 7);
  EXPECT_EQ(c.philox_offset(), 0u);
  c.randn(100);
  EXPECT_EQ(c.philox_offset(), 4u);
  c.randn(16384);
  EXPECT_EQ(c.philox_offset(), 8u);
  EXPECT_TRUE(TorchRandn(RngKind::Cuda, 1).randn(0).empty());
}
