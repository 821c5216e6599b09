#include "bench/workload.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <random>

#include "bench/trace.h"

namespace strata::bench {

namespace {

// Simple words, so that any tokenizer (byte-level or SentencePiece) turns the
// chat messages into a modest number of tokens.
constexpr std::array<const char*, 48> kWords = {
    "the",   "little", "girl",  "boy",    "dog",   "cat",  "tree",  "park",  "sun",    "ball",  "happy", "big",
    "red",   "blue",   "friend", "played", "saw",   "went", "home",  "said",  "mom",    "bird",  "fish",  "water",
    "car",   "toy",    "box",    "jumped", "ran",   "sky",  "day",   "night", "nice",   "small", "green", "garden",
    "cake",  "smiled", "book",   "school", "flower", "funny", "rain", "hat",   "loved",  "found", "tall",  "road"};

std::string Words(std::mt19937_64& rng, int n) {
  std::uniform_int_distribution<size_t> pick(0, kWords.size() - 1);
  std::string out;
  for (int i = 0; i < n; ++i) {
    if (i > 0) out += ' ';
    out += kWords[pick(rng)];
  }
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  out += '.';
  return out;
}

std::vector<int32_t> Tokens(std::mt19937_64& rng, int n, const WorkloadOptions& o) {
  std::uniform_int_distribution<int32_t> pick(o.first_token_id, o.vocab_size - 1);
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (auto& t : out) t = pick(rng);
  return out;
}

// A fresh stream for (seed, purpose, index), so that changing one knob (e.g.
// the number of sessions) does not change what the other sessions send.
std::mt19937_64 Stream(uint64_t seed, uint64_t purpose, uint64_t index) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(purpose),
                    static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32)};
  return std::mt19937_64(seq);
}

Status Positive(int v, const char* name) {
  if (v < 1) return Status::InvalidArgument(std::string(name) + " must be at least 1, got " + std::to_string(v));
  return Status::Ok();
}

Result<Workload> BuildTrace(const std::string& path, const WorkloadOptions& o) {
  if (o.tokens_per_hash_id < 0)
    return Status::InvalidArgument("--tokens-per-hash-id must be >= 0, got " + std::to_string(o.tokens_per_hash_id));
  STRATA_ASSIGN_OR_RETURN(std::vector<TraceRequest> trace, LoadTrace(path));
  Workload w;
  w.kind = WorkloadKind::kTrace;
  size_t n = trace.size();
  if (o.max_requests > 0) n = std::min(n, static_cast<size_t>(o.max_requests));
  w.sessions.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    ScaledRequest s = ScaleRequest(trace[i], o.tokens_per_hash_id, o.vocab_size, o.first_token_id);
    Turn t;
    t.arrival_s = static_cast<double>(trace[i].timestamp_ms) / 1000.0;
    t.prompt = std::move(s.prompt);
    t.max_tokens = s.output_length;
    t.num_hash_ids = static_cast<int>(trace[i].hash_ids.size());
    w.sessions.push_back(Session{static_cast<int>(i), {std::move(t)}});
  }
  return w;
}

Result<Workload> BuildChat(const WorkloadOptions& o) {
  STRATA_RETURN_IF_ERROR(Positive(o.sessions, "--sessions"));
  STRATA_RETURN_IF_ERROR(Positive(o.turns, "--turns"));
  STRATA_RETURN_IF_ERROR(Positive(o.user_words, "--user-words"));
  STRATA_RETURN_IF_ERROR(Positive(o.chat_max_tokens, "--output-tokens"));
  if (o.think_time_s < 0) return Status::InvalidArgument("--think-time must be >= 0");
  Workload w;
  w.kind = WorkloadKind::kChat;
  w.chat = true;
  auto sys = Stream(o.seed, 1, 0);
  w.system_prompt = "You are a storyteller for children. " + Words(sys, std::max(0, o.system_prompt_words));
  for (int s = 0; s < o.sessions; ++s) {
    auto rng = Stream(o.seed, 2, static_cast<uint64_t>(s));
    Session session{s, {}};
    for (int t = 0; t < o.turns; ++t) {
      Turn turn;
      turn.user_message = Words(rng, o.user_words);
      turn.max_tokens = o.chat_max_tokens;
      turn.think_time_s = t == 0 ? 0 : o.think_time_s;
      session.turns.push_back(std::move(turn));
    }
    w.sessions.push_back(std::move(session));
  }
  return w;
}

