#include "scheduler/engine.h"

#include <algorithm>
#include <chrono>

#include "common/logging.h"

namespace strata::scheduler {

struct Engine::Sequence {
  Sequence(RequestId id_, EngineRequest r, OutputSink s, uint64_t order_, int vocab, const Tokenizer& tok)
      : id(id_),
        req(std::move(r)),
        sink(std::move(s)),
        order(order_),
        output(tok, req.sampling, vocab,
               StopConditions{req.max_tokens, req.stop, req.stop_token_ids, req.ignore_eos}, req.prompt,
               &req.continuation) {
    tokens = req.prompt;
    prompt_len = static_cast<int32_t>(req.prompt.size());
    // A continuation: its tokens are computed like a prompt's (one prefill),
    // then the next token is sampled where the other engine stopped.
    tokens.insert(tokens.end(), req.continuation.generated.begin(), req.continuation.generated.end());
    generated = static_cast<int32_t>(req.continuation.generated.size());
    replay_end = generated > 0 ? static_cast<int32_t>(tokens.size()) : 0;
    req.continuation = Continuation();  // the output processor holds its state now
    want_logprobs = req.sampling.logprobs || req.sampling.top_logprobs > 0;
  }

  int32_t remaining() const { return static_cast<int32_t>(tokens.size()) - num_computed; }
  // Positions to compute this step, at most `budget`. A continuation
  // computes its prompt in chunks that end at the prompt's end and then the
  // generated tokens it was given one per step, as the engine that
  // generated them did (decode), so the logits it samples from are the same
  // bits: the CPU kernels pick their path by the number of tokens in a step.
  int32_t Chunk(int32_t from, int32_t budget) const {
    const int32_t n = std::min(static_cast<int32_t>(tokens.size()) - from, budget);
    if (from >= replay_end) return n;
    return from < prompt_len ? std::min(n, prompt_len - from) : std::min(n, 1);
  }

