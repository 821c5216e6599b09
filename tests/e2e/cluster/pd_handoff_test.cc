// A prefill/decode handoff between real processes (issue 19), the test
// playing the router: `strata serve --role decode` reserves blocks and
// grants them to `strata serve --role prefill`, which runs the prompt to its
// first token and writes the blocks with the transfer engine; the decode
// instance names them and continues the request from the prefill's
// continuation. The text equals a colocated `strata serve` answer (greedy
// and seeded), the decode instance computes only the prompt's tail, a
// second conversation turn sends fewer blocks, a lease that lapses before
// the writes ends in an exact recomputation, an abandoned reservation is
// freed at its lease, a block corrupted in flight is caught by its checksum
// and recomputed, and every device pool is back to empty; counted.

#include <gtest/gtest.h>

#include <sstream>
#include <thread>

#include "cluster/pd_wire.h"
#include "tests/e2e/server/serve_test_util.h"
#include "tests/support/metadata_store.h"

namespace strata::testing {
namespace {

constexpr int kBlock = 16;

std::vector<int32_t> Prompt(int seed, int n) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(5 + (i * 37 + seed * 101) % 200);
  return p;
}

struct Colocated {
  std::string text;
  std::vector<int32_t> tokens;
};

Colocated Complete(int port, const std::vector<int32_t>& prompt, double temperature, int seed) {
  json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 8}, {"temperature", temperature},
               {"logprobs", 0}};
  if (seed != 0) body["seed"] = seed;
  auto r = PostJson(port, "/v1/completions", body);
  EXPECT_EQ(r.status, 200) << r.raw;
  Colocated c;
  if (r.status != 200) return c;
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], static_cast<int>(prompt.size()));
  c.text = r.body["choices"][0]["text"].get<std::string>();
  return c;
}

scheduler::EngineRequest Request(const std::vector<int32_t>& prompt, double temperature, int seed) {
  scheduler::EngineRequest r;
  r.prompt = prompt;
  r.max_tokens = 8;
  r.sampling.temperature = static_cast<float>(temperature);
  if (seed != 0) r.sampling.seed = static_cast<uint64_t>(seed);
  return r;
}

struct HandOff {
  cluster::ReserveReply reserve;
  cluster::PrefillReply prefill;
  std::string text;       // prefill's first token(s), then the decode stream's
  int32_t decode_cached = -1;
  bool finished = false;
};

void ContinueAt(int decode_port, uint64_t id, const scheduler::EngineRequest& request, const SimpleHttpResponse& p,
                HandOff* out);

// Reserves the request's blocks at the decode instance for "prefill-a";
// false (and failed expectations) when it did not answer a reservation.
bool ReserveAt(int decode_port, uint64_t id, const scheduler::EngineRequest& request, int64_t lease_ms,
               cluster::ReserveReply* out) {
  cluster::ReserveRequest q{id, request.prompt, request.cache_salt, lease_ms, "prefill-a"};
  auto r = SimpleHttp(decode_port, "POST", "/internal/pd/reserve", cluster::ReserveRequestToJson(q));
  EXPECT_EQ(r.status, 200) << r.body;
  auto reserve = cluster::ReserveReplyFromJson(r.body);
  EXPECT_TRUE(reserve.ok()) << r.body;
  if (!reserve.ok()) return false;
  *out = *reserve;
  return true;
}

// `lease_ms`, `stall`: a lease that lapses before the prefill instance
// writes (the test waits `stall` in between).
HandOff RunHandOff(int prefill_port, int decode_port, uint64_t id, const scheduler::EngineRequest& request,
                   int64_t lease_ms = 20000, std::chrono::milliseconds stall = {}) {
  HandOff h;
  if (!ReserveAt(decode_port, id, request, lease_ms, &h.reserve)) return h;
  std::this_thread::sleep_for(stall);

  auto p = SimpleHttp(prefill_port, "POST", "/internal/pd/prefill",
                      cluster::PrefillRequestToJson({request, h.reserve}), {}, 120);
  ContinueAt(decode_port, id, request, p, &h);
  return h;
}

