// The sandboxes family: sandboxes.list and sandboxes.terminate (admin). Registered on the main
// thread.
#pragma once

#include "daemon/method_table.h"
#include "runtime/sandbox_pool.h"

namespace toolhost::daemon {

void registerSandboxMethods(MethodTable& methods, runtime::SandboxPool& sandboxes);

}  // namespace toolhost::daemon
