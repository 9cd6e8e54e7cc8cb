// Read-only mmap of a file (POSIX). See mapped_file.h.
#include "formats/mapped_file.h"

#include "core/error.h"

#include <algorithm>
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

bool MappedFile::contains(const void* p, uint64_t bytes) const {
  const auto b = reinterpret_cast<uintptr_t>(data_), q = reinterpret_cast<uintptr_t>(p);
  return data_ && q >= b && bytes <= size_ && q - b <= size_ - bytes;
}

uint64_t MappedFile::release(const void* p, uint64_t bytes) const {
  if (!data_ || bytes == 0) return 0;
  const auto base = reinterpret_cast<uintptr_t>(data_);
  uintptr_t begin = reinterpret_cast<uintptr_t>(p), end = begin + bytes;
  begin = std::max(begin, base);
  end = std::min(end, base + static_cast<uintptr_t>(size_));
  static const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  // The mapping starts on a page, and its last page counts whole (the tail
  // past the file's end is the kernel's zero fill, never read as data).
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = end == base + size_ ? (end + page - 1) / page * page : end / page * page;
  if (end <= begin || last <= first) return 0;
  if (::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0) return 0;
  return last - first;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace atelier::formats
