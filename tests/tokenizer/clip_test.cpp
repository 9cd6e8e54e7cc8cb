// CLIP BPE: every row of the fixture vectors (openai/CLIP and third-party
// suites; Hugging Face semantics where marked), the 77-token context, A1111's
// emphasis syntax and its 75-token chunking with comma backtracking.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/clip.h"

using atelier::tok::ClipTokenizer;
using atelier::tok::parse_prompt_attention;
using atelier::tok::tokenize_weighted;

namespace {

const std::string kClip = std::string(ATELIER_FIXTURES_DIR) + "/clip/";

const ClipTokenizer& tok() {
  static const auto t = ClipTokenizer::open(kClip + "bpe_simple_vocab_16e6.txt.gz");
  return *t;
}

// A JSON string literal (the fixture's first column): \" \\ \/ \n \t \uXXXX.
std::string json_string(const std::string& s) {
  std::string out;
  auto put = [&](uint32_t c) {
    if (c < 0x80) {
      out += char(c);
    } else if (c < 0x800) {
      out += char(0xC0 | (c >> 6)), out += char(0x80 | (c & 0x3F));
    } else {
      out += char(0xE0 | (c >> 12)), out += char(0x80 | ((c >> 6) & 0x3F)), out += char(0x80 | (c & 0x3F));
    }
  };
  for (size_t i = 1; i + 1 < s.size(); ++i) {
    if (s[i] != '\\') {
      out += s[i];
      continue;
    }
    const char e = s[++i];
    if (e == 'u') {
      put(static_cast<uint32_t>(std::stoul(s.substr(i + 1, 4), nullptr, 16)));
      i += 4;
    } else {
      out += e == 'n' ? '\n' : e == 't' ? '\t' : e;
    }
  }
  return out;
}

}  // namespace

TEST(Clip, Vocabulary) {
  EXPECT_EQ(tok().n_vocab(), 49408);
  EXPECT_EQ(tok().start_id(), 49406);
  EXPECT_EQ(tok().end_id(), 49407);
  EXPECT_EQ(tok().comma_id(), 267);
  EXPECT_EQ(tok().token_text(320), "a</w>");
  EXPECT_THROW(ClipTokenizer::open(kClip + "missing.txt.gz"), atelier::Error);
}

TEST(Clip, FixtureVectors) {
  std::ifstream in(kClip + "clip_tokenizer_vectors.tsv");
  ASSERT_TRUE(in.good());
  std::string line;
  std::getline(in, line);  // header
  int rows = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream cols(line);
    std::string text, ids_s;
    std::getline(cols, text, '\t');
    std::getline(cols, ids_s, '\t');
    std::vector<int32_t> expected;
    std::istringstream ids(ids_s);
    for (int32_t v; ids >> v;) expected.push_back(v);
    EXPECT_EQ(tok().encode_with_specials(json_string(text)), expected) << text;
    ++rows;
  }
  EXPECT_EQ(rows, 29);
}

TEST(Clip, PaddedContext) {
  const auto ids = tok().encode_padded("a photo of a cat", 49407);
  EXPECT_EQ(ids[0], 49406);
  EXPECT_EQ(ids[5], 2368);
  EXPECT_EQ(ids[6], 49407);
  EXPECT_EQ(ids[76], 49407);
  const auto ids0 = tok().encode_padded("a photo of a cat", 0);  // OpenCLIP pads with 0
  EXPECT_EQ(ids0[6], 49407);
  EXPECT_EQ(ids0[7], 0);
  // Truncated to 75 tokens between start and end.
  std::string long_text;
  for (int i = 0; i < 100; ++i) long_text += "cat ";
  const auto t = tok().encode_padded(long_text, 49407);
  EXPECT_EQ(t[75], 2368);
  EXPECT_EQ(t[76], 49407);
}

