// GgufWriter -> GgufFile round trips: every metadata type, arrays of every
// element type, tensors of several types and ranks, custom alignment; the
// writer's own error paths; and a rewrite of the real stories260K.gguf.
#include "core/error.h"
#include "formats/formats_test_util.h"
#include "formats/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <random>

using atelier::Error;
using atelier::formats::GgufFile;
using atelier::formats::GgufTensor;
using atelier::formats::GgufType;
using atelier::formats::GgufValue;
using atelier::formats::GgufWriter;
using atelier::kernels::DType;
using atelier::test::TempDir;

namespace {

GgufValue scalar(GgufType t, decltype(GgufValue::value) v) { return GgufValue{t, GgufType::UINT32, std::move(v)}; }
GgufValue array(GgufType e, decltype(GgufValue::value) v) { return GgufValue{GgufType::ARRAY, e, std::move(v)}; }

bool same(const GgufValue& a, const GgufValue& b) {
  return a.type == b.type && (a.type != GgufType::ARRAY || a.elem_type == b.elem_type) && a.value == b.value;
}

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  DType type;
};

std::vector<uint8_t> random_bytes(size_t n, std::mt19937& rng) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

uint64_t byte_size(const TensorSpec& s) {
  uint64_t rows = 1;
  for (size_t i = 1; i < s.shape.size(); ++i) rows *= static_cast<uint64_t>(s.shape[i]);
  return static_cast<uint64_t>(atelier::kernels::dtype_row_bytes(s.type, s.shape[0])) * rows;
}

std::vector<std::pair<std::string, GgufValue>> all_values() {
  const std::string weird("nul\0inside \xe2\x96\x81 and \xf0\x9f\xa6\x99", 20);
  return {
      {"t.u8", scalar(GgufType::UINT8, uint64_t{255})},
      {"t.i8", scalar(GgufType::INT8, int64_t{-128})},
      {"t.u16", scalar(GgufType::UINT16, uint64_t{65535})},
      {"t.i16", scalar(GgufType::INT16, int64_t{-32768})},
      {"t.u32", scalar(GgufType::UINT32, uint64_t{4294967295u})},
      {"t.i32", scalar(GgufType::INT32, int64_t{std::numeric_limits<int32_t>::min()})},
      {"t.u64", scalar(GgufType::UINT64, std::numeric_limits<uint64_t>::max())},
      {"t.i64", scalar(GgufType::INT64, std::numeric_limits<int64_t>::min())},
      {"t.f32", scalar(GgufType::FLOAT32, double{-1.5e-3f})},
      {"t.f64", scalar(GgufType::FLOAT64, 3.141592653589793)},
      {"t.bool_t", scalar(GgufType::BOOL, true)},
      {"t.bool_f", scalar(GgufType::BOOL, false)},
      {"t.str", scalar(GgufType::STRING, weird)},
      {"t.str_empty", scalar(GgufType::STRING, std::string())},
      {"a.u8", array(GgufType::UINT8, std::vector<uint64_t>{0, 1, 255})},
      {"a.i8", array(GgufType::INT8, std::vector<int64_t>{-128, 0, 127})},
      {"a.u16", array(GgufType::UINT16, std::vector<uint64_t>{65535, 7})},
      {"a.i16", array(GgufType::INT16, std::vector<int64_t>{-32768, 32767})},
      {"a.u32", array(GgufType::UINT32, std::vector<uint64_t>{4294967295u, 0})},
      {"a.i32", array(GgufType::INT32, std::vector<int64_t>{-1, 2, -3})},
      {"a.u64", array(GgufType::UINT64, std::vector<uint64_t>{std::numeric_limits<uint64_t>::max(), 1})},
      {"a.i64", array(GgufType::INT64, std::vector<int64_t>{std::numeric_limits<int64_t>::min(), 5})},
      {"a.f32", array(GgufType::FLOAT32, std::vector<double>{0.25, -2.0, double{1e-30f}})},
      {"a.f64", array(GgufType::FLOAT64, std::vector<double>{1e300, -0.0, 1.0 / 3.0})},
      {"a.bool", array(GgufType::BOOL, std::vector<uint8_t>{1, 0, 1, 1})},
      {"a.str", array(GgufType::STRING, std::vector<std::string>{"a", "", weird, std::string(300, 'x')})},
      {"a.empty", array(GgufType::INT32, std::vector<int64_t>{})},
      {"a.empty_str", array(GgufType::STRING, std::vector<std::string>{})},
  };
}

