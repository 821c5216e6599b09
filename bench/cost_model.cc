#include "bench/cost_model.h"

#include "kvcache/eviction_policy.h"

#include "kvcache/kv_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/mapped_file.h"
#include "model/synth.h"

namespace strata::bench {
namespace {

constexpr const char* kCostKeys[] = {"a", "b", "c", "d", "e", "f"};

double* CostField(CostModel& m, int i) {
  double* f[] = {&m.a, &m.b, &m.c, &m.d, &m.e, &m.f};
  return f[i];
}

}  // namespace

namespace {

Result<CostModel> CostModelFromJson(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return Status::InvalidArgument(where + ": not a JSON object");
  CostModel m;
  for (int i = 0; i < 6; ++i) {
    auto it = j.find(kCostKeys[i]);
    if (it == j.end()) continue;
    if (!it->is_number()) return Status::InvalidArgument(where + ": '" + kCostKeys[i] + "' is not a number");
    const double v = it->get<double>();
    if (!(v >= 0) || !std::isfinite(v)) return Status::InvalidArgument(where + ": '" + kCostKeys[i] + "' must be >= 0");
    *CostField(m, i) = v;
  }
  return m;
}

Result<nlohmann::json> ReadJsonObject(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument(path + ": not a JSON object");
  return j;
}

}  // namespace

Result<CostModel> LoadCostModel(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonObject(path));
  return CostModelFromJson(j, path);
}

Result<ClusterCalibration> LoadClusterCalibration(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonObject(path));
  ClusterCalibration c;
  if (!j.contains("instances")) {
    STRATA_ASSIGN_OR_RETURN(c.default_model, CostModelFromJson(j, path));
    return c;
  }
  if (!j["instances"].is_object()) return Status::InvalidArgument(path + ": 'instances' is not an object");
  for (const auto& [name, m] : j["instances"].items()) {
    STRATA_ASSIGN_OR_RETURN(CostModel cm, CostModelFromJson(m, path + ": instances." + name));
    c.instances[name] = cm;
  }
  if (j.contains("default")) {
    STRATA_ASSIGN_OR_RETURN(c.default_model, CostModelFromJson(j["default"], path + ": default"));
  }
  return c;
}

std::string CostModelJson(const CostModel& m) {
  nlohmann::json j = {{"a", m.a}, {"b", m.b}, {"c", m.c}, {"d", m.d}, {"e", m.e}, {"f", m.f}};
  return j.dump();
}

Result<uint64_t> KvBytesPerToken(const std::string& model, const std::string& dtype) {
  uint64_t elem = 0;
  if (dtype == "f16" || dtype == "bf16") {
    elem = 2;
  } else if (dtype == "f32") {
    elem = 4;
  } else {
    return Status::InvalidArgument("kv_dtype '" + dtype + "' (f16, bf16, f32)");
  }
  if (model == "llama-8b") return uint64_t{2} * 32 * 8 * 128 * elem;  // Llama-3-8B: GQA 8 KV heads
  STRATA_ASSIGN_OR_RETURN(ModelConfig c, SynthPresetConfig(model, 0));
  return uint64_t{2} * static_cast<uint64_t>(c.n_layers) * static_cast<uint64_t>(c.n_kv_heads) *
         static_cast<uint64_t>(c.head_dim) * elem;
}

std::vector<std::string> ProfileNames() { return {"cpu-bench-110m", "h200-llama-8b"}; }

