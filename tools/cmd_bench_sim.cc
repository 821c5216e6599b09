// strata bench simulate: a cluster replaying a trace in virtual time
// (bench/simulator.h; issue "strata bench"; docs/simulator.md).
// strata bench calibrate: the simulator's cost model fitted to this
// machine's forward passes (bench/calibrate.h).

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "bench/calibrate.h"
#include "bench/cost_model.h"
#include "bench/simulator.h"
#include "bench/trace.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/thread_pool.h"
#include "model/model_loader.h"
#include "kvcache/eviction_policy.h"
#include "kvcache/kv_config.h"
#include "tools/commands.h"

namespace strata::cli {
namespace {

struct SimFlags {
  std::string trace;
  std::string cluster;
  std::string profile;
  bool unlimited_cache = false;
  bool serial = false;
  int concurrency = 0;
  int tokens_per_hash_id = 0;
  double time_scale = 1.0;
  int64_t max_requests = 0;
  int max_model_len = 0;
  int max_waiting = 1024;
  std::string sweep_device_bytes, sweep_host_bytes, sweep_disk_admit_after;
  int disk_admit_after = -1;
  std::string remote;  // "true" | "false": override the cluster pool; empty = keep
  std::string host_write_policy, disk_write_policy;  // overrides; empty = keep
  std::string eviction_policy, host_eviction_policy, disk_eviction_policy;  // overrides; empty = keep
  // Overrides of the cluster file / profile; empty or 0 = keep.
  int instances = 0;
  int prefill_instances = -1;  // -1: the cluster file's
  std::string routing, device_bytes, host_bytes, disk_bytes;
  std::string slo;
  bool json = false;
  bool records = false;
};

// "1G,2G,4G" → bytes.
Result<std::vector<uint64_t>> ParseSizes(const std::string& text, const std::string& flag) {
  std::vector<uint64_t> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string part = text.substr(pos, end - pos);
    auto v = ParseByteSize(part);
    if (!v.ok() || *v == 0) return Status::InvalidArgument(flag + ": '" + part + "' is not a size > 0 (e.g. 512M, 4G)");
    out.push_back(*v);
    pos = end + 1;
  }
  return out;
}

// "ttft=2s,tpot=100ms": seconds.
Status ParseSimSlo(const std::string& text, double* ttft, double* tpot) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string part = text.substr(pos, end - pos);
    pos = end + 1;
    const size_t eq = part.find('=');
    if (eq == std::string::npos) return Status::InvalidArgument("--slo: '" + part + "' is not key=value");
    const std::string key = part.substr(0, eq);
    std::string val = part.substr(eq + 1);
    double scale = 1;
    auto ends_with = [&](const char* s) {
      const std::string suf(s);
      return val.size() > suf.size() && val.compare(val.size() - suf.size(), suf.size(), suf) == 0;
    };
    if (ends_with("ms")) {
      scale = 1e-3;
      val.resize(val.size() - 2);
    } else if (ends_with("us")) {
      scale = 1e-6;
      val.resize(val.size() - 2);
    } else if (ends_with("s")) {
      val.resize(val.size() - 1);
    }
    char* stop = nullptr;
    const double v = std::strtod(val.c_str(), &stop);
    if (val.empty() || stop == nullptr || *stop != '\0' || !(v > 0)) {
      return Status::InvalidArgument("--slo: '" + part + "' needs a positive time (2s, 100ms)");
    }
    if (key == "ttft") {
      *ttft = v * scale;
    } else if (key == "tpot") {
      *tpot = v * scale;
    } else {
      return Status::InvalidArgument("--slo: unknown key '" + key + "' (ttft, tpot)");
    }
  }
  return Status::Ok();
}

