// The secrets family (admin): secrets.set stores a secret for one tool revision (the value only
// ever travels inward: no method answers it), secrets.list shows names, scopes and origins, and
// secrets.delete removes one. Registered on the main thread.
#pragma once

#include "daemon/config.h"
#include "daemon/disk_thread.h"
#include "daemon/method_table.h"
#include "policy/audit.h"
#include "policy/secrets_vault.h"
#include "registry/registry.h"

namespace toolhost::daemon {

// Every reference must outlive the server.
struct SecretServices {
  registry::Registry& registry;
  policy::SecretsVault& vault;
  policy::AuditLog& audit;
  DiskThread& disk;             // secrets are stored and deleted there
  const ConfigHolder& configs;  // [secrets] max_value_bytes, read per request
};

void registerSecretMethods(MethodTable& methods, SecretServices services);

}  // namespace toolhost::daemon
