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
  for (RoutingPolicy p : {RoutingPolicy::kRoundRobin, RoutingPolicy::kLongestPrefix})
    EXPECT_EQ(RoutingPolicyFromName(RoutingPolicyName(p)), p);
  EXPECT_EQ(RoutingPolicyName(RoutingPolicy::kRoundRobin), "round-robin");
  EXPECT_EQ(RoutingPolicyName(RoutingPolicy::kLongestPrefix), "longest-prefix");
  EXPECT_FALSE(RoutingPolicyFromName("random").has_value());
  EXPECT_FALSE(RoutingPolicyFromName("").has_value());
  EXPECT_EQ(RoutingPolicyNames(), "round-robin, longest-prefix");
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