  RequestId id;
  EngineRequest req;
  OutputSink sink;
  uint64_t order;                // arrival order (ties within a priority)
  std::vector<int32_t> tokens;   // prompt, then generated
  int32_t prompt_len = 0;
  int32_t num_computed = 0;      // leading positions with KV
  int32_t generated = 0;
  bool in_kv = false;            // tracked by the KV manager (admitted, or prefetching)
  bool prefetched = false;       // waiting, with its cached prefix taken (in_kv)
  int32_t prefetch_blocks = 0;   // blocks charged to the prefetch bound
  bool loading = false;          // waiting for tier loads
  bool ever_admitted = false;
  bool want_logprobs = false;
  int32_t replay_end = 0;        // a continuation: end of the given generated tokens, else 0
  // The asynchronous lookup of its cached prefix while waiting (see
  // Engine::LookedUp): in flight (id != 0), or answered in step `match_step`.
  uint64_t lookup = 0;
  uint64_t match_step = 0;  // 0: no answer
  kvcache::PrefixMatch match;
  bool blocked = false;     // the head of the queue, refused blocks last time
  bool held = false;        // SetHeld: not scheduled while running
  OutputProcessor output;  // sampling, text, stop conditions
  // Deltas for the next event.
  std::vector<int32_t> new_tokens;
  std::string new_text;
  std::vector<SampleResult> new_logprobs;
  bool cache_known = false;      // cached_tokens set (first admission)
  int32_t cached_tokens = 0;
  std::vector<int32_t> cached_by_tier;
  int32_t preemptions = 0;
  RequestTimings timings;
};

namespace {

bool Before(int pa, uint64_t oa, int pb, uint64_t ob) { return pa != pb ? pa < pb : oa < ob; }

Status ValidateContinuation(const EngineRequest& r, int vocab) {
  const auto done = static_cast<int64_t>(r.continuation.generated.size());
  for (int32_t t : r.continuation.generated)
    if (t < 0 || t >= vocab)
      return Status::InvalidArgument("continuation token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                     std::to_string(vocab) + ")");
  if (done >= r.max_tokens)
    return Status::InvalidArgument("the continuation has " + std::to_string(done) +
                                   " generated tokens, max_tokens is " + std::to_string(r.max_tokens) +
                                   ": nothing is left to generate");
  if (r.pause_after < 0) return Status::InvalidArgument("pause_after must be >= 0");
  if (r.pause_after > 0 && r.pause_after <= done)
    return Status::InvalidArgument("pause_after (" + std::to_string(r.pause_after) +
                                   ") must exceed the continuation's " + std::to_string(done) + " generated tokens");
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options, StepRunner* runner,
                                               kvcache::KvManager* kv, const Tokenizer* tokenizer,
                                               kvcache::Clock* clock) {
  if (runner == nullptr || kv == nullptr || tokenizer == nullptr || clock == nullptr)
    return Status::InvalidArgument("engine: runner, kv manager, tokenizer and clock are required");
  if (options.max_batch_tokens < 1) return Status::InvalidArgument("engine: max_batch_tokens must be >= 1");
  if (options.max_running < 1) return Status::InvalidArgument("engine: max_running must be >= 1");
  if (options.max_waiting < 0) return Status::InvalidArgument("engine: max_waiting must be >= 0");
  if (options.prefetch_max_requests < 0)
    return Status::InvalidArgument("engine: prefetch_max_requests must be >= 0");
  if (!(options.prefetch_max_block_share > 0 && options.prefetch_max_block_share <= 1))
    return Status::InvalidArgument("engine: prefetch_max_block_share must be in (0, 1]");
  return std::unique_ptr<Engine>(new Engine(options, runner, kv, tokenizer, clock));
}

Engine::Engine(const EngineOptions& options, StepRunner* runner, kvcache::KvManager* kv, const Tokenizer* tokenizer,
               kvcache::Clock* clock)
    : options_(options), runner_(runner), kv_(kv), tokenizer_(tokenizer), clock_(clock) {
  for (size_t t = 0; t <= kv_->num_lower_tiers(); ++t) {
    tier_names_.emplace_back(kv_->tier_name(static_cast<int>(t)));
    tier_kinds_.push_back(kv_->tier_kind(static_cast<int>(t)));
  }
  RefreshStats();
}

Engine::~Engine() { Stop(0); }

Result<RequestId> Engine::Submit(EngineRequest request, OutputSink sink) {
  const int ctx = runner_->context_length();
  const int vocab = runner_->vocab_size();
  const int prompt = static_cast<int>(request.prompt.size());
  if (prompt == 0) return Status::InvalidArgument("the prompt is empty (no tokens)");
  for (int32_t t : request.prompt)
    if (t < 0 || t >= vocab)
      return Status::InvalidArgument("prompt token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                     std::to_string(vocab) + ")");
  if (request.max_tokens < 1) return Status::InvalidArgument("max_tokens must be at least 1");
  if (prompt + request.max_tokens > ctx)
    return Status::InvalidArgument("the prompt has " + std::to_string(prompt) + " tokens and max_tokens is " +
                                   std::to_string(request.max_tokens) + ": together " +
                                   std::to_string(prompt + request.max_tokens) + " exceed the model's context of " +
                                   std::to_string(ctx) + " tokens");
  // A sequence that could never fit in the device pool would wait forever.
  const int64_t bs = kv_->options().block_size;
  const int64_t need = (prompt + request.max_tokens - 1 + bs - 1) / bs;
  if (need > kv_->options().num_device_blocks)
    return Status::InvalidArgument("the request needs " + std::to_string(need) + " KV blocks (" +
                                   std::to_string(prompt) + " prompt + " + std::to_string(request.max_tokens) +
                                   " max tokens), more than the device pool's " +
                                   std::to_string(kv_->options().num_device_blocks));
  STRATA_RETURN_IF_ERROR(ValidateSamplingParams(request.sampling, vocab));
  STRATA_RETURN_IF_ERROR(ValidateContinuation(request, vocab));
  if (!sink) return Status::InvalidArgument("engine: a request needs an output sink");

  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_ || draining_)
    return Status::Unavailable(stopping_ ? "the server is shutting down" : "the server is draining (shutting down)");
  if (queued_ >= options_.max_waiting) {
    ++rejected_;
    return Status::ResourceExhausted("the waiting queue is full (" + std::to_string(options_.max_waiting) +
                                     " requests); retry later");
  }
  RequestId id(next_id_++);
  inbox_.push_back(Pending{id, std::move(request), std::move(sink), clock_->NowNanos()});
  ++queued_;
  ++unfinished_;
  wake_.notify_one();
  return id;
}

void Engine::Cancel(RequestId id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.push_back(id);
  wake_.notify_one();
}

void Engine::SetHeld(RequestId id, bool held) {
  std::lock_guard<std::mutex> lock(mu_);
  holds_.emplace_back(id, held);
  wake_.notify_one();
}

bool Engine::Post(std::function<void(kvcache::KvManager&)> task) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return false;
  tasks_.push_back(std::move(task));
  wake_.notify_one();
  return true;
}

