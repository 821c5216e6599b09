// strata bench vs-llamacpp: Strata and llama.cpp on the same GGUF file, the
// same machine, in the same run, alternating, as ratios (issue 21's figure
// of merit). llama.cpp is an external build (docs/PERFORMANCE.md says how);
// nothing of it is linked.

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "bench/report.h"
#include "common/status.h"
#include "tools/commands.h"

namespace strata::cli {

namespace {

struct VsFlags {
  std::string llamacpp_dir, model;
  int rounds = 5, threads = 2;
  int batched_context = 512;  // prompt of each of the 32 sequences
  bool batched = true, json = false;
  // Strata's side only (llama.cpp's CPU path always quantizes them).
  bool int8_activations = false, exact_activations = false;
};

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs `cmd` through the shell; its stdout, or an error naming the command
// with how it ended and the end of its stderr.
Result<std::string> Capture(const std::string& cmd) {
  char err_path[] = "/tmp/strata-vs-stderr-XXXXXX";
  const int fd = ::mkstemp(err_path);
  if (fd < 0) return Status::Internal("cannot create a temporary file for stderr");
  ::close(fd);
  std::unique_ptr<FILE, int (*)(FILE*)> p(::popen((cmd + " 2>" + Quote(err_path)).c_str(), "r"), ::pclose);
  if (!p) {
    std::remove(err_path);
    return Status::Internal("cannot run: " + cmd);
  }
  std::string out;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p.get())) > 0) out.append(buf.data(), n);
  const int status = ::pclose(p.release());
  std::string err;
  if (FILE* e = std::fopen(err_path, "r")) {
    while ((n = std::fread(buf.data(), 1, buf.size(), e)) > 0) err.append(buf.data(), n);
    std::fclose(e);
  }
  std::remove(err_path);
  if (status == 0) return out;
  const std::string how = WIFEXITED(status)     ? "exit status " + std::to_string(WEXITSTATUS(status))
                          : WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                                : "status " + std::to_string(status);
  if (err.size() > 600) err = "..." + err.substr(err.size() - 600);
  return Status::Internal(how + " from: " + cmd + (err.empty() ? "" : "\n" + err));
}

Result<std::string> FindTool(const std::string& dir, const std::string& name) {
  for (const char* sub : {"/build/bin/", "/bin/", "/"}) {
    std::string p = dir + sub + name;
    std::error_code ec;
    if (std::filesystem::is_regular_file(p, ec)) return p;
  }
  return Status::NotFound(name + " not found under " + dir + " (build/bin, bin or the directory itself)");
}

struct Figures {
  double decode = 0, prefill = 0, batched = 0;  // tokens per second
  // Strata's run only: the bytes one batch-1 decode step reads (the file's
  // weights, an embedding row, the KV) and the streaming read bandwidth
  // `strata bench kernels` measured around its figures (GB/s).
  double decode_bytes = 0, read_gbs = 0;
};

Result<Figures> RunLlama(const VsFlags& f, const std::string& bench, const std::string& batched) {
  Figures r;
  STRATA_ASSIGN_OR_RETURN(std::string out, Capture(Quote(bench) + " -m " + Quote(f.model) + " -p 512 -n 128 -t " +
                                                       std::to_string(f.threads) + " -o json"));
  auto j = nlohmann::json::parse(out, nullptr, false);
  if (!j.is_array()) return Status::Internal("llama-bench printed no JSON array");
  for (const auto& e : j) {
    if (!e.is_object()) continue;
    if (e.value("n_prompt", 0) == 512 && e.value("n_gen", 0) == 0) r.prefill = e.value("avg_ts", 0.0);
    if (e.value("n_prompt", 0) == 0 && e.value("n_gen", 0) == 128) r.decode = e.value("avg_ts", 0.0);
  }
  if (!(r.prefill > 0) || !(r.decode > 0))
    return Status::Internal("llama-bench's JSON has no positive pp512 and tg128 figures");
  if (!batched.empty()) {
    const int npp = f.batched_context;
    STRATA_ASSIGN_OR_RETURN(std::string t, Capture(Quote(batched) + " -m " + Quote(f.model) + " -c " +
                                                   std::to_string(32 * (npp + 32)) + " -npp " + std::to_string(npp) +
                                                   " -ntg 32 -npl 32 -t " + std::to_string(f.threads)));
    // The table row after the header naming "S_TG t/s".
    std::istringstream in(t);
    std::string line;
    int col = -1;
    while (std::getline(in, line)) {
      std::vector<std::string> cells;
      std::stringstream ls(line);
      for (std::string c; std::getline(ls, c, '|');) {
        c.erase(0, c.find_first_not_of(' '));
        c.erase(c.find_last_not_of(' ') + 1);
        cells.push_back(c);
      }
      if (col < 0) {
        for (size_t i = 0; i < cells.size(); ++i)
          if (cells[i] == "S_TG t/s") col = static_cast<int>(i);
      } else if (static_cast<int>(cells.size()) > col && cells.size() >= 2 && !cells[1].empty() &&
                 cells[1][0] != '-') {
        r.batched = std::atof(cells[static_cast<size_t>(col)].c_str());
        break;
      }
    }
    if (r.batched <= 0) return Status::Internal("llama-batched-bench printed no S_TG figure");
  }
  return r;
}

