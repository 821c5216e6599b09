// The transfer engine across real processes on 127.0.0.1: this test process
// and one or two `strata transfer serve` peers. Random blocks with
// checksummed payloads over tcp (forced) and shm; then the faults: a peer
// killed mid-transfer, a stalled peer (SIGSTOP) past the deadline, a wrong
// cluster secret, out-of-bounds offsets, a write without a grant and a grant
// used after revocation. Each ends in a clear error and every process keeps
// working.
#include <gtest/gtest.h>
#include <signal.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "tests/support/run_command.h"
#include "tests/support/test_env.h"
#include "tests/support/transfer_peer.h"
#include "transfer/shared_memory.h"
#include "transfer/transfer_engine.h"
#include "transfer/wire.h"

namespace strata::transfer {
namespace {

using namespace std::chrono_literals;
using strata::testing::TransferPeer;

constexpr uint64_t kPeerBytes = 16 << 20;

using strata::testing::WaitBounded;


std::string Hex(uint64_t v) { return fmt::format("{:016x}", v); }

class Client {
 public:
  Client(const std::string& name, const std::string& transports, const std::string& secret) {
    mem_ = std::move(*SharedHostMemory::Allocate(kPeerBytes, name));
    id_ = *segments_.Register(SegmentKind::kHost, mem_.data(), kPeerBytes, "client");
    TransferOptions o;
    o.instance_name = name;
    o.transports = *ParseTransports(transports);
    o.cluster_secret = secret;
    o.listen = false;
    auto e = TransferEngine::Start(o, &segments_);
    EXPECT_TRUE(e.has_value());
    engine_ = std::move(*e);
  }
  TransferEngine& engine() { return *engine_; }
  uint8_t* mem() { return mem_.data(); }
  Region region(uint64_t off, uint64_t len) const { return Region{id_, off, len}; }
  BatchResult Run(std::vector<TransferOp> ops, std::chrono::milliseconds deadline = 20s) {
    auto b = engine_->Submit(std::move(ops), Clock::now() + deadline);
    EXPECT_TRUE(b.has_value());
    return b ? WaitBounded(*engine_, *b) : BatchResult{};
  }

