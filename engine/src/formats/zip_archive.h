// A read-only view of the entries of a zip archive held in memory (a
// MappedFile), for PyTorch checkpoints (`torch.save` since 1.6 writes a zip
// whose entries are all *stored*, uncompressed, with their data aligned to 64
// bytes so tensors can be used in place).
//
// Why not libzip (the project's rule is "prefer a well-kept Debian library"):
// libzip has no public API that returns where an entry's bytes start in the
// archive; it can only copy them out through zip_fread. A Stable Diffusion
// checkpoint holds 2-7 GB of tensors, and copying them to the heap would
// defeat the zero-copy mmap that every other model reader here relies on.
// For stored entries the job is small and fully bounds-checked: find the end
// of central directory record (and its ZIP64 form for archives over 4 GB or
// 65535 entries), walk the central directory, and read each entry's local
// header to find its data. Compressed and encrypted entries are listed but
// refused when their data is asked for.
//
// Every offset and length is checked against the buffer; a truncated or
// hostile archive throws atelier::Error naming the file and what is wrong.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace atelier::formats {

struct ZipEntry {
  std::string name;
  uint16_t method = 0;        // 0 = stored
  uint16_t flags = 0;         // bit 0 = encrypted
  uint64_t compressed_size = 0;
  uint64_t size = 0;
  uint64_t local_header_offset = 0;
};

class ZipArchive {
 public:
  static constexpr uint64_t kMaxEntries = 1u << 20;

  // Parses the central directory of the archive in [data, data + size).
  // `where` names the file in error messages. The buffer must outlive this.
  ZipArchive(const uint8_t* data, uint64_t size, const std::string& where);

  const std::vector<ZipEntry>& entries() const { return entries_; }
  const ZipEntry* find(const std::string& name) const;

  // The bytes of a stored entry, checked to lie inside the buffer. Throws
  // Error for a missing, compressed, encrypted or out-of-bounds entry.
  struct Span {
    const uint8_t* data;
    uint64_t size;
  };
  Span read(const std::string& name) const;

 private:
  const uint8_t* data_;
  uint64_t size_;
  std::string where_;
  std::vector<ZipEntry> entries_;
  std::map<std::string, size_t> index_;
};

// Whether the buffer starts like a zip archive (a local file header).
bool looks_like_zip(const uint8_t* data, uint64_t size);

}  // namespace atelier::formats
