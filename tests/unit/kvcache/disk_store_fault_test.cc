// DiskStore under faults, on real filesystems: truncated and bit-flipped slab
// files, index records that point past the end, kill -9 during writes, and a
// disk that fills up (a size-limited tmpfs or a loop-mounted ext4 the test
// mounts). Each fault must become a miss that is counted and never served.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "common/sha256.h"
#include "tests/support/block_data.h"
#include "tests/support/test_memory.h"
#include "kvcache/disk_index.h"
#include "kvcache/disk_store.h"

namespace strata::kvcache {
namespace {

std::string MakeODirectTempDir() {
  for (const char* base : {"/var/tmp", "/tmp", "."}) {
    std::string tmpl = std::string(base) + "/strata-diskf-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) continue;
    std::string probe = tmpl + "/probe";
    int fd = open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0644);
    if (fd >= 0) {
      close(fd);
      unlink(probe.c_str());
      return tmpl;
    }
    std::filesystem::remove_all(tmpl);
  }
  return "";
}

class DiskStoreFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeODirectTempDir();
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string dir_;
};

BlockHash HashOf(uint64_t i) {
  BlockHash h;
  h.digest = Sha256Of(&i, sizeof(i));
  return h;
}

Sha256Digest Ns() {
  Sha256Digest d{};
  d.fill(0x5a);
  return d;
}

using testing::BlockOf;

constexpr uint64_t kBlock = 64 << 10;

// 16 slots a slab, so slot s lives in slab s / 16 at offset (s % 16) * kBlock.
DiskStoreOptions Opts(const std::string& dir, uint64_t slots) {
  DiskStoreOptions o;
  o.directory = dir + "/store";
  o.block_bytes = kBlock;
  o.capacity_bytes = slots * kBlock;
  o.slab_file_bytes = 16 * kBlock;
  o.grow_bytes = 16 * kBlock;
  o.queue_depth = 8;
  return o;
}

std::unique_ptr<DiskStore> MustOpen(const DiskStoreOptions& o) {
  auto r = DiskStore::Open(o);
  EXPECT_TRUE(r.ok()) << r.error().ToString();
  if (r.ok()) testing::AttachToTestSegments(r->get());
  return r.ok() ? std::move(r).value() : nullptr;
}

// Writes ids one at a time, in order, so block i lands in slot i of a fresh store.
void WriteInOrder(DiskStore& s, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    std::vector<uint8_t> b = BlockOf(i, kBlock);
    ASSERT_TRUE(s.SubmitWrite(HashOf(i), Ns(), testing::RegionOf(b), i).ok());
    std::vector<StoreCompletion> done;
    s.Drain(&done);
    ASSERT_EQ(done.size(), 1u);
    ASSERT_TRUE(done[0].status.ok()) << done[0].status.ToString();
  }
}

// The read's Status; on success checks the bytes are the block's.
Status ReadAndCheck(DiskStore& s, uint64_t id) {
  std::vector<uint8_t> buf(kBlock, 0xee);
  Status sub = s.SubmitRead(HashOf(id), testing::RegionOf(buf), id);
  if (!sub.ok()) return sub;
  std::vector<StoreCompletion> done;
  s.Drain(&done);
  if (done.size() != 1) return Status::Internal("expected one completion");
  if (done[0].status.ok() && buf != BlockOf(id, kBlock)) {
    ADD_FAILURE() << "block " << id << " served with wrong bytes";
  }
  return done[0].status;
}

std::string Slab(const std::string& dir, int k) {
  char name[64];
  std::snprintf(name, sizeof(name), "/store/slab-%05d.dat", k);
  return dir + name;
}

TEST_F(DiskStoreFaultTest, SlabTruncatedWhileClosed) {
  DiskStoreOptions o = Opts(dir_, 64);
  {
    auto s = MustOpen(o);
    WriteInOrder(*s, 20);  // slots 0..15 in slab 0, 16..19 in slab 1
  }
  // Cut slab 0 in the middle of slot 5: slots 5..15 lose their bytes.
  ASSERT_EQ(truncate(Slab(dir_, 0).c_str(), 5 * kBlock + 100), 0);
  auto s = MustOpen(o);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->stats().corrupt_blocks, 11u);
  EXPECT_EQ(s->stats().blocks, 9u);
  for (uint64_t i = 0; i < 20; ++i) {
    bool lost = i >= 5 && i < 16;
    EXPECT_EQ(s->Contains(HashOf(i)), !lost) << i;
    Status st = ReadAndCheck(*s, i);
    EXPECT_EQ(st.ok(), !lost) << i << ": " << st.ToString();
  }
  // The store keeps working: the lost slots are written again.
  WriteInOrder(*s, 20);
  for (uint64_t i = 0; i < 20; ++i) EXPECT_TRUE(ReadAndCheck(*s, i).ok()) << i;
}

