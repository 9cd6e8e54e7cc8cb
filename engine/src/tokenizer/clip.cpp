#include "tokenizer/clip.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace atelier::tok {

namespace {

constexpr const char* kStartText = "<|startoftext|>";
constexpr const char* kEndText = "<|endoftext|>";
constexpr int kMerges = 49152 - 256 - 2;  // the merges openai's loader keeps (lines 1..48894)

std::string read_maybe_gzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files transparently
  if (!f) throw Error(errno_code(errno), path + ": cannot open the CLIP vocabulary");
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      int err = 0;
      const std::string msg = gzerror(f, &err);
      gzclose(f);
      throw Error(path + ": cannot decompress the CLIP vocabulary (" + msg + ")");
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > (64u << 20)) {
      gzclose(f);
      throw Error(path + ": the CLIP vocabulary is implausibly large (over 64 MiB)");
    }
  }
  gzclose(f);
  return out;
}

// NFC then full lower-casing (Python's str.lower), through ICU.
std::string nfc_lower(std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status) || !nfc) throw Error(std::string("ICU NFC data: ") + u_errorName(status));
  icu::UnicodeString s = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  icu::UnicodeString n = nfc->normalize(s, status);
  if (U_FAILURE(status)) throw Error(std::string("ICU NFC: ") + u_errorName(status));
  n.toLower(icu::Locale::getRoot());
  std::string out;
  n.toUTF8String(out);
  return out;
}

bool is_space(uint32_t c) { return (unicode::flags(c) & unicode::kWhitespace) != 0; }
bool is_letter(uint32_t c) { return (unicode::flags(c) & unicode::kLetter) != 0; }
bool is_number(uint32_t c) { return (unicode::flags(c) & unicode::kNumber) != 0; }

// The pre-tokenizer's words of already normalized text (whitespace between
// words is dropped, as regex findall drops it).
std::vector<std::string> split_words(const std::vector<uint32_t>& c) {
  std::vector<std::string> words;
  size_t i = 0;
  auto take = [&](size_t end) {
    std::string w;
    for (size_t k = i; k < end; ++k) unicode::append_utf8(w, c[k]);
    words.push_back(std::move(w));
    i = end;
  };
  while (i < c.size()) {
    if (is_space(c[i])) {
      ++i;
      continue;
    }
    if (c[i] == '\'' && i + 1 < c.size()) {
      const uint32_t a = c[i + 1], b = i + 2 < c.size() ? c[i + 2] : 0;
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        take(i + 3);
        continue;
      }
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        take(i + 2);
        continue;
      }
    }
    size_t j = i + 1;
    if (is_letter(c[i])) {
      while (j < c.size() && is_letter(c[j])) ++j;
    } else if (!is_number(c[i])) {  // a digit is a word of its own
      while (j < c.size() && !is_space(c[j]) && !is_letter(c[j]) && !is_number(c[j])) ++j;
    }
    take(j);
  }
  return words;
}

}  // namespace

std::unique_ptr<ClipTokenizer> ClipTokenizer::open(const std::string& path) {
  const std::string text = read_maybe_gzip(path);
  std::unique_ptr<ClipTokenizer> t(new ClipTokenizer());
  // Byte symbols in bytes_to_unicode's order: printable bytes first, then the rest.
  std::vector<int> order;
  for (int b = 0; b < 256; ++b)
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174)) order.push_back(b);
  for (int b = 0; b < 256; ++b)
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174))) order.push_back(b);
  for (int b : order) t->vocab_.push_back(unicode::byte_to_symbol(static_cast<uint8_t>(b)));
  for (int b : order) t->vocab_.push_back(unicode::byte_to_symbol(static_cast<uint8_t>(b)) + "</w>");
  size_t pos = text.find('\n');  // line 0 is the version header
  int line = 0;
  while (pos != std::string::npos && line < kMerges) {
    const size_t start = pos + 1, end = text.find('\n', start);
    const std::string merge = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    pos = end;
    const size_t sp = merge.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 >= merge.size() || merge.find(' ', sp + 1) != std::string::npos)
      throw Error(path + ": line " + std::to_string(line + 2) + " is not a merge \"LEFT RIGHT\"");
    t->merge_rank_.emplace(merge, line);
    t->vocab_.push_back(merge.substr(0, sp) + merge.substr(sp + 1));
    ++line;
  }
  if (line != kMerges)
    throw Error(path + ": " + std::to_string(line) + " merges, expected " + std::to_string(kMerges) +
                " (not CLIP's bpe_simple_vocab_16e6?)");
  t->vocab_.push_back(kStartText);
  t->vocab_.push_back(kEndText);
  for (size_t i = 0; i < t->vocab_.size(); ++i) t->ids_.emplace(t->vocab_[i], static_cast<int32_t>(i));
  t->start_ = t->ids_.at(kStartText);
  t->end_ = t->ids_.at(kEndText);
  t->comma_ = t->ids_.at(",</w>");
  return t;
}