TEST(Clip, EmphasisParsing) {
  struct Expect { std::string text; float weight; };
  auto check = [](const std::string& prompt, const std::vector<Expect>& want) {
    const auto got = parse_prompt_attention(prompt);
    ASSERT_EQ(got.size(), want.size()) << prompt;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].text, want[i].text) << prompt;
      EXPECT_NEAR(got[i].weight, want[i].weight, 1e-5) << prompt << " fragment " << i;
    }
  };
  // The examples of A1111's parse_prompt_attention docstring.
  check("normal text", {{"normal text", 1.0f}});
  check("an (important) word", {{"an ", 1.0f}, {"important", 1.1f}, {" word", 1.0f}});
  check("(unbalanced", {{"unbalanced", 1.1f}});
  check("\\(literal\\]", {{"(literal]", 1.0f}});
  check("(unnecessary)(parens)", {{"unnecessaryparens", 1.1f}});
  // The first "(" never closes, so it lifts everything after it by 1.1.
  check("a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).",
        {{"a ", 1.0f}, {"house", 1.573f}, {" ", 1.1f}, {"on", 1.0f}, {" a ", 1.1f}, {"hill", 0.55f},
         {", sun, ", 1.1f}, {"sky", 1.4641f}, {".", 1.1f}});
  check("[word]", {{"word", 1.0f / 1.1f}});
  check("(word:1.2)", {{"word", 1.2f}});
  check("word:1.2) and: more", {{"word:1.2) and: more", 1.0f}});
  check("", {{"", 1.0f}});
  const auto br = parse_prompt_attention("a cat BREAK a dog");
  ASSERT_EQ(br.size(), 3u);
  EXPECT_EQ(br[0].text, "a cat");
  EXPECT_TRUE(br[1].is_break);
  EXPECT_EQ(br[2].text, "a dog");
  EXPECT_EQ(parse_prompt_attention("BREAKING news").size(), 1u);
}

TEST(Clip, WeightedChunks) {
  const auto one = tokenize_weighted(tok(), "a (cat:1.5) on [grass]", 49407);
  ASSERT_EQ(one.size(), 1u);
  // start a cat on grass end pad...
  EXPECT_EQ(one[0].ids[0], 49406);
  EXPECT_EQ(one[0].ids[1], 320);
  EXPECT_EQ(one[0].ids[2], 2368);
  EXPECT_FLOAT_EQ(one[0].weights[1], 1.0f);
  EXPECT_FLOAT_EQ(one[0].weights[2], 1.5f);
  EXPECT_NEAR(one[0].weights[4], 1.0f / 1.1f, 1e-6);
  EXPECT_EQ(one[0].ids[5], 49407);
  EXPECT_EQ(one[0].ids[76], 49407);
  EXPECT_FLOAT_EQ(one[0].weights[76], 1.0f);

  // 80 x "cat" (one token each) without commas: 75 + 5.
  std::string cats;
  for (int i = 0; i < 80; ++i) cats += "cat ";
  const auto two = tokenize_weighted(tok(), cats, 49407);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].ids[75], 2368);
  EXPECT_EQ(two[0].ids[76], 49407);
  EXPECT_EQ(two[1].ids[5], 2368);
  EXPECT_EQ(two[1].ids[6], 49407);

  // A comma at token 70: the 5 tokens after it move to the next chunk.
  std::string comma;
  for (int i = 0; i < 69; ++i) comma += "cat ";
  comma += ", ";
  for (int i = 0; i < 10; ++i) comma += "dog ";
  const auto moved = tokenize_weighted(tok(), comma, 49407);
  ASSERT_EQ(moved.size(), 2u);
  EXPECT_EQ(moved[0].ids[70], 267);    // the comma ends chunk 0
  EXPECT_EQ(moved[0].ids[71], 49407);  // then padding
  EXPECT_EQ(moved[1].ids[1], 1929);    // "dog"
  EXPECT_EQ(moved[1].ids[10], 1929);
  EXPECT_EQ(moved[1].ids[11], 49407);
  // Without backtracking the chunk is cut at 75.
  const auto cut = tokenize_weighted(tok(), comma, 49407, 0);
  EXPECT_EQ(cut[0].ids[75], 1929);

  // BREAK starts a new chunk; an empty prompt is one chunk of padding.
  const auto br = tokenize_weighted(tok(), "a cat BREAK a dog", 0);
  ASSERT_EQ(br.size(), 2u);
  EXPECT_EQ(br[0].ids[3], 49407);
  EXPECT_EQ(br[0].ids[4], 0);
  EXPECT_EQ(br[1].ids[2], 1929);
  const auto empty = tokenize_weighted(tok(), "", 49407);
  ASSERT_EQ(empty.size(), 1u);
  EXPECT_EQ(empty[0].ids[1], 49407);
}
