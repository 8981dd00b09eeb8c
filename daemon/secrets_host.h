// Secrets as sandboxed tools see them: ctx.secret(name) answers an opaque placeholder, never the
// value; the fetch path (daemon/mediation.h) asks which secret a placeholder in a request stands
// for, whether it may go there, and (after authorization, right before the request is sent) its
// value. The vault (policy/secrets_vault.h) keeps the values; this host keeps the placeholders.
// Threads: every member may be called from any thread, concurrently (the placeholder table has a
// mutex of its own; the vault and the audit log are thread-safe). Short: LMDB reads, one decrypt.
//
// Placeholders: "toolhost-secret:" and 32 base64url characters (24 random bytes), one per (tool
// revision, secret name) for the daemon's run: the same revision asking again gets the same
// placeholder, another revision never gets it, and a placeholder substitutes only in requests of
// the revision it was issued to. The table holds at most `maxPlaceholders`; the least recently
// used goes first (a tool holding an evicted one is told to ask ctx.secret() again).
#pragma once

#include "daemon/config.h"
#include "policy/audit.h"
#include "policy/secrets_vault.h"
#include "registry/registry.h"
#include "runtime/capability_host.h"

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <boost/system/result.hpp>

#include <cstddef>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace toolhost::daemon {

inline constexpr std::string_view kPlaceholderPrefix = "toolhost-secret:";
inline constexpr std::size_t kPlaceholderRandomChars = 32;
inline constexpr std::size_t kPlaceholderChars =
    kPlaceholderPrefix.size() + kPlaceholderRandomChars;

// Every placeholder-shaped token in `text` (the prefix and 32 base64url characters), in order.
struct PlaceholderAt {
  std::size_t offset = 0;
  std::string_view token;  // into `text`
};
std::vector<PlaceholderAt> findPlaceholders(std::string_view text);
// Whether `text` (a URL) mentions a placeholder at all, also with its ':' percent-encoded.
bool mentionsPlaceholder(std::string_view text);

// Where the vault's key comes from: [secrets] key_file, else $CREDENTIALS_DIRECTORY/toolhost.key
// (a systemd credential, which must exist) when that variable is set, else
// <stateDir>/secrets.key (created on first use).
policy::KeySource chooseSecretsKey(const Config& config);

// Where in a request a placeholder was found.
enum class Placement { header, body };

// The secret `name` as revision `revision` of `toolName` sees it: its own row, or one carried
// from a revision installed before it (policy::SecretsVault::tryResolve). Any thread.
boost::system::result<std::optional<policy::ResolvedSecret>, policy::VaultError> resolveSecret(
    registry::Registry& registry, const policy::SecretsVault& vault, const std::string& toolName,
    const std::string& revision, const std::string& name);

class SecretsHost {
 public:
  SecretsHost(policy::SecretsVault& vault, policy::AuditLog& audit, registry::Registry& registry,
              std::size_t maxPlaceholders = 4096)
      : vault_(vault), audit_(audit), registry_(registry), maxPlaceholders_(maxPlaceholders) {}

  // ctx.secret(name), request {"name"}: the placeholder of (caller, name), once the caller's
  // manifest requests the secret (capabilities.secrets; else not-authorized, saying nothing of
  // whether such a secret exists) and it resolves (its own or a carried one; else
  // secret-not-found with the command that sets it).
  runtime::HostOpResult placeholder(const registry::ToolRevision& caller,
                                    const boost::json::value& request);

  // What a placeholder in a request of (toolName, revision) toward `origin` stands for: its
  // secret's name and, with `reveal`, its value. Refused (nothing may be sent) with
  // secret-not-allowed when the placeholder is unknown, belongs to another revision, or the
  // secret is not granted to `origin` or (in a body) to bodies; secret-not-found when the secret
  // was deleted meanwhile. Messages name the secret and the origin, never the value.
  struct Use {
    std::string name;
    policy::SecretValue value;  // empty unless revealed
  };
  boost::system::result<Use, runtime::HostOpFailure> use(std::string_view token,
                                                         const std::string& toolName,
                                                         const std::string& revision,
                                                         const std::string& origin,
                                                         Placement placement, bool reveal);

  // The value of every secret the revision requests that resolves (its own or carried) and is
  // granted to `origin`: for redaction from every response from that origin, so that a value
  // sent to a server that keeps it cannot come back in a later response without a placeholder.
  // Never a secret not granted to `origin` (its value was never sent there, and redacting it
  // would let any echoing server tell a tool whether a guess is right). A secret that cannot be
  // read is left out (its use would fail anyway).
  // Secrets named in `skip` (already substituted, so already redacted) are left out.
  std::vector<policy::SecretValue> valuesFor(const std::string& revision, const std::string& origin,
                                             const std::vector<std::string>& skip);

  // For tools.activate: the secrets `tool` requests, as {own, carried, missing} name lists (set
  // for this revision, resolvable through another revision's carry, not resolvable).
  boost::json::object describeRequested(const registry::ToolRevision& tool);

  policy::SecretsVault& vault() { return vault_; }

 private:
  struct Issued {
    std::string toolName;
    std::string revision;
    std::string secretName;
    std::list<std::string>::iterator lru;
  };

  std::string issue(const registry::ToolRevision& caller, const std::string& name);
  // The secret as (toolName, revision) sees it: its own, or carried from a revision installed
  // before it.
  boost::system::result<std::optional<policy::ResolvedSecret>, policy::VaultError> resolve(
      const std::string& toolName, const std::string& revision, const std::string& name);
  void auditDenial(const registry::ToolRevision& caller, const std::string& name,
                   std::string_view code);

  policy::SecretsVault& vault_;
  policy::AuditLog& audit_;
  registry::Registry& registry_;
  const std::size_t maxPlaceholders_;

  std::mutex mutex_;  // guards the three below
  std::map<std::string, Issued, std::less<>> byToken_;
  std::map<std::pair<std::string, std::string>, std::string> byRevisionAndName_;
  std::list<std::string> lru_;  // tokens, most recently used first
};

}  // namespace toolhost::daemon