Result<InstanceConfig> ProfileInstance(const std::string& name) {
  InstanceConfig ic;
  ic.profile = name;
  ic.cost_source = "profile " + name;
  ic.block_size = 16;
  constexpr uint64_t kG = uint64_t{1} << 30;
  if (name == "cpu-bench-110m") {
    // `strata serve` defaults on this machine: bench-110m, f16 KV, 64
    // sequences, 512 tokens per step, a 4 GiB device pool, no lower tiers.
    ic.model = "bench-110m";
    STRATA_ASSIGN_OR_RETURN(ic.kv_bytes_per_token, KvBytesPerToken("bench-110m", "f16"));
    ic.device_bytes = 4 * kG;
    ic.max_num_seqs = 64;
    ic.max_batch_tokens = 512;
    // Host tier: a memcpy (about 10 GB/s on this loaded machine); disk: one
    // virtual disk (about 1 GB/s, an assumption).
    ic.host_read_bytes_per_s = ic.host_write_bytes_per_s = 10e9;
    ic.disk_read_bytes_per_s = ic.disk_write_bytes_per_s = 1e9;
    // Fitted to docs/PERFORMANCE.md run 3 (bench-110m f32, 2 threads):
    // decode 29.7 / 123 / 416 ms per step at batch 1 / 8 / 32 (context 512)
    // → d + (e + 512 f) B with d = 17.2 ms, e + 512 f = 12.46 ms, of which
    // ~10% is attention (its share of flops at context 512); prefill of 512
    // tokens 1.44 s (356 tok/s) with ~5% attention.
    ic.cost = CostModel{0.0, 2.67e-3, 5.5e-7, 0.0172, 0.0112, 2.4e-6};
  } else if (name == "h200-llama-8b") {
    // ASSUMPTIONS (not measured here): Llama-3-8B bf16 on one H200 (141 GB
    // HBM3e at 4.8 TB/s, ~790 dense bf16 TFLOP/s). KV pool ~100 GB after
    // 16 GB of weights and activations; host DRAM over PCIe 5 (~50 GB/s);
    // one NVMe drive (6 GB/s read, 3 GB/s write).
    ic.model = "llama-8b";
    STRATA_ASSIGN_OR_RETURN(ic.kv_bytes_per_token, KvBytesPerToken("llama-8b", "bf16"));
    ic.device_bytes = 100 * kG;
    ic.host_bytes = 0;
    ic.disk_bytes = 0;
    ic.max_num_seqs = 256;
    ic.max_batch_tokens = 8192;
    ic.host_read_bytes_per_s = ic.host_write_bytes_per_s = 50e9;
    ic.disk_read_bytes_per_s = 6e9;
    ic.disk_write_bytes_per_s = 3e9;
    // Prefill: 16 GFLOP per token at ~40% of peak → b = 5e-5 s (20k tok/s,
    // the scale vLLM reports for 8B models on H100/H200); attention 4·L·dim
    // = 0.5 MFLOP per token per context position at ~250 TFLOP/s → c = 2e-12.
    // Decode: 16 GB of weights at ~3.3 TB/s effective → d = 5 ms (+1 ms
    // launch overhead); e = 4e-5 s per sequence (its matmul share); f: 128 KiB
    // of KV per context position at ~3.3 TB/s → 4e-8 s.
    ic.cost = CostModel{0.004, 5e-5, 2e-12, 0.006, 4e-5, 4e-8};
  } else {
    return Status::InvalidArgument("unknown profile '" + name + "' (cpu-bench-110m, h200-llama-8b)");
  }
  return ic;
}

ClusterConfig DefaultCluster() {
  ClusterConfig c;
  c.instance = std::move(ProfileInstance("cpu-bench-110m")).value();
  return c;
}

namespace {

// `roles.*` and `slower.role` (after instances and slower.instances).
Status ParseRoles(const Config& cfg, ClusterConfig* out) {
  const std::string& origin = cfg.origin();
  STRATA_ASSIGN_OR_RETURN(int64_t prefill, cfg.GetInt("roles.prefill", 0));
  if (prefill < 0 || (prefill > 0 && prefill >= out->instances))
    return Status::InvalidArgument(origin + ": roles.prefill must be 0 (colocated) or in [1, instances - 1]");
  out->prefill_instances = static_cast<int>(prefill);
  STRATA_ASSIGN_OR_RETURN(uint64_t bw, cfg.GetBytes("roles.transfer_bytes_per_s", 0));
  out->transfer_bytes_per_s = static_cast<double>(bw);
  STRATA_ASSIGN_OR_RETURN(int64_t lat_us, cfg.GetInt("roles.transfer_latency_us", 0));
  if (lat_us < 0 || lat_us > 10000000)
    return Status::InvalidArgument(origin + ": roles.transfer_latency_us must be in [0, 10000000]");
  out->transfer_latency_s = static_cast<double>(lat_us) / 1e6;
  STRATA_ASSIGN_OR_RETURN(out->slower_role, cfg.GetString("slower.role", ""));
  if (!out->slower_role.empty()) {
    if (out->slower_role != "prefill" && out->slower_role != "decode")
      return Status::InvalidArgument(origin + ": slower.role must be prefill or decode, not '" + out->slower_role + "'");
    if (prefill == 0) return Status::InvalidArgument(origin + ": slower.role needs roles.prefill");
    const int group = out->slower_role == "prefill" ? out->prefill_instances : out->instances - out->prefill_instances;
    if (out->slower_instances > group)
      return Status::InvalidArgument(origin + ": slower.instances exceeds the " + out->slower_role + " instances");
  }
  return Status::Ok();
}

}  // namespace

