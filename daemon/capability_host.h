// What sandboxed tools may ask of the core (ctx.resolveInvocation, ctx.createSubtasksResult),
// answered from the registry and the task store. Thread-safe: called on V8 worker threads.
#pragma once

#include "registry/registry.h"
#include "registry/tasks.h"
#include "runtime/capability_host.h"

namespace toolhost::daemon {

class DaemonCapabilityHost final : public runtime::CapabilityHost {
 public:
  DaemonCapabilityHost(registry::Registry& registry, registry::TaskStore& tasks)
      : registry_(registry), tasks_(tasks) {}

  boost::system::result<boost::json::object, std::string> resolveInvocation(
      const registry::ToolRevision& caller, const std::string& name) override;
  boost::system::result<boost::json::array, std::string> createSubtasks(
      const registry::ToolRevision& caller, const boost::json::value& drafts,
      const boost::json::object& invocation) override;

 private:
  registry::Registry& registry_;
  registry::TaskStore& tasks_;
};

}  // namespace toolhost::daemon
