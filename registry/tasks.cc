#include "registry/tasks.h"

#include "registry/manifest.h"

#include "protocol/content_hash.h"
#include "protocol/json_parse.h"
#include "protocol/json_text.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <map>
#include <unordered_map>
#include <utility>

namespace toolhost::registry {
namespace json = boost::json;

namespace {

constexpr std::string_view kTasksTable = "tasks";
// Stored tasks passed the depth limit when committed; this bound only keeps a damaged row from
// exhausting the stack, and is generous so that lowering the limit never hides old tasks.
constexpr std::size_t kStoredParseDepth = 4096;

constexpr std::array<std::string_view, 4> kKinds = {task_kind::kMessage, task_kind::kFunctionCall,
                                                    task_kind::kToolResult,
                                                    task_kind::kToolDefinition};
constexpr std::array<std::string_view, 4> kRoles = {"system", "user", "assistant", "tool"};

RegistryError invalid(std::string detail) {
  return RegistryError{RegistryErrc::invalidDefinition, std::move(detail)};
}
RegistryError missing(std::string detail) {
  return RegistryError{RegistryErrc::notFound, std::move(detail)};
}
RegistryError storageError(const store::Store& store, const boost::system::error_code& ec) {
  return RegistryError{RegistryErrc::storage, store.describe(ec)};
}

// A client-supplied string in a sentence: quoted and cut short, so a detail stays readable.
std::string shown(std::string_view text) {
  constexpr std::size_t kMax = 80;
  std::string out = "\"";
  out.append(text.substr(0, kMax));
  out.append(text.size() <= kMax ? "\"" : "...\"");
  return out;
}

template <std::size_t N>
bool oneOf(std::string_view text, const std::array<std::string_view, N>& options) {
  return std::find(options.begin(), options.end(), text) != options.end();
}

template <std::size_t N>
std::string joined(const std::array<std::string_view, N>& words) {
  std::string out;
  for (std::string_view word : words) {
    if (!out.empty()) out += ", ";
    out += word;
  }
  return out;
}

// The string member `key`, if present and a string.
std::optional<std::string> stringMember(const json::object& object, std::string_view key) {
  const auto* value = object.if_contains(key);
  if (value == nullptr || !value->is_string()) return std::nullopt;
  return std::string(value->get_string());
}

// Read a member that checkShape() (or the commit of a stored task) vouched for.
const json::object& objectAt(const json::object& object, std::string_view key) {
  return object.at(key).as_object();
}
std::string stringAt(const json::object& object, std::string_view key) {
  return std::string(object.at(key).as_string());
}

template <class T>
Result<T> unwrap(boost::system::result<Result<T>> outcome, const store::Store& store) {
  if (!outcome) return storageError(store, outcome.error());
  return std::move(*outcome);
}

// ---- shape ----------------------------------------------------------------------------------

enum class Mode { draft, task };

std::optional<RegistryError> checkMembers(const json::object& object, const std::string& where,
                                          std::initializer_list<std::string_view> allowed) {
  for (const auto& [key, value] : object) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      std::string list;
      for (std::string_view name : allowed) list += (list.empty() ? "" : ", ") + std::string(name);
      return invalid(where + ": unknown member " + shown(key) + " (allowed: " + list + ")");
    }
  }
  return std::nullopt;
}

std::optional<RegistryError> checkTaskIdMember(const json::object& object, std::string_view key,
                                               const std::string& where, bool required) {
  const auto* value = object.if_contains(key);
  if (value == nullptr) {
    if (required) return invalid(where + "." + std::string(key) + ": required (a task id)");
    return std::nullopt;
  }
  if (!value->is_string() || !protocol::isContentHash(value->get_string())) {
    return invalid(where + "." + std::string(key) +
                   ": must be a task id (\"sha256:\" and 43 characters)");
  }
  return std::nullopt;
}

std::optional<RegistryError> checkCall(const json::object& task, Mode mode,
                                       const std::string& where) {
  const std::string at = where + ".call";
  const auto* value = task.if_contains("call");
  if (value == nullptr || !value->is_object()) {
    return invalid(at + ": required, an object {name, arguments}");
  }
  const json::object& call = value->get_object();
  if (mode == Mode::draft) {
    for (std::string_view pinned : {"toolRevision", "settingsRevision"}) {
      if (call.contains(pinned)) {
        return invalid(at + "." + std::string(pinned) +
                       ": a draft names the tool only; tasks.compile pins the revision");
      }
    }
    if (auto e = checkMembers(call, at, {"name", "arguments"})) return e;
  } else {
    if (auto e =
            checkMembers(call, at, {"name", "toolRevision", "settingsRevision", "arguments"})) {
      return e;
    }
    const auto* revision = call.if_contains("toolRevision");
    if (revision == nullptr) {
      return invalid(at +
                     ".toolRevision: required; a function call is committed only pinned to a "
                     "tool revision (tasks.compile pins it)");
    }
    if (!revision->is_string() || !protocol::isContentHash(revision->get_string())) {
      return invalid(at + ".toolRevision: must be a revision (\"sha256:\" and 43 characters)");
    }
    if (const auto* settings = call.if_contains("settingsRevision")) {
      if (!settings->is_string() || !protocol::isContentHash(settings->get_string())) {
        return invalid(at +
                       ".settingsRevision: must be a settings revision (\"sha256:\" and 43 "
                       "characters)");
      }
    }
  }
  const auto* name = call.if_contains("name");
  if (name == nullptr || !name->is_string()) return invalid(at + ".name: required, a tool name");
  if (!isValidToolName(name->get_string())) {
    return invalid(at + ".name: " + shown(name->get_string()) +
                   " is not a tool name (lowercase letters and digits in words joined by - or _)");
  }
  const auto* arguments = call.if_contains("arguments");
  if (arguments == nullptr || !arguments->is_object()) {
    return invalid(at + ".arguments: required, an object");
  }
  return std::nullopt;
}

