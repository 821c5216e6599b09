#include "tools/kv_stack.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "common/logging.h"
#include "kvcache/block_hash.h"
#include "tools/kv_estimate.h"

namespace strata::cli {

// Device blocks for the cached path: --kv-device-bytes, or enough for the
// whole context (and at least this sequence).
Result<int> DeviceBlocks(const kvcache::KvCacheConfig& kv, const KvLayout& layout, int context_length, int total) {
  const int bs = kv.block_size;
  const int need = (total + bs - 1) / bs;
  if (kv.device_bytes == 0) return std::max(need, (context_length + bs - 1) / bs);
  const uint64_t blocks = kv.device_bytes / layout.block_bytes();
  if (blocks < static_cast<uint64_t>(need))
    return Status::InvalidArgument("--kv-device-bytes (kv.device_bytes) " + std::to_string(kv.device_bytes) +
                                   " holds " + std::to_string(blocks) + " blocks of " +
                                   std::to_string(layout.block_bytes()) + " bytes; this sequence needs " +
                                   std::to_string(need));
  return static_cast<int>(std::min<uint64_t>(blocks, 1u << 30));
}

namespace {

// kv.load_policy auto: measures recompute speed and each tier's read rate
// now, before any request owns a device block (see kv_estimate.h), fills
// them into `o` and `lowers`, and logs them.
void MeasureLoadRates(const kvcache::KvCacheConfig& kv, const std::vector<kvcache::TierSpec>& specs,
                      ForwardPass& engine, uint64_t block_bytes, kvcache::KvManagerOptions* o,
                      std::vector<kvcache::LowerTier>* lowers) {
  const uint64_t sample = block_bytes * std::min<uint64_t>(16, std::max<uint64_t>(1, (64u << 20) / block_bytes));
  o->recompute_tokens_per_s = MeasureRecomputeRate(engine);
  std::string line =
      "kv load policy auto: recompute " + std::to_string(static_cast<int64_t>(o->recompute_tokens_per_s)) + " tokens/s";
  const double block_compute_ms = o->recompute_tokens_per_s > 0 ? 1e3 * kv.block_size / o->recompute_tokens_per_s : 0;
  for (size_t i = 0; i < lowers->size(); ++i) {
    kvcache::LowerTier& t = (*lowers)[i];
    const kvcache::TierSpec& spec = specs[i];
    if (spec.kind == kvcache::TierKind::kHost) {
      t.read_bytes_per_s = MeasureMemcpyRate(sample);
    } else if (spec.kind == kvcache::TierKind::kDisk) {
      // The store pads each slot to whole 4 KiB pages for O_DIRECT; so does the probe.
      const uint64_t io_bytes = (block_bytes + 4095) / 4096 * 4096;
      auto r = MeasureDirectReadRate(spec.path, io_bytes, static_cast<int>(sample / block_bytes));
      if (r) {
        t.read_bytes_per_s = *r * static_cast<double>(block_bytes) / static_cast<double>(io_bytes);  // useful bytes/s
      } else {
        STRATA_LOG_WARN("kv load policy auto: {} read rate unknown ({}); its hits are always loaded", spec.name,
                        r.error().ToString());
      }
    }
    char buf[200];
    if (t.read_bytes_per_s > 0) {
      std::snprintf(buf, sizeof buf, "; %s %.2f GB/s (a block: load %.3f ms vs recompute %.3f ms)", spec.name.c_str(),
                    t.read_bytes_per_s / 1e9, 1e3 * static_cast<double>(block_bytes) / t.read_bytes_per_s,
                    block_compute_ms);
    } else {
      std::snprintf(buf, sizeof buf, "; %s rate unknown (hits are loaded)", spec.name.c_str());
    }
    line += buf;
  }
  STRATA_LOG_INFO("{}", line);
}

}  // namespace

Result<std::unique_ptr<CpuModel>> OpenCpuModel(const LoadedModel& m, const KvOptions& kv, ThreadPool* threads) {
  auto cm = std::make_unique<CpuModel>();
  cm->backend = std::make_unique<CpuBackend>(threads);
  const ModelConfig& c = m.weights.config;
  const KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, kv.block_size, kv.dtype};
  STRATA_ASSIGN_OR_RETURN(cm->pool, cm->backend->AllocateKvPool(layout, kv.num_blocks));
  STRATA_ASSIGN_OR_RETURN(cm->forward, cm->backend->CreateForward(m.weights, cm->pool));
  return cm;
}

Result<std::unique_ptr<KvStack>> OpenKvStack(const kvcache::KvCacheConfig& kv, const LoadedModel& m,
                                             Backend& backend, const KvPool& pool, ForwardPass& engine,
                                             kvcache::Clock* clock, const kvcache::StoreMaker& make) {
  auto stack = std::make_unique<KvStack>();
  const uint64_t block_bytes = engine.kv_layout().block_bytes();
  STRATA_ASSIGN_OR_RETURN(std::vector<kvcache::TierSpec> specs, kvcache::LowerTierSpecs(kv));
  STRATA_ASSIGN_OR_RETURN(kvcache::OpenedTiers tiers, kvcache::OpenTiers(specs, block_bytes, make));
  stack->stores = std::move(tiers.stores);
  kvcache::KvManagerOptions o;
  if (kv.load_policy == kvcache::LoadPolicy::kAuto && !tiers.lowers.empty())
    MeasureLoadRates(kv, specs, engine, block_bytes, &o, &tiers.lowers);
  o.block_size = kv.block_size;
  o.num_device_blocks = engine.num_blocks();
  o.block_bytes = block_bytes;
  o.ns = kvcache::NamespaceDigest(m.weights.digest, m.weights.config.arch, kv.dtype, kv.block_size);
  o.load_policy = kv.load_policy;
  o.eviction_policy = kv.eviction_policy;
  const kvcache::DeviceKv device{&backend.segments(), pool.segment, &backend.copy_engine()};
  STRATA_ASSIGN_OR_RETURN(stack->manager, kvcache::KvManager::Create(o, device, std::move(tiers.lowers), clock));
  return stack;
}

Result<int> ServingDeviceBlocks(const kvcache::KvCacheConfig& kv, const KvLayout& layout, int context_length,
                                int max_seqs, uint64_t default_cap_bytes) {
  const int bs = kv.block_size;
  const int ctx_blocks = (context_length + bs - 1) / bs;
  if (kv.device_bytes != 0) {
    const uint64_t blocks = kv.device_bytes / layout.block_bytes();
    if (blocks < static_cast<uint64_t>(ctx_blocks))
      return Status::InvalidArgument("--kv-device-bytes (kv.device_bytes) " + std::to_string(kv.device_bytes) +
                                     " holds " + std::to_string(blocks) + " blocks of " +
                                     std::to_string(layout.block_bytes()) + " bytes; one full context of " +
                                     std::to_string(context_length) + " tokens needs " + std::to_string(ctx_blocks));
    return static_cast<int>(std::min<uint64_t>(blocks, 1u << 30));
  }
  const uint64_t want = static_cast<uint64_t>(ctx_blocks) * static_cast<uint64_t>(std::max(1, max_seqs));
  const uint64_t cap = std::max<uint64_t>(ctx_blocks, default_cap_bytes / layout.block_bytes());
  return static_cast<int>(std::min<uint64_t>(std::min(want, cap), 1u << 30));
}

}  // namespace strata::cli
