// Synthetic model references as real processes (issue 33: benchmark models
// without multi-GB downloads): `bench serve --synth`, `text -m synth:...`,
// the job record of one, and the commands that refuse them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "cli/cli_util.h"

namespace fs = std::filesystem;
using atelier::test::CliRun;
using atelier::test::CliSandbox;
using atelier::test::jsonl;

namespace {

const std::string kGguf = std::string(ATELIER_FIXTURES_DIR) + "/text/stories260K.gguf";

// Without a CUDA module, so `auto` is the CPU on every machine.
class SynthCli : public atelier::test::WithoutCudaModule {};

}  // namespace

TEST_F(SynthCli, BenchServeRunsASynthPresetWithoutAFile) {
  CliSandbox sb("synth_cli_serve");
  const CliRun r = sb.run({"bench", "serve", "--synth", "260K", "--type", "f32", "--synth-seed", "3", "--concurrency", "1,3",
                           "-p", "12", "-n", "4", "--rounds", "1", "--threads", "1", "--device", "cpu", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = jsonl(r.out).at(0);
  EXPECT_EQ(j.value("model", ""), "synth:260K:f32:seed=3");
  EXPECT_EQ(j.value("device", ""), "cpu");
  const auto& levels = j.at("levels");
  ASSERT_EQ(levels.size(), 2u);
  EXPECT_EQ(levels[0].value("concurrency", 0), 1);
  EXPECT_EQ(levels[1].value("concurrency", 0), 3);
  for (const auto& l : levels) {
    EXPECT_GT(l.value("tokens_per_s", 0.0), 0.0) << l.dump();
    EXPECT_TRUE(l.at("device_busy_percent").is_null()) << "the CPU reports no utilisation: " << l.dump();
    EXPECT_GT(l.value("itl_p99_vs_first_level", 0.0), 0.0) << l.dump();
  }
  EXPECT_DOUBLE_EQ(levels[0].value("itl_p99_vs_first_level", 0.0), 1.0);
  EXPECT_NEAR(levels[1].value("mean_batch", 0.0), 3.0, 1.0) << "the three streams decoded together";
  // The table names the reference and the ITL ratio's column.
  const CliRun t = sb.run({"bench", "serve", "--synth", "260K", "--type", "f32", "--concurrency", "1", "-p", "8", "-n", "2",
                           "--rounds", "1", "--threads", "1", "--device", "cpu"});
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("model synth:260K:f32:seed=1,"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("p99 x1st"), std::string::npos) << t.out;
  // -m or --synth, one of them; a bad type or preset is refused before any work.
  EXPECT_EQ(sb.run({"bench", "serve", "--concurrency", "1"}).code, 2);
  EXPECT_EQ(sb.run({"bench", "serve", "-m", kGguf, "--synth", "260K"}).code, 2);
  const CliRun bad = sb.run({"bench", "serve", "--synth", "260K", "--type", "q3_K", "--device", "cpu"});
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("q4_k_m"), std::string::npos) << bad.err;
  const CliRun nine = sb.run({"bench", "serve", "--synth", "9B", "--device", "cpu"});
  EXPECT_EQ(nine.code, 2) << nine.err;
  EXPECT_NE(nine.err.find("260K, 15M, 42M, 110M, 1B, 8B"), std::string::npos) << nine.err;
}

TEST_F(SynthCli, TextFromASynthReferenceIsTheSameForTheSameSeed) {
  CliSandbox sb("synth_cli_text");
  auto run = [&](const std::string& ref) {
    const CliRun r = sb.run({"text", "-m", ref, "-p", "Once upon a time", "-n", "16", "--seed", "3",
                             "--threads", "1", "--json"});
    EXPECT_EQ(r.code, 0) << r.err;
    const auto lines = jsonl(r.out);
    return lines.empty() ? nlohmann::json::object() : lines.back();
  };
  const auto a = run("synth:260K:f32:seed=7"), b = run("synth:260K:f32:seed=7");
  EXPECT_EQ(a.at("ids"), b.at("ids"));
  EXPECT_EQ(a.at("text"), b.at("text"));
  EXPECT_GT(a.value("new_tokens", 0), 0);
  // The prompt is its bytes, one token each, after BOS.
  std::vector<int> want = {1};
  for (unsigned char c : std::string("Once upon a time")) want.push_back(c == ' ' ? 259 : 3 + c);
  EXPECT_EQ(a.at("prompt_ids").get<std::vector<int>>(), want);
  EXPECT_NE(run("synth:260K:f32:seed=8").at("ids"), a.at("ids")) << "another seed, other weights";
}

TEST_F(SynthCli, AJobRecordsTheReferenceAndItsDigest) {
  CliSandbox sb("synth_cli_job");
  sb.write("in.jsonl", "{\"model\": \"synth:260K:seed=5\", \"prompt\": \"Once\", \"max_new_tokens\": 3, \"ignore_eos\": true}\n");
  const CliRun b = sb.run({"batch", sb.path("in.jsonl"), "--out", sb.path("out"), "--data-dir", sb.data(), "--threads", "1"});
  ASSERT_EQ(b.code, 0) << b.err;
  const CliRun list = sb.run({"queue", "list", "--json", "--data-dir", sb.data()});
  ASSERT_EQ(list.code, 0) << list.err;
  const auto jobs = jsonl(list.out);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].value("state", ""), "completed") << jobs[0].dump();
  EXPECT_EQ(jobs[0].value("model", ""), "synth:260K:seed=5");
  EXPECT_EQ(jobs[0].value("model_version", ""), "synthetic-v1:260K:bf16:seed=5");
  EXPECT_EQ(jobs[0].value("model_name", ""), "synth:260K:bf16:seed=5") << "the canonical reference, not a path";
}