std::optional<RegistryError> checkDefinition(const json::object& task, const std::string& where,
                                             const TaskLimits& limits) {
  const std::string at = where + ".definition";
  const auto* value = task.if_contains("definition");
  if (value == nullptr || !value->is_object()) {
    return invalid(at + ": required, an object {name, description, parameters, implementation}");
  }
  const json::object& definition = value->get_object();
  if (auto e =
          checkMembers(definition, at, {"name", "description", "parameters", "implementation"})) {
    return e;
  }
  const auto* name = definition.if_contains("name");
  if (name == nullptr || !name->is_string()) return invalid(at + ".name: required, a tool name");
  if (!isValidToolName(name->get_string())) {
    return invalid(at + ".name: " + shown(name->get_string()) +
                   " is not a tool name (lowercase letters and digits in words joined by - or _)");
  }
  const auto* description = definition.if_contains("description");
  if (description == nullptr || !description->is_string()) {
    return invalid(at + ".description: required, a string");
  }
  if (description->get_string().size() > limits.maxDescriptionBytes) {
    return invalid(at + ".description: " + std::to_string(description->get_string().size()) +
                   " bytes; the limit is " + std::to_string(limits.maxDescriptionBytes));
  }
  const auto* parameters = definition.if_contains("parameters");
  if (parameters == nullptr) return invalid(at + ".parameters: required, a JSON Schema object");
  auto compiled = compileToolSchema(*parameters, at + ".parameters");
  if (!compiled) return compiled.error();
  // What running it holds (TaskStore::definedTool) grows with its values.
  if (compiled->expandedValues() > TaskStore::kMaxDefinitionSchemaValues) {
    return invalid(at + ".parameters: " + std::to_string(compiled->expandedValues()) +
                   " values with its references written out; a lineage definition's parameters "
                   "may have at most " +
                   std::to_string(TaskStore::kMaxDefinitionSchemaValues));
  }
  const std::string implAt = at + ".implementation";
  const auto* implValue = definition.if_contains("implementation");
  if (implValue == nullptr || !implValue->is_object()) {
    return invalid(implAt + R"(: required, {"type": "code", "source"} or {"type": "binding", )"
                            R"("targetRevision"})");
  }
  const json::object& implementation = implValue->get_object();
  const auto type = stringMember(implementation, "type");
  if (type == "code") {
    if (auto e = checkMembers(implementation, implAt, {"type", "source", "modules"})) return e;
    const auto* source = implementation.if_contains("source");
    if (source == nullptr || !source->is_string() || source->get_string().empty()) {
      return invalid(implAt + ".source: required, the tool's JavaScript module (a string)");
    }
    if (const auto* modules = implementation.if_contains("modules")) {
      if (!modules->is_object()) return invalid(implAt + ".modules: must be an object of strings");
      if (modules->get_object().size() > limits.maxModules) {
        return invalid(implAt + ".modules: " + std::to_string(modules->get_object().size()) +
                       " modules; the limit is " + std::to_string(limits.maxModules));
      }
      for (const auto& [moduleName, moduleSource] : modules->get_object()) {
        if (!moduleSource.is_string()) {
          return invalid(implAt + ".modules: each module needs a string source");
        }
        if (!validModuleName(moduleName)) {
          return invalid(implAt + ".modules: \"" + std::string(moduleName).substr(0, 80) +
                         "\" is not a module name; " + std::string(kModuleNameRule));
        }
      }
    }
  } else if (type == "binding") {
    if (auto e = checkMembers(implementation, implAt, {"type", "targetRevision"})) return e;
    const auto* target = implementation.if_contains("targetRevision");
    if (target == nullptr || !target->is_string() ||
        !protocol::isContentHash(target->get_string())) {
      return invalid(implAt +
                     ".targetRevision: required, a registry revision (\"sha256:\" and 43 "
                     "characters)");
    }
  } else {
    return invalid(implAt + R"(.type: must be "code" or "binding")");
  }
  return std::nullopt;
}

// Every rule on a task's shape that needs neither the store nor the registry. In Mode::draft the
// task has no parentId or id (the caller checks that with its own words) and calls are unpinned.
std::optional<RegistryError> checkShape(const json::object& task, Mode mode,
                                        const std::string& where, const TaskLimits& limits) {
  std::size_t depth = 1;
  for (const auto& [key, value] : task) depth = std::max(depth, protocol::jsonDepth(value) + 1);
  if (depth > limits.maxDepth) {
    return invalid(where + ": nested deeper than " + std::to_string(limits.maxDepth) + " levels");
  }
  const auto kind = stringMember(task, "kind");
  if (!kind || !oneOf(*kind, kKinds)) {
    return invalid(where + ".kind: required, one of " + joined(kKinds));
  }
  const auto role = stringMember(task, "role");
  if (!role || !oneOf(*role, kRoles)) {
    return invalid(where + ".role: required, one of " + joined(kRoles));
  }
  std::optional<RegistryError> unknown;
  if (*kind == task_kind::kMessage) {
    unknown = checkMembers(task, where, {"kind", "role", "parentId", "priorId", "content"});
  } else if (*kind == task_kind::kFunctionCall) {
    unknown = checkMembers(task, where, {"kind", "role", "parentId", "priorId", "call"});
  } else if (*kind == task_kind::kToolResult) {
    unknown = checkMembers(task, where,
                           {"kind", "role", "parentId", "priorId", "callId", "result", "error"});
  } else {
    unknown = checkMembers(task, where, {"kind", "role", "parentId", "priorId", "definition"});
  }
  if (unknown) return unknown;
  if (auto e = checkTaskIdMember(task, "parentId", where, false)) return e;
  if (auto e = checkTaskIdMember(task, "priorId", where, false)) return e;

  if (*kind == task_kind::kMessage) {
    if (!task.contains("content")) return invalid(where + ".content: required");
  } else if (*kind == task_kind::kFunctionCall) {
    if (auto e = checkCall(task, mode, where)) return e;
  } else if (*kind == task_kind::kToolResult) {
    if (auto e = checkTaskIdMember(task, "callId", where, true)) return e;
    const bool hasResult = task.contains("result");
    const auto* error = task.if_contains("error");
    if (hasResult == (error != nullptr)) {
      return invalid(where + ": a toolresult has exactly one of result and error");
    }
    if (error != nullptr && !error->is_object() && !error->is_string()) {
      return invalid(where + ".error: must be an object or a string");
    }
  } else {
    if (auto e = checkDefinition(task, where, limits)) return e;
  }
  return std::nullopt;
}

