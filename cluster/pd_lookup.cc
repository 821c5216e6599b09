#include "cluster/pd_lookup.h"

#include "cluster/kv_wire.h"
#include "cluster/pd_wire.h"

namespace strata::cluster {

bool HandlePdLookup(scheduler::EngineClient* engine, const std::string& method, const std::string& path,
                    const std::string& body, const ReplyFn& reply) {
  if (path == "/internal/pd/status") {
    if (method != "GET") {
      reply(405, ErrorJson("GET only"));
    } else {
      reply(200, EngineStatusToJson(engine->Stats()));
    }
    return true;
  }
  if (path != "/internal/pd/lookup") return false;
  if (method != "POST") {
    reply(405, ErrorJson("POST only"));
    return true;
  }
  auto q = LookupRequestFromJson(body);
  if (!q) {
    reply(400, ErrorJson(q.error().message()));
    return true;
  }
  const scheduler::EngineStats stats = engine->Stats();
  const bool asked = engine->LookupCache(
      std::move(q->prompt), std::move(q->cache_salt), [reply, stats](const scheduler::CacheMatch& m) {
        LookupReply a;
        a.cached_tokens = m.cached_tokens;
        a.device_cached_tokens = m.tokens_by_tier.empty() ? 0 : m.tokens_by_tier[0];
        a.pending_prefill_tokens = stats.pending_prefill_tokens;
        a.prefill_tokens_per_s = stats.prefill_tokens_per_s;
        a.decode_step_seconds = stats.decode_step_seconds;
        a.running = stats.num_running;
        a.waiting = stats.num_waiting;
        a.load_seconds = m.load_seconds;
        a.step_elapsed_seconds = stats.step_elapsed_seconds;
        const auto& pool = stats.kv.device_pool;
        a.device_free_tokens = static_cast<int64_t>(pool.num_blocks - pool.in_use) * m.block_size;
        a.device_tokens = static_cast<int64_t>(pool.num_blocks) * m.block_size;
        reply(200, LookupReplyToJson(a));
      });
  if (!asked) reply(503, ErrorJson("the engine is stopping"));
  return true;
}

}  // namespace strata::cluster
