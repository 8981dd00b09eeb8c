// The storage family, for operators: storage.list (what each tool stores, or one tool's keys with
// their sizes), storage.get (one value) and storage.clear (everything a tool name stores). Admin
// only. Registered on the main thread; the handlers run short LMDB read transactions on I/O
// threads, and storage.clear's write on the disk thread.
#pragma once

#include "daemon/disk_thread.h"
#include "daemon/method_table.h"
#include "registry/registry.h"
#include "registry/tool_storage.h"

namespace toolhost::daemon {

// `registry` tells a name no tool ever had (a typo) from one that keeps nothing.
void registerStorageMethods(MethodTable& methods, registry::ToolStorage& storage,
                            registry::Registry& registry, DiskThread& disk);

}  // namespace toolhost::daemon
