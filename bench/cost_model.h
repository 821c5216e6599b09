#pragma once
// The simulator's instances and the cluster file (`strata bench simulate
// --cluster FILE.yaml`): the step cost model itself and the routing
// policies are scheduler/router.h's (no I/O there); this file reads them
// from files and names the profiles.
//
// Profiles (docs/simulator.md explains where each number comes from):
//   "cpu-bench-110m"  fitted to docs/PERFORMANCE.md (bench-110m f32, 2
//                     threads, run 3): measured on this machine.
//   "h200-llama-8b"   Llama-3-8B bf16 on one H200: ASSUMPTIONS scaled from
//                     published figures (not measured here).
//
// Thread-safety: plain values and pure functions.

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "kvcache/kv_types.h"
#include "scheduler/router.h"

namespace strata::bench {

using scheduler::CostModel;
using Routing = scheduler::RoutingPolicy;

// Reads {"a":..,"b":..,"c":..,"d":..,"e":..,"f":..} (missing keys are 0;
// negative values are an error). Errors name the file.
Result<CostModel> LoadCostModel(const std::string& path);

// A router's calibrations (`strata router --calibration F`): either one
// cost model as above (every instance), or
//   {"instances": {"NAME": {cost model}, ...}, "default": {cost model}}
// by instance name, "default" optional. Errors name the file and the key.
struct ClusterCalibration {
  std::optional<CostModel> default_model;
  std::map<std::string, CostModel> instances;
};
Result<ClusterCalibration> LoadClusterCalibration(const std::string& path);
std::string CostModelJson(const CostModel& m);

// One simulated serving instance (all instances of a cluster are alike).
struct InstanceConfig {
  std::string profile;        // the profile it started from
  std::string model;          // bench-110m | bench-1b | llama-8b (KV bytes per token)
  uint64_t kv_bytes_per_token = 0;  // K and V of one token over all layers
  int block_size = 16;
  uint64_t device_bytes = 0;  // KV pool; rounded down to whole blocks
  uint64_t host_bytes = 0;    // 0 = no host tier
  uint64_t disk_bytes = 0;    // 0 = no disk tier
  double host_read_bytes_per_s = 0, host_write_bytes_per_s = 0;  // 0 = instant
  double disk_read_bytes_per_s = 0, disk_write_bytes_per_s = 0;
  // The cluster pool (docs/cluster.md): a remote tier below the local ones
  // reading the other instances' host and disk tiers at this bandwidth
  // plus this latency per block (the network).
  // Write policy of the host and disk tiers (kvcache/kv_types.h):
  // write-through (inclusive), write-back (a block goes down only when
  // evicted from above) or exclusive (write-back, and a load moves the block
  // up). The host tier's default is `strata serve`'s: exclusive, or
  // write-through with `remote` (peers read the host tier);
  // HostWritePolicy() says which applies. The disk's: write-through.
  kvcache::WritePolicy host_write_policy = kvcache::WritePolicy::kExclusive;
  bool host_write_policy_set = false;  // given (key or flag)
  kvcache::WritePolicy disk_write_policy = kvcache::WritePolicy::kWriteThrough;
  // Eviction policy of the device pool and the default of the lower tiers
  // (kvcache/eviction_policy.h; kv.eviction_policy live).
  std::string eviction_policy = kvcache::kDefaultEvictionPolicy;
  std::string host_eviction_policy;  // the host tier's; empty = eviction_policy
  std::string disk_eviction_policy;  // the disk tier's; empty = eviction_policy
  bool remote = false;
  double remote_read_bytes_per_s = 0;  // 0 = instant
  double remote_latency_s = 0;
  // Hits a block needs before it is written to disk (kv.disk_admit_after);
  // 0 = every full block is written through.
  uint32_t disk_admit_after = 0;
  int max_num_seqs = 64;
  int max_batch_tokens = 512;
  CostModel cost;
  std::string cost_source;    // "profile NAME", "file PATH" or "cluster file"

