// The storage family, for operators: storage.list (what each tool stores, or one tool's keys with
// their sizes), storage.get (one value) and storage.clear (everything a tool name stores). Admin
// only. Registered on the main thread; the handlers run short LMDB transactions on I/O threads.
#pragma once

#include "daemon/method_table.h"
#include "registry/tool_storage.h"

namespace toolhost::daemon {

void registerStorageMethods(MethodTable& methods, registry::ToolStorage& storage);

}  // namespace toolhost::daemon
