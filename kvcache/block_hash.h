#pragma once
// Block identity (DESIGN.md decision 2).
//
//   namespace = SHA-256("strata-kv-namespace-v1" ‖ field...) where each field
//               (weights digest hex, architecture, KV dtype name, block size
//               as decimal text, layout version) is written as its length
//               (u32 LE) followed by its bytes, so no two field lists collide.
//   hash_0    = SHA-256(namespace ‖ tokens_0 as u32 LE ‖ cache_salt)
//   hash_i    = SHA-256(hash_{i-1} ‖ tokens_i as u32 LE)              (i > 0)
//
// Only full blocks have hashes. Every block has exactly block_size tokens and
// block_size is folded into the namespace, so the token bytes and the extra
// bytes that follow them cannot be confused. The result depends on nothing
// but these inputs: it is the same in every process and after restarts.
//
// Thread-safety: all functions are pure and thread-safe.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "common/sha256.h"

namespace strata::kvcache {

// Version of the block-major layout (model/backend/kv_layout.h). Bump when the
// bytes inside a block change meaning, so old cached blocks stop matching.
inline constexpr std::string_view kKvLayoutVersion = "block-major-v1";

Sha256Digest NamespaceDigest(std::string_view weights_digest_hex, std::string_view arch,
                             std::string_view kv_dtype, int block_size,
                             std::string_view layout_version = kKvLayoutVersion);

// The namespace as the parent of the first block.
inline BlockHash NamespaceParent(const Sha256Digest& ns) { return BlockHash{ns}; }

// SHA-256(parent ‖ tokens as u32 LE ‖ extra).
BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens,
                    std::span<const uint8_t> extra = {});

// Hashes of the full blocks of `tokens` (tokens.size() / block_size of them),
// chained from `ns`; `cache_salt` (may be empty) is the first block's extra.
// REQUIRES: block_size > 0.
std::vector<BlockHash> HashPrefix(const Sha256Digest& ns, std::span<const int32_t> tokens,
                                  int block_size, std::string_view cache_salt = {});

// Appends to `chain` the hashes of full blocks of `tokens` beyond those
// already in it (tokens must start with the tokens `chain` was built from).
// Lets a request extend its chain as generation fills blocks.
void ExtendHashChain(const Sha256Digest& ns, std::span<const int32_t> tokens, int block_size,
                     std::string_view cache_salt, std::vector<BlockHash>* chain);

// For unordered containers: the digest's first 8 bytes (already uniform).
struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const noexcept {
    size_t v;
    std::memcpy(&v, h.digest.data(), sizeof(v));
    return v;
  }
};

}  // namespace strata::kvcache