namespace {

CacheMatch MatchPrompt(const kvcache::KvManager& kv, const std::vector<int32_t>& tokens, const std::string& salt) {
  const kvcache::PrefixMatch m = kv.Match(tokens, salt);
  CacheMatch c;
  c.prompt_tokens = static_cast<int32_t>(tokens.size());
  c.cached_tokens = m.total();
  c.block_size = kv.options().block_size;
  c.tokens_by_tier.push_back(m.device_tokens);
  c.tokens_by_tier.insert(c.tokens_by_tier.end(), m.lower_tier_tokens.begin(), m.lower_tier_tokens.end());
  c.tokens_by_tier.resize(kv.num_lower_tiers() + 1, 0);
  c.load_seconds = kv.EstimateLoadSeconds(m);
  return c;
}

}  // namespace

bool Engine::LookupCache(std::vector<int32_t> tokens, std::string cache_salt,
                         std::function<void(const CacheMatch&)> done) {
  {
    // The loop lends the KV manager while it runs a forward pass or sleeps:
    // answer here rather than after the step (a router asking every
    // candidate would otherwise wait for the longest step among them).
    std::unique_lock<std::mutex> lock(kv_mu_);
    if (kv_shared_) {
      const CacheMatch c = MatchPrompt(*kv_, tokens, cache_salt);
      lock.unlock();
      done(c);
      return true;
    }
  }
  return Post([tokens = std::move(tokens), salt = std::move(cache_salt), done = std::move(done)](kvcache::KvManager& kv) {
    done(MatchPrompt(kv, tokens, salt));
  });
}

bool Engine::FlushCache(CacheFlush what, std::function<void(Result<kvcache::FlushResult>)> done) {
  return Post([what = std::move(what), done = std::move(done)](kvcache::KvManager& kv) {
    done(kv.Flush(what.device, what.lower, what.all_namespaces));
  });
}

void Engine::BeginDrain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
  stats_.draining = true;
}

int Engine::num_unfinished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return unfinished_;
}

EngineStats Engine::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s = stats_;
  s.rejected_queue_full = rejected_;
  s.draining = draining_;
  // Submitted since the last step: not in the snapshot yet, but queued.
  for (const Pending& p : inbox_) s.pending_prefill_tokens += static_cast<int64_t>(p.request.prompt.size());
  s.num_waiting = static_cast<int>(queued_);
  const int64_t since = step_since_ns_.load(std::memory_order_relaxed);
  if (since > 0) {
    const int64_t now =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
    s.step_elapsed_seconds = static_cast<double>(std::max<int64_t>(0, now - since)) * 1e-9;
  }
  return s;
}


void Engine::AddWaiting(Sequence* s) {
  auto pos = std::upper_bound(waiting_.begin(), waiting_.end(), s, [](const Sequence* a, const Sequence* b) {
    return Before(a->req.priority, a->order, b->req.priority, b->order);
  });
  waiting_.insert(pos, s);
}

void Engine::RemoveWaiting(Sequence* s) {
  auto it = std::find(waiting_.begin(), waiting_.end(), s);
  if (it == waiting_.end()) return;
  waiting_.erase(it);
  std::lock_guard<std::mutex> lock(mu_);
  --queued_;
}

void Engine::TakeInbox() {
  std::vector<Pending> inbox;
  std::vector<RequestId> cancels;
  std::vector<std::pair<RequestId, bool>> holds;
  std::vector<std::function<void(kvcache::KvManager&)>> tasks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox.swap(inbox_);
    cancels.swap(cancels_);
    holds.swap(holds_);
    tasks.swap(tasks_);
  }
  for (auto& task : tasks) task(*kv_);
  const int vocab = runner_->vocab_size();
  for (Pending& p : inbox) {
    auto seq = std::make_unique<Sequence>(p.id, std::move(p.request), std::move(p.sink), p.id.value(), vocab,
                                          *tokenizer_);
    seq->timings.arrival = p.arrival;
    Sequence* s = seq.get();
    seqs_.emplace(p.id.value(), std::move(seq));
    AddWaiting(s);  // already counted in queued_ by Submit
  }
  for (const auto& [id, held] : holds)
    if (auto it = seqs_.find(id.value()); it != seqs_.end()) it->second->held = held;
  for (RequestId id : cancels) {
    auto it = seqs_.find(id.value());
    if (it == seqs_.end()) continue;
    Finish(*it->second, FinishReason::kAbort, Status::Cancelled("request cancelled"));
  }
  const int64_t now = clock_->NowNanos();
  std::vector<Sequence*> late;
  for (auto& [_, s] : seqs_)
    if (s->req.deadline_nanos > 0 && now >= s->req.deadline_nanos) late.push_back(s.get());
  for (Sequence* s : late) Finish(*s, FinishReason::kAbort, Status::DeadlineExceeded("the request's deadline passed"));
}

