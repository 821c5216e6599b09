#include "model/output_processor.h"

#include <algorithm>

namespace strata {

namespace {

// Largest n' <= n such that s[0, n') does not end inside a UTF-8 sequence.
size_t Utf8Boundary(const std::string& s, size_t n) {
  size_t i = n;
  // Step back over continuation bytes (at most 3) to the lead byte.
  size_t back = 0;
  while (i > 0 && back < 4 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) {
    --i;
    ++back;
  }
  if (i == 0) return n;
  unsigned char lead = static_cast<unsigned char>(s[i - 1]);
  size_t len = lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 1;
  // The sequence starting at i-1 spans len bytes; complete if it ends by n.
  if (i - 1 + len <= n) return n;
  return i - 1;
}

}  // namespace

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
  for (const auto& s : stops_) max_len_ = std::max(max_len_, s.size());
}

std::string StopMatcher::Push(std::string_view text) {
  if (stopped_) return {};
  pending_.append(text);
  size_t hit = std::string::npos;
  for (const auto& s : stops_) hit = std::min(hit, pending_.find(s));
  if (hit != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, hit);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that could still grow into a stop string.
  size_t keep = max_len_ > 0 ? std::min(pending_.size(), max_len_ - 1) : 0;
  size_t release = Utf8Boundary(pending_, pending_.size() - keep);
  std::string out = pending_.substr(0, release);
  pending_.erase(0, release);
  return out;
}

std::string StopMatcher::Flush() {
  std::string out = stopped_ ? std::string() : pending_;
  pending_.clear();
  return out;
}

OutputProcessor::OutputProcessor(const Tokenizer& tokenizer, const SamplingParams& sampling, int vocab_size,
                                 StopConditions stop, std::span<const int32_t> prompt, const Continuation* from)
    : tokenizer_(tokenizer),
      stop_(std::move(stop)),
      sampler_(from != nullptr && !from->empty() ? Sampler(sampling, vocab_size, from->sampler)
                                                 : Sampler(sampling, vocab_size)),
      decoder_(tokenizer, /*skip_special=*/true),
      matcher_(stop_.stop) {
  sampler_.AcceptPrompt(prompt);
  if (from != nullptr && !from->empty()) {
    generated_ = static_cast<int>(from->generated.size());
    decoder_.Restore(from->held_bytes, /*at_start=*/false);
    matcher_.Restore(from->held_text);
  }
}

TokenStep OutputProcessor::Next(const float* logits) {
  TokenStep step;
  step.sample = sampler_.Sample(logits);
  ++generated_;
  step.finish = StopAfter(step.sample.token, &step.text);
  finish_ = step.finish;
  return step;
}

FinishReason OutputProcessor::StopAfter(int32_t token, std::string* text) {
  const bool eog = !stop_.ignore_eos && tokenizer_.IsEog(token);
  const bool stop_id =
      std::find(stop_.stop_token_ids.begin(), stop_.stop_token_ids.end(), token) != stop_.stop_token_ids.end();
  FinishReason reason = FinishReason::kNone;
  if (eog || stop_id) {
    reason = FinishReason::kStop;
  } else {
    *text += matcher_.Push(decoder_.Push(token));
    if (matcher_.stopped()) return FinishReason::kStop;  // the text is cut; nothing more is released
    if (generated_ >= stop_.max_tokens) reason = FinishReason::kLength;
  }
  if (reason != FinishReason::kNone) {
    // What was held back is final now.
    *text += matcher_.Push(decoder_.Flush());
    *text += matcher_.Flush();
  }
  return reason;
}

Continuation OutputProcessor::Save(std::span<const int32_t> generated_tokens) const {
  Continuation c;
  c.generated.assign(generated_tokens.begin(), generated_tokens.end());
  c.sampler = sampler_.State();
  c.held_bytes = decoder_.held();
  c.held_text = matcher_.held();
  return c;
}

}  // namespace strata
