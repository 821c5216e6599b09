#pragma once
// `strata bench kvcache` (issue 4, "Tiered KV cache"): each figure of the
// tiered KV cache next to the machine's limit measured in the same process,
// as a ratio (docs/PERFORMANCE.md, section "Tiered KV cache (issue 4)"):
//
//   moves: N blocks device→host (Commit → write-through to the HostStore) and
//          host→device (a prefix hit → loads) through the real KvManager,
//          lookups, hashing and bookkeeping included, ÷ plain memcpy of the
//          same blocks (block by block, one thread, as the manager copies).
//   disk:  DiskStore write and read bandwidth (checksums, bounce buffers,
//          RocksDB index included) per block size ÷ raw sequential O_DIRECT
//          io_uring writes/reads of a plain file in the same directory, same
//          request size, queue depth and total bytes.
//   ttft:  time to first token of a prompt whose leading `cached_tokens` are
//          cached on the device, in host DRAM or on disk ÷ the same prompt
//          with no cache (plain Generate on a second engine).
//
// Every figure is the median of `iterations` timed runs; the parts
// interleave their runs (limit, then figure) so that a noisy machine skews
// both alike.
//
// Thread-safety: the functions hold no state; each drives what it is given
// from the caller's thread.

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "kvcache/kv_manager.h"
#include "model/forward.h"
#include "model/tokenizer/tokenizer.h"

namespace strata::bench {

// --- moves ---------------------------------------------------------------
struct KvMoveOptions {
  uint64_t block_bytes = 0;  // REQUIRES: > 0
  int block_size = 16;       // tokens per block (hashing only)
  int blocks = 256;          // blocks moved per direction and run
  int iterations = 5;
};

struct KvMoveResult {
  uint64_t block_bytes = 0;
  int blocks = 0;
  uint64_t bytes = 0;  // per direction and run
  int iterations = 0;
  double memcpy_gbs = 0;  // 1e9 bytes/s
  double device_to_host_gbs = 0;
  double host_to_device_gbs = 0;
  double device_to_host_ratio = 0;  // ÷ memcpy_gbs
  double host_to_device_ratio = 0;
};

// A KvManager over a plain buffer of blocks + 1 "device" blocks and a
// HostStore of `blocks` slots (pinning off: there is no device here).
// Fails if a run moves fewer blocks than asked (the figure would be a miss).
Result<KvMoveResult> MeasureTierMoves(const KvMoveOptions& options);

// --- disk ----------------------------------------------------------------
struct DiskBenchOptions {
  std::string directory;               // exists; files are made and removed in it
  std::vector<uint64_t> block_sizes;   // each a multiple of 4096
  uint64_t total_bytes = 256ull << 20;  // per size and run (rounded down to blocks)
  unsigned queue_depth = 32;
  int iterations = 3;
};

struct DiskSizeResult {
  uint64_t block_bytes = 0;
  int blocks = 0;
  double raw_write_gbs = 0, raw_read_gbs = 0;
  double store_write_gbs = 0, store_read_gbs = 0;
  double write_ratio = 0, read_ratio = 0;  // store ÷ raw
};

// Per size: one untimed pass of both (slab files and the raw file get their
// extents), then `iterations` timed rounds of raw write, store write (after
// a Flush, so every block is written again), raw read, store read. Reads are
// checked against what was written (untimed). Files are removed at the end.
Result<std::vector<DiskSizeResult>> MeasureDisk(const DiskBenchOptions& options);

// --- ttft ----------------------------------------------------------------
struct TtftOptions {
  int prompt_tokens = 2048;
  int cached_tokens = 1792;  // REQUIRES: multiple of the block size, < prompt_tokens
  int iterations = 3;
  uint64_t seed = 1;
};

struct TtftSetup {
  ForwardPass* cached_engine = nullptr;   // the engine whose blocks `kv` manages
  kvcache::KvManager* kv = nullptr;        // lower tiers named "host" and "disk"
  ForwardPass* plain_engine = nullptr;    // cache off: Generate on blocks [0, n)
  const Tokenizer* tokenizer = nullptr;
};

struct TtftTier {
  std::string tier;  // "device" | "host" | "disk"
  double ttft_s = 0;  // median
  double ratio = 0;   // ÷ cache_off_s
  int32_t hit_tokens = 0;
  std::vector<double> samples_s;
};

struct TtftResult {
  int prompt_tokens = 0;
  int cached_tokens = 0;
  int iterations = 0;
  double cache_off_s = 0;  // median
  std::vector<double> cache_off_samples_s;
  std::vector<TtftTier> tiers;  // device, then each lower tier the manager has
};

// Seeds the cache with the prefix, then per round: cache off, device hit,
// host hit (device flushed), disk hit (device and host flushed). Each
// measured prompt is the shared prefix plus a fresh suffix, so exactly
// `cached_tokens` hit. Fails (Internal) when a tier's run did not hit the
// whole prefix from that tier, or its hit counter did not rise.
Result<TtftResult> MeasureTtft(const TtftSetup& setup, const TtftOptions& options);

// --- report --------------------------------------------------------------
struct KvBenchReport {
  bool has_moves = false, has_disk = false, has_ttft = false;
  KvMoveResult moves;
  std::string disk_directory;
  unsigned disk_queue_depth = 0;
  uint64_t disk_total_bytes = 0;
  std::vector<DiskSizeResult> disk;
  std::string model;  // ttft
  TtftResult ttft;
};

// One JSON object (schema in docs/PERFORMANCE.md).
std::string KvReportJson(const KvBenchReport& r);
// A table: figure, measured, limit, ratio, the goal.
std::string KvReportTable(const KvBenchReport& r);

}  // namespace strata::bench
