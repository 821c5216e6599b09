// Two transfer engines in one process, over real sockets (tcp) and real
// same-host shared memory (shm): data integrity, access rules as the
// requester sees them, deadlines and the test-only fault layer.
#include "transfer/transfer_engine.h"

#include <gtest/gtest.h>

#include <sys/socket.h>

#include <cstring>
#include <random>
#include <thread>

#include "tests/support/transfer_peer.h"
#include "transfer/engine_impl.h"
#include "transfer/shared_memory.h"
#include "transfer/wire.h"

namespace strata::transfer {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kBytes = 4 << 20;

using strata::testing::WaitBounded;


struct Side {
  SegmentTable segments;
  SharedHostMemory data, inbox;
  SegmentId data_id, inbox_id;
  std::unique_ptr<TransferEngine> engine;
};

std::unique_ptr<Side> MakeSide(const std::string& name, std::vector<Transport> transports, uint64_t seed,
                               const std::string& secret = "s3cret") {
  auto s = std::make_unique<Side>();
  s->data = std::move(*SharedHostMemory::Allocate(kBytes, name + " data"));
  s->inbox = std::move(*SharedHostMemory::Allocate(kBytes, name + " inbox"));
  std::mt19937_64 rng(seed);
  for (uint64_t i = 0; i < kBytes; i += 8) {
    uint64_t v = rng();
    std::memcpy(s->data.data() + i, &v, 8);
  }
  s->data_id = *s->segments.Register(SegmentKind::kHost, s->data.data(), kBytes, "data");
  s->inbox_id = *s->segments.Register(SegmentKind::kHost, s->inbox.data(), kBytes, "inbox");
  TransferOptions o;
  o.instance_name = name;
  o.transports = std::move(transports);
  o.cluster_secret = secret;
  o.connections_per_peer = 2;
  auto e = TransferEngine::Start(o, &s->segments);
  EXPECT_TRUE(e.has_value()) << e.error().message();
  s->engine = std::move(*e);
  auto h = s->engine->ExportSegment(s->data_id, "data");
  EXPECT_TRUE(h.has_value());
  return s;
}

class TransferEngineTest : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    owner_ = MakeSide("owner", {Transport::kTcp}, 1);
    client_ = MakeSide("client", {GetParam()}, 2);
    auto p = client_->engine->Connect(owner_->engine->address());
    ASSERT_TRUE(p.has_value()) << p.error().message();
    peer_ = *p;
  }
  BatchResult Run(std::vector<TransferOp> ops, std::chrono::milliseconds deadline = 10s) {
    auto b = client_->engine->Submit(std::move(ops), Clock::now() + deadline);
    EXPECT_TRUE(b.has_value());
    if (!b) return {};
    return WaitBounded(*client_->engine, *b);
  }
  std::unique_ptr<Side> owner_, client_;
  uint64_t peer_ = 0;
};

TEST_P(TransferEngineTest, RandomBlocksArriveByteForByte) {
  auto data = client_->engine->OpenSegment(peer_, "data");
  ASSERT_TRUE(data.has_value()) << data.error().message();
  EXPECT_EQ(data->transport, GetParam());
  auto grant = owner_->engine->Grant(Region{owner_->inbox_id, 1 << 20, 2 << 20}, "client", 30s);
  ASSERT_TRUE(grant.has_value());
  auto inbox = client_->engine->OpenGrant(peer_, *grant);
  ASSERT_TRUE(inbox.has_value()) << inbox.error().message();
  EXPECT_TRUE(inbox->writable);

  std::mt19937_64 rng(3);
  std::vector<TransferOp> ops;
  std::vector<std::pair<uint64_t, uint64_t>> reads, writes;  // (remote, local) offsets
  std::vector<uint64_t> lens;
  uint64_t local = 0, next_write = 0;
  for (int i = 0; i < 24; ++i) {
    uint64_t len = 1 + rng() % (48 << 10);
    bool read = i % 2 == 0;
    // Reads anywhere (they may overlap); writes to disjoint places.
    uint64_t remote = read ? rng() % (kBytes - len) : next_write + rng() % 4096;
    if (!read) next_write = remote + len;
    ops.push_back({read ? OpKind::kRead : OpKind::kWrite, Region{read ? client_->inbox_id : client_->data_id, local, len},
                   read ? *data : *inbox, remote});
    local += len;
  }
  auto r = Run(ops);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  for (const auto& op : ops) {
    auto l = client_->segments.Resolve(op.local);
    const uint8_t* remote = op.kind == OpKind::kRead ? owner_->data.data() + op.remote_offset
                                                     : owner_->inbox.data() + (1 << 20) + op.remote_offset;
    ASSERT_EQ(std::memcmp(l->data(), remote, l->size()), 0);
    ASSERT_EQ(PayloadChecksum(l->data(), l->size()), PayloadChecksum(remote, l->size()));
  }
  // Nothing outside the grant was touched.
  for (uint64_t i = 0; i < (1 << 20); ++i) ASSERT_EQ(owner_->inbox.data()[i], 0) << i;
  for (uint64_t i = 3 << 20; i < kBytes; ++i) ASSERT_EQ(owner_->inbox.data()[i], 0) << i;
  EXPECT_GT(client_->engine->stats().latency_count, 0u);
}