// ---- hashing and storage ---------------------------------------------------------------------

struct Hashed {
  std::string id;
  std::string canonical;
};

Result<Hashed> hashTask(const json::object& task, const std::string& where,
                        const TaskLimits& limits) {
  auto canonical = protocol::canonicalJson(task);
  if (!canonical) return invalid(where + ": " + canonical.error().detail);
  if (canonical->size() > limits.maxTaskBytes) {
    return invalid(where + ": " + std::to_string(canonical->size()) +
                   " bytes of canonical JSON; the limit for one task is " +
                   std::to_string(limits.maxTaskBytes));
  }
  std::string id = protocol::contentHashOfCanonical(protocol::domain::kTask, *canonical);
  return Hashed{std::move(id), std::move(*canonical)};
}

// The task as served: "id" first, then its members.
json::object withId(const std::string& id, const json::object& task) {
  json::object out;
  out.reserve(task.size() + 1);
  out["id"] = id;
  for (const auto& [key, value] : task) out[key] = value;
  return out;
}

// A stored task, re-hashed against its id: a mismatch is never served. `id` must be a content
// hash (anything else is not a valid key and would poison the transaction).
Result<json::object> readVerified(store::ReadTxn& txn, store::Table table, const std::string& id) {
  auto text = txn.tryGet(table, id);
  if (!text) return missing("no task " + id);
  if (protocol::contentHashOfCanonical(protocol::domain::kTask, *text) != id) {
    spdlog::error("integrity: the stored task {} does not match its hash; not served", id);
    return RegistryError{RegistryErrc::integrity,
                         "the stored task " + id +
                             " does not match its hash; it is not served (see the daemon log)"};
  }
  auto parsed = protocol::parseJson(*text, protocol::JsonParseLimits{kStoredParseDepth});
  if (!parsed || !parsed->is_object()) {
    spdlog::error("integrity: the stored task {} is not a JSON object", id);
    return RegistryError{RegistryErrc::integrity, "the stored task " + id + " is unreadable"};
  }
  return std::move(parsed->as_object());
}

// Visits the stored lineage of `id` leaf first, each task verified: visit(id, task). Returns the
// number of tasks. A missing leaf is notFound; a missing ancestor is an integrity error (commit
// never writes a task before its parent).
// TODO(perf): every compile, commit and read re-walks and re-hashes the whole lineage; a cache of
// verified lineage summaries (immutable, like the tasks) would make appending to long lineages
// O(batch) instead of O(lineage).
// `admit(size)` is told each task's stored size before it is parsed; false stops the walk with
// tooLarge.
template <class Visit, class Admit = bool (*)(std::size_t)>
Result<std::size_t> walkStored(
    store::ReadTxn& txn, store::Table table, const std::string& id, const TaskLimits& limits,
    Visit&& visit, Admit&& admit = [](std::size_t) { return true; }) {
  std::size_t count = 0;
  std::optional<std::string> current = id;
  std::string child;
  while (current) {
    if (++count > limits.maxLineage) {
      return invalid("the lineage of " + id + " is longer than " +
                     std::to_string(limits.maxLineage) + " tasks");
    }
    if (auto text = txn.tryGet(table, *current); text && !admit(text->size())) {
      return RegistryError{RegistryErrc::tooLarge,
                           "the lineage of " + id + " holds more than " +
                               std::to_string(limits.maxReadBytes >> 20) +
                               " MiB of tasks, more than one answer can carry; read it in parts "
                               "with tasks.get"};
    }
    auto task = readVerified(txn, table, *current);
    if (!task) {
      if (count > 1 && task.error().code == RegistryErrc::notFound) {
        spdlog::error("integrity: the stored task {} names a parent {} that is not stored", child,
                      *current);
        return RegistryError{
            RegistryErrc::integrity,
            "the stored task " + child + " names a parent " + *current + " that is not stored"};
      }
      return task.error();
    }
    std::optional<std::string> parent;
    if (const auto* link = task->if_contains("parentId")) {
      if (!link->is_string() || !protocol::isContentHash(link->get_string())) {
        return RegistryError{RegistryErrc::integrity,
                             "the stored task " + *current + " has a malformed parentId"};
      }
      parent = std::string(link->get_string());
    }
    child = *current;
    visit(*current, std::move(*task));
    current = std::move(parent);
  }
  return count;
}

// ---- lineage summaries -----------------------------------------------------------------------

// What a descendant needs to know about an ancestor: its kind, the tool it defines or calls, and,
// for a definition, the definition itself.
struct Ancestor {
  std::string kind;
  std::string name;                        // definition.name or call.name; empty otherwise
  std::optional<json::object> definition;  // tooldefinition only
};

Ancestor describeTask(const json::object& task) {
  Ancestor out;
  out.kind = stringMember(task, "kind").value_or("");
  if (out.kind == task_kind::kFunctionCall) {
    if (const auto* call = task.if_contains("call"); call && call->is_object()) {
      out.name = stringMember(call->get_object(), "name").value_or("");
    }
  } else if (out.kind == task_kind::kToolDefinition) {
    if (const auto* definition = task.if_contains("definition");
        definition && definition->is_object()) {
      out.name = stringMember(definition->get_object(), "name").value_or("");
      out.definition = definition->get_object();
    }
  }
  return out;
}

// A tooldefinition in scope: the task that holds it and the definition.
struct Visible {
  std::string id;
  json::object definition;
};

struct StoredLineage {
  std::size_t length = 0;
  std::unordered_map<std::string, Ancestor> ancestors;      // every task of the lineage, by id
  std::map<std::string, Visible, std::less<>> definitions;  // by name; nearest ancestor wins
};

Result<StoredLineage> summarize(store::ReadTxn& txn, store::Table table, const std::string& id,
                                const TaskLimits& limits) {
  StoredLineage out;
  auto walked =
      walkStored(txn, table, id, limits, [&](const std::string& taskId, json::object task) {
        Ancestor ancestor = describeTask(task);
        if (ancestor.definition) {
          // Leaf first: the first definition of a name met is the nearest one.
          out.definitions.try_emplace(ancestor.name, Visible{taskId, *ancestor.definition});
        }
        out.ancestors.emplace(taskId, std::move(ancestor));
      });
  if (!walked) return walked.error();
  out.length = *walked;
  return out;
}

}  // namespace

