// End-to-end: `atelier batch merge` over the output folders of real
// `atelier batch --shard I/N` runs (stories260K), against one unsharded run of
// the same file as the reference; and what it refuses: a missing shard, a
// shard given twice, a lost line, results of another file, and failed lines.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli/cli_util.h"

namespace fs = std::filesystem;
using nlohmann::json;
using atelier::test::CliRun;
using atelier::test::jsonl;
using atelier::test::slurp;

namespace {

const std::string kModel = std::string(ATELIER_FIXTURES_DIR) + "/text/stories260K.gguf";

std::string request(int seed, const std::string& model = kModel) {
  return json{{"model", model}, {"prompt", "Once upon a time"}, {"max_new_tokens", 6}, {"sampling", {{"temperature", 0.8}, {"seed", seed}}}}
      .dump();
}

// A 9-line file with a blank line 5 (not a request): 8 requests.
struct Batch : atelier::test::CliSandbox {
  Batch() : CliSandbox("atelier_merge") {
    std::string text;
    for (int line = 1; line <= 9; ++line) text += (line == 5 ? std::string() : request(line)) + "\n";
    write("jobs.jsonl", text);
  }
  std::string file() const { return path("jobs.jsonl"); }
  // Shard I of N into DIR/shard-I (its own queue): the exit status.
  int shard(int i, int n) const {
    const std::string s = std::to_string(i) + "/" + std::to_string(n), d = path("shard-" + std::to_string(i));
    CliRun r = run({"batch", file(), "--shard", s, "--out", d, "--data-dir", d + "/data"});
    EXPECT_EQ(r.code, 0) << r.err;
    return r.code;
  }
  std::vector<std::string> shard_dirs(int n) const {
    std::vector<std::string> v;
    for (int i = 0; i < n; ++i) v.push_back(path("shard-" + std::to_string(i)));
    return v;
  }
  CliRun merge(std::vector<std::string> args) const {
    args.insert(args.begin(), {"batch", "merge"});
    return run(args);
  }
};

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST(BatchMerge, ShardsMergeIntoWhatOneRunWritesLineForLine) {
  Batch b;
  for (int i = 0; i < 3; ++i) ASSERT_EQ(b.shard(i, 3), 0);
  std::vector<std::string> args = b.shard_dirs(3);
  std::reverse(args.begin(), args.end());  // the order of the folders does not matter
  args.insert(args.end(), {"--batch", b.file(), "--out", b.path("merged")});
  CliRun m = b.merge(args);
  ASSERT_EQ(m.code, 0) << m.err;
  EXPECT_TRUE(has(m.err, "merged 8 line(s) from 3 folder(s)")) << m.err;

  CliRun one = b.run({"batch", b.file(), "--out", b.path("single"), "--data-dir", b.path("single-data")});
  ASSERT_EQ(one.code, 0) << one.err;
  const auto merged = jsonl(slurp(b.path("merged/results.jsonl"))), single = jsonl(slurp(b.path("single/results.jsonl")));
  ASSERT_EQ(merged.size(), 8u);
  ASSERT_EQ(merged.size(), single.size());
  for (size_t i = 0; i < merged.size(); ++i) {
    EXPECT_EQ(merged[i]["line"], single[i]["line"]);
    EXPECT_EQ(merged[i]["state"], "completed");
    // Job ids and speeds belong to each run's own queue; the rest is the same.
    for (const char* key : {"line", "state", "seed", "text", "stop_reason", "prompt_tokens", "new_tokens", "model_version"})
      EXPECT_EQ(merged[i][key], single[i][key]) << "line " << merged[i]["line"] << ", key " << key;
    EXPECT_FALSE(merged[i].contains("shard"));  // as one run writes it
  }
  EXPECT_EQ(merged[3]["line"], 4);
  EXPECT_EQ(merged[4]["line"], 6);  // line 5 is blank: no job, no result
}

TEST(BatchMerge, MissingDuplicatedAndForeignLinesAreNamedAndNothingIsWritten) {
  Batch b;
  for (int i = 0; i < 2; ++i) ASSERT_EQ(b.shard(i, 2), 0);
  const std::string s0 = b.path("shard-0"), s1 = b.path("shard-1"), out = b.path("merged");

  CliRun missing = b.merge({s0, "--out", out});
  EXPECT_EQ(missing.code, 1);
  EXPECT_TRUE(has(missing.err, "shard 1/2 is missing")) << missing.err;
  EXPECT_FALSE(fs::exists(out + "/results.jsonl"));

  CliRun twice = b.merge({s0, s1, s0, "--out", out});
  EXPECT_EQ(twice.code, 2);
  EXPECT_TRUE(has(twice.err, "is given twice")) << twice.err;

  fs::copy(s1, b.path("copy-of-1"), fs::copy_options::recursive);
  CliRun dup = b.merge({s0, s1, b.path("copy-of-1"), "--out", out});
  EXPECT_EQ(dup.code, 1);
  EXPECT_TRUE(has(dup.err, "line 3 is there twice: " + s1 + "/results.jsonl:2 and " + b.path("copy-of-1") + "/results.jsonl:2")) << dup.err;
  EXPECT_FALSE(fs::exists(out + "/results.jsonl"));

  // A line lost from a shard's file: only the batch file can tell.
  std::vector<std::string> kept;
  for (const auto& r : jsonl(slurp(s1 + "/results.jsonl")))
    if (r["line"] != 7) kept.push_back(r.dump());
  {
    std::ofstream f(s1 + "/results.jsonl");
    for (const auto& k : kept) f << k << "\n";
  }
  EXPECT_EQ(b.merge({s0, s1, "--out", out}).code, 0);  // by shards alone it looks whole
  fs::remove(out + "/results.jsonl");
  CliRun lost = b.merge({s0, s1, "--batch", b.file(), "--out", out});
  EXPECT_EQ(lost.code, 1);
  EXPECT_TRUE(has(lost.err, "1 line(s) of " + b.file() + " have no result: 7")) << lost.err;
  EXPECT_FALSE(fs::exists(out + "/results.jsonl"));

  // Results of a longer file than the one named.
  b.write("short.jsonl", request(1) + "\n" + request(2) + "\n");
  CliRun foreign = b.merge({s0, s1, "--batch", b.path("short.jsonl"), "--out", out});
  EXPECT_EQ(foreign.code, 1);
  EXPECT_TRUE(has(foreign.err, "line(s) 3, 4, 6, 8, 9 are not request lines of")) << foreign.err;

  CliRun into_shard = b.merge({s0, s1, "--out", s1});
  EXPECT_EQ(into_shard.code, 2);
  EXPECT_TRUE(has(into_shard.err, "is also a shard's folder")) << into_shard.err;
  EXPECT_TRUE(has(slurp(s1 + "/results.jsonl"), "\"shard\":\"1/2\""));  // left as it was

  CliRun none = b.merge({s0, b.path("never-ran"), "--out", out});
  EXPECT_EQ(none.code, 1);
  EXPECT_TRUE(has(none.err, "never-ran: no such folder")) << none.err;
  fs::create_directories(b.path("not-finished"));
  CliRun unfinished = b.merge({s0, b.path("not-finished"), "--out", out});
  EXPECT_EQ(unfinished.code, 1);
  EXPECT_TRUE(has(unfinished.err, "not-finished/results.jsonl does not exist: that shard has not finished")) << unfinished.err;
}

TEST(BatchMerge, FailedLinesAreMergedAndNamedWithExitStatusOne) {
  atelier::test::CliSandbox sb("atelier_merge_failed");
  // Line 2 names a model file that does not exist: batch fails that line and goes on.
  sb.write("jobs.jsonl", request(1) + "\n" + request(2, sb.path("no-such-model.gguf")) + "\n" + request(3) + "\n");
  for (const char* s : {"0/2", "1/2"}) {
    const std::string d = sb.path(std::string("shard-") + s[0]);
    CliRun r = sb.run({"batch", sb.path("jobs.jsonl"), "--shard", s, "--out", d, "--data-dir", d + "/data"});
    EXPECT_EQ(r.code, s[0] == '0' ? 1 : 0) << r.err;  // shard 0 holds line 2
  }
  CliRun m = sb.run({"batch", "merge", sb.path("shard-0"), sb.path("shard-1"), "--batch", sb.path("jobs.jsonl"), "--out", sb.path("m")});
  EXPECT_EQ(m.code, 1);
  EXPECT_TRUE(has(m.err, "1 of 3 lines did not complete")) << m.err;
  EXPECT_TRUE(has(m.err, "line 2: ")) << m.err;
  const auto merged = jsonl(slurp(sb.path("m/results.jsonl")));
  ASSERT_EQ(merged.size(), 3u);
  EXPECT_EQ(merged[1]["line"], 2);
  EXPECT_EQ(merged[1]["state"], "failed");
  EXPECT_EQ(merged[0]["state"], "completed");
  EXPECT_EQ(merged[2]["state"], "completed");
}