// The prefill instance answered `p`: the decode instance continues the
// request (reservation `id`) from it; fills h's prefill, text and decode.
void ContinueAt(int decode_port, uint64_t id, const scheduler::EngineRequest& request, const SimpleHttpResponse& p,
                HandOff* out) {
  HandOff& h = *out;
  EXPECT_EQ(p.status, 200) << p.body;
  auto prefill = cluster::PrefillReplyFromJson(p.body);
  EXPECT_TRUE(prefill.ok()) << p.body;
  if (!prefill.ok()) return;
  h.prefill = *prefill;
  EXPECT_EQ(prefill->output.finish_reason, FinishReason::kPaused);
  EXPECT_TRUE(prefill->output.continuation.has_value());
  if (!prefill->output.continuation) return;

  cluster::DecodeRequest d{id, prefill->blocks_written, prefill->checksums, request};
  d.request.continuation = *prefill->output.continuation;
  auto s = SimpleHttp(decode_port, "POST", "/internal/pd/decode", cluster::DecodeRequestToJson(d), {}, 120);
  EXPECT_EQ(s.status, 200) << s.body;
  h.text = prefill->output.text;
  std::istringstream lines(s.body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("data: ", 0) != 0) continue;
    auto ev = cluster::RequestOutputFromJson(line.substr(6));
    EXPECT_TRUE(ev.ok()) << line;
    if (!ev.ok()) continue;
    if (h.decode_cached < 0) h.decode_cached = ev->cached_tokens;
    h.text += ev->text;
    h.finished = ev->finished;
  }
}

void ExpectPoolEmpty(int port) {
  const std::string m = WaitForMetrics(
      port, [](const std::string& t) { return Gauge(t, "strata_kv_device_blocks_in_use") == 0; }, 10);
  EXPECT_EQ(Gauge(m, "strata_kv_device_blocks_in_use"), 0) << "port " << port;
}

// The transports the prefill instance writes with (same host: shm by default).
class PdHandoff : public ::testing::TestWithParam<std::string> {};

