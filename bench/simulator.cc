#include "bench/simulator.h"

#include "bench/cache_reference.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "bench/report.h"  // Percentile: the same definition as live runs
#include "bench/sim_store.h"
#include "kvcache/block_hash.h"
#include "kvcache/clock.h"
#include "kvcache/kv_manager.h"
#include "kvcache/tier_registry.h"
#include "model/gguf_tokenizer.h"
#include "model/tokenizer/tokenizer.h"
#include "scheduler/engine.h"

namespace strata::bench {
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

// Device blocks that can never run out for this trace: every block a request
// could ever need, bounded by "new chains + what runs at once".
int64_t UnlimitedBlocks(const std::vector<TraceRequest>& trace, size_t n, const SimOptions& o, int bs,
                        const std::vector<uint32_t>& ideal) {
  int64_t all = 0, unique = 0, largest = 0;
  for (size_t i = 0; i < n; ++i) {
    const TraceRequest& r = trace[i];
    int64_t prompt = 0, fresh = 0;
    for (size_t k = 0; k < r.hash_ids.size(); ++k) {
      const int64_t t = HashIdTokenCount(r, k, o.tokens_per_hash_id);
      prompt += t;
      if (k >= ideal[i]) fresh += t;
    }
    int64_t out = r.output_length;
    if (o.tokens_per_hash_id > 0) {
      out = std::max<int64_t>(1, (out * o.tokens_per_hash_id + kTraceTokensPerHashId - 1) / kTraceTokensPerHashId);
    }
    const int64_t req_blocks = (prompt + out) / bs + 2;
    all += req_blocks;
    unique += (fresh + out) / bs + 3;
    largest = std::max(largest, req_blocks);
  }
  const int64_t running = static_cast<int64_t>(o.cluster.instance.max_num_seqs) * largest;
  return std::min<int64_t>({all + 16, unique + running + 16, INT32_MAX - 1});
}

// The simulated instance's lower tiers as the tier registry's list (a host
// tier, then a disk tier, as the cluster file sizes them). The disk tier has
// no directory: SimStores hold no bytes.
std::vector<kvcache::TierSpec> SimTierSpecs(const InstanceConfig& ic) {
  std::vector<kvcache::TierSpec> specs;
  if (ic.host_bytes > 0) {
    kvcache::TierSpec h;
    h.kind = kvcache::TierKind::kHost;
    h.name = "host";
    h.bytes = ic.host_bytes;
    h.write_policy = HostWritePolicy(ic);
    h.eviction_policy = ic.host_eviction_policy.empty() ? ic.eviction_policy : ic.host_eviction_policy;
    h.source = "instance.host_bytes";
    specs.push_back(std::move(h));
  }
  if (ic.disk_bytes > 0) {
    kvcache::TierSpec d;
    d.kind = kvcache::TierKind::kDisk;
    d.name = "disk";
    d.bytes = ic.disk_bytes;
    d.path = "(simulated)";
    d.admit_after = ic.disk_admit_after;
    d.write_policy = ic.disk_write_policy;
    d.source = "instance.disk_bytes";
    specs.push_back(std::move(d));
  }
  if (ic.remote) {
    kvcache::TierSpec r;
    r.kind = kvcache::TierKind::kRemote;
    r.name = "remote";
    r.write_policy = kvcache::WritePolicy::kNone;
    r.source = "instance.remote";
    specs.push_back(std::move(r));
  }
  return specs;
}

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

}  // namespace

