// The `strata` executable: dispatches subcommands (DESIGN.md "Process roles").

#include <CLI/CLI.hpp>

#include <cstdio>

#include "common/logging.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  strata::InitLogging();
  CLI::App app{"Strata: an LLM inference server built around a tiered KV cache"};
  app.require_subcommand(1);
  app.fallthrough();  // global options (--log-level) may follow the subcommand
  app.set_version_flag("--version", "strata 0.1.0");
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")->capture_default_str();
  app.parse_complete_callback([&] {
    strata::Status s = strata::SetLogLevel(log_level);
    if (!s.ok()) throw CLI::ValidationError("--log-level", s.message());
  });
  int exit_code = 0;
  strata::cli::RegisterGenerate(app, &exit_code);
  strata::cli::RegisterModel(app, &exit_code);
  strata::cli::RegisterBench(app, &exit_code);
  strata::cli::RegisterServe(app, &exit_code);
  strata::cli::RegisterCache(app, &exit_code);
  strata::cli::RegisterTransfer(app, &exit_code);
  strata::cli::RegisterMeta(app, &exit_code);
  strata::cli::RegisterRouter(app, &exit_code);
  strata::cli::RegisterCluster(app, &exit_code);
  strata::cli::RegisterEval(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}
