#pragma once
// KV cache configuration as operators give it: the kv.* keys of the YAML file
// (configs/strata.yaml documents them) and the --kv-* flags, which override
// the file. Sizes take binary suffixes (512K, 64M, 4G = GiB); 0 disables a
// tier. Errors name the key or flag they come from.
//
// Thread-safety: plain values and pure functions.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "kvcache/kv_manager.h"
#include "kvcache/tier_registry.h"

namespace strata::kvcache {

struct KvCacheConfig {
  int block_size = 16;        // kv.block_size       --kv-block-size
  std::string dtype = "f16";  // kv.dtype            --kv-dtype (f32 | f16 | bf16)
  uint64_t device_bytes = 0;  // kv.device_bytes     --kv-device-bytes (0 = sized for the context)
  uint64_t host_bytes = 0;    // kv.host_bytes       --kv-host-bytes (0 = no host tier)
  std::string disk_path;      // kv.disk_path        --kv-disk-path (empty = no disk tier)
  uint64_t disk_bytes = 0;    // kv.disk_bytes       --kv-disk-bytes (0 = no disk tier)
  uint32_t disk_admit_after = 0;               // kv.disk_admit_after --kv-disk-admit-after
  LoadPolicy load_policy = LoadPolicy::kAuto;  // kv.load_policy --kv-load-policy
  // kv.host_write_policy --kv-host-write-policy, kv.disk_write_policy
  // --kv-disk-write-policy: write-through | write-back | exclusive
  // (kvcache/kv_types.h). A host tier whose policy is not given (here or in
  // its kv.tiers entry) is exclusive for a lone instance (device + host then
  // serve as one cache of their total size: docs/simulator.md) and
  // write-through in a cluster (`cluster`), where peers read what this
  // instance computed from its host tier; LowerTierSpecs applies the rule.
  WritePolicy host_write_policy = WritePolicy::kExclusive;
  bool host_write_policy_set = false;  // given by key or flag
  WritePolicy disk_write_policy = WritePolicy::kWriteThrough;
  // Not a key: `strata serve` sets it with --metadata (the instance shares
  // its tiers with peers).
  bool cluster = false;
  // kv.prefetch_max_requests --kv-prefetch-max-requests: waiting requests
  // that may load their lower-tier prefix before admission (0 = off); the
  // engine's EngineOptions::prefetch_max_requests.
  int prefetch_max_requests = 4;
  // kv.lookup_timeout_ms --kv-lookup-timeout-ms: how long a waiting request
  // waits for the tiers' answer on its cached prefix before counting it a
  // lower-tier miss (EngineOptions::lookup_timeout_seconds). Local tiers
  // answer at once; it matters for tiers whose index is remote.
  int lookup_timeout_ms = 50;
  // kv.stop_write_down_seconds --kv-stop-write-down-seconds: at a graceful
  // stop, how long `strata serve` may spend writing the device's and the
  // host tier's blocks into the disk tier (KvManager::WriteDown), so that a
  // restart finds the hottest blocks there; 0 = off; 0 to 3600. No effect
  // without a disk tier.
  int stop_write_down_seconds = 30;
  // kv.host_pin --kv-host-pin: page-lock the host tier's buffer
  // (cudaHostRegister) when a CUDA device is present, so device copies run
  // at full speed; false leaves it pageable (operators who cannot spare
  // locked memory). No effect without a device.
  bool host_pin = true;
  // kv.remote --kv-remote: a remote tier last in the chain (the cluster
  // pool: blocks other instances hold, cluster/remote_store.h); the same as
  // listing {kind: remote} last in kv.tiers. Needs --metadata.
  bool remote = false;
  // kv.eviction_policy --kv-eviction-policy: the device pool's eviction
  // policy and the default of each host and disk tier
  // (kv.tiers[].eviction_policy overrides it per tier). Names in
  // kvcache/eviction_policy.h.
  std::string eviction_policy = kDefaultEvictionPolicy;
  // kv.tiers: the lower tiers as a list (kvcache/tier_registry.h). The host_*
  // and disk_* fields above are shorthands for a list of one host and one
  // disk tier; LowerTierSpecs resolves which applies.
  std::vector<TierSpec> tiers;
  // The caller runs through KvManager (not a plain block table) when true:
  // set by any tier flag given (sizes, disk path, admission, load policy,
  // even "0"), and by a YAML tier size > 0 or a non-empty kv.disk_path (the
  // documented defaults in configs/strata.yaml leave it false), and by a
  // non-empty kv.tiers.
  bool tiers_configured = false;

  bool host_enabled() const { return host_bytes > 0; }
  bool disk_enabled() const { return !disk_path.empty() && disk_bytes > 0; }
};

// The kv.* keys understood here (for Config::CheckKnownKeys).
const std::vector<std::string>& KvConfigKeys();

// Overlays the kv.* keys present in `cfg` on `base`. Errors name the key.
Result<KvCacheConfig> KvCacheConfigFromYaml(const Config& cfg, const KvCacheConfig& base);

// Applies one flag given as text, e.g. ("--kv-host-bytes", "512M"). Errors
// name the flag; an unknown flag is InvalidArgument.
Status ApplyKvFlag(std::string_view flag, std::string_view value, KvCacheConfig* config);

Result<LoadPolicy> ParseLoadPolicy(std::string_view text);
std::string_view LoadPolicyName(LoadPolicy p);
// "write-through" | "write-back" (kNone is not configurable).
Result<WritePolicy> ParseWritePolicy(std::string_view text);
std::string_view WritePolicyName(WritePolicy p);

// The lower tiers in chain order: kv.tiers when listed, else the shorthands
// (a "host" tier when host_bytes > 0, then a "disk" tier when disk_path and
// disk_bytes are set), checked by ValidateTierSpecs. Giving kv.tiers and a
// shorthand that differs from its default is an error naming both.
Result<std::vector<TierSpec>> LowerTierSpecs(const KvCacheConfig& config);

// Checks ranges and combinations (a disk path without a size and the
// reverse; block size 1..4096; dtype; the tier list, LowerTierSpecs).
// Appends warnings (a lower tier not larger than the one above it, which
// makes it churn: an equal size holds nothing the tier above does not) to
// `warnings`; the caller logs them.
// `effective_device_bytes`: the device pool's size when device_bytes is 0.
Status ValidateKvCacheConfig(const KvCacheConfig& config, uint64_t effective_device_bytes,
                             std::vector<std::string>* warnings);

}  // namespace strata::kvcache
