// GGUF (llama.cpp's model format), versions 2 and 3: a bounds-checked,
// memory-mapped reader and a writer.
//
// The file is untrusted input. Every read is checked against the file size;
// counts and lengths are checked before anything is allocated; a truncated,
// corrupt or hostile file throws atelier::Error naming the file and what is
// wrong. Nothing here crashes or allocates more than the file could hold.
#pragma once

#include <atelier/kernels.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace atelier::formats {

class MappedFile;  // mapped_file.h

enum class GgufType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
  BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};

// One metadata value. Scalars are widened (integers to int64/uint64, floats to
// double) but `type` keeps the type stored in the file. Arrays hold their
// elements' type in `elem_type` and the values in the matching vector.
struct GgufValue {
  GgufType type = GgufType::UINT32;
  GgufType elem_type = GgufType::UINT32;  // arrays only
  std::variant<uint64_t, int64_t, double, bool, std::string,
               std::vector<uint64_t>, std::vector<int64_t>, std::vector<double>,
               std::vector<uint8_t> /*bool arrays*/, std::vector<std::string>>
      value;
};

struct GgufTensor {
  std::string name;
  std::vector<int64_t> shape;  // GGML order: shape[0] is the innermost (row length)
  kernels::DType type = kernels::DType::F32;
  uint64_t offset = 0;          // relative to the data section
  const uint8_t* data = nullptr;  // into the mapping
  uint64_t bytes = 0;
  int64_t elements() const;
};

class GgufFile {
 public:
  // Maps and parses the file. Throws atelier::Error on any problem.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  ~GgufFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  // Where the data section starts in the file (a multiple of alignment()).
  // tensor.data == mapping start + data_offset() + tensor.offset.
  uint64_t data_offset() const { return data_offset_; }

  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const GgufValue* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }

  // Typed getters. The `fallback` overloads return it when the key is absent;
  // the others throw Error("FILE: metadata key K is missing"). A key of the
  // wrong type throws Error naming the key, the expected and the found type.
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  int64_t get_int(const std::string& key) const;          // any integer type (uint64 > INT64_MAX throws)
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key) const;         // FLOAT32/FLOAT64 (integers accepted too)
  double get_float(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<double> get_float_array(const std::string& key) const;   // from any numeric array
  std::vector<int64_t> get_int_array(const std::string& key) const;    // from any integer array

  // Frees the parsed metadata once a loader has read all it needs (a 32k
  // vocabulary's strings, scores and types are ~2 MB of heap, duplicated by
  // the tokenizer built from them). The tensors stay; a later metadata read
  // throws Error(Internal).
  void drop_metadata();

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(const std::string& name) const;
  // Throws Error("FILE: tensor NAME is missing") when absent.
  const GgufTensor& tensor(const std::string& name) const;

 private:
  GgufFile() = default;
  std::string path_;
  std::unique_ptr<MappedFile> map_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue> kv_;
  bool metadata_dropped_ = false;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// Writes a GGUF v3 file. Metadata keeps insertion order; tensor data is
// aligned to general.alignment (default 32). Writes to PATH.tmp, fsyncs, then
// renames, so a failed write never leaves a half-written model behind.
class GgufWriter {
 public:
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, const std::string& v);
  void set_value(const std::string& key, const GgufValue& v);  // any type, arrays included
  void set_string_array(const std::string& key, const std::vector<std::string>& v);
  void set_f32_array(const std::string& key, const std::vector<float>& v);
  void set_i32_array(const std::string& key, const std::vector<int32_t>& v);

  // shape in GGML order; data must hold dtype_row_bytes(type, shape[0]) * rows bytes (copied).
  void add_tensor(const std::string& name, const std::vector<int64_t>& shape, kernels::DType type,
                  const void* data, uint64_t bytes);

  // Throws atelier::Error on I/O failure (message names the path and errno text).
  void write(const std::string& path) const;

 private:
  std::vector<std::pair<std::string, GgufValue>> kv_;
  struct Pending {
    std::string name;
    std::vector<int64_t> shape;
    kernels::DType type;
    std::vector<uint8_t> data;
  };
  std::vector<Pending> tensors_;
};

}  // namespace atelier::formats
