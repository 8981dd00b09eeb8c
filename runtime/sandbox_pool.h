// Runs sandboxed JavaScript tools: one retained sandbox (isolate + context + evaluated module) per
// revision, calls to one sandbox serialized on its strand, different revisions in parallel on a
// fixed pool of V8 worker threads, limits enforced by a watchdog thread.
// Every method may be called from any thread. call() is awaited from a coroutine on any other
// executor and honours terminal cancellation of that coroutine (the daemon's $/cancelRequest and
// disconnects). Destroy the pool before the executors of its callers and before the V8Platform.
//
// Caveats:
//  - The outcome is delivered on the awaiting coroutine's executor. A call's wallMs runs from the
//    moment it has the sandbox (waiting behind other calls of the same revision is not counted;
//    the caller bounds that wait by cancelling).
//  - A cancel is answered at once when no V8 runs for the call at that moment (it waits for its
//    sandbox, a worker, a pre-warmed shell or its host operations), however long other calls
//    keep the sandbox's strand or the workers busy; the call is then ended on its strand
//    without running its JavaScript again. A call inside V8 is terminated and answers when its
//    segment stops (within kill_grace_ms, or stalled() names it).
//  - The CapabilityHost is called on V8 worker threads, never with an isolate locked.
//  - Host operations (fetch, popup, storage, secrets): a call whose promise settled still waits
//    for the operations it started (up to its wall-clock deadline, which moves later while an
//    operation pauses the clock). A call cut short (cancel, timeout, a limit, shutdown, the pool's
//    destructor) does not wait: it aborts them (HostOperation::onAbort) and ends.
//  - Every kill (wall clock, CPU, heap, ArrayBuffer, cancel, terminate) and every failure at the
//    boundary (invalid module or result, output too large, stack overflow) discards the sandbox;
//    a tool that merely threw keeps it.
//  - RuntimeConfig::prewarmed sandbox shells (isolate, context and globals, no tool) are kept
//    ready, built on the worker threads after startup and after each time one is taken. The
//    first call of a revision (retained or disposable) whose heapMb and arrayBufferMb equal those
//    of a manifest without limits takes one and only compiles and evaluates its module there
//    (with none ready, it waits, suspended and without holding its worker, for a build already
//    running on another worker that no earlier call is waiting for); every other
//    first call builds its sandbox on demand. A taken shell belongs to that one sandbox and is
//    disposed with it. Shells are not retained sandboxes: list(), maxRetained and memoryBudgetMb
//    leave them out.
//  - Residual risk of running V8 in the daemon's process (V8 10.2): a few builtins loop in C++
//    without checking for termination and V8 has fatal size checks, so a hostile tool can still
//    stall a worker well past its limits (Array.prototype.fill over a 1e8-element sparse array:
//    minutes and GBs) or abort the process ("Fatal JavaScript invalid size error", e.g.
//    'x'.repeat(2 ** 28).split('')). Only a separate process per sandbox (or per pool) closes
//    that: ProcessSandboxPool runs this pool in supervised sandbox host processes and kills one
//    whose call does not stop (see stalled()). One abort is avoided here instead, because a
//    caller could trigger it: a termination between Module::Evaluate's entry and the start of
//    the module's code fails a V8 CHECK, so kills wait while a module loads and for the first
//    10 ms of its evaluation (Watchdog::hold).
#pragma once

#include "registry/registry.h"
#include "runtime/call_outcome.h"
#include "runtime/capability_host.h"
#include "runtime/limits.h"
#include "runtime/tool_runner.h"
#include "runtime/watchdog.h"

#include <boost/asio/awaitable.hpp>
#include <boost/json/object.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace toolhost::runtime {

// A call whose JavaScript was told to stop (a limit or a cancel) and is still inside V8.
struct StalledCall {
  std::uint64_t tag = 0;  // CallOptions::tag
  Kill reason = Kill::none;
};

class SandboxPool final : public ToolRunner {
 public:
  // Starts the worker threads and the watchdog. Needs a live V8Platform; `host` must outlive the
  // pool. Throws std::invalid_argument for a configuration that cannot work (e.g. no workers).
  SandboxPool(RuntimeConfig config, CapabilityHost& host);
  // Cancels every call, joins the workers and disposes every isolate.
  ~SandboxPool() override;
  SandboxPool(const SandboxPool&) = delete;
  SandboxPool& operator=(const SandboxPool&) = delete;

  // ToolRunner (see there).
  boost::asio::awaitable<CallOutcome> call(registry::ToolRevisionPtr tool,
                                           boost::json::object arguments,
                                           CallOptions options) override;
  std::vector<SandboxInfo> list() const override;

  // call() for a caller that is not a coroutine (the sandbox host): `done` runs once, on the V8
  // worker thread that ran the call, on this thread for a call refused at once, or on the
  // cancelling thread for a call cancelled while no V8 ran for it; keep it short and let it not
  // throw. Returns what cancels the call (any thread, any number of times; nothing once the call
  // is done).
  using Done = std::function<void(std::exception_ptr error, CallOutcome outcome)>;
  std::function<void()> start(registry::ToolRevisionPtr tool, boost::json::object arguments,
                              CallOptions options, Done done);
  bool terminate(const std::string& revision) override;
  void discard(const std::string& revision) override;
  const RuntimeConfig& config() const override;

  // Calls whose JavaScript was told to stop at least `grace` ago (by the watchdog, a heap or
  // ArrayBuffer kill, a cancel) and whose thread is still inside V8: a builtin looping in C++
  // without checking for termination. Such an isolate cannot be recovered; only killing the
  // process ends it. Any thread.
  std::vector<StalledCall> stalled(std::chrono::milliseconds grace) const;

  // The pre-warmed shells: how many are ready to be taken (0 to prewarmed), built and taken so far. Any
  // thread; for tests and diagnostics.
  struct Spares {
    std::size_t ready = 0;
    std::uint64_t built = 0;
    std::uint64_t taken = 0;
  };
  Spares spares() const;

  // What changed in list() since the previous changes(): the rows added or updated (a call of
  // the revision was admitted or ended), least recently used first, and the revisions no longer
  // retained (evicted, terminated, discarded, a first call that failed). Applied in order to an
  // empty list, the results rebuild list() apart from idleMs, which a row keeps from when it was
  // reported. Costs O(changes), not O(retained). Tracking starts with the first call, which
  // returns every row. For one consumer (the sandbox host mirrors its list to the daemon); any
  // thread.
  struct Changes {
    std::vector<SandboxInfo> updated;
    std::vector<std::string> removed;
  };
  Changes changes();
  // Runs (on a V8 worker) when a call that was answered at its cancel, before it ended, has
  // ended: list() changed with no outcome to carry the change. Set it before the first call.
  void onLateChange(std::function<void()> listener);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace toolhost::runtime
