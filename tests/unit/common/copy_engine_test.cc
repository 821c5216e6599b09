// Memory segments and the CPU copy engine: registration and its refusals,
// region checks, locating a pointer, copies between every pair of segment
// kinds (host and pinned host move; device and file memory are refused by
// the CPU engine), zero-length and out-of-bounds regions refused with the
// segment named, and fences in both modes (inline and on a worker thread).

#include "common/copy_engine.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

namespace strata {
namespace {

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

TEST(SegmentTable, RegistersChecksResolvesAndLocates) {
  SegmentTable t;
  std::vector<uint8_t> a(4096), b(1024);
  auto sa = t.Register(SegmentKind::kHost, a.data(), a.size(), "a");
  auto sb = t.Register(SegmentKind::kPinnedHost, b.data(), b.size(), "b");
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_NE(*sa, *sb);
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t.Get(*sb)->kind, SegmentKind::kPinnedHost);
  EXPECT_TRUE(t.Check({*sa, 0, 4096}).ok());
  EXPECT_TRUE(t.Check({*sa, 4095, 1}).ok());
  auto span = t.Resolve({*sa, 100, 8});
  ASSERT_TRUE(span.ok());
  EXPECT_EQ(span->data(), a.data() + 100);
  EXPECT_EQ(span->size(), 8u);

