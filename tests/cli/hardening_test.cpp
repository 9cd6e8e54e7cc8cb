// End-to-end regression tests of issue 14 (hardening): what a batch line, a
// flag, a file or a fault can do to the built `atelier` binary. Each test
// failed before its fix (a crash with exit 134, a rerun that repeated work, a
// half-written results.jsonl, a file written outside --out, ...).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
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
const std::string kCvae = kFixtures + "/image/quickdraw-cvae.safetensors";

struct Sandbox : atelier::test::CliSandbox {
  explicit Sandbox(const std::string& tag) : CliSandbox("atelier_hard_" + tag) {}
};

std::string text_line(const std::string& prompt, int n, int seed) {
  return json{{"model", kModel}, {"prompt", prompt}, {"max_new_tokens", n}, {"sampling", {{"temperature", 0.8}, {"seed", seed}}}}.dump();
}

std::string image_line(const std::string& output, int seed = 1) {
  json j = {{"kind", "image"}, {"model", kCvae}, {"prompt", "apple"}, {"width", 32}, {"height", 32}, {"seed", seed}};
  if (!output.empty()) j["output"] = output;
  return j.dump();
}

// Polls `queue list` until N jobs are queued (the batch has submitted its lines).
bool wait_for_jobs(const Sandbox& sb, size_t n) {
  for (int i = 0; i < 600; ++i) {
    Out l = sb.run({"queue", "--data-dir", sb.data(), "list", "--json"});
    if (jsonl(l.out).size() >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace

// Defect 1 (and 10: max_new_tokens 1e300 read as -2147483648; "kind": "video").
TEST(HardBatch, NumbersTooLargeAreClearErrorsNotACrash) {
  Sandbox sb("numbers");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"model": "stories260k", "prompt": "Once", "priority": 1e400})", "too large"},
      {R"({"model": "m", "prompt": "Once", "sampling": {"temperature": 1e999}})", "too large"},
      {R"({"model": "m", "prompt": "Once", "max_new_tokens": -1e400})", "too large"},
      {R"({"model": "m", "prompt": "Once", "max_new_tokens": 1e300})", "whole number between -2147483648 and 2147483647, got 1e+300"},
      {R"({"model": "m", "prompt": "Once", "max_new_tokens": 2.5})", "whole number"},
      {R"({"model": "m", "prompt": "Once", "priority": 99999999999})", "whole number"},
      {R"({"model": "m", "prompt": "Once", "sampling": {"seed": -5}})", "between 0 and"},
      {R"({"model": "m", "prompt": "Once", "sampling": {"seed": 18446744073709551616}})", "between 0 and"},
      {R"({"model": "m", "prompt": "Once", "sampling": {"top_p": 1e300}})", "out of range"},
      {R"({"kind": "image", "model": "m", "prompt": "x", "width": 1e300})", "whole number"},
      {R"({"kind": "image", "model": "m", "prompt": "x", "cfg_scale": 1e39})", "out of range"},
      {R"({"kind": "video", "model": "m", "prompt": "x"})", "use \"text\" (the default) or \"image\""},
      {R"({"kind": 7, "model": "m", "prompt": "x"})", "unknown kind 7"},
  };
  std::string file;
  for (const auto& c : cases) file += c.first + "\n";
  sb.write("bad.jsonl", file);
  Out r = sb.run({"batch", sb.path("bad.jsonl"), "--out", sb.path("out"), "--data-dir", sb.data()});
  EXPECT_EQ(r.code, 2) << r.err;  // before the fix: 134 (terminate called ... out_of_range.406)
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string where = ":" + std::to_string(i + 1) + ": ";
    const size_t at = r.err.find(where);
    ASSERT_NE(at, std::string::npos) << "line " << i + 1 << " not reported:\n" << r.err;
    const std::string msg = r.err.substr(at, r.err.find('\n', at) - at);
    EXPECT_NE(msg.find(cases[i].second), std::string::npos) << msg;
    EXPECT_EQ(msg.find("-2147483648, got -2147483648"), std::string::npos) << msg;
  }
  EXPECT_NE(r.err.find("nothing was queued"), std::string::npos);
  EXPECT_FALSE(fs::exists(sb.path("out") + "/results.jsonl"));
}