// decode[0].tokens_per_s (and prefill.tokens_per_s, decode[0].bytes_per_step
// and limits.read_bandwidth_gbs) of `strata bench kernels --json`.
Status ReadKernels(const std::string& out, double* decode, double* prefill, Figures* bytes = nullptr) {
  auto j = nlohmann::json::parse(out, nullptr, false);
  if (!j.is_object() || !j.contains("decode") || !j["decode"].is_array() || j["decode"].empty() ||
      !j["decode"][0].is_object() || !j.contains("prefill") || !j["prefill"].is_object())
    return Status::Internal("strata bench kernels printed no figures");
  *decode = j["decode"][0].value("tokens_per_s", 0.0);
  if (prefill != nullptr) *prefill = j["prefill"].value("tokens_per_s", 0.0);
  if (!(*decode > 0) || (prefill != nullptr && !(*prefill > 0)))
    return Status::Internal("strata bench kernels printed a figure that is not positive");
  if (bytes != nullptr) {
    bytes->decode_bytes = j["decode"][0].value("bytes_per_step", 0.0);
    if (j.contains("limits") && j["limits"].is_object())
      bytes->read_gbs = j["limits"].value("read_bandwidth_gbs", 0.0);
    if (!(bytes->decode_bytes > 0) || !(bytes->read_gbs > 0))
      return Status::Internal("strata bench kernels printed no bytes per step or read bandwidth");
  }
  return Status::Ok();
}

// GB/s a decode at tokens_per_s reads, as a share of the streaming read.
double ReadShare(double tokens_per_s, const Figures& s) {
  return tokens_per_s * s.decode_bytes / 1e9 / s.read_gbs;
}

Result<Figures> RunStrata(const VsFlags& f) {
  Figures r;
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) return Status::Internal("cannot find this executable: " + ec.message());
  const std::string base = Quote(self) + " bench kernels --log-level warn --model " + Quote(f.model) +
                           " --threads " + std::to_string(f.threads) + " --json" +
                           (f.int8_activations ? " --int8-activations" : "") +
                           (f.exact_activations ? " --exact-activations" : "");
  STRATA_ASSIGN_OR_RETURN(std::string out, Capture(base + " --context 64 --batches 1 --prefill 512"));
  STRATA_RETURN_IF_ERROR(ReadKernels(out, &r.decode, &r.prefill, &r));
  if (f.batched) {
    STRATA_ASSIGN_OR_RETURN(std::string b, Capture(base + " --context " + std::to_string(f.batched_context) +
                                                           " --batches 32 --prefill 16"));
    STRATA_RETURN_IF_ERROR(ReadKernels(b, &r.batched, nullptr));
  }
  return r;
}

