// strata cache stats | lookup | flush: the operator's view of a running
// server's KV cache, through its /admin/cache/* endpoints (docs/admin.md).

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/http_client.h"
#include "tools/commands.h"

namespace strata::cli {
namespace {

using nlohmann::json;

struct CacheFlags {
  std::string url = "http://127.0.0.1:8000";
  std::string admin_token;
  double timeout_seconds = 30;
  bool json = false;
  // lookup
  std::string prompt;
  std::string tokens;  // "1,2,3"
  bool chat = false;
  std::string cache_salt;
  // flush
  std::vector<std::string> tiers;
  bool all_namespaces = false;
};

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

// Number at `key` in `j`, or 0 when absent / not a number.
double Num(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

// Calls the admin endpoint; prints the error and returns false on failure.
bool Call(const CacheFlags& f, const char* cmd, const std::string& method, const std::string& path,
          const std::string& body, json* out) {
  auto url = strata::ParseHttpUrl(f.url);
  if (!url.ok()) {
    std::fprintf(stderr, "strata cache %s: --url: %s\n", cmd, url.error().message().c_str());
    return false;
  }
  HeaderList headers = {{"Content-Type", "application/json"}};
  if (!f.admin_token.empty()) headers.emplace_back("Authorization", "Bearer " + f.admin_token);
  auto r = strata::HttpCall(url->host, url->port, method, path, body, headers, f.timeout_seconds);
  if (!r.ok()) {
    std::fprintf(stderr, "strata cache %s: %s: %s\n", cmd, f.url.c_str(),
                 r.error().message().c_str());
    return false;
  }
  json j = json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (r->status != 200) {
    std::string msg = r->body;
    if (j.is_object() && j.contains("error") && j["error"].is_object() &&
        j["error"].contains("message") && j["error"]["message"].is_string())
      msg = j["error"]["message"].get<std::string>();
    std::fprintf(stderr, "strata cache %s: HTTP %d: %s\n", cmd, r->status, msg.c_str());
    return false;
  }
  if (j.is_discarded() || !j.is_object()) {
    std::fprintf(stderr, "strata cache %s: the server's answer is not a JSON object: %s\n", cmd,
                 r->body.c_str());
    return false;
  }
  *out = std::move(j);
  return true;
}

void PrintStats(const json& j) {
  const json& req = j.value("requests", json::object());
  std::printf(
      "model %s: %.0f running, %.0f waiting, %.0f preemptions, %.0f rejected (queue full)\n",
      j.value("model", std::string("?")).c_str(), Num(req, "running"), Num(req, "waiting"),
      Num(req, "preemptions"), Num(req, "rejected_queue_full"));
  const json& pc = j.value("prefix_cache", json::object());
  std::printf("prefix cache: %.0f lookups over %.0f prompt tokens, %.0f tokens hit (%.1f%%)\n",
              Num(pc, "queries"), Num(pc, "query_tokens"), Num(pc, "hit_tokens"),
              100.0 * Num(pc, "hit_ratio"));
  std::printf("\n%-8s %12s %12s %7s %12s %12s %12s %10s\n", "tier", "capacity", "used", "usage",
              "hit tokens", "written", "read", "load fails");
  for (const json& t : j.value("tiers", json::array())) {
    const bool device = t.value("kind", std::string()) == "device";
    const json& hits = t.value("hits", json::object());
    auto opt = [&](const char* key) { return device ? std::string("-") : Bytes(Num(t, key)); };
    std::printf(
        "%-8s %12s %12s %6.1f%% %12.0f %12s %12s %10s\n", t.value("name", std::string("?")).c_str(),
        Bytes(Num(t, "capacity_bytes")).c_str(), Bytes(Num(t, "used_bytes")).c_str(),
        100.0 * Num(t, "usage_ratio"), Num(hits, "tokens"), opt("bytes_written").c_str(),
        opt("bytes_read").c_str(),
        device ? "-" : std::to_string(static_cast<uint64_t>(Num(t, "loads_failed"))).c_str());
  }
  const json& db = j.value("device_blocks", json::object());
  std::printf("\ndevice blocks: %.0f total, %.0f in use, %.0f cached, %.0f free; %.0f evictions\n",
              Num(db, "total"), Num(db, "in_use"), Num(db, "cached"), Num(db, "free"),
              Num(db, "evictions"));
  std::printf("\n%-8s %-9s %10s %10s %10s %10s %14s %10s\n", "tier", "policy", "stored", "rejected", "hits",
              "evicted", "evicted unused", "expired");
  for (const json& t : j.value("tiers", json::array())) {
    const json& p = t.value("eviction_policy", json::object());
    if (p.empty()) continue;
    std::printf("%-8s %-9s %10.0f %10.0f %10.0f %10.0f %14.0f %10.0f\n", t.value("name", std::string("?")).c_str(),
                p.value("name", std::string("?")).c_str(), Num(p, "inserted"), Num(p, "rejected"), Num(p, "hits"),
                Num(p, "evicted"), Num(p, "evicted_unused"), Num(p, "evicted_expired"));
  }
}

void PrintLookup(const json& j) {
  const double prompt = Num(j, "prompt_tokens"), cached = Num(j, "cached_tokens");
  std::printf("prompt tokens  %.0f\n", prompt);
  std::printf("cached tokens  %.0f (%.0f blocks of %.0f; %.1f%% of the prompt)\n", cached,
              Num(j, "blocks"), Num(j, "block_size"), prompt > 0 ? 100.0 * cached / prompt : 0.0);
  const json by_tier = j.value("by_tier", json::object());
  for (const auto& [tier, n] : by_tier.items())
    std::printf("  %-8s %8.0f\n", tier.c_str(), n.is_number() ? n.get<double>() : 0.0);
  if (j.contains("cluster") && j["cluster"].is_array()) {
    std::printf("other instances holding the prefix (cluster index):%s\n", j["cluster"].empty() ? " none" : "");
    for (const auto& h : j["cluster"]) {
      std::string tiers;
      if (h.contains("blocks_by_tier") && h["blocks_by_tier"].is_object()) {
        for (auto it = h["blocks_by_tier"].begin(); it != h["blocks_by_tier"].end(); ++it)
          tiers += " " + it.key() + "=" + std::to_string(it.value().is_number() ? it.value().get<int64_t>() : 0);
      }
      std::printf("  %-24s %6lld tokens (%lld blocks;%s)\n", h.value("instance", std::string()).c_str(),
                  static_cast<long long>(h.value("tokens", int64_t{0})), static_cast<long long>(h.value("blocks", int64_t{0})),
                  tiers.c_str());
    }
  }
}

void PrintFlush(const json& j) {
  std::printf("flushed");
  const char* sep = " ";
  const json flushed = j.value("flushed_blocks", json::object());
  for (const auto& [tier, n] : flushed.items()) {
    std::printf("%s%s: %.0f blocks", sep, tier.c_str(), n.is_number() ? n.get<double>() : 0.0);
    sep = ", ";
  }
  std::printf("%s\n", j.value("all_namespaces", false) ? " (all namespaces)" : "");
}

int Emit(const CacheFlags& f, const json& j, void (*print)(const json&)) {
  if (f.json) {
    std::printf("%s\n", j.dump(2, ' ', false, json::error_handler_t::replace).c_str());
  } else {
    print(j);
  }
  return 0;
}

int RunStats(const CacheFlags& f) {
  json j;
  if (!Call(f, "stats", "GET", "/admin/cache/stats", "", &j)) return 1;
  return Emit(f, j, PrintStats);
}

int RunLookup(const CacheFlags& f) {
  json body = json::object();
  if (f.prompt.empty() == f.tokens.empty()) {
    std::fprintf(stderr, "strata cache lookup: give exactly one of --prompt or --tokens\n");
    return 2;
  }
  if (!f.tokens.empty()) {
    json ids = json::array();
    size_t pos = 0;
    while (pos <= f.tokens.size()) {
      const size_t comma = std::min(f.tokens.find(',', pos), f.tokens.size());
      const std::string item = f.tokens.substr(pos, comma - pos);
      char* end = nullptr;
      const long long v = std::strtoll(item.c_str(), &end, 10);
      if (item.empty() || end == nullptr || *end != '\0' || v < 0 || v > INT32_MAX) {
        std::fprintf(stderr, "strata cache lookup: --tokens: '%s' is not a token id\n",
                     item.c_str());
        return 2;
      }
      ids.push_back(v);
      pos = comma + 1;
    }
    body["tokens"] = std::move(ids);
  } else if (f.chat) {
    body["messages"] = json::array({{{"role", "user"}, {"content", f.prompt}}});
  } else {
    body["prompt"] = f.prompt;
  }
  if (!f.cache_salt.empty()) body["cache_salt"] = f.cache_salt;
  json j;
  if (!Call(f, "lookup", "POST", "/admin/cache/lookup", body.dump(), &j)) return 1;
  return Emit(f, j, PrintLookup);
}

int RunFlush(const CacheFlags& f) {
  json body = json::object();
  if (!f.tiers.empty()) body["tiers"] = f.tiers;
  if (f.all_namespaces) body["all_namespaces"] = true;
  json j;
  if (!Call(f, "flush", "POST", "/admin/cache/flush", body.dump(), &j)) return 1;
  return Emit(f, j, PrintFlush);
}

void AddCommon(CLI::App* cmd, CacheFlags* f) {
  cmd->add_option("--url", f->url, "the server's base URL")->capture_default_str();
  cmd->add_option("--admin-token", f->admin_token, "the server's --admin-token")
      ->envname("STRATA_ADMIN_TOKEN");
  cmd->add_option("--timeout", f->timeout_seconds, "seconds to wait for the answer")
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "print the server's JSON instead of a table");
}

}  // namespace

void RegisterCache(CLI::App& app, int* exit_code) {
  CLI::App* cache =
      app.add_subcommand("cache", "KV cache of a running server: tier usage, prefix lookup, flush");
  cache->require_subcommand(1);
  cache->fallthrough();
  auto f = std::make_shared<CacheFlags>();

  CLI::App* stats = cache->add_subcommand("stats", "usage, hits and traffic per tier");
  AddCommon(stats, f.get());
  stats->callback([f, exit_code] { *exit_code = RunStats(*f); });

  CLI::App* lookup = cache->add_subcommand(
      "lookup", "which tiers hold a prompt's prefix, and how many tokens would hit");
  AddCommon(lookup, f.get());
  lookup->add_option("--prompt", f->prompt,
                     "prompt text (tokenized by the server like a completion prompt)");
  lookup->add_option("--tokens", f->tokens, "token ids, comma-separated (e.g. 1,2,3)");
  lookup->add_flag("--chat", f->chat,
                   "treat --prompt as one user chat message (chat template applied)");
  lookup->add_option("--cache-salt", f->cache_salt, "the requests' cache_salt (tenant)");
  lookup->callback([f, exit_code] { *exit_code = RunLookup(*f); });

  CLI::App* flush =
      cache->add_subcommand("flush", "drop cached blocks (running requests are unaffected)");
  AddCommon(flush, f.get());
  flush->add_option("--tier", f->tiers,
                    "tier to flush: device, host, disk (repeatable; default all)");
  flush->add_flag("--all-namespaces", f->all_namespaces,
                  "lower tiers: also drop other models' blocks");
  flush->callback([f, exit_code] { *exit_code = RunFlush(*f); });
}

}  // namespace strata::cli
