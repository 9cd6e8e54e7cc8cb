// Unicode helpers for the tokenizers (private to engine/src/tokenizer).
// Code point classes, lower-casing and NFD follow llama.cpp's unicode.cpp, with
// the Unicode Character Database facts taken from ICU (libicu); UTF-8 decoding
// is as lenient as llama.cpp's: a byte that does not start a well-formed
// sequence becomes U+FFFD on its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace atelier::tok {

namespace unicode {

enum Flag : uint16_t {
  kUndefined = 0x001,    // Cn
  kNumber = 0x002,       // \p{N}
  kLetter = 0x004,       // \p{L}
  kSeparator = 0x008,    // \p{Z}
  kAccentMark = 0x010,   // \p{M}
  kPunctuation = 0x020,  // \p{P}
  kSymbol = 0x040,       // \p{S}
  kControl = 0x080,      // Cc, Cf, Co, Cs
  kWhitespace = 0x100,   // the White_Space property (includes U+0085)
};

uint16_t flags(uint32_t cpt);  // 0 for values past U+10FFFF
uint32_t to_lower(uint32_t cpt);  // the simple lowercase mapping
uint32_t nfd_base(uint32_t cpt);  // first code point of the canonical decomposition (NFD)

// Length of the UTF-8 sequence that `first` starts (1 for continuation bytes), as llama.cpp.
inline size_t utf8_len(uint8_t first) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[first >> 4];
}
// Decodes the code point at `pos` and advances; on a malformed sequence returns
// U+FFFD and advances one byte.
uint32_t next_cpt(std::string_view text, size_t& pos);
std::vector<uint32_t> to_cpts(std::string_view text);
void append_utf8(std::string& out, uint32_t cpt);
std::string to_utf8(uint32_t cpt);

// GPT-2's bytes_to_unicode: every byte as a printable code point (UTF-8 text).
const std::string& byte_to_symbol(uint8_t byte);
// The byte a byte-level symbol stands for, or -1.
int symbol_to_byte(uint32_t cpt);

}  // namespace unicode
}  // namespace atelier::tok
