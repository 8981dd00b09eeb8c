#include "daemon/secret_methods.h"

#include "daemon/errors.h"
#include "daemon/registry_errors.h"
#include "daemon/secrets_host.h"
#include "protocol/content_hash.h"
#include "registry/manifest.h"

#include <spdlog/spdlog.h>
#include <boost/json/parse.hpp>

#include <algorithm>
#include <map>
#include <optional>

namespace toolhost::daemon {
namespace asio = boost::asio;
namespace json = boost::json;

namespace {

// No `pattern` anywhere (valijson evaluates it with std::regex): names, revisions and origins are
// checked in code. No schema error quotes a value: valijson's messages name the rule only.
const json::value kTool =
    schema(R"({"type":"string","minLength":1,"maxLength":64,"description":"a tool name"})");
const json::value kRevision = schema(
    R"({"type":"string","minLength":50,"maxLength":50,"description":"a tool revision (sha256: and 43 base64url characters); default: the tool's active revision"})");
const json::value kSecretName = schema(
    R"({"type":"string","minLength":1,"maxLength":64,"description":"a secret name: letters, digits, _ and -, starting with a letter"})");

std::string who(const CallContext& context) {
  return "admin uid " + std::to_string(context.peer.uid) + " pid " +
         std::to_string(context.peer.pid);
}

MethodResult vaultFailure(const policy::VaultError& error) {
  using policy::VaultErrc;
  switch (error.code) {
    case VaultErrc::invalidArgument:
      return invalidParams(error.message);
    case VaultErrc::storage:
      spdlog::warn("secrets: the store failed: {}", error.message);
      return appError(app_error::kStorageFull, "storage", error.message);
    case VaultErrc::corrupt:
      return appError(app_error::kIntegrity, "integrity", error.message);
    default:
      spdlog::warn("secrets: {}", error.message);
      return appError(app_error::kUnavailable, "secrets-unavailable", error.message);
  }
}

bool flag(const json::object& params, std::string_view name) {
  const auto* given = params.if_contains(name);
  return given != nullptr && given->as_bool();
}

// The revision a secrets method is about: params.revision (which must carry the tool's name),
// else the tool's active revision.
boost::system::result<registry::ToolRevisionPtr, protocol::RpcError> revisionOf(
    registry::Registry& registry, const std::string& tool, const json::object& params) {
  if (!registry::isValidToolName(tool)) {
    return invalidParams(
               "params.tool: a tool name is lowercase letters and digits in words joined by "
               "single '-' or '_', starting with a letter")
        .error();
  }
  if (const auto* given = params.if_contains("revision")) {
    std::string revision(given->as_string());
    if (!protocol::isContentHash(revision)) {
      return invalidParams(
                 "params.revision: not a tool revision (sha256: and 43 base64url characters)")
          .error();
    }
    auto found = registry.getRevision(revision, tool);
    if (!found) return toRpcError(found.error());
    return *found;
  }
  auto active = registry.getActive(tool);
  if (!active) {
    auto error = toRpcError(active.error());
    error.detail += "; give the revision the secret is for (--revision)";
    return error;
  }
  return *active;
}

// The secret a secrets.set or secrets.delete is about: params.name (checked) of the revision
// revisionOf() finds for params.tool.
struct SecretOf {
  registry::ToolRevisionPtr tool;
  std::string name;
};
boost::system::result<SecretOf, protocol::RpcError> secretOf(registry::Registry& registry,
                                                              const json::object& params) {
  std::string name(params.at("name").as_string());
  if (!policy::isValidSecretName(name)) {
    return invalidParams(
               "params.name: a secret name is letters, digits, '_' and '-', starting with a "
               "letter, at most 64 characters")
        .error();
  }
  auto tool = revisionOf(registry, std::string(params.at("tool").as_string()), params);
  if (!tool) return tool.error();
  return SecretOf{std::move(*tool), std::move(name)};
}

bool requestsSecret(const json::object& manifest, std::string_view name) {
  const auto* capabilities = manifest.if_contains("capabilities");
  if (capabilities == nullptr || !capabilities->is_object()) return false;
  const auto* secrets = capabilities->as_object().if_contains("secrets");
  if (secrets == nullptr || !secrets->is_array()) return false;
  const auto& list = secrets->get_array();
  return std::any_of(list.begin(), list.end(),
                     [&](const json::value& item) { return item == json::value(name); });
}

json::object recordJson(const policy::SecretRecord& record) {
  json::array origins;
  for (const auto& origin : record.origins) origins.emplace_back(origin);
  return json::object{{"tool", record.tool},          {"revision", record.revision},
                      {"name", record.name},          {"origins", std::move(origins)},
                      {"carry", record.carry},        {"allowBody", record.allowBody},
                      {"createdAt", record.createdAt}};
}

void auditChange(policy::AuditLog& audit, const registry::ToolRevision& tool,
                 const std::string& name, std::string verdict, std::string reason) {
  policy::AuditEntry entry;
  entry.kind = "change";
  entry.toolRevision = tool.revision;
  entry.toolName = tool.name;
  entry.action = "secret";
  entry.target = name;
  entry.verdict = std::move(verdict);
  entry.reason = std::move(reason);
  audit.append(std::move(entry));
}

}  // namespace

void registerSecretMethods(MethodTable& methods, SecretServices services) {
  methods.add(MethodSpec{
      "secrets.set",
      "Stores a secret for one tool revision (default: the tool's active one), encrypted at rest. "
      "Tools get only a placeholder from ctx.secret(name), which the daemon replaces by the value "
      "in request headers (and bodies with allowBody) sent to the listed origins, after "
      "authorization. carry: later revisions of the tool that request the secret use it too. No "
      "method ever answers the value. Returns the stored secret without its value, and whether "
      "the revision's manifest requests it.",
      RoleSet{Role::admin},
      paramsWith(
          json::object{
              {"tool", kTool},
              {"revision", kRevision},
              {"name", kSecretName},
              {"value",
               schema(
                   R"({"type":"string","minLength":1,"description":"the value (at most [secrets] max_value_bytes bytes); never answered, logged or audited"})")},
              {"origins",
               schema(
                   R"({"type":"array","minItems":1,"maxItems":32,"items":{"type":"string","minLength":1,"maxLength":2048},"description":"exact https origins the value may be sent to, such as https://api.example.com"})")},
              {"carry", schema(R"({"type":"boolean"})")},
              {"allowBody", schema(R"({"type":"boolean"})")}},
          {"tool", "name", "value", "origins"}),
      schema(
          R"({"type":"object","required":["tool","revision","name","origins","carry","allowBody","createdAt","requested"]})"),
      [services](CallContext& context, json::object params) -> asio::awaitable<MethodResult> {
        auto target = secretOf(services.registry, params);
        if (!target) co_return target.error();
        const std::string& name = target->name;
        const registry::ToolRevisionPtr& tool = target->tool;
        const json::string& value = params.at("value").as_string();
        const std::size_t maxBytes = services.configs.current()->secrets.maxValueBytes;
        if (value.size() > maxBytes) {
          co_return invalidParams("params.value: the value is " + std::to_string(value.size()) +
                                  " bytes; the limit is " + std::to_string(maxBytes) +
                                  " bytes ([secrets] max_value_bytes)");
        }
        policy::SecretGrant grant;
        grant.tool = tool->name;
        grant.revision = tool->revision;
        grant.name = name;
        std::size_t index = 0;
        for (const auto& origin : params.at("origins").as_array()) {
          // The origin is not quoted: an operator may have pasted the value in the wrong place.
          if (!registry::isCanonicalHttpsOrigin(origin.as_string())) {
            co_return invalidParams(
                "params.origins/" + std::to_string(index) +
                ": not an exact https origin in canonical form, such as https://api.example.com "
                "or https://api.example.com:8443 (lowercase, no path, no default port)");
          }
          grant.origins.emplace_back(origin.as_string());
          ++index;
        }
        grant.carry = flag(params, "carry");
        grant.allowBody = flag(params, "allowBody");
        auto stored = co_await services.disk.run([&] {
          return services.vault.set(grant, std::string_view(value.data(), value.size()));
        });
        if (!stored) co_return vaultFailure(stored.error());
        std::string origins;
        for (const auto& origin : stored->origins) origins += (origins.empty() ? "" : " ") + origin;
        auditChange(services.audit, *tool, name, "set",
                    "set by " + who(context) + " for " + origins +
                        (stored->carry ? "; carried to later revisions" : "") +
                        (stored->allowBody ? "; allowed in bodies" : ""));
        spdlog::info("secrets: {} of {} ({}) set by {}", name, tool->name, tool->revision,
                     who(context));
        auto answer = recordJson(*stored);
        answer["requested"] = requestsSecret(tool->manifest, name);
        co_return json::value(std::move(answer));
      }});

  methods.add(MethodSpec{
      "secrets.list",
      "The stored secrets (or one tool's): {secrets: [{tool, revision, name, origins, carry, "
      "allowBody, createdAt, active}]}, where active says whether the revision is the tool's "
      "active one. Never values.",
      RoleSet{Role::admin}, paramsWith(json::object{{"tool", kTool}}, {}),
      schema(R"({"type":"object","required":["secrets"]})"),
      [services](CallContext&, json::object params) -> asio::awaitable<MethodResult> {
        std::optional<std::string> tool;
        if (const auto* given = params.if_contains("tool")) tool = std::string(given->as_string());
        auto records = services.vault.list(tool);
        if (!records) co_return vaultFailure(records.error());
        std::map<std::string, std::optional<std::string>> active;  // tool -> bound revision
        json::array out;
        for (const auto& record : *records) {
          auto bound = active.find(record.tool);
          if (bound == active.end()) {
            auto binding = services.registry.tryBinding(record.tool);
            bound =
                active
                    .emplace(record.tool, binding ? std::optional(binding->revision) : std::nullopt)
                    .first;
          }
          auto entry = recordJson(record);
          entry["active"] = bound->second == record.revision;
          out.push_back(std::move(entry));
        }
        co_return json::value(json::object{{"secrets", std::move(out)}});
      }});

  methods.add(MethodSpec{
      "secrets.delete",
      "Removes the secret `name` of one tool revision (default: the tool's active one; a secret "
      "that a revision uses through carry is deleted under the revision it was set for, as "
      "secrets.list shows). Returns {deleted: whether it existed, tool, revision, name}, and "
      "when the revision uses a secret carried from another, carriedFrom (that revision) and a "
      "detail.",
      RoleSet{Role::admin},
      paramsWith(json::object{{"tool", kTool}, {"revision", kRevision}, {"name", kSecretName}},
                 {"tool", "name"}),
      schema(R"({"type":"object","required":["deleted","tool","revision","name"]})"),
      [services](CallContext& context, json::object params) -> asio::awaitable<MethodResult> {
        auto target = secretOf(services.registry, params);
        if (!target) co_return target.error();
        const std::string& name = target->name;
        const registry::ToolRevisionPtr& tool = target->tool;
        auto erased = co_await services.disk.run(
            [&] { return services.vault.erase(tool->name, tool->revision, name); });
        if (!erased) co_return vaultFailure(erased.error());
        if (*erased) {
          auditChange(services.audit, *tool, name, "deleted", "deleted by " + who(context));
        }
        json::object answer{{"deleted", *erased},
                            {"tool", tool->name},
                            {"revision", tool->revision},
                            {"name", name}};
        if (!*erased) {
          // The revision may still use a secret carried from an earlier one: say where it is.
          auto carried = co_await services.disk.run([&] {
            return resolveSecret(services.registry, services.vault, tool->name, tool->revision,
                                 name);
          });
          if (carried && *carried && (*carried)->resolution == policy::Resolution::carried) {
            const std::string& from = (*carried)->record.revision;
            answer["carriedFrom"] = from;
            answer["detail"] = "this revision has no " + name + " of its own; it uses the one " +
                               "carried from revision " + from +
                               ", which stays: delete that one with revision " + from;
          }
        }
        co_return json::value(std::move(answer));
      }});
}

}  // namespace toolhost::daemon
