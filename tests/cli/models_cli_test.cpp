// End-to-end: the model store from the command line. Pull from the fixtures
// mirror and generate by name, import/verify round trip, dedup, pinning,
// promote/rollback, gc, a corrupted blob found by verify and refused at load,
// an interrupted download resumed, two processes importing at once, the
// digest each job records, and the errors people see.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli_util.h"
#include "store/http_server.h"

namespace fs = std::filesystem;
using nlohmann::json;
using Out = atelier::test::CliRun;

namespace {

const std::string kFixtures = ATELIER_FIXTURES_DIR;
const std::string kGguf = kFixtures + "/text/stories260K.gguf";
const std::string kGgufSha = "270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d";
const std::string kCvae = kFixtures + "/image/quickdraw-cvae.safetensors";

// A store and data dir per test, unique across ctest's parallel processes.
struct Sandbox : atelier::test::ScratchDir {
  explicit Sandbox(const std::string& tag) : ScratchDir("atelier_models_" + tag) {}
  std::string store() const { return (dir / "store").string(); }
  // Every command gets --store (the user's own store is never touched).
  Out run(std::vector<std::string> args) const {
    args.push_back("--store");
    args.push_back(store());
    return atelier::test::run_atelier(args, dir);
  }
  Out raw(const std::vector<std::string>& args) const { return atelier::test::run_atelier(args, dir); }
};

std::vector<json> jsonl(const std::string& text) {
  std::vector<json> v;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) v.push_back(json::parse(line));
  return v;
}

std::string golden_text() { return atelier::test::slurp(kFixtures + "/text/golden-once-upon-a-time-greedy.txt"); }

// Overwrites one byte of a blob in place (blobs are read-only files).
void damage(const std::string& path) {
  fs::permissions(path, fs::perms::owner_write, fs::perm_options::add);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(5000);
  f.put('\x7f');
}

}  // namespace

TEST(ModelsCli, PullFromTheMirrorThenGenerateByName) {
  Sandbox sb("pull");
  Out p = sb.run({"models", "pull", "stories260k", "quickdraw", "--mirror", kFixtures});
  ASSERT_EQ(p.code, 0) << p.err;
  EXPECT_NE(p.err.find("installed stories260k@1"), std::string::npos) << p.err;
  EXPECT_NE(p.err.find("installed quickdraw@1"), std::string::npos) << p.err;
  Out again = sb.run({"models", "pull", "stories260k", "--mirror", kFixtures});
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.err.find("already installed"), std::string::npos) << again.err;

  // By name, the golden text byte for byte.
  Out t = sb.run({"text", "-m", "stories260k", "-p", "Once upon a time", "-n", "60", "--temp", "0", "--echo"});
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_EQ(t.out, golden_text());
  Out img = sb.run({"image", "-m", "quickdraw", "-p", "airplane", "-W", "64", "-H", "64", "--seed", "3", "-o", (sb.dir / "a.png").string()});
  ASSERT_EQ(img.code, 0) << img.err;
  const std::string png = atelier::test::slurp(sb.dir / "a.png");
  EXPECT_NE(png.find("Model: quickdraw@1"), std::string::npos);
  EXPECT_NE(png.find("Model hash: e2a9583067"), std::string::npos);

  auto list = jsonl(sb.run({"models", "list", "--json"}).out);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[1]["name"], "stories260k");
  EXPECT_EQ(list[1]["versions"][0]["digest"], "sha256:" + kGgufSha);
  Out table = sb.run({"models", "list"});
  EXPECT_NE(table.out.find("stories260k@1 *"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("sha256:270cba1bd510"), std::string::npos) << table.out;
}

