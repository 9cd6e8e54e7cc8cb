// Helpers of the end-to-end tests: run the built `atelier` binary with
// arguments (no shell interpretation of them) and capture what it printed.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace atelier::test {

inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string shell_quote(const std::string& s) {
  std::string r = "'";
  for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}

// The binary under test. ATELIER_TEST_BINARY runs the suite against another
// build (an older one, to see a regression test fail before its fix).
inline std::string atelier_binary() {
  const char* other = std::getenv("ATELIER_TEST_BINARY");
  return other && *other ? other : ATELIER_BINARY;
}

// A scratch folder per test and process (ctest runs cases in parallel
// processes): emptied when made, removed with everything in it at the end.
struct ScratchDir {
  std::filesystem::path dir;
  explicit ScratchDir(const std::string& name)
      : dir(std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
};

struct CliRun {
  int code;
  std::string out, err;
};

// Capture files go in `dir`; ctest runs test cases in parallel processes, so
// the default is a per-process name in the temp dir.
inline CliRun run_atelier(const std::vector<std::string>& args, const std::filesystem::path& dir = {}) {
  const std::filesystem::path base = dir.empty() ? std::filesystem::temp_directory_path() : dir;
  const std::string tag = std::to_string(::getpid());
  const std::string out = (base / ("atelier_out_" + tag)).string(), err = (base / ("atelier_err_" + tag)).string();
  std::string cmd = shell_quote(atelier_binary());
  for (const auto& a : args) cmd.append(" ").append(shell_quote(a));  // append: GCC 12 misreports " " + s (-Wrestrict)
  cmd.append(" >").append(out).append(" 2>").append(err);
  const int status = std::system(cmd.c_str());
  CliRun r{WIFEXITED(status) ? WEXITSTATUS(status) : 128, slurp(out), slurp(err)};
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

}  // namespace atelier::test
