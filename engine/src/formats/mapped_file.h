// A read-only memory mapping of a whole file: the way every model reader
// sees its bytes. The mapping is private and read-only; the pages are the
// page cache's, so opening a multi-gigabyte model costs no copy.
//
// Pages a reader no longer needs can leave this process (`release`): the
// mapping is private and never written, so dropping them only unmaps the page
// cache's copies (RSS falls, the file is untouched) and a later read faults
// them back in from the page cache or the file, with the same bytes.
//
// An empty file is valid: data() is nullptr and size() is 0 (mmap refuses a
// zero-length mapping, so none is made). Failures throw atelier::Error with
// the path and the system's reason (strerror).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace atelier::formats {

class MappedFile {
 public:
  // Opens and maps PATH. Throws atelier::Error ("PATH: cannot open: No such
  // file or directory") when it cannot, or when PATH is not a regular file.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  // Whether [p, p + bytes) lies inside the mapping.
  bool contains(const void* p, uint64_t bytes) const;
  // Drops this process's pages that lie wholly inside [p, p + bytes) and
  // inside the mapping (madvise MADV_DONTNEED; partial pages at the ends stay,
  // since a neighbour may still be read). Returns the bytes of whole pages
  // released; a range outside the mapping releases nothing.
  uint64_t release(const void* p, uint64_t bytes) const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace atelier::formats