TEST(ModelsCli, ImportVerifyRoundTripDedupAndGc) {
  Sandbox sb("import");
  Out a = sb.run({"models", "import", kGguf, "--name", "tiny", "--label", "first"});
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, "tiny@1\n");
  Out b = sb.run({"models", "import", kGguf, "--name", "tiny-copy"});
  ASSERT_EQ(b.code, 0) << b.err;
  // Identical bytes are stored once.
  EXPECT_EQ(std::distance(fs::directory_iterator(sb.store() + "/blobs/sha256"), fs::directory_iterator{}), 1);
  Out info = sb.run({"models", "info", "tiny@1", "--json"});
  ASSERT_EQ(info.code, 0) << info.err;
  const json j = json::parse(info.out);
  EXPECT_EQ(j["digest"], "sha256:" + kGgufSha);
  EXPECT_EQ(j["label"], "first");
  EXPECT_EQ(j["format"], "gguf");
  EXPECT_EQ(j["vocab_size"], 512);
  Out v = sb.run({"models", "verify"});
  EXPECT_EQ(v.code, 0) << v.err;
  EXPECT_NE(v.err.find("ok: 1 blob"), std::string::npos) << v.err;

  // gc keeps a blob while any version references it, and frees it after.
  ASSERT_EQ(sb.run({"models", "import", kCvae, "--name", "doodles"}).code, 0);
  ASSERT_EQ(sb.run({"models", "remove", "doodles@1"}).code, 0);
  ASSERT_EQ(sb.run({"models", "remove", "tiny-copy"}).code, 0);
  Out gc = sb.run({"models", "gc", "--json"});
  ASSERT_EQ(gc.code, 0) << gc.err;
  EXPECT_EQ(json::parse(gc.out)["blobs_removed"], 1);
  EXPECT_TRUE(fs::exists(sb.store() + "/blobs/sha256/" + kGgufSha));
  EXPECT_EQ(sb.run({"models", "verify", "tiny"}).code, 0);
}

TEST(ModelsCli, PinningPromoteRollbackAndHistory) {
  Sandbox sb("channels");
  const std::string tok = kFixtures + "/text/tok512.bin";
  ASSERT_EQ(sb.run({"models", "import", kGguf, "--name", "m"}).code, 0);
  ASSERT_EQ(sb.run({"models", "import", kFixtures + "/text/stories260K.bin", tok, "--name", "m", "--role", "model", "--role", "tokenizer"}).code, 0);
  auto digest = [&](const std::string& ref) { return json::parse(sb.run({"models", "info", ref, "--json"}).out)["resolved"]["digest"].get<std::string>(); };
  const std::string d1 = digest("m@1"), d2 = digest("m@2");
  EXPECT_NE(d1, d2);
  EXPECT_EQ(digest("m"), d2);  // no channel: the newest
  Out pr = sb.run({"models", "promote", "m@1", "prod"});
  ASSERT_EQ(pr.code, 0) << pr.err;
  EXPECT_EQ(digest("m"), d1);  // prod wins over newest
  EXPECT_EQ(digest("m:prod"), d1);
  ASSERT_EQ(sb.run({"models", "promote", "m@2", "prod"}).code, 0);
  EXPECT_EQ(digest("m"), d2);
  Out rb = sb.run({"models", "rollback", "m", "prod"});
  ASSERT_EQ(rb.code, 0) << rb.err;
  EXPECT_NE(rb.err.find("m:prod -> m@1"), std::string::npos) << rb.err;
  EXPECT_EQ(digest("m"), d1);
  // A channel target is not removed without --force.
  Out rm = sb.run({"models", "remove", "m@1"});
  EXPECT_EQ(rm.code, 1);
  EXPECT_NE(rm.err.find("promote another version first"), std::string::npos) << rm.err;
  // Pinned by version, generation is the same whatever the channels say.
  Out t1 = sb.run({"text", "-m", "m@1", "-p", "Once upon a time", "-n", "60", "--temp", "0", "--echo"});
  EXPECT_EQ(t1.out, golden_text()) << t1.err;
  Out h = sb.run({"models", "history", "m", "--json"});
  ASSERT_EQ(h.code, 0) << h.err;
  std::vector<std::string> actions;
  for (const auto& row : jsonl(h.out)) actions.push_back(row["action"]);
  EXPECT_EQ(actions, (std::vector<std::string>{"import", "import", "promote", "promote", "rollback"}));
  EXPECT_NE(sb.run({"models", "history", "m"}).out.find("rollback"), std::string::npos);
}

