// The tasks family: tasks.compile, tasks.commit, tasks.get, tasks.lineage, tasks.providerTools and
// tasks.messages, for agents (and admins). Registered on the main thread; the handlers run on the
// I/O threads and reach the store only through the TaskStore's own short transactions; a commit's
// write runs on the disk thread.
#pragma once

#include "daemon/disk_thread.h"
#include "daemon/method_table.h"
#include "registry/tasks.h"
#include "runtime/tool_runner.h"

namespace toolhost::daemon {

// `tasks` and `disk` must outlive the method table's use (the server).
// Commits run on `disk`; the reads that walk a lineage (compile, get, lineage, providerTools,
// messages) on `reads`, so that neither an I/O thread nor the writes wait for them. With
// `sandboxes`, tasks.compile compiles the modules of code definitions there (null: it does not).
void registerTaskMethods(MethodTable& methods, registry::TaskStore& tasks, DiskThread& disk,
                         DiskThread& reads, runtime::ToolRunner* sandboxes = nullptr);

}  // namespace toolhost::daemon
