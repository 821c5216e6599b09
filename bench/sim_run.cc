#include "bench/sim_run.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "bench/cache_reference.h"
#include "bench/report.h"  // Percentile: the same definition as live runs
#include "bench/sim_store.h"
#include "kvcache/block_hash.h"
#include "kvcache/clock.h"
#include "kvcache/kv_manager.h"
#include "kvcache/tier_registry.h"
#include "scheduler/engine.h"

namespace strata::bench::internal {
namespace {

constexpr int64_t kNever = INT64_MAX;
// Above any prompt a trace holds; the engine checks prompt + max_tokens
// against it.
constexpr int kSimContextLength = 1 << 24;

// The model stand-in: zero logits, cost from the model.
class SimRunner final : public scheduler::StepRunner {
 public:
  SimRunner(const CostModel& cost, int vocab) : cost_(cost), vocab_(vocab) {}
  Status Forward(std::span<const ForwardSeq> batch, std::vector<float>* logits) override {
    seconds_ += cost_.StepSeconds(batch);
    const size_t n = batch.size() * static_cast<size_t>(vocab_);
    // The sampler only reads logits, so zeros written once stay zeros.
    if (logits->size() < n) logits->resize(n, 0.0f);
    return Status::Ok();
  }
  int vocab_size() const override { return vocab_; }
  int context_length() const override { return kSimContextLength; }
  double TakeSeconds() { return std::exchange(seconds_, 0.0); }
  // The cost model's prefill rate (the ttft router's figure for it).
  double prefill_tokens_per_s() const { return cost_.recompute_tokens_per_s(); }

 private:
  const CostModel cost_;
  const int vocab_;
  double seconds_ = 0;
};

// Which part of a request an engine runs: all of it (colocated), or, when
// disaggregated, the prefill (prompt and first token) or the decode
// continuation.
enum class Phase { kWhole, kPrefill, kDecode };

struct Event {
  size_t req;
  Phase phase;
  bool finished;
  bool ok;
  int32_t completion_tokens;
  int32_t cached_tokens;
  std::vector<int32_t> by_tier;
  std::string reason;
};

struct Instance {
  Phase role = Phase::kWhole;  // kWhole: both phases
  CostModel cost;
  std::vector<std::unique_ptr<kvcache::BlockStore>> stores;  // SimStores, chain order
  std::unique_ptr<kvcache::KvManager> kv;
  std::unique_ptr<SimRunner> runner;
  std::unique_ptr<scheduler::Engine> engine;
  int64_t free_at = 0;
  int64_t wake = kNever;
  int unfinished = 0;  // submitted to its engine, not finished
  int reserved = 0;    // decode: reservations whose continuation is not submitted yet
  // decode: blocks the reserved requests will need beyond their
  // reservations (their outputs), until their continuations start
  int64_t promised_blocks = 0;
  int zero_steps = 0;  // consecutive steps that did work without a forward pass
  std::vector<Event> events;

  int64_t NextStoreCompletion() const {
    int64_t t = kNever;
    for (const auto& s : stores) t = std::min(t, static_cast<const SimStore&>(*s).next_completion_nanos());
    return t;
  }
  // When every operation its stores have pending is done (kNever: none).
  int64_t StoresIdle() const {
    int64_t t = -1;
    for (const auto& s : stores) {
      const int64_t last = static_cast<const SimStore&>(*s).last_completion_nanos();
      if (last != kNever) t = std::max(t, last);
    }
    return t < 0 ? kNever : t;
  }
};

struct Pending {
  int64_t release_ns = 0;
  int32_t prompt_len = 0;
  int32_t output_len = 0;
  bool skipped = false;
  bool whole_prompt_cached = false;  // at release (only asked when ideally possible)
  bool got_first = false;
  std::vector<int32_t> id_ends;      // cumulative token end of each hash id
  // Disaggregated: the decode instance holding the prompt's reservation,
  // the blocks the prefill instance sends it, and the prompt, kept from
  // the prefill's submission to the continuation's.
  int decode = -1;
  int32_t handoff_blocks = 0;
  int32_t promised_blocks = 0;  // counted in the decode instance's promised_blocks
  bool reservation_held = false;
  bool continuing = false;  // the continuation was submitted to the decode instance
  std::vector<int32_t> prompt;
};

int64_t FloorTo(int64_t v, int64_t m) { return v / m * m; }

// Opens each listed tier as a SimStore with the cluster file's rates for its kind.
kvcache::StoreMaker SimStoreMaker(const InstanceConfig& ic, kvcache::Clock* clock) {
  return [&ic, clock](const kvcache::TierSpec& spec, uint64_t block_bytes)
             -> Result<std::unique_ptr<kvcache::BlockStore>> {
    const bool host = spec.kind == kvcache::TierKind::kHost;
    const bool remote = spec.kind == kvcache::TierKind::kRemote;
    SimStoreOptions so;
    so.name = spec.name;
    so.kind = spec.kind;
    so.capacity_bytes = spec.bytes;
    so.block_bytes = block_bytes;
    so.read_bytes_per_s = remote ? ic.remote_read_bytes_per_s : host ? ic.host_read_bytes_per_s : ic.disk_read_bytes_per_s;
    so.write_bytes_per_s = host ? ic.host_write_bytes_per_s : ic.disk_write_bytes_per_s;
    so.latency_s = remote ? ic.remote_latency_s : 0;
    if (!spec.eviction_policy.empty()) so.eviction_policy = spec.eviction_policy;
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<SimStore> store, SimStore::Create(so, clock));
    return std::unique_ptr<kvcache::BlockStore>(std::move(store));
  };
}

// What every simulated request asks of its engine: exactly `max_tokens`
// tokens (zero logits: greedy picks token 0, and ignore_eos runs them all).
scheduler::EngineRequest GreedyRequest(std::vector<int32_t> prompt, int max_tokens) {
  scheduler::EngineRequest er;
  er.prompt = std::move(prompt);
  er.max_tokens = max_tokens;
  er.sampling.temperature = 0;
  er.ignore_eos = true;
  return er;
}

// One simulation: the cluster, every request's bookkeeping and the event
// loop's state, from RunSimulation's start to its end. Single-threaded; one
// Run per object.
class SimRun {
 public:
  SimRun(SimPlan plan, const SimOptions& o)
      : plan_(std::move(plan)),
        head_(plan_.head),
        ideal_(plan_.ideal),
        o_(o),
        ic_(o.cluster.instance),
        bs_(ic_.block_size),
        n_(head_.size()),
        device_blocks_(plan_.device_blocks),
        block_bytes_(ic_.block_bytes()),
        router_(o.cluster.routing),
        decode_router_(o.cluster.routing) {}

