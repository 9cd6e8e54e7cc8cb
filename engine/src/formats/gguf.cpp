// GGUF v2/v3 reader and v3 writer (see gguf.h and llama.cpp's gguf.cpp).
//
// Layout (little-endian):
//   "GGUF" u32 version  u64 n_tensors  u64 n_kv
//   n_kv x   { string key, u32 type, value }
//   n_tensors x { string name, u32 n_dims, u64 dims[n_dims], u32 type, u64 offset }
//   padding to general.alignment (default 32), then the data section;
//   every tensor offset is relative to the data section and aligned.
// A string is u64 length + bytes (no terminator); an array is u32 element
// type + u64 count + elements.
//
// The reader treats the file as hostile: every count and length is checked
// against the bytes that remain *before* anything is allocated, so a header
// that claims 2^60 elements fails with a clear message instead of a huge
// allocation; tensor extents are checked for overflow and against the file.
#include "formats/gguf.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "formats/mapped_file.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <limits>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

namespace atelier::formats {

namespace {

constexpr uint32_t kMaxDims = 4;
constexpr uint64_t kDefaultAlignment = 32;
// Far above any real file (the largest vocabularies hold ~260k entries), far
// below what could hurt: a cap on the elements of one metadata array, so a
// large hostile file cannot make us widen gigabytes of u8 into u64.
constexpr uint64_t kMaxArrayElems = uint64_t{1} << 24;

const char* type_name(GgufType t) {
  switch (t) {
    case GgufType::UINT8: return "uint8";
    case GgufType::INT8: return "int8";
    case GgufType::UINT16: return "uint16";
    case GgufType::INT16: return "int16";
    case GgufType::UINT32: return "uint32";
    case GgufType::INT32: return "int32";
    case GgufType::FLOAT32: return "float32";
    case GgufType::BOOL: return "bool";
    case GgufType::STRING: return "string";
    case GgufType::ARRAY: return "array";
    case GgufType::UINT64: return "uint64";
    case GgufType::INT64: return "int64";
    case GgufType::FLOAT64: return "float64";
  }
  return "unknown";
}

std::string describe(const GgufValue& v) {
  if (v.type == GgufType::ARRAY) return std::string("array of ") + type_name(v.elem_type);
  return type_name(v.type);
}

bool valid_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::FLOAT64); }

bool is_unsigned(GgufType t) {
  return t == GgufType::UINT8 || t == GgufType::UINT16 || t == GgufType::UINT32 || t == GgufType::UINT64;
}
bool is_signed(GgufType t) {
  return t == GgufType::INT8 || t == GgufType::INT16 || t == GgufType::INT32 || t == GgufType::INT64;
}
bool is_float(GgufType t) { return t == GgufType::FLOAT32 || t == GgufType::FLOAT64; }

// Bytes one scalar of type t occupies in the file (strings: the minimum, an empty one).
uint64_t file_size_of(GgufType t) {
  switch (t) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::BOOL: return 1;
    case GgufType::UINT16: case GgufType::INT16: return 2;
    case GgufType::UINT32: case GgufType::INT32: case GgufType::FLOAT32: return 4;
    case GgufType::UINT64: case GgufType::INT64: case GgufType::FLOAT64: return 8;
    case GgufType::STRING: return 8;
    case GgufType::ARRAY: return 12;
  }
  return 1;
}

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// A cursor over the mapping that never reads past its end.
class Reader {
 public:
  Reader(const std::string& path, const uint8_t* data, uint64_t size)
      : path_(path), data_(data), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  [[noreturn]] void fail(const std::string& what) const { throw Error(path_ + ": " + what); }

  void need(uint64_t n, const std::string& what) const {
    if (n > remaining())
      fail("truncated: " + what + " needs " + std::to_string(n) + " bytes at offset " +
           std::to_string(pos_) + " but the file ends at " + std::to_string(size_) +
           " — the file is incomplete or corrupt; fetch it again");
  }

