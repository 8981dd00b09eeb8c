// The policy and audit families: policy.subscribe and policy.decide (approvers), policy.list,
// policy.set, policy.revoke, policy.reset, policy.check (a diagnostic that runs the whole
// authorization for one key, prompt included) and audit.tail. Registered on the main thread.
#pragma once

#include "daemon/config.h"
#include "daemon/disk_thread.h"
#include "daemon/method_table.h"
#include "policy/approvals.h"
#include "policy/audit.h"
#include "policy/decisions.h"
#include "registry/registry.h"

namespace toolhost::daemon {

// Every reference must outlive the server.
struct PolicyServices {
  registry::Registry& registry;
  policy::DecisionStore& decisions;
  policy::ApprovalBroker& approvals;
  policy::AuditLog& audit;
  DiskThread& disk;  // decisions are stored and the audit log read there
  const ConfigHolder& configs;  // [policy] prompt_timeout_ms, read per prompt
};

void registerPolicyMethods(MethodTable& methods, PolicyServices services);

}  // namespace toolhost::daemon
