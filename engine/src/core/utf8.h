// Well-formed UTF-8 (RFC 3629): what request text must be before it reaches
// a tokenizer or the job database (whose JSON would silently replace the
// bytes, so a queued job would not run the prompt the user gave).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace atelier {

// Offset of the first byte that does not start a well-formed sequence (a
// stray continuation byte, a cut sequence, an overlong form, a surrogate,
// above U+10FFFF, 0xF5..0xFF), or npos when all of S is well formed.
inline size_t first_bad_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<uint8_t>(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    size_t n = 0;
    uint32_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (b >= 0xC2 && b <= 0xDF) n = 1;
    else if (b == 0xE0) n = 2, lo = 0xA0;
    else if (b == 0xED) n = 2, hi = 0x9F;  // no surrogates
    else if (b >= 0xE1 && b <= 0xEF) n = 2;
    else if (b == 0xF0) n = 3, lo = 0x90;
    else if (b >= 0xF1 && b <= 0xF3) n = 3;
    else if (b == 0xF4) n = 3, hi = 0x8F;  // at most U+10FFFF
    else return i;
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return i;
      const auto c = static_cast<uint8_t>(s[i + k]);
      if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return i;
    }
    i += n + 1;
  }
  return std::string_view::npos;
}

}  // namespace atelier
