#include "scheduler/cached_generate.h"

#include <chrono>
#include <thread>

namespace strata::scheduler {

namespace {

// Frees the request on every path out of CachedGenerate.
class RequestGuard {
 public:
  RequestGuard(kvcache::KvManager& kv, RequestId id) : kv_(kv), id_(id) {}
  ~RequestGuard() {
    kv_.Poll();
    kv_.Free(id_);
  }
  RequestGuard(const RequestGuard&) = delete;
  RequestGuard& operator=(const RequestGuard&) = delete;

 private:
  kvcache::KvManager& kv_;
  RequestId id_;
};

}  // namespace

Result<CachedGenerateOutput> CachedGenerate(ForwardPass& engine, kvcache::KvManager& kv,
                                            const Tokenizer& tokenizer,
                                            std::span<const int32_t> prompt,
                                            const GenerateOptions& options,
                                            const CachedGenerateOptions& cache,
                                            const std::function<void(std::string_view)>& on_text) {
  if (kv.options().block_size != engine.kv_layout().block_size)
    return Status::InvalidArgument(
        "kv manager block size " + std::to_string(kv.options().block_size) +
        " differs from the engine's " + std::to_string(engine.kv_layout().block_size));
  STRATA_ASSIGN_OR_RETURN(int max_tokens,
                          ResolveMaxTokens(static_cast<int>(prompt.size()), options.max_tokens,
                                           engine.context_length()));
  const RequestId id = cache.request_id;
  STRATA_RETURN_IF_ERROR(kv.AddRequest(id, prompt, cache.cache_salt));
  RequestGuard guard(kv, id);

  const int32_t total = static_cast<int32_t>(prompt.size()) + max_tokens;
  STRATA_ASSIGN_OR_RETURN(kvcache::AllocOutcome got, kv.Allocate(id, total));
  if (got == kvcache::AllocOutcome::kNotNow)
    return Status::ResourceExhausted("the sequence needs " + std::to_string(total) +
                                     " tokens of KV blocks, more than the device pool of " +
                                     std::to_string(kv.options().num_device_blocks) +
                                     " blocks can supply");

  // Loads from host/disk complete asynchronously; nothing else runs here, so
  // poll until they are in (a failed load only lowers CachedTokens).
  using WallClock = std::chrono::steady_clock;
  const auto wait_start = WallClock::now();
  while (!kv.IsReady(id)) {
    if (kv.Poll() == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (std::chrono::duration<double>(WallClock::now() - wait_start).count() >
        cache.load_timeout_seconds)
      return Status::Unavailable("KV cache loads did not complete within " +
                                 std::to_string(cache.load_timeout_seconds) + " s");
  }
  CachedGenerateOutput out;
  out.load_wait_seconds = std::chrono::duration<double>(WallClock::now() - wait_start).count();
  out.cached_tokens = kv.CachedTokens(id);
  out.block_tiers = kv.CachedBlockTiers(id);
  const size_t tiers = kv.num_lower_tiers() + 1;
  out.tier_hit_tokens.assign(tiers, 0);
  for (size_t t = 0; t < tiers; ++t) {
    out.tier_names.emplace_back(kv.tier_name(static_cast<int>(t)));
    out.tier_kinds.push_back(kv.tier_kind(static_cast<int>(t)));
  }
  for (int t : out.block_tiers)
    out.tier_hit_tokens[static_cast<size_t>(t)] += kv.options().block_size;

  SequenceKv seq;
  seq.block_table = kv.BlockTable(id);
  seq.cached_tokens = out.cached_tokens;
  seq.after_step = [&kv, id](std::span<const int32_t> with_kv) {
    Status s = kv.Commit(id, with_kv);
    kv.Poll();  // settle finished write-throughs between steps
    return s;
  };
  STRATA_ASSIGN_OR_RETURN(out.gen,
                          GenerateWithKv(engine, tokenizer, prompt, options, seq, on_text));
  return out;
}

}  // namespace strata::scheduler
