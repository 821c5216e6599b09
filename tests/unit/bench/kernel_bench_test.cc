// The cost formulas of `strata bench kernels` against a hand calculation, and
// the benchmark run's shape and checks on a small synthetic model.

#include "bench/kernel_bench.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "bench/calibrate.h"
#include "bench/machine_limits.h"
#include "model/synth.h"

namespace strata::bench {
namespace {

// dim 64, 2 layers, 4 heads (head_dim 16), 2 KV heads, ffn 128, vocab 100.
ModelConfig SmallConfig() {
  ModelConfig c;
  c.arch = "llama";
  c.name = "bench-test";
  c.dim = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.ffn_dim = 128;
  c.vocab_size = 100;
  c.context_length = 64;
  return c;
}

ModelWeights SmallWeights() {
  SynthOptions o;
  o.dtype = DType::kF32;
  auto w = MakeSyntheticWeights(SmallConfig(), o);
  EXPECT_TRUE(w.ok()) << w.error().message();
  return std::move(w).value();
}

TEST(KernelBenchCost, MatchesHandCalculation) {
  ModelWeights w = SmallWeights();
  ModelCost c = ComputeModelCost(w, DType::kF32);
  // Per layer: 2 norms (64 each) + wq 64x64 + wk, wv 64x32 + wo 64x64 +
  // gate, up, down 64x128 = 128 + 4096 + 4096 + 4096 + 24576 = 36992.
  // Two layers + output norm (64) = 74048.
  EXPECT_EQ(c.body_params, 74048);
  EXPECT_EQ(c.body_bytes, 74048 * 4);
  EXPECT_EQ(c.head_params, 6400);  // 64 x 100
  EXPECT_EQ(c.head_bytes, 25600);
  EXPECT_EQ(c.embedding_params, 6400);
  EXPECT_EQ(c.embedding_row_bytes, 256);  // 64 f32
  EXPECT_EQ(c.params_excluding_embedding(), 80448);
  EXPECT_EQ(c.kv_bytes_per_token, 512);  // 2 layers x (K, V) x 32 x 4 bytes
  EXPECT_EQ(ComputeModelCost(w, DType::kF16).kv_bytes_per_token, 256);

  // Decode, context 16, batch 2, f32 KV:
  // bytes = 296192 + 25600 + 2 x 256 + 16 x 512 x 2 = 338688.
  EXPECT_DOUBLE_EQ(DecodeStepBytes(c, 2, 16), 338688.0);
  // flops = 2 x 80448 x 2 + 4 x 2 x 4 x 16 x 16 x 2 = 321792 + 16384.
  EXPECT_DOUBLE_EQ(DecodeStepFlops(c, 2, 16), 338176.0);
  // Prefill of 16: 2 x 74048 x 16 + 2 x 2 x 4 x 16 x 16^2 + 2 x 6400.
  EXPECT_DOUBLE_EQ(PrefillFlops(c, 16), 2369536.0 + 65536.0 + 12800.0);

  MachineLimits limits;
  limits.read_bandwidth_gbs = 10;  // bytes bound: 338688 / 1e10
  limits.fma_peak_gflops = 100;
  EXPECT_DOUBLE_EQ(RooflineSeconds(338688.0, 338176.0, limits), 338688.0 / 1e10);
  limits.fma_peak_gflops = 0.01;  // flops bound: 338176 / 1e7
  EXPECT_DOUBLE_EQ(RooflineSeconds(338688.0, 338176.0, limits), 338176.0 / 1e7);
}

TEST(KernelBenchCost, TiedHeadCountsTheEmbeddingTableAsHead) {
  ModelWeights w = SmallWeights();
  w.output = Tensor{};  // as a tied model loads: no separate output tensor
  ModelCost c = ComputeModelCost(w, DType::kF32);
  EXPECT_EQ(c.head_params, 6400);
  EXPECT_EQ(c.head_bytes, 25600);
}

MachineLimits Limits(double gbs, double gflops, int threads) {
  MachineLimits l;
  l.read_bandwidth_gbs = gbs;
  l.fma_peak_gflops = gflops;
  l.threads = threads;
  return l;
}

// Context 16, an 8-token prefill: small enough for SmallWeights.
KernelBenchOptions SmallRun(std::vector<int> batches, int iterations) {
  KernelBenchOptions o;
  o.context = 16;
  o.batches = std::move(batches);
  o.prefill = 8;
  o.iterations = iterations;
  return o;
}

TEST(KernelBench, RunsEveryFigureWithTheFormulas) {
  ModelWeights w = SmallWeights();
  ThreadPool pool(2);
  const MachineLimits limits = Limits(20, 200, 2);
  KernelBenchOptions o = SmallRun({1, 3}, 2);
  o.kv_dtype = DType::kF16;
  auto r = RunKernelBench(w, o, limits, &pool);
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ(r->decode.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const DecodeResult& d = r->decode[i];
    EXPECT_EQ(d.batch, o.batches[i]);
    EXPECT_EQ(d.context, 16);
    EXPECT_GT(d.tokens_per_s, 0);
    EXPECT_DOUBLE_EQ(d.bytes_per_step, DecodeStepBytes(r->cost, d.batch, 16));
    EXPECT_DOUBLE_EQ(d.flops_per_step, DecodeStepFlops(r->cost, d.batch, 16));
    EXPECT_DOUBLE_EQ(d.share_of_roofline,
                     RooflineSeconds(d.bytes_per_step, d.flops_per_step, limits) / d.step_seconds);
    EXPECT_GT(d.share_of_roofline, 0);
  }
  EXPECT_EQ(r->prefill.tokens, 8);
  EXPECT_GT(r->prefill.tokens_per_s, 0);
  EXPECT_DOUBLE_EQ(r->prefill.flops, PrefillFlops(r->cost, 8));
  EXPECT_GT(r->prefill.share_of_fma_peak, 0);
  EXPECT_EQ(r->weight_type, "f32");
  EXPECT_EQ(r->kv_type, "f16");

  nlohmann::json j = nlohmann::json::parse(ReportJson(*r));
  EXPECT_EQ(j["limits"]["threads"], 2);
  EXPECT_EQ(j["decode"].size(), 2u);
  EXPECT_EQ(j["decode"][1]["batch"], 3);
  EXPECT_EQ(j["prefill"]["tokens"], 8);
  EXPECT_FALSE(ReportTable(*r).empty());
}

// Re-applying stronger limits (as `strata bench kernels` does with its
// second measurement) recomputes every share from the same times, and the
// JSON lists each measurement.
TEST(KernelBench, StrongerLimitsRecomputeEveryShare) {
  ModelWeights w = SmallWeights();
  ThreadPool pool(1);
  const MachineLimits before = Limits(20, 100, 1);
  const KernelBenchOptions o = SmallRun({1, 4}, 1);
  auto r = RunKernelBench(w, o, before, &pool);
  ASSERT_TRUE(r.ok()) << r.error().message();
  const KernelBenchReport first = *r;

  MachineLimits after = before;
  after.read_bandwidth_gbs = 40;  // higher bandwidth, lower FMA peak
  after.fma_peak_gflops = 50;
  const MachineLimits best = Stronger(before, after);
  EXPECT_DOUBLE_EQ(best.read_bandwidth_gbs, 40);
  EXPECT_DOUBLE_EQ(best.fma_peak_gflops, 100);
  EXPECT_EQ(best.threads, 1);

  r->limits_measured = {before, after};
  ApplyLimits(&*r, best);
  for (size_t i = 0; i < r->decode.size(); ++i) {
    const DecodeResult& d = r->decode[i];
    EXPECT_DOUBLE_EQ(d.step_seconds, first.decode[i].step_seconds);
    EXPECT_DOUBLE_EQ(d.roofline_seconds, RooflineSeconds(d.bytes_per_step, d.flops_per_step, best));
    EXPECT_DOUBLE_EQ(d.share_of_roofline, d.roofline_seconds / d.step_seconds);
    EXPECT_LE(d.share_of_roofline, first.decode[i].share_of_roofline);  // more bandwidth: less credit
  }
  EXPECT_DOUBLE_EQ(r->prefill.share_of_fma_peak, first.prefill.share_of_fma_peak);  // same peak
  nlohmann::json j = nlohmann::json::parse(ReportJson(*r));
  ASSERT_EQ(j["limits"]["measured"].size(), 2u);
  EXPECT_DOUBLE_EQ(j["limits"]["measured"][1]["read_bandwidth_gbs"].get<double>(), 40);
  EXPECT_DOUBLE_EQ(j["limits"]["read_bandwidth_gbs"].get<double>(), 40);
  EXPECT_NE(ReportTable(*r).find("measured before and after"), std::string::npos);
}

TEST(KernelBench, RejectsShapesPastTheContext) {
  ModelWeights w = SmallWeights();
  ThreadPool pool(1);
  MachineLimits limits;
  KernelBenchOptions o;
  o.context = 64;  // + the decoded token = 65 > 64
  o.batches = {1};
  o.prefill = 8;
  auto r = RunKernelBench(w, o, limits, &pool);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
  o.context = 8;
  o.batches = {0};
  EXPECT_EQ(RunKernelBench(w, o, limits, &pool).error().code(), StatusCode::kInvalidArgument);
}

TEST(MachineLimits, MeasuresPositiveLimitsWithThePoolsThreads) {
  ThreadPool pool(2);
  LimitsOptions o;
  o.buffer_bytes = size_t{8} << 20;
  o.passes = 1;
  o.fma_seconds = 0.01;
  auto l = MeasureMachineLimits(&pool, o);
  ASSERT_TRUE(l.ok()) << l.error().message();
  EXPECT_EQ(l->threads, 2);
  EXPECT_GT(l->read_bandwidth_gbs, 0);
  EXPECT_GT(l->fma_peak_gflops, 0);
  EXPECT_FALSE(l->simd.empty());
  o.buffer_bytes = 1024;
  EXPECT_EQ(MeasureMachineLimits(&pool, o).error().code(), StatusCode::kInvalidArgument);
}

// The fit recovers known coefficients from exact points, keeps every
// coefficient non-negative, and rejects points without a time.
TEST(Calibrate, FitRecoversKnownCoefficientsAndStaysNonNegative) {
  const CostModel truth{0.002, 3e-3, 4e-7, 0.015, 0.01, 2e-6};
  std::vector<PrefillPoint> pre;
  for (int t : {32, 128, 512}) pre.push_back({t, truth.a + truth.b * t + truth.c * t * t / 2.0});
  std::vector<DecodePoint> dec;
  for (int b : {1, 4, 16})
    for (int ctx : {128, 512}) dec.push_back({b, ctx, truth.d + truth.e * b + truth.f * b * (ctx + 1.0)});
  auto fit = FitCostModel(pre, dec);
  ASSERT_TRUE(fit.ok()) << fit.error().message();
  EXPECT_NEAR(fit->model.a, truth.a, 1e-9);
  EXPECT_NEAR(fit->model.b, truth.b, 1e-9);
  EXPECT_NEAR(fit->model.c, truth.c, 1e-12);
  EXPECT_NEAR(fit->model.d, truth.d, 1e-9);
  EXPECT_NEAR(fit->model.e, truth.e, 1e-9);
  EXPECT_NEAR(fit->model.f, truth.f, 1e-12);
  EXPECT_LT(fit->prefill_max_rel_error, 1e-9);
  EXPECT_LT(fit->decode_max_rel_error, 1e-9);
  // The fitted model prices a step as the simulator will.
  std::vector<int32_t> prompt(100, 1), one(1, 1);
  std::vector<ForwardSeq> batch(1);
  batch[0].tokens = prompt;
  EXPECT_NEAR(fit->model.StepSeconds(batch), truth.StepSeconds(batch), 1e-9);
  batch.assign(2, ForwardSeq{});
  batch[0].tokens = one;
  batch[0].start_pos = 300;
  batch[1].tokens = one;
  batch[1].start_pos = 40;
  EXPECT_NEAR(fit->model.StepSeconds(batch), truth.StepSeconds(batch), 1e-9);

  // Times that fall with length would need a negative slope: the fit clamps it.
  auto clamped = FitCostModel({{32, 0.5}, {128, 0.4}, {512, 0.3}}, {{1, 128, 0.01}, {4, 128, 0.02}});
  ASSERT_TRUE(clamped.ok());
  for (double v : {clamped->model.a, clamped->model.b, clamped->model.c, clamped->model.d, clamped->model.e,
                   clamped->model.f})
    EXPECT_GE(v, 0.0);
  EXPECT_GT(clamped->prefill_max_rel_error, 0.0);

  EXPECT_EQ(FitCostModel({{32, 0.0}}, dec).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(FitCostModel(pre, {}).error().code(), StatusCode::kInvalidArgument);
}

// On a real (small) model: positive step costs, and the JSON reads back
// through the cluster file's loader.
TEST(Calibrate, TimesARealModelAndWritesALoadableCostFile) {
  ModelWeights w = SmallWeights();
  ThreadPool pool(2);
  CalibrateOptions o;
  o.prefill_tokens = {8, 32};
  o.decode_batches = {1, 4};
  o.decode_contexts = {8, 24};
  o.iterations = 1;
  auto c = Calibrate(w, o, &pool);
  ASSERT_TRUE(c.ok()) << c.error().message();
  EXPECT_EQ(c->prefill.size(), 2u);
  EXPECT_EQ(c->decode.size(), 4u);
  // A positive time for every step. Not a + b > 0: with one timed run per
  // point on a shared machine, a 32-token prefill slowed 16x against the
  // 8-token one (a neighbour's burst) is fitted best by the quadratic term
  // alone (CI failed that way once).
  EXPECT_GT(c->model.a + c->model.b + c->model.c, 0.0);
  EXPECT_GT(c->model.d + c->model.e + c->model.f, 0.0);
  const std::string path = ::testing::TempDir() + "/calibrated_costs.json";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(CalibrationJson(*c, "small", 2).c_str(), f);
    std::fclose(f);
  }
  auto back = LoadCostModel(path);
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_DOUBLE_EQ(back->b, c->model.b);
  EXPECT_DOUBLE_EQ(back->f, c->model.f);
  o.decode_contexts = {64};  // + the decoded token is past the context
  EXPECT_EQ(Calibrate(w, o, &pool).error().code(), StatusCode::kInvalidArgument);
}

// A router's --calibration file: one cost model for every instance, or one
// per instance name with an optional default; bad values name the key.
TEST(Calibrate, ClusterCalibrationFileByInstanceOrForAll) {
  const std::string dir = ::testing::TempDir();
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = dir + "/" + name;
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(text.c_str(), f);
    std::fclose(f);
    return path;
  };
  auto all = LoadClusterCalibration(write("cal_all.json", R"({"a":0.001,"b":0.0001,"points":[]})"));
  ASSERT_TRUE(all.ok()) << all.error().message();
  ASSERT_TRUE(all->default_model.has_value());
  EXPECT_DOUBLE_EQ(all->default_model->b, 0.0001);
  EXPECT_TRUE(all->instances.empty());
  auto each = LoadClusterCalibration(
      write("cal_each.json", R"({"instances":{"p0":{"b":0.001},"p1":{"b":0.002,"d":0.01}},"default":{"b":0.003}})"));
  ASSERT_TRUE(each.ok()) << each.error().message();
  ASSERT_EQ(each->instances.size(), 2u);
  EXPECT_DOUBLE_EQ(each->instances["p1"].d, 0.01);
  EXPECT_DOUBLE_EQ(each->default_model->b, 0.003);
  auto none = LoadClusterCalibration(write("cal_nodefault.json", R"({"instances":{"p0":{"b":0.001}}})"));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->default_model.has_value());
  auto bad = LoadClusterCalibration(write("cal_bad.json", R"({"instances":{"p0":{"b":-1}}})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("instances.p0"), std::string::npos) << bad.error().message();
  EXPECT_FALSE(LoadClusterCalibration(write("cal_list.json", R"({"instances":[1]})")).ok());
  EXPECT_FALSE(LoadClusterCalibration(dir + "/no_such_file.json").ok());
}

}  // namespace
}  // namespace strata::bench
