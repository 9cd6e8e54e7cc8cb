// The model store: import and verify round trips with the real fixtures,
// header facts, dedup, version pinning, promote and rollback, removal, gc,
// corruption found by verify, a crash between hash and rename, two processes
// importing at once, every reference form, and refusal of garbage.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <atelier/store.h>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "store/blob_store.h"
#include "store/fixture_sums.h"
#include "store/store.h"

using atelier::store::BlobStore;
using atelier::store::ImportFile;
using atelier::store::ImportOptions;
using atelier::store::ModelStore;
using atelier::store::VersionInfo;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = ATELIER_FIXTURES_DIR;
const std::string kGguf = kFixtures + "/text/stories260K.gguf";
const std::string kBin = kFixtures + "/text/stories260K.bin";
const std::string kTok = kFixtures + "/text/tok512.bin";
const std::string kCvae = kFixtures + "/image/quickdraw-cvae.safetensors";

// A fresh folder per test, unique across the parallel processes ctest starts.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("atelier-store-") + info->test_suite_name() + "-" + info->name() + "-" +
                       std::to_string(::getpid()) + "-" + std::to_string(counter_++);
    path_ = fs::temp_directory_path() / name;
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  std::string dir() const { return path_.string(); }
  std::string store() const { return (path_ / "store").string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

// Runs BODY in a forked child and returns its pid; the child exits with
// BODY's return value (98 on an exception) without running atexit handlers.
pid_t fork_child(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 98;
    try {
      rc = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
    }
    ::_exit(rc);
  }
  return pid;
}

int wait_status(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

std::string file_sha(const std::string& path) {
  int64_t size = 0;
  return atelier::store::sha256_file(path, &size);
}

std::vector<std::string> blobs_in(const std::string& root) { return BlobStore(root).list(); }

std::vector<std::string> tmp_files(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(root + "/blobs"))
    if (e.path().filename().string().rfind("tmp-", 0) == 0) out.push_back(e.path().string());
  return out;
}

