// The simulator's prefill/decode disaggregation (ClusterConfig::
// prefill_instances): a request is prefilled at a prefill instance (its
// first token), its KV sent to a decode instance at the cluster's transfer
// rate (less the blocks that instance already holds) and decoded there;
// timing on known inputs, requests waiting for room at a decode instance,
// and the cluster file's roles.

#include <gtest/gtest.h>

#include <algorithm>

#include "bench/simulator.h"
#include "common/config.h"
#include "tests/support/test_env.h"

namespace strata::bench {
namespace {

std::vector<TraceRequest> SharedTraceHead(size_t n) {
  auto r = LoadTrace(testing::SharedDir() + "/traces/synthetic_trace.jsonl");
  EXPECT_TRUE(r.ok()) << r.error().ToString();
  if (!r.ok()) return {};
  r->resize(std::min(r->size(), n));
  return std::move(r).value();
}

SimOptions OneBlockPerIdPd() {
  SimOptions o;
  o.tokens_per_hash_id = 16;
  o.cluster.instance.block_size = 16;
  o.cluster.instances = 2;
  o.cluster.prefill_instances = 1;
  return o;
}

TEST(SimulatorDisaggTest, TimingFollowsPrefillTransferAndDecode) {
  // One request of 2 ids x 16 tokens, 3 output tokens. Prefill costs 1 s +
  // 0.5 s/token, a decode step 2 s; the network 0.25 s + 1 s per block.
  std::vector<TraceRequest> t = {{1000, 32, 96, {1, 2}}};
  SimOptions o = OneBlockPerIdPd();
  o.cluster.instance.cost = CostModel{1.0, 0.5, 0, 2.0, 0, 0};
  o.cluster.transfer_latency_s = 0.25;
  o.cluster.transfer_bytes_per_s = static_cast<double>(o.cluster.instance.block_bytes());
  auto r = Simulate(t, o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  const SimRequestRecord& rec = r->records.at(0);
  EXPECT_EQ(rec.finish_reason, "length");
  EXPECT_EQ(rec.instance, 0);
  EXPECT_EQ(rec.decode_instance, 1);
  EXPECT_EQ(rec.output_tokens, 3);
  // The prefill instance's step gives the first token.
  EXPECT_DOUBLE_EQ(rec.first_token_s, 1.0 + 1.0 + 0.5 * 32);
  // Its reservation covers (32 - 1) / 16 = 1 block, sent in 1.25 s; the
  // decode instance computes the other 17 positions (the second block and
  // the first token: 9.5 s), then one decode step.
  EXPECT_EQ(r->handoff_blocks, 1u);
  EXPECT_DOUBLE_EQ(rec.finish_s, rec.first_token_s + 1.25 + (1.0 + 0.5 * 17) + 2.0);
  EXPECT_EQ(r->requests, 1);

  // A one-token request ends at its prefill: nothing is sent.
  t[0].output_length = 1;
  auto one = Simulate(t, o);
  ASSERT_TRUE(one.ok()) << one.error().ToString();
  EXPECT_EQ(one->records[0].output_tokens, 1);
  EXPECT_DOUBLE_EQ(one->records[0].finish_s, one->records[0].first_token_s);
  EXPECT_EQ(one->handoff_blocks, 0u);
}

TEST(SimulatorDisaggTest, ADecodeInstanceIsSentOnlyTheBlocksItLacks) {
  // A second turn extends the first: the decode instance holds the first
  // turn's two blocks (its continuation named them), so only the third of
  // the second prompt's three reservable blocks travels.
  std::vector<TraceRequest> t = {{0, 32, 512, {1, 2}}, {100000, 64, 512, {1, 2, 3, 4}}};
  SimOptions o = OneBlockPerIdPd();
  o.serial = true;
  auto r = Simulate(t, o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->requests, 2);
  EXPECT_EQ(r->handoff_blocks, 1u + 1u);
  // The prefill instance served the first turn's ids from its own cache.
  EXPECT_EQ(r->records[1].cached_tokens, 32);
}

TEST(SimulatorDisaggTest, RequestsWaitForRoomAtTheDecodeInstance) {
  // Every request needs 7 of a decode pool's 10 blocks: one at a time is
  // reserved, the others wait for a decode to finish, and all complete.
  std::vector<TraceRequest> t;
  for (int64_t k = 0; k < 6; ++k) t.push_back({0, 96, 512, {10 * k, 10 * k + 1, 10 * k + 2, 10 * k + 3, 10 * k + 4, 10 * k + 5}});
  SimOptions o = OneBlockPerIdPd();
  o.cluster.instance.device_bytes = 10 * o.cluster.instance.block_bytes();
  o.cluster.instance.cost = CostModel{0.01, 1e-3, 0, 0.01, 0, 0};
  auto r = Simulate(t, o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->requests, 6);
  EXPECT_EQ(r->rejected, 0);
  EXPECT_EQ(r->decode_waits, 5u);
  std::vector<std::pair<double, double>> decodes;  // (first token, finish)
  for (const SimRequestRecord& rec : r->records) {
    EXPECT_EQ(rec.finish_reason, "length");
    decodes.emplace_back(rec.first_token_s, rec.finish_s);
  }
  std::sort(decodes.begin(), decodes.end());
  for (size_t k = 1; k < decodes.size(); ++k)
    EXPECT_GE(decodes[k].first, decodes[k - 1].second) << "request " << k << " was prefilled before room was free";
}

TEST(SimulatorDisaggTest, SharedTraceEveryRequestIsPrefilledAndDecodedApart) {
  // 2 prefill + 2 decode instances on the first 400 requests, every policy:
  // each finished request ran its phases on instances of the right role,
  // and the decode instances together received blocks.
  std::vector<TraceRequest> head(SharedTraceHead(400));
  SimOptions o = OneBlockPerIdPd();
  o.cluster.instances = 4;
  o.cluster.prefill_instances = 2;
  o.time_scale = 10;
  for (Routing p : {Routing::kRoundRobin, Routing::kLeastLoaded, Routing::kLongestPrefix, Routing::kTtft}) {
    o.cluster.routing = p;
    auto r = Simulate(head, o);
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    EXPECT_GT(r->requests, 350) << scheduler::RoutingPolicyName(p);
    EXPECT_GT(r->handoff_blocks, 0u);
    for (const SimRequestRecord& rec : r->records) {
      if (rec.finish_reason != "length") continue;
      EXPECT_TRUE(rec.instance == 0 || rec.instance == 1) << rec.instance;
      if (rec.output_tokens > 1) {
        EXPECT_TRUE(rec.decode_instance == 2 || rec.decode_instance == 3) << rec.decode_instance;
      }
    }
  }
}

TEST(SimulatorDisaggTest, ClusterFileRoles) {
  auto cfg = Config::Parse(
      "instances: 4\nroles:\n  prefill: 3\n  transfer_bytes_per_s: 10G\n  transfer_latency_us: 30\n"
      "slower:\n  instances: 1\n  factor: 2\n  role: prefill\n",
      "c.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.error().ToString();
  auto c = ParseClusterConfig(*cfg, "");
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  EXPECT_EQ(c->prefill_instances, 3);
  EXPECT_TRUE(c->disaggregated());
  EXPECT_DOUBLE_EQ(c->transfer_bytes_per_s, double(uint64_t{10} << 30));
  EXPECT_DOUBLE_EQ(c->transfer_latency_s, 30e-6);
  EXPECT_EQ(c->RoleName(0), "prefill");
  EXPECT_EQ(c->RoleName(3), "decode");
  // The last prefill instance is the slower one.
  EXPECT_DOUBLE_EQ(c->InstanceCost(1).b, c->instance.cost.b);
  EXPECT_DOUBLE_EQ(c->InstanceCost(2).b, 2 * c->instance.cost.b);
  EXPECT_DOUBLE_EQ(c->InstanceCost(3).b, c->instance.cost.b);
  for (const char* text : {"instances: 2\nroles:\n  prefill: 2\n", "roles:\n  prefill: -1\n",
                           "instances: 2\nroles:\n  prefill: 1\n  transfer_latency_us: -5\n",
                           "instances: 3\nroles:\n  prefill: 1\nslower:\n  instances: 2\n  role: prefill\n",
                           "instances: 3\nslower:\n  instances: 1\n  role: prefill\n",
                           "instances: 3\nroles:\n  prefill: 1\nslower:\n  instances: 1\n  role: both\n"}) {
    auto b = Config::Parse(text, "c.yaml");
    ASSERT_TRUE(b.ok()) << text;
    EXPECT_FALSE(ParseClusterConfig(*b, "").ok()) << text;
  }
  auto colocated = Config::Parse("instances: 2\n", "c.yaml");
  ASSERT_TRUE(colocated.ok());
  auto cc = ParseClusterConfig(*colocated, "");
  ASSERT_TRUE(cc.ok());
  EXPECT_FALSE(cc->disaggregated());
  EXPECT_EQ(cc->RoleName(1), "both");
}

}  // namespace
}  // namespace strata::bench
