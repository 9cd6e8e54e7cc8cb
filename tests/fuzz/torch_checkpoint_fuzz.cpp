// libFuzzer: a whole .ckpt/.pth as torch.save writes it (zip + pickle + tensor records).
#include <cstdint>
#include <exception>

#include "formats/pickle.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)atelier::formats::TorchCheckpoint::open(atelier::fuzz::write_scratch(data, size));
  } catch (const std::exception&) {
  }
  return 0;
}
