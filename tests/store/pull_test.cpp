// Pulling models: resumable downloads against a local HTTP server that drops
// the connection part-way (offline), servers that ignore ranges, sha256
// checks before anything is recorded, mirrors, no-op re-pulls, the
// no-network error, and the repository's catalog against the fixtures.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "core/error.h"
#include "store/blob_store.h"
#include "store/catalog.h"
#include "store/download.h"
#include "store/fixture_sums.h"
#include "store/http_server.h"
#include "store/pull.h"
#include "store/store.h"

namespace fs = std::filesystem;
using atelier::CatalogEntry;
using atelier::CatalogFile;
using atelier::PullOptions;
using atelier::store::ModelStore;
using atelier::test::HttpServer;

namespace {

const std::string kFixtures = ATELIER_FIXTURES_DIR;
const std::string kGguf = kFixtures + "/text/stories260K.gguf";
const std::string kGgufSha = "270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh folder per test, unique across the parallel processes ctest starts.
class Dir {
 public:
  Dir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() / ("atelier-pull-" + std::string(info->name()) + "-" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~Dir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& p) const { return (path_ / p).string(); }

 private:
  fs::path path_;
};

CatalogEntry stories_entry(const std::string& url) {
  CatalogEntry e;
  e.name = "stories260k";
  e.kind = "text";
  e.verified = true;
  CatalogFile f;
  f.name = "stories260K.gguf";
  f.size = static_cast<int64_t>(fs::file_size(kGguf));
  f.sha256 = kGgufSha;
  if (!url.empty()) f.urls = {url};
  f.mirror = "text/stories260K.gguf";
  e.files = {f};
  return e;
}

PullOptions quick() {
  PullOptions o;
  o.retry_delay_ms = 10;
  return o;
}

}  // namespace

TEST(Download, ADroppedConnectionIsResumedWithARangeRequest) {
  Dir d;
  const std::string body = slurp(kGguf);
  HttpServer server(body, {.drop_at = 400000, .drops = 1});
  atelier::store::DownloadOptions o;
  o.retries = 2;
  o.retry_delay_ms = 10;
  const std::string part = d / "x.part";
  atelier::store::download(server.url(), part, 0, o);
  EXPECT_EQ(slurp(part), body);
  const auto r = server.ranges();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0], "");
  EXPECT_EQ(r[1], "bytes=400000-");  // resumed where the connection dropped, not from zero
}

TEST(Download, AnInterruptedRunLeavesAPartialFileTheNextRunResumes) {
  Dir d;
  const std::string body = slurp(kGguf);
  HttpServer server(body, {.drop_at = 700001, .drops = 1});
  atelier::store::DownloadOptions o;
  o.retries = 0;  // the first run gives up at the drop, as a killed process would
  const std::string part = d / "x.part";
  EXPECT_THROW(atelier::store::download(server.url(), part, 0, o), atelier::Error);
  EXPECT_EQ(fs::file_size(part), 700001u);
  EXPECT_EQ(slurp(part), body.substr(0, 700001));
  const int64_t got = atelier::store::download(server.url(), part, 0, o);
  EXPECT_EQ(got, static_cast<int64_t>(body.size()) - 700001);  // only the rest travelled
  EXPECT_EQ(slurp(part), body);
  EXPECT_EQ(server.ranges().back(), "bytes=700001-");
}

TEST(Download, AServerThatIgnoresRangesMakesItStartOver) {
  Dir d;
  const std::string body = slurp(kGguf);
  HttpServer server(body, {.drop_at = 300000, .drops = 1, .honour_range = false});
  atelier::store::DownloadOptions o;
  o.retries = 2;
  o.retry_delay_ms = 10;
  const std::string part = d / "x.part";
  atelier::store::download(server.url(), part, 0, o);
  EXPECT_EQ(slurp(part), body);  // not the first 300000 bytes twice
}

TEST(Pull, DownloadIsVerifiedThenRecordedAndThePartialRemoved) {
  Dir d;
  HttpServer server(slurp(kGguf), {.drop_at = 500000, .drops = 2});
  auto st = ModelStore::open(d / "store");
  PullOptions o = quick();
  int64_t last = 0;
  o.on_progress = [&](const atelier::PullProgress& p) { last = p.bytes_done; };
  const auto r = atelier::store::pull(*st, stories_entry(server.url()), o);
  EXPECT_EQ(r.version, 1);
  EXPECT_FALSE(r.already_installed);
  EXPECT_EQ(r.digest, kGgufSha);
  EXPECT_EQ(last, static_cast<int64_t>(fs::file_size(kGguf)));
  EXPECT_TRUE(st->verify().ok());
  EXPECT_TRUE(fs::is_empty(d / "store/downloads"));
  // Again: identical, nothing fetched.
  const size_t requests = server.ranges().size();
  const auto again = atelier::store::pull(*st, stories_entry(server.url()), o);
  EXPECT_TRUE(again.already_installed);
  EXPECT_EQ(again.version, 1);
  EXPECT_EQ(server.ranges().size(), requests);
}

