#include "registry/registry.h"

#include "protocol/content_hash.h"
#include "protocol/json_parse.h"
#include "protocol/json_text.h"
#include "protocol/time_text.h"
#include "registry/manifest.h"
#include "store/keys.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <ctime>

namespace toolhost::registry {
namespace json = boost::json;

namespace {

constexpr std::string_view kManifestsTable = "tool_manifests";
constexpr std::string_view kRevisionsTable = "tool_revisions";
constexpr std::string_view kHistoryTable = "tool_history";
// uniqueItems compares every pair of an array's items: only beside a maxItems this small.
constexpr int kMaxUniqueItems = 100;
constexpr std::string_view kBindingsTable = "tool_bindings";
constexpr std::string_view kSettingsTable = "tool_settings";
constexpr std::string_view kCurrentSettingsTable = "tool_current_settings";
constexpr std::string_view kSettingsKeyTable = "tool_settings_key";
constexpr std::string_view kSaltKeyName = "salt";
constexpr std::size_t kSaltKeyBytes = 32;

RegistryError storageError(store::Store& store, const boost::system::error_code& ec) {
  return RegistryError{RegistryErrc::storage, store.describe(ec)};
}

std::optional<json::object> parseObject(std::string_view text) {
  auto parsed = protocol::parseJson(text, protocol::JsonParseLimits{100000});
  if (!parsed || !parsed->is_object()) return std::nullopt;
  return std::move(parsed->as_object());
}

// A write callback aborts with this code when the reason is a registry outcome kept aside.
boost::system::error_code aborted() { return store::StoreErrc::aborted; }

// The keywords toolhost refuses in a tool's schema, wherever a schema stands (a property named
// "patternProperties" is no keyword; a schema under a property named "enum" is a schema).
std::optional<RegistryError> refusedKeyword(const json::value& schema, const std::string& where) {
  std::optional<RegistryError> refusal;
  forEachSubschema(schema, [&](const json::object& node, const std::string& pointer) {
    if (refusal) return;
    const std::string here = where + pointer;
    // valijson matches these names with std::regex, which a hostile property name can drive to
    // exponential time or a stack overflow ("pattern" goes to toolhost's own matcher instead).
    if (node.contains("patternProperties")) {
      refusal = RegistryError{RegistryErrc::invalidDefinition,
                              here +
                                  "/patternProperties: not supported; \"propertyNames\" with a "
                                  "\"pattern\" checks the names of an object's properties"};
      return;
    }
    if (const auto* unique = node.if_contains("uniqueItems"); unique && *unique == true) {
      const auto* maxItems = node.if_contains("maxItems");
      if (maxItems == nullptr || !maxItems->is_number() ||
          maxItems->to_number<double>() > kMaxUniqueItems) {
        refusal = RegistryError{RegistryErrc::invalidDefinition,
                                here + "/uniqueItems: uniqueItems needs a maxItems of at most " +
                                    std::to_string(kMaxUniqueItems) +
                                    " beside it (checking uniqueness takes quadratic time)"};
        return;
      }
    }
    if (const auto* ref = node.if_contains("$ref");
        ref && ref->is_string() && !ref->get_string().starts_with("#")) {
      refusal = RegistryError{RegistryErrc::invalidDefinition,
                              here + "/$ref: only local references (\"#/...\") are resolved"};
    }
  });
  return refusal;
}

}  // namespace

std::string_view executionClassName(ExecutionClass executionClass) {
  switch (executionClass) {
    case ExecutionClass::sandboxedCode: return "sandboxed-code";
    case ExecutionClass::externalService: return "external-service";
    case ExecutionClass::trustedNative: return "trusted-native";
  }
  return "unknown";
}

std::string notRequestedWords(std::string_view toolName, bool agentDefined, std::string_view what,
                              std::string_view addition) {
  if (agentDefined) {
    return std::string(toolName) +
           " is code an agent defined in a task lineage, which runs without " +
           "capabilities, so it may not have " + std::string(what) +
           "; to give it that, install its code as a tool with tools.install, and in that "
           "manifest: " +
           std::string(addition);
  }
  return "the manifest of " + std::string(toolName) + " does not request " + std::string(what) +
         ": " + std::string(addition) + " and install the new revision";
}

bool isValidToolName(std::string_view name) {
  if (name.empty() || name.size() > kMaxToolNameLength) return false;
  if (name.front() < 'a' || name.front() > 'z') return false;
  bool previousSeparator = false;
  for (char c : name) {
    bool separator = c == '-' || c == '_';
    bool word = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!separator && !word) return false;
    if (separator && previousSeparator) return false;
    previousSeparator = separator;
  }
  return !previousSeparator;
}

