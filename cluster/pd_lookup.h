#pragma once
// POST /internal/pd/lookup on any instance of a cluster (cluster/pd_wire.h):
// how much of a prompt the instance holds (any tier, and in its device
// pool), its queue of prompt tokens still to compute and its recent prefill
// rate, from EngineClient::LookupCache and Stats. A router's routing policy
// (scheduler/router.h) reads it.
//
// Thread-safety: any thread; the answer is sent from the engine's delivery
// thread.

#include <string>

#include "cluster/kv_holder.h"
#include "scheduler/engine_client.h"

namespace strata::cluster {

// False for another path (nothing sent). 400 for a bad body, 503 when the
// engine is stopping. `engine` outlives the call.
bool HandlePdLookup(scheduler::EngineClient* engine, const std::string& method, const std::string& path,
                    const std::string& body, const ReplyFn& reply);

}  // namespace strata::cluster