void Engine::Emit(Sequence& s, bool finished, FinishReason reason, const Status& status) {
  RequestOutput out;
  out.id = s.id;
  out.token_ids.swap(s.new_tokens);
  out.text.swap(s.new_text);
  out.logprobs.swap(s.new_logprobs);
  out.finished = finished;
  out.finish_reason = reason;
  out.status = status;
  out.prompt_tokens = s.prompt_len;
  out.completion_tokens = s.generated;
  out.cached_tokens = s.cached_tokens;
  out.cached_tokens_by_tier = s.cached_by_tier;
  out.preemptions = s.preemptions;
  out.timings = s.timings;
  if (reason == FinishReason::kPaused)
    out.continuation = s.output.Save(std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(s.prompt_len)));
  s.sink(std::move(out));
}

void Engine::Finish(Sequence& s, FinishReason reason, Status status) {
  if (s.lookup != 0) kv_->CancelLookup(s.lookup);
  s.lookup = 0;
  if (s.in_kv) kv_->Free(s.id);
  s.in_kv = false;
  if (s.prefetched) --num_prefetching_;
  s.prefetched = false;
  s.loading = false;
  RemoveWaiting(&s);
  running_.erase(std::remove(running_.begin(), running_.end(), &s), running_.end());
  s.timings.finished = clock_->NowNanos();
  if (s.timings.first_token > 0)
    s.timings.decode_seconds = static_cast<double>(s.timings.finished - s.timings.first_token) * 1e-9;
  ++finished_by_reason_[std::string(FinishReasonName(reason))];
  Emit(s, /*finished=*/true, reason, status);
  seqs_.erase(s.id.value());  // destroys s
  std::lock_guard<std::mutex> lock(mu_);
  --unfinished_;
}

void Engine::Preempt(Sequence& s, std::vector<Planned>* plan) {
  STRATA_LOG_DEBUG("engine: preempting request {} ({} tokens computed)", s.id.value(), s.num_computed);
  if (s.in_kv) kv_->Free(s.id);
  s.in_kv = false;
  s.loading = false;
  s.num_computed = 0;
  running_.erase(std::remove(running_.begin(), running_.end(), &s), running_.end());
  plan->erase(std::remove_if(plan->begin(), plan->end(), [&](const Planned& p) { return p.seq == &s; }),
              plan->end());
  ++s.preemptions;
  ++preemptions_;
  AddWaiting(&s);
  std::lock_guard<std::mutex> lock(mu_);
  ++queued_;
}

bool Engine::EnsureBlocks(Sequence& s, int32_t positions, std::vector<Planned>* plan) {
  while (true) {
    auto r = kv_->Allocate(s.id, positions);
    if (!r) {
      Finish(s, FinishReason::kError, r.error());
      return false;
    }
    if (*r == kvcache::AllocOutcome::kAllocated) return true;
    if (DropPrefetch(nullptr)) continue;  // waiting requests give way to running ones
    // Lowest priority (largest value), latest arrival goes first.
    Sequence* victim = nullptr;
    for (Sequence* c : running_)
      if (victim == nullptr || Before(victim->req.priority, victim->order, c->req.priority, c->order)) victim = c;
    if (victim == nullptr) return false;
    Preempt(*victim, plan);
    if (victim == &s) return false;
  }
}

void Engine::OnReady(Sequence& s) {
  s.loading = false;
  s.num_computed = kv_->CachedTokens(s.id);
  if (s.cache_known) return;  // a resumed sequence keeps its first admission's figures
  s.cache_known = true;
  s.cached_tokens = s.num_computed;
  s.cached_by_tier.assign(tier_names_.size(), 0);
  const int32_t bs = kv_->options().block_size;
  for (int t : kv_->CachedBlockTiers(s.id))
    if (t >= 0 && static_cast<size_t>(t) < s.cached_by_tier.size()) s.cached_by_tier[static_cast<size_t>(t)] += bs;
}

