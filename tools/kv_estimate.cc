#include "tools/kv_estimate.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "common/logging.h"

namespace strata::cli {

namespace {

using SteadyClock = std::chrono::steady_clock;

double SecondsSince(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

struct FreeAligned {
  void operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t{4096}); }
};
using AlignedBuf = std::unique_ptr<uint8_t[], FreeAligned>;

AlignedBuf Alloc(uint64_t n) { return AlignedBuf(new (std::align_val_t{4096}, std::nothrow) uint8_t[n]); }

}  // namespace

double MeasureRecomputeRate(ForwardPass& engine, int tokens) {
  const int bs = engine.kv_layout().block_size;
  const int max_tokens = std::min<int64_t>(static_cast<int64_t>(engine.num_blocks()) * bs,
                                           engine.context_length());
  const int n = std::clamp(std::min(tokens, max_tokens), 1, 64);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = (i * 7 + 1) % engine.vocab_size();
  std::vector<int32_t> table(static_cast<size_t>((n + bs - 1) / bs));
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  ForwardSeq seq;
  seq.tokens = ids;
  seq.block_table = table;
  std::vector<float> logits;
  // The first pass pays one-off costs (first touch of activations, the
  // GEMM library's code generation for this shape): the best of the next two
  // is the figure.
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = SteadyClock::now();
    if (Status s = engine.Forward(std::span<const ForwardSeq>(&seq, 1), &logits); !s.ok()) {
      STRATA_LOG_WARN("kv load estimate: recompute measurement failed: {}", s.ToString());
      return 0;
    }
    const double sec = SecondsSince(t0);
    if (pass > 0 && sec > 0) best = std::max(best, n / sec);
  }
  return best;
}

double MeasureMemcpyRate(uint64_t bytes) {
  bytes = std::max<uint64_t>(bytes, 4096);
  AlignedBuf a = Alloc(bytes), b = Alloc(bytes);
  if (!a || !b) return 0;
  std::memset(a.get(), 1, bytes);
  std::memset(b.get(), 2, bytes);
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = SteadyClock::now();
    std::memcpy(b.get(), a.get(), bytes);
    const double sec = SecondsSince(t0);
    if (sec > 0) best = std::max(best, static_cast<double>(bytes) / sec);
    a[i] = b[bytes - 1 - static_cast<uint64_t>(i)];  // keep the copy observable
  }
  return best;
}

Result<double> MeasureDirectReadRate(const std::string& directory, uint64_t block_bytes, int blocks) {
  if (block_bytes == 0 || block_bytes % 4096 != 0)
    return Status::InvalidArgument("block size " + std::to_string(block_bytes) + " is not a multiple of 4096");
  blocks = std::max(blocks, 1);
  const uint64_t total = block_bytes * static_cast<uint64_t>(blocks);
  AlignedBuf buf = Alloc(total);
  if (!buf) return Status::ResourceExhausted("cannot allocate " + std::to_string(total) + " bytes");
  std::memset(buf.get(), 0x5a, total);
  std::string path = directory + "/.strata-load-estimate-XXXXXX";
  std::vector<char> tmpl(path.begin(), path.end());
  tmpl.push_back('\0');
  const int fd0 = ::mkstemp(tmpl.data());
  if (fd0 < 0) return Status::IoError("cannot create a file in", directory, errno);
  path.assign(tmpl.data());
  ::close(fd0);
  struct Unlink {
    std::string p;
    ~Unlink() { ::unlink(p.c_str()); }
  } unlink_guard{path};
  const int fd = ::open(path.c_str(), O_RDWR | O_DIRECT);
  if (fd < 0) return Status::IoError("O_DIRECT open of", path, errno);
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_guard{fd};
  for (int i = 0; i < blocks; ++i) {
    const ssize_t w = ::pwrite(fd, buf.get() + static_cast<uint64_t>(i) * block_bytes, block_bytes,
                               static_cast<off_t>(static_cast<uint64_t>(i) * block_bytes));
    if (w != static_cast<ssize_t>(block_bytes))
      return Status::IoError("O_DIRECT write to", path, w < 0 ? errno : EIO);
  }
  if (::fdatasync(fd) != 0) return Status::IoError("fdatasync", path, errno);
  const auto t0 = SteadyClock::now();
  for (int i = 0; i < blocks; ++i) {
    const ssize_t r = ::pread(fd, buf.get() + static_cast<uint64_t>(i) * block_bytes, block_bytes,
                              static_cast<off_t>(static_cast<uint64_t>(i) * block_bytes));
    if (r != static_cast<ssize_t>(block_bytes))
      return Status::IoError("O_DIRECT read of", path, r < 0 ? errno : EIO);
  }
  const double sec = SecondsSince(t0);
  return sec > 0 ? static_cast<double>(total) / sec : 0.0;
}

}  // namespace strata::cli
