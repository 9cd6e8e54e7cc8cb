// End-to-end tests of issue 31 on the built `atelier` binary: JSON nested
// thousands deep in a batch (it crashed with SIGSEGV before results.jsonl),
// queueing a large batch in chunks that a signal stops between (it was
// quadratic and deaf to SIGINT and SIGTERM), two identical lines that must
// be two jobs, and number flags whose errors say what was wrong.
#include <gtest/gtest.h>

#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_util.h"

namespace fs = std::filesystem;
using nlohmann::json;
using Out = atelier::test::CliRun;
using atelier::test::Child;
using atelier::test::jsonl;
using atelier::test::slurp;

namespace {

const std::string kFixtures = ATELIER_FIXTURES_DIR;
const std::string kModel = kFixtures + "/text/stories260K.gguf";

struct Sandbox : atelier::test::CliSandbox {
  explicit Sandbox(const std::string& tag) : CliSandbox("atelier_batchin_" + tag) {}
};

std::string text_line(const std::string& prompt, int n, int seed) {
  return json{{"model", kModel}, {"prompt", prompt}, {"max_new_tokens", n}, {"sampling", {{"temperature", 0.8}, {"seed", seed}}}}.dump();
}

// Runs CMD in the background and waits at most SECONDS for it: a batch that
// waits forever (a job that is never queued) fails the test instead of hanging it.
int run_within(const std::vector<std::string>& cmd, const Sandbox& sb, int seconds, std::string* err) {
  Child c(cmd, sb.dir);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  int code = -1;
  while (!c.ended(&code)) {
    if (std::chrono::steady_clock::now() > deadline) {
      *err = slurp(c.err);
      return -1;  // ~Child kills it
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  *err = slurp(c.err);
  return code;
}

// Waits until FILE holds NEEDLE (what a child printed); false after 60 s.
bool wait_for_text(const std::string& file, const std::string& needle) {
  for (int i = 0; i < 3000; ++i) {
    if (slurp(file).find(needle) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// SQLite's write lock on a database, held from this process as another writer would.
struct WriteLock {
  sqlite3* db = nullptr;
  explicit WriteLock(const std::string& path) {
    EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK) << path;
    EXPECT_EQ(sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  }
  void release() {
    if (!db) return;
    sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    sqlite3_close_v2(db);
    db = nullptr;
  }
  ~WriteLock() { release(); }
};

}  // namespace

// Item 2: a json_schema nested 8,000 levels (200 KB) killed the batch with
// SIGSEGV before results.jsonl; a line nested 100,000 deep is a line error.
TEST(BatchInput, DeepJsonIsALineErrorNamingTheLimit) {
  Sandbox sb("deep");
  std::string schema;
  for (int i = 0; i < 8000; ++i) schema += R"({"type":"array","items":)";
  schema += R"({"type":"string"})" + std::string(8000, '}');
  json deep_schema = json::parse(text_line("Once", 8, 1));
  deep_schema["json_schema"] = schema;
  sb.write("schema.jsonl", deep_schema.dump() + "\n" + text_line("Once upon a time", 2, 2) + "\n");
  std::string err;
  const int code = run_within({"batch", sb.path("schema.jsonl"), "--out", sb.path("out"), "--data-dir", sb.data()}, sb, 120, &err);
  ASSERT_EQ(code, 1) << err;  // before the fix: killed by SIGSEGV
  const auto results = jsonl(slurp(sb.path("out/results.jsonl")));
  ASSERT_EQ(results.size(), 2u) << err;
  EXPECT_EQ(results[0]["state"], "failed");
  EXPECT_NE(results[0]["error"].get<std::string>().find("more than 64 levels deep"), std::string::npos) << results[0].dump();
  EXPECT_EQ(results[1]["state"], "completed") << results[1].dump();

  // The line itself nested 100,000 deep (an ignored-looking field): refused while reading, nothing queued.
  sb.write("line.jsonl", text_line("Once", 2, 1) + "\n" + R"({"model":"m","prompt":"x","stop":)" + std::string(100000, '[') +
                             std::string(100000, ']') + "}\n");
  Out r = sb.run({"batch", sb.path("line.jsonl"), "--out", sb.path("out2"), "--data-dir", sb.data()});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("line.jsonl:2: the request nests objects and arrays more than 64 levels deep"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nothing was queued"), std::string::npos) << r.err;
}

// Item 11: a line's job is known by its text AND its number (and --out).
// Without the number, two identical lines queued one job and the batch
// waited forever for the second.
TEST(BatchInput, TwoIdenticalLinesAreTwoJobsAndBothReachTheResults) {
  Sandbox sb("twins");
  const std::string line = text_line("Once upon a time", 4, 7);
  sb.write("twins.jsonl", line + "\n" + line + "\n");
  std::string err;
  const int code = run_within({"batch", sb.path("twins.jsonl"), "--out", sb.path("out"), "--data-dir", sb.data()}, sb, 120, &err);
  ASSERT_EQ(code, 0) << "the batch did not finish within 120 s (or failed): " << err;
  const auto results = jsonl(slurp(sb.path("out/results.jsonl")));
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0]["line"], 1);
  EXPECT_EQ(results[1]["line"], 2);
  EXPECT_NE(results[0]["job"], results[1]["job"]);
  for (const auto& r : results) EXPECT_EQ(r["state"], "completed") << r.dump();
  EXPECT_EQ(results[0]["text"], results[1]["text"]);  // the same request and seed
  EXPECT_EQ(jsonl(sb.run({"queue", "--data-dir", sb.data(), "list", "--json"}).out).size(), 2u);
}

// Item 9: SIGINT or SIGTERM while a batch is queueing stops it between two
// chunks (1,000 lines each, one transaction): it says how many lines are
// queued, exits 128 + the signal, and the same command queues the rest, none twice.
// Deterministic: the queue's write lock is held while the signal lands, so the
// first chunk is waiting for it.
TEST(BatchInput, ASignalWhileQueueingStopsBetweenChunksAndARerunQueuesTheRest) {
  for (int sig : {SIGINT, SIGTERM}) {
    Sandbox sb(std::string("signal") + std::to_string(sig));
    ASSERT_EQ(sb.run({"queue", "--data-dir", sb.data(), "pause"}).code, 0);  // nothing runs: this is about queueing
    {
      std::ofstream f(sb.dir / "many.jsonl");
      for (int i = 0; i < 2500; ++i) f << text_line("Once", 2, i) << "\n";
    }
    const std::vector<std::string> cmd = {"batch", sb.path("many.jsonl"), "--out", sb.path("out"), "--data-dir", sb.data()};
    {
      WriteLock lock(sb.data() + "/jobs.db");
      Child c(cmd, sb.dir);
      ASSERT_GT(c.pid, 0);
      ASSERT_TRUE(wait_for_text(c.err, "queueing 2500 line(s)")) << slurp(c.err);
      ::kill(c.pid, sig);
      lock.release();
      const int code = c.wait();
      EXPECT_EQ(code, 128 + sig) << slurp(c.err);
      EXPECT_NE(slurp(c.err).find("interrupted while queueing: 1000 of 2500 line(s) are queued"), std::string::npos) << slurp(c.err);
      const auto results = jsonl(slurp(sb.path("out/results.jsonl")));
      ASSERT_EQ(results.size(), 2500u);
      EXPECT_EQ(results[999]["state"], "queued");
      EXPECT_EQ(results[1000]["state"], "not_queued");
      EXPECT_NE(results[1000]["error"].get<std::string>().find("run the same command again"), std::string::npos);
    }
    EXPECT_EQ(jsonl(sb.run({"queue", "--data-dir", sb.data(), "list", "--json", "--limit", "100000"}).out).size(), 1000u);
    // The rerun queues the other 1,500 (then waits on the paused queue until it is stopped).
    Child again(cmd, sb.dir, "again");
    ASSERT_TRUE(wait_for_text(again.err, "jobs |")) << slurp(again.err);  // the progress line: queueing is over
    ::kill(again.pid, SIGTERM);
    EXPECT_EQ(again.wait(), 1) << slurp(again.err);  // interrupted while waiting, as before
    EXPECT_NE(slurp(again.err).find("1000 of 2500 line(s) were queued by an earlier run"), std::string::npos) << slurp(again.err);
    const auto all = jsonl(sb.run({"queue", "--data-dir", sb.data(), "list", "--json", "--limit", "100000"}).out);
    EXPECT_EQ(all.size(), 2500u);
    for (const auto& j : all) EXPECT_EQ(j["state"], "queued") << j.dump();
  }
}

// Item 10: a number flag given something that is not a number says so and what it wants.
TEST(BatchInput, NumberFlagsSayWhatWasWrongAndTheFormWanted) {
  Sandbox sb("flags");
  const struct {
    std::vector<std::string> args;
    std::string want;
  } cases[] = {
      {{"text", "-m", kModel, "-p", "x", "-n", "abc"}, "--n-predict: 'abc' is not a whole number; give a whole number from 1 to 1048576"},
      {{"text", "-m", kModel, "-p", "x", "-n", "1.5"}, "--n-predict: '1.5' is not a whole number; give a whole number from 1 to 1048576"},
      {{"queue", "--data-dir", sb.data(), "cancel", "abc"}, "ids: 'abc' is not a whole number; give a whole number"},
      {{"queue", "--data-dir", sb.data(), "add", "-m", kModel, "-p", "x", "--priority", "nan"},
       "--priority: 'nan' is not a whole number; give a whole number from -2147483648 to 2147483647"},
      {{"queue", "--data-dir", sb.data(), "add", "-m", kModel, "-p", "x", "--priority", "99999999999"}, "--priority"},
      {{"text", "-m", kModel, "-p", "x", "--temp", "abc"}, "--temp: 'abc' is not a number; give a number from 0 to 100"},
      {{"text", "-m", kModel, "-p", "x", "--temp", "nan"}, "--temp: 'nan' is not a finite number; give a number from 0 to 100"},
      {{"text", "-m", kModel, "-p", "x", "--top-p", "x"}, "--top-p: 'x' is not a number; give a number from 0 to 1"},
  };
  for (const auto& c : cases) {
    Out r = sb.run(c.args);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find(c.want), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("Could not convert"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("not in range"), std::string::npos) << r.err;
  }
}
