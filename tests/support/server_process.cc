#include "tests/support/server_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "model/gguf_export.h"
#include "model/gguf_tokenizer.h"
#include "model/synth.h"
#include "tests/support/run_command.h"
#include "tests/support/test_env.h"

extern char** environ;

namespace strata::testing {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Decodes a chunked transfer-encoded body; returns the input when malformed
// (tests then see the raw bytes in their failure message).
std::string Dechunk(const std::string& in) {
  std::string out;
  size_t pos = 0;
  while (pos < in.size()) {
    size_t eol = in.find("\r\n", pos);
    if (eol == std::string::npos) return in;
    size_t len = 0;
    try {
      len = std::stoul(in.substr(pos, eol - pos), nullptr, 16);
    } catch (...) {
      return in;
    }
    pos = eol + 2;
    if (len == 0) return out;
    if (pos + len > in.size()) return in;
    out.append(in, pos, len);
    pos += len + 2;
  }
  return out;
}

// Reads VmRSS / VmHWM ("NAME:   123 kB") of /proc/PID/status.
std::optional<int64_t> ProcStatusKb(pid_t pid, const char* field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  if (!in) return std::nullopt;
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') {
      return std::strtoll(line.c_str() + n + 1, nullptr, 10) * 1024;
    }
  }
  return std::nullopt;
}

}  // namespace

// ---- ServerProcess ----------------------------------------------------------

RoleOptions ServeRole() {
  RoleOptions r;
  r.zero_port_flags = {"--port", "--grpc-port"};
  r.port_file_flag = "--port-file";
  r.host_flag = true;
  r.ready_path = "/health";
  return r;
}

Result<std::unique_ptr<ServerProcess>> ServerProcess::Start(const std::vector<std::string>& args,
                                                            const ServerStartOptions& options) {
  return StartRole("serve", args, ServeRole(), options);
}

int ServerProcess::port(const std::string& name) const {
  for (const auto& [k, v] : ports_)
    if (k == name) return v;
  return 0;
}

