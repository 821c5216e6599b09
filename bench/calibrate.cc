#include "bench/calibrate.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "bench/kernel_bench.h"

namespace strata::bench {
namespace {

struct Row {
  std::array<double, 3> x;  // the three terms' multipliers
  double y;                 // measured seconds
};

// Solves the k x k system in place (partial pivoting); false when singular.
bool Solve(std::vector<std::vector<double>> m, std::vector<double> v, std::vector<double>* out) {
  const size_t k = v.size();
  for (size_t col = 0; col < k; ++col) {
    size_t piv = col;
    for (size_t r = col + 1; r < k; ++r)
      if (std::fabs(m[r][col]) > std::fabs(m[piv][col])) piv = r;
    if (!(std::fabs(m[piv][col]) > 1e-300)) return false;
    std::swap(m[piv], m[col]);
    std::swap(v[piv], v[col]);
    for (size_t r = 0; r < k; ++r) {
      if (r == col) continue;
      const double q = m[r][col] / m[col][col];
      for (size_t c = col; c < k; ++c) m[r][c] -= q * m[col][c];
      v[r] -= q * v[col];
    }
  }
  out->resize(k);
  for (size_t i = 0; i < k; ++i) (*out)[i] = v[i] / m[i][i];
  return true;
}

// Non-negative least squares over three terms, each row weighted by 1/y so
// that the fit minimises relative error (short prompts weigh as much as long
// ones). With three unknowns every subset of free terms can be tried: the
// best feasible subset is the exact NNLS solution.
std::array<double, 3> FitNonNegative(const std::vector<Row>& rows) {
  std::array<double, 3> best{0, 0, 0};
  double best_err = std::numeric_limits<double>::infinity();
  for (int mask = 1; mask < 8; ++mask) {
    std::vector<int> vars;
    for (int i = 0; i < 3; ++i)
      if (mask & (1 << i)) vars.push_back(i);
    const size_t k = vars.size();
    std::vector<std::vector<double>> ata(k, std::vector<double>(k, 0));
    std::vector<double> aty(k, 0);
    for (const Row& r : rows) {
      const double w = 1.0 / r.y;
      for (size_t i = 0; i < k; ++i) {
        aty[i] += r.x[vars[i]] * w * r.y * w;
        for (size_t j = 0; j < k; ++j) ata[i][j] += r.x[vars[i]] * w * r.x[vars[j]] * w;
      }
    }
    std::vector<double> sol;
    if (!Solve(ata, aty, &sol)) continue;
    if (std::any_of(sol.begin(), sol.end(), [](double v) { return !(v >= 0); })) continue;
    std::array<double, 3> coef{0, 0, 0};
    for (size_t i = 0; i < k; ++i) coef[vars[i]] = sol[i];
    double err = 0;
    for (const Row& r : rows) {
      const double fit = coef[0] * r.x[0] + coef[1] * r.x[1] + coef[2] * r.x[2];
      err += (fit - r.y) * (fit - r.y) / (r.y * r.y);
    }
    if (err < best_err) {
      best_err = err;
      best = coef;
    }
  }
  return best;
}

double MaxRelError(const std::vector<Row>& rows, const std::array<double, 3>& c) {
  double worst = 0;
  for (const Row& r : rows)
    worst = std::max(worst, std::fabs(c[0] * r.x[0] + c[1] * r.x[1] + c[2] * r.x[2] - r.y) / r.y);
  return worst;
}

}  // namespace

Result<Calibration> FitCostModel(std::vector<PrefillPoint> prefill, std::vector<DecodePoint> decode) {
  if (prefill.empty() || decode.empty()) return Status::InvalidArgument("calibration needs prefill and decode points");
  std::vector<Row> pr, dr;
  for (const PrefillPoint& p : prefill) {
    if (p.tokens < 1 || !(p.seconds > 0) || !std::isfinite(p.seconds))
      return Status::InvalidArgument("prefill point of " + std::to_string(p.tokens) + " tokens has no positive time");
    const double t = p.tokens;
    pr.push_back(Row{{1.0, t, t * t / 2}, p.seconds});
  }
  for (const DecodePoint& p : decode) {
    if (p.batch < 1 || p.context < 0 || !(p.seconds > 0) || !std::isfinite(p.seconds))
      return Status::InvalidArgument("decode point batch " + std::to_string(p.batch) + " has no positive time");
    const double b = p.batch;
    dr.push_back(Row{{1.0, b, b * (p.context + 1.0)}, p.seconds});
  }
  Calibration c;
  const auto pc = FitNonNegative(pr);
  const auto dc = FitNonNegative(dr);
  c.model = CostModel{pc[0], pc[1], pc[2], dc[0], dc[1], dc[2]};
  c.prefill_max_rel_error = MaxRelError(pr, pc);
  c.decode_max_rel_error = MaxRelError(dr, dc);
  c.prefill = std::move(prefill);
  c.decode = std::move(decode);
  return c;
}

Result<Calibration> Calibrate(const ModelWeights& w, const CalibrateOptions& o, ThreadPool* pool) {
  if (o.prefill_tokens.empty() || o.decode_batches.empty() || o.decode_contexts.empty())
    return Status::InvalidArgument("calibration needs prefill lengths, decode batches and contexts");
  const MachineLimits no_limits{};  // shares are not used here
  std::vector<PrefillPoint> prefill;
  std::vector<DecodePoint> decode;
  KernelBenchOptions k;
  k.iterations = o.iterations;
  k.kv_dtype = o.kv_dtype;
  k.kv_block_size = o.kv_block_size;
  // Decode points, one kernel bench per context (its prefill figure is the
  // shortest prompt).
  for (int ctx : o.decode_contexts) {
    k.context = ctx;
    k.batches = o.decode_batches;
    k.prefill = o.prefill_tokens.front();
    STRATA_ASSIGN_OR_RETURN(KernelBenchReport r, RunKernelBench(w, k, no_limits, pool));
    for (const DecodeResult& d : r.decode) decode.push_back(DecodePoint{d.batch, d.context, d.step_seconds});
    if (prefill.empty()) prefill.push_back(PrefillPoint{r.prefill.tokens, r.prefill.seconds});
  }
  // The other prompt lengths (batch 1 decode at a short context alongside).
  for (size_t i = 1; i < o.prefill_tokens.size(); ++i) {
    k.context = 1;
    k.batches = {1};
    k.prefill = o.prefill_tokens[i];
    STRATA_ASSIGN_OR_RETURN(KernelBenchReport r, RunKernelBench(w, k, no_limits, pool));
    prefill.push_back(PrefillPoint{r.prefill.tokens, r.prefill.seconds});
  }
  return FitCostModel(std::move(prefill), std::move(decode));
}

std::string CalibrationJson(const Calibration& c, const std::string& model_path, int threads) {
  nlohmann::json j = {{"a", c.model.a}, {"b", c.model.b}, {"c", c.model.c},
                      {"d", c.model.d}, {"e", c.model.e}, {"f", c.model.f}};
  nlohmann::json pre = nlohmann::json::array(), dec = nlohmann::json::array();
  for (const PrefillPoint& p : c.prefill) {
    const double t = p.tokens;
    pre.push_back({{"tokens", p.tokens},
                   {"seconds", p.seconds},
                   {"fitted_seconds", c.model.a + c.model.b * t + c.model.c * t * t / 2}});
  }
  for (const DecodePoint& p : c.decode) {
    const double b = p.batch;
    dec.push_back({{"batch", p.batch},
                   {"context", p.context},
                   {"seconds", p.seconds},
                   {"fitted_seconds", c.model.d + c.model.e * b + c.model.f * b * (p.context + 1.0)}});
  }
  j["points"] = {{"prefill", pre}, {"decode", dec}};
  j["prefill_max_rel_error"] = c.prefill_max_rel_error;
  j["decode_max_rel_error"] = c.decode_max_rel_error;
  j["model"] = model_path;
  j["threads"] = threads;
  return j.dump(2);
}

}  // namespace strata::bench
