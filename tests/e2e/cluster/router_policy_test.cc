// `strata router --routing` with real instances (issue 20's first part):
// longest-prefix keeps a conversation where its KV is (the second turn
// finds its first turn on the same prefill instance and the same decode
// instance, which is sent only the new blocks); ttft sends prefills to the
// instance predicted to answer first, so a slower instance (made so with
// the test-only step-time factor) gets fewer of them; --slo refuses at
// once (429 slo_unattainable) what no instance is predicted to meet.

#include <map>

#include "tests/e2e/cluster/router_test_util.h"
#include "tests/e2e/server/serve_test_util.h"

namespace strata::testing {
namespace {

TEST(RouterPolicy, LongestPrefixKeepsAConversationWhereItsBlocksAre) {
  FaultCluster c;
  ASSERT_TRUE(c.Start(2, 2, {}, {}, "", {"--routing", "longest-prefix"}));
  const int rp = c.router->http_port();
  const auto turn1 = Prompt(40, 300);
  auto turn2 = turn1;
  for (int i = 0; i < 40; ++i) turn2.push_back(11 + i);
  auto ask = [&](const std::vector<int32_t>& prompt) {
    json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}};
    const Answer a = Whole(PostJson(rp, "/v1/completions", body));
    ExpectSameAnswer(a, Whole(PostJson(c.colocated->http_port(), "/v1/completions", body)));
    return a;
  };
  // Two other conversations in between: in turn order (what least-loaded
  // does when idle) the second turn would go to the other instances.
  const Answer first = ask(turn1);
  ask(Prompt(41, 200));
  ask(Prompt(42, 200));
  const Answer second = ask(turn2);
  EXPECT_EQ(second.prefill_header, first.prefill_header);
  EXPECT_EQ(second.decode_header, first.decode_header);
  EXPECT_EQ(second.usage["prompt_tokens_details"]["cached_tokens"], 18 * kBlock) << second.usage.dump();
  // The decode instance held the first turn's 18 blocks: not sent again.
  const int d = first.decode_header == "decode-0" ? 0 : 1;
  EXPECT_EQ(Gauge(Metrics(c.decode[static_cast<size_t>(d)]->http_port()), "strata_pd_blocks_held_total"), 18);
  ExpectRouterIdle(rp);
  for (auto& p : c.prefill) ExpectPoolEmpty(p->http_port());
  for (auto& p : c.decode) ExpectPoolEmpty(p->http_port());
}

TEST(RouterPolicy, TtftSendsPrefillsToTheFasterInstance) {
  FaultCluster c;
  // prefill-1 takes 8 times as long per step as prefill-0.
  ASSERT_TRUE(c.Start(2, 1, {}, {}, "", {"--routing", "ttft"}));
  c.prefill[1].reset();
  c.prefill[1] = StartMember(c.url, "prefill-1", "prefill", {"--debug-step-time-factor", "8"});
  ASSERT_NE(c.prefill[1], nullptr);
  const int rp = c.router->http_port();
  ASSERT_TRUE(WaitForInstances(rp, 2, 1));
  std::map<std::string, int> served;
  for (int i = 0; i < 12; ++i) {
    json body = {{"model", "tiny"}, {"prompt", Prompt(60 + i, 250)}, {"max_tokens", 2}, {"temperature", 0}};
    const Answer a = Whole(PostJson(rp, "/v1/completions", body));
    ++served[a.prefill_header];
  }
  // Until both rates are known the choice is by load (in turn); then the
  // faster instance's predictions win while it has no queue.
  EXPECT_GE(served["prefill-0"], 10) << "prefill-0 " << served["prefill-0"] << ", prefill-1 " << served["prefill-1"];
  const std::string m = Metrics(rp);
  EXPECT_EQ(Gauge(m, "strata_router_routed_total", R"(phase="prefill",instance="prefill-0")"), served["prefill-0"]);
  ExpectRouterIdle(rp);
  for (auto& p : c.prefill) ExpectPoolEmpty(p->http_port());
}

TEST(RouterPolicy, AnSloRefusesAtOnceWhatNoInstanceCanMeet) {
  FaultCluster c;
  // One slow prefill instance; a 50 ms time-to-first-token level.
  ASSERT_TRUE(c.Start(1, 1, {"--debug-step-time-factor", "50", "--max-batch-tokens", "64"}, {}, "",
                      {"--routing", "ttft", "--slo", "ttft=50ms"}));
  const int rp = c.router->http_port();
  auto ask = [&](int seed, int n) {
    return PostJson(rp, "/v1/completions",
                    json{{"model", "tiny"}, {"prompt", Prompt(seed, n)}, {"max_tokens", 2}, {"temperature", 0}});
  };
  // Nothing is known of the instance yet: admitted (and its rate measured).
  EXPECT_EQ(ask(70, 300).status, 200);
  // 400 prompt tokens at the measured rate take far longer: refused at once.
  const auto big = ask(71, 400);
  EXPECT_EQ(big.status, 429) << big.raw;
  EXPECT_TRUE(IsOpenAiError(big.body)) << big.raw;
  EXPECT_EQ(big.body["error"]["code"], "slo_unattainable") << big.raw;
  EXPECT_NE(big.body["error"]["message"].get<std::string>().find("predicted time to first token"), std::string::npos)
      << big.raw;
  EXPECT_FALSE(big.http.header("retry-after").empty());
  // A short prompt meets it.
  EXPECT_EQ(ask(72, 3).status, 200);
  const std::string m = Metrics(rp);
  EXPECT_EQ(Gauge(m, "strata_router_refused_total", R"(reason="slo_ttft")"), 1);
  EXPECT_GE(Gauge(m, "strata_router_ttft_prediction_ratio_count"), 1) << "the short prompt had a prediction";
  EXPECT_EQ(Gauge(Metrics(c.prefill[0]->http_port()), "strata_pd_prefills_total"), 2) << "the refused one never ran";
  ExpectRouterIdle(rp);
  ExpectPoolEmpty(c.prefill[0]->http_port());
  ExpectPoolEmpty(c.decode[0]->http_port());
}

}  // namespace
}  // namespace strata::testing
