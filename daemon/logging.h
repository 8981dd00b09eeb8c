// Process-wide logging set-up (spdlog's default logger, thread-safe): text for terminals, JSON
// lines for journald and collectors. Called on the main thread before anything else runs.
#pragma once

#include "daemon/config.h"

#include <string>

namespace toolhost::daemon {

void setupLogging(const std::string& level, LogFormat format);
void setLogLevel(const std::string& level);

}  // namespace toolhost::daemon
