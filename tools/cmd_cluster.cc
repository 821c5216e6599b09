// strata cluster: what an operator asks of a running cluster
// (docs/disaggregation.md).
//
//   status   every instance in the metadata (--metadata etcd://…|strata://…):
//            name, role, model, addresses, whether it answers, its requests
//            and queue, its prefill rate and decode step (measured, and
//            calibrated), and its KV use per tier (GET /internal/pd/status).
//   predict  what a `--routing ttft` router would predict for a prompt on
//            each prefill candidate (POST /internal/pd/lookup; the same
//            scheduler::PredictTtftSeconds), and which one it would pick.
//            The prompt is tokenized by one of the instances (/tokenize), so
//            no model file is needed here. A router's own in-flight requests
//            (sent, not yet queued there) are not known to this command.
//
// Both take --cluster-secret-file (the /internal/ routes' bearer token) and
// print a table, or one JSON object with --json. Exit 1 when the metadata
// cannot be read (status) or no candidate answers (predict).

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cluster/pd_wire.h"
#include "common/http_client.h"
#include "scheduler/router.h"
#include "tools/commands.h"
#include "tools/transfer_flags.h"
#include "transfer/metadata.h"
#include "transfer/wire.h"

namespace strata::cli {

namespace {

using nlohmann::json;

struct ClusterFlags {
  std::string metadata;
  std::string secret_file;
  std::string model;  // only instances serving this model name ("" = all)
  std::string api_key;
  std::string prompt;
  double timeout_s = 2;
  bool json = false;
};

int Fail(const char* cmd, const Status& s) {
  std::fprintf(stderr, "strata cluster %s: %s\n", cmd, s.message().c_str());
  return 1;
}

// The host and port of an instance's "host:port" address (transfer::SplitHostPort).
bool SplitAddress(const std::string& address, std::string* host, int* port) {
  auto hp = transfer::SplitHostPort(address);
  if (!hp) return false;
  *host = hp->first;
  *port = hp->second;
  return true;
}

std::string Describe(const Result<HttpResponse>& r) {
  if (!r) return r.error().message();
  return "HTTP " + std::to_string(r->status) + ": " + r->body.substr(0, 200);
}

// The instances (of --model, when given) and the bearer for their routes.
Result<std::vector<transfer::InstanceInfo>> ListInstances(const ClusterFlags& f, HeaderList* auth) {
  STRATA_ASSIGN_OR_RETURN(auto url, transfer::ParseMetadataUrl(f.metadata));
  std::string bearer;
  if (!f.secret_file.empty()) {
    STRATA_ASSIGN_OR_RETURN(std::string secret, ReadClusterSecret(f.secret_file));
    bearer = transfer::ClusterBearer(secret);
    auth->emplace_back("Authorization", "Bearer " + bearer);
  }
  STRATA_ASSIGN_OR_RETURN(auto client, transfer::MetadataClient::Create(url, f.timeout_s, bearer));
  STRATA_ASSIGN_OR_RETURN(auto all, client->List());
  std::vector<transfer::InstanceInfo> out;
  for (auto& i : all) {
    if (f.model.empty() || i.model == f.model) out.push_back(std::move(i));
  }
  return out;
}

// GET /internal/pd/status of `i`, as JSON; an error object when it does not answer.
json InstanceStatus(const transfer::InstanceInfo& i, const HeaderList& auth, double timeout_s) {
  json j{{"name", i.name},
         {"role", i.role},
         {"model", i.model},
         {"http_address", i.http_address},
         {"transfer_address", i.transfer_address},
         {"incarnation", i.incarnation},
         {"registered_unix_ms", i.registered_unix_ms}};
  std::string host;
  int port = 0;
  if (!SplitAddress(i.http_address, &host, &port)) {
    j["healthy"] = false;
    j["error"] = "no HTTP address";
    return j;
  }
  auto r = HttpCall(host, port, "GET", "/internal/pd/status", "", auth, timeout_s);
  json st = r && r->status == 200 ? json::parse(r->body, nullptr, false) : json();
  if (!st.is_object()) {
    j["healthy"] = false;
    j["error"] = Describe(r);
    return j;
  }
  j["healthy"] = !st.value("draining", false);
  j["status"] = st;
  return j;
}

void PrintStatusTable(const json& instances) {
  std::printf("%-16s %-8s %-7s %-21s %4s %4s %8s %10s %10s  %s\n", "NAME", "ROLE", "HEALTH", "HTTP", "RUN", "WAIT",
              "QUEUE", "PREFILL/s", "DECODE ms", "KV USE BY TIER");
  for (const json& i : instances) {
    const std::string health = i.value("healthy", false) ? "ok" : (i.contains("status") ? "drain" : "down");
    if (!i.contains("status")) {
      std::printf("%-16s %-8s %-7s %-21s  (%s)\n", i.value("name", "").c_str(), i.value("role", "").c_str(),
                  health.c_str(), i.value("http_address", "").c_str(), i.value("error", "").c_str());
      continue;
    }
    const json& s = i["status"];
    std::string tiers;
    for (const json& t : s.value("tiers", json::array())) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "%s%s %.0f%% of %.0f MiB", tiers.empty() ? "" : ", ",
                    t.value("name", "").c_str(), 100 * t.value("usage_ratio", 0.0),
                    t.value("capacity_bytes", 0.0) / (1 << 20));
      tiers += buf;
    }
    std::printf("%-16s %-8s %-7s %-21s %4d %4d %8lld %10.0f %10.2f  %s\n", i.value("name", "").c_str(),
                i.value("role", "").c_str(), health.c_str(), i.value("http_address", "").c_str(),
                s.value("running", 0), s.value("waiting", 0),
                static_cast<long long>(s.value("pending_prefill_tokens", int64_t{0})),
                s.value("prefill_tokens_per_s", 0.0), 1e3 * s.value("decode_step_seconds", 0.0), tiers.c_str());
  }
}

