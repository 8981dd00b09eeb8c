#include "daemon/mediation.h"

#include "daemon/secrets_host.h"

#include <openssl/crypto.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <functional>
#include <map>

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

}  // namespace

policy::FetchLimits fetchLimits(const Config& config) {
  policy::FetchLimits limits;
  limits.timeout = config.fetch.timeout;
  limits.maxResponseBytes = config.fetch.maxResponseBytes;
  limits.maxRequestBodyBytes = config.fetch.maxRequestBytes;
  limits.maxBufferedBytes = config.fetch.maxBufferedBytes;
  limits.maxOwnerBufferedBytes = config.fetch.maxBufferedBytesPerTool;
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
  if (!record.secrets.empty()) {
    std::string names;
    for (const auto& name : record.secrets) names += (names.empty() ? "" : ", ") + name;
    entry.reason += " (secrets: " + names + ")";
  }
  entry.status = record.status;
  entry.bytes = record.bytes;
  entry.durationMs = record.duration.count();
  audit.append(std::move(entry));
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
  audit.append(std::move(entry));
}

// ---------------------------------------------------------------------------------------------
// secrets in a fetch

namespace {

// What a header value may carry (RFC 9110 field-vchar, SP, HTAB, obs-text): no CR, LF or other
// control characters, so a secret can never split a header.
bool fitsHeaderValue(std::string_view value) {
  return std::all_of(value.begin(), value.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u == '\t' || (u >= 0x20 && u != 0x7f);
  });
}

void wipe(std::string& text) {
  if (!text.empty()) OPENSSL_cleanse(text.data(), text.size());
  text.clear();
}

// One pass over the request's header values and body: every placeholder judged by the secrets
// host; with `rewrite` (which may be &request), revealed and replaced there.
boost::system::result<SubstitutedSecrets, runtime::HostOpFailure> walkSecrets(
    SecretsHost& host, const std::string& toolName, const std::string& revision,
    const policy::HttpRequest& request, policy::HttpRequest* rewrite) {
  const bool reveal = rewrite != nullptr;
  SubstitutedSecrets out;
  const std::string& origin = request.destination.origin;
  // Per placeholder and placement: the index of its value in out.values (or 0 unrevealed).
  std::map<std::pair<std::string, Placement>, std::size_t> judged;
  std::size_t placed = 0;  // placeholders in the request so far
  // Judges the placeholders in `text`; with reveal, writes it with values into `*target`.
  auto walk = [&](std::string_view text, std::string* target,
                  Placement placement) -> std::optional<runtime::HostOpFailure> {
    auto found = findPlaceholders(text);
    if (found.empty()) return std::nullopt;
    placed += found.size();
    if (placed > kMaxSecretPlaceholders) {
      return runtime::HostOpFailure{
          "request-too-large", "a request may carry at most " +
                                   std::to_string(kMaxSecretPlaceholders) +
                                   " secret placeholders; this one has more. Nothing was sent."};
    }
    std::string replaced;
    std::size_t copied = 0;
    for (const auto& at : found) {
      auto key = std::make_pair(std::string(at.token), placement);
      auto known = judged.find(key);
      if (known == judged.end()) {
        auto use = host.use(at.token, toolName, revision, origin, placement, reveal);
        if (!use) {
          wipe(replaced);
          return std::move(use.error());
        }
        if (placement == Placement::header && reveal && !fitsHeaderValue(use->value.view())) {
          wipe(replaced);
          return runtime::HostOpFailure{
              "secret-not-allowed",
              "the secret " + use->name +
                  " holds a line break or another control character, which a header value "
                  "cannot carry; nothing was sent"};
        }
        out.names.push_back(use->name);
        known = judged.emplace(std::move(key), out.values.size()).first;
        out.values.push_back(std::move(use->value));
      }
      if (target != nullptr) {
        replaced.append(text.substr(copied, at.offset - copied));
        replaced.append(out.values[known->second].view());
        copied = at.offset + at.token.size();
      }
    }
    if (target != nullptr) {
      replaced.append(text.substr(copied));
      *target = std::move(replaced);  // `text` (the placeholders) is not used after this
    }
    return std::nullopt;
  };
  // A refusal after some values went in: wipe them, the request is dropped.
  auto refuse = [&](runtime::HostOpFailure failure) {
    if (reveal) {
      for (auto& header : rewrite->headers) wipe(header.second);
      wipe(rewrite->body);
    }
    return failure;
  };
  for (std::size_t i = 0; i < request.headers.size(); ++i) {
    std::string* target = reveal ? &rewrite->headers[i].second : nullptr;
    if (auto failed = walk(request.headers[i].second, target, Placement::header)) {
      return refuse(std::move(*failed));
    }
  }
  if (auto failed = walk(request.body, reveal ? &rewrite->body : nullptr, Placement::body)) {
    return refuse(std::move(*failed));
  }
  std::sort(out.names.begin(), out.names.end());
  out.names.erase(std::unique(out.names.begin(), out.names.end()), out.names.end());
  if (!reveal) out.values.clear();
  return out;
}

char asciiLower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

// Rebuilds `text` with every match of `value` that `next(from)` finds (the start of the next
// match at or after `from`, or text.end()) written as kRedacted: one pass, since replacing in
// place moves the rest of the text at each match (a 15 MB response full of the value took 98 s,
// on the I/O thread). The old buffer, which held the value, is wiped.
template <typename FindNext>
void redactMatches(std::string& text, std::size_t length, FindNext next) {
  auto found = next(text.cbegin());
  if (found == text.cend()) return;
  std::string out;
  out.reserve(text.size());
  auto copied = text.cbegin();
  while (found != text.cend()) {
    out.append(copied, found);
    out.append(kRedacted);
    copied = found + static_cast<std::ptrdiff_t>(length);
    found = next(copied);
  }
  out.append(copied, text.cend());
  wipe(text);
  text = std::move(out);
}

