// CLIP's BPE tokenizer (openai/CLIP simple_tokenizer, the vocabulary of SD
// 1.x's ViT-L/14 and SD 2.x's OpenCLIP ViT-H), with Hugging Face
// CLIPTokenizer semantics where the two differ, since image pipelines
// (diffusers, ComfyUI, A1111) tokenize through Hugging Face:
//   - text: NFC (ftfy's fix for decomposed accents), runs of whitespace to one
//     space, trimmed, lower-cased; no html.unescape ("&amp;" stays as typed);
//   - "<|startoftext|>" / "<|endoftext|>" in the text are split out first and
//     become their ids (the original tokenizer would BPE them as text);
//   - words: 's 't 're 've 'm 'll 'd | letters+ | one digit | other non-space+;
//     each word's bytes go through GPT-2's byte symbols, "</w>" marks its end,
//     merges apply by rank.
// Ids: 256 byte symbols, the same with "</w>", one per merge (48,894), then
// <|startoftext|> = 49406 and <|endoftext|> = 49407.
//
// Prompts for diffusion go through `tokenize_weighted`: A1111's emphasis
// syntax and its 75-token chunking (see below).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace atelier::tok {

class ClipTokenizer {
 public:
  static constexpr int kContext = 77;      // tokens per CLIP text-encoder call
  static constexpr int kChunkTokens = 75;  // kContext minus start and end

  // Reads bpe_simple_vocab_16e6.txt.gz (gzip through zlib; plain text too).
  // Throws atelier::Error naming the file on anything malformed.
  static std::unique_ptr<ClipTokenizer> open(const std::string& path);

  // Token ids of `text` without start/end tokens.
  std::vector<int32_t> encode(std::string_view text) const;
  // <|startoftext|> ids... <|endoftext|> (what Hugging Face returns; the
  // fixture vectors' form), no truncation or padding.
  std::vector<int32_t> encode_with_specials(std::string_view text) const;
  // Exactly kContext ids: start, the first 75 ids, end, then pad_id
  // (49407 for SD 1.x's tokenizer, 0 for OpenCLIP / SD 2.x).
  std::array<int32_t, kContext> encode_padded(std::string_view text, int32_t pad_id) const;

  int32_t start_id() const { return start_; }
  int32_t end_id() const { return end_; }
  int32_t comma_id() const { return comma_; }
  int32_t n_vocab() const { return static_cast<int32_t>(vocab_.size()); }
  // The vocabulary entry ("a</w>", "th", ...), or "" when out of range.
  std::string token_text(int32_t id) const;

 private:
  ClipTokenizer() = default;
  void bpe_word(const std::string& word, std::vector<int32_t>& out) const;

  std::vector<std::string> vocab_;
  std::unordered_map<std::string, int32_t> ids_;
  std::unordered_map<std::string, int32_t> merge_rank_;  // "left right" -> rank
  int32_t start_ = 0, end_ = 0, comma_ = 0;
};

// A1111's prompt emphasis (modules/prompt_parser.py parse_prompt_attention):
//   (text) multiplies by 1.1, [text] by 1/1.1, (text:1.3) by 1.3, nestable;
//   \( \) \[ \] \\ are literal characters; unbalanced brackets close at the end
//   of the prompt; a ":number)" without an open "(" and stray ")" "]" stay as
//   text; "BREAK" (a word, upper case) ends the current 75-token chunk.
// Adjacent fragments with equal weights are merged.
struct PromptFragment {
  std::string text;
  float weight = 1.0f;
  bool is_break = false;  // a BREAK marker (text empty)
};
std::vector<PromptFragment> parse_prompt_attention(std::string_view prompt);

// One CLIP call's worth: start, 75 tokens (padded), end, with a weight per
// token (1.0 on start, end and padding).
struct PromptChunk {
  std::array<int32_t, ClipTokenizer::kContext> ids{};
  std::array<float, ClipTokenizer::kContext> weights{};
};

// A1111's tokenize_line: fragments tokenized one by one, tokens gathered into
// chunks of 75. When a chunk is full and a comma came within its last
// `comma_backtrack` tokens (A1111's comma_padding_backtrack, default 20), the
// tokens after that comma move to the next chunk, so a phrase is not cut in
// two; a BREAK pads the current chunk and starts a new one. Padding uses
// pad_id (see encode_padded). An empty prompt gives one chunk of padding.
// The encoder runs once per chunk; the outputs are concatenated along the
// token axis (77 * chunks tokens of conditioning).
std::vector<PromptChunk> tokenize_weighted(const ClipTokenizer& tok, std::string_view prompt, int32_t pad_id,
                                           int comma_backtrack = 20);

}  // namespace atelier::tok