TEST_P(PdHandoff, TheDecodeInstanceContinuesWithThePrefillInstancesBlocks) {
  MetadataStoreProcess store(false);
  auto member = [&](const std::string& name, const std::string& role) {
    return std::vector<std::string>{"--metadata", store.url(), "--instance-name", name, "--role", role,
                                    "--metadata-lease-seconds", "2", "--transfer-transports", GetParam()};
  };
  // Prompt chunks of 64 tokens: blocks go out while later chunks compute.
  auto prefill = StartTinyServer(
      [&] { auto a = member("prefill-a", "prefill"); a.insert(a.end(), {"--max-batch-tokens", "64"}); return a; }());
  auto decode = StartTinyServer(member("decode-a", "decode"));
  auto colocated = StartTinyServer({});
  ASSERT_TRUE(prefill && decode && colocated);
  const int pp = prefill->port("http"), pd = decode->port("http"), pc = colocated->port("http");

  for (auto [temperature, seed] : {std::pair{0.0, 0}, std::pair{0.9, 7}}) {
    SCOPED_TRACE("temperature " + std::to_string(temperature));
    const auto prompt = Prompt(seed + 1, 300);  // 18 whole blocks come from cache
    const Colocated ref = Complete(pc, prompt, temperature, seed);
    const HandOff h = RunHandOff(pp, pd, 100 + static_cast<uint64_t>(seed), Request(prompt, temperature, seed));
    EXPECT_EQ(h.reserve.held_blocks, 0);
    EXPECT_EQ(h.reserve.blocks, 18);
    EXPECT_EQ(h.prefill.blocks_written, 18);
    EXPECT_EQ(h.decode_cached, 18 * kBlock) << "decode computed only the prompt's tail\n" << decode->stderr_tail();
    EXPECT_TRUE(h.finished);
    EXPECT_EQ(h.text, ref.text);

    // The next turn: the decode instance holds the first turn's blocks.
    std::vector<int32_t> turn2 = prompt;
    for (int i = 0; i < 40; ++i) turn2.push_back(7 + i);
    const Colocated ref2 = Complete(pc, turn2, temperature, seed);
    const HandOff h2 = RunHandOff(pp, pd, 200 + static_cast<uint64_t>(seed), Request(turn2, temperature, seed));
    EXPECT_GE(h2.reserve.held_blocks, 18) << "not sent again";
    EXPECT_EQ(h2.reserve.blocks, static_cast<int>((turn2.size() - 1) / kBlock));
    EXPECT_EQ(h2.prefill.blocks_written, h2.reserve.blocks - h2.reserve.held_blocks);
    EXPECT_LT(h2.prefill.blocks_written, h.prefill.blocks_written);
    EXPECT_EQ(h2.text, ref2.text);
  }

  // A lease that lapses before the prefill instance writes: nothing lands
  // (the grants are revoked), the decode instance recomputes, exactly.
  {
    const auto prompt3 = Prompt(77, 120);
    const Colocated ref3 = Complete(pc, prompt3, 0, 0);
    const HandOff h3 = RunHandOff(pp, pd, 300, Request(prompt3, 0, 0), /*lease_ms=*/1, std::chrono::milliseconds(300));
    EXPECT_EQ(h3.prefill.blocks_written, 0);
    EXPECT_EQ(h3.decode_cached, 0) << "recomputed";
    EXPECT_EQ(h3.text, ref3.text);
  }

  // A reservation nobody decodes is freed at its lease.
  cluster::ReserveRequest q{999, Prompt(50, 200), "", 3000, "prefill-a"};
  auto r = SimpleHttp(pd, "POST", "/internal/pd/reserve", cluster::ReserveRequestToJson(q));
  ASSERT_EQ(r.status, 200) << r.body;
  // (The engine's stats snapshot follows the reservation within a step.)
  const std::string held = WaitForMetrics(
      pd, [](const std::string& t) { return Gauge(t, "strata_kv_device_blocks_in_use") == 12; }, 2);
  EXPECT_EQ(Gauge(held, "strata_kv_device_blocks_in_use"), 12) << "its 12 blocks are held";
  // Bad messages are refused by field; an unknown reservation's decode recomputes.
  auto bad = SimpleHttp(pd, "POST", "/internal/pd/reserve", R"({"id":1,"prompt":[],"lease_ms":5,"grantee":"x"})");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("'prompt'"), std::string::npos) << bad.body;
  for (int port : {pp, pd, pc}) ExpectPoolEmpty(port);
  // Counted: two handoffs per sampling mode, the second turns' blocks held
  // at the decode instance, the abandoned reservation expired.
  const std::string md = WaitForMetrics(
      pd, [](const std::string& t) { return Gauge(t, "strata_pd_reservations_expired_total") >= 2; }, 10);
  EXPECT_EQ(Gauge(md, "strata_pd_reservations_total"), 6);
  EXPECT_EQ(Gauge(md, "strata_pd_decodes_total"), 5);
  EXPECT_EQ(Gauge(md, "strata_pd_reservations_expired_total"), 2);
  EXPECT_EQ(Gauge(md, "strata_pd_reservations_active"), 0);
  EXPECT_EQ(Gauge(md, "strata_pd_reservations_untrusted_total"), 0);
  EXPECT_GE(Gauge(md, "strata_pd_blocks_held_total"), 36);
  const std::string mp = Metrics(pp);
  EXPECT_EQ(Gauge(mp, "strata_pd_prefills_total"), 5);
  EXPECT_EQ(Gauge(mp, "strata_pd_blocks_sent_total"), Gauge(md, "strata_pd_blocks_received_total"));
  EXPECT_EQ(Gauge(mp, "strata_pd_send_failures_total"), 1) << "the lapsed lease's writes";
  // The first turns (300 tokens in chunks of 64): 16 of 18 blocks were
  // queued while later chunks still computed; the second turns' 40-token
  // tails come in one chunk with the first token (only the tail is computed).
  EXPECT_GE(Gauge(mp, "strata_pd_blocks_sent_early_total"), 2 * 16);
  for (auto* s : {prefill.get(), decode.get(), colocated.get()}) StopCleanly(s);
}

