#include "bench/kv_bench.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <thread>

#include "common/logging.h"
#include "common/sha256.h"
#include "kvcache/block_hash.h"
#include "kvcache/clock.h"
#include "kvcache/disk_io.h"
#include "kvcache/disk_store.h"
#include "kvcache/host_store.h"
#include "kvcache/tier_registry.h"
#include "model/generate.h"
#include "scheduler/cached_generate.h"

namespace strata::bench {

namespace {

using WallClock = std::chrono::steady_clock;

double SecondsSince(WallClock::time_point t0) {
  return std::chrono::duration<double>(WallClock::now() - t0).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
}

double Gbs(uint64_t bytes, double seconds) { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }

// Keeps a copy's destination observable so the compiler cannot drop it.
volatile uint8_t g_sink = 0;

Sha256Digest BenchNamespace() {
  static const char kName[] = "strata bench kvcache";
  return Sha256Of(kName, sizeof kName - 1);
}

// --- moves ---------------------------------------------------------------

Status ValidateMoves(const KvMoveOptions& o) {
  if (o.block_bytes == 0) return Status::InvalidArgument("--block-bytes must be > 0");
  if (o.blocks < 1) return Status::InvalidArgument("--blocks must be >= 1");
  if (o.block_size < 1) return Status::InvalidArgument("--kv-block-size must be >= 1");
  if (o.iterations < 1) return Status::InvalidArgument("--iterations must be >= 1");
  return Status::Ok();
}

}  // namespace

Result<KvMoveResult> MeasureTierMoves(const KvMoveOptions& o) {
  STRATA_RETURN_IF_ERROR(ValidateMoves(o));
  const uint64_t bb = o.block_bytes;
  const uint64_t n = static_cast<uint64_t>(o.blocks);
  const uint64_t bytes = n * bb;
  const uint64_t device_blocks = n + 1;
  // Page-aligned like the engine's KV pool and the host arena, so neither
  // side of a copy pays for a misaligned destination.
  struct FreeAligned {
    void operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t{4096}); }
  };
  auto alloc = [](uint64_t n) {
    return std::unique_ptr<uint8_t[], FreeAligned>(new (std::align_val_t{4096}, std::nothrow) uint8_t[n]);
  };
  auto device = alloc(device_blocks * bb);
  auto copy_dst = alloc(bytes);
  if (!device || !copy_dst)
    return Status::ResourceExhausted("bench kvcache: cannot allocate 2 x " + std::to_string(bytes) + " bytes");
  for (uint64_t i = 0; i < device_blocks * bb; ++i) device[i] = static_cast<uint8_t>(i * 131 + (i >> 12));
  std::memset(copy_dst.get(), 0, bytes);

  kvcache::TierSpec host;
  host.kind = kvcache::TierKind::kHost;
  host.name = "host";
  host.bytes = bytes;
  host.pin = false;  // device memory here is plain memory
  host.source = "bench kvcache";
  STRATA_ASSIGN_OR_RETURN(kvcache::OpenedTiers tiers, kvcache::OpenTiers(std::span(&host, 1), bb));
  kvcache::KvManagerOptions mo;
  mo.block_size = o.block_size;
  mo.num_device_blocks = static_cast<int32_t>(device_blocks);
  mo.block_bytes = bb;
  mo.ns = BenchNamespace();
  mo.load_policy = kvcache::LoadPolicy::kAlways;
  auto mem = [p = device.get(), bb](BlockId id) { return p + static_cast<size_t>(id.value()) * bb; };
  STRATA_ASSIGN_OR_RETURN(auto kv, kvcache::KvManager::Create(mo, mem, std::move(tiers.lowers), kvcache::RealClock()));

  std::vector<int32_t> prompt(n * static_cast<uint64_t>(o.block_size) + 1);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(1 + (i * 7919) % 30000);
  const int32_t tokens = static_cast<int32_t>(prompt.size());
  uint64_t next_id = 1;

  std::vector<double> copy_s, down_s, up_s;
  for (int it = 0; it <= o.iterations; ++it) {  // run 0 is a warm-up (faults the arena in)
    STRATA_ASSIGN_OR_RETURN(auto flushed, kv->Flush(true, {true}));
    (void)flushed;

    auto t0 = WallClock::now();
    for (uint64_t b = 0; b < n; ++b) std::memcpy(copy_dst.get() + b * bb, device.get() + b * bb, bb);
    const double copy = SecondsSince(t0);
    g_sink = copy_dst[bytes - 1];

    // device → host: the prompt's blocks are committed and written through.
    const uint64_t down_before = kv->stats().tiers[0].bytes_down;
    const RequestId down_id(next_id++);
    t0 = WallClock::now();
    STRATA_RETURN_IF_ERROR(kv->AddRequest(down_id, prompt, ""));
    STRATA_ASSIGN_OR_RETURN(auto got, kv->Allocate(down_id, tokens));
    if (got != kvcache::AllocOutcome::kAllocated) return Status::Internal("bench kvcache: device pool refused blocks");
    STRATA_RETURN_IF_ERROR(kv->Commit(down_id, prompt));
    kv->Poll();
    kv->Free(down_id);
    const double down = SecondsSince(t0);
    const uint64_t moved_down = kv->stats().tiers[0].bytes_down - down_before;
    if (moved_down != bytes)
      return Status::Internal("bench kvcache: device->host moved " + std::to_string(moved_down) + " bytes, expected " +
                              std::to_string(bytes));

    // host → device: the device forgets, the same prompt hits the host.
    STRATA_ASSIGN_OR_RETURN(flushed, kv->Flush(true, {}));
    const uint64_t hits_before = kv->stats().tiers[0].hits.blocks;
    const RequestId up_id(next_id++);
    t0 = WallClock::now();
    STRATA_RETURN_IF_ERROR(kv->AddRequest(up_id, prompt, ""));
    STRATA_ASSIGN_OR_RETURN(got, kv->Allocate(up_id, tokens));
    if (got != kvcache::AllocOutcome::kAllocated) return Status::Internal("bench kvcache: device pool refused blocks");
    while (!kv->IsReady(up_id)) kv->Poll();
    const int32_t cached = kv->CachedTokens(up_id);
    kv->Free(up_id);
    const double up = SecondsSince(t0);
    const uint64_t hits = kv->stats().tiers[0].hits.blocks - hits_before;
    if (hits != n || cached != static_cast<int32_t>(n) * o.block_size)
      return Status::Internal("bench kvcache: host->device loaded " + std::to_string(hits) + " blocks (" +
                              std::to_string(cached) + " tokens), expected " + std::to_string(n));
    if (it == 0) continue;
    copy_s.push_back(copy);
    down_s.push_back(down);
    up_s.push_back(up);
  }
  KvMoveResult r;
  r.block_bytes = bb;
  r.blocks = o.blocks;
  r.bytes = bytes;
  r.iterations = o.iterations;
  r.memcpy_gbs = Gbs(bytes, Median(copy_s));
  r.device_to_host_gbs = Gbs(bytes, Median(down_s));
  r.host_to_device_gbs = Gbs(bytes, Median(up_s));
  r.device_to_host_ratio = r.device_to_host_gbs / r.memcpy_gbs;
  r.host_to_device_ratio = r.host_to_device_gbs / r.memcpy_gbs;
  return r;
}

