#include "cluster/pd_router.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <random>
#include <thread>
#include <tuple>

#include "cluster/pd_wire.h"
#include "common/logging.h"
#include "kvcache/clock.h"

namespace strata::cluster {

using scheduler::RequestOutput;

bool StreamSplicer::Take(RequestOutput* ev) {
  // Tokens: those of this attempt at positions already delivered must match.
  const size_t first = attempt_tokens_;
  const size_t n = ev->token_ids.size();
  size_t skip = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t pos = first + i;
    if (pos >= delivered_ids_.size()) break;
    if (delivered_ids_[pos] != ev->token_ids[i]) return false;
    ++skip;
  }
  attempt_tokens_ += n;
  // Text: the attempt's text so far must agree with what was delivered.
  attempt_text_ += ev->text;
  const size_t common = std::min(attempt_text_.size(), delivered_text_.size());
  if (attempt_text_.compare(0, common, delivered_text_, 0, common) != 0) return false;
  std::string fresh = attempt_text_.size() > delivered_text_.size() ? attempt_text_.substr(delivered_text_.size())
                                                                      : std::string();
  if (skip > 0) {
    ev->token_ids.erase(ev->token_ids.begin(), ev->token_ids.begin() + static_cast<std::ptrdiff_t>(skip));
    if (ev->logprobs.size() >= skip)
      ev->logprobs.erase(ev->logprobs.begin(), ev->logprobs.begin() + static_cast<std::ptrdiff_t>(skip));
  }
  delivered_ids_.insert(delivered_ids_.end(), ev->token_ids.begin(), ev->token_ids.end());
  delivered_text_ += fresh;
  ev->text = std::move(fresh);
  ev->completion_tokens = static_cast<int32_t>(delivered_ids_.size());
  return true;
}

struct PdRouter::Flight {
  RequestId id{0};
  scheduler::EngineRequest request;
  scheduler::OutputSink sink;
  int64_t arrival = 0;
  int64_t first_token = 0;
  StreamSplicer splicer;
  std::string prefill_instance;
  std::vector<std::string> decode_instances;
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;
  std::vector<int32_t> cached_by_kind;  // indexed like tier_kinds_
  bool finished = false;                // the final event was delivered
  double predicted_ttft = -1;           // of the instance first chosen (seconds; -1: not known)
  double predicted_scale = 1;           // its ttft_scale then
  std::string predicted_on;             // that instance
  int64_t routed_tokens = 0;            // prompt tokens counted in its prefill instance's queue (Pick)
  bool cancel_sent = false;             // Cancel was asked for (its final event is "abort")

  std::mutex mu;  // the fields below
  std::condition_variable cv;
  bool cancelled = false;
  bool held = false;
  std::vector<std::shared_ptr<HttpConnection>> conns;  // the calls in progress (two while reserving beside the prefill)
};

namespace {

int64_t Now() { return kvcache::RealClock()->NowNanos(); }

bool ParseHostPort(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  *host = address.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  const char* b = address.data() + colon + 1;
  const char* e = address.data() + address.size();
  auto r = std::from_chars(b, e, *port);
  return r.ec == std::errc() && r.ptr == e && *port > 0 && *port < 65536;
}

std::string Describe(const Result<HttpResponse>& r) {
  if (!r.ok()) return r.error().message();
  std::string body = r->body.size() > 300 ? r->body.substr(0, 300) + "..." : r->body;
  return "HTTP " + std::to_string(r->status) + ": " + body;
}

}  // namespace

PdRouter::PdRouter(ListInstancesFn list, PdRouterOptions options)
    : list_(std::move(list)),
      options_(std::move(options)),
      tier_names_([] {
        std::vector<std::string> n;
        for (kvcache::TierKind k : kvcache::kAllTierKinds) n.emplace_back(kvcache::TierKindName(k));
        return n;
      }()),
      tier_kinds_(kvcache::kAllTierKinds.begin(), kvcache::kAllTierKinds.end()),
      prefill_router_(options_.routing),
      // A decode instance's worth is the blocks of the prompt it holds
      // already (not sent again): cache-aware policies prefer those.
      decode_router_(options_.routing == scheduler::RoutingPolicy::kTtft ? scheduler::RoutingPolicy::kLongestPrefix
                                                                         : options_.routing) {
  // Reservation ids: random high bits, so that a new router (after one
  // died) does not reuse the ids of reservations its predecessor left.
  std::random_device rd;
  next_reservation_.store((static_cast<uint64_t>(rd() & 0x7fffffffu) << 32) | 1);
  Refresh();
  membership_ = std::thread([this] { MembershipLoop(); });
}

PdRouter::~PdRouter() { Stop(0); }

