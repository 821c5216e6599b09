// `strata cluster status` and `strata cluster predict` against a running
// cluster (router + 2 prefill + 1 decode instances on 127.0.0.1, issue 20):
// every instance with its role, health, rates (a calibrated one before it
// measured its own) and KV use per tier; an instance killed shows as down
// (or has left the metadata); predict names the instance holding a prompt
// and predicts its time to first token from the same function the router
// uses. `strata serve --calibration F` and `strata router --calibration F`
// take the output of `strata bench calibrate`.

#include <signal.h>

#include <fstream>

#include "tests/e2e/cluster/router_test_util.h"
#include "tests/e2e/server/serve_test_util.h"
#include "tests/support/run_command.h"
#include "tests/support/test_env.h"

namespace strata::testing {
namespace {

json Cli(const std::string& args, int* exit_code = nullptr) {
  const auto r = RunCommand(ShellQuote(StrataCli()) + " " + args + " --json");
  if (exit_code != nullptr) *exit_code = r.exit_code;
  if (r.exit_code != 0) return json{{"exit", r.exit_code}, {"err", r.err}};
  json j = json::parse(r.out, nullptr, false);
  EXPECT_TRUE(j.is_object()) << r.out;
  return j;
}

const json* Find(const json& list, const std::string& name) {
  for (const json& i : list) {
    if (i.value("name", "") == name) return &i;
  }
  return nullptr;
}

TEST(ClusterStatus, ListsInstancesWithRolesHealthRatesAndTiersAndPredictsForAPrompt) {
  const std::string dir = MakeTempDir("cluster-status");
  // 100 prompt tokens per second: far slower than the tiny model measures.
  const std::string cal = dir + "/slow.json";
  std::ofstream(cal) << R"({"b": 0.01, "d": 0.004, "e": 0.001})";
  // The router's own calibration file is read (checked by the CLI) too.
  const std::string router_cal = dir + "/router.json";
  std::ofstream(router_cal) << R"({"instances": {"prefill-1": {"b": 0.01}}})";
  FaultCluster c;
  ASSERT_TRUE(c.Start(2, 1, {}, {}, "", {"--routing", "ttft", "--calibration", router_cal}));
  c.prefill[1].reset();
  c.prefill[1] = StartMember(c.url, "prefill-1", "prefill", {"--calibration", cal});
  ASSERT_NE(c.prefill[1], nullptr);
  const int rp = c.router->http_port();
  ASSERT_TRUE(WaitForInstances(rp, 2, 1));

  json st = Cli("cluster status --metadata " + c.url);
  ASSERT_TRUE(st.contains("instances")) << st.dump();
  ASSERT_EQ(st["instances"].size(), 3u) << st.dump();
  for (const std::string name : {"prefill-0", "prefill-1", "decode-0"}) {
    const json* i = Find(st["instances"], name);
    ASSERT_NE(i, nullptr) << name << " " << st.dump();
    EXPECT_EQ((*i)["role"], name.substr(0, name.find('-')));
    EXPECT_EQ((*i)["model"], "tiny");
    EXPECT_TRUE((*i)["healthy"].get<bool>()) << i->dump();
    const json& s = (*i)["status"];
    ASSERT_GE(s["tiers"].size(), 1u);
    EXPECT_EQ(s["tiers"][0]["name"], "device");
    EXPECT_GT(s["tiers"][0]["capacity_bytes"].get<double>(), 0);
    EXPECT_EQ(s["device_blocks_in_use"], 0);
    EXPECT_GT(s["device_blocks"].get<int>(), 0);
  }
  // 512 / (512 * 0.01) = 100 tokens/s; decode 0.004 + 0.001.
  const json& slow = (*Find(st["instances"], "prefill-1"))["status"];
  EXPECT_DOUBLE_EQ(slow["calibrated_prefill_tokens_per_s"].get<double>(), 100);
  EXPECT_DOUBLE_EQ(slow["prefill_tokens_per_s"].get<double>(), 100) << "the calibration until a step measures";
  EXPECT_DOUBLE_EQ(slow["calibrated_decode_step_seconds"].get<double>(), 0.005);
  EXPECT_EQ((*Find(st["instances"], "prefill-0"))["status"]["calibrated_prefill_tokens_per_s"], 0.0);

  // A long text prompt through the router, then predicted for again: the
  // instance that ran it holds it and is predicted to answer first.
  std::string text;
  for (int i = 0; i < 40; ++i) text += "word" + std::to_string(i) + " ";
  const auto a = PostJson(rp, "/v1/completions", json{{"model", "tiny"}, {"prompt", text}, {"max_tokens", 2}, {"temperature", 0}});
  ASSERT_EQ(a.status, 200) << a.raw;
  const std::string ran = a.http.header("x-strata-prefill-instance");
  const int prompt_tokens = a.body["usage"]["prompt_tokens"].get<int>();
  ASSERT_GE(prompt_tokens, 2 * kBlock);
  json p = Cli("cluster predict --metadata " + c.url + " --prompt " + ShellQuote(text));
  ASSERT_TRUE(p.contains("candidates")) << p.dump();
  EXPECT_EQ(p["prompt_tokens"], prompt_tokens);
  ASSERT_EQ(p["candidates"].size(), 2u) << "prefill instances only: " << p.dump();
  const json* held = Find(p["candidates"], ran);
  ASSERT_NE(held, nullptr) << p.dump();
  EXPECT_EQ((*held)["cached_tokens"], (prompt_tokens - 1) / kBlock * kBlock) << p.dump();
  EXPECT_EQ((*held)["uncached_tokens"], prompt_tokens - (*held)["cached_tokens"].get<int>());
  EXPECT_TRUE((*held)["chosen"].get<bool>()) << p.dump();
  EXPECT_GT((*held)["predicted_ttft_seconds"].get<double>(), 0.0);
  const json* other = Find(p["candidates"], ran == "prefill-0" ? "prefill-1" : "prefill-0");
  ASSERT_NE(other, nullptr);
  EXPECT_EQ((*other)["cached_tokens"], 0);
  EXPECT_LT((*held)["predicted_ttft_seconds"].get<double>(), (*other)["predicted_ttft_seconds"].get<double>());

  // A dead instance: down (while its lease lasts) or gone from the list.
  c.decode[0]->Signal(SIGKILL);
  st = Cli("cluster status --timeout-seconds 1 --metadata " + c.url);
  ASSERT_TRUE(st.contains("instances")) << st.dump();
  if (const json* d = Find(st["instances"], "decode-0"); d != nullptr) {
    EXPECT_FALSE((*d)["healthy"].get<bool>()) << d->dump();
    EXPECT_FALSE((*d)["error"].get<std::string>().empty());
    EXPECT_FALSE(d->contains("status"));
  }
  EXPECT_TRUE((*Find(st["instances"], "prefill-0"))["healthy"].get<bool>());
  ExpectRouterIdle(rp);
  for (auto& q : c.prefill) ExpectPoolEmpty(q->http_port());
}

TEST(ClusterStatus, BadMetadataAndMissingFilesAreClearErrors) {
  int code = 0;
  json j = Cli("cluster status --metadata nowhere://x", &code);
  EXPECT_EQ(code, 1) << j.dump();
  EXPECT_NE(j["err"].get<std::string>().find("strata cluster status"), std::string::npos) << j.dump();
  j = Cli("cluster status --metadata strata://127.0.0.1:1", &code);
  EXPECT_EQ(code, 1) << "no store there: " << j.dump();
  const auto r = RunCommand(ShellQuote(StrataCli()) + " router --calibration /no/such/file.json");
  // Usage errors, found while parsing the command line (before any start).
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--calibration"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--help"), std::string::npos) << r.err;
  const auto s = RunCommand(ShellQuote(StrataCli()) + " router --slo ttft=fast");
  EXPECT_NE(s.exit_code, 0);
  EXPECT_NE(s.err.find("ttft=DURATION"), std::string::npos) << s.err;
  EXPECT_NE(s.err.find("--help"), std::string::npos) << s.err;
}

}  // namespace
}  // namespace strata::testing
