// libFuzzer: PNG chunk parsing (IHDR, tEXt, iTXt) as PNG Info reads generation parameters.
#include <cstdint>
#include <exception>
#include <vector>

#include "image/png.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)atelier::image::read_png_info(std::vector<uint8_t>(data, data + size));
  } catch (const std::exception&) {
  }
  return 0;
}
