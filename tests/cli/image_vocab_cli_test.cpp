// CLIP's vocabulary ships with the program (assets/clip, copied to
// <build>/share/atelier/clip at configure time): a plain SD checkpoint with
// no vocabulary beside it, none in a store and no --tokenizer generates, and
// its pixels equal those made with the vocabulary passed explicitly.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "cli/cli_util.h"

namespace fs = std::filesystem;

namespace {

// The concatenated IDAT chunks of a PNG's bytes (the compressed pixels).
std::string png_idat(const std::string& b) {
  auto be32 = [&](size_t p) {
    return (uint32_t(uint8_t(b[p])) << 24) | (uint32_t(uint8_t(b[p + 1])) << 16) | (uint32_t(uint8_t(b[p + 2])) << 8) |
           uint32_t(uint8_t(b[p + 3]));
  };
  std::string idat;
  for (size_t pos = 8; pos + 12 <= b.size();) {
    const uint32_t len = be32(pos);
    if (pos + 12 + len > b.size()) break;
    if (b.compare(pos + 4, 4, "IDAT") == 0) idat += b.substr(pos + 8, len);
    pos += 12 + len;
  }
  return idat;
}

}  // namespace

TEST(CliImageVocab, PlainSdCheckpointUsesTheShippedVocabulary) {
  const fs::path dir = fs::temp_directory_path() / ("atelier_image_vocab_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "models");
  const std::string ckpt = (dir / "models" / "sd.safetensors").string();
  ASSERT_EQ(atelier::test::run_atelier({"models", "synth", "--arch", "sd15", "--width-mult", "0.1", "-o", ckpt}).code, 0);
  ASSERT_FALSE(fs::exists(dir / "models" / "bpe_simple_vocab_16e6.txt.gz"));
  // An empty store: nothing there to lend a vocabulary either.
  const std::string store = (dir / "store").string();
  auto r = atelier::test::run_atelier({"image", "-m", ckpt, "--store", store, "-p", "a lighthouse at dusk", "-W", "64", "-H",
                                       "64", "--steps", "2", "--seed", "5", "-o", (dir / "shipped.png").string()});
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_TRUE(fs::exists(dir / "shipped.png"));
  EXPECT_EQ(r.err.find("--tokenizer"), std::string::npos) << r.err;

  const std::string vocab = std::string(ATELIER_FIXTURES_DIR) + "/clip/bpe_simple_vocab_16e6.txt.gz";
  auto f = atelier::test::run_atelier({"image", "-m", ckpt, "--store", store, "--tokenizer", vocab, "-p",
                                       "a lighthouse at dusk", "-W", "64", "-H", "64", "--steps", "2", "--seed", "5", "-o",
                                       (dir / "explicit.png").string()});
  ASSERT_EQ(f.code, 0) << f.err;
  const std::string a = png_idat(atelier::test::slurp(dir / "shipped.png"));
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, png_idat(atelier::test::slurp(dir / "explicit.png")));  // the same vocabulary, the same pixels
  fs::remove_all(dir);
}
