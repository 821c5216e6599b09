// The holder side of the cluster pool over a real KV manager and host tier:
// the manager publishes its device and host blocks (one batch per Poll);
// resolve answers each held block's place and checksum and pins it; release
// and lease expiry unpin; malformed requests get 400s. The engine thread is
// the test thread (tasks posted by the holder run in RunTasks()).

#include "cluster/kv_holder.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "cluster/kv_wire.h"
#include "kvcache/host_store.h"
#include "kvcache/kv_manager.h"

namespace strata::cluster {
namespace {

using namespace std::chrono_literals;
using kvcache::TierKind;

constexpr int kBs = 4;
constexpr uint64_t kBlockBytes = 32;

struct Fixture {
  Fixture() : device(16 * kBlockBytes), log("me", "inc", 1) {
    host = std::move(kvcache::HostStore::Create({64 * kBlockBytes, kBlockBytes, false})).value();
    kvcache::KvManagerOptions o;
    o.block_size = kBs;
    o.num_device_blocks = 16;
    o.block_bytes = kBlockBytes;
    o.ns = kvcache::NamespaceDigest("w", "llama", "f16", kBs);
    o.load_policy = kvcache::LoadPolicy::kAlways;
    std::vector<kvcache::LowerTier> tiers = {{host.get(), kvcache::WritePolicy::kWriteThrough, 0, 0}};
    mgr = std::move(kvcache::KvManager::Create(
                        o, [this](BlockId id) { return device.data() + id.value() * kBlockBytes; },
                        std::move(tiers), &clock))
              .value();
    mgr->SetEventLog(&log);
    ns = o.ns;
  }
  ~Fixture() {
    holder.reset();
    mgr.reset();
  }
  void MakeHolder(std::chrono::milliseconds max_lease = 30s) {
    PostFn post = [this](EngineTask t) {
      std::lock_guard lock(mu);
      tasks.push_back(std::move(t));
      return true;
    };
    holder = std::make_unique<KvHolder>(&log, post, std::vector<ExportedTier>{{0, "kv.host"}}, max_lease);
  }
  void RunTasks() {
    std::vector<EngineTask> run;
    {
      std::lock_guard lock(mu);
      run.swap(tasks);
    }
    for (auto& t : run) t(*mgr);
  }
  // Computes and commits `prompt` (block bytes from a pattern); returns its chain.
  std::vector<BlockHash> Run(uint64_t id, const std::vector<int32_t>& prompt) {
    const RequestId rid(id);
    EXPECT_TRUE(mgr->AddRequest(rid, prompt, {}).ok());
    EXPECT_EQ(*mgr->Allocate(rid, static_cast<int32_t>(prompt.size())), kvcache::AllocOutcome::kAllocated);
    auto table = mgr->BlockTable(rid);
    for (size_t b = 0; b < table.size(); ++b)
      for (uint64_t k = 0; k < kBlockBytes; ++k)
        device[static_cast<size_t>(table[b]) * kBlockBytes + k] = static_cast<uint8_t>(b * 31 + k + id);
    EXPECT_TRUE(mgr->Commit(rid, prompt).ok());
    mgr->Poll();
    mgr->Free(rid);
    mgr->Poll();
    return kvcache::HashPrefix(ns, prompt, kBs);
  }
  // Calls the holder; returns (status, body) once replied (running posted tasks).
  std::pair<int, std::string> Call(const std::string& method, const std::string& path, const std::string& query = "",
                                   const std::string& body = "") {
    std::pair<int, std::string> out{0, ""};
    EXPECT_TRUE(holder->Handle(method, path, query, body, [&](int s, std::string b) { out = {s, std::move(b)}; }));
    RunTasks();
    return out;
  }

