// DiskStore behaviour on a real filesystem: round trips (also across reopen),
// prefix counting, remove, flush by namespace, LRU eviction, namespaces.
// Fault cases (corruption, kill -9, a full disk) are in disk_store_fault_test.cc.

#include "kvcache/disk_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "common/sha256.h"
#include "kvcache/eviction_policy.h"
#include "tests/support/block_data.h"
#include "tests/support/test_env.h"
#include "tests/support/test_memory.h"

namespace strata::kvcache {
namespace {

// A temp dir on a filesystem with O_DIRECT (testing::MakeDirectIoTempDir),
// removed when the test ends.
class TempDir {
 public:
  TempDir() : path_(testing::MakeDirectIoTempDir("strata-disk-")) {}
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

BlockHash HashOf(uint64_t i) {
  BlockHash h;
  h.digest = Sha256Of(&i, sizeof(i));
  return h;
}

Sha256Digest Ns(uint8_t tag) {
  Sha256Digest d{};
  d.fill(tag);
  return d;
}

using testing::BlockOf;

DiskStoreOptions Opts(const std::string& dir, uint64_t block, uint64_t slots) {
  DiskStoreOptions o;
  o.directory = dir + "/store";
  o.block_bytes = block;
  o.capacity_bytes = slots * ((block + 4095) / 4096 * 4096);
  o.slab_file_bytes = 16 * ((block + 4095) / 4096 * 4096);
  o.grow_bytes = 4 * ((block + 4095) / 4096 * 4096);
  o.queue_depth = 8;
  return o;
}

std::unique_ptr<DiskStore> MustOpen(const DiskStoreOptions& o) {
  auto r = DiskStore::Open(o);
  EXPECT_TRUE(r.ok()) << r.error().ToString();
  if (r.ok()) testing::AttachToTestSegments(r->get());
  return r.ok() ? std::move(r).value() : nullptr;
}

// Writes blocks `ids` (source buffers deliberately misaligned by `skew`).
void WriteBlocks(DiskStore& s, const std::vector<uint64_t>& ids, const Sha256Digest& ns,
                 size_t skew = 0) {
  size_t bytes = s.options().block_bytes;
  std::vector<std::vector<uint8_t>> bufs;
  bufs.reserve(ids.size());
  for (uint64_t id : ids) {
    std::vector<uint8_t> b = BlockOf(id, bytes);
    std::vector<uint8_t> padded(bytes + skew);
    std::memcpy(padded.data() + skew, b.data(), bytes);
    bufs.push_back(std::move(padded));
  }
  for (size_t k = 0; k < ids.size(); ++k) {
    ASSERT_TRUE(s.SubmitWrite(HashOf(ids[k]), ns, testing::RegionOf({bufs[k].data() + skew, bytes}), ids[k]).ok());
  }
  std::vector<StoreCompletion> done;
  s.Drain(&done);
  ASSERT_EQ(done.size(), ids.size());
  for (const auto& c : done) EXPECT_TRUE(c.status.ok()) << c.tag << ": " << c.status.ToString();
}

// Reads one block; the Status of its completion, data in *out.
Status ReadBlock(DiskStore& s, uint64_t id, std::vector<uint8_t>* out, size_t skew = 0) {
  size_t bytes = s.options().block_bytes;
  std::vector<uint8_t> buf(bytes + skew + 4096);
  uint8_t* p = buf.data();
  if (skew == 0)
    p += (4096 - reinterpret_cast<uintptr_t>(p) % 4096) % 4096;  // aligned
  else
    p += skew;
  Status sub = s.SubmitRead(HashOf(id), testing::RegionOf({p, bytes}), id);
  if (!sub.ok()) return sub;
  std::vector<StoreCompletion> done;
  s.Drain(&done);
  if (done.size() != 1) return Status::Internal("expected one completion");
  out->assign(p, p + bytes);
  return done[0].status;
}

void ExpectBlock(DiskStore& s, uint64_t id, size_t skew = 0) {
  std::vector<uint8_t> got;
  Status st = ReadBlock(s, id, &got, skew);
  ASSERT_TRUE(st.ok()) << "block " << id << ": " << st.ToString();
  EXPECT_TRUE(got == BlockOf(id, s.options().block_bytes)) << "block " << id << " differs";
}

TEST(DiskStoreTest, RoundTripManyBlocksAndAfterReopen) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DiskStoreOptions o = Opts(dir.path(), 64 << 10, 256);
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < 100; ++i) ids.push_back(i);
  {
    auto s = MustOpen(o);
    ASSERT_TRUE(s);
    WriteBlocks(*s, {ids.begin(), ids.begin() + 50}, Ns(1), 0);  // aligned: direct I/O
    WriteBlocks(*s, {ids.begin() + 50, ids.end()}, Ns(1), 3);    // misaligned: bounce
    EXPECT_EQ(s->stats().blocks, 100u);
    EXPECT_EQ(s->stats().used_bytes, 100u * (64 << 10));
    for (uint64_t i : ids) ExpectBlock(*s, i, i % 2 ? 5 : 0);
  }
  auto s = MustOpen(o);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->stats().blocks, 100u);
  EXPECT_EQ(s->stats().corrupt_blocks, 0u);
  for (uint64_t i : ids) ExpectBlock(*s, i, i % 3 ? 0 : 1);
  // Many reads in flight at once, more than the queue depth.
  std::vector<std::vector<uint8_t>> bufs(ids.size(), std::vector<uint8_t>(64 << 10));
  for (uint64_t i : ids) ASSERT_TRUE(s->SubmitRead(HashOf(i), testing::RegionOf(bufs[i]), i).ok());
  std::vector<StoreCompletion> done;
  s->Drain(&done);
  ASSERT_EQ(done.size(), ids.size());
  for (const auto& c : done) {
    ASSERT_TRUE(c.status.ok()) << c.status.ToString();
    EXPECT_TRUE(bufs[c.tag] == BlockOf(c.tag, 64 << 10));
  }
}

