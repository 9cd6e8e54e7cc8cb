// What a model file is, from its bytes: the one place that decides it, for
// text loading, image loading, discovery and the store. Names and extensions
// are not consulted (store blobs have none, and a renamed file still loads).
//
//   gguf               "GGUF" magic
//   safetensors        8-byte little-endian header length, then '{' (TAESD
//                      .safetensors files are safetensors too)
//   pytorch_zip        "PK\3\4", a zip holding a data.pkl (torch.save since
//                      1.6: .ckpt, .pth, TAESD .pth); a zip whose directory
//                      does not parse is still reported here, so its reader
//                      says what is damaged
//   diffusers          a folder with model_index.json or unet/
//   llama2c            no magic: a 7-int32 header with plausible dimensions
//                      whose weights layout is exactly the file's size
//   llama2c_tokenizer  max_token_length, then (score, length, bytes) records
//                      to the end of the file
//   clip_vocab         gzip magic (bpe_simple_vocab_16e6.txt.gz), or a plain
//                      merges file starting "#version:"
//   missing            nothing at that path
//   unknown            anything else; `detail` says what was looked for and
//                      what was found
//
// Hostile inputs are safe: the path is stat()ed first (a FIFO or a device is
// "unknown: not a regular file", never opened), the file is opened with
// O_NONBLOCK, at most a bounded prefix is read except for a tokenizer
// candidate (at most 64 MiB), and every length is checked against the size.
#pragma once

#include <string>

namespace atelier::formats {

enum class FileKind { missing, unknown, gguf, safetensors, pytorch_zip, diffusers, llama2c, llama2c_tokenizer, clip_vocab };

struct Sniffed {
  FileKind kind = FileKind::unknown;
  std::string detail;  // unknown: "PATH: not a model file ...: looked for ...; found ..."; missing: "PATH: no such ..."
  bool io = false;     // unknown because the system refused (permissions): an Io failure, not a bad file
};

// Never throws for a bad file; throws std::bad_alloc only.
Sniffed sniff_model_file(const std::string& path);

// For a missing, unreadable or unknown file: throws NotFoundError, IoError or
// Error (InvalidModel) with `detail`. Does nothing for a recognised kind.
void throw_if_unusable(const Sniffed& s);

// "gguf", "safetensors", "pytorch", "diffusers", "llama2c", "llama2c-tokenizer",
// "clip-vocab", "missing", "unknown" (the first five are the store's and
// discovery's format names).
const char* file_kind_name(FileKind kind);

// What the sniffer looks for, for error messages ("GGUF, safetensors, ...").
const char* sniffed_kinds_list();

}  // namespace atelier::formats
