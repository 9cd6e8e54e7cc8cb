// Read-only mmap of a file (POSIX). See mapped_file.h.
#include "formats/mapped_file.h"

#include "core/error.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace atelier::formats {

namespace {
std::string sys_error(const std::string& path, const char* what, int err) {
  return path + ": " + what + ": " + std::strerror(err);
}
}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(errno_code(errno), sys_error(path, "cannot open", errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw IoError(sys_error(path, "cannot stat", err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw NotFoundError(path + ": not a regular file");
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw IoError(sys_error(path, "cannot map into memory", err));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping stays valid without the descriptor
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace atelier::formats
