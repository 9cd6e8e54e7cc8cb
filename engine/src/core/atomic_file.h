// Writes a file so that it is never seen half-written: bytes go to PATH.tmp,
// which commit() syncs and renames over PATH (then syncs the directory, best
// effort). Destroyed without commit(), it removes the tmp file.
// Errors are atelier::Error naming the file and the system's reason.
#pragma once

#include <cstddef>
#include <string>

namespace atelier {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace atelier
