#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>
#include <string>

namespace strata {

void InitLogging() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("strata");
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %v");
    spdlog::set_default_logger(logger);
  });
}

Status SetLogLevel(std::string_view level) {
  InitLogging();
  auto lvl = spdlog::level::from_str(std::string(level));
  // from_str maps unknown names to "off"; treat that as an error unless asked for.
  if (lvl == spdlog::level::off && level != "off") {
    return Status::InvalidArgument("unknown log level '" + std::string(level) +
                                   "' (expected trace, debug, info, warn, error or off)");
  }
  spdlog::set_level(lvl);
  return Status::Ok();
}

}  // namespace strata
