#include "model/forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "model/backend/cpu/attention.h"
#include "model/backend/cpu/kernels.h"
#include "model/backend/cpu/matmul.h"
#include "model/backend/cpu/quant.h"

namespace strata {

namespace {

std::vector<float> ToF32(const Tensor& t) {
  std::vector<float> out;
  if (!t.present()) return out;
  out.resize(static_cast<size_t>(t.elements()));
  for (int64_t r = 0; r < t.rows(); ++r) {
    cpu::DequantizeRow(t.type, t.row(r), out.data() + r * t.cols(), t.cols());
  }
  return out;
}

// Grows `v` to at least n floats (never shrinks: activations are reused).
template <class Vec>
void Reserve(Vec& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

Result<std::unique_ptr<ForwardEngine>> ForwardEngine::Make(const ModelWeights& weights, const KvOptions& kv,
                                                           ThreadPool* pool) {
  STRATA_RETURN_IF_ERROR(ValidateWeights(weights));
  if (pool == nullptr) return Status::InvalidArgument("ForwardEngine needs a thread pool");
  if (kv.dtype != DType::kF32 && kv.dtype != DType::kF16 && kv.dtype != DType::kBF16)
    return Status::InvalidArgument("KV dtype must be f32, f16 or bf16, not " + std::string(DTypeName(kv.dtype)));
  if (kv.block_size < 1 || kv.block_size > 4096)
    return Status::InvalidArgument("KV block size " + std::to_string(kv.block_size) + " out of range [1, 4096]");
  if (kv.num_blocks < 1) return Status::InvalidArgument("KV pool needs at least one block");

  const ModelConfig& c = weights.config;
  std::unique_ptr<ForwardEngine> e(new ForwardEngine(weights, pool));
  e->layout_.n_layers = c.n_layers;
  e->layout_.n_kv_heads = c.n_kv_heads;
  e->layout_.head_dim = c.head_dim;
  e->layout_.block_size = kv.block_size;
  e->layout_.dtype = kv.dtype;
  e->num_blocks_ = kv.num_blocks;
  e->inv_freq_.resize(static_cast<size_t>(c.head_dim / 2));
  ComputeRopeInvFreq(c, e->inv_freq_.data());
  e->output_norm_ = ToF32(weights.output_norm);
  for (const LayerWeights& l : weights.layers) {
    LayerF32 f;
    f.attn_norm = ToF32(l.attn_norm);
    f.ffn_norm = ToF32(l.ffn_norm);
    f.bq = ToF32(l.bq);
    f.bk = ToF32(l.bk);
    f.bv = ToF32(l.bv);
    e->layer_f32_.push_back(std::move(f));
  }
  return e;
}

Result<std::unique_ptr<ForwardEngine>> ForwardEngine::Create(const ModelWeights& weights, const KvOptions& kv,
                                                             ThreadPool* pool) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<ForwardEngine> e, Make(weights, kv, pool));
  const size_t bytes = e->layout_.block_bytes() * static_cast<size_t>(kv.num_blocks);
  e->kv_own_.reset(new (std::align_val_t{4096}, std::nothrow) uint8_t[bytes]);
  if (!e->kv_own_) {
    return Status::ResourceExhausted("cannot allocate " + std::to_string(bytes) + " bytes for " +
                                     std::to_string(kv.num_blocks) + " KV blocks");
  }
  std::memset(e->kv_own_.get(), 0, bytes);
  e->kv_ = e->kv_own_.get();
  return e;
}

Result<std::unique_ptr<ForwardEngine>> ForwardEngine::Create(const ModelWeights& weights, const KvPool& kv_pool,
                                                             ThreadPool* pool, CopyEngine* copies) {
  if (!HostAddressable(kv_pool.kind) || kv_pool.base == nullptr)
    return Status::InvalidArgument("the CPU forward pass needs a KV pool in host memory, not " +
                                   std::string(SegmentKindName(kv_pool.kind)));
  const ModelConfig& c = weights.config;
  if (kv_pool.layout.n_layers != c.n_layers || kv_pool.layout.n_kv_heads != c.n_kv_heads ||
      kv_pool.layout.head_dim != c.head_dim)
    return Status::InvalidArgument("the KV pool's layout does not fit the model (layers, KV heads, head size)");
  KvOptions kv;
  kv.block_size = kv_pool.layout.block_size;
  kv.dtype = kv_pool.layout.dtype;
  kv.num_blocks = kv_pool.num_blocks;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<ForwardEngine> e, Make(weights, kv, pool));
  e->kv_ = kv_pool.base;
  e->copies_ = copies;
  return e;
}

ForwardEngine::~ForwardEngine() = default;