void PdRouter::Refresh() {
  auto listed = list_();
  if (!listed) {
    STRATA_LOG_WARN("router: reading the instance list: {}", listed.error().message());
    return;
  }
  std::vector<PdInstance> fresh;
  for (const transfer::InstanceInfo& i : *listed) {
    if (i.model != options_.model) continue;
    PdInstance p;
    p.name = i.name;
    p.role = i.role;
    if (!ParseHostPort(i.http_address, &p.host, &p.port)) continue;
    fresh.push_back(std::move(p));
  }
  std::lock_guard lock(mu_);
  // Keep each known instance's load and avoidance.
  for (PdInstance& p : fresh) {
    for (const PdInstance& old : instances_) {
      if (old.name != p.name) continue;
      p.prefilling = old.prefilling;
      p.decoding = old.decoding;
      p.prefill_tokens = old.prefill_tokens;
      p.ttft_scale = old.ttft_scale;
      p.reported_prefill_tokens_per_s = old.reported_prefill_tokens_per_s;
      p.reported_decode_step_seconds = old.reported_decode_step_seconds;
      p.avoid_until = old.avoid_until;
    }
  }
  // Instances that left but still carry this router's requests keep their
  // counts until those end (Unload finds them).
  for (const PdInstance& old : instances_) {
    bool present = std::any_of(fresh.begin(), fresh.end(), [&](const PdInstance& p) { return p.name == old.name; });
    if (!present && (old.prefilling > 0 || old.decoding > 0)) {
      PdInstance gone = old;
      gone.role = "gone";
      fresh.push_back(std::move(gone));
    }
  }
  std::set<std::string> addresses;
  for (const PdInstance& p : fresh) addresses.insert(p.host + ":" + std::to_string(p.port));
  instances_ = std::move(fresh);
  // Idle connections to addresses no instance has any more are closed.
  std::lock_guard pool_lock(pool_mu_);
  std::erase_if(idle_, [&](const auto& kv) { return addresses.count(kv.first) == 0; });
}

void PdRouter::MembershipLoop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, options_.refresh, [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    Refresh();
    lock.lock();
  }
}

std::vector<PdInstance> PdRouter::instances() const {
  std::lock_guard lock(mu_);
  return instances_;
}

bool PdRouter::Pick(Flight& f, Phase phase, const std::set<std::string>& exclude, const std::string& other,
                    PdInstance* out, std::pair<double, double>* predicted) {
  // The candidates: the role, not excluded; instances not avoided (after a
  // failure) and not the other phase's instance first, when there are such.
  std::vector<PdInstance> cands;
  {
    std::lock_guard lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    for (const PdInstance& p : instances_) {
      const bool role_ok = phase == Phase::kPrefill ? (p.role == "prefill" || p.role == "both")
                                                    : (p.role == "decode" || p.role == "both");
      if (role_ok && exclude.count(p.name) == 0) cands.push_back(p);
    }
    auto prefer = [&](auto good) {
      if (std::any_of(cands.begin(), cands.end(), good)) std::erase_if(cands, [&](const PdInstance& p) { return !good(p); });
    };
    prefer([&](const PdInstance& p) { return p.avoid_until <= now; });
    prefer([&](const PdInstance& p) { return p.name != other; });
  }
  if (cands.empty()) return false;
  scheduler::Router& router = phase == Phase::kPrefill ? prefill_router_ : decode_router_;
  const auto prompt = static_cast<int64_t>(f.request.prompt.size());
  std::vector<scheduler::RouteCandidate> rc(cands.size());
  for (size_t i = 0; i < cands.size(); ++i) {
    rc[i].unfinished = phase == Phase::kPrefill ? cands[i].prefilling : cands[i].decoding;
    // Until an instance says otherwise: all of the prompt to compute behind
    // what this router sent it, at the rates it last reported, else its
    // calibrated ones (if any). Not the other candidates' mean: an instance
    // too busy to answer in time is likely the slow one.
    rc[i].uncached_tokens = prompt;
    rc[i].queue_tokens = cands[i].prefill_tokens;
    const scheduler::CalibratedRates cal = Calibrated(cands[i].name);
    rc[i].prefill_tokens_per_s =
        cands[i].reported_prefill_tokens_per_s > 0 ? cands[i].reported_prefill_tokens_per_s : cal.prefill_tokens_per_s;
    rc[i].tpot_seconds =
        cands[i].reported_decode_step_seconds > 0 ? cands[i].reported_decode_step_seconds : cal.decode_step_seconds;
    rc[i].ttft_scale = cands[i].ttft_scale;
  }
  const bool slo = phase == Phase::kPrefill ? options_.slo_ttft_seconds > 0 : options_.slo_tpot_seconds > 0;
  const bool looked = (router.needs_cached_tokens() && cands.size() > 1) || slo;
  if (looked) LookUp(f, phase, cands, &rc);
  std::lock_guard lock(mu_);
  if (looked && phase == Phase::kPrefill) {
    // Requests routed by other threads while this one asked: their prompts
    // are queued ahead of this one too (else a burst herds to whichever
    // candidate looked best before any of it was counted).
    for (size_t i = 0; i < cands.size(); ++i) {
      for (const PdInstance& p : instances_) {
        if (p.name != cands[i].name || p.prefill_tokens <= rc[i].queue_tokens) continue;
        rc[i].queue_tokens = p.prefill_tokens;
        rc[i].queue_done_seconds = 0;
      }
    }
  }
  const size_t k = phase == Phase::kPrefill ? router.Pick(rc) : router.PickDecode(rc, prompt);
  *out = cands[k];
  if (predicted != nullptr) {
    // Predictions need the lookups (or calibrations): prefill TTFT (an
    // unknown rate takes the mean of the known ones), decode the recent
    // decode step time.
    const double mean = scheduler::MeanKnownPrefillRate(rc);
    auto pred = [&](size_t i) {
      if (!looked) return -1.0;
      if (phase == Phase::kDecode) return rc[i].tpot_seconds > 0 ? rc[i].tpot_seconds : -1.0;
      return scheduler::PredictTtftSeconds(rc[i], mean);
    };
    double best = -1;
    for (size_t i = 0; i < rc.size(); ++i) {
      const double v = pred(i);
      if (v >= 0 && (best < 0 || v < best)) best = v;
    }
    *predicted = {best, pred(k)};
  }
  if (phase == Phase::kPrefill) f.routed_tokens = rc[k].uncached_tokens;
  if (looked && phase == Phase::kPrefill && ::spdlog::should_log(::spdlog::level::debug)) {
    std::string what;
    const double mean = scheduler::MeanKnownPrefillRate(rc);
    for (size_t i = 0; i < rc.size(); ++i) {
      what += fmt::format(" {}{}: queue {} (done {:.3f}s) uncached {} rate {:.0f} scale {:.2f} load {:.3f}s -> {:.3f}s;",
                          i == k ? "*" : "", cands[i].name, rc[i].queue_tokens, rc[i].queue_done_seconds,
                          rc[i].uncached_tokens, rc[i].prefill_tokens_per_s, rc[i].ttft_scale, rc[i].load_seconds,
                          scheduler::PredictTtftSeconds(rc[i], mean));
    }
    STRATA_LOG_DEBUG("router: request {} prefill candidates:{}", f.id.value(), what);
  }
  for (PdInstance& p : instances_) {
    if (p.name != out->name) continue;
    (phase == Phase::kPrefill ? p.prefilling : p.decoding) += 1;
    if (phase == Phase::kPrefill) p.prefill_tokens += f.routed_tokens;
  }
  return true;
}

