#include "tools/transfer_flags.h"

#include <sys/stat.h>

#include <fstream>

#include "common/logging.h"

namespace strata::cli {

void AddTransferFlags(CLI::App* cmd, TransferFlags* f) {
  cmd->add_option("--transfer-transports", f->transports,
                  "transports the transfer engine may use, in order of preference: shm, tcp")
      ->capture_default_str();
  cmd->add_option("--transfer-port", f->port, "transfer listener port (0: any free port; serve: -1 = no transfer engine)")
      ->check(CLI::Range(-1, 65535))
      ->capture_default_str();
  cmd->add_option("--transfer-bind-address", f->bind_address,
                  "transfer listener address (default: 127.0.0.1; serve with a secret file: its --host)");
  cmd->add_option("--transfer-advertise-address", f->advertise_address,
                  "address peers are told to reach this instance at (default: the bind address)");
  cmd->add_option("--cluster-secret-file", f->secret_file,
                  "file holding the cluster's shared secret (peers authenticate with HMAC-SHA256); without it "
                  "the transfer listener binds loopback only");
  cmd->add_option("--transfer-connections", f->connections, "tcp connections to each transfer peer")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--transfer-faults", f->faults,
                  "TESTS ONLY: inject faults into this engine's reads (writes with action@write): "
                  "action[:skip[:count[:delay_s]]],... with action delay|drop|corrupt|fail|teardown")
      ->group("Testing");
}

Result<std::vector<transfer::FaultRule>> ParseFaultRules(const std::string& spec) {
  std::vector<transfer::FaultRule> rules;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(pos, end - pos);
    pos = end + 1;
    std::vector<std::string> parts;
    for (size_t p = 0; p <= item.size();) {
      size_t c = item.find(':', p);
      if (c == std::string::npos) c = item.size();
      parts.push_back(item.substr(p, c - p));
      p = c + 1;
    }
    const std::string bad = "--transfer-faults: '" + item + "' ";
    transfer::FaultRule r;
    r.kind = transfer::OpKind::kRead;
    static const std::pair<const char*, transfer::FaultRule::Action> kActions[] = {
        {"delay", transfer::FaultRule::Action::kDelay},   {"drop", transfer::FaultRule::Action::kDrop},
        {"corrupt", transfer::FaultRule::Action::kCorrupt}, {"fail", transfer::FaultRule::Action::kFail},
        {"teardown", transfer::FaultRule::Action::kTeardown}};
    bool known = false;
    if (parts[0].size() > 6 && parts[0].ends_with("@write")) {
      parts[0].resize(parts[0].size() - 6);
      r.kind = transfer::OpKind::kWrite;
    }
    for (const auto& [name, action] : kActions)
      if (parts[0] == name) r.action = action, known = true;
    if (!known || parts.size() > 4) return Status::InvalidArgument(bad + "is not action[:skip[:count[:delay_s]]]");
    try {
      if (parts.size() > 1) r.skip = std::stoull(parts[1]);
      if (parts.size() > 2) r.count = std::stoull(parts[2]);
      if (parts.size() > 3) r.delay_s = std::stod(parts[3]);
    } catch (...) {
      return Status::InvalidArgument(bad + "has a malformed number");
    }
    rules.push_back(r);
  }
  return rules;
}

Result<std::string> ReadClusterSecret(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::InvalidArgument("--cluster-secret-file " + path + ": cannot read");
  std::string secret;
  std::getline(in, secret);
  while (!secret.empty() && (secret.back() == ' ' || secret.back() == '\r' || secret.back() == '\t')) secret.pop_back();
  if (secret.empty()) return Status::InvalidArgument("--cluster-secret-file " + path + ": empty first line");
  struct stat st{};
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    STRATA_LOG_WARN("--cluster-secret-file {} is readable by group or others (mode {:o})", path, st.st_mode & 0777);
  }
  return secret;
}

Result<transfer::TransferOptions> ToOptions(const TransferFlags& f, const std::string& instance_name) {
  transfer::TransferOptions o;
  o.instance_name = instance_name;
  auto t = transfer::ParseTransports(f.transports);
  if (!t) return t.error().WithContext("--transfer-transports");
  o.transports = *t;
  if (f.port < 0) return Status::InvalidArgument("--transfer-port " + std::to_string(f.port) + ": no listener to start");
  o.port = f.port;
  o.bind_address = f.bind_address.empty() ? "127.0.0.1" : f.bind_address;
  o.advertise_address = f.advertise_address;
  o.connections_per_peer = f.connections;
  if (!f.secret_file.empty()) {
    STRATA_ASSIGN_OR_RETURN(o.cluster_secret, ReadClusterSecret(f.secret_file));
  }
  return o;
}

}  // namespace strata::cli
