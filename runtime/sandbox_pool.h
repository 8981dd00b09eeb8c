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
//  - The CapabilityHost is called on V8 worker threads, never with an isolate locked.
//  - Every kill (wall clock, CPU, heap, ArrayBuffer, cancel, terminate) and every failure at the
//    boundary (invalid module or result, output too large, stack overflow) discards the sandbox;
//    a tool that merely threw keeps it.
//  - Residual risk of running V8 in the daemon's process (V8 10.2): a few builtins loop in C++
//    without checking for termination and V8 has fatal size checks, so a hostile tool can still
//    stall a worker well past its limits (Array.prototype.fill over a 1e8-element sparse array:
//    minutes and GBs) or abort the process ("Fatal JavaScript invalid size error", e.g.
//    'x'.repeat(2 ** 28).split('')). Only a separate process per sandbox (or per pool) closes
//    that; see the runtime's issue notes.
#pragma once

#include "registry/registry.h"
#include "runtime/call_outcome.h"
#include "runtime/capability_host.h"
#include "runtime/limits.h"

#include <boost/asio/awaitable.hpp>
#include <boost/json/object.hpp>

#include <cstdint>
#include <memory>
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

class SandboxPool {
 public:
  // Starts the worker threads and the watchdog. Needs a live V8Platform; `host` must outlive the
  // pool. Throws std::invalid_argument for a configuration that cannot work (e.g. no workers).
  SandboxPool(RuntimeConfig config, CapabilityHost& host);
  // Cancels every call, joins the workers and disposes every isolate.
  ~SandboxPool();
  SandboxPool(const SandboxPool&) = delete;
  SandboxPool& operator=(const SandboxPool&) = delete;

  // Runs the tool's default export with `arguments` (already validated against its parameters)
  // in its retained sandbox, or in a fresh one for Mode::disposable (or when the request tightens
  // heapMb or arrayBufferMb below what the retained sandbox was built with). Expected failures
  // are CallErrors; an exception means a bug.
  boost::asio::awaitable<CallOutcome> call(registry::ToolRevisionPtr tool,
                                           const boost::json::object& arguments,
                                           CallOptions options);

  // Each retained sandbox, least recently used first.
  std::vector<SandboxInfo> list() const;
  // Ends the retained sandbox of `revision`: a running call ends with CallErrc::cancelled, the
  // isolate is disposed; calls waiting for it run in fresh sandboxes. False if there was none.
  bool terminate(const std::string& revision);
  // The binding moved away from `revision`: its sandbox is no longer retained (a running call
  // finishes; the isolate is disposed after it).
  void discard(const std::string& revision);

  const RuntimeConfig& config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace toolhost::runtime