void PdRouter::LookUp(const Flight& f, Phase phase, const std::vector<PdInstance>& cands,
                      std::vector<scheduler::RouteCandidate>* rc) {
  // What each candidate holds of the prompt, its queue and rates.
  const std::string q = LookupRequestToJson({f.request.prompt, f.request.cache_salt});
  const auto prompt = static_cast<int64_t>(f.request.prompt.size());
  // All candidates at once: a slow or dead one (up to the 1 s timeout)
  // delays the choice by its own time, not by the sum of all of them.
  std::vector<Result<LookupReply>> replies(cands.size(), Result<LookupReply>(Status::Unavailable("not asked")));
  auto ask = [&](size_t i) {
    // On a kept-alive connection of the pool (a call that timed out or
    // failed closes its connection, which then is not returned).
    std::shared_ptr<HttpConnection> conn = TakeConnection(cands[i].host, cands[i].port);
    auto r = conn->Call("POST", "/internal/pd/lookup", q, options_.auth, 1.0);
    if (r.ok() && conn->connected()) ReturnConnection(cands[i].host, cands[i].port, std::move(conn));
    replies[i] = r && r->status == 200 ? LookupReplyFromJson(r->body) : Result<LookupReply>(Status::Unavailable(Describe(r)));
  };
  workers_.RunAll(cands.size(), ask);
  for (size_t i = 0; i < cands.size(); ++i) {
    const Result<LookupReply>& a = replies[i];
    if (!a) continue;  // known nothing more
    scheduler::RouteCandidate& c = (*rc)[i];
    c.cached_tokens = phase == Phase::kPrefill ? a->cached_tokens : a->device_cached_tokens;
    c.uncached_tokens = std::max<int64_t>(0, prompt - c.cached_tokens);
    // Its own queue, or what this router sent it and it has not answered
    // yet when larger (requests on their way are not in its queue yet).
    c.queue_tokens = std::max(a->pending_prefill_tokens, cands[i].prefill_tokens);
    if (c.queue_tokens == a->pending_prefill_tokens) c.queue_done_seconds = a->step_elapsed_seconds;
    if (a->prefill_tokens_per_s > 0) c.prefill_tokens_per_s = a->prefill_tokens_per_s;
    if (a->decode_step_seconds > 0) c.tpot_seconds = a->decode_step_seconds;
    c.load_seconds = phase == Phase::kPrefill ? a->load_seconds : 0;
    c.free_kv_tokens = a->device_tokens > 0 ? a->device_free_tokens : -1;
  }
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < cands.size(); ++i) {
    if (!replies[i]) continue;
    for (PdInstance& p : instances_) {
      if (p.name != cands[i].name) continue;
      if (replies[i]->prefill_tokens_per_s > 0) p.reported_prefill_tokens_per_s = replies[i]->prefill_tokens_per_s;
      if (replies[i]->decode_step_seconds > 0) p.reported_decode_step_seconds = replies[i]->decode_step_seconds;
    }
  }
}

