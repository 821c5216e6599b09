#include "bench/compare.h"

#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/report.h"

namespace strata::bench {

namespace {

using json = nlohmann::json;

struct MetricDef {
  const char* path;  // '.'-separated inside "summary"
  const char* unit;
  double scale;      // stored value × scale = shown value
};

constexpr MetricDef kMetrics[] = {
    {"requests_ok", "count", 1},
    {"requests_failed", "count", 1},
    {"skipped_over_context", "count", 1},
    {"duration_s", "s", 1},
    {"ttft_s.mean", "ms", 1e3},
    {"ttft_s.p50", "ms", 1e3},
    {"ttft_s.p90", "ms", 1e3},
    {"ttft_s.p99", "ms", 1e3},
    {"tpot_s.mean", "ms", 1e3},
    {"tpot_s.p50", "ms", 1e3},
    {"tpot_s.p99", "ms", 1e3},
    {"itl_s.mean", "ms", 1e3},
    {"itl_s.p50", "ms", 1e3},
    {"itl_s.p99", "ms", 1e3},
    {"e2e_s.mean", "ms", 1e3},
    {"e2e_s.p50", "ms", 1e3},
    {"e2e_s.p99", "ms", 1e3},
    {"request_throughput", "req/s", 1},
    {"output_token_throughput", "tok/s", 1},
    {"total_token_throughput", "tok/s", 1},
    {"goodput_rps", "req/s", 1},
    {"goodput_ratio", "", 1},
    {"prompt_tokens", "count", 1},
    {"cached_tokens", "count", 1},
    {"hit_ratio_responses.ratio", "", 1},
    {"hit_ratio_responses.by_tier.device", "", 1},
    {"hit_ratio_responses.by_tier.host", "", 1},
    {"hit_ratio_responses.by_tier.disk", "", 1},
    {"hit_ratio_responses.by_tier.remote", "", 1},
    {"hit_ratio_metrics.ratio", "", 1},
    {"hit_ratio_metrics.by_tier.device", "", 1},
    {"hit_ratio_metrics.by_tier.host", "", 1},
    {"hit_ratio_metrics.by_tier.disk", "", 1},
    {"hit_ratio_metrics.by_tier.remote", "", 1},
};

double Lookup(const json& summary, const std::string& path) {
  const json* j = &summary;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t dot = path.find('.', pos);
    if (dot == std::string::npos) dot = path.size();
    const std::string key = path.substr(pos, dot - pos);
    if (!j->is_object() || !j->contains(key)) return std::numeric_limits<double>::quiet_NaN();
    j = &(*j)[key];
    pos = dot + 1;
  }
  return j->is_number() ? j->get<double>() : std::numeric_limits<double>::quiet_NaN();
}

std::string Num(double v, const std::string& unit) {
  if (std::isnan(v)) return "-";
  if (unit == "count") return fmt::format("{:.0f}", v);
  if (unit.empty()) return fmt::format("{:.3f}", v);
  return fmt::format("{:.2f}", v);
}

double Ratio(double b, double a) {
  if (std::isnan(a) || std::isnan(b) || a == 0) return std::numeric_limits<double>::quiet_NaN();
  return b / a;
}

}  // namespace

Result<Comparison> LoadComparison(const std::vector<std::string>& paths) {
  Comparison c;
  std::vector<json> summaries;
  for (const auto& p : paths) {
    std::ifstream f(p, std::ios::binary);
    if (!f) return Status::NotFound("cannot read " + p);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    json doc = json::parse(text, nullptr, false);
    if (doc.is_object() && doc.contains("summary") && doc["summary"].is_object()) {
      summaries.push_back(doc["summary"]);
    } else {
      auto run = RunDataFromJson(text);
      if (!run) return run.error().WithContext(p);
      json again = json::parse(RunJson(*run, Summarize(*run)));
      summaries.push_back(again["summary"]);
    }
    c.names.push_back(p);
  }
  for (const auto& m : kMetrics) {
    CompareRow row{m.path, m.unit, {}};
    bool any = false;
    for (const auto& s : summaries) {
      const double v = Lookup(s, m.path) * m.scale;
      any = any || !std::isnan(v);
      row.values.push_back(v);
    }
    if (any) c.rows.push_back(std::move(row));
  }
  return c;
}

std::string ComparisonTable(const Comparison& c) {
  std::string out;
  const size_t n = c.names.size();
  size_t name_w = 6;
  for (const auto& r : c.rows) name_w = std::max(name_w, r.metric.size() + r.unit.size() + 3);
  std::vector<size_t> col_w(n, 10);
  for (size_t i = 0; i < n; ++i) col_w[i] = std::max<size_t>(10, std::min<size_t>(c.names[i].size(), 28));
  auto cut = [](const std::string& s, size_t w) { return s.size() <= w ? s : "…" + s.substr(s.size() - (w - 1)); };
  auto letter = [](size_t i) { return static_cast<char>('A' + std::min<size_t>(i, 25)); };
  for (size_t i = 0; i < n; ++i) out += fmt::format("{} = {}\n", letter(i), c.names[i]);
  out += fmt::format("{:<{}}", "metric", name_w);
  for (size_t i = 0; i < n; ++i) out += fmt::format(" {:>{}}", cut(c.names[i], col_w[i]), col_w[i]);
  for (size_t i = 1; i < n; ++i) out += fmt::format(" {:>7}", fmt::format("{}/A", letter(i)));
  out += "\n";
  for (const auto& r : c.rows) {
    const std::string label = r.unit.empty() || r.unit == "count" ? r.metric : r.metric + " (" + r.unit + ")";
    out += fmt::format("{:<{}}", label, name_w);
    for (size_t i = 0; i < n; ++i) out += fmt::format(" {:>{}}", Num(r.values[i], r.unit), col_w[i]);
    for (size_t i = 1; i < n; ++i) {
      const double q = Ratio(r.values[i], r.values[0]);
      out += fmt::format(" {:>7}", std::isnan(q) ? std::string("-") : fmt::format("{:.2f}", q));
    }
    out += "\n";
  }
  return out;
}

std::string ComparisonJson(const Comparison& c) {
  json metrics = json::object();
  for (const auto& r : c.rows) {
    json values = json::array(), ratios = json::array();
    for (size_t i = 0; i < r.values.size(); ++i) {
      values.push_back(std::isnan(r.values[i]) ? json(nullptr) : json(r.values[i]));
      const double q = Ratio(r.values[i], r.values[0]);
      ratios.push_back(std::isnan(q) ? json(nullptr) : json(q));
    }
    metrics[r.metric] = {{"unit", r.unit}, {"values", values}, {"ratios", ratios}};
  }
  return json({{"files", c.names}, {"metrics", metrics}}).dump(1);
}

}  // namespace strata::bench
