// libFuzzer: the zip reader (end of central directory, entries, local headers, bounds).
#include <cstdint>
#include <exception>

#include "formats/zip_archive.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)atelier::formats::looks_like_zip(data, size);
    atelier::formats::ZipArchive zip(data, size, "fuzz.zip");
    for (const auto& e : zip.entries()) {
      try {
        (void)zip.read(e.name);
      } catch (const std::exception&) {
      }
    }
  } catch (const std::exception&) {
  }
  return 0;
}