scheduler::CalibratedRates PdRouter::Calibrated(const std::string& name) const {
  auto it = options_.calibration.find(name);
  return it != options_.calibration.end() ? it->second : options_.default_calibration;
}

void PdRouter::Unload(Phase phase, const std::string& name, int64_t tokens) {
  std::lock_guard lock(mu_);
  for (auto it = instances_.begin(); it != instances_.end(); ++it) {
    if (it->name != name) continue;
    int& load = phase == Phase::kPrefill ? it->prefilling : it->decoding;
    if (load > 0) --load;
    if (phase == Phase::kPrefill) it->prefill_tokens = std::max<int64_t>(0, it->prefill_tokens - tokens);
    if (it->role == "gone" && it->prefilling == 0 && it->decoding == 0) instances_.erase(it);
    return;
  }
}

void PdRouter::Learn(const std::string& name, double predicted, double scale, double observed) {
  const double target = std::clamp(scale * observed / predicted, 0.25, 8.0);
  std::lock_guard lock(mu_);
  for (PdInstance& p : instances_) {
    if (p.name == name) p.ttft_scale = std::clamp(0.7 * p.ttft_scale + 0.3 * target, 0.25, 8.0);
  }
}

void PdRouter::Avoid(const std::string& name) {
  std::lock_guard lock(mu_);
  for (PdInstance& p : instances_) {
    if (p.name == name) p.avoid_until = std::chrono::steady_clock::now() + options_.avoid;
  }
}

Result<RequestId> PdRouter::Submit(scheduler::EngineRequest request, scheduler::OutputSink sink) {
  if (request.prompt.empty()) return Status::InvalidArgument("the prompt has no tokens");
  if (draining_.load()) return Status::Unavailable("the router is draining");
  auto f = std::make_shared<Flight>();
  f->request = std::move(request);
  f->request.on_computed = nullptr;
  f->sink = std::move(sink);
  f->arrival = Now();
  std::lock_guard lock(mu_);
  if (stopping_) return Status::Unavailable("the router is stopping");
  if (static_cast<int>(flights_.size()) >= options_.max_in_flight)
    return Status::ResourceExhausted("the router has " + std::to_string(flights_.size()) + " requests in flight");
  f->id = RequestId(next_id_++);
  flights_[f->id.value()] = f;
  if (!workers_.Post([this, f] { Run(f); })) {
    flights_.erase(f->id.value());
    return Status::ResourceExhausted("the router could not start a thread for the request");
  }
  ++stats_.requests;
  return f->id;
}

void PdRouter::Cancel(RequestId id) {
  std::shared_ptr<Flight> f;
  {
    std::lock_guard lock(mu_);
    auto it = flights_.find(id.value());
    if (it == flights_.end()) return;
    f = it->second;
  }
  std::vector<std::shared_ptr<HttpConnection>> conns;
  {
    std::lock_guard lock(f->mu);
    f->cancelled = true;
    conns = f->conns;
  }
  f->cv.notify_all();
  for (const auto& conn : conns) conn->Abort();
}

void PdRouter::SetHeld(RequestId id, bool held) {
  std::shared_ptr<Flight> f;
  {
    std::lock_guard lock(mu_);
    auto it = flights_.find(id.value());
    if (it == flights_.end()) return;
    f = it->second;
  }
  {
    std::lock_guard lock(f->mu);
    f->held = held;
  }
  f->cv.notify_all();
}

scheduler::EngineStats PdRouter::Stats() const {
  scheduler::EngineStats s;
  std::lock_guard lock(mu_);
  s.num_running = static_cast<int>(flights_.size());
  s.draining = draining_.load();
  s.finished_by_reason = stats_.finished_by_reason;
  return s;
}

PdRouterStats PdRouter::stats() const {
  std::lock_guard lock(mu_);
  PdRouterStats s = stats_;
  s.in_flight = static_cast<int>(flights_.size());
  return s;
}

void PdRouter::Stop(double grace_seconds) {
  draining_.store(true);
  {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::duration<double>(grace_seconds), [this] { return flights_.empty(); });
    stopping_ = true;
  }
  cv_.notify_all();
  std::vector<RequestId> left;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, f] : flights_) left.push_back(RequestId(id));
  }
  for (RequestId id : left) Cancel(id);
  workers_.Wait();  // every flight's Run has returned
  if (membership_.joinable()) membership_.join();
}

