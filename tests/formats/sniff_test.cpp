// The model-file sniffer (formats/sniff.h): every fixture kind by content,
// renamed copies, and hostile inputs (empty, 3 bytes, a GGUF magic with
// garbage, a folder, a FIFO that must not block, random prefixes).
#include "formats/sniff.h"

#include "core/error.h"
#include "formats/formats_test_util.h"
#include "formats/gguf.h"
#include "formats/llama2c.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <chrono>
#include <future>
#include <random>
#include <thread>

using atelier::formats::FileKind;
using atelier::formats::sniff_model_file;
using atelier::test::fixture;
using atelier::test::TempDir;

namespace {

FileKind kind_of(const std::string& path) { return sniff_model_file(path).kind; }

std::string copy_as(const TempDir& dir, const std::string& from, const std::string& name) {
  const std::string to = dir.file(name);
  atelier::test::write_all(to, atelier::test::read_all(from));
  return to;
}

std::string write_bytes(const TempDir& dir, const std::string& name, const std::string& bytes) {
  const std::string to = dir.file(name);
  atelier::test::write_all(to, std::vector<uint8_t>(bytes.begin(), bytes.end()));
  return to;
}

}  // namespace

TEST(Sniff, FixturesByContent) {
  EXPECT_EQ(kind_of(fixture("text/stories260K.gguf")), FileKind::gguf);
  EXPECT_EQ(kind_of(fixture("text/stories260K.bin")), FileKind::llama2c);
  EXPECT_EQ(kind_of(fixture("text/tok512.bin")), FileKind::llama2c_tokenizer);
  EXPECT_EQ(kind_of(fixture("image/quickdraw-cvae.safetensors")), FileKind::safetensors);
  EXPECT_EQ(kind_of(fixture("image/taef2_decoder.pth")), FileKind::pytorch_zip);
  EXPECT_EQ(kind_of(fixture("image/taef2_encoder.pth")), FileKind::pytorch_zip);
  EXPECT_EQ(kind_of(fixture("clip/bpe_simple_vocab_16e6.txt.gz")), FileKind::clip_vocab);
  EXPECT_EQ(kind_of(fixture("vocab/ggml-vocab-falcon.gguf")), FileKind::gguf);
  EXPECT_EQ(kind_of(fixture("image/llama_cute.jpg")), FileKind::unknown);
  EXPECT_EQ(kind_of(fixture("text/tok512.model")), FileKind::unknown);  // a SentencePiece protobuf
}

TEST(Sniff, NamesDoNotDecide) {
  TempDir d("sniff-rename");
  EXPECT_EQ(kind_of(copy_as(d, fixture("text/stories260K.gguf"), "x.bin")), FileKind::gguf);
  EXPECT_EQ(kind_of(copy_as(d, fixture("text/stories260K.bin"), "x.dat")), FileKind::llama2c);
  EXPECT_EQ(kind_of(copy_as(d, fixture("text/stories260K.bin"), "noext")), FileKind::llama2c);
  EXPECT_EQ(kind_of(copy_as(d, fixture("text/tok512.bin"), "x.gguf")), FileKind::llama2c_tokenizer);
  EXPECT_EQ(kind_of(copy_as(d, fixture("image/quickdraw-cvae.safetensors"), "x.ckpt")), FileKind::safetensors);
  EXPECT_EQ(kind_of(copy_as(d, fixture("image/taef2_decoder.pth"), "x.safetensors")), FileKind::pytorch_zip);
  EXPECT_EQ(kind_of(copy_as(d, fixture("clip/bpe_simple_vocab_16e6.txt.gz"), "vocab")), FileKind::clip_vocab);
}

TEST(Sniff, Llama2cHeaderImpliesTheFileSize) {
  const auto bytes = atelier::test::read_all(fixture("text/stories260K.bin"));
  int32_t h[7];
  std::memcpy(h, bytes.data(), sizeof h);
  EXPECT_EQ(atelier::formats::llama2c_checkpoint_bytes(h), bytes.size());
  int32_t odd[7] = {64, 172, 5, 8, 4, 512, 512};
  odd[3] = 7;  // 64 is not divisible into 7 heads
  EXPECT_EQ(atelier::formats::llama2c_checkpoint_bytes(odd), 0u);
  int32_t zero[7] = {};
  EXPECT_EQ(atelier::formats::llama2c_checkpoint_bytes(zero), 0u);

  // A truncated checkpoint is not taken for one; the reason says what its header implies.
  TempDir d("sniff-cut");
  const std::string cut = d.file("cut.bin");
  atelier::test::write_all(cut, std::vector<uint8_t>(bytes.begin(), bytes.end() - 100));
  const auto s = sniff_model_file(cut);
  EXPECT_EQ(s.kind, FileKind::unknown);
  EXPECT_NE(s.detail.find("llama2.c header"), std::string::npos) << s.detail;
  EXPECT_NE(s.detail.find("truncated"), std::string::npos) << s.detail;
}

