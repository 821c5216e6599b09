#pragma once
// The serving engine loop: continuous batching over one ForwardPass and
// one KvManager.
//
// Each Step():
//   1. takes newly submitted requests, cancellations and posted tasks;
//      finishes cancelled requests and those past their deadline (their
//      blocks are released at once);
//   2. polls the KV manager (finished tier loads and write-throughs);
//   3. schedules under a per-step token budget (`max_batch_tokens`): one
//      decode token for every running sequence first, then prompt chunks of
//      running sequences still in prefill, then admits waiting requests in
//      order (priority ascending, then arrival) while blocks and the running
//      limit allow (chunked prefill: a long prompt takes several steps and
//      never blocks decode);
//   3b. prefetch: waiting requests that were not admitted and whose prompt
//      prefix is in a lower tier (KvManager::Match lower_tokens > 0) start
//      loading it into device blocks now, so the load overlaps with other
//      requests' compute (see "Prefetch" below);
//   4. runs one batched forward pass, samples, detects stops, commits full
//      blocks to the KV manager and sends each request's new text to its sink.
// Steps 1-3b are Schedule(), which returns the batch as a SchedulerOutput;
// the StepRunner executes it; step 4 is Update(). Sampling, text and stop
// conditions are each sequence's OutputProcessor (model/output_processor.h).
//
// Continuation: a request may start from another engine's generated tokens
// (EngineRequest::continuation) and may pause after N tokens
// (pause_after) to hand its continuation on. A continuation computes its
// prompt in chunks that end at the prompt and its generated tokens one per
// step, as decode computed them, so with the same batch shapes it samples
// from bit-identical logits (the CPU kernels choose their path by a step's
// token count, so a different shape, e.g. a prefix cache hit, can move the
// last bits of a logprob).
//
// Blocks come only from the KV manager. When it answers "not now" for a
// running sequence, the engine preempts the lowest-priority, latest-arrived
// running request: its blocks are freed (full ones stay in the prefix cache
// and in the lower tiers, so resuming mostly hits) and it goes back to the
// front of the waiting queue with its generated tokens, to be recomputed.
//
// Prefetch (EngineOptions::prefetch_max_requests > 0 and lower tiers exist):
// a prefetching request is tracked by the KV manager while still waiting
// (AddRequest + Allocate(id, 0), which takes just its cached prefix and
// queues the loads). Bounds: at most prefetch_max_requests waiting requests
// hold prefetched blocks; only the first 4 x that many waiting requests not
// yet prefetching are examined per step; and a prefetch starts only while
// the blocks all prefetches hold (counted as the prefix's whole block count,
// an upper bound) stay within prefetch_max_block_share of the blocks that
// are allocatable or already prefetch-held, and while one allocatable block
// per running sequence is left over for its next step; none starts in a
// step that had to release a prefetch, and when the head of the queue is
// waiting for blocks only the head itself may prefetch. Prefetched blocks never starve
// running requests: when a running request (or the head of the waiting
// queue) cannot get blocks, the latest-queued prefetch is released before
// anyone is preempted. A prefetched request keeps its blocks on admission
// (no second lookup or allocation); cancellation, deadline and shutdown free
// them like any request's.
//
// Time comes from the injected Clock (queue times, deadlines, timings), so
// the simulator can drive the same code in virtual time through Step().
//
// Thread-safety: Submit, Cancel, Post, BeginDrain and Stats may be called
// from any thread. Step() is called by one thread at a time: the loop thread
// Start() creates, or the caller when no loop runs (tests, simulator). Sinks
// and posted tasks run on the stepping thread and must not block.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/status.h"
#include "common/strong_id.h"
#include "kvcache/clock.h"
#include "kvcache/kv_manager.h"
#include "model/backend/backend.h"
#include "model/output_processor.h"
#include "model/tokenizer/tokenizer.h"
#include "scheduler/engine_client.h"

namespace strata::scheduler {

// What the engine runs a batch on: the model's forward pass (ForwardPass),
// or a cost model in the simulator.
class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // ForwardPass::Forward's contract.
  virtual Status Forward(std::span<const ForwardSeq> batch, std::vector<float>* logits) = 0;
  virtual int vocab_size() const = 0;
  virtual int context_length() const = 0;
};

// Runs batches on a backend's forward pass (model/backend/backend.h; not
// owned).
class ForwardEngineRunner final : public StepRunner {
 public:
  explicit ForwardEngineRunner(ForwardPass* engine) : engine_(engine) {}
  Status Forward(std::span<const ForwardSeq> batch, std::vector<float>* logits) override {
    return engine_->Forward(batch, logits);
  }
  int vocab_size() const override { return engine_->vocab_size(); }
  int context_length() const override { return engine_->context_length(); }

 private:
  ForwardPass* engine_;
};

