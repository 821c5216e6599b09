// strata transfer serve: a transfer-engine peer driven by line commands on
// stdin, for tests, demos and checking a cluster's network by hand. It
// exports a readable segment "data" (filled from --seed) and keeps a private
// segment "inbox" that peers reach only through grants.
//
// Commands (one per line; each answers one line, "ok ..." or "error ..."):
//   grant OFF LEN GRANTEE LEASE_MS      → ok HANDLE    (inbox bytes, writable by GRANTEE)
//   revoke HANDLE                       → ok quiesced  (waits until no access can land)
//   checksum data|inbox OFF LEN         → ok HEX       (XXH3-64)
//   fill data|inbox OFF LEN SEED        → ok
//   connect HOST:PORT                   → ok PEER
//   pull PEER SEGMENT ROFF OFF LEN      → ok HEX       (reads a peer's segment into inbox[OFF..])
//   stats                               → ok {json}
//   quit                                → exits 0 (so does end of input)

#include <unistd.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "common/logging.h"
#include "tools/commands.h"
#include "tools/transfer_flags.h"
#include "transfer/shared_memory.h"
#include "transfer/transfer_engine.h"
#include "transfer/wire.h"

namespace strata::cli {

void FillPattern(uint8_t* p, uint64_t len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  uint64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
  uint64_t v = rng();
  for (; i < len; ++i) p[i] = static_cast<uint8_t>(v >> ((i % 8) * 8));
}

namespace {
using transfer::Clock;

struct PeerFlags {
  TransferFlags transfer;
  std::string name = "peer";
  std::string segment_bytes = "16M";
  uint64_t seed = 1;
  std::string port_file;
};

std::string Hex(uint64_t v) { return fmt::format("{:016x}", v); }

int RunPeer(const PeerFlags& f) {
  auto bytes = ParseByteSize(f.segment_bytes);
  if (!bytes || *bytes == 0) {
    std::cerr << "--segment-bytes: not a byte size\n";
    return 2;
  }
  auto options = ToOptions(f.transfer, f.name);
  if (!options) {
    std::cerr << options.error().message() << "\n";
    return 2;
  }
  // Shared memory, so same-host peers map it (the shm transport's fast path).
  auto data_mem = transfer::SharedHostMemory::Allocate(*bytes, f.name + " data");
  auto inbox_mem = transfer::SharedHostMemory::Allocate(*bytes, f.name + " inbox");
  if (!data_mem || !inbox_mem) {
    std::cerr << "shared memory: " << (data_mem ? inbox_mem.error() : data_mem.error()).message() << "\n";
    return 1;
  }
  std::span<uint8_t> data(data_mem->data(), data_mem->size()), inbox(inbox_mem->data(), inbox_mem->size());
  FillPattern(data.data(), data.size(), f.seed);
  SegmentTable segments;
  auto data_id = segments.Register(SegmentKind::kHost, data.data(), data.size(), "data");
  auto inbox_id = segments.Register(SegmentKind::kHost, inbox.data(), inbox.size(), "inbox");
  if (!data_id || !inbox_id) return 1;
  auto engine = transfer::TransferEngine::Start(*options, &segments);
  if (!engine) {
    std::cerr << "transfer engine: " << engine.error().message() << "\n";
    return 1;
  }
  auto& e = **engine;
  if (auto r = e.ExportSegment(*data_id, "data"); !r) {
    std::cerr << r.error().message() << "\n";
    return 1;
  }
  if (!f.port_file.empty()) {
    std::string tmp = f.port_file + ".tmp";
    std::ofstream(tmp) << nlohmann::json{{"transfer", e.port()}, {"pid", getpid()}}.dump() << "\n";
    std::rename(tmp.c_str(), f.port_file.c_str());
  }
  std::cout << "ready " << e.port() << std::endl;
  auto seg = [&](const std::string& n) -> std::span<uint8_t>* {
    return n == "data" ? &data : n == "inbox" ? &inbox : nullptr;
  };
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    std::string reply;
    if (cmd == "quit") break;
    if (cmd == "grant") {
      uint64_t off = 0, len = 0, lease_ms = 0;
      std::string grantee;
      in >> off >> len >> grantee >> lease_ms;
      auto g = e.Grant(Region{*inbox_id, off, len}, grantee, std::chrono::milliseconds(lease_ms));
      reply = g ? "ok " + std::to_string(*g) : "error " + g.error().message();
    } else if (cmd == "revoke") {
      uint64_t h = 0;
      in >> h;
      Status s = e.Revoke(h);
      auto until = Clock::now() + std::chrono::seconds(10);
      while (s.ok() && !e.Quiesced(h) && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      reply = !s.ok() ? "error " + s.message() : e.Quiesced(h) ? "ok quiesced" : "error not quiesced after 10 s";
    } else if (cmd == "checksum" || cmd == "fill") {
      std::string name;
      uint64_t off = 0, len = 0, seed = 0;
      in >> name >> off >> len >> seed;
      auto* buf = seg(name);
      if (!buf || off > buf->size() || len > buf->size() - off) {
        reply = "error bad segment or range";
      } else if (cmd == "fill") {
        FillPattern(buf->data() + off, len, seed);
        reply = "ok";
      } else {
        reply = "ok " + Hex(transfer::PayloadChecksum(buf->data() + off, len));
      }
    } else if (cmd == "connect") {
      std::string addr;
      in >> addr;
      auto p = e.Connect(addr);
      reply = p ? "ok " + std::to_string(*p) : "error " + p.error().message();
    } else if (cmd == "pull") {
      uint64_t peer = 0, roff = 0, off = 0, len = 0;
      std::string name;
      in >> peer >> name >> roff >> off >> len;
      auto h = e.OpenSegment(peer, name);
      if (!h) {
        reply = "error " + h.error().message();
      } else {
        transfer::TransferOp op{transfer::OpKind::kRead, Region{*inbox_id, off, len}, *h, roff};
        auto b = e.Submit({op}, Clock::now() + std::chrono::seconds(10));
        if (!b) {
          reply = "error " + b.error().message();
        } else {
          auto r = e.Wait(*b);
          reply = r.status.ok() ? "ok " + Hex(transfer::PayloadChecksum(inbox.data() + off, len))
                                : "error " + r.status.message();
        }
      }
    } else if (cmd == "stats") {
      auto s = e.stats();
      reply = "ok " + nlohmann::json{{"served_read_bytes", s.served_read_bytes},
                                     {"served_write_bytes", s.served_write_bytes},
                                     {"refused", s.refused},
                                     {"refused_locally", s.refused_locally},
                                     {"failed_handshakes", s.failed_handshakes},
                                     {"timeouts", s.timeouts},
                                     {"connections", s.connections}}
                          .dump();
    } else {
      reply = "error unknown command '" + cmd + "'";
    }
    std::cout << reply << std::endl;
  }
  return 0;
}

}  // namespace

void RegisterTransfer(CLI::App& app, int* exit_code) {
  CLI::App* transfer = app.add_subcommand("transfer", "transfer engine tools");
  transfer->require_subcommand(1);
  auto f = std::make_shared<PeerFlags>();
  CLI::App* cmd = transfer->add_subcommand(
      "serve", "a transfer peer driven by commands on stdin (exports 'data', grants from 'inbox'); see docs/cli.md");
  cmd->add_option("--name", f->name, "instance name")->capture_default_str();
  cmd->add_option("--segment-bytes", f->segment_bytes, "size of each of 'data' and 'inbox'")->capture_default_str();
  cmd->add_option("--seed", f->seed, "fills 'data'")->capture_default_str();
  cmd->add_option("--port-file", f->port_file, "write {\"transfer\": P, \"pid\": N} here once listening");
  AddTransferFlags(cmd, &f->transfer);
  cmd->callback([f, exit_code] { *exit_code = RunPeer(*f); });
}

}  // namespace strata::cli