Result<std::string> taskId(const json::object& task) {
  json::object withoutId = task;
  withoutId.erase("id");
  auto canonical = protocol::canonicalJson(withoutId);
  if (!canonical) return invalid("task: " + canonical.error().detail);
  return protocol::contentHashOfCanonical(protocol::domain::kTask, *canonical);
}

TaskStore::TaskStore(store::Store& store, Registry& registry, TaskLimits limits)
    : store_(store), registry_(registry), limits_(limits), tasks_(store.table(kTasksTable)) {}

std::vector<std::string> TaskStore::tables() { return {std::string(kTasksTable)}; }

namespace {

// Checks call arguments against what a call pinned to `definition` would run: the definition's
// parameters, and for a binding also the parameters of the registry revision it pins.
// The parameters of definitions compiled so far in one request, by definition id: a request of
// a thousand calls to one definition compiles it once.
using DefinitionSchemas = std::map<std::string, JsonSchema, std::less<>>;

std::optional<RegistryError> checkDefinitionArguments(
    Registry& registry, const json::object& definition, const json::object& arguments,
    const std::string& where, const std::string& definitionId, DefinitionSchemas& compiled) {
  const std::string name = stringAt(definition, "name");
  auto known = compiled.find(definitionId);
  if (known == compiled.end()) {
    auto schema = compileToolSchema(definition.at("parameters"),
                                    "definition " + definitionId + " parameters");
    if (!schema) return schema.error();
    known = compiled.emplace(definitionId, std::move(*schema)).first;
  }
  // The agent wrote both the schema and the arguments: validation is bounded as for a tool's.
  if (auto violation = known->second.validate(arguments, JsonSchema::kMaxPairsForArguments)) {
    return RegistryError{RegistryErrc::invalidArguments,
                         where + ": the arguments do not match the parameters of " + name +
                             " (defined by " + definitionId +
                             "): " + violation->describe("arguments")};
  }
  const json::object& implementation = objectAt(definition, "implementation");
  if (stringMember(implementation, "type") == "binding") {
    const std::string target = stringAt(implementation, "targetRevision");
    auto tool = registry.getRevision(target);
    if (!tool) {
      if (tool.error().code != RegistryErrc::notFound) return tool.error();
      return missing(where + ": " + name + " (defined by " + definitionId +
                     ") is bound to the registry revision " + target + ", which is not stored");
    }
    if (auto violation =
            (*tool)->parameters.validate(arguments, JsonSchema::kMaxPairsForArguments)) {
      return RegistryError{RegistryErrc::invalidArguments,
                           where + ": the arguments do not match the parameters of " + name +
                               " at its bound revision " + target + ": " +
                               violation->describe("arguments")};
    }
  }
  return std::nullopt;
}

std::optional<RegistryError> checkBindingTarget(Registry& registry, const json::object& task,
                                                const std::string& where) {
  const json::object& implementation = objectAt(objectAt(task, "definition"), "implementation");
  if (stringMember(implementation, "type") != "binding") return std::nullopt;
  const std::string target = stringAt(implementation, "targetRevision");
  auto tool = registry.getRevision(target);
  if (tool) return std::nullopt;
  if (tool.error().code != RegistryErrc::notFound) return tool.error();
  return missing(where + ".definition.implementation.targetRevision: no registry revision " +
                 target);
}

// The rules for drafts a tool made (see DraftSource::tool), checked after checkShape.
std::optional<RegistryError> checkToolDraft(const json::object& draft, const std::string& where) {
  const std::string kind = stringAt(draft, "kind");
  if (kind != task_kind::kMessage && kind != task_kind::kFunctionCall) {
    return invalid(where + ".kind: a tool's subtasks hold messages and function calls, not " +
                   kind + "s (a result or a definition there would speak for another tool)");
  }
  const std::string role = stringAt(draft, "role");
  if (role != "assistant") {
    return invalid(where + ".role: a task a tool makes speaks as the assistant, not " +
                   shown(role));
  }
  if (draft.contains("priorId")) {
    return invalid(where + ".priorId: a tool's subtasks revise no task");
  }
  return std::nullopt;
}

}  // namespace

