// End-to-end `atelier image` with the QuickDraw CVAE: the PNG's size and its
// A1111 `parameters` chunk, batches, and the usage errors.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/cli_util.h"

namespace fs = std::filesystem;

namespace {

const std::string kModel = std::string(ATELIER_FIXTURES_DIR) + "/image/quickdraw-cvae.safetensors";

struct PngFacts {
  uint32_t width = 0, height = 0;
  std::map<std::string, std::string> text;  // tEXt and uncompressed iTXt
  std::string idat;                         // the compressed pixels, all IDAT chunks
};

uint32_t be32(const std::string& s, size_t p) {
  return (uint32_t(uint8_t(s[p])) << 24) | (uint32_t(uint8_t(s[p + 1])) << 16) | (uint32_t(uint8_t(s[p + 2])) << 8) |
         uint32_t(uint8_t(s[p + 3]));
}

// Walks the chunks of the file's bytes (an independent reader: not the engine's).
PngFacts scan_png(const std::string& b) {
  PngFacts f;
  if (b.size() < 8 || b.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) return f;
  size_t pos = 8;
  while (pos + 12 <= b.size()) {
    const uint32_t len = be32(b, pos);
    const std::string type = b.substr(pos + 4, 4);
    if (pos + 12 + len > b.size()) break;
    const std::string data = b.substr(pos + 8, len);
    if (type == "IHDR" && len >= 8) {
      f.width = be32(data, 0);
      f.height = be32(data, 4);
    } else if (type == "IDAT") {
      f.idat += data;
    } else if (type == "tEXt") {
      const size_t nul = data.find('\0');
      if (nul != std::string::npos) f.text[data.substr(0, nul)] = data.substr(nul + 1);
    } else if (type == "iTXt") {
      const size_t k = data.find('\0');
      const size_t l = k == std::string::npos ? k : data.find('\0', k + 3);
      const size_t t = l == std::string::npos ? l : data.find('\0', l + 1);
      if (t != std::string::npos && data[k + 1] == 0) f.text[data.substr(0, k)] = data.substr(t + 1);
    }
    pos += 12 + len;
  }
  return f;
}

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("atelier_image_cli_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST(CliImage, OctopusPngCarriesItsParameters) {
  const fs::path dir = temp_dir();
  const std::string out = (dir / "octopus.png").string();
  auto r = atelier::test::run_atelier({"image", "-m", kModel, "-p", "an octopus", "-W", "256", "-H", "256", "--seed", "3", "-o", out});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(out), std::string::npos) << r.out;
  ASSERT_TRUE(fs::exists(out));
  const PngFacts f = scan_png(atelier::test::slurp(out));
  EXPECT_EQ(f.width, 256u);
  EXPECT_EQ(f.height, 256u);
  ASSERT_TRUE(f.text.count("parameters"));
  const std::string& p = f.text.at("parameters");
  EXPECT_EQ(p.rfind("an octopus\nSteps: 1, Sampler: CVAE decoder, CFG scale: 1, Seed: 3, Size: 256x256, Model hash: ", 0), 0u) << p;
  EXPECT_NE(p.find(", Model: quickdraw-cvae"), std::string::npos) << p;
  ASSERT_TRUE(f.text.count("atelier"));
  const auto j = nlohmann::json::parse(f.text.at("atelier"));
  EXPECT_EQ(j.at("prompt"), "an octopus");
  EXPECT_EQ(j.at("seed"), 3);
  EXPECT_EQ(j.at("width"), 256);

  // Same seed, same bytes.
  const std::string again = (dir / "again.png").string();
  ASSERT_EQ(atelier::test::run_atelier({"image", "-m", kModel, "-p", "an octopus", "-W", "256", "-H", "256", "--seed", "3", "-o", again}).code, 0);
  EXPECT_EQ(atelier::test::slurp(out), atelier::test::slurp(again));
  fs::remove_all(dir);
}

