// --device, --precision and --gpu-memory-fraction on the commands that run
// models (issue 33), as real processes. The CUDA module is pointed at a
// missing file, so these hold on any machine: a GPU named outright is a
// clear error (what is missing, how to get it) before any work; auto runs on
// the CPU and says so in the summary, --json, the job records and metrics.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/cli_util.h"

namespace fs = std::filesystem;
using atelier::test::CliRun;
using atelier::test::CliSandbox;
using atelier::test::jsonl;

namespace {

const std::string kGguf = std::string(ATELIER_FIXTURES_DIR) + "/text/stories260K.gguf";

class DeviceCli : public atelier::test::WithoutCudaModule {};

// The refusal names what is missing and how to run without it.
void expect_no_gpu_error(const CliRun& r, const std::string& what) {
  EXPECT_EQ(r.code, 1) << what << ": " << r.err;
  EXPECT_NE(r.err.find("--device cuda"), std::string::npos) << what << ": " << r.err;
  EXPECT_NE(r.err.find("libatelier_cuda.so"), std::string::npos) << what << ": " << r.err;
  EXPECT_NE(r.err.find("--device cpu"), std::string::npos) << what << ": " << r.err;
}

}  // namespace

TEST_F(DeviceCli, CudaWithoutAGpuIsAClearErrorBeforeAnyWork) {
  CliSandbox sb("device_cli_nogpu");
  expect_no_gpu_error(sb.run({"text", "-m", kGguf, "-p", "Once", "-n", "4", "--device", "cuda"}), "text");
  expect_no_gpu_error(sb.run({"bench", "text", "-m", kGguf, "-p", "4", "-n", "2", "--reps", "1", "--device", "cuda:0"}),
                      "bench text");
  expect_no_gpu_error(sb.run({"bench", "serve", "-m", kGguf, "--concurrency", "1", "-n", "2", "--rounds", "1", "--device", "cuda"}),
                      "bench serve");
  sb.write("in.jsonl", "{\"model\": \"" + kGguf + "\", \"prompt\": \"Once\", \"max_new_tokens\": 2}\n");
  expect_no_gpu_error(sb.run({"batch", sb.path("in.jsonl"), "--out", sb.path("out"), "--data-dir", sb.data(), "--device", "cuda"}),
                      "batch");
  expect_no_gpu_error(sb.run({"--headless", "--data-dir", sb.data(), "--device", "cuda"}), "--headless");
  expect_no_gpu_error(sb.run({"serve", "--port", "0", "--data-dir", sb.data(), "--device", "cuda"}), "serve");
  // Nothing was queued or made.
  EXPECT_FALSE(fs::exists(sb.dir / "out"));
  EXPECT_FALSE(fs::exists(fs::path(sb.data()) / "jobs.db"));
  // Images: refused on a GPU named outright (they run on the CPU so far).
  const CliRun img = sb.run({"image", "-m", "quickdraw", "-p", "a cat", "-o", sb.path("cat.png"), "--device", "cuda"});
  EXPECT_EQ(img.code, 1) << img.err;
  EXPECT_NE(img.err.find("--device cpu"), std::string::npos) << img.err;
  EXPECT_FALSE(fs::exists(sb.path("cat.png")));
}

TEST_F(DeviceCli, BadDevicesAndPrecisionsAreRefusedWithExit2) {
  CliSandbox sb("device_cli_bad");
  const CliRun tpu = sb.run({"text", "-m", kGguf, "-p", "Once", "-n", "2", "--device", "tpu"});
  EXPECT_EQ(tpu.code, 2) << tpu.err;
  EXPECT_NE(tpu.err.find("auto, cpu, cuda or cuda:N"), std::string::npos) << tpu.err;
  const CliRun fp8 = sb.run({"text", "-m", kGguf, "-p", "Once", "-n", "2", "--device", "cpu", "--precision", "fp8"});
  EXPECT_EQ(fp8.code, 2) << fp8.err;
  EXPECT_NE(fp8.err.find("--precision fp8 is for a GPU"), std::string::npos) << fp8.err;
  EXPECT_EQ(sb.run({"text", "-m", kGguf, "-p", "Once", "--precision", "fp4"}).code, 2);
  EXPECT_EQ(sb.run({"text", "-m", kGguf, "-p", "Once", "--device", ""}).code, 2);
  EXPECT_EQ(sb.run({"--headless", "--data-dir", sb.data(), "--gpu-memory-fraction", "1.5"}).code, 2);
}

