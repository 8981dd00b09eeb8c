// Policy decisions: what a person (or a program, or an admin ahead of time) decided for one key
// (tool revision, action, target, access class). "always" decisions live in the LMDB table
// policy_decisions and survive restarts; "session" decisions live in memory for this daemon run;
// "once" decisions are never stored. Thread-safe: any thread, concurrently.
#pragma once

#include "policy/access_class.h"
#include "protocol/time_text.h"
#include "store/store.h"

#include <boost/json/object.hpp>
#include <boost/system/result.hpp>

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace toolhost::policy {

enum class Verdict { allow, deny };
enum class Scope { once, session, always };

std::string_view verdictName(Verdict verdict);  // "allow", "deny"
std::string_view scopeName(Scope scope);        // "once", "session", "always"
std::optional<Verdict> parseVerdict(std::string_view text);
std::optional<Scope> parseScope(std::string_view text);
std::optional<AccessClass> parseAccessClass(std::string_view text);

// The actions a decision is about. The target is an origin for fetch, "custom-html" or an origin
// for popup, and the manifest's endpoint for invoke (external-service tools).
inline constexpr std::string_view kActionFetch = "fetch";
inline constexpr std::string_view kActionPopup = "popup";
inline constexpr std::string_view kActionInvoke = "invoke";
bool isKnownAction(std::string_view action);

struct DecisionKey {
  std::string toolRevision;  // "sha256:..."
  std::string action;        // "fetch" | "popup" | "invoke"
  std::string target;        // origin, "custom-html", or endpoint
  AccessClass access = AccessClass::read;

  friend bool operator==(const DecisionKey&, const DecisionKey&) = default;
  friend auto operator<=>(const DecisionKey& a, const DecisionKey& b) {
    return std::tie(a.toolRevision, a.action, a.target, a.access) <=>
           std::tie(b.toolRevision, b.action, b.target, b.access);
  }
};

// RFC 3339 UTC with milliseconds (protocol/time_text.h).
using protocol::formatTime;

// Words for logs and messages: "fetch https://api.example (read) by sha256:...".
std::string describe(const DecisionKey& key);

// Whether the manifest's requested capabilities (the ceiling) cover `key`: a fetch entry with
// exactly this origin listing this access class; a popup entry equal to the target (either access
// class); for invoke, the manifest's own external-service endpoint. Anything else is not
// requested, and is refused without asking anyone. Pure; any thread.
bool manifestRequests(const boost::json::object& manifest, const DecisionKey& key);

struct StoredDecision {
  Verdict verdict = Verdict::deny;
  Scope scope = Scope::always;  // session or always
  std::string decidedAt;        // RFC 3339 UTC
  std::string decidedBy;        // "approver uid 1000 pid 42", "admin uid 0 pid 7", ...
};

struct DecisionEntry {
  DecisionKey key;
  StoredDecision decision;
};

boost::json::object toJson(const DecisionEntry& entry);

class DecisionStore {
 public:
  // The tables this module and the audit log keep in the store (pass them to store::Options).
  static std::vector<std::string> tables();  // {"policy_decisions", "audit"}

  explicit DecisionStore(store::Store& store);

  // The decision in force for `key`: a session decision of this run first (it is always the more
  // recent one: storing an always decision drops the session one), else an always decision.
  boost::system::result<std::optional<StoredDecision>> tryFind(const DecisionKey& key) const;

  // Stores a session or always decision, replacing whatever was decided for `key` before.
  // Scope::once is never stored: passing it is a bug (std::invalid_argument).
  boost::system::result<StoredDecision> set(const DecisionKey& key, Verdict verdict, Scope scope,
                                            std::string decidedBy);

  // Removes the session and the always decision for `key`; true if there was one.
  boost::system::result<bool> revoke(const DecisionKey& key);

  // Removes every decision (or every decision of one tool revision); how many were removed.
  boost::system::result<std::size_t> reset(const std::optional<std::string>& toolRevision);

  // Every decision in force (or those of one tool revision), ordered by key; session decisions
  // shadow always decisions of the same key.
  boost::system::result<std::vector<DecisionEntry>> list(
      const std::optional<std::string>& toolRevision) const;

  // The store's words for a failure it returned.
  std::string describe(const boost::system::error_code& ec) const { return store_.describe(ec); }

 private:
  store::Store& store_;
  store::Table table_;
  mutable std::mutex mutex_;  // guards session_
  std::map<DecisionKey, StoredDecision> session_;
};

}  // namespace toolhost::policy
