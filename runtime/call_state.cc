#include "runtime/call_state.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>

namespace toolhost::runtime {

CallState::WallClock CallState::wallClock() const {
  std::lock_guard lock(opsMutex);
  WallClock out{deadline + pausedTotal, pausedOps > 0};
  if (out.paused) out.deadline += Clock::now() - pausedSince;
  return out;
}

std::shared_ptr<CallOperation> newOperation(const std::shared_ptr<CallState>& call,
                                            std::size_t resolver) {
  auto operation = std::make_shared<CallOperation>(call, resolver);
  std::lock_guard lock(call->opsMutex);
  call->liveOps.push_back(operation);
  return operation;
}

std::vector<std::function<void()>> abortOperations(CallState& call) {
  std::vector<std::function<void()>> aborts;
  std::vector<std::shared_ptr<CallOperation>> live;  // released after the lock
  std::lock_guard lock(call.opsMutex);
  call.ended = true;
  live.swap(call.liveOps);
  for (const auto& operation : live) {
    operation->paused_ = false;
    // One whose complete() is racing this end has finished: nothing to abort.
    if (operation->completed_.load()) continue;
    for (auto& abort : operation->aborts_) aborts.push_back(std::move(abort));
    operation->aborts_.clear();
  }
  call.pausedOps = 0;
  return aborts;
}

std::vector<std::function<void()>> endOperations(CallState& call) {
  auto aborts = abortOperations(call);
  std::function<void(std::function<void()>)> post;  // released after the lock
  {
    std::lock_guard lock(call.opsMutex);
    post.swap(call.post);
  }
  call.wake = nullptr;
  call.completions.clear();
  return aborts;
}

void runAborts(std::vector<std::function<void()>> aborts, const std::string& toolName) {
  for (auto& abort : aborts) {
    try {
      abort();
    } catch (const std::exception& e) {
      spdlog::error("runtime: aborting a host operation of {} threw: {}", toolName, e.what());
    } catch (...) {
      spdlog::error("runtime: aborting a host operation of {} threw", toolName);
    }
  }
}

void CallOperation::unpauseLocked(CallState& call, CallState::Clock::time_point now) {
  if (!paused_) return;
  paused_ = false;
  if (call.pausedOps > 0 && --call.pausedOps == 0) call.pausedTotal += now - call.pausedSince;
}

void CallOperation::complete(HostOpResult result) {
  if (completed_.exchange(true)) return;
  std::shared_ptr<CallState> call = call_.lock();
  if (!call) return;  // the call and its pool are gone
  // Released after the lock: the host's functions, and the call's reference to this operation.
  std::vector<std::function<void()>> aborts;
  std::shared_ptr<CallOperation> self;
  std::lock_guard lock(call->opsMutex);
  unpauseLocked(*call, CallState::Clock::now());
  aborts.swap(aborts_);
  auto& live = call->liveOps;
  auto found = std::find_if(live.begin(), live.end(),
                            [this](const auto& operation) { return operation.get() == this; });
  if (found != live.end()) {
    self = std::move(*found);
    live.erase(found);
  }
  if (call->ended || !call->post) return;  // cancelled or over: the answer has nowhere to go
  call->post([call, resolver = resolver_, result = std::move(result)]() mutable {
    if (call->ended) return;
    call->completions.push_back(CallState::Completion{resolver, std::move(result)});
    if (call->wake) call->wake();
  });
}

void CallOperation::pauseWallClock() {
  std::shared_ptr<CallState> call = call_.lock();
  if (!call) return;
  std::lock_guard lock(call->opsMutex);
  if (call->ended || paused_ || completed_.load()) return;
  paused_ = true;
  if (call->pausedOps++ == 0) call->pausedSince = CallState::Clock::now();
}

void CallOperation::resumeWallClock() {
  std::shared_ptr<CallState> call = call_.lock();
  if (!call) return;
  std::lock_guard lock(call->opsMutex);
  if (!paused_) return;
  unpauseLocked(*call, CallState::Clock::now());
  // The call may be waiting with the clock stopped: wake it to wait for the moved deadline.
  if (call->ended || !call->post) return;
  call->post([call] {
    if (!call->ended && call->wake) call->wake();
  });
}

void CallOperation::onAbort(std::function<void()> abort) {
  if (!abort) return;
  if (std::shared_ptr<CallState> call = call_.lock()) {
    std::lock_guard lock(call->opsMutex);
    if (completed_.load()) return;  // finished: there is nothing to abort
    if (!call->ended) {
      aborts_.push_back(std::move(abort));
      return;
    }
  } else if (completed_.load()) {
    return;
  }
  // The call ended before this operation completed.
  std::vector<std::function<void()>> now;
  now.push_back(std::move(abort));
  runAborts(std::move(now), "a tool");
}

}  // namespace toolhost::runtime