Result<json::array> TaskStore::compile(const json::array& drafts,
                                       const std::optional<std::string>& parentId,
                                       DraftSource source) {
  if (drafts.empty()) return invalid("drafts: nothing to compile");
  if (drafts.size() > limits_.maxBatch) {
    return invalid("drafts: " + std::to_string(drafts.size()) + " drafts; the limit is " +
                   std::to_string(limits_.maxBatch) + " per compile");
  }
  StoredLineage stored;
  if (parentId) {
    if (!protocol::isContentHash(*parentId)) {
      return invalid("parentId: must be a task id (\"sha256:\" and 43 characters)");
    }
    auto summary = unwrap(store_.read([&](store::ReadTxn& txn) {
      return summarize(txn, tasks_, *parentId, limits_);
    }),
                          store_);
    if (!summary) {
      if (summary.error().code == RegistryErrc::notFound) {
        return missing("parentId: no stored task " + *parentId);
      }
      return summary.error();
    }
    stored = std::move(*summary);
  }
  if (stored.length + drafts.size() > limits_.maxLineage) {
    return invalid("drafts: the lineage would be " + std::to_string(stored.length + drafts.size()) +
                   " tasks long; the limit is " + std::to_string(limits_.maxLineage));
  }

  // Definitions in scope of the next draft, and every task of its lineage (for callIds).
  DefinitionSchemas definitionSchemas;
  auto visible = std::move(stored.definitions);
  auto ancestors = std::move(stored.ancestors);
  std::optional<std::string> previous = parentId;
  json::array out;
  out.reserve(drafts.size());
  for (std::size_t i = 0; i < drafts.size(); ++i) {
    const std::string where = "drafts[" + std::to_string(i) + "]";
    const auto* draft = drafts[i].if_object();
    if (draft == nullptr) return invalid(where + ": must be an object");
    if (draft->contains("id")) {
      return invalid(where + ".id: a draft carries no id; tasks.compile computes it");
    }
    if (draft->contains("parentId")) {
      return invalid(where +
                     ".parentId: a draft carries no parentId; tasks.compile chains the drafts "
                     "(pass the parent of the first draft as the parentId param)");
    }
    if (auto e = checkShape(*draft, Mode::draft, where, limits_)) return *e;
    if (source == DraftSource::tool) {
      if (auto e = checkToolDraft(*draft, where)) return *e;
    }

    const std::string kind = stringAt(*draft, "kind");
    json::object task;
    task["kind"] = kind;
    task["role"] = draft->at("role");
    if (previous) task["parentId"] = *previous;
    if (const auto* prior = draft->if_contains("priorId")) task["priorId"] = *prior;

    if (kind == task_kind::kMessage) {
      task["content"] = draft->at("content");
    } else if (kind == task_kind::kFunctionCall) {
      const json::object& call = objectAt(*draft, "call");
      const std::string name = stringAt(call, "name");
      const json::object& arguments = objectAt(call, "arguments");
      json::object pinned;
      pinned["name"] = name;
      if (auto it = visible.find(name); it != visible.end()) {
        // Nearest lineage definition: the call is pinned to the definition's identity.
        if (auto e = checkDefinitionArguments(registry_, it->second.definition, arguments, where,
                                              it->second.id, definitionSchemas)) {
          return *e;
        }
        pinned["toolRevision"] = it->second.id;
      } else {
        auto tool = registry_.getActive(name);
        if (!tool) {
          if (tool.error().code != RegistryErrc::notFound) return tool.error();
          return missing(where + ".call.name: no tool named " + shown(name) +
                         " is defined in the lineage or bound in the registry");
        }
        if (auto violation =
                (*tool)->parameters.validate(arguments, JsonSchema::kMaxPairsForArguments)) {
          return RegistryError{RegistryErrc::invalidArguments,
                               where + ": the arguments do not match the parameters of " + name +
                                   " (" + (*tool)->revision +
                                   "): " + violation->describe("arguments")};
        }
        pinned["toolRevision"] = (*tool)->revision;
        if (auto settings = registry_.trySettingsRevision(name, (*tool)->revision)) {
          pinned["settingsRevision"] = *settings;
        }
      }
      pinned["arguments"] = arguments;
      task["call"] = std::move(pinned);
    } else if (kind == task_kind::kToolResult) {
      const std::string callId = stringAt(*draft, "callId");
      auto it = ancestors.find(callId);
      if (it == ancestors.end() || it->second.kind != task_kind::kFunctionCall) {
        return invalid(where + ".callId: " + callId +
                       " is not a functioncall in this draft's lineage");
      }
      task["callId"] = callId;
      if (const auto* result = draft->if_contains("result")) task["result"] = *result;
      if (const auto* error = draft->if_contains("error")) task["error"] = *error;
    } else {
      if (auto e = checkBindingTarget(registry_, *draft, where)) return *e;
      task["definition"] = draft->at("definition");
    }

    auto hashed = hashTask(task, where, limits_);
    if (!hashed) return hashed.error();
    Ancestor self = describeTask(task);
    if (self.definition) visible.insert_or_assign(self.name, Visible{hashed->id, *self.definition});
    ancestors.insert_or_assign(hashed->id, std::move(self));
    out.push_back(withId(hashed->id, task));
    previous = hashed->id;
  }
  return out;
}

Result<CommitOutcome> TaskStore::commit(const json::array& tasks) {
  auto prepared = prepareCommit(tasks);
  if (!prepared) return prepared.error();
  return writeCommit(*prepared);
}