bool Engine::Admit(int* budget, std::vector<Planned>* plan) {
  bool any = false;
  while (!waiting_.empty() && *budget > 0 && static_cast<int>(running_.size()) < options_.max_running) {
    Sequence* s = waiting_.front();
    const int32_t len = static_cast<int32_t>(s->tokens.size());
    int32_t start = 0;
    if (s->prefetched) {
      // Its prefix is already taken (maybe still loading): grow that table.
      start = std::min(kv_->CachedTokens(s->id), len - 1);
    } else {
      // The head waits for its lookup (at most lookup_timeout_seconds): the
      // queue stays in order, running requests go on. A head already refused
      // blocks keeps waiting for blocks on its last answer while a fresh one
      // is pending (the prefix is a hint: a block gone since is recomputed),
      // so requests behind it do not take the blocks it waits for.
      if (!LookedUp(*s)) {
        if (!s->blocked || s->match_step == 0) break;
        head_needs_blocks_ = true;
      }
      if (Status a = kv_->AddRequest(s->id, s->tokens, s->req.cache_salt, &s->match, s->req.cache_ttl_seconds); !a.ok()) {
        Finish(*s, FinishReason::kError, a);
        any = true;
        continue;
      }
      start = std::min(kv_->PrefixTokens(s->id), len - 1);
    }
    const int32_t chunk = s->Chunk(start, *budget);
    auto r = kv_->Allocate(s->id, start + chunk);
    // Prefetches of requests queued behind this one give way first.
    while (r && *r == kvcache::AllocOutcome::kNotNow && DropPrefetch(s)) r = kv_->Allocate(s->id, start + chunk);
    if (!r || *r == kvcache::AllocOutcome::kNotNow) {
      if (!r) {
        Finish(*s, FinishReason::kError, r.error());
        any = true;
        continue;
      }
      if (!s->prefetched) kv_->Free(s->id);  // a prefetch keeps its blocks while it waits
      s->blocked = true;
      head_needs_blocks_ = true;
      break;  // head of line waits for blocks
    }
    s->blocked = false;
    s->match_step = 0;  // used: a later wait asks again
    if (s->prefetched) {
      s->prefetched = false;
      --num_prefetching_;
      ++prefetches_used_;
    }
    s->in_kv = true;
    RemoveWaiting(s);
    running_.push_back(s);
    any = true;
    if (!s->ever_admitted) {
      s->ever_admitted = true;
      s->timings.scheduled = clock_->NowNanos();
      s->timings.queue_seconds = static_cast<double>(s->timings.scheduled - s->timings.arrival) * 1e-9;
      prompt_tokens_ += static_cast<uint64_t>(s->prompt_len);
    }
    if (!kv_->IsReady(s->id)) {
      s->loading = true;
      continue;
    }
    OnReady(*s);
    const int32_t n = s->Chunk(s->num_computed, *budget);
    if (!EnsureBlocks(*s, s->num_computed + n, plan)) continue;
    plan->push_back({s, n});
    *budget -= n;
  }
  return any;
}

bool Engine::DropPrefetch(const Sequence* keep) {
  for (auto it = waiting_.rbegin(); it != waiting_.rend(); ++it) {
    Sequence* s = *it;
    if (!s->prefetched || s == keep) continue;
    STRATA_LOG_DEBUG("engine: releasing the prefetch of waiting request {}", s->id.value());
    kv_->Free(s->id);
    s->in_kv = false;
    s->prefetched = false;
    s->prefetch_blocks = 0;
    --num_prefetching_;
    ++prefetches_released_;
    released_this_step_ = true;
    // Loads that already finished hold their blocks until polled.
    kv_->Poll();
    return true;
  }
  return false;
}

bool Engine::LookedUp(Sequence& s) {
  if (s.match_step == step_seq_) return true;
  if (s.lookup == 0) {
    const auto timeout = static_cast<int64_t>(options_.lookup_timeout_seconds * 1e9);
    s.lookup = kv_->SubmitLookup(s.tokens, s.req.cache_salt, clock_->NowNanos() + timeout);
  }
  if (kv_->TakeLookup(s.lookup, &s.match) == kvcache::LookupState::kPending) return false;
  s.lookup = 0;
  s.match_step = step_seq_;
  return true;
}

