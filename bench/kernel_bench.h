#pragma once
// `strata bench kernels`: decode and prefill speed of the CPU forward pass,
// each figure set against the machine's limits (bench/machine_limits.h) by the
// formulas of issue "CPU backend speed" (docs/PERFORMANCE.md restates them).
//
// The cost model (ModelCost and the *Bytes/*Flops functions) is pure
// arithmetic on the weights' shapes and stored sizes; RunKernelBench runs the
// model. Thread-safety: RunKernelBench uses the pool it is given, so one call
// at a time per pool; the cost functions may be called from any thread.

#include <cstdint>
#include <string>
#include <vector>

#include "bench/machine_limits.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "model/backend/dtype.h"
#include "model/weights.h"

namespace strata::bench {

// What the formulas need to know about a model. Parameters count elements;
// bytes are as stored (quantized blocks included).
struct ModelCost {
  int layers = 0, heads = 0, head_dim = 0, dim = 0, vocab = 0;
  // Every tensor of every layer (norms and biases included) + the output norm.
  int64_t body_params = 0;
  int64_t body_bytes = 0;
  // The output head (dim x vocab); counted even when tied to the embedding.
  int64_t head_params = 0;
  int64_t head_bytes = 0;
  // One row of the token-embedding table.
  int64_t embedding_row_bytes = 0;
  int64_t embedding_params = 0;  // the whole table (not counted in flops)
  // K and V of one token over all layers, in the KV cache's type.
  int64_t kv_bytes_per_token = 0;

  // "Parameters excluding the embedding table": body + head.
  int64_t params_excluding_embedding() const { return body_params + head_params; }
};

ModelCost ComputeModelCost(const ModelWeights& w, DType kv_dtype);

// One decode step of `batch` sequences, each with `context` tokens in the KV:
// bytes = body + head + batch embedding rows + context x KV bytes per token x batch;
// flops = 2 x params_excluding_embedding x batch + 4 x layers x heads x head_dim x context x batch.
double DecodeStepBytes(const ModelCost& c, int batch, int context);
double DecodeStepFlops(const ModelCost& c, int batch, int context);
// A prompt of `tokens` tokens: 2 x body_params x T + 2 x layers x heads x
// head_dim x T^2 + 2 x head_params (logits of the last position only).
double PrefillFlops(const ModelCost& c, int tokens);
// max(bytes / bandwidth, flops / FMA peak), in seconds.
double RooflineSeconds(double bytes, double flops, const MachineLimits& limits);

struct KernelBenchOptions {
  int context = 512;  // tokens already in each sequence's KV
  std::vector<int> batches = {1, 8, 32};
  int prefill = 512;   // prompt length of the prefill figure
  int iterations = 5;  // timed runs per figure (median), after one warm-up
  DType kv_dtype = DType::kF16;
  int kv_block_size = 16;
};

struct DecodeResult {
  int batch = 0;
  int context = 0;
  double step_seconds = 0;  // median
  double tokens_per_s = 0;  // batch / step_seconds
  double bytes_per_step = 0;
  double flops_per_step = 0;
  double roofline_seconds = 0;
  double share_of_roofline = 0;  // roofline_seconds / step_seconds
};

struct PrefillResult {
  int tokens = 0;
  double seconds = 0;  // median
  double tokens_per_s = 0;
  double flops = 0;
  double share_of_fma_peak = 0;  // (flops / seconds) / FMA peak
};

struct KernelBenchReport {
  MachineLimits limits;  // what the shares are computed from
  // Each measurement the limits were taken from, in order (empty when the
  // caller passed one set of limits and never re-measured).
  std::vector<MachineLimits> limits_measured;
  ModelCost cost;
  std::string weight_type;  // type of the largest matrices ("f32", "q8_0", ...)
  std::string kv_type;
  std::vector<DecodeResult> decode;
  PrefillResult prefill;
};

// Runs the model with `pool`: the prefill figure (one sequence, `prefill`
// tokens), then for the KV: one prefill of `context` tokens into a sequence's
// blocks, copied block by block into every other sequence's own blocks (so
// each sequence reads its own KV, as distinct requests would); then for each
// batch, one warm-up and `iterations` timed Forward calls of `batch` decode
// tokens at position `context` (each call rewrites the same KV slot).
// REQUIRES: weights valid; context >= 1, prefill >= 1, every batch >= 1,
// iterations >= 1, context + 1 and prefill <= the model's context length
// (checked: InvalidArgument). Errors of the forward pass are returned as is.
Result<KernelBenchReport> RunKernelBench(const ModelWeights& w, const KernelBenchOptions& options,
                                         const MachineLimits& limits, ThreadPool* pool);

// Sets r->limits and recomputes every share from it (the figures' times,
// bytes and flops stay). `strata bench kernels` measures the limits again
// after the figures and applies the stronger of the two measurements.
void ApplyLimits(KernelBenchReport* r, const MachineLimits& limits);

// Exactly one JSON object (issue "CPU backend speed" schema, plus "model").
std::string ReportJson(const KernelBenchReport& r);
// A readable table: each figure next to its limit and the ratio.
std::string ReportTable(const KernelBenchReport& r);

}  // namespace strata::bench