  template <typename T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const std::string& what) {
    uint64_t len = read<uint64_t>(what + " (length)");
    if (len > remaining())
      fail("truncated or corrupt: " + what + " claims a length of " + std::to_string(len) + " bytes at offset " +
           std::to_string(pos_ - 8) + " but only " + std::to_string(remaining()) +
           " bytes remain in the file");
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

  // Checks that `count` items of at least `min_bytes` each can fit in what remains.
  void check_count(uint64_t count, uint64_t min_bytes, const std::string& what) const {
    if (min_bytes != 0 && count > remaining() / min_bytes)
      fail("truncated or corrupt: " + what + " claims " + std::to_string(count) + " entries of at least " +
           std::to_string(min_bytes) + " bytes each, but only " + std::to_string(remaining()) +
           " bytes remain in the file");
  }

 private:
  const std::string& path_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

GgufValue read_scalar(Reader& r, GgufType t, const std::string& what) {
  GgufValue v;
  v.type = t;
  switch (t) {
    case GgufType::UINT8: v.value = uint64_t{r.read<uint8_t>(what)}; break;
    case GgufType::INT8: v.value = int64_t{r.read<int8_t>(what)}; break;
    case GgufType::UINT16: v.value = uint64_t{r.read<uint16_t>(what)}; break;
    case GgufType::INT16: v.value = int64_t{r.read<int16_t>(what)}; break;
    case GgufType::UINT32: v.value = uint64_t{r.read<uint32_t>(what)}; break;
    case GgufType::INT32: v.value = int64_t{r.read<int32_t>(what)}; break;
    case GgufType::UINT64: v.value = r.read<uint64_t>(what); break;
    case GgufType::INT64: v.value = r.read<int64_t>(what); break;
    case GgufType::FLOAT32: v.value = double{r.read<float>(what)}; break;
    case GgufType::FLOAT64: v.value = r.read<double>(what); break;
    case GgufType::BOOL: v.value = r.read<uint8_t>(what) != 0; break;
    case GgufType::STRING: v.value = r.read_string(what); break;
    case GgufType::ARRAY: r.fail("internal: read_scalar called for an array");
  }
  return v;
}

template <typename Out, typename In>
std::vector<Out> read_array_of(Reader& r, uint64_t n, const std::string& what) {
  std::vector<Out> out;
  out.reserve(static_cast<size_t>(n));  // bounded by check_count and kMaxArrayElems
  for (uint64_t i = 0; i < n; ++i) out.push_back(static_cast<Out>(r.read<In>(what)));
  return out;
}

GgufValue read_value(Reader& r, uint32_t type_id, const std::string& key) {
  const std::string what = "value of metadata key '" + key + "'";
  if (!valid_type(type_id))
    r.fail("corrupt: metadata key '" + key + "' has unknown value type " + std::to_string(type_id) +
           " at offset " + std::to_string(r.pos() - 4));
  auto type = static_cast<GgufType>(type_id);
  if (type != GgufType::ARRAY) return read_scalar(r, type, what);

  GgufValue v;
  v.type = GgufType::ARRAY;
  uint32_t elem_id = r.read<uint32_t>(what + " (array element type)");
  if (!valid_type(elem_id))
    r.fail("corrupt: metadata array '" + key + "' has unknown element type " + std::to_string(elem_id));
  v.elem_type = static_cast<GgufType>(elem_id);
  if (v.elem_type == GgufType::ARRAY)
    r.fail("unsupported: metadata key '" + key +
           "' is an array of arrays; nested arrays are not supported (llama.cpp models do not use them)");
  uint64_t n = r.read<uint64_t>(what + " (array length)");
  r.check_count(n, file_size_of(v.elem_type), "metadata array '" + key + "'");
  if (n > kMaxArrayElems)
    r.fail("unsupported: metadata array '" + key + "' has " + std::to_string(n) +
           " elements; the limit is " + std::to_string(kMaxArrayElems));
  switch (v.elem_type) {
    case GgufType::UINT8: v.value = read_array_of<uint64_t, uint8_t>(r, n, what); break;
    case GgufType::UINT16: v.value = read_array_of<uint64_t, uint16_t>(r, n, what); break;
    case GgufType::UINT32: v.value = read_array_of<uint64_t, uint32_t>(r, n, what); break;
    case GgufType::UINT64: v.value = read_array_of<uint64_t, uint64_t>(r, n, what); break;
    case GgufType::INT8: v.value = read_array_of<int64_t, int8_t>(r, n, what); break;
    case GgufType::INT16: v.value = read_array_of<int64_t, int16_t>(r, n, what); break;
    case GgufType::INT32: v.value = read_array_of<int64_t, int32_t>(r, n, what); break;
    case GgufType::INT64: v.value = read_array_of<int64_t, int64_t>(r, n, what); break;
    case GgufType::FLOAT32: v.value = read_array_of<double, float>(r, n, what); break;
    case GgufType::FLOAT64: v.value = read_array_of<double, double>(r, n, what); break;
    case GgufType::BOOL: {
      std::vector<uint8_t> b;
      b.reserve(static_cast<size_t>(n));
      for (uint64_t i = 0; i < n; ++i) b.push_back(r.read<uint8_t>(what) != 0 ? 1 : 0);
      v.value = std::move(b);
      break;
    }
    case GgufType::STRING: {
      std::vector<std::string> s;
      s.reserve(static_cast<size_t>(n));
      for (uint64_t i = 0; i < n; ++i) s.push_back(r.read_string(what + " [" + std::to_string(i) + "]"));
      v.value = std::move(s);
      break;
    }
    case GgufType::ARRAY: break;  // refused above
  }
  return v;
}

uint32_t byteswap32(uint32_t v) {
  return (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
}

bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

// ---------------------------------------------------------------------------
// GgufTensor

int64_t GgufTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // checked for overflow when the file was read
  return n;
}

// ---------------------------------------------------------------------------
// GgufFile

GgufFile::~GgufFile() = default;

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->map_ = std::make_unique<MappedFile>(path);
  const uint8_t* base = f->map_->data();
  const uint64_t size = f->map_->size();
  Reader r(f->path_, base, size);

  // --- header
  if (size < 4 || std::memcmp(base, "GGUF", 4) != 0) {
    if (size == 0) r.fail("not a GGUF file: the file is empty");
    if (size < 4 && std::memcmp(base, "GGUF", size) == 0)
      r.fail("truncated: the file has only " + std::to_string(size) + " bytes of the GGUF header — fetch it again");
    r.fail("not a GGUF file: it does not start with the magic bytes \"GGUF\"");
  }
  r.read<uint32_t>("magic");
  uint32_t version = r.read<uint32_t>("version");
  if ((version & 0xffffu) == 0 && version != 0 && byteswap32(version) <= 3)
    r.fail("unsupported: this is a big-endian GGUF file (version " + std::to_string(byteswap32(version)) +
           "); Atelier reads little-endian GGUF only — convert it on a little-endian machine");
  if (version == 1)
    r.fail("unsupported GGUF version 1 (an early 2023 format); convert the model again with a current llama.cpp");
  if (version != 2 && version != 3)
    r.fail("unsupported GGUF version " + std::to_string(version) + "; versions 2 and 3 are supported");
  f->version_ = version;

  const uint64_t n_tensors = r.read<uint64_t>("tensor count");
  const uint64_t n_kv = r.read<uint64_t>("metadata count");
  // Minimum bytes: a key-value pair is an empty key (8) + type (4) + a u8 (1);
  // a tensor info is an empty name (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
  r.check_count(n_kv, 13, "the header's metadata count");
  r.check_count(n_tensors, 32, "the header's tensor count");

  // --- metadata
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = r.read_string("metadata key #" + std::to_string(i));
    uint32_t type_id = r.read<uint32_t>("type of metadata key '" + key + "'");
    GgufValue v = read_value(r, type_id, key);
    if (!f->kv_.emplace(key, std::move(v)).second) r.fail("corrupt: metadata key '" + key + "' appears twice");
  }

  if (const GgufValue* a = f->find("general.alignment")) {
    uint64_t al = 0;
    if (const auto* u = std::get_if<uint64_t>(&a->value); u && a->type != GgufType::ARRAY) {
      al = *u;
    } else if (const auto* s = std::get_if<int64_t>(&a->value); s && a->type != GgufType::ARRAY && *s > 0) {
      al = static_cast<uint64_t>(*s);
    } else {
      r.fail("corrupt: general.alignment must be a positive integer, found " + describe(*a));
    }
    if (!is_pow2(al) || al > (uint64_t{1} << 30))
      r.fail("corrupt: general.alignment is " + std::to_string(al) + "; it must be a power of two (at most 2^30)");
    f->alignment_ = al;
  } else {
    f->alignment_ = kDefaultAlignment;
  }

  // --- tensor infos
  f->tensors_.reserve(static_cast<size_t>(n_tensors));  // bounded by check_count above
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = r.read_string("name of tensor #" + std::to_string(i));
    const std::string tn = "tensor '" + t.name + "'";
    uint32_t n_dims = r.read<uint32_t>("dimension count of " + tn);
    if (n_dims == 0 || n_dims > kMaxDims)
      r.fail("corrupt: " + tn + " has " + std::to_string(n_dims) + " dimensions; 1 to " +
             std::to_string(kMaxDims) + " are allowed");
    uint64_t elems = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = r.read<uint64_t>("shape of " + tn);
      if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        r.fail("corrupt: " + tn + " has dimension " + std::to_string(d) + " = " + std::to_string(dim) +
               (dim == 0 ? "; every dimension must be at least 1" : "; that is more than 2^63 - 1"));
      if (__builtin_mul_overflow(elems, dim, &elems) ||
          elems > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        r.fail("corrupt: " + tn + " has so many elements that the count overflows 64 bits");
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    uint32_t type_id = r.read<uint32_t>("type of " + tn);
    if (!kernels::dtype_known(type_id))
      r.fail("unsupported: " + tn + " has tensor type id " + std::to_string(type_id) +
             ", which Atelier cannot read (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K..Q8_K)");
    t.type = static_cast<kernels::DType>(type_id);
    const int64_t block = kernels::dtype_block_elems(t.type);
    if (t.shape[0] % block != 0)
      r.fail("corrupt: " + tn + " has rows of " + std::to_string(t.shape[0]) + " elements, not a multiple of " +
             std::to_string(block) + " as type " + std::string(kernels::dtype_name(t.type)) + " requires");
    const uint64_t row_bytes = static_cast<uint64_t>(kernels::dtype_row_bytes(t.type, t.shape[0]));
    const uint64_t rows = elems / static_cast<uint64_t>(t.shape[0]);
    if (__builtin_mul_overflow(row_bytes, rows, &t.bytes))
      r.fail("corrupt: " + tn + " is so large that its byte size overflows 64 bits");
    t.offset = r.read<uint64_t>("data offset of " + tn);
    if (f->tensor_index_.count(t.name)) r.fail("corrupt: tensor name '" + t.name + "' appears twice");
    f->tensor_index_.emplace(t.name, f->tensors_.size());
    f->tensors_.push_back(std::move(t));
  }

  // --- data section
  const uint64_t al = f->alignment_;
  const uint64_t data_start = (r.pos() + al - 1) / al * al;  // r.pos() <= size, no overflow with al <= 2^30
  const uint64_t data_size = data_start <= size ? size - data_start : 0;
  f->data_offset_ = data_start;
  for (GgufTensor& t : f->tensors_) {
    const std::string tn = "tensor '" + t.name + "'";
    if (t.offset % al != 0)
      r.fail("corrupt: " + tn + " has data offset " + std::to_string(t.offset) + ", not a multiple of the alignment " +
             std::to_string(al));
    uint64_t end;
    if (__builtin_add_overflow(t.offset, t.bytes, &end) || data_start > size || end > data_size) {
      uint64_t abs_off = data_start + t.offset;
      r.fail("truncated: " + tn + " needs " + std::to_string(t.bytes) + " bytes at offset " +
             (abs_off < data_start ? hex(t.offset) + " (data-relative)" : std::to_string(abs_off)) +
             " but the file ends at " + std::to_string(size) +
             " — the download is incomplete or the file is corrupt; fetch it again");
    }
    t.data = base + data_start + t.offset;
  }
  // The metadata and tensor table are parsed into kv_ and tensors_: the
  // header's pages (a 32k vocabulary is ~1 MB) leave this process's mapping,
  // as the weights' do once prepared (they stay in the page cache).
  f->map_->release(base, data_start);
  return f;
}

