// Issue 35: SIGTERM and SIGINT to `atelier batch` and `atelier --headless`
// never wait on a step without bound. The job is a 1536x1536 image on a
// narrow synthetic SD 1.5 model, whose one UNet call takes tens of seconds
// (minutes under ASan): each process must exit within a few seconds of the
// signal, and the queue keeps the job (queued again, not failed).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_util.h"

namespace fs = std::filesystem;
using nlohmann::json;
using atelier::test::Child;
using atelier::test::jsonl;

namespace {

using Clock = std::chrono::steady_clock;

struct Sandbox : atelier::test::CliSandbox {
  explicit Sandbox(const std::string& tag) : CliSandbox("atelier_shutdown_" + tag) {}
  json job(int64_t id) const {
    for (const json& j : jsonl(run({"queue", "--data-dir", data(), "list", "--json"}).out))
      if (j.value("id", int64_t{0}) == id) return j;
    return json();
  }
  // Waits (no limit of its own: the test's timeout is the limit) until a job
  // runs, or C ended; the running job's id, 0 when C ended first.
  int64_t await_running(Child& c, int* code) const {
    for (;;) {
      if (c.ended(code)) return 0;
      for (const json& j : jsonl(run({"queue", "--data-dir", data(), "list", "--json", "--state", "running"}).out))
        return j.value("id", int64_t{0});
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  // Sends SIG to C once its job runs (a second into the UNet call) and
  // returns the exit code and the seconds it took to exit (-1: still alive 20 s later).
  std::pair<int, double> signal_during_step(Child& c, int sig, int64_t* id) const {
    int code = 0;
    *id = await_running(c, &code);
    EXPECT_NE(*id, 0) << "ended before its job ran (" << code << "): " << atelier::test::slurp(c.err);
    if (*id == 0) return {code, 0};
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const auto t0 = Clock::now();
    ::kill(c.pid, sig);
    while (Clock::now() - t0 < std::chrono::seconds(20)) {
      if (c.ended(&code)) return {code, std::chrono::duration<double>(Clock::now() - t0).count()};
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return {-1, -1};
  }
};

}  // namespace

TEST(Shutdown, BatchAndHeadlessStopWithinSecondsDuringAHugeStep) {
  Sandbox sb("huge");
  const std::string model = sb.path("narrow.safetensors");
  ASSERT_EQ(sb.run({"models", "synth", "--arch", "sd15", "--width-mult", "0.1", "--type", "f32", "-o", model}).code, 0);
  sb.write("big.jsonl", json{{"kind", "image"}, {"model", model}, {"prompt", "a lighthouse"}, {"width", 1536}, {"height", 1536},
                            {"steps", 2}, {"seed", 5}, {"tokenizer", std::string(ATELIER_FIXTURES_DIR) + "/clip/bpe_simple_vocab_16e6.txt.gz"}}
                                .dump() + "\n");
  int64_t id = 0;
  {
    Child batch({"batch", sb.path("big.jsonl"), "--out", sb.path("out"), "--data-dir", sb.data(), "--threads", "2"}, sb.dir, "batch");
    const auto [code, seconds] = sb.signal_during_step(batch, SIGTERM, &id);
    ASSERT_NE(id, 0);
    ASSERT_GE(seconds, 0) << "atelier batch still running 20 s after SIGTERM";
    EXPECT_LT(seconds, 8.0);
    // Interrupted while running (README): results.jsonl names the line queued, exit 1.
    EXPECT_EQ(code, 1) << atelier::test::slurp(batch.err);
    EXPECT_NE(atelier::test::slurp(batch.err).find("interrupted"), std::string::npos) << atelier::test::slurp(batch.err);
  }
  EXPECT_EQ(sb.job(id).value("state", ""), "queued") << sb.job(id).dump();
  {
    Child headless({"--headless", "--data-dir", sb.data(), "--threads", "2"}, sb.dir, "headless");
    int64_t again = 0;
    const auto [code, seconds] = sb.signal_during_step(headless, SIGINT, &again);
    ASSERT_EQ(again, id);
    ASSERT_GE(seconds, 0) << "atelier --headless still running 20 s after SIGINT";
    EXPECT_LT(seconds, 8.0);
    EXPECT_LT(code, 128) << atelier::test::slurp(headless.err);  // it stops, not dies
  }
  EXPECT_EQ(sb.job(id).value("state", ""), "queued") << sb.job(id).dump();
}