// Defect 2: a batch killed (SIGTERM, SIGINT, SIGKILL) and run again does each line once.
TEST(HardBatch, AnInterruptedBatchWritesItsResultsAndARerunDoesEachLineOnce) {
  Sandbox sb("resume");
  {
    std::ofstream f(sb.dir / "jobs.jsonl");
    for (int i = 0; i < 6; ++i) f << text_line("Once upon a time", 6, i) << "\n";
    f << image_line("") << "\n";
  }
  const std::vector<std::string> cmd = {"batch", sb.path("jobs.jsonl"), "--out", sb.path("out"), "--data-dir", sb.data()};
  // Paused, nothing can finish: the interrupt lands while every job waits.
  ASSERT_EQ(sb.run({"queue", "--data-dir", sb.data(), "pause"}).code, 0);
  for (int sig : {SIGTERM, SIGINT, SIGKILL}) {
    Child c(cmd, sb.dir);
    ASSERT_GT(c.pid, 0);
    ASSERT_TRUE(wait_for_jobs(sb, 7));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::kill(c.pid, sig);
    const int code = c.wait();
    if (sig == SIGKILL) {
      EXPECT_EQ(code, 128 + SIGKILL);
      continue;
    }
    EXPECT_EQ(code, 1) << slurp(c.err);
    // results.jsonl lists every line, none finished, each saying how to finish it.
    const auto results = jsonl(slurp(sb.dir / "out" / "results.jsonl"));
    ASSERT_EQ(results.size(), 7u) << slurp(c.err);
    for (const auto& r : results) {
      EXPECT_EQ(r["state"], "queued") << r.dump();
      EXPECT_NE(r["error"].get<std::string>().find("rerun the same command"), std::string::npos) << r.dump();
    }
    EXPECT_NE(slurp(c.err).find("line 7"), std::string::npos) << slurp(c.err);
    // Still 7 jobs: each rerun found the jobs of the one before.
    EXPECT_EQ(jsonl(sb.run({"queue", "--data-dir", sb.data(), "list", "--json"}).out).size(), 7u);
  }
  ASSERT_EQ(sb.run({"queue", "--data-dir", sb.data(), "resume"}).code, 0);
  Out done = sb.run(cmd);
  ASSERT_EQ(done.code, 0) << done.err;
  EXPECT_NE(done.err.find("7 of 7 line(s) were queued by an earlier run"), std::string::npos) << done.err;
  const auto results = jsonl(slurp(sb.dir / "out" / "results.jsonl"));
  ASSERT_EQ(results.size(), 7u);
  std::set<int64_t> jobs;
  for (const auto& r : results) {
    EXPECT_EQ(r["state"], "completed") << r.dump();
    jobs.insert(r["job"].get<int64_t>());
  }
  EXPECT_EQ(jobs.size(), 7u);
  // Once more: nothing is run again (the same job ids), and the queue still holds 7 jobs.
  Out again = sb.run(cmd);
  ASSERT_EQ(again.code, 0) << again.err;
  for (const auto& r : jsonl(slurp(sb.dir / "out" / "results.jsonl"))) EXPECT_TRUE(jobs.count(r["job"].get<int64_t>())) << r.dump();
  const auto all = jsonl(sb.run({"queue", "--data-dir", sb.data(), "list", "--json"}).out);
  EXPECT_EQ(all.size(), 7u);
  for (const auto& j : all) EXPECT_EQ(j["attempts"], 1) << j.dump();
  // The same lines into another folder are another batch.
  Out other = sb.run({"batch", sb.path("jobs.jsonl"), "--out", sb.path("out2"), "--data-dir", sb.data()});
  ASSERT_EQ(other.code, 0) << other.err;
  EXPECT_EQ(jsonl(sb.run({"queue", "--data-dir", sb.data(), "list", "--json"}).out).size(), 14u);
}

