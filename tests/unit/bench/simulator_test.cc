// The cluster simulator: with an unlimited cache and one request at a time it
// serves exactly the trace's ideal prefix hits; smaller caches serve fewer,
// and a bigger cache never fewer; the cost model and metric arithmetic on
// known inputs; SimStore timing; cluster files.

#include "bench/report.h"
#include "bench/simulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "bench/sim_store.h"
#include "kvcache/clock.h"
#include "tests/support/test_env.h"

namespace strata::bench {
namespace {

const std::vector<TraceRequest>& SharedTrace() {
  static const std::vector<TraceRequest>* t = [] {
    auto r = LoadTrace(testing::SharedDir() + "/traces/synthetic_trace.jsonl");
    EXPECT_TRUE(r.ok()) << r.error().ToString();
    return new std::vector<TraceRequest>(r.ok() ? *r : std::vector<TraceRequest>{});
  }();
  return *t;
}

// One block per hash id (16 tokens, block size 16): the test of the issue.
SimOptions OneBlockPerId() {
  SimOptions o;
  o.tokens_per_hash_id = 16;
  o.cluster.instance.block_size = 16;
  return o;
}

uint64_t Blocks(const SimOptions& o, uint64_t n) { return n * o.cluster.instance.block_bytes(); }

TEST(SimulatorTest, SerialUnlimitedEqualsIdealOnSharedTrace) {
  ASSERT_EQ(SharedTrace().size(), 3993u);
  SimOptions o = OneBlockPerId();
  o.unlimited_cache = true;
  o.serial = true;
  auto r = Simulate(SharedTrace(), o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->requests, 3993);
  EXPECT_EQ(r->rejected + r->errors + r->skipped_over_context + r->skipped_over_capacity, 0);
  EXPECT_EQ(r->total_ids, 121877u);
  EXPECT_EQ(r->served_ids, 77953u);
  EXPECT_NEAR(r->hit_ratio_blocks, 0.639604, 5e-7);
  EXPECT_EQ(r->hit_ratio_blocks, r->ideal_hit_ratio_blocks);
  // Per request, not just in total.
  for (const SimRequestRecord& rec : r->records) ASSERT_EQ(rec.served_ids, rec.ideal_ids);
  // The engine recomputes the last block of a repeated prompt, so the token
  // ratio is a little lower; all of it came from the device.
  EXPECT_GT(r->hit_ratio_tokens, 0.55);
  EXPECT_LE(r->hit_ratio_tokens, r->hit_ratio_blocks);
  ASSERT_EQ(r->tiers.size(), 1u);
  EXPECT_EQ(r->tiers[0].hit_tokens, r->cached_tokens);
  EXPECT_EQ(r->tiers[0].evictions, 0u);
  EXPECT_EQ(r->lost_to_overlap, 0.0);
}

TEST(SimulatorTest, OverlapLosesHitsAndSaysHowMany) {
  SimOptions o = OneBlockPerId();
  o.unlimited_cache = true;
  o.max_requests = 400;
  o.time_scale = 0.001;  // everything arrives at once: many requests in flight
  auto r = Simulate(SharedTrace(), o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->requests, 400);
  EXPECT_EQ(r->achievable_hit_ratio_blocks, r->ideal_hit_ratio_blocks);  // one block per id
  EXPECT_LT(r->hit_ratio_blocks, r->ideal_hit_ratio_blocks);
  EXPECT_GT(r->lost_to_overlap, 0.0);
  EXPECT_DOUBLE_EQ(r->lost_to_overlap, r->ideal_hit_ratio_blocks - r->hit_ratio_blocks);
}

TEST(SimulatorTest, RealLengthsServeAllThatBlocksAllow) {
  // 512 tokens per id: a trailing id with no full block of its own can never
  // be served, so the serial unlimited run reaches the achievable ratio, a
  // little under the ideal.
  SimOptions o;
  o.unlimited_cache = true;
  o.serial = true;
  o.max_requests = 500;
  auto r = Simulate(SharedTrace(), o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->requests, 500);
  EXPECT_EQ(r->hit_ratio_blocks, r->achievable_hit_ratio_blocks);
  EXPECT_LE(r->achievable_hit_ratio_blocks, r->ideal_hit_ratio_blocks);
  EXPECT_GT(r->achievable_hit_ratio_blocks, r->ideal_hit_ratio_blocks - 0.01);
  // Requests of several thousand tokens: real lengths are in play.
  int64_t longest = 0;
  for (const SimRequestRecord& rec : r->records) longest = std::max<int64_t>(longest, rec.prompt_tokens);
  EXPECT_GT(longest, 50000);
}

TEST(SimulatorTest, SmallCacheHitsLessAndSweepIsMonotone) {
  SimOptions o = OneBlockPerId();
  o.serial = true;
  o.max_requests = 300;
  o.unlimited_cache = true;
  auto ideal = Simulate(SharedTrace(), o);
  ASSERT_TRUE(ideal.ok()) << ideal.error().ToString();
  o.unlimited_cache = false;
  double prev = -1;
  for (uint64_t blocks : {400, 800, 1600, 3200, 12800}) {
    o.cluster.instance.device_bytes = Blocks(o, blocks);
    auto r = Simulate(SharedTrace(), o);
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    SCOPED_TRACE(blocks);
    EXPECT_EQ(r->requests + r->skipped_over_capacity, 300);
    EXPECT_GE(r->hit_ratio_blocks, prev);
    EXPECT_LE(r->hit_ratio_blocks, ideal->hit_ratio_blocks);
    if (blocks == 400) {
      EXPECT_LT(r->hit_ratio_blocks, ideal->hit_ratio_blocks);
      EXPECT_GT(r->tiers[0].evictions, 0u);
    }
    prev = r->hit_ratio_blocks;
  }
}

TEST(SimulatorTest, HostTierServesWhatTheDeviceEvicted) {
  SimOptions o = OneBlockPerId();
  o.serial = true;
  o.max_requests = 300;
  o.cluster.instance.device_bytes = Blocks(o, 400);
  auto dev = Simulate(SharedTrace(), o);
  ASSERT_TRUE(dev.ok()) << dev.error().ToString();
  o.cluster.instance.host_bytes = Blocks(o, 100000);
  auto host = Simulate(SharedTrace(), o);
  ASSERT_TRUE(host.ok()) << host.error().ToString();
  ASSERT_EQ(host->tiers.size(), 2u);
  EXPECT_EQ(host->tiers[1].name, "host");
  EXPECT_GT(host->tiers[1].hit_tokens, 0u);
  EXPECT_GT(host->hit_ratio_blocks, dev->hit_ratio_blocks);
}

TEST(SimulatorTest, TwoInstancesLongestPrefixBeatsRoundRobin) {
  SimOptions o = OneBlockPerId();
  o.unlimited_cache = true;
  o.serial = true;
  o.max_requests = 500;
  o.cluster.instances = 2;
  o.cluster.routing = Routing::kRoundRobin;
  auto rr = Simulate(SharedTrace(), o);
  ASSERT_TRUE(rr.ok()) << rr.error().ToString();
  o.cluster.routing = Routing::kLongestPrefix;
  auto lp = Simulate(SharedTrace(), o);
  ASSERT_TRUE(lp.ok()) << lp.error().ToString();
  EXPECT_LT(rr->hit_ratio_blocks, rr->ideal_hit_ratio_blocks);
  // Routing by cached prefix with unlimited caches finds every prefix.
  EXPECT_EQ(lp->served_ids, static_cast<uint64_t>(lp->ideal_hit_ratio_blocks * lp->total_ids + 0.5));
  int used[2] = {0, 0};
  for (const SimRequestRecord& rec : rr->records) ++used[rec.instance];
  EXPECT_EQ(used[0], 250);
  EXPECT_EQ(used[1], 250);
}

// Unequal instances (the cluster file's `slower` group): the slower one's
// steps take `factor` times as long; ttft routing sends it fewer requests
// than turn-taking does and gets a lower p90 time to first token.
TEST(SimulatorTest, TtftRoutingGivesASlowerInstanceLessAndWinsOnTtft) {
  SimOptions o = OneBlockPerId();
  o.max_requests = 300;
  o.time_scale = 10;  // arrivals 10 times as slow: busy, not swamped, on this profile
  o.cluster.instances = 2;
  o.cluster.slower_instances = 1;
  o.cluster.slower_factor = 4;
  EXPECT_DOUBLE_EQ(o.cluster.InstanceCost(1).b, 4 * o.cluster.InstanceCost(0).b);
  EXPECT_DOUBLE_EQ(o.cluster.InstanceCost(1).d, 4 * o.cluster.InstanceCost(0).d);
  auto share = [](const SimResult& r) {
    int n[2] = {0, 0};
    for (const SimRequestRecord& rec : r.records) ++n[rec.instance];
    return static_cast<double>(n[1]) / (n[0] + n[1]);
  };
  o.cluster.routing = Routing::kRoundRobin;
  auto rr = Simulate(SharedTrace(), o);
  ASSERT_TRUE(rr.ok()) << rr.error().ToString();
  o.cluster.routing = Routing::kTtft;
  auto tt = Simulate(SharedTrace(), o);
  ASSERT_TRUE(tt.ok()) << tt.error().ToString();
  o.cluster.routing = Routing::kLeastLoaded;
  auto ll = Simulate(SharedTrace(), o);
  ASSERT_TRUE(ll.ok()) << ll.error().ToString();
  EXPECT_DOUBLE_EQ(share(*rr), 0.5);
  EXPECT_LT(share(*tt), share(*ll)) << "the slower instance's share";
  EXPECT_LT(share(*tt), 0.4);
  EXPECT_LT(tt->ttft_p90_s, rr->ttft_p90_s);
  EXPECT_LT(tt->ttft_p90_s, ll->ttft_p90_s);
}

TEST(SimulatorTest, TimingFollowsTheCostModel) {
  // One request of 2 ids x 16 tokens, 3 output tokens, alone on an instance
  // whose prefill costs 1 s + 0.5 s/token and decode 2 s per step.
  std::vector<TraceRequest> t = {{1000, 32, 96, {1, 2}}};
  SimOptions o = OneBlockPerId();
  o.cluster.instance.max_batch_tokens = 512;
  o.cluster.instance.cost = CostModel{1.0, 0.5, 0, 2.0, 0, 0};
  auto r = Simulate(t, o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  ASSERT_EQ(r->records.size(), 1u);
  const SimRequestRecord& rec = r->records[0];
  EXPECT_EQ(rec.output_tokens, 3);  // ceil(96 * 16 / 512)
  EXPECT_DOUBLE_EQ(rec.arrival_s, 1.0);
  EXPECT_DOUBLE_EQ(rec.first_token_s, 1.0 + 1.0 + 0.5 * 32);  // the whole prompt in one step
  EXPECT_DOUBLE_EQ(rec.finish_s, rec.first_token_s + 2 * 2.0);
  EXPECT_DOUBLE_EQ(r->ttft_p50_s, 17.0);
  EXPECT_DOUBLE_EQ(r->tpot_p50_s, 2.0);
  EXPECT_DOUBLE_EQ(r->duration_s, 21.0);
  EXPECT_DOUBLE_EQ(r->throughput_tokens_per_s, 3.0 / 21.0);
  // SLOs: TTFT 17 s misses a 10 s limit.
  o.slo_ttft_s = 10;
  auto slo = Simulate(t, o);
  ASSERT_TRUE(slo.ok());
  EXPECT_EQ(slo->goodput_requests, 0);
  EXPECT_EQ(slo->goodput_rps, 0.0);
}

TEST(SimulatorTest, ClosedLoopKeepsAtMostNInFlightAndIgnoresTimestamps) {
  // The first 120 requests, timestamps spread over minutes; a closed loop of
  // 3 users starts each request when a user's previous one finished.
  std::vector<TraceRequest> head(SharedTrace().begin(), SharedTrace().begin() + 120);
  SimOptions o = OneBlockPerId();
  o.concurrency = 3;
  o.cluster.instance.max_num_seqs = 64;
  o.cluster.instance.cost = CostModel{0, 1e-4, 0, 1e-3, 1e-4, 0};  // ~0.05 s per prompt here
  auto r = Simulate(head, o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  std::vector<std::pair<double, int>> edges;  // (time, +1 at arrival / -1 at finish)
  int run = 0;
  for (const SimRequestRecord& rec : r->records) {
    if (rec.finish_reason == "skipped") continue;
    ASSERT_GE(rec.finish_s, rec.arrival_s);
    edges.emplace_back(rec.arrival_s, +1);
    edges.emplace_back(rec.finish_s, -1);
    ++run;
  }
  ASSERT_GT(run, 100);
  std::sort(edges.begin(), edges.end());  // a finish sorts before an arrival at the same time
  int in_flight = 0, most = 0;
  for (auto [t, d] : edges) most = std::max(most, in_flight += d);
  EXPECT_EQ(most, 3);
  // Released on finishes, not at timestamps: the run ends long before the
  // 120th timestamp (about 34 s in).
  EXPECT_LT(r->duration_s, static_cast<double>(head.back().timestamp_ms) * 1e-3 / 2);

  // One user with timestamps scaled to 0 is --serial at time scale 0.
  o.concurrency = 1;
  auto one = Simulate(head, o);
  o.concurrency = 0;
  o.serial = true;
  o.time_scale = 0;
  auto serial = Simulate(head, o);
  ASSERT_TRUE(one.ok() && serial.ok());
  EXPECT_EQ(one->served_ids, serial->served_ids);
  EXPECT_DOUBLE_EQ(one->ttft_p50_s, serial->ttft_p50_s);
  EXPECT_DOUBLE_EQ(one->duration_s, serial->duration_s);
  // Both at once is an error.
  o.concurrency = 2;
  EXPECT_FALSE(Simulate(head, o).ok());
}

TEST(SimulatorTest, PercentileInterpolatesBetweenClosestRanks) {
  EXPECT_EQ(Percentile({}, 50), 0.0);
  EXPECT_DOUBLE_EQ(Percentile({3}, 99), 3.0);
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4}, 99), 3.97);
  EXPECT_DOUBLE_EQ(Percentile({0, 10}, 90), 9.0);
}

// The cluster pool (issue 18): four instances behind a cache-unaware
// router, each with a host tier of S/4. Private tiers see a quarter of the
// traffic each and stay under 0.6 of the ideal; pooled (each also reads the
// other three's tiers) the same total size reaches the ideal.
TEST(SimulatorTest, APooledRemoteTierReachesTheIdealWherePrivateTiersCannot) {
  SimOptions o = OneBlockPerId();
  o.serial = true;
  o.cluster.instances = 4;
  o.cluster.routing = Routing::kRoundRobin;
  o.cluster.instance.device_bytes = Blocks(o, 512);
  o.cluster.instance.host_bytes = Blocks(o, 16384);
  o.cluster.instance.disk_bytes = 0;
  o.cluster.instance.remote_read_bytes_per_s = 10e9;
  o.cluster.instance.remote_latency_s = 20e-6;
  auto priv = Simulate(SharedTrace(), o);
  ASSERT_TRUE(priv.ok()) << priv.error().ToString();
  o.cluster.instance.remote = true;
  auto pooled = Simulate(SharedTrace(), o);
  ASSERT_TRUE(pooled.ok()) << pooled.error().ToString();
  const double ideal = pooled->ideal_hit_ratio_blocks;
  EXPECT_LT(priv->hit_ratio_blocks, 0.6 * ideal);
  EXPECT_GE(pooled->hit_ratio_blocks, 0.95 * ideal);
  ASSERT_EQ(pooled->tiers.size(), 3u);
  EXPECT_EQ(pooled->tiers[2].name, "remote");
  EXPECT_GT(pooled->tiers[2].hit_blocks, 0u);
}

// The offline references (issue 22) next to what the engine achieved: one
// device pool of N blocks, one block per id, serial, is the engine running
// LRU over a flat cache of N; it matches the LRU reference but for the few
// blocks generated tokens fill (they take cache room the reference does
// not model). MIN is far above (the issue's table: 0.380 / 0.526 at 2k / 5k).
TEST(SimulatorTest, ReportsLruAndBeladyReferencesOfOneFlatCache) {
  SimOptions o = OneBlockPerId();
  o.serial = true;
  o.cluster.instance.eviction_policy = "lru";  // not the default (s3fifo)
  o.cluster.instance.host_bytes = 0;
  o.cluster.instance.disk_bytes = 0;
  for (uint64_t blocks : {2000u, 5000u}) {
    o.cluster.instance.device_bytes = Blocks(o, blocks);
    auto r = Simulate(SharedTrace(), o);
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    EXPECT_EQ(r->reference_capacity_ids, blocks);
    EXPECT_NEAR(r->hit_ratio_blocks, r->lru_hit_ratio_blocks, 1e-3) << blocks;
    EXPECT_LE(r->hit_ratio_blocks, r->lru_hit_ratio_blocks) << blocks;
    EXPECT_NEAR(r->belady_hit_ratio_blocks, blocks == 2000 ? 0.380 : 0.526, 1e-3);
    EXPECT_GT(r->belady_hit_ratio_blocks, r->lru_hit_ratio_blocks + 0.2);
  }
  // Two blocks per id (32 tokens per id, blocks of 16): the capacity in ids halves.
  o.tokens_per_hash_id = 32;
  o.max_requests = 300;
  o.cluster.instance.device_bytes = Blocks(o, 4000);
  auto two = Simulate(SharedTrace(), o);
  ASSERT_TRUE(two.ok()) << two.error().ToString();
  EXPECT_EQ(two->reference_capacity_ids, 2000u);
  EXPECT_LE(two->lru_hit_ratio_blocks, two->ideal_hit_ratio_blocks);
  EXPECT_LE(two->lru_hit_ratio_blocks, two->belady_hit_ratio_blocks);
}

// The eviction policy and the write policy reach the simulated tiers: on the
// first 2,000 requests of the shared trace, s3fifo serves more than LRU from
// one device pool, and an exclusive device + host hierarchy serves what one
// flat LRU cache of the same total size does; so does a write-through host
// (it drops its copies of device blocks first and takes the device's drops,
// so it holds each block once).
TEST(SimulatorTest, EvictionAndWritePoliciesReachTheTiers) {
  SimOptions o = OneBlockPerId();
  o.serial = true;
  o.max_requests = 2000;
  o.cluster.instance.host_bytes = 0;
  o.cluster.instance.disk_bytes = 0;
  o.cluster.instance.device_bytes = Blocks(o, 5000);
  o.cluster.instance.eviction_policy = "lru";
  auto lru = Simulate(SharedTrace(), o);
  o.cluster.instance.eviction_policy = "s3fifo";
  auto s3 = Simulate(SharedTrace(), o);
  ASSERT_TRUE(lru.ok() && s3.ok());
  EXPECT_NEAR(lru->hit_ratio_blocks, lru->lru_hit_ratio_blocks, 1e-3);
  EXPECT_GT(s3->hit_ratio_blocks, lru->hit_ratio_blocks + 0.01);
  EXPECT_EQ(s3->lru_hit_ratio_blocks, lru->lru_hit_ratio_blocks) << "the reference does not depend on the policy";

  o.cluster.instance.eviction_policy = "lru";
  o.cluster.instance.device_bytes = Blocks(o, 500);
  o.cluster.instance.host_bytes = Blocks(o, 4500);
  auto exclusive = Simulate(SharedTrace(), o);  // the default host tier of a lone instance
  o.cluster.instance.host_write_policy = kvcache::WritePolicy::kWriteThrough;
  o.cluster.instance.host_write_policy_set = true;
  auto through = Simulate(SharedTrace(), o);
  ASSERT_TRUE(through.ok() && exclusive.ok());
  EXPECT_EQ(exclusive->reference_capacity_ids, 5000u);
  // As one flat LRU cache of the total size, within what the engine's own
  // working blocks cost a flat device pool too (0.9995 measured; the
  // write-through host 0.998: a block is a copy until the device drops it).
  // With its copies kept last and no drops taken it served 0.95.
  EXPECT_GE(exclusive->hit_ratio_blocks, 0.998 * exclusive->lru_hit_ratio_blocks);
  EXPECT_GE(through->hit_ratio_blocks, 0.99 * through->lru_hit_ratio_blocks) << "the write-through host holds copies";
  EXPECT_GE(exclusive->hit_ratio_blocks, through->hit_ratio_blocks);

  // One policy over both tiers (kvcache/hierarchy_policy.h) carries s3fifo's
  // gain over LRU into the hierarchy: it serves about what s3fifo serves
  // from one device pool of the total size (per-tier policies served less
  // than LRU, a demoted block arriving at the host tier as new).
  o.cluster.instance.eviction_policy = "s3fifo";
  o.cluster.instance.host_write_policy = kvcache::WritePolicy::kExclusive;
  auto s3_exclusive = Simulate(SharedTrace(), o);
  ASSERT_TRUE(s3_exclusive.ok());
  EXPECT_GT(s3_exclusive->hit_ratio_blocks, exclusive->hit_ratio_blocks + 0.005);
  EXPECT_NEAR(s3_exclusive->hit_ratio_blocks, s3->hit_ratio_blocks, 1e-3);
}

// Device + host + a disk of write policy `write` (10/30/60% of 5,000
// blocks, the first 2,000 requests) under s3fifo: the disk in the one
// policy (*joined), and on its own lru policy (*own).
void SimulateDiskJoinedAndOwn(kvcache::WritePolicy write, Result<SimResult>* joined, Result<SimResult>* own) {
  SimOptions o = OneBlockPerId();
  o.serial = true;
  o.max_requests = 2000;
  o.cluster.instance.device_bytes = Blocks(o, 500);
  o.cluster.instance.host_bytes = Blocks(o, 1500);
  o.cluster.instance.disk_bytes = Blocks(o, 3000);
  o.cluster.instance.disk_write_policy = write;
  o.cluster.instance.eviction_policy = "s3fifo";
  *joined = Simulate(SharedTrace(), o);
  o.cluster.instance.disk_eviction_policy = "lru";
  *own = Simulate(SharedTrace(), o);
}

// Device + host + an exclusive disk: with the disk in the one policy (the
// same name), s3fifo serves at least what one flat LRU cache of the total
// size serves; given its own policy (instance.disk_eviction_policy: s3fifo
// under an lru pair, lru under an s3fifo pair) the disk ranks what the host
// drops as new blocks.
TEST(SimulatorTest, AnExclusiveDiskJoinsTheOnePolicyOfItsName) {
  Result<SimResult> joined = Status::Internal("not run"), own = Status::Internal("not run");
  SimulateDiskJoinedAndOwn(kvcache::WritePolicy::kExclusive, &joined, &own);
  ASSERT_TRUE(joined.ok() && own.ok());
  EXPECT_EQ(joined->reference_capacity_ids, 5000u);
  EXPECT_GE(joined->hit_ratio_blocks, joined->lru_hit_ratio_blocks);
  EXPECT_GT(joined->hit_ratio_blocks, own->hit_ratio_blocks);  // 0.1196 and 0.0888 measured (flat LRU 0.0855)
}

// The same with a write-through disk (the default) and a write-back one:
// in the one policy the disk drops its copies of what the device and host
// hold first and takes what the host drops, so it holds each block once
// and the three tiers serve at least the flat LRU cache of their total
// size; with its own policy a write-through disk holds copies of the
// host's blocks and serves less.
TEST(SimulatorTest, AWriteThroughOrWriteBackDiskHoldsEachBlockOnce) {
  for (const auto write : {kvcache::WritePolicy::kWriteThrough, kvcache::WritePolicy::kWriteBack}) {
    SCOPED_TRACE(static_cast<int>(write));
    Result<SimResult> joined = Status::Internal("not run"), own = Status::Internal("not run");
    SimulateDiskJoinedAndOwn(write, &joined, &own);
    ASSERT_TRUE(joined.ok() && own.ok());
    EXPECT_GE(joined->hit_ratio_blocks, joined->lru_hit_ratio_blocks);
    EXPECT_GT(joined->hit_ratio_blocks, own->hit_ratio_blocks);
    std::printf("disk write policy %d: joined %.4f, own policy %.4f, flat lru %.4f\n", static_cast<int>(write),
                joined->hit_ratio_blocks, own->hit_ratio_blocks, joined->lru_hit_ratio_blocks);
  }
}

TEST(SimStoreTest, ARemoteStoreReadsItsPeersBlocksAfterTheNetworkDelay) {
  kvcache::ManualClock clock(0);
  auto peer_store = SimStore::Create({"host", 4000, 1000, 0, 0}, &clock);  // instant local tier
  ASSERT_TRUE(peer_store.ok());
  SimStore& peer = **peer_store;
  SimStoreOptions ro{"remote", 0, 1000, 1000.0, 0, kvcache::TierKind::kRemote, 0.5};  // 1 s per block + 0.5 s
  auto remote_store = SimStore::Create(ro, &clock);
  ASSERT_TRUE(remote_store.ok());
  SimStore& remote = **remote_store;
  remote.SetPeers({&peer});
  BlockHash a, b;
  a.digest[0] = 1;
  b.digest[0] = 2;
  ASSERT_TRUE(peer.SubmitWrite(a, {}, {}, 1).ok());
  std::vector<kvcache::StoreCompletion> out;
  peer.Poll(&out);
  const BlockHash chain[] = {a, b};
  EXPECT_EQ(remote.CountPrefix(chain), 1u);
  EXPECT_TRUE(remote.Contains(a));
  EXPECT_FALSE(remote.SubmitWrite(b, {}, {}, 2).ok()) << "read-only";
  out.clear();
  ASSERT_TRUE(remote.SubmitRead(a, {}, 3).ok());
  ASSERT_TRUE(remote.SubmitRead(b, {}, 4).ok());  // nobody holds it: NotFound at once
  EXPECT_EQ(remote.Poll(&out), 1u);
  EXPECT_EQ(out[0].tag, 4u);
  EXPECT_FALSE(out[0].status.ok());
  EXPECT_EQ(remote.next_completion_nanos(), 1'500'000'000);
  clock.Advance(1'500'000'000);
  EXPECT_EQ(remote.Poll(&out), 1u);
  EXPECT_TRUE(out[1].status.ok());
  EXPECT_EQ(remote.remote_reads(), 1u);
}

TEST(SimStoreTest, CompletesAfterTheBandwidthDelayAndEvictsLru) {
  kvcache::ManualClock clock(0);
  auto store = SimStore::Create({"host", 2000, 1000, 1000.0, 500.0}, &clock);  // 2 blocks; read 1 s, write 2 s per block
  ASSERT_TRUE(store.ok());
  SimStore& s = **store;
  EXPECT_EQ(s.max_blocks(), 2u);
  BlockHash a, b, c;
  a.digest[0] = 1;
  b.digest[0] = 2;
  c.digest[0] = 3;
  ASSERT_TRUE(s.SubmitWrite(a, {}, {}, 1).ok());
  ASSERT_TRUE(s.SubmitWrite(b, {}, {}, 2).ok());
  std::vector<kvcache::StoreCompletion> out;
  EXPECT_EQ(s.Poll(&out), 0u);
  EXPECT_FALSE(s.Contains(a));  // not visible before its write completes
  EXPECT_EQ(s.next_completion_nanos(), 2'000'000'000);
  clock.Advance(2'000'000'000);
  EXPECT_EQ(s.Poll(&out), 1u);
  EXPECT_TRUE(s.Contains(a));
  clock.Advance(2'000'000'000);  // the second write queued behind the first
  EXPECT_EQ(s.Poll(&out), 1u);
  const BlockHash chain[] = {a, b, c};
  EXPECT_EQ(s.CountPrefix(chain), 2u);
  // Read a (now most recent), then write c: b is evicted.
  ASSERT_TRUE(s.SubmitRead(a, {}, 3).ok());
  ASSERT_TRUE(s.SubmitWrite(c, {}, {}, 4).ok());
  clock.Advance(2'000'000'000);
  out.clear();
  EXPECT_EQ(s.Poll(&out), 2u);
  EXPECT_TRUE(s.Contains(a));
  EXPECT_FALSE(s.Contains(b));
  EXPECT_TRUE(s.Contains(c));
  EXPECT_EQ(s.stats().evictions, 1u);
  // A read of a missing block fails at once.
  ASSERT_TRUE(s.SubmitRead(b, {}, 5).ok());
  out.clear();
  EXPECT_EQ(s.Poll(&out), 1u);
  EXPECT_EQ(out[0].status.code(), StatusCode::kNotFound);
}

// Writing a block the tier already holds is one use of it, as in HostStore:
// a frequency policy (s3fifo) must see the same counts simulated and live.
TEST(SimStoreTest, RewritingAHeldBlockIsOneUse) {
  kvcache::ManualClock clock(0);
  SimStoreOptions o{"host", 4000, 1000, 0, 0};
  o.eviction_policy = "s3fifo";
  auto store = SimStore::Create(o, &clock);
  ASSERT_TRUE(store.ok());
  SimStore& s = **store;
  BlockHash a;
  a.digest[0] = 7;
  std::vector<kvcache::StoreCompletion> out;
  ASSERT_TRUE(s.SubmitWrite(a, {}, {}, 1).ok());
  EXPECT_EQ(s.Poll(&out), 1u);
  EXPECT_EQ(s.stats().policy.inserted, 1u);
  EXPECT_EQ(s.stats().policy.hits, 0u);
  ASSERT_TRUE(s.SubmitWrite(a, {}, {}, 2).ok());
  EXPECT_EQ(s.Poll(&out), 1u);
  EXPECT_EQ(s.stats().policy.inserted, 1u);
  EXPECT_EQ(s.stats().policy.hits, 1u);
  ASSERT_TRUE(s.SubmitRead(a, {}, 3).ok());
  EXPECT_EQ(s.Poll(&out), 1u);
  EXPECT_EQ(s.stats().policy.hits, 2u);
  ASSERT_EQ(out.size(), 3u);
  for (const auto& c : out) EXPECT_TRUE(c.status.ok());
}

TEST(ClusterConfigTest, ParsesOverridesAndRejectsUnknownKeys) {
  auto cfg = Config::Parse(
      "instances: 3\nrouting: longest-prefix\ninstance:\n  profile: h200-llama-8b\n  device_bytes: 8G\n"
      "  host_bytes: 64G\n  block_size: 32\n  cost:\n    a: 0.5\n",
      "c.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.error().ToString();
  auto c = ParseClusterConfig(*cfg, "");
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  EXPECT_EQ(c->instances, 3);
  EXPECT_EQ(c->routing, Routing::kLongestPrefix);
  EXPECT_EQ(c->instance.model, "llama-8b");
  EXPECT_EQ(c->instance.kv_bytes_per_token, 131072u);
  EXPECT_EQ(c->instance.block_size, 32);
  EXPECT_EQ(c->instance.device_bytes, uint64_t{8} << 30);
  EXPECT_EQ(c->instance.host_bytes, uint64_t{64} << 30);
  EXPECT_EQ(c->instance.cost.a, 0.5);
  EXPECT_EQ(c->instance.cost.b, 5e-5);  // the profile's

  auto bad = Config::Parse("instance:\n  devce_bytes: 1G\n", "c.yaml");
  ASSERT_TRUE(bad.ok());
  auto e = ParseClusterConfig(*bad, "");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message().find("devce_bytes"), std::string::npos) << e.error().message();
  auto slower = Config::Parse("instances: 4\nrouting: ttft\nslower:\n  instances: 2\n  factor: 2.5\n", "c.yaml");
  ASSERT_TRUE(slower.ok());
  auto sc = ParseClusterConfig(*slower, "");
  ASSERT_TRUE(sc.ok()) << sc.error().ToString();
  EXPECT_EQ(sc->slower_instances, 2);
  EXPECT_DOUBLE_EQ(sc->InstanceCost(1).b, sc->instance.cost.b);
  EXPECT_DOUBLE_EQ(sc->InstanceCost(2).b, 2.5 * sc->instance.cost.b);
  for (const char* text : {"instances: 2\nslower:\n  instances: 3\n", "slower:\n  factor: 0.5\n"}) {
    auto b = Config::Parse(text, "c.yaml");
    ASSERT_TRUE(b.ok());
    EXPECT_FALSE(ParseClusterConfig(*b, "").ok()) << text;
  }
  auto bad_routing = Config::Parse("routing: random\n", "c.yaml");
  ASSERT_TRUE(bad_routing.ok());
  EXPECT_FALSE(ParseClusterConfig(*bad_routing, "").ok());

  auto pool = Config::Parse(
      "instance:\n  host_write_policy: write-back\n  remote: true\n  remote_read_bytes_per_s: 10G\n"
      "  remote_latency_us: 20\n",
      "c.yaml");
  ASSERT_TRUE(pool.ok());
  auto pc = ParseClusterConfig(*pool, "");
  ASSERT_TRUE(pc.ok()) << pc.error().ToString();
  EXPECT_EQ(pc->instance.host_write_policy, kvcache::WritePolicy::kWriteBack);
  EXPECT_EQ(pc->instance.disk_write_policy, kvcache::WritePolicy::kWriteThrough);
  EXPECT_TRUE(pc->instance.remote);
  EXPECT_EQ(pc->instance.remote_read_bytes_per_s, double(uint64_t{10} << 30));
  EXPECT_DOUBLE_EQ(pc->instance.remote_latency_s, 20e-6);
  for (const char* text : {"instance:\n  host_write_policy: none\n", "instance:\n  disk_write_policy: lazy\n",
                           "instance:\n  remote_latency_us: -1\n"}) {
    auto b = Config::Parse(text, "c.yaml");
    ASSERT_TRUE(b.ok());
    EXPECT_FALSE(ParseClusterConfig(*b, "").ok()) << text;
  }
}

TEST(ClusterConfigTest, CalibratedCostFileAndExampleFile) {
  const std::string dir = testing::MakeTempDir("sim-cluster");
  {
    std::ofstream f(dir + "/costs.json");
    f << R"({"a": 0.01, "b": 0.002, "c": 0, "d": 0.02, "e": 0.003, "f": 1e-6})";
  }
  {
    std::ofstream f(dir + "/c.yaml");
    f << "instance:\n  cost:\n    calibrated: costs.json\n";
  }
  auto c = LoadClusterConfig(dir + "/c.yaml");
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  EXPECT_EQ(c->instance.cost.b, 0.002);
  EXPECT_EQ(c->instance.cost.f, 1e-6);
  EXPECT_EQ(c->instance.profile, "cpu-bench-110m");

  auto example = LoadClusterConfig(testing::SourceDir() + "/configs/sim-cluster.yaml");
  ASSERT_TRUE(example.ok()) << example.error().ToString();
  EXPECT_GE(example->instances, 1);
}

}  // namespace
}  // namespace strata::bench
