// End-to-end: `atelier batch`, `atelier queue ...`, `atelier --headless` and
// `atelier metrics` on the real stories260K model, against `atelier text`
// (the single-sequence path) as the reference.
#include <gtest/gtest.h>

#include "cli/cli_util.h"
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
const std::string kModel = std::string(ATELIER_FIXTURES_DIR) + "/text/stories260K.gguf";

using atelier::test::slurp;
using Out = atelier::test::CliRun;

struct Sandbox : atelier::test::ScratchDir {
  explicit Sandbox(const std::string& tag) : ScratchDir("atelier_queue_" + tag) {}
  Out run(const std::vector<std::string>& args) const { return atelier::test::run_atelier(args, dir); }
  std::string data() const { return (dir / "data").string(); }
};

std::vector<json> jsonl(const std::string& text) {
  std::vector<json> v;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) v.push_back(json::parse(line));
  return v;
}

std::string line(const std::string& prompt, int n, int seed, const std::string& model = kModel) {
  return json{{"model", model}, {"prompt", prompt}, {"max_new_tokens", n}, {"sampling", {{"temperature", 0.8}, {"seed", seed}}}}.dump();
}
}  // namespace

TEST(Batch, ResultsMatchSingleRunsAndFailuresAreListed) {
  Sandbox sb("batch");
  std::ofstream(sb.dir / "jobs.jsonl") << line("Once upon a time", 20, 1) << "\n\n"
                                        << line("The little dog", 20, 2) << "\n"
                                        << line("Lily", 8, 3, "/no/such/model.gguf") << "\n";
  Out r = sb.run({"batch", (sb.dir / "jobs.jsonl").string(), "--out", (sb.dir / "out").string(), "--data-dir", sb.data()});
  EXPECT_EQ(r.code, 1) << r.err;  // one line failed
  EXPECT_NE(r.err.find("line 4"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no such model file"), std::string::npos) << r.err;
  const auto results = jsonl(slurp(sb.dir / "out" / "results.jsonl"));
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[0]["line"], 1);
  EXPECT_EQ(results[1]["line"], 3);
  EXPECT_EQ(results[2]["line"], 4);
  EXPECT_EQ(results[2]["state"], "failed");
  const std::vector<std::pair<std::string, std::string>> refs = {{"Once upon a time", "1"}, {"The little dog", "2"}};
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(results[i]["state"], "completed");
    Out t = sb.run({"text", "-m", kModel, "-p", refs[i].first, "-n", "20", "--temp", "0.8", "--seed", refs[i].second});
    ASSERT_EQ(t.code, 0) << t.err;
    EXPECT_EQ(results[i]["text"].get<std::string>() + "\n", t.out) << "line " << results[i]["line"];
  }
}

TEST(Batch, ShardsSplitTheFileAndBadLinesQueueNothing) {
  Sandbox sb("shard");
  {
    std::ofstream f(sb.dir / "jobs.jsonl");
    for (int i = 0; i < 5; ++i) f << line("Once upon a time", 4, i) << "\n";
  }
  std::set<int> seen;
  for (const char* shard : {"0/2", "1/2"}) {
    const fs::path out = sb.dir / ("out" + std::string(1, shard[0]));
    Out r = sb.run({"batch", (sb.dir / "jobs.jsonl").string(), "--shard", shard, "--out", out.string(), "--data-dir", sb.data()});
    ASSERT_EQ(r.code, 0) << r.err;
    for (const auto& res : jsonl(slurp(out / "results.jsonl"))) {
      const int l = res["line"];
      EXPECT_EQ(l % 2, shard[0] - '0');
      EXPECT_TRUE(seen.insert(l).second) << "line " << l << " ran twice";
    }
  }
  EXPECT_EQ(seen, (std::set<int>{1, 2, 3, 4, 5}));

  std::ofstream(sb.dir / "bad.jsonl") << line("x", 4, 1) << "\n{\"model\": \"m\", \"promt\": \"typo\"}\n";
  const std::string fresh = (sb.dir / "fresh").string();
  Out bad = sb.run({"batch", (sb.dir / "bad.jsonl").string(), "--data-dir", fresh});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find(":2: unknown key 'promt'"), std::string::npos) << bad.err;
  Out list = sb.run({"queue", "list", "--json", "--data-dir", fresh});
  EXPECT_EQ(list.out, "");  // nothing was queued
  EXPECT_EQ(sb.run({"batch", (sb.dir / "jobs.jsonl").string(), "--shard", "2/2"}).code, 2);
}

