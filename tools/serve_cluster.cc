#include "tools/serve_cluster.h"

#include <unistd.h>

#include "common/logging.h"

namespace strata::cli {

namespace {
std::string HostName() {
  char hn[256] = {};
  gethostname(hn, sizeof(hn) - 1);
  return hn;
}
}  // namespace

std::string InstanceName(const std::string& flag, int http_port) {
  return flag.empty() ? HostName() + ":" + std::to_string(http_port) : flag;
}

std::string AdvertisedHost(const std::string& bind_host, const std::string& transfer_advertise) {
  if (!bind_host.empty() && bind_host != "0.0.0.0" && bind_host != "::") return bind_host;
  return transfer_advertise.empty() ? HostName() : transfer_advertise;
}

Result<std::unique_ptr<transfer::TransferEngine>> StartServeTransfer(const TransferFlags& flags,
                                                                      const std::string& serve_host,
                                                                      const std::string& instance,
                                                                      SegmentTable* segments) {
  if (flags.port < 0) return std::unique_ptr<transfer::TransferEngine>();
  TransferFlags tf = flags;
  if (tf.bind_address.empty()) tf.bind_address = tf.secret_file.empty() ? "127.0.0.1" : serve_host;
  STRATA_ASSIGN_OR_RETURN(transfer::TransferOptions options, ToOptions(tf, instance));
  auto engine = transfer::TransferEngine::Start(options, segments);
  if (!engine) return engine.error().WithContext("transfer engine");
  STRATA_LOG_INFO("transfer engine '{}' listening on {}", (*engine)->instance_name(), (*engine)->address());
  return std::move(*engine);
}

Result<std::unique_ptr<transfer::MetadataClient>> JoinCluster(const std::string& url,
                                                              const transfer::InstanceInfo& self, int lease_seconds) {
  auto parsed = transfer::ParseMetadataUrl(url);
  if (!parsed) return parsed.error().WithContext("--metadata");
  STRATA_ASSIGN_OR_RETURN(auto client, transfer::MetadataClient::Create(*parsed));
  if (Status s = client->Register(self, lease_seconds); !s.ok()) return s.WithContext("--metadata");
  STRATA_LOG_INFO("cluster: instance '{}' (incarnation {}) registers at {} with a {} s lease", self.name,
                  self.incarnation, url, lease_seconds);
  return client;
}

}  // namespace strata::cli
