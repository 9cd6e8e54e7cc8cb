#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "core/error.h"

namespace atelier {

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw IoError(tmp_ + ": cannot create: " + std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  const auto* c = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t w = ::write(fd_, c, bytes);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw IoError(tmp_ + ": cannot write: " + std::strerror(errno));
    }
    c += w;
    bytes -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) throw IoError(tmp_ + ": cannot sync to disk: " + std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw IoError(tmp_ + ": cannot close: " + std::strerror(errno));
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    throw IoError(path_ + ": cannot rename " + tmp_ + " into place: " + std::strerror(errno));
  committed_ = true;
  // Make the rename durable: sync the directory (best effort).
  std::string dir = ".";
  if (auto slash = path_.find_last_of('/'); slash != std::string::npos) dir = slash == 0 ? "/" : path_.substr(0, slash);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace atelier
