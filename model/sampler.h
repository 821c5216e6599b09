#pragma once
// Token sampling for one sequence: penalties, temperature, top-k, top-p,
// min-p, a seeded RNG, and OpenAI-style logprobs.
//
// Sample() runs these steps, in vLLM's order:
//   1. logprobs (if asked) come from log_softmax of the RAW logits: the
//      model's own distribution, before logit_bias, penalties, temperature
//      and any truncation (vLLM's default "raw_logprobs"). NaN logits count
//      as -inf everywhere.
//   2. logit_bias is added.
//   3. penalties, over the tokens seen so far:
//        repetition (prompt + generated, each distinct token once):
//          logit > 0 ? logit / r : logit * r
//        frequency (generated): logit -= f * count
//        presence  (generated): logit -= p * (count > 0)
//   4. temperature < 1e-5: greedy, the argmax of the penalized logits (ties go
//      to the lowest id); top-k/top-p/min-p and the RNG are not used.
//   5. otherwise logits / temperature, softmax, then
//        top-k: keep the k most likely (ties broken by lower id);
//        top-p: of those, keep the smallest most-likely-first prefix whose
//               probability (renormalized over the kept set) reaches top_p;
//        min-p: drop tokens with prob < min_p * (prob of the most likely);
//      and draw one of the rest in proportion to its probability.
//
// The draw uses std::mt19937_64, whose output the C++ standard fixes, and
// builds the uniform double itself (top 53 bits * 2^-53) instead of using
// std::uniform_real_distribution, whose output differs across standard
// libraries. One draw per non-greedy Sample(). So the same seed, params and
// logits give the same tokens on every platform (logits themselves may differ
// in the last bits between SIMD levels, which can move a draw that lands on
// a boundary).
//
// Cost: a few O(vocab) passes per Sample() (~0.2-1 ms at 150k vocab). top-k
// and top-p group tokens into buckets by logit and sort only the bucket where
// the cut falls (plus the k kept for top-k), never the whole vocabulary.
// Scratch buffers are per thread (~18 bytes per vocab entry), not per
// Sampler, so a Sampler itself is small: its penalty counts are sparse.

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/status.h"

namespace strata {

struct SamplingParams {
  float temperature = 1.0f;         // [0, 2]; < 1e-5 = greedy
  float top_p = 1.0f;               // (0, 1]; 1 = off
  int top_k = -1;                   // -1 or 0 = off, else >= 1 (values > vocab = off)
  float min_p = 0.0f;               // [0, 1]; 0 = off
  std::optional<uint64_t> seed;     // same seed → same output; absent → random seed
  float presence_penalty = 0.0f;    // [-2, 2], over generated tokens
  float frequency_penalty = 0.0f;   // [-2, 2], over generated tokens
  float repetition_penalty = 1.0f;  // > 0, over prompt + generated tokens; 1 = off
  // (token id, bias in [-100, 100]) added to the logits; an id listed twice
  // gets both biases.
  std::vector<std::pair<int32_t, float>> logit_bias;
  int top_logprobs = 0;   // [0, 20]: how many most likely alternatives to return
  bool logprobs = false;  // return the chosen token's logprob
};

// OK, or InvalidArgument naming the first bad field and its allowed range
// (e.g. "top_p must be in (0, 1], got 0"). Also rejects vocab_size <= 0,
// NaN/inf values and logit_bias ids outside [0, vocab_size).
Status ValidateSamplingParams(const SamplingParams& params, int vocab_size);

struct TokenLogprob {
  int32_t id;
  float logprob;  // natural log; -inf for a token the model gives no mass
};

// What a Sampler needs to continue a sequence exactly in another Sampler
// (another engine or process): the seed it drew with (the random one when
// none was given), how many draws it made, and the penalty counts of the
// tokens it recorded as generated.
struct SamplerState {
  uint64_t seed = 0;
  uint64_t draws = 0;
  int64_t num_generated = 0;
  std::vector<std::pair<int32_t, int32_t>> generated_counts;  // (token id, count), ascending id
};

struct SampleResult {
  int32_t token = 0;
  // The chosen token's logprob under the raw model distribution; 0 unless
  // params.logprobs or params.top_logprobs > 0.
  float logprob = 0.0f;
  // The params.top_logprobs most likely tokens of the raw distribution, most
  // likely first (ties: lower id first). May or may not contain `token`.
  std::vector<TokenLogprob> top;
};

// One per sequence. Not thread-safe: one thread at a time may call it (it may
// move between threads). Keeps the RNG and the counts the penalties need.
class Sampler {
 public:
  // Validates, then constructs.
  static Result<Sampler> Create(SamplingParams params, int vocab_size);

  // REQUIRES: ValidateSamplingParams(params, vocab_size).ok(). Out-of-range
  // values are clamped into range and bad logit_bias ids dropped, so a
  // violation still gives defined behaviour, just not a meaningful one.
  Sampler(SamplingParams params, int vocab_size);
  // Continues from `state` (saved by State() of a Sampler with the same
  // params and vocabulary): the RNG is at the same point and the penalty
  // counts are the same, so the following Sample() calls return what the
  // saved Sampler's would have. The prompt is given again with
  // AcceptPrompt. Counts of ids outside the vocabulary are ignored.
  Sampler(SamplingParams params, int vocab_size, const SamplerState& state);

  // Records prompt tokens for the repetition penalty (may be called more than
  // once; ids outside [0, vocab_size) are ignored). Call before Sample().
  void AcceptPrompt(std::span<const int32_t> prompt);

  // logits: vocab_size floats, the raw model output for the next position;
  // not modified. Chooses a token, records it as generated (as Accept does),
  // and returns it with the logprobs asked for. A null logits pointer (or
  // vocab_size <= 0) returns token 0 and records nothing.
  SampleResult Sample(const float* logits);

  // Records a generated token that did not come from this Sampler's Sample():
  // e.g. the first token sampled by a prefill worker, or a forced token. Do
  // not call it for tokens Sample() returned. Out-of-range ids are ignored.
  void Accept(int32_t token);

  const SamplingParams& params() const { return params_; }
  int vocab_size() const { return vocab_size_; }
  // Tokens recorded by Sample() and Accept().
  int64_t num_generated() const { return num_generated_; }
  // The state to continue from (see SamplerState). O(distinct generated ids).
  SamplerState State() const;

 private:
  void ApplyPenalties(float* logits) const;
  int32_t Draw(float* logits);  // logits: penalized; clobbered

  SamplingParams params_;
  int vocab_size_;
  std::mt19937_64 rng_;
  uint64_t seed_ = 0;   // what rng_ was seeded with
  uint64_t draws_ = 0;  // rng_ outputs consumed
  int64_t num_generated_ = 0;
  std::unordered_map<int32_t, int32_t> generated_counts_;
  std::unordered_set<int32_t> prompt_tokens_;  // kept only for repetition_penalty != 1
};

}  // namespace strata