TEST(DiskStoreTest, BlockSizeNotAMultipleOfTheSlot) {
  TempDir dir;
  DiskStoreOptions o = Opts(dir.path(), 5000, 32);
  auto s = MustOpen(o);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->slot_bytes(), 8192u);
  WriteBlocks(*s, {1, 2, 3}, Ns(1));
  for (uint64_t i : {1, 2, 3}) ExpectBlock(*s, i);
  s.reset();
  s = MustOpen(o);
  for (uint64_t i : {1, 2, 3}) ExpectBlock(*s, i, 7);
}

TEST(DiskStoreTest, PollDeliversCompletionsWithoutBlocking) {
  TempDir dir;
  auto s = MustOpen(Opts(dir.path(), 16 << 10, 64));
  ASSERT_TRUE(s);
  std::vector<uint8_t> b = BlockOf(9, 16 << 10);
  ASSERT_TRUE(s->SubmitWrite(HashOf(9), Ns(1), testing::RegionOf(b), 42).ok());
  std::vector<StoreCompletion> done;
  while (done.empty()) s->Poll(&done);  // the loop ends when the kernel finishes the write
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].tag, 42u);
  EXPECT_TRUE(done[0].status.ok());
  EXPECT_TRUE(s->Contains(HashOf(9)));
}

TEST(DiskStoreTest, CountPrefixStopsAtFirstMiss) {
  TempDir dir;
  auto s = MustOpen(Opts(dir.path(), 16 << 10, 64));
  ASSERT_TRUE(s);
  WriteBlocks(*s, {0, 1, 2, 3, 4, 5, 7}, Ns(1));
  std::vector<BlockHash> chain;
  for (uint64_t i = 0; i < 10; ++i) chain.push_back(HashOf(i));
  EXPECT_EQ(s->CountPrefix(chain), 6u);
  EXPECT_EQ(s->CountPrefix({chain.data() + 7, 3}), 1u);
  EXPECT_EQ(s->CountPrefix({}), 0u);
  EXPECT_FALSE(s->Contains(HashOf(6)));
}

