#include "model/generate.h"

#include <algorithm>
#include <chrono>

namespace strata {

Result<int> ResolveMaxTokens(int prompt_tokens, int max_tokens, int context_length) {
  if (prompt_tokens <= 0) return Status::InvalidArgument("the prompt is empty (no tokens)");
  if (prompt_tokens >= context_length)
    return Status::InvalidArgument("the prompt has " + std::to_string(prompt_tokens) +
                                   " tokens, which fills the model's context of " + std::to_string(context_length) +
                                   " tokens; no room to generate");
  if (max_tokens < 0) return context_length - prompt_tokens;
  if (max_tokens == 0) return Status::InvalidArgument("max_tokens must be at least 1");
  if (prompt_tokens + max_tokens > context_length)
    return Status::InvalidArgument("the prompt has " + std::to_string(prompt_tokens) + " tokens and max_tokens is " +
                                   std::to_string(max_tokens) + ": together " +
                                   std::to_string(prompt_tokens + max_tokens) + " exceed the model's context of " +
                                   std::to_string(context_length) + " tokens");
  return max_tokens;
}

Result<GenerateOutput> Generate(ForwardPass& engine, const Tokenizer& tokenizer, std::span<const int32_t> prompt,
                                const GenerateOptions& options,
                                const std::function<void(std::string_view)>& on_text) {
  STRATA_ASSIGN_OR_RETURN(int max_tokens, ResolveMaxTokens(static_cast<int>(prompt.size()), options.max_tokens,
                                                           engine.context_length()));
  STRATA_RETURN_IF_ERROR(ValidateSamplingParams(options.sampling, engine.vocab_size()));
  const int bs = engine.kv_layout().block_size;
  const int total = static_cast<int>(prompt.size()) + max_tokens;
  const int need_blocks = (total + bs - 1) / bs;
  if (need_blocks > engine.num_blocks())
    return Status::ResourceExhausted("the sequence needs " + std::to_string(need_blocks) + " KV blocks, the pool has " +
                                     std::to_string(engine.num_blocks()));
  std::vector<int32_t> table(static_cast<size_t>(need_blocks));
  for (int i = 0; i < need_blocks; ++i) table[static_cast<size_t>(i)] = i;
  SequenceKv kv;
  kv.block_table = table;
  return GenerateWithKv(engine, tokenizer, prompt, options, kv, on_text);
}

Result<GenerateOutput> GenerateWithKv(ForwardPass& engine, const Tokenizer& tokenizer,
                                      std::span<const int32_t> prompt, const GenerateOptions& options,
                                      const SequenceKv& kv,
                                      const std::function<void(std::string_view)>& on_text) {
  STRATA_ASSIGN_OR_RETURN(int max_tokens, ResolveMaxTokens(static_cast<int>(prompt.size()), options.max_tokens,
                                                           engine.context_length()));
  STRATA_RETURN_IF_ERROR(ValidateSamplingParams(options.sampling, engine.vocab_size()));
  const size_t total = prompt.size() + static_cast<size_t>(max_tokens);
  if (kv.block_table.size() * static_cast<size_t>(engine.kv_layout().block_size) < total)
    return Status::InvalidArgument("the block table covers " + std::to_string(kv.block_table.size()) +
                                   " blocks, fewer than the sequence's " + std::to_string(total) + " tokens need");
  if (kv.cached_tokens < 0 || static_cast<size_t>(kv.cached_tokens) >= prompt.size())
    return Status::InvalidArgument("cached_tokens " + std::to_string(kv.cached_tokens) +
                                   " must be in [0, prompt tokens)");
  const std::span<const int32_t> table = kv.block_table;
  auto after_step = [&](std::span<const int32_t> with_kv) {
    return kv.after_step ? kv.after_step(with_kv) : Status::Ok();
  };

  GenerateOutput out;
  StopConditions stop{max_tokens, options.stop, options.stop_token_ids, options.ignore_eos};
  OutputProcessor output(tokenizer, options.sampling, engine.vocab_size(), std::move(stop), prompt);
  auto emit = [&](const std::string& s) {
    if (s.empty()) return;
    out.text += s;
    if (on_text) on_text(s);
  };

  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  std::vector<float> logits;
  const size_t chunk = static_cast<size_t>(std::max(1, options.prefill_chunk));
  for (size_t start = static_cast<size_t>(kv.cached_tokens); start < prompt.size(); start += chunk) {
    size_t n = std::min(chunk, prompt.size() - start);
    ForwardSeq seq{prompt.subspan(start, n), static_cast<int32_t>(start), table};
    STRATA_RETURN_IF_ERROR(engine.Forward({&seq, 1}, &logits));
    STRATA_RETURN_IF_ERROR(after_step(prompt.first(start + n)));
  }
  auto t1 = Clock::now();
  out.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  std::vector<int32_t> history(prompt.begin(), prompt.end());
  while (true) {
    TokenStep step = output.Next(logits.data());
    out.tokens.push_back(step.sample.token);
    history.push_back(step.sample.token);
    emit(step.text);
    out.samples.push_back(std::move(step.sample));
    if (step.finish != FinishReason::kNone) {
      out.finish_reason = step.finish;
      break;
    }
    ForwardSeq seq{std::span<const int32_t>(&history.back(), 1), static_cast<int32_t>(history.size() - 1), table};
    STRATA_RETURN_IF_ERROR(engine.Forward({&seq, 1}, &logits));
    STRATA_RETURN_IF_ERROR(after_step(history));
  }
  out.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  return out;
}

}  // namespace strata
