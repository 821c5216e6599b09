// PdRouter (cluster/pd_router.h) against fake instances: in-process HTTP
// servers that answer the /internal/pd/ routes with canned messages, so
// that the router's own logic is checked where real instances are hard to
// steer: a decode stream that breaks is resumed on another decode instance
// and spliced into one stream; `ttft` asks every candidate and picks the
// lowest prediction; "not now" from every decode instance waits
// instead of failing; a request no instance serves fails with a reason.
// (tests/e2e/cluster/router_cluster_test.cc runs the real processes.)

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "cluster/pd_router.h"
#include "cluster/pd_wire.h"
#include "server/http_server.h"

namespace strata::cluster {
namespace {

using scheduler::RequestOutput;

RequestOutput Token(int32_t id, std::string text, bool finished = false) {
  RequestOutput o;
  o.token_ids = {id};
  o.text = std::move(text);
  o.finished = finished;
  if (finished) o.finish_reason = FinishReason::kLength;
  return o;
}

// One fake instance: prefill answers token 10 "A" paused; decode streams
// `events`, breaking off after `break_after` of them (-1: never).
class FakeInstance {
 public:
  FakeInstance(std::string name, std::string role) : name_(std::move(name)), role_(std::move(role)) {
    server::HttpServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    auto s = server::HttpServer::Create(o, [this](server::HttpRequest&& r, std::shared_ptr<server::ResponseWriter> w) {
      Handle(r, w);
    });
    EXPECT_TRUE(s.ok());
    server_ = std::move(*s);
    server_->Start();
  }
  ~FakeInstance() { server_->Stop(); }
  transfer::InstanceInfo info() const {
    transfer::InstanceInfo i;
    i.name = name_;
    i.role = role_;
    i.model = "m";
    i.http_address = "127.0.0.1:" + std::to_string(server_->port());
    return i;
  }
  std::vector<RequestOutput> events;
  int break_after = -1;
  std::atomic<int> not_now{0};  // answer this many reservations 503 first
  std::atomic<int> reserves{0}, prefills{0}, decodes{0}, cancels{0}, lookups{0};
  // Prefill requests whose grants follow; grants messages with and without a reservation.
  std::atomic<int> keyed_prefills{0}, grants{0}, no_grants{0};
  // What /internal/pd/lookup answers; unset: 404 (an instance that cannot say).
  std::optional<LookupReply> lookup;
  std::atomic<bool> silent{false};  // answer lookups 404 for now (set between requests)