void GgufFile::drop_metadata() {
  std::map<std::string, GgufValue>().swap(kv_);
  metadata_dropped_ = true;
}

const GgufValue* GgufFile::find(const std::string& key) const {
  if (metadata_dropped_)
    throw Error(StatusCode::Internal, path_ + ": metadata key " + key + " read after the loader dropped the metadata");
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

namespace {

[[noreturn]] void wrong_type(const std::string& path, const std::string& key, const char* expected,
                             const GgufValue& v) {
  throw Error(path + ": metadata key " + key + " should be " + expected + " but is " + describe(v));
}

[[noreturn]] void missing(const std::string& path, const std::string& key) {
  throw Error(path + ": metadata key " + key + " is missing");
}

}  // namespace

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) missing(path_, key);
  if (v->type != GgufType::STRING) wrong_type(path_, key, "a string", *v);
  return std::get<std::string>(v->value);
}

std::string GgufFile::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) missing(path_, key);
  if (is_signed(v->type)) return std::get<int64_t>(v->value);
  if (is_unsigned(v->type)) {
    uint64_t u = std::get<uint64_t>(v->value);
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw Error(path_ + ": metadata key " + key + " = " + std::to_string(u) + " is too large");
    return static_cast<int64_t>(u);
  }
  wrong_type(path_, key, "an integer", *v);
}