// --- disk ----------------------------------------------------------------

namespace {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Removes the bench's files on every path out.
class RemoveOnExit {
 public:
  explicit RemoveOnExit(std::vector<std::string> paths) : paths_(std::move(paths)) {}
  ~RemoveOnExit() {
    for (const auto& p : paths_) {
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
    }
  }
  RemoveOnExit(const RemoveOnExit&) = delete;
  RemoveOnExit& operator=(const RemoveOnExit&) = delete;

 private:
  std::vector<std::string> paths_;
};

// Sequential O_DIRECT I/O of `n` requests of `bb` bytes over the file, at
// most `qd` in flight. Returns seconds.
Result<double> RawIo(kvcache::DiskRing& ring, int fd, bool write, const kvcache::AlignedBuffer& buf, uint64_t n,
                     uint64_t bb, unsigned qd, const std::string& path) {
  uint64_t next = 0, done = 0;
  unsigned in_flight = 0;
  const auto t0 = WallClock::now();
  while (done < n) {
    bool prepped = false;
    while (next < n && in_flight < qd) {
      std::span<uint8_t> s = buf.span().subspan(next * bb, bb);
      if (write) {
        ring.PrepWrite(fd, s, next * bb, -1, next);
      } else {
        ring.PrepRead(fd, s, next * bb, -1, next);
      }
      ++next;
      ++in_flight;
      prepped = true;
    }
    if (prepped) STRATA_RETURN_IF_ERROR(ring.Submit());
    kvcache::DiskCompletion c;
    STRATA_RETURN_IF_ERROR(ring.Wait(&c));
    do {
      if (c.res < 0) return Status::IoError(write ? "O_DIRECT write" : "O_DIRECT read", path, -c.res);
      if (static_cast<uint64_t>(c.res) != bb)
        return Status::IoError(write ? "short O_DIRECT write" : "short O_DIRECT read", path, EIO);
      --in_flight;
      ++done;
    } while (ring.Peek(&c));
  }
  return SecondsSince(t0);
}

Result<DiskSizeResult> MeasureDiskSize(const DiskBenchOptions& o, uint64_t bb) {
  const uint64_t n = o.total_bytes / bb;
  if (n == 0)
    return Status::InvalidArgument("--disk-total-bytes " + std::to_string(o.total_bytes) +
                                   " is smaller than one block of " + std::to_string(bb));
  const uint64_t bytes = n * bb;
  const std::string store_dir = o.directory + "/strata-kvbench-store-" + std::to_string(bb);
  const std::string raw_path = o.directory + "/strata-kvbench-raw-" + std::to_string(bb) + ".dat";
  RemoveOnExit cleanup({store_dir, raw_path});

  STRATA_ASSIGN_OR_RETURN(auto src, kvcache::AlignedBuffer::Allocate(bytes));
  STRATA_ASSIGN_OR_RETURN(auto dst, kvcache::AlignedBuffer::Allocate(bytes));
  for (uint64_t i = 0; i < bytes; ++i) src.data()[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  std::memset(dst.data(), 0, bytes);

  kvcache::DiskStoreOptions d;
  d.directory = store_dir;
  d.capacity_bytes = bytes;
  d.block_bytes = bb;
  d.queue_depth = o.queue_depth;
  d.grow_bytes = std::min<uint64_t>(d.grow_bytes, bytes);
  // The store reads and writes regions of registered memory; the table
  // outlives the store, which unregisters its own segments when destroyed.
  SegmentTable segments;
  STRATA_ASSIGN_OR_RETURN(auto store, kvcache::DiskStore::Open(d));
  if (store->slot_bytes() != bb) return Status::Internal("disk store slot size differs from the block size");

  Fd fd(::open(raw_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644));
  if (fd.get() < 0) return Status::IoError("open O_DIRECT", raw_path, errno);
  if (::fallocate(fd.get(), 0, 0, static_cast<off_t>(bytes)) != 0 && errno != EOPNOTSUPP)
    return Status::IoError("fallocate", raw_path, errno);
  STRATA_ASSIGN_OR_RETURN(auto ring, kvcache::DiskRing::Create(o.queue_depth));

  const Sha256Digest ns = BenchNamespace();
  std::vector<BlockHash> hashes(n);
  for (uint64_t i = 0; i < n; ++i) {
    std::memcpy(hashes[i].digest.data(), &i, sizeof i);
    std::memcpy(hashes[i].digest.data() + 8, &bb, sizeof bb);
    hashes[i].digest[31] = 0x5b;
  }
  STRATA_RETURN_IF_ERROR(store->Attach(&segments));
  STRATA_ASSIGN_OR_RETURN(const SegmentId src_seg, segments.Register(SegmentKind::kHost, src.data(), bytes, "bench src"));
  STRATA_ASSIGN_OR_RETURN(const SegmentId dst_seg, segments.Register(SegmentKind::kHost, dst.data(), bytes, "bench dst"));
  auto block = [bb](SegmentId seg, uint64_t i) { return Region{seg, i * bb, bb}; };
  std::vector<kvcache::StoreCompletion> done;
  auto check_done = [&](const char* what) -> Status {
    if (done.size() != n)
      return Status::Internal(std::string("disk store ") + what + ": " + std::to_string(done.size()) + " of " +
                              std::to_string(n) + " completions");
    for (const auto& c : done)
      if (!c.status.ok()) return c.status.WithContext(std::string("disk store ") + what);
    return Status::Ok();
  };
  auto store_write = [&]() -> Result<double> {
    STRATA_RETURN_IF_ERROR(store->Flush(nullptr));
    done.clear();
    store->Drain(&done);
    done.clear();
    const auto t0 = WallClock::now();
    for (uint64_t i = 0; i < n; ++i) STRATA_RETURN_IF_ERROR(store->SubmitWrite(hashes[i], ns, block(src_seg, i), i));
    store->Drain(&done);
    const double s = SecondsSince(t0);
    STRATA_RETURN_IF_ERROR(check_done("write"));
    return s;
  };
  auto check_read = [&](const char* what) -> Status {
    if (std::memcmp(src.data(), dst.data(), bytes) != 0)
      return Status::Internal(std::string(what) + " read back other bytes than were written");
    std::memset(dst.data(), 0, bytes);
    return Status::Ok();
  };
  auto store_read = [&]() -> Result<double> {
    done.clear();
    const auto t0 = WallClock::now();
    for (uint64_t i = 0; i < n; ++i) STRATA_RETURN_IF_ERROR(store->SubmitRead(hashes[i], block(dst_seg, i), i));
    store->Drain(&done);
    const double s = SecondsSince(t0);
    STRATA_RETURN_IF_ERROR(check_done("read"));
    STRATA_RETURN_IF_ERROR(check_read("disk store"));
    return s;
  };
  const unsigned qd = o.queue_depth;

  // Untimed: extents of the raw file and the slab files get written once.
  STRATA_RETURN_IF_ERROR(RawIo(*ring, fd.get(), true, src, n, bb, qd, raw_path).status());
  STRATA_RETURN_IF_ERROR(store_write().status());

  std::vector<double> rw, sw, rr, sr;
  for (int it = 0; it < o.iterations; ++it) {
    STRATA_ASSIGN_OR_RETURN(double a, RawIo(*ring, fd.get(), true, src, n, bb, qd, raw_path));
    STRATA_ASSIGN_OR_RETURN(double b, store_write());
    STRATA_ASSIGN_OR_RETURN(double c, RawIo(*ring, fd.get(), false, dst, n, bb, qd, raw_path));
    STRATA_RETURN_IF_ERROR(check_read("raw O_DIRECT"));
    STRATA_ASSIGN_OR_RETURN(double e, store_read());
    rw.push_back(a);
    sw.push_back(b);
    rr.push_back(c);
    sr.push_back(e);
  }
  DiskSizeResult r;
  r.block_bytes = bb;
  r.blocks = static_cast<int>(n);
  r.raw_write_gbs = Gbs(bytes, Median(rw));
  r.raw_read_gbs = Gbs(bytes, Median(rr));
  r.store_write_gbs = Gbs(bytes, Median(sw));
  r.store_read_gbs = Gbs(bytes, Median(sr));
  r.write_ratio = r.store_write_gbs / r.raw_write_gbs;
  r.read_ratio = r.store_read_gbs / r.raw_read_gbs;
  return r;
}

}  // namespace

Result<std::vector<DiskSizeResult>> MeasureDisk(const DiskBenchOptions& o) {
  std::error_code ec;
  if (!std::filesystem::is_directory(o.directory, ec))
    return Status::InvalidArgument("--disk-path '" + o.directory + "' is not a directory");
  if (o.block_sizes.empty()) return Status::InvalidArgument("--disk-sizes is empty");
  for (uint64_t bb : o.block_sizes)
    if (bb == 0 || bb % kvcache::kDiskAlign != 0)
      return Status::InvalidArgument("--disk-sizes: " + std::to_string(bb) + " is not a multiple of 4096");
  if (o.queue_depth < 1 || o.queue_depth > 4096) return Status::InvalidArgument("--queue-depth must be in 1..4096");
  if (o.iterations < 1) return Status::InvalidArgument("--iterations must be >= 1");
  std::vector<DiskSizeResult> out;
  for (uint64_t bb : o.block_sizes) {
    auto r = MeasureDiskSize(o, bb);
    if (!r) return r.error().WithContext("disk blocks of " + std::to_string(bb) + " bytes");
    out.push_back(*r);
  }
  return out;
}

// --- ttft ----------------------------------------------------------------

Result<TtftResult> MeasureTtft(const TtftSetup& s, const TtftOptions& o) {
  if (!s.cached_engine || !s.kv || !s.plain_engine || !s.tokenizer)
    return Status::InvalidArgument("bench kvcache: incomplete TTFT setup");
  kvcache::KvManager& kv = *s.kv;
  const int bs = kv.options().block_size;
  const int ctx = s.cached_engine->context_length();
  if (o.cached_tokens <= 0 || o.cached_tokens % bs != 0 || o.cached_tokens >= o.prompt_tokens)
    return Status::InvalidArgument("--cached-tokens " + std::to_string(o.cached_tokens) +
                                   " must be a positive multiple of the block size " + std::to_string(bs) +
                                   " below --prompt-tokens " + std::to_string(o.prompt_tokens));
  if (o.prompt_tokens + 1 > ctx)
    return Status::InvalidArgument("--prompt-tokens " + std::to_string(o.prompt_tokens) +
                                   " plus one generated token exceed the model's context of " + std::to_string(ctx));
  if (o.iterations < 1) return Status::InvalidArgument("--iterations must be >= 1");
  const int vocab = s.cached_engine->vocab_size();
  if (vocab < 2) return Status::InvalidArgument("the model's vocabulary is too small");

  int host_tier = -1, disk_tier = -1;  // index among the lower tiers
  for (size_t i = 0; i < kv.num_lower_tiers(); ++i) {
    const kvcache::TierKind kind = kv.lower_store(i).kind();
    if (kind == kvcache::TierKind::kHost && host_tier < 0) host_tier = static_cast<int>(i);
    if (kind == kvcache::TierKind::kDisk && disk_tier < 0) disk_tier = static_cast<int>(i);
  }

  std::mt19937_64 rng(o.seed);
  auto token = [&] { return static_cast<int32_t>(1 + rng() % static_cast<uint64_t>(vocab - 1)); };
  std::vector<int32_t> prefix(static_cast<size_t>(o.cached_tokens));
  for (auto& t : prefix) t = token();
  auto make_prompt = [&] {
    std::vector<int32_t> p = prefix;
    while (static_cast<int>(p.size()) < o.prompt_tokens) p.push_back(token());
    return p;
  };

  GenerateOptions go;
  go.max_tokens = 1;
  go.ignore_eos = true;
  go.sampling.temperature = 0;
  go.sampling.seed = 1;
  uint64_t next_id = 1;
  auto cached_run = [&](std::span<const int32_t> prompt) -> Result<scheduler::CachedGenerateOutput> {
    scheduler::CachedGenerateOptions co;
    co.request_id = RequestId(next_id++);
    return scheduler::CachedGenerate(*s.cached_engine, kv, *s.tokenizer, prompt, go, co);
  };

  // The prefix (and one token, so that all its blocks may hit) goes into
  // every tier by write-through.
  {
    std::vector<int32_t> seed_prompt = prefix;
    seed_prompt.push_back(token());
    auto r = cached_run(seed_prompt);
    if (!r) return r.error().WithContext("seeding the cache");
  }

  const int32_t want = o.cached_tokens;
  const uint64_t want_blocks = static_cast<uint64_t>(want / bs);
  // Polls the manager until done() or 60 s have passed (false then).
  auto poll_until = [&](auto done) {
    const auto t0 = WallClock::now();
    while (!done()) {
      if (SecondsSince(t0) > 60) return false;
      if (kv.Poll() == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return true;
  };
  // Waits until the tier would serve the whole prefix.
  auto wait_for = [&](int tier, std::span<const int32_t> prompt) -> Status {
    kvcache::PrefixMatch m;
    int32_t got = 0;
    const bool served = poll_until([&] {
      m = kv.Match(prompt, "");
      got = tier == kvcache::kDeviceTier ? m.device_tokens : m.lower_tier_tokens[static_cast<size_t>(tier - 1)];
      return got == want;
    });
    if (!served) {
      std::string held;
      for (size_t i = 0; i < kv.num_lower_tiers(); ++i)
        held += ", " + std::string(kv.lower_store(i).name()) + " " + std::to_string(m.lower_tier_tokens[i]) +
                " (store has " + std::to_string(kv.lower_store(i).stats().blocks) + " blocks)";
      return Status::Internal("the " + std::string(kv.tier_name(tier)) + " tier would serve " + std::to_string(got) +
                              " of the " + std::to_string(want) + " prefix tokens, so the figure would be a miss " +
                              "(device " + std::to_string(m.device_tokens) + held + ")");
    }
    return Status::Ok();
  };
  auto tier_hits = [&](int tier) -> uint64_t {
    const kvcache::KvManagerStats st = kv.stats();
    return tier == kvcache::kDeviceTier ? st.device.blocks : st.tiers[static_cast<size_t>(tier - 1)].hits.blocks;
  };
  // One timed request served with the prefix from `tier`; checks it hit there.
  auto timed = [&](int tier) -> Result<double> {
    const std::vector<int32_t> prompt = make_prompt();
    STRATA_RETURN_IF_ERROR(wait_for(tier, prompt));
    const uint64_t hits_before = tier_hits(tier);
    const auto t0 = WallClock::now();
    auto r = cached_run(prompt);
    const double sec = SecondsSince(t0);
    const std::string name(kv.tier_name(tier));
    if (!r) return r.error().WithContext("TTFT with the prefix on " + name);
    const uint64_t rose = tier_hits(tier) - hits_before;
    if (r->cached_tokens != want || r->tier_hit_tokens[static_cast<size_t>(tier)] != want || rose < want_blocks) {
      const std::string msg = "TTFT from " + name + ": " + std::to_string(r->tier_hit_tokens[static_cast<size_t>(tier)]) +
                              " of " + std::to_string(want) + " prefix tokens came from " + name + " (" +
                              std::to_string(r->cached_tokens) + " cached in all), its hit counter rose by " +
                              std::to_string(rose) + " blocks; the figure would not measure a " + name + " hit";
      STRATA_LOG_ERROR("{}", msg);
      return Status::Internal(msg);
    }
    return sec;
  };

  std::vector<int> tiers{kvcache::kDeviceTier};
  if (host_tier >= 0) tiers.push_back(host_tier + 1);
  if (disk_tier >= 0) tiers.push_back(disk_tier + 1);
  std::vector<std::vector<double>> samples(tiers.size());
  std::vector<double> off;
  for (int it = 0; it < o.iterations; ++it) {
    {
      const std::vector<int32_t> prompt = make_prompt();
      const auto t0 = WallClock::now();
      auto r = Generate(*s.plain_engine, *s.tokenizer, prompt, go);
      const double sec = SecondsSince(t0);
      if (!r) return r.error().WithContext("TTFT with the cache off");
      off.push_back(sec);
    }
    for (size_t k = 0; k < tiers.size(); ++k) {
      const int tier = tiers[k];
      if (tier != kvcache::kDeviceTier) {
        // Write-backs of the last request must land first: a device block
        // stays referenced (and Flush leaves it) while one reads it.
        if (!poll_until([&] { return kv.ops_in_flight() == 0; }))
          return Status::Internal(std::to_string(kv.ops_in_flight()) +
                                  " lower-tier operations still in flight after 60 s; cannot flush the tiers above " +
                                  std::string(kv.tier_name(tier)));
        // Device flushed; for disk also every lower tier above it.
        std::vector<bool> lower(kv.num_lower_tiers(), false);
        for (int i = 0; i < tier - 1; ++i) lower[static_cast<size_t>(i)] = true;
        STRATA_ASSIGN_OR_RETURN(auto flushed, kv.Flush(true, lower));
        (void)flushed;
      }
      STRATA_ASSIGN_OR_RETURN(double sec, timed(tier));
      samples[k].push_back(sec);
    }
  }

  TtftResult out;
  out.prompt_tokens = o.prompt_tokens;
  out.cached_tokens = o.cached_tokens;
  out.iterations = o.iterations;
  out.cache_off_samples_s = off;
  out.cache_off_s = Median(off);
  for (size_t k = 0; k < tiers.size(); ++k) {
    TtftTier t;
    t.tier = std::string(kv.tier_name(tiers[k]));
    t.samples_s = samples[k];
    t.ttft_s = Median(samples[k]);
    t.ratio = t.ttft_s / out.cache_off_s;
    t.hit_tokens = want;
    out.tiers.push_back(std::move(t));
  }
  return out;
}

// --- report --------------------------------------------------------------

std::string KvReportJson(const KvBenchReport& r) {
  nlohmann::json j = nlohmann::json::object();
  if (r.has_moves) {
    const KvMoveResult& m = r.moves;
    j["moves"] = {{"block_bytes", m.block_bytes},
                  {"blocks", m.blocks},
                  {"bytes", m.bytes},
                  {"iterations", m.iterations},
                  {"memcpy_gbs", m.memcpy_gbs},
                  {"device_to_host_gbs", m.device_to_host_gbs},
                  {"host_to_device_gbs", m.host_to_device_gbs},
                  {"device_to_host_ratio", m.device_to_host_ratio},
                  {"host_to_device_ratio", m.host_to_device_ratio}};
  }
  if (r.has_disk) {
    nlohmann::json sizes = nlohmann::json::array();
    for (const auto& d : r.disk)
      sizes.push_back({{"block_bytes", d.block_bytes},
                       {"blocks", d.blocks},
                       {"raw_write_gbs", d.raw_write_gbs},
                       {"raw_read_gbs", d.raw_read_gbs},
                       {"store_write_gbs", d.store_write_gbs},
                       {"store_read_gbs", d.store_read_gbs},
                       {"write_ratio", d.write_ratio},
                       {"read_ratio", d.read_ratio}});
    j["disk"] = {{"directory", r.disk_directory},
                 {"queue_depth", r.disk_queue_depth},
                 {"total_bytes", r.disk_total_bytes},
                 {"sizes", sizes}};
  }
  if (r.has_ttft) {
    const TtftResult& t = r.ttft;
    nlohmann::json tiers = nlohmann::json::array();
    for (const auto& x : t.tiers)
      tiers.push_back({{"tier", x.tier},
                       {"ttft_s", x.ttft_s},
                       {"ratio", x.ratio},
                       {"hit_tokens", x.hit_tokens},
                       {"samples_s", x.samples_s}});
    j["ttft"] = {{"model", r.model},
                 {"prompt_tokens", t.prompt_tokens},
                 {"cached_tokens", t.cached_tokens},
                 {"iterations", t.iterations},
                 {"cache_off_s", t.cache_off_s},
                 {"cache_off_samples_s", t.cache_off_samples_s},
                 {"tiers", tiers}};
  }
  return j.dump();
}

std::string KvReportTable(const KvBenchReport& r) {
  std::string out;
  char line[256];
  auto row = [&](const std::string& figure, const std::string& measured, const std::string& limit, double ratio,
                 const char* goal) {
    std::snprintf(line, sizeof line, "%-34s %14s %14s %7.3f  %s\n", figure.c_str(), measured.c_str(), limit.c_str(),
                  ratio, goal);
    out += line;
  };
  auto gbs = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.2f GB/s", v);
    return std::string(b);
  };
  auto ms = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f ms", v * 1e3);
    return std::string(b);
  };
  std::snprintf(line, sizeof line, "%-34s %14s %14s %7s  %s\n", "figure", "measured", "limit", "ratio", "goal");
  out += line;
  if (r.has_moves) {
    const KvMoveResult& m = r.moves;
    std::snprintf(line, sizeof line, "tier moves: %d blocks of %llu bytes, limit = memcpy\n", m.blocks,
                  static_cast<unsigned long long>(m.block_bytes));
    out += line;
    row("  device -> host (write-through)", gbs(m.device_to_host_gbs), gbs(m.memcpy_gbs), m.device_to_host_ratio,
        ">= 0.8");
    row("  host -> device (prefix hit)", gbs(m.host_to_device_gbs), gbs(m.memcpy_gbs), m.host_to_device_ratio,
        ">= 0.8");
  }
  if (r.has_disk) {
    std::snprintf(line, sizeof line, "disk tier: %s, queue depth %u, limit = raw O_DIRECT io_uring\n",
                  r.disk_directory.c_str(), r.disk_queue_depth);
    out += line;
    for (const auto& d : r.disk) {
      const bool goal = d.block_bytes >= (256u << 10);
      const std::string size = std::to_string(d.block_bytes / 1024) + " KiB";
      row("  write, blocks of " + size, gbs(d.store_write_gbs), gbs(d.raw_write_gbs), d.write_ratio,
          goal ? ">= 0.8" : "-");
      row("  read, blocks of " + size, gbs(d.store_read_gbs), gbs(d.raw_read_gbs), d.read_ratio,
          goal ? ">= 0.8" : "-");
    }
  }
  if (r.has_ttft) {
    const TtftResult& t = r.ttft;
    std::snprintf(line, sizeof line, "TTFT: %s, %d-token prompt, first %d cached, limit = cache off (%s)\n",
                  r.model.c_str(), t.prompt_tokens, t.cached_tokens, ms(t.cache_off_s).c_str());
    out += line;
    for (const auto& x : t.tiers)
      row("  prefix from " + x.tier, ms(x.ttft_s), ms(t.cache_off_s), x.ratio, x.tier == "host" ? "<= 0.2" : "-");
  }
  return out;
}

}  // namespace strata::bench