// A pause (should_stop) ends the pull at once with Cancelled, records
// nothing and keeps the bytes that arrived; the next pull resumes from them
// with a Range request and installs the model whole.
TEST(Pull, APausedDownloadRecordsNothingAndTheNextPullResumesIt) {
  Dir d;
  // The first response stalls half way, as a slow network would.
  HttpServer server(slurp(kGguf), {.pause_at = 500000, .pause_ms = 3000});
  auto st = ModelStore::open(d / "store");
  PullOptions o = quick();
  const std::string part = atelier::store::partial_path(*st, stories_entry(""), stories_entry("").files[0]);
  o.should_stop = [&] {  // pause during the stall, once the bytes before it are on disk (not at the first write)
    std::error_code ec;
    return fs::exists(part, ec) && fs::file_size(part, ec) >= 500000;
  };
  try {
    atelier::store::pull(*st, stories_entry(server.url()), o);
    FAIL() << "the pull did not stop";
  } catch (const atelier::Error& e) {
    EXPECT_EQ(e.code(), atelier::StatusCode::Cancelled) << e.what();
    EXPECT_NE(std::string(e.what()).find("resume"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(st->list().empty());
  ASSERT_TRUE(fs::exists(part));
  const auto kept = static_cast<int64_t>(fs::file_size(part));
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, static_cast<int64_t>(fs::file_size(kGguf)));
  o.should_stop = {};
  const auto r = atelier::store::pull(*st, stories_entry(server.url()), o);
  EXPECT_EQ(r.digest, kGgufSha);
  ASSERT_FALSE(server.ranges().empty());
  EXPECT_EQ(kept, 500000);
  EXPECT_EQ(server.ranges().back(), "bytes=500000-") << "the second pull asks for the bytes after those kept";
  EXPECT_FALSE(fs::exists(part));
}

TEST(Pull, AWrongDownloadRecordsNothing) {
  Dir d;
  std::string body = slurp(kGguf);
  body[1000] ^= 0x5a;  // same size, other bytes
  HttpServer server(body, {});
  auto st = ModelStore::open(d / "store");
  try {
    atelier::store::pull(*st, stories_entry(server.url()), quick());
    FAIL() << "a download with the wrong sha256 was accepted";
  } catch (const atelier::Error& e) {
    EXPECT_NE(std::string(e.what()).find("nothing was recorded"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(st->list().empty());
  EXPECT_FALSE(fs::exists(atelier::store::partial_path(*st, stories_entry(""), stories_entry("").files[0])));
}

TEST(Pull, FromAMirrorFolderAndAWrongMirrorFileIsRefused) {
  Dir d;
  auto st = ModelStore::open(d / "store");
  PullOptions o = quick();
  o.mirror = kFixtures;
  const auto r = atelier::store::pull(*st, stories_entry(""), o);
  EXPECT_EQ(r.version, 1);
  EXPECT_EQ(r.source, kFixtures);
  // A mirror whose file differs from the catalog's sha256.
  fs::create_directories(d / "bad/text");
  std::string body = slurp(kGguf);
  body[2000] ^= 1;
  std::ofstream(d / "bad/text/stories260K.gguf", std::ios::binary) << body;
  auto st2 = ModelStore::open(d / "store2");
  o.mirror = d / "bad";
  EXPECT_THROW(atelier::store::pull(*st2, stories_entry(""), o), atelier::Error);
  EXPECT_TRUE(st2->list().empty());
}

TEST(Pull, NoNetworkAndNoMirrorSaysSoAndNamesMirror) {
  Dir d;
  auto st = ModelStore::open(d / "store");
  // A closed port on this machine: the connection is refused at once.
  try {
    atelier::store::pull(*st, stories_entry("http://127.0.0.1:1/stories260K.gguf"), quick());
    FAIL() << "pull succeeded without a source";
  } catch (const atelier::store::NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("--mirror"), std::string::npos) << e.what();
  }
  // An entry with no address at all.
  try {
    atelier::store::pull(*st, stories_entry(""), quick());
    FAIL() << "pull succeeded without a source";
  } catch (const atelier::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--mirror"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(st->list().empty());
}

TEST(Catalog, TheRepositoryCatalogParsesAndItsFixturesMatchTheirSums) {
  const auto catalog = atelier::store::read_catalog(ATELIER_CATALOG_FILE);
  std::map<std::string, std::string> sums = atelier::test::fixture_sums(kFixtures);  // fixture path -> sha256
  int fixtures = 0;
  for (const auto& e : catalog) {
    for (const auto& f : e.files) {
      if (!e.verified) {
        EXPECT_TRUE(f.sha256.empty() || f.sha256.size() == 64) << e.name;
        continue;
      }
      ASSERT_TRUE(sums.count(f.mirror)) << e.name << ": " << f.mirror << " is not a fixture";
      EXPECT_EQ(f.sha256, sums[f.mirror]) << e.name;
      EXPECT_EQ(f.size, static_cast<int64_t>(fs::file_size(kFixtures + "/" + f.mirror))) << e.name;
      ++fixtures;
    }
  }
  EXPECT_EQ(fixtures, 4);  // stories260k, quickdraw, taef2 encoder and decoder
  for (const char* name : {"stories260k", "quickdraw", "taef2", "tinyllama-1.1b-chat-q4_k_m", "llama-3.2-3b-instruct-q8_0",
                           "qwen2.5-1.5b-instruct-q4_k_m", "sd-1.5", "sd-2.1", "taesd"})
    EXPECT_NO_THROW(atelier::store::find_entry(catalog, name, "catalog")) << name;
}

TEST(Catalog, BadCatalogsAreRefusedWithTheEntryNamed) {
  EXPECT_THROW(atelier::store::parse_catalog("{", "c.json"), atelier::Error);
  try {
    atelier::store::parse_catalog(R"({"models": [{"name": "m", "kind": "text", "verified": true,
        "files": [{"name": "m.gguf", "mirror": "m.gguf", "sha256": ""}]}]})", "c.json");
    FAIL();
  } catch (const atelier::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model \"m\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(atelier::store::parse_catalog(R"({"models": [{"name": "m", "kind": "text",
        "files": [{"name": "m.gguf", "mirror": "../m.gguf"}]}]})", "c.json"), atelier::Error);
}
