#pragma once
// How far a model's next-token distributions are from a reference model's on
// the same text: `strata eval kld`, the accuracy check for quantized weights
// and for kernels that round differently (issue 21).
//
// The tokens are split into chunks of `context` tokens, each evaluated from
// position 0 (its first token replaced by BOS when the tokenizer adds one),
// and the positions of the second half of each chunk are scored, as
// llama.cpp's `llama-perplexity --kl-divergence` does, so the two tools'
// figures are comparable: at each scored position, the KL divergence
// KL(reference || model) of the softmaxed logits (in double precision), and
// whether the two argmaxes agree.
//
// Thread-safety: one call at a time per ThreadPool.

#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"
#include "common/thread_pool.h"
#include "model/weights.h"

namespace strata {

struct KldOptions {
  int context = 512;   // tokens per chunk (at most the models' context length)
  int max_chunks = 0;  // 0 = every whole chunk the tokens hold
  int32_t bos_id = -1; // the first token of each chunk, when >= 0
  DType kv_dtype = DType::kF16;
};

struct KldResult {
  int64_t positions = 0;  // scored positions
  int chunks = 0;
  double mean_kld = 0;
  double max_kld = 0;
  double p99_kld = 0;          // 99th percentile over positions
  double top1_agreement = 0;   // share of positions whose argmaxes agree
  double reference_ppl = 0;    // perplexity of each model on the scored tokens
  double model_ppl = 0;
};

// InvalidArgument when the vocabulary sizes differ, a token id is out of
// range, --context is outside [4, context length] or the tokens do not fill
// one chunk; Internal when either model gives a non-finite logit. Holds two
// KV pools of `context` tokens and 2 x context x vocab floats of logits.
Result<KldResult> EvaluateKld(const ModelWeights& model, const ModelWeights& reference,
                              std::span<const int32_t> tokens, const KldOptions& opt, ThreadPool* pool);

// Per position (exposed for tests): KL(p || q) of the softmaxes of logits
// `ref` and `cand` (n floats each), in double precision. NaN when a logit is
// NaN or +inf (or all are -inf); +inf when q gives 0 where p does not.
double KlDivergence(const float* ref, const float* cand, int n);

// English prose the project writes itself (a seeded grammar of short story
// sentences): the default text of `strata eval kld`. About `words` words;
// the same text for the same arguments on every machine.
std::string DefaultEvalText(int words = 6000, uint64_t seed = 1);

}  // namespace strata
