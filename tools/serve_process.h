#pragma once
// Process plumbing shared by the long-running commands (`strata serve`,
// `strata router`, `strata meta`): shutdown signals, the --port-file, and
// the embedded metadata store's HTTP server.

#include <memory>
#include <string>

#include "common/status.h"
#include "server/http_server.h"
#include "transfer/metadata.h"

namespace strata::cli {

// Routes SIGTERM and SIGINT to WaitForShutdownSignal (later signals during
// the shutdown are absorbed). Call once, early in the main thread.
Status InstallShutdownSignals();
// Blocks until SIGTERM or SIGINT arrives; returns it.
int WaitForShutdownSignal();
// {"http", "grpc", "transfer", "pid"} (and "metadata" when >= 0), written
// atomically (rename).
Status WritePortFile(const std::string& path, int http_port, int grpc_port, int transfer_port,
                     int metadata_port = -1);

// The embedded metadata store (`strata meta`, `strata router
// --serve-metadata`) behind an HTTP server on host:port (0: any), started.
// `store` outlives the server. With a non-empty `bearer`, every call but
// GET /health needs "Authorization: Bearer <bearer>" (401 otherwise).
Result<std::unique_ptr<server::HttpServer>> StartMetadataServer(const std::string& host, int port,
                                                                transfer::MetaStore* store, std::string bearer);

}  // namespace strata::cli
