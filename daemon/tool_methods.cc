#include "daemon/tool_methods.h"

#include "daemon/capability_host.h"
#include "daemon/external_tools.h"
#include "daemon/registry_errors.h"
#include "daemon/secrets_host.h"
#include "protocol/json_parse.h"
#include "runtime/tool_runner.h"

#include <boost/json/parse.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <ctime>

namespace toolhost::daemon {
namespace asio = boost::asio;
namespace json = boost::json;
using registry::RegistryErrc;

namespace {

// Above this many pairs of argument and schema values (about a millisecond of valijson), a
// call's arguments are checked on ToolServices::checks.
constexpr std::size_t kInlineCheckPairs = 100'000;

const json::value kName = schema(R"({"type":"string","minLength":1,"maxLength":64,"description":"a tool name"})");
const json::value kRevision =
    schema(R"({"type":"string","minLength":50,"maxLength":50,"description":"a revision: sha256: and 43 base64url characters"})");

json::object revisionSummary(const registry::ToolRevision& tool, bool active) {
  return json::object{{"name", tool.name},
                      {"revision", tool.revision},
                      {"class", registry::executionClassName(tool.executionClass)},
                      {"description", tool.manifest.at("description")},
                      {"installedAt", tool.installedAt},
                      {"active", active}};
}

std::int64_t msSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
}

// A sandboxed call's outcome as a JSON-RPC answer.
MethodResult answerFor(runtime::CallOutcome outcome, const registry::ToolRevision& tool,
                       const runtime::CallLimits& request, const runtime::RuntimeConfig& config) {
  json::object usage{{"wallMs", outcome.usage.wallMs},
                     {"cpuMs", outcome.usage.cpuMs},
                     {"heapPeakBytes", outcome.usage.heapPeakBytes},
                     {"freshSandbox", outcome.usage.freshSandbox}};
  if (outcome.result) {
    json::object answer{{"result", std::move(*outcome.result)},
                        {"name", tool.name},
                        {"revision", tool.revision},
                        {"usage", std::move(usage)}};
    if (!outcome.logs.empty()) answer["logs"] = outcome.logs;
    return json::value(std::move(answer));
  }
  const runtime::CallError& error = outcome.result.error();
  using runtime::CallErrc;
  int code = app_error::kToolThrew;
  const char* limit = nullptr;  // the manifest's name of the limit the call stopped at
  switch (error.code) {
    case CallErrc::timeout:
      code = app_error::kTimeout;
      limit = "wallMs";
      break;
    case CallErrc::cpuLimit:
      code = app_error::kCpuLimit;
      limit = "cpuMs";
      break;
    case CallErrc::memoryLimit:
      code = app_error::kMemoryLimit;
      limit = "heapMb";
      break;
    case CallErrc::arrayBufferLimit:
      code = app_error::kArrayBufferLimit;
      limit = "arrayBufferMb";
      break;
    case CallErrc::stackLimit:
      code = app_error::kStackLimit;
      limit = "stackKb";
      break;
    case CallErrc::outputTooLarge:
      code = app_error::kOutputTooLarge;
      limit = "outputBytes";
      break;
    case CallErrc::toolThrew:
    case CallErrc::invalidResult: code = app_error::kToolThrew; break;
    case CallErrc::invalidModule: code = app_error::kInvalidDefinition; break;
    case CallErrc::invalidLimits: code = protocol::rpc_error::kInvalidParams; break;
    case CallErrc::cancelled: code = app_error::kCancelled; break;
    case CallErrc::overloaded: code = app_error::kOverloaded; break;
    case CallErrc::notRunnable: code = app_error::kUnavailable; break;
    case CallErrc::sandboxCrashed: code = app_error::kSandboxCrashed; break;
  }
  protocol::RpcError rpc{
      code,
      code == protocol::rpc_error::kInvalidParams ? "Invalid params"
                                                  : std::string(app_error::message(code)),
      std::string(runtime::callErrcName(error.code)),
      error.detail + (limit != nullptr ? runtime::capNote(tool.manifest, limit, request, config)
                                       : std::string())};
  rpc.extra["revision"] = tool.revision;
  rpc.extra["usage"] = std::move(usage);
  if (!error.toolError.empty()) rpc.extra["toolError"] = error.toolError;
  if (!outcome.logs.empty()) rpc.extra["logs"] = outcome.logs;
  return rpc;
}

runtime::CallLimits requestedLimits(const json::object& params) {
  runtime::CallLimits limits;
  const auto* given = params.if_contains("limits");
  if (given == nullptr) return limits;
  const auto& object = given->as_object();
  auto read = [&](const char* key, std::optional<std::int64_t>& out) {
    if (const auto* value = object.if_contains(key)) out = value->to_number<std::int64_t>();
  };
  read("wallMs", limits.wallMs);
  read("cpuMs", limits.cpuMs);
  read("heapMb", limits.heapMb);
  read("arrayBufferMb", limits.arrayBufferMb);
  read("stackKb", limits.stackKb);
  read("outputBytes", limits.outputBytes);
  return limits;
}

}  // namespace

