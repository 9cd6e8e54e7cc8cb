// Hugging Face safetensors: a bounds-checked, memory-mapped reader and a
// writer (used by tests and by synthetic models).
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype": "F16", "shape": [..], "data_offsets": [begin, end]},
// ..., "__metadata__": {"key": "value", ...}}), then the data section; the
// offsets are relative to the data section.
//
// The file is untrusted input. N is checked against the file size and a cap
// (kMaxHeaderBytes) before anything is parsed; every tensor's shape x element
// size must equal its data_offsets span, which must lie inside the data
// section; no two tensors may overlap (the header may list them in any
// order). Any problem throws atelier::Error naming the file, the tensor and
// what is wrong. Types other than F32/F16/BF16 (I64, U8, F64, ...) open fine
// and are listed; supported() says whether math can use them.
//
// Tensor data pointers point into the mapping. The format does not align
// tensors, so a pointer may be unaligned for its element type: copy (memcpy)
// or use unaligned loads.
#pragma once

#include "formats/tensor_types.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace atelier::formats {

class MappedFile;  // mapped_file.h

struct SafetensorsTensor {
  std::string name;
  ElemType dtype = ElemType::F32;
  std::vector<int64_t> shape;      // row-major, outermost first (PyTorch order)
  uint64_t offset = 0;             // relative to the data section
  const uint8_t* data = nullptr;   // into the mapping (nullptr when bytes == 0)
  uint64_t bytes = 0;
  int64_t elements() const;
  bool supported() const { return supported_for_math(dtype); }
};

class SafetensorsFile {
 public:
  // Hugging Face's own reader refuses headers above 100 MB; so do we.
  static constexpr uint64_t kMaxHeaderBytes = 100u << 20;

  // Maps and parses the file. Throws atelier::Error on any problem.
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  // The mapping the tensors' data points into (to release pages read once).
  const MappedFile& mapping() const { return *map_; }
  uint64_t header_bytes() const { return header_bytes_; }
  // Where the data section starts in the file (8 + header_bytes()).
  uint64_t data_offset() const { return 8 + header_bytes_; }

  // In the order the header lists them.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find_tensor(const std::string& name) const;
  // Throws Error("FILE: tensor NAME is missing") when absent.
  const SafetensorsTensor& tensor(const std::string& name) const;
  // The "__metadata__" string map (empty when the file has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  std::unique_ptr<MappedFile> map_;
  uint64_t header_bytes_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes a safetensors file: tensors in insertion order, packed back to back;
// the header padded with spaces to a multiple of 8 bytes (as Hugging Face's
// writer does). Writes to PATH.tmp, fsyncs, then renames, so a failed write
// never leaves a half-written model behind.
class SafetensorsWriter {
 public:
  // shape row-major; bytes must equal elements x elem_size(dtype) (copied).
  // Throws Error on a mismatch, a duplicate name or the name "__metadata__".
  void add_tensor(const std::string& name, ElemType dtype, const std::vector<int64_t>& shape,
                  const void* data, uint64_t bytes);
  void set_metadata(const std::string& key, const std::string& value);

  // Throws atelier::Error on I/O failure (message names the path and errno text).
  void write(const std::string& path) const;

 private:
  struct Pending {
    std::string name;
    ElemType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
  };
  std::vector<Pending> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace atelier::formats