Result<JsonSchema> compileToolSchema(const json::value& schema, std::string_view where) {
  if (!schema.is_object()) {
    return RegistryError{RegistryErrc::invalidDefinition, std::string(where) + ": must be a JSON Schema object"};
  }
  if (auto refusal = refusedKeyword(schema, std::string(where))) return *refusal;
  // `format` is an annotation (as in JSON Schema 2019-09 and later); valijson would check some
  // formats with std::regex, so it never sees them.
  auto compiled = JsonSchema::compile(withoutKeyword(schema, "format"));
  if (!compiled) {
    // A detail that names a place continues the path ("parameters/properties/a/$ref: ...").
    const std::string& detail = compiled.error().detail;
    return RegistryError{RegistryErrc::invalidDefinition,
                         std::string(where) + (detail.starts_with("/") ? "" : ": ") + detail};
  }
  return *compiled;
}

Registry::Registry(store::Store& store, RegistryLimits limits)
    : store_(store),
      limits_(limits),
      manifests_(store.table(kManifestsTable)),
      revisions_(store.table(kRevisionsTable)),
      history_(store.table(kHistoryTable)),
      bindings_(store.table(kBindingsTable)),
      settings_(store.table(kSettingsTable)),
      currentSettings_(store.table(kCurrentSettingsTable)),
      settingsKey_(store.table(kSettingsKeyTable)) {}

std::vector<std::string> Registry::tables() {
  return {std::string(kManifestsTable),  std::string(kRevisionsTable),
          std::string(kHistoryTable),    std::string(kBindingsTable),
          std::string(kSettingsTable),   std::string(kCurrentSettingsTable),
          std::string(kSettingsKeyTable)};
}

Result<ToolRevisionPtr> Registry::build(const std::string& revision, json::object manifest,
                                        std::string installedAt) {
  auto revisionPtr = std::make_shared<ToolRevision>();
  revisionPtr->revision = revision;
  revisionPtr->name = std::string(manifest.at("name").as_string());
  revisionPtr->executionClass = executionClassOf(manifest);
  auto parameters = compileToolSchema(manifest.at("parameters"), "parameters");
  if (!parameters) return parameters.error();
  revisionPtr->parameters = *parameters;
  if (const auto* settings = manifest.if_contains("settings")) {
    auto compiled = compileToolSchema(*settings, "settings");
    if (!compiled) return compiled.error();
    revisionPtr->settingsSchema = *compiled;
  }
  revisionPtr->installedAt = std::move(installedAt);
  revisionPtr->manifest = std::move(manifest);
  return ToolRevisionPtr(std::move(revisionPtr));
}

Result<ToolRevisionPtr> Registry::load(const std::string& revision) {
  {
    std::lock_guard lock(mutex_);
    if (auto it = cache_.find(revision); it != cache_.end()) {
      cacheOrder_.splice(cacheOrder_.begin(), cacheOrder_, it->second.used);
      return it->second.tool;
    }
  }
  if (!protocol::isContentHash(revision)) {
    return RegistryError{RegistryErrc::notFound, "\"" + revision.substr(0, 80) + "\" is not a revision (sha256:...)"};
  }
  struct Row {
    std::optional<std::string> manifest;
    std::optional<std::string> meta;
  };
  auto row = store_.read([&](store::ReadTxn& txn) {
    return Row{txn.getCopy(manifests_, revision), txn.getCopy(revisions_, revision)};
  });
  if (!row) return storageError(store_, row.error());
  if (!row->manifest) {
    return RegistryError{RegistryErrc::notFound, "no tool revision " + revision};
  }
  // Re-hash what was read: a stored manifest that no longer matches its revision is never served.
  if (protocol::contentHashOfCanonical(protocol::domain::kToolManifest, *row->manifest) != revision) {
    spdlog::error("integrity: the stored manifest of {} does not match its hash", revision);
    return RegistryError{RegistryErrc::integrity,
                         "the stored manifest of " + revision +
                             " does not match its hash; it is not served (see the daemon log)"};
  }
  auto manifest = parseObject(*row->manifest);
  if (!manifest) {
    spdlog::error("integrity: the stored manifest of {} is not a JSON object", revision);
    return RegistryError{RegistryErrc::integrity, "the stored manifest of " + revision + " is unreadable"};
  }
  std::string installedAt;
  if (row->meta) {
    if (auto meta = parseObject(*row->meta)) {
      if (const auto* at = meta->if_contains("installedAt"); at && at->is_string()) {
        installedAt = std::string(at->get_string());
      }
    }
  }
  auto built = build(revision, std::move(*manifest), std::move(installedAt));
  if (!built) return built.error();
  std::lock_guard lock(mutex_);
  cacheLocked(revision, *built, row->manifest->size());
  return *built;
}