  uint64_t block_bytes() const { return kv_bytes_per_token * static_cast<uint64_t>(block_size); }
};

// The host tier's write policy in effect (see InstanceConfig::host_write_policy).
inline kvcache::WritePolicy HostWritePolicy(const InstanceConfig& ic) {
  if (ic.host_write_policy_set) return ic.host_write_policy;
  return ic.remote ? kvcache::WritePolicy::kWriteThrough : kvcache::WritePolicy::kExclusive;
}

struct ClusterConfig {
  int instances = 1;
  Routing routing = Routing::kRoundRobin;
  InstanceConfig instance;
  // A second group of unequal instances: the last `slower_instances` run
  // every step `slower_factor` times as long (all of a..f scaled), as a live
  // instance with `strata serve --debug-step-time-factor` does, or an
  // older machine beside newer ones.
  int slower_instances = 0;
  double slower_factor = 1;
  // Which group `slower_instances` counts from the end of: "" (all
  // instances), "prefill" or "decode" (with prefill_instances).
  std::string slower_role;
  // Prefill/decode disaggregation, as `strata router` over `strata serve
  // --role prefill|decode` instances: the first `prefill_instances` only
  // prefill (a request's prompt and first token), the others only decode.
  // 0: every instance does both (colocated). The decode instance reserves
  // the prompt's blocks, the prefill instance computes them, and they reach
  // the decode instance after transfer_latency_s plus their bytes at
  // transfer_bytes_per_s (0 = instant), less the blocks it already holds.
  int prefill_instances = 0;
  double transfer_bytes_per_s = 0;
  double transfer_latency_s = 0;
  bool disaggregated() const { return prefill_instances > 0; }
  // "prefill", "decode" or "both" for instance `i`.
  std::string_view RoleName(int i) const;
  // The cost model of instance `i` (0-based).
  CostModel InstanceCost(int i) const;
};

// Profile names: "cpu-bench-110m" (the default), "h200-llama-8b".
std::vector<std::string> ProfileNames();
Result<InstanceConfig> ProfileInstance(const std::string& name);

// KV bytes per token of a model preset: "bench-110m", "bench-1b" (model/
// synth.h shapes) or "llama-8b" (32 layers, 8 KV heads of 128), at `dtype`
// (f16 | bf16 | f32).
Result<uint64_t> KvBytesPerToken(const std::string& model, const std::string& dtype);

// The cluster file (YAML):
//   instances: 2                     # N instances
//   routing: longest-prefix          # round-robin | longest-prefix | least-loaded | ttft
//   slower:                          # optional: the last N instances are F times slower per step
//     instances: 1
//     factor: 2
//     role: prefill                  # ... the last N of the prefill (or decode) instances
//   roles:                           # optional: prefill/decode disaggregation
//     prefill: 2                     # the first 2 instances prefill, the others decode
//     transfer_bytes_per_s: 25G      # the KV handoff's network (0 = instant)
//     transfer_latency_us: 20
//   instance:
//     profile: h200-llama-8b         # starting values; the keys below override
//     model: llama-8b                # sets kv_bytes_per_token (with kv_dtype)
//     kv_dtype: bf16
//     kv_bytes_per_token: 131072
//     block_size: 16
//     device_bytes: 40G              # sizes take K/M/G/T (binary)
//     host_bytes: 512G
//     disk_bytes: 4T
//     host_read_bytes_per_s: 50G     # bandwidths: bytes per second, same suffixes
//     host_write_bytes_per_s: 50G
//     disk_read_bytes_per_s: 6G
//     disk_write_bytes_per_s: 3G
//     host_write_policy: write-back  # or write-through (the default); also disk_write_policy
//     remote: true                   # the cluster pool: read the others' tiers
//     remote_read_bytes_per_s: 10G   # ... over this network
//     remote_latency_us: 20          # ... with this latency per block
//     max_num_seqs: 256
//     max_batch_tokens: 8192
//     cost:                          # any of a..f override the profile's
//       a: 0.005
//       calibrated: costs.json       # or a whole cost model from a file
// Unknown keys are an error naming the key. Relative paths are relative to
// the cluster file's folder.
Result<ClusterConfig> ParseClusterConfig(const Config& cfg, const std::string& base_dir);
Result<ClusterConfig> LoadClusterConfig(const std::string& path);
// The default cluster: one "cpu-bench-110m" instance.
ClusterConfig DefaultCluster();

}  // namespace strata::bench