TEST(DiskStoreTest, ExistingHashCompletesOkAndBadSizesAreRejected) {
  TempDir dir;
  auto s = MustOpen(Opts(dir.path(), 16 << 10, 64));
  ASSERT_TRUE(s);
  WriteBlocks(*s, {1}, Ns(1));
  WriteBlocks(*s, {1}, Ns(1));
  EXPECT_EQ(s->stats().blocks, 1u);
  std::vector<uint8_t> small(100);
  EXPECT_EQ(s->SubmitWrite(HashOf(2), Ns(1), testing::RegionOf(small), 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s->SubmitRead(HashOf(1), testing::RegionOf(small), 0).code(), StatusCode::kInvalidArgument);
  std::vector<uint8_t> got;
  EXPECT_EQ(ReadBlock(*s, 77, &got).code(), StatusCode::kNotFound);
}

TEST(DiskStoreTest, RemoveIsPersistent) {
  TempDir dir;
  DiskStoreOptions o = Opts(dir.path(), 16 << 10, 64);
  {
    auto s = MustOpen(o);
    ASSERT_TRUE(s);
    WriteBlocks(*s, {1, 2, 3}, Ns(1));
    ASSERT_TRUE(s->Remove(HashOf(2)).ok());
    EXPECT_TRUE(s->Remove(HashOf(99)).ok());  // absent: nothing to do
    EXPECT_FALSE(s->Contains(HashOf(2)));
    std::vector<uint8_t> got;
    EXPECT_EQ(ReadBlock(*s, 2, &got).code(), StatusCode::kNotFound);
    EXPECT_EQ(s->stats().blocks, 2u);
  }
  auto s = MustOpen(o);
  EXPECT_FALSE(s->Contains(HashOf(2)));
  ExpectBlock(*s, 1);
  ExpectBlock(*s, 3);
}

TEST(DiskStoreTest, RemoveWhileTheWriteIsInFlight) {
  TempDir dir;
  auto s = MustOpen(Opts(dir.path(), 16 << 10, 64));
  ASSERT_TRUE(s);
  std::vector<uint8_t> b = BlockOf(5, 16 << 10);
  ASSERT_TRUE(s->SubmitWrite(HashOf(5), Ns(1), testing::RegionOf(b), 5).ok());
  ASSERT_TRUE(s->Remove(HashOf(5)).ok());
  std::vector<StoreCompletion> done;
  s->Drain(&done);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status.code(), StatusCode::kCancelled) << done[0].status.ToString();
  EXPECT_FALSE(s->Contains(HashOf(5)));
  // Writing it again works.
  WriteBlocks(*s, {5}, Ns(1));
  ExpectBlock(*s, 5);
}

TEST(DiskStoreTest, FlushByNamespaceAndAll) {
  TempDir dir;
  DiskStoreOptions o = Opts(dir.path(), 16 << 10, 64);
  {
    auto s = MustOpen(o);
    ASSERT_TRUE(s);
    WriteBlocks(*s, {1, 2, 3, 4}, Ns(0xa));
    WriteBlocks(*s, {11, 12, 13}, Ns(0xb));
    Sha256Digest a = Ns(0xa);
    ASSERT_TRUE(s->Flush(&a).ok());
    for (uint64_t i : {1, 2, 3, 4}) EXPECT_FALSE(s->Contains(HashOf(i)));
    for (uint64_t i : {11, 12, 13}) ExpectBlock(*s, i);
    EXPECT_EQ(s->stats().blocks, 3u);
  }
  auto s = MustOpen(o);
  for (uint64_t i : {1, 2, 3, 4}) EXPECT_FALSE(s->Contains(HashOf(i)));
  for (uint64_t i : {11, 12, 13}) EXPECT_TRUE(s->Contains(HashOf(i)));
  ASSERT_TRUE(s->Flush(nullptr).ok());
  EXPECT_EQ(s->stats().blocks, 0u);
  // Freed slots are reused.
  WriteBlocks(*s, {21, 22}, Ns(0xb));
  ExpectBlock(*s, 21);
}

