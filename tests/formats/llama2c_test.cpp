// llama2.c checkpoints and tokenizers: the real stories260K.bin / tok512.bin,
// then truncated, bit-flipped and hand-made bad files.
#include "core/error.h"
#include "formats/formats_test_util.h"
#include "formats/gguf.h"
#include "formats/llama2c.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fcntl.h>
#include <random>
#include <unistd.h>

using atelier::Error;
using atelier::formats::load_llama2c;
using atelier::formats::load_llama2c_tokenizer;
using atelier::test::Bytes;
using atelier::test::TempDir;
using atelier::test::fixture;

namespace {

TEST(Llama2c, Stories260KLayout) {
  auto m = load_llama2c(fixture("text/stories260K.bin"));
  const auto& c = m.config;
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.seq_len, 512);
  EXPECT_TRUE(c.shared_classifier);
  const auto& w = m.weights;
  EXPECT_EQ(w.wcls, w.token_embedding);
  // run.c's order, counted in floats from the embedding.
  const float* b = w.token_embedding;
  EXPECT_EQ(w.rms_att - b, 512 * 64);
  EXPECT_EQ(w.wq - w.rms_att, 5 * 64);
  EXPECT_EQ(w.wk - w.wq, 5 * 64 * 64);
  EXPECT_EQ(w.wv - w.wk, 5 * 32 * 64);
  EXPECT_EQ(w.wo - w.wv, 5 * 32 * 64);
  EXPECT_EQ(w.rms_ffn - w.wo, 5 * 64 * 64);
  EXPECT_EQ(w.w1 - w.rms_ffn, 5 * 64);
  EXPECT_EQ(w.w2 - w.w1, 5 * 172 * 64);
  EXPECT_EQ(w.w3 - w.w2, 5 * 64 * 172);
  EXPECT_EQ(w.rms_final - w.w3, 5 * 172 * 64);
  // RMSNorm weights of a trained model are positive-ish and finite.
  for (int i = 0; i < 64; ++i) EXPECT_TRUE(std::isfinite(w.rms_final[i]));
  // The skipped freq_cis tables end exactly at the end of the file: the last
  // float of freq_cis_imag is sin(511 * 10000^(-6/8)) for head size 8.
  const float* end = w.rms_final + 64 + 2 * 512 * 4;
  EXPECT_NEAR(end[-1], std::sin(511.0 * std::pow(10000.0, -6.0 / 8.0)), 1e-4);
  EXPECT_NEAR(w.rms_final[64], 1.0f, 1e-6);  // freq_cis_real[0][0] = cos(0)
}

TEST(Llama2c, Tok512) {
  auto v = load_llama2c_tokenizer(fixture("text/tok512.bin"), 512);
  EXPECT_EQ(v.max_token_length, 7);
  ASSERT_EQ(v.pieces.size(), 512u);
  ASSERT_EQ(v.scores.size(), 512u);
  EXPECT_EQ(v.pieces[0], "<unk>");
  EXPECT_EQ(v.pieces[1], "\n<s>\n");   // llama2.c's tokenizer.py spells BOS/EOS this way
  EXPECT_EQ(v.pieces[2], "\n</s>\n");
  EXPECT_EQ(v.pieces[3], "<0x00>");
  // Spaces are ' ', not U+2581; the same vocabulary as the GGUF otherwise.
  auto g = atelier::formats::GgufFile::open(fixture("text/stories260K.gguf"));
  auto tokens = g->get_string_array("tokenizer.ggml.tokens");
  auto scores = g->get_float_array("tokenizer.ggml.scores");
  int compared = 0;
  for (size_t i = 3; i < 512; ++i) {
    // U+2581 (E2 96 81) -> ' ' (built by hand: GCC 12's -Wrestrict misfires on string::replace).
    std::string t;
    for (size_t k = 0; k < tokens[i].size(); ++k) {
      if (tokens[i].compare(k, 3, "\xe2\x96\x81") == 0) {
        t += ' ';
        k += 2;
      } else {
        t += tokens[i][k];
      }
    }
    EXPECT_EQ(v.pieces[i], t) << i;
    EXPECT_EQ(v.scores[i], static_cast<float>(scores[i])) << i;
    ++compared;
  }
  EXPECT_EQ(compared, 509);
  EXPECT_NE(std::find(v.pieces.begin(), v.pieces.end(), " the"), v.pieces.end());
}

