#pragma once
// Runs the official `openai` npm client (tests/reference/openai_client.mjs)
// against a server, for the tests that check Strata's API with a client
// nobody here wrote. Needs node and tests/reference/node_modules/openai
// (scripts/setup-test-refs.sh); without them STRATA_NEED_OPENAI() skips the
// test, or fails it when STRATA_REQUIRE_REFS=1 (CI). Header-only.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/e2e/server/serve_test_util.h"
#include "tests/support/run_command.h"
#include "tests/support/test_env.h"

namespace strata {

using testing::json;
using testing::ServerProcess;

inline bool RefsRequired() {
  const char* e = std::getenv("STRATA_REQUIRE_REFS");
  return e != nullptr && std::string(e) == "1";
}

// Empty when node and the openai package are usable; otherwise why not.
inline std::string WhyNoOpenAi() {
  const std::string dir = testing::ReferenceDir();
  if (!std::filesystem::exists(dir + "/openai_client.mjs")) return "missing " + dir + "/openai_client.mjs";
  if (!std::filesystem::exists(dir + "/node_modules/openai/package.json")) {
    return "the openai npm package is not installed under " + dir + "/node_modules";
  }
  if (std::system("node --version >/dev/null 2>&1") != 0) return "node is not on PATH";
  return "";
}

// GTEST_SKIP/FAIL must return from the test body, hence a macro.
#define STRATA_NEED_OPENAI()                                                                         \
  do {                                                                                               \
    const std::string why_ = WhyNoOpenAi();                                                          \
    if (!why_.empty()) {                                                                             \
      if (RefsRequired()) FAIL() << "openai client required (STRATA_REQUIRE_REFS=1): " << why_;      \
      GTEST_SKIP() << why_ << " (scripts/setup-test-refs.sh installs it; CI sets STRATA_REQUIRE_REFS=1)"; \
    }                                                                                                \
  } while (0)

// Runs the driver with {"base_url", "api_key", "calls"} and returns its
// results array (one entry per call); fails the test on a driver error.
inline json RunClient(const ServerProcess& server, const json& calls, const std::string& api_key = "") {
  json input = {{"base_url", server.base_url() + "/v1"}, {"calls", calls}, {"timeout_seconds", 120}};
  if (!api_key.empty()) input["api_key"] = api_key;
  const std::string dir = testing::MakeTempDir("strata-openai-");
  const std::string path = dir + "/input.json";
  std::ofstream(path) << input.dump();
  auto r = testing::RunCommand("node " + testing::ShellQuote(testing::ReferenceDir() + "/openai_client.mjs") + " < " +
                               testing::ShellQuote(path));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  json out = json::parse(r.out, nullptr, false);
  if (out.is_discarded() || !out.contains("results") || out["results"].size() != calls.size()) {
    ADD_FAILURE() << "driver output: " << r.out << "\nstderr: " << r.err;
    return json::array();
  }
  return out["results"];
}

}  // namespace strata
