#include "bench/kernel_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>

#include "model/backend/kv_layout.h"
#include "model/forward.h"

namespace strata::bench {

namespace {

using Clock = std::chrono::steady_clock;

int64_t Params(const Tensor& t) { return t.present() ? t.elements() : 0; }
int64_t Bytes(const Tensor& t) { return t.present() ? static_cast<int64_t>(t.nbytes) : 0; }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Deterministic token ids spread over the vocabulary (the values do not matter
// for speed; they only must be valid).
std::vector<int32_t> Tokens(int n, int vocab, int salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    t[static_cast<size_t>(i)] =
        static_cast<int32_t>((static_cast<int64_t>(i) * 7919 + salt * 104729 + 1) % vocab);
  return t;
}

Result<double> TimeMedian(int iterations, const std::function<Status()>& fn) {
  STRATA_RETURN_IF_ERROR(fn());  // warm-up: buffers sized, pages touched
  std::vector<double> times;
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = Clock::now();
    STRATA_RETURN_IF_ERROR(fn());
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return Median(std::move(times));
}

}  // namespace

ModelCost ComputeModelCost(const ModelWeights& w, DType kv_dtype) {
  const ModelConfig& cfg = w.config;
  ModelCost c;
  c.layers = cfg.n_layers;
  c.heads = cfg.n_heads;
  c.head_dim = cfg.head_dim;
  c.dim = cfg.dim;
  c.vocab = cfg.vocab_size;
  for (const LayerWeights& l : w.layers) {
    for (const Tensor* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.bq, &l.bk, &l.bv,
                            &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down}) {
      c.body_params += Params(*t);
      c.body_bytes += Bytes(*t);
    }
  }
  c.body_params += Params(w.output_norm);
  c.body_bytes += Bytes(w.output_norm);
  // Tied models read the embedding table as the head: same bytes and flops.
  const Tensor& head = w.output.present() ? w.output : w.tok_embd;
  c.head_params = Params(head);
  c.head_bytes = Bytes(head);
  c.embedding_params = Params(w.tok_embd);
  c.embedding_row_bytes =
      w.tok_embd.present() ? static_cast<int64_t>(RowBytes(w.tok_embd.type, w.tok_embd.cols())) : 0;
  KvLayout kv;
  kv.n_layers = cfg.n_layers;
  kv.n_kv_heads = cfg.n_kv_heads;
  kv.head_dim = cfg.head_dim;
  kv.dtype = kv_dtype;
  c.kv_bytes_per_token = static_cast<int64_t>(kv.token_bytes());
  return c;
}

double DecodeStepBytes(const ModelCost& c, int batch, int context) {
  const double b = batch;
  return static_cast<double>(c.body_bytes + c.head_bytes) +
         b * static_cast<double>(c.embedding_row_bytes) +
         static_cast<double>(context) * static_cast<double>(c.kv_bytes_per_token) * b;
}

double DecodeStepFlops(const ModelCost& c, int batch, int context) {
  const double b = batch;
  return 2.0 * static_cast<double>(c.params_excluding_embedding()) * b +
         4.0 * c.layers * c.heads * static_cast<double>(c.head_dim) * context * b;
}

double PrefillFlops(const ModelCost& c, int tokens) {
  const double t = tokens;
  return 2.0 * static_cast<double>(c.body_params) * t +
         2.0 * c.layers * c.heads * static_cast<double>(c.head_dim) * t * t +
         2.0 * static_cast<double>(c.head_params);
}

double RooflineSeconds(double bytes, double flops, const MachineLimits& limits) {
  const double mem = limits.read_bandwidth_gbs > 0 ? bytes / (limits.read_bandwidth_gbs * 1e9) : 0;
  const double fma = limits.fma_peak_gflops > 0 ? flops / (limits.fma_peak_gflops * 1e9) : 0;
  return std::max(mem, fma);
}

void ApplyLimits(KernelBenchReport* r, const MachineLimits& limits) {
  r->limits = limits;
  for (DecodeResult& d : r->decode) {
    d.roofline_seconds = RooflineSeconds(d.bytes_per_step, d.flops_per_step, limits);
    d.share_of_roofline = d.step_seconds > 0 ? d.roofline_seconds / d.step_seconds : 0;
  }
  PrefillResult& p = r->prefill;
  p.share_of_fma_peak =
      p.seconds > 0 && limits.fma_peak_gflops > 0 ? p.flops / p.seconds / (limits.fma_peak_gflops * 1e9) : 0;
}

Result<KernelBenchReport> RunKernelBench(const ModelWeights& w, const KernelBenchOptions& o,
                                         const MachineLimits& limits, ThreadPool* pool) {
  const ModelConfig& cfg = w.config;
  if (pool == nullptr) return Status::InvalidArgument("RunKernelBench needs a thread pool");
  if (o.context < 1 || o.prefill < 1 || o.iterations < 1 || o.kv_block_size < 1 ||
      o.batches.empty())
    return Status::InvalidArgument(
        "context, prefill, iterations and the KV block size must be >= 1, batches non-empty");
  for (int b : o.batches)
    if (b < 1) return Status::InvalidArgument("every batch must be >= 1, got " + std::to_string(b));
  if (o.context + 1 > cfg.context_length || o.prefill > cfg.context_length)
    return Status::InvalidArgument("context + 1 (" + std::to_string(o.context + 1) +
                                   ") and prefill (" + std::to_string(o.prefill) +
                                   ") must fit the model's context length " +
                                   std::to_string(cfg.context_length));

  KernelBenchReport r;
  r.limits = limits;
  r.cost = ComputeModelCost(w, o.kv_dtype);
  r.weight_type =
      std::string(DTypeName(cfg.n_layers > 0 ? w.layers[0].w_gate.type : w.output.type));
  r.kv_type = std::string(DTypeName(o.kv_dtype));

  const int bs = o.kv_block_size;
  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  const int seq_blocks = (o.context + 1 + bs - 1) / bs;  // context + the decoded token
  const int prefill_blocks = (o.prefill + bs - 1) / bs;
  KvOptions kv;
  kv.block_size = bs;
  kv.dtype = o.kv_dtype;
  kv.num_blocks = std::max(max_batch * seq_blocks, prefill_blocks);
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<ForwardEngine> engine,
                          ForwardEngine::Create(w, kv, pool));
  std::vector<float> logits;

