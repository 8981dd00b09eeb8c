// The sandboxes family: sandboxes.list and sandboxes.terminate (admin). Registered on the main
// thread.
#pragma once

#include "daemon/method_table.h"
#include "runtime/tool_runner.h"

namespace toolhost::daemon {

void registerSandboxMethods(MethodTable& methods, runtime::ToolRunner& sandboxes);

}  // namespace toolhost::daemon