Result<HttpResponse> PdRouter::Call(Flight& f, const PdInstance& to, const std::string& path, const std::string& body,
                                    HttpDataFn on_data) {
  std::shared_ptr<HttpConnection> conn = TakeConnection(to.host, to.port);
  {
    std::lock_guard lock(f.mu);
    if (f.cancelled) return Status::Cancelled("the request was cancelled");
    f.conns.push_back(conn);
  }
  Result<HttpResponse> r = on_data ? conn->Stream("POST", path, body, options_.auth, std::move(on_data),
                                                  options_.call_timeout_s)
                                   : conn->Call("POST", path, body, options_.auth, options_.call_timeout_s);
  bool cancelled;
  {
    std::lock_guard lock(f.mu);
    std::erase(f.conns, conn);
    cancelled = f.cancelled;
  }
  if (cancelled) return Status::Cancelled("the request was cancelled");
  // Back to the pool when the response ended on an open connection (the
  // client closes it after a stream stopped early, an error or "close").
  // Not cancelled: Cancel sets `cancelled` where it takes f.conns, so no
  // Cancel holds this one (an aborted connection fails every later call).
  if (r.ok() && conn->connected()) ReturnConnection(to.host, to.port, std::move(conn));
  return r;
}

std::shared_ptr<HttpConnection> PdRouter::TakeConnection(const std::string& host, int port) {
  {
    std::lock_guard lock(pool_mu_);
    auto it = idle_.find(host + ":" + std::to_string(port));
    if (it != idle_.end() && !it->second.empty()) {
      std::shared_ptr<HttpConnection> c = std::move(it->second.back());
      it->second.pop_back();
      return c;
    }
  }
  return std::make_shared<HttpConnection>(host, port);
}

void PdRouter::ReturnConnection(const std::string& host, int port, std::shared_ptr<HttpConnection> conn) {
  std::lock_guard lock(pool_mu_);
  auto& idle = idle_[host + ":" + std::to_string(port)];
  if (idle.size() < kIdlePerInstance) idle.push_back(std::move(conn));
}

void PdRouter::CancelReservation(const PdInstance& d, uint64_t id) {
  // Best effort: a reservation nobody decodes is freed at its lease anyway.
  auto r = HttpCall(d.host, d.port, "POST", "/internal/pd/cancel", "{\"id\":" + std::to_string(id) + "}",
                    options_.auth, 5);
  if (!r || (r->status != 200 && r->status != 404))
    STRATA_LOG_DEBUG("router: cancelling reservation {} at {}: {}", id, d.name, Describe(r));
}

bool PdRouter::Deliver(Flight& f, RequestOutput ev) {
  const bool had_tokens = !ev.token_ids.empty();
  if (!f.splicer.Take(&ev)) {
    std::lock_guard lock(mu_);
    ++stats_.replay_mismatches;
    return false;
  }
  const int64_t now = Now();
  if (had_tokens && f.splicer.delivered_tokens() > 0 && f.first_token == 0) {
    f.first_token = now;
    if (f.predicted_ttft > 0) {
      const double observed = static_cast<double>(now - f.arrival) * 1e-9;
      const double ratio = observed / f.predicted_ttft;
      Learn(f.predicted_on, f.predicted_ttft, f.predicted_scale, observed);
      size_t b = 0;
      while (b < std::size(kTtftRatioBounds) && ratio > kTtftRatioBounds[b]) ++b;
      std::lock_guard lock(mu_);
      ++stats_.ttft_ratio_buckets[b];
      stats_.ttft_ratio_sum += ratio;
      ++stats_.ttft_ratio_count;
    }
  }
  ev.id = f.id;
  ev.continuation.reset();
  ev.prompt_tokens = f.prompt_tokens;
  ev.cached_tokens = f.cached_tokens;
  ev.cached_tokens_by_tier = f.cached_by_kind;
  ev.prefill_instance = f.prefill_instance;
  ev.decode_instances = f.decode_instances;
  ev.timings = {};
  ev.timings.arrival = f.arrival;
  ev.timings.first_token = f.first_token;
  ev.timings.last_token = f.first_token != 0 ? now : 0;
  if (ev.finished) {
    ev.timings.finished = now;
    f.finished = true;
    std::lock_guard lock(mu_);
    ++stats_.finished_by_reason[std::string(FinishReasonName(ev.finish_reason))];
  }
  f.sink(std::move(ev));
  return true;
}

bool PdRouter::Refused(Flight& f, double best_ttft, double best_tpot, Status* why) {
  char msg[256];
  if (options_.slo_ttft_seconds > 0 && best_ttft > options_.slo_ttft_seconds) {
    std::snprintf(msg, sizeof(msg), "%s: the best predicted time to first token is %.3f s, over the SLO of %.3f s",
                  scheduler::kSloUnattainable.data(), best_ttft, options_.slo_ttft_seconds);
    std::lock_guard lock(mu_);
    ++stats_.refused_slo_ttft;
  } else if (options_.slo_tpot_seconds > 0 && best_tpot > options_.slo_tpot_seconds) {
    std::snprintf(msg, sizeof(msg), "%s: the best predicted time per output token is %.4f s, over the SLO of %.4f s",
                  scheduler::kSloUnattainable.data(), best_tpot, options_.slo_tpot_seconds);
    std::lock_guard lock(mu_);
    ++stats_.refused_slo_tpot;
  } else {
    return false;
  }
  *why = Status::ResourceExhausted(msg);
  return true;
}

