// Model references through the engine: resolve_model and the command line
// agree on every reference form; jobs record the digest and name@version of
// what they ran; a corrupted blob is refused when the engine loads it; a
// plain file still works without a store entry.
#include <atelier/engine.h>
#include <atelier/models.h>
#include <atelier/store.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "cli/cli_util.h"

using namespace atelier;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = ATELIER_FIXTURES_DIR;
const std::string kGguf = kFixtures + "/text/stories260K.gguf";
const std::string kBin = kFixtures + "/text/stories260K.bin";
const std::string kTok = kFixtures + "/text/tok512.bin";
const std::string kGgufSha = "270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d";

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("atelier_engine_store_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string store() const { return (path / "store").string(); }
  std::string data() const { return (path / "data").string(); }
};

// stories260k@1 (GGUF) and @2 (llama2.c + tokenizer), @1 promoted to stable.
std::unique_ptr<Store> two_versions(const TempDir& d) {
  auto st = Store::open(d.store());
  EXPECT_TRUE(st.ok()) << st.status().message;
  EXPECT_EQ(st.value()->import({{kGguf, "model"}}, "stories260k").value(), 1);
  EXPECT_EQ(st.value()->import({{kBin, "model"}, {kTok, "tokenizer"}}, "stories260k").value(), 2);
  EXPECT_EQ(st.value()->promote("stories260k@1", "stable").value(), 1);
  return std::move(st.value());
}

JobInfo run_one(const TempDir& d, const std::string& model) {
  EngineConfig c;
  c.data_dir = d.data();
  c.store_dir = d.store();
  c.max_wait_ms = 0;
  auto e = Engine::open(c);
  EXPECT_TRUE(e.ok()) << e.status().message;
  TextRequest r;
  r.model = model;
  r.prompt = "Once upon a time";
  r.max_new_tokens = 8;
  r.sampling.temperature = 0;
  auto id = e.value()->submit(r);
  EXPECT_TRUE(id.ok()) << id.status().message;
  EXPECT_TRUE(e.value()->wait_idle(60000));
  return e.value()->job(id.value()).value();
}

}  // namespace

TEST(ModelStoreEngine, CliAndEngineResolveEveryReferenceFormIdentically) {
  TempDir d("forms");
  auto st = two_versions(d);
  const std::string d2 = st->resolve("stories260k@2").value().digest;
  for (const std::string& ref : std::vector<std::string>{"stories260k", "stories260k@1", "stories260k@2", "stories260k:stable",
                                "sha256:" + kGgufSha, "sha256:" + kGgufSha.substr(0, 12), "sha256:" + d2.substr(0, 16)}) {
    auto r = resolve_model(ref, d.store());
    ASSERT_TRUE(r.ok()) << ref << ": " << r.status().message;
    const auto cli = test::run_atelier({"models", "info", ref, "--json", "--store", d.store()}, d.path);
    ASSERT_EQ(cli.code, 0) << ref << ": " << cli.err;
    const auto j = nlohmann::json::parse(cli.out)["resolved"];
    EXPECT_EQ(j["path"], r->path) << ref;
    EXPECT_EQ(j["digest"], r->digest) << ref;
    EXPECT_EQ(j["display"], r->display) << ref;
    EXPECT_TRUE(r->in_store);
  }
  EXPECT_EQ(resolve_model("stories260k", d.store())->display, "stories260k@1");  // stable before newest
  const StoreVersion v2 = st->resolve("stories260k@2").value();
  for (const auto& f : v2.files) {
    if (f.role == "tokenizer") {
      EXPECT_EQ(resolve_model("stories260k@2", d.store())->file("tokenizer"), f.path);
    }
  }
  // Malformed and unknown references: the same errors as the store gives.
  EXPECT_EQ(resolve_model("stories260k@x", d.store()).status().code, StatusCode::InvalidArgument);
  EXPECT_EQ(resolve_model("stories260k@9", d.store()).status().code, StatusCode::NotFound);
  EXPECT_EQ(resolve_model("nothing", d.store()).status().code, StatusCode::NotFound);
  EXPECT_EQ(resolve_model("sha256:0123", d.store()).status().code, StatusCode::InvalidArgument);
}

