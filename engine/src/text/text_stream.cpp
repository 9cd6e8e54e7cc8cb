#include "text/text_stream.h"

#include <algorithm>

namespace atelier::text {

namespace {
// Length of the longest suffix of `s` that is a proper prefix of some stop string.
size_t stop_prefix_holdback(const std::string& s, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& stop : stops) {
    for (size_t len = std::min(stop.size() - 1, s.size()); len > hold; --len) {
      if (s.compare(s.size() - len, len, stop, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  return hold;
}

// Bytes at the end of s[0, end) that form an incomplete UTF-8 sequence.
size_t incomplete_utf8_tail(const std::string& s, size_t end) {
  for (size_t back = 1; back <= 4 && back <= end; ++back) {
    const unsigned char c = static_cast<unsigned char>(s[end - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    const size_t need = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    return need > back ? back : 0;
  }
  return 0;
}
}  // namespace

std::string TextStream::push(const std::string& piece) {
  if (stopped()) return {};
  all_ += piece;
  // A stop string cannot start before released_: any text that could begin one is held back.
  for (const auto& stop : stops_) {
    const size_t at = all_.find(stop, released_);
    if (at != std::string::npos && at < stop_at_) stop_at_ = at;
  }
  size_t end = all_.size();
  if (stopped()) {
    end = stop_at_;
  } else {
    end -= stop_prefix_holdback(all_, stops_);
    end -= incomplete_utf8_tail(all_, end);
  }
  if (end <= released_) return {};
  std::string out = all_.substr(released_, end - released_);
  released_ = end;
  return out;
}

}  // namespace atelier::text
