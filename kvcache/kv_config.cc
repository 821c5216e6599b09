#include "kvcache/kv_config.h"

#include "kvcache/eviction_policy.h"

#include <charconv>

namespace strata::kvcache {

namespace {

Status Bad(std::string_view where, const std::string& what) {
  return Status::InvalidArgument(std::string(where) + ": " + what);
}

Result<int64_t> ParseInt(std::string_view where, std::string_view text) {
  int64_t v = 0;
  const auto* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || p != end || text.empty())
    return Bad(where, "expected an integer, got '" + std::string(text) + "'");
  return v;
}

Status CheckBlockSize(std::string_view where, int64_t v) {
  if (v < 1 || v > 4096) return Bad(where, "out of range [1, 4096]: " + std::to_string(v));
  return Status::Ok();
}

Status CheckDtype(std::string_view where, std::string_view v) {
  if (v != "f32" && v != "f16" && v != "bf16")
    return Bad(where, "must be f32, f16 or bf16, not '" + std::string(v) + "'");
  return Status::Ok();
}

Status CheckAdmitAfter(std::string_view where, int64_t v) {
  if (v < 0 || v > 1000000) return Bad(where, "out of range [0, 1000000]: " + std::to_string(v));
  return Status::Ok();
}

Status CheckLookupTimeout(std::string_view where, int64_t v) {
  if (v < 1 || v > 60000) return Bad(where, "out of range [1, 60000] ms: " + std::to_string(v));
  return Status::Ok();
}

Status CheckWriteDown(std::string_view where, int64_t v) {
  if (v < 0 || v > 3600) return Bad(where, "out of range [0, 3600] s: " + std::to_string(v));
  return Status::Ok();
}

Status CheckPrefetch(std::string_view where, int64_t v) {
  if (v < 0 || v > 4096) return Bad(where, "out of range [0, 4096]: " + std::to_string(v));
  return Status::Ok();
}

}  // namespace

const std::vector<std::string>& KvConfigKeys() {
  static const std::vector<std::string> keys = {
      "kv.block_size", "kv.dtype",      "kv.device_bytes",     "kv.host_bytes",
      "kv.disk_path",  "kv.disk_bytes", "kv.disk_admit_after", "kv.load_policy",
      "kv.host_write_policy", "kv.disk_write_policy", "kv.prefetch_max_requests", "kv.host_pin", "kv.remote", "kv.tiers",
      "kv.lookup_timeout_ms", "kv.eviction_policy", "kv.stop_write_down_seconds"};
  return keys;
}

Result<LoadPolicy> ParseLoadPolicy(std::string_view text) {
  if (text == "auto") return LoadPolicy::kAuto;
  if (text == "always") return LoadPolicy::kAlways;
  if (text == "never") return LoadPolicy::kNever;
  return Status::InvalidArgument("must be auto, always or never, not '" + std::string(text) + "'");
}

std::string_view LoadPolicyName(LoadPolicy p) {
  switch (p) {
    case LoadPolicy::kAuto:
      return "auto";
    case LoadPolicy::kAlways:
      return "always";
    case LoadPolicy::kNever:
      return "never";
  }
  return "auto";
}

Result<WritePolicy> ParseWritePolicy(std::string_view text) {
  if (text == "write-through") return WritePolicy::kWriteThrough;
  if (text == "write-back") return WritePolicy::kWriteBack;
  if (text == "exclusive") return WritePolicy::kExclusive;
  return Status::InvalidArgument("must be write-through, write-back or exclusive, not '" + std::string(text) + "'");
}

std::string_view WritePolicyName(WritePolicy p) {
  switch (p) {
    case WritePolicy::kNone:
      return "none";
    case WritePolicy::kWriteThrough:
      return "write-through";
    case WritePolicy::kWriteBack:
      return "write-back";
    case WritePolicy::kExclusive:
      return "exclusive";
  }
  return "write-through";
}