  // Prefill: one prompt into blocks [0, prefill_blocks).
  {
    std::vector<int32_t> table(static_cast<size_t>(prefill_blocks));
    for (int i = 0; i < prefill_blocks; ++i) table[static_cast<size_t>(i)] = i;
    const std::vector<int32_t> prompt = Tokens(o.prefill, cfg.vocab_size, 1);
    const ForwardSeq seq{prompt, 0, table, false};
    STRATA_ASSIGN_OR_RETURN(double t, TimeMedian(o.iterations, [&] {
                              return engine->Forward(std::span<const ForwardSeq>(&seq, 1), &logits);
                            }));
    r.prefill.tokens = o.prefill;
    r.prefill.seconds = t;
    r.prefill.tokens_per_s = t > 0 ? o.prefill / t : 0;
    r.prefill.flops = PrefillFlops(r.cost, o.prefill);
  }

  // The KV: sequence s owns blocks [s * seq_blocks, (s + 1) * seq_blocks).
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(max_batch));
  for (int s = 0; s < max_batch; ++s)
    for (int i = 0; i < seq_blocks; ++i)
      tables[static_cast<size_t>(s)].push_back(s * seq_blocks + i);
  {
    const std::vector<int32_t> context = Tokens(o.context, cfg.vocab_size, 2);
    const ForwardSeq seq{context, 0, tables[0], false};
    STRATA_RETURN_IF_ERROR(engine->Forward(std::span<const ForwardSeq>(&seq, 1), &logits));
    const size_t block_bytes = engine->kv_layout().block_bytes();
    for (int s = 1; s < max_batch; ++s)
      for (int i = 0; i < seq_blocks; ++i)
        std::memcpy(engine->block_data(tables[static_cast<size_t>(s)][static_cast<size_t>(i)]),
                    engine->block_data(tables[0][static_cast<size_t>(i)]), block_bytes);
  }

  const std::vector<int32_t> next = Tokens(max_batch, cfg.vocab_size, 3);
  for (int batch : o.batches) {
    std::vector<ForwardSeq> seqs;
    for (int s = 0; s < batch; ++s)
      seqs.push_back(ForwardSeq{std::span<const int32_t>(&next[static_cast<size_t>(s)], 1),
                                o.context, tables[static_cast<size_t>(s)], false});
    STRATA_ASSIGN_OR_RETURN(
        double t, TimeMedian(o.iterations, [&] { return engine->Forward(seqs, &logits); }));
    DecodeResult d;
    d.batch = batch;
    d.context = o.context;
    d.step_seconds = t;
    d.tokens_per_s = t > 0 ? batch / t : 0;
    d.bytes_per_step = DecodeStepBytes(r.cost, batch, o.context);
    d.flops_per_step = DecodeStepFlops(r.cost, batch, o.context);
    r.decode.push_back(d);
  }
  ApplyLimits(&r, limits);
  return r;
}

