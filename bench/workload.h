#pragma once
// Workloads of `strata bench run` (issue "strata bench"): what to send, built
// up front and deterministically from a seed, so two runs with the same flags
// send the same requests (only the chat history differs, because it contains
// what the server answered).
//
// A workload is a list of sessions, each a list of turns sent one after the
// other. Single-request workloads (trace, shared-prefix, random) have one turn
// per session; the chat workload has several, and each turn re-sends the
// whole conversation so far (shared system prompt, earlier user messages and
// the server's actual replies) plus a new user message.
//
// Token workloads carry token ids and go to /v1/completions, so the prompt the
// server caches is exactly the one built here; the chat workload carries text
// and goes to /v1/chat/completions.
//
// Thread-safety: the functions are pure; a built Workload is read-only and may
// be shared by threads.

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata::bench {

enum class WorkloadKind { kTrace, kChat, kSharedPrefix, kRandom };
const char* WorkloadKindName(WorkloadKind kind);

struct WorkloadOptions {
  // "trace:FILE", "chat", "shared-prefix" or "random".
  std::string spec;
  uint64_t seed = 1;
  // Token ids are drawn from [first_token_id, vocab_size).
  int vocab_size = 512;
  int first_token_id = 3;  // past <unk>, <s>, </s> of Llama-style vocabularies
  // Keep at most this many requests (turns) in workload order; 0 = all.
  int64_t max_requests = 0;

  // trace:FILE. 0 = real lengths (512 tokens per id); see ScaleRequest.
  int tokens_per_hash_id = 0;

  // chat: sessions × turns; every session shares the system prompt.
  int sessions = 8;
  int turns = 4;
  int system_prompt_words = 60;
  int user_words = 20;
  int chat_max_tokens = 24;
  double think_time_s = 0.5;

  // shared-prefix: `documents` documents of `document_tokens` tokens, each
  // asked `questions` questions of `question_tokens` tokens.
  int documents = 4;
  int document_tokens = 256;
  int questions = 8;
  int question_tokens = 24;
  int shared_max_tokens = 16;

  // random: `requests` prompts of input_tokens ± range_ratio.
  int requests = 64;
  int input_tokens = 128;
  int output_tokens = 32;
  double range_ratio = 0.0;  // lengths uniform in [(1-r)·L, (1+r)·L]
};

struct Turn {
  // Trace arrival offset in seconds (before --time-scale); < 0 when the
  // workload has no timestamps.
  double arrival_s = -1;
  // Pause after the previous turn of the same session finished (chat).
  double think_time_s = 0;
  std::vector<int32_t> prompt;  // token workloads
  std::string user_message;     // chat
  int max_tokens = 16;
  int num_hash_ids = 0;  // trace: ids of this prompt
};

struct Session {
  int id = 0;
  std::vector<Turn> turns;
};

struct Workload {
  WorkloadKind kind = WorkloadKind::kRandom;
  std::string spec;
  bool chat = false;
  std::string system_prompt;  // chat
  std::vector<Session> sessions;
  // Requests dropped before the run because prompt + max_tokens exceed the
  // model's context (DropOverContext).
  int64_t skipped_over_context = 0;

  int64_t num_requests() const;
};

// Builds the workload. Errors: kInvalidArgument (unknown spec, bad knob, a
// trace with a line-numbered parse error), kNotFound / kIoError (trace file).
Result<Workload> BuildWorkload(const WorkloadOptions& options);

// Removes token-prompt turns whose prompt + max_tokens exceed `max_model_len`
// (sessions left empty go too) and adds them to skipped_over_context. Chat
// turns are not known in tokens here; the driver counts the server's
// context-length refusals instead.
void DropOverContext(int max_model_len, Workload* workload);

}  // namespace strata::bench
