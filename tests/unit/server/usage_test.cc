// server/usage.h: the usage HTTP and gRPC both report, built from the
// choices' events: the prompt and its cache hits once (choice 0),
// completion tokens summed over choices, cached tokens by tier mapped to
// kinds, time to first token from choice 0's first token.

#include "server/usage.h"

#include <gtest/gtest.h>

namespace strata::server {
namespace {

scheduler::RequestOutput Event(int32_t prompt, int32_t completion, int32_t cached, std::vector<int32_t> by_tier) {
  scheduler::RequestOutput ev;
  ev.prompt_tokens = prompt;
  ev.completion_tokens = completion;
  ev.cached_tokens = cached;
  ev.cached_tokens_by_tier = std::move(by_tier);
  return ev;
}

TEST(UsageTallyTest, PromptOnceCompletionSummedCachedByKind) {
  UsageTally t(2);
  t.Add(1, Event(100, 3, 0, {}));  // choice 1 first: its prompt figures are not used
  EXPECT_EQ(t.prompt_tokens(), 0);
  auto first = Event(100, 1, 64, {32, 16, 16});
  first.timings.arrival = 1'000'000;
  first.timings.first_token = 6'000'000;
  t.Add(0, first);
  auto later = Event(100, 5, 64, {32, 16, 16});
  later.timings.arrival = 1'000'000;
  later.timings.first_token = 9'000'000;
  t.Add(0, later);
  t.Add(1, Event(100, 7, 0, {}));
  t.Add(2, Event(999, 999, 999, {}));  // no such choice
  t.Add(-1, Event(999, 999, 999, {}));
  EXPECT_EQ(t.prompt_tokens(), 100);
  EXPECT_EQ(t.cached_tokens(), 64);
  EXPECT_EQ(t.completion_tokens(), 12);  // 5 + 7: each choice's latest count
  EXPECT_DOUBLE_EQ(t.ttft_ms(), 5.0);    // the first token, not a later event's
  // Lower tiers 0 and 1 are both disk here: they add up under "disk".
  const std::vector<kvcache::TierKind> kinds = {kvcache::TierKind::kDevice, kvcache::TierKind::kDisk,
                                                kvcache::TierKind::kDisk};
  const Usage u = t.Make(kinds);
  EXPECT_EQ(u.prompt_tokens, 100);
  EXPECT_EQ(u.completion_tokens, 12);
  EXPECT_EQ(u.cached_tokens, 64);
  EXPECT_EQ(u.cached_by_kind[kvcache::TierKindIndex(kvcache::TierKind::kDevice)], 32);
  EXPECT_EQ(u.cached_by_kind[kvcache::TierKindIndex(kvcache::TierKind::kDisk)], 32);
  EXPECT_EQ(u.cached_by_kind[kvcache::TierKindIndex(kvcache::TierKind::kHost)], 0);
}

TEST(UsageTallyTest, NothingYet) {
  UsageTally t(1);
  EXPECT_EQ(t.completion_tokens(), 0);
  EXPECT_LT(t.ttft_ms(), 0);
  const Usage u = t.Make({});
  EXPECT_EQ(u.prompt_tokens + u.completion_tokens + u.cached_tokens, 0);
}

}  // namespace
}  // namespace strata::server