  kvcache::ManualClock clock;
  std::vector<uint8_t> device;
  std::unique_ptr<kvcache::HostStore> host;
  std::unique_ptr<kvcache::KvManager> mgr;
  kvcache::KvEventLog log;
  Sha256Digest ns;
  std::mutex mu;
  std::vector<EngineTask> tasks;
  std::unique_ptr<KvHolder> holder;
};

std::vector<int32_t> Seq(int n, int first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

TEST(KvHolderTest, TheManagerPublishesDeviceAndHostBlocksPerPoll) {
  Fixture f;
  const auto chain = f.Run(1, Seq(12, 100));  // 3 full blocks
  kvcache::ClusterKvIndex index;
  ASSERT_TRUE(index.ApplySnapshot(f.log.Snapshot()));
  for (const auto& h : chain) {
    EXPECT_EQ(index.Holds("me", h), kvcache::MaskOf(TierKind::kDevice) | kvcache::MaskOf(TierKind::kHost));
  }
  // A device flush is published as removals from the device tier only.
  ASSERT_TRUE(f.mgr->Flush(true, {}).ok());
  f.mgr->Poll();
  auto batches = f.log.Since(0);
  ASSERT_TRUE(batches.has_value());
  kvcache::ClusterKvIndex replay;
  for (const auto& b : *batches) EXPECT_EQ(replay.Apply(b), kvcache::ClusterKvIndex::ApplyResult::kApplied);
  for (const auto& h : chain) EXPECT_EQ(replay.Holds("me", h), kvcache::MaskOf(TierKind::kHost));
}

TEST(KvHolderTest, ResolvePinsHeldBlocksAndReleaseUnpinsThem) {
  Fixture f;
  f.MakeHolder();
  auto chain = f.Run(1, Seq(12, 100));
  BlockHash missing;
  missing.digest[0] = 0xee;
  chain.push_back(missing);  // a prefix answer stops here
  auto [status, body] = f.Call("POST", "/internal/kv/resolve", "", ResolveRequestToJson({"peer", 1000, chain}));
  ASSERT_EQ(status, 200) << body;
  auto reply = ResolveReplyFromJson(body);
  ASSERT_TRUE(reply.ok());
  ASSERT_EQ(reply->blocks.size(), 3u);
  EXPECT_NE(reply->lease, 0u);
  EXPECT_EQ(f.host->pinned_slots(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    auto loc = f.host->Locate(chain[i]);
    ASSERT_TRUE(loc.has_value());
    EXPECT_EQ(reply->blocks[i].segment, "kv.host");
    EXPECT_EQ(reply->blocks[i].offset, loc->region.offset);
    EXPECT_EQ(reply->blocks[i].checksum, loc->checksum);
  }
  auto [rs, rb] = f.Call("POST", "/internal/kv/release", "", "{\"lease\":" + std::to_string(reply->lease) + "}");
  EXPECT_EQ(rs, 200) << rb;
  EXPECT_EQ(f.host->pinned_slots(), 0u);
  EXPECT_EQ(f.Call("POST", "/internal/kv/release", "", "{\"lease\":" + std::to_string(reply->lease) + "}").first, 404);
  EXPECT_EQ(f.holder->stats().releases, 1u);
}

TEST(KvHolderTest, ALeaseNotReleasedIsUnpinnedAtItsDeadline) {
  Fixture f;
  f.MakeHolder(100ms);  // caps the 60 s the reader asks
  auto chain = f.Run(1, Seq(8, 100));
  ASSERT_EQ(f.Call("POST", "/internal/kv/resolve", "", ResolveRequestToJson({"peer", 60000, chain})).first, 200);
  EXPECT_EQ(f.host->pinned_slots(), 2u);
  for (int i = 0; i < 50 && f.holder->stats().leases_expired == 0; ++i) std::this_thread::sleep_for(20ms);
  f.RunTasks();
  EXPECT_EQ(f.holder->stats().leases_expired, 1u);
  EXPECT_EQ(f.holder->stats().leases_active, 0u);
  EXPECT_EQ(f.host->pinned_slots(), 0u);
}

TEST(KvHolderTest, EventsAndSnapshotsAndBadRequests) {
  Fixture f;
  f.MakeHolder();
  f.Run(1, Seq(8, 100));
  auto [es, eb] = f.Call("GET", "/internal/kv/events", "since=0");
  ASSERT_EQ(es, 200) << eb;
  auto events = EventsReplyFromJson(eb);
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(events->instance, "me");
  EXPECT_FALSE(events->batches.empty());
  auto [ss, sb] = f.Call("GET", "/internal/kv/snapshot");
  ASSERT_EQ(ss, 200);
  auto snap = SnapshotFromJson(sb);
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(snap->blocks.size(), 4u);  // 2 blocks, device and host
  EXPECT_EQ(f.Call("GET", "/internal/kv/events", "since=x").first, 400);
  EXPECT_EQ(f.Call("GET", "/internal/kv/resolve").first, 405);
  EXPECT_EQ(f.Call("POST", "/internal/kv/resolve", "", "{\"hashes\":[]}").first, 400);
  EXPECT_EQ(f.Call("POST", "/internal/kv/release", "", "[]").first, 400);
  EXPECT_FALSE(f.holder->Handle("GET", "/internal/kv/other", "", "", [](int, std::string) {}));
}

}  // namespace
}  // namespace strata::cluster