TEST_F(SynthCli, TheStoreCommandsRefuseThemWithAClearMessage) {
  CliSandbox sb("synth_cli_refuse");
  const std::string store = sb.path("store");
  const CliRun pull = sb.run({"models", "pull", "synth:8B", "--store", store});
  EXPECT_EQ(pull.code, 2) << pull.err;
  EXPECT_NE(pull.err.find("synthetic model"), std::string::npos) << pull.err;
  EXPECT_NE(pull.err.find("nothing to pull"), std::string::npos) << pull.err;
  const CliRun named = sb.run({"models", "import", kGguf, "--name", "synth", "--store", store});
  EXPECT_EQ(named.code, 2) << named.err;
  EXPECT_NE(named.err.find("reserved for synthetic models"), std::string::npos) << named.err;
  ASSERT_EQ(sb.run({"models", "import", kGguf, "--name", "tiny", "--store", store}).code, 0);
  for (const char* cmd : {"info", "verify", "remove"}) {
    const CliRun r = sb.run({"models", cmd, "synth:8B", "--store", store});
    EXPECT_EQ(r.code, 2) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find("is a synthetic model, made on the device"), std::string::npos) << cmd << ": " << r.err;
  }
  const CliRun promote = sb.run({"models", "promote", "synth:8B", "prod", "--store", store});
  EXPECT_EQ(promote.code, 2) << promote.err;
  EXPECT_NE(promote.err.find("synthetic model"), std::string::npos) << promote.err;
  const CliRun quant = sb.run({"models", "quantize", "synth:260K", "--type", "q8_0", "--name", "q", "--store", store});
  EXPECT_EQ(quant.code, 2) << quant.err;
  EXPECT_NE(quant.err.find("synth:PARAMS:q4_k_m"), std::string::npos) << quant.err;
  const CliRun bad = sb.run({"text", "-m", "synth:8B:q3_K", "-p", "x"});
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("synth:PARAMS[:TYPE][:seed=N]"), std::string::npos) << bad.err;
}