Result<PreparedCommit> TaskStore::prepareCommit(const json::array& tasks) {
  if (tasks.empty()) return invalid("tasks: nothing to commit");
  if (tasks.size() > limits_.maxBatch) {
    return invalid("tasks: " + std::to_string(tasks.size()) + " tasks; the limit is " +
                   std::to_string(limits_.maxBatch) + " per commit");
  }

  struct Entry {
    std::string id;
    std::string canonical;
    json::object task;
    Ancestor self;
    std::ptrdiff_t parent = -1;             // index of the parent in this batch
    std::optional<std::string> storedRoot;  // the stored task this batch chain hangs from
    std::size_t length = 1;                 // tasks from the root to this one
  };
  std::vector<Entry> entries;
  entries.reserve(tasks.size());
  std::unordered_map<std::string, std::size_t> batchIndex;  // id -> first index

  // 1. Shapes and ids: nothing but the task itself.
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    const std::string where = "tasks[" + std::to_string(i) + "]";
    const auto* object = tasks[i].if_object();
    if (object == nullptr) return invalid(where + ": must be an object");
    const auto id = stringMember(*object, "id");
    if (!id) return invalid(where + ".id: required (tasks.compile computes it)");
    json::object task = *object;
    task.erase("id");
    if (auto e = checkShape(task, Mode::task, where, limits_)) return *e;
    auto hashed = hashTask(task, where, limits_);
    if (!hashed) return hashed.error();
    if (hashed->id != *id) {
      return invalid(where + ".id: " + shown(*id) +
                     " does not match the task's content (its id is " + hashed->id + ")");
    }
    Ancestor self = describeTask(task);
    Entry entry;
    entry.id = *id;
    entry.canonical = std::move(hashed->canonical);
    entry.task = std::move(task);
    entry.self = std::move(self);
    entries.push_back(std::move(entry));
    batchIndex.try_emplace(*id, i);
  }

  // 2. Links: parents and priors exist, in the store or earlier in this batch. Tasks are never
  // deleted, so what this snapshot shows still holds when the write below runs.
  std::map<std::string, StoredLineage, std::less<>> storedLineages;  // by stored parent id
  std::size_t walked = 0;  // stored tasks read for storedLineages
  auto linked = unwrap(store_.read([&](store::ReadTxn& txn) -> Result<bool> {
    for (std::size_t i = 0; i < entries.size(); ++i) {
      Entry& entry = entries[i];
      const std::string where = "tasks[" + std::to_string(i) + "]";
      auto earlier = [&](const std::string& id) -> std::optional<std::size_t> {
        auto it = batchIndex.find(id);
        if (it == batchIndex.end() || it->second >= i) return std::nullopt;
        return it->second;
      };
      auto laterRefusal = [&](const std::string& member,
                              const std::string& id) -> std::optional<RegistryError> {
        auto it = batchIndex.find(id);
        if (it == batchIndex.end() || it->second < i) return std::nullopt;
        return invalid(where + "." + member + ": names tasks[" + std::to_string(it->second) +
                       "], which comes later in the batch; put a task after what it links to");
      };
      if (auto parentId = stringMember(entry.task, "parentId")) {
        if (auto j = earlier(*parentId)) {
          entry.parent = static_cast<std::ptrdiff_t>(*j);
          entry.storedRoot = entries[*j].storedRoot;
          entry.length = entries[*j].length + 1;
        } else {
          if (auto e = laterRefusal("parentId", *parentId)) return *e;
          auto it = storedLineages.find(*parentId);
          if (it == storedLineages.end()) {
            auto summary = summarize(txn, tasks_, *parentId, limits_);
            if (!summary) {
              if (summary.error().code == RegistryErrc::notFound) {
                return missing(where + ".parentId: no stored task " + *parentId +
                               " (nor an earlier task of this commit)");
              }
              return summary.error();
            }
            walked += summary->length;
            if (walked > limits_.maxCommitWalk) {
              return invalid(where + ".parentId: this commit extends lineages of " +
                             std::to_string(walked) + " stored tasks in all; the limit is " +
                             std::to_string(limits_.maxCommitWalk) +
                             " (commit fewer branches at once)");
            }
            it = storedLineages.emplace(*parentId, std::move(*summary)).first;
          }
          entry.storedRoot = *parentId;
          entry.length = it->second.length + 1;
        }
        if (entry.length > limits_.maxLineage) {
          return invalid(where + ": the lineage would be " + std::to_string(entry.length) +
                         " tasks long; the limit is " + std::to_string(limits_.maxLineage));
        }
      }
      if (auto priorId = stringMember(entry.task, "priorId")) {
        if (!earlier(*priorId)) {
          if (auto e = laterRefusal("priorId", *priorId)) return *e;
          auto prior = readVerified(txn, tasks_, *priorId);
          if (!prior) {
            if (prior.error().code == RegistryErrc::notFound) {
              return missing(where + ".priorId: no stored task " + *priorId +
                             " (nor an earlier task of this commit)");
            }
            return prior.error();
          }
        }
      }
    }
    return true;
  }),
                       store_);
  if (!linked) return linked.error();

  // 3. Pins and in-lineage references (the registry runs its own transactions).
  auto ancestorOf = [&](std::size_t i, const std::string& id) -> const Ancestor* {
    for (std::ptrdiff_t j = entries[i].parent; j >= 0;
         j = entries[static_cast<std::size_t>(j)].parent) {
      if (entries[static_cast<std::size_t>(j)].id == id)
        return &entries[static_cast<std::size_t>(j)].self;
    }
    if (!entries[i].storedRoot) return nullptr;
    const auto& lineage = storedLineages.at(*entries[i].storedRoot);
    auto it = lineage.ancestors.find(id);
    return it == lineage.ancestors.end() ? nullptr : &it->second;
  };
  DefinitionSchemas definitionSchemas;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Entry& entry = entries[i];
    const std::string where = "tasks[" + std::to_string(i) + "]";
    if (entry.self.kind == task_kind::kFunctionCall) {
      const json::object& call = objectAt(entry.task, "call");
      const std::string name = stringAt(call, "name");
      const std::string revision = stringAt(call, "toolRevision");
      const auto settings = stringMember(call, "settingsRevision");
      const json::object& arguments = objectAt(call, "arguments");
      if (const Ancestor* ancestor = ancestorOf(i, revision)) {
        if (ancestor->kind != task_kind::kToolDefinition || ancestor->name != name) {
          return invalid(where + ".call.toolRevision: " + revision + " is a " + ancestor->kind +
                         " task of this lineage, not a definition of " + name);
        }
        if (settings) {
          return invalid(where +
                         ".call.settingsRevision: a call pinned to a lineage definition has no "
                         "settings revision");
        }
        if (auto e = checkDefinitionArguments(registry_, *ancestor->definition, arguments, where,
                                              revision, definitionSchemas)) {
          return *e;
        }
      } else {
        auto tool = registry_.getRevision(revision, name);
        if (!tool) {
          if (tool.error().code != RegistryErrc::notFound) return tool.error();
          return missing(where + ".call.toolRevision: " + revision +
                         " is neither a registry revision of " + name + " nor a definition of " +
                         name + " in this task's lineage");
        }
        if (auto violation =
                (*tool)->parameters.validate(arguments, JsonSchema::kMaxPairsForArguments)) {
          return RegistryError{RegistryErrc::invalidArguments,
                               where + ": the arguments do not match the parameters of " + name +
                                   " (" + revision + "): " + violation->describe("arguments")};
        }
        if (settings) {
          auto values = registry_.getSettings(*settings, name, revision);
          if (!values) {
            if (values.error().code != RegistryErrc::notFound) return values.error();
            return missing(where + ".call.settingsRevision: no settings " + *settings + " of " +
                           name + " at " + revision);
          }
        }
      }
    } else if (entry.self.kind == task_kind::kToolResult) {
      const std::string callId = stringAt(entry.task, "callId");
      const Ancestor* call = ancestorOf(i, callId);
      if (call == nullptr || call->kind != task_kind::kFunctionCall) {
        return invalid(where + ".callId: " + callId +
                       " is not a functioncall in this task's lineage");
      }
    } else if (entry.self.kind == task_kind::kToolDefinition) {
      if (auto e = checkBindingTarget(registry_, entry.task, where)) return *e;
    }
  }

  PreparedCommit prepared;
  prepared.tasks.reserve(entries.size());
  for (Entry& entry : entries) {
    prepared.tasks.emplace_back(std::move(entry.id), std::move(entry.canonical));
  }
  return prepared;
}

