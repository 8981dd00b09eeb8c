// Times as the protocol, the logs and the stores write them: RFC 3339 in UTC with milliseconds,
// "2026-11-30T16:04:15.123Z". Thread-safe.
#pragma once

#include <chrono>
#include <string>

namespace toolhost::protocol {

std::string formatTime(std::chrono::system_clock::time_point time);

}  // namespace toolhost::protocol