std::size_t Registry::cachedRevisions() const {
  std::lock_guard lock(mutex_);
  return cache_.size();
}

void Registry::cacheLocked(const std::string& revision, const ToolRevisionPtr& tool,
                           std::size_t bytes) {
  if (cache_.contains(revision)) return;  // another thread loaded it meanwhile
  cacheOrder_.push_front(revision);
  cache_.emplace(revision, Cached{tool, bytes, cacheOrder_.begin()});
  cachedBytes_ += bytes;
  while (cacheOrder_.size() > 1 &&
         (cacheOrder_.size() > kMaxCachedRevisions || cachedBytes_ > kMaxCachedManifestBytes)) {
    auto oldest = cache_.find(cacheOrder_.back());
    cachedBytes_ -= oldest->second.bytes;
    cache_.erase(oldest);
    cacheOrder_.pop_back();
  }
}

Result<ToolRevisionPtr> Registry::getRevision(const std::string& revision,
                                              const std::optional<std::string>& name) {
  auto loaded = load(revision);
  if (!loaded) return loaded;
  if (name && (*loaded)->name != *name) {
    // A revision cannot be borrowed under another name.
    return RegistryError{RegistryErrc::notFound, "no revision " + revision + " of tool " + *name};
  }
  return loaded;
}

std::optional<Binding> Registry::tryBinding(const std::string& name) {
  std::uint64_t generation;
  {
    std::lock_guard lock(mutex_);
    if (auto cached = bindingCache_.find(name); cached != bindingCache_.end()) return cached->second;
    generation = bindingsGeneration_;
  }
  auto text = store_.read([&](store::ReadTxn& txn) { return txn.getCopy(bindings_, name); });
  if (!text || !*text) return std::nullopt;
  auto object = parseObject(**text);
  if (!object) return std::nullopt;
  Binding binding{name, std::string(object->at("revision").as_string()),
                  std::string(object->at("activatedAt").as_string())};
  std::lock_guard lock(mutex_);
  if (generation == bindingsGeneration_) bindingCache_.insert_or_assign(name, binding);
  return binding;
}

void Registry::bindingsWritten() {
  std::lock_guard lock(mutex_);
  ++bindingsGeneration_;
  bindingCache_.clear();
}

Result<ToolRevisionPtr> Registry::getActive(const std::string& name) {
  // A name no tool can have is looked up nowhere (the store refuses an empty key, and says so).
  if (!isValidToolName(name)) {
    return RegistryError{RegistryErrc::notFound, "no active tool named " + name.substr(0, 80)};
  }
  auto binding = tryBinding(name);
  if (!binding) {
    std::string detail = "no active tool named " + name.substr(0, 80);
    // Installed but never activated (or deactivated) is the common mistake: say what to do.
    if (auto installed = history(name); installed && !installed->empty()) {
      detail += ": it has " + std::to_string(installed->size()) +
                " installed revision(s), none active; bind one with tools.activate {name, "
                "revision} (tools.history lists them)";
    }
    return RegistryError{RegistryErrc::notFound, std::move(detail)};
  }
  return getRevision(binding->revision, name);
}

