#include "policy/approvals.h"

#include <spdlog/spdlog.h>
#include <boost/asio/deferred.hpp>
#include <boost/asio/experimental/concurrent_channel.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <random>

namespace toolhost::policy {
namespace asio = boost::asio;
namespace json = boost::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

// Wakes one waiting request; the resolution itself is read from the prompt under the lock.
using WakeChannel = asio::experimental::concurrent_channel<void(boost::system::error_code)>;

std::string randomPrefix() {
  std::random_device device;
  std::uint32_t value = device();
  char buffer[16];
  std::snprintf(buffer, sizeof buffer, "%08x", value);
  return buffer;
}

milliseconds since(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start);
}

std::string actionWords(const DecisionKey& key) {
  return key.action + " " + key.target + " (" + std::string(accessClassName(key.access)) + ")";
}

std::string decidedWords(Verdict verdict, Scope scope, std::string_view by) {
  std::string words = verdict == Verdict::allow ? "allowed " : "denied ";
  switch (scope) {
    case Scope::once:
      words += "once";
      break;
    case Scope::session:
      words += "for this daemon session";
      break;
    case Scope::always:
      words += "always";
      break;
  }
  words += " by ";
  words += by;
  return words;
}

}  // namespace

std::string_view decisionSourceName(DecisionSource source) {
  switch (source) {
    case DecisionSource::notRequested:
      return "not-requested";
    case DecisionSource::stored:
      return "stored";
    case DecisionSource::prompt:
      return "prompt";
    case DecisionSource::noApprover:
      return "no-approver";
    case DecisionSource::timeout:
      return "timeout";
    case DecisionSource::cancelled:
      return "cancelled";
    case DecisionSource::failure:
      return "failure";
  }
  return "failure";
}

struct ApprovalBroker::Resolution {
  enum class Kind { decided, timeout, withdrawn, noApprover };
  Kind kind = Kind::timeout;
  Verdict verdict = Verdict::deny;
  Scope scope = Scope::once;
  std::string reason;
};

struct ApprovalBroker::Waiter {
  explicit Waiter(const asio::any_io_executor& executor) : wake(executor, 1) {}
  WakeChannel wake;
};

struct ApprovalBroker::Prompt {
  std::string id;
  AuthorizationRequest request;
  Clock::time_point started;
  Clock::time_point deadline;
  milliseconds timeout{0};
  json::object params;  // of policy.prompt
  std::optional<Resolution> resolution;
  std::vector<std::shared_ptr<Waiter>> waiters;
};

ApprovalBroker::ApprovalBroker(DecisionStore& decisions, AuditLog& audit)
    : decisions_(decisions), audit_(audit), promptPrefix_(randomPrefix()) {}

ApprovalBroker::~ApprovalBroker() = default;

void ApprovalBroker::auditDecision(const AuthorizationRequest& request, const Decision& decision,
                                   std::string_view kind) {
  AuditEntry entry;
  entry.kind = std::string(kind);
  entry.toolRevision = request.key.toolRevision;
  entry.toolName = request.toolName;
  entry.action = request.key.action;
  entry.target = request.key.target;
  entry.access = request.key.access;
  entry.verdict = std::string(verdictName(decision.verdict));
  if (decision.scope) entry.scope = std::string(scopeName(*decision.scope));
  entry.reason = decision.reason;
  if (decision.promptDuration.count() > 0 || decision.source == DecisionSource::prompt ||
      decision.source == DecisionSource::timeout) {
    entry.durationMs = decision.promptDuration.count();
  }
  audit_.append(std::move(entry));
}

void ApprovalBroker::send(std::vector<Notice> notices) {
  for (auto& notice : notices) {
    if (!notice.sink) continue;
    try {
      notice.sink(notice.method, std::move(notice.params));
    } catch (const std::exception& error) {
      spdlog::warn("policy: an approver could not be notified: {}", error.what());
    }
  }
}