TEST(DiskStoreTest, LruEvictionAtCapacityKeepsOrderAcrossReopen) {
  TempDir dir;
  DiskStoreOptions o = Opts(dir.path(), 16 << 10, 8);
  {
    auto s = MustOpen(o);
    ASSERT_TRUE(s);
    WriteBlocks(*s, {0, 1, 2, 3, 4, 5, 6, 7}, Ns(1));
    ExpectBlock(*s, 0);  // 0 becomes the most recent
    WriteBlocks(*s, {8, 9, 10}, Ns(1));
    EXPECT_EQ(s->stats().evictions, 3u);
    EXPECT_EQ(s->stats().blocks, 8u);
    for (uint64_t i : {1, 2, 3}) EXPECT_FALSE(s->Contains(HashOf(i))) << i;
    for (uint64_t i : {0, 4, 5, 6, 7, 8, 9, 10}) EXPECT_TRUE(s->Contains(HashOf(i))) << i;
    ExpectBlock(*s, 4);  // 4 becomes the most recent; 5 is now the oldest
  }
  auto s = MustOpen(o);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->stats().blocks, 8u);
  WriteBlocks(*s, {11, 12}, Ns(1));
  EXPECT_FALSE(s->Contains(HashOf(5)));
  EXPECT_FALSE(s->Contains(HashOf(6)));
  for (uint64_t i : {0, 4, 7, 8, 9, 10, 11, 12}) ExpectBlock(*s, i);
}

// The disk tier runs the configured eviction policy (kvcache/eviction_policy.h):
// five blocks read twice each, then a scan of 20 blocks never read. LRU
// gives the read blocks up to the scan; S3-FIFO keeps them (their hits move
// them out of its small queue into the main one) and evicts scan blocks.
// The policy's decisions are in stats(), and it still runs after a reopen.
TEST(DiskStoreTest, EvictionPolicyIsTheConfiguredOne) {
  for (const char* policy : {"lru", "s3fifo"}) {
    SCOPED_TRACE(policy);
    TempDir dir;
    DiskStoreOptions o = Opts(dir.path(), 16 << 10, 10);
    o.eviction_policy = policy;
    const std::vector<uint64_t> hot = {0, 1, 2, 3, 4};
    {
      auto s = MustOpen(o);
      ASSERT_TRUE(s);
      WriteBlocks(*s, hot, Ns(1));
      for (int round = 0; round < 2; ++round) {
        for (uint64_t i : hot) ExpectBlock(*s, i);
      }
      std::vector<uint64_t> scan;
      for (uint64_t i = 100; i < 120; ++i) scan.push_back(i);
      for (uint64_t i : scan) WriteBlocks(*s, {i}, Ns(1));
      const StoreStats st = s->stats();
      EXPECT_EQ(st.eviction_policy, policy);
      EXPECT_EQ(st.blocks, 10u);
      EXPECT_EQ(st.evictions, 15u);
      EXPECT_EQ(st.policy.evicted, 15u);
      EXPECT_EQ(st.policy.inserted, 25u);
      EXPECT_EQ(st.policy.hits, 10u);
      for (uint64_t i : hot) {
        EXPECT_EQ(s->Contains(HashOf(i)), std::string(policy) != "lru") << i;
      }
      if (std::string(policy) == "lru") {
        for (uint64_t i = 110; i < 120; ++i) EXPECT_TRUE(s->Contains(HashOf(i))) << i;
      }
    }
    auto s = MustOpen(o);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->stats().blocks, 10u);
    EXPECT_EQ(s->stats().eviction_policy, policy);
    WriteBlocks(*s, {200, 201}, Ns(1));
    EXPECT_EQ(s->stats().blocks, 10u);
    ExpectBlock(*s, 200);
    ExpectBlock(*s, 201);
  }
  TempDir dir;
  DiskStoreOptions o = Opts(dir.path(), 16 << 10, 10);
  o.eviction_policy = "mru";
  auto r = DiskStore::Open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.error().message().find("mru"), std::string::npos) << r.error().ToString();
}