Status ForwardEngine::Validate(std::span<const ForwardSeq> batch) const {
  const ModelConfig& c = w_.config;
  if (batch.empty()) return Status::InvalidArgument("empty batch");
  for (size_t s = 0; s < batch.size(); ++s) {
    const ForwardSeq& q = batch[s];
    std::string who = "sequence " + std::to_string(s) + " of the batch";
    if (q.tokens.empty()) return Status::InvalidArgument(who + " has no tokens");
    if (q.start_pos < 0) return Status::InvalidArgument(who + " has a negative start position");
    int64_t end = static_cast<int64_t>(q.start_pos) + static_cast<int64_t>(q.tokens.size());
    if (end > c.context_length)
      return Status::InvalidArgument(who + " reaches position " + std::to_string(end) +
                                     ", past the context length " + std::to_string(c.context_length));
    int64_t need_blocks = (end + layout_.block_size - 1) / layout_.block_size;
    if (static_cast<int64_t>(q.block_table.size()) < need_blocks)
      return Status::InvalidArgument(who + " needs " + std::to_string(need_blocks) + " blocks, block table has " +
                                     std::to_string(q.block_table.size()));
    for (int64_t b = 0; b < need_blocks; ++b) {
      if (q.block_table[b] < 0 || q.block_table[b] >= num_blocks_)
        return Status::InvalidArgument(who + " block table entry " + std::to_string(b) + " = " +
                                       std::to_string(q.block_table[b]) + " is not a valid block id");
    }
    for (int32_t t : q.tokens)
      if (t < 0 || t >= c.vocab_size)
        return Status::InvalidArgument(who + " has token id " + std::to_string(t) + " outside the vocabulary [0, " +
                                       std::to_string(c.vocab_size) + ")");
  }
  return Status::Ok();
}

// Every task covers whole KV heads of its token, so the kernel reads each
// block front to back (attention.h); the query heads of a group share K/V
// rows. With enough tokens for every thread, one task per token over all KV
// heads. With few (decode at small batches), each token's context is split
// into ranges of whole blocks over all KV heads, a task per range, merged by
// log-sum-exp (flash-decoding): the ranges spread one token over the
// threads. One task per (token, KV head) instead read one head's 128 of
// every 1,536 bytes (bench-110m), which the prefetchers barely follow: q8_0
// decode at batch 1, context 2000, ran 68 tok/s that way and 98 split. Short
// contexts (under 2 ranges of 4 blocks) keep that per-head split.
bool ForwardEngine::AllMatMulsInt8() const {
  const cpu::ActivationMode mode = cpu::GetActivationMode();
  auto int8 = [mode](const Tensor& t) { return cpu::UsesIntegerActivations(t.type, mode); };
  if (!int8(w_.output)) return false;
  for (const LayerWeights& L : w_.layers) {
    for (const Tensor* t : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) {
      if (!int8(*t)) return false;
    }
  }
  return true;
}

void ForwardEngine::PlanAttentionRanges(const std::vector<int>& pos_of_token) {
  ranges_.clear();
  range_first_.clear();
  const int T = static_cast<int>(pos_of_token.size());
  const int threads = pool_->num_threads();
  if (T >= 2 * threads || threads <= 1) return;
  // When every matrix takes int8 activations the logits are independent of
  // batch and thread count (cpu::ActivationMode); a context split's
  // log-sum-exp merge rounds differently from one pass over the context, so
  // such a model is never split.
  if (AllMatMulsInt8()) return;
  constexpr int kMinRangeBlocks = 4;
  const int bs = layout_.block_size;
  for (int t = 0; t < T; ++t) {
    const int n_ctx = pos_of_token[t] + 1;
    const int blocks = (n_ctx + bs - 1) / bs;
    const int parts = std::min(2 * threads, blocks / kMinRangeBlocks);
    if (parts < 2) {  // one short context: the per-head split for the batch
      ranges_.clear();
      range_first_.clear();
      return;
    }
    range_first_.push_back(static_cast<int>(ranges_.size()));
    for (int p = 0; p < parts; ++p) {
      const int b0 = blocks * p / parts, b1 = blocks * (p + 1) / parts;
      ranges_.push_back({t, b0, std::min(n_ctx, b1 * bs) - b0 * bs});
    }
  }
  range_first_.push_back(static_cast<int>(ranges_.size()));
}