std::vector<ApprovalBroker::Notice> ApprovalBroker::resolveLocked(
    const std::shared_ptr<Prompt>& prompt, Resolution resolution,
    std::optional<ApproverId> except) {
  std::vector<Notice> notices;
  if (prompt->resolution) return notices;
  json::object params{{"promptId", prompt->id}};
  switch (resolution.kind) {
    case Resolution::Kind::decided:
      params["resolution"] = "decided";
      params["verdict"] = verdictName(resolution.verdict);
      params["scope"] = scopeName(resolution.scope);
      break;
    case Resolution::Kind::timeout:
      params["resolution"] = "timeout";
      params["verdict"] = "deny";
      break;
    case Resolution::Kind::withdrawn:
      params["resolution"] = "withdrawn";
      break;
    case Resolution::Kind::noApprover:
      params["resolution"] = "no-approver";
      params["verdict"] = "deny";
      break;
  }
  params["reason"] = resolution.reason;
  prompt->resolution = std::move(resolution);
  prompts_.erase(prompt->id);
  auto [begin, end] = promptsByKey_.equal_range(prompt->request.key);
  for (auto byKey = begin; byKey != end; ++byKey) {
    if (byKey->second == prompt) {
      promptsByKey_.erase(byKey);
      break;
    }
  }
  for (auto& waiter : prompt->waiters) waiter->wake.try_send(boost::system::error_code{});
  for (const auto& [id, approver] : approvers_) {
    if (except && id == *except) continue;
    notices.push_back(Notice{approver.sink, "policy.resolved", params});
  }
  return notices;
}

std::shared_ptr<ApprovalBroker::Prompt> ApprovalBroker::findPromptLocked(
    const AuthorizationRequest& request) const {
  auto [begin, end] = promptsByKey_.equal_range(request.key);
  for (auto it = begin; it != end; ++it) {
    const AuthorizationRequest& shown = it->second->request;
    if (shown.detail == request.detail && shown.sameAs == request.sameAs &&
        shown.privateRange == request.privateRange) {
      return it->second;
    }
  }
  return nullptr;
}

