#pragma once
// Backend: what the engine needs from the hardware a model runs on, so that
// a CUDA backend can stand next to the CPU one without touching kvcache/ or
// scheduler/:
//
//   segments()        the SegmentTable naming the backend's memory; the KV
//                     manager attaches its tiers and registers its staging
//                     buffers in the same table, so one copy engine and, later,
//                     the transfer engine can name any of it by region.
//   copy_engine()     moves bytes between the backend's memory and host
//                     memory registered in segments() (CPU: memcpy; CUDA: a
//                     copy stream). A copy submitted after a forward pass
//                     returned must see that pass's writes to the pool (a
//                     CUDA backend orders its copy stream after the compute
//                     stream, e.g. by an event recorded after each forward).
//   AllocateKvPool    the device KV pool: num_blocks blocks of the block-major
//                     layout (kv_layout.h), one registered segment, owned by
//                     the backend. The same pool is handed to the forward pass
//                     (CreateForward) and to the KV manager (as a
//                     kvcache::DeviceKv: segments(), pool.segment,
//                     copy_engine()).
//   CreateForward     a ForwardPass: runs the model over block tables into
//                     the pool. Before reading the pool it waits on the fence
//                     of every copy submitted to copy_engine() so far, so a
//                     block loaded through the copy engine is never read
//                     before it landed.
//
// Ownership: the backend owns the pool memory, the table and the copy
// engine; everything created from it (pools, forward passes, a KV manager
// using them) must be destroyed before it.
//
// Thread-safety: one thread (the engine loop) uses a backend, its copy
// engine and its forward passes; segments() may be read from any thread.

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "common/copy_engine.h"
#include "common/memory_segment.h"
#include "common/status.h"
#include "model/backend/kv_layout.h"

namespace strata {

struct ModelWeights;  // model/weights.h

// One sequence of a forward batch (ForwardPass::Forward).
struct ForwardSeq {
  std::span<const int32_t> tokens;       // >= 1 token ids (prompt chunk or decode token)
  int32_t start_pos = 0;                 // position of tokens[0]
  std::span<const int32_t> block_table;  // block ids for positions [0, start_pos + tokens.size())
  bool all_logits = false;               // logits for every token, not only the last
};

// A device KV pool: `num_blocks` blocks of layout.block_bytes() from offset
// 0 of `segment` (of the backend's segments()); `base` is its first byte, a
// device pointer when the kind is not host-addressable.
struct KvPool {
  SegmentId segment;
  SegmentKind kind = SegmentKind::kHost;
  uint8_t* base = nullptr;
  KvLayout layout;
  int num_blocks = 0;
  uint64_t bytes() const { return static_cast<uint64_t>(num_blocks) * layout.block_bytes(); }
};

// A model loaded on a backend, running over one KV pool.
class ForwardPass {
 public:
  virtual ~ForwardPass() = default;
  // REQUIRES: each sequence's block table covers start_pos + tokens.size()
  // positions with valid block ids, start_pos + tokens.size() <= context
  // length, and token ids are < vocab size (all checked; a violation returns
  // InvalidArgument and writes nothing). On success `logits` holds, for each
  // sequence in order, one row (or tokens.size() rows with all_logits) of
  // vocab_size floats.
  virtual Status Forward(std::span<const ForwardSeq> batch, std::vector<float>* logits) = 0;
  virtual const KvLayout& kv_layout() const = 0;
  virtual int num_blocks() const = 0;
  virtual int vocab_size() const = 0;
  virtual int context_length() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual SegmentTable& segments() = 0;
  virtual CopyEngine& copy_engine() = 0;
  // InvalidArgument: num_blocks < 1 or an empty layout; ResourceExhausted:
  // the memory cannot be had. The pool lives until the backend is destroyed.
  virtual Result<KvPool> AllocateKvPool(const KvLayout& layout, int num_blocks) = 0;
  // REQUIRES: `pool` came from this backend's AllocateKvPool and its layout
  // matches the weights' (InvalidArgument otherwise); `weights` outlive the
  // forward pass.
  virtual Result<std::unique_ptr<ForwardPass>> CreateForward(const ModelWeights& weights, const KvPool& pool) = 0;
};

}  // namespace strata