int64_t GgufFile::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) missing(path_, key);
  if (is_float(v->type)) return std::get<double>(v->value);
  if (is_signed(v->type)) return static_cast<double>(std::get<int64_t>(v->value));
  if (is_unsigned(v->type)) return static_cast<double>(std::get<uint64_t>(v->value));
  wrong_type(path_, key, "a number", *v);
}

double GgufFile::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

bool GgufFile::get_bool(const std::string& key, bool fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  if (v->type != GgufType::BOOL) wrong_type(path_, key, "a bool", *v);
  return std::get<bool>(v->value);
}

std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) missing(path_, key);
  if (v->type != GgufType::ARRAY || v->elem_type != GgufType::STRING) wrong_type(path_, key, "an array of strings", *v);
  return std::get<std::vector<std::string>>(v->value);
}

std::vector<double> GgufFile::get_float_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) missing(path_, key);
  if (v->type == GgufType::ARRAY) {
    if (is_float(v->elem_type)) return std::get<std::vector<double>>(v->value);
    if (is_signed(v->elem_type)) {
      const auto& a = std::get<std::vector<int64_t>>(v->value);
      return std::vector<double>(a.begin(), a.end());
    }
    if (is_unsigned(v->elem_type)) {
      const auto& a = std::get<std::vector<uint64_t>>(v->value);
      return std::vector<double>(a.begin(), a.end());
    }
  }
  wrong_type(path_, key, "an array of numbers", *v);
}