// Defect 3: a full disk under --out leaves no half-written results.jsonl (an
// earlier one stays whole) and lists the failed lines. A real full disk: a
// 1 MiB tmpfs in a private mount namespace, filled up.
TEST(HardBatch, AFullDiskLeavesTheEarlierResultsWhole) {
  if (std::system("unshare -rm true >/dev/null 2>&1") != 0) GTEST_SKIP() << "unshare -rm (user and mount namespaces) is not available here";
  Sandbox sb("full");
  sb.write("jobs.jsonl", text_line("Once upon a time", 8, 1) + "\n" + text_line("Lily", 8, 2) + "\n" +
                             json{{"model", "/no/such/model.gguf"}, {"prompt", "x"}}.dump() + "\n");
  const std::string out = sb.path("mnt");
  fs::create_directories(out);
  std::string batch = atelier::test::shell_quote(atelier::test::atelier_binary()) + " batch " + atelier::test::shell_quote(sb.path("jobs.jsonl")) +
                      " --out " + atelier::test::shell_quote(out) + " --data-dir " + atelier::test::shell_quote(sb.data());
  const std::string script = "mount -t tmpfs -o size=1m tmpfs " + atelier::test::shell_quote(out) + " || exit 99; " + batch +
                             " 2>" + sb.path("err1") + "; echo $? >" + sb.path("code1") + "; cp " + out + "/results.jsonl " +
                             sb.path("first.jsonl") + "; cat /dev/zero > " + out + "/fill 2>/dev/null; " + batch + " 2>" +
                             sb.path("err2") + "; echo $? >" + sb.path("code2") + "; cp " + out + "/results.jsonl " +
                             sb.path("second.jsonl") + "; ls " + out + " >" + sb.path("ls");
  const int rc = std::system(("unshare -rm sh -c " + atelier::test::shell_quote(script)).c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 99) GTEST_SKIP() << "cannot mount a tmpfs in a user namespace here";
  EXPECT_EQ(slurp(sb.path("code1")), "1\n") << slurp(sb.path("err1"));  // one line fails (no such model)
  const std::string first = slurp(sb.path("first.jsonl"));
  ASSERT_EQ(jsonl(first).size(), 3u);
  EXPECT_EQ(slurp(sb.path("code2")), "1\n");
  const std::string err = slurp(sb.path("err2"));
  EXPECT_NE(err.find("disk is full"), std::string::npos) << err;
  EXPECT_NE(err.find("line 3"), std::string::npos) << err;  // the failed line is listed
  EXPECT_EQ(slurp(sb.path("second.jsonl")), first);         // not cut, not emptied
  EXPECT_EQ(slurp(sb.path("ls")), "fill\nresults.jsonl\n");  // no temporary file left behind
}