struct EngineOptions {
  int max_batch_tokens = 512;  // tokens per forward step (decode + prompt chunks); >= 1
  int max_running = 64;        // sequences in flight at once (running or loading); >= 1
  int max_waiting = 1024;      // queued, not yet running; Submit beyond it is ResourceExhausted
  int prefetch_max_requests = 4;          // waiting requests loading their prefix early; 0 = off
  double prefetch_max_block_share = 0.5;  // of allocatable + prefetch-held device blocks; (0, 1]
  // Waiting requests ask the KV tiers for their cached prefix asynchronously
  // (KvManager::SubmitLookup); an answer later than this counts as a
  // lower-tier miss. Local tiers answer at once.
  double lookup_timeout_seconds = 0.05;
  // Test-only (`strata serve --debug-step-time-factor`): >= 1; each forward
  // pass is followed by a sleep of (factor - 1) x its wall time, so that a
  // test can make an instance slower (or slow enough to act mid-stream) on
  // a machine whose thread counts cannot. 1 = off.
  double step_time_factor = 1;
  // From a calibration (`strata serve --calibration F`, the output of
  // `strata bench calibrate`): the prefill rate (tokens/s) and decode step
  // (s) reported in EngineStats before live steps measure them; 0 = none.
  double calibrated_prefill_tokens_per_s = 0;
  double calibrated_decode_step_seconds = 0;
};

// One step's work as a plain value (Engine::Schedule): the batch for the
// executor and which request each entry belongs to. The ForwardSeq spans
// point into the engine's sequences and stay valid until Update() or the
// next Schedule().
struct SchedulerOutput {
  struct Entry {
    RequestId id{0};
    int32_t num_tokens = 0;  // positions computed this step (prompt chunk, or 1)
  };
  std::vector<Entry> entries;
  std::vector<ForwardSeq> batch;  // entries[i]'s tokens, start and block table
  int32_t prefill_tokens = 0;     // in entries of 2+ tokens
  int32_t decode_tokens = 0;      // in entries of one token
  bool did_work = false;          // admitted, finished or started something (even with an empty batch)
  bool empty() const { return entries.empty(); }
};

