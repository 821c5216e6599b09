#include "cluster/pd_prefill.h"

#include <nlohmann/json.hpp>

#include "common/logging.h"

#include <xxhash.h>

namespace strata::cluster {

namespace {
std::string ErrorBody(const std::string& message) { return nlohmann::json{{"error", message}}.dump(); }

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

PdPrefill::PdPrefill(PostFn post, scheduler::EngineClient* engine, transfer::TransferEngine* xfer,
                     SegmentId device_segment, uint64_t block_bytes, std::chrono::milliseconds write_timeout)
    : post_(std::move(post)),
      engine_(engine),
      xfer_(xfer),
      segment_(device_segment),
      block_bytes_(block_bytes),
      write_timeout_(write_timeout) {
  worker_ = std::thread([this] { WorkerLoop(); });
}

PdPrefill::~PdPrefill() { Stop(); }

void PdPrefill::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

PdPrefillStats PdPrefill::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

bool PdPrefill::Handle(const std::string& method, const std::string& path, const std::string& body, ReplyFn reply) {
  if (method != "POST" || path != "/internal/pd/prefill") return false;
  auto req = PrefillRequestFromJson(body);
  if (!req.ok()) return reply(400, ErrorBody(req.error().message())), true;
  scheduler::EngineRequest run = req->request;
  run.pause_after = static_cast<int>(run.continuation.generated.size()) + 1;
  auto merged = std::make_shared<scheduler::RequestOutput>();
  auto sink = [this, merged, request = req->request, decode = req->decode, reply](scheduler::RequestOutput&& ev) {
    const bool finished = ev.finished;
    Merge(*merged, std::move(ev));
    if (!finished) return;
    PrefillReply answer;
    answer.output = std::move(*merged);
    if (answer.output.finish_reason != FinishReason::kPaused) {
      // Ended at its first token (a stop, the length, an error): nothing to hand over.
      {
        std::lock_guard lock(mu_);
        ++stats_.finished_early;
      }
      return reply(200, PrefillReplyToJson(answer));
    }
    // The sink runs on the engine thread: the KV manager may be used here.
    const bool posted = post_([this, request, decode, answer = std::move(answer), reply](kvcache::KvManager& kv) {
      HandOver(kv, request, decode, answer, reply);
    });
    if (!posted) reply(503, ErrorBody("the engine is stopping"));
  };
  auto id = engine_->Submit(std::move(run), sink);
  if (!id.ok())
    reply(id.error().code() == StatusCode::kInvalidArgument ? 400 : 503, ErrorBody(id.error().message()));
  return true;
}

void PdPrefill::HandOver(kvcache::KvManager& kv, const scheduler::EngineRequest& request, const ReserveReply& decode,
                         PrefillReply answer, ReplyFn reply) {
  Job job;
  {
    std::lock_guard lock(mu_);
    ++stats_.prefills;
    job.pin = next_pin_++;
  }
  // Pin the blocks the request just computed (named in this pool: they are
  // all held) until the writes are done.
  kvcache::KvManager::Reservation r;
  auto got = kv.Reserve(job.pin, request.prompt, request.cache_salt, INT64_MAX, &r);
  if (got.ok() && *got == kvcache::AllocOutcome::kAllocated) {
    const auto have = static_cast<int32_t>(r.held_blocks);  // computed here and still named
    for (int32_t i = decode.held_blocks; i < std::min(have, decode.blocks); ++i) {
      const uint64_t b = r.blocks[static_cast<size_t>(i)].value();
      auto bytes = kv.segments().Resolve(Region{segment_, b * block_bytes_, block_bytes_});
      if (!bytes.ok()) break;  // (the device segment always resolves)
      job.local_blocks.push_back(b);
      job.checksums.push_back(XXH3_64bits(bytes->data(), bytes->size()));
    }
    (void)kv.CompleteReservation(job.pin, 0);  // frees the blocks it took fresh (none when all are held)
  } else {
    job.pin = 0;  // nothing pinned: nothing sent (the decode instance recomputes)
  }
  job.decode = decode;
  job.answer = std::move(answer);
  job.reply = std::move(reply);
  std::lock_guard lock(mu_);
  if (stop_) {
    if (job.pin != 0) kv.ReleaseReservation(job.pin);
    job.reply(503, ErrorBody("the instance is shutting down"));
    return;
  }
  jobs_.push_back(std::move(job));
  cv_.notify_all();
}

void PdPrefill::Write(Job& job) {
  int32_t written = 0;
  Status failed;
  if (!job.local_blocks.empty()) {
    auto peer = xfer_->Connect(job.decode.transfer);
    std::vector<transfer::TransferOp> ops;
    if (!peer.ok()) failed = peer.error();
    for (size_t i = 0; failed.ok() && i < job.local_blocks.size(); ++i) {
      auto h = xfer_->OpenGrant(*peer, job.decode.grants[i]);
      if (!h.ok()) {
        failed = h.error();
        break;
      }
      transfer::TransferOp op;
      op.kind = transfer::OpKind::kWrite;
      op.local = Region{segment_, job.local_blocks[i] * block_bytes_, block_bytes_};
      op.remote = *h;
      ops.push_back(op);
    }
    if (!ops.empty()) {
      auto batch = xfer_->Submit(ops, transfer::Clock::now() + write_timeout_);
      if (!batch.ok()) {
        failed = batch.error();
      } else {
        const transfer::BatchResult res = xfer_->Wait(*batch);
        while (written < static_cast<int32_t>(res.ops.size()) && res.ops[static_cast<size_t>(written)].ok()) ++written;
        if (!res.status.ok()) failed = res.status;
      }
    }
  }
  if (!failed.ok())
    STRATA_LOG_WARN("pd prefill: {} of {} blocks reached {}: {}", written, job.local_blocks.size(),
                    job.decode.transfer, failed.message());
  {
    std::lock_guard lock(mu_);
    stats_.blocks_written += static_cast<uint64_t>(written);
    stats_.bytes_written += static_cast<uint64_t>(written) * block_bytes_;
    if (!failed.ok()) ++stats_.write_failures;
  }
  if (job.pin != 0) post_([pin = job.pin](kvcache::KvManager& kv) { kv.ReleaseReservation(pin); });
  job.answer.blocks_written = written;
  job.answer.checksums.assign(job.checksums.begin(), job.checksums.begin() + written);
  job.reply(200, PrefillReplyToJson(job.answer));
}

void PdPrefill::WorkerLoop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) break;  // stopping, nothing left
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    Write(job);
    lock.lock();
  }
}

}  // namespace strata::cluster
