// The owner side's access rules: bounds, grants, leases, revocation and the
// quiescence that must come before memory is handed out again.
#include "transfer/exports.h"

#include <gtest/gtest.h>

#include <vector>

namespace strata::transfer {
namespace {

struct Fixture {
  std::vector<uint8_t> mem = std::vector<uint8_t>(4096);
  Segment seg{SegmentId(1), SegmentKind::kHost, nullptr, 4096, "test"};
  ExportTable t;
  Fixture() { seg.base = mem.data(); }
};

TEST(TransferExports, ReadableSegmentIsReadOnlyAndBounded) {
  Fixture f;
  auto h = f.t.ExportSegment(f.seg, "data");
  ASSERT_TRUE(h.has_value());
  EXPECT_FALSE(f.t.ExportSegment(f.seg, "data").has_value()) << "names are unique";
  auto v = f.t.OpenSegment("data", "peer-a", 0);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->length, 4096u);
  EXPECT_FALSE(v->writable);
  auto now = Clock::now();
  auto r = f.t.Begin(*h, "peer-a", 4000, 96, false, 1, now);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, f.mem.data() + 4000);
  f.t.End(*h, 1);
  EXPECT_EQ(f.t.Begin(*h, "peer-a", 4000, 97, false, 1, now).error().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(f.t.Begin(*h, "peer-a", UINT64_MAX, 2, false, 1, now).error().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(f.t.Begin(*h, "peer-a", 0, 0, false, 1, now).error().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(f.t.Begin(*h, "peer-a", 0, 8, true, 1, now).error().code(), StatusCode::kInvalidArgument)
      << "a readable segment is never writable";
  EXPECT_EQ(f.t.Begin(*h + 100, "peer-a", 0, 8, false, 1, now).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.t.refused(), 5u);
  EXPECT_FALSE(f.t.OpenSegment("nope", "peer-a", 0).has_value());
}

TEST(TransferExports, GrantIsForOnePeerWithinItsRegionUntilRevokedOrExpired) {
  Fixture f;
  auto g = f.t.Grant(f.mem.data() + 1024, 512, "decode-1", std::chrono::seconds(30));
  ASSERT_TRUE(g.has_value());
  auto now = Clock::now();
  EXPECT_FALSE(f.t.OpenGrant(*g, "decode-2", 0, now).has_value()) << "not the grantee";
  ASSERT_TRUE(f.t.OpenGrant(*g, "decode-1", 0, now).has_value());
  auto w = f.t.Begin(*g, "decode-1", 0, 512, true, 7, now);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(*w, f.mem.data() + 1024);
  f.t.End(*g, 7);
  EXPECT_EQ(f.t.Begin(*g, "decode-2", 0, 8, true, 7, now).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.t.Begin(*g, "decode-1", 500, 13, true, 7, now).error().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(f.t.Begin(*g, "decode-1", 0, 8, true, 7, now + std::chrono::seconds(31)).error().code(),
            StatusCode::kDeadlineExceeded)
      << "lease over";
  EXPECT_FALSE(f.t.Grant(f.mem.data(), 0, "x", std::chrono::seconds(1)).has_value());
  EXPECT_FALSE(f.t.Grant(f.mem.data(), 8, "", std::chrono::seconds(1)).has_value());
  EXPECT_FALSE(f.t.Grant(f.mem.data(), 8, "x", std::chrono::seconds(0)).has_value());
}

TEST(TransferExports, RevokeWaitsForAccessesInFlightAndDirectMappers) {
  Fixture f;
  auto g = f.t.Grant(f.mem.data(), 1024, "p", std::chrono::seconds(30));
  ASSERT_TRUE(g.has_value());
  auto now = Clock::now();
  ASSERT_TRUE(f.t.OpenGrant(*g, "p", /*direct_conn=*/9, now).has_value());
  ASSERT_TRUE(f.t.Begin(*g, "p", 0, 64, true, 42, now).has_value());  // a write arriving on connection 42
  EXPECT_FALSE(f.t.Quiesced(*g)) << "not revoked yet";
  auto conns = f.t.Revoke(*g);
  ASSERT_TRUE(conns.has_value());
  EXPECT_EQ(*conns, std::vector<uint64_t>{42}) << "the connection whose write is in flight is to be shut down";
  EXPECT_EQ(f.t.Begin(*g, "p", 0, 64, true, 43, now).error().code(), StatusCode::kInvalidArgument)
      << "no new access after revocation";
  EXPECT_FALSE(f.t.OpenGrant(*g, "p", 0, now).has_value());
  EXPECT_FALSE(f.t.Quiesced(*g)) << "an access is still in flight";
  f.t.End(*g, 42);
  EXPECT_FALSE(f.t.Quiesced(*g)) << "the direct mapper has not acknowledged";
  EXPECT_EQ(f.t.DirectMappers(*g), std::vector<uint64_t>{9});
  f.t.AckRevoke(*g, 8);
  EXPECT_FALSE(f.t.Quiesced(*g)) << "another connection's ack does not count";
  f.t.AckRevoke(*g, 9);
  EXPECT_TRUE(f.t.Quiesced(*g));
  f.t.Forget(*g);
  EXPECT_EQ(f.t.live_exports(), 0u);
}

TEST(TransferExports, AConnectionThatClosedNeedNotAcknowledge) {
  Fixture f;
  auto g = f.t.Grant(f.mem.data(), 1024, "p", std::chrono::seconds(30));
  ASSERT_TRUE(f.t.OpenGrant(*g, "p", 3, Clock::now()).has_value());
  ASSERT_TRUE(f.t.OpenGrant(*g, "p", 4, Clock::now()).has_value()) << "the same instance through a second connection";
  ASSERT_TRUE(f.t.Revoke(*g).has_value());
  EXPECT_FALSE(f.t.Quiesced(*g));
  f.t.ConnectionGone(3);
  EXPECT_FALSE(f.t.Quiesced(*g)) << "connection 4 still maps it";
  f.t.ConnectionGone(4);
  EXPECT_TRUE(f.t.Quiesced(*g));
  auto h = f.t.ExportSegment(f.seg, "seg");
  EXPECT_EQ(f.t.HandleOf("seg"), *h);
  EXPECT_FALSE(f.t.HandleOf("other").has_value());
}

}  // namespace
}  // namespace strata::transfer
