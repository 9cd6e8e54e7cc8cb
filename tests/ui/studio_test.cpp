// The studio window starts, lists the models in a folder and renders: run
// offscreen, saved with --screenshot, and the PNG checked.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;

namespace {
uint32_t be32(const unsigned char* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3];
}
}  // namespace

TEST(Studio, RendersTheModelList) {
  const std::string png = (fs::temp_directory_path() / "atelier_studio_test.png").string();
  fs::remove(png);
  const std::string cmd = std::string("QT_QPA_PLATFORM=offscreen '") + ATELIER_STUDIO + "' --screenshot '" + png + "' '" +
                          ATELIER_FIXTURES_DIR + "/text' >/dev/null 2>&1";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd;
  std::ifstream in(png, std::ios::binary);
  ASSERT_TRUE(in) << "no screenshot written";
  unsigned char head[24] = {};
  in.read(reinterpret_cast<char*>(head), sizeof head);
  const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  ASSERT_EQ(std::string(head, head + 8), std::string(sig, sig + 8));
  EXPECT_GE(be32(head + 16), 600u);  // IHDR width
  EXPECT_GE(be32(head + 20), 300u);  // IHDR height
  EXPECT_GT(fs::file_size(png), 5000u);  // more than an empty frame
  fs::remove(png);
}