std::string ReportJson(const KernelBenchReport& r) {
  nlohmann::json j;
  j["limits"] = {{"read_bandwidth_gbs", r.limits.read_bandwidth_gbs},
                 {"fma_peak_gflops", r.limits.fma_peak_gflops},
                 {"threads", r.limits.threads},
                 {"simd", r.limits.simd}};
  if (!r.limits_measured.empty()) {
    nlohmann::json runs = nlohmann::json::array();
    for (const MachineLimits& m : r.limits_measured)
      runs.push_back({{"read_bandwidth_gbs", m.read_bandwidth_gbs}, {"fma_peak_gflops", m.fma_peak_gflops}});
    j["limits"]["measured"] = runs;
  }
  const ModelCost& c = r.cost;
  j["model"] = {{"weight_type", r.weight_type},
                {"kv_type", r.kv_type},
                {"layers", c.layers},
                {"dim", c.dim},
                {"heads", c.heads},
                {"head_dim", c.head_dim},
                {"vocab", c.vocab},
                {"params_excluding_embedding", c.params_excluding_embedding()},
                {"embedding_params", c.embedding_params},
                {"weight_bytes_per_step", c.body_bytes + c.head_bytes},
                {"kv_bytes_per_token", c.kv_bytes_per_token}};
  nlohmann::json dec = nlohmann::json::array();
  for (const DecodeResult& d : r.decode)
    dec.push_back({{"batch", d.batch},
                   {"context", d.context},
                   {"tokens_per_s", d.tokens_per_s},
                   {"step_ms", d.step_seconds * 1e3},
                   {"bytes_per_step", d.bytes_per_step},
                   {"flops_per_step", d.flops_per_step},
                   {"roofline_ms", d.roofline_seconds * 1e3},
                   {"share_of_roofline", d.share_of_roofline}});
  j["decode"] = dec;
  j["prefill"] = {{"tokens", r.prefill.tokens},
                  {"tokens_per_s", r.prefill.tokens_per_s},
                  {"seconds", r.prefill.seconds},
                  {"flops", r.prefill.flops},
                  {"share_of_fma_peak", r.prefill.share_of_fma_peak}};
  return j.dump();
}

std::string ReportTable(const KernelBenchReport& r) {
  std::string out;
  char line[512];
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof(line), fmt, args...);
    out += line;
  };
  const ModelCost& c = r.cost;
  add("machine   %d threads: streaming read %.1f GB/s, FP32 FMA peak %.0f GFLOP/s (%s)\n",
      r.limits.threads, r.limits.read_bandwidth_gbs, r.limits.fma_peak_gflops,
      r.limits.simd.c_str());
  if (r.limits_measured.size() > 1) {
    out += "          (the best of";
    for (size_t i = 0; i < r.limits_measured.size(); ++i) {
      add("%s %.1f GB/s, %.0f GFLOP/s", i == 0 ? "" : i + 1 == r.limits_measured.size() ? " and" : ",",
          r.limits_measured[i].read_bandwidth_gbs, r.limits_measured[i].fma_peak_gflops);
    }
    out += ", measured before and after the figures)\n";
  }
  add("model     %s weights, %s KV; %d layers, dim %d, %d heads x %d, vocab %d; %.1f M params "
      "excl. embedding, "
      "%.1f MiB weights read per step, %.1f KiB KV per token\n",
      r.weight_type.c_str(), r.kv_type.c_str(), c.layers, c.dim, c.heads, c.head_dim, c.vocab,
      c.params_excluding_embedding() / 1e6, (c.body_bytes + c.head_bytes) / 1048576.0,
      c.kv_bytes_per_token / 1024.0);
  add("\ndecode (context %d)\n", r.decode.empty() ? 0 : r.decode[0].context);
  add("%6s %10s %10s %12s %12s %10s %12s %10s %8s\n", "batch", "tok/s", "step ms", "MB/step",
      "GFLOP/step", "GB/s", "GFLOP/s", "roof ms", "share");
  for (const DecodeResult& d : r.decode) {
    const double s = d.step_seconds > 0 ? d.step_seconds : 1;
    add("%6d %10.1f %10.2f %12.1f %12.3f %10.1f %12.1f %10.2f %8.2f\n", d.batch, d.tokens_per_s,
        d.step_seconds * 1e3, d.bytes_per_step / 1e6, d.flops_per_step / 1e9,
        d.bytes_per_step / s / 1e9, d.flops_per_step / s / 1e9, d.roofline_seconds * 1e3,
        d.share_of_roofline);
  }
  add("       (GB/s vs limit %.1f, GFLOP/s vs limit %.0f; share = roofline time / step time)\n",
      r.limits.read_bandwidth_gbs, r.limits.fma_peak_gflops);
  const PrefillResult& p = r.prefill;
  add("\nprefill   %d tokens: %.1f tok/s, %.1f ms, %.2f GFLOP -> %.1f GFLOP/s of %.0f peak, share "
      "%.2f\n",
      p.tokens, p.tokens_per_s, p.seconds * 1e3, p.flops / 1e9,
      p.seconds > 0 ? p.flops / p.seconds / 1e9 : 0.0, r.limits.fma_peak_gflops,
      p.share_of_fma_peak);
  return out;
}

}  // namespace strata::bench
