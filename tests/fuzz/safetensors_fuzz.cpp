// libFuzzer: the safetensors reader (length prefix, JSON header, tensor bounds).
#include <cstdint>
#include <exception>

#include "formats/safetensors.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = atelier::formats::SafetensorsFile::open(atelier::fuzz::write_scratch(data, size));
    for (const auto& t : f->tensors()) (void)f->find_tensor(t.name);
  } catch (const std::exception&) {
  }
  return 0;
}
