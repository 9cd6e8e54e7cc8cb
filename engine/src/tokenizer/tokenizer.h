// Tokenizers compatible with llama.cpp: SentencePiece-style (`llama`),
// byte-level BPE (`gpt2`, pre-tokenizer from `tokenizer.ggml.pre`) and
// WordPiece (`bert`), loaded from GGUF metadata; a Hugging Face
// tokenizer.json (BPE) as a second source; llama2.c tokenizer files.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace atelier::formats {
class GgufFile;
struct Llama2cVocab;
}  // namespace atelier::formats

namespace atelier::tok {

struct VocabSpec;  // tokenizer_impl.h: what a loader read, before a tokenizer is built

enum class TokenType : int32_t {  // as tokenizer.ggml.token_type stores them
  Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6,
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Throw atelier::Error naming the file and the problem (unsupported model or pre-tokenizer, ...).
  static std::unique_ptr<Tokenizer> from_gguf(const formats::GgufFile& file);
  static std::unique_ptr<Tokenizer> from_hf_json(const std::string& path);
  static std::unique_ptr<Tokenizer> from_llama2c(const formats::Llama2cVocab& vocab);
  // A synthetic model's vocabulary (atelier/models.h, SynthModelRef):
  // SentencePiece-style, every byte a token, no merges, no space prefix.
  // Throws atelier::Error when n_vocab is under 261.
  static std::unique_ptr<Tokenizer> synthetic(int n_vocab);

  // add_bos: prepend BOS when the vocabulary uses one (tokenizer.ggml.add_bos_token,
  // default per model type as llama.cpp) and append EOS when it asks for that
  // (tokenizer.ggml.add_eos_token); WordPiece adds [CLS] ... [SEP]. This is
  // llama.cpp's add_special. parse_special: control/user-defined
  // token texts in `text` (e.g. "<|eot_id|>") become their ids. User-defined
  // token texts are cut out even without it, as in llama.cpp.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const = 0;

  // The bytes a token stands for when streamed: SentencePiece U+2581 becomes
  // ' ', <0xNN> byte tokens become that byte, byte-level BPE symbols map back
  // to bytes. Control tokens give "" (llama.cpp's default, special=false).
  virtual std::string token_to_piece(int32_t id) const = 0;
  // The pieces of `ids` joined. Where the vocabulary adds a space prefix
  // (SentencePiece), the space that prefix put before the first word is dropped,
  // so decode(encode(text, ...)) == text for text without special tokens.
  std::string decode(const std::vector<int32_t>& ids) const;

  virtual std::string model_name() const = 0;  // "llama", "gpt2", "bert"
  int32_t n_vocab() const { return static_cast<int32_t>(texts_.size()); }
  const std::string& token_text(int32_t id) const { return texts_.at(static_cast<size_t>(id)); }
  TokenType token_type(int32_t id) const { return types_.at(static_cast<size_t>(id)); }
  int32_t bos_id() const { return bos_; }
  int32_t eos_id() const { return eos_; }
  // End of generation: EOS, EOT (<|eot_id|>, <|im_end|>, <|end|> ...) as the vocabulary names them.
  bool is_eog(int32_t id) const;

 protected:
  // Shared set-up (tokenizer.cpp): takes the token tables and special ids from
  // `spec`, applies llama.cpp's load-time rules (EOT/EOG detection by text,
  // per-model strip flags) and builds the lookup map and the special-token cache.
  void init_vocab(VocabSpec& spec);
  // The trie partition() walks, from special_tokens_ (init_vocab calls it).
  void build_special_trie();
  // The token whose text is exactly `text`, or -1.
  int32_t find_token(std::string_view text) const;
  // Throws atelier::Error unless 0 <= id < n_vocab().
  void check_id(int32_t id) const;
  // llama.cpp's tokenizer_st_partition: control, unknown (only with
  // parse_special) and user-defined (always) token texts are cut out of `text`,
  // longest first. A fragment is a token (token >= 0) or raw text [offset, offset + length).
  struct Fragment {
    int32_t token;
    size_t offset, length;
  };
  // The result is llama.cpp's; only the work differs: one walk of a byte trie
  // of the special texts from every byte of `text` finds which of them occur,
  // and only those are tried (Gemma 3 has ~6,400, a prompt holds a few).
  std::vector<Fragment> partition(std::string_view text, bool parse_special) const;

  struct TextHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  enum StripFlag : uint8_t { kLstrip = 1, kRstrip = 2 };

  std::unordered_map<std::string, int32_t, TextHash, std::equal_to<>> ids_;
  std::vector<uint8_t> strip_;           // StripFlag bits per token
  std::vector<int32_t> special_tokens_;  // control/user-defined/unknown ids, longest text first
  // The byte trie of the special tokens' texts (node 0 the root): children of
  // node k are edge_byte_/edge_child_[edge_begin_[k], edge_begin_[k + 1]);
  // special_node_[i] is the node where special_tokens_[i]'s text ends.
  std::vector<int32_t> root_child_;  // 256 entries, -1: no special text starts with that byte
  std::vector<uint32_t> edge_begin_;
  std::vector<uint8_t> edge_byte_;
  std::vector<int32_t> edge_child_;
  std::vector<int32_t> special_node_;
  bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false;
  int32_t sep_ = -1;
  size_t max_token_len_ = 0;  // bytes

  std::vector<std::string> texts_;
  std::vector<TokenType> types_;
  std::vector<float> scores_;
  int32_t bos_ = -1, eos_ = -1, unk_ = -1;
  std::vector<int32_t> eog_ids_;
};

}  // namespace atelier::tok
