// SentencePiece-style tokenizer ("llama"), as llama.cpp's llm_tokenizer_spm:
// spaces become U+2581, a space is put before the text (and after every
// special token) when the vocabulary adds a space prefix (not Gemma 3), then
// adjacent symbols are merged by the score of the merged piece, highest first;
// characters that are no piece fall back to <0xNN>.
#include <cctype>
#include <queue>

#include "tokenizer_impl.h"
#include "unicode.h"

namespace atelier::tok {

namespace {

using Symbol = MergeSymbol;  // offsets into the escaped text

struct Bigram {
  int left, right;
  float score;
  size_t size;
};

struct BigramLess {  // the queue's top: highest score, then leftmost
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  }
};

}  // namespace

std::string unescape_spm_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 3, "\xE2\x96\x81") == 0) {
      out += ' ';
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

SpmTokenizer::SpmTokenizer(VocabSpec& spec) {
  init_vocab(spec);
  byte_ids_.assign(256, -1);
  static const char* kHex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const char name[7] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>', 0};
    int32_t id = find_token(name);
    if (id < 0) id = find_token(std::string(1, static_cast<char>(b)));
    byte_ids_[static_cast<size_t>(b)] = id;
  }
}

int32_t SpmTokenizer::byte_token(uint8_t byte) const {
  const int32_t id = byte_ids_[byte];
  return id >= 0 ? id : unk_;
}

void SpmTokenizer::encode_fragment(const std::string& text, std::vector<int32_t>& out) const {
  std::vector<Symbol> symbols = split_symbols(text);
  const std::string_view view(text);

  std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue;
  const auto try_add = [&](int left, int right) {
    if (left == -1 || right == -1) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const Symbol& r = symbols[static_cast<size_t>(right)];
    const int32_t id = find_token(view.substr(l.offset, l.n + r.n));
    if (id < 0) return;
    queue.push({left, right, scores_[static_cast<size_t>(id)], l.n + r.n});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(bigram.left)];
    Symbol& right = symbols[static_cast<size_t>(bigram.right)];
    if (left.n == 0 || right.n == 0 || left.n + right.n != bigram.size) continue;  // outdated
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = bigram.left;
    try_add(left.prev, bigram.left);
    try_add(bigram.left, left.next);
  }

  // A merged symbol is a token (a pair merges only into one), so a symbol that
  // is not is a single character outside the vocabulary: its bytes. (llama.cpp
  // looks such a symbol up among the merges first, keyed by text; the merges
  // are all tokens, so it never finds one.)
  for (int i = symbols.empty() ? -1 : 0; i != -1; i = symbols[static_cast<size_t>(i)].next) {
    const Symbol& sym = symbols[static_cast<size_t>(i)];
    const std::string_view piece = view.substr(sym.offset, sym.n);
    const int32_t id = find_token(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (char c : piece) {
      const int32_t b = byte_token(static_cast<uint8_t>(c));
      if (b >= 0) out.push_back(b);
    }
  }
}

std::vector<int32_t> SpmTokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  std::vector<int32_t> out;
  if (add_bos && add_bos_) out.push_back(bos_);
  bool prev_special = true;  // the first text gets the space prefix
  for (const Fragment& f : partition(text, parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    std::string escaped;
    escaped.reserve(f.length * 3 + 3);
    if (add_space_prefix_ && prev_special) escaped += "\xE2\x96\x81";
    for (char c : text.substr(f.offset, f.length)) {
      if (c == ' ')
        escaped += "\xE2\x96\x81";
      else
        escaped += c;
    }
    encode_fragment(escaped, out);
    prev_special = false;
  }
  if (add_bos && add_eos_) out.push_back(eos_);
  return out;
}

std::string SpmTokenizer::token_to_piece(int32_t id) const {
  check_id(id);
  const std::string& text = texts_[static_cast<size_t>(id)];
  switch (types_[static_cast<size_t>(id)]) {
    case TokenType::UserDefined:
      return text;
    case TokenType::Normal:
      return unescape_spm_spaces(text);
    case TokenType::Byte:
      if (text.size() == 6 && text.compare(0, 3, "<0x") == 0 && std::isxdigit(static_cast<unsigned char>(text[3])) &&
          std::isxdigit(static_cast<unsigned char>(text[4])))
        return std::string(1, static_cast<char>(std::stoi(text.substr(3, 2), nullptr, 16)));
      return text.size() == 1 ? text : std::string();
    default:  // control, unknown, unused, undefined
      return {};
  }
}

}  // namespace atelier::tok
