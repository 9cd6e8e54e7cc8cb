// SHA-256 from the system's libcrypto, opened on the first digest: linking it
// left ~3 MB resident in every process, hashing or not (bench text, a
// one-shot `atelier text`). Throws IoError when libcrypto cannot be loaded.
#pragma once

#include <cstddef>
#include <string>

namespace atelier {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::string hex();  // the digest as 64 lower-case hex digits; the object is spent

 private:
  // OpenSSL's SHA256_CTX (8 + 16 words, a block and two counters: 112 bytes);
  // its size is checked against the library's header in sha256.cpp.
  alignas(8) unsigned char ctx_[112];
};

}  // namespace atelier
