#pragma once
// Logging through spdlog. Modules log with STRATA_LOG_INFO(...) etc. using
// fmt-style format strings; the level is set once at start.

#include <spdlog/spdlog.h>

#include <string_view>

#include "common/status.h"

namespace strata {

// Sets the global level from "trace|debug|info|warn|error|off".
Status SetLogLevel(std::string_view level);
// Sends logs to stderr (the default), so stdout stays clean for --json output.
void InitLogging();

}  // namespace strata

#define STRATA_LOG_TRACE(...) SPDLOG_TRACE(__VA_ARGS__)
#define STRATA_LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define STRATA_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define STRATA_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define STRATA_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
