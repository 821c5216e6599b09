#pragma once
// Configuration: one YAML file (configs/strata.yaml documents every key);
// command-line flags override it. Values are read by dotted path
// ("kv.block_size"); errors name the key and what was expected.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata {

class Config {
 public:
  Config();  // empty
  ~Config();
  Config(const Config&);
  Config& operator=(const Config&);

  static Result<Config> LoadFile(const std::string& path);
  static Result<Config> Parse(const std::string& yaml_text, const std::string& origin = "<string>");

  bool Has(const std::string& key) const;
  // Each returns `fallback` when the key is absent, an error when present with
  // the wrong type.
  Result<int64_t> GetInt(const std::string& key, int64_t fallback) const;
  Result<double> GetDouble(const std::string& key, double fallback) const;
  Result<bool> GetBool(const std::string& key, bool fallback) const;
  Result<std::string> GetString(const std::string& key, const std::string& fallback) const;
  // Byte sizes: an integer or a string with a binary suffix (512K, 64M, 4G, 1T).
  Result<uint64_t> GetBytes(const std::string& key, uint64_t fallback) const;

  // A sequence of mappings at `key` (e.g. kv.tiers), each element as its own
  // Config whose origin names it ("file.yaml: kv.tiers[1]"). Absent or null:
  // an empty list. Present but not a sequence of mappings: an error naming
  // the key (and the element).
  Result<std::vector<Config>> GetMapList(const std::string& key) const;

  // Every leaf key present, dotted; a sequence is one leaf (its elements are
  // checked by whoever reads them through GetMapList). Lets callers reject
  // unknown keys.
  std::vector<std::string> LeafKeys() const;
  // Error naming the first key not in `known` (dotted leaf paths).
  Status CheckKnownKeys(const std::vector<std::string>& known) const;

  const std::string& origin() const { return origin_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string origin_;
};

// "512K" → 524288, "4G" → 4 GiB, "123" → 123. Binary suffixes K, M, G, T
// (optionally followed by "i"/"iB"/"B").
Result<uint64_t> ParseByteSize(const std::string& text);

}  // namespace strata
