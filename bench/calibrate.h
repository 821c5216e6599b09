#pragma once
// `strata bench calibrate`: the simulator's cost model (bench/cost_model.h)
// fitted to this machine's own forward passes, so that `strata bench simulate`
// and a live `strata bench run` can be compared under the same conditions.
//
// It times prefills of a few prompt lengths from position 0 and decode steps
// at a few batch sizes and contexts (bench/kernel_bench.h does the timing),
// then fits, by non-negative least squares,
//   prefill seconds(T)   = a + b * T + c * T^2 / 2   (chunk at position 0: ctx = T / 2)
//   decode seconds(B, C) = d + e * B + f * B * (C + 1)
// the same terms CostModel::StepSeconds adds up.
//
// Thread-safety: FitCostModel is pure; Calibrate uses the pool it is given
// (one call at a time per pool).

#include <string>
#include <vector>

#include "bench/cost_model.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "model/backend/dtype.h"
#include "model/weights.h"

namespace strata::bench {

struct PrefillPoint {
  int tokens = 0;
  double seconds = 0;
};
struct DecodePoint {
  int batch = 0;
  int context = 0;  // tokens already in the KV (the step attends to context + 1)
  double seconds = 0;
};

struct CalibrateOptions {
  // The longest prompt fixes the attention term c: chunks late in a long
  // prompt attend to thousands of positions.
  std::vector<int> prefill_tokens = {32, 128, 512, 2048};
  std::vector<int> decode_batches = {1, 4, 16};
  std::vector<int> decode_contexts = {128, 512};
  int iterations = 5;  // timed runs per point (median), after a warm-up
  DType kv_dtype = DType::kF16;
  int kv_block_size = 16;
};

struct Calibration {
  CostModel model;
  std::vector<PrefillPoint> prefill;
  std::vector<DecodePoint> decode;
  // Largest |fitted - measured| / measured over the points of each part.
  double prefill_max_rel_error = 0, decode_max_rel_error = 0;
};

// Fits a, b, c to `prefill` and d, e, f to `decode` (each coefficient >= 0;
// exact non-negative least squares over the three terms). Errors: fewer than
// one point in a part, or a point with a non-positive time or size.
Result<Calibration> FitCostModel(std::vector<PrefillPoint> prefill, std::vector<DecodePoint> decode);

// Times the points with the model and fits them.
// REQUIRES: every length and context + 1 within the model's context length
// (checked by the kernel bench: InvalidArgument).
Result<Calibration> Calibrate(const ModelWeights& w, const CalibrateOptions& options, ThreadPool* pool);

// {"a":..,"b":..,"c":..,"d":..,"e":..,"f":..} (LoadCostModel reads it back)
// plus "points" and the fit errors, which LoadCostModel ignores.
std::string CalibrationJson(const Calibration& c, const std::string& model_path, int threads);

}  // namespace strata::bench
