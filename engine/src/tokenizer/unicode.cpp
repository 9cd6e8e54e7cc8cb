#include "unicode.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <array>
#include <stdexcept>

namespace atelier::tok::unicode {

namespace {

// The general category as llama.cpp's classes.
uint16_t category_flags(int8_t category) {
  switch (category) {
    case U_UNASSIGNED:  // Cn
      return kUndefined;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return kNumber;
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return kLetter;
    case U_SPACE_SEPARATOR:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
      return kSeparator;
    case U_NON_SPACING_MARK:
    case U_COMBINING_SPACING_MARK:
    case U_ENCLOSING_MARK:
      return kAccentMark;
    case U_CONNECTOR_PUNCTUATION:
    case U_DASH_PUNCTUATION:
    case U_START_PUNCTUATION:
    case U_END_PUNCTUATION:
    case U_INITIAL_PUNCTUATION:
    case U_FINAL_PUNCTUATION:
    case U_OTHER_PUNCTUATION:
      return kPunctuation;
    case U_MATH_SYMBOL:
    case U_CURRENCY_SYMBOL:
    case U_MODIFIER_SYMBOL:
    case U_OTHER_SYMBOL:
      return kSymbol;
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_PRIVATE_USE_CHAR:
    case U_SURROGATE:
      return kControl;
    default:
      return 0;
  }
}

const icu::Normalizer2& nfd() {
  static const icu::Normalizer2& n = []() -> const icu::Normalizer2& {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* p = icu::Normalizer2::getNFDInstance(status);
    if (U_FAILURE(status) || !p) throw std::runtime_error(std::string("ICU NFD data: ") + u_errorName(status));
    return *p;
  }();
  return n;
}

}  // namespace

uint16_t flags(uint32_t cpt) {
  if (cpt > 0x10FFFF) return 0;
  const auto c = static_cast<UChar32>(cpt);
  // White_Space is exactly llama.cpp's explicit list: U+0009..000D, 0020, 0085, 00A0,
  // 1680, 2000..200A, 2028, 2029, 202F, 205F, 3000.
  return category_flags(u_charType(c)) | (u_isUWhiteSpace(c) ? kWhitespace : 0);
}

uint32_t to_lower(uint32_t cpt) {
  if (cpt < 0x80) return (cpt >= 'A' && cpt <= 'Z') ? cpt + 32 : cpt;
  if (cpt > 0x10FFFF) return cpt;
  return static_cast<uint32_t>(u_tolower(static_cast<UChar32>(cpt)));
}

uint32_t nfd_base(uint32_t cpt) {
  if (cpt < 0xC0 || cpt > 0x10FFFF) return cpt;
  icu::UnicodeString decomposition;
  if (!nfd().getDecomposition(static_cast<UChar32>(cpt), decomposition) || decomposition.isEmpty()) return cpt;
  return static_cast<uint32_t>(decomposition.char32At(0));
}

uint32_t next_cpt(std::string_view s, size_t& pos) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t c0 = b(pos);
  if (!(c0 & 0x80)) {
    pos += 1;
    return c0;
  }
  const auto cont = [&](size_t i) { return pos + i < s.size() && (b(pos + i) & 0xC0) == 0x80; };
  if ((c0 & 0xE0) == 0xC0) {
    if (cont(1)) {
      uint32_t r = ((c0 & 0x1Fu) << 6) | (b(pos + 1) & 0x3Fu);
      pos += 2;
      return r;
    }
  } else if ((c0 & 0xF0) == 0xE0) {
    if (cont(1) && cont(2)) {
      uint32_t r = ((c0 & 0x0Fu) << 12) | ((b(pos + 1) & 0x3Fu) << 6) | (b(pos + 2) & 0x3Fu);
      pos += 3;
      return r;
    }
  } else if ((c0 & 0xF8) == 0xF0) {
    if (cont(1) && cont(2) && cont(3)) {
      uint32_t r = ((c0 & 0x07u) << 18) | ((b(pos + 1) & 0x3Fu) << 12) | ((b(pos + 2) & 0x3Fu) << 6) |
                   (b(pos + 3) & 0x3Fu);
      pos += 4;
      return r;
    }
  }
  pos += 1;
  return 0xFFFD;
}

std::vector<uint32_t> to_cpts(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) out.push_back(next_cpt(text, pos));
  return out;
}

void append_utf8(std::string& out, uint32_t cpt) {
  if (cpt < 0x80) {
    out.push_back(static_cast<char>(cpt));
  } else if (cpt < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | ((cpt >> 18) & 0x07)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

std::string to_utf8(uint32_t cpt) {
  std::string s;
  append_utf8(s, cpt);
  return s;
}

namespace {
struct ByteTables {
  std::array<std::string, 256> symbol;
  std::array<uint32_t, 256> cpt{};
  ByteTables() {
    // printable Latin-1 bytes stand for themselves; the rest map to U+0100 onwards, in byte order
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      cpt[b] = printable ? b : next++;
      symbol[b] = to_utf8(cpt[b]);
    }
  }
};
const ByteTables& byte_tables() {
  static const ByteTables t;
  return t;
}
}  // namespace

const std::string& byte_to_symbol(uint8_t byte) { return byte_tables().symbol[byte]; }

int symbol_to_byte(uint32_t cpt) {
  if (cpt < 256) {
    const bool printable = (cpt >= 0x21 && cpt <= 0x7E) || (cpt >= 0xA1 && cpt <= 0xAC) || (cpt >= 0xAE);
    return printable ? static_cast<int>(cpt) : -1;
  }
  if (cpt < 256 + 68) {  // 68 non-printable bytes
    const auto& t = byte_tables().cpt;
    for (int b = 0; b < 256; ++b)
      if (t[b] == cpt) return b;
  }
  return -1;
}

}  // namespace atelier::tok::unicode
