#pragma once
// The transfer engine's command-line flags, shared by `strata serve` and
// `strata transfer serve` (YAML keys transfer.* for serve; docs/config.md).

#include <CLI/CLI.hpp>

#include <string>

#include "transfer/transfer_engine.h"

namespace strata::cli {

struct TransferFlags {
  std::string transports = "shm,tcp";
  int port = 0;                 // 0: an ephemeral port
  std::string bind_address;     // default: 127.0.0.1 (serve: its --host)
  std::string advertise_address;
  std::string secret_file;
  int connections = 4;
  // Test-only fault injection (TransferEngine::SetFaults) on this engine's
  // reads, e.g. "corrupt:0:1,delay:2:1:3.0": action[:skip[:count[:delay_s]]]
  // with action delay|drop|corrupt|fail|teardown. Empty: none.
  std::string faults;
};

// Parses --transfer-faults (see TransferFlags::faults).
Result<std::vector<transfer::FaultRule>> ParseFaultRules(const std::string& spec);

void AddTransferFlags(CLI::App* cmd, TransferFlags* f);
// Options for an engine named `instance_name`: parses the transport list,
// reads the secret file (its first line, trimmed; refused when empty).
// The cluster secret in `path` (--cluster-secret-file): its first line,
// trimmed; refused when empty or unreadable; a warning when others can read it.
Result<std::string> ReadClusterSecret(const std::string& path);
Result<transfer::TransferOptions> ToOptions(const TransferFlags& f, const std::string& instance_name);

}  // namespace strata::cli