Result<SimResult> Simulate(const std::vector<TraceRequest>& trace, const SimOptions& o) {
  const auto wall_start = std::chrono::steady_clock::now();
  const InstanceConfig& ic = o.cluster.instance;
  const int bs = ic.block_size;
  if (bs < 1) return Status::InvalidArgument("block_size must be >= 1");
  if (o.vocab_size <= o.first_id + 1 || o.first_id < 0) return Status::InvalidArgument("bad vocab_size / first_id");
  if (o.tokens_per_hash_id < 0) return Status::InvalidArgument("tokens_per_hash_id must be >= 0");
  if (!(o.time_scale >= 0)) return Status::InvalidArgument("time_scale must be >= 0");
  if (o.concurrency < 0) return Status::InvalidArgument("concurrency must be >= 0");
  if (o.concurrency > 0 && o.serial) return Status::InvalidArgument("give serial or concurrency, not both");
  const size_t n = o.max_requests > 0 ? std::min(trace.size(), static_cast<size_t>(o.max_requests)) : trace.size();
  const std::vector<TraceRequest> head(trace.begin(), trace.begin() + static_cast<std::ptrdiff_t>(n));
  const std::vector<uint32_t> ideal = IdealHitIdsPerRequest(head);

  TokenizerSpec spec = SyntheticVocab(o.vocab_size);
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::Create(std::move(spec)));

  kvcache::ManualClock clock(0);
  const uint64_t block_bytes = ic.block_bytes();
  int64_t device_blocks = block_bytes == 0 ? 0 : static_cast<int64_t>(ic.device_bytes / block_bytes);
  if (o.unlimited_cache) device_blocks = UnlimitedBlocks(head, n, o, bs, ideal);
  device_blocks = std::min<int64_t>(device_blocks, INT32_MAX - 1);
  if (device_blocks < 1) return Status::InvalidArgument("the device pool holds no block");

  std::vector<Instance> inst(static_cast<size_t>(o.cluster.instances));
  for (size_t ii = 0; ii < inst.size(); ++ii) {
    Instance& in = inst[ii];
    const CostModel cost = o.cluster.InstanceCost(static_cast<int>(ii));
    in.cost = cost;
    if (o.cluster.disaggregated())
      in.role = static_cast<int>(ii) < o.cluster.prefill_instances ? Phase::kPrefill : Phase::kDecode;
    kvcache::KvManagerOptions ko;
    ko.block_size = bs;
    ko.num_device_blocks = static_cast<int32_t>(device_blocks);
    ko.block_bytes = block_bytes;
    ko.ns = kvcache::NamespaceDigest("simulated-" + ic.model, "llama", "f16", bs);
    ko.load_policy = kvcache::LoadPolicy::kAuto;
    ko.eviction_policy = ic.eviction_policy;
    ko.recompute_tokens_per_s = cost.recompute_tokens_per_s();
    const std::vector<kvcache::TierSpec> specs = o.unlimited_cache ? std::vector<kvcache::TierSpec>{} : SimTierSpecs(ic);
    STRATA_ASSIGN_OR_RETURN(kvcache::OpenedTiers tiers,
                            kvcache::OpenTiers(specs, block_bytes, SimStoreMaker(ic, &clock)));
    for (kvcache::LowerTier& t : tiers.lowers) {
      const kvcache::TierKind k = t.store->kind();
      t.read_bytes_per_s = k == kvcache::TierKind::kHost   ? ic.host_read_bytes_per_s
                           : k == kvcache::TierKind::kDisk ? ic.disk_read_bytes_per_s
                                                           : ic.remote_read_bytes_per_s;
    }
    in.stores = std::move(tiers.stores);
    STRATA_ASSIGN_OR_RETURN(in.kv,
                            kvcache::KvManager::Create(ko, kvcache::BlockMemoryFn{}, std::move(tiers.lowers), &clock));
    in.runner = std::make_unique<SimRunner>(cost, o.vocab_size);
    scheduler::EngineOptions eo;
    eo.max_batch_tokens = ic.max_batch_tokens;
    eo.max_running = ic.max_num_seqs;
    eo.max_waiting = std::max(1, o.max_waiting);
    STRATA_ASSIGN_OR_RETURN(in.engine,
                            scheduler::Engine::Create(eo, in.runner.get(), in.kv.get(), tokenizer.get(), &clock));
  }
  // The cluster pool: each instance's remote tier reads the others' host and disk tiers.
  for (size_t i = 0; i < inst.size(); ++i) {
    SimStore* remote = nullptr;
    std::vector<SimStore*> peers;
    for (size_t j = 0; j < inst.size(); ++j) {
      for (const auto& s : inst[j].stores) {
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
  const size_t num_tiers = 1 + inst[0].kv->num_lower_tiers();

  // Per-request bookkeeping; prompts are built only at release.
  SimResult res;
  res.records.resize(n);
  std::vector<Pending> pend(n);
  for (size_t i = 0; i < n; ++i) {
    const TraceRequest& r = head[i];
    Pending& p = pend[i];
    p.release_ns = static_cast<int64_t>(std::llround(static_cast<double>(r.timestamp_ms) * o.time_scale * 1e6));
    int64_t end = 0;
    for (size_t k = 0; k < r.hash_ids.size(); ++k) {
      end += HashIdTokenCount(r, k, o.tokens_per_hash_id);
      p.id_ends.push_back(static_cast<int32_t>(std::min<int64_t>(end, INT32_MAX)));
    }
    p.prompt_len = p.id_ends.back();
    p.output_len = o.tokens_per_hash_id > 0
                       ? static_cast<int32_t>(std::max<int64_t>(
                             1, (static_cast<int64_t>(r.output_length) * o.tokens_per_hash_id + kTraceTokensPerHashId - 1) /
                                    kTraceTokensPerHashId))
                       : r.output_length;
    const int64_t total = static_cast<int64_t>(p.prompt_len) + p.output_len;
    SimRequestRecord& rec = res.records[i];
    rec.arrival_s = static_cast<double>(p.release_ns) * 1e-9;
    rec.prompt_tokens = p.prompt_len;
    rec.hash_ids = static_cast<uint32_t>(r.hash_ids.size());
    rec.ideal_ids = ideal[i];
    if (o.max_model_len > 0 && total > o.max_model_len) {
      p.skipped = true;
      rec.finish_reason = "skipped";
      ++res.skipped_over_context;
    } else if ((total + bs - 1) / bs + 1 > device_blocks) {
      // It could never hold its own blocks: the engine would preempt it
      // forever. A real deployment sizes the pool for its longest request.
      p.skipped = true;
      rec.finish_reason = "skipped";
      ++res.skipped_over_capacity;
    }
  }

  // Leading hash ids whose tokens lie in the first `covered` tokens (whole
  // cached blocks); the trailing id needs only its full blocks.
  auto ids_covered = [&](const Pending& p, int64_t covered) -> uint32_t {
    uint32_t served = 0;
    for (size_t k = 0; k < p.id_ends.size(); ++k) {
      const int64_t start = k == 0 ? 0 : p.id_ends[k - 1];
      const bool last = k + 1 == p.id_ends.size();
      const int64_t need = last ? FloorTo(p.id_ends[k], bs) : p.id_ends[k];
      if (need <= start || covered < need) break;
      ++served;
    }
    return served;
  };
  // Hash ids served, from the tokens the engine took from cache.
  auto served_ids = [&](size_t i, int32_t cached) -> uint32_t {
    const Pending& p = pend[i];
    int64_t covered = cached;
    const int64_t engine_cap = FloorTo(p.prompt_len - 1, bs);
    if (p.whole_prompt_cached && covered >= engine_cap) covered = FloorTo(p.prompt_len, bs);
    return ids_covered(p, covered);
  };

  size_t next = 0;
  bool serial_busy = false;
  int64_t serial_free_at = 0;
  // Closed loop: when each of the `concurrency` users is free again. All
  // start at the first request's timestamp.
  std::multiset<int64_t> slots;
  if (o.concurrency > 0) {
    const int64_t start = n > 0 ? pend[0].release_ns : 0;
    for (int k = 0; k < o.concurrency; ++k) slots.insert(start);
  }
  scheduler::Router router(o.cluster.routing);
  // Disaggregated: the decode choice keeps its own turn, as strata router's.
  scheduler::Router decode_router(o.cluster.routing);
  std::vector<scheduler::RouteCandidate> candidates;
  // The instances a prompt may be prefilled at (all, or the prefill ones)
  // and those that decode (disaggregated only).
  std::vector<size_t> prefill_ids, decode_ids;
  for (size_t j = 0; j < inst.size(); ++j) (inst[j].role == Phase::kDecode ? decode_ids : prefill_ids).push_back(j);
  // Disaggregated: prefills done, their KV on its way, by arrival time at
  // the decode instance; requests waiting for room at a decode instance.
  std::multimap<int64_t, size_t> transfers;
  std::deque<size_t> decode_wait;
  int64_t retry_at = kNever;  // when a decode instance freed room (decode_wait tries again then)
  auto advance_to = [&](int64_t t) {
    const int64_t now = clock.NowNanos();
    if (t > now) clock.Advance(t - now);
  };

  // The router's view of instances `ids` for this prompt: the index in
  // `ids` it picks for the prefill.
  auto pick_prefill = [&](std::vector<int32_t>& prompt, const Pending& p, const std::vector<size_t>& ids) -> size_t {
    candidates.assign(ids.size(), scheduler::RouteCandidate{});
    for (size_t k = 0; k < ids.size(); ++k) candidates[k].unfinished = inst[ids[k]].unfinished;
    if (router.needs_cached_tokens() && ids.size() > 1) {
      // Match caps at prompt - 1 tokens; one token more lets the whole
      // prompt count, so a repeated prompt goes where all of it is.
      prompt.push_back(o.first_id);
      for (size_t k = 0; k < ids.size(); ++k) {
        Instance& in = inst[ids[k]];
        in.kv->Poll();
        scheduler::RouteCandidate& c = candidates[k];
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
        c.queue_done_seconds = -static_cast<double>(std::max<int64_t>(0, in.free_at - clock.NowNanos())) * 1e-9;
      }
      prompt.pop_back();
    }
    return router.Pick(candidates);
  };

  // The request is over (finished, failed or refused): the serial and
  // closed-loop releases move on.
  auto request_over = [&](int64_t at) {
    if (o.serial) {
      serial_busy = false;
      serial_free_at = at;
    }
    if (o.concurrency > 0) slots.insert(at);
  };
  auto reject = [&](size_t i) {
    res.records[i].finish_reason = "rejected";
    ++res.rejected;
    if (o.concurrency > 0) slots.insert(clock.NowNanos());  // the user moves on at once
    else if (o.serial) request_over(clock.NowNanos());
  };

  // Submits `er` to instance `k` for request i's `phase`. False: refused
  // (queue full); errors other than that are the simulation's.
  auto submit = [&](size_t k, size_t i, Phase phase, scheduler::EngineRequest er) -> Result<bool> {
    Instance& in = inst[k];
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
    in.wake = std::min(in.wake, std::max(clock.NowNanos(), in.free_at));
    return true;
  };

  // Submits request i's prompt (max_tokens tokens) to instance `target`.
  auto submit_prompt = [&](size_t i, size_t target, std::vector<int32_t> prompt, int max_tokens,
                           Phase phase) -> Result<bool> {
    const TraceRequest& r = head[i];
    Pending& p = pend[i];
    Instance& in = inst[target];
    res.records[i].instance = static_cast<int>(target);
    if (ideal[i] == r.hash_ids.size()) {
      // The engine never serves the last prompt block from cache; ask whether
      // it is there with one token more (Match is a pure query).
      prompt.push_back(o.first_id);
      in.kv->Poll();  // writes that finished by now are visible, as at the next step
      p.whole_prompt_cached = in.kv->Match(prompt, "").total() >= FloorTo(p.prompt_len, bs);
      prompt.pop_back();
    }
    scheduler::EngineRequest er;
    er.prompt = std::move(prompt);
    er.max_tokens = max_tokens;
    er.sampling.temperature = 0;
    er.ignore_eos = true;
    return submit(target, i, phase, std::move(er));
  };

  // Request i's reservation at its decode instance is released.
  auto release_reservation = [&](size_t i) {
    Pending& p = pend[i];
    Instance& d = inst[static_cast<size_t>(p.decode)];
    if (!p.reservation_held) return;
    d.kv->ReleaseReservation(i + 1);
    p.reservation_held = false;
    d.promised_blocks -= std::exchange(p.promised_blocks, 0);
  };

  // Disaggregated: reserves the prompt's blocks at a decode instance (the
  // router's PickDecode first, then the others in turn) and submits the
  // prefill; with no room at any decode instance, the request waits for a
  // decode to finish, as the live router's handoff does.
  // Returns whether the request got a reservation (else it waits).
  auto dispatch_pd = [&](size_t i) -> Result<bool> {
    Pending& p = pend[i];
    if (p.prompt.empty()) p.prompt = ScaleRequest(head[i], o.tokens_per_hash_id, o.vocab_size, o.first_id).prompt;
    std::vector<int32_t>& prompt = p.prompt;  // kept while it waits
    std::vector<scheduler::RouteCandidate> dc(decode_ids.size());
    for (size_t k = 0; k < decode_ids.size(); ++k) {
      Instance& d = inst[decode_ids[k]];
      d.kv->Poll();
      dc[k].unfinished = d.unfinished + d.reserved;
      dc[k].cached_tokens = d.kv->Match(prompt, "").device_tokens;
      dc[k].free_kv_tokens = static_cast<int64_t>(d.kv->device_pool().num_allocatable()) * bs;
      dc[k].tpot_seconds = d.cost.DecodeStepSeconds(d.unfinished + 1, p.prompt_len);
    }
    const int64_t need_tokens = static_cast<int64_t>(p.prompt_len) + p.output_len;
    const size_t first = decode_router.PickDecode(dc, need_tokens);
    // An instance has room when its pool can hold this request's prompt and
    // output besides what the requests reserved before it will need: a
    // reservation whose continuation could never get its output blocks
    // would hold its blocks forever.
    const int64_t need_blocks = (need_tokens + bs - 1) / bs;
    kvcache::KvManager::Reservation rv;
    int chosen = -1;
    for (size_t t = 0; t < decode_ids.size() && chosen < 0; ++t) {
      const size_t k = decode_ids[(first + t) % decode_ids.size()];
      if (inst[k].kv->device_pool().num_allocatable() - inst[k].promised_blocks < need_blocks) continue;
      auto got = inst[k].kv->Reserve(i + 1, prompt, "", kNever, &rv);
      if (!got.ok()) return got.error().WithContext("simulate: request " + std::to_string(i) + ": reserve");
      if (*got == kvcache::AllocOutcome::kAllocated) chosen = static_cast<int>(k);
    }
    if (chosen < 0) {
      return false;
    }
    Instance& d = inst[static_cast<size_t>(chosen)];
    p.decode = chosen;
    p.reservation_held = true;
    p.handoff_blocks = static_cast<int32_t>(rv.blocks.size()) - rv.held_blocks;
    res.records[i].decode_instance = chosen;
    ++d.reserved;
    p.promised_blocks = static_cast<int32_t>(std::max<int64_t>(0, need_blocks - static_cast<int64_t>(rv.blocks.size())));
    d.promised_blocks += p.promised_blocks;
    const size_t target = prefill_ids[pick_prefill(prompt, p, prefill_ids)];
    STRATA_ASSIGN_OR_RETURN(bool ok, submit_prompt(i, target, prompt, 1, Phase::kPrefill));
    if (!ok) {
      release_reservation(i);
      --d.reserved;
      p.prompt.clear();
      reject(i);
    }
    return true;
  };
  // Room may have come free at a decode instance: the waiting requests try
  // again in arrival order, up to the first that still finds none (first
  // come, first served: a large request is not passed over for ever).
  auto retry_decode_wait = [&]() -> Status {
    while (!decode_wait.empty()) {
      STRATA_ASSIGN_OR_RETURN(bool got, dispatch_pd(decode_wait.front()));
      if (!got) {
        // Blocks also come free when a decode instance's tier writes
        // complete (a write holds its block until then): look again when
        // they have, if no decode finishes first.
        for (size_t k : decode_ids) retry_at = std::min(retry_at, inst[k].StoresIdle());
        break;
      }
      decode_wait.pop_front();
    }
    return Status::Ok();
  };

  auto release = [&](size_t i) -> Status {
    Pending& p = pend[i];
    res.records[i].arrival_s = static_cast<double>(clock.NowNanos()) * 1e-9;
    if (o.cluster.disaggregated()) {
      if (o.serial) serial_busy = true;  // until it is over, even while it waits for a decode instance
      // Behind others already waiting, it waits too (first come, first served).
      bool got = false;
      if (decode_wait.empty()) {
        STRATA_ASSIGN_OR_RETURN(got, dispatch_pd(i));
      }
      if (!got) {
        ++res.decode_waits;
        decode_wait.push_back(i);
      }
      return Status::Ok();
    }
    ScaledRequest sr = ScaleRequest(head[i], o.tokens_per_hash_id, o.vocab_size, o.first_id);
    const size_t target = prefill_ids[pick_prefill(sr.prompt, p, prefill_ids)];
    STRATA_ASSIGN_OR_RETURN(bool ok, submit_prompt(i, target, std::move(sr.prompt), sr.output_length, Phase::kWhole));
    if (!ok) {
      reject(i);
      return Status::Ok();
    }
    if (o.serial) serial_busy = true;
    return Status::Ok();
  };

  // Request i's prefill is done at `at`: its KV goes to the decode
  // instance, or, with nothing left to decode, it is over.
  auto prefill_done = [&](size_t i, const Event& ev, int64_t at) -> Status {
    Pending& p = pend[i];
    Instance& d = inst[static_cast<size_t>(p.decode)];
    if (ev.ok && ev.completion_tokens >= 1 && p.output_len > 1) {
      const double bytes = static_cast<double>(p.handoff_blocks) * static_cast<double>(block_bytes);
      const double sec = o.cluster.transfer_latency_s +
                         (o.cluster.transfer_bytes_per_s > 0 ? bytes / o.cluster.transfer_bytes_per_s : 0.0);
      res.handoff_blocks += static_cast<uint64_t>(p.handoff_blocks);
      transfers.emplace(at + static_cast<int64_t>(std::llround(sec * 1e9)), i);
      return Status::Ok();
    }
    release_reservation(i);
    --d.reserved;
    p.prompt.clear();
    SimRequestRecord& rec = res.records[i];
    rec.finish_s = static_cast<double>(at) * 1e-9;
    rec.output_tokens = ev.completion_tokens;
    rec.finish_reason = ev.ok ? ev.reason : "error";
    request_over(at);
    retry_at = std::min(retry_at, at);
    return Status::Ok();
  };

  // The KV of request i reached its decode instance: the continuation
  // (the prompt and the first token) runs there on the reserved blocks.
  auto start_decode = [&](size_t i) -> Status {
    Pending& p = pend[i];
    Instance& d = inst[static_cast<size_t>(p.decode)];
    STRATA_RETURN_IF_ERROR(d.kv->CompleteReservation(i + 1, p.handoff_blocks));
    --d.reserved;
    p.continuing = true;
    std::vector<int32_t> prompt = std::move(p.prompt);
    p.prompt = {};
    prompt.push_back(0);  // the first token (zero logits: greedy picks 0)
    scheduler::EngineRequest er;
    er.prompt = std::move(prompt);
    er.max_tokens = p.output_len - 1;
    er.sampling.temperature = 0;
    er.ignore_eos = true;
    STRATA_ASSIGN_OR_RETURN(bool ok, submit(static_cast<size_t>(p.decode), i, Phase::kDecode, std::move(er)));
    if (!ok) {
      release_reservation(i);
      reject(i);
      retry_at = std::min(retry_at, clock.NowNanos());
    }
    return Status::Ok();
  };

  // A decode instance whose queued continuations all wait for blocks that
  // the reservations of other queued continuations hold would wait for
  // ever (a preempted continuation that must recompute its prompt needs
  // more than the free blocks): live, those reservations expire and their
  // blocks stay only as cache. Returns whether any was released.
  auto expire_reservations = [&](size_t j) -> bool {
    size_t released = 0;
    for (size_t i = 0; i < n; ++i) {
      Pending& p = pend[i];
      if (p.decode != static_cast<int>(j) || !p.reservation_held || !p.continuing) continue;
      release_reservation(i);
      ++released;
    }
    res.reservations_expired += released;
    return released > 0;
  };

  auto handle_events = [&](Instance& in, int64_t at) -> Status {
    const double t = static_cast<double>(at) * 1e-9;
    std::vector<Event> events;
    events.swap(in.events);
    for (Event& ev : events) {
      SimRequestRecord& rec = res.records[ev.req];
      Pending& p = pend[ev.req];
      if (ev.phase == Phase::kDecode) {
        // Its first event comes after its admission: the continuation holds
        // its own references now, the reservation's can go.
        release_reservation(ev.req);
        if (ev.finished) {
          rec.finish_s = t;
          rec.output_tokens = 1 + ev.completion_tokens;
          rec.finish_reason = ev.ok ? ev.reason : "error";
          --in.unfinished;
          request_over(at);
          retry_at = std::min(retry_at, at);
        }
        continue;
      }
      if (!p.got_first && ev.completion_tokens > 0) {
        p.got_first = true;
        rec.first_token_s = t;
        rec.cached_tokens = ev.cached_tokens;
        rec.cached_tokens_by_tier = ev.by_tier;
        rec.served_ids = served_ids(ev.req, ev.cached_tokens);
      }
      if (!ev.finished) continue;
      --in.unfinished;
      if (!p.got_first) {  // finished without a token (error, abort)
        rec.cached_tokens = ev.cached_tokens;
        rec.cached_tokens_by_tier = ev.by_tier;
      }
      if (ev.phase == Phase::kPrefill) {
        STRATA_RETURN_IF_ERROR(prefill_done(ev.req, ev, at));
        continue;
      }
      rec.finish_s = t;
      rec.output_tokens = ev.completion_tokens;
      rec.finish_reason = ev.ok ? ev.reason : "error";
      request_over(at);
    }
    return Status::Ok();
  };

  while (true) {
    while (next < n && pend[next].skipped) ++next;
    int64_t t_arr = kNever;
    if (o.concurrency > 0) {
      if (next < n && !slots.empty()) t_arr = std::max(*slots.begin(), clock.NowNanos());
    } else if (next < n && !(o.serial && serial_busy)) {
      t_arr = o.serial ? std::max(pend[next].release_ns, serial_free_at) : pend[next].release_ns;
      t_arr = std::max(t_arr, clock.NowNanos());
    }
    size_t j = 0;
    for (size_t k = 1; k < inst.size(); ++k)
      if (inst[k].wake < inst[j].wake) j = k;
    const int64_t t_inst = inst[j].wake;
    const int64_t t_xfer = transfers.empty() ? kNever : transfers.begin()->first;
    const int64_t t_retry = decode_wait.empty() ? kNever : std::max(retry_at, clock.NowNanos());
    if (t_arr == kNever && t_inst == kNever && t_xfer == kNever && t_retry == kNever) break;
    // At equal times: KV arrivals, then room freed, then new requests, then steps.
    if (t_xfer <= std::min({t_retry, t_arr, t_inst})) {
      advance_to(t_xfer);
      const size_t i = transfers.begin()->second;
      transfers.erase(transfers.begin());
      STRATA_RETURN_IF_ERROR(start_decode(i));
      continue;
    }
    if (t_retry <= std::min(t_arr, t_inst)) {
      advance_to(t_retry);
      retry_at = kNever;
      STRATA_RETURN_IF_ERROR(retry_decode_wait());
      continue;
    }
    if (t_arr <= t_inst) {
      advance_to(t_arr);
      if (o.concurrency > 0) slots.erase(slots.begin());
      STRATA_RETURN_IF_ERROR(release(next));
      ++next;
      continue;
    }
    Instance& in = inst[j];
    advance_to(t_inst);
    const int64_t now = clock.NowNanos();
    auto did = in.engine->Step();
    const double sec = in.runner->TakeSeconds();
    res.busy_s += sec;
    const int64_t end = now + static_cast<int64_t>(std::llround(sec * 1e9));
    STRATA_RETURN_IF_ERROR(handle_events(in, end));
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
      if (c == kNever && in.role == Phase::kDecode && expire_reservations(j)) {
        in.wake = now + 1;
        continue;
      }
      if (c == kNever && in.reserved > 0) {
        in.wake = kNever;  // a handoff on its way wakes it (start_decode)
        continue;
      }
      if (c == kNever) {
        return Status::Internal("simulate: instance " + std::to_string(j) + " stalled with " +
                                std::to_string(in.unfinished) + " unfinished requests at t=" +
                                std::to_string(static_cast<double>(now) * 1e-9) + " s");
      }
      in.wake = std::max(c, now + 1);
    }
  }

  for (size_t k = 0; k < inst.size(); ++k) {
    if (inst[k].kv->num_reservations() != 0 || inst[k].promised_blocks != 0)
      return Status::Internal("simulate: instance " + std::to_string(k) + " ends with " +
                              std::to_string(inst[k].kv->num_reservations()) + " reservations held");
  }
  if (!decode_wait.empty()) {
    std::string state;
    for (size_t k : decode_ids) {
      state += "; instance " + std::to_string(k) + ": " +
               std::to_string(inst[k].kv->device_pool().num_allocatable()) + " blocks free, " +
               std::to_string(inst[k].promised_blocks) + " promised, " + std::to_string(inst[k].reserved) +
               " reserved, " + std::to_string(inst[k].unfinished) + " unfinished";
    }
    const Pending& h = pend[decode_wait.front()];
    return Status::Internal("simulate: " + std::to_string(decode_wait.size()) +
                            " requests still wait for room at a decode instance at the end (the first needs " +
                            std::to_string((int64_t{h.prompt_len} + h.output_len + bs - 1) / bs) + " blocks" + state + ")");
  }

  // Figures.
  std::vector<double> ttft, tpot, e2e;
  double first_arrival = -1, last_finish = 0;
  std::vector<uint64_t> tier_tokens(num_tiers, 0);
  for (size_t i = 0; i < n; ++i) {
    const SimRequestRecord& rec = res.records[i];
    if (rec.finish_reason == "skipped") continue;
    res.total_ids += rec.hash_ids;
    res.prompt_tokens += static_cast<uint64_t>(rec.prompt_tokens);
    res.served_ids += rec.served_ids;
    res.cached_tokens += static_cast<uint64_t>(rec.cached_tokens);
    for (size_t k = 0; k < rec.cached_tokens_by_tier.size() && k < num_tiers; ++k)
      tier_tokens[k] += static_cast<uint64_t>(rec.cached_tokens_by_tier[k]);
    if (first_arrival < 0 || rec.arrival_s < first_arrival) first_arrival = rec.arrival_s;
    if (rec.finish_reason == "rejected") continue;
    if (rec.finish_reason != "length" && rec.finish_reason != "stop") {
      ++res.errors;
      continue;
    }
    ++res.requests;
    res.completion_tokens += static_cast<uint64_t>(rec.output_tokens);
    last_finish = std::max(last_finish, rec.finish_s);
    const double t1 = rec.first_token_s - rec.arrival_s;
    ttft.push_back(t1);
    e2e.push_back(rec.finish_s - rec.arrival_s);
    double tp = 0;
    if (rec.output_tokens >= 2) {
      tp = (rec.finish_s - rec.first_token_s) / (rec.output_tokens - 1);
      tpot.push_back(tp);
    }
    const bool good = (o.slo_ttft_s <= 0 || t1 <= o.slo_ttft_s) &&
                      (o.slo_tpot_s <= 0 || rec.output_tokens < 2 || tp <= o.slo_tpot_s);
    if (good) ++res.goodput_requests;
  }
  std::sort(ttft.begin(), ttft.end());
  std::sort(tpot.begin(), tpot.end());
  std::sort(e2e.begin(), e2e.end());
  IdealHit ih;
  uint64_t achievable = 0;
  for (size_t i = 0; i < n; ++i) {
    if (pend[i].skipped) continue;
    ih.hit_ids += ideal[i];
    ih.total_ids += head[i].hash_ids.size();
    achievable += std::min(ideal[i], ids_covered(pend[i], FloorTo(pend[i].prompt_len, bs)));
  }
  const double total = static_cast<double>(res.total_ids);
  res.ideal_hit_ratio_blocks = ih.ratio();
  res.achievable_hit_ratio_blocks = res.total_ids ? static_cast<double>(achievable) / total : 0;
  res.hit_ratio_blocks = res.total_ids ? static_cast<double>(res.served_ids) / total : 0;
  res.lost_to_overlap = o.serial ? 0.0 : res.achievable_hit_ratio_blocks - res.hit_ratio_blocks;
  {
    // The offline references over the same requests, one flat cache of the
    // cluster's total size (every tier's blocks summed, as if exclusive).
    // Each request's ids stop where the engine could serve no more of them
    // (a trailing id without a full block of its own), as ids_covered says.
    std::vector<TraceRequest> run;
    for (size_t i = 0; i < n; ++i) {
      if (pend[i].skipped) continue;
      TraceRequest r = head[i];
      const uint32_t coverable = ids_covered(pend[i], FloorTo(pend[i].prompt_len, bs));
      r.hash_ids.resize(std::min<size_t>(r.hash_ids.size(), coverable));
      run.push_back(std::move(r));
    }
    const uint64_t per_instance = static_cast<uint64_t>(device_blocks) +
                                  (o.unlimited_cache || block_bytes == 0 ? 0 : (ic.host_bytes + ic.disk_bytes) / block_bytes);
    const uint64_t tokens_per_id =
        static_cast<uint64_t>(o.tokens_per_hash_id > 0 ? o.tokens_per_hash_id : kTraceTokensPerHashId);
    res.reference_capacity_ids =
        per_instance * static_cast<uint64_t>(o.cluster.instances) * static_cast<uint64_t>(bs) / tokens_per_id;
    const auto chains = ChainUnits(run);
    ReferenceHits lru = LruReference(chains, res.reference_capacity_ids);
    ReferenceHits min = BeladyReference(chains, res.reference_capacity_ids);
    // The denominator is every id of the requests run, as hit_ratio_blocks'.
    res.lru_hit_ratio_blocks = res.total_ids ? static_cast<double>(lru.hit_ids) / total : 0;
    res.belady_hit_ratio_blocks = res.total_ids ? static_cast<double>(min.hit_ids) / total : 0;
  }
  res.hit_ratio_tokens =
      res.prompt_tokens ? static_cast<double>(res.cached_tokens) / static_cast<double>(res.prompt_tokens) : 0;
  if (!ttft.empty()) {
    double sum = 0;
    for (double v : ttft) sum += v;
    res.ttft_mean_s = sum / static_cast<double>(ttft.size());
  }
  res.ttft_p50_s = Percentile(ttft, 50);
  res.ttft_p90_s = Percentile(ttft, 90);
  res.ttft_p99_s = Percentile(ttft, 99);
  res.tpot_p50_s = Percentile(tpot, 50);
  res.tpot_p99_s = Percentile(tpot, 99);
  res.e2e_p50_s = Percentile(e2e, 50);
  res.e2e_p99_s = Percentile(e2e, 99);
  res.duration_s = first_arrival >= 0 ? std::max(0.0, last_finish - first_arrival) : 0;
  if (res.duration_s > 0) {
    res.throughput_requests_per_s = static_cast<double>(res.requests) / res.duration_s;
    res.throughput_tokens_per_s = static_cast<double>(res.completion_tokens) / res.duration_s;
    res.total_tokens_per_s = static_cast<double>(res.completion_tokens + res.prompt_tokens) / res.duration_s;
    res.goodput_rps = static_cast<double>(res.goodput_requests) / res.duration_s;
  }
  res.tiers.resize(num_tiers);
  for (size_t k = 0; k < num_tiers; ++k) {
    res.tiers[k].name = std::string(inst[0].kv->tier_name(static_cast<int>(k)));
    res.tiers[k].hit_tokens = tier_tokens[k];
  }
  for (Instance& in : inst) {
    const scheduler::EngineStats es = in.engine->Stats();
    res.steps += es.steps;
    res.preemptions += es.preemptions;
    const kvcache::KvManagerStats ks = in.kv->stats();
    res.tiers[0].hit_blocks += ks.device.blocks;
    res.tiers[0].capacity_bytes += static_cast<uint64_t>(ks.device_pool.num_blocks) * block_bytes;
    res.tiers[0].used_bytes += static_cast<uint64_t>(ks.device_pool.in_use + ks.device_pool.cached) * block_bytes;
    res.tiers[0].evictions += ks.device_pool.evictions;
    for (size_t k = 1; k < num_tiers && k - 1 < ks.tiers.size(); ++k) {
      res.tiers[k].hit_blocks += ks.tiers[k - 1].hits.blocks;
      res.tiers[k].bytes_written += ks.tiers[k - 1].bytes_down;
      const kvcache::StoreStats ss = in.kv->lower_store(k - 1).stats();
      res.tiers[k].capacity_bytes += ss.capacity_bytes;
      res.tiers[k].used_bytes += ss.used_bytes;
      res.tiers[k].evictions += ss.evictions;
    }
  }
  // Engines before the managers they use, managers before their stores.
  for (Instance& in : inst) {
    in.engine.reset();
    in.kv.reset();
  }
  res.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  // Remote tiers point into other instances' stores, destroyed in order.
  for (Instance& in : inst)
    for (const auto& st : in.stores)
      if (st->kind() == kvcache::TierKind::kRemote) static_cast<SimStore*>(st.get())->SetPeers({});
  return res;
}

}  // namespace strata::bench