// Defect 4: a line's "output" stays inside --out unless allowed, and never replaces a file without --overwrite.
TEST(HardBatch, OutputPathsStayInsideOutAndNeverOverwriteSilently) {
  Sandbox sb("paths");
  const std::string out = sb.path("out");
  auto batch = [&](const std::string& lines, std::vector<std::string> extra = {}) {
    sb.write("b.jsonl", lines);
    std::vector<std::string> args = {"batch", sb.path("b.jsonl"), "--out", out, "--data-dir", sb.data()};
    args.insert(args.end(), extra.begin(), extra.end());
    return sb.run(args);
  };
  const std::string nowhere = sb.path("nonexistent/dir/x.png");
  for (const std::string& o : {nowhere, std::string("../../escape.png"), std::string("sub/../../x.png")}) {
    Out r = batch(image_line(o) + "\n");
    EXPECT_EQ(r.code, 2) << o << ": " << r.err;
    EXPECT_NE(r.err.find("outside the --out folder"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--allow-any-output"), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(sb.path("escape.png")));
  EXPECT_FALSE(fs::exists(sb.path("nonexistent")));
  // Allowed, an absolute path into a missing folder is refused before rendering, and no folder is made.
  Out missing = batch(image_line(nowhere) + "\n", {"--allow-any-output"});
  EXPECT_EQ(missing.code, 1) << missing.err;
  EXPECT_NE(missing.err.find("does not exist"), std::string::npos) << missing.err;
  EXPECT_FALSE(fs::exists(sb.path("nonexistent")));
  // Relative values land inside --out (subfolders made there).
  Out rel = batch(image_line("sub/a.png", 2) + "\n");
  ASSERT_EQ(rel.code, 0) << rel.err;
  EXPECT_EQ(slurp(out + "/sub/a.png").substr(1, 3), "PNG");
  // An existing file is not replaced without --overwrite.
  fs::create_directories(out);
  std::ofstream(out + "/notes.txt") << "my notes\n";
  Out keep = batch(image_line("notes.txt", 3) + "\n");
  EXPECT_EQ(keep.code, 1) << keep.err;
  EXPECT_NE(keep.err.find("already exists: pass --overwrite"), std::string::npos) << keep.err;
  EXPECT_EQ(slurp(out + "/notes.txt"), "my notes\n");
  Out replace = batch(image_line("notes.txt", 3) + "\n", {"--overwrite"});
  EXPECT_EQ(replace.code, 0) << replace.err;
  EXPECT_EQ(slurp(out + "/notes.txt").substr(1, 3), "PNG");
}

// Defect 9, and the batch file being something else than a file.
TEST(HardBatch, AFolderOrAnEmptyFileIsRefused) {
  Sandbox sb("dir");
  Out d = sb.run({"batch", sb.dir.string(), "--data-dir", sb.data()});
  EXPECT_EQ(d.code, 2) << d.err;  // before: exit 0, "0/0 jobs"
  EXPECT_NE(d.err.find("is a folder"), std::string::npos) << d.err;
  sb.write("empty.jsonl", "\n\n");
  Out e = sb.run({"batch", sb.path("empty.jsonl"), "--data-dir", sb.data()});
  EXPECT_EQ(e.code, 2) << e.err;
  EXPECT_NE(e.err.find("holds no request"), std::string::npos) << e.err;
  ASSERT_EQ(::mkfifo(sb.path("fifo").c_str(), 0600), 0);
  Out f = sb.run({"batch", sb.path("fifo"), "--data-dir", sb.data()});
  EXPECT_EQ(f.code, 2) << f.err;
  EXPECT_NE(f.err.find("not a regular file"), std::string::npos) << f.err;
  Out none = sb.run({"batch", sb.path("missing.jsonl"), "--data-dir", sb.data()});
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.err.find("no such batch file"), std::string::npos) << none.err;
}

// Defect 10: one context limit for the flag and the batch line; a text model in an image line.
TEST(HardBatch, BatchAndCliAgreeAndSayWhatIsWrong) {
  Sandbox sb("agree");
  Out cli = sb.run({"text", "-m", kModel, "-p", "Once", "-n", "100000"});
  EXPECT_EQ(cli.code, 2) << cli.err;
  const size_t at = cli.err.find("context size ");
  ASSERT_NE(at, std::string::npos) << cli.err;
  const std::string limit = cli.err.substr(at, cli.err.find(',', at) - at);  // "context size 512"
  sb.write("b.jsonl", json{{"model", kModel}, {"prompt", "Once"}, {"max_new_tokens", 100000}}.dump() + "\n" +
                          json{{"kind", "image"}, {"model", kModel}, {"prompt", "apple"}, {"width", 32}, {"height", 32}}.dump() + "\n");
  Out b = sb.run({"batch", sb.path("b.jsonl"), "--out", sb.path("out"), "--data-dir", sb.data()});
  EXPECT_EQ(b.code, 1) << b.err;
  EXPECT_NE(b.err.find("line 1 (job 0): max new tokens must be between 1 and the " + limit), std::string::npos) << b.err;
  EXPECT_NE(b.err.find("line 2 (job 0): " + kModel + " is a text model (GGUF)"), std::string::npos) << b.err;
  EXPECT_EQ(b.err.find("header"), std::string::npos) << b.err;
}

// Defect 7: FIFOs where files go are refused at once, never read (they would block until killed).
TEST(HardFlags, FifosAreRefusedNotRead) {
  Sandbox sb("fifo");
  const std::string fifo = sb.path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string bin = kFixtures + "/text/stories260K.bin", init = kFixtures + "/image/llama_cute.jpg";
  const std::vector<std::vector<std::string>> cases = {
      {"text", "-m", bin, "--tokenizer", fifo, "-p", "Once", "-n", "2"},
      {"image", "-m", kCvae, "-p", "apple", "-W", "32", "-H", "32", "--init", init, "--mask", fifo, "-o", sb.path("a.png")},
      {"image", "-m", kCvae, "-p", "apple", "-W", "32", "-H", "32", "--init", fifo, "-o", sb.path("a.png")},
      {"image", "-m", kCvae, "-p", "apple", "-W", "32", "-H", "32", "--tokenizer", fifo, "-o", sb.path("a.png")},
      {"image", "-m", kCvae, "-p", "apple", "-W", "32", "-H", "32", "--taesd", fifo, "-o", sb.path("a.png")},
  };
  for (auto args : cases) {
    args.insert(args.begin(), {"20", atelier::test::atelier_binary()});  // `timeout 20`: a hang fails the test instead of stalling it
    std::string cmd = "timeout";
    for (const auto& a : args) cmd += " " + atelier::test::shell_quote(a);
    const int rc = std::system((cmd + " >/dev/null 2>" + sb.path("err")).c_str());
    const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
    EXPECT_EQ(code, 2) << args[4] << " " << args[5] << ": " << slurp(sb.path("err"));
    EXPECT_NE(slurp(sb.path("err")).find("not a regular file"), std::string::npos) << slurp(sb.path("err"));
  }
}

// Defect 8: a seed that is not a whole number 0..2^64-2 is refused, not wrapped or made random.
TEST(HardFlags, SeedsOutOfRangeAreRefused) {
  Sandbox sb("seed");
  for (const char* seed : {"18446744073709551616", "-5", "1.5", "18446744073709551615", "0x10", "", "99999999999999999999999"}) {
    Out t = sb.run({"text", "-m", kModel, "-p", "Once", "-n", "2", "--seed", seed});
    EXPECT_EQ(t.code, 2) << seed << ": " << t.err;
    EXPECT_NE(t.err.find("whole number from 0 to 18446744073709551614"), std::string::npos) << seed << ": " << t.err;
    Out i = sb.run({"image", "-m", kCvae, "-p", "apple", "-W", "32", "-H", "32", "--seed", seed, "-o", sb.path("x.png")});
    EXPECT_EQ(i.code, 2) << seed << ": " << i.err;
    Out q = sb.run({"queue", "--data-dir", sb.data(), "add", "-m", kModel, "-p", "x", "--seed", seed});
    EXPECT_EQ(q.code, 2) << seed << ": " << q.err;
  }
  // The largest seed is kept as given: two runs agree.
  Out a = sb.run({"text", "-m", kModel, "-p", "Once", "-n", "8", "--seed", "18446744073709551614"});
  Out b = sb.run({"text", "-m", kModel, "-p", "Once", "-n", "8", "--seed", "18446744073709551614"});
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
}

// Defect 10: `image -o FOLDER` fails before the render; `image --threads 0` is refused like `text --threads 0`.
TEST(HardFlags, ImageOutputAndThreadsAreCheckedFirst) {
  Sandbox sb("imgout");
  Out dir = sb.run({"image", "-m", kCvae, "-p", "apple", "-W", "32", "-H", "32", "-o", sb.dir.string(), "--json"});
  EXPECT_EQ(dir.code, 2) << dir.err;
  EXPECT_NE(dir.err.find("is a folder"), std::string::npos) << dir.err;
  EXPECT_EQ(dir.out.find("\"step\""), std::string::npos) << "rendered before refusing: " << dir.out;
  Out missing = sb.run({"image", "-m", kCvae, "-p", "apple", "-W", "32", "-H", "32", "-o", sb.path("no/such/x.png"), "--json"});
  EXPECT_EQ(missing.code, 1) << missing.err;
  EXPECT_NE(missing.err.find("does not exist"), std::string::npos) << missing.err;
  EXPECT_EQ(missing.out.find("\"step\""), std::string::npos) << missing.out;
  for (const char* cmd : {"image", "text"}) {
    std::vector<std::string> args = {cmd, "-m", std::string(cmd) == "image" ? kCvae : kModel, "-p", "apple", "--threads", "0"};
    if (std::string(cmd) == "image") args.insert(args.end(), {"-o", sb.path("t.png")});
    Out r = sb.run(args);
    EXPECT_EQ(r.code, 2) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find("--threads"), std::string::npos) << r.err;
  }
}

namespace {
const std::string kGgufSha = "270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d";

// Flips a byte in the middle of a (read-only) blob, as a failing disk would.
void damage(const std::string& path) {
  fs::permissions(path, fs::perms::owner_write, fs::perm_options::add);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(fs::file_size(path) / 2));
  f.put('\x5a');
}
}  // namespace

