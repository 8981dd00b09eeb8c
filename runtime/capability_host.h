// What sandboxed code may ask of the rest of the daemon. Implemented by the daemon (registry,
// task store, policy engine, HTTPS client, popup hosts, storage, secrets).
//
// Two kinds of requests:
//  - quick ones (resolveInvocation, createSubtasks): started with startQuickRequest, whose default
//    calls the blocking forms on a V8 worker thread, never while an isolate is locked, possibly
//    from several workers at once; thread-safe and short (LMDB reads, though a long lineage takes
//    seconds). The sandbox host forwards them to the daemon instead, so that its V8 worker is
//    free meanwhile; the daemon answers them on a thread of its own.
//  - operations (fetch, popup, and later storage and secrets): startOperation() returns at once;
//    the host finishes the operation whenever it is done, from any thread, through the
//    HostOperation it was given. The call waits for every operation it started.
// "A V8 worker thread" is where SandboxPool calls; ProcessSandboxPool calls the daemon's host on
// one of its own host threads instead (the V8 worker thread is in the sandbox host process,
// waiting), with the same rules: thread-safe, short, never blocking for long.
#pragma once

#include "registry/registry.h"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <boost/system/result.hpp>

#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace toolhost::runtime {

// How a host operation failed: `code` becomes the JavaScript Error's `code` ("not-authorized",
// "destination-blocked", "timeout", ...), `message` its message (words a tool author can act on;
// never a secret).
struct HostOpFailure {
  std::string code;
  std::string message;
};
using HostOpResult = boost::system::result<boost::json::value, HostOpFailure>;

// One operation in flight, as the host sees it. Every member is thread-safe and may be called from
// any thread, at any time, also synchronously inside startOperation() and long after the call
// (or the SandboxPool) is gone: the operation refers to its call weakly, so a late call is
// harmless. Keep the shared_ptr as long as the operation runs.
class HostOperation {
 public:
  virtual ~HostOperation() = default;
  // Finishes the operation; the first call counts, later ones are ignored. The result is settled
  // into the tool's promise on the sandbox's strand; if the call has ended meanwhile (cancelled,
  // timed out, killed by a limit, pool shutdown), it is dropped. Completing also ends this
  // operation's pause of the wall clock.
  virtual void complete(HostOpResult result) = 0;
  // The tool's wall clock stops while a person is being asked (a policy prompt, a popup) and runs
  // again after: the call's wall-clock deadline moves later by the time the clock stood still.
  // Per operation, pauses do not nest (a second pause before the resume is ignored); the clock
  // stands still while any operation of the call holds it paused. Both are ignored once the
  // operation completed or the call ended.
  virtual void pauseWallClock() = 0;
  virtual void resumeWallClock() = 0;
  // Registers `abort`, run once (on the sandbox's worker thread, or on the thread that cancels a
  // call waiting for its operations; outside every V8 lock; keep it short and non-blocking) when
  // the call ends before the operation completed: the host then
  // cancels its I/O or prompt and may still call complete(), which is ignored. If the call has
  // already ended, `abort` runs at once, on the calling thread; if the operation already
  // completed, it never runs. Several registrations all run.
  virtual void onAbort(std::function<void()> abort) = 0;
};

// The kinds of quick requests (CapabilityHost::startQuickRequest), as operations between a
// sandbox host and the daemon.
inline constexpr std::string_view kResolveInvocation = "resolveInvocation";
inline constexpr std::string_view kCreateSubtasks = "createSubtasks";

// Whether the tool's manifest requests capabilities.subtasks (the quick requests need it).
bool subtasksRequested(const registry::ToolRevision& tool);

class CapabilityHost {
 public:
  virtual ~CapabilityHost() = default;

  // The opaque revisions a call of tool `name` would run with: {toolRevision, settingsRevision?},
  // through the lineage of the caller's invocation (its taskId) first, as tasks.compile pins.
  // Anything else in the object is dropped before the tool sees it. An error has a code the tool
  // sees (e.code: "not-found" when no tool of that name can be called, else "failed") and a
  // sentence.
  virtual boost::system::result<boost::json::object, HostOpFailure> resolveInvocation(
      const registry::ToolRevision& caller, const std::string& name,
      const boost::json::object& invocation) = 0;

  // Compiles and hashes the drafts (as the tool passed them, already plain JSON) into tasks.
  virtual boost::system::result<boost::json::array, std::string> createSubtasks(
      const registry::ToolRevision& caller, const boost::json::value& drafts,
      const boost::json::object& invocation) = 0;

  // A quick request without waiting for it: kind kResolveInvocation with request {name}, or
  // kCreateSubtasks with request {drafts}; `operation` completes with resolveInvocation's object
  // or createSubtasks' array (or its error; createSubtasks' sentence as code "failed"), now or
  // later, from any
  // thread. The default answers at once through the blocking forms above. Refuses (code
  // "not-authorized") a caller whose manifest does not request capabilities.subtasks.
  virtual void startQuickRequest(const registry::ToolRevision& caller,
                                 const boost::json::object& invocation, const std::string& kind,
                                 boost::json::value request,
                                 std::shared_ptr<HostOperation> operation);

  // Starts an operation `kind` ("fetch", "popup", "storage", "secret") with `request` (plain
  // JSON built by the runtime; its shape per kind, and the reply each expects, are documented in
  // runtime/capabilities.h). Called on a V8 worker thread (the sandbox's strand), never while an
  // isolate is locked; must return promptly (the sandbox's next segment waits for it) and
  // completes through `operation`, now or later. The default refuses everything as not
  // authorized.
  virtual void startOperation(const registry::ToolRevision& caller,
                              const boost::json::object& invocation, const std::string& kind,
                              boost::json::value request,
                              std::shared_ptr<HostOperation> operation) {
    (void)caller;
    (void)invocation;
    (void)request;
    operation->complete(HostOpFailure{"not-authorized",
                                      kind + " is not granted to sandboxed tools by this daemon"});
  }
};

}  // namespace toolhost::runtime