// Like redactIn, with ASCII letters compared without case: header names reach the tool
// lowercased, so a value echoed in one no longer matches exactly. No lowered copy of the value
// is made (it would outlive the SecretValue's wipe).
void redactInFolded(std::string& text, std::string_view value) {
  if (value.empty() || text.size() < value.size()) return;
  const auto last = text.cend() - static_cast<std::ptrdiff_t>(value.size());
  redactMatches(text, value.size(), [&](std::string::const_iterator from) {
    for (auto at = from; at <= last; ++at) {
      std::size_t i = 0;
      while (i < value.size() &&
             asciiLower(at[static_cast<std::ptrdiff_t>(i)]) == asciiLower(value[i])) {
        ++i;
      }
      if (i == value.size()) return at;
    }
    return text.cend();
  });
}

void redactIn(std::string& text, std::string_view value) {
  if (value.empty() || text.size() < value.size()) return;
  const std::boyer_moore_horspool_searcher searcher(value.begin(), value.end());
  redactMatches(text, value.size(), [&](std::string::const_iterator from) {
    return std::search(from, text.cend(), searcher);
  });
}

bool isBlank(char c) { return c == ' ' || c == '\t'; }

// The values to redact, longer first, so that a value containing another is redacted whole.
// Each also without its leading, trailing or surrounding spaces and tabs, as it went out when it
// began or ended a header value (header values are sent trimmed).
std::vector<std::string_view> longestFirst(const SubstitutedSecrets& secrets) {
  std::vector<std::string_view> values;
  for (const auto& secret : secrets.values) {
    const std::string_view value = secret.view();
    std::size_t first = 0;
    while (first < value.size() && isBlank(value[first])) ++first;
    std::size_t end = value.size();
    while (end > first && isBlank(value[end - 1])) --end;
    for (auto variant :
         {value, value.substr(first), value.substr(0, end), value.substr(first, end - first)}) {
      if (!variant.empty() && std::find(values.begin(), values.end(), variant) == values.end()) {
        values.push_back(variant);
      }
    }
  }
  std::sort(values.begin(), values.end(),
            [](std::string_view a, std::string_view b) { return a.size() > b.size(); });
  return values;
}

}  // namespace

std::optional<runtime::HostOpFailure> checkSecrets(MediationServices& services,
                                                   const std::string& toolName,
                                                   const std::string& revision,
                                                   std::string_view url,
                                                   const policy::HttpRequest& request) {
  if (mentionsPlaceholder(url) || mentionsPlaceholder(request.destination.pathAndQuery)) {
    return runtime::HostOpFailure{
        "secret-not-allowed",
        "secrets may not be placed in URLs (they end up in logs and histories); send them in a "
        "header. Nothing was sent."};
  }
  if (services.secrets == nullptr) return std::nullopt;
  auto judged = walkSecrets(*services.secrets, toolName, revision, request, nullptr);
  if (!judged) return std::move(judged.error());
  return std::nullopt;
}

boost::system::result<SubstitutedSecrets, runtime::HostOpFailure> substituteSecrets(
    MediationServices& services, const std::string& toolName, const std::string& revision,
    policy::HttpRequest& request) {
  if (services.secrets == nullptr) return SubstitutedSecrets{};
  return walkSecrets(*services.secrets, toolName, revision, request, &request);
}

bool carriesSecret(const SubstitutedSecrets& secrets, std::string_view url) {
  if (secrets.values.empty()) return false;
  auto lower = [](std::string text) {
    for (char& c : text) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    return text;
  };
  auto decoded = [](std::string_view text, bool plusIsSpace) {
    std::string out;
    out.reserve(text.size());
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    for (std::size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '%' && i + 2 < text.size() && hex(text[i + 1]) >= 0 && hex(text[i + 2]) >= 0) {
        out += static_cast<char>(hex(text[i + 1]) * 16 + hex(text[i + 2]));
        i += 2;
      } else {
        out += plusIsSpace && text[i] == '+' ? ' ' : text[i];
      }
    }
    return out;
  };
  // Decoded again and again (a URL inside a query parameter is encoded twice), a few times.
  std::vector<std::string> forms{lower(std::string(url))};
  for (const bool plusIsSpace : {false, true}) {
    std::string form(url);
    for (int round = 0; round < 4; ++round) {
      std::string next = decoded(form, plusIsSpace);
      if (next == form) break;
      form = std::move(next);
      forms.push_back(lower(form));
    }
  }
  for (auto value : longestFirst(secrets)) {
    const std::string needle = lower(std::string(value));
    for (const auto& form : forms) {
      if (form.find(needle) != std::string::npos) return true;
    }
  }
  return false;
}

void redactSecrets(const SubstitutedSecrets& secrets, std::string& text) {
  for (auto value : longestFirst(secrets)) redactIn(text, value);
}

void redactSecrets(const SubstitutedSecrets& secrets, policy::HttpResponse& response) {
  if (secrets.values.empty()) return;
  const auto values = longestFirst(secrets);
  const std::size_t bodySize = response.body.size();
  for (auto value : values) {
    redactIn(response.statusText, value);
    redactIn(response.body, value);
  }
  for (auto& [name, text] : response.headers) {
    for (auto value : values) {
      redactInFolded(name, value);
      redactIn(text, value);
    }
  }
  // A Content-Length left as it was would tell the tool how long the redacted values were.
  if (response.body.size() != bodySize) {
    for (auto& [name, text] : response.headers) {
      if (name == "content-length") text = std::to_string(response.body.size());
    }
  }
}

}  // namespace toolhost::daemon