void PdRouter::Final(Flight& f, FinishReason reason, const Status& status) {
  RequestOutput ev;
  ev.finished = true;
  ev.finish_reason = reason;
  ev.status = status;
  // Nothing new to cut: a final event without tokens always passes.
  Deliver(f, std::move(ev));
}

void PdRouter::Run(const std::shared_ptr<Flight>& fp) {
  Flight& f = *fp;
  Tried tried;
  Status why = Status::Unavailable("no prefill/decode instance serves model '" + options_.model + "'");
  for (int attempt = 0; attempt < options_.max_attempts && !f.finished;) {
    {
      std::lock_guard lock(f.mu);
      if (f.cancelled) break;
    }
    bool free_retry = false;
    if (Attempt(f, &tried, &free_retry, &why)) break;
    if (!free_retry) ++attempt;
  }
  if (!f.finished) {
    bool cancelled;
    {
      std::lock_guard lock(f.mu);
      cancelled = f.cancelled;
    }
    if (cancelled) {
      Final(f, FinishReason::kAbort, Status::Cancelled("cancelled"));
    } else {
      if (why.code() == StatusCode::kUnavailable) {
        std::lock_guard lock(mu_);
        ++stats_.no_instance;
      }
      Final(f, FinishReason::kError, why);
    }
  }
  std::lock_guard lock(mu_);
  flights_.erase(f.id.value());
  cv_.notify_all();
}

