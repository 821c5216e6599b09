// MetaStore: the embedded metadata store behind `strata meta`, answering the
// etcd v3 JSON gateway's subset the MetadataClient uses.
#include <nlohmann/json.hpp>

#include "transfer/metadata.h"

namespace strata::transfer {

using nlohmann::json;


void MetaStore::Expire(int64_t now) {
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expires_ms <= now) {
      int64_t id = it->first;
      for (auto kv = kv_.begin(); kv != kv_.end();) {
        kv = kv->second.second == id ? kv_.erase(kv) : std::next(kv);
      }
      it = leases_.erase(it);
      ++revision_;
    } else {
      ++it;
    }
  }
}

size_t MetaStore::size(int64_t now_ms) {
  std::lock_guard lock(mu_);
  Expire(now_ms);
  return kv_.size();
}

std::string MetaStore::Handle(const std::string& path, const std::string& body, int64_t now, int* http_status) {
  std::lock_guard lock(mu_);
  Expire(now);
  *http_status = 200;
  auto error = [&](int code, const std::string& msg) {
    *http_status = code == 5 ? 404 : 400;
    return json{{"error", msg}, {"message", msg}, {"code", code}}.dump();
  };
  json req = json::parse(body, nullptr, false);
  if (!req.is_object()) return error(3, "request body is not a JSON object");
  json header{{"revision", std::to_string(revision_)}};
  auto decode = [&](const char* field, std::string* out) -> bool {
    auto d = Base64Decode(req.value(field, ""));
    if (!d) return false;
    *out = std::move(*d);
    return true;
  };
  if (path == "/v3/lease/grant") {
    int64_t ttl = std::max<int64_t>(GatewayInt64(req, "TTL"), 2);
    int64_t id = next_lease_++;
    leases_[id] = Lease{ttl * 1000, now + ttl * 1000};
    return json{{"header", header}, {"ID", std::to_string(id)}, {"TTL", std::to_string(ttl)}}.dump();
  }
  if (path == "/v3/lease/keepalive") {
    int64_t id = GatewayInt64(req, "ID");
    auto it = leases_.find(id);
    json result{{"header", header}, {"ID", std::to_string(id)}};
    if (it != leases_.end()) {
      it->second.expires_ms = now + it->second.ttl_ms;
      result["TTL"] = std::to_string(it->second.ttl_ms / 1000);
    }
    return json{{"result", result}}.dump();
  }
  if (path == "/v3/lease/revoke") {
    int64_t id = GatewayInt64(req, "ID");
    auto it = leases_.find(id);
    if (it == leases_.end()) return error(5, "etcdserver: requested lease not found");
    it->second.expires_ms = 0;
    Expire(now);
    return json{{"header", header}}.dump();
  }
  if (path == "/v3/kv/put") {
    std::string key, value;
    if (!decode("key", &key) || !decode("value", &value) || key.empty()) return error(3, "bad key or value");
    int64_t lease = GatewayInt64(req, "lease");
    if (lease != 0 && !leases_.count(lease)) return error(5, "etcdserver: requested lease not found");
    kv_[key] = {value, lease};
    ++revision_;
    return json{{"header", json{{"revision", std::to_string(revision_)}}}}.dump();
  }
  if (path == "/v3/kv/range" || path == "/v3/kv/deleterange") {
    std::string key, end;
    if (!decode("key", &key) || !decode("range_end", &end)) return error(3, "bad key or range_end");
    // etcd: no range_end = the key alone; "\0" = every key >= key.
    auto in = [&](const std::string& k) {
      if (end.empty()) return k == key;
      if (end == std::string(1, '\0')) return k >= key;
      return k >= key && k < end;
    };
    json kvs = json::array();
    int64_t n = 0;
    for (auto it = kv_.begin(); it != kv_.end();) {
      if (!in(it->first)) {
        ++it;
        continue;
      }
      ++n;
      if (path == "/v3/kv/range") {
        json e{{"key", Base64Encode(it->first)}, {"value", Base64Encode(it->second.first)}};
        if (it->second.second) e["lease"] = std::to_string(it->second.second);
        kvs.push_back(e);
        ++it;
      } else {
        it = kv_.erase(it);
      }
    }
    if (path == "/v3/kv/deleterange") {
      if (n) ++revision_;
      return json{{"header", header}, {"deleted", std::to_string(n)}}.dump();
    }
    json out{{"header", header}, {"count", std::to_string(n)}};
    if (n) out["kvs"] = kvs;
    return out.dump();
  }
  *http_status = 404;
  return json{{"error", "unknown path " + path}, {"message", "unknown path " + path}, {"code", 12}}.dump();
}

}  // namespace strata::transfer
