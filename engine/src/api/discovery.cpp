// Lists the model files in folders, reading only their headers, for the
// window's model list and `atelier models` before the store exists.
#include <atelier/tools.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "formats/gguf.h"
#include "formats/llama2c.h"
#include "formats/pickle.h"
#include "formats/safetensors.h"
#include "formats/sniff.h"
#include "api/text_model_impl.h"

namespace atelier {

namespace fs = std::filesystem;

namespace {
std::string describe_gguf(const std::string& path) {
  auto f = formats::GgufFile::open(path);
  const std::string arch = f->get_string("general.architecture", "unknown");
  std::string s = arch;
  if (f->has(arch + ".embedding_length"))
    s += ", " + std::to_string(f->get_int(arch + ".embedding_length")) + "-dim, " +
         std::to_string(f->get_int(arch + ".block_count", 0)) + " layers";
  if (f->has("tokenizer.ggml.tokens")) s += ", vocab " + std::to_string(f->get_string_array("tokenizer.ggml.tokens").size());
  s += ", " + std::to_string(f->tensors().size()) + " tensors";
  return s;
}

std::string describe_llama2c(const std::string& path) {
  formats::Llama2cModel m = formats::load_llama2c(path);
  const auto& c = m.config;
  return "llama2.c, " + std::to_string(c.dim) + "-dim, " + std::to_string(c.n_layers) + " layers, vocab " +
         std::to_string(c.vocab_size);
}
template <class File>
std::string describe_tensors(const File& f, const std::string& arch) {
  int64_t params = 0;
  for (const auto& t : f.tensors()) params += t.elements();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2fM params", static_cast<double>(params) / 1e6);
  return (arch.empty() ? std::string("tensors") : arch) + ", " + std::to_string(f.tensors().size()) + " tensors, " + buf;
}

std::string describe_safetensors(const std::string& path) {
  auto f = formats::SafetensorsFile::open(path);
  auto it = f->metadata().find("architecture");
  return describe_tensors(*f, it == f->metadata().end() ? "" : it->second);
}

std::string describe_torch(const std::string& path) {
  return describe_tensors(*formats::TorchCheckpoint::open(path), "PyTorch checkpoint");
}

std::string describe_diffusers(const std::string& path) {
  int64_t bytes = 0;
  int files = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(path, ec)) {
    if (!e.is_regular_file(ec)) continue;
    bytes += static_cast<int64_t>(e.file_size(ec));
    ++files;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return "diffusers folder, " + std::to_string(files) + " files, " + buf;
}

// Extensions of model files: one that holds something else is listed with the reason it cannot load.
bool model_extension(const std::string& ext) {
  return ext == ".gguf" || ext == ".bin" || ext == ".safetensors" || ext == ".pth" || ext == ".ckpt" || ext == ".pt";
}

}  // namespace

namespace {
// What PATH is, from its bytes; nullopt for what is no model (a vocabulary, a
// plain folder, a file without a model's name or header).
std::optional<ModelFile> describe(const fs::path& path) {
  std::error_code ec;
  const bool dir = fs::is_directory(path, ec);
  if (!dir && !fs::is_regular_file(path, ec)) return std::nullopt;  // FIFOs, sockets, devices: never opened
  ModelFile m;
  m.path = path.string();
  // What the file is comes from its bytes (formats/sniff.h), not its name.
  const formats::Sniffed kind = formats::sniff_model_file(m.path);
  using K = formats::FileKind;
  if (dir && kind.kind != K::diffusers) return std::nullopt;
  if (kind.kind == K::llama2c_tokenizer || kind.kind == K::clip_vocab || kind.kind == K::missing) return std::nullopt;
  if (kind.kind == K::unknown && !model_extension(path.extension().string())) return std::nullopt;
  m.bytes = dir ? 0 : static_cast<int64_t>(fs::file_size(path, ec));
  m.format = kind.kind == K::unknown ? "unknown" : formats::file_kind_name(kind.kind);
  // Image models come as safetensors, PyTorch archives or diffusers folders (text models as GGUF and llama2.c).
  m.kind = kind.kind == K::gguf || kind.kind == K::llama2c ? "text" : "image";
  if (kind.kind == K::unknown) {  // listed where its name says, with why it cannot load
    const std::string ext = path.extension().string();
    m.kind = ext == ".gguf" || ext == ".bin" ? "text" : "image";
  }
  Status st = guarded([&]() -> Status {
    switch (kind.kind) {
      case K::gguf: m.summary = describe_gguf(m.path); break;
      case K::llama2c: m.summary = describe_llama2c(m.path); break;
      case K::safetensors: m.summary = describe_safetensors(m.path); break;
      case K::pytorch_zip: m.summary = describe_torch(m.path); break;
      case K::diffusers: m.summary = describe_diffusers(m.path); break;
      default: formats::throw_if_unusable(kind);
    }
    return Status{};
  });
  if (!st.ok()) m.summary = "cannot load: " + st.message;
  return m;
}
}  // namespace

std::vector<ModelFile> scan_model_folders(const std::vector<std::string>& folders) {
  std::vector<ModelFile> out;
  for (const auto& folder : folders) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(folder, ec))
      if (auto m = describe(e.path())) out.push_back(std::move(*m));
  }
  std::sort(out.begin(), out.end(), [](const ModelFile& a, const ModelFile& b) { return a.path < b.path; });
  return out;
}

Result<ModelFile> inspect_model_file(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status::error(StatusCode::NotFound, path + ": no such file");
  auto m = describe(path);
  if (!m || m->format == "unknown")
    return Status::error(StatusCode::InvalidArgument,
                         path + " is not a model file (GGUF, llama2.c .bin, safetensors, PyTorch archive or diffusers folder)");
  if (m->summary.rfind("cannot load: ", 0) == 0) return Status::error(StatusCode::InvalidModel, path + ": " + m->summary);
  return *m;
}

}  // namespace atelier
