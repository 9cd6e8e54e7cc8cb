// The command line reads model files by content (formats/sniff.h): renamed
// files still run, an unknown file fails with exit 1 and one line naming what
// was looked for, and the exit statuses of the error kinds stay as they were.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "cli/cli_util.h"

namespace fs = std::filesystem;
using atelier::test::CliRun;

namespace {
const std::string kFix = ATELIER_FIXTURES_DIR;

fs::path scratch() {
  static int n = 0;
  const fs::path d = fs::temp_directory_path() / ("atelier-sniff-cli-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

CliRun greedy(const std::vector<std::string>& model_args) {
  std::vector<std::string> args = {"text", "-p", "Once upon a time", "-n", "16", "--temp", "0", "--threads", "1"};
  args.insert(args.end(), model_args.begin(), model_args.end());
  return atelier::test::run_atelier(args);
}
}  // namespace

TEST(CliSniff, RenamedTextModelsGiveTheSameText) {
  const fs::path d = scratch();
  fs::copy_file(kFix + "/text/stories260K.gguf", d / "x.bin");
  fs::copy_file(kFix + "/text/stories260K.bin", d / "x.dat");
  const CliRun want = greedy({"-m", kFix + "/text/stories260K.gguf"});
  ASSERT_EQ(want.code, 0) << want.err;
  const CliRun gguf_as_bin = greedy({"-m", (d / "x.bin").string()});
  EXPECT_EQ(gguf_as_bin.code, 0) << gguf_as_bin.err;
  EXPECT_EQ(gguf_as_bin.out, want.out);
  const CliRun bin_as_dat = greedy({"-m", (d / "x.dat").string(), "--tokenizer", kFix + "/text/tok512.bin"});
  EXPECT_EQ(bin_as_dat.code, 0) << bin_as_dat.err;
  const CliRun bin = greedy({"-m", kFix + "/text/stories260K.bin", "--tokenizer", kFix + "/text/tok512.bin"});
  EXPECT_EQ(bin_as_dat.out, bin.out);
  fs::remove_all(d);
}

TEST(CliSniff, UnknownAndMisplacedFilesFailWithOneLine) {
  const fs::path d = scratch();
  std::ofstream(d / "notes.gguf") << "not a model\n";
  const CliRun unknown = greedy({"-m", (d / "notes.gguf").string()});
  EXPECT_EQ(unknown.code, 1);
  EXPECT_EQ(std::count(unknown.err.begin(), unknown.err.end(), '\n'), 1) << unknown.err;
  EXPECT_NE(unknown.err.find("looked for"), std::string::npos) << unknown.err;
  // A tokenizer given as the model says what it is.
  const CliRun tok = greedy({"-m", kFix + "/text/tok512.bin"});
  EXPECT_EQ(tok.code, 1);
  EXPECT_NE(tok.err.find("tokenizer"), std::string::npos) << tok.err;
  // A llama2.c checkpoint alone in a folder: its tokenizer is not found (exit 1, says --tokenizer).
  fs::copy_file(kFix + "/text/stories260K.bin", d / "alone.bin");
  const CliRun alone = greedy({"-m", (d / "alone.bin").string()});
  EXPECT_EQ(alone.code, 1);
  EXPECT_NE(alone.err.find("--tokenizer"), std::string::npos) << alone.err;
  fs::remove_all(d);
}
