#include "daemon/task_methods.h"

#include "daemon/registry_errors.h"
#include "protocol/content_hash.h"

#include <spdlog/spdlog.h>
#include <boost/json/parse.hpp>

namespace toolhost::daemon {
namespace asio = boost::asio;
namespace json = boost::json;
using registry::RegistryErrc;

namespace {

// No `pattern`: valijson evaluates it with std::regex, which overflows the stack on long input.
// The TaskStore checks the exact form of every id.
const json::value kTaskId = schema(
    R"({"type":"string","minLength":50,"maxLength":50,"description":"a task id: sha256: and 43 base64url characters"})");

// Items are only objects here: the TaskStore checks each task's shape and names the offending
// member ("drafts[2].call.name: ..."), which a schema violation could not say as well.
const json::value kTaskObject = schema(R"({"type":"object"})");

json::value batchOf(std::size_t maxItems, json::value items, std::string_view description) {
  return json::object{
      {"type", "array"},
      {"minItems", 1},
      {"maxItems", static_cast<std::int64_t>(maxItems)},  // valijson reads int64 only
      {"items", std::move(items)},
      {"description", description}};
}

// Integrity and storage failures are the daemon's problem, not the caller's: logged with the
// request they broke.
MethodResult failure(const CallContext& context, std::string_view method,
                     const registry::RegistryError& error) {
  if (error.code == RegistryErrc::integrity || error.code == RegistryErrc::storage) {
    spdlog::warn("conn={} req={} {}: {}", context.connectionId, context.requestId, method,
                 error.detail);
  }
  return toRpcError(error);
}

std::string idParam(const json::object& params) { return std::string(params.at("id").as_string()); }

// params[key], when present, must have a task id's form (the schema checks only its length): a
// malformed one is a mistake in the request, not a task that is missing.
std::optional<MethodResult> malformedId(const json::object& params, std::string_view key) {
  const auto* id = params.if_contains(key);
  if (id == nullptr || protocol::isContentHash(id->as_string())) return std::nullopt;
  return invalidParams("params/" + std::string(key) +
                       ": not a task id (\"sha256:\" and 43 base64url characters)");
}

}  // namespace

void registerTaskMethods(MethodTable& methods, registry::TaskStore& tasks, DiskThread& disk,
                         DiskThread& reads, runtime::ToolRunner* sandboxes) {
  const registry::TaskLimits& limits = tasks.limits();
  const json::value taskSchema = schema(R"({"type":"object","required":["id","kind","role"]})");

  methods.add(MethodSpec{
      "tasks.compile",
      "Links drafts into a chain under parentId (or as a new root) and pins every function call to "
      "{name, toolRevision, settingsRevision?, arguments}: a name resolves through the nearest "
      "tooldefinition in the lineage, then the registry binding. Drafts carry neither id nor "
      "parentId. A code tooldefinition's modules are compiled (none of its code runs) and refused "
      "if they cannot load. Writes nothing; returns {tasks} with their ids, ready for "
      "tasks.commit, and notChecked when the runtime could not compile some definitions now.",
      RoleSet{Role::agent},
      paramsWith(
          json::object{
              {"drafts",
               batchOf(
                   limits.maxBatch, kTaskObject,
                   "task drafts in order: {kind, role, priorId?, ...}; kind message {content}, "
                   "functioncall {call: {name, arguments}}, toolresult {callId, result | error}, "
                   "tooldefinition {definition: {name, description, parameters, implementation}}")},
              {"parentId", kTaskId}},
          {"drafts"}),
      schema(R"({"type":"object","required":["tasks"],"properties":{"tasks":{"type":"array"}}})"),
      [&tasks, &reads, sandboxes](CallContext& context,
                                  json::object params) -> asio::awaitable<MethodResult> {
        if (auto bad = malformedId(params, "parentId")) co_return std::move(*bad);
        std::optional<std::string> parentId;
        if (const auto* parent = params.if_contains("parentId"))
          parentId = std::string(parent->as_string());
        struct Compiled {
          json::array tasks;
          std::vector<std::pair<std::size_t, registry::ToolRevisionPtr>> code;  // draft, tool
        };
        auto compiled = co_await reads.run([&]() -> registry::Result<Compiled> {
          auto made = tasks.compile(params.at("drafts").as_array(), parentId);
          if (!made) return made.error();
          Compiled out{std::move(*made), {}};
          if (sandboxes == nullptr) return out;
          for (std::size_t i = 0; i < out.tasks.size(); ++i) {
            const json::object& task = out.tasks[i].as_object();
            if (task.at("kind").as_string() != registry::task_kind::kToolDefinition) continue;
            const json::object& definition = task.at("definition").as_object();
            if (definition.at("implementation").as_object().at("type") != "code") continue;
            auto tool = registry::TaskStore::codeDefinitionTool(
                std::string(task.at("id").as_string()), definition);
            if (!tool) return tool.error();
            out.code.emplace_back(i, std::move(*tool));
          }
          return out;
        });
        if (!compiled) co_return failure(context, "tasks.compile", compiled.error());
        // Code that cannot run is refused now, not at its first call, as tools.install refuses
        // it: its modules are compiled and linked (none of its code runs) in a sandbox of their
        // own, under the limits it would run with. When the runtime cannot check them now, the
        // answer's notChecked says which were not.
        json::array notChecked;
        for (auto& [draft, tool] : compiled->code) {
          const std::string where =
              "drafts[" + std::to_string(draft) + "].definition.implementation";
          runtime::CallOptions options;
          options.mode = runtime::CallOptions::Mode::disposable;
          options.checkOnly = true;
          options.agentCode = true;
          auto checked = co_await sandboxes->call(tool, {}, std::move(options));
          if (checked.result) continue;
          using runtime::CallErrc;
          const runtime::CallError& error = checked.result.error();
          if (error.code == CallErrc::invalidModule) {
            co_return toRpcError(
                registry::RegistryError{RegistryErrc::invalidDefinition,
                                        where + ": " + error.detail + "; nothing was compiled"});
          }
          if (runtime::isLimitErrc(error.code)) {
            co_return toRpcError(registry::RegistryError{
                RegistryErrc::invalidDefinition,
                where + ": compiling its modules went past the limits it would run under (" +
                    error.detail + "); nothing was compiled"});
          }
          notChecked.emplace_back(where + ": its modules were not compiled (" + error.detail +
                                  "); its first call will say if they do not load");
        }
        json::object answer{{"tasks", std::move(compiled->tasks)}};
        if (!notChecked.empty()) answer["notChecked"] = std::move(notChecked);
        co_return json::value(std::move(answer));
      }});

  methods.add(MethodSpec{
      "tasks.commit",
      "Verifies every task (its id re-computed, its parentId and priorId stored or earlier in the "
      "batch, every call pinned to a revision that resolves, every toolresult answering a call of "
      "its lineage) and then stores them all in one transaction; one bad task and nothing is "
      "written. Committing stored tasks again is harmless. Returns {ids, created}.",
      RoleSet{Role::agent},
      paramsWith(json::object{{"tasks", batchOf(limits.maxBatch, kTaskObject,
                                                "tasks as tasks.compile returns them")}},
                 {"tasks"}),
      schema(R"({"type":"object","required":["ids","created"],"properties":{
          "ids":{"type":"array","items":{"type":"string"}},"created":{"type":"integer"}}})"),
      [&tasks, &disk, &reads](CallContext& context,
                              json::object params) -> asio::awaitable<MethodResult> {
        // The checks walk the lineages the batch extends (seconds for long ones): on the
        // lineage-read thread, so that every other write does not wait behind them.
        auto prepared =
            co_await reads.run([&] { return tasks.prepareCommit(params.at("tasks").as_array()); });
        if (!prepared) co_return failure(context, "tasks.commit", prepared.error());
        auto committed = co_await disk.run([&] { return tasks.writeCommit(*prepared); });
        if (!committed) co_return failure(context, "tasks.commit", committed.error());
        json::array ids;
        for (auto& id : committed->ids) ids.emplace_back(id);
        co_return json::value(
            json::object{{"ids", std::move(ids)}, {"created", committed->created}});
      }});

  methods.add(MethodSpec{
      "tasks.get", "One stored task with its id, re-hashed on read.", RoleSet{Role::agent},
      paramsWith(json::object{{"id", kTaskId}}, {"id"}), taskSchema,
      [&tasks, &reads](CallContext& context, json::object params) -> asio::awaitable<MethodResult> {
        if (auto bad = malformedId(params, "id")) co_return std::move(*bad);
        const std::string id = idParam(params);
        auto task = co_await reads.run([&] { return tasks.get(id); });
        if (!task) co_return failure(context, "tasks.get", task.error());
        co_return json::value(std::move(*task));
      }});

  methods.add(MethodSpec{
      "tasks.lineage", "The task and its ancestors through parentId, root first: {tasks}.",
      RoleSet{Role::agent}, paramsWith(json::object{{"id", kTaskId}}, {"id"}),
      schema(R"({"type":"object","required":["tasks"],"properties":{"tasks":{"type":"array"}}})"),
      [&tasks, &reads](CallContext& context, json::object params) -> asio::awaitable<MethodResult> {
        if (auto bad = malformedId(params, "id")) co_return std::move(*bad);
        const std::string id = idParam(params);
        auto lineage = co_await reads.run([&] { return tasks.lineage(id); });
        if (!lineage) co_return failure(context, "tasks.lineage", lineage.error());
        co_return json::value(json::object{{"tasks", std::move(*lineage)}});
      }});

  methods.add(MethodSpec{
      "tasks.providerTools",
      "The tools visible at a task, as chat-completion APIs take them: {tools: [{type: "
      "\"function\", function: {name, description, parameters}}]}, registry bindings merged with "
      "the lineage's tooldefinitions (the nearest definition of a name wins), sorted by name.",
      RoleSet{Role::agent}, paramsWith(json::object{{"id", kTaskId}}, {"id"}),
      schema(R"({"type":"object","required":["tools"],"properties":{"tools":{"type":"array"}}})"),
      [&tasks, &reads](CallContext& context, json::object params) -> asio::awaitable<MethodResult> {
        if (auto bad = malformedId(params, "id")) co_return std::move(*bad);
        const std::string id = idParam(params);
        auto tools = co_await reads.run([&] { return tasks.providerTools(id); });
        if (!tools) co_return failure(context, "tasks.providerTools", tools.error());
        co_return json::value(json::object{{"tools", std::move(*tools)}});
      }});

  methods.add(MethodSpec{
      "tasks.messages",
      "The lineage of a task as chat-completion messages, root first, tooldefinitions left out: "
      "{messages}. Function calls become assistant tool_calls (id: the call's task id), tool "
      "results become tool messages.",
      RoleSet{Role::agent}, paramsWith(json::object{{"id", kTaskId}}, {"id"}),
      schema(
          R"({"type":"object","required":["messages"],"properties":{"messages":{"type":"array"}}})"),
      [&tasks, &reads](CallContext& context, json::object params) -> asio::awaitable<MethodResult> {
        if (auto bad = malformedId(params, "id")) co_return std::move(*bad);
        const std::string id = idParam(params);
        auto messages = co_await reads.run([&] { return tasks.messages(id); });
        if (!messages) co_return failure(context, "tasks.messages", messages.error());
        co_return json::value(json::object{{"messages", std::move(*messages)}});
      }});
}

}  // namespace toolhost::daemon
