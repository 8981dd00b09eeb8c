#include "daemon/policy_methods.h"

#include "policy/destination.h"

#include "daemon/errors.h"
#include "daemon/registry_errors.h"
#include "daemon/session.h"
#include "protocol/content_hash.h"
#include "protocol/jsonrpc.h"
#include "registry/manifest.h"

#include <spdlog/spdlog.h>
#include <boost/json/parse.hpp>

#include <memory>

namespace toolhost::daemon {
namespace asio = boost::asio;
namespace json = boost::json;

namespace {

// No `pattern` anywhere: valijson evaluates it with std::regex, which overflows the stack on long
// input. Revisions and targets are checked in code.
const json::value kRevision = schema(
    R"({"type":"string","minLength":50,"maxLength":50,"description":"a tool revision: sha256: and 43 base64url characters"})");
const json::value kAction = schema(
    R"j({"enum":["fetch","popup","invoke"],"description":"fetch (target: an origin), popup (target: custom-html or an origin), invoke (target: an external-service endpoint)"})j");
const json::value kTarget = schema(
    R"({"type":"string","minLength":1,"maxLength":2048,"description":"an exact https origin such as https://api.example.com, custom-html, or an endpoint"})");
const json::value kAccess = schema(R"({"enum":["read","write"]})");
const json::value kVerdict = schema(R"({"enum":["allow","deny"]})");

std::string who(const CallContext& context, std::string_view role) {
  return std::string(role) + " uid " + std::to_string(context.peer.uid) + " pid " +
         std::to_string(context.peer.pid);
}

MethodResult storageFailure(const policy::DecisionStore& decisions,
                            const boost::system::error_code& ec) {
  spdlog::warn("policy: the store failed: {}", decisions.describe(ec));
  return appError(app_error::kStorageFull, "storage", decisions.describe(ec));
}

std::string str(const json::object& params, std::string_view name) {
  return std::string(params.at(name).as_string());
}

std::optional<std::string> optionalRevision(const json::object& params, std::string& error) {
  const auto* given = params.if_contains("toolRevision");
  if (given == nullptr) return std::nullopt;
  std::string revision(given->as_string());
  if (!protocol::isContentHash(revision)) {
    error = "params.toolRevision: not a tool revision (sha256: and 43 base64url characters)";
  }
  return revision;
}

struct KeyError {
  std::string detail;
};

// What a target must look like: as fetch and popups name them (set, check), or any line of
// text (revoke: so that a decision stored before the origin rules tightened can be removed).
enum class TargetRule { canonical, anyText };

// The key named by params {toolRevision, action, target, access}, or the reason it is invalid.

boost::system::result<policy::DecisionKey, KeyError> keyFrom(
    const json::object& params, TargetRule rule = TargetRule::canonical) {
  policy::DecisionKey key;
  key.toolRevision = str(params, "toolRevision");
  key.action = str(params, "action");
  key.target = str(params, "target");
  // The params schema's enum admits only these words; value() (not *) should it ever not.
  key.access = policy::parseAccessClass(params.at("access").as_string()).value();
  if (!protocol::isContentHash(key.toolRevision)) {
    return KeyError{
        "params.toolRevision: not a tool revision (sha256: and 43 base64url characters)"};
  }
  for (char c : key.target) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return KeyError{"params.target: contains control characters"};
    }
  }
  if (rule == TargetRule::anyText) return key;
  if (key.action == policy::kActionFetch) {
    if (auto why = policy::whyNotCanonicalOrigin(key.target)) {
      return KeyError{
          "params.target: a fetch target is an exact https origin in canonical form, such as "
          "https://api.example.com or https://api.example.com:8443 (lowercase, no path, no "
          "default port): " +
          *why};
    }
  }
  if (key.action == policy::kActionPopup && key.target != "custom-html") {
    if (auto why = policy::whyNotCanonicalOrigin(key.target)) {
      return KeyError{
          "params.target: a popup target is custom-html or an exact https origin in canonical "
          "form: " +
          *why};
    }
  }
  if (key.action == policy::kActionInvoke && !key.target.starts_with("https://") &&
      !key.target.starts_with("unix:/")) {
    return KeyError{
        "params.target: an invoke target is the tool's endpoint: an https URL or unix:/path"};
  }
  return key;
}

json::value keyProperties() {
  return json::object{
      {"toolRevision", kRevision}, {"action", kAction}, {"target", kTarget}, {"access", kAccess}};
}

json::object withKey(json::object extra, const policy::DecisionKey& key) {
  extra["toolRevision"] = key.toolRevision;
  extra["action"] = key.action;
  extra["target"] = key.target;
  extra["access"] = policy::accessClassName(key.access);
  return extra;
}

void auditChange(policy::AuditLog& audit, policy::AuditEntry entry) {
  entry.kind = "change";
  audit.append(std::move(entry));
}

}  // namespace