TEST_P(TransferEngineTest, AccessOutsideTheRulesFailsAndHarmsNothing) {
  auto data = client_->engine->OpenSegment(peer_, "data");
  ASSERT_TRUE(data.has_value());
  auto grant = owner_->engine->Grant(Region{owner_->inbox_id, 4096, 4096}, "client", 30s);
  auto inbox = client_->engine->OpenGrant(peer_, *grant);
  ASSERT_TRUE(inbox.has_value());
  Region l{client_->data_id, 0, 4096};

  // Out of bounds, both ends.
  auto r = Run({{OpKind::kWrite, l, *inbox, 1}});
  EXPECT_EQ(r.status.code(), StatusCode::kOutOfRange) << r.status.message();
  r = Run({{OpKind::kRead, l, *data, kBytes - 100}});
  EXPECT_EQ(r.status.code(), StatusCode::kOutOfRange) << r.status.message();
  // A readable segment is not writable.
  r = Run({{OpKind::kWrite, l, *data, 0}});
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << r.status.message();
  // A grant for someone else, opened or forged.
  auto other = owner_->engine->Grant(Region{owner_->inbox_id, 0, 4096}, "someone-else", 30s);
  EXPECT_FALSE(client_->engine->OpenGrant(peer_, *other).has_value());
  RemoteHandle forged = *inbox;
  forged.handle = *other;
  r = Run({{OpKind::kWrite, l, forged, 0}});
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << r.status.message();
  // The local region must be registered.
  EXPECT_FALSE(client_->engine->Submit({{OpKind::kRead, Region{SegmentId(99), 0, 8}, *data, 0}}, Clock::now() + 1s)
                   .has_value());

  for (uint64_t i = 0; i < kBytes; ++i) ASSERT_EQ(owner_->inbox.data()[i], 0) << i;
  auto s = owner_->engine->stats();
  auto c = client_->engine->stats();
  EXPECT_GE(s.refused + c.refused_locally, 4u);
  // And both still work.
  r = Run({{OpKind::kWrite, l, *inbox, 0}});
  EXPECT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(std::memcmp(owner_->inbox.data() + 4096, client_->data.data(), 4096), 0);
}

TEST_P(TransferEngineTest, ARevokedGrantReachesNothing) {
  auto grant = owner_->engine->Grant(Region{owner_->inbox_id, 0, 65536}, "client", 30s);
  auto inbox = client_->engine->OpenGrant(peer_, *grant);
  ASSERT_TRUE(inbox.has_value());
  Region l{client_->data_id, 0, 65536};
  ASSERT_TRUE(Run({{OpKind::kWrite, l, *inbox, 0}}).status.ok());
  ASSERT_TRUE(owner_->engine->Revoke(*grant).ok());
  auto until = Clock::now() + 5s;
  while (!owner_->engine->Quiesced(*grant) && Clock::now() < until) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(owner_->engine->Quiesced(*grant)) << "the grantee acknowledged (shm) or nothing was in flight (tcp)";
  std::memset(owner_->inbox.data(), 0xee, 65536);  // the memory is handed out again

  Region back{client_->inbox_id, 0, 65536};
  std::memset(client_->inbox.data(), 0x11, 65536);
  auto r = Run({{OpKind::kWrite, l, *inbox, 0}, {OpKind::kRead, back, *inbox, 0}});
  EXPECT_EQ(r.ops[0].code(), StatusCode::kInvalidArgument) << r.ops[0].message();
  EXPECT_EQ(r.ops[1].code(), StatusCode::kInvalidArgument) << r.ops[1].message();
  for (int i = 0; i < 65536; ++i) ASSERT_EQ(owner_->inbox.data()[i], 0xee);
  for (int i = 0; i < 65536; ++i) ASSERT_EQ(client_->inbox.data()[i], 0x11) << "the old handle read nothing";
  EXPECT_FALSE(client_->engine->OpenGrant(peer_, *grant).has_value());
}

