#pragma once
// The KV cache stack behind a command that runs the model (generate, serve):
// the device pool the backend allocated (model/backend/backend.h), shared
// with the forward pass; the lower tiers as the kv.* config lists them
// (kv.tiers or its shorthands), opened by the tier registry; the KvManager
// over all of them.

#include <memory>

#include "common/status.h"
#include "kvcache/clock.h"
#include "kvcache/kv_config.h"
#include "kvcache/kv_manager.h"
#include "kvcache/tier_registry.h"
#include "model/backend/kv_layout.h"
#include "model/backend/backend.h"
#include "model/backend/cpu/cpu_backend.h"
#include "model/forward.h"
#include "model/model_loader.h"

namespace strata::cli {

// The KV cache behind one generation: device pool in the engine, then the
// lower tiers the config lists (kvcache/tier_registry.h), in chain order.
struct KvStack {
  std::vector<std::unique_ptr<kvcache::BlockStore>> stores;
  std::unique_ptr<kvcache::KvManager> manager;  // destroyed first (drains the stores)
  ~KvStack() { manager.reset(); }
};

// Device blocks for one sequence of `total` tokens: --kv-device-bytes, or
// enough for the whole context (and at least this sequence).
Result<int> DeviceBlocks(const kvcache::KvCacheConfig& kv, const KvLayout& layout, int context_length, int total);

// Device blocks for serving `max_seqs` sequences at once: --kv-device-bytes
// when given (at least one full context), else max_seqs full contexts capped
// at `default_cap_bytes` (and never under one context).
Result<int> ServingDeviceBlocks(const kvcache::KvCacheConfig& kv, const KvLayout& layout, int context_length,
                                int max_seqs, uint64_t default_cap_bytes);

// Opens the lower tiers the config lists (with `make`: `strata serve`
// makes the remote tier itself) and the manager over `pool` (the pool
// `engine` runs over, from `backend`, which outlives the stack). Errors
// name the flag, key or tier at fault.
Result<std::unique_ptr<KvStack>> OpenKvStack(const kvcache::KvCacheConfig& kv, const LoadedModel& m,
                                             Backend& backend, const KvPool& pool, ForwardPass& engine,
                                             kvcache::Clock* clock,
                                             const kvcache::StoreMaker& make = kvcache::OpenStore);

// The CPU backend with its KV pool and forward pass, in destruction order.
struct CpuModel {
  std::unique_ptr<CpuBackend> backend;
  KvPool pool;
  std::unique_ptr<ForwardPass> forward;  // destroyed before the backend
  ~CpuModel() { forward.reset(); }
};
// Allocates `kv.num_blocks` blocks of `m`'s layout and the forward pass.
Result<std::unique_ptr<CpuModel>> OpenCpuModel(const LoadedModel& m, const KvOptions& kv, ThreadPool* threads);

}  // namespace strata::cli
