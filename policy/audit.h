// The audit log: every policy decision, denial, change and (from the fetch path) request outcome,
// appended to the LMDB table "audit" under a big-endian sequence number and trimmed to the newest
// `maxEntries`. Entries hold who, what and the outcome; never secrets, headers or bodies.
//
// Threads: append() queues the entry and returns at once; the log's own thread writes what is
// queued in batches, one transaction (one fdatasync) per batch, so that neither an I/O thread nor
// the policy engine ever waits for the disk for an audit entry, and a burst of requests costs one
// disk wait, not one each. tail() first waits for every entry queued before it, so a caller reads
// its own appends. Every member may be called from any thread.
// Caveats:
//  - An entry's time is taken when it is appended; its sequence number when it is written, in
//    the order of the append() calls.
//  - A batch that cannot be written (disk full, map full) is lost, with a warning in the log that
//    says how many entries; later batches are tried again.
//  - When kMaxQueued entries wait for the disk, append() waits for room: a disk that slow slows
//    the callers rather than drop audit entries or grow without bound.
//  - The destructor writes what is queued, then joins its thread: destroy the log before the
//    Store.
//  - Denials are tool code's doing (a tool may request a refused origin in a loop), and the log
//    keeps only the newest maxEntries: unchecked, one tool would push every earlier decision
//    and change out of it in seconds. Each tool revision's denials get kDenialsPerSecond after a
//    burst of kDenialBurst, all tools' together kAllDenialsPerSecond after kAllDenialBurst; the
//    next denial written says how many of its tool's were left out.
#pragma once

#include "policy/access_class.h"
#include "store/store.h"

#include <boost/json/object.hpp>
#include <boost/system/result.hpp>

#include <chrono>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace toolhost::policy {

struct AuditEntry {
  std::uint64_t sequence = 0;  // assigned when the entry is written
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
  // The most entries that wait for the disk before append() waits for room.
  static constexpr std::size_t kMaxQueued = 10000;
  static constexpr double kDenialsPerSecond = 5;
  static constexpr double kDenialBurst = 100;
  static constexpr double kAllDenialsPerSecond = 50;
  static constexpr double kAllDenialBurst = 1000;

  // `maxEntries` (config: [policy] audit_max_entries) bounds the table; at least 1.
  AuditLog(store::Store& store, std::size_t maxEntries);
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  // Queues one entry; the log's thread appends it and drops the oldest beyond maxEntries.
  void append(AuditEntry entry);

  // Waits until every entry appended before this call has been written (or has failed to be).
  void flush() const;

  // The newest `limit` entries (matching `filter`), oldest first, after a flush().
  boost::system::result<std::vector<AuditEntry>> tail(std::size_t limit,
                                                      const AuditFilter& filter = {}) const;

  std::size_t maxEntries() const { return maxEntries_; }

 private:
  void run();  // the log's thread
  boost::system::result<void> write(std::vector<AuditEntry>& batch);

  store::Store& store_;
  store::Table table_;
  std::size_t maxEntries_;

  // A token bucket for denials, and how many it held back since it last let one through.
  struct DenialBudget {
    double tokens = 0;
    std::chrono::steady_clock::time_point refilled;
    std::uint64_t withheld = 0;
  };
  // Whether `entry` (a denial) may be written now; adds the count left out to its reason.
  bool admitDenial(AuditEntry& entry);  // under mutex_

  mutable std::mutex mutex_;
  DenialBudget allDenials_{kAllDenialBurst, std::chrono::steady_clock::now(), 0};  // under mutex_
  std::unordered_map<std::string, DenialBudget> denials_;  // under mutex_: by tool revision
  mutable std::condition_variable changed_;  // queued, written, room made, or stopping
  std::deque<AuditEntry> queue_;             // under mutex_
  std::uint64_t appended_ = 0;               // under mutex_: entries ever queued
  std::uint64_t done_ = 0;                   // under mutex_: entries written or lost
  bool stopping_ = false;                    // under mutex_
  std::thread thread_;
};

}  // namespace toolhost::policy