TEST(Sniff, DiffusersFolders) {
  TempDir d("sniff-diffusers");
  std::filesystem::create_directories(d.file("a/unet"));
  std::filesystem::create_directories(d.file("b"));
  write_bytes(d, "b/model_index.json", "{}");
  std::filesystem::create_directories(d.file("c"));
  EXPECT_EQ(kind_of(d.file("a")), FileKind::diffusers);
  EXPECT_EQ(kind_of(d.file("b")), FileKind::diffusers);
  const auto c = sniff_model_file(d.file("c"));
  EXPECT_EQ(c.kind, FileKind::unknown);
  EXPECT_NE(c.detail.find("model_index.json"), std::string::npos) << c.detail;
}

TEST(Sniff, MissingAndUnknownSayWhy) {
  TempDir d("sniff-unknown");
  const auto missing = sniff_model_file(d.file("nope.gguf"));
  EXPECT_EQ(missing.kind, FileKind::missing);
  EXPECT_THROW(atelier::formats::throw_if_unusable(missing), atelier::NotFoundError);

  const std::string txt = write_bytes(d, "notes.safetensors", "hello, this is text and not a model\n");
  const auto u = sniff_model_file(txt);
  EXPECT_EQ(u.kind, FileKind::unknown);
  for (const char* what : {"GGUF", "safetensors", "PyTorch", "diffusers", "llama2.c", "CLIP", "36 bytes of text"})
    EXPECT_NE(u.detail.find(what), std::string::npos) << what << ": " << u.detail;
  // What it found, never its bytes: the message reaches API clients (issue 31).
  for (const char* bytes : {"68 65 6c", "hello"}) EXPECT_EQ(u.detail.find(bytes), std::string::npos) << u.detail;
  EXPECT_NE(u.detail.find(txt), std::string::npos) << u.detail;
  try {
    atelier::formats::throw_if_unusable(u);
    ADD_FAILURE() << "no throw";
  } catch (const atelier::Error& e) {
    EXPECT_EQ(e.code(), atelier::StatusCode::InvalidModel);
  }
}

TEST(Sniff, HostileInputs) {
  TempDir d("sniff-hostile");
  const auto empty = sniff_model_file(write_bytes(d, "empty.gguf", ""));
  EXPECT_EQ(empty.kind, FileKind::unknown);
  EXPECT_NE(empty.detail.find("empty"), std::string::npos) << empty.detail;
  EXPECT_EQ(kind_of(write_bytes(d, "three.gguf", "GGU")), FileKind::unknown);
  EXPECT_EQ(kind_of(write_bytes(d, "pk", "PK\x03\x04")), FileKind::pytorch_zip);  // a damaged zip: its reader says how
  EXPECT_EQ(kind_of(write_bytes(d, "gz", "\x1f")), FileKind::unknown);

  // GGUF magic with garbage: a GGUF file (by its magic), which the reader then refuses.
  const std::string garbage = write_bytes(d, "garbage.bin", std::string("GGUF\x03\0\0\0garbage garbage", 23));
  EXPECT_EQ(kind_of(garbage), FileKind::gguf);
  EXPECT_THROW(atelier::formats::GgufFile::open(garbage), atelier::Error);

  // safetensors-like length with no '{', and a '{' with an absurd header length.
  std::string st(8, '\0');
  st[0] = 2;
  EXPECT_EQ(kind_of(write_bytes(d, "st1", st + "[]")), FileKind::unknown);
  std::string huge(8, '\xff');
  EXPECT_EQ(kind_of(write_bytes(d, "st2", huge + "{}")), FileKind::unknown);

  // A zip that is not a PyTorch checkpoint (the decoder with its data.pkl renamed).
  auto pth = atelier::test::read_all(fixture("image/taef2_decoder.pth"));
  std::string s(pth.begin(), pth.end());
  for (size_t p = s.find("/data.pkl"); p != std::string::npos; p = s.find("/data.pkl", p)) s[p + 8] = 'x';
  const auto zip = sniff_model_file(write_bytes(d, "other.zip", s));
  EXPECT_EQ(zip.kind, FileKind::unknown);
  EXPECT_NE(zip.detail.find("data.pkl"), std::string::npos) << zip.detail;

  // Random prefixes of every length up to 64 bytes never crash and never pass for llama2.c.
  std::mt19937 rng(7);
  for (int n = 0; n <= 64; ++n) {
    std::string r(static_cast<size_t>(n), '\0');
    for (char& c : r) c = static_cast<char>(rng());
    const FileKind k = kind_of(write_bytes(d, "rand", r));
    EXPECT_NE(k, FileKind::llama2c) << n;
    EXPECT_NE(k, FileKind::llama2c_tokenizer) << n;
  }
}

TEST(Sniff, FolderAndFifoDoNotBlock) {
  TempDir d("sniff-fifo");
  const std::string fifo = d.file("model.gguf");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto f = std::async(std::launch::async, [&] { return sniff_model_file(fifo); });
  if (f.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    // Unblock it (a writer appears) so the test fails instead of hanging.
    const int fd = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);
    f.wait();
    if (fd >= 0) ::close(fd);
    FAIL() << "sniffing a FIFO blocked";
  }
  const auto s = f.get();
  EXPECT_EQ(s.kind, FileKind::unknown);
  EXPECT_NE(s.detail.find("not a regular file"), std::string::npos) << s.detail;
  EXPECT_EQ(kind_of(d.file("")), FileKind::unknown);  // a plain folder
  EXPECT_EQ(kind_of("/dev/null"), FileKind::unknown);
}
