// strata bench transfer: the transfer engine against the machine's own
// baselines, measured in the same run with the same sizes.
//   tcp: batches of writes into a granted region of another process, against
//        a plain C++ socket pair with the same connection count, chunk size
//        and pipelining (16 chunks in flight per connection, one ack each).
//   shm: the same writes over same-host shared memory (cross-memory attach),
//        submit to completion, against memcpy between two buffers of this
//        process with as many threads as the engine's copiers.
// Rounds alternate engine and baseline (the VM's bandwidth drifts); each
// figure is the best of its rounds.

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/logging.h"
#include "tools/bench_remote_prefix.h"
#include "tools/commands.h"
#include "transfer/shared_memory.h"
#include "transfer/transfer_engine.h"
#include "transfer/wire.h"

namespace strata::cli {

void FillPattern(uint8_t* p, uint64_t len, uint64_t seed);

namespace {

using transfer::Clock;
constexpr int kWindow = 16;  // chunks in flight per connection, engine and baseline alike

struct BenchFlags {
  std::string bytes = "512M";
  std::string region = "128M";
  int rounds = 2;
  bool json = false;
  std::string remote_model;  // remote_prefix: empty = bench-110m q8_0 (synthetic)
  int remote_prompt_tokens = 1792;
  bool skip_remote_prefix = false;
};

// --- the target process ---

void SocketSink(int fd, uint8_t* buf, uint64_t region) {
  uint64_t off = 0;
  while (true) {
    uint64_t len = 0;
    if (!transfer::RecvAll(fd, &len, 8, "size").ok() || len == 0 || len > region) break;
    if (off + len > region) off = 0;
    if (!transfer::RecvAll(fd, buf + off, len, "chunk").ok()) break;
    off += len;
    uint8_t ack = 1;
    if (!transfer::SendAll(fd, &ack, 1, "ack").ok()) break;
  }
  ::close(fd);
}

[[noreturn]] void RunTarget(int out_fd, int in_fd, uint64_t region) {
  // The grant the engine figures use lies in shared memory (mapped by a
  // same-host peer); a second one in plain memory measures cross-memory
  // attach.
  auto shared = transfer::SharedHostMemory::Allocate(region, "bench target");
  if (!shared) _exit(3);
  std::vector<uint8_t> plain(region, 1);
  uint8_t* buf = shared->data();
  SegmentTable segments;
  auto id = segments.Register(SegmentKind::kHost, buf, region, "bench target");
  auto plain_id = segments.Register(SegmentKind::kHost, plain.data(), region, "bench target (plain)");
  transfer::TransferOptions o;
  o.instance_name = "bench-target";
  auto engine = transfer::TransferEngine::Start(o, &segments);
  if (!id || !plain_id || !engine) _exit(3);
  auto grant = (*engine)->Grant(Region{*id, 0, region}, "bench-client", std::chrono::hours(1));
  auto plain_grant = (*engine)->Grant(Region{*plain_id, 0, region}, "bench-client", std::chrono::hours(1));
  int sock_port = 0;
  auto lfd = transfer::ListenTcp("127.0.0.1", 0, &sock_port);
  if (!grant || !plain_grant || !lfd) _exit(4);
  std::thread([&] {
    while (true) {
      int fd = ::accept(*lfd, nullptr, nullptr);
      if (fd < 0) return;
      transfer::TuneSocket(fd);
      std::thread(SocketSink, fd, buf, region).detach();
    }
  }).detach();
  std::string hello = fmt::format("{} {} {} {}\n", (*engine)->port(), *grant, sock_port, *plain_grant);
  (void)!write(out_fd, hello.data(), hello.size());
  char c;
  while (read(in_fd, &c, 1) > 0) {
  }
  _exit(0);
}

// --- baselines ---

double SocketPairGBps(int port, int conns, uint64_t chunk, uint64_t total, const uint8_t* src, uint64_t region) {
  uint64_t per_conn = std::max<uint64_t>(1, total / chunk / conns);
  std::vector<int> fds;
  for (int i = 0; i < conns; ++i) {
    auto fd = transfer::ConnectTcp("127.0.0.1", port, 5);
    if (!fd) {
      for (int f : fds) ::close(f);
      return 0;
    }
    transfer::TuneSocket(*fd);
    fds.push_back(*fd);
  }
  auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < conns; ++i) {
    threads.emplace_back([&, fd = fds[i]] {
      std::atomic<uint64_t> acked{0};
      std::thread reader([&] {
        uint8_t acks[256];
        while (acked < per_conn) {
          ssize_t n = ::recv(fd, acks, std::min<uint64_t>(sizeof(acks), per_conn - acked), 0);
          if (n <= 0) break;
          acked += static_cast<uint64_t>(n);
        }
      });
      uint64_t off = 0;
      for (uint64_t k = 0; k < per_conn; ++k) {
        while (k - acked.load() >= static_cast<uint64_t>(kWindow)) std::this_thread::yield();
        if (off + chunk > region) off = 0;
        uint64_t len = chunk;
        if (!transfer::SendAll(fd, &len, 8, "size").ok() || !transfer::SendAll(fd, src + off, chunk, "chunk").ok()) {
          ::shutdown(fd, SHUT_RDWR);  // the ack reader stops too
          break;
        }
        off += chunk;
      }
      reader.join();
    });
  }
  for (auto& t : threads) t.join();
  double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  for (int fd : fds) {
    uint64_t zero = 0;
    (void)transfer::SendAll(fd, &zero, 8, "end");
    ::close(fd);
  }
  return static_cast<double>(per_conn * conns * chunk) / sec / 1e9;
}

double MemcpyGBps(int threads, uint64_t chunk, uint64_t total, const uint8_t* src, uint8_t* dst, uint64_t region) {
  uint64_t chunks = std::max<uint64_t>(1, total / chunk);
  auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      uint64_t slots = region / chunk;
      for (uint64_t k = static_cast<uint64_t>(t); k < chunks; k += static_cast<uint64_t>(threads)) {
        uint64_t off = (k % slots) * chunk;
        std::memcpy(dst + off, src + off, chunk);
      }
    });
  }
  for (auto& t : ts) t.join();
  double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  return static_cast<double>(chunks * chunk) / sec / 1e9;
}