asio::awaitable<Decision> ApprovalBroker::authorize(AuthorizationRequest request,
                                                    milliseconds promptTimeout) {
  const auto started = Clock::now();
  auto executor = co_await asio::this_coro::executor;
  Decision decision;
  const DecisionKey& key = request.key;

  if (!request.manifestRequests) {
    decision.source = DecisionSource::notRequested;
    decision.reason = "not-authorized: the manifest of " + request.toolName + " (" +
                      key.toolRevision + ") does not request " + actionWords(key);
    auditDecision(request, decision, "denial");
    co_return decision;
  }

  std::shared_ptr<Prompt> prompt;
  auto waiter = std::make_shared<Waiter>(executor);
  std::vector<Notice> notices;
  {
    std::lock_guard lock(mutex_);
    // Looked up under the lock: an answer stored by decide() is seen, or its prompt is joined.
    auto stored = decisions_.tryFind(key);
    if (!stored) {
      decision.source = DecisionSource::failure;
      decision.reason = "the policy store failed: " + decisions_.describe(stored.error());
    } else if (*stored) {
      const StoredDecision& found = **stored;
      decision.verdict = found.verdict;
      decision.scope = found.scope;
      decision.source = DecisionSource::stored;
      decision.reason = decidedWords(found.verdict, found.scope, found.decidedBy) +
                        (found.decidedAt.empty() ? "" : " at " + found.decidedAt);
    } else if (auto pending = findPromptLocked(request); pending != nullptr) {
      prompt = std::move(pending);
      prompt->waiters.push_back(waiter);
    } else if (approvers_.empty()) {
      decision.source = DecisionSource::noApprover;
      decision.reason =
          "no approver is connected; run toolhostctl approve (or subscribe with "
          "policy.subscribe) to be asked";
    } else {
      prompt = std::make_shared<Prompt>();
      prompt->id = promptPrefix_ + "-" + std::to_string(nextPrompt_++);
      prompt->request = request;
      prompt->started = started;
      prompt->timeout = promptTimeout;
      prompt->deadline = started + promptTimeout;
      prompt->params = json::object{
          {"promptId", prompt->id},
          {"tool", json::object{{"name", request.toolName}, {"revision", key.toolRevision}}},
          {"action", key.action},
          {"target", key.target},
          {"access", accessClassName(key.access)},
          {"private", request.privateRange.has_value()},
          {"expiresAt", formatTime(std::chrono::system_clock::now() + promptTimeout)},
          {"timeoutMs", promptTimeout.count()}};
      if (request.privateRange) prompt->params["privateRange"] = *request.privateRange;
      if (!request.detail.empty()) prompt->params["detail"] = request.detail;
      prompt->waiters.push_back(waiter);
      prompts_.emplace(prompt->id, prompt);
      promptsByKey_.emplace(key, prompt);
      for (const auto& [id, approver] : approvers_) {
        notices.push_back(Notice{approver.sink, "policy.prompt", prompt->params});
      }
      spdlog::info("policy: prompt {} to {} approver(s): {} ({}) asks to {}", prompt->id,
                   approvers_.size(), request.toolName, key.toolRevision, actionWords(key));
    }
  }
  if (!prompt) {
    if (decision.verdict == Verdict::deny) auditDecision(request, decision, "denial");
    co_return decision;
  }
  send(std::move(notices));

  asio::steady_timer timer(executor, prompt->deadline);
  for (;;) {
    bool cancelled = false;
    try {
      co_await asio::experimental::make_parallel_group(waiter->wake.async_receive(asio::deferred),
                                                       timer.async_wait(asio::deferred))
          .async_wait(asio::experimental::wait_for_one(), asio::use_awaitable);
    } catch (const boost::system::system_error&) {
      cancelled = true;  // cancelled before the wait could even start
    }
    asio::cancellation_state state = co_await asio::this_coro::cancellation_state;
    cancelled = cancelled || state.cancelled() != asio::cancellation_type::none;

    std::optional<Resolution> resolution;
    std::vector<Notice> resolvedNotices;
    std::optional<Decision> promptAudit;  // the audit entry for a prompt this waiter resolved
    {
      std::lock_guard lock(mutex_);
      if (!prompt->resolution) {
        bool timedOut = Clock::now() >= prompt->deadline;
        if (cancelled) {
          std::erase(prompt->waiters, waiter);
          if (prompt->waiters.empty()) {
            resolvedNotices = resolveLocked(
                prompt,
                Resolution{Resolution::Kind::withdrawn, Verdict::deny, Scope::once,
                           "withdrawn: the request was cancelled before anyone answered"},
                std::nullopt);
            Decision withdrawn;
            withdrawn.source = DecisionSource::cancelled;
            withdrawn.reason = prompt->resolution->reason;
            withdrawn.promptDuration = since(prompt->started);
            promptAudit = withdrawn;
          }
        } else if (timedOut) {
          std::size_t asked = approvers_.size();
          resolvedNotices = resolveLocked(
              prompt,
              Resolution{Resolution::Kind::timeout, Verdict::deny, Scope::once,
                         "no answer within " + std::to_string(prompt->timeout.count()) +
                             " ms from " + std::to_string(asked) + " approver(s)"},
              std::nullopt);
          Decision expired;
          expired.source = DecisionSource::timeout;
          expired.reason = prompt->resolution->reason;
          expired.promptDuration = since(prompt->started);
          promptAudit = expired;
        }
      }
      if (prompt->resolution) {
        std::erase(prompt->waiters, waiter);
        resolution = prompt->resolution;
      }
    }
    send(std::move(resolvedNotices));
    if (promptAudit) {
      spdlog::info("policy: prompt {}: {}", prompt->id, promptAudit->reason);
      auditDecision(request, *promptAudit, "denial");
    }
    if (cancelled && (!resolution || resolution->kind == Resolution::Kind::withdrawn)) {
      decision = Decision{};
      decision.source = DecisionSource::cancelled;
      decision.reason = "cancelled while waiting for an approver";
      decision.promptDuration = since(started);
      co_return decision;
    }
    if (!resolution) continue;  // woken early without an answer: wait on
    decision = Decision{};
    decision.promptDuration = since(started);
    decision.reason = resolution->reason;
    switch (resolution->kind) {
      case Resolution::Kind::decided:
        decision.verdict = resolution->verdict;
        decision.scope = resolution->scope;
        decision.source = DecisionSource::prompt;
        break;
      case Resolution::Kind::timeout:
        decision.source = DecisionSource::timeout;
        break;
      case Resolution::Kind::noApprover:
        decision.source = DecisionSource::noApprover;
        break;
      case Resolution::Kind::withdrawn:
        decision.source = DecisionSource::cancelled;
        break;
    }
    co_return decision;
  }
}

