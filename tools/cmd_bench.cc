// strata bench kernels: decode and prefill speed against the machine's limits
// (bench/kernel_bench.h; issue "CPU backend speed"; docs/PERFORMANCE.md).
// strata bench run / compare: live load against a server and side-by-side
// reports (bench/workload.h, load_driver.h, report.h, compare.h; issue
// "strata bench"; docs/bench.md).

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bench/compare.h"
#include "bench/kernel_bench.h"
#include "bench/load_driver.h"
#include "bench/report.h"
#include "bench/workload.h"
#include "bench/machine_limits.h"
#include "common/logging.h"
#include "common/thread_pool.h"
#include "model/model_loader.h"
#include "common/http_client.h"
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
  bool int8_activations = false, exact_activations = false;
  bool no_weight_pack = false;
  bool json = false;
};

int Fail(const Status& s) {
  std::fprintf(stderr, "strata bench kernels: %s\n", s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

int RunKernels(const KernelsFlags& f) {
  auto kv_dtype = DTypeFromName(f.kv_dtype);
  if (!kv_dtype) return Fail(Status::InvalidArgument("unknown --kv-dtype '" + f.kv_dtype + "'"));
  ApplyActivationFlags(f.int8_activations, f.exact_activations);
  LoadOptions lo;
  lo.pack_weights = !f.no_weight_pack;
  auto loaded = LoadModel(f.model, lo);
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
  // Once more after the figures: a neighbour on this shared machine can hold
  // one measurement low for seconds, which would inflate every share.
  auto after = bench::MeasureMachineLimits(&pool);
  if (!after) return Fail(after.error());
  STRATA_LOG_INFO("limits again after the figures: read {:.1f} GB/s, FMA peak {:.0f} GFLOP/s",
                  after->read_bandwidth_gbs, after->fma_peak_gflops);
  report->limits_measured = {*limits, *after};
  bench::ApplyLimits(&*report, bench::Stronger(*limits, *after));
  if (f.json) {
    std::printf("%s\n", bench::ReportJson(*report).c_str());
  } else {
    std::printf("%s (%s)\n", (*loaded)->id.c_str(), f.model.c_str());
    std::printf("%s", bench::ReportTable(*report).c_str());
  }
  return 0;
}


struct RunFlags {
  std::string url;
  std::string out;
  std::string model;
  std::string slo;
  double rate = 0;
  int concurrency = 0;
  double time_scale = 1.0;
  int output_tokens = 0;  // 0 = the workload's default
  double scrape_interval = 1.0;
  double request_timeout = 600;
  bool no_plots = false;
  bool no_progress = false;
  bool unique_cache_salt = false;
  bench::WorkloadOptions w;
  int vocab_size = 0;  // 0 = ask the server
};

int RunFail(const char* cmd, const Status& s) {
  std::fprintf(stderr, "strata bench %s: %s\n", cmd, s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

std::string UtcNow() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

int RunLive(RunFlags f) {
  auto url = bench::ParseServerUrl(f.url);
  if (!url) return RunFail("run", url.error());
  auto slo = f.slo.empty() ? Result<bench::Slo>(bench::Slo{}) : bench::ParseSlo(f.slo);
  if (!slo) return RunFail("run", slo.error());
  if (f.rate > 0 && f.concurrency > 0) return RunFail("run", Status::InvalidArgument("give --rate or --concurrency, not both"));

  auto served = bench::QueryModel(*url);
  if (!served)
    return RunFail("run", served.error().WithContext("asking " + f.url + (url->grpc ? " (gRPC Health/Tokenize)" : "/v1/models")));
  const std::string model = f.model.empty() ? served->id : f.model;

  f.w.vocab_size = f.vocab_size;
  if (f.w.vocab_size <= 0) f.w.vocab_size = bench::ProbeVocabSize(*url, model);
  if (f.w.vocab_size <= 0) {
    f.w.vocab_size = 512;
    STRATA_LOG_WARN("the server did not say its vocabulary size; token ids stay below 512 (set --vocab-size)");
  }
  if (f.output_tokens > 0) f.w.chat_max_tokens = f.w.shared_max_tokens = f.w.output_tokens = f.output_tokens;
  auto workload = bench::BuildWorkload(f.w);
  if (!workload) return RunFail("run", workload.error());
  bench::DropOverContext(served->max_model_len, &*workload);
  if (workload->skipped_over_context > 0)
    STRATA_LOG_WARN("{} requests exceed the model's context of {} tokens and are skipped",
                    workload->skipped_over_context, served->max_model_len);

  bench::LoadOptions lo;
  lo.host = url->host;
  lo.port = url->port;
  lo.grpc = url->grpc;
  lo.model = model;
  lo.rate = f.rate;
  lo.concurrency = f.concurrency;
  if (f.rate <= 0 && f.concurrency <= 0 && workload->kind != bench::WorkloadKind::kTrace)
    lo.concurrency = workload->chat ? std::max(1, f.w.sessions) : 1;
  lo.time_scale = f.time_scale;
  lo.seed = f.w.seed;
  lo.request_timeout_s = f.request_timeout;
  lo.scrape_interval_s = f.scrape_interval;
  lo.progress = !f.no_progress && ::isatty(2);
  lo.max_model_len = served->max_model_len;
  lo.unique_cache_salt = f.unique_cache_salt;

  bench::RunData run;
  run.url = f.url;
  run.model = model;
  run.workload = f.w.spec;
  run.unique_cache_salt = lo.unique_cache_salt;
  run.mode = lo.rate > 0 ? "poisson" : lo.concurrency > 0 ? "closed-loop" : "trace-timestamps";
  run.rate = lo.rate;
  run.concurrency = lo.concurrency;
  run.time_scale = lo.time_scale;
  run.tokens_per_hash_id = f.w.tokens_per_hash_id;
  run.seed = f.w.seed;
  run.max_model_len = served->max_model_len;
  run.slo = *slo;
  run.started_at = UtcNow();
  STRATA_LOG_INFO("{}: {} requests in {} sessions, {} ({})", f.w.spec, workload->num_requests(),
                  workload->sessions.size(), run.mode, model);
  auto load = bench::RunLoad(*workload, lo);
  if (!load) return RunFail("run", load.error());
  run.load = std::move(*load);

  const bench::Summary summary = bench::Summarize(run);
  {
    std::ofstream out(f.out, std::ios::binary | std::ios::trunc);
    out << bench::RunJson(run, summary) << "\n";
    out.close();
    if (!out) return RunFail("run", Status::IoError("write", f.out, errno));
  }
  std::printf("%s", bench::HumanSummary(run, summary).c_str());
  std::printf("wrote %s\n", f.out.c_str());
  if (!f.no_plots) {
    auto plots = bench::WritePlots(run, summary, f.out);
    if (!plots) {
      STRATA_LOG_WARN("no plots: {}", plots.error().message());
    } else {
      for (const auto& p : *plots) std::printf("wrote %s\n", p.c_str());
    }
  }
  return summary.requests_ok > 0 || summary.requests_total == 0 ? 0 : 1;
}

int RunCompare(const std::vector<std::string>& files, bool json) {
  auto c = bench::LoadComparison(files);
  if (!c) return RunFail("compare", c.error());
  std::printf("%s", json ? (bench::ComparisonJson(*c) + "\n").c_str() : bench::ComparisonTable(*c).c_str());
  return 0;
}

void AddRun(CLI::App* bench, int* exit_code) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* run = bench->add_subcommand("run", "live load against a server: latency, throughput, goodput, cache hits");
  run->add_option("--url", f->url, "the server: http://HOST:PORT (OpenAI HTTP streaming), or grpc://HOST:PORT (strata's gRPC "
                  "service, streaming Generate/Chat), e.g. http://127.0.0.1:8000, grpc://127.0.0.1:50051")
      ->required();
  run->add_option("--workload", f->w.spec, "trace:FILE | chat | shared-prefix | random")->required();
  run->add_option("--out", f->out, "the JSON report; plots go next to it")->required();
  run->add_option("--model", f->model, "model name in requests (default: the first of GET /v1/models)");
  run->add_option("--rate", f->rate, "open loop: Poisson arrivals, sessions per second")->check(CLI::PositiveNumber);
  run->add_option("--concurrency", f->concurrency, "closed loop: concurrent users")->check(CLI::Range(1, 4096));
  run->add_option("--time-scale", f->time_scale, "trace timestamps are multiplied by this (0.5 = twice as fast)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  run->add_option("--max-requests", f->w.max_requests, "send at most this many requests (0 = all)")
      ->check(CLI::NonNegativeNumber);
  run->add_option("--tokens-per-hash-id", f->w.tokens_per_hash_id,
                  "trace: tokens per hash id (0 = real lengths, 512 per id); output lengths scale by N/512")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  run->add_option("--slo", f->slo, "goodput limits, e.g. ttft=2s,tpot=100ms[,e2e=10s]");
  run->add_option("--seed", f->w.seed, "workload and arrival seed")->capture_default_str();
  run->add_option("--vocab-size", f->vocab_size, "token ids stay below this (0 = ask the server)")
      ->check(CLI::NonNegativeNumber);
  run->add_option("--first-token-id", f->w.first_token_id, "smallest token id in generated prompts")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  run->add_option("--output-tokens", f->output_tokens, "max_tokens of every request (0 = the workload's default)")
      ->check(CLI::NonNegativeNumber);
  run->add_option("--sessions", f->w.sessions, "chat: conversations")->capture_default_str();
  run->add_option("--turns", f->w.turns, "chat: turns per conversation")->capture_default_str();
  run->add_option("--think-time", f->w.think_time_s, "chat: seconds between a reply and the next turn")
      ->capture_default_str();
  run->add_option("--system-prompt-words", f->w.system_prompt_words, "chat: words in the shared system prompt")
      ->capture_default_str();
  run->add_option("--user-words", f->w.user_words, "chat: words per user message")->capture_default_str();
  run->add_option("--documents", f->w.documents, "shared-prefix: documents")->capture_default_str();
  run->add_option("--document-tokens", f->w.document_tokens, "shared-prefix: tokens per document")
      ->capture_default_str();
  run->add_option("--questions", f->w.questions, "shared-prefix: questions per document")->capture_default_str();
  run->add_option("--question-tokens", f->w.question_tokens, "shared-prefix: tokens per question")
      ->capture_default_str();
  run->add_option("--requests", f->w.requests, "random: requests")->capture_default_str();
  run->add_option("--input-tokens", f->w.input_tokens, "random: prompt tokens")->capture_default_str();
  run->add_option("--range-ratio", f->w.range_ratio, "random: lengths vary uniformly by ± this fraction")
      ->capture_default_str();
  run->add_option("--scrape-interval", f->scrape_interval, "seconds between /metrics scrapes (0 = before/after only)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  run->add_option("--request-timeout", f->request_timeout, "seconds to wait for the next bytes of a stream")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  run->add_flag("--unique-cache-salt", f->unique_cache_salt,
                "a different cache_salt on every request: no request reuses another's KV (cache-off baseline)");
  run->add_flag("--no-plots", f->no_plots, "skip the gnuplot images");
  run->add_flag("--no-progress", f->no_progress, "no progress bar even on a terminal");
  run->callback([f, exit_code] { *exit_code = RunLive(*f); });

  auto files = std::make_shared<std::vector<std::string>>();
  auto json = std::make_shared<bool>(false);
  CLI::App* cmp = bench->add_subcommand("compare", "side-by-side table of `bench run` JSON files with ratios to the first");
  cmp->add_option("files", *files, "A.json B.json ...")->required()->check(CLI::ExistingFile);
  cmp->add_flag("--json", *json, "print one JSON object");
  cmp->callback([files, json, exit_code] { *exit_code = RunCompare(*files, *json); });
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
  AddActivationFlags(kernels, &f->int8_activations, &f->exact_activations);
  kernels->add_flag("--no-weight-pack", f->no_weight_pack,
                    "keep every weight in the file's layout: no lane copy of q4_0/q8_0 (the int8 lane kernel then "
                    "transposes them on every call) and no column panels of wide rows; for comparing");
  kernels->add_flag("--json", f->json, "print one JSON object");
  kernels->callback([f, exit_code] { *exit_code = RunKernels(*f); });

  AddRun(bench, exit_code);
  RegisterBenchSimulate(bench, exit_code);
  RegisterBenchCalibrate(bench, exit_code);
  RegisterBenchKvcache(bench, exit_code);
  RegisterBenchTransfer(bench, exit_code);
  RegisterBenchVsLlamacpp(bench, exit_code);
}

}  // namespace strata::cli
