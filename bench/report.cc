#include "bench/report.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <iterator>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace strata::bench {

namespace {

using json = nlohmann::json;

double Div(double a, double b) { return b > 0 ? a / b : 0.0; }

std::string Trim(std::string s) {
  auto sp = [](unsigned char c) { return std::isspace(c) != 0; };
  while (!s.empty() && sp(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && sp(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

json DistJson(const Distribution& d) {
  return {{"count", d.count}, {"mean", d.mean}, {"p50", d.p50}, {"p90", d.p90},
          {"p99", d.p99},     {"min", d.min},   {"max", d.max}};
}

json TierJson(const TierRatios& t) {
  json by = json::object(), tokens = json::object();
  for (size_t i = 0; i < kTierNames.size(); ++i) {
    by[kTierNames[i]] = t.by_tier[i];
    tokens[kTierNames[i]] = t.tokens[i];
  }
  return {{"ratio", t.total}, {"by_tier", by}, {"cached_tokens_by_tier", tokens}, {"prompt_tokens", t.denominator}};
}

TierRatios Ratios(const std::array<double, 4>& num, double den) {
  TierRatios t;
  t.denominator = den;
  double sum = 0;
  for (size_t i = 0; i < 4; ++i) {
    t.tokens[i] = num[i];
    t.by_tier[i] = Div(num[i], den);
    sum += num[i];
  }
  t.total = Div(sum, den);
  return t;
}

json RecordJson(const RequestRecord& r) {
  json tiers = json::object();
  for (size_t i = 0; i < kTierNames.size(); ++i) tiers[kTierNames[i]] = r.cached_by_tier[i];
  json j = {{"index", r.index},
            {"session", r.session},
            {"turn", r.turn},
            {"scheduled_s", r.scheduled_s},
            {"start_s", r.start_s},
            {"first_token_s", r.first_token_s},
            {"end_s", r.end_s},
            {"token_s", r.token_s},
            {"sent_prompt_tokens", r.sent_prompt_tokens},
            {"max_tokens", r.max_tokens},
            {"prompt_tokens", r.prompt_tokens},
            {"completion_tokens", r.completion_tokens},
            {"cached_tokens", r.cached_tokens},
            {"cached_tokens_by_tier", tiers},
            {"http_status", r.http_status},
            {"grpc_status", r.grpc_status},
            {"error", r.error}};
  if (!r.error_message.empty()) j["error_message"] = r.error_message;
  return j;
}

RequestRecord RecordFromJson(const json& j) {
  RequestRecord r;
  r.index = j.value("index", int64_t{0});
  r.session = j.value("session", 0);
  r.turn = j.value("turn", 0);
  r.scheduled_s = j.value("scheduled_s", 0.0);
  r.start_s = j.value("start_s", 0.0);
  r.first_token_s = j.value("first_token_s", -1.0);
  r.end_s = j.value("end_s", 0.0);
  if (j.contains("token_s") && j["token_s"].is_array()) r.token_s = j["token_s"].get<std::vector<double>>();
  r.sent_prompt_tokens = j.value("sent_prompt_tokens", int64_t{0});
  r.max_tokens = j.value("max_tokens", 0);
  r.prompt_tokens = j.value("prompt_tokens", int64_t{0});
  r.completion_tokens = j.value("completion_tokens", int64_t{0});
  r.cached_tokens = j.value("cached_tokens", int64_t{0});
  if (j.contains("cached_tokens_by_tier") && j["cached_tokens_by_tier"].is_object()) {
    for (size_t i = 0; i < kTierNames.size(); ++i)
      r.cached_by_tier[i] = j["cached_tokens_by_tier"].value(kTierNames[i], int64_t{0});
  }
  r.http_status = j.value("http_status", 0);
  r.grpc_status = j.value("grpc_status", std::string());
  r.error = j.value("error", std::string());
  r.error_message = j.value("error_message", std::string());
  return r;
}

json ScrapeJson(const MetricsSample& m) {
  json hits = json::object();
  for (size_t i = 0; i < kTierNames.size(); ++i) hits[kTierNames[i]] = m.hits[i];
  return {{"t_s", m.t_s},         {"prefix_cache_queries", m.queries}, {"prefix_cache_hits", hits},
          {"running", m.running}, {"waiting", m.waiting},              {"rejected", m.rejected}};
}

MetricsSample ScrapeFromJson(const json& j) {
  MetricsSample m;
  m.t_s = j.value("t_s", 0.0);
  m.queries = j.value("prefix_cache_queries", 0.0);
  if (j.contains("prefix_cache_hits") && j["prefix_cache_hits"].is_object()) {
    for (size_t i = 0; i < kTierNames.size(); ++i) m.hits[i] = j["prefix_cache_hits"].value(kTierNames[i], 0.0);
  }
  m.running = j.value("running", 0.0);
  m.waiting = j.value("waiting", 0.0);
  m.rejected = j.value("rejected", 0.0);
  return m;
}

std::string Ms(double s) { return fmt::format("{:.1f}", s * 1000); }

}  // namespace

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  p = std::clamp(p, 0.0, 100.0);
  const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

Distribution Describe(std::vector<double> v) {
  Distribution d;
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  d.count = static_cast<int64_t>(v.size());
  d.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  d.p50 = Percentile(v, 50);
  d.p90 = Percentile(v, 90);
  d.p99 = Percentile(v, 99);
  d.min = v.front();
  d.max = v.back();
  return d;
}

Result<Slo> ParseSlo(const std::string& text) {
  Slo slo;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    const std::string part = Trim(text.substr(pos, comma - pos));
    pos = comma + 1;
    if (part.empty()) {
      if (comma >= text.size()) break;
      continue;
    }
    const size_t eq = part.find('=');
    if (eq == std::string::npos) return Status::InvalidArgument("--slo: '" + part + "' is not KEY=VALUE");
    const std::string key = Trim(part.substr(0, eq));
    std::string value = Trim(part.substr(eq + 1));
    double scale = 1;
    if (value.ends_with("ms")) {
      scale = 1e-3;
      value.resize(value.size() - 2);
    } else if (value.ends_with("us")) {
      scale = 1e-6;
      value.resize(value.size() - 2);
    } else if (value.ends_with("s")) {
      value.pop_back();
    }
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (value.empty() || end != value.c_str() + value.size() || !(v > 0) || !std::isfinite(v))
      return Status::InvalidArgument("--slo: '" + part + "' needs a positive duration such as 2s or 100ms");
    if (key == "ttft") {
      slo.ttft_s = v * scale;
    } else if (key == "tpot") {
      slo.tpot_s = v * scale;
    } else if (key == "e2e") {
      slo.e2e_s = v * scale;
    } else {
      return Status::InvalidArgument("--slo: unknown key '" + key + "' (expected ttft, tpot, e2e)");
    }
    if (comma >= text.size()) break;
  }
  return slo;
}

bool MeetsSlo(const RequestRecord& r, const Slo& slo) {
  if (!r.ok()) return false;
  if (slo.ttft_s > 0 && (r.first_token_s < 0 || r.first_token_s - r.start_s > slo.ttft_s)) return false;
  if (slo.tpot_s > 0 && r.completion_tokens >= 2 && r.first_token_s >= 0) {
    const double tpot = (r.end_s - r.first_token_s) / static_cast<double>(r.completion_tokens - 1);
    if (tpot > slo.tpot_s) return false;
  }
  if (slo.e2e_s > 0 && r.end_s - r.start_s > slo.e2e_s) return false;
  return true;
}

Summary Summarize(const RunData& run) {
  Summary s;
  const LoadResult& L = run.load;
  s.duration_s = L.duration_s;
  s.skipped_over_context = L.skipped_over_context;
  s.not_sent = L.not_sent;
  s.metrics_available = L.metrics_available;
  std::vector<double> ttft, tpot, itl, e2e;
  std::array<double, 4> cached_tier{};
  std::map<int, std::vector<double>> turn_ttft;
  std::map<int, std::pair<double, double>> turn_hits;  // cached, prompt
  for (const auto& r : L.records) {
    ++s.requests_total;
    if (!r.ok()) {
      ++s.requests_failed;
      ++s.errors[r.error];
      if (r.http_status == 429 || r.http_status == 503) ++s.rejections[std::to_string(r.http_status)];
      continue;
    }
    ++s.requests_ok;
    if (r.first_token_s >= 0) {
      ttft.push_back(r.first_token_s - r.start_s);
      turn_ttft[r.turn].push_back(r.first_token_s - r.start_s);
    }
    if (r.completion_tokens >= 2 && r.first_token_s >= 0)
      tpot.push_back((r.end_s - r.first_token_s) / static_cast<double>(r.completion_tokens - 1));
    for (size_t i = 1; i < r.token_s.size(); ++i) itl.push_back(r.token_s[i] - r.token_s[i - 1]);
    e2e.push_back(r.end_s - r.start_s);
    s.prompt_tokens += r.prompt_tokens;
    s.completion_tokens += r.completion_tokens;
    s.cached_tokens += r.cached_tokens;
    for (size_t i = 0; i < 4; ++i) cached_tier[i] += static_cast<double>(r.cached_by_tier[i]);
    turn_hits[r.turn].first += static_cast<double>(r.cached_tokens);
    turn_hits[r.turn].second += static_cast<double>(r.prompt_tokens);
    if (MeetsSlo(r, run.slo)) ++s.goodput_requests;
  }
  s.ttft_s = Describe(std::move(ttft));
  s.tpot_s = Describe(std::move(tpot));
  s.itl_s = Describe(std::move(itl));
  s.e2e_s = Describe(std::move(e2e));
  s.request_throughput = Div(static_cast<double>(s.requests_ok), s.duration_s);
  s.output_token_throughput = Div(static_cast<double>(s.completion_tokens), s.duration_s);
  s.total_token_throughput = Div(static_cast<double>(s.prompt_tokens + s.completion_tokens), s.duration_s);
  s.goodput_rps = Div(static_cast<double>(s.goodput_requests), s.duration_s);
  s.goodput_ratio = Div(static_cast<double>(s.goodput_requests), static_cast<double>(s.requests_total));
  s.hit_responses = Ratios(cached_tier, static_cast<double>(s.prompt_tokens));
  if (L.metrics_available && L.scrapes.size() >= 2) {
    const MetricsSample& a = L.scrapes.front();
    const MetricsSample& b = L.scrapes.back();
    std::array<double, 4> d{};
    for (size_t i = 0; i < 4; ++i) d[i] = b.hits[i] - a.hits[i];
    s.hit_metrics = Ratios(d, b.queries - a.queries);
  }
  if (turn_ttft.size() > 1) {
    for (auto& [turn, v] : turn_ttft) {
      TurnStats t;
      t.turn = turn;
      Distribution d = Describe(v);
      t.requests = d.count;
      t.ttft_mean_s = d.mean;
      t.ttft_p50_s = d.p50;
      t.hit_ratio = Div(turn_hits[turn].first, turn_hits[turn].second);
      s.by_turn.push_back(t);
    }
  }
  return s;
}

std::vector<TimelinePoint> Timeline(const RunData& run, double bucket_s) {
  std::vector<TimelinePoint> out;
  if (bucket_s <= 0 || run.load.duration_s <= 0) return out;
  const size_t n = static_cast<size_t>(std::ceil(run.load.duration_s / bucket_s));
  out.resize(std::max<size_t>(n, 1));
  std::vector<std::pair<double, double>> hits(out.size());  // cached, prompt
  for (size_t i = 0; i < out.size(); ++i) out[i].t_s = static_cast<double>(i) * bucket_s;
  auto bucket = [&](double t) { return std::min(out.size() - 1, static_cast<size_t>(std::max(0.0, t) / bucket_s)); };
  for (const auto& r : run.load.records) {
    if (!r.ok()) continue;
    TimelinePoint& p = out[bucket(r.end_s)];
    ++p.requests_done;
    hits[bucket(r.end_s)].first += static_cast<double>(r.cached_tokens);
    hits[bucket(r.end_s)].second += static_cast<double>(r.prompt_tokens);
    for (double t : r.token_s) ++out[bucket(t)].tokens;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].request_rate = static_cast<double>(out[i].requests_done) / bucket_s;
    out[i].token_rate = static_cast<double>(out[i].tokens) / bucket_s;
    if (hits[i].second > 0) out[i].hit_ratio_responses = hits[i].first / hits[i].second;
  }
  // /metrics: the delta between consecutive scrapes goes to the later one's bucket.
  std::vector<std::pair<double, double>> mh(out.size());
  const auto& sc = run.load.scrapes;
  for (size_t i = 1; i < sc.size(); ++i) {
    double hit = 0;
    for (size_t k = 0; k < 4; ++k) hit += sc[i].hits[k] - sc[i - 1].hits[k];
    mh[bucket(sc[i].t_s)].first += hit;
    mh[bucket(sc[i].t_s)].second += sc[i].queries - sc[i - 1].queries;
  }
  for (size_t i = 0; i < out.size(); ++i)
    if (mh[i].second > 0) out[i].hit_ratio_metrics = mh[i].first / mh[i].second;
  return out;
}

static double DefaultBucket(double duration) { return std::max(1.0, std::ceil(duration / 60.0)); }

std::string RunJson(const RunData& run, const Summary& s) {
  json config = {{"url", run.url},
                 {"model", run.model},
                 {"workload", run.workload},
                 {"mode", run.mode},
                 {"rate", run.rate},
                 {"concurrency", run.concurrency},
                 {"time_scale", run.time_scale},
                 {"tokens_per_hash_id", run.tokens_per_hash_id},
                 {"seed", run.seed},
                 {"max_model_len", run.max_model_len},
                 {"unique_cache_salt", run.unique_cache_salt},
                 {"slo", {{"ttft_s", run.slo.ttft_s}, {"tpot_s", run.slo.tpot_s}, {"e2e_s", run.slo.e2e_s}}},
                 {"started_at", run.started_at}};
  json by_turn = json::array();
  for (const auto& t : s.by_turn)
    by_turn.push_back({{"turn", t.turn},
                       {"requests", t.requests},
                       {"ttft_mean_s", t.ttft_mean_s},
                       {"ttft_p50_s", t.ttft_p50_s},
                       {"hit_ratio", t.hit_ratio}});
  json summary = {{"requests_total", s.requests_total},
                  {"requests_ok", s.requests_ok},
                  {"requests_failed", s.requests_failed},
                  {"skipped_over_context", s.skipped_over_context},
                  {"not_sent", s.not_sent},
                  {"errors", s.errors},
                  {"rejections", s.rejections},
                  {"duration_s", s.duration_s},
                  {"ttft_s", DistJson(s.ttft_s)},
                  {"tpot_s", DistJson(s.tpot_s)},
                  {"itl_s", DistJson(s.itl_s)},
                  {"e2e_s", DistJson(s.e2e_s)},
                  {"request_throughput", s.request_throughput},
                  {"output_token_throughput", s.output_token_throughput},
                  {"total_token_throughput", s.total_token_throughput},
                  {"prompt_tokens", s.prompt_tokens},
                  {"completion_tokens", s.completion_tokens},
                  {"cached_tokens", s.cached_tokens},
                  {"goodput_requests", s.goodput_requests},
                  {"goodput_rps", s.goodput_rps},
                  {"goodput_ratio", s.goodput_ratio},
                  {"hit_ratio_responses", TierJson(s.hit_responses)},
                  {"metrics_available", s.metrics_available},
                  {"hit_ratio_metrics", s.metrics_available ? TierJson(s.hit_metrics) : json(nullptr)},
                  {"by_turn", by_turn}};
  json records = json::array();
  for (const auto& r : run.load.records) records.push_back(RecordJson(r));
  json scrapes = json::array();
  for (const auto& m : run.load.scrapes) scrapes.push_back(ScrapeJson(m));
  json timeline = json::array();
  for (const auto& p : Timeline(run, DefaultBucket(run.load.duration_s)))
    timeline.push_back({{"t_s", p.t_s},
                        {"requests_done", p.requests_done},
                        {"tokens", p.tokens},
                        {"request_rate", p.request_rate},
                        {"token_rate", p.token_rate},
                        {"hit_ratio_responses", p.hit_ratio_responses},
                        {"hit_ratio_metrics", p.hit_ratio_metrics}});
  json doc = {{"strata_bench_run", 1},     {"config", config},         {"summary", summary},
              {"records", records},        {"metrics_scrapes", scrapes}, {"timeline", timeline},
              {"duration_s", run.load.duration_s}, {"metrics_available", run.load.metrics_available},
              {"skipped_over_context", run.load.skipped_over_context}, {"not_sent", run.load.not_sent}};
  return doc.dump(1);
}

Result<RunData> RunDataFromJson(const std::string& text) {
  json doc = json::parse(text, nullptr, false);
  if (!doc.is_object() || !doc.contains("strata_bench_run") || !doc.contains("records") || !doc["records"].is_array())
    return Status::InvalidArgument("not a `strata bench run` JSON file (no strata_bench_run / records)");
  RunData run;
  const json c = doc.value("config", json::object());
  run.url = c.value("url", std::string());
  run.model = c.value("model", std::string());
  run.workload = c.value("workload", std::string());
  run.mode = c.value("mode", std::string());
  run.rate = c.value("rate", 0.0);
  run.concurrency = c.value("concurrency", 0);
  run.time_scale = c.value("time_scale", 1.0);
  run.tokens_per_hash_id = c.value("tokens_per_hash_id", 0);
  run.seed = c.value("seed", uint64_t{1});
  run.max_model_len = c.value("max_model_len", 0);
  run.unique_cache_salt = c.value("unique_cache_salt", false);
  run.started_at = c.value("started_at", std::string());
  if (c.contains("slo") && c["slo"].is_object()) {
    run.slo.ttft_s = c["slo"].value("ttft_s", 0.0);
    run.slo.tpot_s = c["slo"].value("tpot_s", 0.0);
    run.slo.e2e_s = c["slo"].value("e2e_s", 0.0);
  }
  for (const auto& r : doc["records"]) run.load.records.push_back(RecordFromJson(r));
  if (doc.contains("metrics_scrapes") && doc["metrics_scrapes"].is_array())
    for (const auto& m : doc["metrics_scrapes"]) run.load.scrapes.push_back(ScrapeFromJson(m));
  run.load.duration_s = doc.value("duration_s", 0.0);
  run.load.metrics_available = doc.value("metrics_available", false);
  run.load.skipped_over_context = doc.value("skipped_over_context", int64_t{0});
  run.load.not_sent = doc.value("not_sent", int64_t{0});
  return run;
}

std::string HumanSummary(const RunData& run, const Summary& s) {
  std::string o;
  o += fmt::format("workload {} against {} (model {}), {}{}\n", run.workload, run.url, run.model, run.mode,
                   run.unique_cache_salt ? ", unique cache_salt per request" : "");
  o += fmt::format("requests: {} ok, {} failed, {} skipped (over context), {} not sent; {:.2f} s\n", s.requests_ok,
                   s.requests_failed, s.skipped_over_context, s.not_sent, s.duration_s);
  for (const auto& [k, v] : s.errors) o += fmt::format("  errors {}: {}\n", k, v);
  o += fmt::format("{:<10} {:>10} {:>10} {:>10} {:>10}\n", "ms", "mean", "p50", "p90", "p99");
  auto row = [&](const char* name, const Distribution& d) {
    o += fmt::format("{:<10} {:>10} {:>10} {:>10} {:>10}\n", name, Ms(d.mean), Ms(d.p50), Ms(d.p90), Ms(d.p99));
  };
  row("TTFT", s.ttft_s);
  row("TPOT", s.tpot_s);
  row("ITL", s.itl_s);
  row("E2E", s.e2e_s);
  o += fmt::format("throughput: {:.2f} req/s, {:.1f} output tok/s, {:.1f} total tok/s\n", s.request_throughput,
                   s.output_token_throughput, s.total_token_throughput);
  if (run.slo.any())
    o += fmt::format("goodput: {:.2f} req/s ({} of {} requests meet the SLO)\n", s.goodput_rps, s.goodput_requests,
                     s.requests_total);
  auto tiers = [&](const TierRatios& t) {
    std::string x = fmt::format("{:.3f}", t.total);
    for (size_t i = 0; i < 4; ++i)
      if (t.tokens[i] > 0) x += fmt::format(" {} {:.3f}", kTierNames[i], t.by_tier[i]);
    return x;
  };
  o += fmt::format("prefix hit ratio (responses): {}\n", tiers(s.hit_responses));
  if (s.metrics_available) o += fmt::format("prefix hit ratio (/metrics):  {}\n", tiers(s.hit_metrics));
  for (const auto& t : s.by_turn)
    o += fmt::format("  turn {}: {} requests, TTFT mean {} ms p50 {} ms, hit ratio {:.3f}\n", t.turn + 1, t.requests,
                     Ms(t.ttft_mean_s), Ms(t.ttft_p50_s), t.hit_ratio);
  return o;
}


namespace {

// Quotes a path for a gnuplot string literal.
std::string GpQuote(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("''") : std::string(1, c);
  return o + "'";
}

Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return Status::IoError("open", path, errno);
  f << text;
  f.close();
  if (!f) return Status::IoError("write", path, errno);
  return Status::Ok();
}

}  // namespace

Result<std::vector<std::string>> WritePlots(const RunData& run, const Summary& s, const std::string& json_path) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0)
    return Status::Unavailable("gnuplot is not installed (scripts/install-deps.sh installs gnuplot-nox)");
  std::string stem = json_path;
  if (stem.ends_with(".json")) stem.resize(stem.size() - 5);
  char tmpl[] = "/tmp/strata-bench-plot-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return Status::IoError("mkdtemp", tmpl, errno);
  const std::string dir = tmpl;

  // TTFT CDF.
  std::vector<double> ttft;
  for (const auto& r : run.load.records)
    if (r.ok() && r.first_token_s >= 0) ttft.push_back((r.first_token_s - r.start_s) * 1000);
  std::sort(ttft.begin(), ttft.end());
  std::string cdf;
  for (size_t i = 0; i < ttft.size(); ++i)
    cdf += fmt::format("{} {}\n", ttft[i], static_cast<double>(i + 1) / static_cast<double>(ttft.size()));
  if (cdf.empty()) cdf = "0 0\n";
  // Over time.
  std::string tl;
  const double bucket = DefaultBucket(run.load.duration_s);
  for (const auto& p : Timeline(run, bucket)) {
    auto na = [](double v) { return v < 0 ? std::string("NaN") : fmt::format("{}", v); };
    tl += fmt::format("{} {} {} {} {}\n", p.t_s + bucket / 2, p.request_rate, p.token_rate,
                      na(p.hit_ratio_responses), na(p.hit_ratio_metrics));
  }
  if (tl.empty()) tl = "0 0 0 NaN NaN\n";
  // By tier.
  std::string tiers;
  for (size_t i = 0; i < 4; ++i)
    tiers += fmt::format("{} {} {}\n", kTierNames[i], s.hit_responses.by_tier[i],
                         s.metrics_available ? s.hit_metrics.by_tier[i] : 0.0);
  STRATA_RETURN_IF_ERROR(WriteText(dir + "/cdf.dat", cdf));
  STRATA_RETURN_IF_ERROR(WriteText(dir + "/timeline.dat", tl));
  STRATA_RETURN_IF_ERROR(WriteText(dir + "/tiers.dat", tiers));

  // PNG (cairo) when this gnuplot has it, else SVG, which every build has.
  const bool png = std::system("gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1") == 0;
  const std::string ext = png ? ".png" : ".svg";
  const std::vector<std::string> files = {stem + ".ttft_cdf" + ext, stem + ".throughput" + ext,
                                          stem + ".hit_ratio" + ext, stem + ".hit_by_tier" + ext};
  const std::string title = run.workload + " on " + run.model;
  std::string gp = png ? "set terminal pngcairo size 800,480 font 'sans,10'\n"
                       : "set terminal svg size 800,480 dynamic font 'sans,12'\n";
  gp += "set grid\nset key top left\nset termoption noenhanced\n";
  gp += fmt::format("set output {}\nset title {}\nset xlabel 'TTFT (ms)'\nset ylabel 'fraction of requests'\n"
                    "set yrange [0:1]\nplot {} using 1:2 with steps lw 2 title 'TTFT CDF'\n",
                    GpQuote(files[0]), GpQuote(title), GpQuote(dir + "/cdf.dat"));
  gp += fmt::format("set output {}\nset autoscale y\nset xlabel 'time (s)'\nset ylabel 'requests/s'\n"
                    "set y2label 'output tokens/s'\nset ytics nomirror\nset y2tics\n"
                    "plot {} using 1:2 with linespoints title 'requests/s', '' using 1:3 axes x1y2 with "
                    "linespoints title 'output tokens/s'\n",
                    GpQuote(files[1]), GpQuote(dir + "/timeline.dat"));
  gp += fmt::format("unset y2tics\nunset y2label\nset ytics mirror\nset output {}\nset yrange [0:1]\n"
                    "set ylabel 'prefix hit ratio'\nplot {} using 1:4 with linespoints title 'responses "
                    "(cached_tokens)', '' using 1:5 with linespoints title '/metrics'\n",
                    GpQuote(files[2]), GpQuote(dir + "/timeline.dat"));
  gp += fmt::format("set output {}\nset xlabel 'tier'\nset style data histogram\nset style histogram cluster "
                    "gap 1\nset style fill solid 0.8 border -1\nset boxwidth 0.9\nset xtics rotate by 0\n"
                    "plot {} using 2:xtic(1) title 'responses', '' using 3 title '/metrics'\n",
                    GpQuote(files[3]), GpQuote(dir + "/tiers.dat"));
  STRATA_RETURN_IF_ERROR(WriteText(dir + "/plots.gp", gp));
  const std::string cmd = "gnuplot " + GpQuote(dir + "/plots.gp") + " 2>" + GpQuote(dir + "/gnuplot.err");
  const int rc = std::system(cmd.c_str());
  std::string err;
  if (rc != 0) {
    std::ifstream e(dir + "/gnuplot.err");
    err.assign(std::istreambuf_iterator<char>(e), {});
  }
  for (const char* f : {"cdf.dat", "timeline.dat", "tiers.dat", "plots.gp", "gnuplot.err"})
    std::remove((dir + "/" + f).c_str());
  ::rmdir(dir.c_str());
  if (rc != 0) return Status::Internal("gnuplot failed: " + err.substr(0, 500));
  return files;
}

}  // namespace strata::bench
