// What every mediated request of a tool shares, whether a sandboxed tool's fetch or popup or an
// external-service tool's forwarded call: the services it goes through and small helpers (limits
// from the config, base64, prompt wording of private ranges, request audit entries).
// Pure helpers and plain references; any thread.
#pragma once

#include "daemon/config.h"
#include "policy/access_class.h"
#include "policy/approvals.h"
#include "policy/audit.h"
#include "policy/decisions.h"
#include "policy/destination.h"
#include "policy/http_client.h"
#include "policy/secrets_vault.h"
#include "runtime/capability_host.h"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace toolhost::daemon {

class SecretsHost;  // daemon/secrets_host.h

// The services a mediated request needs. All must outlive the io_context the requests run on
// (main.cc declares them before it).
struct MediationServices {
  policy::DecisionStore& decisions;
  policy::ApprovalBroker& approvals;
  policy::AuditLog& audit;
  policy::HttpClient& http;     // built once at start from [fetch] allow_private, extra_ca_file
  const ConfigHolder& configs;  // [fetch] limits and [policy] prompt_timeout_ms, read per request
  SecretsHost* secrets = nullptr;  // null: no placeholders are issued, so none is substituted
};

// The limits of one request under the configuration in force.
policy::FetchLimits fetchLimits(const Config& config);

// Standard base64 with padding (RFC 4648 section 4), as the runtime passes bodies.
std::string base64Encode(std::string_view bytes);
// Strict: padding required, no whitespace, no other alphabet. nullopt for anything else.
std::optional<std::string> base64Decode(std::string_view text);

// How a prompt shows a literal destination in a range the operator opened:
// "loopback 127.0.0.0/8 (opened by [fetch] allow_private 127.0.0.1/32)". nullopt for public ones.
std::optional<std::string> privateRangeText(const policy::Destination& destination);

// Whether asking `key` is likely to show a person a prompt: the manifest requests it, nothing is
// decided for it, and an approver is connected. Decides only whether the tool's wall clock pauses;
// the broker decides for real.
bool mayPrompt(MediationServices& services, const policy::DecisionKey& key, bool requested);

// One "request" audit entry: who, what, the HTTP status and bytes if any, how long it took.
// `outcome` is a word or a failure code ("ok", "timeout", "cancelled"), never a URL's path or
// query, a header or a body.
struct RequestRecord {
  policy::DecisionKey key;
  std::string toolName;
  std::optional<policy::Scope> scope;  // of the decision that allowed it
  std::string method;                  // "GET", "POST"; empty for popups and unix: calls
  std::string outcome;
  std::optional<int> status;
  std::optional<std::uint64_t> bytes;
  std::chrono::milliseconds duration{0};
  std::vector<std::string> secrets{};  // names of the secrets substituted into it (never values)
};
void auditRequest(policy::AuditLog& audit, const RequestRecord& record);

// A refusal before any authorization (invalid URL, blocked destination, bad header): a "denial"
// audit entry naming the code only (messages may quote the URL).
void auditRefusal(policy::AuditLog& audit, const std::string& toolRevision,
                  const std::string& toolName, std::string_view action, std::string target,
                  std::optional<policy::AccessClass> access, std::string_view code);

}  // namespace toolhost::daemon

namespace toolhost::daemon {

// Secrets in a sandboxed tool's fetch (placeholders from ctx.secret, daemon/secrets_host.h).
// Placeholders in the URL are refused; in a header value or the body, each must belong to the
// calling revision and its secret must be granted to the destination origin (and, in the body,
// allow bodies), or the request is refused with secret-not-allowed and nothing is sent. A header
// or body without a placeholder is left as it is. At most kMaxSecretPlaceholders placeholders in
// one request (each may grow into a value of up to 1 MiB), else request-too-large.
inline constexpr std::size_t kMaxSecretPlaceholders = 16;

// Before authorization (no prompt for a request that could never be sent): the checks above,
// against the secrets as stored now. No value is read.
std::optional<runtime::HostOpFailure> checkSecrets(MediationServices& services,
                                                   const std::string& toolName,
                                                   const std::string& revision,
                                                   std::string_view url,
                                                   const policy::HttpRequest& request);

// After authorization, right before the request is sent: the same checks again (the grant may
// have changed while a person was asked), then every placeholder replaced by its value.
struct SubstitutedSecrets {
  std::vector<std::string> names;           // sorted, unique: for the audit
  std::vector<policy::SecretValue> values;  // for redaction; wiped when this goes
};
boost::system::result<SubstitutedSecrets, runtime::HostOpFailure> substituteSecrets(
    MediationServices& services, const std::string& toolName, const std::string& revision,
    policy::HttpRequest& request);

// Replaces every exact occurrence of a substituted value in the response (status text, header
// values, body), or in a failure message, with "[redacted]" before the tool sees it. A server
// that transforms a value before echoing it (encodes, hashes, splits it) defeats this: grant
// secrets only to origins trusted with them.
inline constexpr std::string_view kRedacted = "[redacted]";
void redactSecrets(const SubstitutedSecrets& secrets, policy::HttpResponse& response);
void redactSecrets(const SubstitutedSecrets& secrets, std::string& text);
// Whether `url` holds one of the values: as it is, in another case, or percent-encoded once or
// several times over ('+' read as a space too), the ways a server that was sent a value may
// write it into a URL it redirects to, and the ways fetch itself re-encodes a Location.
bool carriesSecret(const SubstitutedSecrets& secrets, std::string_view url);

}  // namespace toolhost::daemon