TEST_F(DiskStoreFaultTest, SlabTruncatedWhileOpen) {
  auto s = MustOpen(Opts(dir_, 64));
  ASSERT_TRUE(s);
  WriteInOrder(*s, 10);
  ASSERT_EQ(truncate(Slab(dir_, 0).c_str(), 6 * kBlock), 0);
  for (uint64_t i = 0; i < 10; ++i) {
    Status st = ReadAndCheck(*s, i);
    if (i < 6) {
      EXPECT_TRUE(st.ok()) << i << ": " << st.ToString();
    } else {
      EXPECT_EQ(st.code(), StatusCode::kCorrupt) << i << ": " << st.ToString();
      EXPECT_FALSE(s->Contains(HashOf(i)));
      EXPECT_EQ(ReadAndCheck(*s, i).code(), StatusCode::kNotFound);
    }
  }
  EXPECT_EQ(s->stats().corrupt_blocks, 4u);
  EXPECT_EQ(s->stats().blocks, 6u);
}

void FlipBit(const std::string& path, uint64_t offset) {
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t b = 0;
  ASSERT_EQ(pread(fd, &b, 1, static_cast<off_t>(offset)), 1);
  b ^= 0x10;
  ASSERT_EQ(pwrite(fd, &b, 1, static_cast<off_t>(offset)), 1);
  ASSERT_EQ(fsync(fd), 0);
  close(fd);
}

TEST_F(DiskStoreFaultTest, BitFlipIsNeverServed) {
  DiskStoreOptions o = Opts(dir_, 64);
  {
    auto s = MustOpen(o);
    WriteInOrder(*s, 8);
  }
  FlipBit(Slab(dir_, 0), 3 * kBlock + 12345);  // inside block 3
  auto s = MustOpen(o);
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->Contains(HashOf(3)));  // not known before it is read
  EXPECT_EQ(ReadAndCheck(*s, 3).code(), StatusCode::kCorrupt);
  EXPECT_EQ(s->stats().corrupt_blocks, 1u);
  EXPECT_FALSE(s->Contains(HashOf(3)));
  for (uint64_t i : {0, 1, 2, 4, 5, 6, 7}) EXPECT_TRUE(ReadAndCheck(*s, i).ok()) << i;
  // While open, too (the flip goes through the page cache; O_DIRECT reads see it).
  FlipBit(Slab(dir_, 0), 6 * kBlock + kBlock - 1);  // last byte of block 6
  EXPECT_EQ(ReadAndCheck(*s, 6).code(), StatusCode::kCorrupt);
  EXPECT_EQ(s->stats().corrupt_blocks, 2u);
  s.reset();
  s = MustOpen(o);  // the drops were persisted
  EXPECT_FALSE(s->Contains(HashOf(3)));
  EXPECT_FALSE(s->Contains(HashOf(6)));
  EXPECT_EQ(s->stats().blocks, 6u);
}

