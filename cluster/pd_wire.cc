#include "cluster/pd_wire.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace strata::cluster {

using nlohmann::json;
using scheduler::EngineRequest;
using scheduler::RequestOutput;

namespace {

std::string ToHexBytes(const std::string& s) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char c : s) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

int Nibble(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// Reads fields of one object, keeping the first error (named by its path).
class Reader {
 public:
  Reader(const json& j, std::string path, Status* err) : j_(j), path_(std::move(path)), err_(err) {}
  bool Has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  const json& Raw(const char* key) const { return j_[key]; }
  std::string Path(const char* key) const { return path_.empty() ? key : path_ + "." + key; }
  void Fail(const char* key, const std::string& why) const {
    if (err_->ok()) *err_ = Status::InvalidArgument("pd message: '" + Path(key) + "' " + why);
  }
  template <typename T>
  T Int(const char* key, T def = 0) const {
    if (!Has(key)) return def;
    const json& v = j_[key];
    if (!v.is_number_integer()) {
      Fail(key, "is not an integer");
      return def;
    }
    if constexpr (std::is_unsigned_v<T>) {
      if (v.is_number_unsigned()) return static_cast<T>(v.get<uint64_t>());
      if (v.get<int64_t>() < 0) {
        Fail(key, "is negative");
        return def;
      }
    }
    return static_cast<T>(v.get<int64_t>());
  }
  double Num(const char* key, double def) const {
    if (!Has(key)) return def;
    if (!j_[key].is_number()) {
      Fail(key, "is not a number");
      return def;
    }
    return j_[key].get<double>();
  }
  bool Bool(const char* key, bool def = false) const {
    if (!Has(key)) return def;
    if (!j_[key].is_boolean()) {
      Fail(key, "is not a boolean");
      return def;
    }
    return j_[key].get<bool>();
  }
  std::string Str(const char* key) const {
    if (!Has(key)) return {};
    if (!j_[key].is_string()) {
      Fail(key, "is not a string");
      return {};
    }
    return j_[key].get<std::string>();
  }
  std::string HexBytes(const char* key) const {
    const std::string hex = Str(key);
    std::string out;
    if (hex.size() % 2 != 0) Fail(key, "is not hex");
    for (size_t i = 0; i + 1 < hex.size(); i += 2) {
      const int hi = Nibble(hex[i]), lo = Nibble(hex[i + 1]);
      if (hi < 0 || lo < 0) {
        Fail(key, "is not hex");
        return {};
      }
      out.push_back(static_cast<char>(hi * 16 + lo));
    }
    return out;
  }
  template <typename T>
  std::vector<T> Ints(const char* key) const {
    std::vector<T> out;
    if (!Has(key)) return out;
    if (!j_[key].is_array()) {
      Fail(key, "is not an array");
      return out;
    }
    for (const json& v : j_[key]) {
      if (!v.is_number_integer()) {
        Fail(key, "holds a non-integer");
        return {};
      }
      out.push_back(v.is_number_unsigned() ? static_cast<T>(v.get<uint64_t>()) : static_cast<T>(v.get<int64_t>()));
    }
    return out;
  }
  std::vector<std::string> Strs(const char* key) const {
    std::vector<std::string> out;
    if (!Has(key)) return out;
    if (!j_[key].is_array()) {
      Fail(key, "is not an array");
      return out;
    }
    for (const json& v : j_[key]) {
      if (!v.is_string()) {
        Fail(key, "holds a non-string");
        return {};
      }
      out.push_back(v.get<std::string>());
    }
    return out;
  }
  // A nested object ({} when absent).
  Reader Obj(const char* key, const json& empty) const {
    if (Has(key) && !j_[key].is_object()) Fail(key, "is not an object");
    return Reader(Has(key) && j_[key].is_object() ? j_[key] : empty, Path(key), err_);
  }

 private:
  const json& j_;
  std::string path_;
  Status* err_;
};

const json& EmptyObject() {
  static const json e = json::object();
  return e;
}

Result<json> Parse(const std::string& text, const char* what) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument(std::string(what) + ": not a JSON object");
  return j;
}

json Logprob(float v) { return std::isfinite(v) ? json(v) : json(nullptr); }
float LogprobFrom(const json& v) {
  return v.is_number() ? v.get<float>() : -std::numeric_limits<float>::infinity();
}

