// One sandboxed call as the runtime sees it, and the HostOperations it hands to the
// CapabilityHost. Created by the pool; shared by the coroutine running the call, cancellation and
// the operations in flight. Fields are used on the sandbox's strand unless marked otherwise; the
// operation state is guarded by `opsMutex` and may be touched from any thread.
//
// Caveats:
//  - An operation holds its call weakly: a host may keep a HostOperation as long as it likes and
//    call it from any thread, before, during or after the call's end (or the pool's).
//  - When the call ends, `post` and `wake` are cleared under `opsMutex` (nothing refers to the
//    pool's strand or timer afterwards), and the abort functions of outstanding operations are
//    handed back to run outside every lock.
#pragma once

#include "registry/registry.h"
#include "runtime/capability_host.h"
#include "runtime/limits.h"

#include <boost/json/object.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace toolhost::runtime {

// Host operations (fetches, popups, storage and secret requests, quick ctx requests) of one call:
// at most kMaxRunningOps reach the host at once, the others wait in the sandbox for their turn,
// so that no tool holds an unbounded number of requests, sockets and prompts in the daemon (which
// counts its side too, so that a host process cannot go past it either: ProcessSandboxPool). At
// most kMaxOutstandingOps may be outstanding, running or waiting; one more is refused with
// "too-many-operations".
inline constexpr std::size_t kMaxRunningOps = 64;
inline constexpr std::size_t kMaxOutstandingOps = 1024;
// The requests of a call's outstanding operations (URLs, headers and bodies, storage values, popup
// HTML, drafts) live outside its heap and ArrayBuffer limits until the daemon has them: together
// they hold at most this much; a request that would go past it is refused with
// "request-too-large".
inline constexpr std::size_t kMaxOutstandingRequestBytes = std::size_t{64} << 20;

class CallOperation;

struct CallState {
  using Clock = std::chrono::steady_clock;

  std::uint64_t epoch = 0;  // unique for the pool's lifetime; keys the watchdog and ctx
  registry::ToolRevisionPtr tool;
  EffectiveLimits limits;
  boost::json::object invocation;
  std::string settingsRevision;                         // CallOptions'
  std::shared_ptr<const boost::json::object> settings;  // CallOptions'
  bool checkOnly = false;                               // CallOptions'
  CapabilityHost* host = nullptr;
  std::size_t maxResultDepth = 128;
  std::size_t maxLogBytes = 64 * 1024;
  // The wall-clock deadline before any pause; set when the sandbox is acquired. The deadline in
  // force is wallClock().deadline.
  Clock::time_point deadline;

  std::atomic<bool> cancelRequested{false};  // any thread

  std::int64_t cpuUsedNs = 0;
  std::uint64_t heapPeakBytes = 0;
  std::string logs;
  bool logsTruncated = false;

  // Host operations started and not yet settled in JavaScript. The call ends when its promise
  // settled and this is zero, or when it is cut short (then the rest are aborted). Completions
  // arrive on the strand and are settled in the next segment. At most kMaxOutstandingOps, of
  // which at most kMaxRunningOps started with the host (Sandbox::startHostOp).
  std::size_t outstandingOps = 0;
  std::size_t outstandingRequestBytes = 0;  // of those operations' requests
  struct Completion {
    std::size_t resolver;  // index into the sandbox's pending operations of this call
    HostOpResult result;
  };
  std::deque<Completion> completions;
  std::function<void()> wake;  // wakes the call's wait; strand only, cleared at the end

  // --- Under opsMutex (any thread). ---
  mutable std::mutex opsMutex;
  // Set once, when the call ends (on the strand, or by the cancel of a call answered before its
  // strand ended it): ctx refuses, completions are dropped, aborts run at once. Written under
  // the mutex; atomic, so that the strand may read it without.
  std::atomic<bool> ended{false};
  // Runs a function on the sandbox's strand; set by the pool before the call starts.
  std::function<void(std::function<void()>)> post;
  std::vector<std::shared_ptr<CallOperation>> liveOps;  // started, not completed
  std::size_t pausedOps = 0;                            // operations holding the clock paused
  Clock::time_point pausedSince;                        // when pausedOps became non-zero
  Clock::duration pausedTotal{};                        // of the pauses that ended

  // The wall clock now (any thread): the deadline moved later by every pause so far and, while
  // an operation holds the clock paused, as if that pause ended now.
  struct WallClock {
    Clock::time_point deadline;
    bool paused = false;
  };
  WallClock wallClock() const;
};

// Makes the HostOperation for the operation settling pending operation `resolver` of `call`,
// registered as outstanding. Strand, inside the segment that starts it; the call has not ended.
std::shared_ptr<CallOperation> newOperation(const std::shared_ptr<CallState>& call,
                                            std::size_t resolver);

// Ends the call's operations (strand): `ended` is set, `post` and `wake` are cleared, and the
// abort functions of operations still outstanding are returned, for the caller to run outside
// every lock (runAborts).
std::vector<std::function<void()>> endOperations(CallState& call);
// The part of endOperations any thread may do (a call answered before its strand ends it): sets
// `ended` and returns the aborts of the operations still outstanding.
std::vector<std::function<void()>> abortOperations(CallState& call);
void runAborts(std::vector<std::function<void()>> aborts, const std::string& toolName);

// The HostOperation of one operation of one call. Thread-safe; see HostOperation.
class CallOperation final : public HostOperation {
 public:
  CallOperation(std::weak_ptr<CallState> call, std::size_t resolver)
      : call_(std::move(call)), resolver_(resolver) {}

  void complete(HostOpResult result) override;
  void pauseWallClock() override;
  void resumeWallClock() override;
  void onAbort(std::function<void()> abort) override;

 private:
  friend std::vector<std::function<void()>> abortOperations(CallState& call);

  // Stops this operation's pause, if it holds one. Under the call's opsMutex.
  void unpauseLocked(CallState& call, CallState::Clock::time_point now);

  const std::weak_ptr<CallState> call_;
  const std::size_t resolver_;
  std::atomic<bool> completed_{false};  // the first complete() wins
  // Under the call's opsMutex.
  bool paused_ = false;
  std::vector<std::function<void()>> aborts_;
};

}  // namespace toolhost::runtime
