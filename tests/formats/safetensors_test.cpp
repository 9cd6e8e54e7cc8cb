// safetensors: the real QuickDraw fixture, a writer round trip, and hand-made
// hostile files, each of which must give a clean atelier::Error without a
// large allocation (alloc_tracker.cpp).
#include "core/error.h"
#include "formats/formats_test_util.h"
#include "formats/safetensors.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using atelier::Error;
using atelier::formats::ElemType;
using atelier::formats::SafetensorsFile;
using atelier::formats::SafetensorsWriter;
using atelier::test::Bytes;
using atelier::test::TempDir;

namespace {

constexpr size_t kSmallAlloc = 1 << 20;

TEST(Safetensors, QuickDrawFixtureOpens) {
  auto f = SafetensorsFile::open(atelier::test::fixture("image/quickdraw-cvae.safetensors"));
  EXPECT_EQ(f->tensors().size(), 8u);
  const auto& m = f->metadata();
  ASSERT_TRUE(m.count("architecture"));
  ASSERT_TRUE(m.count("labels"));
  ASSERT_TRUE(m.count("graph"));
  auto labels = nlohmann::json::parse(m.at("labels"));
  ASSERT_TRUE(labels.is_array());
  EXPECT_EQ(labels.size(), 50u);
  uint64_t params = 0;
  for (const auto& t : f->tensors()) {
    EXPECT_EQ(t.dtype, ElemType::F32) << t.name;
    EXPECT_TRUE(t.supported());
    EXPECT_EQ(t.bytes, uint64_t(t.elements()) * 4);
    params += uint64_t(t.elements());
  }
  EXPECT_GT(params, 10000u);
  EXPECT_NE(f->find_tensor("conv2d_transpose_1.bias"), nullptr);
  EXPECT_THROW(f->tensor("nope"), Error);
}

TEST(Safetensors, WriterRoundTrip) {
  TempDir dir("st-rt");
  const std::string path = dir.file("m.safetensors");
  std::vector<float> a = {1.f, -2.5f, 3.f, 4.f, 5.f, 6.f};
  std::vector<uint16_t> h = {0x3c00, 0xc000, 0x7bff};
  std::vector<uint16_t> b = {0x3f80};
  std::vector<int64_t> ids = {0, 1, 2, 3};
  SafetensorsWriter w;
  w.add_tensor("a", ElemType::F32, {2, 3}, a.data(), a.size() * 4);
  w.add_tensor("h", ElemType::F16, {3}, h.data(), h.size() * 2);
  w.add_tensor("b", ElemType::BF16, {1, 1}, b.data(), 2);
  w.add_tensor("ids", ElemType::I64, {1, 4}, ids.data(), ids.size() * 8);
  w.add_tensor("empty", ElemType::F32, {0, 5}, nullptr, 0);
  w.set_metadata("format", "pt");
  w.set_metadata("note", "round \"trip\"");
  EXPECT_THROW(w.add_tensor("a", ElemType::F32, {1}, a.data(), 4), Error);
  EXPECT_THROW(w.add_tensor("bad", ElemType::F32, {2}, a.data(), 4), Error);
  EXPECT_THROW(w.add_tensor("__metadata__", ElemType::F32, {1}, a.data(), 4), Error);
  w.write(path);

  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->header_bytes() % 8, 0u);
  ASSERT_EQ(f->tensors().size(), 5u);
  EXPECT_EQ(f->tensors()[0].name, "a");  // header order kept
  const auto& ta = f->tensor("a");
  EXPECT_EQ(ta.shape, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(ta.bytes, 24u);
  EXPECT_EQ(std::memcmp(ta.data, a.data(), 24), 0);
  EXPECT_EQ(f->tensor("h").dtype, ElemType::F16);
  EXPECT_EQ(std::memcmp(f->tensor("h").data, h.data(), 6), 0);
  EXPECT_EQ(f->tensor("b").dtype, ElemType::BF16);
  EXPECT_EQ(f->tensor("ids").dtype, ElemType::I64);
  EXPECT_FALSE(f->tensor("ids").supported());
  EXPECT_EQ(f->tensor("empty").bytes, 0u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("note"), "round \"trip\"");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

// A file: 8-byte length, the header text, then `data_bytes` zero bytes.
std::string make(const TempDir& dir, const std::string& header, size_t data_bytes, uint64_t claimed_len = 0) {
  Bytes b;
  b.u64(claimed_len ? claimed_len : header.size()).raw(header).zeros(data_bytes);
  const std::string p = dir.file("h.safetensors");
  atelier::test::write_all(p, b.b);
  return p;
}

void expect_error(const std::string& path, const std::string& needle) {
  atelier::test::reset_alloc_high_water();
  try {
    SafetensorsFile::open(path);
    FAIL() << "expected an error containing: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_LT(atelier::test::alloc_high_water(), kSmallAlloc);
}

TEST(SafetensorsHostile, Rejected) {
  TempDir dir("st-hostile");
  expect_error(make(dir, "", 0, uint64_t{1} << 62), "exceeds the limit");
  expect_error(make(dir, "{}", 0, 1000), "runs past the end");
  {
    const std::string p = dir.file("tiny");
    atelier::test::write_all(p, {1, 2, 3});
    expect_error(p, "too small");
  }
  expect_error(make(dir, "{\"a\": {\"dtype\": ", 16), "not valid JSON");
  expect_error(make(dir, "[1, 2]", 16), "must be a JSON object");
  expect_error(make(dir, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8), "past the end of the data");
  expect_error(make(dir, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}})", 16), "needs 16 bytes");
  expect_error(make(dir, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,4]}})", 16), "before begin");
  expect_error(make(dir,
                    R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
                    R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                    16),
               "overlap");
  expect_error(make(dir, R"({"a":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}})", 16), "unknown dtype");
  expect_error(make(dir, R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 16), "non-negative");
  expect_error(make(dir,
                    R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", 16),
               "overflows");
  expect_error(make(dir, R"({"a":{"dtype":"F32","shape":[2]}})", 16), "data_offsets");
  expect_error(make(dir, R"({"__metadata__":{"k":1}})", 0), "must be a string");
  expect_error(make(dir, std::string(2000, '['), 0), "not valid JSON");
}

TEST(SafetensorsHostile, UnsortedOffsetsAndGapsAccepted) {
  TempDir dir("st-unsorted");
  auto f = SafetensorsFile::open(make(dir,
                                      R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                                      R"("a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                                      16));
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_FALSE(f->tensor("a").supported());
  EXPECT_EQ(f->tensor("b").offset, 8u);
}

}  // namespace
