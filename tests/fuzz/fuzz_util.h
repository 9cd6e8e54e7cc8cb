// Shared by the libFuzzer targets: the readers that take a path get the
// input through a per-process file in /dev/shm (tmpfs: no disk I/O per run).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace atelier::fuzz {

inline const std::string& scratch_path() {
  static const std::string path = "/dev/shm/atelier-fuzz-" + std::to_string(::getpid());
  return path;
}

inline const std::string& write_scratch(const uint8_t* data, size_t size) {
  const std::string& path = scratch_path();
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    if (size) std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  return path;
}

}  // namespace atelier::fuzz
