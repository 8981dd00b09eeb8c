// What one sandboxed call asks for and what it ends with: options, usage and the typed error
// codes the daemon maps to JSON-RPC errors. Plain data; any thread.
#pragma once

#include "runtime/limits.h"

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <boost/system/result.hpp>

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace toolhost::runtime {

enum class CallErrc {
  timeout,           // the wall-clock limit, or a promise that can never settle
  cpuLimit,          // thread CPU time
  memoryLimit,       // the V8 heap
  arrayBufferLimit,  // ArrayBuffer bytes
  stackLimit,        // JavaScript stack depth (an uncaught stack overflow)
  outputTooLarge,    // the result's JSON text is over outputBytes
  toolThrew,         // the tool threw or its promise rejected; toolError says what
  invalidResult,     // the result is not JSON data (proxy, function, cycle, BigInt, NaN, ...)
  invalidModule,     // the source does not compile, import, evaluate, or export a function
  invalidLimits,     // the request loosens a limit, or a limit is not a positive integer
  cancelled,         // the caller cancelled, an admin terminated the sandbox, or shutdown
  overloaded,        // too many calls are waiting
  notRunnable,       // not sandboxed JavaScript (another execution class, or no source)
  sandboxCrashed,    // the sandbox process ended unexpectedly (V8 aborted, killed from outside,
                     // or killed because another call in it did not stop), or keeps crashing
};

// A stable word per code ("timeout", "cpu-limit", ...), for error.data.kind and logs.
std::string_view callErrcName(CallErrc code);

// The call went past one of its limits of time or memory (wall clock, CPU, heap, ArrayBuffer
// bytes, stack depth).
constexpr bool isLimitErrc(CallErrc code) {
  return code == CallErrc::timeout || code == CallErrc::cpuLimit || code == CallErrc::memoryLimit ||
         code == CallErrc::arrayBufferLimit || code == CallErrc::stackLimit;
}

struct CallError {
  CallErrc code;
  std::string detail;             // a sentence a tool author or caller can act on
  boost::json::object toolError;  // {name, message, stack[, code]} of a thrown JS value, if any
};

// "timeout: the call exceeded ..." (for logs and test output).
inline std::ostream& operator<<(std::ostream& out, const CallError& error) {
  return out << callErrcName(error.code) << ": " << error.detail;
}

struct CallUsage {
  std::int64_t wallMs = 0;          // from acquiring the sandbox to the end of the call
  std::int64_t cpuMs = 0;           // thread CPU time spent in the tool's JavaScript
  std::uint64_t heapPeakBytes = 0;  // highest V8 heap use seen, plus ArrayBuffer bytes at peak
  bool freshSandbox = false;        // the call built a new isolate (first call, or disposable)
};

struct CallOutcome {
  boost::system::result<boost::json::value, CallError> result{boost::json::value()};
  CallUsage usage;
  std::string revision;  // the revision that ran
  std::string logs;      // console output, one "[level] text" line each, bounded
};

struct CallOptions {
  enum class Mode { retained, disposable };
  Mode mode = Mode::retained;
  CallLimits limits;               // may only tighten the manifest's limits
  boost::json::object invocation;  // e.g. {taskId}; handed to the CapabilityHost, not to JS
  // The tool's settings for this call (ctx.settings, deep-frozen; null when there are none),
  // and their settings revision, by which a sandbox keeps the values it made from them.
  std::string settingsRevision;
  std::shared_ptr<const boost::json::object> settings;
  // Only compile and link the tool's modules (imports resolved, no top-level await): no tool
  // code runs, and the call's value is null. How tools.install checks a source before storing
  // it; use with Mode::disposable.
  bool checkOnly = false;
  // Code an agent wrote (a lineage's code definition), not a tool an admin installed: a
  // ProcessSandboxPool runs it in a sandbox process of its own, so that it never shares workers,
  // memory budget or crashes with installed tools. Use with Mode::disposable.
  bool agentCode = false;

  // For whoever hosts a SandboxPool (the sandbox host process); it reaches neither JavaScript
  // nor the CapabilityHost: a number of the caller's choosing that SandboxPool::stalled() reports.
  std::uint64_t tag = 0;
};

}  // namespace toolhost::runtime
