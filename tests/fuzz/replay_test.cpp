// Every fuzz target's entry point over its seed corpus and its regression
// inputs (tests/fuzz/regressions/TARGET/: inputs that once crashed), in the
// ordinary build and under ASan in CI, so a crash found by fuzzing stays fixed
// without clang or libFuzzer. Built as test_fuzz_replay (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#define ATELIER_FUZZ_TARGET(name) extern "C" int fuzz_##name(const uint8_t*, size_t);
ATELIER_FUZZ_TARGET(gguf)
ATELIER_FUZZ_TARGET(safetensors)
ATELIER_FUZZ_TARGET(zip)
ATELIER_FUZZ_TARGET(pickle)
ATELIER_FUZZ_TARGET(torch_checkpoint)
ATELIER_FUZZ_TARGET(tokenizer)
ATELIER_FUZZ_TARGET(chat_template)
ATELIER_FUZZ_TARGET(request_json)
ATELIER_FUZZ_TARGET(json_depth)
ATELIER_FUZZ_TARGET(png_info)
ATELIER_FUZZ_TARGET(http)

namespace {
namespace fs = std::filesystem;

// Runs every file of corpus/TARGET and regressions/TARGET; returns how many.
int replay(const std::string& target, int (*one)(const uint8_t*, size_t)) {
  int n = 0;
  for (const char* dir : {"corpus", "regressions"}) {
    const fs::path d = fs::path(ATELIER_FUZZ_DIR) / dir / target;
    if (!fs::is_directory(d)) continue;
    for (const auto& e : fs::directory_iterator(d)) {
      std::ifstream in(e.path(), std::ios::binary);
      const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      one(bytes.data(), bytes.size());  // a crash or a sanitizer report is the failure
      ++n;
    }
  }
  return n;
}
}  // namespace

#define ATELIER_REPLAY(name) \
  TEST(FuzzReplay, name) { EXPECT_GT(replay(#name, fuzz_##name), 0) << "no seed inputs for " #name; }
ATELIER_REPLAY(gguf)
ATELIER_REPLAY(safetensors)
ATELIER_REPLAY(zip)
ATELIER_REPLAY(pickle)
ATELIER_REPLAY(torch_checkpoint)
ATELIER_REPLAY(tokenizer)
ATELIER_REPLAY(chat_template)
ATELIER_REPLAY(request_json)
ATELIER_REPLAY(json_depth)
ATELIER_REPLAY(png_info)
ATELIER_REPLAY(http)
