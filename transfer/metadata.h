#pragma once
// Cluster membership: which Strata instances exist, their roles and how to
// reach them (DESIGN.md decision 7). Per-block KV events never go here.
//
// Two interchangeable stores behind one client, both speaking the etcd v3
// JSON gateway's subset (POST /v3/lease/grant|keepalive|revoke,
// /v3/kv/put|range|deleterange, keys and values base64):
//   - etcd://HOST:PORT    a real etcd (3.4+);
//   - strata://HOST:PORT  `strata meta` (MetaStore below behind an HTTP
//                         server), so one machine needs no etcd.
// An instance registers under /strata/instances/<name> with a lease of
// --metadata-lease-seconds and keeps it alive; when it dies its entry
// disappears within the lease. When the store was unreachable or lost the
// lease (etcd restarted, a long stall), the keeper grants a new lease and
// puts the entry again: membership recovers by itself.
//
// Thread-safety: MetadataClient and MetaStore may be called from any thread.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"

namespace strata::transfer {

struct InstanceInfo {
  std::string name;               // cluster-unique
  std::string role = "both";      // prefill | decode | both
  std::string incarnation;        // random per process start: a restart under the same name is seen
  std::string http_address;       // host:port of its OpenAI API ("" when none)
  std::string transfer_address;   // host:port of its transfer listener ("" when none)
  std::vector<std::string> transports;
  std::string model_namespace;    // hex digest: instances of one model share blocks
  std::string model;              // the served model name (the API's `model`); a router routes by it
  int64_t registered_unix_ms = 0;
};
std::string InstanceToJson(const InstanceInfo& i);
Result<InstanceInfo> InstanceFromJson(const std::string& text);

// An int64 field of an etcd gateway JSON object (written as a string or a
// number); 0 when absent or malformed. `object` is a nlohmann::json.
template <typename Json>
int64_t GatewayInt64(const Json& object, const char* name) {
  if (!object.is_object() || !object.contains(name)) return 0;
  const auto& v = object[name];
  if (v.is_number_integer()) return v.template get<int64_t>();
  if (v.is_string()) {
    try {
      return std::stoll(v.template get<std::string>());
    } catch (...) {
    }
  }
  return 0;
}

// The bearer token every cluster process derives from the cluster secret
// (--cluster-secret-file) for the calls between them over HTTP (the
// metadata store, the /internal/ routes): hex SHA-256 of a fixed label and
// the secret, so the secret itself never crosses the wire.
std::string ClusterBearer(std::string_view secret);

std::string Base64Encode(std::string_view bytes);
Result<std::string> Base64Decode(std::string_view text);

struct MetadataUrl {
  enum class Kind { kEtcd, kStrata } kind = Kind::kEtcd;
  std::string host;
  int port = 0;
};
// "etcd://HOST:PORT" or "strata://HOST:PORT".
Result<MetadataUrl> ParseMetadataUrl(std::string_view url);

struct MetadataStatus {
  bool registered = false;     // the entry is believed present
  uint64_t registrations = 0;  // grants + puts that succeeded (1 after start; more after recoveries)
  uint64_t failures = 0;       // calls that failed
  std::string last_error;
};

class MetadataClient {
 public:
  // `bearer` (ClusterBearer of the cluster secret; empty = none) is sent
  // as "Authorization: Bearer ..." to a strata:// store (an etcd store has
  // its own authentication).
  static Result<std::unique_ptr<MetadataClient>> Create(const MetadataUrl& url, double call_timeout_s = 2.0,
                                                        std::string bearer = "");
  ~MetadataClient();
  MetadataClient(const MetadataClient&) = delete;
  MetadataClient& operator=(const MetadataClient&) = delete;

  // Registers `self` with a lease of `lease_seconds` (>= 2) and keeps it
  // alive from a background thread (every lease/3). Returns at once even
  // when the store is unreachable (the keeper retries; status() says).
  Status Register(const InstanceInfo& self, int lease_seconds);
  // Stops the keeper and revokes the lease (the entry goes at once). The
  // client cannot register again afterwards.
  Status Deregister();
  // Every registered instance (a fresh range read).
  Result<std::vector<InstanceInfo>> List();
  MetadataStatus status() const;

  // Raw gateway calls (tests and `strata meta` clients).
  Result<int64_t> GrantLease(int ttl_seconds);
  // False when the lease is gone (expired or revoked).
  Result<bool> KeepAlive(int64_t lease);
  Status Put(const std::string& key, const std::string& value, int64_t lease);
  Result<std::map<std::string, std::string>> Range(const std::string& prefix);
  Status RevokeLease(int64_t lease);

 private:
  MetadataClient(MetadataUrl url, double timeout, std::string bearer)
      : url_(std::move(url)), timeout_(timeout), bearer_(std::move(bearer)) {}
  Result<std::string> Call(const std::string& path, const std::string& body);
  void KeeperLoop();
  bool RegisterOnce();

  MetadataUrl url_;
  double timeout_;
  std::string bearer_;
  std::mutex lifecycle_mu_;  // Register / Deregister / destruction (the keeper thread's start and join)
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::optional<InstanceInfo> self_;
  int lease_seconds_ = 10;
  int64_t lease_ = 0;
  MetadataStatus status_;
  std::thread keeper_;
};

inline constexpr const char* kInstancesPrefix = "/strata/instances/";

// The embedded store behind `strata meta`: keys with optional leases that
// expire after their TTL unless kept alive. `now_ms` is injected (tests).
class MetaStore {
 public:
  struct Error {
    int code;  // gRPC-style: 5 = not found, 3 = invalid argument
    std::string message;
  };
  // Answers one gateway request (path and JSON body) with a JSON body, as
  // etcd's gateway does; errors are {"error","message","code"} with an HTTP
  // status (400 or 404) in *http_status.
  std::string Handle(const std::string& path, const std::string& body, int64_t now_ms, int* http_status);
  size_t size(int64_t now_ms);

 private:
  void Expire(int64_t now_ms);
  std::mutex mu_;
  struct Lease {
    int64_t ttl_ms;
    int64_t expires_ms;
  };
  std::map<int64_t, Lease> leases_;
  std::map<std::string, std::pair<std::string, int64_t>> kv_;  // key → (value, lease or 0)
  int64_t next_lease_ = 0x5354524154410001;                       // arbitrary, like etcd's large ids
  int64_t revision_ = 1;
};

}  // namespace strata::transfer
