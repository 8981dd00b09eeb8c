#include "policy/decisions.h"

#include "protocol/content_hash.h"
#include "protocol/json_parse.h"
#include "protocol/json_text.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <ctime>
#include <stdexcept>

namespace toolhost::policy {
namespace json = boost::json;

namespace {

constexpr std::string_view kDecisionsTable = "policy_decisions";
constexpr std::string_view kAuditTable = "audit";
// Targets longer than this are keyed by their hash (LMDB keys are at most 511 bytes); the row
// itself keeps the whole key.
constexpr std::size_t kMaxTargetInKey = 300;
constexpr std::string_view kTargetHashDomain = "toolhost.policy-target.v1";

std::string targetKeyPart(std::string_view target) {
  if (target.size() <= kMaxTargetInKey && !target.starts_with('#')) return std::string(target);
  return "#" + protocol::contentHashOfCanonical(kTargetHashDomain, target);
}

// revision \0 action \0 access \0 target: every part before the last is free of NUL bytes (the
// revision is a content hash, the action and access are fixed words), and the target comes last.
std::string rowKey(const DecisionKey& key) {
  return store::compositeKey(
      {key.toolRevision, key.action, accessClassName(key.access), targetKeyPart(key.target)});
}

std::string rowValue(const DecisionKey& key, const StoredDecision& decision) {
  return protocol::writeJson(json::value(toJson(DecisionEntry{key, decision})));
}

std::optional<DecisionEntry> parseRow(std::string_view value) {
  auto parsed = protocol::parseJson(value);
  if (!parsed || !parsed->is_object()) return std::nullopt;
  const auto& row = parsed->as_object();
  auto text = [&](std::string_view name) -> std::optional<std::string> {
    const auto* member = row.if_contains(name);
    if (member == nullptr || !member->is_string()) return std::nullopt;
    return std::string(member->get_string());
  };
  auto revision = text("toolRevision");
  auto action = text("action");
  auto target = text("target");
  auto access = text("access");
  auto verdict = text("verdict");
  auto scope = text("scope");
  if (!revision || !action || !target || !access || !verdict || !scope) return std::nullopt;
  auto accessClass = parseAccessClass(*access);
  auto verdictValue = parseVerdict(*verdict);
  auto scopeValue = parseScope(*scope);
  if (!accessClass || !verdictValue || !scopeValue) return std::nullopt;
  DecisionEntry entry;
  entry.key = DecisionKey{*revision, *action, *target, *accessClass};
  entry.decision.verdict = *verdictValue;
  entry.decision.scope = *scopeValue;
  entry.decision.decidedAt = text("decidedAt").value_or("");
  entry.decision.decidedBy = text("decidedBy").value_or("");
  return entry;
}

store::KeyRange rangeOf(const std::optional<std::string>& toolRevision) {
  if (!toolRevision) return store::KeyRange::all();
  return store::KeyRange::prefix(store::compositePrefix({*toolRevision}));
}

bool validKeyParts(const DecisionKey& key) {
  return key.toolRevision.find('\0') == std::string::npos && isKnownAction(key.action);
}

}  // namespace

std::string_view verdictName(Verdict verdict) {
  return verdict == Verdict::allow ? "allow" : "deny";
}

std::string_view scopeName(Scope scope) {
  switch (scope) {
    case Scope::once:
      return "once";
    case Scope::session:
      return "session";
    case Scope::always:
      return "always";
  }
  return "once";
}

std::optional<Verdict> parseVerdict(std::string_view text) {
  if (text == "allow") return Verdict::allow;
  if (text == "deny") return Verdict::deny;
  return std::nullopt;
}

std::optional<Scope> parseScope(std::string_view text) {
  if (text == "once") return Scope::once;
  if (text == "session") return Scope::session;
  if (text == "always") return Scope::always;
  return std::nullopt;
}

std::optional<AccessClass> parseAccessClass(std::string_view text) {
  if (text == "read") return AccessClass::read;
  if (text == "write") return AccessClass::write;
  return std::nullopt;
}

bool isKnownAction(std::string_view action) {
  return action == kActionFetch || action == kActionPopup || action == kActionInvoke;
}

std::string describe(const DecisionKey& key) {
  return key.action + " " + key.target + " (" + std::string(accessClassName(key.access)) + ") by " +
         key.toolRevision;
}

bool manifestRequests(const json::object& manifest, const DecisionKey& key) {
  if (key.action == kActionInvoke) {
    const auto* execution = manifest.if_contains("execution");
    if (execution == nullptr || !execution->is_object()) return false;
    const auto* kind = execution->as_object().if_contains("class");
    const auto* endpoint = execution->as_object().if_contains("endpoint");
    return kind != nullptr && *kind == "external-service" && endpoint != nullptr &&
           endpoint->is_string() && endpoint->get_string() == key.target;
  }
  const auto* capabilities = manifest.if_contains("capabilities");
  if (capabilities == nullptr || !capabilities->is_object()) return false;
  const auto* requested = capabilities->as_object().if_contains(key.action);
  if (requested == nullptr || !requested->is_array()) return false;
  if (key.action == kActionPopup) {
    for (const auto& target : requested->get_array()) {
      if (target.is_string() && target.get_string() == key.target) return true;
    }
    return false;
  }
  if (key.action != kActionFetch) return false;
  for (const auto& entry : requested->get_array()) {
    if (!entry.is_object()) continue;
    const auto* origin = entry.as_object().if_contains("origin");
    const auto* access = entry.as_object().if_contains("access");
    if (origin == nullptr || !origin->is_string() || origin->get_string() != key.target) continue;
    if (access == nullptr || !access->is_array()) continue;
    for (const auto& item : access->get_array()) {
      if (item.is_string() && item.get_string() == accessClassName(key.access)) return true;
    }
  }
  return false;
}

json::object toJson(const DecisionEntry& entry) {
  return json::object{{"toolRevision", entry.key.toolRevision},
                      {"action", entry.key.action},
                      {"target", entry.key.target},
                      {"access", accessClassName(entry.key.access)},
                      {"verdict", verdictName(entry.decision.verdict)},
                      {"scope", scopeName(entry.decision.scope)},
                      {"decidedAt", entry.decision.decidedAt},
                      {"decidedBy", entry.decision.decidedBy}};
}

std::vector<std::string> DecisionStore::tables() {
  return {std::string(kDecisionsTable), std::string(kAuditTable)};
}

DecisionStore::DecisionStore(store::Store& store)
    : store_(store), table_(store.table(kDecisionsTable)) {}

boost::system::result<std::optional<StoredDecision>> DecisionStore::tryFind(
    const DecisionKey& key) const {
  {
    std::lock_guard lock(mutex_);
    if (auto found = session_.find(key); found != session_.end()) return found->second;
  }
  if (!validKeyParts(key)) return std::optional<StoredDecision>();
  return store_.read([&](store::ReadTxn& txn) -> std::optional<StoredDecision> {
    auto value = txn.tryGet(table_, rowKey(key));
    if (!value) return std::nullopt;
    auto entry = parseRow(*value);
    if (!entry || entry->key != key) {
      spdlog::warn("policy: the stored decision for {} is unreadable; treating it as undecided",
                   policy::describe(key));
      return std::nullopt;
    }
    return entry->decision;
  });
}

boost::system::result<StoredDecision> DecisionStore::set(const DecisionKey& key, Verdict verdict,
                                                         Scope scope, std::string decidedBy) {
  if (scope == Scope::once) {
    throw std::invalid_argument("DecisionStore::set: a once decision is never stored");
  }
  if (!validKeyParts(key)) {
    throw std::invalid_argument("DecisionStore::set: unknown action or a NUL in the revision");
  }
  StoredDecision decision{verdict, scope, formatTime(std::chrono::system_clock::now()),
                          std::move(decidedBy)};
  // The lock spans the write so a concurrent set of the same key cannot interleave the memory
  // and the table differently.
  std::lock_guard lock(mutex_);
  if (scope == Scope::session) {
    session_[key] = decision;
    return decision;
  }
  auto written = store_.write([&](store::WriteTxn& txn) -> boost::system::result<void> {
    txn.put(table_, rowKey(key), rowValue(key, decision));
    return {};
  });
  if (!written) return written.error();
  session_.erase(key);
  return decision;
}

boost::system::result<bool> DecisionStore::revoke(const DecisionKey& key) {
  std::lock_guard lock(mutex_);
  bool removed = session_.erase(key) > 0;
  if (!validKeyParts(key)) return removed;
  auto erased = store_.write([&](store::WriteTxn& txn) -> boost::system::result<bool> {
    return txn.erase(table_, rowKey(key));
  });
  if (!erased) return boost::system::result<bool>(boost::system::in_place_error, erased.error());
  return removed || *erased;
}

boost::system::result<std::size_t> DecisionStore::reset(
    const std::optional<std::string>& toolRevision) {
  std::lock_guard lock(mutex_);
  std::size_t removed = 0;
  if (!toolRevision || toolRevision->find('\0') == std::string::npos) {
    auto erased = store_.write([&](store::WriteTxn& txn) -> boost::system::result<std::size_t> {
      std::vector<std::string> keys;
      txn.scan(table_, rangeOf(toolRevision),
               [&](std::string_view key, std::string_view) { keys.emplace_back(key); });
      for (const auto& key : keys) txn.erase(table_, key);
      return keys.size();
    });
    if (!erased) return erased.error();
    removed = *erased;
  }
  for (auto it = session_.begin(); it != session_.end();) {
    if (!toolRevision || it->first.toolRevision == *toolRevision) {
      it = session_.erase(it);
      ++removed;
    } else {
      ++it;
    }
  }
  return removed;
}

boost::system::result<std::vector<DecisionEntry>> DecisionStore::list(
    const std::optional<std::string>& toolRevision) const {
  std::map<DecisionKey, StoredDecision> all;
  if (!toolRevision || toolRevision->find('\0') == std::string::npos) {
    auto stored = store_.read([&](store::ReadTxn& txn) {
      std::vector<DecisionEntry> rows;
      txn.scan(table_, rangeOf(toolRevision), [&](std::string_view key, std::string_view value) {
        if (auto entry = parseRow(value)) {
          rows.push_back(std::move(*entry));
        } else {
          spdlog::warn("policy: an unreadable decision row ({} bytes of key) is skipped",
                       key.size());
        }
      });
      return rows;
    });
    if (!stored) return stored.error();
    for (auto& entry : *stored) all[entry.key] = std::move(entry.decision);
  }
  {
    std::lock_guard lock(mutex_);
    for (const auto& [key, decision] : session_) {
      if (!toolRevision || key.toolRevision == *toolRevision) all[key] = decision;
    }
  }
  std::vector<DecisionEntry> out;
  out.reserve(all.size());
  for (auto& [key, decision] : all) out.push_back(DecisionEntry{key, std::move(decision)});
  return out;
}

}  // namespace toolhost::policy
