#include "model/backend/cpu/cpu_backend.h"

#include <cstring>
#include <new>
#include <string>

#include "model/forward.h"

namespace strata {

namespace {
constexpr std::align_val_t kPoolAlign{4096};
}  // namespace

void CpuBackend::FreeAligned::operator()(uint8_t* p) const { ::operator delete[](p, kPoolAlign); }

CpuBackend::CpuBackend(ThreadPool* threads) : threads_(threads), copy_(&segments_) {}

CpuBackend::~CpuBackend() {
  for (SegmentId id : pool_segments_) (void)segments_.Unregister(id);
}

Result<KvPool> CpuBackend::AllocateKvPool(const KvLayout& layout, int num_blocks) {
  if (num_blocks < 1) return Status::InvalidArgument("KV pool needs at least one block");
  if (layout.block_bytes() == 0) return Status::InvalidArgument("KV pool: the layout has empty blocks");
  KvPool pool;
  pool.kind = SegmentKind::kHost;
  pool.layout = layout;
  pool.num_blocks = num_blocks;
  const uint64_t bytes = pool.bytes();
  std::unique_ptr<uint8_t[], FreeAligned> mem(new (kPoolAlign, std::nothrow) uint8_t[bytes]);
  if (!mem)
    return Status::ResourceExhausted("cannot allocate " + std::to_string(bytes) + " bytes for " +
                                     std::to_string(num_blocks) + " KV blocks");
  std::memset(mem.get(), 0, bytes);
  pool.base = mem.get();
  STRATA_ASSIGN_OR_RETURN(pool.segment, segments_.Register(SegmentKind::kHost, pool.base, bytes, "device KV pool"));
  pools_.push_back(std::move(mem));
  pool_segments_.push_back(pool.segment);
  return pool;
}

Result<std::unique_ptr<ForwardPass>> CpuBackend::CreateForward(const ModelWeights& weights, const KvPool& pool) {
  const auto seg = segments_.Get(pool.segment);
  if (!seg || seg->base != pool.base || seg->size < pool.bytes())
    return Status::InvalidArgument("KV pool was not allocated by this backend");
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<ForwardEngine> e, ForwardEngine::Create(weights, pool, threads_, &copy_));
  return std::unique_ptr<ForwardPass>(std::move(e));
}

}  // namespace strata
