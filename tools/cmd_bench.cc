// strata bench kernels: decode and prefill speed against the machine's limits
// (bench/kernel_bench.h; issue "CPU backend speed"; docs/PERFORMANCE.md).

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/kernel_bench.h"
#include "bench/machine_limits.h"
#include "common/logging.h"
#include "common/thread_pool.h"
#include "model/model_loader.h"
#include "tools/commands.h"

namespace strata::cli {

namespace {

struct KernelsFlags {
  std::string model;
  int threads = 0;
  std::string kv_dtype = "f16";
  int context = 512;
  std::vector<int> batches = {1, 8, 32};
  int prefill = 512;
  int iterations = 5;
  bool json = false;
};

int Fail(const Status& s) {
  std::fprintf(stderr, "strata bench kernels: %s\n", s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

int RunKernels(const KernelsFlags& f) {
  auto kv_dtype = DTypeFromName(f.kv_dtype);
  if (!kv_dtype) return Fail(Status::InvalidArgument("unknown --kv-dtype '" + f.kv_dtype + "'"));
  auto loaded = LoadModel(f.model);
  if (!loaded) return Fail(loaded.error());
  const ModelWeights& w = (*loaded)->weights;

  ThreadPool pool(f.threads);
  auto limits = bench::MeasureMachineLimits(&pool);
  if (!limits) return Fail(limits.error());
  STRATA_LOG_INFO("limits with {} threads: read {:.1f} GB/s, FMA peak {:.0f} GFLOP/s ({})",
                  limits->threads, limits->read_bandwidth_gbs, limits->fma_peak_gflops,
                  limits->simd);

  bench::KernelBenchOptions o;
  o.context = f.context;
  o.batches = f.batches;
  o.prefill = f.prefill;
  o.iterations = f.iterations;
  o.kv_dtype = *kv_dtype;
  auto report = bench::RunKernelBench(w, o, *limits, &pool);
  if (!report) return Fail(report.error());
  if (f.json) {
    std::printf("%s\n", bench::ReportJson(*report).c_str());
  } else {
    std::printf("%s (%s)\n", (*loaded)->id.c_str(), f.model.c_str());
    std::printf("%s", bench::ReportTable(*report).c_str());
  }
  return 0;
}

}  // namespace

void RegisterBench(CLI::App& app, int* exit_code) {
  CLI::App* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  bench->fallthrough();

  auto f = std::make_shared<KernelsFlags>();
  CLI::App* kernels = bench->add_subcommand(
      "kernels", "decode and prefill speed against the machine's bandwidth and FMA peak");
  kernels->add_option("--model", f->model, "GGUF file or Hugging Face directory")->required();
  kernels->add_option("--threads", f->threads, "compute threads (0 = all hardware threads)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  kernels->add_option("--kv-dtype", f->kv_dtype, "KV cache element type")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
  kernels->add_option("--context", f->context, "tokens already in each sequence's KV for decode")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  kernels->add_option("--batches", f->batches, "decode batch sizes, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  kernels->add_option("--prefill", f->prefill, "prompt length of the prefill figure")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  kernels
      ->add_option("--iterations", f->iterations,
                   "timed runs per figure (median), after one warm-up")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  kernels->add_flag("--json", f->json, "print one JSON object");
  kernels->callback([f, exit_code] { *exit_code = RunKernels(*f); });

  RegisterBenchSimulate(bench, exit_code);
}

}  // namespace strata::cli