json::array ApprovalBroker::addApprover(ApproverId id, std::string label, ApproverSink sink) {
  std::lock_guard lock(mutex_);
  approvers_[id] = ApproverEntry{std::move(label), std::move(sink)};
  json::array pending;
  for (const auto& [promptId, prompt] : prompts_) pending.push_back(prompt->params);
  return pending;
}

void ApprovalBroker::removeApprover(ApproverId id) {
  std::vector<std::shared_ptr<Prompt>> abandoned;
  {
    std::lock_guard lock(mutex_);
    if (approvers_.erase(id) == 0 || !approvers_.empty()) return;
    for (const auto& [promptId, prompt] : prompts_) abandoned.push_back(prompt);
    for (const auto& prompt : abandoned) {
      resolveLocked(prompt,
                    Resolution{Resolution::Kind::noApprover, Verdict::deny, Scope::once,
                               "the last approver disconnected before answering"},
                    std::nullopt);
    }
  }
  for (const auto& prompt : abandoned) {
    Decision denied;
    denied.source = DecisionSource::noApprover;
    denied.reason = prompt->resolution->reason;
    denied.promptDuration = since(prompt->started);
    spdlog::info("policy: prompt {}: {}", prompt->id, denied.reason);
    auditDecision(prompt->request, denied, "denial");
  }
}

bool ApprovalBroker::isApprover(ApproverId id) const {
  std::lock_guard lock(mutex_);
  return approvers_.contains(id);
}

std::size_t ApprovalBroker::approverCount() const {
  std::lock_guard lock(mutex_);
  return approvers_.size();
}

json::array ApprovalBroker::pendingPrompts() const {
  std::lock_guard lock(mutex_);
  json::array pending;
  for (const auto& [promptId, prompt] : prompts_) pending.push_back(prompt->params);
  return pending;
}

boost::system::result<DecideOutcome, DecideError> ApprovalBroker::decide(
    ApproverId approver, const std::string& promptId, Verdict verdict, Scope scope) {
  std::vector<Notice> notices;
  std::shared_ptr<Prompt> prompt;
  std::vector<std::shared_ptr<Prompt>> resolved;  // this prompt first
  DecideOutcome outcome;
  {
    std::lock_guard lock(mutex_);
    auto who = approvers_.find(approver);
    if (who == approvers_.end()) {
      return DecideError{DecideErrc::notSubscribed,
                         "this connection is not an approver; call policy.subscribe first"};
    }
    auto found = prompts_.find(promptId);
    if (found == prompts_.end()) {
      return DecideError{DecideErrc::notFound,
                         "no prompt " + promptId.substr(0, 80) +
                             " is pending: it was answered by another approver, timed out, or "
                             "was withdrawn"};
    }
    prompt = found->second;
    if (scope != Scope::once) {
      auto stored = decisions_.set(prompt->request.key, verdict, scope, who->second.label);
      if (!stored) {
        return DecideError{DecideErrc::storage,
                           "the decision could not be stored (" +
                               decisions_.describe(stored.error()) +
                               "); the prompt is still pending: answer once, or try again"};
      }
    }
    outcome.promptId = prompt->id;
    outcome.verdict = verdict;
    outcome.scope = scope;
    resolved.push_back(prompt);
    if (scope != Scope::once) {
      // The stored decision covers the other prompts of the same key (other methods or paths).
      auto [begin, end] = promptsByKey_.equal_range(prompt->request.key);
      for (auto it = begin; it != end; ++it) {
        if (it->second != prompt) resolved.push_back(it->second);
      }
    }
    const std::string reason = decidedWords(verdict, scope, who->second.label);
    for (const auto& each : resolved) {
      outcome.requests += each->waiters.size();
      auto told =
          resolveLocked(each, Resolution{Resolution::Kind::decided, verdict, scope, reason},
                        each == prompt ? std::optional<ApproverId>(approver) : std::nullopt);
      std::move(told.begin(), told.end(), std::back_inserter(notices));
    }
  }
  send(std::move(notices));
  for (const auto& each : resolved) {
    Decision decided;
    decided.verdict = verdict;
    decided.scope = scope;
    decided.source = DecisionSource::prompt;
    decided.reason = each->resolution->reason;
    decided.promptDuration = since(each->started);
    spdlog::info("policy: prompt {}: {}", each->id, decided.reason);
    auditDecision(each->request, decided, "decision");
  }
  return outcome;
}

}  // namespace toolhost::policy
