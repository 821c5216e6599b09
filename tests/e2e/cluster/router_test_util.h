#pragma once
// Shared pieces of the `strata router` end-to-end tests: starting the
// router and its prefill/decode instances on the tiny model, comparing a
// routed answer with a colocated one, pools and router idle. Header-only.

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "tests/e2e/server/serve_test_util.h"

namespace strata::testing {

inline constexpr int kBlock = 16;

inline std::vector<int32_t> Prompt(int seed, int n) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(5 + (i * 37 + seed * 101) % 200);
  return p;
}

// A prefill or decode instance of the tiny model registered at `url`.
inline std::unique_ptr<ServerProcess> StartMember(const std::string& url, const std::string& name, const std::string& role,
                                           std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--metadata", url,  "--instance-name",          name,
                                   "--role",     role, "--metadata-lease-seconds", "2"};
  args.insert(args.end(), extra.begin(), extra.end());
  return StartTinyServer(args);
}

// `strata router` on the tiny model; with `serve_metadata` it serves the
// store itself (its port in the port file's "metadata").
inline std::unique_ptr<ServerProcess> StartRouter(const std::string& url, bool serve_metadata,
                                           std::vector<std::string> extra = {}) {
  auto model = TinyModelPath();
  if (!model) {
    ADD_FAILURE() << model.error().ToString();
    return nullptr;
  }
  std::vector<std::string> args = {"--model", *model, "--metadata", url};
  if (serve_metadata) args.push_back("--serve-metadata");
  args.insert(args.end(), extra.begin(), extra.end());
  RoleOptions role;
  role.zero_port_flags = {"--port", "--grpc-port"};
  role.port_file_flag = "--port-file";
  role.host_flag = true;
  role.ready_path = "/health";
  auto p = ServerProcess::StartRole("router", args, role);
  if (!p) {
    ADD_FAILURE() << p.error().ToString();
    return nullptr;
  }
  return std::move(*p);
}

// Waits until the router lists `prefill` prefill and `decode` decode instances.
inline bool WaitForInstances(int router_port, int prefill, int decode) {
  auto seen = [&](const std::string& t) {
    return Gauge(t, "strata_router_instances", R"(role="prefill")") == prefill &&
           Gauge(t, "strata_router_instances", R"(role="decode")") == decode;
  };
  return seen(WaitForMetrics(router_port, seen, 30));
}

inline void ExpectPoolEmpty(int port) {
  const std::string m = WaitForMetrics(
      port, [](const std::string& t) { return Gauge(t, "strata_kv_device_blocks_in_use") == 0; }, 10);
  EXPECT_EQ(Gauge(m, "strata_kv_device_blocks_in_use"), 0) << "port " << port;
}

inline void ExpectRouterIdle(int port) {
  const std::string m = WaitForMetrics(
      port, [](const std::string& t) { return Gauge(t, "strata_router_requests_in_flight") == 0; }, 10);
  EXPECT_EQ(Gauge(m, "strata_router_requests_in_flight"), 0);
}

// The texts, finish reasons and logprob tokens of a whole (non-streamed)
// response, for comparing a routed answer with a colocated one.
struct Answer {
  std::vector<std::string> text, finish;
  std::vector<std::vector<std::string>> tokens;
  std::vector<std::vector<double>> logprobs;
  json usage;
  std::string prefill_header, decode_header;
};

inline Answer Whole(const JsonResponse& r) {
  Answer a;
  EXPECT_EQ(r.status, 200) << r.raw;
  if (r.status != 200) return a;
  for (const json& c : r.body["choices"]) {
    a.text.push_back(c.contains("message") ? c["message"]["content"].get<std::string>() : c["text"].get<std::string>());
    a.finish.push_back(c["finish_reason"].get<std::string>());
    std::vector<std::string> toks;
    std::vector<double> lps;
    if (c.contains("logprobs") && c["logprobs"].is_object() && c["logprobs"].contains("tokens")) {
      for (const json& t : c["logprobs"]["tokens"]) toks.push_back(t.get<std::string>());
      for (const json& l : c["logprobs"]["token_logprobs"]) lps.push_back(l.get<double>());
    }
    a.tokens.push_back(toks);
    a.logprobs.push_back(lps);
  }
  a.usage = r.body["usage"];
  a.prefill_header = r.http.header("x-strata-prefill-instance");
  a.decode_header = r.http.header("x-strata-decode-instance");
  return a;
}

inline void ExpectSameAnswer(const Answer& routed, const Answer& colocated) {
  EXPECT_EQ(routed.text, colocated.text);
  EXPECT_EQ(routed.finish, colocated.finish);
  EXPECT_EQ(routed.tokens, colocated.tokens);
  ASSERT_EQ(routed.logprobs.size(), colocated.logprobs.size());
  for (size_t c = 0; c < routed.logprobs.size(); ++c) {
    ASSERT_EQ(routed.logprobs[c].size(), colocated.logprobs[c].size());
    // A prefix cache hit changes a step's shape, which may move the last bits.
    for (size_t i = 0; i < routed.logprobs[c].size(); ++i)
      EXPECT_NEAR(routed.logprobs[c][i], colocated.logprobs[c][i], 1e-3) << "choice " << c << " token " << i;
  }
  EXPECT_EQ(routed.usage["prompt_tokens"], colocated.usage["prompt_tokens"]);
  EXPECT_EQ(routed.usage["completion_tokens"], colocated.usage["completion_tokens"]);
}

// The instances a routed response names, checked against each other.
inline void ExpectInstances(const Answer& a, const std::set<std::string>& prefills, const std::set<std::string>& decodes) {
  EXPECT_EQ(prefills.count(a.prefill_header), 1u) << a.prefill_header;
  EXPECT_EQ(decodes.count(a.decode_header), 1u) << a.decode_header;
  ASSERT_TRUE(a.usage.contains("strata")) << a.usage.dump();
  const json& in = a.usage["strata"]["instances"];
  EXPECT_EQ(in["prefill"], a.prefill_header);
  ASSERT_EQ(in["decode"].size(), 1u) << in.dump();
  EXPECT_EQ(in["decode"][0], a.decode_header);
}

// A cluster of its own, for faults that kill its members.
struct FaultCluster {
  std::unique_ptr<ServerProcess> router, colocated;
  std::vector<std::unique_ptr<ServerProcess>> prefill, decode;
  std::string url;
  // `store_url`: an outside metadata store (else the router serves it).
  bool Start(int prefills, int decodes, const std::vector<std::string>& prefill_extra,
             const std::vector<std::string>& decode_extra, const std::string& store_url = "",
             const std::vector<std::string>& router_extra = {}) {
    router = StartRouter(store_url.empty() ? "strata://127.0.0.1:0" : store_url, store_url.empty(), router_extra);
    if (!router) return false;
    url = store_url.empty() ? "strata://127.0.0.1:" + std::to_string(router->port("metadata")) : store_url;
    for (int i = 0; i < prefills; ++i)
      prefill.push_back(StartMember(url, "prefill-" + std::to_string(i), "prefill", prefill_extra));
    for (int i = 0; i < decodes; ++i)
      decode.push_back(StartMember(url, "decode-" + std::to_string(i), "decode", decode_extra));
    colocated = StartTinyServer({});
    for (auto& p : prefill) if (!p) return false;
    for (auto& d : decode) if (!d) return false;
    return colocated && WaitForInstances(router->http_port(), prefills, decodes);
  }
};

}  // namespace strata::testing