TEST_P(TransferEngineTest, DeadlinesAndInjectedFaults) {
  auto data = client_->engine->OpenSegment(peer_, "data");
  ASSERT_TRUE(data.has_value());
  Region l{client_->inbox_id, 0, 65536};

  // Delayed past the deadline: a timeout, and the local memory untouched.
  std::memset(client_->inbox.data(), 0x22, 65536);
  client_->engine->SetFaults({{FaultRule::Action::kDelay, std::nullopt, 0, 1, 0.5}});
  auto r = Run({{OpKind::kRead, l, *data, 0}}, 100ms);
  EXPECT_EQ(r.status.code(), StatusCode::kDeadlineExceeded) << r.status.message();
  EXPECT_LT(r.seconds, 0.45);
  std::this_thread::sleep_for(500ms);
  for (int i = 0; i < 65536; ++i) ASSERT_EQ(client_->inbox.data()[i], 0x22);
  // Delayed within the deadline: fine.
  client_->engine->SetFaults({{FaultRule::Action::kDelay, std::nullopt, 0, 1, 0.05}});
  EXPECT_TRUE(Run({{OpKind::kRead, l, *data, 0}}).status.ok());
  // Dropped: times out.
  client_->engine->SetFaults({{FaultRule::Action::kDrop, std::nullopt, 0, 1, 0}});
  EXPECT_EQ(Run({{OpKind::kRead, l, *data, 0}}, 100ms).status.code(), StatusCode::kDeadlineExceeded);
  // Failed: the error says so; the next op is fine.
  client_->engine->SetFaults({{FaultRule::Action::kFail, std::nullopt, 0, 1, 0}});
  r = Run({{OpKind::kRead, l, *data, 0}, {OpKind::kRead, l, *data, 0}});
  EXPECT_EQ(r.ops[0].code(), StatusCode::kInternal);
  EXPECT_TRUE(r.ops[1].ok());
  // Corrupted in flight: the op "succeeds"; the caller's checksum catches it.
  client_->engine->SetFaults({{FaultRule::Action::kCorrupt, OpKind::kRead, 0, 1, 0}});
  r = Run({{OpKind::kRead, l, *data, 0}});
  EXPECT_TRUE(r.status.ok());
  EXPECT_NE(PayloadChecksum(client_->inbox.data(), 65536), PayloadChecksum(owner_->data.data(), 65536));
  // Endpoint torn down before sending (tcp): the op moves to another connection.
  client_->engine->SetFaults({{FaultRule::Action::kTeardown, std::nullopt, 0, 1, 0}});
  r = Run({{OpKind::kRead, l, *data, 0}});
  EXPECT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(PayloadChecksum(client_->inbox.data(), 65536), PayloadChecksum(owner_->data.data(), 65536));
  client_->engine->SetFaults({});
  client_->engine->TearDownPeer(peer_);
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(Run({{OpKind::kRead, l, *data, 4096}}).status.ok());
  EXPECT_GE(client_->engine->stats().timeouts, 2u);
  EXPECT_EQ(client_->engine->stats().batches_in_flight, 0u);
}

INSTANTIATE_TEST_SUITE_P(Transports, TransferEngineTest, ::testing::Values(Transport::kTcp, Transport::kShm),
                         [](const auto& info) { return std::string(TransportName(info.param)); });

TEST(TransferEngineAuth, AWrongSecretIsRefusedAndCounted) {
  auto owner = MakeSide("owner", {Transport::kTcp}, 1, "right");
  auto intruder = MakeSide("intruder", {Transport::kTcp}, 2, "wrong");
  auto p = intruder->engine->Connect(owner->engine->address());
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.error().code(), StatusCode::kInvalidArgument) << p.error().message();
  EXPECT_NE(p.error().message().find("secret"), std::string::npos) << p.error().message();
  auto until = Clock::now() + 2s;
  while (owner->engine->stats().failed_handshakes == 0 && Clock::now() < until) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(owner->engine->stats().failed_handshakes, 1u);
  EXPECT_EQ(intruder->engine->stats().failed_handshakes, 1u);
  auto friendly = MakeSide("friend", {Transport::kTcp}, 3, "right");
  EXPECT_TRUE(friendly->engine->Connect(owner->engine->address()).has_value()) << "the owner keeps serving";
}

TEST(TransferEngineAuth, NoSecretMeansLoopbackOnly) {
  SegmentTable t;
  TransferOptions o;
  o.instance_name = "x";
  o.bind_address = "0.0.0.0";
  auto e = TransferEngine::Start(o, &t);
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.error().message().find("secret"), std::string::npos);
  o.cluster_secret = "k";
  EXPECT_TRUE(TransferEngine::Start(o, &t).has_value());
}

