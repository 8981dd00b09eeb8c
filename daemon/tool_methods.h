// The tools family: tools.install, tools.activate, tools.configure, tools.get, tools.list,
// tools.history, tools.call, and store.verify. Registered on the main thread.
#pragma once

#include "daemon/method_table.h"
#include "registry/registry.h"

namespace toolhost::runtime {
class SandboxPool;
}

namespace toolhost::daemon {

struct ToolServices {
  registry::Registry& registry;
  runtime::SandboxPool* sandboxes = nullptr;  // null until the runtime is wired
};

void registerToolMethods(MethodTable& methods, ToolServices services);

}  // namespace toolhost::daemon
