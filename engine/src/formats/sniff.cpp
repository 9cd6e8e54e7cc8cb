// The model-file sniffer. See sniff.h.
#include "formats/sniff.h"

#include "core/unique_fd.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "formats/llama2c.h"
#include "formats/mapped_file.h"
#include "formats/zip_archive.h"

namespace atelier::formats {

namespace {

constexpr uint64_t kMaxSafetensorsHeader = 100ull << 20;  // the format's own limit (100 MB)
constexpr uint64_t kMaxTokenizerBytes = 64ull << 20;      // llama2.c tokenizers are < 1 MB
constexpr int32_t kMaxTokenLength = 1 << 16;

using Fd = UniqueFd;

// Reads up to n bytes at offset; returns how many were read (short at EOF or on error).
size_t read_at(int fd, uint8_t* out, size_t n, uint64_t offset) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, out + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}
uint64_t le64(const uint8_t* p) { return le32(p) | static_cast<uint64_t>(le32(p + 4)) << 32; }

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// A zip whose central directory lists a data.pkl (torch.save puts it at ARCHIVE/data.pkl).
// Returns 1 yes, 0 a readable zip without one, -1 a zip that does not parse.
int zip_has_data_pkl(const std::string& path) {
  try {
    MappedFile map(path);
    ZipArchive zip(map.data(), map.size(), path);
    for (const ZipEntry& e : zip.entries()) {
      const std::string& n = e.name;
      if (n == "data.pkl" || (n.size() > 9 && n.compare(n.size() - 9, 9, "/data.pkl") == 0)) return 1;
    }
    return 0;
  } catch (const Error&) {
    return -1;
  }
}

// max_token_length, then (float score, int32 len, len bytes) records exactly to the end.
bool is_llama2c_tokenizer(int fd, uint64_t size) {
  if (size < 4 + 3 * 8 || size > kMaxTokenizerBytes) return false;
  std::vector<uint8_t> b(static_cast<size_t>(size));
  if (read_at(fd, b.data(), b.size(), 0) != b.size()) return false;
  const int32_t max_len = static_cast<int32_t>(le32(b.data()));
  if (max_len <= 0 || max_len > kMaxTokenLength) return false;
  uint64_t pos = 4, tokens = 0;
  while (pos < size) {
    if (size - pos < 8) return false;
    float score;
    std::memcpy(&score, b.data() + pos, 4);
    const int32_t len = static_cast<int32_t>(le32(b.data() + pos + 4));
    if (std::isnan(score) || len < 0 || len > max_len) return false;
    pos += 8;
    if (size - pos < static_cast<uint64_t>(len)) return false;
    pos += static_cast<uint64_t>(len);
    ++tokens;
  }
  return tokens >= 3;  // <unk>, <s>, </s> at least
}

bool looks_like_text(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n && i < 64; ++i)
    if (p[i] < 0x20 && p[i] != '\n' && p[i] != '\r' && p[i] != '\t') return false;
  return n > 0;
}

Sniffed unknown(const std::string& path, const std::string& found) {
  return {FileKind::unknown, path + ": not a model file Atelier reads: looked for " + std::string(sniffed_kinds_list()) +
                                 "; found " + found};
}

}  // namespace

const char* sniffed_kinds_list() {
  return "GGUF (magic \"GGUF\"), safetensors (8-byte header length, then '{'), a PyTorch zip checkpoint (PK with a "
         "data.pkl), a diffusers folder (model_index.json or unet/), a llama2.c checkpoint (7-int32 header whose "
         "dimensions imply the file's size), a llama2.c tokenizer, a CLIP vocabulary (.txt.gz)";
}

void throw_if_unusable(const Sniffed& s) {
  if (s.kind == FileKind::missing) throw NotFoundError(s.detail);
  if (s.kind == FileKind::unknown) throw Error(s.io ? StatusCode::Io : StatusCode::InvalidModel, s.detail);
}

const char* file_kind_name(FileKind k) {
  switch (k) {
    case FileKind::missing: return "missing";
    case FileKind::unknown: return "unknown";
    case FileKind::gguf: return "gguf";
    case FileKind::safetensors: return "safetensors";
    case FileKind::pytorch_zip: return "pytorch";
    case FileKind::diffusers: return "diffusers";
    case FileKind::llama2c: return "llama2c";
    case FileKind::llama2c_tokenizer: return "llama2c-tokenizer";
    case FileKind::clip_vocab: return "clip-vocab";
  }
  return "unknown";
}

Sniffed sniff_model_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) return {FileKind::missing, path + ": no such file or folder"};
    Sniffed s = unknown(path, std::string("nothing readable (") + std::strerror(err) + ")");
    s.io = true;
    return s;
  }
  if (S_ISDIR(st.st_mode)) {
    if (is_file(path + "/model_index.json") || is_dir(path + "/unet")) return {FileKind::diffusers, {}};
    return unknown(path, "a folder without model_index.json or unet/");
  }
  if (!S_ISREG(st.st_mode)) return unknown(path, "not a regular file (a FIFO, socket or device)");
  // O_NONBLOCK: should the path be swapped for a FIFO after the stat, open does not wait for a writer.
  Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) {
    Sniffed s = unknown(path, std::string("a file that cannot be opened (") + std::strerror(errno) + ")");
    s.io = true;
    return s;
  }
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return unknown(path, "not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0) return unknown(path, "an empty file (0 bytes)");

  uint8_t head[32] = {};
  const size_t n = read_at(fd.get(), head, sizeof head, 0);
  if (n >= 4 && std::memcmp(head, "GGUF", 4) == 0) return {FileKind::gguf, {}};
  if (n >= 9 && head[8] == '{') {
    const uint64_t len = le64(head);
    if (len >= 2 && len <= kMaxSafetensorsHeader) return {FileKind::safetensors, {}};
  }
  if (n >= 4 && std::memcmp(head, "PK\x03\x04", 4) == 0) {
    const int pkl = zip_has_data_pkl(path);
    if (pkl != 0) return {FileKind::pytorch_zip, {}};  // -1: damaged; its reader says how
    return unknown(path, "a zip archive without a data.pkl (not a PyTorch checkpoint)");
  }
  if (n >= 2 && head[0] == 0x1f && head[1] == 0x8b) return {FileKind::clip_vocab, {}};
  if (n >= 9 && std::memcmp(head, "#version:", 9) == 0) return {FileKind::clip_vocab, {}};

  if (n >= 28) {
    int32_t h[7];
    std::memcpy(h, head, sizeof h);
    const uint64_t want = llama2c_checkpoint_bytes(h);
    if (want == size) return {FileKind::llama2c, {}};
    if (want != 0)  // most likely a damaged llama2.c checkpoint: say that, not the whole list
      return {FileKind::unknown,
              path + ": not a usable model file: it starts with a llama2.c header (dim " + std::to_string(h[0]) + ", " +
                  std::to_string(h[2]) + " layers, vocab " +
                  std::to_string(h[5] < 0 ? -static_cast<int64_t>(h[5]) : h[5]) + ") that implies " +
                  std::to_string(want) + " bytes, but the file has " + std::to_string(size) +
                  (size < want ? " (truncated: the download is incomplete; fetch it again)"
                               : " (the header or the file is corrupt)")};
  }
  if (is_llama2c_tokenizer(fd.get(), size)) return {FileKind::llama2c_tokenizer, {}};
  // Not the bytes themselves: this message reaches API clients, who must not read a file through it.
  return unknown(path, std::to_string(size) + (size == 1 ? " byte" : " bytes") + " of " + (looks_like_text(head, n) ? "text" : "other data"));
}

}  // namespace atelier::formats