int RunStatus(const ClusterFlags& f) {
  HeaderList auth;
  auto list = ListInstances(f, &auth);
  if (!list) return Fail("status", list.error());
  json instances = json::array();
  for (const auto& i : *list) instances.push_back(InstanceStatus(i, auth, f.timeout_s));
  if (f.json) {
    std::printf("%s\n", json{{"metadata", f.metadata}, {"instances", instances}}.dump(2).c_str());
  } else {
    PrintStatusTable(instances);
  }
  return 0;
}

// The prompt's tokens from the first instance that tokenizes it.
Result<std::vector<int32_t>> Tokenize(const ClusterFlags& f, const std::vector<transfer::InstanceInfo>& list) {
  HeaderList h;
  if (!f.api_key.empty()) h.emplace_back("Authorization", "Bearer " + f.api_key);
  std::string why = "no instance";
  for (const auto& i : list) {
    std::string host;
    int port = 0;
    if (!SplitAddress(i.http_address, &host, &port)) continue;
    auto r = HttpCall(host, port, "POST", "/tokenize", json{{"prompt", f.prompt}}.dump(), h, f.timeout_s);
    json j = r && r->status == 200 ? json::parse(r->body, nullptr, false) : json();
    if (j.is_object() && j.contains("tokens") && j["tokens"].is_array()) return j["tokens"].get<std::vector<int32_t>>();
    why = i.name + ": " + Describe(r);
  }
  return Status::Unavailable("tokenizing the prompt: " + why);
}

