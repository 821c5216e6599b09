#pragma once
// The forward pass over a batch of sequences whose KV lives in fixed-size
// blocks (block-major layout, model/backend/kv_layout.h).
//
// One Forward() call processes several sequences at once; each contributes a
// chunk of its prompt (prefill) or one token (decode). For every token the
// model's K and V are written into the sequence's blocks at its position, and
// attention reads positions [0, pos] back through the block table. A sequence
// whose first `start_pos` positions are already in its blocks (an earlier
// chunk, or a shared prefix) continues from there.
//
// It is the CPU backend's ForwardPass (model/backend/backend.h); the KV
// pool is either the backend's (Create with a KvPool) or, for tests and
// tools that need no backend, its own (Create with KvOptions).
//
// Thread-safety: a ForwardEngine is used by one thread at a time (the engine
// loop); it parallelises internally over its ThreadPool.

#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <vector>

#include "common/aligned_vector.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "model/backend/backend.h"
#include "model/backend/kv_layout.h"
#include "model/weights.h"

namespace strata {

struct KvOptions {
  int block_size = 16;
  DType dtype = DType::kF16;  // f32 | f16 | bf16
  int num_blocks = 0;         // size of the KV pool
};

class ForwardEngine final : public ForwardPass {
 public:
  // `weights` must outlive the engine. Allocates a KV pool of its own.
  static Result<std::unique_ptr<ForwardEngine>> Create(const ModelWeights& weights, const KvOptions& kv,
                                                       ThreadPool* pool);
  // Runs over `kv_pool` (host memory, not owned, outliving the engine), as
  // the CPU backend allocated it; before each Forward it waits on the fence
  // of every copy submitted to `copies` (may be null) so far.
  static Result<std::unique_ptr<ForwardEngine>> Create(const ModelWeights& weights, const KvPool& kv_pool,
                                                       ThreadPool* pool, CopyEngine* copies);
  ~ForwardEngine() override;

  // ForwardPass::Forward's contract.
  Status Forward(std::span<const ForwardSeq> batch, std::vector<float>* logits) override;

  const KvLayout& kv_layout() const override { return layout_; }
  int num_blocks() const override { return num_blocks_; }
  int vocab_size() const override { return w_.config.vocab_size; }
  int context_length() const override { return w_.config.context_length; }
  uint8_t* block_data(int32_t block) { return kv_ + static_cast<size_t>(block) * layout_.block_bytes(); }
  const ModelConfig& config() const { return w_.config; }

 private:
  ForwardEngine(const ModelWeights& w, ThreadPool* pool) : w_(w), pool_(pool) {}
  // Everything but the KV memory.
  static Result<std::unique_ptr<ForwardEngine>> Make(const ModelWeights& weights, const KvOptions& kv,
                                                     ThreadPool* pool);
  Status Validate(std::span<const ForwardSeq> batch) const;
  // Fills ranges_ / range_first_ for this batch (empty: no split); see
  // forward.cc. Once per Forward: the ranges are the same in every layer.
  void PlanAttentionRanges(const std::vector<int>& pos_of_token);
  // Whether every matrix multiplies with int8 activations in the current
  // cpu::ActivationMode (then a token's logits are batch-invariant).
  bool AllMatMulsInt8() const;
  void Attention(int layer, std::span<const ForwardSeq> batch, const std::vector<int>& seq_of_token,
                 const std::vector<int>& pos_of_token);

  const ModelWeights& w_;
  ThreadPool* pool_;
  KvLayout layout_;
  int num_blocks_ = 0;
  // Page-aligned: tier copies into and out of blocks (memcpy, O_DIRECT reads)
  // run at full speed only with an aligned destination (a 16-byte aligned
  // pool made host -> device loads ~0.6x of memcpy; measured by
  // `strata bench kvcache`).
  struct FreeKvPool {
    void operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t{4096}); }
  };
  std::unique_ptr<uint8_t[], FreeKvPool> kv_own_;  // Create with KvOptions
  uint8_t* kv_ = nullptr;                          // the pool: kv_own_ or the backend's
  CopyEngine* copies_ = nullptr;                   // fences waited on before a forward
  std::vector<float> inv_freq_;
  // Norms and biases converted to f32 once (they may be stored f16/bf16).
  std::vector<float> output_norm_;
  struct LayerF32 {
    std::vector<float> attn_norm, ffn_norm, bq, bk, bv;
  };
  std::vector<LayerF32> layer_f32_;
  // Activations, sized for the largest batch seen; cache-line aligned (the
  // matrix products' vector loads of x).
  CacheAlignedVector<float> x_, xn_, q_, k_, v_, attn_, tmp_, gate_, up_;
  // Attention split over position ranges (few tokens, long contexts): token
  // t's ranges are ranges_[range_first_[t] .. range_first_[t + 1]); each
  // range's outputs and log-sum-exps, merged per token.
  struct AttnRange {
    int t, first_block, n_ctx;
  };
  std::vector<AttnRange> ranges_;
  std::vector<int> range_first_;
  std::vector<float> part_out_, part_lse_;
};

}  // namespace strata
