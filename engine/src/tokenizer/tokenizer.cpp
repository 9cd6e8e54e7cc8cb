// Tokenizer: loaders (GGUF metadata, llama2.c), the shared vocabulary set-up
// and llama.cpp's special-token partition.
#include "tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/llama2c.h"
#include "tokenizer_impl.h"
#include "unicode.h"

namespace atelier::tok {

namespace {

bool is_c_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

std::string lower_ascii(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool contains_any(const std::string& s, std::initializer_list<const char*> subs) {
  for (const char* sub : subs)
    if (s.find(sub) != std::string::npos) return true;
  return false;
}

TokenType to_token_type(int64_t v) {
  return (v >= 0 && v <= 6) ? static_cast<TokenType>(v) : TokenType::Undefined;
}

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(VocabSpec&& spec) {
  if (spec.model == "llama") return std::make_unique<SpmTokenizer>(spec);
  if (spec.model == "gpt2") return std::make_unique<BpeTokenizer>(spec);
  if (spec.model == "bert") return std::make_unique<WpmTokenizer>(spec);
  throw UnsupportedError(spec.source + ": tokenizer model '" + spec.model +
              "' is not supported (supported: llama (SentencePiece), gpt2 (byte-level BPE), bert (WordPiece))");
}

void Tokenizer::init_vocab(VocabSpec& spec) {
  texts_ = std::move(spec.texts);
  const size_t n = texts_.size();
  if (n == 0) throw Error(spec.source + ": the tokenizer vocabulary is empty");
  if (n > static_cast<size_t>(INT32_MAX)) throw Error(spec.source + ": the tokenizer vocabulary is too large");
  types_ = spec.types.empty() ? std::vector<TokenType>(n, TokenType::Normal) : std::move(spec.types);
  scores_ = spec.scores.empty() ? std::vector<float>(n, 0.0f) : std::move(spec.scores);
  strip_ = spec.strip.empty() ? std::vector<uint8_t>(n, 0) : std::move(spec.strip);
  if (types_.size() != n || scores_.size() != n || strip_.size() != n)
    throw Error(spec.source + ": the tokenizer's token types or scores do not match its " + std::to_string(n) +
                " tokens");

  ids_.clear();
  ids_.reserve(n);
  max_token_len_ = 0;
  for (size_t i = 0; i < n; ++i) {
    if (texts_[i].empty()) texts_[i] = "[EMPTY_" + std::to_string(i) + "]";  // as llama.cpp
    ids_.insert_or_assign(texts_[i], static_cast<int32_t>(i));
    max_token_len_ = std::max(max_token_len_, texts_[i].size());
  }

  const auto valid = [&](int32_t id) { return (id >= 0 && static_cast<size_t>(id) < n) ? id : -1; };
  bos_ = valid(spec.bos);
  eos_ = valid(spec.eos);
  unk_ = valid(spec.unk);
  sep_ = valid(spec.sep);
  add_bos_ = spec.add_bos && bos_ >= 0;
  add_eos_ = spec.add_eos && eos_ >= 0;
  add_space_prefix_ = spec.add_space_prefix;

  // llama.cpp finds EOT/EOM/FIM tokens by their text when the file does not name
  // them, and makes such tokens control tokens.
  const auto make_control = [&](int32_t id) { types_[static_cast<size_t>(id)] = TokenType::Control; };
  const auto detect = [&](int32_t& id, std::initializer_list<const char*> names) {
    id = valid(id);
    if (id >= 0) return;
    for (size_t i = 0; i < n && id < 0; ++i)
      for (const char* name : names)
        if (texts_[i] == name) {
          id = static_cast<int32_t>(i);
          make_control(id);
          break;
        }
  };
  int32_t eot = spec.eot, eom = spec.eom;
  detect(eot, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>",
               "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"});
  detect(eom, {"<|eom_id|>"});
  int32_t fim_pre = spec.fim_pre, fim_suf = spec.fim_suf, fim_mid = spec.fim_mid;
  int32_t fim_pad = spec.fim_pad, fim_rep = spec.fim_rep, fim_sep = spec.fim_sep;
  detect(fim_pre, {"<|fim_prefix|>", "<fim-prefix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>", "<PRE>"});
  detect(fim_suf, {"<|fim_suffix|>", "<fim-suffix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "hole\xEF\xBD\x9C>", "<SUF>"});
  detect(fim_mid, {"<|fim_middle|>", "<fim-middle>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>", "<MID>"});
  detect(fim_pad, {"<|fim_pad|>", "<fim-pad>", "<PAD>"});
  detect(fim_rep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>"});
  detect(fim_sep, {"<|file_sep|>"});

  eog_ids_.clear();
  for (int32_t id : {fim_pad, fim_rep, fim_sep, eos_, eot, eom})
    if (id >= 0) eog_ids_.push_back(id);
  for (size_t i = 0; i < n; ++i) {
    const std::string& t = texts_[i];
    if (t == "<|eot_id|>" || t == "<|im_end|>" || t == "<|end|>" || t == "<end_of_turn>" || t == "<|endoftext|>" ||
        t == "<|eom_id|>" || t == "<EOT>") {
      eog_ids_.push_back(static_cast<int32_t>(i));
      make_control(static_cast<int32_t>(i));
    } else if (t == "<|end_of_text|>" && types_[i] == TokenType::Control) {
      eog_ids_.push_back(static_cast<int32_t>(i));
    }
  }
  // gpt-oss's harmony format (o200k_harmony), as llama.cpp loads it: <|return|>
  // and <|call|> end generation, <|end|> only ends one message (the analysis
  // before the answer), and the markers between messages are printed as their
  // text (user-defined), so that the chat output parser sees the channels.
  const int32_t h_return = find_token("<|return|>"), h_call = find_token("<|call|>"), h_end = find_token("<|end|>");
  if (h_return >= 0 && h_call >= 0) {
    eog_ids_.push_back(h_return);
    eog_ids_.push_back(h_call);
    if (h_end >= 0) eog_ids_.erase(std::remove(eog_ids_.begin(), eog_ids_.end(), h_end), eog_ids_.end());
    for (const char* t : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", "<|end|>"})
      if (const int32_t id = find_token(t); id >= 0) types_[static_cast<size_t>(id)] = TokenType::UserDefined;
  }
  std::sort(eog_ids_.begin(), eog_ids_.end());
  eog_ids_.erase(std::unique(eog_ids_.begin(), eog_ids_.end()), eog_ids_.end());

  special_tokens_.clear();
  for (size_t i = 0; i < n; ++i)
    if (types_[i] == TokenType::Control || types_[i] == TokenType::UserDefined || types_[i] == TokenType::Unknown)
      special_tokens_.push_back(static_cast<int32_t>(i));
  std::stable_sort(special_tokens_.begin(), special_tokens_.end(), [&](int32_t a, int32_t b) {
    return texts_[static_cast<size_t>(a)].size() > texts_[static_cast<size_t>(b)].size();
  });

  build_special_trie();

  // Per-model strip flags, as llama.cpp sets them by tokenizer and model name.
  const auto set_strip = [&](const char* text, uint8_t flag, bool on) {
    const int32_t id = find_token(text);
    if (id < 0) return;
    auto& s = strip_[static_cast<size_t>(id)];
    s = on ? static_cast<uint8_t>(s | flag) : static_cast<uint8_t>(s & ~flag);
  };
  const std::string name = lower_ascii(spec.name);
  if (contains_any(spec.pre, {"jina-v2-de", "jina-v2-es", "jina-v2-code"})) {
    set_strip("<mask>", kLstrip, true);
  } else if (contains_any(name, {"phi-3", "phi3"})) {
    for (int32_t id : special_tokens_) strip_[static_cast<size_t>(id)] |= kRstrip;
    set_strip("</s>", kRstrip, true);
    for (const char* t : {"<unk>", "<s>", "<|endoftext|>"}) set_strip(t, kRstrip, false);
  }
}

void Tokenizer::build_special_trie() {
  // Built with a map per node, then flattened: children in byte order, each
  // node's edges contiguous (most nodes have one child: a linear scan is fastest).
  std::vector<std::map<uint8_t, int32_t>> children(1);
  special_node_.clear();
  special_node_.reserve(special_tokens_.size());
  for (int32_t id : special_tokens_) {
    int32_t node = 0;
    for (char c : texts_[static_cast<size_t>(id)]) {
      auto [it, inserted] = children[static_cast<size_t>(node)].try_emplace(static_cast<uint8_t>(c), 0);
      if (inserted) {
        it->second = static_cast<int32_t>(children.size());
        children.emplace_back();
      }
      node = it->second;
    }
    special_node_.push_back(node);
  }
  root_child_.assign(256, -1);
  for (const auto& [byte, child] : children[0]) root_child_[byte] = child;
  edge_begin_.assign(children.size() + 1, 0);
  edge_byte_.clear();
  edge_child_.clear();
  for (size_t k = 0; k < children.size(); ++k) {
    edge_begin_[k] = static_cast<uint32_t>(edge_byte_.size());
    for (const auto& [byte, child] : children[k]) {
      edge_byte_.push_back(byte);
      edge_child_.push_back(child);
    }
  }
  edge_begin_[children.size()] = static_cast<uint32_t>(edge_byte_.size());
}

int32_t Tokenizer::find_token(std::string_view text) const {
  auto it = ids_.find(text);
  return it == ids_.end() ? -1 : it->second;
}

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= n_vocab())
    throw Error("token id " + std::to_string(id) + " is out of range (vocabulary of " + std::to_string(n_vocab()) +
                " tokens)");
}

std::vector<MergeSymbol> split_symbols(std::string_view text) {
  std::vector<MergeSymbol> symbols;
  symbols.reserve(text.size());
  for (size_t offs = 0; offs < text.size();) {
    const size_t len = std::min(unicode::utf8_len(static_cast<uint8_t>(text[offs])), text.size() - offs);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({index - 1, offs + len == text.size() ? -1 : index + 1, offs, len});
    offs += len;
  }
  return symbols;
}

std::vector<Tokenizer::Fragment> Tokenizer::partition(std::string_view text, bool parse_special) const {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({-1, 0, text.size()});

  // Which special texts occur anywhere in `text`: a text that does not cannot
  // occur in a fragment of it, so skipping it leaves llama.cpp's result as is.
  std::vector<uint8_t> seen(edge_begin_.size() - 1, 0);
  bool any = false;
  for (size_t i = 0; i < text.size(); ++i) {
    int32_t node = root_child_[static_cast<uint8_t>(text[i])];
    for (size_t j = i + 1; node >= 0; ++j) {
      seen[static_cast<size_t>(node)] = 1;
      any = true;
      if (j == text.size()) break;
      const uint8_t c = static_cast<uint8_t>(text[j]);
      const uint32_t end = edge_begin_[static_cast<size_t>(node) + 1];
      uint32_t e = edge_begin_[static_cast<size_t>(node)];
      while (e < end && edge_byte_[e] != c) ++e;
      node = e < end ? edge_child_[e] : -1;
    }
  }
  if (!any) return frags;

  std::vector<Fragment> next;
  for (size_t rank = 0; rank < special_tokens_.size(); ++rank) {
    if (!seen[static_cast<size_t>(special_node_[rank])]) continue;
    const int32_t id = special_tokens_[rank];
    const TokenType type = types_[static_cast<size_t>(id)];
    if (!parse_special && (type == TokenType::Control || type == TokenType::Unknown)) continue;
    const std::string& special = texts_[static_cast<size_t>(id)];
    const uint8_t strip = strip_[static_cast<size_t>(id)];
    next.clear();
    bool changed = false;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t base = f.offset, len = f.length;
      while (len > 0) {
        const size_t match = text.substr(base, len).find(special);
        if (match == std::string_view::npos) break;
        changed = true;
        const size_t pos = base + match;
        size_t left_len = pos - base;
        if (strip & kLstrip)
          while (left_len > 0 && is_c_space(text[base + left_len - 1])) --left_len;
        if (left_len > 0) next.push_back({-1, base, left_len});
        next.push_back({id, 0, 0});
        size_t right = pos + special.size();
        size_t right_len = base + len - right;
        if (strip & kRstrip)
          while (right_len > 0 && is_c_space(text[right])) ++right, --right_len;
        base = right;
        len = right_len;
      }
      if (len > 0) next.push_back({-1, base, len});
    }
    if (changed) frags.swap(next);
  }
  return frags;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  bool drop_space = add_space_prefix_;
  for (int32_t id : ids) {
    std::string piece = token_to_piece(id);
    if (drop_space && !piece.empty()) {
      if (piece[0] == ' ') piece.erase(0, 1);
      drop_space = false;
    }
    out += piece;
  }
  return out;
}

bool Tokenizer::is_eog(int32_t id) const { return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id); }

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const formats::GgufFile& file) {
  VocabSpec spec;
  spec.source = file.path();
  if (!file.has("tokenizer.ggml.model") || !file.has("tokenizer.ggml.tokens"))
    throw Error(spec.source + ": the file holds no tokenizer (tokenizer.ggml.model or tokenizer.ggml.tokens is missing)");
  spec.model = file.get_string("tokenizer.ggml.model");
  spec.pre = file.get_string("tokenizer.ggml.pre", "");
  spec.name = file.get_string("general.name", "");

  spec.texts = file.get_string_array("tokenizer.ggml.tokens");
  const size_t n = spec.texts.size();
  if (file.has("tokenizer.ggml.scores")) {
    const auto scores = file.get_float_array("tokenizer.ggml.scores");
    if (scores.size() != n)
      throw Error(spec.source + ": tokenizer.ggml.scores has " + std::to_string(scores.size()) + " entries for " +
                  std::to_string(n) + " tokens");
    spec.scores.assign(scores.begin(), scores.end());
  }
  if (file.has("tokenizer.ggml.token_type")) {
    const auto types = file.get_int_array("tokenizer.ggml.token_type");
    if (types.size() != n)
      throw Error(spec.source + ": tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                  " entries for " + std::to_string(n) + " tokens");
    spec.types.reserve(n);
    for (int64_t t : types) spec.types.push_back(to_token_type(t));
  }

  // llama.cpp's defaults per model type, then what the file says.
  if (spec.model == "llama") {
    spec.bos = 1, spec.eos = 2, spec.unk = 0;
    spec.add_bos = true, spec.add_space_prefix = true;
  } else if (spec.model == "bert") {
    spec.bos = 101, spec.unk = 100, spec.sep = 102, spec.pad = 0, spec.mask = 103;
    spec.add_bos = true;
  } else if (spec.model == "gpt2") {
    spec.bos = 11, spec.eos = 11;
    if (!file.has("tokenizer.ggml.merges"))
      throw Error(spec.source + ": byte-level BPE vocabulary without tokenizer.ggml.merges");
    const auto merges = file.get_string_array("tokenizer.ggml.merges");
    spec.merges.reserve(merges.size());
    for (const auto& m : merges) {
      const size_t pos = m.find(' ', 1);
      if (pos == std::string::npos) continue;  // llama.cpp keeps an empty pair that never matches
      spec.merges.emplace_back(m.substr(0, pos), m.substr(pos + 1));
    }
    const std::string& p = spec.pre;
    spec.add_bos = p == "llama3" || p == "llama-v3" || p == "llama-bpe" || p == "falcon3" || p == "tekken" ||
                   p == "chameleon";
    spec.ignore_merges = p == "llama3" || p == "llama-v3" || p == "llama-bpe" || p == "falcon3" || p == "tekken";
  } else {
    make_tokenizer(std::move(spec));  // throws: unsupported model
  }
  spec.add_space_prefix = file.get_bool("tokenizer.ggml.add_space_prefix", spec.add_space_prefix);

  const auto read_id = [&](const char* key, int32_t& id) {
    if (!file.has(key)) return;
    const int64_t v = file.get_int(key);
    if (v >= 0 && static_cast<uint64_t>(v) < n) id = static_cast<int32_t>(v);  // else: keep the default, as llama.cpp
  };
  read_id("tokenizer.ggml.bos_token_id", spec.bos);
  read_id("tokenizer.ggml.eos_token_id", spec.eos);
  read_id("tokenizer.ggml.eot_token_id", spec.eot);
  read_id("tokenizer.ggml.eom_token_id", spec.eom);
  read_id("tokenizer.ggml.unknown_token_id", spec.unk);
  read_id("tokenizer.ggml.seperator_token_id", spec.sep);
  read_id("tokenizer.ggml.padding_token_id", spec.pad);
  read_id("tokenizer.ggml.mask_token_id", spec.mask);
  read_id("tokenizer.ggml.fim_pre_token_id", spec.fim_pre);
  read_id("tokenizer.ggml.fim_suf_token_id", spec.fim_suf);
  read_id("tokenizer.ggml.fim_mid_token_id", spec.fim_mid);
  read_id("tokenizer.ggml.fim_pad_token_id", spec.fim_pad);
  read_id("tokenizer.ggml.fim_rep_token_id", spec.fim_rep);
  read_id("tokenizer.ggml.fim_sep_token_id", spec.fim_sep);
  read_id("tokenizer.ggml.prefix_token_id", spec.fim_pre);  // deprecated names
  read_id("tokenizer.ggml.suffix_token_id", spec.fim_suf);
  read_id("tokenizer.ggml.middle_token_id", spec.fim_mid);
  spec.add_bos = file.get_bool("tokenizer.ggml.add_bos_token", spec.add_bos);
  spec.add_eos = file.get_bool("tokenizer.ggml.add_eos_token", spec.add_eos);
  return make_tokenizer(std::move(spec));
}

std::unique_ptr<Tokenizer> Tokenizer::synthetic(int n_vocab) {
  if (n_vocab < 261) throw Error("a synthetic vocabulary needs at least 261 tokens, got " + std::to_string(n_vocab));
  VocabSpec spec;
  spec.source = "synthetic vocabulary";
  spec.model = "llama";
  spec.name = "synthetic";
  spec.texts.reserve(static_cast<size_t>(n_vocab));
  spec.texts = {"<unk>", "<s>", "</s>"};
  spec.types = {TokenType::Unknown, TokenType::Control, TokenType::Control};
  char buf[16];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    spec.texts.emplace_back(buf);
    spec.types.push_back(TokenType::Byte);
  }
  // The space mark as a piece of its own: a space is one token and decodes as ' '.
  spec.texts.emplace_back("\xE2\x96\x81");
  spec.types.push_back(TokenType::Normal);
  // No piece of two or more characters has its prefixes in the vocabulary,
  // so no merge ever forms one: text stays bytes, and these only come from sampling.
  for (int id = static_cast<int>(spec.texts.size()); id < n_vocab; ++id) {
    spec.texts.push_back("<t" + std::to_string(id) + ">");
    spec.types.push_back(TokenType::Normal);
  }
  spec.bos = 1, spec.eos = 2, spec.unk = 0;
  spec.add_bos = true;
  return make_tokenizer(std::move(spec));
}

std::unique_ptr<Tokenizer> Tokenizer::from_llama2c(const formats::Llama2cVocab& vocab) {
  // llama2.c's tokenizer.bin is a SentencePiece vocabulary exported with ' ' for
  // U+2581 and "\n<s>\n" / "\n</s>\n" for BOS/EOS; ids 3..258 are <0x00>..<0xFF>.
  VocabSpec spec;
  spec.source = "llama2.c tokenizer";
  spec.model = "llama";
  const size_t n = vocab.pieces.size();
  if (n < 3) throw Error("llama2.c tokenizer: " + std::to_string(n) + " tokens are too few (need <unk>, <s>, </s>)");
  if (vocab.scores.size() != n)
    throw Error("llama2.c tokenizer: " + std::to_string(vocab.scores.size()) + " scores for " + std::to_string(n) +
                " tokens");
  spec.texts.reserve(n);
  spec.types.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    std::string t = vocab.pieces[i];
    TokenType type = TokenType::Normal;
    if (i == 0) {
      type = TokenType::Unknown;
    } else if (i == 1 || i == 2) {
      type = TokenType::Control;
      t = i == 1 ? "<s>" : "</s>";
    } else if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
               std::isxdigit(static_cast<unsigned char>(t[4]))) {
      type = TokenType::Byte;
    } else {
      std::string esc;
      for (char c : t) {
        if (c == ' ')
          esc += "\xE2\x96\x81";
        else
          esc += c;
      }
      t = std::move(esc);
    }
    spec.texts.push_back(std::move(t));
    spec.types.push_back(type);
  }
  spec.scores = vocab.scores;
  spec.bos = 1, spec.eos = 2, spec.unk = 0;
  spec.add_bos = true, spec.add_space_prefix = true;
  return make_tokenizer(std::move(spec));
}

}  // namespace atelier::tok