// The KvManager hands a disk under a host tier its view of one hierarchy
// policy (BlockStore::ReplaceEvictionPolicy). A reopened store holds
// blocks: they enter the new policy in the old one's order (lru resumes),
// the policy named is the store's, and a factory that fails leaves the old
// policy in place.
TEST(DiskStoreTest, ReplacedPolicyTakesTheHeldBlocksInOrder) {
  TempDir dir;
  DiskStoreOptions o = Opts(dir.path(), 16 << 10, 4);
  o.eviction_policy = "lru";
  {
    auto s = MustOpen(o);
    ASSERT_TRUE(s);
    WriteBlocks(*s, {0, 1, 2, 3}, Ns(1));
    ExpectBlock(*s, 0);  // 1 is the oldest now
  }
  auto s = MustOpen(o);
  ASSERT_TRUE(s);
  const Status refused = s->ReplaceEvictionPolicy(
      [](int32_t, std::string_view) -> Result<std::unique_ptr<EvictionPolicy>> { return Status::Cancelled("no"); });
  EXPECT_EQ(refused.code(), StatusCode::kCancelled);
  int32_t slots = -1;
  std::string name;
  const Status replaced =
      s->ReplaceEvictionPolicy([&](int32_t n, std::string_view policy) -> Result<std::unique_ptr<EvictionPolicy>> {
        slots = n;
        name = std::string(policy);
        return MakeEvictionPolicy("lru", n);
      });
  ASSERT_TRUE(replaced.ok()) << replaced.ToString();
  EXPECT_EQ(slots, 4);
  EXPECT_EQ(name, "lru");
  EXPECT_EQ(s->stats().policy.inserted, 4u) << "the held blocks, in the new policy";
  WriteBlocks(*s, {4, 5}, Ns(1));
  EXPECT_FALSE(s->Contains(HashOf(1)));
  EXPECT_FALSE(s->Contains(HashOf(2)));
  for (uint64_t i : {3, 0, 4, 5}) ExpectBlock(*s, i);
}

// BlockStore::Pin (a request about to load the block): a pinned block is
// not evicted however old, pins nest, and a pinned block that is removed
// keeps its slot (its bytes) until the last Unpin.
TEST(DiskStoreTest, APinnedBlockIsNotEvictedAndKeepsItsSlot) {
  TempDir dir;
  DiskStoreOptions o = Opts(dir.path(), 16 << 10, 4);
  o.eviction_policy = "lru";
  auto s = MustOpen(o);
  ASSERT_TRUE(s);
  WriteBlocks(*s, {0, 1, 2, 3}, Ns(1));
  EXPECT_FALSE(s->Pin(HashOf(9))) << "not held";
  ASSERT_TRUE(s->Pin(HashOf(0)));
  ASSERT_TRUE(s->Pin(HashOf(0)));
  WriteBlocks(*s, {4}, Ns(1));
  EXPECT_TRUE(s->Contains(HashOf(0))) << "the oldest, but pinned";
  EXPECT_FALSE(s->Contains(HashOf(1)));
  s->Unpin(HashOf(0));
  WriteBlocks(*s, {5}, Ns(1));
  EXPECT_TRUE(s->Contains(HashOf(0))) << "still pinned once";
  EXPECT_FALSE(s->Contains(HashOf(2)));
  s->Unpin(HashOf(0));  // evictable again, as a block just used (about to be read)
  WriteBlocks(*s, {6}, Ns(1));
  EXPECT_FALSE(s->Contains(HashOf(3)));
  for (uint64_t i : {0, 4, 5, 6}) ExpectBlock(*s, i);

  // Removed while pinned: gone from the index, its slot not reused yet.
  ASSERT_TRUE(s->Pin(HashOf(4)));
  ASSERT_TRUE(s->Remove(HashOf(4)).ok());
  EXPECT_FALSE(s->Contains(HashOf(4)));
  WriteBlocks(*s, {7}, Ns(1));  // 4 slots, one of them still 4's: 0 goes
  EXPECT_FALSE(s->Contains(HashOf(0)));
  EXPECT_EQ(s->stats().blocks, 3u);
  s->Unpin(HashOf(4));
  WriteBlocks(*s, {8}, Ns(1));  // takes 4's slot back: nothing evicted
  for (uint64_t i : {5, 6, 7, 8}) ExpectBlock(*s, i);
  EXPECT_EQ(s->stats().blocks, 4u);
}

