// libFuzzer: the GGUF reader (header, metadata, tensor table) and the typed getters on what it read.
#include <cstdint>
#include <exception>

#include "formats/gguf.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = atelier::formats::GgufFile::open(atelier::fuzz::write_scratch(data, size));
    for (const auto& [key, value] : f->metadata()) {
      try {
        (void)f->get_string(key, "");
      } catch (const std::exception&) {
      }
      try {
        (void)f->get_int(key, 0);
      } catch (const std::exception&) {
      }
    }
  } catch (const std::exception&) {
    // A refused file is the expected outcome; a crash or a sanitizer report is the bug.
  }
  return 0;
}
