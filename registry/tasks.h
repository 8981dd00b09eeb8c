// Tasks: immutable, content-addressed nodes of a conversation tree (message, functioncall,
// toolresult, tooldefinition) linked by parentId (the lineage) and priorId (an alternative to an
// earlier task). Compiling drafts pins every function call to a tool revision; committing verifies
// every id and link and writes a batch all or nothing. Thread-safe: every method may be called from
// any thread; each runs its own short LMDB transactions and keeps nothing between calls.
//
// A task is a JSON object {kind, role, parentId?, priorId?, <kind's members>} and its id is
// protocol::contentHash(domain::kTask, <the task without "id">). Kinds and their members:
//   message         content (any JSON; a string for ordinary text)
//   functioncall    call: {name, toolRevision, settingsRevision?, arguments}  (drafts: {name,
//   arguments}) toolresult      callId (a functioncall in the lineage), and exactly one of result
//   (any JSON)
//                   or error (an object or a string)
//   tooldefinition  definition: {name, description, parameters, implementation}, implementation
//                   {type: "code", source, modules?} or {type: "binding", targetRevision}
// Unknown members are refused at every level that has a fixed shape, so nothing unhashed or
// unchecked can hide in a task. Settings values never enter a task, only a settings revision.
//
// A tooldefinition is visible only to its descendants (nearest ancestor wins over a farther one and
// over the registry binding of the same name) and is never installed in the registry: a call it
// resolves is pinned to the definition task's id, and a binding definition pins a registry
// revision.
#pragma once

#include "registry/errors.h"
#include "registry/registry.h"
#include "store/store.h"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>

#include <cstddef>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace toolhost::registry {

// Bounds on what one request may make the daemon hash, store or walk; each refused clearly.
struct TaskLimits {
  std::size_t maxTaskBytes = 1024 * 1024;  // canonical JSON of one task (without its id)
  std::size_t maxBatch = 1000;             // drafts per compile, tasks per commit
  std::size_t maxLineage = 100000;         // tasks from a root to a leaf, the leaf included
  // Stored text one lineage read (lineage, messages) gathers at most: an answer
  // larger than a connection's 64 MiB of unread answers could never be sent, and building it
  // would hold several times its size.
  std::size_t maxReadBytes = std::size_t{64} << 20;
  // Stored tasks one commit may walk, over every lineage it extends (each branch walks its own).
  std::size_t maxCommitWalk = 400000;
  std::size_t maxDepth = 200;                  // JSON nesting inside one task
  std::size_t maxDescriptionBytes = 8 * 1024;  // a tooldefinition's description
  std::size_t maxModules = 64;                 // a code definition's modules
  // What the stored tasks may take of the state database (its pages), so that tasks, which any
  // agent may commit and nothing deletes, cannot fill it for installs, decisions and storage.
  // 0: no bound (the daemon sets half of [store] map_size_mb).
  std::uint64_t maxStoredBytes = 0;
};

// Tasks TaskStore::prepareCommit checked, for writeCommit: {id, canonical text}, in order.
struct PreparedCommit {
  std::vector<std::pair<std::string, std::string>> tasks;
};

struct CommitOutcome {
  std::vector<std::string> ids;  // one per task committed, in order
  std::size_t created = 0;       // tasks that were not stored before
};

namespace task_kind {
inline constexpr std::string_view kMessage = "message";
inline constexpr std::string_view kFunctionCall = "functioncall";
inline constexpr std::string_view kToolResult = "toolresult";
inline constexpr std::string_view kToolDefinition = "tooldefinition";
}  // namespace task_kind

class TaskStore {
 public:
  // `store` must have been opened with tables() among its tables; both must outlive this.
  TaskStore(store::Store& store, Registry& registry, TaskLimits limits = {});

  // The tables this module keeps in the store (pass them to store::Options at open).
  static std::vector<std::string> tables();

  const TaskLimits& limits() const noexcept { return limits_; }

  // Links the drafts into a chain under `parentId` (or as a new root), pins every function call
  // (lineage definitions first, nearest wins, then the registry binding), validates call
  // arguments, and returns the hashed tasks in order (each with its "id"). Writes nothing.
  // Drafts carrying an id or a parentId, or a pinned call, are refused; so is an unresolved call.
  //
  // DraftSource::tool: drafts a tool made (ctx.createSubtasksResult). They hold only messages
  // and function calls, speak only as the assistant (never as the system, the user or a tool),
  // and revise nothing (no priorId): a result or a definition there would speak for another
  // tool, or put another tool behind a name.
  enum class DraftSource { agent, tool };
  Result<boost::json::array> compile(const boost::json::array& drafts,
                                     const std::optional<std::string>& parentId,
                                     DraftSource source = DraftSource::agent);

