// The tokenizer kinds behind Tokenizer (private to engine/src/tokenizer).
//
// A loader (GGUF metadata, tokenizer.json, llama2.c tokenizer) fills a
// VocabSpec; make_tokenizer() builds the kind `spec.model` names. Each kind
// follows llama.cpp's llama-vocab.cpp token for token:
//   spm.cpp       SentencePiece-style ("llama"): bigram merges by score, byte fallback
//   bpe.cpp       byte-level BPE ("gpt2"): pre-tokenizer regexes (PCRE2), merge ranks
//   wordpiece.cpp WordPiece ("bert"): BERT normalisation, greedy longest match
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer.h"

namespace atelier::tok {

struct VocabSpec {
  std::string source;  // file name for error messages
  std::string model;   // "llama", "gpt2", "bert"
  std::string pre;     // tokenizer.ggml.pre ("" when absent)
  std::string name;    // general.name (llama.cpp keys per-model token flags on it)

  std::vector<std::string> texts;
  std::vector<TokenType> types;
  std::vector<float> scores;                                // empty: all 0
  std::vector<uint8_t> strip;                               // Tokenizer::StripFlag bits; empty: none
  std::vector<std::pair<std::string, std::string>> merges;  // BPE, by rank

  // BPE: explicit pre-tokenizer regexes (tokenizer.json) instead of those `pre` names.
  std::optional<std::vector<std::string>> regexes;
  bool hf_add_prefix_space = false;  // tokenizer.json ByteLevel add_prefix_space

  // Special ids as the file gives them (-1: absent; out-of-range ids are ignored).
  int32_t bos = -1, eos = -1, unk = -1, sep = -1, pad = -1, mask = -1, eot = -1, eom = -1;
  int32_t fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;
  bool add_bos = false, add_eos = false, add_space_prefix = false, ignore_merges = false;
};

std::unique_ptr<Tokenizer> make_tokenizer(VocabSpec&& spec);

// `text` with every SentencePiece space mark U+2581 turned back into ' '.
std::string unescape_spm_spaces(std::string_view text);

// One symbol of the doubly linked list the SPM and BPE merge loops work on:
// bytes [offset, offset + n) of the text, neighbours by index (-1: none).
struct MergeSymbol {
  int prev, next;
  size_t offset, n;
};
// `text` split into its UTF-8 characters (a truncated last sequence is one
// short symbol), linked in order.
std::vector<MergeSymbol> split_symbols(std::string_view text);

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(VocabSpec& spec);
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override;
  std::string token_to_piece(int32_t id) const override;
  std::string model_name() const override { return "llama"; }

 private:
  void encode_fragment(const std::string& text, std::vector<int32_t>& out) const;
  int32_t byte_token(uint8_t byte) const;
  std::vector<int32_t> byte_ids_;  // <0xNN> (or the single byte) per byte value, -1 when absent
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(VocabSpec& spec);
  ~BpeTokenizer() override;
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override;
  std::string token_to_piece(int32_t id) const override;
  std::string model_name() const override { return "gpt2"; }

  // The regexes llama.cpp applies, in order, for a tokenizer.ggml.pre value.
  // Throws atelier::Error listing the supported names for an unknown one.
  static std::vector<std::string> pre_tokenizer_regexes(const std::string& pre, const std::string& source);
  // The byte-level words `text` splits into (public for tests and debugging).
  std::vector<std::string> pre_tokenize(std::string_view text) const;

 private:
  struct Regex;
  void encode_word(const std::string& word, std::vector<int32_t>& out) const;
  int rank(std::string_view left, std::string_view right) const;

  std::vector<std::unique_ptr<Regex>> regexes_;
  std::unordered_map<std::string, int, TextHash, std::equal_to<>> ranks_;  // "<len(left)>:" left right
  bool ignore_merges_ = false;
  bool prefix_space_ = false;
};

class WpmTokenizer final : public Tokenizer {
 public:
  explicit WpmTokenizer(VocabSpec& spec);
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override;
  std::string token_to_piece(int32_t id) const override;
  std::string model_name() const override { return "bert"; }

  static std::vector<std::string> preprocess(std::string_view text);  // BERT normalisation and word split
};

}  // namespace atelier::tok