TEST(ModelsCli, ACorruptedBlobIsFoundByVerifyAndRefusedAtLoad) {
  Sandbox sb("corrupt");
  ASSERT_EQ(sb.run({"models", "pull", "stories260k", "--mirror", kFixtures}).code, 0);
  damage(sb.store() + "/blobs/sha256/" + kGgufSha);
  Out v = sb.run({"models", "verify"});
  EXPECT_EQ(v.code, 1);
  EXPECT_NE(v.err.find("corrupted"), std::string::npos) << v.err;
  Out t = sb.run({"text", "-m", "stories260k", "-p", "Once", "-n", "4"});
  EXPECT_EQ(t.code, 1);
  EXPECT_NE(t.err.find("stories260k@1 is corrupted"), std::string::npos) << t.err;
  EXPECT_EQ(t.out, "");
  // The queue's runner refuses it too: the job fails with the same reason.
  const std::string data = (sb.dir / "data").string();
  ASSERT_EQ(sb.run({"queue", "--data-dir", data, "add", "-m", "stories260k", "-p", "Once", "-n", "4"}).code, 0);
  sb.run({"--headless", "--data-dir", data});
  auto jobs = jsonl(sb.run({"queue", "--data-dir", data, "list", "--json"}).out);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0]["state"], "failed");
  EXPECT_NE(jobs[0]["error"].get<std::string>().find("corrupted"), std::string::npos) << jobs[0].dump();
  // Pulled again, it is whole.
  ASSERT_EQ(sb.run({"models", "remove", "stories260k@1"}).code, 0);
  Out again = sb.run({"models", "pull", "stories260k", "--mirror", kFixtures});
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(sb.run({"models", "verify"}).code, 0);
  EXPECT_EQ(sb.run({"text", "-m", "stories260k", "-p", "Once upon a time", "-n", "60", "--temp", "0", "--echo"}).out, golden_text());
}

TEST(ModelsCli, AnInterruptedDownloadResumes) {
  Sandbox sb("resume");
  const std::string body = atelier::test::slurp(kGguf);
  atelier::test::HttpServer server(body, {.drop_at = 600000, .drops = 1});
  const json catalog = {{"models",
                         {{{"name", "stories260k"},
                           {"kind", "text"},
                           {"verified", true},
                           {"files", {{{"name", "stories260K.gguf"}, {"size", body.size()}, {"sha256", kGgufSha}, {"urls", {server.url()}}, {"mirror", "text/stories260K.gguf"}}}}}}}};
  std::ofstream(sb.dir / "catalog.json") << catalog.dump(2);
  const std::string cat = (sb.dir / "catalog.json").string();
  // The first run gives up when the connection drops (no retries), keeping what arrived.
  Out first = sb.run({"models", "pull", "stories260k", "--catalog", cat, "--retries", "0"});
  EXPECT_EQ(first.code, 1);
  EXPECT_NE(first.err.find("run the same command again to resume"), std::string::npos) << first.err;
  EXPECT_EQ(fs::file_size(sb.store() + "/downloads/" + kGgufSha + ".part"), 600000u);
  Out second = sb.run({"models", "pull", "stories260k", "--catalog", cat, "--retries", "0"});
  ASSERT_EQ(second.code, 0) << second.err;
  EXPECT_NE(second.err.find("resuming stories260K.gguf"), std::string::npos) << second.err;
  EXPECT_NE(second.err.find("installed stories260k@1"), std::string::npos) << second.err;
  ASSERT_EQ(server.ranges().size(), 2u);
  EXPECT_EQ(server.ranges()[1], "bytes=600000-");
  EXPECT_FALSE(fs::exists(sb.store() + "/downloads/" + kGgufSha + ".part"));
  EXPECT_EQ(sb.run({"text", "-m", "stories260k", "-p", "Once upon a time", "-n", "60", "--temp", "0", "--echo"}).out, golden_text());
}