Result<KvCacheConfig> KvCacheConfigFromYaml(const Config& cfg, const KvCacheConfig& base) {
  KvCacheConfig c = base;
  const std::string o = cfg.origin() + ": ";
  auto named = [&](const Status& s, const std::string& key) {
    // Config's own errors already name the key; ours add the file.
    return Status::InvalidArgument(
        s.message().find(key) != std::string::npos ? s.message() : o + key + ": " + s.message());
  };
  if (cfg.Has("kv.block_size")) {
    auto v = cfg.GetInt("kv.block_size", c.block_size);
    if (!v) return named(v.error(), "kv.block_size");
    STRATA_RETURN_IF_ERROR(CheckBlockSize(o + "kv.block_size", *v));
    c.block_size = static_cast<int>(*v);
  }
  if (cfg.Has("kv.dtype")) {
    auto v = cfg.GetString("kv.dtype", c.dtype);
    if (!v) return named(v.error(), "kv.dtype");
    STRATA_RETURN_IF_ERROR(CheckDtype(o + "kv.dtype", *v));
    c.dtype = *v;
  }
  struct SizeKey {
    const char* key;
    uint64_t* dst;
  };
  for (const SizeKey& k :
       {SizeKey{"kv.device_bytes", &c.device_bytes}, SizeKey{"kv.host_bytes", &c.host_bytes},
        SizeKey{"kv.disk_bytes", &c.disk_bytes}}) {
    if (!cfg.Has(k.key)) continue;
    auto v = cfg.GetBytes(k.key, *k.dst);
    if (!v) return named(v.error(), k.key);
    *k.dst = *v;
    if (*v > 0) c.tiers_configured = true;
  }
  if (cfg.Has("kv.disk_path")) {
    auto v = cfg.GetString("kv.disk_path", c.disk_path);
    if (!v) return named(v.error(), "kv.disk_path");
    c.disk_path = *v;
    if (!v->empty()) c.tiers_configured = true;
  }
  if (cfg.Has("kv.disk_admit_after")) {
    auto v = cfg.GetInt("kv.disk_admit_after", c.disk_admit_after);
    if (!v) return named(v.error(), "kv.disk_admit_after");
    STRATA_RETURN_IF_ERROR(CheckAdmitAfter(o + "kv.disk_admit_after", *v));
    c.disk_admit_after = static_cast<uint32_t>(*v);
  }
  if (cfg.Has("kv.load_policy")) {
    auto v = cfg.GetString("kv.load_policy", "auto");
    if (!v) return named(v.error(), "kv.load_policy");
    auto p = ParseLoadPolicy(*v);
    if (!p) return Bad(o + "kv.load_policy", p.error().message());
    c.load_policy = *p;
  }
  struct PolicyKey {
    const char* key;
    WritePolicy* dst;
  };
  for (const PolicyKey& k : {PolicyKey{"kv.host_write_policy", &c.host_write_policy},
                             PolicyKey{"kv.disk_write_policy", &c.disk_write_policy}}) {
    if (!cfg.Has(k.key)) continue;
    auto v = cfg.GetString(k.key, "write-through");
    if (!v) return named(v.error(), k.key);
    auto p = ParseWritePolicy(*v);
    if (!p) return Bad(o + k.key, p.error().message());
    *k.dst = *p;
    if (k.dst == &c.host_write_policy) c.host_write_policy_set = true;
  }
  if (cfg.Has("kv.eviction_policy")) {
    auto v = cfg.GetString("kv.eviction_policy", c.eviction_policy);
    if (!v) return named(v.error(), "kv.eviction_policy");
    if (!IsEvictionPolicy(*v)) return Bad(o + "kv.eviction_policy", MakeEvictionPolicy(*v, 0).error().message());
    c.eviction_policy = *v;
  }
  if (cfg.Has("kv.prefetch_max_requests")) {
    auto v = cfg.GetInt("kv.prefetch_max_requests", c.prefetch_max_requests);
    if (!v) return named(v.error(), "kv.prefetch_max_requests");
    STRATA_RETURN_IF_ERROR(CheckPrefetch(o + "kv.prefetch_max_requests", *v));
    c.prefetch_max_requests = static_cast<int>(*v);
  }
  if (cfg.Has("kv.lookup_timeout_ms")) {
    auto v = cfg.GetInt("kv.lookup_timeout_ms", c.lookup_timeout_ms);
    if (!v) return named(v.error(), "kv.lookup_timeout_ms");
    STRATA_RETURN_IF_ERROR(CheckLookupTimeout(o + "kv.lookup_timeout_ms", *v));
    c.lookup_timeout_ms = static_cast<int>(*v);
  }
  if (cfg.Has("kv.stop_write_down_seconds")) {
    auto v = cfg.GetInt("kv.stop_write_down_seconds", c.stop_write_down_seconds);
    if (!v) return named(v.error(), "kv.stop_write_down_seconds");
    STRATA_RETURN_IF_ERROR(CheckWriteDown(o + "kv.stop_write_down_seconds", *v));
    c.stop_write_down_seconds = static_cast<int>(*v);
  }
  if (cfg.Has("kv.host_pin")) {
    auto v = cfg.GetBool("kv.host_pin", c.host_pin);
    if (!v) return named(v.error(), "kv.host_pin");
    c.host_pin = *v;
  }
  if (cfg.Has("kv.remote")) {
    auto v = cfg.GetBool("kv.remote", c.remote);
    if (!v) return named(v.error(), "kv.remote");
    c.remote = *v;
    if (c.remote) c.tiers_configured = true;
  }
  if (cfg.Has("kv.tiers")) {
    STRATA_ASSIGN_OR_RETURN(c.tiers, TierSpecsFromYaml(cfg));
    if (!c.tiers.empty()) c.tiers_configured = true;
  }
  return c;
}