// A lying transfer: the prefill instance's 6th block write lands with a
// flipped byte while reporting success (a test-only fault). The decode
// instance checks each block against the sender's checksum, names the 5
// good ones, recomputes from there, and answers exactly.
TEST_P(PdHandoff, ABlockCorruptedInFlightIsRecomputedNotServed) {
  MetadataStoreProcess store(false);
  auto member = [&](const std::string& name, const std::string& role, std::vector<std::string> extra) {
    std::vector<std::string> a{"--metadata", store.url(), "--instance-name", name, "--role", role,
                               "--metadata-lease-seconds", "2", "--transfer-transports", GetParam()};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  auto prefill = StartTinyServer(member("prefill-a", "prefill", {"--transfer-faults", "corrupt@write:5:1"}));
  auto decode = StartTinyServer(member("decode-a", "decode", {}));
  auto colocated = StartTinyServer({});
  ASSERT_TRUE(prefill && decode && colocated);
  const int pp = prefill->port("http"), pd = decode->port("http");
  const auto prompt = Prompt(9, 300);
  const Colocated ref = Complete(colocated->port("http"), prompt, 0, 0);
  const HandOff h = RunHandOff(pp, pd, 1, Request(prompt, 0, 0));
  EXPECT_EQ(h.prefill.blocks_written, 18) << "the sender saw every write succeed";
  EXPECT_EQ(h.decode_cached, 5 * kBlock) << "the 5 blocks before the corrupt one";
  EXPECT_EQ(h.text, ref.text);
  const std::string m = WaitForMetrics(
      pd, [](const std::string& t) { return Gauge(t, "strata_kv_device_blocks_in_use") == 0; }, 10);
  EXPECT_EQ(Gauge(m, "strata_pd_blocks_corrupt_total"), 1);
  EXPECT_EQ(Gauge(m, "strata_pd_blocks_received_total"), 5);
  EXPECT_EQ(Gauge(m, "strata_kv_device_blocks_in_use"), 0);
  ExpectPoolEmpty(pp);
  ExpectPoolEmpty(colocated->port("http"));
  for (auto* s : {prefill.get(), decode.get(), colocated.get()}) StopCleanly(s);
}

// The router's way (PdRouterOptions::overlap_reserve): the prefill request
// carries a grants key, the reservation is made meanwhile and its grants
// follow in /internal/pd/grants. Blocks computed before they come are sent
// when they come; grants that overtake their prefill request are kept for
// it; "no grants" (the reservation failed) and grants that never come (past
// --pd-grants-timeout-ms) end in an answer with no block written, and the
// decode instance recomputes. Every answer is the colocated text.
TEST(PdHandoffGrants, GrantsThatFollowThePrefillRequestAreUsedWheneverTheyCome) {
  MetadataStoreProcess store(false);
  auto member = [&](const std::string& name, const std::string& role) {
    return std::vector<std::string>{"--metadata", store.url(), "--instance-name", name, "--role", role,
                                    "--metadata-lease-seconds", "2"};
  };
  auto prefill = StartTinyServer([&] {
    auto a = member("prefill-a", "prefill");
    // Slowed, so that grants sent 300 ms after the request find blocks
    // computed and later chunks still to compute.
    a.insert(a.end(), {"--max-batch-tokens", "64", "--pd-grants-timeout-ms", "1500", "--debug-step-time-factor", "40"});
    return a;
  }());
  auto decode = StartTinyServer(member("decode-a", "decode"));
  auto colocated = StartTinyServer({});
  ASSERT_TRUE(prefill && decode && colocated);
  const int pp = prefill->port("http"), pd = decode->port("http"), pc = colocated->port("http");

  // kAfter: 300 ms after the request (its first chunks computed);
  // kAtFirstToken: once it is at its first token (counted as a prefill).
  enum class Grants { kAfter, kAtFirstToken, kBefore, kNone, kNever };
  auto run = [&](uint64_t id, const std::vector<int32_t>& prompt, Grants how, int* grants_status) {
    HandOff h;
    const scheduler::EngineRequest request = Request(prompt, 0, 0);
    if (!ReserveAt(pd, id, request, 20000, &h.reserve)) return h;
    cluster::GrantsMessage g{id, std::nullopt};
    if (how != Grants::kNone) g.decode = h.reserve;
    auto send_grants = [&] {
      *grants_status = SimpleHttp(pp, "POST", "/internal/pd/grants", cluster::GrantsMessageToJson(g)).status;
    };
    if (how == Grants::kBefore) send_grants();
    SimpleHttpResponse p;
    std::thread caller([&] {
      p = SimpleHttp(pp, "POST", "/internal/pd/prefill", cluster::PrefillRequestToJson({request, {}, id}), {}, 120);
    });
    if (how == Grants::kAfter || how == Grants::kNone) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      send_grants();
    }
    if (how == Grants::kAtFirstToken) {
      const double before = Gauge(Metrics(pp), "strata_pd_prefills_total");
      WaitForMetrics(pp, [&](const std::string& t) { return Gauge(t, "strata_pd_prefills_total") > before; }, 10);
      send_grants();
    }
    caller.join();
    ContinueAt(pd, id, request, p, &h);
    return h;
  };

  const auto prompt = Prompt(3, 300);  // 18 whole blocks
  const Colocated ref = Complete(pc, prompt, 0, 0);
  int status = 0;
  const auto t_after = std::chrono::steady_clock::now();
  HandOff after = run(11, prompt, Grants::kAfter, &status);
  std::fprintf(stderr, "the prefill with grants after 300 ms took %.3f s\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t_after).count());
  EXPECT_EQ(status, 200) << "the prefill waited for them";
  EXPECT_GE(Gauge(Metrics(pp), "strata_pd_blocks_sent_early_total"), 1) << "sent while later chunks computed";
  EXPECT_EQ(after.prefill.blocks_written, 18);
  EXPECT_EQ(after.decode_cached, 18 * kBlock) << "decode computed only the prompt's tail\n" << decode->stderr_tail();
  EXPECT_EQ(after.text, ref.text);

  const auto prompt1 = Prompt(8, 300);
  const Colocated ref1 = Complete(pc, prompt1, 0, 0);
  HandOff at_first = run(15, prompt1, Grants::kAtFirstToken, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(at_first.prefill.blocks_written, 18) << "all sent from the pinned blocks";
  EXPECT_EQ(at_first.decode_cached, 18 * kBlock);
  EXPECT_EQ(at_first.text, ref1.text);

  const auto prompt2 = Prompt(4, 300);
  const Colocated ref2 = Complete(pc, prompt2, 0, 0);
  HandOff before = run(12, prompt2, Grants::kBefore, &status);
  EXPECT_EQ(status, 202) << "kept for the prefill request that follows";
  EXPECT_EQ(before.prefill.blocks_written, 18);
  EXPECT_EQ(before.decode_cached, 18 * kBlock);
  EXPECT_EQ(before.text, ref2.text);

  for (Grants how : {Grants::kNone, Grants::kNever}) {
    const auto prompt3 = Prompt(how == Grants::kNone ? 5 : 6, 200);
    const Colocated ref3 = Complete(pc, prompt3, 0, 0);
    const auto t0 = std::chrono::steady_clock::now();
    HandOff h = run(how == Grants::kNone ? 13 : 14, prompt3, how, &status);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(h.prefill.blocks_written, 0);
    EXPECT_EQ(h.decode_cached, 0) << "recomputed";
    EXPECT_EQ(h.text, ref3.text);
    if (how == Grants::kNever) {
      EXPECT_GE(waited, 1.5) << "the prefill waited for its grants";
    }
  }
  for (int port : {pp, pd, pc}) ExpectPoolEmpty(port);
  const std::string mp = Metrics(pp);
  EXPECT_EQ(Gauge(mp, "strata_pd_prefills_total"), 5);
  EXPECT_EQ(Gauge(mp, "strata_pd_send_failures_total"), 1) << "the grants that never came";
  const std::string md = WaitForMetrics(
      pd, [](const std::string& t) { return Gauge(t, "strata_pd_reservations_active") == 0; }, 10);
  EXPECT_EQ(Gauge(md, "strata_pd_blocks_received_total"), 3 * 18);
  for (auto* s : {prefill.get(), decode.get(), colocated.get()}) StopCleanly(s);
}

INSTANTIATE_TEST_SUITE_P(Transports, PdHandoff, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace strata::testing