json SamplingToJson(const SamplingParams& p) {
  json bias = json::array();
  for (const auto& [id, b] : p.logit_bias) bias.push_back({id, b});
  json j = {{"temperature", p.temperature},         {"top_p", p.top_p},
            {"top_k", p.top_k},                     {"min_p", p.min_p},
            {"presence_penalty", p.presence_penalty}, {"frequency_penalty", p.frequency_penalty},
            {"repetition_penalty", p.repetition_penalty}, {"logit_bias", std::move(bias)},
            {"top_logprobs", p.top_logprobs},       {"logprobs", p.logprobs}};
  if (p.seed) j["seed"] = *p.seed;
  return j;
}

SamplingParams SamplingFrom(const Reader& r) {
  SamplingParams p;
  p.temperature = static_cast<float>(r.Num("temperature", p.temperature));
  p.top_p = static_cast<float>(r.Num("top_p", p.top_p));
  p.top_k = r.Int<int>("top_k", p.top_k);
  p.min_p = static_cast<float>(r.Num("min_p", p.min_p));
  if (r.Has("seed")) p.seed = r.Int<uint64_t>("seed");
  p.presence_penalty = static_cast<float>(r.Num("presence_penalty", 0));
  p.frequency_penalty = static_cast<float>(r.Num("frequency_penalty", 0));
  p.repetition_penalty = static_cast<float>(r.Num("repetition_penalty", 1));
  if (r.Has("logit_bias")) {
    const json& b = r.Raw("logit_bias");
    if (!b.is_array()) r.Fail("logit_bias", "is not an array");
    for (const json& e : b.is_array() ? b : json::array()) {
      if (!e.is_array() || e.size() != 2 || !e[0].is_number_integer() || !e[1].is_number()) {
        r.Fail("logit_bias", "holds an entry that is not [id, bias]");
        break;
      }
      p.logit_bias.emplace_back(e[0].get<int32_t>(), e[1].get<float>());
    }
  }
  p.top_logprobs = r.Int<int>("top_logprobs", 0);
  p.logprobs = r.Bool("logprobs");
  return p;
}

json ContinuationToJson(const Continuation& c) {
  json counts = json::array();
  for (const auto& [id, n] : c.sampler.generated_counts) counts.push_back({id, n});
  return {{"generated", c.generated},
          {"sampler",
           {{"seed", c.sampler.seed},
            {"draws", c.sampler.draws},
            {"num_generated", c.sampler.num_generated},
            {"generated_counts", std::move(counts)}}},
          {"held_bytes", ToHexBytes(c.held_bytes)},
          {"held_text", ToHexBytes(c.held_text)}};
}

Continuation ContinuationFrom(const Reader& r) {
  Continuation c;
  c.generated = r.Ints<int32_t>("generated");
  const Reader s = r.Obj("sampler", EmptyObject());
  c.sampler.seed = s.Int<uint64_t>("seed");
  c.sampler.draws = s.Int<uint64_t>("draws");
  c.sampler.num_generated = s.Int<int64_t>("num_generated");
  if (s.Has("generated_counts")) {
    const json& a = s.Raw("generated_counts");
    for (const json& e : a.is_array() ? a : json::array()) {
      if (!e.is_array() || e.size() != 2 || !e[0].is_number_integer() || !e[1].is_number_integer()) {
        s.Fail("generated_counts", "holds an entry that is not [id, count]");
        break;
      }
      c.sampler.generated_counts.emplace_back(e[0].get<int32_t>(), e[1].get<int32_t>());
    }
  }
  c.held_bytes = r.HexBytes("held_bytes");
  c.held_text = r.HexBytes("held_text");
  return c;
}

json EngineRequestJson(const EngineRequest& r) {
  json j = {{"prompt", r.prompt},
            {"max_tokens", r.max_tokens},
            {"sampling", SamplingToJson(r.sampling)},
            {"stop", r.stop},
            {"stop_token_ids", r.stop_token_ids},
            {"ignore_eos", r.ignore_eos},
            {"cache_salt", r.cache_salt},
            {"cache_ttl_seconds", r.cache_ttl_seconds},
            {"priority", r.priority},
            {"pause_after", r.pause_after}};
  if (!r.continuation.empty()) j["continuation"] = ContinuationToJson(r.continuation);
  return j;
}

