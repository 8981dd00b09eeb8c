// The meta family: rpc.discover, ping, daemon.info, daemon.health. Registered on the main thread.
#pragma once

#include "daemon/config.h"
#include "daemon/method_table.h"

#include <boost/json/object.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace toolhost::daemon {

// A named health check: returns {ok: bool, ...details}. Called on an I/O thread.
struct HealthCheck {
  std::string name;
  std::function<boost::json::object()> check;
};

struct DaemonFacts {
  std::string version;
  std::string malloc;  // the allocator serving the process: "mimalloc 2.0.9" or "libc"
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::chrono::system_clock::time_point startedWall = std::chrono::system_clock::now();
  const ConfigHolder* config = nullptr;  // the configuration in force (a reload swaps it)
  std::function<std::size_t()> connectionCount;
  std::vector<HealthCheck> healthChecks;
};

void registerMetaMethods(MethodTable& methods, const DaemonFacts& facts);


}  // namespace toolhost::daemon