TEST(ModelsCli, TwoProcessesImportingAtOnceBothSucceed) {
  Sandbox sb("two");
  fs::create_directories(sb.dir / "0");
  fs::create_directories(sb.dir / "1");
  pid_t pids[2];
  for (int i = 0; i < 2; ++i) {
    pids[i] = ::fork();
    if (pids[i] == 0) {
      const std::string name = i == 0 ? kGguf : kCvae;
      const Out r = atelier::test::run_atelier({"models", "import", name, "--name", "m" + std::to_string(i), "--store", sb.store()},
                                               sb.dir / std::to_string(i));
      ::_exit(r.code);
    }
  }
  for (pid_t p : pids) {
    int status = 0;
    ::waitpid(p, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  EXPECT_EQ(jsonl(sb.run({"models", "list", "--json"}).out).size(), 2u);
  EXPECT_EQ(sb.run({"models", "verify"}).code, 0);
}

TEST(ModelsCli, JobsRecordTheDigestAndQueueListShowsIt) {
  Sandbox sb("jobs");
  ASSERT_EQ(sb.run({"models", "pull", "stories260k", "--mirror", kFixtures}).code, 0);
  const std::string data = (sb.dir / "data").string();
  ASSERT_EQ(sb.run({"queue", "--data-dir", data, "add", "-m", "stories260k@1", "-p", "Once upon a time", "-n", "8", "--seed", "1"}).code, 0);
  Out h = sb.run({"--headless", "--data-dir", data});
  ASSERT_EQ(h.code, 0) << h.err;
  auto jobs = jsonl(sb.run({"queue", "--data-dir", data, "list", "--json"}).out);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0]["state"], "completed");
  EXPECT_EQ(jobs[0]["model"], "stories260k@1");
  EXPECT_EQ(jobs[0]["model_version"], "sha256:" + kGgufSha);
  EXPECT_EQ(jobs[0]["model_name"], "stories260k@1");
  Out table = sb.run({"queue", "--data-dir", data, "list"});
  EXPECT_NE(table.out.find("270cba1bd510 stories260k@1"), std::string::npos) << table.out;
  // A batch file naming the model by reference runs through the store too.
  std::ofstream(sb.dir / "b.jsonl") << json{{"model", "stories260k"}, {"prompt", "Lily"}, {"max_new_tokens", 4}}.dump() << "\n";
  Out b = sb.run({"batch", (sb.dir / "b.jsonl").string(), "--out", (sb.dir / "out").string(), "--data-dir", data});
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_EQ(jsonl(atelier::test::slurp(sb.dir / "out/results.jsonl"))[0]["model_version"], "sha256:" + kGgufSha);
}

TEST(ModelsCli, ErrorsSayWhatToDo) {
  Sandbox sb("errors");
  Out none = sb.run({"text", "-m", "stories260k", "-p", "x"});
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.err.find("atelier models pull stories260k"), std::string::npos) << none.err;
  EXPECT_EQ(std::count(none.err.begin(), none.err.end(), '\n'), 1) << none.err;
  Out bad_flag = sb.run({"models", "list", "--bogus"});
  EXPECT_EQ(bad_flag.code, 2);
  Out bad_channel = sb.run({"models", "promote", "x@1", "beta"});
  EXPECT_EQ(bad_channel.code, 2);
  Out unknown = sb.run({"models", "pull", "no-such-model"});
  EXPECT_EQ(unknown.code, 1);
  EXPECT_NE(unknown.err.find("stories260k"), std::string::npos) << unknown.err;  // lists what exists
  ASSERT_EQ(sb.run({"models", "import", kGguf, "--name", "m"}).code, 0);
  Out missing = sb.run({"models", "info", "m@7"});
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.err.find("has no version 7"), std::string::npos) << missing.err;
  Out badref = sb.run({"text", "-m", "m@x", "-p", "x"});
  EXPECT_EQ(badref.code, 2);
  // No network and no mirror: says so and names --mirror (a closed local port stands for the network).
  const json catalog = {{"models", {{{"name", "far"}, {"kind", "text"}, {"files", {{{"name", "far.gguf"}, {"urls", {"http://127.0.0.1:1/far.gguf"}}, {"mirror", "text/far.gguf"}}}}}}}};
  std::ofstream(sb.dir / "c.json") << catalog.dump();
  Out offline = sb.run({"models", "pull", "far", "--catalog", (sb.dir / "c.json").string()});
  EXPECT_EQ(offline.code, 1);
  EXPECT_NE(offline.err.find("--mirror"), std::string::npos) << offline.err;
  EXPECT_NE(offline.err.find("no network"), std::string::npos) << offline.err;
  // Files still work without any store entry.
  Out file = sb.run({"text", "-m", kGguf, "-p", "Once upon a time", "-n", "60", "--temp", "0", "--echo"});
  EXPECT_EQ(file.out, golden_text()) << file.err;
}