Result<Registry::Checked> Registry::checkInstall(const json::object& manifest) {
  // A manifest stored already (valid when it was installed, perhaps under rules tightened since)
  // answers as it always did: nothing to write, so a deploy script that installs again works.
  // Built-in tools' manifests are stored too, but are never installed.
  const auto* execution = manifest.if_contains("execution");
  const auto* executionClass = execution != nullptr && execution->is_object()
                                   ? execution->get_object().if_contains("class")
                                   : nullptr;
  const bool builtIn = executionClass == nullptr || !executionClass->is_string() ||
                       executionClass->get_string() == "trusted-native";
  if (const auto* name = manifest.if_contains("name");
      !builtIn && name != nullptr && name->is_string()) {
    if (auto canonical = protocol::canonicalJson(manifest)) {
      std::string revision =
          protocol::contentHashOfCanonical(protocol::domain::kToolManifest, *canonical);
      auto stored =
          store_.read([&](store::ReadTxn& txn) { return txn.contains(manifests_, revision); });
      if (stored && *stored) {
        return Checked{{}, std::move(revision), std::string(name->get_string()), true};
      }
    }
  }
  // Before the schema, which would first ask for what only a built-in tool has.
  if (executionClass != nullptr && executionClass->is_string() &&
      executionClass->get_string() == "trusted-native") {
    return RegistryError{RegistryErrc::invalidDefinition,
                         "manifest/execution/class: trusted-native tools are compiled into the "
                         "daemon; tools.install takes sandboxed-code and external-service tools"};
  }
  auto canonical = validateManifest(manifest, limits_);
  if (!canonical) return canonical.error();
  std::string name(manifest.at("name").as_string());
  {
    std::lock_guard lock(mutex_);
    for (const auto& [revision, native] : natives_) {
      if (native.manifest.at("name").as_string() == name) {
        return RegistryError{RegistryErrc::reservedName,
                             "manifest/name: \"" + name + "\" is a built-in tool; choose another name"};
      }
    }
  }
  std::string revision = protocol::contentHashOfCanonical(protocol::domain::kToolManifest, *canonical);
  return Checked{std::move(*canonical), std::move(revision), std::move(name), false};
}

Result<std::optional<ToolRevisionPtr>> Registry::preview(const json::object& manifest) {
  auto checked = checkInstall(manifest);
  if (!checked) return checked.error();
  if (checked->stored) return std::optional<ToolRevisionPtr>();
  auto tool = build(checked->revision, manifest, "");
  if (!tool) return tool.error();
  return std::optional(std::move(*tool));
}

Result<InstallOutcome> Registry::install(const json::object& manifest) {
  auto checked = checkInstall(manifest);
  if (!checked) return checked.error();
  if (checked->stored) return InstallOutcome{checked->revision, checked->name, false};
  const std::string& canonical = checked->canonical;
  const std::string& revision = checked->revision;
  const std::string& name = checked->name;
  std::string installedAt = protocol::formatTime(std::chrono::system_clock::now());
  bool created = false;
  auto written = store_.write([&](store::WriteTxn& txn) -> boost::system::result<void> {
    if (txn.contains(manifests_, revision)) return {};  // same manifest: nothing to write
    txn.put(manifests_, revision, canonical);
    txn.put(revisions_, revision,
            protocol::writeJson(json::object{{"name", name}, {"installedAt", installedAt}}));
    txn.put(history_, store::compositeKey({name, revision}), installedAt);
    created = true;
    return {};
  });
  if (!written) return storageError(store_, written.error());
  if (created) spdlog::info("installed {} as {}", name, revision);
  return InstallOutcome{revision, name, created};
}

Result<InstallOutcome> Registry::registerNative(NativeTool tool) {
  auto canonical = validateManifest(tool.manifest, limits_);
  if (!canonical) return canonical.error();
  if (executionClassOf(tool.manifest) != ExecutionClass::trustedNative) {
    return RegistryError{RegistryErrc::invalidDefinition, "a built-in tool must be trusted-native"};
  }
  std::string name(tool.manifest.at("name").as_string());
  std::string revision = protocol::contentHashOfCanonical(protocol::domain::kToolManifest, *canonical);
  std::string now = protocol::formatTime(std::chrono::system_clock::now());
  bool created = false;
  std::optional<std::string> previous;
  auto written = store_.write([&](store::WriteTxn& txn) -> boost::system::result<void> {
    if (!txn.contains(manifests_, revision)) {
      txn.put(manifests_, revision, *canonical);
      txn.put(revisions_, revision,
              protocol::writeJson(json::object{{"name", name}, {"installedAt", now}}));
      txn.put(history_, store::compositeKey({name, revision}), now);
      created = true;
    }
    auto binding = txn.tryGet(bindings_, name);
    if (binding) {
      auto object = parseObject(*binding);
      if (object && object->at("revision").as_string() == revision) return {};
      if (object) previous = std::string(object->at("revision").as_string());
    }
    txn.put(bindings_, name, protocol::writeJson(json::object{{"revision", revision}, {"activatedAt", now}}));
    return {};
  });
  bindingsWritten();
  if (!written) return storageError(store_, written.error());
  {
    std::lock_guard lock(mutex_);
    natives_.insert_or_assign(revision, std::move(tool));
  }
  if (previous) {
    spdlog::info("built-in tool {} moved from {} to {}", name, *previous, revision);
    for (const auto& listener : bindingListeners_) listener(name, *previous, revision);
  }
  return InstallOutcome{revision, name, created};
}