EngineRequest EngineRequestFrom(const Reader& r) {
  EngineRequest e;
  e.prompt = r.Ints<int32_t>("prompt");
  e.max_tokens = r.Int<int>("max_tokens", e.max_tokens);
  e.sampling = SamplingFrom(r.Obj("sampling", EmptyObject()));
  e.stop = r.Strs("stop");
  e.stop_token_ids = r.Ints<int32_t>("stop_token_ids");
  e.ignore_eos = r.Bool("ignore_eos");
  e.cache_salt = r.Str("cache_salt");
  e.cache_ttl_seconds = r.Num("cache_ttl_seconds", 0);
  e.priority = r.Int<int>("priority", 0);
  e.pause_after = r.Int<int>("pause_after", 0);
  if (r.Has("continuation")) e.continuation = ContinuationFrom(r.Obj("continuation", EmptyObject()));
  return e;
}

std::optional<FinishReason> FinishFromName(const std::string& s) {
  for (FinishReason f : {FinishReason::kNone, FinishReason::kStop, FinishReason::kLength, FinishReason::kAbort,
                         FinishReason::kError, FinishReason::kPaused})
    if (FinishReasonName(f) == s) return f;
  return std::nullopt;
}

json OutputJson(const RequestOutput& o) {
  json lps = json::array();
  for (const SampleResult& s : o.logprobs) {
    json top = json::array();
    for (const TokenLogprob& t : s.top) top.push_back({t.id, Logprob(t.logprob)});
    lps.push_back({{"token", s.token}, {"logprob", Logprob(s.logprob)}, {"top", std::move(top)}});
  }
  json j = {{"token_ids", o.token_ids},
            {"text", o.text},
            {"logprobs", std::move(lps)},
            {"finished", o.finished},
            {"finish_reason", std::string(FinishReasonName(o.finish_reason))},
            {"prompt_tokens", o.prompt_tokens},
            {"completion_tokens", o.completion_tokens},
            {"cached_tokens", o.cached_tokens},
            {"cached_tokens_by_tier", o.cached_tokens_by_tier},
            {"preemptions", o.preemptions}};
  if (!o.status.ok())
    j["status"] = {{"code", static_cast<int>(o.status.code())}, {"message", o.status.message()}};
  if (o.continuation) j["continuation"] = ContinuationToJson(*o.continuation);
  return j;
}

RequestOutput OutputFrom(const Reader& r) {
  RequestOutput o;
  o.token_ids = r.Ints<int32_t>("token_ids");
  o.text = r.Str("text");
  if (r.Has("logprobs")) {
    const json& a = r.Raw("logprobs");
    for (const json& e : a.is_array() ? a : json::array()) {
      if (!e.is_object() || !e.contains("token") || !e["token"].is_number_integer()) {
        r.Fail("logprobs", "holds an entry without a token");
        break;
      }
      SampleResult s;
      s.token = e["token"].get<int32_t>();
      s.logprob = LogprobFrom(e.value("logprob", json(nullptr)));
      for (const json& t : e.value("top", json::array()))
        if (t.is_array() && t.size() == 2 && t[0].is_number_integer())
          s.top.push_back({t[0].get<int32_t>(), LogprobFrom(t[1])});
      o.logprobs.push_back(std::move(s));
    }
  }
  o.finished = r.Bool("finished");
  const std::string reason = r.Str("finish_reason");
  if (auto f = FinishFromName(reason)) {
    o.finish_reason = *f;
  } else {
    r.Fail("finish_reason", "is not a finish reason: '" + reason + "'");
  }
  o.prompt_tokens = r.Int<int32_t>("prompt_tokens");
  o.completion_tokens = r.Int<int32_t>("completion_tokens");
  o.cached_tokens = r.Int<int32_t>("cached_tokens");
  o.cached_tokens_by_tier = r.Ints<int32_t>("cached_tokens_by_tier");
  o.preemptions = r.Int<int32_t>("preemptions");
  if (r.Has("status")) {
    const Reader s = r.Obj("status", EmptyObject());
    const int code = s.Int<int>("code");
    if (code < 0 || code > static_cast<int>(StatusCode::kDeadlineExceeded)) s.Fail("code", "is not a status code");
    o.status = Status(static_cast<StatusCode>(code), s.Str("message"));
  }
  if (r.Has("continuation")) o.continuation = ContinuationFrom(r.Obj("continuation", EmptyObject()));
  return o;
}

json ReserveReplyJson(const ReserveReply& r) {
  return {{"id", r.id},         {"held_blocks", r.held_blocks}, {"blocks", r.blocks},
          {"block_bytes", r.block_bytes}, {"grants", r.grants}, {"transfer", r.transfer}};
}

