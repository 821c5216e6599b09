// HostStore: round trips are bitwise exact, LRU eviction at capacity,
// completions through Poll, prefix counting, remove/flush, metadata-only.

#include "kvcache/host_store.h"

#include <gtest/gtest.h>

#include "tests/support/test_memory.h"

namespace strata::kvcache {
namespace {

constexpr uint64_t kBlock = 64;

BlockHash H(int i) {
  BlockHash h;
  h.digest[0] = static_cast<uint8_t>(i);
  h.digest[5] = 0xa5;
  return h;
}

std::vector<uint8_t> Bytes(int seed) {
  std::vector<uint8_t> b(kBlock);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(seed * 31 + i * 7);
  return b;
}

std::unique_ptr<HostStore> Make(uint64_t blocks, bool meta = false) {
  auto s = HostStore::Create({blocks * kBlock + kBlock / 2, kBlock, meta});
  EXPECT_TRUE(s.ok());
  testing::AttachToTestSegments(s->get());
  return std::move(s).value();
}

TEST(HostStoreTest, WriteReadRoundTripIsExact) {
  auto s = Make(4);
  EXPECT_EQ(s->num_slots(), 4);  // capacity rounded down to whole blocks
  const Sha256Digest ns{};
  auto data = Bytes(3);
  ASSERT_TRUE(s->SubmitWrite(H(1), ns, testing::RegionOf(data), 11).ok());
  std::vector<StoreCompletion> done;
  EXPECT_EQ(s->Poll(&done), 1u);
  EXPECT_EQ(done[0].tag, 11u);
  EXPECT_TRUE(done[0].status.ok());
  std::vector<uint8_t> back(kBlock, 0);
  ASSERT_TRUE(s->SubmitRead(H(1), testing::RegionOf(back), 12).ok());
  done.clear();
  s->Drain(&done);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok());
  EXPECT_EQ(back, data);
  EXPECT_EQ(s->stats().blocks, 1u);
  EXPECT_EQ(s->stats().used_bytes, kBlock);
  EXPECT_EQ(s->stats().capacity_bytes, 4 * kBlock);
}

TEST(HostStoreTest, MissAndBadSizes) {
  auto s = Make(2);
  std::vector<uint8_t> dst(kBlock);
  ASSERT_TRUE(s->SubmitRead(H(9), testing::RegionOf(dst), 1).ok());
  std::vector<StoreCompletion> done;
  s->Poll(&done);
  EXPECT_EQ(done[0].status.code(), StatusCode::kNotFound);
  std::vector<uint8_t> small(3);
  EXPECT_FALSE(s->SubmitWrite(H(1), {}, testing::RegionOf(small), 2).ok());
  EXPECT_FALSE(s->SubmitRead(H(1), testing::RegionOf(small), 3).ok());
  auto off = HostStore::Create({0, kBlock, false});
  ASSERT_TRUE(off.ok());
  testing::AttachToTestSegments(off->get());
  auto d = Bytes(1);
  ASSERT_TRUE((*off)->SubmitWrite(H(1), {}, testing::RegionOf(d), 4).ok());
  done.clear();
  (*off)->Poll(&done);
  EXPECT_FALSE(done[0].status.ok());
  EXPECT_FALSE((*off)->Contains(H(1)));
}

TEST(HostStoreTest, EvictsLeastRecentlyUsed) {
  auto s = Make(3);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s->SubmitWrite(H(i), {}, testing::RegionOf(Bytes(i)), i).ok());
  std::vector<uint8_t> dst(kBlock);
  ASSERT_TRUE(s->SubmitRead(H(0), testing::RegionOf(dst), 10).ok());           // 0 becomes most recent
  ASSERT_TRUE(s->SubmitWrite(H(1), {}, testing::RegionOf(Bytes(1)), 11).ok());  // rewrite touches 1
  ASSERT_TRUE(s->SubmitWrite(H(3), {}, testing::RegionOf(Bytes(3)), 12).ok());  // evicts 2
  EXPECT_FALSE(s->Contains(H(2)));
  EXPECT_TRUE(s->Contains(H(0)) && s->Contains(H(1)) && s->Contains(H(3)));
  EXPECT_EQ(s->stats().evictions, 1u);
  ASSERT_TRUE(s->SubmitRead(H(3), testing::RegionOf(dst), 13).ok());
  EXPECT_EQ(dst, Bytes(3));
  std::vector<StoreCompletion> done;
  EXPECT_EQ(s->Poll(&done), 7u);
  for (auto& c : done) EXPECT_TRUE(c.status.ok());
}