Status ApplyKvFlag(std::string_view flag, std::string_view value, KvCacheConfig* c) {
  const std::string text(value);
  auto size = [&](uint64_t* dst) -> Status {
    auto v = ParseByteSize(text);
    if (!v) return Bad(flag, "expected a size like 512K, 64M or 4G, got '" + text + "'");
    *dst = *v;
    c->tiers_configured = true;
    return Status::Ok();
  };
  if (flag == "--kv-block-size") {
    STRATA_ASSIGN_OR_RETURN(int64_t v, ParseInt(flag, value));
    STRATA_RETURN_IF_ERROR(CheckBlockSize(flag, v));
    c->block_size = static_cast<int>(v);
    return Status::Ok();
  }
  if (flag == "--kv-dtype") {
    STRATA_RETURN_IF_ERROR(CheckDtype(flag, value));
    c->dtype = text;
    return Status::Ok();
  }
  if (flag == "--kv-device-bytes") return size(&c->device_bytes);
  if (flag == "--kv-host-bytes") return size(&c->host_bytes);
  if (flag == "--kv-disk-bytes") return size(&c->disk_bytes);
  if (flag == "--kv-disk-path") {
    c->disk_path = text;
    c->tiers_configured = true;
    return Status::Ok();
  }
  if (flag == "--kv-disk-admit-after") {
    STRATA_ASSIGN_OR_RETURN(int64_t v, ParseInt(flag, value));
    STRATA_RETURN_IF_ERROR(CheckAdmitAfter(flag, v));
    c->disk_admit_after = static_cast<uint32_t>(v);
    c->tiers_configured = true;
    return Status::Ok();
  }
  if (flag == "--kv-load-policy") {
    auto p = ParseLoadPolicy(value);
    if (!p) return Bad(flag, p.error().message());
    c->load_policy = *p;
    c->tiers_configured = true;
    return Status::Ok();
  }
  if (flag == "--kv-host-write-policy" || flag == "--kv-disk-write-policy") {
    auto p = ParseWritePolicy(value);
    if (!p) return Bad(flag, p.error().message());
    (flag == "--kv-host-write-policy" ? c->host_write_policy : c->disk_write_policy) = *p;
    if (flag == "--kv-host-write-policy") c->host_write_policy_set = true;
    c->tiers_configured = true;
    return Status::Ok();
  }
  if (flag == "--kv-eviction-policy") {
    if (!IsEvictionPolicy(value)) return Bad(flag, MakeEvictionPolicy(value, 0).error().message());
    c->eviction_policy = std::string(value);
    c->tiers_configured = true;
    return Status::Ok();
  }
  if (flag == "--kv-prefetch-max-requests") {
    STRATA_ASSIGN_OR_RETURN(int64_t v, ParseInt(flag, value));
    STRATA_RETURN_IF_ERROR(CheckPrefetch(flag, v));
    c->prefetch_max_requests = static_cast<int>(v);
    return Status::Ok();
  }
  if (flag == "--kv-stop-write-down-seconds") {
    STRATA_ASSIGN_OR_RETURN(int64_t v, ParseInt(flag, value));
    STRATA_RETURN_IF_ERROR(CheckWriteDown(flag, v));
    c->stop_write_down_seconds = static_cast<int>(v);
    return Status::Ok();
  }
  if (flag == "--kv-lookup-timeout-ms") {
    STRATA_ASSIGN_OR_RETURN(int64_t v, ParseInt(flag, value));
    STRATA_RETURN_IF_ERROR(CheckLookupTimeout(flag, v));
    c->lookup_timeout_ms = static_cast<int>(v);
    return Status::Ok();
  }
  auto boolean = [&](bool* dst) -> Status {
    if (text != "true" && text != "false") return Bad(flag, "must be true or false, not '" + text + "'");
    *dst = text == "true";
    return Status::Ok();
  };
  if (flag == "--kv-remote") {
    STRATA_RETURN_IF_ERROR(boolean(&c->remote));
    if (c->remote) c->tiers_configured = true;
    return Status::Ok();
  }
  if (flag == "--kv-host-pin") return boolean(&c->host_pin);
  return Status::InvalidArgument("unknown kv flag " + std::string(flag));
}