bool PdRouter::Attempt(Flight& f, Tried* tried, bool* free_retry, Status* why) {
  std::set<std::string>* bad_prefill = &tried->prefill;
  std::set<std::string>* bad_decode = &tried->decode;
  PdInstance p, d;
  std::pair<double, double> ttft{-1, -1}, tpot{-1, -1};
  if (!Pick(f, Phase::kPrefill, *bad_prefill, "", &p, &ttft)) {
    *why = Status::Unavailable("no prefill instance of model '" + options_.model + "' is available" +
                               (bad_prefill->empty() ? "" : " (every one failed or refused)"));
    return true;
  }
  std::set<std::string> excluded = *bad_decode;
  excluded.insert(tried->not_now.begin(), tried->not_now.end());
  if (!Pick(f, Phase::kDecode, excluded, p.name, &d, &tpot)) {
    Unload(Phase::kPrefill, p.name, f.routed_tokens);
    const int64_t waited_ms = (Now() - f.arrival) / 1000000;
    if (!tried->not_now.empty() && waited_ms < options_.queue_timeout.count()) {
      // Every decode instance left is full for now: wait, then ask again.
      std::unique_lock lock(f.mu);
      f.cv.wait_for(lock, std::chrono::milliseconds(tried->backoff_ms), [&] { return f.cancelled; });
      tried->backoff_ms = std::min(tried->backoff_ms * 2, 500);
      tried->not_now.clear();
      *free_retry = true;
      return false;
    }
    *why = Status::Unavailable("no decode instance of model '" + options_.model + "' is available" +
                               (tried->not_now.empty() ? (bad_decode->empty() ? "" : " (every one failed)")
                                                       : " (their KV pools stayed full for the queue timeout)"));
    return true;
  }
  if (f.first_token == 0 && f.splicer.delivered_tokens() == 0) {
    // Nothing delivered yet: the request may still be refused by its SLO.
    if (Refused(f, ttft.first, tpot.first, why)) {
      Unload(Phase::kPrefill, p.name, f.routed_tokens);
      Unload(Phase::kDecode, d.name);
      return true;
    }
    if (f.predicted_ttft < 0) {
      f.predicted_ttft = ttft.second;
      f.predicted_scale = p.ttft_scale;
      f.predicted_on = p.name;
    }
  }
  const uint64_t rid = next_reservation_.fetch_add(1);
  ReserveRequest q{rid, f.request.prompt, f.request.cache_salt, options_.lease_ms, p.name};
  Result<HttpResponse> r = Status::Unavailable("not asked");
  Result<ReserveReply> reserve = Status::Unavailable("not asked");
  Result<HttpResponse> pr = Status::Unavailable("not asked");
  bool overlap = options_.overlap_reserve && !tried->reserve_first;
  if (overlap) {
    std::lock_guard lock(mu_);
    for (const PdInstance& i : instances_) {
      if (i.name == d.name && i.not_now_until > std::chrono::steady_clock::now()) overlap = false;
    }
  }
  if (overlap) {
    // The reservation beside the prefill: its grants follow the prefill
    // request (key rid); the prefill waits for them only at its first token.
    // With no pool thread to be had, the reservation runs first and then
    // the prefill (the instance keeps grants that come before their
    // prefill request).
    const std::string prefill_body = PrefillRequestToJson(PrefillRequest{f.request, {}, rid});
    workers_.RunAll(2, [&](size_t i) {
      if (i == 0) {
        ReserveBeside(f, p, d, q, &r, &reserve);
      } else {
        pr = Call(f, p, "/internal/pd/prefill", prefill_body);
      }
    });
    if (!r || r->status != 200 || !reserve.ok()) {
      // The prefill's answer (if any) is dropped; it wrote nothing.
      return ReserveFailed(f, tried, p, d, rid, r, reserve, free_retry, why);
    }
  }
  if (!overlap) {
    r = Call(f, d, "/internal/pd/reserve", ReserveRequestToJson(q));
    reserve = r && r->status == 200 ? ReserveReplyFromJson(r->body) : Result<ReserveReply>(Status::Ok());
    if (!r || r->status != 200 || !reserve.ok()) return ReserveFailed(f, tried, p, d, rid, r, reserve, free_retry, why);
    // Prefill: the first token, the blocks written.
    pr = Call(f, p, "/internal/pd/prefill", PrefillRequestToJson({f.request, *reserve}));
  }
  Unload(Phase::kPrefill, p.name, f.routed_tokens);
  auto prefill = pr && pr->status == 200 ? PrefillReplyFromJson(pr->body) : Result<PrefillReply>(Status::Ok());
  if (!pr || pr->status != 200 || !prefill.ok()) {
    Unload(Phase::kDecode, d.name);
    CancelReservation(d, rid);
    if (pr && pr->status >= 400 && pr->status < 500) {
      *why = Status::InvalidArgument("prefill instance " + p.name + " refused the request: " + Describe(pr));
      return true;
    }
    bad_prefill->insert(p.name);
    if (!pr.ok() && pr.error().code() == StatusCode::kCancelled) return true;
    if (!(pr && pr->status == 503)) Avoid(p.name);
    std::lock_guard lock(mu_);
    ++stats_.prefill_failovers;
    *why = Status::Unavailable("prefill instance " + p.name + ": " +
                               (prefill.ok() ? Describe(pr) : prefill.error().message()));
    STRATA_LOG_WARN("router: request {}: {}; trying another", f.id.value(), why->message());
    return false;
  }
  {
    std::lock_guard lock(mu_);
    ++stats_.prefills_by_instance[p.name];
  }
  RequestOutput first = std::move(prefill->output);
  f.prefill_instance = p.name;
  f.prompt_tokens = first.prompt_tokens;
  f.cached_tokens = first.cached_tokens;
  f.cached_by_kind.assign(tier_kinds_.size(), 0);
  for (size_t i = 0; i < first.cached_tokens_by_tier.size() && i < prefill->tier_kinds.size(); ++i) {
    if (auto k = kvcache::ParseTierKind(prefill->tier_kinds[i]))
      f.cached_by_kind[kvcache::TierKindIndex(*k)] += first.cached_tokens_by_tier[i];
  }
  f.splicer.BeginAttempt();
  if (first.finish_reason != FinishReason::kPaused || !first.continuation) {
    // Ended at its first token (or failed there): nothing to hand over.
    Unload(Phase::kDecode, d.name);
    CancelReservation(d, rid);
    first.finished = true;
    if (first.finish_reason == FinishReason::kPaused || first.finish_reason == FinishReason::kNone) {
      first.finish_reason = FinishReason::kError;
      first.status = Status::Internal("prefill instance " + p.name + " answered without a continuation");
    }
    if (!Deliver(f, std::move(first))) *why = Status::Internal("the resumed stream differed from the delivered one");
    return true;
  }
  DecodeRequest dq{rid, prefill->blocks_written, prefill->checksums, f.request};
  dq.request.continuation = *first.continuation;
  first.finished = false;
  first.finish_reason = FinishReason::kNone;
  if (f.decode_instances.empty() || f.decode_instances.back() != d.name) f.decode_instances.push_back(d.name);
  if (!Deliver(f, std::move(first))) {
    Unload(Phase::kDecode, d.name);
    CancelReservation(d, rid);
    *why = Status::Internal("the resumed stream differed from the one delivered before the failover");
    return true;
  }
  {
    std::lock_guard lock(mu_);
    ++stats_.handoffs;
  }
  const bool ended = Decode(f, d, DecodeRequestToJson(dq), why);
  Unload(Phase::kDecode, d.name);
  if (!ended) bad_decode->insert(d.name);
  return ended;
}

