// The synthetic models' vocabulary (atelier/models.h, SynthModelRef): every
// byte one token (ids 3..258), a space the U+2581 piece (259), "<tID>"
// pieces after it that only sampling produces; no space prefix, so a prompt
// of N bytes is N + 1 tokens and decode(encode(text)) == text.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

using atelier::tok::Tokenizer;
using atelier::tok::TokenType;

TEST(SyntheticVocab, TextIsItsBytesAndDecodesBack) {
  const auto t = Tokenizer::synthetic(512);
  ASSERT_EQ(t->n_vocab(), 512);
  EXPECT_EQ(t->bos_id(), 1);
  EXPECT_EQ(t->eos_id(), 2);
  const std::string text = "Hi there, caf\xC3\xA9 <t300> </s>";
  const std::vector<int32_t> ids = t->encode(text, /*add_bos=*/true, /*parse_special=*/false);
  std::vector<int32_t> want = {1};
  for (unsigned char c : text) want.push_back(c == ' ' ? 259 : 3 + c);
  EXPECT_EQ(ids, want) << "one token a byte, a space as 259, no merges into <t300>";
  std::vector<int32_t> body(ids.begin() + 1, ids.end());
  EXPECT_EQ(t->decode(body), text);
  // With specials parsed, "</s>" is EOS; the rest is unchanged.
  const std::vector<int32_t> special = t->encode("a</s>", true, true);
  EXPECT_EQ(special, (std::vector<int32_t>{1, 3 + 'a', 2}));
}

TEST(SyntheticVocab, GeneratedIdsDetokenize) {
  const auto t = Tokenizer::synthetic(128256);  // the 8B preset's size
  EXPECT_EQ(t->token_to_piece(260), "<t260>");
  EXPECT_EQ(t->token_to_piece(128255), "<t128255>");
  EXPECT_EQ(t->token_to_piece(259), " ");
  EXPECT_EQ(t->token_to_piece(3 + 'x'), "x");
  EXPECT_EQ(t->token_to_piece(2), "") << "control tokens stream nothing";
  EXPECT_EQ(t->token_type(3), TokenType::Byte);
  EXPECT_TRUE(t->is_eog(2));
  EXPECT_EQ(t->decode({3 + 'o', 3 + 'k', 259, 4242}), "ok <t4242>");
  // The same vocabulary every time: a prompt tokenizes the same.
  EXPECT_EQ(Tokenizer::synthetic(128256)->encode("same words", true, false), t->encode("same words", true, false));
}

TEST(SyntheticVocab, TooSmallIsAnError) {
  EXPECT_THROW(Tokenizer::synthetic(260), atelier::Error);
  EXPECT_NO_THROW(Tokenizer::synthetic(261));
}
