// Restricted unpickler and PyTorch checkpoint reader. See pickle.h.
#include "formats/pickle.h"

#include "core/error.h"
#include "formats/mapped_file.h"
#include "formats/zip_archive.h"

#include <cstring>
#include <deque>
#include <unordered_map>

namespace atelier::formats {

namespace pickle {
namespace {

constexpr size_t kMaxObjectsHere = 1u << 21;  // a 1,000-tensor SD checkpoint needs ~15,000

enum class Kind : uint8_t { None, Bool, Int, Float, Str, Tuple, List, Dict, Global, Storage, Tensor };
enum class Callable : uint8_t { OrderedDict, RebuildTensorV2, RebuildParameter, StorageType };

struct TensorData {
  uint32_t storage = 0;
  int64_t offset = 0;
  std::vector<int64_t> shape, stride;
};

// One object of the graph. Values on the stack and in the memo are indices
// into the arena, so shared references behave as in Python, cycles cost
// nothing, and tearing down a deeply nested graph never recurses.
struct Obj {
  Kind kind = Kind::None;
  Callable callable = Callable::OrderedDict;  // Global
  ElemType dtype = ElemType::F32;             // Global StorageType, Storage
  int64_t i = 0;                              // Int, Bool, Storage numel, Tensor index
  double f = 0;
  std::string s;                              // Str, Global name, Storage key
  std::vector<uint32_t> items;                // Tuple, List; Dict as k0 v0 k1 v1 ...
  std::unique_ptr<std::unordered_map<std::string, size_t>> str_keys;  // Dict: string key -> pair index
};

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::None: return "None";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::Str: return "str";
    case Kind::Tuple: return "tuple";
    case Kind::List: return "list";
    case Kind::Dict: return "dict";
    case Kind::Global: return "global";
    case Kind::Storage: return "storage";
    case Kind::Tensor: return "tensor";
  }
  return "?";
}

struct StorageName {
  const char* name;
  ElemType type;
};
constexpr StorageName kStorages[] = {
    {"FloatStorage", ElemType::F32}, {"HalfStorage", ElemType::F16},  {"BFloat16Storage", ElemType::BF16},
    {"DoubleStorage", ElemType::F64}, {"LongStorage", ElemType::I64}, {"IntStorage", ElemType::I32},
    {"ShortStorage", ElemType::I16}, {"CharStorage", ElemType::I8},   {"ByteStorage", ElemType::U8},
    {"BoolStorage", ElemType::BOOL},
};

class Unpickler {
 public:
  Unpickler(const uint8_t* data, uint64_t size, const std::string& where) : p_(data), size_(size), where_(where) {}

  uint32_t run();
  const Obj& obj(uint32_t i) const { return objs_[i]; }
  const TensorData& tensor(const Obj& o) const { return tensors_[size_t(o.i)]; }

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(where_ + ": " + what + " (pickle offset " + std::to_string(op_pos_) + ")");
  }