int RunSimulate(const SimFlags& f) {
  // Exit 2 for invalid input (flags, trace, cluster file), 1 otherwise.
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "strata bench simulate: %s\n", s.ToString().c_str());
    return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
  };
  bench::SimOptions o;
  if (!f.cluster.empty()) {
    auto c = bench::LoadClusterConfig(f.cluster);
    if (!c.ok()) return fail(c.error());
    o.cluster = *c;
  } else if (!f.profile.empty()) {
    auto ic = bench::ProfileInstance(f.profile);
    if (!ic.ok()) return fail(ic.error());
    o.cluster.instance = *ic;
  }
  if (f.instances > 0) o.cluster.instances = f.instances;
  if (f.prefill_instances >= 0) o.cluster.prefill_instances = f.prefill_instances;
  if (o.cluster.prefill_instances >= o.cluster.instances) {
    return fail(Status::InvalidArgument("--prefill-instances: " + std::to_string(o.cluster.prefill_instances) +
                                        " prefill instances leave no decode instance of " +
                                        std::to_string(o.cluster.instances)));
  }
  if (!f.routing.empty()) {
    o.cluster.routing = scheduler::RoutingPolicyFromName(f.routing).value();  // IsMember checked the name
  }
  for (auto [text, flag, field] : {std::tuple{&f.device_bytes, "--device-bytes", &o.cluster.instance.device_bytes},
                                   std::tuple{&f.host_bytes, "--host-bytes", &o.cluster.instance.host_bytes},
                                   std::tuple{&f.disk_bytes, "--disk-bytes", &o.cluster.instance.disk_bytes}}) {
    if (text->empty()) continue;
    auto v = ParseByteSize(*text);
    if (!v.ok()) return fail(v.error().WithContext(flag));
    *field = *v;
  }
  if (f.disk_admit_after >= 0) o.cluster.instance.disk_admit_after = static_cast<uint32_t>(f.disk_admit_after);
  if (!f.remote.empty()) o.cluster.instance.remote = f.remote == "true";
  if (!f.host_write_policy.empty()) {
    o.cluster.instance.host_write_policy = *kvcache::ParseWritePolicy(f.host_write_policy);  // checked by the flag
    o.cluster.instance.host_write_policy_set = true;
  }
  if (!f.disk_write_policy.empty())
    o.cluster.instance.disk_write_policy = *kvcache::ParseWritePolicy(f.disk_write_policy);
  if (!f.eviction_policy.empty()) o.cluster.instance.eviction_policy = f.eviction_policy;  // checked by the flag
  if (!f.host_eviction_policy.empty()) o.cluster.instance.host_eviction_policy = f.host_eviction_policy;
  if (!f.disk_eviction_policy.empty()) o.cluster.instance.disk_eviction_policy = f.disk_eviction_policy;
  o.unlimited_cache = f.unlimited_cache;
  o.serial = f.serial;
  o.concurrency = f.concurrency;
  o.tokens_per_hash_id = f.tokens_per_hash_id;
  o.time_scale = f.time_scale;
  o.max_requests = f.max_requests;
  o.max_model_len = f.max_model_len;
  o.max_waiting = f.max_waiting;
  if (Status s = ParseSimSlo(f.slo, &o.slo_ttft_s, &o.slo_tpot_s); !s.ok()) return fail(s);

  std::vector<uint64_t> sweep_values;
  std::string sweep_key;
  if ((!f.sweep_device_bytes.empty()) + (!f.sweep_host_bytes.empty()) + (!f.sweep_disk_admit_after.empty()) > 1) {
    return fail(Status::InvalidArgument(
        "give one of --sweep-device-bytes, --sweep-host-bytes and --sweep-disk-admit-after"));
  }
  if (!f.sweep_device_bytes.empty()) {
    auto v = ParseSizes(f.sweep_device_bytes, "--sweep-device-bytes");
    if (!v.ok()) return fail(v.error());
    sweep_values = *v;
    sweep_key = "device_bytes";
  } else if (!f.sweep_host_bytes.empty()) {
    auto v = ParseSizes(f.sweep_host_bytes, "--sweep-host-bytes");
    if (!v.ok()) return fail(v.error());
    sweep_values = *v;
    sweep_key = "host_bytes";
  } else if (!f.sweep_disk_admit_after.empty()) {
    std::string item;
    std::stringstream in(f.sweep_disk_admit_after);
    while (std::getline(in, item, ',')) {
      char* end = nullptr;
      const long v = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || v < 0 || v > 1000000)
        return fail(Status::InvalidArgument("--sweep-disk-admit-after: '" + item +
                                            "' is not a hit count in [0, 1000000]"));
      sweep_values.push_back(static_cast<uint64_t>(v));
    }
    sweep_key = "disk_admit_after";
  }
  if (!sweep_values.empty() && o.unlimited_cache) {
    return fail(Status::InvalidArgument("a capacity sweep and --unlimited-cache exclude each other"));
  }

  auto trace = bench::LoadTrace(f.trace);
  if (!trace.ok()) return fail(trace.error());

  auto base = bench::Simulate(*trace, o);
  if (!base.ok()) return fail(base.error());
  std::vector<std::pair<uint64_t, bench::SimResult>> sweep;
  for (uint64_t v : sweep_values) {
    bench::SimOptions so = o;
    if (sweep_key == "device_bytes") {
      so.cluster.instance.device_bytes = v;
    } else if (sweep_key == "disk_admit_after") {
      so.cluster.instance.disk_admit_after = static_cast<uint32_t>(v);
    } else {
      so.cluster.instance.host_bytes = v;
    }
    if (!f.json) std::fprintf(stderr, "simulating %s = %llu ...\n", sweep_key.c_str(), static_cast<unsigned long long>(v));
    auto r = bench::Simulate(*trace, so);
    if (!r.ok()) return fail(r.error().WithContext(sweep_key + " " + std::to_string(v)));
    r->records.clear();
    sweep.emplace_back(v, std::move(r).value());
  }
  if (f.json) {
    std::printf("%s\n", bench::SimReportJson(o, *base, sweep_key, sweep, f.records).c_str());
  } else {
    std::printf("%s", bench::SimReportText(o, *base, sweep_key, sweep).c_str());
  }
  return 0;
}