const NativeTool* Registry::tryNative(std::string_view revision) const {
  std::lock_guard lock(mutex_);
  auto it = natives_.find(revision);
  return it == natives_.end() ? nullptr : &it->second;
}

Result<ActivateOutcome> Registry::activate(const std::string& name, const std::string& revision,
                                           bool replace) {
  if (!isValidToolName(name)) return RegistryError{RegistryErrc::notFound, "no tool named " + name.substr(0, 80)};
  auto target = getRevision(revision, name);
  if (!target) return target.error();
  if ((*target)->executionClass == ExecutionClass::trustedNative) {
    return RegistryError{RegistryErrc::reservedName, name + " is a built-in tool; the daemon binds it"};
  }
  ActivateOutcome outcome{name, revision, std::nullopt, false, {}};
  std::optional<RegistryError> refusal;
  std::string now = protocol::formatTime(std::chrono::system_clock::now());
  auto written = store_.write([&](store::WriteTxn& txn) -> boost::system::result<void> {
    if (auto current = txn.tryGet(bindings_, name)) {
      auto object = parseObject(*current);
      std::string bound = object ? std::string(object->at("revision").as_string()) : "";
      outcome.previous = bound;
      if (bound == revision) return {};  // already active: nothing to write, nothing changes
      if (!replace) {
        refusal = RegistryError{RegistryErrc::conflict,
                                name + " is bound to " + bound + "; pass replace: true to move it to " + revision};
        return aborted();
      }
    }
    txn.put(bindings_, name, protocol::writeJson(json::object{{"revision", revision}, {"activatedAt", now}}));
    outcome.changed = true;
    return {};
  });
  bindingsWritten();
  if (refusal) return *refusal;
  if (!written) return storageError(store_, written.error());
  if (outcome.previous) {
    auto previous = getRevision(*outcome.previous);
    outcome.changes = previous ? describeChanges((*previous)->manifest, (*target)->manifest)
                               : json::object{{"unknown", "the previous revision could not be read"}};
  } else {
    // From nothing: every capability the revision requests is added (its endpoint too).
    const auto& execution = (*target)->manifest.at("execution").as_object();
    outcome.changes =
        describeChanges(json::object{{"execution", json::object{{"class", execution.at("class")}}}},
                        (*target)->manifest);
  }
  if (outcome.changed) {
    spdlog::info("activated {} at {}{}", name, revision,
                 outcome.previous ? " (was " + *outcome.previous + ")" : std::string());
    if (outcome.previous) {
      for (const auto& listener : bindingListeners_) listener(name, *outcome.previous, revision);
    }
  }
  return outcome;
}

Result<std::vector<Binding>> Registry::list() {
  auto rows = store_.read([&](store::ReadTxn& txn) {
    std::vector<Binding> out;
    txn.scan(bindings_, store::KeyRange::all(), [&](std::string_view key, std::string_view value) {
      if (auto object = parseObject(value)) {
        out.push_back(Binding{std::string(key), std::string(object->at("revision").as_string()),
                              std::string(object->at("activatedAt").as_string())});
      }
    });
    return out;
  });
  if (!rows) return storageError(store_, rows.error());
  return std::move(*rows);
}

