#pragma once
// Why a generated sequence ended: one enum for generation, the engine, the
// simulator and the front ends, rendered to its wire name (OpenAI's
// "finish_reason", gRPC's, metrics' label) only by FinishReasonName.
//
// Thread-safety: plain values.

#include <cstdint>
#include <string_view>

namespace strata {

enum class FinishReason : uint8_t {
  kNone,    // not finished
  kStop,    // EOS, a stop token id or a stop string
  kLength,  // max_tokens (or the context) reached
  kAbort,   // cancelled, deadline passed, engine stopping
  kError,   // failed; the output's status says why
  // Stopped to be continued elsewhere (an engine request's pause_after):
  // the final event carries the continuation. Never shown to API clients.
  kPaused,
};

// "" (kNone), "stop", "length", "abort", "error", "paused".
constexpr std::string_view FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
    case FinishReason::kPaused:
      return "paused";
    case FinishReason::kNone:
      break;
  }
  return "";
}

}  // namespace strata
