#include "bench/trace.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/mapped_file.h"

namespace strata::bench {
namespace {

Status LineError(std::string_view source, size_t line, const std::string& what) {
  return Status::InvalidArgument(std::string(source) + ":" + std::to_string(line) + ": " + what);
}

// Reads an integer field; the json's own integer types only (a 1.5 or "3" is
// an error, a 3.0 is not accepted either: traces write plain integers).
Result<int64_t> IntField(const nlohmann::json& obj, const char* name, std::string_view source, size_t line) {
  auto it = obj.find(name);
  if (it == obj.end()) return LineError(source, line, std::string("missing field '") + name + "'");
  if (!it->is_number_integer()) return LineError(source, line, std::string("field '") + name + "' is not an integer");
  if (it->is_number_unsigned()) {
    uint64_t u = it->get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return LineError(source, line, std::string("field '") + name + "' is too large");
    return static_cast<int64_t>(u);
  }
  return it->get<int64_t>();
}

uint64_t SplitMix64Next(uint64_t& state) {
  state += 0x9E3779B97F4A7C15ull;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

Result<std::vector<TraceRequest>> ParseTrace(std::string_view text, std::string_view source) {
  std::vector<TraceRequest> out;
  size_t line_no = 0;
  size_t pos = 0;
  int64_t prev_ts = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;

    nlohmann::json obj = nlohmann::json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
    if (obj.is_discarded()) return LineError(source, line_no, "not valid JSON");
    if (!obj.is_object()) return LineError(source, line_no, "not a JSON object");

    TraceRequest r;
    STRATA_ASSIGN_OR_RETURN(r.timestamp_ms, IntField(obj, "timestamp", source, line_no));
    STRATA_ASSIGN_OR_RETURN(int64_t in_len, IntField(obj, "input_length", source, line_no));
    STRATA_ASSIGN_OR_RETURN(int64_t out_len, IntField(obj, "output_length", source, line_no));
    if (r.timestamp_ms < 0) return LineError(source, line_no, "negative timestamp " + std::to_string(r.timestamp_ms));
    if (in_len < 1 || in_len > INT32_MAX) {
      return LineError(source, line_no, "input_length " + std::to_string(in_len) + " is not in [1, 2^31)");
    }
    if (out_len < 1 || out_len > INT32_MAX) {
      return LineError(source, line_no, "output_length " + std::to_string(out_len) + " is not in [1, 2^31)");
    }
    r.input_length = static_cast<int32_t>(in_len);
    r.output_length = static_cast<int32_t>(out_len);

    auto ids = obj.find("hash_ids");
    if (ids == obj.end()) return LineError(source, line_no, "missing field 'hash_ids'");
    if (!ids->is_array()) return LineError(source, line_no, "field 'hash_ids' is not an array");
    if (ids->empty()) return LineError(source, line_no, "field 'hash_ids' is empty");
    r.hash_ids.reserve(ids->size());
    for (size_t i = 0; i < ids->size(); ++i) {
      const auto& v = (*ids)[i];
      if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
        return LineError(source, line_no, "hash_ids[" + std::to_string(i) + "] is not an integer");
      }
      int64_t id = v.get<int64_t>();
      if (id < 0) return LineError(source, line_no, "hash_ids[" + std::to_string(i) + "] is negative");
      r.hash_ids.push_back(id);
    }
    if (!out.empty() && r.timestamp_ms < prev_ts) {
      return LineError(source, line_no,
                       "timestamp " + std::to_string(r.timestamp_ms) + " is before the previous request's " +
                           std::to_string(prev_ts));
    }
    prev_ts = r.timestamp_ms;
    out.push_back(std::move(r));
  }
  return out;
}

Result<std::vector<TraceRequest>> LoadTrace(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseTrace(text, path);
}

std::vector<int32_t> HashIdTokens(int64_t hash_id, int n, int vocab_size, int first_id) {
  std::vector<int32_t> out;
  if (n <= 0 || vocab_size <= first_id) return out;
  out.reserve(static_cast<size_t>(n));
  // Seeded through one mixing step so that neighbouring ids do not start from
  // neighbouring states.
  uint64_t state = static_cast<uint64_t>(hash_id) * 0xD1B54A32D192ED03ull + 0x2545F4914F6CDD1Dull;
  const uint64_t range = static_cast<uint64_t>(vocab_size - first_id);
  for (int i = 0; i < n; ++i) {
    out.push_back(first_id + static_cast<int32_t>(SplitMix64Next(state) % range));
  }
  return out;
}

int32_t HashIdTokenCount(const TraceRequest& r, size_t index, int tokens_per_hash_id) {
  if (tokens_per_hash_id > 0) return tokens_per_hash_id;
  const size_t k = r.hash_ids.size();
  if (index + 1 < k) return kTraceTokensPerHashId;
  const int64_t rest = static_cast<int64_t>(r.input_length) - static_cast<int64_t>(kTraceTokensPerHashId) * static_cast<int64_t>(k - 1);
  return static_cast<int32_t>(std::max<int64_t>(1, rest));
}

ScaledRequest ScaleRequest(const TraceRequest& r, int tokens_per_hash_id, int vocab_size, int first_id) {
  ScaledRequest out;
  size_t total = 0;
  for (size_t i = 0; i < r.hash_ids.size(); ++i) total += static_cast<size_t>(HashIdTokenCount(r, i, tokens_per_hash_id));
  out.prompt.reserve(total);
  for (size_t i = 0; i < r.hash_ids.size(); ++i) {
    std::vector<int32_t> block = HashIdTokens(r.hash_ids[i], HashIdTokenCount(r, i, tokens_per_hash_id), vocab_size, first_id);
    out.prompt.insert(out.prompt.end(), block.begin(), block.end());
  }
  if (tokens_per_hash_id > 0) {
    const int64_t scaled = (static_cast<int64_t>(r.output_length) * tokens_per_hash_id + kTraceTokensPerHashId - 1) /
                           kTraceTokensPerHashId;
    out.output_length = static_cast<int32_t>(std::max<int64_t>(1, scaled));
  } else {
    out.output_length = std::max<int32_t>(1, r.output_length);
  }
  return out;
}

std::vector<uint32_t> IdealHitIdsPerRequest(const std::vector<TraceRequest>& trace) {
  // A trie of prefix chains: node 0 is the empty prefix; (parent, id) -> child.
  // Exact (no hashing of chains), so two different chains never alias.
  std::map<std::pair<uint64_t, int64_t>, uint64_t> children;
  uint64_t next_node = 1;
  std::vector<uint32_t> hits;
  hits.reserve(trace.size());
  for (const TraceRequest& r : trace) {
    uint64_t node = 0;
    uint32_t hit = 0;
    bool chain_seen = true;
    for (int64_t id : r.hash_ids) {
      auto [it, inserted] = children.try_emplace({node, id}, next_node);
      if (inserted) {
        ++next_node;
        chain_seen = false;  // every longer prefix of this prompt is new too
      }
      if (chain_seen) ++hit;
      node = it->second;
    }
    hits.push_back(hit);
  }
  return hits;
}

IdealHit IdealHitRatio(const std::vector<TraceRequest>& trace) {
  IdealHit h;
  std::vector<uint32_t> per = IdealHitIdsPerRequest(trace);
  for (size_t i = 0; i < trace.size(); ++i) {
    h.hit_ids += per[i];
    h.total_ids += trace[i].hash_ids.size();
  }
  return h;
}

}  // namespace strata::bench