Result<std::unique_ptr<ServerProcess>> ServerProcess::StartRole(const std::string& subcommand,
                                                                const std::vector<std::string>& args,
                                                                const RoleOptions& role,
                                                                const ServerStartOptions& options) {
  std::unique_ptr<ServerProcess> p(new ServerProcess());
  p->dir_ = MakeTempDir("strata-role-");
  const std::string port_file = p->dir_ + "/ports.json";
  const std::string binary = options.binary.empty() ? StrataCli() : options.binary;

  std::vector<std::string> argv_s = {binary};
  {
    std::istringstream words(subcommand);
    for (std::string w; words >> w;) argv_s.push_back(w);
  }
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  if (role.host_flag) {
    argv_s.push_back("--host");
    argv_s.push_back("127.0.0.1");
  }
  for (const auto& flag : role.zero_port_flags) {
    argv_s.push_back(flag);
    argv_s.push_back("0");
  }
  if (!role.port_file_flag.empty()) {
    argv_s.push_back(role.port_file_flag);
    argv_s.push_back(port_file);
  }

  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; ++e) env_s.emplace_back(*e);
  env_s.insert(env_s.end(), options.extra_env.begin(), options.extra_env.end());
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);

  const std::string out_path = p->dir_ + "/stdout";
  const std::string err_path = p->dir_ + "/stderr";
  int out_fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out_fd < 0 || err_fd < 0) return Status::IoError("open", err_path, errno);
  const pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) return Status::IoError("fork", binary, errno);
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    ::execve(binary.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(out_fd);
  ::close(err_fd);
  p->pid_ = pid;

  auto fail = [&](const std::string& why) -> Status {
    std::string cmd;
    for (const auto& a : argv_s) cmd += (cmd.empty() ? "" : " ") + a;
    return Status::Unavailable("strata " + subcommand + " did not become ready: " + why + "\ncommand: " + cmd +
                               "\n--- stderr (tail) ---\n" + p->stderr_tail(6000));
  };
  auto exited = [&]() -> std::string {
    return "it exited with code " + std::to_string(p->exit_code_) + " before it was ready";
  };

  const auto t0 = Clock::now();
  // 1. The port file: {"http": P, "grpc": G, ...}, written once the role
  // listens. It may be seen half-written, so parse errors are retried.
  while (!role.port_file_flag.empty()) {
    if (p->Reap(false)) return fail(exited());
    if (SecondsSince(t0) > options.ready_timeout_seconds) {
      return fail("no port file " + port_file + " after " + std::to_string(options.ready_timeout_seconds) + " s");
    }
    std::string text = ReadFile(port_file);
    if (!text.empty()) {
      auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && !j.empty()) {
        for (const auto& [k, v] : j.items())
          if (v.is_number_integer()) p->ports_.emplace_back(k, v.get<int>());
        p->http_port_ = p->port("http");
        p->grpc_port_ = p->port("grpc");
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // 2. The ready path (serve: /health, 503 while the model loads, then 200).
  std::string last;
  while (!role.ready_path.empty()) {
    if (p->Reap(false)) return fail(exited());
    if (SecondsSince(t0) > options.ready_timeout_seconds) {
      return fail("GET " + role.ready_path + " was not 200 after " + std::to_string(options.ready_timeout_seconds) +
                  " s; last answer: " + last);
    }
    if (p->http_port_ <= 0) return fail("the port file has no \"http\" port for " + role.ready_path);
    SimpleHttpResponse r = SimpleHttp(p->http_port_, "GET", role.ready_path, "", {}, 5);
    if (r.status == 200) break;
    last = r.status == 0 ? r.error : std::to_string(r.status) + " " + r.body.substr(0, 200);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return p;
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    Reap(true);
  }
}

std::string ServerProcess::base_url() const { return "http://127.0.0.1:" + std::to_string(http_port_); }

std::optional<int64_t> ServerProcess::RssBytes() const { return ProcStatusKb(pid_, "VmRSS"); }
std::optional<int64_t> ServerProcess::PeakRssBytes() const { return ProcStatusKb(pid_, "VmHWM"); }

bool ServerProcess::alive() const {
  if (pid_ <= 0 || reaped_) return false;
  siginfo_t info{};
  // WNOWAIT: look without reaping, so Stop() still gets the exit code.
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) return false;
  return info.si_pid == 0;
}

bool ServerProcess::Reap(bool block) {
  if (reaped_) return true;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, block ? 0 : WNOHANG);
  if (r == 0) return false;
  reaped_ = true;
  if (r < 0) return true;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return true;
}

Result<int> ServerProcess::Stop(double timeout_seconds) {
  if (pid_ <= 0) return Status::InvalidArgument("no server process");
  if (Reap(false)) {
    return Status::Unavailable("the server had already exited (code " + std::to_string(exit_code_) +
                               ") before SIGTERM\n--- server stderr (tail) ---\n" + stderr_tail());
  }
  ::kill(pid_, SIGTERM);
  return Wait(timeout_seconds);
}

bool ServerProcess::Signal(int sig) {
  if (pid_ <= 0 || Reap(false)) return false;
  return ::kill(pid_, sig) == 0;
}