// Every slot pinned: a write finds no slot. It completes refused (not
// stored, no write error counted), and the store keeps serving its blocks.
TEST(DiskStoreTest, AWriteWithEverySlotPinnedIsRefusedNotFailed) {
  TempDir dir;
  auto s = MustOpen(Opts(dir.path(), 16 << 10, 2));
  ASSERT_TRUE(s);
  WriteBlocks(*s, {0, 1}, Ns(1));
  ASSERT_TRUE(s->Pin(HashOf(0)));
  ASSERT_TRUE(s->Pin(HashOf(1)));
  const std::vector<uint8_t> b = BlockOf(2, s->options().block_bytes);
  ASSERT_TRUE(s->SubmitWrite(HashOf(2), Ns(1), testing::RegionOf({b.data(), b.size()}), 9).ok());
  std::vector<StoreCompletion> done;
  s->Drain(&done);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(done[0].refused) << done[0].status.ToString();
  EXPECT_EQ(s->stats().write_errors, 0u);
  EXPECT_FALSE(s->Contains(HashOf(2)));
  s->Unpin(HashOf(0));
  s->Unpin(HashOf(1));
  for (uint64_t i : {0, 1}) ExpectBlock(*s, i);
}

// cache_ttl_seconds on the disk tier (BlockStore::KeepFor, real clock): a
// kept block outlives blocks LRU would keep, whether the ask came after its
// write or before the write completed; an ask that has expired keeps nothing.
TEST(DiskStoreTest, KeptBlocksAreEvictedLast) {
  TempDir dir;
  auto s = MustOpen(Opts(dir.path(), 16 << 10, 4));
  ASSERT_TRUE(s);
  constexpr int64_t kHour = int64_t{3600} * 1000 * 1000 * 1000;
  WriteBlocks(*s, {0, 1}, Ns(1));
  s->KeepFor(HashOf(0), kHour);  // after its write
  s->KeepFor(HashOf(1), 1);      // expires at once
  s->KeepFor(HashOf(2), kHour);  // before its write
  WriteBlocks(*s, {2, 3}, Ns(1));
  for (uint64_t i = 10; i < 16; ++i) WriteBlocks(*s, {i}, Ns(1));
  EXPECT_TRUE(s->Contains(HashOf(0)));
  EXPECT_TRUE(s->Contains(HashOf(2)));
  EXPECT_FALSE(s->Contains(HashOf(1)));
  EXPECT_FALSE(s->Contains(HashOf(3)));
  EXPECT_TRUE(s->Contains(HashOf(15)));
  EXPECT_EQ(s->stats().blocks, 4u);
  EXPECT_EQ(s->stats().policy.evicted_kept, 0u);
  ExpectBlock(*s, 0);
  ExpectBlock(*s, 2);
}

TEST(DiskStoreTest, SmallerCapacityOnReopenEvicts) {
  TempDir dir;
  DiskStoreOptions o = Opts(dir.path(), 16 << 10, 40);
  {
    auto s = MustOpen(o);
    std::vector<uint64_t> ids;
    for (uint64_t i = 0; i < 40; ++i) ids.push_back(i);
    WriteBlocks(*s, ids, Ns(1));
  }
  o.capacity_bytes = 20 * (16 << 10);
  auto s = MustOpen(o);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->stats().blocks, 20u);
  EXPECT_EQ(s->stats().corrupt_blocks, 0u);
  for (uint64_t i = 0; i < 40; ++i) {
    if (s->Contains(HashOf(i))) ExpectBlock(*s, i);
  }
}

