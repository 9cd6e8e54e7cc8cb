// libFuzzer: the restricted pickle reader of torch state dicts (never executes anything).
#include <cstdint>
#include <exception>

#include "formats/pickle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)atelier::formats::pickle::read_state_dict(data, size, "fuzz.pkl");
  } catch (const std::exception&) {
  }
  return 0;
}