Result<int> ServerProcess::Wait(double timeout_seconds) {
  if (pid_ <= 0) return Status::InvalidArgument("no server process");
  const auto t0 = Clock::now();
  while (!Reap(false)) {
    if (SecondsSince(t0) > timeout_seconds) {
      ::kill(pid_, SIGKILL);
      Reap(true);
      return Status::Unavailable("the server did not exit within " + std::to_string(timeout_seconds) +
                                 " s (killed)\n--- server stderr (tail) ---\n" + stderr_tail());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return exit_code_;
}

std::string ServerProcess::stderr_text() const { return ReadFile(dir_ + "/stderr"); }
std::string ServerProcess::stdout_text() const { return ReadFile(dir_ + "/stdout"); }

std::string ServerProcess::stderr_tail(size_t max_bytes) const {
  std::string s = stderr_text();
  return s.size() <= max_bytes ? s : "..." + s.substr(s.size() - max_bytes);
}

Result<std::string> TinyModelPath() {
  static std::mutex mu;
  static std::string path;
  std::lock_guard<std::mutex> lock(mu);
  if (!path.empty()) return path;
  STRATA_ASSIGN_OR_RETURN(ModelConfig config, SynthPresetConfig("tiny", 0));
  const std::string out = MakeTempDir("strata-tiny-") + "/tiny.gguf";
  STRATA_RETURN_IF_ERROR(WriteSyntheticGguf(config, SyntheticVocab(config.vocab_size), SynthOptions{}, out));
  path = out;
  return path;
}

// ---- SimpleHttp ------------------------------------------------------------------

std::string SimpleHttpResponse::header(const std::string& name) const {
  const std::string key = Lower(name) + ":";
  size_t pos = 0;
  while (pos < headers.size()) {
    size_t eol = headers.find("\r\n", pos);
    if (eol == std::string::npos) eol = headers.size();
    if (headers.compare(pos, key.size(), key) == 0) {
      std::string v = headers.substr(pos + key.size(), eol - pos - key.size());
      size_t b = v.find_first_not_of(" \t");
      size_t e = v.find_last_not_of(" \t");
      return b == std::string::npos ? std::string() : v.substr(b, e - b + 1);
    }
    pos = eol + 2;
  }
  return "";
}

SimpleHttpResponse SimpleHttp(int port, const std::string& method, const std::string& target,
                              const std::string& body, const std::vector<std::string>& extra_headers,
                              double timeout_seconds) {
  SimpleHttpResponse r;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    r.error = std::string("socket: ") + std::strerror(errno);
    return r;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    r.error = std::string("connect: ") + std::strerror(errno);
    ::close(fd);
    return r;
  }
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
                    "\r\nConnection: close\r\n";
  bool has_type = false;
  for (const auto& h : extra_headers) {
    req += h + "\r\n";
    if (Lower(h).rfind("content-type:", 0) == 0) has_type = true;
  }
  if (!body.empty() || method == "POST" || method == "PUT") {
    if (!has_type) req += "Content-Type: application/json\r\n";
    req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  }
  req += "\r\n";
  req += body;

  const auto t0 = Clock::now();
  auto remaining_ms = [&] {
    double left = timeout_seconds - SecondsSince(t0);
    return left <= 0 ? 0 : static_cast<int>(left * 1000) + 1;
  };
  // Send everything (the server may answer early, e.g. 413, and close: a
  // failed send is then not an error, the answer is read below).
  size_t sent = 0;
  while (sent < req.size()) {
    ssize_t n = ::send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    sent += static_cast<size_t>(n);
  }
  std::string raw;
  char buf[65536];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    int ms = remaining_ms();
    if (ms == 0) {
      r.error = "timeout after " + std::to_string(timeout_seconds) + " s";
      break;
    }
    int pr = ::poll(&p, 1, ms);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue;  // the timeout check above ends the loop
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // closed (or reset after an early answer)
    raw.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);

  size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) {
    if (r.error.empty()) r.error = raw.empty() ? "connection closed without a response" : "incomplete response: " + raw;
    return r;
  }
  std::string head = raw.substr(0, end);
  std::string content = raw.substr(end + 4);
  size_t line_end = head.find("\r\n");
  std::string status_line = head.substr(0, line_end);
  if (status_line.rfind("HTTP/1.", 0) != 0 || status_line.size() < 12) {
    r.error = "bad status line: " + status_line;
    return r;
  }
  r.status = std::atoi(status_line.c_str() + 9);
  // Lower-case the header names (not the values).
  std::string hdrs = line_end == std::string::npos ? "" : head.substr(line_end + 2);
  size_t pos = 0;
  while (pos < hdrs.size()) {
    size_t eol = hdrs.find("\r\n", pos);
    if (eol == std::string::npos) eol = hdrs.size();
    size_t colon = hdrs.find(':', pos);
    if (colon != std::string::npos && colon < eol) {
      for (size_t i = pos; i < colon; ++i) hdrs[i] = static_cast<char>(std::tolower(static_cast<unsigned char>(hdrs[i])));
    }
    pos = eol + 2;
  }
  r.headers = hdrs;
  r.body = Lower(r.header("transfer-encoding")).find("chunked") != std::string::npos ? Dechunk(content) : content;
  if (r.error.rfind("timeout", 0) == 0) r.status = 0;  // incomplete
  return r;
}