 private:
  const uint8_t* take(uint64_t n) {
    if (n > size_ - pos_) fail("truncated pickle: needs " + std::to_string(n) + " more bytes, " + std::to_string(size_ - pos_) + " left");
    const uint8_t* r = p_ + pos_;
    pos_ += n;
    return r;
  }
  uint64_t uint_le(int n) {
    const uint8_t* b = take(uint64_t(n));
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; --k) v = (v << 8) | b[k];
    return v;
  }
  uint32_t make(Kind k) {
    if (objs_.size() >= kMaxObjectsHere) fail("pickle builds more than " + std::to_string(kMaxObjectsHere) + " objects");
    objs_.emplace_back();
    objs_.back().kind = k;
    return uint32_t(objs_.size() - 1);
  }
  void push(uint32_t v) {
    if (stack_.size() >= kMaxStack) fail("pickle stack deeper than " + std::to_string(kMaxStack));
    stack_.push_back(v);
  }
  uint32_t pop() {
    if (stack_.size() <= floor()) fail("pickle stack underflow");
    uint32_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  uint32_t top() {
    if (stack_.size() <= floor()) fail("pickle stack underflow");
    return stack_.back();
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  size_t pop_mark() {
    if (marks_.empty()) fail("pickle uses a MARK that was never set");
    size_t m = marks_.back();
    marks_.pop_back();
    return m;
  }
  uint32_t& at_mark_minus_one(size_t m) {
    if (m == 0 || m > stack_.size()) fail("pickle stack underflow");
    return stack_[m - 1];
  }
  void memo_put(uint64_t idx) {
    if (memo_.size() >= kMaxMemo && !memo_.count(idx)) fail("pickle memo exceeds " + std::to_string(kMaxMemo) + " entries");
    memo_[idx] = top();
  }
  void memo_get(uint64_t idx) {
    auto it = memo_.find(idx);
    if (it == memo_.end()) fail("pickle reads memo entry " + std::to_string(idx) + " that was never written");
    push(it->second);
  }
  void push_str(uint64_t n) {
    const uint8_t* b = take(n);
    uint32_t o = make(Kind::Str);
    objs_[o].s.assign(reinterpret_cast<const char*>(b), size_t(n));
    push(o);
  }
  std::string line() {
    std::string s;
    while (true) {
      const uint8_t c = *take(1);
      if (c == '\n') return s;
      if (s.size() >= 256) fail("GLOBAL name longer than 256 bytes");
      s.push_back(char(c));
    }
  }
  void dict_set(uint32_t d, uint32_t k, uint32_t v) {
    Obj& o = objs_[d];
    if (o.kind != Kind::Dict) fail(std::string("SETITEM on a ") + kind_name(o.kind) + ", not a dict");
    const Obj& key = objs_[k];
    if (key.kind == Kind::Str) {
      if (!o.str_keys) o.str_keys = std::make_unique<std::unordered_map<std::string, size_t>>();
      auto [it, fresh] = o.str_keys->emplace(key.s, o.items.size() / 2);
      if (!fresh) {
        o.items[it->second * 2 + 1] = v;
        return;
      }
    }
    o.items.push_back(k);
    o.items.push_back(v);
  }
  void global(const std::string& module, const std::string& name);
  void reduce();
  void persid();
  std::vector<int64_t> int_tuple(uint32_t t, const char* what);

  const uint8_t* p_;
  uint64_t size_, pos_ = 0, op_pos_ = 0;
  std::string where_;
  std::deque<Obj> objs_;
  std::deque<TensorData> tensors_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, uint32_t> memo_;
};

void Unpickler::global(const std::string& module, const std::string& name) {
  uint32_t g = make(Kind::Global);
  Obj& o = objs_[g];
  o.s = module + "." + name;
  if (module == "collections" && name == "OrderedDict") {
    o.callable = Callable::OrderedDict;
  } else if (module == "torch._utils" && name == "_rebuild_tensor_v2") {
    o.callable = Callable::RebuildTensorV2;
  } else if (module == "torch._utils" && name == "_rebuild_parameter") {
    o.callable = Callable::RebuildParameter;
  } else {
    bool found = false;
    if (module == "torch")
      for (const StorageName& s : kStorages)
        if (name == s.name) {
          o.callable = Callable::StorageType;
          o.dtype = s.type;
          found = true;
        }
    if (!found)
      fail("refuses global '" + o.s +
           "': only tensor-storage globals are allowed (OrderedDict, torch._utils._rebuild_tensor_v2, "
           "torch.*Storage); this pickle may try to run code. Use a plain state dict or a safetensors file");
  }
  push(g);
}

std::vector<int64_t> Unpickler::int_tuple(uint32_t t, const char* what) {
  const Obj& o = objs_[t];
  if (o.kind != Kind::Tuple) fail(std::string("_rebuild_tensor_v2: ") + what + " is a " + kind_name(o.kind) + ", not a tuple");
  if (o.items.size() > 64) fail(std::string("_rebuild_tensor_v2: ") + what + " has more than 64 dimensions");
  std::vector<int64_t> v;
  for (uint32_t x : o.items) {
    if (objs_[x].kind != Kind::Int) fail(std::string("_rebuild_tensor_v2: ") + what + " holds a non-integer");
    v.push_back(objs_[x].i);
  }
  return v;
}

void Unpickler::persid() {
  const uint32_t pid = pop();
  const Obj& t = objs_[pid];
  auto is = [&](size_t k, Kind kind) { return objs_[t.items[k]].kind == kind; };
  if (t.kind != Kind::Tuple || t.items.size() != 5 || !is(0, Kind::Str) || objs_[t.items[0]].s != "storage" ||
      !is(1, Kind::Global) || objs_[t.items[1]].callable != Callable::StorageType || !is(2, Kind::Str) ||
      !is(4, Kind::Int) || objs_[t.items[4]].i < 0)
    fail("persistent id is not ('storage', <torch storage type>, key, location, numel)");
  uint32_t s = make(Kind::Storage);
  Obj& o = objs_[s];
  o.dtype = objs_[objs_[pid].items[1]].dtype;
  o.s = objs_[objs_[pid].items[2]].s;
  o.i = objs_[objs_[pid].items[4]].i;
  push(s);
}

void Unpickler::reduce() {
  const uint32_t args = pop();
  const uint32_t fn = pop();
  if (objs_[fn].kind != Kind::Global) fail(std::string("REDUCE calls a ") + kind_name(objs_[fn].kind) + ", not an allowed global");
  if (objs_[args].kind != Kind::Tuple) fail("REDUCE arguments are not a tuple");
  const std::vector<uint32_t> a = objs_[args].items;
  switch (objs_[fn].callable) {
    case Callable::OrderedDict:
      if (!a.empty()) fail("OrderedDict called with arguments");
      push(make(Kind::Dict));
      return;
    case Callable::RebuildParameter:
      if (a.empty() || objs_[a[0]].kind != Kind::Tensor) fail("_rebuild_parameter without a tensor");
      push(a[0]);
      return;
    case Callable::StorageType:
      fail("refuses to call storage type '" + objs_[fn].s + "'");
    case Callable::RebuildTensorV2: {
      if (a.size() < 4) fail("_rebuild_tensor_v2 called with fewer than 4 arguments");
      if (objs_[a[0]].kind != Kind::Storage) fail("_rebuild_tensor_v2: first argument is not a storage");
      if (objs_[a[1]].kind != Kind::Int || objs_[a[1]].i < 0) fail("_rebuild_tensor_v2: storage offset is not a non-negative integer");
      TensorData td;
      td.storage = a[0];
      td.offset = objs_[a[1]].i;
      td.shape = int_tuple(a[2], "size");
      td.stride = int_tuple(a[3], "stride");
      if (td.shape.size() != td.stride.size()) fail("_rebuild_tensor_v2: size and stride differ in length");
      uint32_t t = make(Kind::Tensor);
      objs_[t].i = int64_t(tensors_.size());
      tensors_.push_back(std::move(td));
      push(t);
      return;
    }
  }
}

uint32_t Unpickler::run() {
  while (true) {
    op_pos_ = pos_;
    const uint8_t op = *take(1);
    switch (op) {
      case 0x80: {  // PROTO
        const uint8_t v = *take(1);
        if (v < 2 || v > 5) fail("unsupported pickle protocol " + std::to_string(v));
        break;
      }
      case 0x95: take(8); break;  // FRAME: a size hint only
      case '.': {                 // STOP
        if (stack_.empty()) fail("pickle stops with an empty stack");
        return stack_.back();
      }
      case '(':  // MARK
        if (marks_.size() >= kMaxMarks) fail("pickle nests MARK deeper than " + std::to_string(kMaxMarks));
        marks_.push_back(stack_.size());
        break;
      case '0': pop(); break;  // POP
      case '1': stack_.resize(pop_mark()); break;  // POP_MARK
      case '}': push(make(Kind::Dict)); break;
      case ']': push(make(Kind::List)); break;
      case ')': push(make(Kind::Tuple)); break;
      case 'N': push(make(Kind::None)); break;
      case 0x88:
      case 0x89: {  // NEWTRUE, NEWFALSE
        uint32_t o = make(Kind::Bool);
        objs_[o].i = op == 0x88;
        push(o);
        break;
      }
      case 'J': {  // BININT
        uint32_t o = make(Kind::Int);
        objs_[o].i = int32_t(uint32_t(uint_le(4)));
        push(o);
        break;
      }
      case 'K':
      case 'M': {  // BININT1, BININT2
        uint32_t o = make(Kind::Int);
        objs_[o].i = int64_t(uint_le(op == 'K' ? 1 : 2));
        push(o);
        break;
      }
      case 0x8a: {  // LONG1
        const uint8_t n = *take(1);
        if (n > 8) fail("LONG1 integer wider than 64 bits");
        uint64_t v = n ? uint_le(n) : 0;
        if (n && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t(0) << (8 * n);  // sign-extend
        uint32_t o = make(Kind::Int);
        objs_[o].i = int64_t(v);
        push(o);
        break;
      }
      case 'G': {  // BINFLOAT, big-endian
        const uint8_t* b = take(8);
        uint64_t bits = 0;
        for (int k = 0; k < 8; ++k) bits = (bits << 8) | b[k];
        uint32_t o = make(Kind::Float);
        std::memcpy(&objs_[o].f, &bits, 8);
        push(o);
        break;
      }
      case 'X': push_str(uint_le(4)); break;     // BINUNICODE
      case 0x8c: push_str(uint_le(1)); break;    // SHORT_BINUNICODE
      case 0x8d: push_str(uint_le(8)); break;    // BINUNICODE8
      case 'T': push_str(uint_le(4)); break;     // BINSTRING
      case 'U': push_str(uint_le(1)); break;     // SHORT_BINSTRING
      case 'q': memo_put(uint_le(1)); break;     // BINPUT
      case 'r': memo_put(uint_le(4)); break;     // LONG_BINPUT
      case 0x94: memo_put(memo_.size()); break;  // MEMOIZE
      case 'h': memo_get(uint_le(1)); break;     // BINGET
      case 'j': memo_get(uint_le(4)); break;     // LONG_BINGET
      case 't': {                                // TUPLE
        const size_t m = pop_mark();
        uint32_t o = make(Kind::Tuple);
        objs_[o].items.assign(stack_.begin() + std::ptrdiff_t(m), stack_.end());
        stack_.resize(m);
        push(o);
        break;
      }
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        const size_t n = size_t(op - 0x84);
        if (stack_.size() < floor() + n) fail("pickle stack underflow");
        uint32_t o = make(Kind::Tuple);
        objs_[o].items.assign(stack_.end() - std::ptrdiff_t(n), stack_.end());
        stack_.resize(stack_.size() - n);
        push(o);
        break;
      }
      case 's': {  // SETITEM
        const uint32_t v = pop(), k = pop();
        dict_set(top(), k, v);
        break;
      }
      case 'u': {  // SETITEMS
        const size_t m = pop_mark();
        const uint32_t d = at_mark_minus_one(m);
        if ((stack_.size() - m) % 2) fail("SETITEMS with an odd number of items");
        for (size_t k = m; k < stack_.size(); k += 2) dict_set(d, stack_[k], stack_[k + 1]);
        stack_.resize(m);
        break;
      }
      case 'a': {  // APPEND
        const uint32_t v = pop();
        Obj& l = objs_[top()];
        if (l.kind != Kind::List) fail(std::string("APPEND to a ") + kind_name(l.kind) + ", not a list");
        l.items.push_back(v);
        break;
      }
      case 'e': {  // APPENDS
        const size_t m = pop_mark();
        Obj& l = objs_[at_mark_minus_one(m)];
        if (l.kind != Kind::List) fail(std::string("APPENDS to a ") + kind_name(l.kind) + ", not a list");
        l.items.insert(l.items.end(), stack_.begin() + std::ptrdiff_t(m), stack_.end());
        stack_.resize(m);
        break;
      }
      case 'c': {  // GLOBAL "module\nname\n"
        std::string module = line();
        std::string name = line();
        global(module, name);
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        const uint32_t n = pop(), m = pop();
        if (objs_[m].kind != Kind::Str || objs_[n].kind != Kind::Str) fail("STACK_GLOBAL needs two strings");
        global(objs_[m].s, objs_[n].s);
        break;
      }
      case 'R': reduce(); break;
      case 'b': pop(); top(); break;  // BUILD: the state (OrderedDict _metadata, ...) is not needed
      case 'Q': persid(); break;      // BINPERSID
      default: {
        static const char* hex = "0123456789abcdef";
        fail(std::string("unsupported pickle opcode 0x") + hex[op >> 4] + hex[op & 15] +
             " (the restricted reader only understands PyTorch state dicts)");
      }
    }
  }
}

}  // namespace