// Defect 5: the advice for a damaged blob works: pulling or importing the same file again repairs it.
TEST(HardStore, PullingOrImportingAgainRepairsADamagedBlob) {
  Sandbox sb("repairblob");
  const std::string store = sb.path("store"), blob = store + "/blobs/sha256/" + kGgufSha;
  ASSERT_EQ(sb.run({"models", "pull", "stories260k", "--mirror", kFixtures, "--store", store}).code, 0);
  damage(blob);
  ASSERT_EQ(sb.run({"models", "verify", "--store", store}).code, 1);
  Out pull = sb.run({"models", "pull", "stories260k", "--mirror", kFixtures, "--store", store});
  EXPECT_EQ(pull.code, 0) << pull.err;
  EXPECT_NE(pull.err.find("repaired stories260k@1"), std::string::npos) << pull.err;  // before: "already installed ... nothing to do"
  EXPECT_EQ(sb.run({"models", "verify", "--store", store}).code, 0);
  Out again = sb.run({"models", "pull", "stories260k", "--mirror", kFixtures, "--store", store});
  EXPECT_NE(again.err.find("already installed"), std::string::npos) << again.err;

  damage(blob);
  ASSERT_EQ(sb.run({"models", "verify", "--store", store}).code, 1);
  Out imp = sb.run({"models", "import", kModel, "--name", "stories260k", "--store", store});
  EXPECT_EQ(imp.code, 0) << imp.err;
  EXPECT_EQ(sb.run({"models", "verify", "--store", store}).code, 0);
  Out t = sb.run({"text", "-m", "stories260k@1", "-p", "Once", "-n", "4", "--store", store});
  EXPECT_EQ(t.code, 0) << t.err;
}