  Result<SimResult> Run();

 private:
  // Aggregates over the finished requests, from SumRequests to the figures.
  struct RequestSums {
    std::vector<double> ttft, tpot, e2e;  // sorted
    double first_arrival = -1, last_finish = 0;
    std::vector<uint64_t> tier_tokens;
  };

  // The cluster.
  Status BuildCluster();
  Status BuildInstance(size_t ii);
  void ConnectPools();
  void InitRequests();
  // Hit accounting.
  uint32_t IdsCovered(const Pending& p, int64_t covered) const;
  uint32_t ServedIds(size_t i, int32_t cached) const;
  // Routing and submission.
  void AdvanceTo(int64_t t);
  size_t PickPrefill(std::vector<int32_t>& prompt, const Pending& p, const std::vector<size_t>& ids);
  void RequestOver(int64_t at);
  void Reject(size_t i);
  Result<bool> Submit(size_t k, size_t i, Phase phase, scheduler::EngineRequest er);
  Result<bool> SubmitPrompt(size_t i, size_t target, std::vector<int32_t> prompt, int max_tokens, Phase phase);
  Status Release(size_t i);
  // The prefill → decode handoff (disaggregated).
  void ReleaseReservation(size_t i);
  Result<bool> DispatchPd(size_t i);
  Status RetryDecodeWait();
  Status PrefillDone(size_t i, const Event& ev, int64_t at);
  Status StartDecode(size_t i);
  bool ExpireReservations(size_t j);
  // The event loop.
  Status EventLoop();
  Status StepInstance(size_t j);
  Status HandleEvents(Instance& in, int64_t at);
  Status CheckDrained() const;
  // The figures.
  RequestSums SumRequests();
  void SumHitRatios();
  void SumReferences(double total);
  void SumLatencies(const RequestSums& s);
  void SumTiers(const std::vector<uint64_t>& tier_tokens);
  void TearDown();

  SimPlan plan_;  // first: its tokenizer outlives the engines
  const std::vector<TraceRequest>& head_;
  const std::vector<uint32_t>& ideal_;
  const SimOptions& o_;
  const InstanceConfig& ic_;
  const int bs_;
  const size_t n_;
  const int64_t device_blocks_;
  const uint64_t block_bytes_;

  kvcache::ManualClock clock_{0};
  std::vector<Instance> inst_;  // sized once by BuildCluster: engines' sinks point into it
  size_t num_tiers_ = 0;

  // Per-request bookkeeping; prompts are built only at release.
  SimResult res_;
  std::vector<Pending> pend_;

