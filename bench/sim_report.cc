// SimReportJson / SimReportText (declared in bench/simulator.h).

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "bench/simulator.h"

#include "kvcache/kv_config.h"

namespace strata::bench {
namespace {

nlohmann::json Figures(const SimResult& r) {
  nlohmann::json j;
  j["requests"] = r.requests;
  j["rejected"] = r.rejected;
  j["errors"] = r.errors;
  j["skipped_over_context"] = r.skipped_over_context;
  j["skipped_over_capacity"] = r.skipped_over_capacity;
  j["hash_ids"] = r.total_ids;
  j["served_ids"] = r.served_ids;
  j["hit_ratio_blocks"] = r.hit_ratio_blocks;
  j["ideal_hit_ratio_blocks"] = r.ideal_hit_ratio_blocks;
  j["achievable_hit_ratio_blocks"] = r.achievable_hit_ratio_blocks;
  j["lost_to_overlap"] = r.lost_to_overlap;
  j["lru_hit_ratio_blocks"] = r.lru_hit_ratio_blocks;
  j["belady_hit_ratio_blocks"] = r.belady_hit_ratio_blocks;
  j["reference_capacity_ids"] = r.reference_capacity_ids;
  j["prompt_tokens"] = r.prompt_tokens;
  j["cached_tokens"] = r.cached_tokens;
  j["completion_tokens"] = r.completion_tokens;
  j["hit_ratio_tokens"] = r.hit_ratio_tokens;
  j["ttft_mean_s"] = r.ttft_mean_s;
  j["ttft_p50_s"] = r.ttft_p50_s;
  j["ttft_p90_s"] = r.ttft_p90_s;
  j["ttft_p99_s"] = r.ttft_p99_s;
  j["tpot_p50_s"] = r.tpot_p50_s;
  j["tpot_p99_s"] = r.tpot_p99_s;
  j["e2e_p50_s"] = r.e2e_p50_s;
  j["e2e_p99_s"] = r.e2e_p99_s;
  j["duration_s"] = r.duration_s;
  j["throughput_requests_per_s"] = r.throughput_requests_per_s;
  j["throughput_tokens_per_s"] = r.throughput_tokens_per_s;
  j["total_tokens_per_s"] = r.total_tokens_per_s;
  j["goodput_requests"] = r.goodput_requests;
  j["goodput_rps"] = r.goodput_rps;
  j["steps"] = r.steps;
  j["busy_s"] = r.busy_s;
  j["preemptions"] = r.preemptions;
  j["handoff_blocks"] = r.handoff_blocks;
  j["decode_waits"] = r.decode_waits;
  j["reservations_expired"] = r.reservations_expired;
  nlohmann::json tiers = nlohmann::json::array();
  for (const SimTier& t : r.tiers) {
    tiers.push_back({{"name", t.name},
                     {"hit_tokens", t.hit_tokens},
                     {"hit_ratio_tokens", r.prompt_tokens ? static_cast<double>(t.hit_tokens) / static_cast<double>(r.prompt_tokens) : 0.0},
                     {"hit_blocks", t.hit_blocks},
                     {"capacity_bytes", t.capacity_bytes},
                     {"used_bytes", t.used_bytes},
                     {"evictions", t.evictions},
                     {"bytes_written", t.bytes_written}});
  }
  j["tiers"] = std::move(tiers);
  j["wall_seconds"] = r.wall_seconds;
  return j;
}

std::string Fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string Gib(uint64_t b) { return Fmt("%.3g GiB", static_cast<double>(b) / (1024.0 * 1024 * 1024)); }

}  // namespace

std::string SimReportJson(const SimOptions& o, const SimResult& r, const std::string& sweep_key,
                          const std::vector<std::pair<uint64_t, SimResult>>& sweep, bool with_records) {
  nlohmann::json j = Figures(r);
  j["lost_to_overlap"] = o.serial ? nlohmann::json(nullptr) : nlohmann::json(r.lost_to_overlap);
  const InstanceConfig& ic = o.cluster.instance;
  j["options"] = {{"serial", o.serial},
                  {"concurrency", o.concurrency},
                  {"unlimited_cache", o.unlimited_cache},
                  {"tokens_per_hash_id", o.tokens_per_hash_id},
                  {"time_scale", o.time_scale},
                  {"max_requests", o.max_requests},
                  {"max_model_len", o.max_model_len},
                  {"slo_ttft_s", o.slo_ttft_s},
                  {"slo_tpot_s", o.slo_tpot_s}};
  j["cluster"] = {{"instances", o.cluster.instances},
                  {"slower_instances", o.cluster.slower_instances},
                  {"slower_factor", o.cluster.slower_factor},
                  {"slower_role", o.cluster.slower_role},
                  {"prefill_instances", o.cluster.prefill_instances},
                  {"transfer_bytes_per_s", o.cluster.transfer_bytes_per_s},
                  {"transfer_latency_s", o.cluster.transfer_latency_s},
                  {"routing", std::string(scheduler::RoutingPolicyName(o.cluster.routing))},
                  {"profile", ic.profile},
                  {"model", ic.model},
                  {"kv_bytes_per_token", ic.kv_bytes_per_token},
                  {"block_size", ic.block_size},
                  {"device_bytes", ic.device_bytes},
                  {"host_bytes", ic.host_bytes},
                  {"disk_bytes", ic.disk_bytes},
                  {"host_read_bytes_per_s", ic.host_read_bytes_per_s},
                  {"disk_read_bytes_per_s", ic.disk_read_bytes_per_s},
                  {"disk_admit_after", ic.disk_admit_after},
                  {"host_write_policy", std::string(kvcache::WritePolicyName(HostWritePolicy(ic)))},
                  {"disk_write_policy", std::string(kvcache::WritePolicyName(ic.disk_write_policy))},
                  {"eviction_policy", ic.eviction_policy},
                  {"host_eviction_policy", ic.host_eviction_policy.empty() ? ic.eviction_policy : ic.host_eviction_policy},
                  {"disk_eviction_policy", ic.disk_eviction_policy.empty() ? ic.eviction_policy : ic.disk_eviction_policy},
                  {"remote", ic.remote},
                  {"remote_read_bytes_per_s", ic.remote_read_bytes_per_s},
                  {"remote_latency_s", ic.remote_latency_s},
                  {"max_num_seqs", ic.max_num_seqs},
                  {"max_batch_tokens", ic.max_batch_tokens},
                  {"cost", nlohmann::json::parse(CostModelJson(ic.cost))},
                  {"cost_source", ic.cost_source}};
  std::vector<int64_t> by_instance(static_cast<size_t>(o.cluster.instances), 0);
  for (const SimRequestRecord& rec : r.records) {
    if (rec.instance >= 0 && static_cast<size_t>(rec.instance) < by_instance.size()) ++by_instance[static_cast<size_t>(rec.instance)];
  }
  j["requests_by_instance"] = by_instance;  // where each was prefilled (colocated: run)
  if (o.cluster.disaggregated()) {
    std::vector<int64_t> decoded(static_cast<size_t>(o.cluster.instances), 0);
    for (const SimRequestRecord& rec : r.records)
      if (rec.decode_instance >= 0 && static_cast<size_t>(rec.decode_instance) < decoded.size())
        ++decoded[static_cast<size_t>(rec.decode_instance)];
    j["decodes_by_instance"] = decoded;
  }
  if (!sweep.empty()) {
    nlohmann::json curve = nlohmann::json::array();
    for (const auto& [bytes, pr] : sweep) {
      nlohmann::json p = Figures(pr);
      p[sweep_key] = bytes;
      curve.push_back(std::move(p));
    }
    j["curve"] = std::move(curve);
    j["curve_key"] = sweep_key;
  }
  if (with_records) {
    nlohmann::json recs = nlohmann::json::array();
    for (const SimRequestRecord& rec : r.records) {
      recs.push_back({{"instance", rec.instance},
                      {"decode_instance", rec.decode_instance},
                      {"arrival_s", rec.arrival_s},
                      {"first_token_s", rec.first_token_s},
                      {"finish_s", rec.finish_s},
                      {"prompt_tokens", rec.prompt_tokens},
                      {"output_tokens", rec.output_tokens},
                      {"cached_tokens", rec.cached_tokens},
                      {"cached_tokens_by_tier", rec.cached_tokens_by_tier},
                      {"hash_ids", rec.hash_ids},
                      {"served_ids", rec.served_ids},
                      {"ideal_ids", rec.ideal_ids},
                      {"finish_reason", rec.finish_reason}});
    }
    j["records"] = std::move(recs);
  }
  return j.dump(2);
}

std::string SimReportText(const SimOptions& o, const SimResult& r, const std::string& sweep_key,
                          const std::vector<std::pair<uint64_t, SimResult>>& sweep) {
  const InstanceConfig& ic = o.cluster.instance;
  std::string s;
  s += "cluster: " + std::to_string(o.cluster.instances) + " x " + ic.profile + " (" + ic.model + ")" +
       (o.cluster.slower_instances > 0
            ? " (" + std::to_string(o.cluster.slower_instances) + " of them " + Fmt("%g", o.cluster.slower_factor) + "x slower)"
            : "") +
       (o.cluster.disaggregated() ? " (" + std::to_string(o.cluster.prefill_instances) + " prefill, " +
                                        std::to_string(o.cluster.instances - o.cluster.prefill_instances) + " decode)"
                                  : "") +
       ", routing " +
       (std::string(scheduler::RoutingPolicyName(o.cluster.routing))) + ", device " +
       (o.unlimited_cache ? std::string("unlimited") : Gib(ic.device_bytes)) + ", host " + Gib(ic.host_bytes) +
       ", disk " + Gib(ic.disk_bytes) + (o.serial ? ", serial" : "") +
       (o.concurrency > 0 ? ", closed loop of " + std::to_string(o.concurrency) + " users" : "") + "\n";
  s += "requests: " + std::to_string(r.requests) + " finished, " + std::to_string(r.rejected) + " rejected, " +
       std::to_string(r.errors) + " errors, " + std::to_string(r.skipped_over_context) + " skipped (context), " +
       std::to_string(r.skipped_over_capacity) + " skipped (larger than a device pool)\n";
  s += "hit ratio: blocks " + Fmt("%.6f", r.hit_ratio_blocks) + " (ideal " + Fmt("%.6f", r.ideal_hit_ratio_blocks) +
       ", achievable at this block size " + Fmt("%.6f", r.achievable_hit_ratio_blocks) +
       (o.serial ? "" : ", lost to overlap " + Fmt("%.6f", r.lost_to_overlap)) + "), tokens " +
       Fmt("%.6f", r.hit_ratio_tokens) + "\n";
  s += "  one flat cache of the same total size (" + std::to_string(r.reference_capacity_ids) +
       " hash ids), serial: LRU " + Fmt("%.6f", r.lru_hit_ratio_blocks) + ", Belady MIN " +
       Fmt("%.6f", r.belady_hit_ratio_blocks) + "\n";
  s += "  by tier (tokens):";
  for (const SimTier& t : r.tiers)
    s += " " + t.name + " " +
         Fmt("%.4f", r.prompt_tokens ? static_cast<double>(t.hit_tokens) / static_cast<double>(r.prompt_tokens) : 0.0) +
         (t.name == "device" ? "" : " (" + Gib(t.bytes_written) + " written)");
  s += "\n";
  s += "TTFT: mean " + Fmt("%.3f", r.ttft_mean_s) + " s, p50 " + Fmt("%.3f", r.ttft_p50_s) + " s, p99 " +
       Fmt("%.3f", r.ttft_p99_s) + " s; TPOT p50 " + Fmt("%.4f", r.tpot_p50_s) + " s; E2E p50 " +
       Fmt("%.3f", r.e2e_p50_s) + " s\n";
  s += "throughput: " + Fmt("%.1f", r.throughput_tokens_per_s) + " output tok/s, " +
       Fmt("%.3f", r.throughput_requests_per_s) + " req/s; goodput " + Fmt("%.3f", r.goodput_rps) +
       " req/s over " + Fmt("%.1f", r.duration_s) + " s (virtual)\n";
  s += "simulated in " + Fmt("%.2f", r.wall_seconds) + " s (" + std::to_string(r.steps) + " steps, " +
       std::to_string(r.preemptions) + " preemptions)\n";
  if (!sweep.empty()) {
    s += "\n" + sweep_key + "  hit_ratio_blocks  hit_ratio_tokens  ttft_p50_s  ttft_p99_s  output_tok/s\n";
    for (const auto& [bytes, pr] : sweep) {
      const std::string key = sweep_key == "disk_admit_after" ? std::to_string(bytes) : Gib(bytes);
      std::string disk;
      for (const SimTier& t : pr.tiers)
        if (t.name == "disk")
          disk = "  disk: hits " +
                 Fmt("%.4f", pr.prompt_tokens ? static_cast<double>(t.hit_tokens) / static_cast<double>(pr.prompt_tokens)
                                              : 0.0) +
                 " of tokens, " + Gib(t.bytes_written) + " written";
      s += key + "  " + Fmt("%.6f", pr.hit_ratio_blocks) + "  " + Fmt("%.6f", pr.hit_ratio_tokens) + "  " +
           Fmt("%.3f", pr.ttft_p50_s) + "  " + Fmt("%.3f", pr.ttft_p99_s) + "  " +
           Fmt("%.1f", pr.throughput_tokens_per_s) + disk + "\n";
    }
  }
  return s;
}

}  // namespace strata::bench