TEST(ModelStoreEngine, JobsRecordTheDigestAndNameOfWhatTheyRan) {
  TempDir d("jobs");
  auto st = two_versions(d);
  const JobInfo a = run_one(d, "stories260k");  // stable: @1
  ASSERT_EQ(a.state, JobState::Completed) << a.error;
  EXPECT_EQ(a.model_version, "sha256:" + kGgufSha);
  EXPECT_EQ(a.model_name, "stories260k@1");
  EXPECT_EQ(a.request.model, "stories260k");  // the request stays as written
  const JobInfo b = run_one(d, "stories260k@2");  // the llama2.c version, its tokenizer from the store
  ASSERT_EQ(b.state, JobState::Completed) << b.error;
  EXPECT_EQ(b.model_version, "sha256:" + st->resolve("stories260k@2").value().digest);
  EXPECT_EQ(b.model_name, "stories260k@2");
  EXPECT_EQ(a.text, b.text);  // the same weights in two formats, greedy
  // A plain file: no store entry needed; its sha256 is recorded all the same.
  const JobInfo c = run_one(d, kGguf);
  ASSERT_EQ(c.state, JobState::Completed) << c.error;
  EXPECT_EQ(c.model_version, "sha256:" + kGgufSha);
  EXPECT_EQ(c.text, a.text);
}

TEST(ModelStoreEngine, ACorruptedBlobIsRefusedAtLoad) {
  TempDir d("corrupt");
  auto st = two_versions(d);
  const std::string blob = st->resolve("stories260k@1").value().files[0].path;
  fs::permissions(blob, fs::perms::owner_write, fs::perm_options::add);
  {
    std::fstream f(blob, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096);
    f.put('\x55');
  }
  ResolveOptions check;
  check.check_digest = true;
  auto r = resolve_model("stories260k@1", d.store(), check);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code, StatusCode::InvalidModel);
  EXPECT_NE(r.status().message.find("corrupted"), std::string::npos) << r.status().message;
  const JobInfo j = run_one(d, "stories260k@1");
  EXPECT_EQ(j.state, JobState::Failed);
  EXPECT_NE(j.error.find("stories260k@1 is corrupted"), std::string::npos) << j.error;
  // The image path refuses it the same way (before looking at its format).
  ImageRequest ir;
  ir.model = "stories260k@1";
  ir.prompt = "airplane";
  EXPECT_EQ(generate_image(ir, d.store()).status().code, StatusCode::InvalidModel);
  // The other version is untouched and still runs.
  EXPECT_EQ(run_one(d, "stories260k@2").state, JobState::Completed);
}

TEST(ModelStoreEngine, ImagesResolveThroughTheStoreToo) {
  TempDir d("image");
  auto st = Store::open(d.store());
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(st.value()->import({{kFixtures + "/image/quickdraw-cvae.safetensors", "model"}}, "quickdraw").ok());
  ImageRequest ir;
  ir.model = "quickdraw";
  ir.prompt = "airplane";
  ir.width = ir.height = 32;
  ir.seed = 7;
  auto by_name = generate_image(ir, d.store());
  ASSERT_TRUE(by_name.ok()) << by_name.status().message;
  ir.model = kFixtures + "/image/quickdraw-cvae.safetensors";
  auto by_file = generate_image(ir, d.store());
  ASSERT_TRUE(by_file.ok()) << by_file.status().message;
  EXPECT_EQ(by_name.value()[0].pixels, by_file.value()[0].pixels);
  EXPECT_NE(by_name.value()[0].parameters.find("Model: quickdraw@1"), std::string::npos);
}

// Issue 14 mutant: the per-process digest cache ignoring mtime. A blob that
// passed its check in this process and is then damaged in place (same size,
// newer modification time) must be hashed again and refused.
TEST(ModelStoreEngine, ABlobDamagedAfterItWasVerifiedInThisProcessIsRefused) {
  TempDir d("recheck");
  auto st = two_versions(d);
  ResolveOptions check;
  check.check_digest = true;
  auto first = resolve_model("stories260k@1", d.store(), check);
  ASSERT_TRUE(first.ok()) << first.status().message;
  EXPECT_EQ(first->digest, "sha256:" + kGgufSha);
  const std::string blob = first->path;
  const auto size = fs::file_size(blob);
  fs::permissions(blob, fs::perms::owner_write, fs::perm_options::add);
  {
    std::fstream f(blob, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096);
    f.put('\x55');
  }
  // A clock tick later than the first check, whatever the file system's timestamp granularity.
  struct timespec times[2] = {{0, UTIME_OMIT}, {::time(nullptr) + 5, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, blob.c_str(), times, 0), 0);
  ASSERT_EQ(fs::file_size(blob), size);  // only the time says it changed
  auto again = resolve_model("stories260k@1", d.store(), check);
  ASSERT_FALSE(again.ok()) << "a cached digest was trusted for a changed file";
  EXPECT_EQ(again.status().code, StatusCode::InvalidModel);
}