std::vector<TensorSpec> all_tensors() {
  return {
      {"f32.2d", {5, 3}, DType::F32},
      {"f16.1d", {7}, DType::F16},
      {"bf16.3d", {3, 2, 2}, DType::BF16},
      {"q8_0", {64, 3}, DType::Q8_0},
      {"q4_0.4d", {32, 1, 2, 1}, DType::Q4_0},
      {"q4_1", {32, 2}, DType::Q4_1},
      {"q5_0", {32}, DType::Q5_0},
      {"q4_K", {256, 2}, DType::Q4_K},
      {"q6_K", {512}, DType::Q6_K},
      {"q2_K", {256}, DType::Q2_K},
  };
}

void round_trip(uint64_t alignment, bool set_alignment, GgufType alignment_type = GgufType::UINT32) {
  TempDir dir("writer");
  const std::string path = dir.file("round.gguf");
  std::mt19937 rng(1234);
  GgufWriter w;
  auto values = all_values();
  if (set_alignment) values.emplace_back("general.alignment", scalar(alignment_type, uint64_t{alignment}));
  for (const auto& [k, v] : values) w.set_value(k, v);
  w.set_u32("s.u32", 7);
  w.set_i32("s.i32", -7);
  w.set_u64("s.u64", uint64_t{1} << 40);
  w.set_f32("s.f32", 0.5f);
  w.set_bool("s.bool", true);
  w.set_string("s.str", "hello");
  w.set_string_array("s.strs", {"x", "yy"});
  w.set_f32_array("s.f32s", {1.5f, -2.25f});
  w.set_i32_array("s.i32s", {1, -2, 3});
  w.set_u32("s.u32", 8);  // replaces, does not duplicate
  auto specs = all_tensors();
  std::vector<std::vector<uint8_t>> datas;
  for (const auto& s : specs) {
    datas.push_back(random_bytes(byte_size(s), rng));
    w.add_tensor(s.name, s.shape, s.type, datas.back().data(), datas.back().size());
  }
  w.write(path);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  // The raw header, read without the reader: magic, version 3, counts, first key.
  auto raw = atelier::test::read_all(path);
  ASSERT_GE(raw.size(), 24u);
  EXPECT_EQ(std::string(raw.begin(), raw.begin() + 4), "GGUF");
  uint32_t version;
  uint64_t n_tensors, n_kv, key_len;
  std::memcpy(&version, &raw[4], 4);
  std::memcpy(&n_tensors, &raw[8], 8);
  std::memcpy(&n_kv, &raw[16], 8);
  std::memcpy(&key_len, &raw[24], 8);
  EXPECT_EQ(version, 3u);
  EXPECT_EQ(n_tensors, specs.size());
  EXPECT_EQ(n_kv, values.size() + 9);
  EXPECT_EQ(std::string(raw.begin() + 32, raw.begin() + 32 + static_cast<long>(key_len)), "t.u8");  // insertion order
  EXPECT_EQ(raw.size() % alignment, 0u);

  auto f = GgufFile::open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), alignment);
  EXPECT_EQ(f->data_offset() % alignment, 0u);
  EXPECT_EQ(f->metadata().size(), values.size() + 9);
  for (const auto& [k, v] : values) {
    const GgufValue* got = f->find(k);
    ASSERT_NE(got, nullptr) << k;
    EXPECT_TRUE(same(*got, v)) << k;
  }
  EXPECT_EQ(f->get_int("s.u32"), 8);
  EXPECT_EQ(f->get_int("s.i32"), -7);
  EXPECT_EQ(f->get_int("s.u64"), int64_t{1} << 40);
  EXPECT_EQ(f->get_float("s.f32"), 0.5);
  EXPECT_TRUE(f->get_bool("s.bool", false));
  EXPECT_EQ(f->get_string("s.str"), "hello");
  EXPECT_EQ(f->get_string_array("s.strs"), (std::vector<std::string>{"x", "yy"}));
  EXPECT_EQ(f->get_float_array("s.f32s"), (std::vector<double>{1.5, -2.25}));
  EXPECT_EQ(f->get_int_array("s.i32s"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f->get_float_array("s.i32s"), (std::vector<double>{1, -2, 3}));
  EXPECT_EQ(f->get_int_array("a.u8"), (std::vector<int64_t>{0, 1, 255}));
  EXPECT_EQ(f->get_float("t.i8"), -128.0);  // integers are accepted as floats
  EXPECT_EQ(f->get_int("t.u32"), 4294967295);
  EXPECT_THROW(f->get_int("t.u64"), Error);       // > INT64_MAX
  EXPECT_THROW(f->get_int_array("a.u64"), Error);  // holds a value > INT64_MAX
  EXPECT_THROW(f->get_int("t.f32"), Error);
  EXPECT_THROW(f->get_bool("t.u8", false), Error);
  EXPECT_THROW(f->get_float_array("a.str"), Error);
  EXPECT_THROW(f->get_string("a.str"), Error);

  ASSERT_EQ(f->tensors().size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const GgufTensor& t = f->tensors()[i];  // file order is insertion order
    EXPECT_EQ(t.name, specs[i].name);
    EXPECT_EQ(t.shape, specs[i].shape) << t.name;
    EXPECT_EQ(t.type, specs[i].type) << t.name;
    EXPECT_EQ(t.bytes, datas[i].size()) << t.name;
    EXPECT_EQ(t.offset % alignment, 0u) << t.name;
    EXPECT_EQ(std::memcmp(t.data, datas[i].data(), datas[i].size()), 0) << t.name;
    EXPECT_EQ(&f->tensor(t.name), &t);
  }
}

