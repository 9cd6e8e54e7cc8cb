// Lists the model files in folders, reading only their headers, for the
// window's model list and `atelier models` before the store exists.
#include <atelier/engine.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "formats/gguf.h"
#include "formats/llama2c.h"
#include "formats/pickle.h"
#include "formats/safetensors.h"
#include "text_model_impl.h"

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
}  // namespace

std::vector<ModelFile> scan_model_folders(const std::vector<std::string>& folders) {
  std::vector<ModelFile> out;
  for (const auto& folder : folders) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(folder, ec)) {
      if (!e.is_regular_file(ec)) continue;
      const std::string name = e.path().filename().string();
      const std::string ext = e.path().extension().string();
      ModelFile m;
      m.path = e.path().string();
      m.kind = "text";
      m.bytes = static_cast<int64_t>(e.file_size(ec));
      // Tokenizer files of llama2.c sit beside checkpoints with the same extension.
      const bool tokenizer_bin = name.rfind("tok", 0) == 0;
      if (ext == ".gguf") m.format = "gguf";
      else if (ext == ".bin" && !tokenizer_bin) m.format = "llama2c";
      else if (ext == ".safetensors") m.format = "safetensors";
      else if (ext == ".pth" || ext == ".ckpt") m.format = "pytorch";
      else continue;
      // Image models come as safetensors or PyTorch archives (text models as GGUF and llama2.c).
      if (m.format == "safetensors" || m.format == "pytorch") m.kind = "image";
      Status st = guarded([&]() -> Status {
        m.summary = m.format == "gguf"          ? describe_gguf(m.path)
                    : m.format == "llama2c"     ? describe_llama2c(m.path)
                    : m.format == "safetensors" ? describe_safetensors(m.path)
                                                : describe_torch(m.path);
        return Status{};
      });
      if (!st.ok()) m.summary = "cannot load: " + st.message;
      out.push_back(std::move(m));
    }
  }
  std::sort(out.begin(), out.end(), [](const ModelFile& a, const ModelFile& b) { return a.path < b.path; });
  return out;
}

}  // namespace atelier
