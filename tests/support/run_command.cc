#include "tests/support/run_command.h"

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tests/support/test_env.h"

namespace strata::testing {

std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') q += "'\\''";
    else q += c;
  }
  return q + "'";
}

std::string StrataCli() {
  const char* e = std::getenv("STRATA_CLI");
  return e != nullptr && *e != '\0' ? e : STRATA_DEFAULT_CLI;
}

CommandResult RunCommand(const std::string& cmd) {
  static std::string dir = MakeTempDir("strata-cmd-");
  std::string err_path = dir + "/stderr";
  CommandResult r;
  FILE* p = popen((cmd + " 2>" + ShellQuote(err_path)).c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(err_path);
  std::stringstream ss;
  ss << in.rdbuf();
  r.err = ss.str();
  return r;
}

}  // namespace strata::testing
