// The tools family: tools.install, tools.activate, tools.configure, tools.get, tools.list,
// tools.history, tools.call, and store.verify. Registered on the main thread.
#pragma once

#include "daemon/disk_thread.h"
#include "daemon/method_table.h"
#include "registry/registry.h"
#include "registry/tasks.h"

namespace toolhost::runtime {
class ToolRunner;
}

namespace toolhost::daemon {

class ExternalTools;
class SecretsHost;
class SubtaskLedger;

struct ToolServices {
  registry::Registry& registry;
  DiskThread& disk;  // installs, activations, settings and verifyAll run there
  runtime::ToolRunner* sandboxes = nullptr;  // null until the runtime is wired
  ExternalTools* external = nullptr;          // null: external-service tools are unavailable
  SecretsHost* secrets = nullptr;  // null: tools.activate does not report requested secrets
  registry::TaskStore* tasks = nullptr;  // null: store.verify does not check tasks
  DiskThread* checks = nullptr;          // large arguments are validated there (null: inline)
  const store::Store* store = nullptr;   // null: store.verify does not check the pages
  SubtaskLedger* subtasks = nullptr;     // null: tools.call answers no `subtasks`
  DiskThread* definitions = nullptr;  // lineage definitions are first compiled there (null: inline)
  // store.verify's page walk and store.backup's copy, which take as long as the database is
  // large: off the argument checks, which calls would wait behind (null: checks, else disk).
  DiskThread* maintenance = nullptr;
};

void registerToolMethods(MethodTable& methods, ToolServices services);

}  // namespace toolhost::daemon
