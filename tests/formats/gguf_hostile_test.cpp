// Hand-made hostile GGUF files: each field a crafted file can lie about, and
// the error that must come back. Every case also checks that no single
// allocation grew large (alloc_tracker.cpp), so a claimed 2^60-element array
// is refused before anything is reserved.
#include "core/error.h"
#include "formats/formats_test_util.h"
#include "formats/gguf.h"

#include <gtest/gtest.h>

#include <functional>

using atelier::Error;
using atelier::formats::GgufFile;
using atelier::test::Bytes;
using atelier::test::TempDir;

namespace {

constexpr uint32_t kStr = 8, kArr = 9, kU8 = 0, kU32 = 4, kI32 = 5, kU64 = 10;
constexpr uint64_t kHuge = uint64_t{1} << 60;
constexpr size_t kSmallAlloc = 1 << 20;  // no hand-made file here justifies more than 1 MiB

Bytes header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
  Bytes b;
  b.raw("GGUF").u32(version).u64(n_tensors).u64(n_kv);
  return b;
}

// A tensor info: name, dims, type, offset.
Bytes& tensor_info(Bytes& b, const std::string& name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
  b.str(name).u32(static_cast<uint32_t>(dims.size()));
  for (uint64_t d : dims) b.u64(d);
  return b.u32(type).u64(offset);
}

// A well-formed file: one string key, one 32x2 F32 tensor.
Bytes valid_file() {
  Bytes b = header(1, 1);
  b.str("general.architecture").u32(kStr).str("llama");
  tensor_info(b, "w", {32, 2}, 0, 0);
  return b.pad_to(32).zeros(256);
}

class GgufHostile : public ::testing::Test {
 protected:
  // Writes the bytes and opens them; returns the error message ("" when it opened).
  std::string open_bytes(const Bytes& b) {
    atelier::test::write_all(path_, b.b);
    atelier::test::reset_alloc_high_water();
    std::string msg;
    try {
      GgufFile::open(path_);
    } catch (const Error& e) {
      msg = e.what();
      EXPECT_FALSE(msg.empty());
    }
    EXPECT_LE(atelier::test::alloc_high_water(), kSmallAlloc);
    return msg;
  }
  void expect_error(const Bytes& b, const std::string& fragment) {
    std::string msg = open_bytes(b);
    ASSERT_FALSE(msg.empty()) << "expected an error containing '" << fragment << "'";
    EXPECT_EQ(msg.rfind(path_ + ": ", 0), 0u) << "message should start with the path: " << msg;
    EXPECT_NE(msg.find(fragment), std::string::npos) << "message: " << msg;
  }
  TempDir dir_{"hostile"};
  std::string path_ = dir_.file("hostile.gguf");
};

TEST_F(GgufHostile, ValidBaselineOpens) {
  EXPECT_EQ(open_bytes(valid_file()), "");
  auto f = GgufFile::open(path_);
  EXPECT_EQ(f->tensor("w").bytes, 256u);
  Bytes v2 = valid_file();
  v2.b[4] = 2;
  EXPECT_EQ(open_bytes(v2), "");
}

TEST_F(GgufHostile, VocabOnlyFileWithoutTrailingPaddingOpens) {
  Bytes b = header(0, 1);
  b.str("k").u32(kU8).u8(1);  // 24 + 9 + 4 + 1 = 38 bytes: not a multiple of 32, no padding
  EXPECT_EQ(open_bytes(b), "");
}

TEST_F(GgufHostile, MagicVersionEndianness) {
  expect_error(Bytes(), "the file is empty");
  expect_error(Bytes().raw("GGU"), "truncated: the file has only 3 bytes");
  expect_error(Bytes().raw("XY"), "not a GGUF file");
  expect_error(Bytes().raw("GGML").u32(3), "not a GGUF file");
  expect_error(Bytes().raw("GGUF"), "truncated");
  expect_error(Bytes().raw("GGUF").u32(3).u32(0), "truncated");
  expect_error(header(0, 0, 1), "unsupported GGUF version 1");
  expect_error(header(0, 0, 4), "unsupported GGUF version 4");
  expect_error(header(0, 0, 0), "unsupported GGUF version 0");
  Bytes be;
  be.raw("GGUF").u8(0).u8(0).u8(0).u8(3).zeros(16);
  expect_error(be, "big-endian");
}