bool Engine::Prefetch() {
  const int max = options_.prefetch_max_requests;
  // Not in a step that had to take prefetched blocks back (no ping-pong).
  if (max <= 0 || kv_->num_lower_tiers() == 0 || num_prefetching_ >= max || released_this_step_) return false;
  const int32_t bs = kv_->options().block_size;
  int64_t held = 0;
  for (const Sequence* s : waiting_)
    if (s->prefetched) held += s->prefetch_blocks;
  bool any = false;
  int examined = 0;
  for (Sequence* s : waiting_) {
    if (num_prefetching_ >= max || examined >= 4 * max) break;
    // Blocks the head of the queue waits for are not handed to those behind it.
    if (head_needs_blocks_ && s != waiting_.front()) break;
    if (s->in_kv) continue;
    ++examined;
    if (!LookedUp(*s)) continue;  // its answer comes in a later step
    const kvcache::PrefixMatch& m = s->match;
    if (m.lower_tokens <= 0) continue;
    // Upper bound on the blocks it takes from the allocatable ones.
    const int32_t cost = m.total() / bs;
    const int32_t allocatable = kv_->device_pool().num_allocatable();
    const int64_t room = allocatable + held;
    if (static_cast<double>(held + cost) > options_.prefetch_max_block_share * static_cast<double>(room)) continue;
    // Leave one block per running sequence for its next step.
    if (allocatable - cost < static_cast<int32_t>(running_.size())) continue;
    if (!kv_->AddRequest(s->id, s->tokens, s->req.cache_salt, &m, s->req.cache_ttl_seconds).ok()) continue;
    s->match_step = 0;
    auto r = kv_->Allocate(s->id, 0);  // just the cached prefix; loads queued
    if (!r || *r != kvcache::AllocOutcome::kAllocated) {
      kv_->Free(s->id);
      continue;
    }
    s->in_kv = true;
    s->prefetched = true;
    s->prefetch_blocks = cost;
    held += cost;
    ++num_prefetching_;
    ++prefetches_started_;
    prefetched_blocks_ += static_cast<uint64_t>(m.lower_tokens / bs);
    any = true;
    STRATA_LOG_DEBUG("engine: request {} prefetches {} cached tokens while waiting", s->id.value(), m.total());
  }
  return any;
}

void Engine::AfterToken(Sequence& s, const float* logits) {
  TokenStep step = s.output.Next(logits);
  const int64_t now = clock_->NowNanos();
  if (s.timings.first_token == 0) {  // the first token this engine sampled
    s.timings.first_token = now;
    s.timings.prefill_seconds = static_cast<double>(now - s.timings.scheduled) * 1e-9;
  }
  s.timings.last_token = now;
  ++s.generated;
  ++generation_tokens_;
  s.tokens.push_back(step.sample.token);
  s.new_tokens.push_back(step.sample.token);
  s.new_text += step.text;
  if (s.want_logprobs) s.new_logprobs.push_back(std::move(step.sample));
  if (step.finish != FinishReason::kNone) return Finish(s, step.finish, Status::Ok());
  if (s.req.pause_after > 0 && s.generated >= s.req.pause_after) return Finish(s, FinishReason::kPaused, Status::Ok());
  Emit(s, /*finished=*/false, FinishReason::kNone, Status::Ok());
}

SchedulerOutput Engine::Schedule() {
  SchedulerOutput out;
  const size_t unfinished_before = seqs_.size();
  released_this_step_ = false;
  head_needs_blocks_ = false;
  ++step_seq_;
  TakeInbox();
  out.did_work = seqs_.size() != unfinished_before;
  kv_->Poll();
  std::vector<Planned> plan;
  int budget = options_.max_batch_tokens;
  // Loads that finished since the last step.
  for (Sequence* s : std::vector<Sequence*>(running_))
    if (s->loading && kv_->IsReady(s->id)) {
      OnReady(*s);
      out.did_work = true;
    }
  // 1. One decode token for every running sequence that has finished its prompt.
  const std::vector<Sequence*> snapshot = running_;
  auto still_running = [&](Sequence* s) {
    return std::find(running_.begin(), running_.end(), s) != running_.end();
  };
  for (Sequence* s : snapshot) {
    if (budget <= 0) break;
    if (!still_running(s) || s->loading || s->held || s->remaining() != 1) continue;
    if (!EnsureBlocks(*s, s->num_computed + 1, &plan)) continue;
    plan.push_back({s, 1});
    --budget;
  }
  // 2. Prompt chunks of running sequences still in prefill.
  for (Sequence* s : snapshot) {
    if (budget <= 0) break;
    if (!still_running(s) || s->loading || s->held || s->remaining() <= 1) continue;
    const int32_t n = s->Chunk(s->num_computed, budget);
    if (!EnsureBlocks(*s, s->num_computed + n, &plan)) continue;
    plan.push_back({s, n});
    budget -= n;
  }
  // 3. New requests.
  if (Admit(&budget, &plan)) out.did_work = true;
  // 3b. Waiting requests left over start loading their cached prefix.
  if (Prefetch()) out.did_work = true;

  out.entries.reserve(plan.size());
  out.batch.reserve(plan.size());
  for (const Planned& p : plan) {
    Sequence& s = *p.seq;
    out.entries.push_back({s.id, p.tokens});
    ForwardSeq f;
    f.tokens = std::span<const int32_t>(s.tokens.data() + s.num_computed, static_cast<size_t>(p.tokens));
    f.start_pos = s.num_computed;
    f.block_table = kv_->BlockTable(s.id);
    out.batch.push_back(f);
    (p.tokens > 1 ? out.prefill_tokens : out.decode_tokens) += p.tokens;
  }
  return out;
}

