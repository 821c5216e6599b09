#include "kvcache/tier_registry.h"

#include "kvcache/eviction_policy.h"

#include <algorithm>
#include <filesystem>

#include "kvcache/disk_store.h"
#include "kvcache/host_store.h"
#include "kvcache/kv_config.h"

namespace strata::kvcache {

namespace {

// A directory's path in one spelling: "/kv/./x/" and "/kv/x" are one place.
std::filesystem::path Normal(const std::string& path) {
  std::filesystem::path p = std::filesystem::path(path).lexically_normal();
  if (!p.has_filename() && p.has_parent_path() && p != p.root_path()) p = p.parent_path();
  return p;
}

Status Bad(const TierSpec& s, const std::string& what) {
  return Status::InvalidArgument(s.source + " (tier '" + s.name + "'): " + what);
}

// One kv.tiers entry. `c` is the entry's own Config (origin "file: kv.tiers[i]").
Result<TierSpec> ParseEntry(const Config& c, size_t index) {
  STRATA_RETURN_IF_ERROR(c.CheckKnownKeys(TierSpecKeys()));
  TierSpec s;
  s.source = "kv.tiers[" + std::to_string(index) + "]";
  if (!c.Has("kind"))
    return Status::InvalidArgument(c.origin() + ": 'kind' is required (host or disk)");
  STRATA_ASSIGN_OR_RETURN(std::string kind, c.GetString("kind", ""));
  const auto k = ParseTierKind(kind);
  if (!k) return Status::InvalidArgument(c.origin() + ": unknown tier kind '" + kind + "' (host or disk)");
  s.kind = *k;
  STRATA_ASSIGN_OR_RETURN(s.name, c.GetString("name", std::string(TierKindName(s.kind))));
  if (s.name.empty()) return Status::InvalidArgument(c.origin() + ": 'name' is empty");
  if (s.kind == TierKind::kRemote) {
    // The cluster pool: other instances' tiers, read-only here.
    for (const char* key : {"bytes", "path", "write_policy", "admit_after", "pin", "eviction_policy"})
      if (c.Has(key))
        return Status::InvalidArgument(c.origin() + ": '" + key +
                                       "' does not apply to a remote tier (its blocks are other instances')");
    s.write_policy = WritePolicy::kNone;
    return s;
  }
  if (!c.Has("bytes")) return Status::InvalidArgument(c.origin() + ": 'bytes' is required");
  STRATA_ASSIGN_OR_RETURN(s.bytes, c.GetBytes("bytes", 0));
  STRATA_ASSIGN_OR_RETURN(s.path, c.GetString("path", ""));
  if (c.Has("write_policy")) {
    STRATA_ASSIGN_OR_RETURN(std::string p, c.GetString("write_policy", ""));
    auto w = ParseWritePolicy(p);
    if (!w) return Status::InvalidArgument(c.origin() + ": key 'write_policy' " + w.error().message());
    s.write_policy = *w;
    s.write_policy_set = true;
  }
  STRATA_ASSIGN_OR_RETURN(int64_t admit, c.GetInt("admit_after", 0));
  if (admit < 0 || admit > 1000000)
    return Status::InvalidArgument(c.origin() + ": key 'admit_after' out of range [0, 1000000]: " +
                                   std::to_string(admit));
  s.admit_after = static_cast<uint32_t>(admit);
  if (c.Has("pin") && s.kind != TierKind::kHost)
    return Status::InvalidArgument(c.origin() + ": 'pin' applies to host tiers only");
  STRATA_ASSIGN_OR_RETURN(s.pin, c.GetBool("pin", true));
  STRATA_ASSIGN_OR_RETURN(s.eviction_policy, c.GetString("eviction_policy", ""));
  if (c.Has("eviction_policy") && !IsEvictionPolicy(s.eviction_policy))
    return Status::InvalidArgument(c.origin() + ": key 'eviction_policy' " +
                                   MakeEvictionPolicy(s.eviction_policy, 0).error().message());
  return s;
}

}  // namespace

const std::vector<std::string>& TierSpecKeys() {
  static const std::vector<std::string> keys = {"kind",        "name", "bytes",          "path",
                                                "write_policy", "admit_after", "pin", "eviction_policy"};
  return keys;
}

Result<std::vector<TierSpec>> TierSpecsFromYaml(const Config& cfg) {
  STRATA_ASSIGN_OR_RETURN(std::vector<Config> entries, cfg.GetMapList("kv.tiers"));
  std::vector<TierSpec> out;
  for (size_t i = 0; i < entries.size(); ++i) {
    STRATA_ASSIGN_OR_RETURN(TierSpec s, ParseEntry(entries[i], i));
    out.push_back(std::move(s));
  }
  return out;
}

Status ValidateTierSpecs(std::span<const TierSpec> specs) {
  for (size_t i = 0; i < specs.size(); ++i) {
    const TierSpec& s = specs[i];
    if (s.kind == TierKind::kDevice)
      return Bad(s, "the device tier is the backend's pool, sized by kv.device_bytes (--kv-device-bytes), not listed");
    if (s.kind == TierKind::kRemote) {
      if (i + 1 != specs.size()) return Bad(s, "the remote tier must be the last in the list");
      if (s.write_policy != WritePolicy::kNone) return Bad(s, "the remote tier is read-only (write_policy none)");
      if (!s.eviction_policy.empty() && s.eviction_policy != "lru")
        return Bad(s, "the remote tier evicts nothing of its own (its blocks are other instances'); no eviction_policy");
      continue;
    }
    if (s.name == TierKindName(TierKind::kDevice))
      return Bad(s, "the name 'device' is the device pool's; give this tier another");
    if (s.bytes == 0) return Bad(s, "bytes is 0: give the tier a size, or leave it out");
    if (!s.eviction_policy.empty() && !IsEvictionPolicy(s.eviction_policy))
      return Bad(s, MakeEvictionPolicy(s.eviction_policy, 0).error().message());
    if (s.kind == TierKind::kDisk && s.path.empty()) return Bad(s, "a disk tier needs a path (its directory)");
    if (s.kind != TierKind::kDisk && !s.path.empty())
      return Bad(s, "path applies to disk tiers only, not " + std::string(TierKindName(s.kind)));
    for (size_t j = 0; j < i; ++j) {
      if (specs[j].name == s.name)
        return Bad(s, "the name '" + s.name + "' is also used by " + specs[j].source + "; give each tier its own name");
      if (s.kind == TierKind::kDisk && specs[j].kind == TierKind::kDisk) {
        const auto a = Normal(s.path);
        const auto b = Normal(specs[j].path);
        std::error_code ec;
        if (a == b || std::filesystem::equivalent(a, b, ec))
          return Bad(s, "disk tiers '" + specs[j].name + "' and '" + s.name + "' share the directory " + s.path);
      }
    }
  }
  return Status::Ok();
}

Result<std::unique_ptr<BlockStore>> OpenStore(const TierSpec& spec, uint64_t block_bytes) {
  switch (spec.kind) {
    case TierKind::kHost: {
      HostStoreOptions ho;
      ho.capacity_bytes = spec.bytes;
      ho.block_bytes = block_bytes;
      ho.pin = spec.pin;
      if (!spec.eviction_policy.empty()) ho.eviction_policy = spec.eviction_policy;
      STRATA_ASSIGN_OR_RETURN(std::unique_ptr<HostStore> host, HostStore::Create(ho));
      if (host->num_slots() == 0)
        return Bad(spec, std::to_string(spec.bytes) + " bytes is smaller than one KV block (" +
                             std::to_string(block_bytes) + " bytes)");
      return std::unique_ptr<BlockStore>(std::move(host));
    }
    case TierKind::kDisk: {
      if (block_bytes < 4096)
        return Bad(spec, "a disk tier needs blocks of at least 4096 bytes; this model's blocks are " +
                             std::to_string(block_bytes) + " bytes: raise --kv-block-size or use a wider --kv-dtype");
      DiskStoreOptions d;
      d.directory = spec.path;
      d.capacity_bytes = spec.bytes;
      d.block_bytes = block_bytes;
      if (!spec.eviction_policy.empty()) d.eviction_policy = spec.eviction_policy;
      d.grow_bytes = std::min<uint64_t>(d.grow_bytes, spec.bytes);
      auto disk = DiskStore::Open(d);
      if (!disk) return disk.error().WithContext(spec.source + " (tier '" + spec.name + "', " + spec.path + ")");
      return std::unique_ptr<BlockStore>(std::move(*disk));
    }
    case TierKind::kRemote:
      return Bad(spec, "a remote tier reads other instances' blocks: it needs the cluster (strata serve --metadata)");
    case TierKind::kDevice:
      break;
  }
  return Bad(spec, "no store of kind " + std::string(TierKindName(spec.kind)) + " can be opened here");
}

Result<OpenedTiers> OpenTiers(std::span<const TierSpec> specs, uint64_t block_bytes, const StoreMaker& make) {
  STRATA_RETURN_IF_ERROR(ValidateTierSpecs(specs));
  OpenedTiers out;
  for (const TierSpec& s : specs) {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<BlockStore> store, make(s, block_bytes));
    if (store == nullptr) return Bad(s, "the store maker returned no store");
    if (store->kind() != s.kind)
      return Bad(s, "the store maker returned a " + std::string(TierKindName(store->kind())) + " store");
    LowerTier t;
    t.store = store.get();
    t.write_policy = s.write_policy;
    t.admit_after = s.admit_after;
    t.name = s.name;
    out.lowers.push_back(std::move(t));
    out.stores.push_back(std::move(store));
  }
  return out;
}

}  // namespace strata::kvcache
