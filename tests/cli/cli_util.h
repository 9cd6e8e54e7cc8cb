// Helpers of the end-to-end tests: run the built `atelier` binary with
// arguments (no shell interpretation of them) and capture what it printed.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

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

// A scratch folder that runs atelier in it: the CLI suites' sandbox.
struct CliSandbox : ScratchDir {
  explicit CliSandbox(const std::string& name) : ScratchDir(name) {}
  CliRun run(const std::vector<std::string>& args) const { return run_atelier(args, dir); }
  std::string data() const { return (dir / "data").string(); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(dir / name, std::ios::binary) << text;
  }
};

// A CLI suite whose processes find no CUDA module (a path that does not
// exist), so `--device auto` is the CPU on every machine.
class WithoutCudaModule : public ::testing::Test {
 protected:
  void SetUp() override { ::setenv("ATELIER_CUDA_MODULE", "/nonexistent/libatelier_cuda.so", 1); }
  void TearDown() override { ::unsetenv("ATELIER_CUDA_MODULE"); }
};

// The lines of a JSON Lines text (empty lines skipped).
inline std::vector<nlohmann::json> jsonl(const std::string& text) {
  std::vector<nlohmann::json> v;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) v.push_back(nlohmann::json::parse(line));
  return v;
}

// The atelier binary in the background, stdout and stderr to files in DIR;
// killed (SIGKILL) and reaped by the destructor if still running.
struct Child {
  pid_t pid = -1;
  std::string out, err;
  Child(const std::vector<std::string>& args, const std::filesystem::path& dir, const std::string& tag = "child") {
    out = (dir / (tag + "_out")).string();
    err = (dir / (tag + "_err")).string();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const std::string bin = atelier_binary();
    std::vector<std::string> all = {bin};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid, bin.c_str(), &fa, nullptr, argv.data(), environ) != 0) pid = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  // Exit code, 128 + signal when killed.
  int wait() {
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  // True (and the exit code in *code) when it has ended; does not block.
  bool ended(int* code) {
    int status = 0;
    if (pid <= 0 || ::waitpid(pid, &status, WNOHANG) != pid) return false;
    pid = -1;
    *code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return true;
  }
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
};

}  // namespace atelier::test
