// Runs sandboxed JavaScript tools in supervised sandbox host processes (runtime/sandbox_host.h),
// so that whatever a tool does to V8 (a fatal error that aborts, a builtin looping in C++ past
// every limit) costs a process the daemon restarts, never the daemon. [runtime] processes host
// processes, each with its own SandboxPool of [runtime] workers V8 threads; a revision always
// goes to the same process (a stable hash of the revision), so its retained sandbox is found
// again. Messages: runtime/sandbox_protocol.h. Every method may be called from any thread.
//
// Caveats:
//  - The I/O with the host processes runs on the executor given to the constructor (the daemon's
//    io_context; never blocked). Requests from sandboxes to the CapabilityHost (startOperation)
//    and the hosts' abort functions run on two threads of the pool's own, so a host that blocks
//    briefly (an LMDB read) never holds up the I/O; quick requests (resolveInvocation,
//    createSubtasks, which read task lineages of up to 100,000 tasks) on a third, so that a long
//    lineage delays only other quick requests.
//  - A host process ends unexpectedly (V8 aborted, killed from outside, a protocol error): each of
//    its calls ends at once with CallErrc::sandboxCrashed (cancelled if its caller had cancelled
//    it), their host operations are aborted, and the process is started again on the next call
//    for it. After [runtime] max_restarts such ends within restart_window_ms, calls for it fail
//    fast with sandboxCrashed until the oldest of those ends leaves the window.
//  - A call told to stop (wall clock, CPU, heap, cancel) whose thread is still inside V8
//    kill_grace_ms later is stuck in a builtin: its host reports it and is killed (SIGKILL); that
//    call ends with its limit's code ("...; its sandbox process was killed"), the others of that
//    process with sandboxCrashed. As a backstop the daemon also keeps each started call's wall
//    clock (wallMs plus the pauses its own HostOperations granted, plus the grace) and, once one
//    is past it, pings the process: no answer within the grace, and the process is killed. The
//    host's own report is what normally decides: a call starved of a V8 thread by other busy
//    calls is late without being stuck, and must not cost them their process.
//  - A cancel must be answered within twice kill_grace_ms plus a second: an honest host answers
//    a call not inside V8 at once and stops one that is (or reports it stalled) within the grace.
//    A host past that holds the call, as only one taken over would: it is killed, the call ends
//    cancelled, the others of that process with sandboxCrashed. A result also ends whatever
//    host operations of its call the host did not abort.
//  - Memory: no RLIMIT_AS on the hosts (V8 reserves large virtual ranges up front, so an address
//    space limit would break ordinary isolates); V8's heap limits bound ordinary growth, and a
//    builtin that grows without checking is ended by the kill above, within its wall limit plus
//    the grace.
//  - list(), terminate() and discard() answer at once: each process sends the changes to its
//    retained sandboxes with every result and after every terminate or discard, and list() merges
//    the list those rebuild with the calls in flight (busy; a revision whose first call is still
//    running shows with 0 calls).
//  - CallOptions::tag is the pool's own business here and is ignored.
//  - Destroy the pool before the executor it was given and before the CapabilityHost: the
//    destructor ends every call (cancelled), aborts their operations, kills and reaps every
//    process.
#pragma once

#include "registry/registry.h"
#include "runtime/call_outcome.h"
#include "runtime/capability_host.h"
#include "runtime/limits.h"
#include "runtime/tool_runner.h"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/json/object.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace toolhost::runtime {

// How to start a sandbox host: execve(executable, {argv0, arguments...}) with the socket on fd 3,
// stdin on /dev/null, stdout on stderr, a minimal environment (TZ, LANG, LC_ALL and the
// sanitizers' options, when set) and a process group of its own (a terminal's ^C reaches the
// daemon, which then ends the hosts itself). argv0 is `executable`, or the daemon's real path
// when that is "/proc/self/exe" (so `ps` shows "toolhostd --sandbox-host").
struct SandboxLaunch {
  std::string executable;              // e.g. "/proc/self/exe" (the daemon re-executes itself)
  std::vector<std::string> arguments;  // e.g. {"--sandbox-host"}
};

class ProcessSandboxPool final : public ToolRunner {
 public:
  // Starts nothing yet: each process starts with the first call for it. Throws
  // std::invalid_argument for a configuration that cannot work (no processes or workers, a
  // worker stack too small for the stack cap).
  ProcessSandboxPool(RuntimeConfig config, CapabilityHost& host, SandboxLaunch launch,
                     boost::asio::any_io_executor executor);
  ~ProcessSandboxPool() override;
  ProcessSandboxPool(const ProcessSandboxPool&) = delete;
  ProcessSandboxPool& operator=(const ProcessSandboxPool&) = delete;

  // ToolRunner (see there).
  boost::asio::awaitable<CallOutcome> call(registry::ToolRevisionPtr tool,
                                           boost::json::object arguments,
                                           CallOptions options) override;
  std::vector<SandboxInfo> list() const override;
  bool terminate(const std::string& revision) override;
  void discard(const std::string& revision) override;
  const RuntimeConfig& config() const override;

  // The pid of each process slot's host, 0 while it has none running (never started, ended,
  // or still starting). For diagnostics and tests.
  std::vector<int> processIds() const;

  // What daemon.health reports of each process slot.
  // One per sandbox process slot: [runtime] processes of them for installed tools, then the one
  // for agents' code (CallOptions::agentCode).
  struct SlotHealth {
    bool agentCode = false;         // the slot of agents' code
    int pid = 0;                    // 0 while none runs (never started, ended, or starting)
    std::size_t recentEnds = 0;     // unexpected ends within the restart window
    std::int64_t failingForMs = 0;  // > 0: calls for it fail fast (max_restarts) for this long
    // The Landlock ABI the running process is confined with (0: the kernel has none, and its
    // system call filter alone holds); unset until it has answered its first ping.
    std::optional<int> landlockAbi;
    // Why the last start failed, while that is within the restart window and no start has
    // succeeded since.
    std::string startError;
  };
  std::vector<SlotHealth> health() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace toolhost::runtime
