#pragma once
// Generation of one sequence: prefill, then sample and decode token by token
// until a stop condition. Used by `strata generate`; the serving engine loop
// batches many sequences with the same output component
// (model/output_processor.h: sampling, text, stop conditions).

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/finish_reason.h"
#include "model/forward.h"
#include "model/output_processor.h"
#include "model/sampler.h"
#include "model/tokenizer/tokenizer.h"

namespace strata {

struct GenerateOptions {
  SamplingParams sampling;
  int max_tokens = -1;             // -1 = the rest of the context
  std::vector<std::string> stop;   // stop strings (not included in the text)
  std::vector<int32_t> stop_token_ids;  // in addition to the tokenizer's end-of-generation tokens
  bool ignore_eos = false;         // keep going past end-of-generation tokens
  int prefill_chunk = 512;         // prompt tokens per forward call
};

struct GenerateOutput {
  std::vector<int32_t> tokens;       // generated ids (a stop token is included, a stop string's tokens too)
  std::string text;                  // detokenized, cut before a stop string, without the EOS text
  FinishReason finish_reason = FinishReason::kNone;  // kStop | kLength
  std::vector<SampleResult> samples; // per generated token: logprob and top alternatives
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

// Checks prompt and max_tokens against the context length; the message says
// both numbers. Returns the effective max_tokens.
Result<int> ResolveMaxTokens(int prompt_tokens, int max_tokens, int context_length);

// Generates with `engine`'s KV blocks [0, n) for the sequence. `on_text` gets
// text as soon as it is final (complete UTF-8, not part of a possible stop
// string). REQUIRES: engine has enough blocks for prompt + max_tokens.
Result<GenerateOutput> Generate(ForwardPass& engine, const Tokenizer& tokenizer, std::span<const int32_t> prompt,
                                const GenerateOptions& options,
                                const std::function<void(std::string_view)>& on_text = nullptr);

// A sequence whose KV blocks are managed by the caller (a KV cache): the
// block table, how much of the prompt already has KV, and a hook after each
// forward step.
struct SequenceKv {
  // Blocks for positions [0, prompt + max_tokens); REQUIRES: valid engine ids.
  std::span<const int32_t> block_table;
  // Leading prompt positions whose KV is already in the blocks.
  // REQUIRES: 0 <= cached_tokens < prompt size (the last prompt token is
  // always computed, for its logits).
  int32_t cached_tokens = 0;
  // Called after each successful forward step with every token whose KV is
  // now in the blocks (a prompt prefix, then prompt + generated). An error
  // ends generation with it. May be empty.
  std::function<Status(std::span<const int32_t>)> after_step;
};

// Generate() over caller-managed blocks: prefill starts at kv.cached_tokens.
// With cached_tokens == 0 and blocks 0..n it computes exactly what Generate() does.
Result<GenerateOutput> GenerateWithKv(ForwardPass& engine, const Tokenizer& tokenizer,
                                      std::span<const int32_t> prompt, const GenerateOptions& options,
                                      const SequenceKv& kv,
                                      const std::function<void(std::string_view)>& on_text = nullptr);

}  // namespace strata
