// StreamSplicer (cluster/pd_router.h): a request resumed after a failover
// replays its stream from the first token; the client gets each token and
// each byte of text once, and a replay that differs is refused.

#include <gtest/gtest.h>

#include "cluster/pd_router.h"

namespace strata::cluster {
namespace {

scheduler::RequestOutput Ev(std::vector<int32_t> ids, std::string text, bool with_logprobs = false) {
  scheduler::RequestOutput o;
  o.token_ids = std::move(ids);
  o.text = std::move(text);
  if (with_logprobs) {
    for (int32_t id : o.token_ids) o.logprobs.push_back(SampleResult{id, -0.5f * static_cast<float>(id), {}});
  }
  return o;
}

TEST(StreamSplicer, AFirstAttemptPassesThrough) {
  StreamSplicer s;
  s.BeginAttempt();
  auto a = Ev({1, 2}, "ab");
  ASSERT_TRUE(s.Take(&a));
  EXPECT_EQ(a.token_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(a.text, "ab");
  EXPECT_EQ(a.completion_tokens, 2);
  auto b = Ev({3}, "c");
  ASSERT_TRUE(s.Take(&b));
  EXPECT_EQ(b.completion_tokens, 3);
  EXPECT_EQ(s.delivered_text(), "abc");
}

TEST(StreamSplicer, AReplayDropsWhatWasDeliveredAndPassesTheRest) {
  StreamSplicer s;
  s.BeginAttempt();
  auto a = Ev({1, 2, 3}, "abc", true);
  ASSERT_TRUE(s.Take(&a));
  // The replay comes in other event boundaries.
  s.BeginAttempt();
  auto r1 = Ev({1}, "a", true);
  ASSERT_TRUE(s.Take(&r1));
  EXPECT_TRUE(r1.token_ids.empty());
  EXPECT_TRUE(r1.logprobs.empty());
  EXPECT_EQ(r1.text, "");
  auto r2 = Ev({2, 3, 4}, "bcd", true);
  ASSERT_TRUE(s.Take(&r2));
  EXPECT_EQ(r2.token_ids, (std::vector<int32_t>{4}));
  ASSERT_EQ(r2.logprobs.size(), 1u);
  EXPECT_EQ(r2.logprobs[0].token, 4);
  EXPECT_EQ(r2.text, "d");
  EXPECT_EQ(r2.completion_tokens, 4);
  EXPECT_EQ(s.delivered_text(), "abcd");
}

TEST(StreamSplicer, TextHeldBackByOneAttemptIsNotLost) {
  // A stop-string prefix or an incomplete UTF-8 character can hold text
  // back: token 2's text arrives with token 3.
  StreamSplicer s;
  s.BeginAttempt();
  auto a = Ev({1, 2}, "a");
  ASSERT_TRUE(s.Take(&a));
  s.BeginAttempt();
  auto r = Ev({1, 2, 3}, "abc");
  ASSERT_TRUE(s.Take(&r));
  EXPECT_EQ(r.token_ids, (std::vector<int32_t>{3}));
  EXPECT_EQ(r.text, "bc");
  EXPECT_EQ(s.delivered_text(), "abc");
}

TEST(StreamSplicer, AReplayThatDiffersIsRefused) {
  StreamSplicer s;
  s.BeginAttempt();
  auto a = Ev({1, 2}, "ab");
  ASSERT_TRUE(s.Take(&a));
  s.BeginAttempt();
  auto wrong_token = Ev({1, 7}, "ab");
  EXPECT_FALSE(s.Take(&wrong_token));
  StreamSplicer t;
  t.BeginAttempt();
  auto b = Ev({1, 2}, "ab");
  ASSERT_TRUE(t.Take(&b));
  t.BeginAttempt();
  auto wrong_text = Ev({1}, "x");
  EXPECT_FALSE(t.Take(&wrong_text));
}

}  // namespace
}  // namespace strata::cluster