TEST(DiskStoreTest, ForeignNamespaceIsAMissAndIsDropped) {
  TempDir dir;
  DiskStoreOptions o = Opts(dir.path(), 16 << 10, 64);
  {
    auto s = MustOpen(o);
    WriteBlocks(*s, {1}, Ns(0xa));
    WriteBlocks(*s, {2}, Ns(0xb));
  }
  o.namespaces = {Ns(0xb)};
  auto s = MustOpen(o);
  ASSERT_TRUE(s);
  EXPECT_FALSE(s->Contains(HashOf(1)));
  EXPECT_TRUE(s->Contains(HashOf(2)));
  std::vector<uint8_t> got;
  EXPECT_EQ(ReadBlock(*s, 1, &got).code(), StatusCode::kCorrupt);
  EXPECT_EQ(s->stats().corrupt_blocks, 1u);
  EXPECT_EQ(ReadBlock(*s, 1, &got).code(), StatusCode::kNotFound);
  ExpectBlock(*s, 2);
  std::vector<uint8_t> b = BlockOf(3, 16 << 10);
  EXPECT_EQ(s->SubmitWrite(HashOf(3), Ns(0xa), testing::RegionOf(b), 3).code(), StatusCode::kInvalidArgument);
}

TEST(DiskStoreTest, AnotherBlockSizeWipesTheDirectory) {
  TempDir dir;
  DiskStoreOptions o = Opts(dir.path(), 16 << 10, 64);
  {
    auto s = MustOpen(o);
    WriteBlocks(*s, {1, 2}, Ns(1));
  }
  DiskStoreOptions o2 = Opts(dir.path(), 32 << 10, 64);
  {
    auto s = MustOpen(o2);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->stats().blocks, 0u);
    WriteBlocks(*s, {3}, Ns(1));
    ExpectBlock(*s, 3);
  }
}

TEST(DiskStoreTest, BadOptionsAreRejected) {
  TempDir dir;
  DiskStoreOptions o = Opts(dir.path(), 16 << 10, 64);
  o.block_bytes = 1000;
  EXPECT_EQ(DiskStore::Open(o).error().code(), StatusCode::kInvalidArgument);
  o = Opts(dir.path(), 16 << 10, 64);
  o.capacity_bytes = 100;
  EXPECT_EQ(DiskStore::Open(o).error().code(), StatusCode::kInvalidArgument);
  o = Opts(dir.path(), 16 << 10, 64);
  o.directory = "/proc/strata-no-such-dir";
  EXPECT_FALSE(DiskStore::Open(o).ok());
}

TEST(DiskStoreTest, SecondOpenOfTheSameDirectoryFails) {
  TempDir dir;
  DiskStoreOptions o = Opts(dir.path(), 16 << 10, 64);
  auto s = MustOpen(o);
  ASSERT_TRUE(s);
  auto second = DiskStore::Open(o);
  EXPECT_FALSE(second.ok());
}

// Regions: attaching registers the slab files as one kFile segment of the
// store's capacity and the bounce buffers as host memory; device memory is
// refused with an error naming it, nothing queued.
TEST(DiskStoreTest, AttachRegistersItsStorageAndRefusesDeviceMemory) {
  TempDir dir;
  SegmentTable table;
  auto r = DiskStore::Open(Opts(dir.path(), 16 << 10, 8));
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  DiskStore& s = **r;
  ASSERT_TRUE(s.Attach(&table).ok());
  ASSERT_EQ(s.own_segments().size(), 2u);
  const auto file = table.Get(s.own_segments()[0]);
  const auto bounce = table.Get(s.own_segments()[1]);
  ASSERT_TRUE(file && bounce);
  EXPECT_EQ(file->kind, SegmentKind::kFile);
  EXPECT_EQ(file->size, 8u * (16 << 10));
  EXPECT_EQ(bounce->kind, SegmentKind::kHost);
  EXPECT_EQ(bounce->size, 8u * (16 << 10));  // min(queue_depth, bounce_buffers) slots
  std::vector<uint8_t> dev(16 << 10);
  const SegmentId gpu = table.Register(SegmentKind::kDevice, dev.data(), dev.size(), "gpu").value();
  const Status w = s.SubmitWrite(HashOf(1), Ns(1), Region{gpu, 0, dev.size()}, 1);
  EXPECT_EQ(w.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.message().find("gpu"), std::string::npos) << w.ToString();
  EXPECT_EQ(s.SubmitWrite(HashOf(1), Ns(1), Region{file->id, 0, dev.size()}, 1).code(),
            StatusCode::kInvalidArgument);
  std::vector<StoreCompletion> done;
  s.Drain(&done);
  EXPECT_TRUE(done.empty());
  r->reset();  // destroying the store unregisters its segments
  EXPECT_EQ(table.size(), 1u);
}

}  // namespace
}  // namespace strata::kvcache

