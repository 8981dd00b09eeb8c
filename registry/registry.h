// The tool registry: immutable content-addressed tool revisions (manifests), name bindings,
// built-in (trusted-native) tools, and per-tool settings revisions, all in the state store.
// Thread-safe: every method may be called from any thread; each does its own short LMDB
// transactions (never across a co_await) and keeps a cache of verified, immutable revisions.
#pragma once

#include "registry/errors.h"
#include "registry/json_schema.h"
#include "store/store.h"

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace toolhost::registry {

enum class ExecutionClass { sandboxedCode, externalService, trustedNative };
std::string_view executionClassName(ExecutionClass executionClass);

// Bounds on what may be stored. Defaults are generous for real tools and small for the daemon.
struct RegistryLimits {
  std::size_t maxManifestBytes = 4 * 1024 * 1024;  // canonical JSON of one manifest
  std::size_t maxSourceBytes = 2 * 1024 * 1024;    // source plus all modules
  std::size_t maxModules = 64;
  std::size_t maxSettingsBytes = 64 * 1024;
  std::size_t maxDescriptionBytes = 8 * 1024;
};

// One verified revision. Immutable; shared by every caller that looks it up.
struct ToolRevision {
  std::string revision;           // "sha256:..."
  std::string name;
  boost::json::object manifest;   // exactly as submitted (and hashed)
  ExecutionClass executionClass = ExecutionClass::sandboxedCode;
  JsonSchema parameters;          // compiled `parameters`
  std::optional<JsonSchema> settingsSchema;  // compiled `settings`, if the manifest has one
  std::string installedAt;        // RFC 3339
  // Code an agent defined in a task lineage (a tooldefinition; `revision` is its task id): no
  // admin installed it, and it requests no capability.
  bool agentDefined = false;
};
using ToolRevisionPtr = std::shared_ptr<const ToolRevision>;

// Why `tool` may not have `what` ("fetch https://x.example (read)", "the secret api_key"), and
// what gives it that: `addition` ("add \"storage\": true to its capabilities") and a new
// revision for an installed tool; for code an agent defined, that it runs without capabilities.
std::string notRequestedWords(std::string_view toolName, bool agentDefined, std::string_view what,
                              std::string_view addition);
inline std::string notRequestedWords(const ToolRevision& tool, std::string_view what,
                                     std::string_view addition) {
  return notRequestedWords(tool.name, tool.agentDefined, what, addition);
}

struct Binding {
  std::string name;
  std::string revision;
  std::string activatedAt;
};

struct InstallOutcome {
  std::string revision;
  std::string name;
  bool created = false;  // false: this exact manifest was already stored; nothing was written
};

struct ActivateOutcome {
  std::string name;
  std::string revision;
  std::optional<std::string> previous;  // the revision the name was bound to, if any
  bool changed = false;                 // false: already bound to this revision
  boost::json::object changes;          // requested capabilities and limits: what changed
};

struct HistoryEntry {
  std::string revision;
  std::string installedAt;
  bool active = false;
};

struct SettingsOutcome {
  std::string settingsRevision;
  bool created = false;
};

// A built-in tool: its manifest (class trusted-native, with implementationRevision) and the
// compiled code that runs it. Registered by the daemon at start.
struct NativeTool {
  boost::json::object manifest;
  // Runs the tool with validated arguments; returns the result or an error sentence.
  std::function<boost::system::result<boost::json::value, std::string>(const boost::json::object&)>
      run;
};

class Registry {
 public:
  Registry(store::Store& store, RegistryLimits limits = {});

  // The tables this module keeps in the store (pass them to store::Options at open).
  static std::vector<std::string> tables();

  // The JSON Schema every manifest must satisfy, as published in rpc.discover.
  static const boost::json::value& manifestSchema();

  // Revisions held in memory as loaded (bounded: see cache_).
  std::size_t cachedRevisions() const;

  // Validates and stores a manifest; the revision is the content hash of the manifest exactly as
  // submitted. Refuses trusted-native manifests and names of built-in tools.
  Result<InstallOutcome> install(const boost::json::object& manifest);
  // What install() would store, as the revision it would be (not stored, not cached, its
  // installedAt empty), or nothing when the manifest is stored already; install()'s refusals.
  // For checks a revision must pass before it is stored.
  Result<std::optional<ToolRevisionPtr>> preview(const boost::json::object& manifest);

  // Registers a built-in tool, binding its name to it. Unchanged natives write nothing.
  Result<InstallOutcome> registerNative(NativeTool tool);
  // The compiled implementation of a built-in revision, if it is one of this process's natives.
  const NativeTool* tryNative(std::string_view revision) const;

  // Binds `name` to `revision` (which must carry that name). Moving an existing binding to another
  // revision needs `replace`.
  Result<ActivateOutcome> activate(const std::string& name, const std::string& revision, bool replace);

  // A revision, verified against its hash. With `name`, the revision must carry that name.
  Result<ToolRevisionPtr> getRevision(const std::string& revision,
                                      const std::optional<std::string>& name = std::nullopt);
  std::optional<Binding> tryBinding(const std::string& name);
  // The active revision under `name`.
  Result<ToolRevisionPtr> getActive(const std::string& name);

  Result<std::vector<Binding>> list();
  Result<std::vector<HistoryEntry>> history(const std::string& name);

  // Stores settings for (name, revision) content-addressed, and makes them that tool revision's
  // current settings.
  Result<SettingsOutcome> configure(const std::string& name, const std::string& revision,
                                    const boost::json::object& settings);
  // The current settings revision of (name, revision), if configured (cached; every
  // tools.call of a sandboxed tool asks).
  std::optional<std::string> trySettingsRevision(const std::string& name, const std::string& revision);
  // Settings values; resolves only for the tool name and revision they were stored for.
  Result<boost::json::object> getSettings(const std::string& settingsRevision, const std::string& name,
                                          const std::string& revision);
  // The same, shared and kept (a settings revision never changes): what a call's ctx.settings
  // holds.
  Result<std::shared_ptr<const boost::json::object>> sharedSettings(
      const std::string& settingsRevision, const std::string& name, const std::string& revision);

  // Re-hashes every stored manifest and settings document; lists what does not match.
  Result<std::vector<std::string>> verifyAll();

  // Called after a binding moved (the runtime drops the old revision's sandbox).
  void onBindingMoved(std::function<void(const std::string& name, const std::string& from,
                                         const std::string& to)> listener);

 private:
  Result<ToolRevisionPtr> load(const std::string& revision);
  Result<ToolRevisionPtr> build(const std::string& revision, boost::json::object manifest,
                                std::string installedAt);
  void bindingsWritten();  // after a write transaction that may have moved a binding
  // install()'s checks: the canonical manifest, its revision and name, or that it is stored.
  struct Checked {
    std::string canonical;
    std::string revision;
    std::string name;
    bool stored = false;  // nothing else is set but revision and name
  };
  Result<Checked> checkInstall(const boost::json::object& manifest);
  // The store's own secret that salts settings documents, made on first use.
  Result<std::string> settingsSaltKey();

  store::Store& store_;
  RegistryLimits limits_;
  store::Table manifests_;   // revision -> canonical manifest JSON
  store::Table revisions_;   // revision -> {"name", "installedAt"}
  store::Table history_;     // name \0 revision -> installedAt
  store::Table bindings_;    // name -> {"revision", "activatedAt"}
  store::Table settings_;    // settings revision -> canonical settings document
  store::Table currentSettings_;  // name \0 revision -> settings revision
  store::Table settingsKey_;      // "salt" -> 32 random bytes (settingsSaltKey)
  std::optional<std::string> saltKey_;  // under mutex_, once read

  mutable std::mutex mutex_;
  // Revisions as last loaded, most recently used first, within kMaxCachedRevisions and
  // kMaxCachedManifestBytes of stored manifest text (their compiled schemas can be tens of
  // times larger); the most recent one stays whatever its size. Under mutex_.
  struct Cached {
    ToolRevisionPtr tool;
    std::size_t bytes = 0;
    std::list<std::string>::iterator used;
  };
  static constexpr std::size_t kMaxCachedRevisions = 256;
  static constexpr std::size_t kMaxCachedManifestBytes = 8 * 1024 * 1024;
  std::map<std::string, Cached, std::less<>> cache_;
  std::list<std::string> cacheOrder_;
  std::size_t cachedBytes_ = 0;
  void cacheLocked(const std::string& revision, const ToolRevisionPtr& tool, std::size_t bytes);
  std::map<std::string, NativeTool, std::less<>> natives_;  // by revision
  // Bindings as last read (every tools.call by name reads one). A read from the store fills the
  // cache only if no binding write completed since that read began (bindingsGeneration_), so a
  // reader that raced a write never leaves the old binding behind. Only this process writes
  // the store (the state directory is locked).
  std::map<std::string, Binding, std::less<>> bindingCache_;
  std::uint64_t bindingsGeneration_ = 0;
  // Current settings revisions (name \0 revision -> revision, or none), filled as bindings are,
  // against settingsGeneration_ (configure() bumps it); and settings values by settings revision,
  // within kMaxCachedSettingsBytes of their stored text. Both cleared when full. Under mutex_.
  std::map<std::string, std::optional<std::string>, std::less<>> currentSettingsCache_;
  std::uint64_t settingsGeneration_ = 0;
  struct CachedSettings {
    std::shared_ptr<const boost::json::object> values;
    std::string tool, toolRevision;
  };
  static constexpr std::size_t kMaxCachedSettingsBytes = 8 * 1024 * 1024;
  static constexpr std::size_t kMaxCachedCurrentSettings = 4096;
  std::map<std::string, CachedSettings, std::less<>> settingsCache_;
  std::size_t cachedSettingsBytes_ = 0;
  std::vector<std::function<void(const std::string&, const std::string&, const std::string&)>>
      bindingListeners_;
};

// Tool names: lowercase ASCII letters and digits in words joined by single '-' or '_', starting
// with a letter, at most 64 characters ("weather-lookup", "time-now", "echo").
bool isValidToolName(std::string_view name);
inline constexpr std::size_t kMaxToolNameLength = 64;

// Checks a JSON Schema that a tool supplies (parameters, settings): it compiles (each `pattern`
// with registry::Pattern), and it uses no keyword the daemon refuses to evaluate on untrusted
// input (`patternProperties`: valijson matches it with std::regex, which can be driven to
// exponential time or stack exhaustion; `uniqueItems` without a `maxItems` of at most
// 100: quadratic time). `where` prefixes the error ("parameters").
Result<JsonSchema> compileToolSchema(const boost::json::value& schema, std::string_view where);


}  // namespace toolhost::registry