TEST_F(DiskStoreFaultTest, IndexRecordsPointingPastTheEndOrAtOtherBytes) {
  DiskStoreOptions o = Opts(dir_, 64);
  uint64_t slot_of_2 = 0;
  {
    auto s = MustOpen(o);
    WriteInOrder(*s, 20);
  }
  {
    auto idx = DiskIndex::Open(o.directory + "/index");
    ASSERT_TRUE(idx.ok()) << idx.error().ToString();
    auto rec2 = (*idx)->Get(HashOf(2));
    ASSERT_TRUE(rec2.ok());
    slot_of_2 = rec2->slot;
    DiskIndexRecord r = *rec2;
    r.slot = 1000;  // past the end of the store (64 slots)
    ASSERT_TRUE((*idx)->Put(HashOf(100), r).ok());
    r.slot = 40;  // inside the store, in slab 2, which was never created
    ASSERT_TRUE((*idx)->Put(HashOf(101), r).ok());
    ASSERT_TRUE((*idx)->PutRaw(HashOf(102), "garbage").ok());
    // Block 5's record now names slot 19 (block 19's bytes): a checksum miss.
    auto rec5 = (*idx)->Get(HashOf(5));
    ASSERT_TRUE(rec5.ok());
    DiskIndexRecord r5 = *rec5;
    ASSERT_TRUE((*idx)->Delete(HashOf(19)).ok());
    r5.slot = 19;
    ASSERT_TRUE((*idx)->Put(HashOf(5), r5).ok());
  }
  EXPECT_EQ(slot_of_2, 2u);
  auto s = MustOpen(o);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->stats().corrupt_blocks, 3u);  // 100, 101, 102 at open
  for (uint64_t i : {100, 101, 102}) {
    EXPECT_FALSE(s->Contains(HashOf(i)));
    EXPECT_EQ(ReadAndCheck(*s, i).code(), StatusCode::kNotFound);
  }
  EXPECT_EQ(ReadAndCheck(*s, 5).code(), StatusCode::kCorrupt);
  EXPECT_EQ(s->stats().corrupt_blocks, 4u);
  EXPECT_FALSE(s->Contains(HashOf(5)));
  EXPECT_FALSE(s->Contains(HashOf(19)));
  for (uint64_t i = 0; i < 19; ++i) {
    if (i == 5) continue;
    EXPECT_TRUE(ReadAndCheck(*s, i).ok()) << i;
  }
  // The records are gone from the index itself.
  s.reset();
  auto idx = DiskIndex::Open(o.directory + "/index");
  ASSERT_TRUE(idx.ok());
  for (uint64_t i : {5, 100, 101, 102}) EXPECT_FALSE((*idx)->Get(HashOf(i)).ok()) << i;
}

// A child writes blocks with several in flight until it is killed; every block
// the reopened store indexes must read back intact, every block the child saw
// completed must be there, and nothing else is served.
TEST_F(DiskStoreFaultTest, KillDashNineDuringWrites) {
  DiskStoreOptions o = Opts(dir_, 4096);
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(pipefd[0]);
    auto r = DiskStore::Open(o);
    if (!r.ok()) _exit(2);
    testing::AttachToTestSegments(r->get());
    DiskStore& s = **r;
    std::vector<std::vector<uint8_t>> bufs(8);
    uint64_t next = 0;
    unsigned in_flight = 0;
    for (;;) {
      while (in_flight < 8) {
        bufs[next % 8] = BlockOf(next, kBlock);
        if (!s.SubmitWrite(HashOf(next), Ns(), testing::RegionOf(bufs[next % 8]), next).ok()) _exit(3);
        ++next;
        ++in_flight;
      }
      std::vector<StoreCompletion> done;
      s.Poll(&done);
      for (const auto& c : done) {
        --in_flight;
        if (!c.status.ok()) _exit(4);
        uint64_t id = c.tag;
        if (write(pipefd[1], &id, sizeof(id)) != sizeof(id)) _exit(5);
      }
    }
  }
  close(pipefd[1]);
  std::vector<uint64_t> completed;
  uint64_t id;
  while (completed.size() < 300 && read(pipefd[0], &id, sizeof(id)) == sizeof(id)) {
    completed.push_back(id);
  }
  kill(pid, SIGKILL);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  close(pipefd[0]);
  ASSERT_TRUE(WIFSIGNALED(wstatus)) << "child exited with " << WEXITSTATUS(wstatus);
  ASSERT_EQ(completed.size(), 300u);

  auto s = MustOpen(o);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->stats().corrupt_blocks, 0u);
  for (uint64_t c : completed) EXPECT_TRUE(s->Contains(HashOf(c))) << c;
  uint64_t max_id = *std::max_element(completed.begin(), completed.end());
  uint64_t served = 0;
  for (uint64_t i = 0; i < max_id + 4096; ++i) {
    if (!s->Contains(HashOf(i))) {
      EXPECT_EQ(ReadAndCheck(*s, i).code(), StatusCode::kNotFound);
      continue;
    }
    Status st = ReadAndCheck(*s, i);  // checks the bytes too
    EXPECT_TRUE(st.ok()) << i << ": " << st.ToString();
    ++served;
  }
  EXPECT_EQ(served, s->stats().blocks);
  EXPECT_EQ(s->stats().corrupt_blocks, 0u);
  // Orphan slots (written, never indexed) are reused.
  std::vector<uint8_t> b = BlockOf(999999, kBlock);
  ASSERT_TRUE(s->SubmitWrite(HashOf(999999), Ns(), testing::RegionOf(b), 1).ok());
  std::vector<StoreCompletion> done;
  s->Drain(&done);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok());
}