ReserveReply ReserveReplyFrom(const Reader& r) {
  ReserveReply p;
  p.id = r.Int<uint64_t>("id");
  p.held_blocks = r.Int<int32_t>("held_blocks");
  p.blocks = r.Int<int32_t>("blocks");
  p.block_bytes = r.Int<uint64_t>("block_bytes");
  p.grants = r.Ints<uint64_t>("grants");
  p.transfer = r.Str("transfer");
  if (p.held_blocks > p.blocks || p.grants.size() != static_cast<size_t>(p.blocks - p.held_blocks))
    r.Fail("grants", "does not hold one grant per block to write");
  return p;
}

// Parses `text` as an object and reads it with `read`, failing on the first bad field.
template <typename T, typename F>
Result<T> Decode(const std::string& text, const char* what, F read) {
  STRATA_ASSIGN_OR_RETURN(json j, Parse(text, what));
  Status err;
  T out = read(Reader(j, "", &err));
  if (!err.ok()) return err;
  return out;
}

}  // namespace

std::string EngineRequestToJson(const EngineRequest& r) { return EngineRequestJson(r).dump(); }
Result<EngineRequest> EngineRequestFromJson(const std::string& text) {
  return Decode<EngineRequest>(text, "engine request", EngineRequestFrom);
}

std::string RequestOutputToJson(const RequestOutput& o) { return OutputJson(o).dump(); }
Result<RequestOutput> RequestOutputFromJson(const std::string& text) {
  return Decode<RequestOutput>(text, "request output", OutputFrom);
}

std::string ReserveRequestToJson(const ReserveRequest& r) {
  return json{{"id", r.id}, {"prompt", r.prompt}, {"cache_salt", r.cache_salt}, {"lease_ms", r.lease_ms},
              {"grantee", r.grantee}}
      .dump();
}
Result<ReserveRequest> ReserveRequestFromJson(const std::string& text) {
  return Decode<ReserveRequest>(text, "reserve request", [](const Reader& r) {
    ReserveRequest q;
    q.id = r.Int<uint64_t>("id");
    q.prompt = r.Ints<int32_t>("prompt");
    q.cache_salt = r.Str("cache_salt");
    q.lease_ms = r.Int<int64_t>("lease_ms");
    q.grantee = r.Str("grantee");
    if (q.prompt.empty()) r.Fail("prompt", "is empty");
    if (q.lease_ms <= 0) r.Fail("lease_ms", "must be positive");
    if (q.grantee.empty()) r.Fail("grantee", "is empty");
    return q;
  });
}

std::string ReserveReplyToJson(const ReserveReply& r) { return ReserveReplyJson(r).dump(); }
Result<ReserveReply> ReserveReplyFromJson(const std::string& text) {
  return Decode<ReserveReply>(text, "reserve reply", ReserveReplyFrom);
}

std::string PrefillRequestToJson(const PrefillRequest& r) {
  json j{{"request", EngineRequestJson(r.request)}, {"decode", ReserveReplyJson(r.decode)}};
  if (r.grants_key != 0) j["grants_key"] = r.grants_key;
  return j.dump();
}
Result<PrefillRequest> PrefillRequestFromJson(const std::string& text) {
  return Decode<PrefillRequest>(text, "prefill request", [](const Reader& r) {
    PrefillRequest q;
    q.request = EngineRequestFrom(r.Obj("request", EmptyObject()));
    q.decode = ReserveReplyFrom(r.Obj("decode", EmptyObject()));
    q.grants_key = r.Int<uint64_t>("grants_key");
    return q;
  });
}

std::string GrantsMessageToJson(const GrantsMessage& m) {
  json j{{"key", m.key}};
  if (m.decode) j["decode"] = ReserveReplyJson(*m.decode);
  return j.dump();
}
Result<GrantsMessage> GrantsMessageFromJson(const std::string& text) {
  return Decode<GrantsMessage>(text, "grants message", [](const Reader& r) {
    GrantsMessage m;
    m.key = r.Int<uint64_t>("key");
    if (r.Has("decode")) m.decode = ReserveReplyFrom(r.Obj("decode", EmptyObject()));
    return m;
  });
}

std::string PrefillReplyToJson(const PrefillReply& r) {
  return json{{"output", OutputJson(r.output)},
              {"blocks_written", r.blocks_written},
              {"checksums", r.checksums},
              {"tier_kinds", r.tier_kinds}}
      .dump();
}
Result<PrefillReply> PrefillReplyFromJson(const std::string& text) {
  return Decode<PrefillReply>(text, "prefill reply", [](const Reader& r) {
    PrefillReply p;
    p.output = OutputFrom(r.Obj("output", EmptyObject()));
    p.blocks_written = r.Int<int32_t>("blocks_written");
    p.checksums = r.Ints<uint64_t>("checksums");
    p.tier_kinds = r.Strs("tier_kinds");
    return p;
  });
}