void ForwardEngine::Attention(int layer, std::span<const ForwardSeq> batch, const std::vector<int>& seq_of_token,
                              const std::vector<int>& pos_of_token) {
  const ModelConfig& c = w_.config;
  const int T = static_cast<int>(seq_of_token.size());
  const int hd = c.head_dim;
  const int group = c.n_heads / c.n_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const size_t head_bytes = static_cast<size_t>(hd) * layout_.elem_bytes();
  const size_t qd = static_cast<size_t>(c.q_dim());
  // Token t's KV heads [g, g + kv_heads) over n_ctx positions from block
  // first_block of its table; out and lse are the caller's.
  auto attend = [&](int t, int g, int kv_heads, int first_block, int n_ctx, float* out, float* lse) {
    thread_local std::vector<float> scores;
    const size_t need = static_cast<size_t>(n_ctx) * static_cast<size_t>(group * kv_heads);
    if (scores.size() < need) scores.resize(need);
    cpu::AttnArgs a;
    a.q = q_.data() + static_cast<size_t>(t) * qd + static_cast<size_t>(g * group) * hd;
    a.group = group;
    a.kv_heads = kv_heads;
    a.kv_head_bytes = head_bytes;
    a.head_dim = hd;
    a.n_ctx = n_ctx;
    a.kv_base = kv_;
    a.block_bytes = layout_.block_bytes();
    a.block_table = batch[seq_of_token[t]].block_table.data() + first_block;
    a.block_size = layout_.block_size;
    a.k_offset = layout_.Offset(layer, 0, 0) + static_cast<size_t>(g) * head_bytes;
    a.v_offset = layout_.Offset(layer, 1, 0) + static_cast<size_t>(g) * head_bytes;
    a.row_bytes = layout_.row_bytes();
    a.kv_type = layout_.dtype;
    a.scale = scale;
    a.out = out;
    a.lse = lse;
    a.scores = scores.data();
    cpu::Attend(a);
  };

  if (!ranges_.empty()) {  // PlanAttentionRanges split the contexts
    const size_t heads = static_cast<size_t>(c.n_heads);
    Reserve(part_out_, ranges_.size() * qd);
    Reserve(part_lse_, ranges_.size() * heads);
    pool_->Run(static_cast<int>(ranges_.size()), [&](int task) {
      const AttnRange& r = ranges_[static_cast<size_t>(task)];
      const size_t p = static_cast<size_t>(task);
      attend(r.t, 0, c.n_kv_heads, r.first_block, r.n_ctx, part_out_.data() + p * qd, part_lse_.data() + p * heads);
    });
    for (int t = 0; t < T; ++t) {
      const size_t p0 = static_cast<size_t>(range_first_[static_cast<size_t>(t)]);
      cpu::MergeAttention(part_out_.data() + p0 * qd, part_lse_.data() + p0 * heads,
                          range_first_[static_cast<size_t>(t) + 1] - static_cast<int>(p0), c.n_heads, hd,
                          attn_.data() + static_cast<size_t>(t) * qd);
    }
    return;
  }
  const int heads_per_task = T >= 2 * pool_->num_threads() ? c.n_kv_heads : 1;
  const int tasks_per_token = c.n_kv_heads / heads_per_task;
  pool_->Run(T * tasks_per_token, [&](int task) {
    const int t = task / tasks_per_token;
    const int g = (task % tasks_per_token) * heads_per_task;
    attend(t, g, heads_per_task, 0, pos_of_token[t] + 1,
           attn_.data() + static_cast<size_t>(t) * qd + static_cast<size_t>(g * group) * hd, nullptr);
  });
}

