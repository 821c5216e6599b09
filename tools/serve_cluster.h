#pragma once
// The cluster parts of `strata serve`: its transfer engine over the KV
// manager's segments, and its registration in the metadata store.

#include <memory>
#include <string>

#include "common/memory_segment.h"
#include "common/status.h"
#include "tools/transfer_flags.h"
#include "transfer/metadata.h"
#include "transfer/transfer_engine.h"

namespace strata::cli {

// `flag` when set, else "<hostname>:<http_port>".
std::string InstanceName(const std::string& flag, int http_port);
// The host peers reach this instance at: `bind_host`, unless it is a
// wildcard (then `transfer_advertise`'s host, else this host's name).
std::string AdvertisedHost(const std::string& bind_host, const std::string& transfer_advertise);

// The transfer engine of `strata serve` (null when --transfer-port is -1).
// Without a bind address it binds loopback, or `serve_host` with a secret.
Result<std::unique_ptr<transfer::TransferEngine>> StartServeTransfer(const TransferFlags& flags,
                                                                      const std::string& serve_host,
                                                                      const std::string& instance,
                                                                      SegmentTable* segments);

// Registers `self` at `url` (--metadata) with a lease; the client keeps it.
Result<std::unique_ptr<transfer::MetadataClient>> JoinCluster(const std::string& url, const transfer::InstanceInfo& self,
                                                              int lease_seconds);

}  // namespace strata::cli