TEST(Queue, AddListCancelThenHeadlessRunsTheRest) {
  Sandbox sb("queue");
  const std::string d = sb.data();
  Out a = sb.run({"queue", "--data-dir", d, "add", "-m", kModel, "-p", "Once upon a time", "-n", "12", "--seed", "5"});
  Out b = sb.run({"queue", "--data-dir", d, "add", "-m", kModel, "-p", "The cat", "-n", "12", "--priority", "3"});
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  const std::string id_a = a.out.substr(0, a.out.size() - 1), id_b = b.out.substr(0, b.out.size() - 1);
  auto queued = jsonl(sb.run({"queue", "--data-dir", d, "list", "--json"}).out);
  ASSERT_EQ(queued.size(), 2u);
  for (const auto& j : queued) EXPECT_EQ(j["state"], "queued");
  ASSERT_EQ(sb.run({"queue", "--data-dir", d, "cancel", id_b}).code, 0);
  EXPECT_NE(sb.run({"queue", "--data-dir", d, "cancel", "999"}).code, 0);

  ASSERT_EQ(sb.run({"queue", "--data-dir", d, "pause"}).code, 0);
  Out paused = sb.run({"--headless", "--data-dir", d});
  EXPECT_EQ(paused.code, 0) << paused.err;
  EXPECT_NE(paused.err.find("paused"), std::string::npos) << paused.err;
  ASSERT_EQ(sb.run({"queue", "--data-dir", d, "resume"}).code, 0);

  Out h = sb.run({"--headless", "--data-dir", d, "--metrics"});
  ASSERT_EQ(h.code, 0) << h.err;
  EXPECT_EQ(json::parse(h.out)["completed"], 1);
  std::map<std::string, json> by_id;
  for (const auto& j : jsonl(sb.run({"queue", "--data-dir", d, "list", "--json"}).out)) by_id[std::to_string(j["id"].get<int>())] = j;
  EXPECT_EQ(by_id[id_a]["state"], "completed");
  EXPECT_EQ(by_id[id_b]["state"], "cancelled");
  // A plain file: its sha256, and its path for people.
  EXPECT_EQ(by_id[id_a]["model_version"], "sha256:270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d");
  EXPECT_NE(by_id[id_a]["model_name"].get<std::string>().find("stories260K.gguf"), std::string::npos);
  Out t = sb.run({"text", "-m", kModel, "-p", "Once upon a time", "-n", "12", "--seed", "5"});
  EXPECT_EQ(by_id[id_a]["text"].get<std::string>() + "\n", t.out);

  Out m = sb.run({"metrics", "--json", "--data-dir", d});
  ASSERT_EQ(m.code, 0) << m.err;
  const json mj = json::parse(m.out);
  for (const char* key : {"tokens_per_s", "time_to_first_token_ms", "inter_token_ms", "batch_size_histogram", "queue_depth",
                          "kv_blocks_used", "kv_blocks_free", "prefix_cache_hit_rate", "busy_fraction", "alerts"})
    EXPECT_TRUE(mj.contains(key)) << key;
  // The device's memory (issue 35: the monitor showed 0): the CPU's, the machine's RAM.
  EXPECT_GT(mj.value("device_memory_total_bytes", int64_t{0}), int64_t{64} << 20) << m.out;
  EXPECT_GT(mj.value("device_memory_free_bytes", int64_t{0}), 0) << m.out;
  // The values this run caused: the runner ran one job of 12 new tokens
  // alone (b was cancelled before it started) and left nothing behind.
  EXPECT_EQ(mj["completed"].get<int>(), 1);
  EXPECT_EQ(mj["failed"].get<int>(), 0);
  EXPECT_EQ(mj["preemptions"].get<int>(), 0);
  EXPECT_EQ(mj["queue_depth"].get<int>(), 0);
  EXPECT_EQ(mj["running"].get<int>(), 0);
  EXPECT_EQ(mj["kv_blocks_used"].get<int>(), 0);
  EXPECT_EQ(mj["prefix_cache_hit_rate"].get<double>(), 0.0);  // one prompt: nothing to share
  const auto hist = mj["batch_size_histogram"].get<std::vector<int64_t>>();
  ASSERT_GE(hist.size(), 2u);
  // 12 tokens: the first from the prompt's step, 11 from decode steps of one sequence each.
  EXPECT_GE(hist[1], 11);
  EXPECT_LE(hist[1], 12);
  for (size_t k = 2; k < hist.size(); ++k) EXPECT_EQ(hist[k], 0) << "a step of " << k << " sequences, with one job";
  const double ttft = mj["time_to_first_token_ms"]["p50"], itl = mj["inter_token_ms"]["p50"];
  EXPECT_GT(ttft, 0);
  EXPECT_GT(itl, 0);
  EXPECT_EQ(by_id[id_a]["new_tokens"].get<int>(), 12);
  const double ran_ms = by_id[id_a]["finished_ms"].get<double>() - by_id[id_a]["started_ms"].get<double>();
  EXPECT_LE(itl, ran_ms + 1) << "an inter-token gap of the only job longer than its whole run";
  Out clear = sb.run({"queue", "--data-dir", d, "clear"});
  EXPECT_EQ(clear.code, 0);
  EXPECT_EQ(sb.run({"queue", "--data-dir", d, "list", "--json"}).out, "");
}