TEST(GgufWriter, RoundTripDefaultAlignment) { round_trip(32, false); }
TEST(GgufWriter, RoundTripAlignment64) { round_trip(64, true); }
TEST(GgufWriter, RoundTripAlignment4096AsUint64) { round_trip(4096, true, GgufType::UINT64); }
TEST(GgufWriter, RoundTripAlignment8) { round_trip(8, true); }

TEST(GgufWriter, EmptyFileRoundTrips) {
  TempDir dir("writer");
  GgufWriter().write(dir.file("empty.gguf"));
  auto f = GgufFile::open(dir.file("empty.gguf"));
  EXPECT_TRUE(f->metadata().empty());
  EXPECT_TRUE(f->tensors().empty());
}

TEST(GgufWriter, RewritesStories260KFaithfully) {
  TempDir dir("writer");
  auto orig = GgufFile::open(atelier::test::fixture("text/stories260K.gguf"));
  GgufWriter w;
  for (const auto& [k, v] : orig->metadata()) w.set_value(k, v);
  for (const GgufTensor& t : orig->tensors()) w.add_tensor(t.name, t.shape, t.type, t.data, t.bytes);
  w.write(dir.file("copy.gguf"));
  auto copy = GgufFile::open(dir.file("copy.gguf"));
  // Same content, same alignment: the same size as llama.cpp's file, whatever the key order.
  EXPECT_EQ(std::filesystem::file_size(dir.file("copy.gguf")),
            std::filesystem::file_size(atelier::test::fixture("text/stories260K.gguf")));
  EXPECT_EQ(copy->data_offset(), orig->data_offset());
  ASSERT_EQ(copy->metadata().size(), orig->metadata().size());
  for (const auto& [k, v] : orig->metadata()) {
    ASSERT_TRUE(copy->has(k)) << k;
    EXPECT_TRUE(same(*copy->find(k), v)) << k;
  }
  ASSERT_EQ(copy->tensors().size(), orig->tensors().size());
  for (size_t i = 0; i < orig->tensors().size(); ++i) {
    const auto& a = orig->tensors()[i];
    const auto& b = copy->tensors()[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.shape, b.shape);
    EXPECT_EQ(a.offset, b.offset) << a.name;
    EXPECT_EQ(std::memcmp(a.data, b.data, a.bytes), 0) << a.name;
  }
}