TEST_F(GgufHostile, MissingFileAndDirectory) {
  try {
    GgufFile::open(dir_.file("does-not-exist.gguf"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does-not-exist.gguf: cannot open: No such file or directory"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(GgufFile::open(dir_.file("")), Error);  // a directory
}

TEST_F(GgufHostile, HugeCounts) {
  expect_error(header(kHuge, 0), "tensor count claims 1152921504606846976");
  expect_error(header(0, kHuge), "metadata count claims");
  expect_error(header(~uint64_t{0}, ~uint64_t{0}), "count claims");
  // A count that just exceeds what the remaining bytes could hold.
  Bytes b = header(0, 3);
  b.str("a").u32(kU8).u8(1).str("b").u32(kU8).u8(1).zeros(5);
  expect_error(b, "metadata count claims 3");
}

TEST_F(GgufHostile, HugeStringLengths) {
  Bytes key = header(0, 1);
  key.u64(kHuge).raw("general.architecture").u32(kStr).str("llama");
  expect_error(key, "metadata key #0 claims a length of 1152921504606846976");
  Bytes val = header(0, 1);
  val.str("general.name").u32(kStr).u64(kHuge).raw("x");
  expect_error(val, "value of metadata key 'general.name' claims a length");
  Bytes name = header(1, 0);
  name.u64(kHuge).raw("w").u32(1).u64(32).u32(0).u64(0).zeros(200);
  expect_error(name, "name of tensor #0 claims a length");
}

TEST_F(GgufHostile, HugeArrays) {
  for (uint32_t elem : {kU8, kU32, kU64, kStr}) {
    Bytes b = header(0, 1);
    b.str("tokenizer.ggml.tokens").u32(kArr).u32(elem).u64(kHuge).zeros(64);
    expect_error(b, "metadata array 'tokenizer.ggml.tokens' claims 1152921504606846976 entries");
  }
  // Claims one more u64 than the remaining bytes hold.
  Bytes b = header(0, 1);
  b.str("a").u32(kArr).u32(kU64).u64(9).zeros(64);
  expect_error(b, "claims 9 entries");
  // Strings inside an array that lie about their length.
  Bytes s = header(0, 1);
  s.str("a").u32(kArr).u32(kStr).u64(2).str("ok").u64(kHuge).zeros(16);
  expect_error(s, "[1] claims a length");
}

TEST_F(GgufHostile, ArrayAboveTheElementLimit) {
  // 2^24 + 1 u8 elements are really there (16 MiB): refused by the sanity cap
  // rather than widened into 128 MiB of uint64.
  Bytes b = header(0, 1);
  b.str("big").u32(kArr).u32(kU8).u64((uint64_t{1} << 24) + 1).zeros((size_t{1} << 24) + 1);
  expect_error(b, "the limit is 16777216");
}

TEST_F(GgufHostile, BadValueTypes) {
  Bytes t = header(0, 1);
  t.str("k").u32(13).u64(0);
  expect_error(t, "metadata key 'k' has unknown value type 13");
  Bytes e = header(0, 1);
  e.str("k").u32(kArr).u32(99).u64(0);
  expect_error(e, "unknown element type 99");
  Bytes nested = header(0, 1);
  nested.str("k").u32(kArr).u32(kArr).u64(1).u32(kU8).u64(1).u8(0);
  expect_error(nested, "nested arrays are not supported");
}

TEST_F(GgufHostile, DuplicateKeyAndTensor) {
  Bytes k = header(0, 2);
  k.str("k").u32(kU8).u8(1).str("k").u32(kU8).u8(2);
  expect_error(k, "metadata key 'k' appears twice");
  Bytes t = header(2, 0);
  tensor_info(t, "w", {32}, 0, 0);
  tensor_info(t, "w", {32}, 0, 128);
  t.pad_to(32).zeros(256);
  expect_error(t, "tensor name 'w' appears twice");
}

TEST_F(GgufHostile, BadAlignment) {
  auto with_alignment = [](uint32_t type, uint64_t value) {
    Bytes b = header(1, 1);
    b.str("general.alignment").u32(type);
    if (type == kU32) b.u32(static_cast<uint32_t>(value));
    if (type == kI32) b.i32(static_cast<int32_t>(value));
    if (type == kU64) b.u64(value);
    if (type == kStr) b.str("32");
    tensor_info(b, "w", {32}, 0, 0);
    return b.pad_to(64).zeros(256);
  };
  expect_error(with_alignment(kU32, 0), "general.alignment is 0; it must be a power of two");
  expect_error(with_alignment(kU32, 3), "general.alignment is 3");
  expect_error(with_alignment(kU32, 48), "general.alignment is 48");
  expect_error(with_alignment(kU64, uint64_t{1} << 40), "power of two");
  expect_error(with_alignment(kI32, static_cast<uint64_t>(-32)), "general.alignment must be a positive integer");
  expect_error(with_alignment(kStr, 0), "general.alignment must be a positive integer, found string");
  EXPECT_EQ(open_bytes(with_alignment(kU32, 64)), "");
}

TEST_F(GgufHostile, MisalignedTensorOffset) {
  Bytes b = header(1, 0);
  tensor_info(b, "w", {32}, 0, 4);
  b.pad_to(32).zeros(256);
  expect_error(b, "tensor 'w' has data offset 4, not a multiple of the alignment 32");
}

TEST_F(GgufHostile, BadTensorTypes) {
  for (uint32_t type : {4u, 5u, 16u, 31u, 99u, 0xffffffffu}) {
    Bytes b = header(1, 0);
    tensor_info(b, "blk.0.attn_q.weight", {32}, type, 0);
    b.pad_to(32).zeros(256);
    expect_error(b, "tensor 'blk.0.attn_q.weight' has tensor type id " + std::to_string(type));
  }
}

TEST_F(GgufHostile, BadDimensions) {
  Bytes many = header(1, 0);
  many.str("w").u32(100);
  for (int i = 0; i < 100; ++i) many.u64(1);
  many.u32(0).u64(0).zeros(64);
  expect_error(many, "tensor 'w' has 100 dimensions; 1 to 4 are allowed");
  Bytes none = header(1, 0);
  none.str("w").u32(0).u32(0).u64(0).zeros(64);
  expect_error(none, "tensor 'w' has 0 dimensions");
  Bytes zero = header(1, 0);
  tensor_info(zero, "w", {32, 0}, 0, 0).zeros(64);
  expect_error(zero, "has dimension 1 = 0; every dimension must be at least 1");
  Bytes neg = header(1, 0);
  tensor_info(neg, "w", {~uint64_t{0}}, 0, 0).zeros(64);
  expect_error(neg, "has dimension 0 = 18446744073709551615; that is more than 2^63 - 1");
  Bytes overflow = header(1, 0);
  tensor_info(overflow, "w", {uint64_t{1} << 32, uint64_t{1} << 32}, 0, 0).zeros(64);
  expect_error(overflow, "so many elements that the count overflows");
  Bytes bytes_overflow = header(1, 0);  // 2^62 elements fit in int64, 2^64 bytes do not
  tensor_info(bytes_overflow, "w", {uint64_t{1} << 31, uint64_t{1} << 31}, 0, 0).zeros(64);
  expect_error(bytes_overflow, "byte size overflows");
  Bytes block = header(1, 0);
  tensor_info(block, "w", {33, 2}, 8 /*Q8_0*/, 0).pad_to(32).zeros(256);
  expect_error(block, "tensor 'w' has rows of 33 elements, not a multiple of 32");
}

TEST_F(GgufHostile, TensorOutsideTheFile) {
  Bytes past = header(1, 0);
  tensor_info(past, "blk.0.attn_q.weight", {64, 64}, 0, 0).pad_to(32).zeros(1000);
  expect_error(past, "truncated: tensor 'blk.0.attn_q.weight' needs 16384 bytes at offset 96");
  Bytes off = header(1, 0);
  tensor_info(off, "w", {32}, 0, 1024).pad_to(32).zeros(256);
  expect_error(off, "tensor 'w' needs 128 bytes");
  Bytes wrap = header(1, 0);  // offset + size wraps around 2^64
  tensor_info(wrap, "w", {32}, 0, ~uint64_t{0} - 31).pad_to(32).zeros(256);
  expect_error(wrap, "tensor 'w' needs 128 bytes");
  Bytes no_data = header(1, 0);  // the data section would start after EOF
  tensor_info(no_data, "w", {32}, 0, 0);
  expect_error(no_data, "tensor 'w' needs 128 bytes");
  Bytes exact = header(1, 0);  // ends exactly at the last tensor's last byte: fine
  tensor_info(exact, "w", {32}, 0, 0).pad_to(32).zeros(128);
  EXPECT_EQ(open_bytes(exact), "");
  exact.b.pop_back();
  expect_error(exact, "tensor 'w' needs 128 bytes");
}

}  // namespace
