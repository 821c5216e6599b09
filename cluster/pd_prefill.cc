#include "cluster/pd_prefill.h"

#include <nlohmann/json.hpp>

#include "cluster/kv_wire.h"
#include "common/logging.h"

#include <xxhash.h>

namespace strata::cluster {

namespace {

// Adds event `ev` of a stream to the merged output `m`.
void Merge(scheduler::RequestOutput& m, scheduler::RequestOutput&& ev) {
  m.id = ev.id;
  m.token_ids.insert(m.token_ids.end(), ev.token_ids.begin(), ev.token_ids.end());
  m.text += ev.text;
  m.logprobs.insert(m.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
  m.finished = ev.finished;
  m.finish_reason = ev.finish_reason;
  m.status = ev.status;
  m.prompt_tokens = ev.prompt_tokens;
  m.completion_tokens = ev.completion_tokens;
  m.cached_tokens = ev.cached_tokens;
  m.cached_tokens_by_tier = ev.cached_tokens_by_tier;
  m.preemptions = ev.preemptions;
  m.timings = ev.timings;
  if (ev.continuation) m.continuation = std::move(ev.continuation);
}
}  // namespace

PdPrefill::PdPrefill(PostFn post, scheduler::EngineClient* engine, kvcache::KvManager* kv,
                     transfer::TransferEngine* xfer, SegmentId device_segment, uint64_t block_bytes, int block_size,
                     std::chrono::milliseconds write_timeout, std::chrono::milliseconds grants_timeout)
    : post_(std::move(post)),
      engine_(engine),
      kv_(kv),
      xfer_(xfer),
      segment_(device_segment),
      block_bytes_(block_bytes),
      block_size_(block_size),
      write_timeout_(write_timeout),
      grants_timeout_(grants_timeout) {
  worker_ = std::thread([this] { WorkerLoop(); });
}

PdPrefill::~PdPrefill() { Stop(); }

void PdPrefill::Stop() {
  std::map<uint64_t, std::shared_ptr<Flight>> waiting;
  {
    std::lock_guard lock(mu_);
    if (stop_) return;
    waiting.swap(waiting_);
  }
  // The engine has stopped (the server stops it first): nothing else
  // touches these flights now. Those still waiting for grants answer.
  for (auto& [key, f] : waiting) Expire(f, "the instance is stopping");
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

PdPrefillStats PdPrefill::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

bool PdPrefill::Handle(const std::string& method, const std::string& path, const std::string& body, ReplyFn reply,
                       std::function<void(std::function<void()>)> on_close) {
  if (method == "POST" && path == "/internal/pd/grants") return Grants(body, reply), true;
  if (method != "POST" || path != "/internal/pd/prefill") return false;
  if (draining_.load()) return reply(503, ErrorJson("the instance is draining: prefill elsewhere")), true;
  auto req = PrefillRequestFromJson(body);
  if (!req.ok()) return reply(400, ErrorJson(req.error().message())), true;
  auto f = std::make_shared<Flight>();
  f->decode = std::move(req->decode);
  f->request = std::move(req->request);
  f->reply = std::move(reply);
  f->grants_key = req->grants_key;
  std::optional<GrantsMessage> came;
  if (f->grants_key != 0) {
    // The grants follow (Grants): until then blocks are only counted.
    std::lock_guard lock(mu_);
    if (auto it = early_.find(f->grants_key); it != early_.end()) {
      came = std::move(it->second.first);  // they overtook this request
      early_.erase(it);
    } else if (!waiting_.emplace(f->grants_key, f).second) {
      return f->reply(409, ErrorJson("a prefill with grants key " + std::to_string(f->grants_key) + " is running")),
             true;
    } else {
      f->grants_ready = false;
    }
  }
  if (came) {
    if (came->decode) f->decode = std::move(*came->decode);
    OpenGrants(f->decode, &f->remote, &f->open_error);
  } else if (f->grants_key == 0) {
    // Open the grants now (blocking round trips), so that blocks can go out
    // from the engine thread as soon as they are full. A failure is answered
    // at the end: nothing lands, the decode instance recomputes.
    OpenGrants(f->decode, &f->remote, &f->open_error);
  }
  scheduler::EngineRequest run = f->request;
  run.pause_after = static_cast<int>(run.continuation.generated.size()) + 1;
  run.on_computed = [this, f](RequestId id, int32_t computed) {  // engine thread
    // Submit may not have returned yet on the lane worker: the id comes
    // with the call, so no block waits for it.
    uint64_t expected = 0;
    f->engine_id.compare_exchange_strong(expected, id.value());
    f->computed = computed;
    SendFilled(*f, id);
    const auto prompt_len = static_cast<int32_t>(f->request.prompt.size());
    // The prompt is done: pin its blocks while the request still holds them.
    if (computed >= prompt_len && f->pin == 0) (void)Pin(*f);
  };
  auto merged = std::make_shared<scheduler::RequestOutput>();
  auto sink = [this, f, merged](scheduler::RequestOutput&& ev) {  // engine thread
    if (observer_) observer_(ev);
    const bool finished = ev.finished;
    Merge(*merged, std::move(ev));
    if (!finished) return;
    f->answer.output = std::move(*merged);
    if (f->answer.output.finish_reason != FinishReason::kPaused) {
      // Ended at its first token (a stop, the length, an error): nothing to
      // hand over; the worker still waits for writes already queued.
      if (f->answer.output.finish_reason != FinishReason::kAbort) {
        std::lock_guard lock(mu_);
        ++stats_.finished_early;
      }
      f->outcome = 1;
      return Queue(f);
    }
    if (!post_([this, f](kvcache::KvManager&) { HandOver(f); })) {
      f->outcome = 2;
      Queue(f);
    }
  };
  auto id = engine_->Submit(std::move(run), sink);
  if (!id.ok()) {
    if (f->grants_key != 0) {
      std::lock_guard lock(mu_);
      waiting_.erase(f->grants_key);
    }
    f->reply(id.error().code() == StatusCode::kInvalidArgument ? 400 : 503, ErrorJson(id.error().message()));
    return true;
  }
  f->engine_id.store(id->value());
  if (on_close) {
    std::weak_ptr<Flight> weak = f;
    on_close([this, weak] {
      auto fl = weak.lock();
      if (!fl) return;
      {
        std::lock_guard lock(mu_);
        ++stats_.abandoned;
      }
      engine_->Cancel(RequestId(fl->engine_id.load()));  // its final event ends the flight as usual
    });
  }
  return true;
}

void PdPrefill::Send(Flight& f, int32_t end, const std::function<uint64_t(int32_t)>& block_of) {
  if (f.remote.empty() || f.submit_failed) return;
  const int32_t held = f.decode.held_blocks;
  end = std::min(end, held + static_cast<int32_t>(f.remote.size()));  // one grant per block to write
  f.next = std::max(f.next, held);
  std::vector<transfer::TransferOp> ops;
  for (int32_t i = f.next; i < end; ++i) {
    const uint64_t b = block_of(i);
    const Region local{segment_, b * block_bytes_, block_bytes_};
    auto bytes = kv_->segments().Resolve(local);
    if (!bytes.ok()) break;  // (the device segment always resolves)
    f.checksums.push_back(XXH3_64bits(bytes->data(), bytes->size()));
    transfer::TransferOp op;
    op.kind = transfer::OpKind::kWrite;
    op.local = local;
    op.remote = f.remote[static_cast<size_t>(i - held)];
    ops.push_back(op);
    f.next = i + 1;
  }
  if (ops.empty()) return;
  auto batch = xfer_->Submit(std::move(ops), transfer::Clock::now() + write_timeout_);
  if (batch.ok()) {
    f.batches.push_back(*batch);
  } else {
    STRATA_LOG_WARN("pd prefill: writes to {} not queued: {}", f.decode.transfer, batch.error().message());
    f.submit_failed = true;  // nothing after this lands
  }
}

bool PdPrefill::Pin(Flight& f) {
  uint64_t pin;
  {
    std::lock_guard lock(mu_);
    pin = next_pin_++;
  }
  kvcache::KvManager::Reservation r;
  auto got = kv_->Reserve(pin, f.request.prompt, f.request.cache_salt, INT64_MAX, &r);
  if (!got.ok() || *got != kvcache::AllocOutcome::kAllocated) return false;
  (void)kv_->CompleteReservation(pin, 0);  // frees the blocks it took fresh (none while all are named)
  f.pin = pin;
  return true;
}

void PdPrefill::HandOver(const std::shared_ptr<Flight>& f) {
  {
    std::lock_guard lock(mu_);
    ++stats_.prefills;
  }
  // Pinned when the prompt was done (else now: the blocks the request just
  // released are still named); send those not sent yet.
  if (f->pin != 0 || Pin(*f)) SendPinned(*f);
  if (!f->grants_ready) {
    // The grants are still to come: ApplyGrants (or Expire) answers.
    f->handed_over = true;
    std::lock_guard lock(mu_);
    f->deadline = std::chrono::steady_clock::now() + grants_timeout_;
    cv_.notify_all();
    return;
  }
  Queue(f);
}

void PdPrefill::OpenGrants(const ReserveReply& decode, std::vector<transfer::RemoteHandle>* remote, Status* error) {
  if (decode.grants.empty()) return;
  auto peer = xfer_->Connect(decode.transfer);
  if (!peer.ok()) *error = peer.error();
  for (size_t i = 0; error->ok() && i < decode.grants.size(); ++i) {
    auto h = xfer_->OpenGrant(*peer, decode.grants[i]);
    if (!h.ok()) *error = h.error();
    else remote->push_back(*h);
  }
  if (!error->ok()) remote->clear();
}

void PdPrefill::Grants(const std::string& body, const ReplyFn& reply) {
  auto m = GrantsMessageFromJson(body);
  if (!m.ok()) return reply(400, ErrorJson(m.error().message()));
  std::shared_ptr<Flight> f;
  {
    std::lock_guard lock(mu_);
    auto it = waiting_.find(m->key);
    if (it == waiting_.end()) {
      // Before their prefill request (or after it ended: then they lapse).
      early_[m->key] = {std::move(*m), std::chrono::steady_clock::now() + grants_timeout_};
      cv_.notify_all();
      return reply(202, "{}");
    }
    f = std::move(it->second);
    waiting_.erase(it);
  }
  std::vector<transfer::RemoteHandle> remote;
  Status open_error;
  if (m->decode) OpenGrants(*m->decode, &remote, &open_error);
  auto apply = [this, f, decode = m->decode, remote = std::move(remote), open_error](kvcache::KvManager&) mutable {
    ApplyGrants(f, decode, std::move(remote), open_error);
  };
  if (!post_(std::move(apply))) return reply(503, ErrorJson("the engine is stopping"));
  reply(200, "{}");
}

void PdPrefill::ApplyGrants(const std::shared_ptr<Flight>& f, const std::optional<ReserveReply>& decode,
                            std::vector<transfer::RemoteHandle> remote, const Status& open_error) {
  if (f->queued || f->grants_ready) return;  // it ended at its first token (or gave up waiting) meanwhile
  f->grants_ready = true;
  if (decode) {
    f->decode = *decode;
    f->remote = std::move(remote);
    f->open_error = open_error;
  }
  if (f->handed_over) {
    if (f->pin != 0) SendPinned(*f);
    return Queue(f);
  }
  // Still computing: what is full goes now, the rest from on_computed.
  if (f->computed > 0) SendFilled(*f, RequestId(f->engine_id.load()));
}

void PdPrefill::SendFilled(Flight& f, RequestId id) {
  const auto table = kv_->BlockTable(id);
  const int32_t full = std::min(f.computed / block_size_, static_cast<int32_t>(table.size()));
  const uint64_t before = f.checksums.size();
  Send(f, std::min(full, f.decode.blocks), [&table](int32_t i) { return static_cast<uint64_t>(table[i]); });
  // Overlapped: queued while the rest of the prompt is still to compute.
  if (f.computed < static_cast<int32_t>(f.request.prompt.size())) f.early += f.checksums.size() - before;
}

void PdPrefill::SendPinned(Flight& f) {
  const kvcache::KvManager::Reservation* r = kv_->reservation(f.pin);
  const int32_t have = r->held_blocks;  // computed here and still named
  Send(f, std::min(have, f.decode.blocks), [r](int32_t i) { return r->blocks[static_cast<size_t>(i)].value(); });
}

void PdPrefill::Expire(const std::shared_ptr<Flight>& f, const std::string& why) {
  if (f->queued || f->grants_ready) return;
  f->grants_ready = true;
  f->open_error = Status::DeadlineExceeded("no grants: " + why);
  if (f->handed_over) Queue(f);
}

void PdPrefill::Queue(std::shared_ptr<Flight> f) {
  f->queued = true;
  std::lock_guard lock(mu_);
  done_.push_back(std::move(f));
  cv_.notify_all();
}

void PdPrefill::Finish(Flight& f) {
  // Every queued write is waited for (the transfer engine keeps a batch's
  // result until then), whatever the outcome.
  int32_t written = 0;
  Status failed = f.open_error;
  bool broken = false;
  for (uint64_t b : f.batches) {
    const transfer::BatchResult res = xfer_->Wait(b);
    for (const Status& s : res.ops) {
      if (!broken && s.ok()) {
        ++written;
      } else {
        broken = true;
      }
    }
    if (!res.status.ok() && failed.ok()) failed = res.status;
  }
  if (f.submit_failed && failed.ok()) failed = Status::Unavailable("writes not queued");
  const auto wanted = static_cast<int32_t>(f.decode.grants.size());
  if (!failed.ok() || written < std::min<int32_t>(wanted, static_cast<int32_t>(f.checksums.size())))
    STRATA_LOG_WARN("pd prefill: {} of {} blocks reached {}: {}", written, wanted, f.decode.transfer,
                    failed.ok() ? std::string("a write failed") : failed.message());
  {
    std::lock_guard lock(mu_);
    if (f.outcome == 0) stats_.blocks_written += static_cast<uint64_t>(written);
    stats_.blocks_early += f.early;
    if (f.outcome == 0) stats_.bytes_written += static_cast<uint64_t>(written) * block_bytes_;
    if (!failed.ok() || broken) ++stats_.write_failures;
  }
  if (f.grants_key != 0) {
    std::lock_guard lock(mu_);
    auto it = waiting_.find(f.grants_key);
    if (it != waiting_.end() && it->second.get() == &f) waiting_.erase(it);  // ended before its grants came
  }
  if (f.pin != 0) post_([pin = f.pin](kvcache::KvManager& kv) { kv.ReleaseReservation(pin); });
  if (f.outcome == 2) return f.reply(503, ErrorJson("the engine is stopping"));
  f.answer.blocks_written = f.outcome == 0 ? written : 0;  // ended at its first token: nothing to decode
  f.answer.checksums.assign(f.checksums.begin(), f.checksums.begin() + f.answer.blocks_written);
  for (kvcache::TierKind k : engine_->tier_kinds()) f.answer.tier_kinds.emplace_back(kvcache::TierKindName(k));
  f.reply(200, PrefillReplyToJson(f.answer));
}

void PdPrefill::WorkerLoop() {
  using Clock = std::chrono::steady_clock;
  std::unique_lock lock(mu_);
  while (true) {
    // Handed-over flights whose grants did not come in time stop waiting
    // (on the engine thread, which owns them).
    Clock::time_point next = Clock::time_point::max();
    const Clock::time_point now = Clock::now();
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      const Clock::time_point d = it->second->deadline;
      if (d == Clock::time_point{} || d > now) {
        if (d != Clock::time_point{}) next = std::min(next, d);
        ++it;
        continue;
      }
      std::shared_ptr<Flight> f = std::move(it->second);
      it = waiting_.erase(it);
      const std::string why = "they did not come within " + std::to_string(grants_timeout_.count()) + " ms";
      auto expire = [this, f, why](kvcache::KvManager&) { Expire(f, why); };
      lock.unlock();
      if (!post_(std::move(expire))) STRATA_LOG_WARN("pd prefill: the engine stopped while a prefill waited for grants");
      lock.lock();
      it = waiting_.begin();  // the map may have changed meanwhile
    }
    std::erase_if(early_, [&](const auto& e) { return e.second.second <= now; });
    for (const auto& e : early_) next = std::min(next, e.second.second);
    if (done_.empty() && !stop_) {
      cv_.wait_until(lock, next);
      continue;
    }
    if (done_.empty()) break;  // stopping, nothing left
    std::shared_ptr<Flight> f = std::move(done_.front());
    done_.pop_front();
    lock.unlock();
    Finish(*f);
    lock.lock();
  }
}

}  // namespace strata::cluster