std::vector<PickledTensor> read_state_dict(const uint8_t* data, uint64_t size, const std::string& where) {
  if (size > kMaxPickleBytes) throw Error(where + ": pickle of " + std::to_string(size) + " bytes exceeds the limit");
  Unpickler u(data, size, where);
  const uint32_t root = u.run();
  const Obj* d = &u.obj(root);
  if (d->kind != Kind::Dict)
    throw Error(where + ": the pickle holds a " + kind_name(d->kind) + ", not a state dict (a dict of tensors)");
  if (d->str_keys) {
    auto it = d->str_keys->find("state_dict");
    if (it != d->str_keys->end() && u.obj(d->items[it->second * 2 + 1]).kind == Kind::Dict)
      d = &u.obj(d->items[it->second * 2 + 1]);
  }
  std::vector<PickledTensor> out;
  for (size_t k = 0; k + 1 < d->items.size(); k += 2) {
    const Obj& key = u.obj(d->items[k]);
    const Obj& val = u.obj(d->items[k + 1]);
    if (key.kind != Kind::Str || val.kind != Kind::Tensor) continue;
    const TensorData& td = u.tensor(val);
    const Obj& st = u.obj(td.storage);
    PickledTensor t;
    t.name = key.s;
    t.storage_key = st.s;
    t.dtype = st.dtype;
    t.storage_numel = st.i;
    t.storage_offset = td.offset;
    t.shape = td.shape;
    t.stride = td.stride;
    out.push_back(std::move(t));
  }
  if (out.empty()) throw Error(where + ": the state dict holds no tensors");
  return out;
}

}  // namespace pickle