void registerToolMethods(MethodTable& methods, ToolServices services) {
  registry::Registry& registry = services.registry;
  DiskThread& disk = services.disk;

  methods.add(MethodSpec{
      "tools.install",
      "Validates and stores a tool manifest. The revision is the content hash of the manifest "
      "exactly as submitted; installing the same manifest again writes nothing. Returns {revision, "
      "name, created}.",
      RoleSet{Role::admin},
      paramsWith(json::object{{"manifest", registry::Registry::manifestSchema()}}, {"manifest"}),
      schema(R"({"type":"object","required":["revision","name","created"]})"),
      [&registry, &disk, sandboxes = services.sandboxes](
          CallContext&, json::object params) -> asio::awaitable<MethodResult> {
        const json::object& manifest = params.at("manifest").as_object();
        // Source that cannot run is refused now, not at its first call: its modules are
        // compiled and linked (imports resolved, no top-level await; none of its code runs) in
        // a sandbox of their own, under the manifest's limits. A stored manifest is not again.
        // When the runtime cannot check it now (busy with agents' calls, restarting a crashing
        // host, shutting down), it is installed unchecked and the answer says so: installing a
        // fixed revision must not wait for a healthy runtime.
        std::optional<std::string> notChecked;
        if (sandboxes != nullptr) {
          auto preview = co_await disk.run([&] { return registry.preview(manifest); });
          if (!preview) co_return toRpcError(preview.error());
          if (*preview && (**preview)->executionClass == registry::ExecutionClass::sandboxedCode) {
            const registry::ToolRevisionPtr tool = **preview;
            runtime::CallOptions options;
            options.mode = runtime::CallOptions::Mode::disposable;
            options.checkOnly = true;
            auto checked = co_await sandboxes->call(tool, {}, std::move(options));
            if (!checked.result) {
              using runtime::CallErrc;
              const CallErrc code = checked.result.error().code;
              if (code == CallErrc::invalidModule) {
                co_return toRpcError(
                    registry::RegistryError{RegistryErrc::invalidDefinition,
                                            "manifest/execution: " + checked.result.error().detail +
                                                "; nothing was installed"});
              }
              if (runtime::isLimitErrc(code)) {
                // Its modules do not even compile within the manifest's limits.
                auto answer = answerFor(std::move(checked), *tool, {}, sandboxes->config());
                protocol::RpcError error =
                    answer.has_error() ? answer.error() : protocol::RpcError{};
                error.detail =
                    "nothing was installed: compiling the tool's modules went past "
                    "its limits: " +
                    error.detail;
                error.extra.erase("revision");
                error.extra.erase("usage");
                co_return error;
              }
              notChecked = checked.result.error().detail;
              spdlog::warn("tools.install: {} installed without its compile check: {}", tool->name,
                           *notChecked);
            }
          }
        }
        auto outcome = co_await disk.run([&] { return registry.install(manifest); });
        if (!outcome) co_return toRpcError(outcome.error());
        json::object answer{{"revision", outcome->revision},
                            {"name", outcome->name},
                            {"created", outcome->created}};
        if (notChecked) {
          answer["notChecked"] = "its modules were not compiled before it was stored (" +
                                 *notChecked + "); its first call will say if they do not load";
        }
        co_return json::value(std::move(answer));
      }});

  methods.add(MethodSpec{
      "tools.activate",
      "Binds a name to one of its revisions. Moving an existing binding needs replace: true; the "
      "answer lists what changed in requested capabilities and limits, and how the secrets the "
      "revision requests resolve: secrets: {own, carried, missing}.",
      RoleSet{Role::admin},
      paramsWith(json::object{{"name", kName}, {"revision", kRevision}, {"replace", schema(R"({"type":"boolean"})")}},
                 {"name", "revision"}),
      schema(R"({"type":"object","required":["name","revision","changed"]})"),
      [&registry, &disk, secrets = services.secrets](
          CallContext&, json::object params) -> asio::awaitable<MethodResult> {
        const auto* replace = params.if_contains("replace");
        auto outcome = co_await disk.run([&] {
          return registry.activate(std::string(params.at("name").as_string()),
                                   std::string(params.at("revision").as_string()),
                                   replace != nullptr && replace->as_bool());
        });
        if (!outcome) co_return toRpcError(outcome.error());
        json::object answer{{"name", outcome->name},
                            {"revision", outcome->revision},
                            {"changed", outcome->changed},
                            {"previous", outcome->previous ? json::value(*outcome->previous) : json::value(nullptr)},
                            {"changes", outcome->changes}};
        // Which secrets the revision now bound requests resolve, and how.
        if (secrets != nullptr) {
          if (auto tool = registry.getRevision(outcome->revision, outcome->name)) {
            answer["secrets"] = secrets->describeRequested(**tool);
          }
        }
        co_return json::value(std::move(answer));
      }});

  methods.add(MethodSpec{
      "tools.configure",
      "Stores settings for one tool revision, content-addressed; they become that revision's "
      "current settings. Returns {settingsRevision, created}.",
      RoleSet{Role::admin},
      paramsWith(json::object{{"name", kName}, {"revision", kRevision}, {"settings", schema(R"({"type":"object"})")}},
                 {"name", "revision", "settings"}),
      schema(R"({"type":"object","required":["settingsRevision","created"]})"),
      [&registry, &disk](CallContext&, json::object params) -> asio::awaitable<MethodResult> {
        auto outcome = co_await disk.run([&] {
          return registry.configure(std::string(params.at("name").as_string()),
                                    std::string(params.at("revision").as_string()),
                                    params.at("settings").as_object());
        });
        if (!outcome) co_return toRpcError(outcome.error());
        co_return json::value(
            json::object{{"settingsRevision", outcome->settingsRevision}, {"created", outcome->created}});
      }});

  methods.add(MethodSpec{
      "tools.get",
      "One tool revision with its manifest: by name (the active revision), by revision, or both "
      "(the revision must carry the name).",
      RoleSet{Role::agent},
      paramsWith(json::object{{"name", kName}, {"revision", kRevision}}, {}),
      schema(R"({"type":"object","required":["name","revision","manifest","active"]})"),
      [&registry](CallContext&, json::object params) -> asio::awaitable<MethodResult> {
        std::optional<std::string> name;
        if (const auto* given = params.if_contains("name")) name = std::string(given->as_string());
        registry::Result<registry::ToolRevisionPtr> tool = registry::RegistryError{RegistryErrc::notFound, ""};
        if (const auto* revision = params.if_contains("revision")) {
          tool = registry.getRevision(std::string(revision->as_string()), name);
        } else if (name) {
          tool = registry.getActive(*name);
        } else {
          co_return invalidParams("params: give name, revision, or both");
        }
        if (!tool) co_return toRpcError(tool.error());
        auto binding = registry.tryBinding((*tool)->name);
        bool active = binding && binding->revision == (*tool)->revision;
        auto answer = revisionSummary(**tool, active);
        answer["manifest"] = (*tool)->manifest;
        if (auto settings = registry.trySettingsRevision((*tool)->name, (*tool)->revision)) {
          answer["settingsRevision"] = *settings;
        }
        co_return json::value(std::move(answer));
      }});

  methods.add(MethodSpec{
      "tools.list",
      "The active bindings: every tool a call by name reaches, with its revision and class.",
      RoleSet{Role::agent},
      {},
      schema(R"({"type":"object","required":["tools"]})"),
      [&registry](CallContext&, json::object) -> asio::awaitable<MethodResult> {
        auto bindings = registry.list();
        if (!bindings) co_return toRpcError(bindings.error());
        json::array tools;
        for (const auto& binding : *bindings) {
          auto tool = registry.getRevision(binding.revision, binding.name);
          if (!tool) {
            spdlog::warn("tools.list: {} -> {}: {}", binding.name, binding.revision, tool.error().detail);
            tools.push_back(json::object{{"name", binding.name},
                                         {"revision", binding.revision},
                                         {"error", tool.error().detail}});
            continue;
          }
          auto summary = revisionSummary(**tool, true);
          summary["activatedAt"] = binding.activatedAt;
          tools.push_back(std::move(summary));
        }
        co_return json::value(json::object{{"tools", std::move(tools)}});
      }});

  methods.add(MethodSpec{
      "tools.history",
      "Every revision installed under a name, oldest first, with its install time and which is active.",
      RoleSet{Role::agent},
      paramsWith(json::object{{"name", kName}}, {"name"}),
      schema(R"({"type":"object","required":["name","revisions"]})"),
      [&registry](CallContext&, json::object params) -> asio::awaitable<MethodResult> {
        std::string name(params.at("name").as_string());
        auto history = registry.history(name);
        if (!history) co_return toRpcError(history.error());
        json::array revisions;
        for (const auto& entry : *history) {
          revisions.push_back(json::object{
              {"revision", entry.revision}, {"installedAt", entry.installedAt}, {"active", entry.active}});
        }
        co_return json::value(json::object{{"name", name}, {"revisions", std::move(revisions)}});
      }});

  methods.add(MethodSpec{
      "tools.call",
      "Calls a tool: by name (pinned to the active revision at call time) or by revision. "
      "Arguments are validated against the tool's parameters. Returns {result, name, revision, usage}.",
      RoleSet{Role::agent},
      paramsWith(json::object{{"name", kName},
                              {"revision", kRevision},
                              {"arguments", schema(R"({"type":"object"})")},
                              {"mode", schema(R"({"enum":["retained","disposable"]})")},
                              {"taskId", schema(R"({"type":"string","minLength":50,"maxLength":50,
                                 "description":"the functioncall task this call executes; subtasks the tool creates follow it"})")},
                              {"limits", schema(R"({"type":"object","additionalProperties":false,"properties":{
                                 "wallMs":{"type":"integer","minimum":1},"cpuMs":{"type":"integer","minimum":1},
                                 "heapMb":{"type":"integer","minimum":1},"arrayBufferMb":{"type":"integer","minimum":1},
                                 "stackKb":{"type":"integer","minimum":64},"outputBytes":{"type":"integer","minimum":1}}})")}},
                 {}),
      schema(R"({"type":"object","required":["result","name","revision","usage"]})"),
      [services](CallContext&, json::object params) -> asio::awaitable<MethodResult> {
        registry::Registry& tools = services.registry;
        std::optional<std::string> name;
        if (const auto* given = params.if_contains("name")) name = std::string(given->as_string());
        registry::Result<registry::ToolRevisionPtr> resolved = registry::RegistryError{RegistryErrc::notFound, ""};
        if (const auto* revision = params.if_contains("revision")) {
          resolved = tools.getRevision(std::string(revision->as_string()), name);
        } else if (name) {
          resolved = tools.getActive(*name);
        } else {
          co_return invalidParams("params: give name or revision");
        }
        // A function call pinned to a tooldefinition of its lineage runs what that defines,
        // found through the task the call executes (the registry never holds it; a registry
        // tool of the same name is what the definition shadows there).
        std::optional<std::string> pinnedAs;  // the definition's id, when that is what runs
        // The task, read once: checked below.
        std::optional<registry::Result<json::object>> executed;
        const auto* taskParam = params.if_contains("taskId");
        if (taskParam != nullptr && services.tasks != nullptr &&
            (resolved || resolved.error().code == RegistryErrc::notFound)) {
          executed = services.tasks->get(std::string(taskParam->as_string()));
          const auto& stored = *executed;
          const json::object* call = nullptr;
          if (stored && stored->at("kind") == "functioncall") {
            if (const auto* found = stored->if_contains("call"); found && found->is_object()) {
              call = &found->as_object();
            }
          }
          const auto* pin = call != nullptr ? call->if_contains("toolRevision") : nullptr;
          const auto* callName = call != nullptr ? call->if_contains("name") : nullptr;
          if (pin != nullptr && pin->is_string() &&
              (!resolved || (*resolved)->revision != pin->as_string())) {
            const std::string pinned(pin->as_string());
            // The call by the name it was made with, or by what it is pinned to (or both).
            const auto* revision = params.if_contains("revision");
            const bool sameName = !name || (callName != nullptr && callName->is_string() &&
                                            callName->as_string() == *name);
            if (revision != nullptr && revision->as_string() == pinned && !sameName) {
              co_return invalidParams("params.name: the function call " +
                                      std::string(taskParam->as_string()) + " was made with " +
                                      (callName != nullptr && callName->is_string()
                                           ? "the name " + std::string(callName->as_string())
                                           : std::string("no name")));
            }
            const bool named = (revision == nullptr || revision->as_string() == pinned) &&
                               (revision != nullptr || name) && sameName;
            // A registry revision (the binding moved since the call was compiled) is no
            // definition: the check of the taskId below says so.
            if (named && !tools.getRevision(pinned)) {
              auto defined = services.tasks->keptDefinedTool(pinned);
              if (!defined) {
                // The first call of a definition reads it and compiles its parameters: off the
                // I/O thread, on a thread of its own.
                auto build = [&] { return services.tasks->definedTool(pinned); };
                if (services.definitions != nullptr) {
                  defined = co_await services.definitions->run(build);
                } else {
                  defined = build();
                }
              }
              const auto& built = *defined;  // what it defines, if it is a definition
              if (!built && built.error().code != RegistryErrc::notFound) {
                co_return toRpcError(built.error());
              }
              if (built && *built) {
                resolved = **built;
                pinnedAs = pinned;
              }
            }
          }
        }
        if (!resolved) co_return toRpcError(resolved.error());
        registry::ToolRevisionPtr tool = *resolved;
        json::object arguments;
        if (auto* given = params.if_contains("arguments")) arguments = std::move(given->as_object());
        auto validate = [&] {
          return tool->parameters.validate(arguments, registry::JsonSchema::kMaxPairsForArguments);
        };
        // Most arguments take microseconds to check, here; large ones against a large schema, or
        // long strings against its patterns, up to about a second, which would stall every
        // connection of this I/O thread.
        std::optional<registry::SchemaViolation> violation;
        if (services.checks != nullptr &&
            tool->parameters.checkCost(arguments) > kInlineCheckPairs) {
          violation = co_await services.checks->run(validate);
        } else {
          violation = validate();
        }
        if (violation) {
          co_return toRpcError(registry::RegistryError{RegistryErrc::invalidArguments,
                                                       violation->describe("arguments")});
        }
        if (const auto* task = params.if_contains("taskId"); task && services.tasks != nullptr) {
          // The function-call task this call executes (a tool's subtasks follow it): a function
          // call pinned to the revision that runs, run with the arguments it records, in the
          // order it records them.
          const std::string id(task->as_string());
          if (!executed) executed = services.tasks->get(id);
          auto& stored = *executed;
          if (!stored) co_return toRpcError(stored.error());
          const auto* call = stored->if_contains("call");
          const auto* pinned =
              call && call->is_object() ? call->as_object().if_contains("toolRevision") : nullptr;
          if (stored->at("kind") != "functioncall" || pinned == nullptr ||
              *pinned != json::value(pinnedAs.value_or(tool->revision))) {
            co_return invalidParams("params.taskId: " + id +
                                    " is not a function call of this revision (" + tool->revision +
                                    "): a call's subtasks follow the call it executes");
          }
          const auto* recorded = call->as_object().if_contains("arguments");
          if (recorded != nullptr && recorded->is_object()) {
            if (*recorded != json::value(arguments)) {
              co_return invalidParams("params.arguments: not the arguments the function call " +
                                      id +
                                      " records; a call that executes a task runs it "
                                      "as recorded");
            }
            arguments = recorded->as_object();
          }
        }
        auto started = std::chrono::steady_clock::now();
        switch (tool->executionClass) {
          case registry::ExecutionClass::trustedNative: {
            const registry::NativeTool* native = tools.tryNative(tool->revision);
            if (native == nullptr) {
              co_return appError(app_error::kNotFound, "not-found",
                                 "revision " + tool->revision + " of built-in tool " + tool->name +
                                     " is not part of this daemon's build");
            }
            // A built-in tool runs here, at once, on this thread: its CPU time is at most the
            // time it took, which is what it is charged. Reading this thread's CPU clock instead
            // is a system call on machines without a vDSO path for it, twice per call.
            const auto ran = std::chrono::steady_clock::now();
            auto outcome = native->run(arguments);
            const auto cpuMs = msSince(ran);
            if (!outcome) co_return appError(app_error::kToolThrew, "tool-error", outcome.error());
            co_return json::value(json::object{
                {"result", std::move(*outcome)},
                {"name", tool->name},
                {"revision", tool->revision},
                {"usage", json::object{{"wallMs", msSince(started)}, {"cpuMs", cpuMs}}}});
          }
          case registry::ExecutionClass::sandboxedCode: {
            if (services.sandboxes == nullptr) {
              co_return appError(app_error::kUnavailable, "unavailable", "the JavaScript runtime is not running");
            }
            runtime::CallOptions options;
            if (const auto* mode = params.if_contains("mode"); mode && mode->as_string() == "disposable") {
              options.mode = runtime::CallOptions::Mode::disposable;
            }
            // Code an agent defined (its revision is the definition's id: no admin installed it)
            // gets no retained sandbox: it could otherwise push out those of installed tools.
            const bool agentCode = pinnedAs && tool->revision == *pinnedAs;
            if (agentCode) {
              options.mode = runtime::CallOptions::Mode::disposable;
              options.agentCode = true;
            }
            options.limits = requestedLimits(params);
            const runtime::CallLimits requested = options.limits;
            if (const auto* task = params.if_contains("taskId")) {
              options.invocation["taskId"] = *task;
            }
            // What ctx.createSubtasksResult compiles during the call is answered beside the
            // result, from the daemon's own record (closed on every way out of the call). Only
            // a tool that requests the capability can make any.
            SubtaskLedger* ledger = runtime::subtasksRequested(*tool) ? services.subtasks : nullptr;
            struct Ledger {
              SubtaskLedger* ledger;
              std::string key;
              ~Ledger() {
                if (ledger != nullptr) ledger->close(key);
              }
            } subtasks{ledger, ""};
            if (ledger != nullptr) {
              // Bounded by the call's output limit, as its result is (each on its own: the
              // answer holds at most twice outputBytes); limits the runtime would refuse are
              // refused there, before anything runs.
              auto limits = runtime::effectiveLimits(tool->manifest, options.limits,
                                                     services.sandboxes->config());
              subtasks.key =
                  ledger->open(limits ? static_cast<std::size_t>(limits->outputBytes) : 0);
            }
            if (subtasks.ledger != nullptr) options.invocation["subtasksKey"] = subtasks.key;
            // The settings it runs with (ctx.settings): those pinned by the task it executes,
            // which it runs as recorded; else (no task, a task that pinned none, a lineage
            // binding) the revision's current ones, so that no task an agent writes strips
            // them. Code an agent defined has none.
            std::optional<std::string> settingsRevision;
            if (!pinnedAs && params.contains("taskId") && executed && *executed) {
              const auto& call = (*executed)->at("call").as_object();
              if (const auto* pinned = call.if_contains("settingsRevision");
                  pinned != nullptr && pinned->is_string()) {
                settingsRevision = std::string(pinned->as_string());
              }
            }
            if (!agentCode && !settingsRevision) {
              settingsRevision = tools.trySettingsRevision(tool->name, tool->revision);
            }
            if (settingsRevision) {
              auto settings = tools.sharedSettings(*settingsRevision, tool->name, tool->revision);
              if (!settings) co_return toRpcError(settings.error());
              options.settingsRevision = *settingsRevision;
              options.settings = std::move(*settings);
            }
            auto outcome =
                co_await services.sandboxes->call(tool, std::move(arguments), std::move(options));
            auto answer =
                answerFor(std::move(outcome), *tool, requested, services.sandboxes->config());
            if (settingsRevision && answer && answer->is_object()) {
              answer->as_object()["settingsRevision"] = *settingsRevision;
            }
            if (subtasks.ledger != nullptr && answer && answer->is_object()) {
              if (auto made = subtasks.ledger->close(subtasks.key); !made.empty()) {
                answer->as_object()["subtasks"] = std::move(made);
              }
            }
            co_return answer;
          }
          case registry::ExecutionClass::externalService: {
            if (services.external == nullptr) {
              co_return appError(app_error::kUnavailable, "unavailable",
                                 "this daemon does not forward external-service tools");
            }
            co_return co_await services.external->call(tool, std::move(arguments),
                                                       requestedLimits(params));
          }
        }
        co_return appError(app_error::kUnavailable, "unavailable", "unknown execution class");
      }});

  methods.add(MethodSpec{
      "store.verify",
      "Reads every page of the database in a separate process, then re-hashes every stored "
      "manifest, settings document and task, and checks every binding and every task's parent; "
      "lists what does not match (empty when all is well).",
      RoleSet{Role::admin},
      {},
      schema(R"({"type":"object","required":["ok","problems"]})"),
      [&registry, &disk, tasks = services.tasks, store = services.store,
       maintenance = services.maintenance != nullptr ? services.maintenance : services.checks](
          CallContext&, json::object) -> asio::awaitable<MethodResult> {
        // Damaged pages first: the walks below would follow them and could kill the daemon. The
        // walk (a child process) waits on a thread of its own, so that writes go on meanwhile.
        if (store != nullptr) {
          DiskThread& walker = maintenance != nullptr ? *maintenance : disk;
          auto failed = co_await walker.run([&] { return store->checkPages(); });
          if (failed && !failed->damaged) {
            co_return toRpcError(registry::RegistryError{
                registry::RegistryErrc::storage,
                "cannot check the database's pages, so nothing else was checked: " + failed->text});
          }
          if (failed) {
            spdlog::error("store.verify: the state database {} is damaged: {}",
                          store->databasePath().string(), failed->text);
            co_return json::value(json::object{
                {"ok", false}, {"problems", json::array{"database pages: " + failed->text}}});
          }
        }
        // Re-hashes everything stored: a long read, kept off the I/O threads.
        auto problems = co_await disk.run([&]() -> registry::Result<std::vector<std::string>> {
          auto found = registry.verifyAll();
          if (!found || tasks == nullptr) return found;
          auto ofTasks = tasks->verifyAll();
          if (!ofTasks) return ofTasks.error();
          found->insert(found->end(), ofTasks->begin(), ofTasks->end());
          return found;
        });
        if (!problems) co_return toRpcError(problems.error());
        json::array list;
        for (const auto& problem : *problems) list.emplace_back(problem);
        co_return json::value(json::object{{"ok", list.empty()}, {"problems", std::move(list)}});
      }});

  methods.add(MethodSpec{
      "store.backup",
      "Writes a copy of the state database as it stands now to path, a new file (absolute; the "
      "daemon's user writes it, mode 0600), without stopping the daemon. Secrets stay "
      "encrypted in it: keep the secrets key apart from it.",
      RoleSet{Role::admin},
      schema(R"({"type":"object","properties":{"path":{"type":"string","minLength":1,
                 "maxLength":4096}},"required":["path"],"additionalProperties":false})"),
      schema(R"({"type":"object","required":["path","bytes"]})"),
      [&disk, store = services.store,
       maintenance = services.maintenance != nullptr ? services.maintenance : services.checks](
          CallContext&, json::object params) -> asio::awaitable<MethodResult> {
        const std::string path(params.at("path").as_string());
        if (path.find('\0') != std::string::npos || path.front() != '/') {
          co_return invalidParams(
              "params.path: an absolute path, such as /var/backups/toolhost.mdb");
        }
        if (store == nullptr) {
          co_return appError(app_error::kUnavailable, "unavailable", "no state database");
        }
        // A long copy, one at a time, on a thread of its own (the path is not even looked at on
        // this one: a stalled mount would hold up every connection): writes and calls go on.
        DiskThread& copier = maintenance != nullptr ? *maintenance : disk;
        auto copied = co_await copier.run([&] { return store->backup(path); });
        if (!copied) {
          const bool exists = copied.error().exists;
          co_return toRpcError(registry::RegistryError{
              exists ? registry::RegistryErrc::conflict : registry::RegistryErrc::storage,
              exists ? copied.error().message
                     : "no backup was written: " + copied.error().message});
        }
        spdlog::info("store: backed up the state database to {} ({} bytes)", path, *copied);
        co_return json::value(json::object{{"path", path}, {"bytes", *copied}});
      }});
}

}  // namespace toolhost::daemon
