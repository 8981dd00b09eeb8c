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

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace toolhost::daemon {

// The services a mediated request needs. All must outlive the io_context the requests run on
// (main.cc declares them before it).
struct MediationServices {
  policy::DecisionStore& decisions;
  policy::ApprovalBroker& approvals;
  policy::AuditLog& audit;
  policy::HttpClient& http;     // built once at start from [fetch] allow_private, extra_ca_file
  const ConfigHolder& configs;  // [fetch] limits and [policy] prompt_timeout_ms, read per request
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
};
void auditRequest(policy::AuditLog& audit, const RequestRecord& record);

// A refusal before any authorization (invalid URL, blocked destination, bad header): a "denial"
// audit entry naming the code only (messages may quote the URL).
void auditRefusal(policy::AuditLog& audit, const std::string& toolRevision,
                  const std::string& toolName, std::string_view action, std::string target,
                  std::optional<policy::AccessClass> access, std::string_view code);

}  // namespace toolhost::daemon
