#pragma once
// Runs a shell command for end-to-end tests and captures its output.

#include <string>

namespace strata::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `cmd` with /bin/sh; stdout and stderr captured separately.
CommandResult RunCommand(const std::string& cmd);
// Path of the strata binary under test ($STRATA_CLI).
std::string StrataCli();
// Quotes for the shell.
std::string ShellQuote(const std::string& s);

}  // namespace strata::testing
