#pragma once
// The one output path of a generated sequence, used by Generate
// (model/generate.h), the serving engine (scheduler/engine.h) and through it
// the simulator: sampling, the streamed text (complete UTF-8 only, stop
// strings cut, the tail that may be the start of a stop string held back),
// stop token ids, end-of-generation tokens, max_tokens and the finish reason.
//
// A sequence can stop after any token and continue in another
// OutputProcessor (another engine, another process): Save() returns a
// Continuation and the constructor that takes one resumes exactly, so the
// concatenated output (tokens, text, logprobs, finish reason) equals that of
// an uninterrupted run.
//
// Thread-safety: one thread at a time per object (it may move between
// threads). The tokenizer must outlive it.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/finish_reason.h"
#include "model/sampler.h"
#include "model/tokenizer/tokenizer.h"

namespace strata {

// Incremental stop-string detection over streamed text. Push() appends text
// and returns what can be released; once a stop string appears, stopped() is
// true and nothing after it is ever released.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  std::string Push(std::string_view text);
  // Releases what is held back (call at the end when no stop string hit).
  std::string Flush();
  bool stopped() const { return stopped_; }
  // Text Push has held back because it may be the start of a stop string;
  // Restore(held()) on a matcher with the same stops continues the stream.
  const std::string& held() const { return pending_; }
  void Restore(std::string held) { pending_ = std::move(held); }

 private:
  std::vector<std::string> stops_;
  size_t max_len_ = 0;
  std::string pending_;
  bool stopped_ = false;
};

// When a sequence ends (besides errors and cancellation, which its owner
// handles).
struct StopConditions {
  int max_tokens = 16;                  // >= 1: generated tokens in all (a continuation's included)
  std::vector<std::string> stop;        // stop strings (cut from the text, not shown)
  std::vector<int32_t> stop_token_ids;  // in addition to the tokenizer's end-of-generation ids
  bool ignore_eos = false;              // keep going past end-of-generation ids
};

// Everything a sequence's output path needs to continue exactly elsewhere.
// The prompt, sampling params and stop conditions are the request's own and
// travel with it, not here.
struct Continuation {
  std::vector<int32_t> generated;  // tokens generated so far, in order (>= 1 to be a continuation)
  SamplerState sampler;            // seed, draws made, penalty counts
  std::string held_bytes;          // the detokenizer's incomplete UTF-8 bytes
  std::string held_text;           // text held back as a possible stop-string start
  bool empty() const { return generated.empty(); }
};

// What one token did to the sequence.
struct TokenStep {
  SampleResult sample;   // the token, with its logprobs when asked for
  std::string text;      // final text released by this token (with the held-back tail when it finished)
  FinishReason finish = FinishReason::kNone;  // kStop or kLength when this token ended the sequence
};

class OutputProcessor {
 public:
  // REQUIRES: ValidateSamplingParams(sampling, vocab_size).ok(),
  // stop.max_tokens >= 1. With a non-empty `from` (saved by Save() of a
  // processor with the same tokenizer, params and stop conditions) the
  // sequence continues after from->generated; otherwise it starts fresh.
  // `prompt` feeds the repetition penalty.
  OutputProcessor(const Tokenizer& tokenizer, const SamplingParams& sampling, int vocab_size,
                  StopConditions stop, std::span<const int32_t> prompt, const Continuation* from = nullptr);

  // Samples the next token from `logits` (vocab_size raw floats) and applies
  // the stop conditions in this order: an end-of-generation id (unless
  // ignore_eos) or a stop id ends with kStop and shows no text for it; a
  // stop string ends with kStop and the text is cut before it; max_tokens
  // ends with kLength. A finishing token's text includes everything held
  // back. REQUIRES: !finished().
  TokenStep Next(const float* logits);

  bool finished() const { return finish_ != FinishReason::kNone; }
  FinishReason finish_reason() const { return finish_; }
  // Tokens generated in all (a continuation's included).
  int generated() const { return generated_; }
  const StopConditions& stop_conditions() const { return stop_; }
  // The state after the last token, to continue elsewhere (see the top).
  // `generated_tokens`: the sequence's generated tokens, which its owner
  // keeps (the processor does not store them twice). REQUIRES: !finished().
  Continuation Save(std::span<const int32_t> generated_tokens) const;

 private:
  FinishReason StopAfter(int32_t token, std::string* text);

  const Tokenizer& tokenizer_;
  StopConditions stop_;
  Sampler sampler_;
  StreamDecoder decoder_;
  StopMatcher matcher_;
  int generated_ = 0;
  FinishReason finish_ = FinishReason::kNone;
};

}  // namespace strata
