// HostStore's pinned arena: the CUDA runtime is looked up at run time; with
// no device (this machine: CUDA installed, no GPU), no runtime, or pinning
// turned off the store says it is not pinned, says why, and works as plain
// memory. Nothing here may crash when libcudart loads but finds no device.

#include <gtest/gtest.h>

#include "tests/support/test_memory.h"

#include <filesystem>
#include <string>
#include <vector>

#include "kvcache/host_store.h"

namespace strata::kvcache {
namespace {

constexpr uint64_t kBlock = 8192;

bool HaveGpu() { return std::filesystem::exists("/dev/nvidia0"); }

BlockHash H(int i) {
  BlockHash h;
  h.digest[0] = static_cast<uint8_t>(i);
  h.digest[9] = 0x3c;
  return h;
}

std::unique_ptr<HostStore> Make(bool pin, const std::string& library = "") {
  HostStoreOptions o;
  o.capacity_bytes = 4 * kBlock;
  o.block_bytes = kBlock;
  o.pin = pin;
  o.cudart_library = library;
  auto s = HostStore::Create(o);
  EXPECT_TRUE(s.ok()) << s.error().message();
  if (s.ok()) testing::AttachToTestSegments(s->get());
  return s.ok() ? std::move(s).value() : nullptr;
}

// Writes two blocks, evicts nothing, reads both back bit for bit.
void ExpectRoundTrip(HostStore& s) {
  const Sha256Digest ns{};
  std::vector<uint8_t> a(kBlock), b(kBlock);
  for (size_t i = 0; i < kBlock; ++i) {
    a[i] = static_cast<uint8_t>(i * 13 + 1);
    b[i] = static_cast<uint8_t>(i * 7 + 5);
  }
  ASSERT_TRUE(s.SubmitWrite(H(1), ns, testing::RegionOf(a), 1).ok());
  ASSERT_TRUE(s.SubmitWrite(H(2), ns, testing::RegionOf(b), 2).ok());
  std::vector<uint8_t> back_a(kBlock, 0), back_b(kBlock, 0);
  ASSERT_TRUE(s.SubmitRead(H(2), testing::RegionOf(back_b), 3).ok());
  ASSERT_TRUE(s.SubmitRead(H(1), testing::RegionOf(back_a), 4).ok());
  std::vector<StoreCompletion> done;
  s.Drain(&done);
  ASSERT_EQ(done.size(), 4u);
  for (const auto& c : done) EXPECT_TRUE(c.status.ok()) << c.tag << ": " << c.status.message();
  EXPECT_EQ(back_a, a);
  EXPECT_EQ(back_b, b);
  EXPECT_EQ(s.stats().blocks, 2u);
}

TEST(HostStorePinnedTest, DefaultLookupWithoutDeviceIsPlainMemoryAndWorks) {
  auto s = Make(true);
  ASSERT_NE(s, nullptr);
  if (HaveGpu()) {
    EXPECT_TRUE(s->pinned()) << s->pin_status();
  } else {
    EXPECT_FALSE(s->pinned());
    EXPECT_NE(s->pin_status().find("not pinned"), std::string::npos) << s->pin_status();
  }
  ExpectRoundTrip(*s);
  // A second store (the runtime is looked up once) and destruction of both.
  auto t = Make(true);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->pinned(), s->pinned());
  ExpectRoundTrip(*t);
}

TEST(HostStorePinnedTest, CudaRuntimeWithoutDeviceDoesNotPin) {
  // The installed runtime, named by path so the dlsym + cudaGetDeviceCount
  // path runs even where the loader's search path lacks it.
  std::string lib;
  for (const char* p : {"/usr/local/cuda/lib64/libcudart.so", "/usr/local/cuda/lib/libcudart.so"})
    if (std::filesystem::exists(p)) lib = p;
  if (lib.empty()) GTEST_SKIP() << "no CUDA runtime under /usr/local/cuda";
  if (HaveGpu()) GTEST_SKIP() << "a GPU is present";
  auto s = Make(true, lib);
  ASSERT_NE(s, nullptr);
  EXPECT_FALSE(s->pinned());
  EXPECT_NE(s->pin_status().find("no CUDA device"), std::string::npos) << s->pin_status();
  ExpectRoundTrip(*s);
}

TEST(HostStorePinnedTest, MissingRuntimeFallsBackToPlainMemory) {
  auto s = Make(true, "/nonexistent/libcudart.so.99");
  ASSERT_NE(s, nullptr);
  EXPECT_FALSE(s->pinned());
  EXPECT_NE(s->pin_status().find("no CUDA runtime"), std::string::npos) << s->pin_status();
  ExpectRoundTrip(*s);
}

TEST(HostStorePinnedTest, PinningCanBeTurnedOff) {
  auto s = Make(false);
  ASSERT_NE(s, nullptr);
  EXPECT_FALSE(s->pinned());
  EXPECT_NE(s->pin_status().find("turned off"), std::string::npos) << s->pin_status();
  ExpectRoundTrip(*s);
}

TEST(HostStorePinnedTest, MetadataOnlyAndEmptyStoresHaveNoArenaToPin) {
  HostStoreOptions o;
  o.capacity_bytes = 4 * kBlock;
  o.block_bytes = kBlock;
  o.metadata_only = true;
  auto s = HostStore::Create(o);
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE((*s)->pinned());
  o.metadata_only = false;
  o.capacity_bytes = kBlock - 1;  // no whole slot
  auto t = HostStore::Create(o);
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE((*t)->pinned());
  EXPECT_EQ((*t)->num_slots(), 0);
}

}  // namespace
}  // namespace strata::kvcache
