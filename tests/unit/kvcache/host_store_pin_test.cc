// HostStore for the cluster pool: each stored block carries the XXH3 of its
// bytes (Locate), a pinned block is never evicted and its bytes stay put
// even when it is removed meanwhile, and the change listener reports every
// block that becomes or stops being readable (the holders' KV events).

#include <gtest/gtest.h>
#include <xxhash.h>

#include "kvcache/host_store.h"
#include "tests/support/test_memory.h"

namespace strata::kvcache {
namespace {

constexpr uint64_t kBlock = 64;

BlockHash H(int i) {
  BlockHash h;
  h.digest[0] = static_cast<uint8_t>(i);
  h.digest[7] = 0x5a;
  return h;
}

std::vector<uint8_t> Bytes(int seed) {
  std::vector<uint8_t> b(kBlock);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(seed * 13 + i * 3);
  return b;
}

std::unique_ptr<HostStore> Make(uint64_t blocks) {
  auto s = HostStore::Create({blocks * kBlock, kBlock, false});
  EXPECT_TRUE(s.ok());
  testing::AttachToTestSegments(s->get());
  return std::move(s).value();
}

void Write(HostStore* s, int i) {
  auto data = Bytes(i);
  ASSERT_TRUE(s->SubmitWrite(H(i), Sha256Digest{}, testing::RegionOf(data), static_cast<uint64_t>(i)).ok());
  std::vector<StoreCompletion> done;
  s->Poll(&done);
}

TEST(HostStorePinTest, LocateGivesTheSlotAndTheChecksumOfItsBytes) {
  auto s = Make(4);
  Write(s.get(), 1);
  auto loc = s->Locate(H(1));
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(loc->region.length, kBlock);
  auto bytes = testing::TestSegments().Resolve(loc->region);
  ASSERT_TRUE(bytes.ok());
  const auto want = Bytes(1);
  EXPECT_TRUE(std::equal(bytes->begin(), bytes->end(), want.begin()));
  EXPECT_EQ(loc->checksum, XXH3_64bits(want.data(), want.size()));
  EXPECT_FALSE(s->Locate(H(2)).has_value());
}

TEST(HostStorePinTest, APinnedBlockIsNeverEvicted) {
  auto s = Make(2);
  Write(s.get(), 1);
  Write(s.get(), 2);
  ASSERT_TRUE(s->Pin(H(1)));  // 1 is the LRU victim, but pinned
  Write(s.get(), 3);          // evicts 2 instead
  EXPECT_TRUE(s->Contains(H(1)));
  EXPECT_FALSE(s->Contains(H(2)));
  ASSERT_TRUE(s->Pin(H(3)));
  // Every slot pinned: a write fails rather than evicting.
  auto data = Bytes(4);
  ASSERT_TRUE(s->SubmitWrite(H(4), Sha256Digest{}, testing::RegionOf(data), 4).ok());
  std::vector<StoreCompletion> done;
  s->Poll(&done);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].status.ok());
  s->Unpin(H(1));
  s->Unpin(H(3));
  Write(s.get(), 4);  // now one of them goes
  EXPECT_TRUE(s->Contains(H(4)));
  EXPECT_EQ(s->pinned_slots(), 0u);
}

TEST(HostStorePinTest, ARemovedPinnedBlockKeepsItsBytesUntilUnpinned) {
  auto s = Make(1);
  Write(s.get(), 1);
  auto loc = s->Locate(H(1));
  ASSERT_TRUE(loc && s->Pin(H(1)));
  ASSERT_TRUE(s->Remove(H(1)).ok());
  EXPECT_FALSE(s->Contains(H(1)));
  // The only slot is still being read: a new block cannot take it.
  auto data = Bytes(2);
  ASSERT_TRUE(s->SubmitWrite(H(2), Sha256Digest{}, testing::RegionOf(data), 2).ok());
  std::vector<StoreCompletion> done;
  s->Poll(&done);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].status.ok());
  auto bytes = testing::TestSegments().Resolve(loc->region);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(XXH3_64bits(bytes->data(), bytes->size()), loc->checksum) << "untouched while pinned";
  s->Unpin(H(1));
  Write(s.get(), 2);
  EXPECT_TRUE(s->Contains(H(2)));
}

TEST(HostStorePinTest, TheChangeListenerReportsEveryBlockInAndOut) {
  auto s = Make(2);
  Write(s.get(), 1);
  std::vector<std::pair<int, bool>> seen;
  s->SetChangeListener([&](const BlockHash& h, bool stored) { seen.emplace_back(h.digest[0], stored); });
  EXPECT_EQ(seen, (std::vector<std::pair<int, bool>>{{1, true}})) << "what it holds, at once";
  Write(s.get(), 2);
  Write(s.get(), 3);  // evicts 1
  ASSERT_TRUE(s->Remove(H(2)).ok());
  ASSERT_TRUE(s->Flush(nullptr).ok());
  EXPECT_EQ(seen, (std::vector<std::pair<int, bool>>{{1, true}, {2, true}, {1, false}, {3, true}, {2, false},
                                                      {3, false}}));
}

}  // namespace
}  // namespace strata::kvcache
