#pragma once
// The usage of one API request, built in one place for HTTP and gRPC as its
// choices' events arrive: the prompt and its cache hits counted once (from
// choice 0, as OpenAI counts the prompt once for n > 1), completion tokens
// summed over the choices, the time to the first token of choice 0, and,
// behind a router, the instances that served it (the prefill instance of
// choice 0, every decode instance of every choice).
//
// Thread-safety: none; the caller serializes Add (HTTP: under the request's
// lock; gRPC: the call's thread).

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvcache/tier_kind.h"
#include "scheduler/engine_client.h"
#include "server/openai_protocol.h"

namespace strata::server {

class UsageTally {
 public:
  explicit UsageTally(int choices) : completion_(static_cast<size_t>(choices > 0 ? choices : 0), 0) {}
  // An event of choice `choice` (events of an unknown choice are ignored).
  void Add(int choice, const scheduler::RequestOutput& ev);

  int32_t prompt_tokens() const { return prompt_; }
  int32_t cached_tokens() const { return cached_; }
  int64_t completion_tokens() const;
  // Milliseconds from arrival to choice 0's first token; < 0 before it.
  double ttft_ms() const { return ttft_ms_; }
  // The usage, cached tokens by tier mapped to kinds with `tier_kinds`
  // (Engine::tier_kinds()).
  Usage Make(std::span<const kvcache::TierKind> tier_kinds) const;

 private:
  int32_t prompt_ = 0, cached_ = 0;
  std::vector<int32_t> by_tier_;
  std::vector<int32_t> completion_;  // per choice
  std::string prefill_instance_;                // choice 0's (or the first seen)
  std::vector<std::string> decode_instances_;   // of every choice, each once, in order of appearance
  double ttft_ms_ = -1;
};

}  // namespace strata::server