std::vector<int64_t> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) missing(path_, key);
  if (v->type == GgufType::ARRAY) {
    if (is_signed(v->elem_type)) return std::get<std::vector<int64_t>>(v->value);
    if (is_unsigned(v->elem_type)) {
      const auto& a = std::get<std::vector<uint64_t>>(v->value);
      std::vector<int64_t> out;
      out.reserve(a.size());
      for (uint64_t u : a) {
        if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          throw Error(path_ + ": metadata array " + key + " holds " + std::to_string(u) + ", which is too large");
        out.push_back(static_cast<int64_t>(u));
      }
      return out;
    }
  }
  wrong_type(path_, key, "an array of integers", *v);
}

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::tensor(const std::string& name) const {
  const GgufTensor* t = find_tensor(name);
  if (!t) throw Error(path_ + ": tensor " + name + " is missing");
  return *t;
}

// ---------------------------------------------------------------------------
// GgufWriter

namespace {

class Buffer {
 public:
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  std::vector<uint8_t> bytes;
};

[[noreturn]] void bad_value(const std::string& key, const std::string& why) {
  throw Error("GgufWriter: metadata key '" + key + "': " + why);
}

template <typename T>
T narrow_unsigned(uint64_t v, const std::string& key) {
  if (v > std::numeric_limits<T>::max()) bad_value(key, std::to_string(v) + " does not fit the declared type");
  return static_cast<T>(v);
}

template <typename T>
T narrow_signed(int64_t v, const std::string& key) {
  if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max())
    bad_value(key, std::to_string(v) + " does not fit the declared type");
  return static_cast<T>(v);
}

template <typename V>
const V& get_checked(const GgufValue& v, const std::string& key) {
  const V* p = std::get_if<V>(&v.value);
  if (!p) bad_value(key, "the stored C++ value does not match its declared type " + describe(v));
  return *p;
}

void put_scalar_u(Buffer& b, GgufType t, uint64_t u, const std::string& key) {
  switch (t) {
    case GgufType::UINT8: b.put(narrow_unsigned<uint8_t>(u, key)); break;
    case GgufType::UINT16: b.put(narrow_unsigned<uint16_t>(u, key)); break;
    case GgufType::UINT32: b.put(narrow_unsigned<uint32_t>(u, key)); break;
    default: b.put<uint64_t>(u); break;
  }
}

