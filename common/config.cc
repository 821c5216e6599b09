#include "common/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <limits>
#include <sstream>

namespace strata {

struct Config::Impl {
  YAML::Node root;
};

Config::Config() : impl_(std::make_unique<Impl>()) {}
Config::~Config() = default;
Config::Config(const Config& o) : impl_(std::make_unique<Impl>(*o.impl_)), origin_(o.origin_) {}
Config& Config::operator=(const Config& o) {
  if (this != &o) {
    impl_ = std::make_unique<Impl>(*o.impl_);
    origin_ = o.origin_;
  }
  return *this;
}

Result<Config> Config::Parse(const std::string& yaml_text, const std::string& origin) {
  Config c;
  c.origin_ = origin;
  try {
    c.impl_->root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(origin + ": invalid YAML: " + e.what());
  }
  if (c.impl_->root && !c.impl_->root.IsNull() && !c.impl_->root.IsMap()) {
    return Status::InvalidArgument(origin + ": top level must be a mapping of keys");
  }
  return c;
}

Result<Config> Config::LoadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound("config file '" + path + "' cannot be opened");
  std::stringstream ss;
  ss << in.rdbuf();
  return Parse(ss.str(), path);
}

namespace {

// Walks a dotted path; returns an undefined node when absent.
YAML::Node Lookup(const YAML::Node& root, const std::string& key) {
  YAML::Node cur = YAML::Clone(root);
  size_t start = 0;
  while (start <= key.size()) {
    size_t dot = key.find('.', start);
    std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!cur.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    YAML::Node next = cur[part];
    if (!next) return YAML::Node(YAML::NodeType::Undefined);
    cur = next;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

void CollectLeaves(const YAML::Node& n, const std::string& prefix, std::vector<std::string>* out) {
  if (n.IsMap()) {
    for (const auto& kv : n) {
      std::string k = kv.first.as<std::string>();
      CollectLeaves(kv.second, prefix.empty() ? k : prefix + "." + k, out);
    }
  } else {
    out->push_back(prefix);
  }
}

}  // namespace

bool Config::Has(const std::string& key) const {
  YAML::Node n = Lookup(impl_->root, key);
  return n.IsDefined() && !n.IsNull();
}

template <typename T>
static Result<T> GetAs(const YAML::Node& root, const std::string& origin, const std::string& key,
                       T fallback, const char* what) {
  YAML::Node n = Lookup(root, key);
  if (!n.IsDefined() || n.IsNull()) return fallback;
  if (!n.IsScalar()) return Status::InvalidArgument(origin + ": key '" + key + "' must be " + what);
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    return Status::InvalidArgument(origin + ": key '" + key + "' must be " + what + ", got '" +
                                   n.Scalar() + "'");
  }
}

Result<int64_t> Config::GetInt(const std::string& key, int64_t fallback) const {
  return GetAs<int64_t>(impl_->root, origin_, key, fallback, "an integer");
}
Result<double> Config::GetDouble(const std::string& key, double fallback) const {
  return GetAs<double>(impl_->root, origin_, key, fallback, "a number");
}
Result<bool> Config::GetBool(const std::string& key, bool fallback) const {
  return GetAs<bool>(impl_->root, origin_, key, fallback, "true or false");
}
Result<std::string> Config::GetString(const std::string& key, const std::string& fallback) const {
  return GetAs<std::string>(impl_->root, origin_, key, fallback, "a string");
}

Result<uint64_t> Config::GetBytes(const std::string& key, uint64_t fallback) const {
  YAML::Node n = Lookup(impl_->root, key);
  if (!n.IsDefined() || n.IsNull()) return fallback;
  if (!n.IsScalar()) return Status::InvalidArgument(origin_ + ": key '" + key + "' must be a size");
  auto r = ParseByteSize(n.Scalar());
  if (!r) return r.error().WithContext(origin_ + ": key '" + key + "'");
  return r;
}

Result<std::vector<Config>> Config::GetMapList(const std::string& key) const {
  std::vector<Config> out;
  YAML::Node n = Lookup(impl_->root, key);
  if (!n.IsDefined() || n.IsNull()) return out;
  if (!n.IsSequence()) return Status::InvalidArgument(origin_ + ": key '" + key + "' must be a list of mappings");
  for (size_t i = 0; i < n.size(); ++i) {
    const std::string where = key + "[" + std::to_string(i) + "]";
    if (!n[i].IsMap()) return Status::InvalidArgument(origin_ + ": " + where + " must be a mapping of keys");
    Config c;
    c.impl_->root = YAML::Clone(n[i]);
    c.origin_ = origin_ + ": " + where;
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<std::string> Config::LeafKeys() const {
  std::vector<std::string> out;
  if (impl_->root && impl_->root.IsMap()) CollectLeaves(impl_->root, "", &out);
  return out;
}

Status Config::CheckKnownKeys(const std::vector<std::string>& known) const {
  for (const auto& k : LeafKeys()) {
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      return Status::InvalidArgument(origin_ + ": unknown key '" + k + "'");
    }
  }
  return Status::Ok();
}

Result<uint64_t> ParseByteSize(const std::string& text) {
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) s.push_back(c);
  if (s.empty()) return Status::InvalidArgument("empty size");
  size_t i = 0;
  uint64_t v = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    uint64_t d = static_cast<uint64_t>(s[i] - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10)
      return Status::InvalidArgument("size '" + text + "' is too large");
    v = v * 10 + d;
    ++i;
  }
  if (i == 0) return Status::InvalidArgument("size '" + text + "' must start with a number");
  std::string suf = s.substr(i);
  for (auto& c : suf) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = 0;
  if (suf.empty() || suf == "B") shift = 0;
  else if (suf == "K" || suf == "KI" || suf == "KIB" || suf == "KB") shift = 10;
  else if (suf == "M" || suf == "MI" || suf == "MIB" || suf == "MB") shift = 20;
  else if (suf == "G" || suf == "GI" || suf == "GIB" || suf == "GB") shift = 30;
  else if (suf == "T" || suf == "TI" || suf == "TIB" || suf == "TB") shift = 40;
  else return Status::InvalidArgument("size '" + text + "' has unknown suffix (use K, M, G or T)");
  if (shift > 0 && v > (std::numeric_limits<uint64_t>::max() >> shift))
    return Status::InvalidArgument("size '" + text + "' is too large");
  return v << shift;
}

}  // namespace strata