std::string ClipTokenizer::token_text(int32_t id) const {
  return id >= 0 && id < n_vocab() ? vocab_[static_cast<size_t>(id)] : std::string();
}

void ClipTokenizer::bpe_word(const std::string& word, std::vector<int32_t>& out) const {
  std::vector<std::string> sym;
  for (unsigned char b : word) sym.push_back(unicode::byte_to_symbol(b));
  if (sym.empty()) return;
  sym.back() += "</w>";
  while (sym.size() > 1) {
    int best = INT_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = merge_rank_.find(sym[i] + " " + sym[i + 1]);
      if (it != merge_rank_.end() && it->second < best) best = it->second, at = i;
    }
    if (best == INT_MAX) break;
    // Merge every occurrence of the best pair, left to right.
    const std::string left = sym[at], right = sym[at + 1];
    std::vector<std::string> next;
    for (size_t i = 0; i < sym.size();) {
      if (i + 1 < sym.size() && sym[i] == left && sym[i + 1] == right) {
        next.push_back(left + right);
        i += 2;
      } else {
        next.push_back(sym[i++]);
      }
    }
    sym = std::move(next);
  }
  for (const auto& s : sym) {
    auto it = ids_.find(s);
    if (it == ids_.end()) throw Error("CLIP tokenizer: no id for the symbol \"" + s + "\"");  // every byte has one
    out.push_back(it->second);
  }
}

std::vector<int32_t> ClipTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  // Special-token texts first (Hugging Face's added tokens), then the pieces between.
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t next = std::string_view::npos, len = 0;
    int32_t id = 0;
    for (const auto& [s, sid] : {std::pair<std::string_view, int32_t>{kStartText, start_}, {kEndText, end_}}) {
      const size_t f = text.find(s, pos);
      if (f < next) next = f, len = s.size(), id = sid;
    }
    const std::string_view piece = text.substr(pos, next == std::string_view::npos ? std::string_view::npos : next - pos);
    const std::vector<uint32_t> cpts = unicode::to_cpts(nfc_lower(piece));
    for (const std::string& w : split_words(cpts)) bpe_word(w, out);
    if (next == std::string_view::npos) break;
    out.push_back(id);
    pos = next + len;
  }
  return out;
}

std::vector<int32_t> ClipTokenizer::encode_with_specials(std::string_view text) const {
  std::vector<int32_t> out{start_};
  const auto ids = encode(text);
  out.insert(out.end(), ids.begin(), ids.end());
  out.push_back(end_);
  return out;
}

std::array<int32_t, ClipTokenizer::kContext> ClipTokenizer::encode_padded(std::string_view text, int32_t pad_id) const {
  std::array<int32_t, kContext> out;
  out.fill(pad_id);
  const auto ids = encode(text);
  const size_t n = std::min<size_t>(ids.size(), kChunkTokens);
  out[0] = start_;
  std::copy_n(ids.begin(), n, out.begin() + 1);
  out[n + 1] = end_;
  return out;
}

// ---- A1111 emphasis and chunking ---------------------------------------------

