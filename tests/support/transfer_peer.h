#pragma once
// A `strata transfer serve` process for tests: started with pipes on its
// stdin and stdout, driven one command line at a time (tools/cmd_transfer.cc
// lists the commands).

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "transfer/transfer_engine.h"

namespace strata::testing {

// Polls a transfer batch to completion; a batch that never completes fails
// the test (after `limit`) instead of hanging it.
transfer::BatchResult WaitBounded(transfer::TransferEngine& e, uint64_t batch,
                                  std::chrono::seconds limit = std::chrono::seconds(60));

class TransferPeer {
 public:
  // Starts `strata transfer serve --name NAME ARGS...` and waits for its
  // "ready PORT" line (fails the test when it does not come).
  TransferPeer(const std::string& name, const std::vector<std::string>& args);
  ~TransferPeer();
  TransferPeer(const TransferPeer&) = delete;
  TransferPeer& operator=(const TransferPeer&) = delete;

  bool started() const { return port_ > 0; }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // Sends one command, returns its reply line ("" when the process is gone).
  std::string Call(const std::string& command);
  // "ok X" → "X"; anything else fails the calling test and returns "".
  std::string Ok(const std::string& command);
  // Sends `sig`; for SIGSTOP, returns once the process has stopped.
  void Kill(int sig);
  // Waits for the process to exit; its exit status (or -signal).
  int Wait();

 private:
  std::string ReadLine(int timeout_ms);
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
  int port_ = 0;
  std::string buffer_;
  bool reaped_ = false;
};

}  // namespace strata::testing