std::string DecodeRequestToJson(const DecodeRequest& r) {
  return json{{"id", r.id}, {"filled", r.filled}, {"checksums", r.checksums}, {"request", EngineRequestJson(r.request)}}
      .dump();
}
Result<DecodeRequest> DecodeRequestFromJson(const std::string& text) {
  return Decode<DecodeRequest>(text, "decode request", [](const Reader& r) {
    DecodeRequest q;
    q.id = r.Int<uint64_t>("id");
    q.filled = r.Int<int32_t>("filled");
    q.checksums = r.Ints<uint64_t>("checksums");
    q.request = EngineRequestFrom(r.Obj("request", EmptyObject()));
    if (q.filled < 0) r.Fail("filled", "is negative");
    return q;
  });
}

std::string LookupRequestToJson(const LookupRequest& r) {
  return json{{"prompt", r.prompt}, {"cache_salt", r.cache_salt}}.dump();
}
Result<LookupRequest> LookupRequestFromJson(const std::string& text) {
  return Decode<LookupRequest>(text, "lookup request", [](const Reader& r) {
    LookupRequest q;
    q.prompt = r.Ints<int32_t>("prompt");
    q.cache_salt = r.Str("cache_salt");
    if (q.prompt.empty()) r.Fail("prompt", "is empty");
    return q;
  });
}

std::string LookupReplyToJson(const LookupReply& r) {
  return json{{"cached_tokens", r.cached_tokens},
              {"device_cached_tokens", r.device_cached_tokens},
              {"pending_prefill_tokens", r.pending_prefill_tokens},
              {"prefill_tokens_per_s", r.prefill_tokens_per_s},
              {"decode_step_seconds", r.decode_step_seconds},
              {"running", r.running},
              {"waiting", r.waiting},
              {"load_seconds", r.load_seconds},
              {"step_elapsed_seconds", r.step_elapsed_seconds},
              {"device_free_tokens", r.device_free_tokens},
              {"device_tokens", r.device_tokens}}
      .dump();
}
Result<LookupReply> LookupReplyFromJson(const std::string& text) {
  return Decode<LookupReply>(text, "lookup reply", [](const Reader& r) {
    LookupReply a;
    a.cached_tokens = r.Int<int32_t>("cached_tokens");
    a.device_cached_tokens = r.Int<int32_t>("device_cached_tokens");
    a.pending_prefill_tokens = r.Int<int64_t>("pending_prefill_tokens");
    a.prefill_tokens_per_s = r.Num("prefill_tokens_per_s", 0);
    a.decode_step_seconds = r.Num("decode_step_seconds", 0);
    a.running = r.Int<int>("running");
    a.waiting = r.Int<int>("waiting");
    a.load_seconds = r.Num("load_seconds", 0);
    a.step_elapsed_seconds = r.Num("step_elapsed_seconds", 0);
    a.device_free_tokens = r.Int<int64_t>("device_free_tokens");
    a.device_tokens = r.Int<int64_t>("device_tokens");
    return a;
  });
}

std::string EngineStatusToJson(const scheduler::EngineStats& s) {
  json tiers = json::array();
  for (const scheduler::TierUsage& t : s.tiers) {
    tiers.push_back({{"name", t.name},
                     {"kind", std::string(kvcache::TierKindName(t.kind))},
                     {"capacity_bytes", t.capacity_bytes},
                     {"used_bytes", t.used_bytes},
                     {"usage_ratio", t.usage_ratio}});
  }
  uint64_t finished = 0;
  for (const auto& [reason, n] : s.finished_by_reason) finished += n;
  return json{{"running", s.num_running},
              {"waiting", s.num_waiting},
              {"draining", s.draining},
              {"finished", finished},
              {"pending_prefill_tokens", s.pending_prefill_tokens},
              {"prefill_tokens_per_s", s.prefill_tokens_per_s},
              {"decode_step_seconds", s.decode_step_seconds},
              {"calibrated_prefill_tokens_per_s", s.calibrated_prefill_tokens_per_s},
              {"calibrated_decode_step_seconds", s.calibrated_decode_step_seconds},
              {"device_blocks", s.kv.device_pool.num_blocks},
              {"device_blocks_in_use", s.kv.device_pool.in_use},
              {"device_blocks_cached", s.kv.device_pool.cached},
              {"tiers", tiers}}
      .dump();
}

}  // namespace strata::cluster