  // Out of bounds, zero length, offsets that would wrap: refused, naming the segment.
  for (const Region& r : {Region{*sa, 4090, 7}, Region{*sa, 4096, 1}, Region{*sa, 0, 4097},
                          Region{*sa, UINT64_MAX, 2}, Region{*sa, 2, UINT64_MAX}}) {
    Status s = t.Check(r);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << r.offset << " +" << r.length;
    EXPECT_NE(s.message().find("out of bounds of segment"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("(a, host, 4096 bytes)"), std::string::npos) << s.message();
  }
  Status zero = t.Check({*sa, 10, 0});
  EXPECT_NE(zero.message().find("zero-length region"), std::string::npos) << zero.message();
  EXPECT_EQ(t.Check({SegmentId(999), 0, 1}).code(), StatusCode::kNotFound);

  auto at = t.Locate(a.data() + 4000, 96);
  ASSERT_TRUE(at.ok());
  EXPECT_EQ(*at, (Region{*sa, 4000, 96}));
  EXPECT_FALSE(t.Locate(a.data() + 4000, 97).ok());  // runs past the end
  std::vector<uint8_t> other(16);
  EXPECT_EQ(t.Locate(other.data(), 1).error().code(), StatusCode::kNotFound);

  ASSERT_TRUE(t.Unregister(*sa).ok());
  EXPECT_EQ(t.Check({*sa, 0, 1}).code(), StatusCode::kNotFound);
  EXPECT_EQ(t.Unregister(*sa).code(), StatusCode::kNotFound);
  auto again = t.Register(SegmentKind::kHost, a.data(), a.size(), "a again");
  ASSERT_TRUE(again.ok());
  EXPECT_NE(*again, *sa);  // ids are never reused
}

TEST(SegmentTable, RefusesBadRegistrations) {
  SegmentTable t;
  std::vector<uint8_t> a(4096);
  EXPECT_FALSE(t.Register(SegmentKind::kHost, a.data(), 0, "empty").ok());
  EXPECT_FALSE(t.Register(SegmentKind::kHost, nullptr, 16, "null").ok());
  EXPECT_FALSE(t.Register(SegmentKind::kDevice, nullptr, 16, "null device").ok());
  EXPECT_TRUE(t.Register(SegmentKind::kFile, nullptr, 1 << 20, "a file").ok());  // files have no address
  ASSERT_TRUE(t.Register(SegmentKind::kHost, a.data(), 2048, "low half").ok());
  auto overlap = t.Register(SegmentKind::kPinnedHost, a.data() + 2047, 16, "overlap");
  ASSERT_FALSE(overlap.ok());
  EXPECT_NE(overlap.error().message().find("overlaps segment"), std::string::npos) << overlap.error().message();
  EXPECT_TRUE(t.Register(SegmentKind::kHost, a.data() + 2048, 2048, "high half").ok());  // adjacent is fine
  auto wrap = t.Register(SegmentKind::kHost, reinterpret_cast<uint8_t*>(UINTPTR_MAX - 8), 64, "wrap");
  EXPECT_FALSE(wrap.ok());
}

class CopyEngineTest : public ::testing::TestWithParam<CpuCopyEngine::Mode> {};

TEST_P(CopyEngineTest, CopiesBetweenEveryPairOfHostKindsAndRefusesTheRest) {
  SegmentTable t;
  const SegmentKind kinds[] = {SegmentKind::kHost, SegmentKind::kPinnedHost, SegmentKind::kDevice, SegmentKind::kFile};
  std::vector<std::vector<uint8_t>> mem;
  std::vector<SegmentId> ids;
  for (size_t i = 0; i < 4; ++i) {
    mem.push_back(Pattern(256, static_cast<uint8_t>(i * 50)));
    // Device memory on this CPU-only machine is stood in for by a host
    // buffer registered as device: the CPU engine must refuse it by kind.
    uint8_t* base = kinds[i] == SegmentKind::kFile ? nullptr : mem[i].data();
    ids.push_back(*t.Register(kinds[i], base, 256, std::string(SegmentKindName(kinds[i]))));
  }
  CpuCopyEngine e(&t, GetParam());
  uint64_t tag = 0;
  std::vector<uint64_t> want_tags;
  for (size_t d = 0; d < 4; ++d) {
    for (size_t s = 0; s < 4; ++s) {
      if (d == s) continue;
      const bool movable = HostAddressable(kinds[d]) && HostAddressable(kinds[s]);
      Status st = e.Submit({ids[d], 64, 32}, {ids[s], 0, 32}, ++tag);
      EXPECT_EQ(st.ok(), movable) << SegmentKindName(kinds[s]) << " -> " << SegmentKindName(kinds[d]) << ": "
                                  << st.ToString();
      if (movable) {
        want_tags.push_back(tag);
        e.Wait(e.Fence());
        const std::vector<uint8_t> src = Pattern(256, static_cast<uint8_t>(s * 50));
        EXPECT_TRUE(std::equal(src.begin(), src.begin() + 32, mem[d].begin() + 64));
      } else {
        EXPECT_NE(st.message().find("not host-addressable"), std::string::npos) << st.message();
      }
    }
  }
  std::vector<CopyCompletion> done;
  e.Poll(&done);
  ASSERT_EQ(done.size(), want_tags.size());
  for (size_t i = 0; i < done.size(); ++i) {
    EXPECT_EQ(done[i].tag, want_tags[i]);  // in submission order
    EXPECT_TRUE(done[i].status.ok());
  }
}

TEST_P(CopyEngineTest, BadRegionsAreRefusedAndNothingIsCopied) {
  SegmentTable t;
  std::vector<uint8_t> a = Pattern(128, 1), b(128, 0);
  const SegmentId sa = *t.Register(SegmentKind::kHost, a.data(), a.size(), "a");
  const SegmentId sb = *t.Register(SegmentKind::kHost, b.data(), b.size(), "b");
  CpuCopyEngine e(&t, GetParam());
  struct Case {
    Region dst, src;
    const char* needle;
  };
  const Case cases[] = {
      {{sb, 0, 0}, {sa, 0, 0}, "zero-length"},
      {{sb, 100, 64}, {sa, 0, 64}, "out of bounds of segment"},
      {{sb, 0, 64}, {sa, 100, 64}, "out of bounds of segment"},
      {{sb, 0, 16}, {sa, 0, 32}, "differs from source length"},
      {{SegmentId(77), 0, 8}, {sa, 0, 8}, "not registered"},
      {{sa, 8, 16}, {sa, 0, 16}, "overlap"},
  };
  for (const Case& c : cases) {
    Status s = e.Submit(c.dst, c.src, 1);
    ASSERT_FALSE(s.ok()) << c.needle;
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << s.message();
  }
  EXPECT_TRUE(e.Reached(e.Fence()));  // nothing was queued
  std::vector<CopyCompletion> done;
  EXPECT_EQ(e.Poll(&done), 0u);
  EXPECT_EQ(b, std::vector<uint8_t>(128, 0));
  // Non-overlapping regions of one segment are fine.
  ASSERT_TRUE(e.Submit({sa, 64, 16}, {sa, 0, 16}, 2).ok());
  e.Wait(e.Fence());
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 16, a.begin() + 64));
}

