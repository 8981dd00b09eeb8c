#include "daemon/mediation.h"

#include <spdlog/spdlog.h>

#include <array>

namespace toolhost::daemon {

namespace {

constexpr std::string_view kAlphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int sextet(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

void append(policy::AuditLog& audit, policy::AuditEntry entry) {
  if (auto appended = audit.append(std::move(entry)); !appended) {
    spdlog::warn("cannot append to the audit log: {}", appended.error().message());
  }
}

}  // namespace

policy::FetchLimits fetchLimits(const Config& config) {
  policy::FetchLimits limits;
  limits.timeout = config.fetch.timeout;
  limits.maxResponseBytes = config.fetch.maxResponseBytes;
  limits.maxRequestBodyBytes = config.fetch.maxRequestBytes;
  return limits;
}

std::string base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const auto n = (static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i])) << 16) |
                   (static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8) |
                   static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i + 2]));
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += kAlphabet[n & 63];
  }
  const std::size_t left = bytes.size() - i;
  if (left > 0) {
    std::uint32_t n = static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i])) << 16;
    if (left == 2) n |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8;
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += left == 2 ? kAlphabet[(n >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::string> base64Decode(std::string_view text) {
  if (text.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    std::array<int, 4> v{};
    int padding = 0;
    for (std::size_t j = 0; j < 4; ++j) {
      const char c = text[i + j];
      if (c == '=' && last && j >= 2) {
        ++padding;
        v[j] = 0;
        continue;
      }
      if (padding > 0) return std::nullopt;  // data after padding
      v[j] = sextet(c);
      if (v[j] < 0) return std::nullopt;
    }
    const std::uint32_t n =
        (static_cast<std::uint32_t>(v[0]) << 18) | (static_cast<std::uint32_t>(v[1]) << 12) |
        (static_cast<std::uint32_t>(v[2]) << 6) | static_cast<std::uint32_t>(v[3]);
    out += static_cast<char>((n >> 16) & 0xff);
    if (padding < 2) out += static_cast<char>((n >> 8) & 0xff);
    if (padding < 1) out += static_cast<char>(n & 0xff);
    // Canonical form only: the bits padding drops must be zero.
    if (padding == 1 && (n & 0xff) != 0) return std::nullopt;
    if (padding == 2 && (n & 0xffff) != 0) return std::nullopt;
  }
  return out;
}

std::optional<std::string> privateRangeText(const policy::Destination& destination) {
  if (!destination.privateRange) return std::nullopt;
  const policy::AddressVerdict& verdict = *destination.privateRange;
  std::string text = verdict.range.empty() ? "a special-purpose range" : verdict.range;
  if (verdict.openedBy) {
    text += " (opened by [fetch] allow_private " + verdict.openedBy->toString() + ")";
  }
  return text;
}

bool mayPrompt(MediationServices& services, const policy::DecisionKey& key, bool requested) {
  if (!requested || services.approvals.approverCount() == 0) return false;
  auto stored = services.decisions.tryFind(key);
  return stored && !stored->has_value();
}

void auditRequest(policy::AuditLog& audit, const RequestRecord& record) {
  policy::AuditEntry entry;
  entry.kind = "request";
  entry.toolRevision = record.key.toolRevision;
  entry.toolName = record.toolName;
  entry.action = record.key.action;
  entry.target = record.key.target;
  entry.access = record.key.access;
  entry.verdict = "allow";
  if (record.scope) entry.scope = std::string(policy::scopeName(*record.scope));
  entry.reason = record.method.empty() ? record.outcome : record.method + ": " + record.outcome;
  entry.status = record.status;
  entry.bytes = record.bytes;
  entry.durationMs = record.duration.count();
  append(audit, std::move(entry));
}

void auditRefusal(policy::AuditLog& audit, const std::string& toolRevision,
                  const std::string& toolName, std::string_view action, std::string target,
                  std::optional<policy::AccessClass> access, std::string_view code) {
  policy::AuditEntry entry;
  entry.kind = "denial";
  entry.toolRevision = toolRevision;
  entry.toolName = toolName;
  entry.action = std::string(action);
  entry.target = std::move(target);
  entry.access = access;
  entry.verdict = "deny";
  entry.reason = "refused before authorization: " + std::string(code);
  append(audit, std::move(entry));
}

}  // namespace toolhost::daemon