struct CalibrateFlags {
  std::string model;
  int threads = 0;
  std::string kv_dtype = "f16";
  int kv_block_size = 16;
  std::vector<int> prefill = {32, 128, 512, 2048};
  std::vector<int> batches = {1, 4, 16};
  std::vector<int> contexts = {128, 512};
  int iterations = 5;
  std::string out;
};

int RunCalibrate(const CalibrateFlags& f) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "strata bench calibrate: %s\n", s.ToString().c_str());
    return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
  };
  auto kv_dtype = DTypeFromName(f.kv_dtype);
  if (!kv_dtype) return fail(Status::InvalidArgument("unknown --kv-dtype '" + f.kv_dtype + "'"));
  auto loaded = LoadModel(f.model);
  if (!loaded) return fail(loaded.error());
  ThreadPool pool(f.threads);
  bench::CalibrateOptions o;
  o.prefill_tokens = f.prefill;
  o.decode_batches = f.batches;
  o.decode_contexts = f.contexts;
  o.iterations = f.iterations;
  o.kv_dtype = *kv_dtype;
  o.kv_block_size = f.kv_block_size;
  auto c = bench::Calibrate((*loaded)->weights, o, &pool);
  if (!c) return fail(c.error());
  const std::string json = bench::CalibrationJson(*c, f.model, pool.num_threads());
  if (!f.out.empty()) {
    std::FILE* fp = std::fopen(f.out.c_str(), "w");
    if (fp == nullptr) return fail(Status::IoError("cannot create", f.out, errno));
    const bool ok = std::fputs(json.c_str(), fp) >= 0 && std::fputc('\n', fp) != EOF;
    const int err = errno;
    if (std::fclose(fp) != 0 || !ok) return fail(Status::IoError("cannot write", f.out, ok ? errno : err));
  }
  std::printf("%s\n", json.c_str());
  std::fprintf(stderr, "cost model: a %.3g b %.3g c %.3g d %.3g e %.3g f %.3g (largest fit error: prefill %.1f%%, decode %.1f%%)\n",
               c->model.a, c->model.b, c->model.c, c->model.d, c->model.e, c->model.f,
               100 * c->prefill_max_rel_error, 100 * c->decode_max_rel_error);
  return 0;
}

}  // namespace