// Defect 6: `models remove` keeps a version that queued jobs need, unless --force.
TEST(HardStore, RemoveRefusesAVersionQueuedJobsNeed) {
  Sandbox sb("removequeued");
  const std::string store = sb.path("store");
  ASSERT_EQ(sb.run({"models", "pull", "stories260k", "--mirror", kFixtures, "--store", store}).code, 0);
  Out add = sb.run({"queue", "--data-dir", store, "--store", store, "add", "-m", "stories260k", "-p", "Once", "-n", "4"});
  ASSERT_EQ(add.code, 0) << add.err;
  const std::string id = add.out.substr(0, add.out.size() - 1);
  Out rm = sb.run({"models", "remove", "stories260k@1", "--store", store});
  EXPECT_EQ(rm.code, 2) << rm.err;  // before: 0, and the job then failed
  EXPECT_NE(rm.err.find("1 queued or running job(s) need stories260k@1 (jobs " + id + ")"), std::string::npos) << rm.err;
  EXPECT_NE(rm.err.find("--force"), std::string::npos) << rm.err;
  EXPECT_EQ(sb.run({"models", "info", "stories260k@1", "--store", store}).code, 0);
  // The queue in another data dir is named with --data-dir; a finished job does not hold the model.
  ASSERT_EQ(sb.run({"--headless", "--data-dir", store, "--store", store}).code, 0);
  Out freed = sb.run({"models", "remove", "stories260k@1", "--store", store});
  EXPECT_EQ(freed.code, 0) << freed.err;
  ASSERT_EQ(sb.run({"models", "pull", "stories260k", "--mirror", kFixtures, "--store", store}).code, 0);
  ASSERT_EQ(sb.run({"queue", "--data-dir", sb.data(), "--store", store, "add", "-m", "stories260k", "-p", "x", "-n", "2"}).code, 0);
  EXPECT_EQ(sb.run({"models", "remove", "stories260k@2", "--store", store, "--data-dir", sb.data()}).code, 2);
  EXPECT_EQ(sb.run({"models", "remove", "stories260k@2", "--store", store, "--data-dir", sb.data(), "--force"}).code, 0);
}

