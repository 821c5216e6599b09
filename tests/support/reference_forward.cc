#include "tests/support/reference_forward.h"

#include <cmath>

#include "model/backend/cpu/quant.h"

namespace strata::testing {

namespace {

std::vector<double> Dequant(const Tensor& t) {
  std::vector<double> out;
  if (!t.present()) return out;
  std::vector<float> row(static_cast<size_t>(t.cols()));
  out.reserve(static_cast<size_t>(t.elements()));
  for (int64_t r = 0; r < t.rows(); ++r) {
    cpu::DequantizeRow(t.type, t.row(r), row.data(), t.cols());
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

// y = W x, W rows × cols.
std::vector<double> MatVec(const std::vector<double>& w, const std::vector<double>& x, size_t rows) {
  size_t cols = x.size();
  std::vector<double> y(rows, 0.0);
  for (size_t r = 0; r < rows; ++r) {
    double s = 0;
    for (size_t k = 0; k < cols; ++k) s += w[r * cols + k] * x[k];
    y[r] = s;
  }
  return y;
}

std::vector<double> RmsNorm(const std::vector<double>& x, const std::vector<double>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  double inv = 1.0 / std::sqrt(ss / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

void Rope(std::vector<double>& v, int heads, int hd, int pos, const std::vector<double>& inv_freq, bool neox) {
  for (int h = 0; h < heads; ++h) {
    double* p = v.data() + static_cast<size_t>(h) * hd;
    for (int i = 0; i < hd / 2; ++i) {
      double a = pos * inv_freq[i];
      double cs = std::cos(a), sn = std::sin(a);
      int i0 = neox ? i : 2 * i;
      int i1 = neox ? i + hd / 2 : 2 * i + 1;
      double x0 = p[i0], x1 = p[i1];
      p[i0] = x0 * cs - x1 * sn;
      p[i1] = x0 * sn + x1 * cs;
    }
  }
}

}  // namespace

ReferenceModel::ReferenceModel(const ModelWeights& w) : c_(w.config) {
  tok_embd_ = Dequant(w.tok_embd);
  output_norm_ = Dequant(w.output_norm);
  output_ = Dequant(w.output);
  for (const auto& l : w.layers) {
    layers_.push_back(Layer{Dequant(l.attn_norm), Dequant(l.wq), Dequant(l.wk), Dequant(l.wv), Dequant(l.wo),
                            Dequant(l.bq), Dequant(l.bk), Dequant(l.bv), Dequant(l.ffn_norm), Dequant(l.w_gate),
                            Dequant(l.w_up), Dequant(l.w_down)});
  }
  // RoPE frequencies, computed here in double from the definitions.
  const auto& s = c_.rope_scaling;
  for (int i = 0; i < c_.head_dim / 2; ++i) {
    double f = 1.0 / std::pow(static_cast<double>(c_.rope_theta), 2.0 * i / c_.head_dim);
    if (s.type == RopeScaling::Type::kLinear) {
      f /= s.factor;
    } else if (s.type == RopeScaling::Type::kLlama3) {
      double wavelen = 2 * M_PI / f;
      double lo = s.original_context / s.low_freq_factor, hi = s.original_context / s.high_freq_factor;
      if (wavelen > lo) {
        f /= s.factor;
      } else if (wavelen >= hi) {
        double sm = (s.original_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - sm) * f / s.factor + sm * f;
      }
    }
    if (!c_.rope_freq_factors.empty()) f /= c_.rope_freq_factors[i];
    inv_freq_.push_back(f);
  }
}

std::vector<std::vector<double>> ReferenceModel::Forward(const std::vector<int32_t>& tokens) const {
  const int dim = c_.dim, hd = c_.head_dim, kvd = c_.kv_dim(), qd = c_.q_dim();
  const int group = c_.n_heads / c_.n_kv_heads;
  const bool neox = c_.rope_style == RopeStyle::kNeox;
  const size_t n = tokens.size();
  // Residual stream of every position.
  std::vector<std::vector<double>> x(n);
  for (size_t t = 0; t < n; ++t)
    x[t].assign(tok_embd_.begin() + static_cast<long>(tokens[t]) * dim,
                tok_embd_.begin() + static_cast<long>(tokens[t] + 1) * dim);
  for (const Layer& L : layers_) {
    std::vector<std::vector<double>> K(n), V(n), Q(n);
    for (size_t t = 0; t < n; ++t) {
      auto xn = RmsNorm(x[t], L.attn_norm, c_.rms_eps);
      Q[t] = MatVec(L.wq, xn, qd);
      K[t] = MatVec(L.wk, xn, kvd);
      V[t] = MatVec(L.wv, xn, kvd);
      if (!L.bq.empty()) {
        for (int i = 0; i < qd; ++i) Q[t][i] += L.bq[i];
        for (int i = 0; i < kvd; ++i) K[t][i] += L.bk[i], V[t][i] += L.bv[i];
      }
      Rope(Q[t], c_.n_heads, hd, static_cast<int>(t), inv_freq_, neox);
      Rope(K[t], c_.n_kv_heads, hd, static_cast<int>(t), inv_freq_, neox);
    }
    for (size_t t = 0; t < n; ++t) {
      std::vector<double> att(qd, 0.0);
      for (int h = 0; h < c_.n_heads; ++h) {
        int g = h / group;
        std::vector<double> sc(t + 1);
        double mx = -1e300;
        for (size_t j = 0; j <= t; ++j) {
          double s = 0;
          for (int d = 0; d < hd; ++d) s += Q[t][h * hd + d] * K[j][g * hd + d];
          sc[j] = s / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, sc[j]);
        }
        double z = 0;
        for (auto& s : sc) z += (s = std::exp(s - mx));
        for (size_t j = 0; j <= t; ++j)
          for (int d = 0; d < hd; ++d) att[h * hd + d] += sc[j] / z * V[j][g * hd + d];
      }
      auto o = MatVec(L.wo, att, dim);
      for (int i = 0; i < dim; ++i) x[t][i] += o[i];
      auto xn = RmsNorm(x[t], L.ffn_norm, c_.rms_eps);
      auto g = MatVec(L.w_gate, xn, c_.ffn_dim);
      auto u = MatVec(L.w_up, xn, c_.ffn_dim);
      for (int i = 0; i < c_.ffn_dim; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      auto d = MatVec(L.w_down, g, dim);
      for (int i = 0; i < dim; ++i) x[t][i] += d[i];
    }
  }
  std::vector<std::vector<double>> logits(n);
  for (size_t t = 0; t < n; ++t) logits[t] = MatVec(output_, RmsNorm(x[t], output_norm_, c_.rms_eps), c_.vocab_size);
  return logits;
}

}  // namespace strata::testing