// ---- Prometheus text -----------------------------------------------------------

namespace {

// Splits a sample line into name, label text (without braces) and value.
bool ParseSample(const std::string& line, std::string* name, std::string* labels, double* value) {
  if (line.empty() || line[0] == '#') return false;
  size_t i = 0;
  while (i < line.size() && (std::isalnum(static_cast<unsigned char>(line[i])) || line[i] == '_' || line[i] == ':')) ++i;
  *name = line.substr(0, i);
  labels->clear();
  if (i < line.size() && line[i] == '{') {
    // Label values may hold '}' inside quotes.
    size_t j = i + 1;
    bool quoted = false;
    for (; j < line.size(); ++j) {
      if (line[j] == '\\' && quoted) {
        ++j;
        continue;
      }
      if (line[j] == '"') quoted = !quoted;
      if (line[j] == '}' && !quoted) break;
    }
    if (j >= line.size()) return false;
    *labels = line.substr(i + 1, j - i - 1);
    i = j + 1;
  }
  while (i < line.size() && line[i] == ' ') ++i;
  if (i >= line.size()) return false;
  std::string v = line.substr(i);
  v = v.substr(0, v.find(' '));  // drop a timestamp
  if (v == "+Inf") *value = HUGE_VAL;
  else if (v == "-Inf") *value = -HUGE_VAL;
  else if (v == "NaN") *value = std::nan("");
  else {
    char* endp = nullptr;
    *value = std::strtod(v.c_str(), &endp);
    if (endp == v.c_str()) return false;
  }
  return true;
}

// Splits `a="x",b="y"` into its pairs as written (`a="x"`).
std::vector<std::string> LabelPairs(const std::string& labels) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < labels.size()) {
    size_t eq = labels.find('=', i);
    if (eq == std::string::npos || eq + 1 >= labels.size() || labels[eq + 1] != '"') break;
    size_t j = eq + 2;
    while (j < labels.size() && labels[j] != '"') j += labels[j] == '\\' ? 2 : 1;
    std::string pair = labels.substr(i, j + 1 - i);
    size_t b = pair.find_first_not_of(' ');
    out.push_back(pair.substr(b));
    i = j + 1;
    while (i < labels.size() && (labels[i] == ',' || labels[i] == ' ')) ++i;
  }
  return out;
}

}  // namespace

std::optional<double> MetricValue(const std::string& text, const std::string& name, const std::string& labels) {
  const std::vector<std::string> want = LabelPairs(labels);
  std::optional<double> first_labelled;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::string n, l;
    double v = 0;
    if (!ParseSample(line, &n, &l, &v) || n != name) continue;
    if (want.empty()) {
      if (l.empty()) return v;
      if (!first_labelled) first_labelled = v;
      continue;
    }
    const std::vector<std::string> have = LabelPairs(l);
    bool all = true;
    for (const auto& w : want) {
      bool found = false;
      for (const auto& h : have) found = found || h == w;
      all = all && found;
    }
    if (all) return v;
  }
  return first_labelled;
}

double MetricSum(const std::string& text, const std::string& name) {
  double sum = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::string n, l;
    double v = 0;
    if (ParseSample(line, &n, &l, &v) && n == name) sum += v;
  }
  return sum;
}

bool HasMetric(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE " + name + " ", 0) == 0 || line.rfind("# HELP " + name + " ", 0) == 0) return true;
    std::string n, l;
    double v = 0;
    if (ParseSample(line, &n, &l, &v) && n == name) return true;
  }
  return false;
}

}  // namespace strata::testing