Result<std::vector<HistoryEntry>> Registry::history(const std::string& name) {
  if (!isValidToolName(name)) return RegistryError{RegistryErrc::notFound, "no tool named " + name.substr(0, 80)};
  auto binding = tryBinding(name);
  auto rows = store_.read([&](store::ReadTxn& txn) {
    std::vector<HistoryEntry> out;
    txn.scan(history_, store::KeyRange::prefix(store::compositePrefix({name})),
             [&](std::string_view key, std::string_view value) {
               auto parts = store::trySplitCompositeKey(key, 2);
               if (!parts) return;
               std::string revision((*parts)[1]);
               out.push_back(HistoryEntry{revision, std::string(value), binding && binding->revision == revision});
             });
    return out;
  });
  if (!rows) return storageError(store_, rows.error());
  if (rows->empty()) return RegistryError{RegistryErrc::notFound, "no tool named " + name};
  std::stable_sort(rows->begin(), rows->end(),
                   [](const HistoryEntry& a, const HistoryEntry& b) { return a.installedAt < b.installedAt; });
  return std::move(*rows);
}

Result<SettingsOutcome> Registry::configure(const std::string& name, const std::string& revision,
                                            const json::object& settings) {
  auto tool = getRevision(revision, name);
  if (!tool) return tool.error();
  if ((*tool)->settingsSchema) {
    if (auto violation = (*tool)->settingsSchema->validate(settings)) {
      return RegistryError{RegistryErrc::invalidDefinition, violation->describe("settings")};
    }
  }
  json::object document{{"tool", name}, {"toolRevision", revision}, {"settings", settings}};
  auto unsalted = protocol::canonicalJson(document);
  if (!unsalted)
    return RegistryError{RegistryErrc::invalidDefinition, "settings: " + unsalted.error().detail};
  // Everything in the document but the values is public, and its revision is shown to agents
  // and to other tools (tools.get, ctx.resolveInvocation): without a salt, guessing the values
  // and hashing each guess would recover them. The salt is keyed by a secret of this store, so
  // the same settings still get the same revision here.
  auto key = settingsSaltKey();
  if (!key) return key.error();
  document["salt"] = protocol::keyedDigest(*key, *unsalted);
  auto canonical = protocol::canonicalJson(document);
  if (!canonical) return RegistryError{RegistryErrc::invalidDefinition, "settings: " + canonical.error().detail};
  if (canonical->size() > limits_.maxSettingsBytes) {
    return RegistryError{RegistryErrc::invalidDefinition,
                         "settings: " + std::to_string(canonical->size()) + " bytes; the limit is " +
                             std::to_string(limits_.maxSettingsBytes)};
  }
  std::string settingsRevision = protocol::contentHashOfCanonical(protocol::domain::kToolSettings, *canonical);
  bool created = false;
  auto written = store_.write([&](store::WriteTxn& txn) -> boost::system::result<void> {
    created = txn.putIfAbsent(settings_, settingsRevision, *canonical);
    txn.put(currentSettings_, store::compositeKey({name, revision}), settingsRevision);
    return {};
  });
  {
    // Whether or not the write went through (it may have, with an error after): read again.
    std::lock_guard lock(mutex_);
    ++settingsGeneration_;
    currentSettingsCache_.clear();
  }
  if (!written) return storageError(store_, written.error());
  return SettingsOutcome{settingsRevision, created};
}

Result<std::string> Registry::settingsSaltKey() {
  {
    std::lock_guard lock(mutex_);
    if (saltKey_) return *saltKey_;
  }
  auto stored =
      store_.read([&](store::ReadTxn& txn) { return txn.getCopy(settingsKey_, kSaltKeyName); });
  if (!stored) return storageError(store_, stored.error());
  if (!*stored) {
    const std::string fresh = protocol::randomBytes(kSaltKeyBytes);
    auto written = store_.write([&](store::WriteTxn& txn) -> boost::system::result<void> {
      txn.putIfAbsent(settingsKey_, kSaltKeyName, fresh);
      return {};
    });
    if (!written) return storageError(store_, written.error());
    stored =
        store_.read([&](store::ReadTxn& txn) { return txn.getCopy(settingsKey_, kSaltKeyName); });
    if (!stored) return storageError(store_, stored.error());
  }
  if (!*stored || (*stored)->size() != kSaltKeyBytes) {
    return RegistryError{RegistryErrc::integrity,
                         "the store's settings salt key is missing or damaged"};
  }
  std::lock_guard lock(mutex_);
  saltKey_ = **stored;
  return *saltKey_;
}

