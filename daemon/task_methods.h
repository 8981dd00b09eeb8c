// The tasks family: tasks.compile, tasks.commit, tasks.get, tasks.lineage, tasks.providerTools and
// tasks.messages, for agents (and admins). Registered on the main thread; the handlers run on the
// I/O threads and reach the store only through the TaskStore's own short transactions.
#pragma once

#include "daemon/method_table.h"
#include "registry/tasks.h"

namespace toolhost::daemon {

// `tasks` must outlive the method table's use (the server).
void registerTaskMethods(MethodTable& methods, registry::TaskStore& tasks);

}  // namespace toolhost::daemon