Result<CommitOutcome> TaskStore::writeCommit(const PreparedCommit& prepared) {
  // Counted in the write transaction: only tasks not stored yet add bytes (committing stored
  // tasks again is harmless, even at the bound), and no other commit slips in between.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> overBound;  // stored, adding
  auto written = store_.write([&](store::WriteTxn& txn) -> boost::system::result<std::size_t> {
    if (limits_.maxStoredBytes > 0) {
      std::uint64_t adding = 0;
      for (const auto& [id, canonical] : prepared.tasks) {
        if (!txn.contains(tasks_, id)) adding += id.size() + canonical.size();
      }
      const std::uint64_t stored = txn.bytes(tasks_);
      if (adding > 0 && stored + adding > limits_.maxStoredBytes) {
        overBound.emplace(stored, adding);
        return 0;  // nothing written
      }
    }
    // One transaction: every task or none.
    std::size_t created = 0;
    for (const auto& [id, canonical] : prepared.tasks) {
      if (txn.putIfAbsent(tasks_, id, canonical)) ++created;
    }
    return created;
  });
  if (written && overBound) {
    return RegistryError{
        RegistryErrc::storage,
        "the stored tasks take " + std::to_string(overBound->first) + " bytes and these " +
            std::to_string(overBound->second) + " more, past the " +
            std::to_string(limits_.maxStoredBytes) +
            " bytes tasks may take of the state database (half of [store] map_size_mb); "
            "an administrator can raise map_size_mb"};
  }
  if (!written) return storageError(store_, written.error());
  CommitOutcome outcome;
  outcome.created = *written;
  outcome.ids.reserve(prepared.tasks.size());
  for (const auto& [id, canonical] : prepared.tasks) outcome.ids.push_back(id);
  return outcome;
}

Result<std::optional<std::string>> TaskStore::definitionFor(const std::string& id,
                                                            std::string_view name) {
  if (!protocol::isContentHash(id)) return invalid("taskId: must be a task id");
  auto summary =
      unwrap(store_.read([&](store::ReadTxn& txn) { return summarize(txn, tasks_, id, limits_); }),
             store_);
  if (!summary) return summary.error();
  auto found = summary->definitions.find(name);
  if (found == summary->definitions.end()) return std::optional<std::string>();
  return std::optional<std::string>(found->second.id);
}

Result<std::vector<std::string>> TaskStore::verifyAll() {
  return unwrap(store_.read([&](store::ReadTxn& txn) -> Result<std::vector<std::string>> {
    std::vector<std::string> problems;
    std::vector<std::pair<std::string, std::string>> parents;  // task, the parent it names
    txn.scan(tasks_, store::KeyRange::all(), [&](std::string_view key, std::string_view value) {
      const std::string id(key);
      if (protocol::contentHashOfCanonical(protocol::domain::kTask, value) != id) {
        problems.push_back("task " + id);
        return;
      }
      auto parsed = protocol::parseJson(value, protocol::JsonParseLimits{kStoredParseDepth});
      const json::value* link =
          parsed && parsed->is_object() ? parsed->as_object().if_contains("parentId") : nullptr;
      if (link == nullptr) return;
      if (!link->is_string() || !protocol::isContentHash(link->get_string())) {
        problems.push_back("task " + id + " has a malformed parentId");
      } else {
        parents.emplace_back(id, std::string(link->get_string()));
      }
    });
    for (const auto& [id, parent] : parents) {
      if (!txn.contains(tasks_, parent)) {
        problems.push_back("task " + id + " names a parent " + parent + " that is not stored");
      }
    }
    return problems;
  }),
                store_);
}

std::optional<Result<std::optional<ToolRevisionPtr>>> TaskStore::keptDefinedTool(
    const std::string& definitionId) {
  std::string target;
  {
    std::lock_guard lock(definedMutex_);
    auto it = std::find_if(defined_.begin(), defined_.end(),
                           [&](const Defined& entry) { return entry.id == definitionId; });
    if (it == defined_.end()) return std::nullopt;
    defined_.splice(defined_.begin(), defined_, it);
    if (it->code) return Result<std::optional<ToolRevisionPtr>>(std::optional(it->code));
    target = it->bindingTarget;
  }
  auto tool = registry_.getRevision(target);
  if (!tool) return Result<std::optional<ToolRevisionPtr>>(tool.error());
  return Result<std::optional<ToolRevisionPtr>>(std::optional(*tool));
}

Result<ToolRevisionPtr> TaskStore::codeDefinitionTool(const std::string& definitionId,
                                                      const json::object& definition) {
  const json::object& implementation = objectAt(definition, "implementation");
  json::object execution{{"class", "sandboxed-code"},
                         {"runtime", "javascript"},
                         {"source", implementation.at("source")}};
  if (const auto* modules = implementation.if_contains("modules")) execution["modules"] = *modules;
  auto tool = std::make_shared<ToolRevision>();
  tool->revision = definitionId;
  tool->name = stringAt(definition, "name");
  tool->manifest = json::object{{"name", definition.at("name")},
                                {"description", definition.at("description")},
                                {"parameters", definition.at("parameters")},
                                {"execution", std::move(execution)}};
  tool->executionClass = ExecutionClass::sandboxedCode;
  tool->agentDefined = true;
  auto parameters = compileToolSchema(definition.at("parameters"),
                                      "the parameters of definition " + definitionId);
  if (!parameters) return parameters.error();
  tool->parameters = std::move(*parameters);
  return ToolRevisionPtr(std::move(tool));
}

Result<std::optional<ToolRevisionPtr>> TaskStore::definedTool(const std::string& definitionId) {
  if (auto kept = keptDefinedTool(definitionId)) return std::move(*kept);
  using Found = std::optional<ToolRevisionPtr>;
  auto task = get(definitionId);
  if (!task) return task.error();
  if (stringMember(*task, "kind") != task_kind::kToolDefinition) return Found();
  const json::object& definition = objectAt(*task, "definition");
  const json::object& implementation = objectAt(definition, "implementation");
  Defined made{definitionId, nullptr, "", 0};
  if (stringMember(implementation, "type") == "binding") {
    made.bindingTarget = stringAt(implementation, "targetRevision");
    made.cost = made.bindingTarget.size() + definitionId.size();
  } else {
    auto tool = codeDefinitionTool(definitionId, definition);
    if (!tool) return tool.error();
    // The text, and what the compiled schema holds: copies of its document (a long string in
    // it is held about six times) and about a kibibyte of valijson's for each of its values.
    made.cost = protocol::writeJson((*tool)->manifest).size() +
                protocol::writeJson(definition.at("parameters")).size() * 8 +
                (*tool)->parameters.expandedValues() * kDefinedCostPerSchemaValue;
    made.code = std::move(*tool);
  }
  const std::string target = made.bindingTarget;
  ToolRevisionPtr code = made.code;
  if (made.cost <= kMaxDefinedCost / 2) {
    std::lock_guard lock(definedMutex_);
    std::erase_if(defined_, [&](const Defined& entry) {
      if (entry.id != definitionId) return false;
      definedCost_ -= entry.cost;
      return true;
    });
    definedCost_ += made.cost;
    defined_.push_front(std::move(made));
    while (defined_.size() > kMaxDefinedTools || definedCost_ > kMaxDefinedCost) {
      definedCost_ -= defined_.back().cost;
      defined_.pop_back();
    }
  }
  if (code) return Found(std::move(code));
  auto bound = registry_.getRevision(target);
  if (!bound) return bound.error();
  return Found(*bound);
}