TEST_F(DeviceCli, AutoRunsOnTheCpuAndSaysSo) {
  CliSandbox sb("device_cli_auto");
  const CliRun plain = sb.run({"text", "-m", kGguf, "-p", "Once upon a time", "-n", "4", "--temp", "0"});
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_NE(plain.err.find("device: cpu (auto: no usable GPU (this build's CUDA module (libatelier_cuda.so) could not be "
                           "loaded); running on the CPU); precision: weights:file act:f32 kv:f16 acc:f32"),
            std::string::npos)
      << plain.err;
  const CliRun js = sb.run({"text", "-m", kGguf, "-p", "Once upon a time", "-n", "4", "--temp", "0", "--json"});
  ASSERT_EQ(js.code, 0) << js.err;
  const auto lines = jsonl(js.out);
  ASSERT_FALSE(lines.empty());
  const auto& result = lines.back();
  EXPECT_EQ(result.value("device", ""), "cpu");
  EXPECT_NE(result.value("device_why", "").find("running on the CPU"), std::string::npos) << result.dump();
  EXPECT_EQ(result.value("precision", ""), "weights:file act:f32 kv:f16 acc:f32");
  // --precision on an automatic CPU is said to apply to a GPU only, not refused.
  const CliRun p = sb.run({"text", "-m", kGguf, "-p", "Once", "-n", "2", "--precision", "bf16"});
  EXPECT_EQ(p.code, 0) << p.err;
  EXPECT_NE(p.err.find("(--precision bf16 applies to a GPU only)"), std::string::npos) << p.err;
}

TEST_F(DeviceCli, JobsRecordTheirDeviceAndPrecisionAndTheMetricsNameTheDevice) {
  CliSandbox sb("device_cli_jobs");
  sb.write("in.jsonl", "{\"model\": \"" + kGguf + "\", \"prompt\": \"Once\", \"max_new_tokens\": 3}\n");
  const CliRun b = sb.run({"batch", sb.path("in.jsonl"), "--out", sb.path("out"), "--data-dir", sb.data()});
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_NE(b.err.find("device: cpu (auto:"), std::string::npos) << b.err;
  const auto results = jsonl(atelier::test::slurp(sb.dir / "out" / "results.jsonl"));
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].value("device", ""), "cpu");
  EXPECT_EQ(results[0].value("precision", ""), "weights:file act:f32 kv:f16 acc:f32");
  EXPECT_EQ(results[0].value("engine_build", "").rfind("atelier ", 0), 0u) << results[0].dump();
  const CliRun list = sb.run({"queue", "list", "--json", "--data-dir", sb.data()});
  ASSERT_EQ(list.code, 0) << list.err;
  const auto jobs = jsonl(list.out);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].value("device", ""), "cpu");
  const CliRun m = sb.run({"metrics", "--json", "--data-dir", sb.data()});
  ASSERT_EQ(m.code, 0) << m.err;
  EXPECT_EQ(jsonl(m.out).at(0).value("device", ""), "cpu");
}

// --deterministic (a GPU's batch-invariant kernels) is one of the device
// flags: every command that runs models takes it; the CPU, always
// batch-invariant, gives the same text with it.
TEST_F(DeviceCli, DeterministicIsOnEveryCommandThatRunsModels) {
  CliSandbox sb("device_cli_deterministic");
  for (const std::vector<std::string>& cmd : std::vector<std::vector<std::string>>{
           {"text"}, {"image"}, {"bench", "text"}, {"bench", "serve"}, {"batch"}, {"serve"}}) {
    std::vector<std::string> args = cmd;
    args.push_back("--help");
    const CliRun h = sb.run(args);
    EXPECT_EQ(h.code, 0) << cmd.front() << ": " << h.err;
    EXPECT_NE(h.out.find("--deterministic"), std::string::npos) << cmd.back() << " --help lacks it";
  }
  const CliRun plain = sb.run({"text", "-m", kGguf, "-p", "Once upon a time", "-n", "8", "--temp", "0", "--device", "cpu"});
  const CliRun det = sb.run(
      {"text", "-m", kGguf, "-p", "Once upon a time", "-n", "8", "--temp", "0", "--device", "cpu", "--deterministic"});
  ASSERT_EQ(det.code, 0) << det.err;
  EXPECT_EQ(det.out, plain.out);
}

TEST_F(DeviceCli, BenchTextMakesASynthPresetWithoutAFile) {
  CliSandbox sb("device_cli_synth");
  const CliRun r = sb.run({"bench", "text", "--synth", "260K", "--type", "q4_k_m", "-p", "4", "-n", "2", "--reps", "1",
                           "--threads", "1", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = jsonl(r.out).at(0);
  EXPECT_EQ(j.value("model", ""), "synth:260K:q4_k_m:seed=1") << "the reference that makes the same model";
  EXPECT_EQ(j.value("device", ""), "cpu");
  EXPECT_GT(j.value("gen_tokens_per_s", 0.0), 0.0);
  EXPECT_EQ(sb.run({"bench", "text", "-m", kGguf, "--synth", "260K"}).code, 2);  // one or the other
  const CliRun bad = sb.run({"bench", "text", "--synth", "260K", "--type", "q3_K"});
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("q4_k_m"), std::string::npos) << bad.err;
}