Status ValidateKvCacheConfig(const KvCacheConfig& c, uint64_t effective_device_bytes,
                             std::vector<std::string>* warnings) {
  STRATA_RETURN_IF_ERROR(CheckBlockSize("kv.block_size (--kv-block-size)", c.block_size));
  STRATA_RETURN_IF_ERROR(CheckDtype("kv.dtype (--kv-dtype)", c.dtype));
  if (!c.disk_path.empty() && c.disk_bytes == 0)
    return Status::InvalidArgument(
        "kv.disk_path (--kv-disk-path) is set but kv.disk_bytes (--kv-disk-bytes) is 0: give the "
        "disk tier a size");
  if (c.disk_path.empty() && c.disk_bytes > 0)
    return Status::InvalidArgument(
        "kv.disk_bytes (--kv-disk-bytes) is set but kv.disk_path (--kv-disk-path) is empty: give "
        "the disk tier a "
        "directory");
  STRATA_ASSIGN_OR_RETURN(std::vector<TierSpec> tiers, LowerTierSpecs(c));
  const uint64_t device = c.device_bytes > 0 ? c.device_bytes : effective_device_bytes;
  // A lower tier no larger than the one above holds (at best) the same
  // blocks: it churns. Equal counts too.
  std::vector<std::string> found;
  uint64_t above = device;
  std::string above_name = "device";
  for (size_t i = 0; i < tiers.size(); ++i) {
    const TierSpec& t = tiers[i];
    if (t.kind == TierKind::kRemote) continue;  // other instances' memory: no size of its own
    if (above > 0 && t.bytes <= above) {
      // The shorthands name their size key; list entries their index.
      const std::string where = !c.tiers.empty() ? "kv.tiers[" + std::to_string(i) + "].bytes"
                                : t.kind == TierKind::kHost ? "kv.host_bytes (--kv-host-bytes)"
                                                            : "kv.disk_bytes (--kv-disk-bytes)";
      found.push_back(where + " " + std::to_string(t.bytes) + " is " +
                      (t.bytes < above ? "smaller than" : "the same size as") + " the " + above_name + " tier's " +
                      std::to_string(above) + " bytes: the " + t.name + " tier will churn");
    }
    above = t.bytes;
    above_name = t.name;
  }
  // The callers (strata serve, strata generate) log them.
  if (warnings != nullptr)
    for (auto& w : found) warnings->push_back(std::move(w));
  return Status::Ok();
}


