// libFuzzer: the JSON form of requests (batch lines, the job database): text
// and image. Whatever parses must survive a round trip unchanged.
#include <atelier/requests.h>

#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (atelier::is_image_request_json(text)) {
    auto r = atelier::image_request_from_json(text);
    if (r.ok()) {
      const std::string once = atelier::image_request_to_json(r.value());
      auto again = atelier::image_request_from_json(once);
      if (!again.ok() || atelier::image_request_to_json(again.value()) != once) __builtin_trap();
    }
  } else {
    auto r = atelier::request_from_json(text);
    if (r.ok()) {
      const std::string once = atelier::request_to_json(r.value());
      auto again = atelier::request_from_json(once);
      if (!again.ok() || atelier::request_to_json(again.value()) != once) __builtin_trap();
    }
  }
  return 0;
}