// A small real filesystem the test mounts: tmpfs with a size limit, else a
// loop-mounted ext4 image. Empty reason = mounted.
class SmallFs {
 public:
  SmallFs(const std::string& mountpoint, const std::string& image) : mnt_(mountpoint) {
    std::filesystem::create_directories(mnt_);
    if (mount("tmpfs", mnt_.c_str(), "tmpfs", 0, "size=4m") == 0) {
      mounted_ = true;
      kind_ = "tmpfs size=4m";
      return;
    }
    reason_ = std::string("tmpfs mount: ") + std::strerror(errno);
    std::string cmd = "truncate -s 8M " + image + " && mkfs.ext4 -q -F " + image +
                      " >/dev/null 2>&1 && mount -o loop " + image + " " + mnt_ +
                      " >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) {
      mounted_ = true;
      kind_ = "loop ext4 8M";
      reason_.clear();
      return;
    }
    reason_ += "; loop-mounted ext4 (" + cmd + ") failed too";
  }
  ~SmallFs() {
    if (mounted_) umount2(mnt_.c_str(), MNT_DETACH);
  }
  const std::string& reason() const { return reason_; }
  const std::string& kind() const { return kind_; }

 private:
  std::string mnt_;
  bool mounted_ = false;
  std::string reason_;
  std::string kind_;
};

TEST_F(DiskStoreFaultTest, FullDiskIsAWriteErrorAndServingContinues) {
  SmallFs fs(dir_ + "/mnt", dir_ + "/fs.img");
  if (!fs.reason().empty()) GTEST_SKIP() << "cannot mount a small filesystem: " << fs.reason();
  DiskStoreOptions o = Opts(dir_ + "/mnt", 1024);  // 64 MiB wanted, a few MiB there
  o.reserve_bytes = 512 << 10;
  auto s = MustOpen(o);
  ASSERT_TRUE(s);
  uint64_t stored = 0;
  Status first_error;
  for (uint64_t i = 0; i < 200 && first_error.ok(); ++i) {
    std::vector<uint8_t> b = BlockOf(i, kBlock);
    ASSERT_TRUE(s->SubmitWrite(HashOf(i), Ns(), testing::RegionOf(b), i).ok());  // a full disk is no submit error
    std::vector<StoreCompletion> done;
    s->Drain(&done);
    ASSERT_EQ(done.size(), 1u);
    if (done[0].status.ok()) {
      ++stored;
    } else {
      first_error = done[0].status;
    }
  }
  ASSERT_FALSE(first_error.ok()) << "the " << fs.kind() << " never filled up";
  EXPECT_EQ(first_error.code(), StatusCode::kResourceExhausted) << first_error.ToString();
  EXPECT_GE(s->stats().write_errors, 1u);
  EXPECT_GT(stored, 10u);
  EXPECT_EQ(s->stats().blocks, stored);
  EXPECT_EQ(s->stats().corrupt_blocks, 0u);
  // Serving continues: every stored block reads back intact.
  for (uint64_t i = 0; i < stored; ++i) EXPECT_TRUE(ReadAndCheck(*s, i).ok()) << i;
  EXPECT_FALSE(s->Contains(HashOf(stored)));
  // Writing continues within the space there is, evicting the oldest blocks.
  uint64_t later_ok = 0;
  for (uint64_t i = 1000; i < 1005; ++i) {
    std::vector<uint8_t> b = BlockOf(i, kBlock);
    ASSERT_TRUE(s->SubmitWrite(HashOf(i), Ns(), testing::RegionOf(b), i).ok());
    std::vector<StoreCompletion> done;
    s->Drain(&done);
    ASSERT_EQ(done.size(), 1u);
    if (done[0].status.ok()) {
      ++later_ok;
      EXPECT_TRUE(ReadAndCheck(*s, i).ok());
    }
  }
  EXPECT_EQ(later_ok, 5u);
  EXPECT_GE(s->stats().evictions, 5u);
  // And the store reopens warm from the full disk.
  uint64_t blocks = s->stats().blocks;
  s.reset();
  s = MustOpen(o);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->stats().blocks, blocks);
  for (uint64_t i = 1000; i < 1005; ++i) EXPECT_TRUE(ReadAndCheck(*s, i).ok()) << i;
}

}  // namespace
}  // namespace strata::kvcache