std::optional<std::string> Registry::trySettingsRevision(const std::string& name, const std::string& revision) {
  const std::string key = store::compositeKey({name, revision});
  std::uint64_t generation = 0;
  {
    std::lock_guard lock(mutex_);
    if (auto cached = currentSettingsCache_.find(key); cached != currentSettingsCache_.end()) {
      return cached->second;
    }
    generation = settingsGeneration_;
  }
  auto found = store_.read([&](store::ReadTxn& txn) { return txn.getCopy(currentSettings_, key); });
  if (!found) return std::nullopt;
  std::lock_guard lock(mutex_);
  if (generation == settingsGeneration_) {
    if (currentSettingsCache_.size() >= kMaxCachedCurrentSettings) currentSettingsCache_.clear();
    currentSettingsCache_.insert_or_assign(key, *found);
  }
  return *found;
}

Result<std::shared_ptr<const json::object>> Registry::sharedSettings(
    const std::string& settingsRevision, const std::string& name, const std::string& revision) {
  {
    std::lock_guard lock(mutex_);
    if (auto cached = settingsCache_.find(settingsRevision); cached != settingsCache_.end()) {
      if (cached->second.tool == name && cached->second.toolRevision == revision) {
        return cached->second.values;
      }
    }
  }
  auto values = getSettings(settingsRevision, name, revision);
  if (!values) return values.error();
  auto shared = std::make_shared<const json::object>(std::move(*values));
  const std::size_t bytes = protocol::writeJson(*shared).size() + settingsRevision.size();
  std::lock_guard lock(mutex_);
  if (cachedSettingsBytes_ + bytes > kMaxCachedSettingsBytes) {
    settingsCache_.clear();
    cachedSettingsBytes_ = 0;
  }
  if (bytes <= kMaxCachedSettingsBytes &&
      settingsCache_.try_emplace(settingsRevision, CachedSettings{shared, name, revision}).second) {
    cachedSettingsBytes_ += bytes;
  }
  return shared;
}

Result<json::object> Registry::getSettings(const std::string& settingsRevision, const std::string& name,
                                           const std::string& revision) {
  auto notFound = RegistryError{RegistryErrc::notFound,
                                "no settings " + settingsRevision.substr(0, 80) + " for " + name + " at " + revision};
  if (!protocol::isContentHash(settingsRevision)) return notFound;
  auto text = store_.read([&](store::ReadTxn& txn) { return txn.getCopy(settings_, settingsRevision); });
  if (!text) return storageError(store_, text.error());
  if (!*text) return notFound;
  if (protocol::contentHashOfCanonical(protocol::domain::kToolSettings, **text) != settingsRevision) {
    spdlog::error("integrity: stored settings {} do not match their hash", settingsRevision);
    return RegistryError{RegistryErrc::integrity, "the stored settings " + settingsRevision + " do not match their hash"};
  }
  auto document = parseObject(**text);
  if (!document) return RegistryError{RegistryErrc::integrity, "the stored settings are unreadable"};
  // Settings resolve only for the tool revision they were made for.
  if (document->at("tool").as_string() != name || document->at("toolRevision").as_string() != revision) {
    return notFound;
  }
  return document->at("settings").as_object();
}

Result<std::vector<std::string>> Registry::verifyAll() {
  auto problems = store_.read([&](store::ReadTxn& txn) {
    std::vector<std::string> out;
    txn.scan(manifests_, store::KeyRange::all(), [&](std::string_view key, std::string_view value) {
      if (protocol::contentHashOfCanonical(protocol::domain::kToolManifest, value) != key) {
        out.push_back("manifest " + std::string(key));
      }
    });
    txn.scan(settings_, store::KeyRange::all(), [&](std::string_view key, std::string_view value) {
      if (protocol::contentHashOfCanonical(protocol::domain::kToolSettings, value) != key) {
        out.push_back("settings " + std::string(key));
      }
    });
    txn.scan(bindings_, store::KeyRange::all(), [&](std::string_view key, std::string_view value) {
      auto object = parseObject(value);
      if (!object || !txn.contains(manifests_, object->at("revision").as_string())) {
        out.push_back("binding " + std::string(key) + " points at no stored manifest");
      }
    });
    return out;
  });
  if (!problems) return storageError(store_, problems.error());
  return std::move(*problems);
}

void Registry::onBindingMoved(
    std::function<void(const std::string&, const std::string&, const std::string&)> listener) {
  bindingListeners_.push_back(std::move(listener));
}

}  // namespace toolhost::registry
