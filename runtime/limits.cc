#include "runtime/limits.h"

#include <algorithm>
#include <array>
#include <limits>
#include <stdexcept>

namespace toolhost::runtime {
namespace json = boost::json;

namespace {

struct Field {
  const char* name;
  const char* capKey;  // in the daemon's config file
  std::optional<std::int64_t> CallLimits::*request;
  std::int64_t EffectiveLimits::*effective;
};

constexpr std::array<Field, 6> kFields{{
    {"wallMs", "max_wall_ms", &CallLimits::wallMs, &EffectiveLimits::wallMs},
    {"cpuMs", "max_cpu_ms", &CallLimits::cpuMs, &EffectiveLimits::cpuMs},
    {"heapMb", "max_heap_mb", &CallLimits::heapMb, &EffectiveLimits::heapMb},
    {"arrayBufferMb", "max_array_buffer_mb", &CallLimits::arrayBufferMb,
     &EffectiveLimits::arrayBufferMb},
    {"stackKb", "max_stack_kb", &CallLimits::stackKb, &EffectiveLimits::stackKb},
    {"outputBytes", "max_output_bytes", &CallLimits::outputBytes, &EffectiveLimits::outputBytes},
}};

// The daemon's built-in values, for a configuration that leaves a default or cap unset.
const RuntimeConfig kBuiltIn{};

std::int64_t configured(const CallLimits& limits, const CallLimits& builtIn, const Field& field) {
  const auto& value = limits.*field.request;
  return value && *value > 0 ? *value : *(builtIn.*field.request);
}

// The manifest's `limits.<name>`, if it has one.
boost::system::result<std::optional<std::int64_t>, std::string> manifestLimit(
    const json::object& manifest, const char* name) {
  const auto* limits = manifest.if_contains("limits");
  if (limits == nullptr || !limits->is_object()) return std::optional<std::int64_t>();
  const auto* value = limits->as_object().if_contains(name);
  if (value == nullptr) return std::optional<std::int64_t>();
  if (value->is_int64() && value->as_int64() > 0) return std::optional(value->as_int64());
  if (value->is_uint64()) return std::optional(std::numeric_limits<std::int64_t>::max());
  return std::string("the tool's manifest limits.") + name + " is not a positive integer";
}

}  // namespace

void checkRuntimeConfig(const RuntimeConfig& config) {
  if (config.workers == 0) throw std::invalid_argument("[runtime] workers must be at least 1");
  if (config.processes == 0) throw std::invalid_argument("[runtime] processes must be at least 1");
  const std::int64_t stackCap = config.caps.stackKb.value_or(4096);
  if (static_cast<std::int64_t>(config.workerStackMb) * 1024 < stackCap + 1024) {
    throw std::invalid_argument(
        "[runtime] the worker stack must exceed the largest stack limit by at least 1 MiB");
  }
  if (config.killGraceMs <= 0)
    throw std::invalid_argument("[runtime] kill_grace_ms must be positive");
}

boost::system::result<EffectiveLimits, std::string> baseLimits(const json::object& manifest,
                                                               const RuntimeConfig& config) {
  EffectiveLimits out;
  for (const auto& field : kFields) {
    auto fromManifest = manifestLimit(manifest, field.name);
    if (!fromManifest) return fromManifest.error();
    const std::int64_t cap = configured(config.caps, kBuiltIn.caps, field);
    const std::int64_t base =
        fromManifest->value_or(configured(config.defaults, kBuiltIn.defaults, field));
    out.*field.effective = std::min(base, cap);
  }
  return out;
}

boost::system::result<EffectiveLimits, std::string> effectiveLimits(const json::object& manifest,
                                                                    const CallLimits& request,
                                                                    const RuntimeConfig& config) {
  auto base = baseLimits(manifest, config);
  if (!base) return base;
  EffectiveLimits out = *base;
  for (const auto& field : kFields) {
    const auto& asked = request.*field.request;
    if (!asked) continue;
    if (*asked <= 0) {
      return std::string("limits.") + field.name + ": " + std::to_string(*asked) +
             " is not a positive integer";
    }
    if (*asked > out.*field.effective) {
      return std::string("limits.") + field.name + ": " + std::to_string(*asked) +
             " is looser than the tool's " + std::to_string(out.*field.effective) +
             capNote(manifest, field.name, {}, config) +
             "; a call may only tighten a tool's limits";
    }
    out.*field.effective = *asked;
  }
  return out;
}

std::string capNote(const json::object& manifest, std::string_view field, const CallLimits& request,
                    const RuntimeConfig& config) {
  for (const auto& entry : kFields) {
    if (field != entry.name) continue;
    const std::int64_t cap = configured(config.caps, kBuiltIn.caps, entry);
    const auto asked = (request.*entry.request);
    if (asked && *asked <= cap) return {};  // the caller's own limit
    auto fromManifest = manifestLimit(manifest, entry.name);
    if (!fromManifest) return {};
    const std::string capped = ", which the daemon's [runtime] " + std::string(entry.capKey) +
                               " caps at " + std::to_string(cap);
    if (*fromManifest) {
      if (**fromManifest <= cap) return {};
      return "; the tool's manifest asks for " + std::to_string(**fromManifest) + capped;
    }
    // The manifest says nothing: the default, which the config may leave at the built-in one.
    const std::int64_t fallback = configured(config.defaults, kBuiltIn.defaults, entry);
    if (fallback <= cap) return {};
    return "; the tool's manifest sets no " + std::string(entry.name) + ", and the default is " +
           std::to_string(fallback) + capped;
  }
  return {};
}

}  // namespace toolhost::runtime
