#include "tools/bench_remote_prefix.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "common/http_client.h"
#include "common/logging.h"
#include "model/gguf_export.h"
#include "model/gguf_tokenizer.h"
#include "model/synth.h"

extern char** environ;

namespace strata::cli {

namespace {

using Clock = std::chrono::steady_clock;

// A child `strata` process; killed (SIGTERM, then SIGKILL) when destroyed.
class Child {
 public:
  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  // Starts `strata <args> --port-file F` with output to `log`; waits until
  // the port file appears and /health answers 200.
  Status Start(std::vector<std::string> args, const std::string& dir, const std::string& name) {
    port_file_ = dir + "/" + name + ".port";
    args.push_back("--port-file");
    args.push_back(port_file_);
    std::vector<std::string> full = {"/proc/self/exe"};
    full.insert(full.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : full) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    const std::string log = dir + "/" + name + ".log";
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    const int rc = posix_spawn(&pid_, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return Status::Internal("spawning strata " + name + ": " + std::strerror(rc));
    const auto until = Clock::now() + std::chrono::seconds(120);
    while (Clock::now() < until) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = 0;
        return Status::Internal("strata " + name + " exited at start; see " + log);
      }
      std::ifstream in(port_file_);
      std::stringstream text;
      text << in.rdbuf();
      auto j = nlohmann::json::parse(text.str(), nullptr, false);
      if (j.is_object() && j.contains("http")) {
        port_ = j["http"].get<int>();
        auto h = HttpCall("127.0.0.1", port_, "GET", "/health", "", {}, 2);
        if (h && h->status == 200) return Status::Ok();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return Status::Unavailable("strata " + name + " did not come up; see " + log);
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = 0;
  int port_ = 0;
  std::string port_file_;
};

nlohmann::json Prompt(int seed, int n, int vocab) {
  nlohmann::json p = nlohmann::json::array();
  uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(seed + 1);
  for (int i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    p.push_back(static_cast<int>(3 + x % static_cast<uint64_t>(vocab - 3)));
  }
  return p;
}

// Seconds for a 1-token completion of `prompt`; *remote: its remote cached tokens.
Result<double> Ttft(int port, const nlohmann::json& prompt, int* remote) {
  nlohmann::json body = {{"model", "m"}, {"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}};
  const auto t0 = Clock::now();
  auto r = HttpCall("127.0.0.1", port, "POST", "/v1/completions", body.dump(), {{"content-type", "application/json"}},
                    300);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!r) return r.error();
  if (r->status != 200) return Status::Internal("completion: HTTP " + std::to_string(r->status) + " " + r->body);
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  if (remote != nullptr) {
    *remote = 0;
    if (j.is_object() && j.contains("usage"))
      *remote = j["usage"]["prompt_tokens_details"]["cached_tokens_by_tier"].value("remote", 0);
  }
  return s;
}

Result<std::string> DefaultModel(const std::string& dir) {
  STRATA_ASSIGN_OR_RETURN(ModelConfig c, SynthPresetConfig("bench-110m", 0));
  SynthOptions o;
  o.dtype = DType::kQ8_0;
  const std::string path = dir + "/bench-110m-q8_0.gguf";
  STRATA_RETURN_IF_ERROR(WriteSyntheticGguf(c, SyntheticVocab(c.vocab_size), o, path));
  return path;
}

}  // namespace

Result<nlohmann::json> RunRemotePrefixBench(const RemotePrefixOptions& opt) {
  char tmpl[] = "/tmp/strata-remote-prefix-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return Status::IoError("mkdtemp", tmpl, errno);
  const std::string dir = tmpl;
  struct Cleanup {
    std::string d;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  } cleanup{dir};
  std::string model = opt.model;
  if (model.empty()) {
    auto written = DefaultModel(dir);
    if (!written) return written.error();
    model = *written;
  }

  Child meta;
  STRATA_RETURN_IF_ERROR(meta.Start({"meta", "--port", "0"}, dir, "meta"));
  const std::string url = "strata://127.0.0.1:" + std::to_string(meta.port());
  const std::string threads = std::to_string(opt.threads);
  auto serve = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> a = {"serve",       "--model",      model,   "--served-model-name", "m",
                                  "--port",      "0",            "--grpc-port", "-1",           "--threads",
                                  threads,       "--metadata",   url,     "--instance-name",     name,
                                  "--max-num-seqs", "2"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  Child holder;
  STRATA_RETURN_IF_ERROR(holder.Start(serve("holder", {"--kv-host-bytes", "2G"}), dir, "holder"));
  nlohmann::json by;
  double worst_ratio = -1, worst_warm = 0, worst_cold = 0;
  int seed = 0;
  for (const std::string transport : {"tcp", "shm"}) {
    Child reader;
    STRATA_RETURN_IF_ERROR(reader.Start(
        serve("reader-" + transport, {"--kv-remote", "--kv-load-policy", "always", "--transfer-transports", transport}),
        dir, "reader-" + transport));
    // Wait until the reader follows the holder (its directory lists it).
    for (int i = 0; i < 100; ++i) {
      auto m = HttpCall("127.0.0.1", reader.port(), "GET", "/metrics", "", {}, 5);
      if (m && m->body.find("strata_cluster_peers 1") != std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    double best_warm = 1e30, best_cold = 1e30;
    int remote_tokens = 0;
    for (int round = 0; round < opt.rounds; ++round) {
      const auto warm_prompt = Prompt(++seed, opt.prompt_tokens, 32000);
      const auto cold_prompt = Prompt(++seed, opt.prompt_tokens, 32000);
      STRATA_RETURN_IF_ERROR(Ttft(holder.port(), warm_prompt, nullptr).status());
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the reader's index catches up
      auto warm = [&]() -> Status {
        STRATA_ASSIGN_OR_RETURN(double s, Ttft(reader.port(), warm_prompt, &remote_tokens));
        best_warm = std::min(best_warm, s);
        return Status::Ok();
      };
      auto cold = [&]() -> Status {
        STRATA_ASSIGN_OR_RETURN(double s, Ttft(reader.port(), cold_prompt, nullptr));
        best_cold = std::min(best_cold, s);
        return Status::Ok();
      };
      if (round % 2 == 0) {
        STRATA_RETURN_IF_ERROR(warm());
        STRATA_RETURN_IF_ERROR(cold());
      } else {
        STRATA_RETURN_IF_ERROR(cold());
        STRATA_RETURN_IF_ERROR(warm());
      }
    }
    const double ratio = best_warm / best_cold;
    by[transport] = {{"ttft_seconds", best_warm},
                     {"cold_ttft_seconds", best_cold},
                     {"ratio", ratio},
                     {"remote_cached_tokens", remote_tokens}};
    if (ratio > worst_ratio) worst_ratio = ratio, worst_warm = best_warm, worst_cold = best_cold;
  }
  return nlohmann::json{{"ttft_seconds", worst_warm},
                        {"cold_ttft_seconds", worst_cold},
                        {"ratio", worst_ratio},
                        {"prompt_tokens", opt.prompt_tokens},
                        {"model", opt.model.empty() ? "bench-110m q8_0 (synthetic)" : opt.model},
                        {"by_transport", by},
                        {"baseline", "the same reader computing a fresh prompt of the same length (cache cold)"}};
}

}  // namespace strata::cli