// --- the engine ---

Result<double> EngineGBps(const std::string& target, uint64_t grant, transfer::Transport transport, int conns,
                          uint64_t chunk, uint64_t total, SegmentTable* segments, SegmentId src, uint64_t region) {
  transfer::TransferOptions o;
  o.instance_name = "bench-client";
  o.listen = false;
  o.transports = {transport};
  o.connections_per_peer = conns;
  o.max_inflight_per_connection = kWindow;
  auto engine = transfer::TransferEngine::Start(o, segments);
  if (!engine) return engine.error();
  auto peer = (*engine)->Connect(target);
  if (!peer) return peer.error();
  auto h = (*engine)->OpenGrant(*peer, grant);
  if (!h) return h.error();
  if (h->transport != transport) return Status::Unavailable("the engine chose another transport");
  uint64_t chunks = std::max<uint64_t>(1, total / chunk);
  uint64_t slots = region / chunk;
  std::vector<transfer::TransferOp> ops;
  ops.reserve(chunks);
  for (uint64_t k = 0; k < chunks; ++k) {
    uint64_t off = (k % slots) * chunk;
    ops.push_back({transfer::OpKind::kWrite, Region{src, off, chunk}, *h, off});
  }
  // Warm-up: connections established, pages touched.
  {
    std::vector<transfer::TransferOp> warm(ops.begin(), ops.begin() + std::min<size_t>(ops.size(), 8));
    auto b = (*engine)->Submit(warm, Clock::now() + std::chrono::seconds(30));
    if (!b) return b.error();
    if (auto r = (*engine)->Wait(*b); !r.status.ok()) return r.status;
  }
  auto t0 = Clock::now();
  auto b = (*engine)->Submit(std::move(ops), Clock::now() + std::chrono::seconds(120));
  if (!b) return b.error();
  auto r = (*engine)->Wait(*b);
  if (!r.status.ok()) return r.status;
  double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  return static_cast<double>(chunks * chunk) / sec / 1e9;
}

