// The transfer engine's framing, authentication primitives and flag parsing.
#include "transfer/wire.h"

#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "transfer/transfer_engine.h"

namespace strata::transfer {
namespace {

TEST(TransferWire, HeaderRoundTrips) {
  FrameHeader h;
  h.type = FrameType::kWrite;
  h.status = StatusCode::kOutOfRange;
  h.payload_bytes = 4096;
  h.request_id = 0x0102030405060708ull;
  h.handle = 77;
  h.offset = 1ull << 40;
  h.length = 4096;
  uint8_t buf[kHeaderBytes];
  EncodeHeader(h, buf);
  auto d = DecodeHeader(buf);
  ASSERT_TRUE(d.has_value()) << d.error().message();
  EXPECT_EQ(d->type, FrameType::kWrite);
  EXPECT_EQ(d->status, StatusCode::kOutOfRange);
  EXPECT_EQ(d->payload_bytes, 4096u);
  EXPECT_EQ(d->request_id, h.request_id);
  EXPECT_EQ(d->handle, 77u);
  EXPECT_EQ(d->offset, 1ull << 40);
  EXPECT_EQ(d->length, 4096u);
}

TEST(TransferWire, RejectsMalformedHeaders) {
  FrameHeader h;
  h.type = FrameType::kOpenSegment;
  h.payload_bytes = 10;
  uint8_t buf[kHeaderBytes];
  EncodeHeader(h, buf);
  ASSERT_TRUE(DecodeHeader(buf).has_value());

  uint8_t bad[kHeaderBytes];
  std::memcpy(bad, buf, kHeaderBytes);
  bad[0] ^= 1;  // magic
  EXPECT_EQ(DecodeHeader(bad).error().code(), StatusCode::kCorrupt);
  std::memcpy(bad, buf, kHeaderBytes);
  bad[4] = 0;  // type 0
  EXPECT_EQ(DecodeHeader(bad).error().code(), StatusCode::kCorrupt);
  bad[4] = 99;  // unknown type
  EXPECT_EQ(DecodeHeader(bad).error().code(), StatusCode::kCorrupt);
  std::memcpy(bad, buf, kHeaderBytes);
  bad[5] = 200;  // unknown status
  EXPECT_EQ(DecodeHeader(bad).error().code(), StatusCode::kCorrupt);
  EXPECT_EQ(DecodeHeader(std::span<const uint8_t>(buf, 10)).error().code(), StatusCode::kCorrupt);

  // A control frame may not carry a large payload.
  h.payload_bytes = kMaxControlPayload + 1;
  EncodeHeader(h, buf);
  EXPECT_EQ(DecodeHeader(buf).error().code(), StatusCode::kCorrupt);
  // A write's payload must equal its length, within the frame limit.
  h.type = FrameType::kWrite;
  h.length = 100;
  h.payload_bytes = 99;
  EncodeHeader(h, buf);
  EXPECT_EQ(DecodeHeader(buf).error().code(), StatusCode::kCorrupt);
  h.length = kMaxDataPayload + 1;
  h.payload_bytes = static_cast<uint32_t>(h.length);
  EncodeHeader(h, buf);
  EXPECT_EQ(DecodeHeader(buf).error().code(), StatusCode::kCorrupt);
  // A read may not ask for more than a frame carries.
  h.type = FrameType::kRead;
  h.payload_bytes = 0;
  EncodeHeader(h, buf);
  EXPECT_EQ(DecodeHeader(buf).error().code(), StatusCode::kCorrupt);
}

TEST(TransferWire, FramesCrossASocket) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  FrameHeader h;
  h.type = FrameType::kOpenReply;
  h.request_id = 5;
  ASSERT_TRUE(SendFrame(sv[0], h, "{\"handle\":3}").ok());
  auto got = RecvHeader(sv[1]);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->type, FrameType::kOpenReply);
  EXPECT_EQ(got->request_id, 5u);
  std::string payload(got->payload_bytes, '\0');
  ASSERT_TRUE(RecvAll(sv[1], payload.data(), payload.size(), "payload").ok());
  EXPECT_EQ(payload, "{\"handle\":3}");
  ::close(sv[0]);
  auto eof = RecvHeader(sv[1]);
  ASSERT_FALSE(eof.has_value());
  EXPECT_EQ(eof.error().code(), StatusCode::kUnavailable);
  ::close(sv[1]);
}

TEST(TransferWire, HmacMatchesRfc4231) {
  // RFC 4231 test case 2.
  auto d = HmacSha256("Jefe", "what do ya want for nothing?");
  EXPECT_EQ(ToHex(d), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  auto other = HmacSha256("jefe", "what do ya want for nothing?");
  EXPECT_FALSE(DigestEqual(d, other));
  EXPECT_TRUE(DigestEqual(d, d));
  EXPECT_EQ(RandomHex(16).size(), 32u);
  EXPECT_NE(RandomHex(16), RandomHex(16));
}

TEST(TransferWire, ParsesAddressesAndTransports) {
  auto hp = SplitHostPort("127.0.0.1:8080");
  ASSERT_TRUE(hp.has_value());
  EXPECT_EQ(hp->first, "127.0.0.1");
  EXPECT_EQ(hp->second, 8080);
  EXPECT_FALSE(SplitHostPort("127.0.0.1").has_value());
  EXPECT_FALSE(SplitHostPort("h:99999").has_value());
  EXPECT_FALSE(SplitHostPort("h:8x").has_value());
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackAddress("localhost"));
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0"));

  auto t = ParseTransports("shm, tcp");
  ASSERT_TRUE(t.has_value());
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0], Transport::kShm);
  EXPECT_EQ((*t)[1], Transport::kTcp);
  EXPECT_EQ(ParseTransports("tcp,carrier-pigeon").error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTransports("rdma").error().code(), StatusCode::kUnsupported);
  EXPECT_FALSE(ParseTransports("").has_value());
}

}  // namespace
}  // namespace strata::transfer
