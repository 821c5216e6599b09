#include "common/sha256.h"

#include <openssl/evp.h>

#include <cstdlib>

namespace strata {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ == nullptr || EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) != 1) {
    std::abort();  // OpenSSL cannot give us SHA-256: nothing sensible to do.
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::Update(const void* data, size_t len) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, len);
}

Sha256Digest Sha256::Finish() {
  Sha256Digest out{};
  unsigned int n = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), out.data(), &n);
  return out;
}

Sha256Digest Sha256Of(const void* data, size_t len) {
  Sha256 h;
  h.Update(data, len);
  return h.Finish();
}

std::string ToHex(const uint8_t* data, size_t len) {
  static const char* kHex = "0123456789abcdef";
  std::string s(len * 2, '0');
  for (size_t i = 0; i < len; ++i) {
    s[2 * i] = kHex[data[i] >> 4];
    s[2 * i + 1] = kHex[data[i] & 15];
  }
  return s;
}

}  // namespace strata