 private:
  void Handle(const server::HttpRequest& r, const std::shared_ptr<server::ResponseWriter>& w) {
    if (r.path == "/internal/pd/reserve") {
      ++reserves;
      if (not_now.load() > 0) {
        --not_now;
        return w->Send(503, "application/json", R"({"error":{"message":"not now"}})");
      }
      auto q = ReserveRequestFromJson(r.body);
      ReserveReply a;
      a.id = q.ok() ? q->id : 0;
      return w->Send(200, "application/json", ReserveReplyToJson(a));
    }
    if (r.path == "/internal/pd/prefill") {
      ++prefills;
      auto q = PrefillRequestFromJson(r.body);
      if (q.ok() && q->grants_key != 0) ++keyed_prefills;
      PrefillReply a;
      a.output = Token(10, "A");
      a.output.finished = true;
      a.output.finish_reason = FinishReason::kPaused;
      a.output.prompt_tokens = q.ok() ? static_cast<int32_t>(q->request.prompt.size()) : 0;
      a.output.cached_tokens = 16;
      a.output.cached_tokens_by_tier = {16};
      Continuation c;
      c.generated = {10};
      a.output.continuation = c;
      a.tier_kinds = {"device"};
      return w->Send(200, "application/json", PrefillReplyToJson(a));
    }
    if (r.path == "/internal/pd/decode") {
      ++decodes;
      w->StartStream(200, "text/event-stream");
      for (size_t i = 0; i < events.size(); ++i) {
        if (break_after >= 0 && static_cast<int>(i) >= break_after) break;
        w->Write("data: " + RequestOutputToJson(events[i]) + "\n\n");
      }
      return w->End();
    }
    if (r.path == "/internal/pd/lookup") {
      ++lookups;
      if (!lookup || silent.load()) return w->Send(404, "application/json", "{}");
      return w->Send(200, "application/json", LookupReplyToJson(*lookup));
    }
    if (r.path == "/internal/pd/grants") {
      auto m = GrantsMessageFromJson(r.body);
      ++(m.ok() && m->decode ? grants : no_grants);
      return w->Send(200, "application/json", "{}");
    }
    if (r.path == "/internal/pd/cancel") {
      ++cancels;
      return w->Send(200, "application/json", "{}");
    }
    w->Send(404, "application/json", "{}");
  }
  std::string name_, role_;
  std::unique_ptr<server::HttpServer> server_;
};

// Collects one request's events; waits for the final one.
struct Sink {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<RequestOutput> events;
  bool done = false;
  scheduler::OutputSink fn() {
    return [this](RequestOutput&& o) {
      std::lock_guard lock(mu);
      done = o.finished;
      events.push_back(std::move(o));
      cv.notify_all();
    };
  }
  bool Wait() {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(30), [&] { return done; });
  }
  std::string text() {
    std::string t;
    for (const auto& e : events) t += e.text;
    return t;
  }
  std::vector<int32_t> tokens() {
    std::vector<int32_t> t;
    for (const auto& e : events) t.insert(t.end(), e.token_ids.begin(), e.token_ids.end());
    return t;
  }
};

scheduler::EngineRequest Request() {
  scheduler::EngineRequest r;
  r.prompt = std::vector<int32_t>(40, 7);
  r.max_tokens = 4;
  return r;
}

PdRouterOptions Options() {
  PdRouterOptions o;
  o.model = "m";
  o.avoid = std::chrono::milliseconds(0);
  return o;
}

TEST(PdRouter, ABrokenDecodeStreamIsResumedElsewhereAsOneStream) {
  FakeInstance p("p", "prefill"), da("da", "decode"), db("db", "decode");
  const std::vector<RequestOutput> stream = {Token(11, "B"), Token(12, "C"), Token(13, "D", true)};
  da.events = stream;
  da.break_after = 1;  // dies after "B"
  db.events = stream;
  PdRouter router([&] { return Result<std::vector<transfer::InstanceInfo>>({p.info(), da.info(), db.info()}); },
                  Options());
  Sink sink;
  auto id = router.Submit(Request(), sink.fn());
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(sink.Wait());
  EXPECT_EQ(sink.text(), "ABCD");
  EXPECT_EQ(sink.tokens(), (std::vector<int32_t>{10, 11, 12, 13}));
  const RequestOutput& last = sink.events.back();
  EXPECT_EQ(last.finish_reason, FinishReason::kLength);
  EXPECT_EQ(last.completion_tokens, 4);
  EXPECT_EQ(last.prompt_tokens, 40);
  EXPECT_EQ(last.cached_tokens, 16);
  EXPECT_EQ(last.prefill_instance, "p");
  EXPECT_EQ(last.decode_instances, (std::vector<std::string>{"da", "db"}));
  EXPECT_EQ(p.prefills.load(), 2) << "the handoff ran again for the new decode instance";
  EXPECT_EQ(router.stats().decode_failovers, 1u);
  // The request leaves the table just after its final event.
  for (int i = 0; i < 1000 && router.stats().in_flight > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(router.stats().in_flight, 0);
}

TEST(PdRouter, DecodeInstancesThatAreFullForNowMakeTheRequestWait) {
  FakeInstance p("p", "prefill"), d("d", "decode");
  d.events = {Token(11, "B", true)};
  d.not_now = 3;
  PdRouter router([&] { return Result<std::vector<transfer::InstanceInfo>>({p.info(), d.info()}); }, Options());
  Sink sink;
  ASSERT_TRUE(router.Submit(Request(), sink.fn()).ok());
  ASSERT_TRUE(sink.Wait());
  EXPECT_EQ(sink.text(), "AB");
  EXPECT_EQ(sink.events.back().finish_reason, FinishReason::kLength);
  EXPECT_EQ(d.reserves.load(), 4);
  EXPECT_EQ(router.stats().not_now, 3u);
}

TEST(PdRouter, TheReservationIsMadeBesideThePrefillAndItsGrantsFollow) {
  FakeInstance p("p", "prefill"), d("d", "decode");
  d.events = {Token(11, "B", true)};
  PdRouter router([&] { return Result<std::vector<transfer::InstanceInfo>>({p.info(), d.info()}); }, Options());
  {
    Sink sink;
    ASSERT_TRUE(router.Submit(Request(), sink.fn()).ok());
    ASSERT_TRUE(sink.Wait());
    EXPECT_EQ(sink.text(), "AB");
  }
  EXPECT_EQ(p.keyed_prefills.load(), 1) << "the prefill did not wait for the reservation";
  EXPECT_EQ(p.grants.load(), 1);
  EXPECT_EQ(d.reserves.load(), 1);
  // A reservation refused for now: the prefill is told no grants come (it
  // writes nothing), and the retry reserves first.
  d.not_now = 1;
  {
    Sink sink;
    ASSERT_TRUE(router.Submit(Request(), sink.fn()).ok());
    ASSERT_TRUE(sink.Wait());
    EXPECT_EQ(sink.text(), "AB");
    EXPECT_EQ(sink.tokens(), (std::vector<int32_t>{10, 11}));
  }
  EXPECT_EQ(p.no_grants.load(), 1);
  EXPECT_EQ(p.prefills.load(), 3);
  EXPECT_EQ(p.keyed_prefills.load(), 2) << "after a 'not now', the reservation comes first";
  EXPECT_EQ(p.grants.load(), 1);
  EXPECT_EQ(d.reserves.load(), 3);
  // Switched off: one after the other, the grants inside the prefill request.
  PdRouterOptions o = Options();
  o.overlap_reserve = false;
  PdRouter serial([&] { return Result<std::vector<transfer::InstanceInfo>>({p.info(), d.info()}); }, o);
  Sink sink;
  ASSERT_TRUE(serial.Submit(Request(), sink.fn()).ok());
  ASSERT_TRUE(sink.Wait());
  EXPECT_EQ(sink.text(), "AB");
  EXPECT_EQ(p.prefills.load(), 4);
  EXPECT_EQ(p.keyed_prefills.load(), 2);
  EXPECT_EQ(p.grants.load() + p.no_grants.load(), 2);
}

TEST(PdRouter, TtftAsksEveryCandidateAndPicksTheLowestPrediction) {
  // Three prefill candidates, asked at once: "near" holds 32 of the 40
  // prompt tokens, "busy" has 10,000 tokens queued, "mute" cannot answer
  // (it keeps the router's defaults: the whole prompt at the mean known
  // rate). The prediction is lowest at "near".
  FakeInstance near("near", "prefill"), busy("busy", "prefill"), mute("mute", "prefill"), d("d", "decode");
  d.events = {Token(11, "B", true)};
  LookupReply a;
  a.prefill_tokens_per_s = 1000;
  busy.lookup = a;
  busy.lookup->pending_prefill_tokens = 10000;
  near.lookup = a;
  near.lookup->cached_tokens = 32;
  PdRouterOptions o = Options();
  o.routing = scheduler::RoutingPolicy::kTtft;
  PdRouter router(
      [&] { return Result<std::vector<transfer::InstanceInfo>>({busy.info(), mute.info(), near.info(), d.info()}); },
      o);
  for (int k = 0; k < 3; ++k) {
    Sink sink;
    ASSERT_TRUE(router.Submit(Request(), sink.fn()).ok());
    ASSERT_TRUE(sink.Wait());
    EXPECT_EQ(sink.text(), "AB");
    EXPECT_EQ(sink.events.back().prefill_instance, "near") << "request " << k;
  }
  EXPECT_EQ(near.prefills.load(), 3);
  EXPECT_EQ(busy.prefills.load() + mute.prefills.load(), 0);
  for (FakeInstance* f : {&near, &busy, &mute}) EXPECT_EQ(f->lookups.load(), 3);
}

TEST(PdRouter, TtftKeepsACandidatesLastReportedRateWhenItsLookupFails) {
  // "slow" computes 100 tokens/s, "fast" 1000 with 100 tokens queued: the
  // 40-token prompt is predicted at 0.4 s and 0.14 s. When slow's lookup
  // then fails (an instance deep in a long step may not answer in time),
  // the router keeps its last reported rate: taking the mean of the
  // others' (1000: 0.04 s) would send the request to the slow one.
  FakeInstance fast("fast", "prefill"), slow("slow", "prefill"), d("d", "decode");
  d.events = {Token(11, "B", true)};
  LookupReply a;
  a.prefill_tokens_per_s = 1000;
  a.pending_prefill_tokens = 100;
  fast.lookup = a;
  a.prefill_tokens_per_s = 100;
  a.pending_prefill_tokens = 0;
  slow.lookup = a;
  PdRouterOptions o = Options();
  o.routing = scheduler::RoutingPolicy::kTtft;
  PdRouter router([&] { return Result<std::vector<transfer::InstanceInfo>>({slow.info(), fast.info(), d.info()}); },
                  o);
  for (int k = 0; k < 2; ++k) {
    if (k == 1) slow.silent = true;
    Sink sink;
    ASSERT_TRUE(router.Submit(Request(), sink.fn()).ok());
    ASSERT_TRUE(sink.Wait());
    EXPECT_EQ(sink.text(), "AB");
    EXPECT_EQ(sink.events.back().prefill_instance, "fast") << "request " << k;
  }
  EXPECT_EQ(slow.lookups.load(), 2);
  EXPECT_EQ(slow.prefills.load(), 0);
}

TEST(PdRouter, WithoutADecodeInstanceTheRequestFailsWithTheReason) {
  FakeInstance p("p", "prefill");
  PdRouter router([&] { return Result<std::vector<transfer::InstanceInfo>>({p.info()}); }, Options());
  Sink sink;
  ASSERT_TRUE(router.Submit(Request(), sink.fn()).ok());
  ASSERT_TRUE(sink.Wait());
  ASSERT_EQ(sink.events.size(), 1u);
  EXPECT_EQ(sink.events[0].finish_reason, FinishReason::kError);
  EXPECT_NE(sink.events[0].status.message().find("no decode instance"), std::string::npos)
      << sink.events[0].status.message();
  EXPECT_EQ(p.prefills.load(), 0);
  EXPECT_EQ(router.stats().no_instance, 1u);
}

TEST(PdRouter, InstancesOfAnotherModelAreNotUsedAndDrainingRefuses) {
  FakeInstance p("p", "prefill"), d("d", "decode");
  PdRouterOptions o = Options();
  o.model = "other";
  PdRouter router([&] { return Result<std::vector<transfer::InstanceInfo>>({p.info(), d.info()}); }, o);
  EXPECT_TRUE(router.instances().empty());
  router.SetDraining();
  auto id = router.Submit(Request(), [](RequestOutput&&) {});
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.error().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace strata::cluster
