#pragma once
// SHA-256 (OpenSSL). Used for block hashes and model digests.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata {

using Sha256Digest = std::array<uint8_t, 32>;

// Incremental hasher. Not thread-safe; one per thread.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(const void* data, size_t len);
  void Update(std::string_view s) { Update(s.data(), s.size()); }
  // Finishes the hash; the object must not be updated afterwards.
  Sha256Digest Finish();

 private:
  void* ctx_;  // EVP_MD_CTX*, kept opaque so this header does not drag OpenSSL in.
};

Sha256Digest Sha256Of(const void* data, size_t len);
std::string ToHex(const uint8_t* data, size_t len);
inline std::string ToHex(const Sha256Digest& d) { return ToHex(d.data(), d.size()); }

// A block hash: strong type over a SHA-256 digest.
struct BlockHash {
  Sha256Digest digest{};
  friend bool operator==(const BlockHash&, const BlockHash&) = default;
};

}  // namespace strata
