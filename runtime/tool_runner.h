// What the daemon runs sandboxed JavaScript tools through: SandboxPool (V8 in this process) or
// ProcessSandboxPool (V8 in supervised sandbox host processes, so a tool that crashes or stalls
// V8 costs a process, never the daemon). Every method may be called from any thread; call() is
// awaited from a coroutine on any executor and honours its terminal cancellation.
#pragma once

#include "registry/registry.h"
#include "runtime/call_outcome.h"
#include "runtime/limits.h"

#include <boost/asio/awaitable.hpp>
#include <boost/json/object.hpp>
#include <boost/system/result.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace toolhost::runtime {

struct SandboxInfo {
  std::string revision;
  std::string name;
  std::uint64_t calls = 0;      // calls this sandbox has run
  std::uint64_t heapBytes = 0;  // heap (plus ArrayBuffer bytes) measured after its last call
  std::int64_t idleMs = 0;      // since its last call ended; 0 while busy
  bool busy = false;            // a call is running or waiting for it
};

class ToolRunner {
 public:
  virtual ~ToolRunner() = default;

  // Runs the tool's default export with `arguments` (already validated against its parameters)
  // in its retained sandbox, or in a fresh one for Mode::disposable (or when the request tightens
  // heapMb or arrayBufferMb below what the retained sandbox was built with). Expected failures
  // are CallErrors; an exception means a bug.
  virtual boost::asio::awaitable<CallOutcome> call(registry::ToolRevisionPtr tool,
                                                   boost::json::object arguments,
                                                   CallOptions options) = 0;

  // Each retained sandbox, least recently used first.
  virtual std::vector<SandboxInfo> list() const = 0;
  // Ends the retained sandbox of `revision`: a running call ends with CallErrc::cancelled, the
  // isolate is disposed; calls waiting for it run in fresh sandboxes. False if there was none.
  virtual bool terminate(const std::string& revision) = 0;
  // The binding moved away from `revision`: its sandbox is no longer retained. Calls holding it
  // (running or waiting) finish in it, one at a time as ever, and so do calls of the revision
  // that come meanwhile; the isolate is disposed after the last of them.
  virtual void discard(const std::string& revision) = 0;

  virtual const RuntimeConfig& config() const = 0;
};

// What every runner decides before a call runs: the tool is sandboxed JavaScript with a source,
// and the limits it runs under. Any thread.
struct Admission {
  EffectiveLimits base;     // what a retained sandbox of the revision is built with
  EffectiveLimits limits;   // what this call runs under
  bool ownSandbox = false;  // disposable, or tighter heap/ArrayBuffer limits than `base`
  bool agentCode = false;   // CallOptions::agentCode
};
// notRunnable or invalidLimits, with a sentence, when the call cannot run.
boost::system::result<Admission, CallError> admitCall(const registry::ToolRevision& tool,
                                                      const CallOptions& options,
                                                      const RuntimeConfig& config);

}  // namespace toolhost::runtime