class Engine final : public EngineClient {
 public:
  // `runner`, `kv`, `tokenizer` and `clock` must outlive the engine. The KV
  // manager's block memory must be the runner's (same block size).
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options, StepRunner* runner,
                                                kvcache::KvManager* kv, const Tokenizer* tokenizer,
                                                kvcache::Clock* clock);
  // Stops the loop (cancelling what is left) if it runs.
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // EngineClient (scheduler/engine_client.h). The delivery thread is the
  // stepping thread. A cancelled request's blocks are released within one
  // step. A continuation's tokens must be in the vocabulary and fewer than
  // max_tokens; pause_after, when set, more than the continuation's tokens.
  Result<RequestId> Submit(EngineRequest request, OutputSink sink) override;
  void Cancel(RequestId id) override;
  void SetHeld(RequestId id, bool held) override;
  EngineStats Stats() const override;
  const std::vector<std::string>& tier_names() const override { return tier_names_; }
  const std::vector<kvcache::TierKind>& tier_kinds() const override { return tier_kinds_; }
  bool LookupCache(std::vector<int32_t> tokens, std::string cache_salt,
                   std::function<void(const CacheMatch&)> done) override;
  bool FlushCache(CacheFlush what, std::function<void(Result<kvcache::FlushResult>)> done) override;

  // Runs `task` on the stepping thread before the next step (operations on
  // the KV manager, which is not thread-safe; tests and tools in the same
  // process). False (and the task is dropped) once the engine is stopping:
  // nobody would run it.
  bool Post(std::function<void(kvcache::KvManager&)> task);

  // One iteration (see the top of this file): Schedule(), the runner's
  // Forward over the batch, Update(). Returns true when it did work (ran a
  // batch, finished or admitted a request, ran a task), false when idle. An
  // error is a failed forward pass; the requests in that batch are finished
  // with "error" and the engine keeps going.
  Result<bool> Step();
  // The parts of Step(), for an executor other than the runner (a remote
  // one): Schedule() takes new work and decides this step's batch (steps 1
  // to 3b at the top); the executor computes logits for it (the runner's
  // Forward contract: one row of vocab_size floats per entry); Update()
  // applies them (commits blocks, samples, stops, events), or finishes the
  // batch's requests with `forward` when it failed. Same thread as Step().
  SchedulerOutput Schedule();
  void Update(const SchedulerOutput& out, const Status& forward, const std::vector<float>& logits);

  // Starts the loop thread (Step until Stop; sleeps when idle).
  void Start();
  // From now on Submit answers Unavailable; running and waiting requests go on.
  void BeginDrain();
  // Waits up to `grace_seconds` (wall clock) for unfinished requests, then
  // cancels the rest ("abort"), runs their final events and joins the loop.
  // Later calls do nothing.
  void Stop(double grace_seconds = 0);

  // Submitted and not yet finished.
  int num_unfinished() const;
  const EngineOptions& options() const { return options_; }
  int context_length() const { return runner_->context_length(); }

 private:
  struct Sequence;
  struct Planned {
    Sequence* seq;
    int32_t tokens;  // positions computed this step
  };
  Engine(const EngineOptions& options, StepRunner* runner, kvcache::KvManager* kv, const Tokenizer* tokenizer,
         kvcache::Clock* clock);
  void TakeInbox();
  void AddWaiting(Sequence* s);
  void RemoveWaiting(Sequence* s);
  void Finish(Sequence& s, FinishReason reason, Status status);
  void Emit(Sequence& s, bool finished, FinishReason reason, const Status& status);
  // Grows the sequence's block table to `positions`, preempting others (or
  // the sequence itself) when the pool is short. False when `s` was preempted.
  bool EnsureBlocks(Sequence& s, int32_t positions, std::vector<Planned>* plan);
  void Preempt(Sequence& s, std::vector<Planned>* plan);
  // Admits waiting requests into `plan` while budget, blocks and the running
  // limit allow. True when any was admitted.
  bool Admit(int* budget, std::vector<Planned>* plan);
  void OnReady(Sequence& s);
  // Starts prefetches for waiting requests (see the top). True when any began.
  bool Prefetch();
  // The waiting request's cached prefix in s.match, answered in this step:
  // submits its lookup when none is in flight; false while the answer is
  // pending (it arrives in a later step, or the deadline makes it a miss).
  bool LookedUp(Sequence& s);
  // Releases the prefetch of the latest waiting request holding one, other
  // than `keep`. False when there is none.
  bool DropPrefetch(const Sequence* keep);
  // Sampling and stop detection after a step that reached the sequence's end.
  void AfterToken(Sequence& s, const float* logits);
  void RefreshStats();
  void Loop();
  void AbortAll(const Status& why);

  const EngineOptions options_;
  StepRunner* const runner_;
  kvcache::KvManager* const kv_;
  const Tokenizer* const tokenizer_;
  kvcache::Clock* const clock_;
  std::vector<std::string> tier_names_;
  std::vector<kvcache::TierKind> tier_kinds_;

  // Shared with other threads (mu_).
  mutable std::mutex mu_;
  std::condition_variable wake_;
  struct Pending {
    RequestId id;
    EngineRequest request;
    OutputSink sink;
    int64_t arrival;
  };
  std::vector<Pending> inbox_;
  std::vector<RequestId> cancels_;
  std::vector<std::pair<RequestId, bool>> holds_;
  std::vector<std::function<void(kvcache::KvManager&)>> tasks_;
  int queued_ = 0;  // inbox + waiting: what max_waiting bounds
  int unfinished_ = 0;
  bool draining_ = false;
  bool stopping_ = false;
  bool stopped_ = false;
  uint64_t next_id_ = 1;
  uint64_t rejected_ = 0;
  EngineStats stats_;

  // Stepping thread only.
  std::unordered_map<uint64_t, std::unique_ptr<Sequence>> seqs_;
  std::deque<Sequence*> waiting_;   // kept sorted by (priority, arrival order)
  std::vector<Sequence*> running_;  // admission order
  uint64_t step_nanos_ = 0, forward_nanos_ = 0, step_prefill_tokens_ = 0, step_decode_tokens_ = 0;
  // Steady-clock nanoseconds at which the running step began; 0 between
  // steps (written by the stepping thread, read by Stats()).
  std::atomic<int64_t> step_since_ns_{0};
  double prefill_rate_ = 0;   // EngineStats::prefill_tokens_per_s
  double decode_step_s_ = 0;  // EngineStats::decode_step_seconds
  uint64_t steps_ = 0, preemptions_ = 0, prompt_tokens_ = 0, generation_tokens_ = 0;
  uint64_t step_seq_ = 0;  // Step() calls, forward or not (a lookup answer is valid within one)
  uint64_t prefetches_started_ = 0, prefetched_blocks_ = 0, prefetches_used_ = 0, prefetches_released_ = 0;
  int num_prefetching_ = 0;
  bool released_this_step_ = false;
  bool head_needs_blocks_ = false;  // this step's queue head got "not now" for blocks
  std::map<std::string, uint64_t> finished_by_reason_;
  std::vector<float> logits_;

  std::thread loop_;
  std::atomic<bool> loop_running_{false};

  // Cache lookups without waiting for a step: the loop thread holds kv_mu_
  // except while in the runner's forward pass or asleep with no work, and
  // LookupCache (KvManager::Match only reads) takes it on the caller's
  // thread. kv_shared_ (kv_mu_): the loop runs and lends kv_mu_ so; when
  // false (no loop: the caller steps), lookups are posted. loop_kv_lock_:
  // the loop's hold, touched by the stepping thread only.
  std::mutex kv_mu_;
  bool kv_shared_ = false;
  std::unique_lock<std::mutex>* loop_kv_lock_ = nullptr;
};

}  // namespace strata::scheduler