// Every slot pinned (loads about to read them): a new block has no room. The
// write completes refused (not stored, nothing failed), and once a pin goes
// the next write evicts as usual.
TEST(HostStoreTest, AWriteWithEverySlotPinnedIsRefusedNotFailed) {
  auto s = Make(2);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(s->SubmitWrite(H(i), {}, testing::RegionOf(Bytes(i)), i).ok());
  ASSERT_TRUE(s->Pin(H(0)));
  ASSERT_TRUE(s->Pin(H(1)));
  std::vector<StoreCompletion> done;
  s->Poll(&done);
  done.clear();
  ASSERT_TRUE(s->SubmitWrite(H(2), {}, testing::RegionOf(Bytes(2)), 7).ok());
  ASSERT_EQ(s->Poll(&done), 1u);
  EXPECT_EQ(done[0].tag, 7u);
  EXPECT_EQ(done[0].status.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(done[0].refused) << done[0].status.ToString();
  EXPECT_FALSE(s->Contains(H(2)));
  EXPECT_TRUE(s->Contains(H(0)) && s->Contains(H(1)));
  EXPECT_EQ(s->stats().write_errors, 0u);
  EXPECT_EQ(s->stats().evictions, 0u);

  s->Unpin(H(1));
  done.clear();
  ASSERT_TRUE(s->SubmitWrite(H(2), {}, testing::RegionOf(Bytes(2)), 8).ok());
  ASSERT_EQ(s->Poll(&done), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status.ToString();
  EXPECT_FALSE(done[0].refused);
  EXPECT_TRUE(s->Contains(H(0)) && s->Contains(H(2)));
  EXPECT_FALSE(s->Contains(H(1)));
  s->Unpin(H(0));
}

TEST(HostStoreTest, CountPrefixRemoveFlush) {
  auto s = Make(8);
  Sha256Digest a{}, b{};
  b[0] = 1;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s->SubmitWrite(H(i), a, testing::RegionOf(Bytes(i)), 0).ok());
  ASSERT_TRUE(s->SubmitWrite(H(5), b, testing::RegionOf(Bytes(5)), 0).ok());
  std::vector<BlockHash> chain = {H(0), H(1), H(4), H(2)};
  EXPECT_EQ(s->CountPrefix(chain), 2u);
  EXPECT_TRUE(s->Remove(H(1)).ok());
  EXPECT_EQ(s->Remove(H(1)).code(), StatusCode::kNotFound);
  EXPECT_EQ(s->CountPrefix(chain), 1u);
  ASSERT_TRUE(s->Flush(&a).ok());
  EXPECT_FALSE(s->Contains(H(0)));
  EXPECT_TRUE(s->Contains(H(5)));
  ASSERT_TRUE(s->Flush(nullptr).ok());
  EXPECT_EQ(s->stats().blocks, 0u);
  // Slots are reusable after removal.
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(s->SubmitWrite(H(10 + i), a, testing::RegionOf(Bytes(i)), 0).ok());
  EXPECT_EQ(s->stats().evictions, 0u);
}

TEST(HostStoreTest, MetadataOnly) {
  auto s = Make(2, /*meta=*/true);
  ASSERT_TRUE(s->SubmitWrite(H(1), {}, Region{}, 1).ok());
  ASSERT_TRUE(s->SubmitRead(H(1), Region{}, 2).ok());
  std::vector<StoreCompletion> done;
  s->Poll(&done);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_TRUE(done[1].status.ok());
  EXPECT_TRUE(s->Contains(H(1)));
}

}  // namespace
}  // namespace strata::kvcache

namespace strata::kvcache {
namespace {

// Regions: the store registers its arena when attached, refuses regions it
// cannot reach with an error naming them, and reports evictions as regions
// of its own arena.
TEST(HostStoreRegions, AttachRegistersTheArenaAndRefusesWhatItCannotReach) {
  SegmentTable table;
  auto s = std::move(HostStore::Create({2 * kBlock, kBlock, false})).value();
  std::vector<uint8_t> buf(kBlock, 9), dev(kBlock), file_bytes(kBlock);
  const SegmentId host_seg = table.Register(SegmentKind::kHost, buf.data(), buf.size(), "buf").value();
  // Not attached: nothing can be resolved.
  EXPECT_EQ(s->SubmitWrite(H(1), {}, Region{host_seg, 0, kBlock}, 1).code(), StatusCode::kInternal);
  ASSERT_TRUE(s->Attach(&table).ok());
  EXPECT_EQ(s->Attach(&table).code(), StatusCode::kInvalidArgument);  // once
  ASSERT_EQ(s->own_segments().size(), 1u);
  const auto arena = table.Get(s->own_segments()[0]);
  ASSERT_TRUE(arena.has_value());
  EXPECT_EQ(arena->size, 2 * kBlock);
  EXPECT_EQ(arena->kind, SegmentKind::kHost);

  const SegmentId dev_seg = table.Register(SegmentKind::kDevice, dev.data(), dev.size(), "gpu").value();
  const SegmentId file_seg = table.Register(SegmentKind::kFile, nullptr, kBlock, "file").value();
  EXPECT_EQ(s->SubmitWrite(H(1), {}, Region{dev_seg, 0, kBlock}, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s->SubmitWrite(H(1), {}, Region{file_seg, 0, kBlock}, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s->SubmitWrite(H(1), {}, Region{SegmentId(999), 0, kBlock}, 1).code(), StatusCode::kNotFound);
  EXPECT_EQ(s->SubmitWrite(H(1), {}, Region{host_seg, 0, kBlock / 2}, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s->SubmitRead(H(1), Region{host_seg, 0, 0}, 1).code(), StatusCode::kInvalidArgument);
  std::vector<StoreCompletion> done;
  EXPECT_EQ(s->Poll(&done), 0u);  // nothing was queued by a refusal
  EXPECT_FALSE(s->Contains(H(1)));

  // Evictions are reported as regions of the arena, holding the bytes.
  std::vector<uint8_t> seen;
  s->SetEvictionListener([&](const BlockHash&, const Region& r) {
    EXPECT_EQ(r.segment, s->own_segments()[0]);
    auto bytes = table.Resolve(r);
    ASSERT_TRUE(bytes.ok());
    seen.assign(bytes->begin(), bytes->end());
  });
  for (int i = 0; i < 3; ++i) {
    std::fill(buf.begin(), buf.end(), static_cast<uint8_t>(i + 1));
    ASSERT_TRUE(s->SubmitWrite(H(i), {}, Region{host_seg, 0, kBlock}, i).ok());
  }
  EXPECT_EQ(seen, std::vector<uint8_t>(kBlock, 1));  // H(0)'s bytes
  s->Detach();
  EXPECT_EQ(s->own_segments().size(), 0u);
  EXPECT_FALSE(table.Get(arena->id).has_value());
}

}  // namespace
}  // namespace strata::kvcache
