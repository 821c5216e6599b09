#pragma once
// The tier registry: the KV tiers below the device pool as operators list
// them, checked at start, and the one factory that opens them for every
// command (`strata serve`, `strata generate`, `strata bench kvcache`, and the
// simulator through its own store maker).
//
// The list comes from `kv.tiers` in the YAML file:
//   kv:
//     tiers:
//       - {kind: host, bytes: 8G, write_policy: write-back, pin: true}
//       - {kind: disk, name: nvme, path: /nvme/kv, bytes: 1T, admit_after: 0}
// or from the flat keys and flags (kv.host_bytes, kv.disk_path, ...,
// --kv-host-bytes, ...), which are shorthands for a list of at most one host
// tier named "host" followed by one disk tier named "disk"
// (kvcache/kv_config.h resolves which; giving both is an error).
//
// Order is the chain order: a lookup asks the first tier first, loads come
// from whichever tier holds the next blocks (kvcache/kv_manager.h).
//
// Thread-safety: plain values and functions; OpenTiers runs once at start.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "kvcache/block_store.h"
#include "kvcache/kv_manager.h"
#include "kvcache/tier_kind.h"

namespace strata::kvcache {

struct TierSpec {
  TierKind kind = TierKind::kHost;
  std::string name;    // unique in the list; empty in a kv.tiers entry = TierKindName(kind)
  uint64_t bytes = 0;  // capacity; > 0
  std::string path;    // disk: its directory (required); other kinds: none
  WritePolicy write_policy = WritePolicy::kWriteThrough;
  // Whether write_policy was given; a host tier's default depends on the
  // instance (KvCacheConfig::host_write_policy, applied by LowerTierSpecs).
  bool write_policy_set = false;
  uint32_t admit_after = 0;  // hits before a block is written to this tier (LowerTier::admit_after)
  bool pin = true;           // host: page-lock the buffer when a CUDA device is present
  // kvcache/eviction_policy.h names; empty = kv.eviction_policy (filled in
  // by LowerTierSpecs). Host and disk tiers; the remote tier evicts nothing.
  std::string eviction_policy;
  // Where it was configured, for messages: "kv.tiers[1]" or the shorthand's
  // flag and key.
  std::string source;
};

// The keys of one kv.tiers entry: kind, name, bytes, path, write_policy,
// admit_after, pin, eviction_policy.
const std::vector<std::string>& TierSpecKeys();

// Parses `kv.tiers` in `cfg` (absent: an empty list). Each entry must have a
// `kind` from the kind table and only TierSpecKeys; errors name the entry
// and key. Names default here. Does not check the list as a whole.
Result<std::vector<TierSpec>> TierSpecsFromYaml(const Config& cfg);

// Checks a list as a whole, refusing by name and source: a kind that cannot
// be listed (device is kv.device_bytes; remote tiers come from the cluster
// pool), two entries with one name, a size of 0, a disk tier without a path,
// two disk tiers on one directory, a path on a non-disk tier, `pin` on a
// non-host tier, an unknown eviction policy, or one other than lru on a disk
// or remote tier.
Status ValidateTierSpecs(std::span<const TierSpec> specs);

// Makes the store of one tier, for blocks of `block_bytes`.
using StoreMaker = std::function<Result<std::unique_ptr<BlockStore>>(const TierSpec& spec, uint64_t block_bytes)>;

// The real stores: HostStore for host, DiskStore for disk (created in its
// directory if missing, serving every namespace). Errors name spec.source.
Result<std::unique_ptr<BlockStore>> OpenStore(const TierSpec& spec, uint64_t block_bytes);

struct OpenedTiers {
  std::vector<std::unique_ptr<BlockStore>> stores;  // in chain order; must outlive the KvManager
  // For KvManager::Create: stores[i] with spec i's name, write policy and
  // admission; read rates 0 (unknown) for the caller to fill.
  std::vector<LowerTier> lowers;
};

// Validates `specs` (ValidateTierSpecs), then opens each store with `make`
// in order. On an error nothing stays open.
Result<OpenedTiers> OpenTiers(std::span<const TierSpec> specs, uint64_t block_bytes,
                              const StoreMaker& make = OpenStore);

}  // namespace strata::kvcache