 private:
  SegmentTable segments_;
  SharedHostMemory mem_;
  SegmentId id_;
  std::unique_ptr<TransferEngine> engine_;
};

std::string SecretFile(const std::string& dir, const std::string& name, const std::string& secret) {
  std::string path = dir + "/" + name;
  std::ofstream(path) << secret << "\n";
  chmod(path.c_str(), 0600);
  return path;
}

struct TestDirs {
  std::string dir = strata::testing::MakeTempDir("transfer-e2e");
  std::string secret_path = SecretFile(dir, "secret", "cluster-secret-1");
};

std::vector<std::string> PeerArgs(const TestDirs& s, const std::string& transports, uint64_t seed) {
  return {"--segment-bytes", "16M", "--seed", std::to_string(seed), "--transfer-transports", transports,
          "--cluster-secret-file", s.secret_path};
}

// Random reads of the peer's data and writes into a grant of its inbox;
// every byte checked through checksums computed by the peer itself.
void MoveRandomBlocks(Client& c, TransferPeer& peer, uint64_t peer_id, uint64_t local_base, uint64_t seed,
                      Transport expect) {
  auto data = c.engine().OpenSegment(peer_id, "data");
  ASSERT_TRUE(data.has_value()) << data.error().message();
  EXPECT_EQ(data->transport, expect);
  std::string grant = peer.Ok("grant 0 8388608 " + c.engine().instance_name() + " 60000");
  auto inbox = c.engine().OpenGrant(peer_id, std::stoull(grant));
  ASSERT_TRUE(inbox.has_value()) << inbox.error().message();
  std::mt19937_64 rng(seed);
  std::vector<TransferOp> ops;
  uint64_t local = local_base, next_write = 0;
  for (int i = 0; i < 40; ++i) {
    uint64_t len = 1 + rng() % (256 << 10);
    bool read = i % 2 == 0;
    if (!read) {
      for (uint64_t k = 0; k < len; ++k) c.mem()[local + k] = static_cast<uint8_t>(rng());
    }
    uint64_t remote = read ? rng() % (kPeerBytes - len) : next_write + rng() % 1000;
    if (!read) next_write = remote + len;
    ops.push_back({read ? OpKind::kRead : OpKind::kWrite, c.region(local, len), read ? *data : *inbox, remote});
    local += len;
  }
  auto r = c.Run(ops);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  for (const auto& op : ops) {
    uint64_t sum = PayloadChecksum(c.mem() + op.local.offset, op.local.length);
    std::string seg = op.kind == OpKind::kRead ? "data" : "inbox";
    EXPECT_EQ(peer.Ok("checksum " + seg + " " + std::to_string(op.remote_offset) + " " + std::to_string(op.local.length)),
              Hex(sum));
  }
  EXPECT_EQ(peer.Ok("revoke " + grant), "quiesced");
}

class TransferPeersTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TransferPeersTest, TwoProcessesMoveRandomBlocksExactly) {
  TestDirs s;
  TransferPeer peer("peer-a", PeerArgs(s, "tcp", 11));
  ASSERT_TRUE(peer.started());
  Client c("client", GetParam(), "cluster-secret-1");
  auto p = c.engine().Connect(peer.address());
  ASSERT_TRUE(p.has_value()) << p.error().message();
  MoveRandomBlocks(c, peer, *p, 0, 1, GetParam() == "tcp" ? Transport::kTcp : Transport::kShm);
  EXPECT_EQ(c.engine().stats().batches_in_flight, 0u);
}

TEST_P(TransferPeersTest, ThreeProcessesMoveBlocksConcurrently) {
  TestDirs s;
  TransferPeer a("peer-a", PeerArgs(s, GetParam(), 21));
  TransferPeer b("peer-b", PeerArgs(s, GetParam(), 22));
  ASSERT_TRUE(a.started() && b.started());
  Client c("client", GetParam(), "cluster-secret-1");
  auto pa = c.engine().Connect(a.address());
  auto pb = c.engine().Connect(b.address());
  ASSERT_TRUE(pa.has_value() && pb.has_value());
  Transport t = GetParam() == "tcp" ? Transport::kTcp : Transport::kShm;
  std::thread ta([&] { MoveRandomBlocks(c, a, *pa, 0, 2, t); });
  std::thread tb([&] { MoveRandomBlocks(c, b, *pb, 8 << 20, 3, t); });
  ta.join();
  tb.join();
  // Peer to peer: b pulls a's data into its own inbox.
  std::string bp = b.Ok("connect " + a.address());
  std::string sum = b.Ok("pull " + bp + " data 1000 0 3000000");
  EXPECT_EQ(sum, a.Ok("checksum data 1000 3000000"));
  EXPECT_EQ(c.engine().stats().batches_in_flight, 0u);
}

INSTANTIATE_TEST_SUITE_P(Transports, TransferPeersTest, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

TEST(TransferFaults, APeerKilledMidTransferFailsItsOpsAndNothingElse) {
  TestDirs s;
  TransferPeer victim("victim", PeerArgs(s, "tcp", 31));
  TransferPeer survivor("survivor", PeerArgs(s, "tcp", 32));
  Client c("client", "tcp", "cluster-secret-1");
  auto pv = c.engine().Connect(victim.address());
  auto ps = c.engine().Connect(survivor.address());
  ASSERT_TRUE(pv.has_value() && ps.has_value());
  auto data = c.engine().OpenSegment(*pv, "data");
  ASSERT_TRUE(data.has_value());
  // Reads in flight (the victim is stopped so they cannot finish first),
  // then kill -9.
  victim.Kill(SIGSTOP);
  std::vector<TransferOp> ops;
  for (uint64_t off = 0; off < kPeerBytes; off += 1 << 20) ops.push_back({OpKind::kRead, c.region(off, 1 << 20), *data, off});
  auto b = c.engine().Submit(ops, Clock::now() + 30s);
  ASSERT_TRUE(b.has_value());
  std::this_thread::sleep_for(100ms);
  auto early = c.engine().Poll(*b);
  ASSERT_FALSE(early.has_value()) << "completed while the peer was stopped: " << early->status.ToString();
  victim.Kill(SIGKILL);
  auto r = WaitBounded(c.engine(), *b);
  ASSERT_FALSE(r.status.ok());
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << r.status.message();
  EXPECT_LT(r.seconds, 10.0) << "failed on the reset, not at the deadline";
  EXPECT_EQ(victim.Wait(), -SIGKILL);
  // New work for the dead peer fails at once; the other peer is unaffected.
  auto again = c.Run({{OpKind::kRead, c.region(0, 4096), *data, 0}});
  EXPECT_FALSE(again.status.ok());
  auto sd = c.engine().OpenSegment(*ps, "data");
  ASSERT_TRUE(sd.has_value());
  auto ok = c.Run({{OpKind::kRead, c.region(0, 1 << 20), *sd, 5}});
  ASSERT_TRUE(ok.status.ok()) << ok.status.message();
  EXPECT_EQ(Hex(PayloadChecksum(c.mem(), 1 << 20)), survivor.Ok("checksum data 5 1048576"));
  EXPECT_EQ(c.engine().stats().batches_in_flight, 0u);
}

TEST(TransferFaults, AStalledPeerTimesOutAndLateBytesNeverLand) {
  TestDirs s;
  TransferPeer peer("sleepy", PeerArgs(s, "tcp", 41));
  Client c("client", "tcp", "cluster-secret-1");
  auto p = c.engine().Connect(peer.address());
  ASSERT_TRUE(p.has_value());
  auto data = c.engine().OpenSegment(*p, "data");
  ASSERT_TRUE(data.has_value());
  std::memset(c.mem(), 0x33, 8 << 20);
  peer.Kill(SIGSTOP);
  std::vector<TransferOp> ops;
  for (uint64_t off = 0; off < (8 << 20); off += 1 << 20) ops.push_back({OpKind::kRead, c.region(off, 1 << 20), *data, off});
  auto r = c.Run(ops, 300ms);
  EXPECT_EQ(r.status.code(), StatusCode::kDeadlineExceeded) << r.status.message();
  EXPECT_LT(r.seconds, 2.0);
  EXPECT_GE(c.engine().stats().timeouts, 1u);
  // Whatever the woken peer still sends goes nowhere: the local memory is
  // exactly what it was when the batch completed.
  std::vector<uint8_t> at_completion(c.mem(), c.mem() + (8 << 20));
  peer.Kill(SIGCONT);
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(std::memcmp(at_completion.data(), c.mem(), 8 << 20), 0) << "bytes landed after the timeout";
  // And the peer serves again on fresh connections.
  auto again = c.Run({{OpKind::kRead, c.region(0, 1 << 20), *data, 0}});
  ASSERT_TRUE(again.status.ok()) << again.status.message();
  EXPECT_EQ(Hex(PayloadChecksum(c.mem(), 1 << 20)), peer.Ok("checksum data 0 1048576"));
}

TEST(TransferFaults, WrongSecretIsRefusedCountedAndTheListenerKeepsServing) {
  TestDirs s;
  TransferPeer peer("guarded", PeerArgs(s, "tcp", 51));
  Client intruder("intruder", "tcp", "not-the-secret");
  auto p = intruder.engine().Connect(peer.address());
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.error().code(), StatusCode::kInvalidArgument) << p.error().message();
  // The target counts the failure after answering it: wait for the count.
  bool counted = false;
  for (int i = 0; i < 200 && !counted; ++i) {
    counted = peer.Ok("stats").find("\"failed_handshakes\":1") != std::string::npos;
    if (!counted) std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(counted);
  Client c("client", "tcp", "cluster-secret-1");
  EXPECT_TRUE(c.engine().Connect(peer.address()).has_value());
}

TEST(TransferFaults, NoSecretMeansLoopbackOnly) {
  auto r = strata::testing::RunCommand(strata::testing::StrataCli() +
                                       " transfer serve --transfer-bind-address 0.0.0.0 </dev/null");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("only with a cluster secret"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("ready"), std::string::npos);
}

TEST(TransferFaults, OutOfBoundsUngrantedAndRevokedAccessesFailAndWriteNothing) {
  for (std::string transports : {"tcp", "shm"}) {
    SCOPED_TRACE(transports);
    TestDirs s;
    TransferPeer peer("owner", PeerArgs(s, "tcp", 61));
    Client c("client", transports, "cluster-secret-1");
    auto p = c.engine().Connect(peer.address());
    ASSERT_TRUE(p.has_value());
    std::string zero = peer.Ok("checksum inbox 0 16777216");
    std::string grant = peer.Ok("grant 4096 65536 client 60000");
    auto inbox = c.engine().OpenGrant(*p, std::stoull(grant));
    ASSERT_TRUE(inbox.has_value());
    std::memset(c.mem(), 0x44, 1 << 20);
    // Out of bounds.
    auto r = c.Run({{OpKind::kWrite, c.region(0, 4096), *inbox, 65536 - 100}});
    EXPECT_EQ(r.status.code(), StatusCode::kOutOfRange) << r.status.message();
    // A grant for another instance, and a forged handle.
    std::string other = peer.Ok("grant 0 4096 someone-else 60000");
    auto stolen = c.engine().OpenGrant(*p, std::stoull(other));
    EXPECT_FALSE(stolen.has_value());
    RemoteHandle forged = *inbox;
    forged.handle = std::stoull(other);
    r = c.Run({{OpKind::kWrite, c.region(0, 4096), forged, 0}});
    EXPECT_FALSE(r.status.ok());
    // The readable segment is not writable.
    auto data = c.engine().OpenSegment(*p, "data");
    ASSERT_TRUE(data.has_value());
    std::string data_sum = peer.Ok("checksum data 0 16777216");
    r = c.Run({{OpKind::kWrite, c.region(0, 4096), *data, 0}});
    EXPECT_FALSE(r.status.ok());
    EXPECT_EQ(peer.Ok("checksum data 0 16777216"), data_sum);
    EXPECT_EQ(peer.Ok("checksum inbox 0 16777216"), zero) << "nothing was written anywhere";
    // A grant used after revocation.
    r = c.Run({{OpKind::kWrite, c.region(0, 65536), *inbox, 0}});
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_EQ(peer.Ok("revoke " + grant), "quiesced");
    peer.Ok("fill inbox 0 16777216 0");
    std::string after = peer.Ok("checksum inbox 0 16777216");
    r = c.Run({{OpKind::kWrite, c.region(0, 65536), *inbox, 0}});
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << r.status.message();
    EXPECT_EQ(peer.Ok("checksum inbox 0 16777216"), after);
    // The target refused the out-of-bounds, forged-handle and revoked
    // writes over tcp (over shm the requester refuses them itself).
    auto stats = nlohmann::json::parse(peer.Ok("stats"));
    if (transports == "tcp") {
      EXPECT_GE(stats["refused"].get<int>(), 3) << stats.dump();
    }
    EXPECT_GE(stats["refused"].get<int>() + static_cast<int>(c.engine().stats().refused_locally), 3);
    // Still serving.
    EXPECT_TRUE(c.Run({{OpKind::kRead, c.region(0, 4096), *data, 0}}).status.ok());
  }
}

}  // namespace
}  // namespace strata::transfer
