#include "core/sha256.h"

// OpenSSL's one-algorithm SHA-256 API (deprecated in 3.0, kept through 3.x):
// the same SHA-NI/AVX2 code as EVP without starting OpenSSL's provider
// machinery, which leaves ~2 MB more resident. The header gives the types;
// the functions come from dlsym.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

#include <atelier/store.h>

#include "core/dynamic_library.h"
#include "core/error.h"

namespace atelier {

namespace {

static_assert(sizeof(SHA256_CTX) <= 112, "Sha256::ctx_ is smaller than this OpenSSL's SHA256_CTX");

struct CryptoApi {
  int (*init)(SHA256_CTX*);
  int (*update)(SHA256_CTX*, const void*, size_t);
  int (*final)(unsigned char*, SHA256_CTX*);
};

const CryptoApi& crypto() {
  static std::string error;
  static const CryptoApi* api = []() -> const CryptoApi* {
    std::string why;
    void* lib = open_system_library({"libcrypto.so.3", "libcrypto.so"}, &why);
    if (!lib) {
      error = "cannot load OpenSSL's libcrypto to compute SHA-256 digests (" + why +
              "); install it (Debian: apt-get install libssl3)";
      return nullptr;
    }
    static CryptoApi a;
    const auto sym = [&](auto& fn, const char* name) {
      if (!bind_symbol(lib, fn, name) && error.empty()) error = std::string("the libcrypto found lacks ") + name + "; install OpenSSL 3 (libssl3)";
    };
    sym(a.init, "SHA256_Init");
    sym(a.update, "SHA256_Update");
    sym(a.final, "SHA256_Final");
    return error.empty() ? &a : nullptr;
  }();
  if (!api) throw IoError(error);
  return *api;
}

SHA256_CTX* ctx_of(unsigned char* bytes) { return reinterpret_cast<SHA256_CTX*>(bytes); }

}  // namespace

Sha256::Sha256() {
  if (crypto().init(ctx_of(ctx_)) != 1) throw IoError("cannot start a SHA-256 digest (OpenSSL)");
}

void Sha256::update(const void* data, size_t n) {
  if (crypto().update(ctx_of(ctx_), data, n) != 1) throw IoError("SHA-256 update failed (OpenSSL)");
}

std::string Sha256::hex() {
  unsigned char md[SHA256_DIGEST_LENGTH];
  if (crypto().final(md, ctx_of(ctx_)) != 1) throw IoError("SHA-256 final failed (OpenSSL)");
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * SHA256_DIGEST_LENGTH);
  for (unsigned char b : md) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

Result<std::string> sha256_hex(std::string_view bytes) {
  try {
    Sha256 sha;
    sha.update(bytes.data(), bytes.size());
    return sha.hex();
  } catch (const Error& e) {
    return Status::error(e.code(), e.what());
  }
}

}  // namespace atelier