TEST(GgufWriter, RejectsBadInput) {
  TempDir dir("writer");
  std::vector<uint8_t> four_floats(16);
  GgufWriter w;
  EXPECT_THROW(w.add_tensor("x", {4}, DType::F32, four_floats.data(), 12), Error);  // wrong byte count
  EXPECT_THROW(w.add_tensor("x", {}, DType::F32, four_floats.data(), 0), Error);
  EXPECT_THROW(w.add_tensor("x", {4, 1, 1, 1, 1}, DType::F32, four_floats.data(), 16), Error);
  EXPECT_THROW(w.add_tensor("x", {4, 0}, DType::F32, four_floats.data(), 0), Error);
  EXPECT_THROW(w.add_tensor("x", {33}, DType::Q8_0, four_floats.data(), 16), Error);  // not a block multiple
  EXPECT_THROW(w.add_tensor("x", {4}, static_cast<DType>(99), four_floats.data(), 16), Error);
  w.add_tensor("x", {4}, DType::F32, four_floats.data(), 16);
  EXPECT_THROW(w.add_tensor("x", {4}, DType::F32, four_floats.data(), 16), Error);  // duplicate

  for (uint64_t bad : {uint64_t{0}, uint64_t{3}, uint64_t{48}}) {
    GgufWriter b;
    b.set_u32("general.alignment", static_cast<uint32_t>(bad));
    EXPECT_THROW(b.write(dir.file("bad.gguf")), Error) << bad;
    EXPECT_FALSE(std::filesystem::exists(dir.file("bad.gguf")));
  }
  {
    GgufWriter b;
    b.set_value("k", scalar(GgufType::UINT8, uint64_t{300}));  // does not fit
    EXPECT_THROW(b.write(dir.file("bad.gguf")), Error);
    EXPECT_FALSE(std::filesystem::exists(dir.file("bad.gguf.tmp")));
  }
  {
    GgufWriter b;
    b.set_value("k", scalar(GgufType::UINT8, std::string("not a number")));
    EXPECT_THROW(b.write(dir.file("bad.gguf")), Error);
  }
  {
    GgufWriter b;
    b.set_value("k", array(GgufType::ARRAY, std::vector<uint64_t>{}));  // nested
    EXPECT_THROW(b.write(dir.file("bad.gguf")), Error);
  }
  try {
    w.write("/nonexistent-atelier-dir/model.gguf");
    FAIL() << "expected Error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("/nonexistent-atelier-dir/model.gguf"), std::string::npos) << m;
    EXPECT_NE(m.find("No such file or directory"), std::string::npos) << m;
  }
}

TEST(GgufWriter, ReplacesAnExistingFileAtomically) {
  TempDir dir("writer");
  const std::string path = dir.file("m.gguf");
  GgufWriter a;
  a.set_string("v", "first");
  a.write(path);
  GgufWriter b;
  b.set_string("v", "second");
  b.write(path);
  EXPECT_EQ(GgufFile::open(path)->get_string("v"), "second");
}

}  // namespace