Result<json::object> TaskStore::get(const std::string& id) {
  if (!protocol::isContentHash(id)) return missing(shown(id) + " is not a task id (sha256:...)");
  auto task = unwrap(
      store_.read([&](store::ReadTxn& txn) { return readVerified(txn, tasks_, id); }), store_);
  if (!task) return task.error();
  return withId(id, *task);
}

namespace {

// The stored lineage of `id`, leaf first, each task with its id; refused (tooLarge) once its
// stored text passes limits.maxReadBytes, before more of it is read.
Result<std::vector<std::pair<std::string, json::object>>> readLineage(const store::Store& store,
                                                                      store::Table table,
                                                                      const std::string& id,
                                                                      const TaskLimits& limits) {
  if (!protocol::isContentHash(id)) return missing(shown(id) + " is not a task id (sha256:...)");
  using Nodes = std::vector<std::pair<std::string, json::object>>;
  return unwrap(store.read([&](store::ReadTxn& txn) -> Result<Nodes> {
    Nodes nodes;
    std::size_t bytes = 0;
    auto walked = walkStored(
        txn, table, id, limits,
        [&](const std::string& taskId, json::object task) {
          nodes.emplace_back(taskId, std::move(task));
        },
        [&](std::size_t size) {
          bytes += size;
          return bytes <= limits.maxReadBytes;
        });
    if (!walked) return walked.error();
    return nodes;
  }),
                store);
}

}  // namespace

Result<json::array> TaskStore::lineage(const std::string& id) {
  auto nodes = readLineage(store_, tasks_, id, limits_);
  if (!nodes) return nodes.error();
  json::array out;
  out.reserve(nodes->size());
  for (auto it = nodes->rbegin(); it != nodes->rend(); ++it)
    out.push_back(withId(it->first, it->second));
  return out;
}

Result<json::array> TaskStore::providerTools(const std::string& id) {
  if (!protocol::isContentHash(id)) return missing(shown(id) + " is not a task id (sha256:...)");
  std::map<std::string, json::object, std::less<>>
      tools;  // name -> {name, description, parameters}
  // Only the definitions are kept (the answer is about them), so no bound on the text walked.
  auto walked = unwrap(store_.read([&](store::ReadTxn& txn) {
    return walkStored(txn, tasks_, id, limits_, [&](const std::string&, json::object task) {
      // Leaf first: the nearest definition wins.
      if (stringMember(task, "kind") != task_kind::kToolDefinition) return;
      const json::object& definition = objectAt(task, "definition");
      const std::string name = stringAt(definition, "name");
      tools.try_emplace(name, json::object{{"name", name},
                                           {"description", definition.at("description")},
                                           {"parameters", definition.at("parameters")}});
    });
  }),
                       store_);
  if (!walked) return walked.error();
  auto bindings = registry_.list();
  if (!bindings) return bindings.error();
  for (const Binding& binding : *bindings) {
    if (tools.contains(binding.name)) continue;  // shadowed by the lineage
    auto tool = registry_.getRevision(binding.revision, binding.name);
    if (!tool) return tool.error();
    const json::object& manifest = (*tool)->manifest;
    json::value description = "";
    if (const auto* text = manifest.if_contains("description"); text && text->is_string()) {
      description = *text;
    }
    tools.emplace(binding.name, json::object{{"name", binding.name},
                                             {"description", std::move(description)},
                                             {"parameters", manifest.at("parameters")}});
  }
  json::array out;
  out.reserve(tools.size());
  for (auto& [name, function] : tools) {
    out.push_back(json::object{{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

Result<json::array> TaskStore::messages(const std::string& id) {
  auto nodes = readLineage(store_, tasks_, id, limits_);
  if (!nodes) return nodes.error();
  json::array out;
  bool extendCalls = false;  // the last message out holds tool_calls that the next call joins
  for (auto it = nodes->rbegin(); it != nodes->rend(); ++it) {
    const auto& [taskId, task] = *it;
    const auto kind = stringMember(task, "kind");
    if (kind == task_kind::kToolDefinition) continue;  // never shown to the model as a message
    if (kind == task_kind::kMessage) {
      out.push_back(json::object{{"role", task.at("role")}, {"content", task.at("content")}});
      extendCalls = false;
    } else if (kind == task_kind::kFunctionCall) {
      const json::object& call = objectAt(task, "call");
      json::object toolCall{
          {"id", taskId},
          {"type", "function"},
          {"function", json::object{{"name", call.at("name")},
                                    {"arguments", protocol::writeJson(call.at("arguments"))}}}};
      if (extendCalls) {
        out.back().as_object().at("tool_calls").as_array().push_back(std::move(toolCall));
      } else {
        out.push_back(json::object{{"role", "assistant"},
                                   {"content", nullptr},
                                   {"tool_calls", json::array{std::move(toolCall)}}});
        extendCalls = true;
      }
    } else if (kind == task_kind::kToolResult) {
      std::string content;
      if (const auto* result = task.if_contains("result")) {
        content =
            result->is_string() ? std::string(result->get_string()) : protocol::writeJson(*result);
      } else {
        content = protocol::writeJson(json::object{{"error", task.at("error")}});
      }
      out.push_back(json::object{
          {"role", "tool"}, {"tool_call_id", task.at("callId")}, {"content", content}});
      extendCalls = false;
    }
  }
  return out;
}

}  // namespace toolhost::registry
