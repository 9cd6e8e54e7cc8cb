// PyTorch checkpoints: the real taef2 files, truncated and bit-flipped copies
// of them, and hand-made hostile pickles fed to the restricted unpickler.
// Every failure must be a clean atelier::Error (never a crash, never code
// run, never a large allocation).
#include "core/error.h"
#include "formats/formats_test_util.h"
#include "formats/mapped_file.h"
#include "formats/pickle.h"
#include "formats/zip_archive.h"

#include <gtest/gtest.h>

#include <iostream>
#include <random>

using atelier::Error;
using atelier::formats::ElemType;
using atelier::formats::TorchCheckpoint;
using atelier::test::TempDir;
namespace pickle = atelier::formats::pickle;

namespace {

const char* kFiles[] = {"image/taef2_encoder.pth", "image/taef2_decoder.pth"};

TEST(TorchCheckpoint, Taef2Loads) {
  for (const char* rel : kFiles) {
    const std::string path = atelier::test::fixture(rel);
    auto c = TorchCheckpoint::open(path);
    const atelier::formats::MappedFile m(path);
    int64_t params = 0;
    for (const auto& t : c->tensors()) {
      EXPECT_EQ(t.dtype, ElemType::F16) << t.name;
      EXPECT_TRUE(t.supported());
      EXPECT_EQ(t.bytes, uint64_t(t.elements()) * 2) << t.name;
      ASSERT_NE(t.data, nullptr) << t.name;
      params += t.elements();
    }
    std::cout << rel << ": " << c->tensors().size() << " tensors, " << params << " parameters (fp16), archive "
              << c->archive_name() << "\n";
    EXPECT_GT(params, 1300000);
    EXPECT_LT(params, 1400000);
    EXPECT_GT(c->tensors().size(), 50u);
  }
  auto enc = TorchCheckpoint::open(atelier::test::fixture(kFiles[0]));
  EXPECT_EQ(enc->archive_name(), "taef2_encoder");
  const auto& w = enc->tensor("0.weight");
  EXPECT_EQ(w.shape, (std::vector<int64_t>{64, 3, 3, 3}));
  EXPECT_EQ(w.storage_key, "0");
  EXPECT_THROW(enc->tensor("no.such"), Error);
}

TEST(TorchCheckpoint, NotACheckpoint) {
  EXPECT_THROW(TorchCheckpoint::open(atelier::test::fixture("image/quickdraw-cvae.safetensors")), Error);
  EXPECT_THROW(TorchCheckpoint::open(atelier::test::fixture("image/does-not-exist.pth")), Error);
}

TEST(TorchCheckpoint, TruncatedCopiesFail) {
  TempDir dir("pth-trunc");
  const auto bytes = atelier::test::read_all(atelier::test::fixture(kFiles[0]));
  const std::string p = dir.file("t.pth");
  for (size_t len : {size_t(0), size_t(3), size_t(30), size_t(5000), bytes.size() / 2, bytes.size() - 30,
                     bytes.size() - 1}) {
    atelier::test::write_all(p, std::vector<uint8_t>(bytes.begin(), bytes.begin() + std::ptrdiff_t(len)));
    EXPECT_THROW(TorchCheckpoint::open(p), Error) << "length " << len;
  }
}

TEST(TorchCheckpoint, BitFlippedCopiesNeverCrash) {
  TempDir dir("pth-flip");
  const auto orig = atelier::test::read_all(atelier::test::fixture(kFiles[1]));
  const std::string p = dir.file("f.pth");
  std::mt19937 rng(1234);
  int opened = 0, refused = 0;
  for (int iter = 0; iter < 300; ++iter) {
    auto b = orig;
    // Mostly in data.pkl (the first ~11 KB) and the central directory (the tail).
    for (int k = 0; k < 1 + iter % 4; ++k) {
      size_t pos;
      switch (rng() % 3) {
        case 0: pos = rng() % 12000; break;
        case 1: pos = b.size() - 1 - rng() % 12000; break;
        default: pos = rng() % b.size();
      }
      b[pos] ^= uint8_t(1u << (rng() % 8));
    }
    atelier::test::write_all(p, b);
    try {
      auto c = TorchCheckpoint::open(p);
      // Touch the first and last byte of every tensor: out of bounds would fault (or trip ASan).
      unsigned sum = 0;
      for (const auto& t : c->tensors())
        if (t.bytes) sum += t.data[0] + t.data[t.bytes - 1];
      (void)sum;
      ++opened;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_EQ(opened + refused, 300);
  EXPECT_GT(refused, 0);
}

// ---- hostile pickles ----

std::vector<uint8_t> bytes_of(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
// A string literal with embedded NULs, all N-1 bytes of it.
template <size_t N>
std::vector<uint8_t> lit(const char (&s)[N]) {
  return std::vector<uint8_t>(s, s + N - 1);
}

std::string expect_refused(const std::vector<uint8_t>& pk, const std::string& needle, size_t alloc_cap = 1 << 20) {
  atelier::test::reset_alloc_high_water();
  std::string msg;
  try {
    pickle::read_state_dict(pk.data(), pk.size(), "hostile.pth");
    ADD_FAILURE() << "expected an error containing: " << needle;
  } catch (const Error& e) {
    msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find("hostile.pth"), std::string::npos) << msg;
  }
  EXPECT_LT(atelier::test::alloc_high_water(), alloc_cap);
  return msg;
}

TEST(PickleHostile, RefusesForeignGlobals) {
  expect_refused(lit("\x80\x02" "cos\nsystem\n" "q\x00" "X\x02\x00\x00\x00id" "\x85R."),
                 "refuses global 'os.system'");
  expect_refused(lit("\x80\x04\x8c\x08" "builtins" "\x8c\x04" "eval" "\x93" "."),
                 "refuses global 'builtins.eval'");
  expect_refused(bytes_of("\x80\x02" "ctorch\nload\n."), "refuses global 'torch.load'");
  expect_refused(bytes_of("\x80\x02" "c__builtin__\ngetattr\n."), "refuses global '__builtin__.getattr'");
}

TEST(PickleHostile, TruncatedRealPickle) {
  const atelier::formats::MappedFile m(atelier::test::fixture(kFiles[0]));
  atelier::formats::ZipArchive zip(m.data(), m.size(), m.path());
  auto pk = zip.read("taef2_encoder/data.pkl");
  EXPECT_NO_THROW(pickle::read_state_dict(pk.data, pk.size, "real"));
  for (uint64_t len : {uint64_t(0), uint64_t(1), uint64_t(2), uint64_t(40), pk.size / 3, pk.size / 2, pk.size - 1}) {
    std::vector<uint8_t> cut(pk.data, pk.data + len);
    EXPECT_THROW(pickle::read_state_dict(cut.data(), cut.size(), "hostile.pth"), Error) << len;
  }
  std::vector<uint8_t> cut(pk.data, pk.data + pk.size / 2);
  expect_refused(cut, "truncated pickle");
}

TEST(PickleHostile, DeepMarkNesting) {
  expect_refused(bytes_of("\x80\x02" + std::string(100000, '(')), "MARK deeper than");
}

TEST(PickleHostile, StackBomb) {
  expect_refused(bytes_of("\x80\x02" + std::string(pickle::kMaxStack + 10, ']')), "stack deeper than", 64u << 20);
}

TEST(PickleHostile, HugeMemoIndex) {
  expect_refused(lit("\x80\x02}j\xff\xff\xff\xff."), "never written");
  // Writing at index 2^32-1 costs one entry, not a 2^32-slot table.
  expect_refused(lit("\x80\x02}r\xff\xff\xff\xff" "0j\xff\xff\xff\xff."), "holds no tensors");
}

TEST(PickleHostile, DeepObjectChainViaMemo) {
  // ] q0, then N times: ] h0 a q0 -> a list nested N deep; tearing it down must not recurse.
  std::string s = "\x80\x02]q";
  s.push_back('\0');
  for (int i = 0; i < 300000; ++i) {
    s += "]h";
    s.push_back('\0');
    s += "aq";
    s.push_back('\0');
  }
  s += ".";
  expect_refused(bytes_of(s), "not a state dict", 64u << 20);
}

TEST(PickleHostile, OtherMalformed) {
  expect_refused(bytes_of("\x80\x02" "i"), "unsupported pickle opcode 0x69");
  expect_refused(bytes_of("\x80\x09."), "unsupported pickle protocol");
  expect_refused(bytes_of("\x80\x02" "t"), "never set");
  expect_refused(bytes_of("\x80\x02" "s"), "underflow");
  expect_refused(bytes_of("\x80\x02" "]]s"), "underflow");
  expect_refused(lit("\x80\x02" "X\xff\xff\xff\x7f"), "truncated pickle");
  expect_refused(bytes_of("\x80\x02" "N)R."), "REDUCE calls a None");
  expect_refused(bytes_of("\x80\x02" "ctorch\nHalfStorage\n)R."), "refuses to call storage type");
  expect_refused(bytes_of("\x80\x02" "ctorch._utils\n_rebuild_tensor_v2\n)R."), "fewer than 4");
  expect_refused(bytes_of("\x80\x02" "N" "Q."), "persistent id");
  expect_refused(bytes_of("\x80\x02" "]."), "not a state dict");
  expect_refused(bytes_of("\x80\x02" "c" + std::string(1000, 'a')), "longer than 256");
}

}  // namespace