void Engine::Update(const SchedulerOutput& out, const Status& forward, const std::vector<float>& logits) {
  ++steps_;
  step_prefill_tokens_ += static_cast<uint64_t>(out.prefill_tokens);
  step_decode_tokens_ += static_cast<uint64_t>(out.decode_tokens);
  const size_t vocab = static_cast<size_t>(runner_->vocab_size());
  for (size_t i = 0; i < out.entries.size(); ++i) {
    auto it = seqs_.find(out.entries[i].id.value());
    if (it == seqs_.end()) continue;  // REQUIRES says it cannot: nothing runs between Schedule and Update
    Sequence& s = *it->second;
    if (!forward.ok()) {
      Finish(s, FinishReason::kError, forward);
      continue;
    }
    s.num_computed += out.entries[i].num_tokens;
    if (Status c = kv_->Commit(s.id, std::span<const int32_t>(s.tokens.data(), static_cast<size_t>(s.num_computed)));
        !c.ok())
      STRATA_LOG_WARN("engine: commit of request {} failed: {}", s.id.value(), c.ToString());
    if (s.req.on_computed) s.req.on_computed(s.id, s.num_computed);
    if (s.remaining() == 0) AfterToken(s, logits.data() + i * vocab);
  }
  if (forward.ok()) kv_->Poll();
}

Result<bool> Engine::Step() {
  const auto step_start = std::chrono::steady_clock::now();
  SchedulerOutput out = Schedule();
  if (out.empty()) {
    RefreshStats();
    return out.did_work;
  }
  const auto forward_start = std::chrono::steady_clock::now();
  step_since_ns_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(step_start.time_since_epoch()).count(),
                       std::memory_order_relaxed);
  // The forward pass does not touch the KV manager's books: lookups may
  // read them meanwhile (LookupCache).
  if (loop_kv_lock_ != nullptr) loop_kv_lock_->unlock();
  Status st = runner_->Forward(out.batch, &logits_);
  if (options_.step_time_factor > 1) {
    std::this_thread::sleep_for((std::chrono::steady_clock::now() - forward_start) * (options_.step_time_factor - 1));
  }
  if (loop_kv_lock_ != nullptr) loop_kv_lock_->lock();
  const auto forward_end = std::chrono::steady_clock::now();
  forward_nanos_ += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(forward_end - forward_start).count());
  if (!st.ok())
    STRATA_LOG_ERROR("engine: forward pass over {} sequences failed: {}", out.entries.size(), st.ToString());
  Update(out, st, logits_);
  step_since_ns_.store(0, std::memory_order_relaxed);
  if (st.ok()) {
    const auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - step_start).count();
    step_nanos_ += static_cast<uint64_t>(nanos);
    if (out.prefill_tokens >= 8 && nanos > 0) {
      const double sample = static_cast<double>(out.prefill_tokens) * 1e9 / static_cast<double>(nanos);
      prefill_rate_ = prefill_rate_ > 0 ? 0.7 * prefill_rate_ + 0.3 * sample : sample;
    } else if (out.prefill_tokens == 0 && out.decode_tokens > 0) {
      const double sample = static_cast<double>(nanos) * 1e-9;
      decode_step_s_ = decode_step_s_ > 0 ? 0.7 * decode_step_s_ + 0.3 * sample : sample;
    }
  }
  RefreshStats();
  if (!st.ok()) return st;
  return true;
}

