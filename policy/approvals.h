// The approval broker: decides whether a tool revision may take one action (fetch an origin, open
// a popup, invoke an endpoint) with one access class. The manifest's ceiling first, then a stored
// decision, else a prompt to the connected approvers (people running `toolhostctl approve`,
// programs that called policy.subscribe), answered by the first of them or denied at the timeout.
// Thread-safe: authorize() may run on any executor, concurrently; approvers may be added, removed
// and answer from any thread. Approver sinks are called without the broker's lock held.
#pragma once

#include "policy/audit.h"
#include "policy/decisions.h"

#include <boost/asio/awaitable.hpp>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/system/result.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace toolhost::policy {

struct AuthorizationRequest {
  DecisionKey key;
  std::string toolName;
  // Whether the manifest requests this action, target and access class (see manifestRequests()).
  // When false the answer is deny, "not-authorized", and nobody is asked.
  bool manifestRequests = false;
  // Set when the destination is an address in a special-purpose range the operator opened
  // ([fetch] allow_private): the prompt shows it, e.g. "private 10.0.0.0/8 (opened by 10.0.0.0/8)".
  std::optional<std::string> privateRange;
  // Shown in the prompt only (never stored or audited), e.g. "GET /v1/forecast". Keep secrets out.
  std::string detail;
  // What a request must share with a pending prompt's to join it, when more than `detail` (which
  // may be cut short): e.g. the whole path. Never shown, stored or audited.
  std::string sameAs;
};

// Where a decision came from.
enum class DecisionSource {
  notRequested,  // the manifest does not request it: denied, nobody asked
  stored,        // a session or always decision
  prompt,        // an approver answered a prompt for this request
  noApprover,    // nobody is subscribed: denied at once
  timeout,       // nobody answered in time: denied
  cancelled,  // the caller gave up (terminal cancellation) while asking: denied, prompt withdrawn
  failure,    // the decision store failed: denied
};
std::string_view decisionSourceName(DecisionSource source);

struct Decision {
  Verdict verdict = Verdict::deny;
  std::optional<Scope> scope;  // of the decision that applied (stored or answered)
  DecisionSource source = DecisionSource::noApprover;
  // For denials, what the tool and the user read: starts with "not-authorized: " when the
  // manifest does not request it; otherwise says who decided or why nobody did.
  std::string reason;
  // How long this request waited for a person (zero without a prompt): the caller pauses the
  // tool's wall clock by this much.
  std::chrono::milliseconds promptDuration{0};
  bool allowed() const { return verdict == Verdict::allow; }
};

// A connected approver receives JSON-RPC notifications through its sink: "policy.prompt" and
// "policy.resolved", with their params. The sink must not block (Session::notify posts).
using ApproverSink = std::function<void(std::string_view method, boost::json::object params)>;
using ApproverId = std::uint64_t;

enum class DecideErrc {
  notSubscribed,  // the caller is not a subscribed approver
  notFound,       // no such prompt pending: answered elsewhere, withdrawn, timed out, or made up
  storage,        // a session/always answer could not be stored; the prompt stays pending
};

struct DecideError {
  DecideErrc code;
  std::string detail;
};

struct DecideOutcome {
  std::string promptId;
  Verdict verdict = Verdict::deny;
  Scope scope = Scope::once;
  // Requests the answer released: those waiting on this prompt, and for a session or always
  // answer also those waiting on other prompts of the same decision key.
  std::size_t requests = 0;
};

class ApprovalBroker {
 public:
  // Both must outlive the broker.
  ApprovalBroker(DecisionStore& decisions, AuditLog& audit);
  ~ApprovalBroker();
  ApprovalBroker(const ApprovalBroker&) = delete;
  ApprovalBroker& operator=(const ApprovalBroker&) = delete;

  // Decides `request`; see the header comment for the order. Every answer but an allow from a
  // stored decision is audited here (the caller audits the request itself). Concurrent undecided
  // requests share one prompt only when they are identical as the approver sees them: the same
  // decision key and the same detail (method and path); a "once" answer applies to the requests
  // of that prompt only, so a request the prompt does not show is never allowed by it. Never throws
  // for an expected outcome; on terminal cancellation it withdraws its part of the prompt and
  // returns a denial with source cancelled.
  boost::asio::awaitable<Decision> authorize(AuthorizationRequest request,
                                             std::chrono::milliseconds promptTimeout);

  // Registers an approver (again: replaces its sink and label). `label` says who it is in
  // decisions and the audit ("approver uid 1000 pid 42"). Returns the prompts pending now, in the
  // policy.prompt params form, so nothing is missed between subscribing and the first prompt.
  boost::json::array addApprover(ApproverId id, std::string label, ApproverSink sink);
  // Removes an approver (its connection closed). When the last one leaves, pending prompts are
  // denied at once: nobody is left to answer them.
  void removeApprover(ApproverId id);
  bool isApprover(ApproverId id) const;
  std::size_t approverCount() const;

  // An approver's answer. session/always answers are stored (and apply to later requests) before
  // the waiting requests are released, and resolve every other prompt of the same decision key
  // too (the stored decision covers them); once applies to this prompt's waiting requests only.
  // The other approvers receive policy.resolved (the answering one too, for the other prompts).
  boost::system::result<DecideOutcome, DecideError> decide(ApproverId approver,
                                                           const std::string& promptId,
                                                           Verdict verdict, Scope scope);

  // The prompts pending now (policy.prompt params).
  boost::json::array pendingPrompts() const;

 private:
  struct Prompt;
  struct Waiter;
  struct Resolution;
  struct ApproverEntry {
    std::string label;
    ApproverSink sink;
  };
  struct Notice {
    ApproverSink sink;
    std::string_view method;  // "policy.prompt" or "policy.resolved"
    boost::json::object params;
  };

  // Resolves a pending prompt (caller holds mutex_): removes it, records the resolution, wakes
  // its waiters, and returns the policy.resolved notices to send once the lock is released.
  std::vector<Notice> resolveLocked(const std::shared_ptr<Prompt>& prompt, Resolution resolution,
                                    std::optional<ApproverId> except);
  // The pending prompt `request` may join (caller holds mutex_): one showing exactly what the
  // approver would see for it. Null when there is none.
  std::shared_ptr<Prompt> findPromptLocked(const AuthorizationRequest& request) const;
  void send(std::vector<Notice> notices);
  void auditDecision(const AuthorizationRequest& request, const Decision& decision,
                     std::string_view kind);

  DecisionStore& decisions_;
  AuditLog& audit_;
  mutable std::mutex mutex_;
  std::map<ApproverId, ApproverEntry> approvers_;
  std::map<std::string, std::shared_ptr<Prompt>, std::less<>> prompts_;  // by prompt id
  std::multimap<DecisionKey, std::shared_ptr<Prompt>> promptsByKey_;     // pending, by decision key
  std::uint64_t nextPrompt_ = 1;
  std::string promptPrefix_;  // random per daemon run, so ids of another run never match
};

}  // namespace toolhost::policy