TEST(TransferMetrics, RendersEveryFamily) {
  TransferStats s;
  s.tcp.read_bytes = 5;
  s.timeouts = 2;
  s.latency_buckets = {0.001};
  s.latency_counts = {3, 1};
  s.latency_count = 4;
  std::string text = RenderTransferMetrics(s);
  EXPECT_NE(text.find("strata_transfer_bytes_total{transport=\"tcp\",direction=\"read\"} 5"), std::string::npos);
  EXPECT_NE(text.find("strata_transfer_timeouts_total 2"), std::string::npos);
  EXPECT_NE(text.find("strata_transfer_op_seconds_bucket{le=\"+Inf\"} 4"), std::string::npos);
  EXPECT_NE(text.find("strata_transfer_failed_handshakes_total 0"), std::string::npos);
}

}  // namespace
}  // namespace strata::transfer

namespace strata::transfer {
namespace {

// An open racing a revocation never leaves a live handle to memory the owner
// was told it may reuse (shm: the revoke can overtake the open's mapping).
TEST_P(TransferEngineTest, AnOpenRacingARevokeNeverWritesAfterQuiesced) {
  std::mt19937 rng(5);
  for (int i = 0; i < 100; ++i) {
    auto grant = owner_->engine->Grant(Region{owner_->inbox_id, 0, kBytes}, "client", 30s);
    ASSERT_TRUE(grant.has_value());
    Result<RemoteHandle> opened = Status::Internal("unset");
    std::thread opener([&] { opened = client_->engine->OpenGrant(peer_, *grant); });
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 1500));
    ASSERT_TRUE(owner_->engine->Revoke(*grant).ok());
    auto until = Clock::now() + 10s;
    while (!owner_->engine->Quiesced(*grant) && Clock::now() < until) std::this_thread::sleep_for(100us);
    ASSERT_TRUE(owner_->engine->Quiesced(*grant));
    std::memset(owner_->inbox.data(), 0xee, 4096);  // handed out again
    opener.join();
    if (opened) {
      auto r = Run({{OpKind::kWrite, Region{client_->data_id, 0, 4096}, *opened, 0}});
      EXPECT_FALSE(r.status.ok()) << "iteration " << i;
    }
    for (int k = 0; k < 4096; ++k) ASSERT_EQ(owner_->inbox.data()[k], 0xee) << "iteration " << i;
  }
}

// A peer that asks for a big read and never reads the reply cannot hold a
// revocation: the connection is shut down and the export quiesces.
TEST(TransferEngineRevoke, AStalledReaderDoesNotHoldARevoke) {
  auto owner = MakeSide("owner", {Transport::kTcp}, 1);
  auto hp = SplitHostPort(owner->engine->address());
  auto fd = ConnectTcp(hp->first, hp->second, 5);
  ASSERT_TRUE(fd.has_value());
  // The handshake by hand.
  auto h = RecvHeader(*fd);
  ASSERT_TRUE(h.has_value());
  std::string payload(h->payload_bytes, '\0');
  ASSERT_TRUE(RecvAll(*fd, payload.data(), payload.size(), "hello").ok());
  auto target = detail::ParseHello(payload);
  ASSERT_TRUE(target.has_value());
  detail::Hello me;
  me.name = "slow";
  me.nonce = RandomHex(16);
  me.role = "control";
  me.mac = detail::PeerMac("s3cret", *target, me);
  FrameHeader f;
  f.type = FrameType::kHelloPeer;
  ASSERT_TRUE(SendFrame(*fd, f, detail::HelloText(me)).ok());
  auto ok = RecvHeader(*fd);
  ASSERT_TRUE(ok.has_value());
  ASSERT_EQ(ok->type, FrameType::kAuthOk);
  ASSERT_TRUE(Discard(*fd, ok->payload_bytes).ok());
  // Read all 4 MiB of "data" ten times, never reading the replies.
  int small = 4096;
  setsockopt(*fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  FrameHeader rd;
  rd.type = FrameType::kRead;
  rd.handle = 1;  // the first export: "data"
  rd.length = kBytes;
  for (int i = 0; i < 10; ++i) {
    rd.request_id = static_cast<uint64_t>(i + 1);
    ASSERT_TRUE(SendFrame(*fd, rd, "").ok());
  }
  std::this_thread::sleep_for(200ms);  // the target is now blocked sending
  auto t0 = Clock::now();
  ASSERT_TRUE(owner->engine->Unexport("data").ok());
  auto until = Clock::now() + 10s;
  while (!owner->engine->Quiesced(1) && Clock::now() < until) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(owner->engine->Quiesced(1)) << "the 30 s send timeout would have been needed";
  EXPECT_LT(Clock::now() - t0, 10s);
  ::close(*fd);
  // The owner still serves others.
  auto client = MakeSide("client", {Transport::kTcp}, 2);
  EXPECT_TRUE(client->engine->Connect(owner->engine->address()).has_value());
}

}  // namespace
}  // namespace strata::transfer
