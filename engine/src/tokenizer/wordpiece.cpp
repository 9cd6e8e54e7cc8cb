// WordPiece ("bert"), as llama.cpp's llm_tokenizer_wpm: NFD-strip accents (each
// code point to the first of its canonical decomposition), lower-case, split at
// white space and around punctuation, ASCII symbols and CJK ideographs, then
// match each word greedily, longest token first. llama.cpp's converter stores
// word-initial pieces with a U+2581 prefix and continuations without "##".
#include "tokenizer_impl.h"
#include "unicode.h"

namespace atelier::tok {

namespace {

bool is_chinese_char(uint32_t cpt) {
  return (cpt >= 0x04E00 && cpt <= 0x09FFF) || (cpt >= 0x03400 && cpt <= 0x04DBF) ||
         (cpt >= 0x20000 && cpt <= 0x2A6DF) || (cpt >= 0x2A700 && cpt <= 0x2B73F) ||
         (cpt >= 0x2B740 && cpt <= 0x2B81F) || (cpt >= 0x2B920 && cpt <= 0x2CEAF) ||  // sic, as HF's rust code
         (cpt >= 0x0F900 && cpt <= 0x0FAFF) || (cpt >= 0x2F800 && cpt <= 0x2FA1F);
}

}  // namespace

WpmTokenizer::WpmTokenizer(VocabSpec& spec) { init_vocab(spec); }

std::vector<std::string> WpmTokenizer::preprocess(std::string_view text) {
  std::vector<std::string> words(1);
  for (size_t pos = 0; pos < text.size();) {
    const uint32_t cpt = unicode::nfd_base(unicode::next_cpt(text, pos));
    const uint16_t fl = unicode::flags(cpt);
    if (fl & unicode::kWhitespace) {
      if (!words.back().empty()) words.emplace_back();
      continue;
    }
    if (cpt == 0 || cpt == 0xFFFD || (fl & unicode::kControl)) continue;
    const std::string s = unicode::to_utf8(unicode::to_lower(cpt));
    if ((fl & unicode::kPunctuation) || (cpt < 0x7F && (fl & unicode::kSymbol)) || is_chinese_char(cpt)) {
      if (!words.back().empty()) words.emplace_back();
      words.back() = s;
      words.emplace_back();
    } else {
      words.back() += s;
    }
  }
  if (words.back().empty()) words.pop_back();
  return words;
}

std::vector<int32_t> WpmTokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  std::vector<int32_t> out;
  if (add_bos && bos_ >= 0) out.push_back(bos_);  // [CLS]
  for (const Fragment& f : partition(text, parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      continue;
    }
    for (const std::string& word : preprocess(text.substr(f.offset, f.length))) {
      if (word.empty()) continue;
      const std::string w = "\xE2\x96\x81" + word;  // the phantom space of a word start
      const size_t n = w.size();
      const size_t before = out.size();
      for (size_t i = 0; i < n; ++i) {
        bool match = false;
        for (size_t j = std::min(n, i + max_token_len_ + 1); j > i; --j) {
          const int32_t id = find_token(std::string_view(w).substr(i, j - i));
          if (id >= 0) {
            out.push_back(id);
            match = true;
            i = j - 1;
            break;
          }
        }
        if (!match) {  // the word has no tokenization: drop what it produced
          out.resize(before);
          break;
        }
      }
      if (out.size() == before && unk_ >= 0) out.push_back(unk_);
    }
  }
  if (add_bos && sep_ >= 0) out.push_back(sep_);  // [SEP]
  return out;
}

std::string WpmTokenizer::token_to_piece(int32_t id) const {
  check_id(id);
  const std::string& text = texts_[static_cast<size_t>(id)];
  switch (types_[static_cast<size_t>(id)]) {
    case TokenType::UserDefined:
      return text;
    case TokenType::Normal:
      return unescape_spm_spaces(text);
    default:
      return {};
  }
}

}  // namespace atelier::tok