void put_scalar_i(Buffer& b, GgufType t, int64_t s, const std::string& key) {
  switch (t) {
    case GgufType::INT8: b.put(narrow_signed<int8_t>(s, key)); break;
    case GgufType::INT16: b.put(narrow_signed<int16_t>(s, key)); break;
    case GgufType::INT32: b.put(narrow_signed<int32_t>(s, key)); break;
    default: b.put<int64_t>(s); break;
  }
}

void put_scalar_f(Buffer& b, GgufType t, double d) {
  if (t == GgufType::FLOAT32)
    b.put(static_cast<float>(d));
  else
    b.put(d);
}

void put_value(Buffer& b, const std::string& key, const GgufValue& v) {
  b.put<uint32_t>(static_cast<uint32_t>(v.type));
  if (is_unsigned(v.type)) return put_scalar_u(b, v.type, get_checked<uint64_t>(v, key), key);
  if (is_signed(v.type)) return put_scalar_i(b, v.type, get_checked<int64_t>(v, key), key);
  if (is_float(v.type)) return put_scalar_f(b, v.type, get_checked<double>(v, key));
  if (v.type == GgufType::BOOL) return b.put<uint8_t>(get_checked<bool>(v, key) ? 1 : 0);
  if (v.type == GgufType::STRING) return b.put_string(get_checked<std::string>(v, key));
  if (v.type != GgufType::ARRAY) bad_value(key, "unknown value type " + std::to_string(static_cast<uint32_t>(v.type)));

  const GgufType e = v.elem_type;
  if (e == GgufType::ARRAY) bad_value(key, "nested arrays are not supported");
  if (!valid_type(static_cast<uint32_t>(e)))
    bad_value(key, "unknown array element type " + std::to_string(static_cast<uint32_t>(e)));
  b.put<uint32_t>(static_cast<uint32_t>(e));
  if (is_unsigned(e)) {
    const auto& a = get_checked<std::vector<uint64_t>>(v, key);
    b.put<uint64_t>(a.size());
    for (uint64_t u : a) put_scalar_u(b, e, u, key);
  } else if (is_signed(e)) {
    const auto& a = get_checked<std::vector<int64_t>>(v, key);
    b.put<uint64_t>(a.size());
    for (int64_t s : a) put_scalar_i(b, e, s, key);
  } else if (is_float(e)) {
    const auto& a = get_checked<std::vector<double>>(v, key);
    b.put<uint64_t>(a.size());
    for (double d : a) put_scalar_f(b, e, d);
  } else if (e == GgufType::BOOL) {
    const auto& a = get_checked<std::vector<uint8_t>>(v, key);
    b.put<uint64_t>(a.size());
    for (uint8_t x : a) b.put<uint8_t>(x ? 1 : 0);
  } else {
    const auto& a = get_checked<std::vector<std::string>>(v, key);
    b.put<uint64_t>(a.size());
    for (const std::string& s : a) b.put_string(s);
  }
}


}  // namespace

void GgufWriter::set_value(const std::string& key, const GgufValue& v) {
  for (auto& kv : kv_) {
    if (kv.first == key) {
      kv.second = v;
      return;
    }
  }
  kv_.emplace_back(key, v);
}

void GgufWriter::set_u32(const std::string& key, uint32_t v) {
  set_value(key, GgufValue{GgufType::UINT32, GgufType::UINT32, uint64_t{v}});
}
void GgufWriter::set_i32(const std::string& key, int32_t v) {
  set_value(key, GgufValue{GgufType::INT32, GgufType::UINT32, int64_t{v}});
}
void GgufWriter::set_u64(const std::string& key, uint64_t v) {
  set_value(key, GgufValue{GgufType::UINT64, GgufType::UINT32, v});
}
void GgufWriter::set_f32(const std::string& key, float v) {
  set_value(key, GgufValue{GgufType::FLOAT32, GgufType::UINT32, double{v}});
}
void GgufWriter::set_bool(const std::string& key, bool v) {
  set_value(key, GgufValue{GgufType::BOOL, GgufType::UINT32, v});
}
void GgufWriter::set_string(const std::string& key, const std::string& v) {
  set_value(key, GgufValue{GgufType::STRING, GgufType::UINT32, v});
}
void GgufWriter::set_string_array(const std::string& key, const std::vector<std::string>& v) {
  set_value(key, GgufValue{GgufType::ARRAY, GgufType::STRING, v});
}
void GgufWriter::set_f32_array(const std::string& key, const std::vector<float>& v) {
  set_value(key, GgufValue{GgufType::ARRAY, GgufType::FLOAT32, std::vector<double>(v.begin(), v.end())});
}
void GgufWriter::set_i32_array(const std::string& key, const std::vector<int32_t>& v) {
  set_value(key, GgufValue{GgufType::ARRAY, GgufType::INT32, std::vector<int64_t>(v.begin(), v.end())});
}