namespace strata::kvcache {
namespace {

// The store starts every submitted I/O it has room for in the ring
// (queue_depth), not only as many as it has bounce buffers: aligned writes
// need none. Before, 32 at most started per poll, and a long prefill's
// writes fell seconds behind the engine (docs/simulator.md). Misaligned
// ones wait for one of the bounce_buffers.
TEST(DiskStoreTest, AlignedIosFillTheQueueDepthMisalignedOnesWaitForABounceBuffer) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  constexpr uint64_t kBlock = 16 << 10;
  DiskStoreOptions o = Opts(dir.path(), kBlock, 128);
  o.queue_depth = 64;
  o.bounce_buffers = 2;
  auto s = MustOpen(o);
  ASSERT_TRUE(s);
  constexpr size_t kAligned = 48, kMisaligned = 6;
  std::vector<uint8_t> raw((kAligned + kMisaligned + 1) * kBlock + 4096 + 8);
  uint8_t* base = raw.data() + (4096 - reinterpret_cast<uintptr_t>(raw.data()) % 4096) % 4096;
  for (uint64_t i = 0; i < kAligned + kMisaligned; ++i) {
    const std::vector<uint8_t> b = BlockOf(i, kBlock);
    uint8_t* dst = base + i * kBlock + (i < kAligned ? 0 : 8 * (i - kAligned + 1));
    std::memcpy(dst, b.data(), kBlock);
  }
  for (uint64_t i = 0; i < kAligned; ++i)
    ASSERT_TRUE(s->SubmitWrite(HashOf(i), Ns(1), testing::RegionOf({base + i * kBlock, kBlock}), i).ok());
  EXPECT_EQ(s->ios_in_flight(), kAligned) << "every aligned write started, with 2 bounce buffers";
  EXPECT_EQ(s->ios_queued(), 0u);
  for (uint64_t i = kAligned; i < kAligned + kMisaligned; ++i) {
    uint8_t* src = base + i * kBlock + 8 * (i - kAligned + 1);
    ASSERT_TRUE(s->SubmitWrite(HashOf(i), Ns(1), testing::RegionOf({src, kBlock}), i).ok());
  }
  EXPECT_EQ(s->ios_in_flight(), kAligned + 2) << "two misaligned writes hold the bounce buffers";
  EXPECT_EQ(s->ios_queued(), kMisaligned - 2);
  std::vector<StoreCompletion> done;
  s->Drain(&done);
  ASSERT_EQ(done.size(), kAligned + kMisaligned);
  for (const auto& c : done) EXPECT_TRUE(c.status.ok()) << c.tag << ": " << c.status.ToString();
  EXPECT_EQ(s->ios_in_flight(), 0u);
  for (uint64_t i = 0; i < kAligned + kMisaligned; ++i) ExpectBlock(*s, i);

  // The ring's size bounds what starts.
  o.directory = dir.path() + "/small";
  o.queue_depth = 8;
  auto q = MustOpen(o);
  ASSERT_TRUE(q);
  for (uint64_t i = 0; i < 20; ++i)
    ASSERT_TRUE(q->SubmitWrite(HashOf(100 + i), Ns(1), testing::RegionOf({base + i * kBlock, kBlock}), i).ok());
  EXPECT_EQ(q->ios_in_flight(), 8u);
  EXPECT_EQ(q->ios_queued(), 12u);
  done.clear();
  q->Drain(&done);
  EXPECT_EQ(done.size(), 20u);
}

}  // namespace
}  // namespace strata::kvcache