int RunBench(const BenchFlags& f) {
  auto total = ParseByteSize(f.bytes);
  auto region = ParseByteSize(f.region);
  if (!total || !region || *region < (1u << 20) || *total == 0) {
    std::cerr << "--bytes / --region: byte sizes, region at least 1M\n";
    return 2;
  }
  int to_parent[2], to_child[2];
  if (pipe(to_parent) != 0 || pipe(to_child) != 0) return 1;
  pid_t pid = fork();
  if (pid == 0) {
    ::close(to_parent[0]);
    ::close(to_child[1]);
    RunTarget(to_parent[1], to_child[0], *region);
  }
  ::close(to_parent[1]);
  ::close(to_child[0]);
  char line[128] = {};
  ssize_t n = read(to_parent[0], line, sizeof(line) - 1);
  int tport = 0, sport = 0;
  unsigned long long grant = 0, plain_grant = 0;
  if (n <= 0 || sscanf(line, "%d %llu %d %llu", &tport, &grant, &sport, &plain_grant) != 4) {
    std::cerr << "bench transfer: the target process did not start\n";
    return 1;
  }
  std::string target = "127.0.0.1:" + std::to_string(tport);
  std::vector<uint8_t> src(*region), dst(*region, 0);
  FillPattern(src.data(), src.size(), 7);
  SegmentTable segments;
  auto src_id = segments.Register(SegmentKind::kHost, src.data(), src.size(), "bench source");
  if (!src_id) return 1;

  struct Case {
    std::string transport;
    int conns;
    uint64_t chunk;
    double engine = 0, baseline = 0;
  };
  std::vector<Case> cases;
  for (int conns : {1, 8}) {
    for (uint64_t chunk : {uint64_t{64} << 10, uint64_t{1} << 20}) cases.push_back({"tcp", conns, chunk});
  }
  for (uint64_t chunk : {uint64_t{64} << 10, uint64_t{1} << 20}) cases.push_back({"shm", 1, chunk});
  for (uint64_t chunk : {uint64_t{64} << 10, uint64_t{1} << 20}) cases.push_back({"cma", 1, chunk});
  int status = 0;
  for (int round = 0; round < f.rounds; ++round) {
    for (auto& c : cases) {
      bool shm = c.transport != "tcp";
      auto run_engine = [&] {
        auto g = EngineGBps(target, c.transport == "cma" ? plain_grant : grant, shm ? transfer::Transport::kShm : transfer::Transport::kTcp, c.conns,
                            c.chunk, *total, &segments, *src_id, *region);
        if (!g) {
          std::cerr << "bench transfer: " << c.transport << ": " << g.error().message() << "\n";
          status = 1;
          return;
        }
        c.engine = std::max(c.engine, *g);
      };
      auto run_base = [&] {
        double g = shm ? MemcpyGBps(2, c.chunk, *total, src.data(), dst.data(), *region)
                       : SocketPairGBps(sport, c.conns, c.chunk, *total, src.data(), *region);
        c.baseline = std::max(c.baseline, g);
      };
      if (round % 2 == 0) {
        run_engine();
        run_base();
      } else {
        run_base();
        run_engine();
      }
    }
  }
  ::close(to_child[1]);
  waitpid(pid, nullptr, 0);

  nlohmann::json out;
  double best_tcp = 0, shm_ratio = 0;
  for (const auto& c : cases) {
    double ratio = c.baseline > 0 ? c.engine / c.baseline : 0;
    nlohmann::json row{{"connections", c.conns}, {"bytes", c.chunk}, {"engine_gbps", c.engine},
                       {"baseline_gbps", c.baseline}, {"ratio", ratio}};
    if (c.transport == "tcp") {
      out["tcp"]["cases"].push_back(row);
      if (c.chunk == (1u << 20)) best_tcp = std::max(best_tcp, ratio);
    } else if (c.transport == "shm") {
      out["shm"]["cases"].push_back(row);
      if (c.chunk == (1u << 20)) shm_ratio = ratio;
    } else {
      out["shm"]["cross_memory_attach"].push_back(row);
    }
  }
  out["tcp"]["ratio_to_socket"] = best_tcp;
  out["tcp"]["baseline"] = "plain socket pair, same connections, chunk size and 16-deep pipelining";
  out["shm"]["ratio_to_memcpy"] = shm_ratio;
  out["shm"]["baseline"] = "memcpy between two buffers of one process, 2 threads (the engine's 2 copiers)";
  out["bytes_per_case"] = *total;
  out["rounds"] = f.rounds;
  if (!f.skip_remote_prefix) {
    RemotePrefixOptions ro;
    ro.model = f.remote_model;
    ro.prompt_tokens = f.remote_prompt_tokens;
    ro.rounds = f.rounds;
    auto rp = RunRemotePrefixBench(ro);
    if (!rp) {
      std::cerr << "bench transfer: remote_prefix: " << rp.error().message() << "\n";
      status = 1;
    } else {
      out["remote_prefix"] = *rp;
    }
  }
  if (f.json) {
    std::cout << out.dump(2) << "\n";
  } else {
    std::cout << fmt::format("{:<5} {:>5} {:>8} {:>12} {:>14} {:>7}\n", "path", "conns", "bytes", "engine GB/s",
                             "baseline GB/s", "ratio");
    for (const auto& c : cases) {
      std::cout << fmt::format("{:<5} {:>5} {:>8} {:>12.2f} {:>14.2f} {:>7.2f}\n", c.transport, c.conns,
                               c.chunk >= (1u << 20) ? "1M" : "64K", c.engine, c.baseline,
                               c.baseline > 0 ? c.engine / c.baseline : 0.0);
    }
    if (out.contains("remote_prefix")) {
      const auto& rp = out["remote_prefix"];
      for (const auto& [t, v] : rp["by_transport"].items())
        std::cout << fmt::format("remote prefix over {}: TTFT {:.3f} s loaded from a peer's host tier vs {:.3f} s "
                                 "computed (cache off): ratio {:.2f} ({} remote cached tokens of {})\n",
                                 t, v["ttft_seconds"].get<double>(), v["cold_ttft_seconds"].get<double>(),
                                 v["ratio"].get<double>(), v["remote_cached_tokens"].get<int>(),
                                 rp["prompt_tokens"].get<int>());
    }
    std::cout << "tcp baseline: plain socket pair (same connections, chunk, pipelining); shm and cma baseline: "
                 "memcpy (2 threads); shm: the target's memory is shared (memfd), cma: plain memory reached with "
                 "process_vm_writev\n";
  }
  return status;
}

}  // namespace

