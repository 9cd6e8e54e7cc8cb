// A restricted unpickler for PyTorch state dicts, and the PyTorch checkpoint
// reader built on it (`.pth` / `.ckpt` zip archives from torch.save >= 1.6:
// ARCHIVE/data.pkl, ARCHIVE/data/0, ARCHIVE/data/1, ...).
//
// Nothing is ever executed. The unpickler builds a plain object graph
// (ints, floats, strings, tuples, lists, dicts, tensors, storage refs) and
// understands only the opcodes a state dict needs (protocols 2-5). A GLOBAL
// or STACK_GLOBAL naming anything outside the allowlist - OrderedDict,
// torch._utils._rebuild_tensor_v2 / _rebuild_parameter and the typed storage
// classes (torch.FloatStorage, torch.HalfStorage, ...) - is refused with an
// error that names it; so is any unknown opcode. The stack, the MARK depth,
// the memo and the number of objects are bounded, and every length is checked
// against the bytes left before anything is allocated.
#pragma once

#include "formats/tensor_types.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace atelier::formats {

class MappedFile;  // mapped_file.h

namespace pickle {

constexpr size_t kMaxStack = 1u << 20;
constexpr size_t kMaxMarks = 4096;
constexpr size_t kMaxMemo = 1u << 22;
constexpr size_t kMaxObjects = 1u << 24;
constexpr uint64_t kMaxPickleBytes = 256u << 20;

// A tensor as the pickle describes it: which storage, where in it, what shape.
struct PickledTensor {
  std::string name;            // the state-dict key
  std::string storage_key;     // ARCHIVE/data/<storage_key>
  ElemType dtype = ElemType::F32;
  int64_t storage_numel = 0;   // elements in the whole storage
  int64_t storage_offset = 0;  // in elements
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
};

// Runs the restricted unpickler over [data, data + size) and returns the
// tensors of the state dict it describes: the top-level dict, or the dict
// under its "state_dict" key (Lightning / Stable Diffusion .ckpt files), in
// pickle order. Non-tensor values (epoch counters and the like) are skipped.
// `where` names the file in errors. Throws atelier::Error on anything else.
std::vector<PickledTensor> read_state_dict(const uint8_t* data, uint64_t size, const std::string& where);

}  // namespace pickle

struct TorchTensor {
  std::string name;
  ElemType dtype = ElemType::F32;
  std::vector<int64_t> shape;     // row-major, contiguous (checked)
  std::string storage_key;
  int64_t storage_offset = 0;     // in elements
  const uint8_t* data = nullptr;  // into the mapping, storage_offset applied (nullptr when bytes == 0)
  uint64_t bytes = 0;
  int64_t elements() const;
  bool supported() const { return supported_for_math(dtype); }
};

class TorchCheckpoint {
 public:
  // Maps the archive, reads data.pkl with the restricted unpickler and
  // resolves every tensor into its storage entry. Throws atelier::Error on
  // any problem (refused global, non-contiguous tensor, bounds, ...).
  static std::unique_ptr<TorchCheckpoint> open(const std::string& path);
  ~TorchCheckpoint();

  const std::string& path() const { return path_; }
  // The mapping the tensors' data points into (to release pages read once).
  const MappedFile& mapping() const { return *map_; }
  // The archive's top folder ("taef2_encoder" for taef2_encoder/data.pkl).
  const std::string& archive_name() const { return archive_; }
  const std::vector<TorchTensor>& tensors() const { return tensors_; }
  const TorchTensor* find_tensor(const std::string& name) const;
  // Throws Error("FILE: tensor NAME is missing") when absent.
  const TorchTensor& tensor(const std::string& name) const;

 private:
  TorchCheckpoint() = default;
  std::string path_;
  std::string archive_;
  std::unique_ptr<MappedFile> map_;
  std::vector<TorchTensor> tensors_;
  std::map<std::string, size_t> index_;
};

}  // namespace atelier::formats