Result<std::vector<TierSpec>> LowerTierSpecs(const KvCacheConfig& c) {
  std::vector<TierSpec> out;
  if (!c.tiers.empty()) {
    const KvCacheConfig d;
    std::vector<std::string> flat;
    if (c.host_bytes != d.host_bytes) flat.push_back("kv.host_bytes (--kv-host-bytes)");
    if (c.disk_path != d.disk_path) flat.push_back("kv.disk_path (--kv-disk-path)");
    if (c.disk_bytes != d.disk_bytes) flat.push_back("kv.disk_bytes (--kv-disk-bytes)");
    if (c.disk_admit_after != d.disk_admit_after) flat.push_back("kv.disk_admit_after (--kv-disk-admit-after)");
    if (c.host_write_policy_set) flat.push_back("kv.host_write_policy (--kv-host-write-policy)");
    if (c.disk_write_policy != d.disk_write_policy) flat.push_back("kv.disk_write_policy (--kv-disk-write-policy)");
    if (c.host_pin != d.host_pin) flat.push_back("kv.host_pin (--kv-host-pin)");
    if (!flat.empty()) {
      std::string names;
      for (const auto& f : flat) names += (names.empty() ? "" : ", ") + f;
      return Status::InvalidArgument("kv.tiers lists the tiers, so the shorthand keys and flags for one host and "
                                     "one disk tier cannot be given too: " + names);
    }
    out = c.tiers;
  } else {
    if (c.host_enabled()) {
      TierSpec h;
      h.kind = TierKind::kHost;
      h.name = "host";
      h.bytes = c.host_bytes;
      h.write_policy = c.host_write_policy;
      h.write_policy_set = c.host_write_policy_set;
      h.pin = c.host_pin;
      h.source = "kv.host_bytes (--kv-host-bytes)";
      out.push_back(std::move(h));
    }
    if (c.disk_enabled()) {
      TierSpec d;
      d.kind = TierKind::kDisk;
      d.name = "disk";
      d.bytes = c.disk_bytes;
      d.path = c.disk_path;
      d.write_policy = c.disk_write_policy;
      d.admit_after = c.disk_admit_after;
      d.source = "kv.disk_path (--kv-disk-path)";
      out.push_back(std::move(d));
    }
  }
  bool listed_remote = false;
  for (const auto& t : out) listed_remote = listed_remote || t.kind == TierKind::kRemote;
  if (c.remote && !listed_remote) {
    TierSpec r;
    r.kind = TierKind::kRemote;
    r.name = "remote";
    r.write_policy = WritePolicy::kNone;
    r.source = "kv.remote (--kv-remote)";
    out.push_back(std::move(r));
  }
  for (TierSpec& t : out) {  // the default policies of the host and disk tiers
    if (t.kind != TierKind::kHost && t.kind != TierKind::kDisk) continue;  // the remote tier evicts nothing
    if (t.eviction_policy.empty()) t.eviction_policy = c.eviction_policy;
    if (t.kind != TierKind::kHost) continue;
    if (!t.write_policy_set) t.write_policy = c.cluster ? WritePolicy::kWriteThrough : WritePolicy::kExclusive;
  }
  STRATA_RETURN_IF_ERROR(ValidateTierSpecs(out));
  return out;
}

}  // namespace strata::kvcache