std::string write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const atelier::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// The file hasher against FIPS 180-2's SHA-256 examples ("abc", a million
// 'a's) and a file of several of its 1 MiB read chunks.
TEST(Store, Sha256OfFilesIsTheStandardDigest) {
  TempDir t;
  const auto hash_of = [&](const std::string& bytes) {
    const std::string p = t.dir() + "/f";
    { std::ofstream(p, std::ios::binary) << bytes; }
    int64_t size = -1;
    const std::string d = atelier::store::sha256_file(p, &size);
    EXPECT_EQ(size, static_cast<int64_t>(bytes.size()));
    return d;
  };
  EXPECT_EQ(hash_of("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hash_of(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hash_of(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Across a chunk boundary (1.1 MiB): the fixture's digest as SHA256SUMS lists it.
  const std::string listed = atelier::test::fixture_sums(kFixtures)["text/stories260K.gguf"];
  ASSERT_EQ(listed.size(), 64u) << "text/stories260K.gguf is not in SHA256SUMS";
  EXPECT_EQ(file_sha(kGguf), listed);
}

// The public digest of bytes (queue keys, the API's fingerprint): the same
// standard vectors, through the same libcrypto opened on first use.
TEST(Store, Sha256OfBytesIsTheStandardDigest) {
  const auto hex = [](const std::string& bytes) {
    auto r = atelier::sha256_hex(bytes);
    EXPECT_TRUE(r.ok()) << r.status().message;
    return r.ok() ? r.value() : std::string();
  };
  EXPECT_EQ(hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Store, ImportVerifyRoundTripWithGguf) {
  TempDir t;
  std::string digest;
  {
    auto st = ModelStore::open(t.store());
    EXPECT_EQ(st->schema_version(), ModelStore::kSchemaVersion);
    ImportOptions opt;
    opt.label = "tiny";
    opt.notes = "fixture";
    opt.licence = "MIT";
    EXPECT_EQ(st->import({{kGguf, "model"}}, "stories", opt), 1);
    const VersionInfo v = st->resolve("stories");
    EXPECT_EQ(v.model, "stories");
    EXPECT_EQ(v.kind, "text");
    EXPECT_EQ(v.number, 1);
    EXPECT_EQ(v.label, "tiny");
    EXPECT_EQ(v.notes, "fixture");
    EXPECT_EQ(v.format, "gguf");
    EXPECT_EQ(v.architecture, "llama");
    EXPECT_EQ(v.embedding_length, 64);
    EXPECT_EQ(v.vocab_size, 512);
    EXPECT_EQ(v.quantization, "f32");
    EXPECT_GT(v.created_ms, 0);

    auto g = atelier::formats::GgufFile::open(kGguf);
    int64_t params = 0;
    for (const auto& tensor : g->tensors()) params += tensor.elements();
    EXPECT_EQ(v.parameters, params);
    EXPECT_GT(params, 200000);
    EXPECT_EQ(v.context_length, g->get_int("llama.context_length"));
    EXPECT_GT(v.context_length, 0);

    ASSERT_EQ(v.files.size(), 1u);
    digest = file_sha(kGguf);
    EXPECT_EQ(v.primary().digest, digest);
    EXPECT_EQ(v.files[0].role, "model");
    EXPECT_EQ(v.files[0].size, static_cast<int64_t>(fs::file_size(kGguf)));
    EXPECT_EQ(v.files[0].blob_path, t.store() + "/blobs/sha256/" + digest);
    EXPECT_EQ(file_sha(v.files[0].blob_path), digest);

    const auto report = st->verify();
    EXPECT_TRUE(report.ok());
    EXPECT_EQ(report.blobs_checked, 1);
    EXPECT_EQ(report.bytes_checked, v.files[0].size);

    const auto models = st->list();
    ASSERT_EQ(models.size(), 1u);
    EXPECT_EQ(models[0].name, "stories");
    EXPECT_EQ(models[0].architecture, "llama");
    EXPECT_EQ(models[0].licence, "MIT");
    ASSERT_EQ(models[0].versions.size(), 1u);
    const auto hist = st->history("stories");
    ASSERT_EQ(hist.size(), 1u);
    EXPECT_EQ(hist[0].action, "import");
    EXPECT_EQ(hist[0].version, 1);
  }
  // Everything survives a reopen.
  auto st = ModelStore::open(t.store());
  EXPECT_EQ(st->resolve("stories@1").primary().digest, digest);
  EXPECT_TRUE(st->verify("stories").ok());
}

TEST(Store, Llama2cWithTokenizerAndSafetensorsFacts) {
  TempDir t;
  auto st = ModelStore::open(t.store());
  EXPECT_EQ(st->import({{kBin, "model"}, {kTok, "tokenizer"}}, "stories-bin"), 1);
  const VersionInfo v = st->resolve("stories-bin");
  EXPECT_EQ(v.format, "llama2c");
  EXPECT_EQ(v.architecture, "llama");
  EXPECT_EQ(v.embedding_length, 64);
  EXPECT_EQ(v.vocab_size, 512);
  EXPECT_GT(v.context_length, 0);
  EXPECT_GT(v.parameters, 200000);
  ASSERT_EQ(v.files.size(), 2u);
  EXPECT_EQ(v.primary().role, "model");
  EXPECT_EQ(v.primary().digest, file_sha(kBin));
  EXPECT_EQ(v.files[1].role, "tokenizer");
  EXPECT_EQ(v.files[1].digest, file_sha(kTok));

  EXPECT_EQ(st->import({{kCvae, "model"}}, "quickdraw"), 1);
  const VersionInfo q = st->resolve("quickdraw");
  EXPECT_EQ(q.kind, "image");
  EXPECT_EQ(q.format, "safetensors");
  EXPECT_EQ(q.architecture, "quickdraw-cvae");
  EXPECT_GT(q.parameters, 0);
  EXPECT_TRUE(st->verify().ok());
  EXPECT_EQ(st->verify().blobs_checked, 3);
}

// A1111's and ComfyUI's checkpoints name no architecture in their metadata:
// the store names it from the tensors (the Models window's Architecture
// column was empty for an imported SD model). Shapes as SD 1.x (768-wide
// cross-attention, CLIP's transformer), SD 2.x (OpenCLIP, 1024) and SDXL
// (its conditioner) lay them out; the values do not matter here.
TEST(Store, ImageCheckpointsWithoutMetadataAreNamedFromTheirTensors) {
  TempDir t;
  auto st = ModelStore::open(t.store());
  auto write = [&](const std::string& file, int64_t context, const std::string& clip_tensor) {
    atelier::formats::SafetensorsWriter w;
    const std::vector<float> z(static_cast<size_t>(4 * 4 * 9 + 8 * context));
    w.add_tensor("model.diffusion_model.input_blocks.0.0.weight", atelier::formats::ElemType::F32, {4, 4, 3, 3}, z.data(), 4 * 4 * 9 * 4);
    w.add_tensor("model.diffusion_model.middle_block.1.transformer_blocks.0.attn2.to_k.weight", atelier::formats::ElemType::F32,
                 {8, context}, z.data(), static_cast<uint64_t>(8 * context * 4));
    w.add_tensor(clip_tensor, atelier::formats::ElemType::F32, {4}, z.data(), 16);
    const std::string path = (std::filesystem::path(t.store()).parent_path() / file).string();
    w.write(path);
    return path;
  };
  const std::string sd1 = write("sd1.safetensors", 768, "cond_stage_model.transformer.text_model.final_layer_norm.weight");
  const std::string sd2 = write("sd2.safetensors", 1024, "cond_stage_model.model.transformer.resblocks.0.ln_1.weight");
  const std::string xl = write("xl.safetensors", 2048, "conditioner.embedders.0.transformer.text_model.final_layer_norm.weight");
  ASSERT_EQ(st->import({{sd1, "model"}}, "one"), 1);
  ASSERT_EQ(st->import({{sd2, "model"}}, "two"), 1);
  ASSERT_EQ(st->import({{xl, "model"}}, "xl"), 1);
  EXPECT_EQ(st->resolve("one").architecture, "sd1");
  EXPECT_EQ(st->resolve("two").architecture, "sd2");
  EXPECT_EQ(st->resolve("xl").architecture, "sdxl");
  EXPECT_EQ(st->resolve("one").kind, "image");
}

TEST(Store, IdenticalContentIsStoredOnce) {
  TempDir t;
  auto st = ModelStore::open(t.store());
  EXPECT_EQ(st->import({{kGguf, "model"}}, "stories"), 1);
  EXPECT_EQ(st->import({{kGguf, "model"}}, "stories"), 2);
  EXPECT_EQ(st->import({{kGguf, "model"}}, "other"), 1);
  EXPECT_EQ(blobs_in(t.store()), std::vector<std::string>{file_sha(kGguf)});
  EXPECT_EQ(st->list().size(), 2u);
  EXPECT_EQ(st->list()[1].versions.size(), 2u);
  EXPECT_TRUE(tmp_files(t.store()).empty());
  EXPECT_TRUE(st->verify().ok());
}

TEST(Store, VersionPinningSurvivesNewVersions) {
  TempDir t;
  auto st = ModelStore::open(t.store());
  ASSERT_EQ(st->import({{kGguf, "model"}}, "stories"), 1);
  const std::string v1 = st->resolve("stories@1").primary().digest;
  ASSERT_EQ(st->import({{kBin, "model"}}, "stories"), 2);
  EXPECT_EQ(st->resolve("stories@1").primary().digest, v1);
  EXPECT_EQ(st->resolve("stories@1").format, "gguf");
  EXPECT_EQ(st->resolve("stories").number, 2);  // no channel: the newest
  EXPECT_EQ(st->resolve("stories@2").format, "llama2c");
  // Numbers are never reused: removing v2 and importing again gives v3.
  st->remove("stories@2");
  EXPECT_EQ(st->import({{kBin, "model"}}, "stories"), 3);
  EXPECT_NE(error_of([&] { st->resolve("stories@2"); }).find("has no version 2"), std::string::npos);
  EXPECT_EQ(st->resolve("stories@1").primary().digest, v1);
}

TEST(Store, PromoteAndRollback) {
  TempDir t;
  auto st = ModelStore::open(t.store());
  ASSERT_EQ(st->import({{kGguf, "model"}}, "m"), 1);
  ASSERT_EQ(st->import({{kBin, "model"}}, "m"), 2);
  ASSERT_EQ(st->import({{kGguf, "model"}}, "m"), 3);

  EXPECT_EQ(st->promote("m@2", "stable"), 2);
  EXPECT_EQ(st->resolve("m").number, 2);  // stable when no prod
  EXPECT_EQ(st->promote("m@1", "prod"), 1);
  EXPECT_EQ(st->resolve("m").number, 1);  // prod first
  EXPECT_EQ(st->promote("m@3", "prod"), 3);
  EXPECT_EQ(st->promote("m:stable", "prod"), 2);  // a channel reference promotes its version
  EXPECT_EQ(st->resolve("m:prod").number, 2);

  EXPECT_EQ(st->rollback("m", "prod"), 3);
  EXPECT_EQ(st->resolve("m:prod").number, 3);
  EXPECT_EQ(st->rollback("m", "prod"), 1);
  EXPECT_EQ(st->resolve("m:prod").number, 1);
  EXPECT_EQ(st->rollback("m", "prod"), 0);  // prod was unset before its first promotion
  EXPECT_NE(error_of([&] { st->resolve("m:prod"); }).find("points at no version"), std::string::npos);
  EXPECT_EQ(st->resolve("m").number, 2);  // back to stable
  EXPECT_NE(error_of([&] { st->rollback("m", "prod"); }).find("nothing to roll back"), std::string::npos);
  EXPECT_NE(error_of([&] { st->rollback("m", "dev"); }).find("points at no version"), std::string::npos);
  EXPECT_NE(error_of([&] { st->promote("m@1", "beta"); }).find("channels are dev, stable and prod"), std::string::npos);

  std::vector<std::string> actions;
  for (const auto& r : st->history("m")) actions.push_back(r.action + ":" + r.channel + ":" + std::to_string(r.version));
  const std::vector<std::string> expected = {
      "import::1",         "import::2",         "import::3",         "promote:stable:2", "promote:prod:1",
      "promote:prod:3",    "promote:prod:2",    "rollback:prod:3",   "rollback:prod:1",  "rollback:prod:0",
  };
  EXPECT_EQ(actions, expected);
  EXPECT_EQ(st->list()[0].channels, (std::map<std::string, int>{{"stable", 2}}));
}

TEST(Store, RemoveRefusesAChannelTargetUnlessForced) {
  TempDir t;
  auto st = ModelStore::open(t.store());
  ASSERT_EQ(st->import({{kGguf, "model"}}, "m"), 1);
  ASSERT_EQ(st->import({{kBin, "model"}}, "m"), 2);
  st->promote("m@1", "prod");
  const std::string err = error_of([&] { st->remove("m@1"); });
  EXPECT_NE(err.find("refusing to remove m@1"), std::string::npos) << err;
  EXPECT_NE(err.find("prod"), std::string::npos) << err;
  EXPECT_EQ(st->resolve("m@1").number, 1);
  st->remove("m@1", /*force=*/true);
  EXPECT_NE(error_of([&] { st->resolve("m@1"); }).find("has no version 1"), std::string::npos);
  EXPECT_EQ(st->resolve("m").number, 2);
  EXPECT_EQ(st->history("m").back().action, "remove");
}

TEST(Store, GcKeepsExactlyTheReferencedBlobs) {
  TempDir t;
  auto st = ModelStore::open(t.store());
  ASSERT_EQ(st->import({{kGguf, "model"}}, "keep"), 1);
  ASSERT_EQ(st->import({{kBin, "model"}, {kTok, "tokenizer"}}, "drop"), 1);
  ASSERT_EQ(st->import({{kCvae, "model"}}, "image"), 1);
  ASSERT_EQ(st->import({{kTok, "tokenizer"}, {kGguf, "model"}}, "shares"), 1);
  EXPECT_EQ(blobs_in(t.store()).size(), 4u);

  st->remove("drop@1");
  st->remove("image@1");
  auto report = st->gc();
  EXPECT_EQ(report.blobs_removed, 2);
  EXPECT_EQ(report.bytes_freed, static_cast<int64_t>(fs::file_size(kBin) + fs::file_size(kCvae)));
  std::vector<std::string> expected = {file_sha(kGguf), file_sha(kTok)};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(blobs_in(t.store()), expected);
  EXPECT_TRUE(st->verify().ok());

  report = st->gc();  // nothing left to free
  EXPECT_EQ(report.blobs_removed, 0);
  EXPECT_EQ(report.bytes_freed, 0);
  EXPECT_EQ(blobs_in(t.store()), expected);
}

TEST(Store, VerifyFindsACorruptedBlob) {
  TempDir t;
  auto st = ModelStore::open(t.store());
  ASSERT_EQ(st->import({{kGguf, "model"}}, "stories"), 1);
  ASSERT_EQ(st->import({{kCvae, "model"}}, "quickdraw"), 1);
  const std::string digest = file_sha(kGguf);
  const std::string blob = t.store() + "/blobs/sha256/" + digest;
  ASSERT_EQ(::chmod(blob.c_str(), 0644), 0);
  {
    std::fstream f(blob, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(1000);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x20);
    f.seekp(1000);
    f.write(&c, 1);
  }
  auto report = st->verify();
  EXPECT_EQ(report.blobs_checked, 2);
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_EQ(report.problems[0].digest, digest);
  EXPECT_EQ(report.problems[0].path, blob);
  EXPECT_NE(report.problems[0].problem.find("corrupted"), std::string::npos);
  EXPECT_FALSE(st->verify("stories").ok());
  EXPECT_TRUE(st->verify("quickdraw").ok());

  // A missing blob is reported too.
  fs::remove(blob);
  report = st->verify("sha256:" + digest.substr(0, 16));
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_EQ(report.problems[0].problem, "missing");

  // Importing the good file again repairs it.
  ASSERT_EQ(st->import({{kGguf, "model"}}, "stories"), 2);
  EXPECT_TRUE(st->verify().ok());
}

TEST(Store, CrashBetweenHashAndRenameLeavesNoTrace) {
  TempDir t;
  ModelStore::open(t.store());  // create it before the fork
  const pid_t pid = fork_child([&] {
    auto st = ModelStore::open(t.store());
    ImportOptions opt;
    opt.after_hash = [](const std::string&) { ::kill(::getpid(), SIGKILL); };
    st->import({{kGguf, "model"}}, "stories", opt);
    return 0;  // not reached
  });
  const int status = wait_status(pid);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  // The child got as far as a complete, synced tmp file...
  const auto tmps = tmp_files(t.store());
  ASSERT_EQ(tmps.size(), 1u);
  EXPECT_EQ(file_sha(tmps[0]), file_sha(kGguf));
  EXPECT_TRUE(blobs_in(t.store()).empty());
  // ...and reopening removes it; nothing was recorded.
  auto st = ModelStore::open(t.store());
  EXPECT_TRUE(tmp_files(t.store()).empty());
  EXPECT_TRUE(blobs_in(t.store()).empty());
  EXPECT_TRUE(st->list().empty());
  EXPECT_NE(error_of([&] { st->resolve("stories"); }).find("no model named \"stories\""), std::string::npos);
  EXPECT_TRUE(st->verify().ok());
  // The store works normally afterwards.
  EXPECT_EQ(st->import({{kGguf, "model"}}, "stories"), 1);
  EXPECT_TRUE(st->verify().ok());
}

TEST(Store, TwoProcessesImportingAtOnceBothSucceed) {
  TempDir t;
  constexpr int kImports = 6;
  std::vector<pid_t> pids;
  for (int child = 0; child < 2; ++child) {
    pids.push_back(fork_child([&, child] {
      auto st = ModelStore::open(t.store());
      for (int i = 0; i < kImports; ++i) {
        st->import({{child == 0 ? kGguf : kBin, "model"}}, "shared");
        st->import({{i % 2 ? kCvae : kGguf, "model"}}, "own-" + std::to_string(child));
      }
      return 0;
    }));
  }
  for (pid_t pid : pids) {
    const int status = wait_status(pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
  auto st = ModelStore::open(t.store());
  const auto models = st->list();
  ASSERT_EQ(models.size(), 3u);
  for (const auto& m : models) {
    ASSERT_EQ(m.versions.size(), static_cast<size_t>(m.name == "shared" ? 2 * kImports : kImports)) << m.name;
    for (size_t i = 0; i < m.versions.size(); ++i) EXPECT_EQ(m.versions[i].number, static_cast<int>(i + 1));
  }
  const auto report = st->verify();
  EXPECT_TRUE(report.ok());
  EXPECT_EQ(report.blobs_checked, 3);
  EXPECT_EQ(blobs_in(t.store()).size(), 3u);
  EXPECT_TRUE(tmp_files(t.store()).empty());
}

TEST(Store, EveryReferenceFormResolvesToTheSameDigest) {
  TempDir t;
  auto st = ModelStore::open(t.store());
  ASSERT_EQ(st->import({{kGguf, "model"}}, "stories"), 1);
  ASSERT_EQ(st->import({{kBin, "model"}, {kTok, "tokenizer"}}, "bin"), 1);
  st->promote("stories@1", "prod");
  st->promote("stories@1", "dev");
  const std::string digest = file_sha(kGguf);
  for (const std::string& ref : std::vector<std::string>{"stories", "stories@1", "stories:prod", "stories:dev", "sha256:" + digest,
                                "sha256:" + digest.substr(0, 12), "sha256:" + digest.substr(0, 20)}) {
    const VersionInfo v = st->resolve(ref);
    EXPECT_EQ(v.model, "stories") << ref;
    EXPECT_EQ(v.number, 1) << ref;
    EXPECT_EQ(v.primary().digest, digest) << ref;
  }
  std::string upper = digest.substr(0, 14);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_EQ(st->resolve("sha256:" + upper).primary().digest, digest);
  // A tokenizer's digest names its version too.
  EXPECT_EQ(st->resolve("sha256:" + file_sha(kTok)).model, "bin");

  auto expect_error = [&](const std::string& ref, const std::string& part) {
    const std::string err = error_of([&] { st->resolve(ref); });
    EXPECT_NE(err.find(part), std::string::npos) << ref << ": " << err;
  };
  expect_error("nosuch", "no model named \"nosuch\"");
  expect_error("stories@9", "has no version 9 (versions: 1)");
  expect_error("stories@x", "give a version number");
  expect_error("stories:stable", "points at no version");
  expect_error("stories:beta", "channels are dev, stable and prod");
  expect_error("sha256:abc", "at least 12");
  expect_error("sha256:" + std::string(12, '0') + "zz", "hex digits");
  expect_error("sha256:000000000000", "no model version holds");
  expect_error("bad name", "bad model reference");
}

TEST(Store, GarbageIsRefusedWithNothingRecorded) {
  TempDir t;
  auto st = ModelStore::open(t.store());
  const std::string readme = write_text(t.dir() + "/README.md", "# Not a model\n\nJust some text.\n");
  const std::string fake_bin = write_text(t.dir() + "/model.bin", "this is not a llama2.c checkpoint at all\n");
  const std::string fake_gguf = write_text(t.dir() + "/broken.gguf", std::string("GGUF\x03\0\0\0garbage", 15));
  const std::string empty = write_text(t.dir() + "/empty.gguf", "");

  std::string err = error_of([&] { st->import({{readme, "model"}}, "readme"); });
  EXPECT_NE(err.find(readme), std::string::npos) << err;
  EXPECT_NE(err.find("not a model file"), std::string::npos) << err;
  for (const auto& bad : {fake_bin, fake_gguf, empty}) {
    err = error_of([&] { st->import({{bad, "model"}}, "bad"); });
    EXPECT_NE(err.find(bad), std::string::npos) << err;
  }
  // A good model with a garbage second model file: nothing is recorded either.
  err = error_of([&] { st->import({{kGguf, "model"}, {readme, "extra"}}, "mixed"); });
  EXPECT_NE(err.find(readme), std::string::npos) << err;
  // Only auxiliary files, duplicate roles, bad names.
  EXPECT_NE(error_of([&] { st->import({{kTok, "tokenizer"}}, "tok"); }).find("no model file"), std::string::npos);
  EXPECT_NE(error_of([&] { st->import({{kGguf, "model"}, {kBin, "model"}}, "dup"); }).find("given twice"),
            std::string::npos);
  EXPECT_NE(error_of([&] { st->import({{kGguf, "model"}}, "a@b"); }).find("bad model name"), std::string::npos);
  EXPECT_NE(error_of([&] { st->import({{t.dir() + "/nope.gguf", "model"}}, "nope"); }).find("nope.gguf"),
            std::string::npos);

  EXPECT_TRUE(st->list().empty());
  EXPECT_TRUE(blobs_in(t.store()).empty());
  EXPECT_TRUE(tmp_files(t.store()).empty());
  EXPECT_NE(error_of([&] { st->history("readme"); }).find("no model named"), std::string::npos);
}

// Import and verify report their bytes as they hash (the window's progress
// bars) and stop when the callback says so: a cancelled import records
// nothing and leaves no tmp file.
TEST(Store, ImportAndVerifyReportProgressAndCanBeCancelled) {
  TempDir t;
  auto st = ModelStore::open(t.store());
  const int64_t tok = static_cast<int64_t>(fs::file_size(kTok));
  std::vector<std::pair<int64_t, int64_t>> seen;
  ImportOptions o;
  o.on_progress = [&](int64_t done, int64_t total) {
    seen.emplace_back(done, total);
    return true;
  };
  st->import({{kBin, "model"}, {kTok, "tokenizer"}}, "two", o);
  ASSERT_FALSE(seen.empty());
  const int64_t all = static_cast<int64_t>(fs::file_size(kBin)) + tok;
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].second, all);
    if (i) {
      EXPECT_GE(seen[i].first, seen[i - 1].first);
    }
  }
  EXPECT_EQ(seen.back().first, all);

  seen.clear();
  const auto report = st->verify("two", [&](int64_t done, int64_t total) {
    seen.emplace_back(done, total);
    return true;
  });
  EXPECT_TRUE(report.ok());
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().first, all);
  EXPECT_EQ(seen.back().second, all);

  ImportOptions stop;
  stop.on_progress = [](int64_t, int64_t) { return false; };
  const std::string why = error_of([&] { st->import({{kGguf, "model"}}, "cancelled", stop); });
  EXPECT_NE(why.find("cancelled"), std::string::npos) << why;
  try {
    st->import({{kGguf, "model"}}, "cancelled", stop);
    ADD_FAILURE() << "the import went through";
  } catch (const atelier::Error& e) {
    EXPECT_EQ(e.code(), atelier::StatusCode::Cancelled);
  }
  EXPECT_EQ(st->list().size(), 1u);  // "two" only
  EXPECT_TRUE(tmp_files(t.store()).empty());
  EXPECT_EQ(blobs_in(t.store()).size(), 2u);
  EXPECT_THROW(st->verify("two", [](int64_t, int64_t) { return false; }), atelier::Error);
}
