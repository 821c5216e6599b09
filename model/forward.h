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
// Thread-safety: a ForwardEngine is used by one thread at a time (the engine
// loop); it parallelises internally over its ThreadPool.

#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "model/backend/kv_layout.h"
#include "model/weights.h"

namespace strata {

struct ForwardSeq {
  std::span<const int32_t> tokens;       // >= 1 token ids (prompt chunk or decode token)
  int32_t start_pos = 0;                 // position of tokens[0]
  std::span<const int32_t> block_table;  // block ids for positions [0, start_pos + tokens.size())
  bool all_logits = false;               // logits for every token, not only the last
};

struct KvOptions {
  int block_size = 16;
  DType dtype = DType::kF16;  // f32 | f16 | bf16
  int num_blocks = 0;         // size of the KV pool
};

class ForwardEngine {
 public:
  // `weights` must outlive the engine. Allocates the KV pool.
  static Result<std::unique_ptr<ForwardEngine>> Create(const ModelWeights& weights, const KvOptions& kv,
                                                       ThreadPool* pool);
  ~ForwardEngine();

  // REQUIRES: each sequence's block table covers start_pos + tokens.size()
  // positions with valid block ids, start_pos + tokens.size() <= context length,
  // and token ids are < vocab size (all checked; a violation returns
  // InvalidArgument and writes nothing).
  // On success `logits` holds, for each sequence in order, one row (or
  // tokens.size() rows with all_logits) of vocab_size floats.
  Status Forward(std::span<const ForwardSeq> batch, std::vector<float>* logits);

  const KvLayout& kv_layout() const { return layout_; }
  int num_blocks() const { return num_blocks_; }
  uint8_t* block_data(int32_t block) { return kv_.get() + static_cast<size_t>(block) * layout_.block_bytes(); }
  const ModelConfig& config() const { return w_.config; }

 private:
  ForwardEngine(const ModelWeights& w, ThreadPool* pool) : w_(w), pool_(pool) {}
  Status Validate(std::span<const ForwardSeq> batch) const;
  // Fills ranges_ / range_first_ for this batch (empty: no split); see
  // forward.cc. Once per Forward: the ranges are the same in every layer.
  void PlanAttentionRanges(const std::vector<int>& pos_of_token);
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
  std::unique_ptr<uint8_t[], FreeKvPool> kv_;
  std::vector<float> inv_freq_;
  // Norms and biases converted to f32 once (they may be stored f16/bf16).
  std::vector<float> output_norm_;
  struct LayerF32 {
    std::vector<float> attn_norm, ffn_norm, bq, bk, bv;
  };
  std::vector<LayerF32> layer_f32_;
  // Activations, sized for the largest batch seen.
  std::vector<float> x_, xn_, q_, k_, v_, attn_, tmp_, gate_, up_;
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
