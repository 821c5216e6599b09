#include "tests/support/transfer_peer.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iterator>

#include "tests/support/run_command.h"

namespace strata::testing {

transfer::BatchResult WaitBounded(transfer::TransferEngine& e, uint64_t batch, std::chrono::seconds limit) {
  auto until = transfer::Clock::now() + limit;
  while (transfer::Clock::now() < until) {
    if (auto r = e.Poll(batch)) return std::move(*r);
    usleep(200);
  }
  ADD_FAILURE() << "transfer batch " << batch << " did not complete within " << limit.count() << " s";
  return transfer::BatchResult{Status::Internal("never completed"), {}, 0, 0};
}

TransferPeer::TransferPeer(const std::string& name, const std::vector<std::string>& args) {
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) {
    ADD_FAILURE() << "pipe failed";
    return;
  }
  std::string cli = StrataCli();
  std::vector<std::string> argv_s = {cli, "transfer", "serve", "--name", name};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  pid_ = fork();
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed test
    dup2(to_child[0], 0);
    dup2(from_child[1], 1);
    ::close(to_child[1]);
    ::close(from_child[0]);
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(cli.c_str(), argv.data());
    _exit(127);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  in_ = to_child[1];
  out_ = from_child[0];
  std::string line = ReadLine(20000);
  if (line.rfind("ready ", 0) != 0) {
    ADD_FAILURE() << "transfer peer " << name << " did not start: '" << line << "'";
    return;
  }
  port_ = std::stoi(line.substr(6));
}

TransferPeer::~TransferPeer() {
  if (in_ >= 0) ::close(in_);
  if (!reaped_ && pid_ > 0) {
    // End of input makes it exit; a stopped or stuck one is killed.
    for (int i = 0; i < 100; ++i) {
      int st;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        reaped_ = true;
        break;
      }
      usleep(50000);
    }
    if (!reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  if (out_ >= 0) ::close(out_);
}

std::string TransferPeer::ReadLine(int timeout_ms) {
  while (true) {
    size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    pollfd p{out_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return "";
    char buf[4096];
    ssize_t n = read(out_, buf, sizeof(buf));
    if (n <= 0) return "";
    buffer_.append(buf, static_cast<size_t>(n));
  }
}

std::string TransferPeer::Call(const std::string& command) {
  std::string line = command + "\n";
  if (write(in_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return "";
  return ReadLine(30000);
}

std::string TransferPeer::Ok(const std::string& command) {
  std::string r = Call(command);
  if (r.rfind("ok", 0) != 0) {
    ADD_FAILURE() << "'" << command << "' answered '" << r << "'";
    return "";
  }
  return r.size() > 3 ? r.substr(3) : "";
}

void TransferPeer::Kill(int sig) {
  if (pid_ <= 0 || reaped_) return;
  kill(pid_, sig);
  if (sig != SIGSTOP) return;
  // kill() returns before the process stops: wait until it has (state T).
  for (int i = 0; i < 2000; ++i) {
    std::ifstream stat("/proc/" + std::to_string(pid_) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    size_t close = text.rfind(')');
    if (close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'T') return;
    usleep(1000);
  }
  ADD_FAILURE() << "the peer did not stop";
}

int TransferPeer::Wait() {
  if (reaped_ || pid_ <= 0) return 0;
  int st = 0;
  waitpid(pid_, &st, 0);
  reaped_ = true;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
}

}  // namespace strata::testing