void RegisterBenchTransfer(CLI::App* bench, int* exit_code) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* cmd = bench->add_subcommand(
      "transfer", "transfer engine: tcp vs a plain socket pair, shm vs memcpy (64K and 1M, 1 and 8 connections)");
  cmd->add_option("--bytes", f->bytes, "bytes moved per case and round")->capture_default_str();
  cmd->add_option("--region", f->region, "size of the target region the writes cycle through")->capture_default_str();
  cmd->add_option("--rounds", f->rounds, "alternating rounds (best of)")->check(CLI::Range(1, 20))->capture_default_str();
  cmd->add_flag("--json", f->json, "print JSON");
  cmd->add_option("--remote-prefix-model", f->remote_model,
                  "remote_prefix: the model (default: bench-110m q8_0, synthetic, written to a temp dir)");
  cmd->add_option("--remote-prefix-tokens", f->remote_prompt_tokens, "remote_prefix: prompt length")
      ->check(CLI::Range(32, 1 << 20))
      ->capture_default_str();
  cmd->add_flag("--skip-remote-prefix", f->skip_remote_prefix,
                "skip the remote_prefix part (TTFT of a prompt loaded from a peer vs computed)");
  cmd->callback([f, exit_code] { *exit_code = RunBench(*f); });
}

}  // namespace strata::cli