  size_t next_ = 0;
  bool serial_busy_ = false;
  int64_t serial_free_at_ = 0;
  // Closed loop: when each of the `concurrency` users is free again. All
  // start at the first request's timestamp.
  std::multiset<int64_t> slots_;
  scheduler::Router router_;
  // Disaggregated: the decode choice keeps its own turn, as strata router's.
  scheduler::Router decode_router_;
  std::vector<scheduler::RouteCandidate> candidates_;
  // The instances a prompt may be prefilled at (all, or the prefill ones)
  // and those that decode (disaggregated only).
  std::vector<size_t> prefill_ids_, decode_ids_;
  // Disaggregated: prefills done, their KV on its way, by arrival time at
  // the decode instance; requests waiting for room at a decode instance.
  std::multimap<int64_t, size_t> transfers_;
  std::deque<size_t> decode_wait_;
  int64_t retry_at_ = kNever;  // when a decode instance freed room (decode_wait_ tries again then)
};

Result<SimResult> SimRun::Run() {
  STRATA_RETURN_IF_ERROR(BuildCluster());
  InitRequests();
  STRATA_RETURN_IF_ERROR(EventLoop());
  STRATA_RETURN_IF_ERROR(CheckDrained());
  const RequestSums sums = SumRequests();
  SumHitRatios();
  SumLatencies(sums);
  SumTiers(sums.tier_tokens);
  TearDown();
  return std::move(res_);
}

Status SimRun::BuildCluster() {
  inst_.resize(static_cast<size_t>(o_.cluster.instances));
  for (size_t ii = 0; ii < inst_.size(); ++ii) STRATA_RETURN_IF_ERROR(BuildInstance(ii));
  ConnectPools();
  num_tiers_ = 1 + inst_[0].kv->num_lower_tiers();
  for (size_t j = 0; j < inst_.size(); ++j)
    (inst_[j].role == Phase::kDecode ? decode_ids_ : prefill_ids_).push_back(j);
  return Status::Ok();
}

Status SimRun::BuildInstance(size_t ii) {
  Instance& in = inst_[ii];
  const CostModel cost = o_.cluster.InstanceCost(static_cast<int>(ii));
  in.cost = cost;
  if (o_.cluster.disaggregated())
    in.role = static_cast<int>(ii) < o_.cluster.prefill_instances ? Phase::kPrefill : Phase::kDecode;
  kvcache::KvManagerOptions ko;
  ko.block_size = bs_;
  ko.num_device_blocks = static_cast<int32_t>(device_blocks_);
  ko.block_bytes = block_bytes_;
  ko.ns = kvcache::NamespaceDigest("simulated-" + ic_.model, "llama", "f16", bs_);
  ko.load_policy = kvcache::LoadPolicy::kAuto;
  ko.eviction_policy = ic_.eviction_policy;
  ko.recompute_tokens_per_s = cost.recompute_tokens_per_s();
  STRATA_ASSIGN_OR_RETURN(kvcache::OpenedTiers tiers,
                          kvcache::OpenTiers(plan_.tier_specs, block_bytes_, SimStoreMaker(ic_, &clock_)));
  for (kvcache::LowerTier& t : tiers.lowers) {
    const kvcache::TierKind k = t.store->kind();
    t.read_bytes_per_s = k == kvcache::TierKind::kHost   ? ic_.host_read_bytes_per_s
                         : k == kvcache::TierKind::kDisk ? ic_.disk_read_bytes_per_s
                                                         : ic_.remote_read_bytes_per_s;
  }
  in.stores = std::move(tiers.stores);
  STRATA_ASSIGN_OR_RETURN(in.kv,
                          kvcache::KvManager::Create(ko, kvcache::BlockMemoryFn{}, std::move(tiers.lowers), &clock_));
  in.runner = std::make_unique<SimRunner>(cost, o_.vocab_size);
  scheduler::EngineOptions eo;
  eo.max_batch_tokens = ic_.max_batch_tokens;
  eo.max_running = ic_.max_num_seqs;
  eo.max_waiting = std::max(1, o_.max_waiting);
  STRATA_ASSIGN_OR_RETURN(in.engine,
                          scheduler::Engine::Create(eo, in.runner.get(), in.kv.get(), plan_.tokenizer.get(), &clock_));
  return Status::Ok();
}

// The cluster pool: each instance's remote tier reads the others' host and disk tiers.
void SimRun::ConnectPools() {
  for (size_t i = 0; i < inst_.size(); ++i) {
    SimStore* remote = nullptr;
    std::vector<SimStore*> peers;
    for (size_t j = 0; j < inst_.size(); ++j) {
      for (const auto& s : inst_[j].stores) {
        auto* st = static_cast<SimStore*>(s.get());
        if (st->kind() == kvcache::TierKind::kRemote) {
          if (j == i) remote = st;
        } else if (j != i) {
          peers.push_back(st);
        }
      }
    }
    if (remote != nullptr) remote->SetPeers(std::move(peers));
  }
}

void SimRun::InitRequests() {
  res_.records.resize(n_);
  pend_.resize(n_);
  for (size_t i = 0; i < n_; ++i) {
    const TraceRequest& r = head_[i];
    Pending& p = pend_[i];
    p.release_ns = static_cast<int64_t>(std::llround(static_cast<double>(r.timestamp_ms) * o_.time_scale * 1e6));
    int64_t end = 0;
    for (size_t k = 0; k < r.hash_ids.size(); ++k) {
      end += HashIdTokenCount(r, k, o_.tokens_per_hash_id);
      p.id_ends.push_back(static_cast<int32_t>(std::min<int64_t>(end, INT32_MAX)));
    }
    p.prompt_len = p.id_ends.back();
    p.output_len = o_.tokens_per_hash_id > 0
                       ? static_cast<int32_t>(std::max<int64_t>(
                             1, (static_cast<int64_t>(r.output_length) * o_.tokens_per_hash_id + kTraceTokensPerHashId - 1) /
                                    kTraceTokensPerHashId))
                       : r.output_length;
    const int64_t total = static_cast<int64_t>(p.prompt_len) + p.output_len;
    SimRequestRecord& rec = res_.records[i];
    rec.arrival_s = static_cast<double>(p.release_ns) * 1e-9;
    rec.prompt_tokens = p.prompt_len;
    rec.hash_ids = static_cast<uint32_t>(r.hash_ids.size());
    rec.ideal_ids = ideal_[i];
    if (o_.max_model_len > 0 && total > o_.max_model_len) {
      p.skipped = true;
      rec.finish_reason = "skipped";
      ++res_.skipped_over_context;
    } else if ((total + bs_ - 1) / bs_ + 1 > device_blocks_) {
      // It could never hold its own blocks: the engine would preempt it
      // forever. A real deployment sizes the pool for its longest request.
      p.skipped = true;
      rec.finish_reason = "skipped";
      ++res_.skipped_over_capacity;
    }
  }
  if (o_.concurrency > 0) {
    const int64_t start = n_ > 0 ? pend_[0].release_ns : 0;
    for (int k = 0; k < o_.concurrency; ++k) slots_.insert(start);
  }
}

// Leading hash ids whose tokens lie in the first `covered` tokens (whole
// cached blocks); the trailing id needs only its full blocks.
uint32_t SimRun::IdsCovered(const Pending& p, int64_t covered) const {
  uint32_t served = 0;
  for (size_t k = 0; k < p.id_ends.size(); ++k) {
    const int64_t start = k == 0 ? 0 : p.id_ends[k - 1];
    const bool last = k + 1 == p.id_ends.size();
    const int64_t need = last ? FloorTo(p.id_ends[k], bs_) : p.id_ends[k];
    if (need <= start || covered < need) break;
    ++served;
  }
  return served;
}

// Hash ids served, from the tokens the engine took from cache.
uint32_t SimRun::ServedIds(size_t i, int32_t cached) const {
  const Pending& p = pend_[i];
  int64_t covered = cached;
  const int64_t engine_cap = FloorTo(p.prompt_len - 1, bs_);
  if (p.whole_prompt_cached && covered >= engine_cap) covered = FloorTo(p.prompt_len, bs_);
  return IdsCovered(p, covered);
}

void SimRun::AdvanceTo(int64_t t) {
  const int64_t now = clock_.NowNanos();
  if (t > now) clock_.Advance(t - now);
}

// The router's view of instances `ids` for this prompt: the index in
// `ids` it picks for the prefill.
size_t SimRun::PickPrefill(std::vector<int32_t>& prompt, const Pending& p, const std::vector<size_t>& ids) {
  candidates_.assign(ids.size(), scheduler::RouteCandidate{});
  for (size_t k = 0; k < ids.size(); ++k) candidates_[k].unfinished = inst_[ids[k]].unfinished;
  if (router_.needs_cached_tokens() && ids.size() > 1) {
    // Match caps at prompt - 1 tokens; one token more lets the whole
    // prompt count, so a repeated prompt goes where all of it is.
    prompt.push_back(o_.first_id);
    for (size_t k = 0; k < ids.size(); ++k) {
      Instance& in = inst_[ids[k]];
      in.kv->Poll();
      scheduler::RouteCandidate& c = candidates_[k];
      const kvcache::PrefixMatch m = in.kv->Match(prompt, "");
      c.cached_tokens = std::min<int32_t>(m.total(), p.prompt_len);
      // ttft: what the instance would compute, what is queued there, its
      // rate and the time to fetch the cached part from its lower tiers.
      c.uncached_tokens = p.prompt_len - c.cached_tokens;
      c.queue_tokens = in.engine->Stats().pending_prefill_tokens;
      c.prefill_tokens_per_s = in.runner->prefill_tokens_per_s();
      c.load_seconds = in.kv->EstimateLoadSeconds(m);
      // The engine ran its current step at once in virtual time, so its
      // queue no longer holds that step's tokens: the step's remaining
      // time is work still owed (a negative "done").
      c.queue_done_seconds = -static_cast<double>(std::max<int64_t>(0, in.free_at - clock_.NowNanos())) * 1e-9;
    }
    prompt.pop_back();
  }
  return router_.Pick(candidates_);
}

// The request is over (finished, failed or refused): the serial and
// closed-loop releases move on.
void SimRun::RequestOver(int64_t at) {
  if (o_.serial) {
    serial_busy_ = false;
    serial_free_at_ = at;
  }
  if (o_.concurrency > 0) slots_.insert(at);
}

void SimRun::Reject(size_t i) {
  res_.records[i].finish_reason = "rejected";
  ++res_.rejected;
  if (o_.concurrency > 0) slots_.insert(clock_.NowNanos());  // the user moves on at once
  else if (o_.serial) RequestOver(clock_.NowNanos());
}

// Submits `er` to instance `k` for request i's `phase`. False: refused
// (queue full); errors other than that are the simulation's.
Result<bool> SimRun::Submit(size_t k, size_t i, Phase phase, scheduler::EngineRequest er) {
  Instance& in = inst_[k];
  auto sink = [&in, i, phase](scheduler::RequestOutput&& out) {
    if (!out.finished && out.completion_tokens != static_cast<int32_t>(out.token_ids.size())) return;
    in.events.push_back(Event{i, phase, out.finished, out.status.ok(), out.completion_tokens, out.cached_tokens,
                              std::move(out.cached_tokens_by_tier), std::string(FinishReasonName(out.finish_reason))});
  };
  auto id = in.engine->Submit(std::move(er), std::move(sink));
  if (!id.ok()) {
    if (id.error().code() == StatusCode::kResourceExhausted) return false;
    return id.error().WithContext("simulate: request " + std::to_string(i));
  }
  ++in.unfinished;
  in.wake = std::min(in.wake, std::max(clock_.NowNanos(), in.free_at));
  return true;
}

// Submits request i's prompt (max_tokens tokens) to instance `target`.
Result<bool> SimRun::SubmitPrompt(size_t i, size_t target, std::vector<int32_t> prompt, int max_tokens,
                                  Phase phase) {
  const TraceRequest& r = head_[i];
  Pending& p = pend_[i];
  Instance& in = inst_[target];
  res_.records[i].instance = static_cast<int>(target);
  if (ideal_[i] == r.hash_ids.size()) {
    // The engine never serves the last prompt block from cache; ask whether
    // it is there with one token more (Match is a pure query).
    prompt.push_back(o_.first_id);
    in.kv->Poll();  // writes that finished by now are visible, as at the next step
    p.whole_prompt_cached = in.kv->Match(prompt, "").total() >= FloorTo(p.prompt_len, bs_);
    prompt.pop_back();
  }
  return Submit(target, i, phase, GreedyRequest(std::move(prompt), max_tokens));
}

Status SimRun::Release(size_t i) {
  Pending& p = pend_[i];
  res_.records[i].arrival_s = static_cast<double>(clock_.NowNanos()) * 1e-9;
  if (o_.cluster.disaggregated()) {
    if (o_.serial) serial_busy_ = true;  // until it is over, even while it waits for a decode instance
    // Behind others already waiting, it waits too (first come, first served).
    bool got = false;
    if (decode_wait_.empty()) {
      STRATA_ASSIGN_OR_RETURN(got, DispatchPd(i));
    }
    if (!got) {
      ++res_.decode_waits;
      decode_wait_.push_back(i);
    }
    return Status::Ok();
  }
  ScaledRequest sr = ScaleRequest(head_[i], o_.tokens_per_hash_id, o_.vocab_size, o_.first_id);
  const size_t target = prefill_ids_[PickPrefill(sr.prompt, p, prefill_ids_)];
  STRATA_ASSIGN_OR_RETURN(bool ok, SubmitPrompt(i, target, std::move(sr.prompt), sr.output_length, Phase::kWhole));
  if (!ok) {
    Reject(i);
    return Status::Ok();
  }
  if (o_.serial) serial_busy_ = true;
  return Status::Ok();
}

// Request i's reservation at its decode instance is released.
void SimRun::ReleaseReservation(size_t i) {
  Pending& p = pend_[i];
  Instance& d = inst_[static_cast<size_t>(p.decode)];
  if (!p.reservation_held) return;
  d.kv->ReleaseReservation(i + 1);
  p.reservation_held = false;
  d.promised_blocks -= std::exchange(p.promised_blocks, 0);
}

// Disaggregated: reserves the prompt's blocks at a decode instance (the
// router's PickDecode first, then the others in turn) and submits the
// prefill; with no room at any decode instance, the request waits for a
// decode to finish, as the live router's handoff does.
// Returns whether the request got a reservation (else it waits).
Result<bool> SimRun::DispatchPd(size_t i) {
  Pending& p = pend_[i];
  if (p.prompt.empty()) p.prompt = ScaleRequest(head_[i], o_.tokens_per_hash_id, o_.vocab_size, o_.first_id).prompt;
  std::vector<int32_t>& prompt = p.prompt;  // kept while it waits
  std::vector<scheduler::RouteCandidate> dc(decode_ids_.size());
  for (size_t k = 0; k < decode_ids_.size(); ++k) {
    Instance& d = inst_[decode_ids_[k]];
    d.kv->Poll();
    dc[k].unfinished = d.unfinished + d.reserved;
    dc[k].cached_tokens = d.kv->Match(prompt, "").device_tokens;
    dc[k].free_kv_tokens = static_cast<int64_t>(d.kv->device_pool().num_allocatable()) * bs_;
    dc[k].tpot_seconds = d.cost.DecodeStepSeconds(d.unfinished + 1, p.prompt_len);
  }
  const int64_t need_tokens = static_cast<int64_t>(p.prompt_len) + p.output_len;
  const size_t first = decode_router_.PickDecode(dc, need_tokens);
  // An instance has room when its pool can hold this request's prompt and
  // output besides what the requests reserved before it will need: a
  // reservation whose continuation could never get its output blocks
  // would hold its blocks forever.
  const int64_t need_blocks = (need_tokens + bs_ - 1) / bs_;
  kvcache::KvManager::Reservation rv;
  int chosen = -1;
  for (size_t t = 0; t < decode_ids_.size() && chosen < 0; ++t) {
    const size_t k = decode_ids_[(first + t) % decode_ids_.size()];
    if (inst_[k].kv->device_pool().num_allocatable() - inst_[k].promised_blocks < need_blocks) continue;
    auto got = inst_[k].kv->Reserve(i + 1, prompt, "", kNever, &rv);
    if (!got.ok()) return got.error().WithContext("simulate: request " + std::to_string(i) + ": reserve");
    if (*got == kvcache::AllocOutcome::kAllocated) chosen = static_cast<int>(k);
  }
  if (chosen < 0) {
    return false;
  }
  Instance& d = inst_[static_cast<size_t>(chosen)];
  p.decode = chosen;
  p.reservation_held = true;
  p.handoff_blocks = static_cast<int32_t>(rv.blocks.size()) - rv.held_blocks;
  res_.records[i].decode_instance = chosen;
  ++d.reserved;
  p.promised_blocks = static_cast<int32_t>(std::max<int64_t>(0, need_blocks - static_cast<int64_t>(rv.blocks.size())));
  d.promised_blocks += p.promised_blocks;
  const size_t target = prefill_ids_[PickPrefill(prompt, p, prefill_ids_)];
  STRATA_ASSIGN_OR_RETURN(bool ok, SubmitPrompt(i, target, prompt, 1, Phase::kPrefill));
  if (!ok) {
    ReleaseReservation(i);
    --d.reserved;
    p.prompt.clear();
    Reject(i);
  }
  return true;
}

// Room may have come free at a decode instance: the waiting requests try
// again in arrival order, up to the first that still finds none (first
// come, first served: a large request is not passed over for ever).
Status SimRun::RetryDecodeWait() {
  while (!decode_wait_.empty()) {
    STRATA_ASSIGN_OR_RETURN(bool got, DispatchPd(decode_wait_.front()));
    if (!got) {
      // Blocks also come free when a decode instance's tier writes
      // complete (a write holds its block until then): look again when
      // they have, if no decode finishes first.
      for (size_t k : decode_ids_) retry_at_ = std::min(retry_at_, inst_[k].StoresIdle());
      break;
    }
    decode_wait_.pop_front();
  }
  return Status::Ok();
}

// Request i's prefill is done at `at`: its KV goes to the decode
// instance, or, with nothing left to decode, it is over.
Status SimRun::PrefillDone(size_t i, const Event& ev, int64_t at) {
  Pending& p = pend_[i];
  Instance& d = inst_[static_cast<size_t>(p.decode)];
  if (ev.ok && ev.completion_tokens >= 1 && p.output_len > 1) {
    const double bytes = static_cast<double>(p.handoff_blocks) * static_cast<double>(block_bytes_);
    const double sec = o_.cluster.transfer_latency_s +
                       (o_.cluster.transfer_bytes_per_s > 0 ? bytes / o_.cluster.transfer_bytes_per_s : 0.0);
    res_.handoff_blocks += static_cast<uint64_t>(p.handoff_blocks);
    transfers_.emplace(at + static_cast<int64_t>(std::llround(sec * 1e9)), i);
    return Status::Ok();
  }
  ReleaseReservation(i);
  --d.reserved;
  p.prompt.clear();
  SimRequestRecord& rec = res_.records[i];
  rec.finish_s = static_cast<double>(at) * 1e-9;
  rec.output_tokens = ev.completion_tokens;
  rec.finish_reason = ev.ok ? ev.reason : "error";
  RequestOver(at);
  retry_at_ = std::min(retry_at_, at);
  return Status::Ok();
}

// The KV of request i reached its decode instance: the continuation
// (the prompt and the first token) runs there on the reserved blocks.
Status SimRun::StartDecode(size_t i) {
  Pending& p = pend_[i];
  Instance& d = inst_[static_cast<size_t>(p.decode)];
  STRATA_RETURN_IF_ERROR(d.kv->CompleteReservation(i + 1, p.handoff_blocks));
  --d.reserved;
  p.continuing = true;
  std::vector<int32_t> prompt = std::move(p.prompt);
  p.prompt = {};
  prompt.push_back(0);  // the first token (zero logits: greedy picks 0)
  STRATA_ASSIGN_OR_RETURN(bool ok, Submit(static_cast<size_t>(p.decode), i, Phase::kDecode,
                                          GreedyRequest(std::move(prompt), p.output_len - 1)));
  if (!ok) {
    ReleaseReservation(i);
    Reject(i);
    retry_at_ = std::min(retry_at_, clock_.NowNanos());
  }
  return Status::Ok();
}

// A decode instance whose queued continuations all wait for blocks that
// the reservations of other queued continuations hold would wait for
// ever (a preempted continuation that must recompute its prompt needs
// more than the free blocks): live, those reservations expire and their
// blocks stay only as cache. Returns whether any was released.
bool SimRun::ExpireReservations(size_t j) {
  size_t released = 0;
  for (size_t i = 0; i < n_; ++i) {
    Pending& p = pend_[i];
    if (p.decode != static_cast<int>(j) || !p.reservation_held || !p.continuing) continue;
    ReleaseReservation(i);
    ++released;
  }
  res_.reservations_expired += released;
  return released > 0;
}

Status SimRun::EventLoop() {
  while (true) {
    while (next_ < n_ && pend_[next_].skipped) ++next_;
    int64_t t_arr = kNever;
    if (o_.concurrency > 0) {
      if (next_ < n_ && !slots_.empty()) t_arr = std::max(*slots_.begin(), clock_.NowNanos());
    } else if (next_ < n_ && !(o_.serial && serial_busy_)) {
      t_arr = o_.serial ? std::max(pend_[next_].release_ns, serial_free_at_) : pend_[next_].release_ns;
      t_arr = std::max(t_arr, clock_.NowNanos());
    }
    size_t j = 0;
    for (size_t k = 1; k < inst_.size(); ++k)
      if (inst_[k].wake < inst_[j].wake) j = k;
    const int64_t t_inst = inst_[j].wake;
    const int64_t t_xfer = transfers_.empty() ? kNever : transfers_.begin()->first;
    const int64_t t_retry = decode_wait_.empty() ? kNever : std::max(retry_at_, clock_.NowNanos());
    if (t_arr == kNever && t_inst == kNever && t_xfer == kNever && t_retry == kNever) break;
    // At equal times: KV arrivals, then room freed, then new requests, then steps.
    if (t_xfer <= std::min({t_retry, t_arr, t_inst})) {
      AdvanceTo(t_xfer);
      const size_t i = transfers_.begin()->second;
      transfers_.erase(transfers_.begin());
      STRATA_RETURN_IF_ERROR(StartDecode(i));
      continue;
    }
    if (t_retry <= std::min(t_arr, t_inst)) {
      AdvanceTo(t_retry);
      retry_at_ = kNever;
      STRATA_RETURN_IF_ERROR(RetryDecodeWait());
      continue;
    }
    if (t_arr <= t_inst) {
      AdvanceTo(t_arr);
      if (o_.concurrency > 0) slots_.erase(slots_.begin());
      STRATA_RETURN_IF_ERROR(Release(next_));
      ++next_;
      continue;
    }
    AdvanceTo(t_inst);
    STRATA_RETURN_IF_ERROR(StepInstance(j));
  }
  return Status::Ok();
}

// Instance j takes a step at the clock's time: it is busy until the step's
// cost has passed, and wakes again when it has work it can do.
Status SimRun::StepInstance(size_t j) {
  Instance& in = inst_[j];
  const int64_t now = clock_.NowNanos();
  auto did = in.engine->Step();
  const double sec = in.runner->TakeSeconds();
  res_.busy_s += sec;
  const int64_t end = now + static_cast<int64_t>(std::llround(sec * 1e9));
  STRATA_RETURN_IF_ERROR(HandleEvents(in, end));
  in.free_at = end;
  if (in.unfinished == 0) {
    in.wake = kNever;
    in.zero_steps = 0;
  } else if (sec > 0) {
    in.wake = end;
    in.zero_steps = 0;
  } else if (did.ok() && *did && ++in.zero_steps < 64) {
    in.wake = end;  // admitted or finished something: look again now
  } else {
    in.zero_steps = 0;
    // Waiting on tier loads only.
    const int64_t c = in.NextStoreCompletion();
    if (c == kNever && in.role == Phase::kDecode && ExpireReservations(j)) {
      in.wake = now + 1;
      return Status::Ok();
    }
    if (c == kNever && in.reserved > 0) {
      in.wake = kNever;  // a handoff on its way wakes it (StartDecode)
      return Status::Ok();
    }
    if (c == kNever) {
      return Status::Internal("simulate: instance " + std::to_string(j) + " stalled with " +
                              std::to_string(in.unfinished) + " unfinished requests at t=" +
                              std::to_string(static_cast<double>(now) * 1e-9) + " s");
    }
    in.wake = std::max(c, now + 1);
  }
  return Status::Ok();
}

Status SimRun::HandleEvents(Instance& in, int64_t at) {
  const double t = static_cast<double>(at) * 1e-9;
  std::vector<Event> events;
  events.swap(in.events);
  for (Event& ev : events) {
    SimRequestRecord& rec = res_.records[ev.req];
    Pending& p = pend_[ev.req];
    if (ev.phase == Phase::kDecode) {
      // Its first event comes after its admission: the continuation holds
      // its own references now, the reservation's can go.
      ReleaseReservation(ev.req);
      if (ev.finished) {
        rec.finish_s = t;
        rec.output_tokens = 1 + ev.completion_tokens;
        rec.finish_reason = ev.ok ? ev.reason : "error";
        --in.unfinished;
        RequestOver(at);
        retry_at_ = std::min(retry_at_, at);
      }
      continue;
    }
    if (!p.got_first && ev.completion_tokens > 0) {
      p.got_first = true;
      rec.first_token_s = t;
      rec.cached_tokens = ev.cached_tokens;
      rec.cached_tokens_by_tier = ev.by_tier;
      rec.served_ids = ServedIds(ev.req, ev.cached_tokens);
    }
    if (!ev.finished) continue;
    --in.unfinished;
    if (!p.got_first) {  // finished without a token (error, abort)
      rec.cached_tokens = ev.cached_tokens;
      rec.cached_tokens_by_tier = ev.by_tier;
    }
    if (ev.phase == Phase::kPrefill) {
      STRATA_RETURN_IF_ERROR(PrefillDone(ev.req, ev, at));
      continue;
    }
    rec.finish_s = t;
    rec.output_tokens = ev.completion_tokens;
    rec.finish_reason = ev.ok ? ev.reason : "error";
    RequestOver(at);
  }
  return Status::Ok();
}

Status SimRun::CheckDrained() const {
  for (size_t k = 0; k < inst_.size(); ++k) {
    if (inst_[k].kv->num_reservations() != 0 || inst_[k].promised_blocks != 0)
      return Status::Internal("simulate: instance " + std::to_string(k) + " ends with " +
                              std::to_string(inst_[k].kv->num_reservations()) + " reservations held");
  }
  if (!decode_wait_.empty()) {
    std::string state;
    for (size_t k : decode_ids_) {
      state += "; instance " + std::to_string(k) + ": " +
               std::to_string(inst_[k].kv->device_pool().num_allocatable()) + " blocks free, " +
               std::to_string(inst_[k].promised_blocks) + " promised, " + std::to_string(inst_[k].reserved) +
               " reserved, " + std::to_string(inst_[k].unfinished) + " unfinished";
    }
    const Pending& h = pend_[decode_wait_.front()];
    return Status::Internal("simulate: " + std::to_string(decode_wait_.size()) +
                            " requests still wait for room at a decode instance at the end (the first needs " +
                            std::to_string((int64_t{h.prompt_len} + h.output_len + bs_ - 1) / bs_) + " blocks" +
                            state + ")");
  }
  return Status::Ok();
}

// Counts, latencies and tier hits over the requests that ran.
SimRun::RequestSums SimRun::SumRequests() {
  RequestSums s;
  s.tier_tokens.assign(num_tiers_, 0);
  for (size_t i = 0; i < n_; ++i) {
    const SimRequestRecord& rec = res_.records[i];
    if (rec.finish_reason == "skipped") continue;
    res_.total_ids += rec.hash_ids;
    res_.prompt_tokens += static_cast<uint64_t>(rec.prompt_tokens);
    res_.served_ids += rec.served_ids;
    res_.cached_tokens += static_cast<uint64_t>(rec.cached_tokens);
    for (size_t k = 0; k < rec.cached_tokens_by_tier.size() && k < num_tiers_; ++k)
      s.tier_tokens[k] += static_cast<uint64_t>(rec.cached_tokens_by_tier[k]);
    if (s.first_arrival < 0 || rec.arrival_s < s.first_arrival) s.first_arrival = rec.arrival_s;
    if (rec.finish_reason == "rejected") continue;
    if (rec.finish_reason != "length" && rec.finish_reason != "stop") {
      ++res_.errors;
      continue;
    }
    ++res_.requests;
    res_.completion_tokens += static_cast<uint64_t>(rec.output_tokens);
    s.last_finish = std::max(s.last_finish, rec.finish_s);
    const double t1 = rec.first_token_s - rec.arrival_s;
    s.ttft.push_back(t1);
    s.e2e.push_back(rec.finish_s - rec.arrival_s);
    double tp = 0;
    if (rec.output_tokens >= 2) {
      tp = (rec.finish_s - rec.first_token_s) / (rec.output_tokens - 1);
      s.tpot.push_back(tp);
    }
    const bool good = (o_.slo_ttft_s <= 0 || t1 <= o_.slo_ttft_s) &&
                      (o_.slo_tpot_s <= 0 || rec.output_tokens < 2 || tp <= o_.slo_tpot_s);
    if (good) ++res_.goodput_requests;
  }
  std::sort(s.ttft.begin(), s.ttft.end());
  std::sort(s.tpot.begin(), s.tpot.end());
  std::sort(s.e2e.begin(), s.e2e.end());
  return s;
}

// The hit ratios: achieved, ideal, achievable and the offline references.
void SimRun::SumHitRatios() {
  IdealHit ih;
  uint64_t achievable = 0;
  for (size_t i = 0; i < n_; ++i) {
    if (pend_[i].skipped) continue;
    ih.hit_ids += ideal_[i];
    ih.total_ids += head_[i].hash_ids.size();
    achievable += std::min(ideal_[i], IdsCovered(pend_[i], FloorTo(pend_[i].prompt_len, bs_)));
  }
  const double total = static_cast<double>(res_.total_ids);
  res_.ideal_hit_ratio_blocks = ih.ratio();
  res_.achievable_hit_ratio_blocks = res_.total_ids ? static_cast<double>(achievable) / total : 0;
  res_.hit_ratio_blocks = res_.total_ids ? static_cast<double>(res_.served_ids) / total : 0;
  res_.lost_to_overlap = o_.serial ? 0.0 : res_.achievable_hit_ratio_blocks - res_.hit_ratio_blocks;
  SumReferences(total);
  res_.hit_ratio_tokens =
      res_.prompt_tokens ? static_cast<double>(res_.cached_tokens) / static_cast<double>(res_.prompt_tokens) : 0;
}

// The offline references over the same requests, one flat cache of the
// cluster's total size (every tier's blocks summed, as if exclusive). Each
// request's ids stop where the engine could serve no more of them (a
// trailing id without a full block of its own), as IdsCovered says.
// `total`: every id of the requests run, the denominator of hit_ratio_blocks.
void SimRun::SumReferences(double total) {
  std::vector<TraceRequest> run;
  for (size_t i = 0; i < n_; ++i) {
    if (pend_[i].skipped) continue;
    TraceRequest r = head_[i];
    const uint32_t coverable = IdsCovered(pend_[i], FloorTo(pend_[i].prompt_len, bs_));
    r.hash_ids.resize(std::min<size_t>(r.hash_ids.size(), coverable));
    run.push_back(std::move(r));
  }
  const uint64_t per_instance =
      static_cast<uint64_t>(device_blocks_) +
      (o_.unlimited_cache || block_bytes_ == 0 ? 0 : (ic_.host_bytes + ic_.disk_bytes) / block_bytes_);
  const uint64_t tokens_per_id =
      static_cast<uint64_t>(o_.tokens_per_hash_id > 0 ? o_.tokens_per_hash_id : kTraceTokensPerHashId);
  res_.reference_capacity_ids =
      per_instance * static_cast<uint64_t>(o_.cluster.instances) * static_cast<uint64_t>(bs_) / tokens_per_id;
  const auto chains = ChainUnits(run);
  ReferenceHits lru = LruReference(chains, res_.reference_capacity_ids);
  ReferenceHits min = BeladyReference(chains, res_.reference_capacity_ids);
  res_.lru_hit_ratio_blocks = res_.total_ids ? static_cast<double>(lru.hit_ids) / total : 0;
  res_.belady_hit_ratio_blocks = res_.total_ids ? static_cast<double>(min.hit_ids) / total : 0;
}

void SimRun::SumLatencies(const RequestSums& s) {
  if (!s.ttft.empty()) {
    double sum = 0;
    for (double v : s.ttft) sum += v;
    res_.ttft_mean_s = sum / static_cast<double>(s.ttft.size());
  }
  res_.ttft_p50_s = Percentile(s.ttft, 50);
  res_.ttft_p90_s = Percentile(s.ttft, 90);
  res_.ttft_p99_s = Percentile(s.ttft, 99);
  res_.tpot_p50_s = Percentile(s.tpot, 50);
  res_.tpot_p99_s = Percentile(s.tpot, 99);
  res_.e2e_p50_s = Percentile(s.e2e, 50);
  res_.e2e_p99_s = Percentile(s.e2e, 99);
  res_.duration_s = s.first_arrival >= 0 ? std::max(0.0, s.last_finish - s.first_arrival) : 0;
  if (res_.duration_s > 0) {
    res_.throughput_requests_per_s = static_cast<double>(res_.requests) / res_.duration_s;
    res_.throughput_tokens_per_s = static_cast<double>(res_.completion_tokens) / res_.duration_s;
    res_.total_tokens_per_s = static_cast<double>(res_.completion_tokens + res_.prompt_tokens) / res_.duration_s;
    res_.goodput_rps = static_cast<double>(res_.goodput_requests) / res_.duration_s;
  }
}

// Each tier's figures, summed over the instances, and the engines' counts.
void SimRun::SumTiers(const std::vector<uint64_t>& tier_tokens) {
  res_.tiers.resize(num_tiers_);
  for (size_t k = 0; k < num_tiers_; ++k) {
    res_.tiers[k].name = std::string(inst_[0].kv->tier_name(static_cast<int>(k)));
    res_.tiers[k].hit_tokens = tier_tokens[k];
  }
  for (Instance& in : inst_) {
    const scheduler::EngineStats es = in.engine->Stats();
    res_.steps += es.steps;
    res_.preemptions += es.preemptions;
    const kvcache::KvManagerStats ks = in.kv->stats();
    res_.tiers[0].hit_blocks += ks.device.blocks;
    res_.tiers[0].capacity_bytes += static_cast<uint64_t>(ks.device_pool.num_blocks) * block_bytes_;
    res_.tiers[0].used_bytes += static_cast<uint64_t>(ks.device_pool.in_use + ks.device_pool.cached) * block_bytes_;
    res_.tiers[0].evictions += ks.device_pool.evictions;
    for (size_t k = 1; k < num_tiers_ && k - 1 < ks.tiers.size(); ++k) {
      res_.tiers[k].hit_blocks += ks.tiers[k - 1].hits.blocks;
      res_.tiers[k].bytes_written += ks.tiers[k - 1].bytes_down;
      const kvcache::StoreStats ss = in.kv->lower_store(k - 1).stats();
      res_.tiers[k].capacity_bytes += ss.capacity_bytes;
      res_.tiers[k].used_bytes += ss.used_bytes;
      res_.tiers[k].evictions += ss.evictions;
    }
  }
}

void SimRun::TearDown() {
  // Engines before the managers they use, managers before their stores.
  for (Instance& in : inst_) {
    in.engine.reset();
    in.kv.reset();
  }
  res_.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - plan_.wall_start).count();
  // Remote tiers point into other instances' stores, destroyed in order.
  for (Instance& in : inst_)
    for (const auto& st : in.stores)
      if (st->kind() == kvcache::TierKind::kRemote) static_cast<SimStore*>(st.get())->SetPeers({});
}

}  // namespace

Result<SimResult> RunSimulation(SimPlan plan, const SimOptions& o) {
  SimRun run(std::move(plan), o);
  return run.Run();
}

}  // namespace strata::bench::internal