void RegisterBenchCalibrate(CLI::App* bench, int* exit_code) {
  auto f = std::make_shared<CalibrateFlags>();
  CLI::App* cal = bench->add_subcommand(
      "calibrate", "fit the simulator's step cost model to this machine's prefill and decode times (cost.calibrated)");
  cal->add_option("--model", f->model, "GGUF file or Hugging Face directory")->required();
  cal->add_option("--threads", f->threads, "compute threads (0 = all hardware threads), as the server will use")
      ->check(CLI::Range(0, 1024));
  cal->add_option("--kv-dtype", f->kv_dtype, "KV cache element type")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
  cal->add_option("--kv-block-size", f->kv_block_size, "KV block size in tokens")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cal->add_option("--prefill", f->prefill, "prompt lengths to time, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  cal->add_option("--batches", f->batches, "decode batch sizes, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cal->add_option("--contexts", f->contexts, "decode contexts (tokens in the KV), comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cal->add_option("--iterations", f->iterations, "timed runs per point (median)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cal->add_option("--out", f->out, "also write the JSON here (the cluster file's cost.calibrated)");
  cal->callback([f, exit_code] { *exit_code = RunCalibrate(*f); });
}

void RegisterBenchSimulate(CLI::App* bench, int* exit_code) {
  auto f = std::make_shared<SimFlags>();
  CLI::App* sim = bench->add_subcommand(
      "simulate", "replay a trace through simulated instances (real scheduler and KV policy, virtual time)");
  sim->add_option("--trace", f->trace, "Mooncake-format JSON-lines trace")->required()->check(CLI::ExistingFile);
  sim->add_option("--cluster", f->cluster, "cluster file (YAML; docs/simulator.md); default: one cpu-bench-110m instance")
      ->check(CLI::ExistingFile);
  sim->add_option("--profile", f->profile, "instance profile without a cluster file: cpu-bench-110m | h200-llama-8b")
      ->excludes("--cluster");
  sim->add_option("--instances", f->instances, "override the cluster's instance count")->check(CLI::Range(1, 4096));
  sim->add_option("--prefill-instances", f->prefill_instances,
                  "disaggregate: the first N instances prefill, the others decode (0 = colocated; "
                  "overrides the cluster's roles.prefill)")
      ->check(CLI::Range(0, 4095));
  sim->add_option("--routing", f->routing, "override the cluster's routing")
      ->check(CLI::IsMember({std::string(scheduler::RoutingPolicyName(scheduler::RoutingPolicy::kRoundRobin)),
                             std::string(scheduler::RoutingPolicyName(scheduler::RoutingPolicy::kLongestPrefix)),
                             std::string(scheduler::RoutingPolicyName(scheduler::RoutingPolicy::kLeastLoaded)),
                             std::string(scheduler::RoutingPolicyName(scheduler::RoutingPolicy::kTtft))}));
  sim->add_option("--device-bytes", f->device_bytes, "override each instance's device KV pool (e.g. 40G)");
  sim->add_option("--host-bytes", f->host_bytes, "override each instance's host tier (0 = none)");
  sim->add_option("--disk-bytes", f->disk_bytes, "override each instance's disk tier (0 = none)");
  sim->add_flag("--unlimited-cache", f->unlimited_cache, "device pools that never evict (no lower tiers)");
  sim->add_flag("--serial", f->serial, "one request at a time in trace order");
  sim->add_option("--concurrency", f->concurrency,
                  "closed loop of N users, as `bench run --concurrency N` (timestamps ignored; 0 = open loop)")
      ->check(CLI::Range(0, 1 << 20))
      ->excludes("--serial");
  sim->add_option("--tokens-per-hash-id", f->tokens_per_hash_id,
                  "tokens per hash id (0 = real lengths, 512 per id); output lengths scale by N/512")
      ->check(CLI::Range(0, 1 << 16))
      ->capture_default_str();
  sim->add_option("--time-scale", f->time_scale, "trace timestamps are multiplied by this (0.5 = twice as fast)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sim->add_option("--max-requests", f->max_requests, "the first N requests (0 = all)")
      ->check(CLI::NonNegativeNumber);
  sim->add_option("--max-model-len", f->max_model_len, "skip (and count) requests longer than this (0 = no limit)")
      ->check(CLI::NonNegativeNumber);
  sim->add_option("--max-waiting", f->max_waiting, "queued requests per instance before rejecting")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  sim->add_option("--sweep-device-bytes", f->sweep_device_bytes, "also run at each device size: 1G,2G,4G,...");
  sim->add_option("--sweep-host-bytes", f->sweep_host_bytes, "also run at each host-tier size: 8G,16G,...");
  sim->add_option("--host-write-policy", f->host_write_policy,
                  "override the host tier's write policy (write-back: blocks go down only when evicted from the "
                  "device; exclusive: write-back, and a block loaded from the tier leaves it)")
      ->check(CLI::IsMember({"write-through", "write-back", "exclusive"}));
  sim->add_option("--disk-write-policy", f->disk_write_policy, "override the disk tier's write policy")
      ->check(CLI::IsMember({"write-through", "write-back", "exclusive"}));
  sim->add_option("--kv-eviction-policy", f->eviction_policy,
                  "override the eviction policy of the device pool and the lower tiers (instance.eviction_policy)")
      ->check(CLI::IsMember(kvcache::EvictionPolicyNames()));
  sim->add_option("--host-eviction-policy", f->host_eviction_policy,
                  "override the host tier's eviction policy (instance.host_eviction_policy; default: the device's); "
                  "the device and the host tier then share one policy of this name")
      ->check(CLI::IsMember(kvcache::EvictionPolicyNames()));
  sim->add_option("--disk-eviction-policy", f->disk_eviction_policy,
                  "override the disk tier's eviction policy (instance.disk_eviction_policy; default: the device's); "
                  "a disk with the host's policy name shares the host's one policy (any write policy), "
                  "another name keeps its own")
      ->check(CLI::IsMember(kvcache::EvictionPolicyNames()));
  sim->add_option("--remote", f->remote,
                  "override the cluster pool: true = each instance also reads the others' host and disk tiers "
                  "(instance.remote)")
      ->check(CLI::IsMember({"true", "false"}));
  sim->add_option("--disk-admit-after", f->disk_admit_after,
                  "override each instance's disk admission (hits before a block is written to disk; 0 = all)")
      ->check(CLI::Range(0, 1000000));
  sim->add_option("--sweep-disk-admit-after", f->sweep_disk_admit_after,
                  "also run at each disk admission threshold: 0,1,2,4 (disk hits vs bytes written)");
  sim->add_option("--slo", f->slo, "goodput limits, e.g. ttft=2s,tpot=100ms");
  sim->add_flag("--json", f->json, "print one JSON object");
  sim->add_flag("--records", f->records, "with --json: include every request's record");
  sim->callback([f, exit_code] { *exit_code = RunSimulate(*f); });
}

}  // namespace strata::cli