TEST(Llama2c, TokenizerErrors) {
  EXPECT_THROW(load_llama2c_tokenizer(fixture("text/tok512.bin"), 513), Error);   // too few tokens in the file
  EXPECT_THROW(load_llama2c_tokenizer(fixture("text/tok512.bin"), 511), Error);   // trailing bytes
  EXPECT_EQ(load_llama2c_tokenizer(fixture("text/tok512.bin"), 0).pieces.size(), 512u);  // 0: every token in the file
  EXPECT_THROW(load_llama2c_tokenizer(fixture("text/tok512.bin"), -5), Error);
  TempDir dir("l2c");
  const std::string p = dir.file("tok.bin");
  auto write = [&](const Bytes& b) { atelier::test::write_all(p, b.b); };
  auto expect_error = [&](int vocab, const std::string& fragment) {
    try {
      load_llama2c_tokenizer(p, vocab);
      ADD_FAILURE() << "expected an error containing " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(p + ": "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  write(Bytes().i32(-1));
  expect_error(1, "max_token_length = -1");
  write(Bytes().i32(4).f32(0).i32(-3));
  expect_error(1, "token 0 has length -3");
  write(Bytes().i32(4).f32(0).i32(5).raw("hello"));
  expect_error(1, "token 0 has length 5 (max_token_length is 4)");
  write(Bytes().i32(4).f32(0).i32(4).raw("ab"));
  expect_error(1, "token 0 bytes needs 4 bytes");
  write(Bytes().i32(4).f32(std::nanf("")).i32(1).raw("a"));
  expect_error(1, "NaN score");
  write(Bytes().i32(4).f32(0).i32(1).raw("a"));
  expect_error(1 << 30, "vocabulary of 1073741824");
  write(Bytes().i32(4).f32(0).i32(1).raw("a").zeros(8));
  expect_error(100, "room for at most 2");
  write(Bytes().i32(4).f32(-1.5f).i32(1).raw("a").f32(2).i32(0));
  auto ok = load_llama2c_tokenizer(p, 2);
  EXPECT_EQ(ok.pieces, (std::vector<std::string>{"a", ""}));
  EXPECT_EQ(ok.scores, (std::vector<float>{-1.5f, 2.0f}));
}

// A valid tiny checkpoint: dim 8, hidden 16, 2 layers, 2 heads, 1 kv head, vocab 5, seq 3.
Bytes tiny_checkpoint(int32_t vocab_field, int32_t seq_len = 3) {
  const int dim = 8, hidden = 16, L = 2, heads = 2, kv = 1, vocab = vocab_field < 0 ? -vocab_field : vocab_field;
  const int head = dim / heads, kv_dim = head * kv;
  Bytes b;
  b.i32(dim).i32(hidden).i32(L).i32(heads).i32(kv).i32(vocab_field).i32(seq_len);
  size_t floats = static_cast<size_t>(vocab) * dim + L * dim + L * dim * dim + 2 * L * kv_dim * dim +
                  L * dim * dim + L * dim + 3 * L * hidden * dim + dim + seq_len * head;
  if (vocab_field < 0) floats += static_cast<size_t>(vocab) * dim;
  for (size_t i = 0; i < floats; ++i) b.f32(static_cast<float>(i));
  return b;
}

TEST(Llama2c, SeparateClassifierAndHeaderValidation) {
  TempDir dir("l2c");
  const std::string p = dir.file("m.bin");
  atelier::test::write_all(p, tiny_checkpoint(-5).b);
  auto m = load_llama2c(p);
  EXPECT_FALSE(m.config.shared_classifier);
  EXPECT_EQ(m.config.vocab_size, 5);
  EXPECT_NE(m.weights.wcls, m.weights.token_embedding);
  // wcls follows rms_final (8 floats) and freq_cis (3 * 4 / 2 * 2 floats).
  EXPECT_EQ(m.weights.wcls - m.weights.rms_final, 8 + 12);
  EXPECT_EQ(m.weights.wcls[0], static_cast<float>(m.weights.wcls - m.weights.token_embedding));

  auto expect_error = [&](const Bytes& b, const std::string& fragment) {
    atelier::test::write_all(p, b.b);
    try {
      load_llama2c(p);
      ADD_FAILURE() << "expected an error containing " << fragment;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(p + ": ", 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  auto with_field = [](int index, int32_t value) {
    Bytes b = tiny_checkpoint(5);
    std::memcpy(&b.b[4 * index], &value, 4);
    return b;
  };
  expect_error(with_field(0, 0), "dim = 0");
  expect_error(with_field(0, -8), "dim = -8");
  expect_error(with_field(0, 1 << 30), "dim = 1073741824");
  expect_error(with_field(1, -1), "hidden_dim = -1");
  expect_error(with_field(2, 0), "n_layers = 0");
  expect_error(with_field(2, 100000), "n_layers = 100000");
  expect_error(with_field(3, 3), "dim 8 is not divisible by n_heads 3");
  expect_error(with_field(3, 9), "n_heads = 9");
  expect_error(with_field(4, 3), "n_kv_heads = 3");  // more kv heads than heads
  expect_error(with_field(3, 8), "head size 1 is odd");
  expect_error(with_field(5, 0), "vocab_size = 0");
  expect_error(with_field(5, std::numeric_limits<int32_t>::min()), "vocab_size = -2147483648");
  expect_error(with_field(6, 0), "seq_len = 0");
  expect_error(with_field(5, 6), "truncated");     // claims more vocab than the file holds
  expect_error(with_field(5, 4), "extra");         // claims less
  expect_error(with_field(5, -5), "truncated");    // claims a separate classifier that is not there
  expect_error(with_field(0, 0x616b3432), "version 1/2 export");
  expect_error(Bytes().raw("GGUF").u32(3).zeros(40), "this is a GGUF file");
  expect_error(Bytes().i32(8).i32(16), "truncated: a llama2.c checkpoint starts with a 28-byte header");
  expect_error(Bytes(), "the file has 0 bytes");
  EXPECT_THROW(load_llama2c(dir.file("missing.bin")), Error);
  // n_kv_heads 4 with 4 heads and dim 8: head size 2, fine when the file matches; a
  // header that does not divide (4 heads, 3 kv) is refused before the size check.
  Bytes b = tiny_checkpoint(5);
  int32_t h4 = 4, kv3 = 3;
  std::memcpy(&b.b[12], &h4, 4);
  std::memcpy(&b.b[16], &kv3, 4);
  expect_error(b, "n_heads 4 is not a multiple of n_kv_heads 3");
}

TEST(Llama2c, TruncatedAndFlippedRealFiles) {
  TempDir dir("l2c");
  const std::string bin = dir.file("stories260K.bin");
  const std::string tok = dir.file("tok512.bin");
  const auto bin_bytes = atelier::test::read_all(fixture("text/stories260K.bin"));
  const auto tok_bytes = atelier::test::read_all(fixture("text/tok512.bin"));
  atelier::test::write_all(bin, bin_bytes);
  atelier::test::write_all(tok, tok_bytes);

  auto try_bin = [&](const std::string& what) {
    try {
      load_llama2c(bin);
      return true;
    } catch (const Error& e) {
      return false;
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": non-atelier exception " << e.what();
      return false;
    }
  };
  auto try_tok = [&](const std::string& what) {
    atelier::test::reset_alloc_high_water();
    bool ok = false;
    try {
      load_llama2c_tokenizer(tok, 512);
      ok = true;
    } catch (const Error&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": non-atelier exception " << e.what();
    }
    EXPECT_LE(atelier::test::alloc_high_water(), size_t{1} << 20) << what;
    return ok;
  };

  // Every truncation of the checkpoint fails (the size must match the header exactly).
  std::vector<uint64_t> sizes;
  for (uint64_t s = 0; s < 256; ++s) sizes.push_back(s);
  for (uint64_t s = 256; s < bin_bytes.size(); s += 1021) sizes.push_back(s);
  sizes.push_back(bin_bytes.size() - 1);
  std::sort(sizes.rbegin(), sizes.rend());
  for (uint64_t s : sizes) {
    ASSERT_EQ(::truncate(bin.c_str(), static_cast<off_t>(s)), 0);
    EXPECT_FALSE(try_bin("bin truncated to " + std::to_string(s))) << s;
  }
  // Every truncation of the tokenizer fails.
  for (uint64_t s = tok_bytes.size(); s-- > 0;) {
    ASSERT_EQ(::truncate(tok.c_str(), static_cast<off_t>(s)), 0);
    EXPECT_FALSE(try_tok("tok truncated to " + std::to_string(s))) << s;
    if (HasFailure()) break;
  }

  // Random header bytes of the checkpoint and random bytes of the tokenizer:
  // an error or a clean load, nothing else.
  atelier::test::write_all(bin, bin_bytes);
  atelier::test::write_all(tok, tok_bytes);
  std::mt19937 rng(7);
  int tok_errors = 0, bin_errors = 0;
  for (int i = 0; i < 2000 && !HasFailure(); ++i) {
    const bool on_tok = i % 2 == 0;
    const std::string& path = on_tok ? tok : bin;
    const auto& orig = on_tok ? tok_bytes : bin_bytes;
    const uint64_t off = on_tok ? rng() % orig.size() : rng() % 28;
    uint8_t b = (i % 4 < 2) ? static_cast<uint8_t>(orig[off] ^ (1u << (rng() % 8))) : static_cast<uint8_t>(rng());
    int fd = ::open(path.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(off)), 1);
    const std::string what = (on_tok ? "tok" : "bin") + std::string(" byte ") + std::to_string(off);
    if (on_tok)
      tok_errors += !try_tok(what);
    else
      bin_errors += !try_bin(what);
    ASSERT_EQ(::pwrite(fd, &orig[off], 1, static_cast<off_t>(off)), 1);
    ::close(fd);
  }
  EXPECT_GT(tok_errors, 50);
  EXPECT_GT(bin_errors, 500);  // almost any header change breaks the exact size
  EXPECT_TRUE(try_bin("restored"));
  EXPECT_TRUE(try_tok("restored"));
}

}  // namespace