int RunPredict(const ClusterFlags& f) {
  HeaderList auth;
  auto list = ListInstances(f, &auth);
  if (!list) return Fail("predict", list.error());
  std::erase_if(*list, [](const transfer::InstanceInfo& i) { return i.role != "prefill" && i.role != "both"; });
  auto tokens = Tokenize(f, *list);
  if (!tokens) return Fail("predict", tokens.error());
  const std::string q = cluster::LookupRequestToJson({*tokens, ""});
  std::vector<scheduler::RouteCandidate> rc;
  std::vector<const transfer::InstanceInfo*> who;
  std::vector<cluster::LookupReply> replies;
  for (const auto& i : *list) {
    std::string host;
    int port = 0;
    if (!SplitAddress(i.http_address, &host, &port)) continue;
    auto r = HttpCall(host, port, "POST", "/internal/pd/lookup", q, auth, f.timeout_s);
    auto a = r && r->status == 200 ? cluster::LookupReplyFromJson(r->body)
                                   : Result<cluster::LookupReply>(Status::Unavailable(Describe(r)));
    if (!a) {
      std::fprintf(stderr, "strata cluster predict: %s: %s\n", i.name.c_str(), a.error().message().c_str());
      continue;
    }
    scheduler::RouteCandidate c;
    c.cached_tokens = a->cached_tokens;
    c.uncached_tokens = static_cast<int64_t>(tokens->size()) - a->cached_tokens;
    c.queue_tokens = a->pending_prefill_tokens;
    c.prefill_tokens_per_s = a->prefill_tokens_per_s;
    c.load_seconds = a->load_seconds;
    c.queue_done_seconds = a->step_elapsed_seconds;
    c.unfinished = a->running + a->waiting;
    rc.push_back(c);
    who.push_back(&i);
    replies.push_back(*a);
  }
  if (rc.empty()) return Fail("predict", Status::Unavailable("no prefill instance answered"));
  const double mean = scheduler::MeanKnownPrefillRate(rc);
  scheduler::Router router(scheduler::RoutingPolicy::kTtft);
  const size_t pick = router.Pick(rc);
  json cands = json::array();
  for (size_t k = 0; k < rc.size(); ++k) {
    const double ttft = scheduler::PredictTtftSeconds(rc[k], mean);
    cands.push_back({{"name", who[k]->name},
                     {"role", who[k]->role},
                     {"cached_tokens", rc[k].cached_tokens},
                     {"device_cached_tokens", replies[k].device_cached_tokens},
                     {"uncached_tokens", rc[k].uncached_tokens},
                     {"queue_tokens", rc[k].queue_tokens},
                     {"prefill_tokens_per_s", rc[k].prefill_tokens_per_s},
                     {"load_seconds", rc[k].load_seconds},
                     {"decode_step_seconds", replies[k].decode_step_seconds},
                     {"predicted_ttft_seconds", ttft >= 0 ? json(ttft) : json(nullptr)},
                     {"chosen", k == pick}});
  }
  if (f.json) {
    std::printf("%s\n", json{{"prompt_tokens", tokens->size()}, {"routing", "ttft"}, {"candidates", cands}}.dump(2).c_str());
    return 0;
  }
  std::printf("prompt: %zu tokens; routing ttft\n", tokens->size());
  std::printf("%-16s %7s %7s %8s %10s %8s %12s\n", "NAME", "CACHED", "TO RUN", "QUEUE", "PREFILL/s", "LOAD ms",
              "TTFT ms");
  for (const json& c : cands) {
    const json& t = c["predicted_ttft_seconds"];
    std::printf("%-16s %7d %7lld %8lld %10.0f %8.2f %12s%s\n", c["name"].get<std::string>().c_str(),
                c["cached_tokens"].get<int>(), static_cast<long long>(c["uncached_tokens"].get<int64_t>()),
                static_cast<long long>(c["queue_tokens"].get<int64_t>()), c["prefill_tokens_per_s"].get<double>(),
                1e3 * c["load_seconds"].get<double>(),
                t.is_null() ? "unknown" : std::to_string(static_cast<int64_t>(1e3 * t.get<double>())).c_str(),
                c["chosen"].get<bool>() ? "  <- chosen" : "");
  }
  return 0;
}

void AddCommon(CLI::App* cmd, ClusterFlags* f) {
  cmd->add_option("--metadata", f->metadata, "the cluster metadata: etcd://HOST:PORT or strata://HOST:PORT")->required();
  cmd->add_option("--cluster-secret-file", f->secret_file, "the cluster's shared secret (bearer of /internal/ routes)");
  cmd->add_option("--model", f->model, "only instances serving this model name");
  cmd->add_option("--timeout-seconds", f->timeout_s, "per call to an instance")->check(CLI::Range(0.01, 600.0))->capture_default_str();
  cmd->add_flag("--json", f->json, "one JSON object instead of a table");
}

}  // namespace

void RegisterCluster(CLI::App& app, int* exit_code) {
  CLI::App* cluster = app.add_subcommand("cluster", "inspect a running cluster (instances, load, routing predictions)");
  cluster->require_subcommand(1);
  auto fs = std::make_shared<ClusterFlags>();
  CLI::App* status = cluster->add_subcommand("status", "every instance: role, health, load, rates, KV use per tier");
  AddCommon(status, fs.get());
  status->callback([fs, exit_code] { *exit_code = RunStatus(*fs); });
  auto fp = std::make_shared<ClusterFlags>();
  CLI::App* predict =
      cluster->add_subcommand("predict", "the time to first token a ttft router predicts for a prompt on each prefill instance");
  AddCommon(predict, fp.get());
  predict->add_option("--prompt", fp->prompt, "the prompt text (tokenized by an instance)")->required();
  predict->add_option("--api-key", fp->api_key, "the instances' API key, for /tokenize");
  predict->callback([fp, exit_code] { *exit_code = RunPredict(*fp); });
}

}  // namespace strata::cli