void PdRouter::ReserveBeside(Flight& f, const PdInstance& p, const PdInstance& d, const ReserveRequest& q,
                             Result<HttpResponse>* r, Result<ReserveReply>* reserve) {
  *r = Call(f, d, "/internal/pd/reserve", ReserveRequestToJson(q));
  *reserve = *r && (*r)->status == 200 ? ReserveReplyFromJson((*r)->body) : Result<ReserveReply>(Status::Ok());
  GrantsMessage m{q.id, std::nullopt};
  if (*r && (*r)->status == 200 && reserve->ok()) m.decode = **reserve;
  // Whatever becomes of this call, the prefill answers: without its grants
  // after its timeout, writing nothing (the decode instance recomputes).
  auto g = Call(f, p, "/internal/pd/grants", GrantsMessageToJson(m));
  if (!g.ok() || (g->status != 200 && g->status != 202)) {
    if (!g.ok() && g.error().code() == StatusCode::kCancelled) return;
    STRATA_LOG_WARN("router: request {}: the grants did not reach prefill instance {}: {}", f.id.value(), p.name,
                    Describe(g));
  }
}

bool PdRouter::ReserveFailed(Flight& f, Tried* tried, const PdInstance& p, const PdInstance& d, uint64_t rid,
                             const Result<HttpResponse>& r, const Result<ReserveReply>& reserve, bool* free_retry,
                             Status* why) {
  Unload(Phase::kPrefill, p.name, f.routed_tokens);
  Unload(Phase::kDecode, d.name);
  if (!r.ok() && r.error().code() == StatusCode::kCancelled) {
    CancelReservation(d, rid);  // it may have been made before the call was aborted
    return true;
  }
  {
    std::lock_guard lock(f.mu);
    if (f.cancelled) {
      CancelReservation(d, rid);
      return true;
    }
  }
  if (r && r->status == 503) {
    tried->not_now.insert(d.name);
    tried->reserve_first = true;
    *free_retry = true;
    std::lock_guard lock(mu_);
    ++stats_.not_now;
    for (PdInstance& i : instances_) {
      if (i.name == d.name) i.not_now_until = std::chrono::steady_clock::now() + options_.avoid;
    }
    return false;
  }
  tried->decode.insert(d.name);
  if (r && r->status >= 400 && r->status < 500) {
    *why = Status::InvalidArgument("decode instance " + d.name + " refused the request: " + Describe(r));
    return true;  // the same request would be refused anywhere
  }
  Avoid(d.name);
  *why = Status::Unavailable("decode instance " + d.name + ": " + (reserve.ok() ? Describe(r) : reserve.error().message()));
  return false;
}

bool PdRouter::Decode(Flight& f, const PdInstance& d, const std::string& body, Status* why) {
  {
    std::lock_guard lock(mu_);
    ++stats_.decodes_by_instance[d.name];
  }
  SseParser sse;
  bool mismatch = false, aborted_by_peer = false, bad_event = false;
  std::string bad_event_text;
  auto on_data = [&](std::string_view bytes) {
    sse.Feed(bytes);
    std::string data;
    while (!f.finished && sse.Next(&data)) {
      auto ev = RequestOutputFromJson(data);
      if (!ev) {
        bad_event = true;
        bad_event_text = ev.error().message();
        return false;
      }
      if (ev->finished && ev->finish_reason == FinishReason::kAbort) {
        // The instance aborted it (stopping, its grace over), not our
        // client (a cancel aborts the call first): resume elsewhere.
        aborted_by_peer = true;
        return false;
      }
      if (!Deliver(f, std::move(*ev))) {
        mismatch = true;
        return false;
      }
    }
    if (f.finished) return false;
    // Backpressure: while the client cannot take more, stop reading.
    std::unique_lock lock(f.mu);
    f.cv.wait(lock, [&] { return !f.held || f.cancelled; });
    return !f.cancelled;
  };
  auto r = Call(f, d, "/internal/pd/decode", body, on_data);
  if (f.finished) return true;
  if (mismatch) {
    *why = Status::Internal("the stream resumed after a failover differed from the one delivered");
    return true;
  }
  if (!r.ok() && r.error().code() == StatusCode::kCancelled) return true;  // Run sends the abort
  {
    std::lock_guard lock(f.mu);
    if (f.cancelled) return true;
  }
  if (r.ok() && r->status >= 400 && r->status < 500) {
    *why = Status::InvalidArgument("decode instance " + d.name + " refused the request: " + Describe(r));
    return true;
  }
  const std::string what = bad_event      ? "sent a bad event: " + bad_event_text
                           : aborted_by_peer ? std::string("aborted the request")
                           : !r.ok()         ? r.error().message()
                           : r->status != 200 ? Describe(r)
                                             : std::string("closed the stream before its last event");
  *why = Status::Unavailable("decode instance " + d.name + " " + what);
  Avoid(d.name);
  std::lock_guard lock(mu_);
  ++stats_.decode_failovers;
  STRATA_LOG_WARN("router: request {}: {}; resuming on another decode instance", f.id.value(), why->message());
  return false;
}

}  // namespace strata::cluster