int RunVs(const VsFlags& f) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "strata bench vs-llamacpp: %s\n", s.message().c_str());
    return 1;
  };
  auto bench = FindTool(f.llamacpp_dir, "llama-bench");
  if (!bench) return fail(bench.error());
  std::string batched;
  if (f.batched) {
    auto b = FindTool(f.llamacpp_dir, "llama-batched-bench");
    if (!b) return fail(b.error().WithContext("--no-batched skips the batched figure"));
    batched = *b;
  }
  const std::string batched_name = "batched_32x" + std::to_string(f.batched_context);
  const char* names[] = {"decode_b1", "prefill_512", batched_name.c_str()};
  std::vector<double> ratios[3];
  std::vector<double> shares[2];  // decode_b1's read share: Strata, llama.cpp
  nlohmann::json rounds = nlohmann::json::array();
  for (int round = 0; round < f.rounds; ++round) {
    Figures s, l;
    // Alternate which engine goes first: the VM's bandwidth drifts by the minute.
    for (int k = 0; k < 2; ++k) {
      const bool strata_now = (k == 0) == (round % 2 == 0);
      if (strata_now) {
        auto r = RunStrata(f);
        if (!r) return fail(r.error());
        s = *r;
      } else {
        auto r = RunLlama(f, *bench, batched);
        if (!r) return fail(r.error());
        l = *r;
      }
    }
    const double sv[3] = {s.decode, s.prefill, s.batched}, lv[3] = {l.decode, l.prefill, l.batched};
    nlohmann::json jr = {{"round", round + 1}, {"first", round % 2 == 0 ? "strata" : "llama.cpp"}};
    for (int i = 0; i < (f.batched ? 3 : 2); ++i) {
      const double ratio = lv[i] > 0 ? sv[i] / lv[i] : 0;
      ratios[i].push_back(ratio);
      jr[names[i]] = {{"strata_tokens_per_s", sv[i]}, {"llamacpp_tokens_per_s", lv[i]}, {"ratio", ratio}};
    }
    // Batch-1 decode streams the weights: each engine's read rate next to
    // the machine's, measured in the same round.
    shares[0].push_back(ReadShare(s.decode, s));
    shares[1].push_back(ReadShare(l.decode, s));
    jr["decode_b1"]["bytes_per_token"] = s.decode_bytes;
    jr["decode_b1"]["read_bandwidth_gbs"] = s.read_gbs;
    jr["decode_b1"]["strata_read_share"] = shares[0].back();
    jr["decode_b1"]["llamacpp_read_share"] = shares[1].back();
    rounds.push_back(jr);
    if (!f.json) {
      std::printf("round %d (%s first):", round + 1, round % 2 == 0 ? "strata" : "llama.cpp");
      for (int i = 0; i < (f.batched ? 3 : 2); ++i)
        std::printf("  %s %.1f / %.1f tok/s = %.3f", names[i], sv[i], lv[i], ratios[i].back());
      std::printf("\n  decode_b1 reads %.2f GB/token: Strata %.2f, llama.cpp %.2f of the streaming read (%.1f GB/s)\n",
                  s.decode_bytes / 1e9, shares[0].back(), shares[1].back(), s.read_gbs);
      std::fflush(stdout);
    }
  }
  nlohmann::json summary = nlohmann::json::object();
  for (int i = 0; i < (f.batched ? 3 : 2); ++i) {
    const bench::Distribution d = bench::Describe(ratios[i]);
    summary[names[i]] = {{"median_ratio", d.p50}, {"min_ratio", d.min}};
  }
  summary["decode_b1"]["strata_median_read_share"] = bench::Describe(shares[0]).p50;
  summary["decode_b1"]["llamacpp_median_read_share"] = bench::Describe(shares[1]).p50;
  if (f.json) {
    nlohmann::json j = {{"model", f.model},
                        {"threads", f.threads},
                        {"activations", f.int8_activations ? "int8" : f.exact_activations ? "exact" : "auto"},
                        {"rounds", rounds},
                        {"summary", summary}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    for (auto& [k, v] : summary.items())
      std::printf("%-16s median ratio %.3f, lowest round %.3f (Strata / llama.cpp; > 1: Strata faster)\n", k.c_str(),
                  v["median_ratio"].get<double>(), v["min_ratio"].get<double>());
    std::printf("decode_b1        median read share: Strata %.2f, llama.cpp %.2f (1.0: the streaming read rate)\n",
                summary["decode_b1"]["strata_median_read_share"].get<double>(),
                summary["decode_b1"]["llamacpp_median_read_share"].get<double>());
  }
  return 0;
}

}  // namespace

void RegisterBenchVsLlamacpp(CLI::App* bench, int* exit_code) {
  auto f = std::make_shared<VsFlags>();
  CLI::App* vs = bench->add_subcommand(
      "vs-llamacpp", "Strata against llama.cpp on the same file, alternating rounds, as ratios");
  vs->add_option("--llamacpp-dir", f->llamacpp_dir, "llama.cpp checkout or build (has build/bin/llama-bench)")
      ->required()
      ->check(CLI::ExistingDirectory);
  vs->add_option("--model", f->model, "GGUF file both engines load")->required()->check(CLI::ExistingFile);
  vs->add_option("--rounds", f->rounds, "alternating rounds")->check(CLI::Range(1, 1000))->capture_default_str();
  vs->add_option("--threads", f->threads, "threads for both engines")->check(CLI::Range(1, 1024))->capture_default_str();
  vs->add_option("--batched-context", f->batched_context,
                 "tokens of context of each of the 32 sequences in the batched figure")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  vs->add_flag("!--no-batched", f->batched, "skip the batched decode figure (32 x 512, llama-batched-bench)");
  AddActivationFlags(vs, &f->int8_activations, &f->exact_activations);
  vs->add_flag("--json", f->json, "print one JSON object");
  vs->callback([f, exit_code] { *exit_code = RunVs(*f); });
}

}  // namespace strata::cli
