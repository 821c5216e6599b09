#include "kvcache/block_hash.h"

#include <string>

namespace strata::kvcache {
namespace {

void PutU32Le(Sha256& h, uint32_t v) {
  const uint8_t b[4] = {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8),
                        static_cast<uint8_t>(v >> 16), static_cast<uint8_t>(v >> 24)};
  h.Update(b, sizeof(b));
}

void PutField(Sha256& h, std::string_view s) {
  PutU32Le(h, static_cast<uint32_t>(s.size()));
  h.Update(s);
}

}  // namespace

Sha256Digest NamespaceDigest(std::string_view weights_digest_hex, std::string_view arch,
                             std::string_view kv_dtype, int block_size,
                             std::string_view layout_version) {
  Sha256 h;
  h.Update(std::string_view("strata-kv-namespace-v1"));
  PutField(h, weights_digest_hex);
  PutField(h, arch);
  PutField(h, kv_dtype);
  PutField(h, std::to_string(block_size));
  PutField(h, layout_version);
  return h.Finish();
}

BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens,
                    std::span<const uint8_t> extra) {
  Sha256 h;
  h.Update(parent.digest.data(), parent.digest.size());
  for (int32_t t : tokens) PutU32Le(h, static_cast<uint32_t>(t));
  if (!extra.empty()) h.Update(extra.data(), extra.size());
  return BlockHash{h.Finish()};
}

void ExtendHashChain(const Sha256Digest& ns, std::span<const int32_t> tokens, int block_size,
                     std::string_view cache_salt, std::vector<BlockHash>* chain) {
  const size_t bs = static_cast<size_t>(block_size);
  const size_t full = tokens.size() / bs;
  chain->reserve(full);
  for (size_t i = chain->size(); i < full; ++i) {
    std::span<const uint8_t> extra;
    if (i == 0) {
      extra = {reinterpret_cast<const uint8_t*>(cache_salt.data()), cache_salt.size()};
    }
    const BlockHash parent = i == 0 ? NamespaceParent(ns) : (*chain)[i - 1];
    chain->push_back(HashBlock(parent, tokens.subspan(i * bs, bs), extra));
  }
}

std::vector<BlockHash> HashPrefix(const Sha256Digest& ns, std::span<const int32_t> tokens,
                                  int block_size, std::string_view cache_salt) {
  std::vector<BlockHash> chain;
  ExtendHashChain(ns, tokens, block_size, cache_salt, &chain);
  return chain;
}

}  // namespace strata::kvcache