Result<ClusterConfig> ParseClusterConfig(const Config& cfg, const std::string& base_dir) {
  static const std::vector<std::string> kKnown = {
      "instances", "routing", "instance.profile", "instance.model", "instance.kv_dtype",
      "instance.kv_bytes_per_token", "instance.block_size", "instance.device_bytes", "instance.host_bytes",
      "instance.disk_bytes", "instance.host_read_bytes_per_s", "instance.host_write_bytes_per_s",
      "instance.disk_read_bytes_per_s", "instance.disk_write_bytes_per_s", "instance.disk_admit_after",
      "instance.remote", "instance.remote_read_bytes_per_s", "instance.remote_latency_us",
      "instance.host_write_policy", "instance.disk_write_policy", "instance.eviction_policy", "instance.host_eviction_policy",
      "instance.disk_eviction_policy",
      "instance.max_num_seqs",
      "instance.max_batch_tokens", "instance.cost.a", "instance.cost.b", "instance.cost.c", "instance.cost.d",
      "instance.cost.e", "instance.cost.f", "instance.cost.calibrated", "slower.instances", "slower.factor", "slower.role",
      "roles.prefill", "roles.transfer_bytes_per_s", "roles.transfer_latency_us"};
  STRATA_RETURN_IF_ERROR(cfg.CheckKnownKeys(kKnown));
  const std::string& origin = cfg.origin();
  ClusterConfig out;
  STRATA_ASSIGN_OR_RETURN(int64_t n, cfg.GetInt("instances", 1));
  if (n < 1 || n > 4096) return Status::InvalidArgument(origin + ": instances must be in [1, 4096]");
  out.instances = static_cast<int>(n);
  STRATA_ASSIGN_OR_RETURN(std::string routing, cfg.GetString("routing", "round-robin"));
  const auto policy = scheduler::RoutingPolicyFromName(routing);
  if (!policy)
    return Status::InvalidArgument(origin + ": routing '" + routing + "' (" + scheduler::RoutingPolicyNames() + ")");
  out.routing = *policy;
  STRATA_ASSIGN_OR_RETURN(int64_t slower, cfg.GetInt("slower.instances", 0));
  if (slower < 0 || slower > n) return Status::InvalidArgument(origin + ": slower.instances must be in [0, instances]");
  out.slower_instances = static_cast<int>(slower);
  STRATA_ASSIGN_OR_RETURN(out.slower_factor, cfg.GetDouble("slower.factor", 1));
  if (!(out.slower_factor >= 1) || out.slower_factor > 1000)
    return Status::InvalidArgument(origin + ": slower.factor must be in [1, 1000]");
  STRATA_RETURN_IF_ERROR(ParseRoles(cfg, &out));

  STRATA_ASSIGN_OR_RETURN(std::string profile, cfg.GetString("instance.profile", "cpu-bench-110m"));
  auto base = ProfileInstance(profile);
  if (!base.ok()) return base.error().WithContext(origin + ": instance.profile");
  InstanceConfig ic = std::move(base).value();

  STRATA_ASSIGN_OR_RETURN(std::string model, cfg.GetString("instance.model", ic.model));
  STRATA_ASSIGN_OR_RETURN(std::string dtype, cfg.GetString("instance.kv_dtype", "f16"));
  if (model != ic.model || cfg.Has("instance.kv_dtype")) {
    auto kvb = KvBytesPerToken(model, dtype);
    if (!kvb.ok()) return kvb.error().WithContext(origin + ": instance.model / kv_dtype");
    ic.kv_bytes_per_token = *kvb;
    ic.model = model;
  }
  STRATA_ASSIGN_OR_RETURN(ic.kv_bytes_per_token, cfg.GetBytes("instance.kv_bytes_per_token", ic.kv_bytes_per_token));
  if (ic.kv_bytes_per_token == 0) return Status::InvalidArgument(origin + ": instance.kv_bytes_per_token must be > 0");
  STRATA_ASSIGN_OR_RETURN(int64_t bs, cfg.GetInt("instance.block_size", ic.block_size));
  if (bs < 1 || bs > 4096) return Status::InvalidArgument(origin + ": instance.block_size must be in [1, 4096]");
  ic.block_size = static_cast<int>(bs);
  STRATA_ASSIGN_OR_RETURN(ic.device_bytes, cfg.GetBytes("instance.device_bytes", ic.device_bytes));
  STRATA_ASSIGN_OR_RETURN(ic.host_bytes, cfg.GetBytes("instance.host_bytes", ic.host_bytes));
  STRATA_ASSIGN_OR_RETURN(ic.disk_bytes, cfg.GetBytes("instance.disk_bytes", ic.disk_bytes));
  auto bw = [&](const char* key, double* v) -> Status {
    STRATA_ASSIGN_OR_RETURN(uint64_t b, cfg.GetBytes(key, static_cast<uint64_t>(*v)));
    *v = static_cast<double>(b);
    return Status::Ok();
  };
  STRATA_RETURN_IF_ERROR(bw("instance.host_read_bytes_per_s", &ic.host_read_bytes_per_s));
  STRATA_RETURN_IF_ERROR(bw("instance.host_write_bytes_per_s", &ic.host_write_bytes_per_s));
  STRATA_RETURN_IF_ERROR(bw("instance.disk_read_bytes_per_s", &ic.disk_read_bytes_per_s));
  STRATA_RETURN_IF_ERROR(bw("instance.disk_write_bytes_per_s", &ic.disk_write_bytes_per_s));
  for (auto [key, field] : {std::pair{"instance.host_write_policy", &ic.host_write_policy},
                             std::pair{"instance.disk_write_policy", &ic.disk_write_policy}}) {
    if (!cfg.Has(key)) continue;
    STRATA_ASSIGN_OR_RETURN(std::string text, cfg.GetString(key, ""));
    auto wp = kvcache::ParseWritePolicy(text);
    if (!wp.ok() || *wp == kvcache::WritePolicy::kNone)
      return Status::InvalidArgument(origin + ": " + key + " must be write-through, write-back or exclusive, not '" + text + "'");
    *field = *wp;
    if (field == &ic.host_write_policy) ic.host_write_policy_set = true;
  }
  STRATA_ASSIGN_OR_RETURN(ic.eviction_policy, cfg.GetString("instance.eviction_policy", ic.eviction_policy));
  if (!kvcache::IsEvictionPolicy(ic.eviction_policy))
    return kvcache::MakeEvictionPolicy(ic.eviction_policy, 0).status().WithContext(origin + ": instance.eviction_policy");
  STRATA_ASSIGN_OR_RETURN(ic.host_eviction_policy,
                          cfg.GetString("instance.host_eviction_policy", ic.host_eviction_policy));
  if (!ic.host_eviction_policy.empty() && !kvcache::IsEvictionPolicy(ic.host_eviction_policy))
    return kvcache::MakeEvictionPolicy(ic.host_eviction_policy, 0).status().WithContext(origin + ": instance.host_eviction_policy");
  STRATA_ASSIGN_OR_RETURN(ic.disk_eviction_policy,
                          cfg.GetString("instance.disk_eviction_policy", ic.disk_eviction_policy));
  if (!ic.disk_eviction_policy.empty() && !kvcache::IsEvictionPolicy(ic.disk_eviction_policy))
    return kvcache::MakeEvictionPolicy(ic.disk_eviction_policy, 0).status().WithContext(origin + ": instance.disk_eviction_policy");
  STRATA_ASSIGN_OR_RETURN(ic.remote, cfg.GetBool("instance.remote", ic.remote));
  STRATA_RETURN_IF_ERROR(bw("instance.remote_read_bytes_per_s", &ic.remote_read_bytes_per_s));
  STRATA_ASSIGN_OR_RETURN(int64_t lat_us, cfg.GetInt("instance.remote_latency_us",
                                                     static_cast<int64_t>(std::llround(ic.remote_latency_s * 1e6))));
  if (lat_us < 0 || lat_us > 10000000)
    return Status::InvalidArgument(origin + ": instance.remote_latency_us must be in [0, 10000000]");
  ic.remote_latency_s = static_cast<double>(lat_us) / 1e6;
  STRATA_ASSIGN_OR_RETURN(int64_t admit, cfg.GetInt("instance.disk_admit_after", ic.disk_admit_after));
  if (admit < 0 || admit > 1000000)
    return Status::InvalidArgument(origin + ": instance.disk_admit_after must be in [0, 1000000]");
  ic.disk_admit_after = static_cast<uint32_t>(admit);
  STRATA_ASSIGN_OR_RETURN(int64_t seqs, cfg.GetInt("instance.max_num_seqs", ic.max_num_seqs));
  if (seqs < 1 || seqs > 65536) return Status::InvalidArgument(origin + ": instance.max_num_seqs must be in [1, 65536]");
  ic.max_num_seqs = static_cast<int>(seqs);
  STRATA_ASSIGN_OR_RETURN(int64_t mbt, cfg.GetInt("instance.max_batch_tokens", ic.max_batch_tokens));
  if (mbt < 1 || mbt > (1 << 20)) {
    return Status::InvalidArgument(origin + ": instance.max_batch_tokens must be in [1, 1048576]");
  }
  ic.max_batch_tokens = static_cast<int>(mbt);

  STRATA_ASSIGN_OR_RETURN(std::string calibrated, cfg.GetString("instance.cost.calibrated", ""));
  if (!calibrated.empty()) {
    std::filesystem::path p(calibrated);
    if (p.is_relative() && !base_dir.empty()) p = std::filesystem::path(base_dir) / p;
    auto m = LoadCostModel(p.string());
    if (!m.ok()) return m.error().WithContext(origin + ": instance.cost.calibrated");
    ic.cost = *m;
    ic.cost_source = "file " + p.string();
  }
  for (int i = 0; i < 6; ++i) {
    const std::string key = std::string("instance.cost.") + kCostKeys[i];
    if (!cfg.Has(key)) continue;
    STRATA_ASSIGN_OR_RETURN(double v, cfg.GetDouble(key, 0));
    if (!(v >= 0) || !std::isfinite(v)) return Status::InvalidArgument(origin + ": " + key + " must be >= 0");
    *CostField(ic.cost, i) = v;
    ic.cost_source += (ic.cost_source.find("overridden") == std::string::npos) ? ", overridden by the cluster file" : "";
  }
  if (ic.block_bytes() == 0 || ic.device_bytes / ic.block_bytes() < 1) {
    return Status::InvalidArgument(origin + ": instance.device_bytes holds no block of " +
                                   std::to_string(ic.block_bytes()) + " bytes");
  }
  out.instance = std::move(ic);
  return out;
}

std::string_view ClusterConfig::RoleName(int i) const {
  if (!disaggregated()) return "both";
  return i < prefill_instances ? "prefill" : "decode";
}

CostModel ClusterConfig::InstanceCost(int i) const {
  CostModel m = instance.cost;
  const int end = slower_role == "prefill" ? prefill_instances : instances;  // the slower group ends here
  if (i >= end || i < end - slower_instances) return m;
  for (double* v : {&m.a, &m.b, &m.c, &m.d, &m.e, &m.f}) *v *= slower_factor;
  return m;
}

Result<ClusterConfig> LoadClusterConfig(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(Config cfg, Config::LoadFile(path));
  return ParseClusterConfig(cfg, std::filesystem::path(path).parent_path().string());
}

}  // namespace strata::bench
