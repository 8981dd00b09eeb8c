#include "daemon/secrets_host.h"

#include "protocol/content_hash.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <stdexcept>

namespace toolhost::daemon {
namespace json = boost::json;
using runtime::HostOpFailure;

namespace {

bool isBase64UrlChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

// The secrets a manifest requests (capabilities.secrets).
std::vector<std::string> requestedSecrets(const json::object& manifest) {
  std::vector<std::string> names;
  const auto* capabilities = manifest.if_contains("capabilities");
  if (capabilities == nullptr || !capabilities->is_object()) return names;
  const auto* secrets = capabilities->as_object().if_contains("secrets");
  if (secrets == nullptr || !secrets->is_array()) return names;
  for (const auto& name : secrets->get_array()) {
    if (name.is_string()) names.emplace_back(name.get_string());
  }
  return names;
}

bool requests(const json::object& manifest, std::string_view name) {
  auto names = requestedSecrets(manifest);
  return std::find(names.begin(), names.end(), name) != names.end();
}

// The command an admin runs to set `name` for the revision of `tool` that asked (which need not
// be the active one: a call may name its revision).
std::string setCommand(const std::string& tool, const std::string& revision,
                       const std::string& name, const std::string& origin = "https://...") {
  return "toolhostctl secrets set " + tool + " " + name + " --origin " + origin + " --revision " +
         revision;
}

HostOpFailure unavailable(const policy::VaultError& error, const std::string& name) {
  spdlog::warn("secrets: {} cannot be used: {}", name, error.message);
  return {"secret-unavailable", "the secret " + name + " cannot be used now: " + error.message};
}

}  // namespace

std::vector<PlaceholderAt> findPlaceholders(std::string_view text) {
  std::vector<PlaceholderAt> found;
  std::size_t from = 0;
  while ((from = text.find(kPlaceholderPrefix, from)) != std::string_view::npos) {
    const std::size_t start = from + kPlaceholderPrefix.size();
    std::size_t end = start;
    while (end < text.size() && end - start < kPlaceholderRandomChars &&
           isBase64UrlChar(text[end])) {
      ++end;
    }
    if (end - start == kPlaceholderRandomChars) {
      found.push_back(PlaceholderAt{from, text.substr(from, kPlaceholderChars)});
      from += kPlaceholderChars;
    } else {
      from = start;
    }
  }
  return found;
}

bool mentionsPlaceholder(std::string_view text) {
  constexpr std::string_view kStem = "toolhost-secret";
  for (std::size_t at = text.find(kStem); at != std::string_view::npos;
       at = text.find(kStem, at + 1)) {
    std::string_view rest = text.substr(at + kStem.size());
    if (rest.starts_with(':')) return true;
    if (rest.size() >= 3 && rest[0] == '%' && rest[1] == '3' &&
        (rest[2] == 'A' || rest[2] == 'a')) {
      return true;
    }
  }
  return false;
}

policy::KeySource chooseSecretsKey(const Config& config) {
  if (config.secrets.keyFile) return {*config.secrets.keyFile, true, "[secrets] key_file"};
  if (const char* credentials = std::getenv("CREDENTIALS_DIRECTORY");
      credentials != nullptr && *credentials != '\0') {
    return {std::filesystem::path(credentials) / "toolhost.key", false,
            "the systemd credential toolhost.key"};
  }
  return {config.stateDir / "secrets.key", true, "the state directory's key"};
}

std::string SecretsHost::issue(const registry::ToolRevision& caller, const std::string& name) {
  std::lock_guard lock(mutex_);
  auto key = std::make_pair(caller.revision, name);
  if (auto found = byRevisionAndName_.find(key); found != byRevisionAndName_.end()) {
    Issued& issued = byToken_.at(found->second);
    lru_.splice(lru_.begin(), lru_, issued.lru);
    return found->second;
  }
  std::array<unsigned char, kPlaceholderRandomChars / 4 * 3> random{};
  if (RAND_bytes(random.data(), static_cast<int>(random.size())) != 1) {
    throw std::runtime_error("the system gave no random bytes for a secret placeholder");
  }
  std::string token(kPlaceholderPrefix);
  token += protocol::base64UrlEncode(
      std::string_view(reinterpret_cast<const char*>(random.data()), random.size()));
  while (byToken_.size() >= maxPlaceholders_ && !lru_.empty()) {
    auto oldest = byToken_.find(lru_.back());
    byRevisionAndName_.erase(std::make_pair(oldest->second.revision, oldest->second.secretName));
    byToken_.erase(oldest);
    lru_.pop_back();
  }
  lru_.push_front(token);
  byToken_.emplace(token, Issued{caller.name, caller.revision, name, lru_.begin()});
  byRevisionAndName_.emplace(std::move(key), token);
  return token;
}

void SecretsHost::auditDenial(const registry::ToolRevision& caller, const std::string& name,
                              std::string_view code) {
  policy::AuditEntry entry;
  entry.kind = "denial";
  entry.toolRevision = caller.revision;
  entry.toolName = caller.name;
  entry.action = "secret";
  entry.target = name;
  entry.verdict = "deny";
  entry.reason = "ctx.secret: " + std::string(code);
  audit_.append(std::move(entry));
}

boost::system::result<std::optional<policy::ResolvedSecret>, policy::VaultError> resolveSecret(
    registry::Registry& registry, const policy::SecretsVault& vault, const std::string& toolName,
    const std::string& revision, const std::string& name) {
  // The tool's revisions oldest first; those installed strictly before this one may carry to
  // it. (A revision the history does not list, a built-in one, gets its own secrets only.)
  std::vector<std::string> installedBefore;
  if (auto history = registry.history(toolName)) {
    auto own = std::find_if(
        history->begin(), history->end(),
        [&](const registry::HistoryEntry& entry) { return entry.revision == revision; });
    if (own != history->end()) {
      for (auto it = history->begin(); it != own; ++it) {
        if (it->installedAt < own->installedAt) installedBefore.push_back(it->revision);
      }
    }
  }
  return vault.tryResolve(toolName, revision, name, installedBefore);
}

boost::system::result<std::optional<policy::ResolvedSecret>, policy::VaultError>
SecretsHost::resolve(const std::string& toolName, const std::string& revision,
                     const std::string& name) {
  return resolveSecret(registry_, vault_, toolName, revision, name);
}

runtime::HostOpResult SecretsHost::placeholder(const registry::ToolRevision& caller,
                                               const json::value& request) {
  const json::object* fields = request.if_object();
  const json::value* given = fields != nullptr ? fields->if_contains("name") : nullptr;
  if (given == nullptr || !given->is_string()) {
    return HostOpFailure{"invalid-argument", "ctx.secret(name) takes the secret's name"};
  }
  const std::string name(given->get_string());
  if (!policy::isValidSecretName(name) || !requests(caller.manifest, name)) {
    const std::string shown = name.substr(0, 64);
    auditDenial(caller, shown, "not-authorized");
    return HostOpFailure{"not-authorized", registry::notRequestedWords(
                                               caller, "the secret " + shown,
                                               "add \"" + shown + "\" to capabilities.secrets")};
  }
  auto resolved = resolve(caller.name, caller.revision, name);
  if (!resolved) return unavailable(resolved.error(), name);
  if (!*resolved) {
    auditDenial(caller, name, "secret-not-found");
    return HostOpFailure{"secret-not-found", "no secret " + name + " is set for this revision of " +
                                                 caller.name + "; an admin sets it with: " +
                                                 setCommand(caller.name, caller.revision, name) +
                                                 " (the value is read from stdin)"};
  }
  return json::value(issue(caller, name));
}

boost::system::result<SecretsHost::Use, HostOpFailure> SecretsHost::use(
    std::string_view token, const std::string& toolName, const std::string& revision,
    const std::string& origin, Placement placement, bool reveal) {
  std::string name;
  {
    std::lock_guard lock(mutex_);
    auto found = byToken_.find(token);
    if (found == byToken_.end()) {
      return HostOpFailure{
          "secret-not-allowed",
          "the request holds a secret placeholder this daemon did not issue (placeholders last "
          "until the daemon restarts, or until many others were issued); get a fresh one from "
          "ctx.secret(name). Nothing was sent."};
    }
    if (found->second.revision != revision || found->second.toolName != toolName) {
      return HostOpFailure{"secret-not-allowed",
                           "the request holds the placeholder of a secret of another tool "
                           "revision; a tool may send only its own secrets. Nothing was sent."};
    }
    lru_.splice(lru_.begin(), lru_, found->second.lru);
    name = found->second.secretName;
  }
  auto resolved = resolve(toolName, revision, name);
  if (!resolved) return unavailable(resolved.error(), name);
  if (!*resolved) {
    return HostOpFailure{"secret-not-found",
                         "the secret " + name + " is no longer set for this revision of " +
                             toolName + "; nothing was sent. An admin sets it with: " +
                             setCommand(toolName, revision, name, origin)};
  }
  policy::SecretRecord record = std::move((*resolved)->record);
  Use out{name, {}};
  if (reveal) {
    auto revealed = vault_.reveal(record.tool, record.revision, record.name);
    if (!revealed) return unavailable(revealed.error(), name);
    if (!*revealed) {
      return HostOpFailure{"secret-not-found", "the secret " + name +
                                                   " was deleted while the request was being "
                                                   "authorized; nothing was sent"};
    }
    // Judge the grant the value was stored with, not the one read a moment before: an earlier
    // revision's row that stopped carrying meanwhile is not this revision's any more.
    if ((*revealed)->record.revision != revision && !(*revealed)->record.carry) {
      return HostOpFailure{"secret-not-found", "the secret " + name +
                                                   " stopped carrying to this revision while the "
                                                   "request was being authorized; nothing was "
                                                   "sent"};
    }
    record = std::move((*revealed)->record);
    out.value = std::move((*revealed)->value);
  }
  if (std::find(record.origins.begin(), record.origins.end(), origin) == record.origins.end()) {
    std::string granted;
    for (const auto& each : record.origins) granted += (granted.empty() ? "" : ", ") + each;
    return HostOpFailure{"secret-not-allowed",
                         "the secret " + name + " is not granted to " + origin +
                             " (it may be sent to " + granted +
                             " only); nothing was sent. To grant it, an admin sets it again "
                             "with: " +
                             setCommand(toolName, revision, name, origin)};
  }
  if (placement == Placement::body && !record.allowBody) {
    return HostOpFailure{"secret-not-allowed",
                         "the secret " + name +
                             " may be sent in request headers only, and the request body holds "
                             "its placeholder; nothing was sent. To allow bodies, an admin sets "
                             "it again with --allow-body"};
  }
  return out;
}

std::vector<policy::SecretValue> SecretsHost::valuesFor(const std::string& revision,
                                                        const std::string& origin,
                                                        const std::vector<std::string>& skip) {
  std::vector<policy::SecretValue> values;
  auto found = registry_.getRevision(revision);
  if (!found) return values;
  const registry::ToolRevision& tool = **found;
  auto grantedHere = [&origin](const policy::SecretRecord& record) {
    return std::find(record.origins.begin(), record.origins.end(), origin) != record.origins.end();
  };
  for (const auto& name : requestedSecrets(tool.manifest)) {
    if (std::find(skip.begin(), skip.end(), name) != skip.end()) continue;
    auto resolved = resolve(tool.name, tool.revision, name);
    // Decrypted only when granted here (and judged again on the grant stored with the value).
    if (!resolved || !*resolved || !grantedHere((*resolved)->record)) continue;
    const auto& record = (*resolved)->record;
    auto revealed = vault_.reveal(record.tool, record.revision, record.name);
    if (!revealed || !*revealed || !grantedHere((*revealed)->record)) continue;
    values.push_back(std::move((*revealed)->value));
  }
  return values;
}

json::object SecretsHost::describeRequested(const registry::ToolRevision& tool) {
  json::array own, carried, missing;
  for (const auto& name : requestedSecrets(tool.manifest)) {
    auto resolved = resolve(tool.name, tool.revision, name);
    if (!resolved) {
      spdlog::warn("secrets: cannot resolve {} of {}: {}", name, tool.name,
                   resolved.error().message);
      missing.emplace_back(name);
    } else if (!*resolved) {
      missing.emplace_back(name);
    } else if ((*resolved)->resolution == policy::Resolution::own) {
      own.emplace_back(name);
    } else {
      carried.emplace_back(name);
    }
  }
  return json::object{
      {"own", std::move(own)}, {"carried", std::move(carried)}, {"missing", std::move(missing)}};
}

}  // namespace toolhost::daemon
