#include "transfer/metadata.h"

#include <nlohmann/json.hpp>

#include "common/http_client.h"
#include "common/logging.h"
#include "common/sha256.h"
#include "transfer/wire.h"

namespace strata::transfer {

using nlohmann::json;

namespace {
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The key just past every key with this prefix (etcd's range_end).
std::string PrefixEnd(std::string p) {
  while (!p.empty()) {
    unsigned char c = static_cast<unsigned char>(p.back());
    if (c < 0xff) {
      p.back() = static_cast<char>(c + 1);
      return p;
    }
    p.pop_back();
  }
  return std::string(1, '\0');
}
}  // namespace

std::string Base64Encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i + 1 == in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

Result<std::string> Base64Decode(std::string_view in) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  while (!in.empty() && in.back() == '=') in.remove_suffix(1);
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v = val(c);
    if (v < 0) return Status::InvalidArgument("not base64");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

std::string InstanceToJson(const InstanceInfo& i) {
  return json{{"name", i.name},
              {"role", i.role},
              {"incarnation", i.incarnation},
              {"http_address", i.http_address},
              {"transfer_address", i.transfer_address},
              {"transports", i.transports},
              {"model_namespace", i.model_namespace},
              {"model", i.model},
              {"registered_unix_ms", i.registered_unix_ms}}
      .dump();
}

Result<InstanceInfo> InstanceFromJson(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return Status::Corrupt("instance entry is not a JSON object");
  InstanceInfo i;
  try {
    i.name = j.value("name", "");
    i.role = j.value("role", "both");
    i.incarnation = j.value("incarnation", "");
    i.http_address = j.value("http_address", "");
    i.transfer_address = j.value("transfer_address", "");
    i.transports = j.value("transports", std::vector<std::string>{});
    i.model_namespace = j.value("model_namespace", "");
    i.model = j.value("model", "");
    i.registered_unix_ms = j.value("registered_unix_ms", int64_t{0});
  } catch (const std::exception& e) {
    return Status::Corrupt(std::string("instance entry: ") + e.what());
  }
  if (i.name.empty()) return Status::Corrupt("instance entry without a name");
  return i;
}

Result<MetadataUrl> ParseMetadataUrl(std::string_view url) {
  MetadataUrl u;
  std::string_view rest;
  if (url.rfind("etcd://", 0) == 0) {
    rest = url.substr(7);
  } else if (url.rfind("strata://", 0) == 0) {
    u.kind = MetadataUrl::Kind::kStrata;
    rest = url.substr(9);
  } else {
    return Status::InvalidArgument("metadata URL '" + std::string(url) + "': expected etcd://HOST:PORT or strata://HOST:PORT");
  }
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  auto hp = SplitHostPort(rest);
  if (!hp) return Status::InvalidArgument("metadata URL '" + std::string(url) + "': " + hp.error().message());
  u.host = hp->first;
  u.port = hp->second;
  return u;
}

Result<std::unique_ptr<MetadataClient>> MetadataClient::Create(const MetadataUrl& url, double timeout,
                                                              std::string bearer) {
  return std::unique_ptr<MetadataClient>(new MetadataClient(url, timeout, std::move(bearer)));
}

std::string ClusterBearer(std::string_view secret) {
  std::string text = "strata cluster bearer v1\n";
  text.append(secret);
  return ToHex(Sha256Of(text.data(), text.size()));
}

MetadataClient::~MetadataClient() {
  std::lock_guard life(lifecycle_mu_);
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (keeper_.joinable()) keeper_.join();
}

Result<std::string> MetadataClient::Call(const std::string& path, const std::string& body) {
  HeaderList headers{{"Content-Type", "application/json"}};
  if (!bearer_.empty() && url_.kind == MetadataUrl::Kind::kStrata) headers.emplace_back("Authorization", "Bearer " + bearer_);
  auto r = HttpCall(url_.host, url_.port, "POST", path, body, headers, timeout_);
  std::string where = "metadata store " + url_.host + ":" + std::to_string(url_.port) + path;
  if (!r) return Status::Unavailable(where + ": " + r.error().message());
  json j = json::parse(r->body, nullptr, false);
  // etcd 3.4's gateway: {"error","message","code"}; newer ones drop "error".
  if (j.is_object() && (j.contains("error") || (j.contains("code") && j.contains("message")))) {
    int code = j.value("code", 2);
    std::string msg = j.contains("message") && j["message"].is_string() ? j["message"].get<std::string>() : "error";
    return Status(code == 5 ? StatusCode::kNotFound : StatusCode::kUnavailable, where + ": " + msg);
  }
  if (r->status != 200 || !j.is_object()) {
    return Status::Unavailable(where + ": HTTP " + std::to_string(r->status) + " " + r->body.substr(0, 200));
  }
  return r->body;
}

Result<int64_t> MetadataClient::GrantLease(int ttl) {
  auto r = Call("/v3/lease/grant", json{{"TTL", ttl}}.dump());
  if (!r) return r.error();
  int64_t id = GatewayInt64(json::parse(*r), "ID");
  if (id == 0) return Status::Unavailable("metadata store granted no lease");
  return id;
}

Result<bool> MetadataClient::KeepAlive(int64_t lease) {
  auto r = Call("/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}.dump());
  if (!r) return r.error().code() == StatusCode::kNotFound ? Result<bool>(false) : Result<bool>(r.error());
  json j = json::parse(*r);
  const json& res = j.contains("result") ? j["result"] : j;
  return GatewayInt64(res, "TTL") > 0;
}

Status MetadataClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  json body{{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  auto r = Call("/v3/kv/put", body.dump());
  return r ? Status::Ok() : r.error();
}

Result<std::map<std::string, std::string>> MetadataClient::Range(const std::string& prefix) {
  auto r = Call("/v3/kv/range",
                json{{"key", Base64Encode(prefix)}, {"range_end", Base64Encode(PrefixEnd(prefix))}}.dump());
  if (!r) return r.error();
  json j = json::parse(*r);
  std::map<std::string, std::string> out;
  if (j.contains("kvs") && j["kvs"].is_array()) {
    for (const auto& kv : j["kvs"]) {
      auto k = Base64Decode(kv.value("key", ""));
      auto v = Base64Decode(kv.value("value", ""));
      if (k && v) out[*k] = *v;
    }
  }
  return out;
}

Status MetadataClient::RevokeLease(int64_t lease) {
  auto r = Call("/v3/lease/revoke", json{{"ID", std::to_string(lease)}}.dump());
  return r ? Status::Ok() : r.error();
}

Result<std::vector<InstanceInfo>> MetadataClient::List() {
  auto r = Range(kInstancesPrefix);
  if (!r) return r.error();
  std::vector<InstanceInfo> out;
  for (const auto& [k, v] : *r) {
    auto i = InstanceFromJson(v);
    if (i) out.push_back(std::move(*i));
  }
  return out;
}

bool MetadataClient::RegisterOnce() {
  InstanceInfo self;
  int ttl;
  {
    std::lock_guard lock(mu_);
    self = *self_;
    ttl = lease_seconds_;
  }
  auto lease = GrantLease(ttl);
  Status s = lease ? Put(kInstancesPrefix + self.name, InstanceToJson(self), *lease) : lease.error();
  bool stopping;
  {
    std::lock_guard lock(mu_);
    stopping = stop_;
  }
  if (lease && (!s.ok() || stopping)) {
    (void)RevokeLease(*lease);  // a put that failed, or Deregister came meanwhile: leave nothing behind
  }
  std::lock_guard lock(mu_);
  if (stopping) return false;
  if (!s.ok()) {
    status_.failures++;
    status_.registered = false;
    status_.last_error = s.message();
    return false;
  }
  lease_ = *lease;
  status_.registered = true;
  status_.registrations++;
  return true;
}

Status MetadataClient::Register(const InstanceInfo& self, int lease_seconds) {
  if (self.name.empty()) return Status::InvalidArgument("an instance needs a name to register");
  if (lease_seconds < 2) return Status::InvalidArgument("--metadata-lease-seconds must be at least 2");
  std::lock_guard life(lifecycle_mu_);
  {
    std::lock_guard lock(mu_);
    if (stop_) return Status::InvalidArgument("this metadata client was deregistered; make a new one");
    if (self_) return Status::InvalidArgument("already registered");
    self_ = self;
    if (self_->registered_unix_ms == 0) self_->registered_unix_ms = NowUnixMs();
    lease_seconds_ = lease_seconds;
  }
  if (!RegisterOnce()) {
    STRATA_LOG_WARN("metadata: cannot register '{}' yet ({}); retrying in the background", self.name,
                    status().last_error);
  }
  keeper_ = std::thread([this] { KeeperLoop(); });
  return Status::Ok();
}

void MetadataClient::KeeperLoop() {
  while (true) {
    int64_t lease;
    bool registered;
    {
      std::unique_lock lock(mu_);
      auto period = std::chrono::milliseconds(lease_seconds_ * 1000 / 3);
      if (!status_.registered) period = std::min(period, std::chrono::milliseconds(500));
      cv_.wait_for(lock, period, [&] { return stop_; });
      if (stop_) return;
      lease = lease_;
      registered = status_.registered;
    }
    if (!registered) {
      if (RegisterOnce()) STRATA_LOG_INFO("metadata: registered again");
      continue;
    }
    auto alive = KeepAlive(lease);
    if (alive && *alive) continue;
    std::string why = alive ? "lease lost" : alive.error().message();
    {
      std::lock_guard lock(mu_);
      status_.failures++;
      status_.last_error = why;
    }
    // Unreachable: keep trying to keep this lease (it may outlive the
    // outage). Gone: grant a new one and put the entry again.
    if (alive) {
      STRATA_LOG_WARN("metadata: {}; registering again", why);
      {
        std::lock_guard lock(mu_);
        status_.registered = false;
      }
      RegisterOnce();
    }
  }
}

Status MetadataClient::Deregister() {
  std::lock_guard life(lifecycle_mu_);
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (keeper_.joinable()) keeper_.join();
  int64_t lease;
  {
    // Read after the keeper stopped: it may have re-registered meanwhile.
    std::lock_guard lock(mu_);
    status_.registered = false;
    lease = lease_;
    lease_ = 0;
  }
  return lease != 0 ? RevokeLease(lease) : Status::Ok();
}

MetadataStatus MetadataClient::status() const {
  std::lock_guard lock(mu_);
  return status_;
}

}  // namespace strata::transfer