// Defect 10 and store/queue recovery: a damaged database is named with the
// command that rebuilds it; the repair keeps a backup and what was readable.
TEST(HardStore, ADamagedOrEmptiedStoreDatabaseIsDetectedAndRepaired) {
  Sandbox sb("repairdb");
  const std::string store = sb.path("store");
  ASSERT_EQ(sb.run({"models", "pull", "stories260k", "--mirror", kFixtures, "--store", store}).code, 0);
  Out healthy = sb.run({"models", "repair", "--store", store});
  EXPECT_EQ(healthy.code, 0);
  EXPECT_NE(healthy.err.find("not damaged; nothing to do"), std::string::npos) << healthy.err;
  fs::resize_file(store + "/store.db", 0);  // before: silently an empty store with an orphaned blob
  Out list = sb.run({"models", "list", "--store", store});
  EXPECT_EQ(list.code, 1) << list.err;
  EXPECT_NE(list.err.find("atelier models repair --store " + store), std::string::npos) << list.err;
  Out t = sb.run({"text", "-m", "stories260k", "-p", "Once", "-n", "2", "--store", store});
  EXPECT_NE(t.err.find("models repair"), std::string::npos) << t.err;
  Out rep = sb.run({"models", "repair", "--store", store});
  ASSERT_EQ(rep.code, 0) << rep.err;
  EXPECT_NE(rep.err.find("1 model file(s) with no record kept"), std::string::npos) << rep.err;
  const std::string recovered = "recovered-" + kGgufSha.substr(0, 12);
  Out gen = sb.run({"text", "-m", recovered, "-p", "Once upon a time", "-n", "8", "--temp", "0", "--store", store});
  EXPECT_EQ(gen.code, 0) << gen.err;
  Out ref = sb.run({"text", "-m", kModel, "-p", "Once upon a time", "-n", "8", "--temp", "0"});
  EXPECT_EQ(gen.out, ref.out);
  bool backup = false;
  for (const auto& e : fs::directory_iterator(store)) backup |= e.path().filename().string().rfind("store.db.damaged-", 0) == 0;
  EXPECT_TRUE(backup);

  // Overwritten in the middle (a bad sector): the rows that can be read are kept.
  ASSERT_EQ(sb.run({"models", "import", kCvae, "--name", "cvae", "--store", store}).code, 0);
  {
    const auto size = fs::file_size(store + "/store.db");
    ASSERT_GT(size, 8192u);
    std::fstream f(store + "/store.db", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096);
    f << std::string(4096, '\xff');
  }
  Out bad = sb.run({"models", "list", "--store", store});
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("is damaged"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("models repair"), std::string::npos) << bad.err;
  Out rep2 = sb.run({"models", "repair", "--store", store});
  ASSERT_EQ(rep2.code, 0) << rep2.err;
  EXPECT_EQ(sb.run({"models", "verify", "--store", store}).code, 0);
  Out after = sb.run({"models", "list", "--json", "--store", store});
  ASSERT_EQ(after.code, 0) << after.err;
  // Both model files are reachable again, by their old names or as recovered models.
  EXPECT_EQ(jsonl(after.out).size(), 2u) << after.out;
}

