// The cluster pool's JSON messages: round trips, and malformed input refused
// with a message naming what is wrong (a peer's reply is never trusted).

#include "cluster/kv_wire.h"

#include <gtest/gtest.h>

namespace strata::cluster {
namespace {

using kvcache::KvEvent;
using kvcache::TierKind;

BlockHash H(int i) {
  BlockHash h;
  for (size_t k = 0; k < h.digest.size(); ++k) h.digest[k] = static_cast<uint8_t>(i * 7 + k);
  return h;
}

TEST(KvWireTest, EventsSnapshotsAndResolvesRoundTrip) {
  EventsReply r{"a", "inc1", 42, 3, {}};
  r.batches.push_back({"a", "inc1", 42, 2, {{KvEvent::Kind::kStored, H(1), TierKind::kHost},
                                          {KvEvent::Kind::kRemoved, H(2), TierKind::kDevice}}});
  auto back = EventsReplyFromJson(EventsReplyToJson(r));
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  ASSERT_EQ(back->batches.size(), 1u);
  EXPECT_EQ(back->batches[0].instance, "a");
  EXPECT_EQ(back->batches[0].seq_first, 2u);
  ASSERT_EQ(back->batches[0].events.size(), 2u);
  EXPECT_EQ(back->batches[0].events[1].hash, H(2));
  EXPECT_EQ(back->batches[0].events[1].kind, KvEvent::Kind::kRemoved);
  EXPECT_EQ(back->batches[0].events[0].tier, TierKind::kHost);

  kvcache::KvSnapshot s{"a", "inc1", 42, 9, {{H(3), TierKind::kDisk}}};
  auto sb = SnapshotFromJson(SnapshotToJson(s));
  ASSERT_TRUE(sb.ok());
  EXPECT_EQ(sb->seq, 9u);
  EXPECT_EQ(sb->blocks, s.blocks);

  ResolveRequest q{"b", 500, {H(4), H(5)}};
  auto qb = ResolveRequestFromJson(ResolveRequestToJson(q));
  ASSERT_TRUE(qb.ok());
  EXPECT_EQ(qb->hashes, q.hashes);
  EXPECT_EQ(qb->lease_ms, 500);

  ResolveReply p{7, {{"kv.host", 4096, 1024, 0x0123456789abcdefull}}};
  auto pb = ResolveReplyFromJson(ResolveReplyToJson(p));
  ASSERT_TRUE(pb.ok());
  EXPECT_EQ(pb->lease, 7u);
  ASSERT_EQ(pb->blocks.size(), 1u);
  EXPECT_EQ(pb->blocks[0].checksum, 0x0123456789abcdefull);
  EXPECT_EQ(pb->blocks[0].offset, 4096u);
}

TEST(KvWireTest, MalformedMessagesAreRefused) {
  EXPECT_FALSE(HashFromHex("abc").ok());
  EXPECT_FALSE(HashFromHex(std::string(64, 'g')).ok());
  EXPECT_FALSE(EventsReplyFromJson("not json").ok());
  EXPECT_FALSE(EventsReplyFromJson(R"({"instance":"a","incarnation":"i","batches":[{"seq_first":0,"events":[]}]})").ok());
  EXPECT_FALSE(EventsReplyFromJson(
                   R"({"instance":"a","incarnation":"i","batches":[{"seq_first":1,"events":[[1,"zz","host"]]}]})")
                   .ok());
  EXPECT_FALSE(SnapshotFromJson(R"({"instance":"a","incarnation":"i","blocks":[["00","tape"]]})").ok());
  auto q = ResolveRequestFromJson(R"({"reader":"b","lease_ms":0,"hashes":[]})");
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.error().message().find("lease_ms"), std::string::npos);
  EXPECT_FALSE(ResolveRequestFromJson(R"({"reader":"b","lease_ms":5,"hashes":[1]})").ok());
  EXPECT_FALSE(ResolveReplyFromJson(R"({"lease":1,"blocks":[{"segment":"s","offset":0,"length":8,"checksum":"12"}]})").ok());
}

}  // namespace
}  // namespace strata::cluster
