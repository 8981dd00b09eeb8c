#include "runtime/sandbox_protocol.h"

#include "runtime/call_state.h"
#include "runtime/json_bridge.h"

#include <algorithm>
#include <array>
#include <utility>

namespace toolhost::runtime::ipc {
namespace json = boost::json;

namespace {

constexpr std::array<std::pair<const char*, std::optional<std::int64_t> CallLimits::*>, 6>
    kLimitFields{{
        {"wallMs", &CallLimits::wallMs},
        {"cpuMs", &CallLimits::cpuMs},
        {"heapMb", &CallLimits::heapMb},
        {"arrayBufferMb", &CallLimits::arrayBufferMb},
        {"stackKb", &CallLimits::stackKb},
        {"outputBytes", &CallLimits::outputBytes},
    }};

constexpr std::array kErrcs{
    CallErrc::timeout,          CallErrc::cpuLimit,       CallErrc::memoryLimit,
    CallErrc::arrayBufferLimit, CallErrc::stackLimit,     CallErrc::outputTooLarge,
    CallErrc::toolThrew,        CallErrc::invalidResult,  CallErrc::invalidModule,
    CallErrc::invalidLimits,    CallErrc::cancelled,      CallErrc::overloaded,
    CallErrc::notRunnable,      CallErrc::sandboxCrashed,
};

constexpr std::array<std::pair<Kill, const char*>, 5> kKills{{
    {Kill::timeout, "timeout"},
    {Kill::cpuLimit, "cpu-limit"},
    {Kill::memoryLimit, "memory-limit"},
    {Kill::arrayBufferLimit, "array-buffer-limit"},
    {Kill::cancelled, "cancelled"},
}};

template <typename T>
T number(const json::object& json, std::string_view name) {
  try {
    return field(json, name).to_number<T>();
  } catch (const std::exception&) {
    throw ProtocolError("\"" + std::string(name) + "\" is not a number in range");
  }
}

bool boolField(const json::object& json, std::string_view name) {
  const auto& value = field(json, name);
  if (!value.is_bool()) throw ProtocolError("\"" + std::string(name) + "\" is not a boolean");
  return value.get_bool();
}

}  // namespace

std::size_t maxMessageDepth(const RuntimeConfig& config) {
  return std::max<std::size_t>(256, config.maxResultDepth + 16);
}

std::size_t maxMessageBytes(const RuntimeConfig& config) {
  const auto output =
      static_cast<std::size_t>(std::max<std::int64_t>(config.caps.outputBytes.value_or(0), 0));
  const std::size_t largest = std::max(output, kMaxOutstandingRequestBytes);
  return std::min(kMaxMessageBytes, 2 * largest + (std::size_t{16} << 20));
}

std::size_t maxMessageValues(const RuntimeConfig& config) {
  // A row is a handful of values; a host reports at most maxRetained + its calls + 1024 of them
  // before the daemon takes it for broken (process_sandbox_pool.cc).
  return kMaxJsonValues + 16 * (config.maxRetained + 1024) + (std::size_t{1} << 20);
}

const json::value& field(const json::object& message, std::string_view name) {
  const auto* value = message.if_contains(name);
  if (value == nullptr) throw ProtocolError("the message has no \"" + std::string(name) + "\"");
  return *value;
}

std::uint64_t uintField(const json::object& message, std::string_view name) {
  return number<std::uint64_t>(message, name);
}

std::string stringField(const json::object& message, std::string_view name) {
  const auto& value = field(message, name);
  if (!value.is_string()) throw ProtocolError("\"" + std::string(name) + "\" is not a string");
  return std::string(value.get_string());
}

const json::object& objectField(const json::object& message, std::string_view name) {
  const auto& value = field(message, name);
  if (!value.is_object()) throw ProtocolError("\"" + std::string(name) + "\" is not an object");
  return value.get_object();
}

json::object limitsToJson(const CallLimits& limits) {
  json::object out;
  for (const auto& [name, member] : kLimitFields) {
    if (const auto& value = limits.*member) out[name] = *value;
  }
  return out;
}

CallLimits limitsFromJson(const json::object& json) {
  CallLimits out;
  for (const auto& [name, member] : kLimitFields) {
    if (json.contains(name)) out.*member = number<std::int64_t>(json, name);
  }
  return out;
}

json::object configToJson(const RuntimeConfig& config) {
  return json::object{
      {"workers", config.workers},
      {"maxRetained", config.maxRetained},
      {"memoryBudgetMb", config.memoryBudgetMb},
      {"maxQueuedPerSandbox", config.maxQueuedPerSandbox},
      {"maxQueuedTotal", config.maxQueuedTotal},
      {"maxResultDepth", config.maxResultDepth},
      {"maxLogBytes", config.maxLogBytes},
      {"workerStackMb", config.workerStackMb},
      {"prewarmed", config.prewarmed},
      {"jit", config.jit},
      {"defaults", limitsToJson(config.defaults)},
      {"caps", limitsToJson(config.caps)},
      {"processes", config.processes},
      {"killGraceMs", config.killGraceMs},
      {"maxRestarts", config.maxRestarts},
      {"restartWindowMs", config.restartWindowMs},
  };
}

RuntimeConfig configFromJson(const json::object& json) {
  RuntimeConfig out;
  out.workers = number<unsigned>(json, "workers");
  out.maxRetained = number<std::size_t>(json, "maxRetained");
  out.memoryBudgetMb = number<std::size_t>(json, "memoryBudgetMb");
  out.maxQueuedPerSandbox = number<std::size_t>(json, "maxQueuedPerSandbox");
  out.maxQueuedTotal = number<std::size_t>(json, "maxQueuedTotal");
  out.maxResultDepth = number<std::size_t>(json, "maxResultDepth");
  out.maxLogBytes = number<std::size_t>(json, "maxLogBytes");
  out.workerStackMb = number<std::size_t>(json, "workerStackMb");
  out.prewarmed = number<unsigned>(json, "prewarmed");
  const auto& jit = field(json, "jit");
  if (!jit.is_bool()) throw ProtocolError("\"jit\" is not a boolean");
  out.jit = jit.get_bool();
  out.defaults = limitsFromJson(objectField(json, "defaults"));
  out.caps = limitsFromJson(objectField(json, "caps"));
  out.processes = number<unsigned>(json, "processes");
  out.killGraceMs = number<std::int64_t>(json, "killGraceMs");
  out.maxRestarts = number<unsigned>(json, "maxRestarts");
  out.restartWindowMs = number<std::int64_t>(json, "restartWindowMs");
  return out;
}

json::object toolToJson(const registry::ToolRevision& tool) {
  json::object out{{"revision", tool.revision},
                   {"name", tool.name},
                   {"manifest", tool.manifest},
                   {"installedAt", tool.installedAt},
                   {"executionClass", registry::executionClassName(tool.executionClass)}};
  if (tool.agentDefined) out["agentDefined"] = true;
  return out;
}

registry::ToolRevisionPtr toolFromJson(const json::object& json) {
  auto tool = std::make_shared<registry::ToolRevision>();
  tool->revision = stringField(json, "revision");
  tool->name = stringField(json, "name");
  tool->manifest = objectField(json, "manifest");
  tool->installedAt = stringField(json, "installedAt");
  if (const auto* defined = json.if_contains("agentDefined")) {
    if (!defined->is_bool()) throw ProtocolError("agentDefined is not a boolean");
    tool->agentDefined = defined->get_bool();
  }
  const std::string executionClass = stringField(json, "executionClass");
  using registry::ExecutionClass;
  bool known = false;
  for (auto candidate : {ExecutionClass::sandboxedCode, ExecutionClass::externalService,
                         ExecutionClass::trustedNative}) {
    if (registry::executionClassName(candidate) == executionClass) {
      tool->executionClass = candidate;
      known = true;
    }
  }
  if (!known) throw ProtocolError("unknown execution class \"" + executionClass + "\"");
  return tool;
}

json::object outcomeToJson(CallOutcome&& outcome) {
  json::object out{{"revision", outcome.revision},
                   {"logs", std::move(outcome.logs)},
                   {"usage", json::object{{"wallMs", outcome.usage.wallMs},
                                          {"cpuMs", outcome.usage.cpuMs},
                                          {"heapPeakBytes", outcome.usage.heapPeakBytes},
                                          {"freshSandbox", outcome.usage.freshSandbox}}}};
  if (outcome.result) {
    out["value"] = std::move(*outcome.result);
  } else {
    const CallError& error = outcome.result.error();
    json::object described{{"code", callErrcName(error.code)}, {"detail", error.detail}};
    if (!error.toolError.empty()) described["toolError"] = error.toolError;
    out["error"] = std::move(described);
  }
  return out;
}

CallOutcome outcomeFromJson(json::object&& json) {
  CallOutcome out;
  out.revision = stringField(json, "revision");
  out.logs = stringField(json, "logs");
  const auto& usage = objectField(json, "usage");
  out.usage.wallMs = number<std::int64_t>(usage, "wallMs");
  out.usage.cpuMs = number<std::int64_t>(usage, "cpuMs");
  out.usage.heapPeakBytes = number<std::uint64_t>(usage, "heapPeakBytes");
  out.usage.freshSandbox = boolField(usage, "freshSandbox");
  if (const auto* error = json.if_contains("error")) {
    if (!error->is_object()) throw ProtocolError("\"error\" is not an object");
    const auto& described = error->get_object();
    const std::string name = stringField(described, "code");
    auto code = callErrcFromName(name);
    if (!code) throw ProtocolError("unknown error code \"" + name + "\"");
    CallError failure{*code, stringField(described, "detail"), {}};
    if (described.contains("toolError")) failure.toolError = objectField(described, "toolError");
    out.result = std::move(failure);
  } else {
    field(json, "value");  // present, or the protocol is broken
    out.result = std::move(json["value"]);
  }
  return out;
}

json::object infoToJson(const SandboxInfo& info) {
  json::object out{{"revision", info.revision}, {"name", info.name}};
  for (auto& member : ownRowToJson(info)) out.emplace(member.key(), std::move(member.value()));
  return out;
}

SandboxInfo infoFromJson(const json::object& json) {
  SandboxInfo info;
  info.revision = stringField(json, "revision");
  info.name = stringField(json, "name");
  readOwnRow(json, info);
  return info;
}

json::object ownRowToJson(const SandboxInfo& info) {
  return json::object{{"calls", info.calls},
                      {"heapBytes", info.heapBytes},
                      {"idleMs", info.idleMs},
                      {"busy", info.busy}};
}

void readOwnRow(const json::object& json, SandboxInfo& info) {
  info.calls = number<std::uint64_t>(json, "calls");
  info.heapBytes = number<std::uint64_t>(json, "heapBytes");
  info.idleMs = number<std::int64_t>(json, "idleMs");
  // The daemon subtracts it from its clock: an honest host's sandboxes are younger than it.
  if (info.idleMs < 0 || info.idleMs > kMaxIdleMs) {
    throw ProtocolError("\"idleMs\" is out of range");
  }
  info.busy = boolField(json, "busy");
}

json::object changesToJson(const SandboxPool::Changes& changes) {
  if (changes.updated.empty() && changes.removed.empty()) return {};
  json::array updated;
  updated.reserve(changes.updated.size());
  for (const auto& info : changes.updated) updated.push_back(infoToJson(info));
  json::array removed;
  removed.reserve(changes.removed.size());
  for (const auto& revision : changes.removed) removed.push_back(json::string(revision));
  return json::object{{"updated", std::move(updated)}, {"removed", std::move(removed)}};
}

SandboxPool::Changes changesFromJson(const json::object& json) {
  SandboxPool::Changes out;
  const auto& updated = field(json, "updated");
  const auto& removed = field(json, "removed");
  if (!updated.is_array() || !removed.is_array()) {
    throw ProtocolError("\"updated\" or \"removed\" is not an array");
  }
  for (const auto& info : updated.get_array()) {
    if (!info.is_object()) throw ProtocolError("a sandbox is not an object");
    out.updated.push_back(infoFromJson(info.get_object()));
  }
  for (const auto& revision : removed.get_array()) {
    if (!revision.is_string()) throw ProtocolError("a removed revision is not a string");
    out.removed.emplace_back(revision.get_string());
  }
  return out;
}

std::optional<CallErrc> callErrcFromName(std::string_view name) {
  for (auto code : kErrcs) {
    if (callErrcName(code) == name) return code;
  }
  return std::nullopt;
}

std::string_view killName(Kill reason) {
  for (const auto& [kill, name] : kKills) {
    if (kill == reason) return name;
  }
  return "none";
}

std::optional<Kill> killFromName(std::string_view name) {
  for (const auto& [kill, text] : kKills) {
    if (text == name) return kill;
  }
  return std::nullopt;
}

}  // namespace toolhost::runtime::ipc
