#pragma once
// Subcommands of the `strata` executable. Each Register* adds its CLI11
// subcommand and the callback that runs it; the callback stores the process
// exit code in *exit_code.

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "kvcache/kv_config.h"
#include "model/model_loader.h"

namespace strata::cli {

void RegisterGenerate(CLI::App& app, int* exit_code);
void RegisterModel(CLI::App& app, int* exit_code);
void RegisterBench(CLI::App& app, int* exit_code);
// `strata bench simulate` (tools/cmd_bench_sim.cc), added under `bench`.
void RegisterBenchSimulate(CLI::App* bench, int* exit_code);
void RegisterBenchCalibrate(CLI::App* bench, int* exit_code);
// `strata bench kvcache` (tools/cmd_bench_kv.cc): tier move, disk and TTFT benchmarks.
void RegisterBenchKvcache(CLI::App* bench, int* exit_code);
void RegisterServe(CLI::App& app, int* exit_code);
void RegisterCache(CLI::App& app, int* exit_code);
// `strata transfer serve` (tools/cmd_transfer.cc).
void RegisterTransfer(CLI::App& app, int* exit_code);
// `strata bench transfer` (tools/cmd_bench_transfer.cc).
void RegisterBenchTransfer(CLI::App* bench, int* exit_code);
// `strata bench vs-llamacpp` (tools/cmd_bench_vs.cc).
void RegisterBenchVsLlamacpp(CLI::App* bench, int* exit_code);
// `strata meta` (tools/cmd_meta.cc).
void RegisterMeta(CLI::App& app, int* exit_code);
// `strata router` (tools/cmd_router.cc).
void RegisterRouter(CLI::App& app, int* exit_code);
// `strata cluster status|predict` (tools/cmd_cluster.cc).
void RegisterCluster(CLI::App& app, int* exit_code);

// `strata eval kld | text` (tools/cmd_eval.cc).
void RegisterEval(CLI::App& app, int* exit_code);

// Options shared by every command that runs the model.
struct EngineFlags {
  std::string config_path;
  int kv_block_size = 16;
  std::string kv_dtype = "f16";
  int threads = 0;  // 0 = all hardware threads
  // --int8-activations / --exact-activations / engine.activations (auto |
  // int8 | exact): how quantized weights multiply activations;
  // ResolveEngineFlags sets cpu::SetActivationMode.
  bool int8_activations = false;
  bool exact_activations = false;
  std::string activations = "auto";
  std::string chat_template;
  // KV cache tiers as typed (--kv-device-bytes ...); ResolveEngineFlags
  // merges them with the YAML kv.* keys into `kv`.
  std::string kv_device_bytes, kv_host_bytes, kv_disk_path, kv_disk_bytes, kv_disk_admit_after, kv_load_policy;
  kvcache::KvCacheConfig kv;
  // Further YAML keys the command reads itself (accepted by the key check).
  std::vector<std::string> extra_config_keys;
};
void AddEngineFlags(CLI::App* cmd, EngineFlags* f);
// Adds --int8-activations and --exact-activations (mutually exclusive) to cmd.
void AddActivationFlags(CLI::App* cmd, bool* int8, bool* exact);
// Sets the process's cpu::ActivationMode from those flags: int8, exact, or
// (neither) `fallback` (auto unless a config says otherwise).
void ApplyActivationFlags(bool int8, bool exact, const std::string& fallback = "auto");
// Applies the YAML config (if any) under the flags the user did not set.
bool ResolveEngineFlags(CLI::App* cmd, EngineFlags* f, std::string* model_path, std::string* error);

// Loads the model a command runs: `*model_path`, or (when empty) the
// synthetic default model, written on first use; *model_path is set to the
// path loaded. Chat format from --chat-template / model.chat_template.
Result<std::unique_ptr<LoadedModel>> LoadCommandModel(const EngineFlags& f, std::string* model_path);

}  // namespace strata::cli