Result<Workload> BuildSharedPrefix(const WorkloadOptions& o) {
  STRATA_RETURN_IF_ERROR(Positive(o.documents, "--documents"));
  STRATA_RETURN_IF_ERROR(Positive(o.document_tokens, "--document-tokens"));
  STRATA_RETURN_IF_ERROR(Positive(o.questions, "--questions"));
  STRATA_RETURN_IF_ERROR(Positive(o.question_tokens, "--question-tokens"));
  STRATA_RETURN_IF_ERROR(Positive(o.shared_max_tokens, "--output-tokens"));
  Workload w;
  w.kind = WorkloadKind::kSharedPrefix;
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < o.documents; ++d) {
    auto rng = Stream(o.seed, 3, static_cast<uint64_t>(d));
    docs.push_back(Tokens(rng, o.document_tokens, o));
  }
  // Questions round-robin over the documents, so a document's blocks must
  // survive the other documents' traffic to be hit again.
  int id = 0;
  for (int q = 0; q < o.questions; ++q) {
    for (int d = 0; d < o.documents; ++d) {
      auto rng = Stream(o.seed, 4, static_cast<uint64_t>(q) * 1000003u + static_cast<uint64_t>(d));
      Turn t;
      t.prompt = docs[static_cast<size_t>(d)];
      std::vector<int32_t> question = Tokens(rng, o.question_tokens, o);
      t.prompt.insert(t.prompt.end(), question.begin(), question.end());
      t.max_tokens = o.shared_max_tokens;
      w.sessions.push_back(Session{id++, {std::move(t)}});
    }
  }
  return w;
}

Result<Workload> BuildRandom(const WorkloadOptions& o) {
  STRATA_RETURN_IF_ERROR(Positive(o.requests, "--requests"));
  STRATA_RETURN_IF_ERROR(Positive(o.input_tokens, "--input-tokens"));
  STRATA_RETURN_IF_ERROR(Positive(o.output_tokens, "--output-tokens"));
  if (o.range_ratio < 0 || o.range_ratio >= 1) return Status::InvalidArgument("--range-ratio must be in [0, 1)");
  Workload w;
  w.kind = WorkloadKind::kRandom;
  for (int i = 0; i < o.requests; ++i) {
    auto rng = Stream(o.seed, 5, static_cast<uint64_t>(i));
    auto len = [&](int base) {
      const int lo = std::max(1, static_cast<int>(std::floor(base * (1 - o.range_ratio))));
      const int hi = std::max(lo, static_cast<int>(std::ceil(base * (1 + o.range_ratio))));
      return std::uniform_int_distribution<int>(lo, hi)(rng);
    };
    Turn t;
    const int in = len(o.input_tokens);
    t.max_tokens = len(o.output_tokens);
    t.prompt = Tokens(rng, in, o);
    w.sessions.push_back(Session{i, {std::move(t)}});
  }
  return w;
}

void Truncate(int64_t max_requests, Workload* w) {
  if (max_requests <= 0) return;
  int64_t left = max_requests;
  size_t keep = 0;
  for (; keep < w->sessions.size() && left > 0; ++keep) {
    auto& turns = w->sessions[keep].turns;
    if (static_cast<int64_t>(turns.size()) > left) turns.resize(static_cast<size_t>(left));
    left -= static_cast<int64_t>(turns.size());
  }
  w->sessions.resize(keep);
}

}  // namespace

const char* WorkloadKindName(WorkloadKind kind) {
  switch (kind) {
    case WorkloadKind::kTrace: return "trace";
    case WorkloadKind::kChat: return "chat";
    case WorkloadKind::kSharedPrefix: return "shared-prefix";
    case WorkloadKind::kRandom: return "random";
  }
  return "?";
}

int64_t Workload::num_requests() const {
  int64_t n = 0;
  for (const auto& s : sessions) n += static_cast<int64_t>(s.turns.size());
  return n;
}

Result<Workload> BuildWorkload(const WorkloadOptions& o) {
  if (o.vocab_size < 2 || o.first_token_id < 0 || o.first_token_id >= o.vocab_size)
    return Status::InvalidArgument("token ids need 0 <= first id < vocabulary size; got first id " +
                                   std::to_string(o.first_token_id) + ", vocabulary " + std::to_string(o.vocab_size));
  if (o.max_requests < 0) return Status::InvalidArgument("--max-requests must be >= 0");
  Result<Workload> w = Status::InvalidArgument("unknown workload '" + o.spec +
                                               "' (expected trace:FILE, chat, shared-prefix or random)");
  if (o.spec.starts_with("trace:")) {
    const std::string path = o.spec.substr(6);
    if (path.empty()) return Status::InvalidArgument("trace: needs a file, as in trace:FILE.jsonl");
    w = BuildTrace(path, o);
  } else if (o.spec == "chat") {
    w = BuildChat(o);
  } else if (o.spec == "shared-prefix") {
    w = BuildSharedPrefix(o);
  } else if (o.spec == "random") {
    w = BuildRandom(o);
  }
  if (!w) return w;
  w->spec = o.spec;
  Truncate(o.max_requests, &*w);
  return w;
}

void DropOverContext(int max_model_len, Workload* w) {
  if (max_model_len <= 0 || w->chat) return;
  std::vector<Session> kept;
  kept.reserve(w->sessions.size());
  for (auto& s : w->sessions) {
    std::vector<Turn> turns;
    for (auto& t : s.turns) {
      if (static_cast<int64_t>(t.prompt.size()) + t.max_tokens > max_model_len) {
        ++w->skipped_over_context;
      } else {
        turns.push_back(std::move(t));
      }
    }
    s.turns = std::move(turns);
    if (!s.turns.empty()) kept.push_back(std::move(s));
  }
  w->sessions = std::move(kept);
}

}  // namespace strata::bench