TEST_P(CopyEngineTest, AFenceCoversEveryEarlierCopy) {
  SegmentTable t;
  constexpr size_t kBlocks = 64, kBlock = 64 << 10;  // 4 MiB: the worker has real work
  std::vector<uint8_t> src(kBlocks * kBlock), dst(kBlocks * kBlock, 0);
  std::iota(src.begin(), src.end(), 0);
  const SegmentId s = *t.Register(SegmentKind::kHost, src.data(), src.size(), "src");
  const SegmentId d = *t.Register(SegmentKind::kPinnedHost, dst.data(), dst.size(), "dst");
  CpuCopyEngine e(&t, GetParam());
  EXPECT_TRUE(e.Reached(e.Fence()));  // the empty fence
  CopyFence half;
  for (size_t i = 0; i < kBlocks; ++i) {
    ASSERT_TRUE(e.Submit({d, i * kBlock, kBlock}, {s, (kBlocks - 1 - i) * kBlock, kBlock}, i).ok());
    if (i == kBlocks / 2 - 1) half = e.Fence();
  }
  const CopyFence all = e.Fence();
  e.Wait(half);
  EXPECT_TRUE(e.Reached(half));
  for (size_t i = 0; i < kBlocks / 2; ++i)
    ASSERT_EQ(0, std::memcmp(dst.data() + i * kBlock, src.data() + (kBlocks - 1 - i) * kBlock, kBlock)) << i;
  e.Wait(all);
  EXPECT_TRUE(e.Reached(all));
  EXPECT_EQ(0, std::memcmp(dst.data() + (kBlocks - 1) * kBlock, src.data(), kBlock));
  std::vector<CopyCompletion> done;
  EXPECT_EQ(e.Poll(&done), kBlocks);
  for (size_t i = 0; i < kBlocks; ++i) EXPECT_EQ(done[i].tag, i);
}

INSTANTIATE_TEST_SUITE_P(Modes, CopyEngineTest,
                         ::testing::Values(CpuCopyEngine::Mode::kInline, CpuCopyEngine::Mode::kWorker),
                         [](const auto& info) {
                           return info.param == CpuCopyEngine::Mode::kInline ? std::string("Inline")
                                                                              : std::string("Worker");
                         });

TEST(CopyEngine, DestroyingAWorkerEngineFinishesItsCopies) {
  SegmentTable t;
  std::vector<uint8_t> src = Pattern(1 << 20, 3), dst(1 << 20, 0);
  const SegmentId s = *t.Register(SegmentKind::kHost, src.data(), src.size(), "src");
  const SegmentId d = *t.Register(SegmentKind::kHost, dst.data(), dst.size(), "dst");
  {
    CpuCopyEngine e(&t, CpuCopyEngine::Mode::kWorker);
    for (size_t i = 0; i < 16; ++i) ASSERT_TRUE(e.Submit({d, i << 16, 1 << 16}, {s, i << 16, 1 << 16}, i).ok());
  }
  EXPECT_EQ(src, dst);
}

}  // namespace
}  // namespace strata