void registerPolicyMethods(MethodTable& methods, PolicyServices services) {
  policy::ApprovalBroker& approvals = services.approvals;
  policy::DecisionStore& decisions = services.decisions;
  policy::AuditLog& audit = services.audit;
  DiskThread& disk = services.disk;
  registry::Registry& registry = services.registry;
  const ConfigHolder& configs = services.configs;

  methods.add(MethodSpec{
      "policy.subscribe",
      "Makes this connection an approver until it closes: it receives a policy.prompt "
      "notification {promptId, tool: {name, revision}, action, target, access, private, "
      "privateRange?, detail?, expiresAt, timeoutMs} for every undecided request, answers with "
      "policy.decide, and receives policy.resolved {promptId, resolution, verdict?, scope?, "
      "reason} when a prompt is answered elsewhere, times out or is withdrawn. Returns "
      "{subscribed: true, pending: [prompts pending now]}.",
      RoleSet{Role::approver}, paramsWith(json::object{}, {}),
      schema(R"({"type":"object","required":["subscribed","pending"]})"),
      [&approvals](CallContext& context, json::object) -> asio::awaitable<MethodResult> {
        std::uint64_t id = context.connectionId;
        bool already = approvals.isApprover(id);
        std::weak_ptr<Session> weak = context.session;
        auto pending = approvals.addApprover(
            id, who(context, "approver"), [weak](std::string_view method, json::object params) {
              if (auto session = weak.lock()) {
                session->notify(protocol::notification(method, json::value(std::move(params))));
              }
            });
        if (!already && context.session) {
          context.session->onClose([&approvals, id] { approvals.removeApprover(id); });
          context.session->servesOthers();
        }
        if (!already) {
          spdlog::info("conn={} subscribed as an approver ({} prompt(s) pending)", id,
                       pending.size());
        }
        co_return json::value(json::object{{"subscribed", true}, {"pending", std::move(pending)}});
      }});

  methods.add(MethodSpec{
      "policy.decide",
      "Answers a prompt (only from a connection that called policy.subscribe): verdict allow or "
      "deny, scope once (this request only), session (until the daemon restarts) or always "
      "(stored). The first answer wins; later ones find the prompt gone (not-found).",
      RoleSet{Role::approver},
      paramsWith(
          json::object{{"promptId", schema(R"({"type":"string","minLength":1,"maxLength":200})")},
                       {"verdict", kVerdict},
                       {"scope", schema(R"({"enum":["once","session","always"]})")}},
          {"promptId", "verdict", "scope"}),
      schema(R"({"type":"object","required":["promptId","verdict","scope","requests"]})"),
      [&approvals, &disk](CallContext& context,
                          json::object params) -> asio::awaitable<MethodResult> {
        auto verdict = policy::parseVerdict(params.at("verdict").as_string()).value();
        auto scope = policy::parseScope(params.at("scope").as_string()).value();
        // A session or always answer is stored first: on the disk thread.
        const auto approver = context.connectionId;
        auto decided = co_await disk.run([&] {
          return approvals.decide(approver, str(params, "promptId"), verdict, scope);
        });
        if (!decided) {
          switch (decided.error().code) {
            case policy::DecideErrc::notSubscribed:
              co_return appError(app_error::kUnauthorized, "not-subscribed",
                                 decided.error().detail);
            case policy::DecideErrc::notFound:
              co_return appError(app_error::kNotFound, "not-found", decided.error().detail);
            case policy::DecideErrc::storage:
              co_return appError(app_error::kStorageFull, "storage", decided.error().detail);
          }
        }
        co_return json::value(json::object{{"promptId", decided->promptId},
                                           {"verdict", policy::verdictName(decided->verdict)},
                                           {"scope", policy::scopeName(decided->scope)},
                                           {"requests", decided->requests}});
      }});

  methods.add(MethodSpec{
      "policy.list",
      "The decisions in force (session and always), optionally of one tool revision, with the "
      "prompts pending now and how many approvers are connected.",
      RoleSet{Role::approver}, paramsWith(json::object{{"toolRevision", kRevision}}, {}),
      schema(R"({"type":"object","required":["decisions","pending","approvers"]})"),
      [&decisions, &approvals](CallContext&, json::object params) -> asio::awaitable<MethodResult> {
        std::string invalid;
        auto revision = optionalRevision(params, invalid);
        if (!invalid.empty()) co_return invalidParams(invalid);
        auto listed = decisions.list(revision);
        if (!listed) co_return storageFailure(decisions, listed.error());
        json::array out;
        for (const auto& entry : *listed) out.push_back(policy::toJson(entry));
        auto pending = approvals.pendingPrompts();
        if (revision) {
          json::array mine;
          for (auto& prompt : pending) {
            if (prompt.at("tool").at("revision") == json::value(*revision)) mine.push_back(prompt);
          }
          pending = std::move(mine);
        }
        co_return json::value(json::object{{"decisions", std::move(out)},
                                           {"pending", std::move(pending)},
                                           {"approvers", approvals.approverCount()}});
      }});

  methods.add(MethodSpec{
      "policy.set",
      "Decides ahead: stores allow or deny for (toolRevision, action, target, access) for this "
      "daemon session or always, replacing any earlier decision. The revision must be installed; "
      "`requested` says whether its manifest requests this at all (if not, requests are refused "
      "whatever is decided).",
      RoleSet{Role::admin},
      [] {
        auto properties = keyProperties().as_object();
        properties["verdict"] = kVerdict;
        properties["scope"] = schema(R"({"enum":["session","always"]})");
        return paramsWith(std::move(properties),
                          {"toolRevision", "action", "target", "access", "verdict", "scope"});
      }(),
      schema(
          R"({"type":"object","required":["toolRevision","action","target","access","verdict","scope","requested"]})"),
      [&decisions, &audit, &registry, &disk](CallContext& context,
                                             json::object params) -> asio::awaitable<MethodResult> {
        auto key = keyFrom(params);
        if (!key) co_return invalidParams(key.error().detail);
        auto tool = registry.getRevision(key->toolRevision);
        if (!tool) co_return toRpcError(tool.error());
        auto verdict = policy::parseVerdict(params.at("verdict").as_string()).value();
        auto scope = policy::parseScope(params.at("scope").as_string()).value();
        const std::string by = who(context, "admin");
        auto stored = co_await disk.run([&] { return decisions.set(*key, verdict, scope, by); });
        if (!stored) co_return storageFailure(decisions, stored.error());
        bool requested = policy::manifestRequests((*tool)->manifest, *key);
        policy::AuditEntry entry;
        entry.toolRevision = key->toolRevision;
        entry.toolName = (*tool)->name;
        entry.action = key->action;
        entry.target = key->target;
        entry.access = key->access;
        entry.verdict = std::string(policy::verdictName(verdict));
        entry.scope = std::string(policy::scopeName(scope));
        entry.reason = "set by " + stored->decidedBy;
        auditChange(audit, std::move(entry));
        co_return json::value(withKey(json::object{{"verdict", policy::verdictName(verdict)},
                                                   {"scope", policy::scopeName(scope)},
                                                   {"decidedAt", stored->decidedAt},
                                                   {"decidedBy", stored->decidedBy},
                                                   {"requested", requested}},
                                      *key));
      }});

  methods.add(MethodSpec{
      "policy.revoke",
      "Removes the session and the always decision for (toolRevision, action, target, access): "
      "the next request asks again. Returns {revoked: whether there was one}.",
      RoleSet{Role::admin},
      paramsWith(keyProperties().as_object(), {"toolRevision", "action", "target", "access"}),
      schema(R"({"type":"object","required":["revoked"]})"),
      [&decisions, &audit, &disk](CallContext& context,
                                  json::object params) -> asio::awaitable<MethodResult> {
        auto key = keyFrom(params, TargetRule::anyText);
        if (!key) co_return invalidParams(key.error().detail);
        auto revoked = co_await disk.run([&] { return decisions.revoke(*key); });
        if (!revoked) co_return storageFailure(decisions, revoked.error());
        if (*revoked) {
          policy::AuditEntry entry;
          entry.toolRevision = key->toolRevision;
          entry.action = key->action;
          entry.target = key->target;
          entry.access = key->access;
          entry.verdict = "revoked";
          entry.reason = "revoked by " + who(context, "admin");
          auditChange(audit, std::move(entry));
        }
        co_return json::value(withKey(json::object{{"revoked", *revoked}}, *key));
      }});

  methods.add(MethodSpec{
      "policy.reset",
      "Removes every decision (session and always), or every decision of one tool revision. "
      "Returns {removed: how many}.",
      RoleSet{Role::admin}, paramsWith(json::object{{"toolRevision", kRevision}}, {}),
      schema(R"({"type":"object","required":["removed"]})"),
      [&decisions, &audit, &disk](CallContext& context,
                                  json::object params) -> asio::awaitable<MethodResult> {
        std::string invalid;
        auto revision = optionalRevision(params, invalid);
        if (!invalid.empty()) co_return invalidParams(invalid);
        auto removed = co_await disk.run([&] { return decisions.reset(revision); });
        if (!removed) co_return storageFailure(decisions, removed.error());
        policy::AuditEntry entry;
        entry.toolRevision = revision.value_or("");
        entry.verdict = "reset";
        entry.reason = "reset by " + who(context, "admin") + ": " + std::to_string(*removed) +
                       " decision(s) removed";
        auditChange(audit, std::move(entry));
        co_return json::value(json::object{{"removed", *removed}});
      }});

  methods.add(MethodSpec{
      "policy.check",
      "Diagnostic: runs the whole authorization for (toolRevision, action, target, access) as a "
      "request of that tool would: the manifest's ceiling, a stored decision, else a real prompt "
      "to the approvers (whose answer is stored as they choose). Returns {verdict, scope?, "
      "source, reason, promptMs}.",
      RoleSet{Role::admin},
      paramsWith(keyProperties().as_object(), {"toolRevision", "action", "target", "access"}),
      schema(R"({"type":"object","required":["verdict","source","reason","promptMs"]})"),
      [&approvals, &registry, &configs](CallContext&,
                                        json::object params) -> asio::awaitable<MethodResult> {
        auto key = keyFrom(params);
        if (!key) co_return invalidParams(key.error().detail);
        auto tool = registry.getRevision(key->toolRevision);
        if (!tool) co_return toRpcError(tool.error());
        policy::AuthorizationRequest request;
        request.key = *key;
        request.toolName = (*tool)->name;
        request.manifestRequests = policy::manifestRequests((*tool)->manifest, *key);
        auto timeout = configs.current()->promptTimeout;
        auto decision = co_await approvals.authorize(std::move(request), timeout);
        if (decision.source == policy::DecisionSource::cancelled) {
          co_return appError(app_error::kCancelled, "cancelled",
                             "the request was cancelled; its prompt was withdrawn");
        }
        json::object answer{{"verdict", policy::verdictName(decision.verdict)},
                            {"source", policy::decisionSourceName(decision.source)},
                            {"reason", decision.reason},
                            {"promptMs", decision.promptDuration.count()}};
        if (decision.scope) answer["scope"] = policy::scopeName(*decision.scope);
        co_return json::value(std::move(answer));
      }});

  methods.add(MethodSpec{
      "audit.tail",
      "The newest audit entries (decisions, denials, changes, requests), oldest first: {entries: "
      "[{sequence, time, kind, toolRevision, toolName, action, target, access?, verdict, scope?, "
      "reason, status?, bytes?, durationMs?}]}. Never secrets, headers or bodies.",
      RoleSet{Role::admin},
      paramsWith(
          json::object{{"limit", schema(R"({"type":"integer","minimum":1,"maximum":10000})")},
                       {"toolRevision", kRevision}},
          {}),
      schema(R"({"type":"object","required":["entries"]})"),
      [&audit, &decisions, &disk](CallContext&,
                                  json::object params) -> asio::awaitable<MethodResult> {
        std::string invalid;
        policy::AuditFilter filter;
        filter.toolRevision = optionalRevision(params, invalid);
        if (!invalid.empty()) co_return invalidParams(invalid);
        std::size_t limit = 100;
        if (const auto* given = params.if_contains("limit")) {
          limit = static_cast<std::size_t>(given->to_number<std::int64_t>());
        }
        // tail() waits for the audit log's queued entries to be written: not on an I/O thread.
        auto entries = co_await disk.run([&] { return audit.tail(limit, filter); });
        if (!entries) co_return storageFailure(decisions, entries.error());
        json::array out;
        for (const auto& entry : *entries) out.push_back(policy::toJson(entry));
        co_return json::value(json::object{{"entries", std::move(out)}});
      }});
}

}  // namespace toolhost::daemon
