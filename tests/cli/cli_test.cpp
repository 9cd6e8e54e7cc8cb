// End-to-end: the built `atelier` binary against the real fixtures, as a
// script or a user would run it.
#include <gtest/gtest.h>

#include <algorithm>

#include "cli/cli_util.h"
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

namespace {
const std::string kFix = ATELIER_FIXTURES_DIR;
const std::string kGguf = kFix + "/text/stories260K.gguf";
const std::string kBin = kFix + "/text/stories260K.bin";

using atelier::test::CliRun;
using atelier::test::slurp;

CliRun run(const std::vector<std::string>& args) { return atelier::test::run_atelier(args); }

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}
}  // namespace

TEST(Cli, GreedyGoldenFromGguf) {
  CliRun r = run({"text", "-m", kGguf, "-p", "Once upon a time", "-n", "60", "--temp", "0", "--echo"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, slurp(kFix + "/text/golden-once-upon-a-time-greedy.txt"));
  EXPECT_NE(r.err.find("new: 60 tokens"), std::string::npos) << r.err;
}

TEST(Cli, GreedyGoldenFromLlama2c) {
  CliRun r = run({"text", "-m", kBin, "--tokenizer", kFix + "/text/tok512.bin", "-p", "Once upon a time", "-n", "60",
               "--temp", "0", "--echo"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, slurp(kFix + "/text/golden-once-upon-a-time-greedy.txt"));
}

TEST(Cli, JsonIdsEqualGolden) {
  CliRun r = run({"text", "-m", kGguf, "-p", "Once upon a time", "-n", "60", "--temp", "0", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  int tokens = 0;
  nlohmann::json result;
  while (std::getline(lines, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == "token") {
      EXPECT_EQ(j["index"], tokens);
      ++tokens;
    } else {
      result = j;
    }
  }
  EXPECT_EQ(tokens, 60);
  std::istringstream ids_file(slurp(kFix + "/text/golden-once-upon-a-time-greedy.ids"));
  std::vector<int> want;
  for (int id; ids_file >> id;) want.push_back(id);
  EXPECT_EQ(result["ids"].get<std::vector<int>>(), want);
  EXPECT_EQ(result["prompt_tokens"], 5);
  EXPECT_EQ(result["new_tokens"], 60);
}

TEST(Cli, StopStringEndsBeforeIt) {
  CliRun r = run({"text", "-m", kGguf, "-p", "Once upon a time", "-n", "60", "--temp", "0", "--stop", "Lily"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, ", there was a little girl named \n");
  EXPECT_NE(r.err.find("stop: stop"), std::string::npos) << r.err;
}

TEST(Cli, SameSeedSameText) {
  auto gen = [](const std::string& seed) {
    return run({"text", "-m", kGguf, "-p", "Once upon a time", "-n", "40", "--temp", "1.0", "--seed", seed}).out;
  };
  const std::string a = gen("123");
  EXPECT_EQ(a, gen("123"));
  EXPECT_NE(a, gen("124"));
}

// A text run maps neither OpenCV nor libcurl (and what they bring): both are
// opened at run time, by the first image resize and the first download. The
// dynamic loader lists what the binary needs at start (LD_TRACE_LOADED_OBJECTS,
// what ldd reads).
TEST(Cli, StartsWithoutOpenCvOrCurl) {
  atelier::test::ScratchDir d("startlibs");
  const std::string out = (d.dir / "libs").string();
  const int status = std::system(("LD_TRACE_LOADED_OBJECTS=1 " + atelier::test::shell_quote(atelier::test::atelier_binary()) +
                                  " >" + out + " 2>&1").c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << slurp(out);
  const std::string libs = slurp(out);
  EXPECT_NE(libs.find("libsqlite3"), std::string::npos) << "the trace lists no libraries:\n" << libs;
  for (const char* lib : {"libopencv", "libcurl", "libgnutls", "libX11", "liblapack", "libtbb"})
    EXPECT_EQ(libs.find(lib), std::string::npos) << lib << " is loaded at start:\n" << libs;
}

TEST(Cli, Tokenize) {
  CliRun r = run({"tokenize", "-m", kGguf, "Once upon a time"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "1 403 407 261 378\n");
  CliRun nb = run({"tokenize", "-m", kGguf, "--no-bos", "--", "-Once upon a time"});
  ASSERT_EQ(nb.code, 0) << nb.err;
  EXPECT_EQ(count_lines(nb.out), 1);
  EXPECT_NE(nb.out.substr(0, 2), "1 ");
}

TEST(Cli, BadUsageIsOneLineWithExit2) {
  CliRun unknown = run({"text", "-m", kGguf, "-p", "x", "--temperature", "1"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_EQ(count_lines(unknown.err), 1) << unknown.err;
  EXPECT_NE(unknown.err.find("--temperature"), std::string::npos) << unknown.err;
  CliRun range = run({"text", "-m", kGguf, "-p", "x", "--top-p", "1.5"});
  EXPECT_EQ(range.code, 2);
  EXPECT_NE(range.err.find("1.5"), std::string::npos) << range.err;
  CliRun kv = run({"text", "-m", kGguf, "-p", "x", "--kv-type", "q4"});
  EXPECT_EQ(kv.code, 2);
  EXPECT_NE(kv.err.find("f16"), std::string::npos) << kv.err;  // says what is allowed
  // q8_0 is a type, but stories260K's 8-wide heads cannot hold its 32-value blocks: a model error, exit 1.
  CliRun q8 = run({"text", "-m", kGguf, "-p", "x", "--kv-type", "q8_0"});
  EXPECT_EQ(q8.code, 1);
  EXPECT_NE(q8.err.find("multiple of 32"), std::string::npos) << q8.err;
  // bf16 and fp8 parse (the list names them) and are a GPU's: the CPU refuses them naming what to use.
  CliRun e4 = run({"text", "-m", kGguf, "-p", "x", "--kv-type", "e4m3"});
  EXPECT_EQ(e4.code, 2);
  EXPECT_NE(e4.err.find("fp8"), std::string::npos) << e4.err;
  for (const char* t : {"fp8", "bf16"}) {
    CliRun gpu_kv = run({"text", "-m", kGguf, "-p", "x", "--device", "cpu", "--kv-type", t});
    EXPECT_EQ(gpu_kv.code, 2) << t;
    EXPECT_EQ(gpu_kv.err.find("is not a KV cache type"), std::string::npos) << gpu_kv.err;
    EXPECT_NE(gpu_kv.err.find(std::string("--kv-type ") + t + " is for a GPU"), std::string::npos) << gpu_kv.err;
    EXPECT_NE(gpu_kv.err.find("--kv-type f16"), std::string::npos) << gpu_kv.err;
  }
  EXPECT_EQ(run({"text", "--help"}).code, 0);
  EXPECT_EQ(run({"bench", "text", "--help"}).code, 0);
  EXPECT_EQ(run({"models", "synth", "--help"}).code, 0);
}

TEST(Cli, MissingAndCorruptModelsFailCleanly) {
  CliRun missing = run({"text", "-m", "/nonexistent/model.gguf", "-p", "x"});
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.err.find("no such model file"), std::string::npos) << missing.err;

  const std::string bytes = slurp(kGguf);
  const std::string cut = (fs::temp_directory_path() / ("atelier_cli_cut_" + std::to_string(::getpid()) + ".gguf")).string();
  std::ofstream(cut, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  CliRun truncated = run({"text", "-m", cut, "-p", "x"});
  EXPECT_EQ(truncated.code, 1);
  EXPECT_EQ(count_lines(truncated.err), 1) << truncated.err;
  EXPECT_NE(truncated.err.find(cut), std::string::npos) << truncated.err;  // names the file
  fs::remove(cut);
}

TEST(Cli, SynthThenGenerateAndBench) {
  const std::string path = (fs::temp_directory_path() / ("atelier_cli_synth_" + std::to_string(::getpid()) + ".gguf")).string();
  CliRun s = run({"models", "synth", "--arch", "llama", "--params", "260K", "--type", "q8_0", "--seed", "3", "-o", path});
  ASSERT_EQ(s.code, 0) << s.err;
  CliRun t = run({"text", "-m", path, "-p", "hello", "-n", "8", "--seed", "1"});
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.err.find("new: 8 tokens"), std::string::npos) << t.err;
  CliRun b = run({"bench", "text", "-m", path, "-p", "16", "-n", "8", "--reps", "1", "--json"});
  ASSERT_EQ(b.code, 0) << b.err;
  auto j = nlohmann::json::parse(b.out);
  for (const char* key : {"prompt_tokens_per_s", "gen_tokens_per_s", "gen_bandwidth_gb_per_s", "mem_bandwidth_gb_per_s",
                          "peak_gflop_per_s", "peak_int8_gop_per_s", "peak_rss_bytes"}) {
    ASSERT_TRUE(j.contains(key)) << key;
    EXPECT_GT(j[key].get<double>(), 0.0) << key;
  }
  EXPECT_TRUE(j["integer_matmul"].get<bool>()) << "a q8_0 model's prompt rate compares with the int8 dot peak";
  // The values, not only the keys: what was asked for, and the derived
  // figures from the JSON's own fields (tools.h says how each is made).
  EXPECT_EQ(j["prompt_tokens"].get<int>(), 16);
  EXPECT_EQ(j["gen_tokens"].get<int>(), 8);
  EXPECT_EQ(j["reps"].get<int>(), 1);
  // The 260K preset is stories260K's shape (fixtures README): dim 64, hidden
  // 172, 5 layers, 8 heads of 8, 4 KV heads, vocab 512, tied output. By hand:
  // per layer q, o 64x64, k, v 64x32, gate, up, down 64x172 = 45312 matmul
  // weights + 2 x 64 norms; the embedding 512 x 64 and the final norm.
  const double matmul_params = 5 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 172);
  EXPECT_EQ(j["n_params"].get<double>(), matmul_params + 5 * 2 * 64 + 512 * 64 + 64);
  const double tps = j["gen_tokens_per_s"], wbytes = j["weight_bytes_per_token"];
  EXPECT_NEAR(j["gen_bandwidth_gb_per_s"].get<double>(), wbytes * tps / 1e9, 1e-6 * wbytes * tps / 1e9);
  // FLOPs of a prompt token: 2 per matmul weight of the layers (the output matrix runs once per prompt).
  const double pps = j["prompt_tokens_per_s"];
  EXPECT_NEAR(j["prompt_gflop_per_s"].get<double>(), 2 * matmul_params * pps / 1e9, 1e-6 * 2 * matmul_params * pps / 1e9);
  EXPECT_NEAR(j["gen_bandwidth_fraction"].get<double>(),
              j["gen_bandwidth_gb_per_s"].get<double>() / j["mem_bandwidth_gb_per_s"].get<double>(), 1e-9);
  EXPECT_NEAR(j["prompt_flop_fraction"].get<double>(),
              j["prompt_gflop_per_s"].get<double>() / j["peak_int8_gop_per_s"].get<double>(), 1e-9);
  // The weights read per token are part of the file; the process held the
  // whole mapped file at least, and less than the machine has.
  const double file_bytes = static_cast<double>(fs::file_size(path));
  EXPECT_GT(wbytes, 0.5 * file_bytes);
  EXPECT_LE(wbytes, file_bytes);
  double mem_total = 0;
  {
    std::ifstream meminfo("/proc/meminfo");
    std::string key, unit;
    double kb = 0;
    while (meminfo >> key >> kb >> unit)
      if (key == "MemTotal:") mem_total = kb * 1024;
  }
  ASSERT_GT(mem_total, 0);
  EXPECT_GT(j["peak_rss_bytes"].get<double>(), file_bytes);
  EXPECT_LT(j["peak_rss_bytes"].get<double>(), mem_total);
  // --depth: the same figures after tokens already in the context.
  CliRun d = run({"bench", "text", "-m", path, "-p", "8", "-n", "4", "-d", "40", "--reps", "1", "--json"});
  ASSERT_EQ(d.code, 0) << d.err;
  const auto jd = nlohmann::json::parse(d.out);
  EXPECT_EQ(jd["depth"].get<int>(), 40);
  EXPECT_GT(jd["gen_tokens_per_s"].get<double>(), 0.0);
  EXPECT_EQ(j["depth"].get<int>(), 0);
  EXPECT_EQ(run({"bench", "text", "-m", path, "-d", "-1"}).code, 2);
  // bench serve: every level's figures are the medians of its rounds.
  CliRun sv = run({"bench", "serve", "-m", path, "--concurrency", "1,3", "-p", "8", "-n", "6", "--rounds", "3", "--json"});
  ASSERT_EQ(sv.code, 0) << sv.err;
  auto js = nlohmann::json::parse(sv.out);
  ASSERT_EQ(js["rounds"].get<int>(), 3);
  ASSERT_EQ(js["levels"].size(), 2u);
  for (const auto& level : js["levels"]) {
    ASSERT_EQ(level["rounds"].size(), 3u);
    for (const char* key : {"tokens_per_s", "itl_ms_p50", "itl_ms_p99", "ttft_ms_p50", "ttft_ms_p99", "mean_batch"}) {
      std::vector<double> v;
      for (const auto& r : level["rounds"]) v.push_back(r[key].get<double>());
      std::sort(v.begin(), v.end());
      EXPECT_EQ(level[key].get<double>(), v[1]) << key;
    }
    for (const auto& r : level["rounds"]) {
      EXPECT_EQ(r["mean_batch"].get<double>(), level["concurrency"].get<double>());
      // every request makes -n tokens (end of sequence ignored): tokens/s is their sum over the round's seconds
      const double tokens = level["concurrency"].get<double>() * 6;
      EXPECT_NEAR(r["tokens_per_s"].get<double>(), tokens / r["seconds"].get<double>(), 1e-6 * tokens / r["seconds"].get<double>());
    }
  }
  EXPECT_EQ(js["levels"][0]["concurrency"].get<int>(), 1);
  EXPECT_EQ(js["levels"][1]["concurrency"].get<int>(), 3);
  EXPECT_EQ(js["gen_tokens"].get<int>(), 6);
  EXPECT_EQ(js["prompt_tokens"].get<int>(), 8);
  EXPECT_EQ(run({"bench", "serve", "-m", path, "--rounds", "0"}).code != 0, true);
  // Same seed, same bytes: the synthetic model is deterministic.
  const std::string again = path + ".2";
  ASSERT_EQ(run({"models", "synth", "--params", "260K", "--type", "q8_0", "--seed", "3", "-o", again}).code, 0);
  EXPECT_EQ(slurp(path), slurp(again));
  fs::remove(path);
  fs::remove(again);
}

// bench mixed: its figures agree with one another (the slowdown is the
// ratio of the image's times, the alone time the mean of its two runs, the
// floor the image plus the text work that ran inside it).
TEST(Cli, BenchMixedFiguresAreConsistent) {
  const std::string sd = (fs::temp_directory_path() / ("atelier_cli_mixed_" + std::to_string(::getpid()) + ".safetensors")).string();
  ASSERT_EQ(run({"models", "synth", "--arch", "sd15", "--width-mult", "0.1", "--type", "f32", "-o", sd}).code, 0);
  const std::string text = std::string(ATELIER_FIXTURES_DIR) + "/text/stories260K.gguf";
  CliRun r = run({"bench", "mixed", "-m", text, "--image-model", sd, "-W", "64", "-H", "64", "--steps", "3", "--text-jobs", "2",
                  "-n", "4", "--text-start", "0", "--json"});
  CliRun bad = run({"bench", "mixed", "-m", text, "--image-model", sd, "-W", "60"});
  fs::remove(sd);
  EXPECT_EQ(bad.code, 2) << bad.err;  // not a multiple of 8
  EXPECT_NE(bad.err.find("multiples of 8"), std::string::npos) << bad.err;
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const double alone = j["image_seconds_alone"].get<double>(), with = j["image_seconds_with_text"].get<double>();
  const auto runs = j["image_seconds_alone_runs"].get<std::vector<double>>();
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_NEAR(alone, 0.5 * (runs[0] + runs[1]), 1e-9);
  ASSERT_GT(alone, 0);
  EXPECT_NEAR(j["image_slowdown"].get<double>(), with / alone, 1e-9);
  const int inside = j["text_jobs_during_image"].get<int>();
  EXPECT_GE(inside, 0);
  EXPECT_LE(inside, 2);
  const double text_s = j["text_seconds_alone"].get<double>();
  EXPECT_GT(text_s, 0);
  EXPECT_NEAR(j["image_slowdown_floor"].get<double>(), (alone + text_s * inside / 2.0) / alone, 1e-9);
}

// `tokenize --no-bos` on vocabulary-only files reproduces llama.cpp's vectors
// (the first strings of each .inp/.out pair), tokenizer.json included.
TEST(Cli, TokenizeVocabularyFiles) {
  const std::string sep = "\n__ggml_vocab_test__\n";
  for (const std::string name : {"gpt-2", "llama-spm", "bert-bge", "llama-bpe"}) {
    const std::string base = kFix + "/vocab/ggml-vocab-" + name + ".gguf";
    const std::string model = name == "llama-bpe" ? kFix + "/vocab/llama3-tokenizer.json" : base;
    const std::string inp = slurp(base + ".inp"), outp = slurp(base + ".out");
    std::vector<std::string> texts, expected;
    for (size_t at = 0, next; (next = inp.find(sep, at)) != std::string::npos && texts.size() < 3; at = next + sep.size())
      texts.push_back(inp.substr(at, next - at));
    std::istringstream lines(outp);
    for (std::string l; expected.size() < texts.size() && std::getline(lines, l);) expected.push_back(l);
    ASSERT_EQ(texts.size(), 3u) << name;
    for (size_t i = 0; i < texts.size(); ++i) {
      CliRun r = run({"tokenize", "-m", model, "--no-bos", "--", texts[i]});
      ASSERT_EQ(r.code, 0) << name << ": " << r.err;
      // .out lines start with a space before each id; ours are space-separated.
      std::string want = expected[i];
      while (!want.empty() && want.front() == ' ') want.erase(0, 1);
      EXPECT_EQ(r.out, want + "\n") << name << " string " << i;
    }
  }
}