TEST(CliImage, BatchWritesNumberedFilesWithSuccessiveSeeds) {
  const fs::path dir = temp_dir();
  auto r = atelier::test::run_atelier({"image", "-m", kModel, "-p", "apple", "-W", "64", "-H", "32", "--seed", "10",
                                       "--batch-count", "3", "--negative", "blurry", "-o", (dir / "a.png").string(), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  int images = 0, steps = 0;  // JSON Lines: a "step" event per image (one-pass model), then the "image" lines
  for (size_t p = 0; (p = r.out.find("\"event\":", p)) != std::string::npos; ++p) {
    const std::string image_event = "\"event\":\"image\"", step_event = "\"event\":\"step\"";
    images += r.out.compare(p, image_event.size(), image_event) == 0;
    steps += r.out.compare(p, step_event.size(), step_event) == 0;
  }
  EXPECT_EQ(images, 3) << r.out;
  EXPECT_EQ(steps, 3) << r.out;
  for (int i = 1; i <= 3; ++i) {
    const fs::path f = dir / ("a-" + std::to_string(i) + ".png");
    ASSERT_TRUE(fs::exists(f)) << f;
    const PngFacts facts = scan_png(atelier::test::slurp(f.string()));
    EXPECT_EQ(facts.width, 64u);
    EXPECT_EQ(facts.height, 32u);
    EXPECT_NE(facts.text.at("parameters").find("Negative prompt: blurry\n"), std::string::npos);
    EXPECT_NE(facts.text.at("parameters").find("Seed: " + std::to_string(9 + i) + ","), std::string::npos);
  }
  fs::remove_all(dir);
}

TEST(CliImage, BadSizeIsUsageError) {
  const fs::path dir = temp_dir();
  auto r = atelier::test::run_atelier({"image", "-m", kModel, "-p", "an octopus", "-W", "100", "-o", (dir / "x.png").string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("multiple of 8"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "x.png"));
  fs::remove_all(dir);
}

TEST(CliImage, UnknownClassListsTheClasses) {
  const fs::path dir = temp_dir();
  auto r = atelier::test::run_atelier({"image", "-m", kModel, "-p", "a giraffe", "-W", "64", "-H", "64", "-o", (dir / "x.png").string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("octopus"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

TEST(CliImage, OtherModelsAreUnsupported) {
  const fs::path dir = temp_dir();
  auto r = atelier::test::run_atelier({"image", "-m", std::string(ATELIER_FIXTURES_DIR) + "/text/stories260K.gguf", "-p", "x",
                                       "-W", "64", "-H", "64", "-o", (dir / "x.png").string()});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("is a text model"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

TEST(CliImage, MissingOutputFolderIsAClearError) {
  auto r = atelier::test::run_atelier({"image", "-m", kModel, "-p", "owl", "-W", "64", "-H", "64", "-o", "/nonexistent-atelier-dir/o.png"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("/nonexistent-atelier-dir/o.png"), std::string::npos) << r.err;
}

// A Stable Diffusion checkpoint imported into the store with CLIP's vocabulary
// (role tokenizer) generates by name: blobs have no file extension, and the
// vocabulary comes from the version, not from a flag. Steps show as JSON
// events and previews, and the image equals the one made from the files.
TEST(CliImage, StableDiffusionFromTheStoreByName) {
  const fs::path dir = temp_dir() / "sd";
  fs::create_directories(dir);
  const std::string ckpt = (dir / "narrow.safetensors").string(), store = (dir / "store").string();
  const std::string vocab = std::string(ATELIER_FIXTURES_DIR) + "/clip/bpe_simple_vocab_16e6.txt.gz";
  ASSERT_EQ(atelier::test::run_atelier({"models", "synth", "--arch", "sd15", "--width-mult", "0.1", "-o", ckpt}).code, 0);
  auto imp = atelier::test::run_atelier({"models", "import", ckpt, vocab, "--name", "sd-narrow", "--role", "model", "--role",
                                         "tokenizer", "--store", store});
  ASSERT_EQ(imp.code, 0) << imp.err;
  auto r = atelier::test::run_atelier({"image", "-m", "sd-narrow", "--store", store, "-p", "a red fox", "-W", "64", "-H", "64",
                                       "--steps", "3", "--seed", "11", "--preview-dir", (dir / "prev").string(), "--json",
                                       "-o", (dir / "by-name.png").string()});
  ASSERT_EQ(r.code, 0) << r.err;
  int steps = 0;
  for (size_t p = 0; (p = r.out.find("\"event\":\"step\"", p)) != std::string::npos; ++p) ++steps;
  EXPECT_EQ(steps, 3) << r.out;
  EXPECT_TRUE(fs::exists(dir / "prev" / "001-003.png"));
  auto f = atelier::test::run_atelier({"image", "-m", ckpt, "--tokenizer", vocab, "-p", "a red fox", "-W", "64", "-H", "64",
                                       "--steps", "3", "--seed", "11", "-o", (dir / "by-file.png").string()});
  ASSERT_EQ(f.code, 0) << f.err;
  const PngFacts a = scan_png(atelier::test::slurp((dir / "by-name.png").string()));
  const PngFacts b = scan_png(atelier::test::slurp((dir / "by-file.png").string()));
  EXPECT_EQ(a.width, 64u);
  EXPECT_NE(a.text.at("parameters").find("Model: sd-narrow@1"), std::string::npos) << a.text.at("parameters");
  EXPECT_EQ(a.idat, b.idat);  // the same pixels
  fs::remove_all(dir);
}
