#include "bench/simulator.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <utility>

#include "bench/sim_run.h"
#include "kvcache/tier_registry.h"
#include "model/gguf_tokenizer.h"
#include "model/tokenizer/tokenizer.h"

namespace strata::bench {
namespace {

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
    // As strata serve: kv.tiers[].eviction_policy, else kv.eviction_policy.
    d.eviction_policy = ic.disk_eviction_policy.empty() ? ic.eviction_policy : ic.disk_eviction_policy;
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

}  // namespace

// Checks the options and settles the run's plan (the requests, the pool sizes
// and tiers); bench/sim_run.cc builds the cluster and runs it.
Result<SimResult> Simulate(const std::vector<TraceRequest>& trace, const SimOptions& o) {
  internal::SimPlan plan;
  plan.wall_start = std::chrono::steady_clock::now();
  const InstanceConfig& ic = o.cluster.instance;
  const int bs = ic.block_size;
  if (bs < 1) return Status::InvalidArgument("block_size must be >= 1");
  if (o.vocab_size <= o.first_id + 1 || o.first_id < 0) return Status::InvalidArgument("bad vocab_size / first_id");
  if (o.tokens_per_hash_id < 0) return Status::InvalidArgument("tokens_per_hash_id must be >= 0");
  if (!(o.time_scale >= 0)) return Status::InvalidArgument("time_scale must be >= 0");
  if (o.concurrency < 0) return Status::InvalidArgument("concurrency must be >= 0");
  if (o.concurrency > 0 && o.serial) return Status::InvalidArgument("give serial or concurrency, not both");
  const size_t n = o.max_requests > 0 ? std::min(trace.size(), static_cast<size_t>(o.max_requests)) : trace.size();
  plan.head.assign(trace.begin(), trace.begin() + static_cast<std::ptrdiff_t>(n));
  plan.ideal = IdealHitIdsPerRequest(plan.head);

  TokenizerSpec spec = SyntheticVocab(o.vocab_size);
  STRATA_ASSIGN_OR_RETURN(plan.tokenizer, Tokenizer::Create(std::move(spec)));

  const uint64_t block_bytes = ic.block_bytes();
  int64_t device_blocks = block_bytes == 0 ? 0 : static_cast<int64_t>(ic.device_bytes / block_bytes);
  if (o.unlimited_cache) device_blocks = UnlimitedBlocks(plan.head, n, o, bs, plan.ideal);
  device_blocks = std::min<int64_t>(device_blocks, INT32_MAX - 1);
  if (device_blocks < 1) return Status::InvalidArgument("the device pool holds no block");
  plan.device_blocks = device_blocks;
  if (!o.unlimited_cache) plan.tier_specs = SimTierSpecs(ic);
  return internal::RunSimulation(std::move(plan), o);
}

}  // namespace strata::bench