void GgufWriter::add_tensor(const std::string& name, const std::vector<int64_t>& shape, kernels::DType type,
                            const void* data, uint64_t bytes) {
  const std::string tn = "GgufWriter: tensor '" + name + "': ";
  for (const Pending& p : tensors_)
    if (p.name == name) throw Error(tn + "added twice");
  if (shape.empty() || shape.size() > kMaxDims) throw Error(tn + "needs 1 to 4 dimensions");
  if (!kernels::dtype_known(static_cast<uint32_t>(type))) throw Error(tn + "unknown type");
  uint64_t rows = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] <= 0) throw Error(tn + "every dimension must be at least 1");
    if (i > 0 && __builtin_mul_overflow(rows, static_cast<uint64_t>(shape[i]), &rows))
      throw Error(tn + "too many elements");
  }
  const int64_t row_bytes = kernels::dtype_row_bytes(type, shape[0]);
  if (row_bytes < 0)
    throw Error(tn + "row length " + std::to_string(shape[0]) + " is not a multiple of the block size of " +
                std::string(kernels::dtype_name(type)));
  uint64_t expected;
  if (__builtin_mul_overflow(static_cast<uint64_t>(row_bytes), rows, &expected)) throw Error(tn + "too large");
  if (bytes != expected)
    throw Error(tn + "got " + std::to_string(bytes) + " bytes of data, the shape and type need " +
                std::to_string(expected));
  if (bytes != 0 && data == nullptr) throw Error(tn + "data is null");
  Pending p{name, shape, type, {}};
  const auto* c = static_cast<const uint8_t*>(data);
  p.data.assign(c, c + bytes);
  tensors_.push_back(std::move(p));
}

void GgufWriter::write(const std::string& path) const {
  // Alignment: general.alignment when set, else 32.
  uint64_t al = kDefaultAlignment;
  for (const auto& [key, v] : kv_) {
    if (key != "general.alignment") continue;
    if (is_unsigned(v.type))
      al = get_checked<uint64_t>(v, key);
    else if (is_signed(v.type) && get_checked<int64_t>(v, key) > 0)
      al = static_cast<uint64_t>(get_checked<int64_t>(v, key));
    else
      al = 0;
    if (!is_pow2(al) || al > (uint64_t{1} << 30))
      throw Error("GgufWriter: general.alignment must be a power of two (at most 2^30)");
  }

  Buffer head;
  head.bytes.insert(head.bytes.end(), {'G', 'G', 'U', 'F'});
  head.put<uint32_t>(3);
  head.put<uint64_t>(tensors_.size());
  head.put<uint64_t>(kv_.size());
  for (const auto& [key, v] : kv_) {
    head.put_string(key);
    put_value(head, key, v);
  }
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const Pending& t : tensors_) {
    head.put_string(t.name);
    head.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) head.put<uint64_t>(static_cast<uint64_t>(d));
    head.put<uint32_t>(static_cast<uint32_t>(t.type));
    head.put<uint64_t>(offset);
    offsets.push_back(offset);
    offset = (offset + t.data.size() + al - 1) / al * al;
  }
  head.bytes.resize((head.bytes.size() + al - 1) / al * al, 0);

  AtomicFile out(path);
  out.write(head.bytes.data(), head.bytes.size());
  const std::vector<uint8_t> zeros(static_cast<size_t>(al), 0);
  uint64_t pos = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    out.write(zeros.data(), static_cast<size_t>(offsets[i] - pos));
    out.write(tensors_[i].data.data(), tensors_[i].data.size());
    pos = offsets[i] + tensors_[i].data.size();
  }
  // Pad the last tensor too, as llama.cpp does, so the file size is aligned.
  out.write(zeros.data(), static_cast<size_t>(offset - pos));
  out.commit();
}

}  // namespace atelier::formats
