// Shared output helpers of the headless commands: unbuffered stdout writes
// for streaming, JSON Lines, and the one-line error format.
#pragma once

#include <atelier/engine.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>

namespace atelier::app {

inline void write_stdout(const std::string& s) {
  if (s.empty()) return;
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

// Invalid UTF-8 (a token that is half of a character) is replaced, not thrown on.
inline void print_json_line(const nlohmann::json& j) {
  write_stdout(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

inline int fail(const Status& s) {
  std::fprintf(stderr, "atelier: error: %s\n", s.message.c_str());
  return s.code == StatusCode::InvalidArgument ? 2 : 1;
}

}  // namespace atelier::app