TEST(HardQueue, ADamagedJobDatabaseIsDetectedAndRepaired) {
  Sandbox sb("repairjobs");
  const std::string d = sb.data();
  for (int i = 0; i < 40; ++i)
    ASSERT_EQ(sb.run({"queue", "--data-dir", d, "add", "-m", kModel, "-p", std::string(300, 'a' + i % 26), "-n", "2"}).code, 0);
  Out healthy = sb.run({"queue", "--data-dir", d, "repair"});
  EXPECT_NE(healthy.err.find("not damaged"), std::string::npos) << healthy.err;
  const std::string db = d + "/jobs.db";
  fs::resize_file(db, fs::file_size(db) - 4096);  // truncated: the last page is lost
  Out list = sb.run({"queue", "--data-dir", d, "list"});
  EXPECT_EQ(list.code, 1);
  EXPECT_NE(list.err.find("is damaged"), std::string::npos) << list.err;
  EXPECT_NE(list.err.find("atelier queue repair --data-dir " + d), std::string::npos) << list.err;
  Out rep = sb.run({"queue", "--data-dir", d, "repair"});
  ASSERT_EQ(rep.code, 0) << rep.err;
  EXPECT_NE(rep.err.find("kept as"), std::string::npos) << rep.err;
  const auto jobs = jsonl(sb.run({"queue", "--data-dir", d, "list", "--json"}).out);
  EXPECT_GT(jobs.size(), 0u);
  EXPECT_LE(jobs.size(), 40u);
  for (const auto& j : jobs) {  // what came back is whole
    const int64_t id = j["id"];
    EXPECT_EQ(j["prompt"], std::string(300, static_cast<char>('a' + (id - 1) % 26))) << j.dump();
    EXPECT_EQ(j["state"], "queued");
  }
  // The repaired queue works: new jobs get fresh ids and everything runs.
  Out add = sb.run({"queue", "--data-dir", d, "add", "-m", kModel, "-p", "Once", "-n", "2"});
  ASSERT_EQ(add.code, 0) << add.err;
  EXPECT_GT(std::stoll(add.out), 40);
  ASSERT_EQ(sb.run({"--headless", "--data-dir", d}).code, 0);
  for (const auto& j : jsonl(sb.run({"queue", "--data-dir", d, "list", "--json"}).out)) EXPECT_EQ(j["state"], "completed") << j.dump();
}

// Fault injection: `kill -9` of `atelier batch` at eight points of its run
// (fixed delays from its start: submission, prefill, decoding, writing), each
// followed by a rerun of the same command. At the end every line completed
// exactly once and results.jsonl has every line once. (A job running at two
// of the kills is failed by crash-loop protection; the rerun queues its line afresh.)
TEST(HardBatch, KillNineAtManyPointsThenEveryLineCompletesOnce) {
  Sandbox sb("kill9");
  const int n = 10;
  {
    std::ofstream f(sb.dir / "jobs.jsonl");
    for (int i = 0; i < n; ++i) f << text_line("Once upon a time " + std::to_string(i), 48, i) << "\n";
  }
  const std::vector<std::string> cmd = {"batch", sb.path("jobs.jsonl"), "--out", sb.path("out"), "--data-dir", sb.data()};
  for (int delay_ms : {15, 40, 80, 120, 180, 250, 350, 500}) {
    Child c(cmd, sb.dir);
    ASSERT_GT(c.pid, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ::kill(c.pid, SIGKILL);
    c.wait();
  }
  Out done = sb.run(cmd);
  ASSERT_EQ(done.code, 0) << done.err;
  const auto results = jsonl(slurp(sb.dir / "out" / "results.jsonl"));
  ASSERT_EQ(results.size(), static_cast<size_t>(n));
  std::set<int> lines;
  for (const auto& r : results) {
    EXPECT_EQ(r["state"], "completed") << r.dump();
    EXPECT_TRUE(lines.insert(r["line"].get<int>()).second) << "line " << r["line"] << " twice";
  }
  std::map<std::string, int> completed;  // prompt -> completed jobs
  for (const auto& j : jsonl(sb.run({"queue", "--data-dir", sb.data(), "list", "--json", "--limit", "1000"}).out))
    if (j["state"] == "completed") ++completed[j["prompt"].get<std::string>()];
  ASSERT_EQ(completed.size(), static_cast<size_t>(n));
  for (const auto& [prompt, count] : completed) EXPECT_EQ(count, 1) << prompt;
  // And the text is what one uninterrupted run gives.
  Out ref = sb.run({"text", "-m", kModel, "-p", "Once upon a time 3", "-n", "48", "--temp", "0.8", "--seed", "3"});
  EXPECT_EQ(results[3]["text"].get<std::string>() + "\n", ref.out);
}
