// The real stories260K.gguf, damaged: truncated at every byte of its first
// 4 KiB and at a stride after that, single bits flipped and bytes overwritten
// at thousands of seeded random offsets, and its counts patched to hostile
// values. Each damaged file must either open (a harmless change, such as a
// flipped bit inside a weight) or throw atelier::Error — never crash, never
// throw anything else, never make a large allocation. The scratch copy lives
// in the system temp dir.
#include "core/error.h"
#include "formats/formats_test_util.h"
#include "formats/gguf.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fcntl.h>
#include <random>
#include <unistd.h>

using atelier::Error;
using atelier::formats::GgufFile;
using atelier::test::TempDir;

namespace {

struct Outcome {
  bool opened = false;
  std::string error;
};

class GgufCorruption : public ::testing::Test {
 protected:
  void SetUp() override {
    original_ = atelier::test::read_all(atelier::test::fixture("text/stories260K.gguf"));
    ASSERT_GT(original_.size(), 100000u);
    atelier::test::write_all(path_, original_);
    auto f = GgufFile::open(path_);
    data_offset_ = f->data_offset();
    for (const auto& t : f->tensors()) data_end_ = std::max(data_end_, data_offset_ + t.offset + t.bytes);
    // Worst honest case: an array of 1-byte elements spanning the file, widened to 8 bytes.
    alloc_limit_ = 8 * original_.size() + (1 << 20);
  }

  // Opens the scratch file; any exception other than atelier::Error fails the test.
  Outcome try_open(const std::string& what) {
    Outcome out;
    atelier::test::reset_alloc_high_water();
    try {
      auto f = GgufFile::open(path_);
      out.opened = true;
      // Touch every tensor's first and last byte: the pointers must be inside the mapping.
      volatile uint8_t sink = 0;
      for (const auto& t : f->tensors()) sink = sink + t.data[0] + t.data[t.bytes - 1];
      (void)sink;
    } catch (const Error& e) {
      out.error = e.what();
      EXPECT_EQ(out.error.rfind(path_ + ": ", 0), 0u) << what << ": " << out.error;
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": threw a non-atelier exception: " << e.what();
    }
    EXPECT_LE(atelier::test::alloc_high_water(), alloc_limit_) << what;
    return out;
  }

  void patch(uint64_t offset, const void* bytes, size_t n) {
    int fd = ::open(path_.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, bytes, n, static_cast<off_t>(offset)), static_cast<ssize_t>(n));
    ::close(fd);
  }
  void restore(uint64_t offset, size_t n) { patch(offset, &original_[offset], n); }

  TempDir dir_{"corrupt"};
  std::string path_ = dir_.file("stories260K.gguf");
  std::vector<uint8_t> original_;
  uint64_t data_offset_ = 0, data_end_ = 0;
  size_t alloc_limit_ = 0;
};

TEST_F(GgufCorruption, TruncatedAnywhere) {
  // Sizes to try, largest first, so one file can be cut down step by step.
  std::vector<uint64_t> sizes;
  for (uint64_t s = 0; s < 4096; ++s) sizes.push_back(s);
  for (uint64_t s = 4096; s < data_offset_ + 4096; s += 97) sizes.push_back(s);
  for (uint64_t s = data_offset_; s < original_.size(); s += 4099) sizes.push_back(s);
  sizes.push_back(data_end_ - 1);
  sizes.push_back(data_end_);
  std::sort(sizes.rbegin(), sizes.rend());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());

  int errors = 0;
  for (uint64_t s : sizes) {
    ASSERT_EQ(::truncate(path_.c_str(), static_cast<off_t>(s)), 0);
    Outcome o = try_open("truncated to " + std::to_string(s));
    if (s < data_end_) {
      EXPECT_FALSE(o.opened) << "a file truncated to " << s << " bytes opened";
      EXPECT_NE(o.error.find(s == 0 ? "the file is empty" : "truncated"), std::string::npos) << s << ": " << o.error;
    } else {
      EXPECT_TRUE(o.opened) << "cut only in the final padding (" << s << "): " << o.error;
    }
    errors += !o.opened;
    if (HasFailure()) break;
  }
  EXPECT_GT(errors, 4096);
}

TEST_F(GgufCorruption, BitFlipsAndByteOverwrites) {
  std::mt19937_64 rng(20240601);
  int errors = 0, opened = 0;
  for (int i = 0; i < 3000 && !HasFailure(); ++i) {
    // Mostly the header, where every byte matters; some in the tensor data.
    const uint64_t limit = (i % 6 == 5) ? original_.size() : data_offset_;
    const uint64_t off = rng() % limit;
    uint8_t b = original_[off];
    if (i % 2 == 0)
      b ^= static_cast<uint8_t>(1u << (rng() % 8));
    else
      b = static_cast<uint8_t>(rng());
    patch(off, &b, 1);
    Outcome o = try_open("byte " + std::to_string(off) + " set to " + std::to_string(b));
    (o.opened ? opened : errors)++;
    restore(off, 1);
  }
  // Both outcomes must occur, or the test is not testing anything.
  EXPECT_GT(errors, 150);
  EXPECT_GT(opened, 150);
}

TEST_F(GgufCorruption, PatchedHostileCounts) {
  const uint64_t huge = uint64_t{1} << 60;
  struct Case {
    uint64_t offset;
    uint64_t value;
    const char* expect;
  } cases[] = {
      {8, huge, "tensor count claims"},
      {16, huge, "metadata count claims"},
      {8, 49, ""},                    // one more tensor than the infos hold: reads garbage, must fail
      {24, huge, "claims a length"},  // the first key's length
      {24, 2000000, "claims a length"},
  };
  for (const Case& c : cases) {
    patch(c.offset, &c.value, 8);
    Outcome o = try_open("u64 at " + std::to_string(c.offset) + " = " + std::to_string(c.value));
    EXPECT_FALSE(o.opened);
    EXPECT_NE(o.error.find(c.expect), std::string::npos) << o.error;
    restore(c.offset, 8);
  }
  // Patched first-key type: 13 is no type.
  uint64_t key_len;
  std::memcpy(&key_len, &original_[24], 8);
  uint32_t bad_type = 13;
  patch(32 + key_len, &bad_type, 4);
  Outcome o = try_open("first key type 13");
  EXPECT_NE(o.error.find("unknown value type 13"), std::string::npos) << o.error;
  restore(32 + key_len, 4);
  EXPECT_TRUE(try_open("restored").opened);
}

}  // namespace