Status ForwardEngine::Forward(std::span<const ForwardSeq> batch, std::vector<float>* logits) {
  STRATA_RETURN_IF_ERROR(Validate(batch));
  // Copies into the pool (staged loads) land before any block is read.
  if (copies_ != nullptr) copies_->Wait(copies_->Fence());
  const ModelConfig& c = w_.config;
  const int dim = c.dim;

  // Flatten the batch: token t belongs to sequence seq_of_token[t] at pos_of_token[t].
  std::vector<int> seq_of_token, pos_of_token;
  std::vector<int32_t> ids;
  std::vector<int> logit_rows;  // token indices whose logits are returned
  for (size_t s = 0; s < batch.size(); ++s) {
    const ForwardSeq& q = batch[s];
    for (size_t i = 0; i < q.tokens.size(); ++i) {
      int t = static_cast<int>(ids.size());
      ids.push_back(q.tokens[i]);
      seq_of_token.push_back(static_cast<int>(s));
      pos_of_token.push_back(q.start_pos + static_cast<int>(i));
      if (q.all_logits || i + 1 == q.tokens.size()) logit_rows.push_back(t);
    }
  }
  const int T = static_cast<int>(ids.size());
  const size_t Ts = static_cast<size_t>(T);
  Reserve(x_, Ts * dim);
  Reserve(xn_, Ts * dim);
  Reserve(q_, Ts * c.q_dim());
  Reserve(k_, Ts * c.kv_dim());
  Reserve(v_, Ts * c.kv_dim());
  Reserve(attn_, Ts * c.q_dim());
  Reserve(tmp_, Ts * std::max(dim, c.q_dim()));
  Reserve(gate_, Ts * c.ffn_dim);
  Reserve(up_, Ts * c.ffn_dim);

  const Tensor& emb = w_.tok_embd;
  pool_->ParallelFor(Ts, 16, [&](size_t b, size_t e) {
    for (size_t t = b; t < e; ++t) cpu::DequantizeRow(emb.type, emb.row(ids[t]), x_.data() + t * dim, dim);
  });

  const bool neox = c.rope_style == RopeStyle::kNeox;
  PlanAttentionRanges(pos_of_token);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w_.layers[l];
    const LayerF32& F = layer_f32_[l];
    pool_->ParallelFor(Ts, 8, [&](size_t b, size_t e) {
      for (size_t t = b; t < e; ++t)
        cpu::RmsNorm(x_.data() + t * dim, F.attn_norm.data(), xn_.data() + t * dim, dim, c.rms_eps);
    });
    cpu::MatMul(L.wq, xn_.data(), T, q_.data(), *pool_);
    cpu::MatMul(L.wk, xn_.data(), T, k_.data(), *pool_);
    cpu::MatMul(L.wv, xn_.data(), T, v_.data(), *pool_);
    pool_->ParallelFor(Ts, 4, [&](size_t b, size_t e) {
      for (size_t t = b; t < e; ++t) {
        float* qt = q_.data() + t * c.q_dim();
        float* kt = k_.data() + t * c.kv_dim();
        float* vt = v_.data() + t * c.kv_dim();
        if (!F.bq.empty()) {
          cpu::Add(qt, F.bq.data(), c.q_dim());
          cpu::Add(kt, F.bk.data(), c.kv_dim());
          cpu::Add(vt, F.bv.data(), c.kv_dim());
        }
        cpu::ApplyRope(qt, c.n_heads, c.head_dim, pos_of_token[t], inv_freq_.data(), neox);
        cpu::ApplyRope(kt, c.n_kv_heads, c.head_dim, pos_of_token[t], inv_freq_.data(), neox);
        // Store this token's K and V into its block.
        const ForwardSeq& seq = batch[seq_of_token[t]];
        int pos = pos_of_token[t];
        uint8_t* blk = kv_ + static_cast<size_t>(seq.block_table[pos / layout_.block_size]) * layout_.block_bytes();
        int slot = pos % layout_.block_size;
        cpu::StoreKv(kt, blk + layout_.Offset(l, 0, slot), layout_.dtype, c.kv_dim());
        cpu::StoreKv(vt, blk + layout_.Offset(l, 1, slot), layout_.dtype, c.kv_dim());
      }
    });
    Attention(l, batch, seq_of_token, pos_of_token);
    cpu::MatMul(L.wo, attn_.data(), T, tmp_.data(), *pool_);
    pool_->ParallelFor(Ts, 8, [&](size_t b, size_t e) {
      for (size_t t = b; t < e; ++t) {
        cpu::Add(x_.data() + t * dim, tmp_.data() + t * dim, dim);
        cpu::RmsNorm(x_.data() + t * dim, F.ffn_norm.data(), xn_.data() + t * dim, dim, c.rms_eps);
      }
    });
    cpu::MatMul(L.w_gate, xn_.data(), T, gate_.data(), *pool_);
    cpu::MatMul(L.w_up, xn_.data(), T, up_.data(), *pool_);
    pool_->ParallelFor(Ts, 4, [&](size_t b, size_t e) {
      for (size_t t = b; t < e; ++t)
        cpu::SwiGlu(gate_.data() + t * c.ffn_dim, up_.data() + t * c.ffn_dim, gate_.data() + t * c.ffn_dim, c.ffn_dim);
    });
    cpu::MatMul(L.w_down, gate_.data(), T, tmp_.data(), *pool_);
    pool_->ParallelFor(Ts, 16, [&](size_t b, size_t e) {
      for (size_t t = b; t < e; ++t) cpu::Add(x_.data() + t * dim, tmp_.data() + t * dim, dim);
    });
  }

  // Final norm and output head only for the rows whose logits are wanted.
  const size_t R = logit_rows.size();
  for (size_t r = 0; r < R; ++r) {
    cpu::RmsNorm(x_.data() + static_cast<size_t>(logit_rows[r]) * dim, output_norm_.data(), xn_.data() + r * dim, dim,
                 c.rms_eps);
  }
  logits->resize(R * static_cast<size_t>(c.vocab_size));
  cpu::MatMul(w_.output, xn_.data(), static_cast<int64_t>(R), logits->data(), *pool_);
  return Status::Ok();
}

}  // namespace strata
