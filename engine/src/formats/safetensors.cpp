// safetensors reader and writer. See safetensors.h.
#include "formats/safetensors.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "formats/mapped_file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <limits>
#include <unistd.h>

namespace atelier::formats {

using ojson = nlohmann::ordered_json;

int64_t SafetensorsTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // checked at open
  return n;
}

SafetensorsFile::~SafetensorsFile() = default;

namespace {

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

const char* json_kind(const ojson& j) { return j.type_name(); }

}  // namespace

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_ = std::make_unique<MappedFile>(path);
  const uint8_t* base = f->map_->data();
  const uint64_t size = f->map_->size();
  const std::string where = path + ": ";
  const std::string hint = " (the file is truncated or not a safetensors file; download or convert it again)";

  if (size < 8) throw Error(where + "too small for a safetensors file (" + std::to_string(size) + " bytes)" + hint);
  const uint64_t n = read_le64(base);
  if (n > kMaxHeaderBytes)
    throw Error(where + "safetensors header length " + std::to_string(n) + " exceeds the limit of " +
                std::to_string(kMaxHeaderBytes) + " bytes" + hint);
  if (n > size - 8)
    throw Error(where + "safetensors header length " + std::to_string(n) + " runs past the end of the file (" +
                std::to_string(size) + " bytes)" + hint);
  if (n < 2) throw Error(where + "safetensors header is empty" + hint);
  f->header_bytes_ = n;
  const uint64_t data_size = size - 8 - n;
  const uint8_t* data = base + 8 + n;

  ojson h = ojson::parse(base + 8, base + 8 + n, nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded()) throw Error(where + "safetensors header is not valid JSON" + hint);
  if (!h.is_object())
    throw Error(where + "safetensors header must be a JSON object, found " + json_kind(h) + hint);

  struct Span {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Span> spans;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const ojson& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw Error(where + "__metadata__ must be an object of strings, found " + json_kind(v) + hint);
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          throw Error(where + "__metadata__ value of '" + m.key() + "' must be a string, found " +
                      json_kind(m.value()) + hint);
        f->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string tw = where + "tensor '" + name + "': ";
    if (!v.is_object()) throw Error(tw + "entry must be an object, found " + json_kind(v) + hint);
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) throw Error(tw + "missing or non-string \"dtype\"" + hint);
    if (sh == v.end() || !sh->is_array()) throw Error(tw + "missing or non-array \"shape\"" + hint);
    if (off == v.end() || !off->is_array() || off->size() != 2)
      throw Error(tw + "\"data_offsets\" must be an array [begin, end]" + hint);
    const std::string dts = dt->get<std::string>();
    auto et = elem_from_name(dts);
    if (!et)
      throw Error(tw + "unknown dtype '" + dts +
                  "' (known: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U64 U32 U16 U8 BOOL)" + hint);
    if (sh->size() > 64) throw Error(tw + "shape has " + std::to_string(sh->size()) + " dimensions (at most 64)" + hint);
    SafetensorsTensor t;
    t.name = name;
    t.dtype = *et;
    int64_t numel = 1;
    for (const ojson& d : *sh) {
      if (!d.is_number_integer() || (d.is_number_integer() && !d.is_number_unsigned() && d.get<int64_t>() < 0))
        throw Error(tw + "shape entries must be non-negative integers" + hint);
      if (d.is_number_unsigned() && d.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
        throw Error(tw + "shape entry too large" + hint);
      const int64_t dim = d.get<int64_t>();
      if (mul_overflows(numel, dim, &numel)) throw Error(tw + "shape's element count overflows" + hint);
      t.shape.push_back(dim);
    }
    int64_t bytes = 0;
    if (mul_overflows(numel, int64_t(elem_size(*et)), &bytes)) throw Error(tw + "shape's byte size overflows" + hint);
    for (const ojson& o : *off)
      if (!o.is_number_unsigned()) throw Error(tw + "\"data_offsets\" must be non-negative integers" + hint);
    const uint64_t b = (*off)[0].get<uint64_t>(), e = (*off)[1].get<uint64_t>();
    if (e < b) throw Error(tw + "data_offsets end " + std::to_string(e) + " is before begin " + std::to_string(b) + hint);
    if (e > data_size)
      throw Error(tw + "data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                  "] run past the end of the data section (" + std::to_string(data_size) + " bytes)" + hint);
    if (e - b != uint64_t(bytes))
      throw Error(tw + "shape x " + dts + " needs " + std::to_string(bytes) + " bytes but data_offsets span " +
                  std::to_string(e - b) + hint);
    t.offset = b;
    t.bytes = e - b;
    t.data = t.bytes ? data + b : nullptr;
    spans.push_back({b, e, f->tensors_.size()});
    f->index_[name] = f->tensors_.size();
    f->tensors_.push_back(std::move(t));
  }

  // No two tensors may share bytes, whatever order the header lists them in.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  const Span* prev = nullptr;
  for (const Span& s : spans) {
    if (s.end == s.begin) continue;  // empty tensors own no bytes
    if (prev && s.begin < prev->end)
      throw Error(where + "tensors '" + f->tensors_[prev->index].name + "' and '" + f->tensors_[s.index].name +
                  "' overlap in the data section" + hint);
    prev = &s;
  }
  return f;
}

const SafetensorsTensor* SafetensorsFile::find_tensor(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const SafetensorsTensor& SafetensorsFile::tensor(const std::string& name) const {
  if (const SafetensorsTensor* t = find_tensor(name)) return *t;
  throw Error(path_ + ": tensor " + name + " is missing");
}

// ---- writer ----

void SafetensorsWriter::add_tensor(const std::string& name, ElemType dtype, const std::vector<int64_t>& shape,
                                   const void* data, uint64_t bytes) {
  if (name == "__metadata__") throw Error("SafetensorsWriter: '__metadata__' is not a valid tensor name");
  for (const Pending& p : tensors_)
    if (p.name == name) throw Error("SafetensorsWriter: tensor '" + name + "' added twice");
  int64_t numel = 1;
  for (int64_t d : shape)
    if (d < 0 || mul_overflows(numel, d, &numel))
      throw Error("SafetensorsWriter: tensor '" + name + "' has an invalid shape");
  int64_t want = 0;
  if (mul_overflows(numel, int64_t(elem_size(dtype)), &want) || uint64_t(want) != bytes)
    throw Error("SafetensorsWriter: tensor '" + name + "' has " + std::to_string(bytes) + " bytes, its shape needs " +
                std::to_string(want));
  const uint8_t* p = static_cast<const uint8_t*>(data);
  tensors_.push_back({name, dtype, shape, std::vector<uint8_t>(p, p + bytes)});
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }


void SafetensorsWriter::write(const std::string& path) const {
  ojson h = ojson::object();
  if (!metadata_.empty()) {
    ojson m = ojson::object();
    for (const auto& [k, v] : metadata_) m[k] = v;
    h["__metadata__"] = m;
  }
  uint64_t offset = 0;
  for (const Pending& t : tensors_) {
    ojson e = ojson::object();
    e["dtype"] = std::string(elem_name(t.dtype));
    e["shape"] = t.shape;
    e["data_offsets"] = {offset, offset + t.data.size()};
    h[t.name] = e;
    offset += t.data.size();
  }
  std::string header = h.dump();
  while (header.size() % 8) header.push_back(' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(header.size()) >> (8 * i));

  AtomicFile out(path);
  out.write(len, 8);
  out.write(header.data(), header.size());
  for (const Pending& t : tensors_) out.write(t.data.data(), t.data.size());
  out.commit();
}

}  // namespace atelier::formats
