// The audit log: every policy decision, denial, change and (from the fetch path) request outcome,
// appended to the LMDB table "audit" under a big-endian sequence number and trimmed to the newest
// `maxEntries`. Entries hold who, what and the outcome; never secrets, headers or bodies.
// Thread-safe: any thread (each call is one short transaction).
#pragma once

#include "policy/access_class.h"
#include "store/store.h"

#include <boost/json/object.hpp>
#include <boost/system/result.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace toolhost::policy {

struct AuditEntry {
  std::uint64_t sequence = 0;  // assigned by append()
  std::string time;            // RFC 3339 UTC; append() fills it when empty
  // "decision" (someone answered a prompt), "denial" (refused without an allow: not requested,
  // no approver, no answer, a stored deny), "change" (policy.set/revoke/reset), "request" (the
  // outcome of a mediated request).
  std::string kind;
  std::string toolRevision;
  std::string toolName;
  std::string action;  // "fetch", "popup", "invoke"; empty for a reset of everything
  std::string target;
  std::optional<AccessClass> access;
  std::string verdict;                     // "allow", "deny"; "revoked"/"reset" for changes
  std::optional<std::string> scope;        // "once", "session", "always"
  std::string reason;                      // words: who decided, or why it was refused
  std::optional<int> status;               // request: the HTTP status
  std::optional<std::uint64_t> bytes;      // request: response bytes received
  std::optional<std::int64_t> durationMs;  // request or prompt: how long it took
};

boost::json::object toJson(const AuditEntry& entry);

struct AuditFilter {
  std::optional<std::string> toolRevision;
};

class AuditLog {
 public:
  // `maxEntries` (config: [policy] audit_max_entries) bounds the table; at least 1.
  AuditLog(store::Store& store, std::size_t maxEntries);

  // Appends one entry and drops the oldest beyond maxEntries; the sequence number it got.
  boost::system::result<std::uint64_t> append(AuditEntry entry);

  // The newest `limit` entries (matching `filter`), oldest first.
  boost::system::result<std::vector<AuditEntry>> tail(std::size_t limit,
                                                      const AuditFilter& filter = {}) const;

  std::size_t maxEntries() const { return maxEntries_; }

 private:
  store::Store& store_;
  store::Table table_;
  std::size_t maxEntries_;
};

}  // namespace toolhost::policy