  // Re-computes every id and checks every task, link and pin against the store and the registry;
  // then writes all tasks in one transaction, or, if any one is refused, nothing. Committing a
  // task that is already stored is idempotent.
  Result<CommitOutcome> commit(const boost::json::array& tasks);
  // commit() in two steps, so that the checks (which walk the lineages the batch extends: up to
  // maxCommitWalk stored tasks) can run elsewhere than the writes: prepareCommit reads only;
  // writeCommit writes what it checked. Tasks are never deleted, so what prepareCommit saw
  // still holds when writeCommit runs, however much later.
  Result<PreparedCommit> prepareCommit(const boost::json::array& tasks);
  Result<CommitOutcome> writeCommit(const PreparedCommit& prepared);

  // Re-hashes every stored task and checks that each parent it names is stored; lists what does
  // not match (for store.verify).
  Result<std::vector<std::string>> verifyAll();

  // One stored task, with its "id", re-hashed on read (a mismatch is RegistryErrc::integrity).
  Result<boost::json::object> get(const std::string& id);

  // The id of the tooldefinition task nearest to `id` in its lineage that defines `name`, if any
  // (a call compiled there would be pinned to it).
  Result<std::optional<std::string>> definitionFor(const std::string& id, std::string_view name);

  // What a function call pinned to the tooldefinition task `definitionId` runs: for a binding,
  // the registry revision it pins; for code, a sandboxed-code revision made from the definition
  // (its revision is the definition's id, its name the definition's; no capabilities, since a
  // definition requests none; the daemon's default limits). nullopt when `definitionId` is a
  // stored task but no tooldefinition. Reads the task and compiles its parameters: slow for
  // large ones. Tasks never change, so what it made is kept: at most kMaxDefinedTools, costing at
  // most kMaxDefinedCost together (the text, the parameters' text eight times, and
  // kDefinedCostPerSchemaValue for each value of the compiled parameters), least recently used
  // out; one costing more than half of that is not kept (a definition compile() accepts never
  // does: a task is at most 1 MiB, its parameters at most kMaxDefinitionSchemaValues values).
  static constexpr std::size_t kMaxDefinedTools = 64;
  static constexpr std::size_t kMaxDefinedCost = 32 << 20;
  static constexpr std::size_t kDefinedCostPerSchemaValue = 2048;
  static constexpr std::size_t kMaxDefinitionSchemaValues = 2000;
  Result<std::optional<ToolRevisionPtr>> definedTool(const std::string& definitionId);
  // The sandboxed-code revision a code tooldefinition runs as (see definedTool), made from the
  // task's `definition` member as compile() accepted it; `definitionId` is the task's id.
  static Result<ToolRevisionPtr> codeDefinitionTool(const std::string& definitionId,
                                                    const boost::json::object& definition);
  // What definedTool() made and kept, if it did: no task read, no compile. Fast.
  std::optional<Result<std::optional<ToolRevisionPtr>>> keptDefinedTool(
      const std::string& definitionId);

  // The task and its ancestors through parentId, root first.
  Result<boost::json::array> lineage(const std::string& id);

  // Provider-facing signatures visible at `id`: [{type: "function", function: {name,
  // description, parameters}}], registry bindings merged with the lineage's definitions (which
  // shadow a binding of the same name), sorted by name.
  Result<boost::json::array> providerTools(const std::string& id);

  // The lineage as chat-completion messages, root first, tooldefinitions left out: message ->
  // {role, content}; consecutive functioncalls -> one {role: "assistant", content: null,
  // tool_calls: [{id: <task id>, type: "function", function: {name, arguments: <JSON text>}}]};
  // toolresult -> {role: "tool", tool_call_id, content: <result as JSON text (a string result as
  // is), or {"error": ...} as JSON text>}.
  Result<boost::json::array> messages(const std::string& id);

 private:
  store::Store& store_;
  Registry& registry_;
  TaskLimits limits_;
  store::Table tasks_;  // task id -> canonical JSON of the task without its id

  // definedTool()'s results, most recently used first; a binding's keeps the revision it pins.
  struct Defined {
    std::string id;
    ToolRevisionPtr code;       // a code definition's tool
    std::string bindingTarget;  // a binding's registry revision
    std::size_t cost = 0;
  };
  std::mutex definedMutex_;
  std::list<Defined> defined_;    // under definedMutex_
  std::size_t definedCost_ = 0;   // under definedMutex_
};

// The id of a task: the content hash (toolhost.task.v1) of the task without its "id" member.
// Refuses values that have no canonical JSON (RegistryErrc::invalidDefinition).
Result<std::string> taskId(const boost::json::object& task);

}  // namespace toolhost::registry