std::vector<PromptFragment> parse_prompt_attention(std::string_view p) {
  std::vector<PromptFragment> res;
  std::vector<size_t> round, square;
  auto multiply = [&](size_t from, double m) {
    for (size_t i = from; i < res.size(); ++i) res[i].weight = static_cast<float>(res[i].weight * m);
  };
  // Plain text: BREAK (a whole upper-case word, surrounding spaces eaten) splits it.
  auto add_text = [&](std::string_view t) {
    size_t start = 0;
    for (size_t i = 0; i + 5 <= t.size(); ++i) {
      const bool word_start = i == 0 || !(std::isalnum(static_cast<unsigned char>(t[i - 1])) || t[i - 1] == '_');
      const bool word_end = i + 5 == t.size() || !(std::isalnum(static_cast<unsigned char>(t[i + 5])) || t[i + 5] == '_');
      if (!word_start || !word_end || t.compare(i, 5, "BREAK") != 0) continue;
      size_t a = i, b = i + 5;
      while (a > start && std::isspace(static_cast<unsigned char>(t[a - 1]))) --a;
      while (b < t.size() && std::isspace(static_cast<unsigned char>(t[b]))) ++b;
      res.push_back({std::string(t.substr(start, a - start)), 1.0f, false});
      res.push_back({"", -1.0f, true});
      start = b;
      i = b > 0 ? b - 1 : 0;
    }
    res.push_back({std::string(t.substr(start)), 1.0f, false});
  };
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\') {  // an escaped character is literal; a lone trailing backslash is dropped
      if (i + 1 < p.size() && std::string_view("()[]\\").find(p[i + 1]) != std::string_view::npos) {
        res.push_back({std::string(1, p[i + 1]), 1.0f, false});
        i += 2;
      } else {
        res.push_back({"", 1.0f, false});
        i += 1;
      }
    } else if (c == '(') {
      round.push_back(res.size());
      ++i;
    } else if (c == '[') {
      square.push_back(res.size());
      ++i;
    } else if (c == ':') {
      // ":" spaces number spaces ")" closes the innermost "(" with that weight.
      size_t j = i + 1;
      while (j < p.size() && std::isspace(static_cast<unsigned char>(p[j]))) ++j;
      size_t k = j;
      if (k < p.size() && (p[k] == '+' || p[k] == '-')) ++k;
      const size_t digits = k;
      while (k < p.size() && (std::isdigit(static_cast<unsigned char>(p[k])) || p[k] == '.')) ++k;
      size_t e = k;
      while (e < p.size() && std::isspace(static_cast<unsigned char>(p[e]))) ++e;
      if (k > digits && e < p.size() && p[e] == ')' && !round.empty()) {
        const double w = std::strtod(std::string(p.substr(j, k - j)).c_str(), nullptr);
        multiply(round.back(), w);
        round.pop_back();
        i = e + 1;
      } else if (k > digits && e < p.size() && p[e] == ')') {
        add_text(p.substr(i, e + 1 - i));  // a weight with nothing to apply to stays text
        i = e + 1;
      } else {
        add_text(":");
        ++i;
      }
    } else if (c == ')' && !round.empty()) {
      multiply(round.back(), 1.1);
      round.pop_back();
      ++i;
    } else if (c == ']' && !square.empty()) {
      multiply(square.back(), 1 / 1.1);
      square.pop_back();
      ++i;
    } else if (c == ')' || c == ']') {
      add_text(std::string_view(&p[i], 1));
      ++i;
    } else {
      size_t j = i;
      while (j < p.size() && std::string_view("\\()[]:").find(p[j]) == std::string_view::npos) ++j;
      add_text(p.substr(i, j - i));
      i = j;
    }
  }
  for (size_t pos : round) multiply(pos, 1.1);
  for (size_t pos : square) multiply(pos, 1 / 1.1);
  if (res.empty()) res.push_back({"", 1.0f, false});
  // Merge neighbours of equal weight (BREAKs never merge: weight -1 only meets text of other weights
  // or another BREAK, which stays separate).
  std::vector<PromptFragment> merged;
  for (auto& f : res) {
    if (!merged.empty() && !f.is_break && !merged.back().is_break && merged.back().weight == f.weight)
      merged.back().text += f.text;
    else
      merged.push_back(std::move(f));
  }
  return merged;
}

std::vector<PromptChunk> tokenize_weighted(const ClipTokenizer& tok, std::string_view prompt, int32_t pad_id,
                                           int comma_backtrack) {
  constexpr int kLen = ClipTokenizer::kChunkTokens;
  std::vector<PromptChunk> chunks;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  int last_comma = -1;
  auto next_chunk = [&]() {
    PromptChunk c;
    c.ids.fill(pad_id);
    c.weights.fill(1.0f);
    c.ids[0] = tok.start_id();
    std::copy(ids.begin(), ids.end(), c.ids.begin() + 1);
    std::copy(weights.begin(), weights.end(), c.weights.begin() + 1);
    c.ids[ids.size() + 1] = tok.end_id();
    chunks.push_back(c);
    ids.clear();
    weights.clear();
    last_comma = -1;
  };
  for (const auto& frag : parse_prompt_attention(prompt)) {
    if (frag.is_break) {
      next_chunk();
      continue;
    }
    for (int32_t t : tok.encode(frag.text)) {
      if (t == tok.comma_id()) {
        last_comma = static_cast<int>(ids.size());
      } else if (comma_backtrack > 0 && static_cast<int>(ids.size()) == kLen && last_comma != -1 &&
                 kLen - last_comma <= comma_backtrack) {
        // Move the words after the last comma into the next chunk.
        std::vector<int32_t> moved_ids(ids.begin() + last_comma + 1, ids.end());
        std::vector<float> moved_w(weights.begin() + last_comma + 1, weights.end());
        ids.resize(static_cast<size_t>(last_comma + 1));
        weights.resize(static_cast<size_t>(last_comma + 1));
        next_chunk();
        ids = std::move(moved_ids);
        weights = std::move(moved_w);
      }
      if (static_cast<int>(ids.size()) == kLen) next_chunk();
      ids.push_back(t);
      weights.push_back(frag.weight);
    }
  }
  if (!ids.empty() || chunks.empty()) next_chunk();
  return chunks;
}

}  // namespace atelier::tok
