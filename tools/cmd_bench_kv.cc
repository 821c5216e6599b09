// strata bench kvcache: the tiered KV cache's figures against the machine's
// limits measured in the same process (bench/kv_bench.h; issue 4;
// docs/PERFORMANCE.md, "Tiered KV cache (issue 4)"; docs/cli.md).

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "bench/kv_bench.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/thread_pool.h"
#include "kvcache/clock.h"
#include "kvcache/kv_config.h"
#include "model/backend/kv_layout.h"
#include "model/forward.h"
#include "model/model_loader.h"
#include "model/synth.h"
#include "tools/commands.h"
#include "tools/kv_stack.h"

namespace strata::cli {
namespace {

struct KvBenchFlags {
  std::string model;
  std::vector<std::string> parts = {"moves", "disk", "ttft"};
  std::string block_bytes;  // empty = from --model's layout, else bench-110m's
  int blocks = 256;
  int kv_block_size = 16;
  std::string disk_path;  // empty = a temporary directory under /tmp
  std::string disk_sizes = "64K,256K,1M";
  std::string disk_total_bytes = "256M";
  unsigned queue_depth = 32;
  int prompt_tokens = 2048;
  int cached_tokens = 1792;
  int iterations = 3;
  int threads = 0;
  bool json = false;
};

int Fail(const Status& s) {
  std::fprintf(stderr, "strata bench kvcache: %s\n", s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

bool Has(const std::vector<std::string>& parts, const char* p) {
  for (const auto& x : parts)
    if (x == p) return true;
  return false;
}

Result<uint64_t> Size(const std::string& text, const std::string& flag) {
  auto v = ParseByteSize(text);
  if (!v.ok() || *v == 0) return Status::InvalidArgument(flag + ": '" + text + "' is not a size > 0 (e.g. 256K, 1M)");
  return *v;
}

KvLayout LayoutOf(const ModelConfig& c, int block_size) {
  return KvLayout{c.n_layers, c.n_kv_heads, c.head_dim, block_size, DType::kF16};
}

// Removes a directory this command made, on every path out.
struct TempDir {
  std::string path;
  bool owned = false;
  ~TempDir() {
    if (owned) {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  }
};

Result<bench::TtftResult> RunTtft(const KvBenchFlags& f, const LoadedModel& m, const std::string& dir) {
  const ModelConfig& c = m.weights.config;
  const int bs = f.kv_block_size;
  const KvLayout layout = LayoutOf(c, bs);
  const int seq_blocks = (f.prompt_tokens + 1 + bs - 1) / bs;
  ThreadPool pool(f.threads);
  KvOptions cached_kv{bs, DType::kF16, 3 * seq_blocks};
  KvOptions plain_kv{bs, DType::kF16, seq_blocks};
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<CpuModel> cached, OpenCpuModel(m, cached_kv, &pool));
  STRATA_ASSIGN_OR_RETURN(auto plain_engine, ForwardEngine::Create(m.weights, plain_kv, &pool));
  const uint64_t seq_bytes = static_cast<uint64_t>(seq_blocks) * layout.block_bytes();
  kvcache::KvCacheConfig kvc;
  kvc.block_size = bs;
  kvc.dtype = "f16";
  kvc.device_bytes = 3 * seq_bytes;
  kvc.host_bytes = 4 * seq_bytes;
  kvc.disk_path = dir + "/strata-kvbench-ttft";
  kvc.disk_bytes = 4 * seq_bytes;
  kvc.load_policy = kvcache::LoadPolicy::kAlways;
  // Every tier is seeded with the prefix (write-through), then each is
  // measured alone.
  kvc.host_write_policy = kvcache::WritePolicy::kWriteThrough;
  kvc.host_write_policy_set = true;
  kvc.tiers_configured = true;
  STRATA_LOG_INFO("TTFT: {} ({} layers, dim {}), {} threads, blocks of {} bytes, disk tier in {}", m.id, c.n_layers,
                  c.dim, pool.num_threads(), layout.block_bytes(), kvc.disk_path);
  std::error_code ec;
  std::filesystem::remove_all(kvc.disk_path, ec);  // a cache left by an earlier run would hit the seed
  STRATA_ASSIGN_OR_RETURN(auto stack,
                          OpenKvStack(kvc, m, *cached->backend, cached->pool, *cached->forward, kvcache::RealClock()));
  bench::TtftSetup setup;
  setup.cached_engine = cached->forward.get();
  setup.kv = stack->manager.get();
  setup.plain_engine = plain_engine.get();
  setup.tokenizer = m.tokenizer.get();
  bench::TtftOptions o;
  o.prompt_tokens = f.prompt_tokens;
  o.cached_tokens = f.cached_tokens;
  o.iterations = f.iterations;
  auto r = bench::MeasureTtft(setup, o);
  stack.reset();  // drains the disk tier before its directory goes
  std::filesystem::remove_all(kvc.disk_path, ec);
  return r;
}

int RunKvBench(const KvBenchFlags& f) {
  for (const auto& p : f.parts)
    if (p != "moves" && p != "disk" && p != "ttft")
      return Fail(Status::InvalidArgument("--parts: unknown part '" + p + "' (moves, disk, ttft)"));
  const bool want_ttft = Has(f.parts, "ttft");
  if (want_ttft && f.model.empty())
    return Fail(Status::InvalidArgument(
        "--model is required for the ttft part (make one with `strata model synth --preset bench-110m --dtype q8_0 "
        "--out /tmp/bench-110m-q8_0.gguf`, or give --parts moves,disk)"));

  std::unique_ptr<LoadedModel> model;
  if (!f.model.empty()) {
    auto loaded = LoadModel(f.model);
    if (!loaded) return Fail(loaded.error());
    model = std::move(*loaded);
  }

  bench::KvBenchReport report;
  if (Has(f.parts, "moves")) {
    bench::KvMoveOptions o;
    o.block_size = f.kv_block_size;
    o.blocks = f.blocks;
    o.iterations = f.iterations;
    if (!f.block_bytes.empty()) {
      auto v = Size(f.block_bytes, "--block-bytes");
      if (!v) return Fail(v.error());
      o.block_bytes = *v;
    } else if (model) {
      o.block_bytes = LayoutOf(model->weights.config, f.kv_block_size).block_bytes();
    } else {
      auto c = SynthPresetConfig("bench-110m", 0);
      if (!c) return Fail(c.error());
      o.block_bytes = LayoutOf(*c, f.kv_block_size).block_bytes();
    }
    STRATA_LOG_INFO("tier moves: {} blocks of {} bytes, {} runs", o.blocks, o.block_bytes, o.iterations);
    auto r = bench::MeasureTierMoves(o);
    if (!r) return Fail(r.error());
    report.has_moves = true;
    report.moves = *r;
  }

  TempDir dir;
  if (Has(f.parts, "disk") || want_ttft) {
    if (f.disk_path.empty()) {
      char tmpl[] = "/tmp/strata-kvbench-XXXXXX";
      if (::mkdtemp(tmpl) == nullptr) return Fail(Status::IoError("mkdtemp", tmpl, errno));
      dir.path = tmpl;
      dir.owned = true;
    } else {
      std::error_code ec;
      if (!std::filesystem::is_directory(f.disk_path, ec))
        return Fail(Status::InvalidArgument("--disk-path '" + f.disk_path + "' is not a directory"));
      dir.path = f.disk_path;
    }
  }

  if (Has(f.parts, "disk")) {
    bench::DiskBenchOptions o;
    o.directory = dir.path;
    o.queue_depth = f.queue_depth;
    o.iterations = f.iterations;
    auto total = Size(f.disk_total_bytes, "--disk-total-bytes");
    if (!total) return Fail(total.error());
    o.total_bytes = *total;
    size_t pos = 0;
    while (pos <= f.disk_sizes.size()) {
      size_t end = f.disk_sizes.find(',', pos);
      if (end == std::string::npos) end = f.disk_sizes.size();
      auto v = Size(f.disk_sizes.substr(pos, end - pos), "--disk-sizes");
      if (!v) return Fail(v.error());
      o.block_sizes.push_back(*v);
      pos = end + 1;
    }
    STRATA_LOG_INFO("disk: {} sizes, {} bytes each, queue depth {}, in {}", o.block_sizes.size(), o.total_bytes,
                    o.queue_depth, o.directory);
    auto r = bench::MeasureDisk(o);
    if (!r) return Fail(r.error());
    report.has_disk = true;
    report.disk = *r;
    report.disk_directory = o.directory;
    report.disk_queue_depth = o.queue_depth;
    report.disk_total_bytes = o.total_bytes;
  }

  if (want_ttft) {
    auto r = RunTtft(f, *model, dir.path);
    if (!r) return Fail(r.error());
    report.has_ttft = true;
    report.ttft = *r;
    report.model = model->id;
  }

  if (f.json) {
    std::printf("%s\n", bench::KvReportJson(report).c_str());
  } else {
    std::printf("%s", bench::KvReportTable(report).c_str());
  }
  return 0;
}

}  // namespace

void RegisterBenchKvcache(CLI::App* bench, int* exit_code) {
  auto f = std::make_shared<KvBenchFlags>();
  CLI::App* cmd = bench->add_subcommand(
      "kvcache", "tiered KV cache: tier moves vs memcpy, disk tier vs raw O_DIRECT, TTFT of cached prefixes");
  cmd->add_option("--model", f->model, "GGUF file or Hugging Face directory (the ttft part; its KV layout for moves)");
  cmd->add_option("--parts", f->parts, "what to measure, comma-separated: moves, disk, ttft")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--block-bytes", f->block_bytes,
                  "moves: bytes per block (default: --model's layout, else bench-110m's: 576K)");
  cmd->add_option("--blocks", f->blocks, "moves: blocks per direction and run")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--kv-block-size", f->kv_block_size, "tokens per KV block")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--disk-path", f->disk_path, "directory for the disk figures (default: a new one under /tmp)");
  cmd->add_option("--disk-sizes", f->disk_sizes, "disk: block sizes, comma-separated, multiples of 4K")
      ->capture_default_str();
  cmd->add_option("--disk-total-bytes", f->disk_total_bytes, "disk: bytes written and read per size and run")
      ->capture_default_str();
  cmd->add_option("--queue-depth", f->queue_depth, "disk: I/Os in flight (store and raw alike)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--prompt-tokens", f->prompt_tokens, "ttft: prompt length")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--cached-tokens", f->cached_tokens, "ttft: leading prompt tokens cached (whole blocks)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--iterations", f->iterations, "timed runs per figure (median)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--threads", f->threads, "ttft: compute threads (0 = all hardware threads)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "print one JSON object");
  cmd->callback([f, exit_code] { *exit_code = RunKvBench(*f); });
}

}  // namespace strata::cli