// ---- TorchCheckpoint ----

int64_t TorchTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // checked at open
  return n;
}

TorchCheckpoint::~TorchCheckpoint() = default;

std::unique_ptr<TorchCheckpoint> TorchCheckpoint::open(const std::string& path) {
  std::unique_ptr<TorchCheckpoint> c(new TorchCheckpoint());
  c->path_ = path;
  c->map_ = std::make_unique<MappedFile>(path);
  const uint8_t* base = c->map_->data();
  const uint64_t size = c->map_->size();
  if (!looks_like_zip(base, size))
    throw Error(path + ": not a PyTorch zip checkpoint (legacy torch.save files from before PyTorch 1.6 are not "
                       "supported; re-save it with a current PyTorch or convert it to safetensors)");
  ZipArchive zip(base, size, path);

  std::string pkl;
  for (const ZipEntry& e : zip.entries()) {
    const auto slash = e.name.find('/');
    if (slash != std::string::npos && e.name.compare(slash, std::string::npos, "/data.pkl") == 0) {
      if (!pkl.empty()) throw Error(path + ": the archive holds more than one data.pkl");
      pkl = e.name;
      c->archive_ = e.name.substr(0, slash);
    }
  }
  if (pkl.empty()) throw Error(path + ": the archive has no ARCHIVE/data.pkl; it is not a PyTorch checkpoint");
  const std::string prefix = c->archive_ + "/";
  if (zip.find(prefix + "byteorder")) {
    auto bo = zip.read(prefix + "byteorder");
    if (std::string(reinterpret_cast<const char*>(bo.data), bo.size) != "little")
      throw Error(path + ": big-endian checkpoints are not supported; re-save it on a little-endian machine");
  }

  auto spans = zip.read(pkl);
  for (pickle::PickledTensor& p : pickle::read_state_dict(spans.data, spans.size, path)) {
    const std::string tw = path + ": tensor '" + p.name + "': ";
    const int64_t es = elem_size(p.dtype);
    int64_t numel = 1;
    for (int64_t d : p.shape) {
      if (d < 0) throw Error(tw + "negative dimension");
      if (mul_overflows(numel, d, &numel)) throw Error(tw + "element count overflows");
    }
    // Contiguous row-major (dims of size 1 may carry any stride, as in PyTorch).
    int64_t expect = 1;
    for (size_t k = p.shape.size(); k-- > 0;) {
      if (p.shape[k] != 1 && numel != 0 && p.stride[k] != expect)
        throw Error(tw + "is not contiguous (stride " + std::to_string(p.stride[k]) + " in dimension " +
                    std::to_string(k) + ", expected " + std::to_string(expect) +
                    "); save it after .contiguous() or convert the checkpoint to safetensors");
      if (mul_overflows(expect, p.shape[k], &expect)) throw Error(tw + "element count overflows");
    }
    int64_t storage_bytes = 0, end = 0, bytes = 0;
    if (mul_overflows(p.storage_numel, es, &storage_bytes) || __builtin_add_overflow(p.storage_offset, numel, &end) ||
        end > p.storage_numel || mul_overflows(numel, es, &bytes))
      throw Error(tw + "elements [" + std::to_string(p.storage_offset) + ", +" + std::to_string(numel) +
                  ") lie outside its storage of " + std::to_string(p.storage_numel) + " elements");
    auto s = zip.read(prefix + "data/" + p.storage_key);
    if (uint64_t(storage_bytes) > s.size)
      throw Error(tw + "storage '" + p.storage_key + "' should hold " + std::to_string(storage_bytes) +
                  " bytes but its archive entry has " + std::to_string(s.size) +
                  " (the file is truncated or corrupt; download it again)");
    TorchTensor t;
    t.name = p.name;
    t.dtype = p.dtype;
    t.shape = std::move(p.shape);
    t.storage_key = p.storage_key;
    t.storage_offset = p.storage_offset;
    t.bytes = uint64_t(bytes);
    t.data = bytes ? s.data + p.storage_offset * es : nullptr;
    if (c->index_.count(t.name)) throw Error(tw + "appears twice");
    c->index_[t.name] = c->tensors_.size();
    c->tensors_.push_back(std::move(t));
  }
  return c;
}

const TorchTensor* TorchCheckpoint::find_tensor(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TorchTensor& TorchCheckpoint::tensor(const std::string& name) const {
  if (const TorchTensor* t = find_tensor(name)) return *t;
  throw Error(path_ + ": tensor " + name + " is missing");
}

}  // namespace atelier::formats