void Engine::RefreshStats() {
  EngineStats st;
  st.num_running = static_cast<int>(running_.size());
  st.steps = steps_;
  st.step_nanos = step_nanos_;
  st.forward_nanos = forward_nanos_;
  st.step_prefill_tokens = step_prefill_tokens_;
  st.step_decode_tokens = step_decode_tokens_;
  st.prefill_tokens_per_s = prefill_rate_ > 0 ? prefill_rate_ : options_.calibrated_prefill_tokens_per_s;
  st.decode_step_seconds = decode_step_s_ > 0 ? decode_step_s_ : options_.calibrated_decode_step_seconds;
  st.calibrated_prefill_tokens_per_s = options_.calibrated_prefill_tokens_per_s;
  st.calibrated_decode_step_seconds = options_.calibrated_decode_step_seconds;
  for (const Sequence* s : waiting_) st.pending_prefill_tokens += s->remaining();
  for (const Sequence* s : running_) st.pending_prefill_tokens += std::max(0, s->prompt_len - s->num_computed);
  st.preemptions = preemptions_;
  st.prompt_tokens = prompt_tokens_;
  st.generation_tokens = generation_tokens_;
  st.finished_by_reason = finished_by_reason_;
  st.prefetches_started = prefetches_started_;
  st.prefetched_blocks = prefetched_blocks_;
  st.prefetches_used = prefetches_used_;
  st.prefetches_released = prefetches_released_;
  st.num_prefetching = num_prefetching_;
  st.kv = kv_->stats();
  st.device_blocks_in_use = st.kv.device_pool.in_use;
  const uint64_t block_bytes = kv_->options().block_bytes;
  TierUsage dev;
  dev.name = tier_names_[0];
  dev.kind = tier_kinds_[0];
  dev.capacity_bytes = static_cast<uint64_t>(kv_->options().num_device_blocks) * block_bytes;
  dev.used_bytes = static_cast<uint64_t>(st.kv.device_pool.in_use) * block_bytes;
  dev.usage_ratio = kv_->options().num_device_blocks > 0
                        ? static_cast<double>(st.kv.device_pool.in_use) / kv_->options().num_device_blocks
                        : 0.0;
  st.tiers.push_back(dev);
  for (size_t i = 0; i < kv_->num_lower_tiers(); ++i) {
    const kvcache::StoreStats ss = kv_->lower_store(i).stats();
    TierUsage t;
    t.name = tier_names_[i + 1];
    t.kind = tier_kinds_[i + 1];
    t.capacity_bytes = ss.capacity_bytes;
    t.used_bytes = ss.used_bytes;
    t.usage_ratio = ss.capacity_bytes > 0 ? static_cast<double>(ss.used_bytes) / ss.capacity_bytes : 0.0;
    st.tiers.push_back(std::move(t));
  }
  std::lock_guard<std::mutex> lock(mu_);
  st.num_waiting = queued_;
  st.draining = draining_;
  st.rejected_queue_full = rejected_;
  stats_ = std::move(st);
}

void Engine::Start() {
  if (loop_running_.exchange(true)) return;
  loop_ = std::thread([this] { Loop(); });
}

void Engine::Loop() {
  std::unique_lock<std::mutex> kv_lock(kv_mu_);
  kv_shared_ = true;
  loop_kv_lock_ = &kv_lock;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;
    }
    auto r = Step();
    if (!r) {
      STRATA_LOG_ERROR("engine step failed: {}", r.error().ToString());
      continue;
    }
    if (*r) continue;
    // Idle: sleep until new work arrives; poll tier I/O now and then (loads
    // in flight: often; otherwise write-throughs settle within 10 ms).
    // Held requests wait for SetHeld (which wakes the loop), not for a poll.
    bool loading = false, active = false;
    for (const Sequence* s : running_) {
      loading |= s->loading;
      active |= !s->held;
    }
    kv_lock.unlock();
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait_for(lock, loading || active ? std::chrono::microseconds(200) : std::chrono::microseconds(10000),
                     [&] { return stopping_ || !inbox_.empty() || !cancels_.empty() || !holds_.empty() || !tasks_.empty(); });
    }
    kv_lock.lock();
  }
  // From here on (Stop's final aborts run on its caller's thread) lookups
  // are posted, and refused.
  kv_shared_ = false;
  loop_kv_lock_ = nullptr;
}

void Engine::AbortAll(const Status& why) {
  TakeInbox();
  std::vector<Sequence*> all;
  for (auto& [_, s] : seqs_) all.push_back(s.get());
  for (Sequence* s : all) Finish(*s, FinishReason::kAbort, why);
  kv_->Poll();
  RefreshStats();
}

void Engine::Stop(double grace_seconds) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    draining_ = true;
  }
  using Wall = std::chrono::steady_clock;
  const auto deadline = Wall::now() + std::chrono::duration_cast<Wall::duration>(
                                          std::chrono::duration<double>(std::max(0.0, grace_seconds)));
  if (loop_running_.load()) {
    while (num_unfinished() > 0 && Wall::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      wake_.notify_all();
    }
    if (loop_.joinable()) loop_.join();
    loop_running_ = false;
  } else {
    while (num_unfinished() > 0 && Wall::now() < deadline) {
      auto r = Step();
      if (r && !*r) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  // This thread is now the only one stepping.
  AbortAll(Status::Unavailable("the server is shutting down"));
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
}

}  // namespace strata::scheduler