// Image requests ("kind": "image") share a batch file with text ones: each
// writes its PNG into the output folder, the same bytes `atelier image` writes.
TEST(Batch, ImageLinesWritePngsBesideTheTextResults) {
  Sandbox sb("images");
  const std::string qd = std::string(ATELIER_FIXTURES_DIR) + "/image/quickdraw-cvae.safetensors";
  std::ofstream(sb.dir / "jobs.jsonl")
      << line("Once upon a time", 8, 1) << "\n"
      << json{{"kind", "image"}, {"model", qd}, {"prompt", "an owl"}, {"width", 64}, {"height", 64}, {"seed", 4}}.dump() << "\n"
      << json{{"kind", "image"}, {"model", qd}, {"prompt", "nothing it knows"}, {"seed", 4}}.dump() << "\n";
  Out r = sb.run({"batch", (sb.dir / "jobs.jsonl").string(), "--out", (sb.dir / "out").string(), "--data-dir", sb.data()});
  EXPECT_EQ(r.code, 1) << r.err;  // the third line names no class
  const auto results = jsonl(slurp(sb.dir / "out" / "results.jsonl"));
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[0]["state"], "completed");
  EXPECT_EQ(results[1]["state"], "completed");
  EXPECT_EQ(results[1]["kind"], "image");
  ASSERT_EQ(results[1]["files"].size(), 1u);
  const std::string png = results[1]["files"][0];
  EXPECT_EQ(png, (sb.dir / "out" / "line-2.png").string());
  EXPECT_EQ(results[2]["state"], "failed");
  EXPECT_NE(results[2]["error"].get<std::string>().find("owl"), std::string::npos);  // the class list
  Out one = sb.run({"image", "-m", qd, "-p", "an owl", "-W", "64", "-H", "64", "--seed", "4", "-o", (sb.dir / "one.png").string()});
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_EQ(slurp(png), slurp(sb.dir / "one.png"));
}
