// Process-wide logging set-up (spdlog's default logger, thread-safe): text for terminals, JSON
// lines for journald and collectors. Called on the main thread before anything else runs.
#pragma once

#include "daemon/config.h"

#include <spdlog/formatter.h>

#include <memory>
#include <string>

namespace toolhost::daemon {

void setupLogging(const std::string& level, LogFormat format);
// The formatter of the JSON log: one object per line, always valid JSON, whatever the text.
std::unique_ptr<spdlog::formatter> jsonLogFormatter();
void setLogLevel(const std::string& level);

}  // namespace toolhost::daemon
