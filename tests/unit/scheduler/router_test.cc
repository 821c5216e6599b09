// scheduler/router.h: the step cost formula (moved here with the cost model
// from the simulator's tests, same assertions), the routing policies' one
// name table, and Router::Pick: round-robin takes turns; longest-prefix
// takes the most cached tokens, ties to the fewer unfinished requests, then
// to turn order.

#include "scheduler/router.h"

#include <gtest/gtest.h>

#include <vector>

namespace strata::scheduler {
namespace {

TEST(CostModelTest, StepCostFormula) {
  const CostModel m{1, 2, 3, 10, 20, 30};
  std::vector<int32_t> chunk(4, 7), one(1, 7);
  std::vector<ForwardSeq> batch(1);
  batch[0].tokens = chunk;
  batch[0].start_pos = 6;
  // a + b*4 + c*4*(6 + 2)
  EXPECT_DOUBLE_EQ(m.StepSeconds(batch), 1 + 8 + 96);
  batch[0].tokens = one;
  batch[0].start_pos = 9;
  // d + e + f*10
  EXPECT_DOUBLE_EQ(m.StepSeconds(batch), 10 + 20 + 300);
  batch.push_back(batch[0]);
  batch[1].tokens = chunk;
  batch[1].start_pos = 0;
  // max(a, d) + b*4 + c*4*2 + e + f*10
  EXPECT_DOUBLE_EQ(m.StepSeconds(batch), 10 + 8 + 24 + 20 + 300);
  EXPECT_EQ(m.StepSeconds({}), 0.0);
  EXPECT_DOUBLE_EQ(m.recompute_tokens_per_s(), 0.5);
  EXPECT_EQ(CostModel{}.recompute_tokens_per_s(), 0.0);
}

TEST(RouterTest, PolicyNamesRoundTripAndUnknownNamesAreRefused) {
  for (RoutingPolicy p : {RoutingPolicy::kRoundRobin, RoutingPolicy::kLongestPrefix, RoutingPolicy::kLeastLoaded,
                          RoutingPolicy::kTtft})
    EXPECT_EQ(RoutingPolicyFromName(RoutingPolicyName(p)), p);
  EXPECT_EQ(RoutingPolicyName(RoutingPolicy::kRoundRobin), "round-robin");
  EXPECT_EQ(RoutingPolicyName(RoutingPolicy::kLongestPrefix), "longest-prefix");
  EXPECT_FALSE(RoutingPolicyFromName("random").has_value());
  EXPECT_FALSE(RoutingPolicyFromName("").has_value());
  EXPECT_EQ(RoutingPolicyNames(), "round-robin, longest-prefix, least-loaded, ttft");
}

TEST(RouterTest, LeastLoadedTakesTheFewestUnfinishedTiesInTurn) {
  Router r(RoutingPolicy::kLeastLoaded);
  EXPECT_FALSE(r.needs_cached_tokens());
  EXPECT_EQ(r.Pick(std::vector<RouteCandidate>{{100, 3}, {0, 1}, {7, 2}}), 1u);
  // All equal: in turn.
  const std::vector<RouteCandidate> equal = {{0, 2}, {0, 2}, {0, 2}};
  std::vector<size_t> got;
  for (int i = 0; i < 3; ++i) got.push_back(r.Pick(equal));
  EXPECT_EQ(got, (std::vector<size_t>{1, 2, 0}));
}

RouteCandidate Ttft(int64_t uncached, int64_t queue, double rate, int unfinished = 0, double load = 0) {
  RouteCandidate c;
  c.uncached_tokens = uncached;
  c.queue_tokens = queue;
  c.prefill_tokens_per_s = rate;
  c.unfinished = unfinished;
  c.load_seconds = load;
  return c;
}

TEST(RouterTest, TtftPredictsFromTheQueueTheUncachedPartAndTheRate) {
  EXPECT_DOUBLE_EQ(PredictTtftSeconds(Ttft(300, 700, 1000), 0), 1.0);
  EXPECT_DOUBLE_EQ(PredictTtftSeconds(Ttft(100, 0, 0), 200), 0.5) << "an unknown rate takes the fallback";
  EXPECT_DOUBLE_EQ(PredictTtftSeconds(Ttft(100, 0, 1000, 0, 0.25), 0), 0.35) << "plus the fetch time";
  EXPECT_LT(PredictTtftSeconds(Ttft(100, 0, 0), 0), 0) << "nothing known";
  RouteCandidate busy = Ttft(300, 700, 1000);
  busy.queue_done_seconds = 0.5;  // half of the queue's 0.7 s already ran
  EXPECT_DOUBLE_EQ(PredictTtftSeconds(busy, 0), 0.5);
  busy.queue_done_seconds = 5;  // never below the prompt's own time
  EXPECT_DOUBLE_EQ(PredictTtftSeconds(busy, 0), 0.3);
  busy.ttft_scale = 2;  // the learned correction scales the compute part
  EXPECT_DOUBLE_EQ(PredictTtftSeconds(busy, 0), 0.6);
}

TEST(RouterTest, TtftWeighsCacheAffinityAgainstLoadAndSpeed) {
  Router r(RoutingPolicy::kTtft);
  EXPECT_TRUE(r.needs_cached_tokens());
  // A fast instance with an empty queue beats a slow one.
  EXPECT_EQ(r.Pick(std::vector<RouteCandidate>{Ttft(1000, 0, 1000), Ttft(1000, 0, 4000)}), 1u);
  // The fast one's queue makes the slow one quicker: no spiral onto one instance.
  EXPECT_EQ(r.Pick(std::vector<RouteCandidate>{Ttft(1000, 0, 1000), Ttft(1000, 8000, 4000)}), 0u);
  // Cached where the slow one is: computing 100 tokens there beats 2000 here.
  EXPECT_EQ(r.Pick(std::vector<RouteCandidate>{Ttft(100, 0, 1000), Ttft(2000, 0, 4000)}), 0u);
  // A rate not known yet takes the mean of the known ones.
  EXPECT_EQ(r.Pick(std::vector<RouteCandidate>{Ttft(1000, 0, 0), Ttft(1000, 1000, 2000)}), 0u);
  // No rate known at all: least loaded.
  EXPECT_EQ(r.Pick(std::vector<RouteCandidate>{Ttft(10, 0, 0, 3), Ttft(10, 0, 0, 1)}), 1u);
}

TEST(CostModelTest, RatesACalibrationGivesARouter) {
  // 512-token chunks from 0: a + 512 b + c 512^2 / 2 seconds.
  const CostModel m{0.002, 0.0001, 0, 0.004, 0.001, 0};
  EXPECT_DOUBLE_EQ(m.PrefillTokensPerS(512), 512 / (0.002 + 0.0512));
  EXPECT_DOUBLE_EQ(m.DecodeStepSeconds(4, 100), 0.004 + 0.004);
  const CalibratedRates r = RatesFromCostModel(m);
  EXPECT_DOUBLE_EQ(r.prefill_tokens_per_s, 512 / (0.002 + 0.0512));
  EXPECT_DOUBLE_EQ(r.decode_step_seconds, 0.005);
  EXPECT_EQ(RatesFromCostModel(CostModel{}).prefill_tokens_per_s, 0.0) << "no terms: not known";
  EXPECT_EQ(RatesFromCostModel(CostModel{}).decode_step_seconds, 0.0);
}

RouteCandidate Decode(double tpot, int64_t free_kv, int32_t cached = 0, int unfinished = 0) {
  RouteCandidate c;
  c.tpot_seconds = tpot;
  c.free_kv_tokens = free_kv;
  c.cached_tokens = cached;
  c.unfinished = unfinished;
  return c;
}

TEST(RouterTest, TtftDecodeChoiceByRoomThenTimePerTokenThenCache) {
  Router r(RoutingPolicy::kTtft);
  // The lower time per output token wins.
  EXPECT_EQ(r.PickDecode(std::vector<RouteCandidate>{Decode(0.05, 1000), Decode(0.02, 1000)}, 100), 1u);
  // ... unless its pool cannot hold the prompt.
  EXPECT_EQ(r.PickDecode(std::vector<RouteCandidate>{Decode(0.05, 1000), Decode(0.02, 50)}, 100), 0u);
  // Unknown room counts as room; unknown time takes the mean of the known.
  // (0.05 here: below 0.08; the 0.02 one has no room.)
  EXPECT_EQ(r.PickDecode(std::vector<RouteCandidate>{Decode(0.08, 1000), Decode(0.02, 50), Decode(0, -1)}, 100), 2u);
  // Equal times: the one holding more of the prompt, then fewer unfinished.
  EXPECT_EQ(r.PickDecode(std::vector<RouteCandidate>{Decode(0.02, 1000, 32), Decode(0.02, 1000, 64)}, 100), 1u);
  EXPECT_EQ(r.PickDecode(std::vector<RouteCandidate>{Decode(0.02, 1000, 0, 3), Decode(0.02, 1000, 0, 1)}, 100), 1u);
  // None can hold it: still a choice (the reservation will say "not now").
  EXPECT_EQ(r.PickDecode(std::vector<RouteCandidate>{Decode(0.05, 10), Decode(0.02, 10)}, 100), 1u);
  // Other policies choose decode as prefill.
  Router ll(RoutingPolicy::kLeastLoaded);
  EXPECT_EQ(ll.PickDecode(std::vector<RouteCandidate>{Decode(0.01, 1000, 0, 2), Decode(0.9, 0, 0, 1)}, 100), 1u);
}

TEST(RouterTest, RoundRobinTakesTurnsWhateverIsCached) {
  Router r(RoutingPolicy::kRoundRobin);
  EXPECT_FALSE(r.needs_cached_tokens());
  const std::vector<RouteCandidate> c = {{100, 0}, {0, 5}, {7, 1}};
  std::vector<size_t> got;
  for (int i = 0; i < 7; ++i) got.push_back(r.Pick(c));
  EXPECT_EQ(got, (std::vector<size_t>{0, 1, 2, 0, 1, 2, 0}));
}

TEST(RouterTest, LongestPrefixThenFewerUnfinishedThenTurnOrder) {
  Router r(RoutingPolicy::kLongestPrefix);
  EXPECT_TRUE(r.needs_cached_tokens());
  // The most cached tokens wins, wherever the turn is.
  EXPECT_EQ(r.Pick(std::vector<RouteCandidate>{{0, 0}, {64, 9}, {32, 0}}), 1u);  // turn 0
  EXPECT_EQ(r.Pick(std::vector<RouteCandidate>{{0, 0}, {64, 9}, {32, 0}}), 1u);  // turn 1
  // A tie goes to the fewer unfinished requests.
  EXPECT_EQ(r.Pick(std::vector<RouteCandidate>{{16, 3}, {16, 1}, {0, 0}}), 1u);  // turn 2
  // A full tie goes to the first in turn order (turn 3 starts at 0; turn 4 at 1).
  EXPECT_EQ(r.Pick(std::vector<RouteCandidate>{{0, 0}, {0, 0}, {0, 0}}), 0u);
  EXPECT_EQ(r.Pick(std::vector<RouteCandidate>{{0, 0}, {0, 0}, {0, 0}}), 1u);
  // One instance: always it.
  EXPECT_EQ(r.Pick(std::vector<RouteCandidate>{{0, 4}}), 0u);
}

}  // namespace
}  // namespace strata::scheduler
