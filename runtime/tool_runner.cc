#include "runtime/tool_runner.h"

namespace toolhost::runtime {
namespace json = boost::json;

boost::system::result<Admission, CallError> admitCall(const registry::ToolRevision& tool,
                                                      const CallOptions& options,
                                                      const RuntimeConfig& config) {
  const json::object& manifest = tool.manifest;
  const auto* execution = manifest.if_contains("execution");
  const json::value* source = nullptr;
  bool javascript = false;
  if (execution != nullptr && execution->is_object()) {
    source = execution->as_object().if_contains("source");
    const auto* runtimeName = execution->as_object().if_contains("runtime");
    javascript = runtimeName != nullptr && runtimeName->is_string() &&
                 runtimeName->as_string() == "javascript";
  }
  if (tool.executionClass != registry::ExecutionClass::sandboxedCode || !javascript ||
      source == nullptr || !source->is_string() || source->as_string().empty()) {
    return CallError{
        CallErrc::notRunnable,
        "tool " + tool.name + " is not sandboxed JavaScript; the V8 runtime cannot run it",
        {}};
  }
  auto base = baseLimits(manifest, config);
  if (!base) return CallError{CallErrc::invalidLimits, base.error(), {}};
  auto limits = effectiveLimits(manifest, options.limits, config);
  if (!limits) return CallError{CallErrc::invalidLimits, limits.error(), {}};
  Admission admission{*base, *limits, false};
  // A tighter heap or ArrayBuffer limit than the retained sandbox was built with cannot be
  // applied to it: such a call gets a sandbox of its own.
  admission.agentCode = options.agentCode;
  admission.ownSandbox = options.mode == CallOptions::Mode::disposable ||
                         limits->heapMb < base->heapMb ||
                         limits->arrayBufferMb < base->arrayBufferMb;
  return admission;
}

}  // namespace toolhost::runtime
