#include "runtime/watchdog.h"

#include <v8.h>

#include <algorithm>

namespace toolhost::runtime {

namespace {
// How late a CPU-limit kill may be: the thread is polled at least this often near its deadline.
constexpr auto kMinCpuPoll = std::chrono::milliseconds(1);
}  // namespace

Watchdog::Watchdog() : thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::int64_t Watchdog::cpuNowNs(clockid_t clock) {
  timespec now{};
  if (clock_gettime(clock, &now) != 0) return 0;
  return static_cast<std::int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

namespace {
// When the watchdog must first look at `arm`: its wall deadline, or the earliest moment its
// thread could reach the CPU deadline (no sooner than the poll floor).
Watchdog::Clock::time_point firstCheck(const Watchdog::Arm& arm, Watchdog::Clock::time_point now) {
  const std::int64_t cpuNow = arm.cpuNowNs >= 0 ? arm.cpuNowNs : Watchdog::cpuNowNs(arm.cpuClock);
  const auto remaining = std::chrono::nanoseconds(std::max<std::int64_t>(arm.cpuDeadlineNs - cpuNow, 0));
  return std::min(arm.wallDeadline,
                  now + std::max<Watchdog::Clock::duration>(remaining, kMinCpuPoll));
}
}  // namespace

void Watchdog::arm(std::uint64_t epoch, const Arm& arm) {
  const auto check = firstCheck(arm, Clock::now());
  bool wake = false;
  {
    std::lock_guard lock(mutex_);
    arms_[epoch] = arm;
    fired_.erase(epoch);
    // The thread looks at every arm when it wakes by itself; only an earlier check needs it now.
    if (check < sleepsUntil_) {
      wake = true;
      sleepsUntil_ = Clock::time_point::min();  // it looks at every arm once it is awake
    }
  }
  if (wake) wake_.notify_all();
}

void Watchdog::disarm(std::uint64_t epoch) {
  std::lock_guard lock(mutex_);
  arms_.erase(epoch);
  fired_.erase(epoch);
}

void Watchdog::kill(std::uint64_t epoch, Kill reason) {
  bool wake = false;
  {
    std::lock_guard lock(mutex_);
    auto found = arms_.find(epoch);
    if (found == arms_.end()) return;
    Arm& arm = found->second;
    const auto now = Clock::now();
    if (held(arm, now)) {
      if (arm.pending == Kill::none) arm.pending = reason;
      // The thread carries it out when the hold runs out, unless release() comes first.
      if (heldRecheck(arm, now) < sleepsUntil_) {
        wake = true;
        sleepsUntil_ = Clock::time_point::min();
      }
    } else {
      fire(arm, reason);
      firedLocked(epoch, arm, now);
      arms_.erase(found);
      wake = wakeForRepeatLocked(now);
    }
  }
  if (wake) wake_.notify_all();
}

void Watchdog::hold(std::uint64_t epoch, Clock::time_point until,
                    std::chrono::nanoseconds cpuBudget) {
  bool wake = false;
  {
    std::lock_guard lock(mutex_);
    auto found = arms_.find(epoch);
    if (found == arms_.end()) return;
    Arm& arm = found->second;
    arm.heldUntil = until;
    arm.heldUntilCpuNs =
        cpuBudget.count() > 0 ? cpuNowNs(arm.cpuClock) + cpuBudget.count() : std::int64_t{0};
    // A kill waiting for an earlier hold to run out (or for ever) is due at this one's end.
    if (arm.pending != Kill::none && heldRecheck(arm, Clock::now()) < sleepsUntil_) {
      wake = true;
      sleepsUntil_ = Clock::time_point::min();
    }
  }
  if (wake) wake_.notify_all();
}

void Watchdog::release(std::uint64_t epoch) {
  bool wake = false;
  {
    std::lock_guard lock(mutex_);
    auto found = arms_.find(epoch);
    if (found == arms_.end()) return;
    Arm& arm = found->second;
    arm.heldUntil = Clock::time_point::min();
    arm.heldUntilCpuNs = 0;
    if (arm.pending == Kill::none) return;
    fire(arm, arm.pending);
    const auto now = Clock::now();
    firedLocked(epoch, arm, now);
    arms_.erase(found);
    wake = wakeForRepeatLocked(now);
  }
  if (wake) wake_.notify_all();
}

bool Watchdog::held(const Arm& arm, Clock::time_point now) {
  if (now >= arm.heldUntil) return false;
  return arm.heldUntilCpuNs == 0 || cpuNowNs(arm.cpuClock) < arm.heldUntilCpuNs;
}

Watchdog::Clock::time_point Watchdog::heldRecheck(const Arm& arm, Clock::time_point now) {
  if (arm.heldUntilCpuNs == 0) return arm.heldUntil;
  // The thread cannot run more CPU time than passes on the wall clock.
  const auto remaining = std::chrono::nanoseconds(
      std::max<std::int64_t>(arm.heldUntilCpuNs - cpuNowNs(arm.cpuClock), 0));
  return std::min(arm.heldUntil, now + std::max<Clock::duration>(remaining, kMinCpuPoll));
}

bool Watchdog::wakeForRepeatLocked(Clock::time_point now) {
  // The thread must be awake to tell the segment again if it runs on.
  if (now + kRepeatTerminate >= sleepsUntil_) return false;
  sleepsUntil_ = Clock::time_point::min();
  return true;
}

void Watchdog::firedLocked(std::uint64_t epoch, const Arm& arm, Clock::time_point now) {
  // The reason that stuck is the first one recorded (maybe by the heap callback, earlier).
  fired_[epoch] = Fired{now, static_cast<Kill>(arm.kill->load()), arm.isolate, now};
}

std::vector<Watchdog::Overdue> Watchdog::overdue(Clock::duration grace) const {
  std::vector<Overdue> out;
  const auto now = Clock::now();
  std::lock_guard lock(mutex_);
  for (const auto& [epoch, fired] : fired_) {
    if (now - fired.at >= grace) out.push_back({epoch, fired.reason});
  }
  for (const auto& [epoch, arm] : arms_) {
    // A held segment runs no JavaScript (modules compiling, at most 2 MiB of source): on a slow
    // machine it may pass its deadline plus the grace without being stuck, so it has longer.
    const auto allowed = held(arm, now) ? grace + kHeldSlack : grace;
    if (arm.wallDeadline != Clock::time_point::max() && now - arm.wallDeadline >= allowed) {
      out.push_back({epoch, Kill::timeout});
    }
  }
  return out;
}

void Watchdog::fire(const Arm& arm, Kill reason) {
  recordKill(*arm.kill, reason);
  arm.isolate->TerminateExecution();  // thread-safe; the isolate lives while it is armed
}

void Watchdog::run() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    const auto now = Clock::now();
    auto next = Clock::time_point::max();
    for (auto it = arms_.begin(); it != arms_.end();) {
      Arm& arm = it->second;
      Kill reason = arm.pending;
      if (reason != Kill::none) {
        // Waits for its hold to run out (or for release()).
      } else if (now >= arm.wallDeadline) {
        reason = Kill::timeout;
      } else {
        next = std::min(next, arm.wallDeadline);
        const std::int64_t remaining = arm.cpuDeadlineNs - cpuNowNs(arm.cpuClock);
        if (remaining <= 0) {
          reason = Kill::cpuLimit;
        } else {
          // A thread cannot burn CPU faster than the clock on the wall: sleeping `remaining`
          // never overshoots by more than the poll floor.
          next = std::min(next, now + std::max<Clock::duration>(std::chrono::nanoseconds(remaining),
                                                                kMinCpuPoll));
        }
      }
      if (reason != Kill::none && held(arm, now)) {
        arm.pending = reason;
        next = std::min(next, heldRecheck(arm, now));
        ++it;
      } else if (reason != Kill::none) {
        fire(arm, reason);
        firedLocked(it->first, arm, now);
        it = arms_.erase(it);
      } else {
        ++it;
      }
    }
    // Segments stopped and still running are told again (see kRepeatTerminate). The isolate
    // lives while its segment is not disarmed, and disarm() takes mutex_.
    for (auto& [epoch, fired] : fired_) {
      if (fired.isolate == nullptr) continue;
      if (now - fired.lastTerminate >= kRepeatTerminate) {
        fired.isolate->TerminateExecution();
        fired.lastTerminate = now;
      }
      next = std::min(next, fired.lastTerminate + kRepeatTerminate);
    }
    // arm() can only run while this thread waits (it holds mutex_ otherwise).
    sleepsUntil_ = next;
    if (next == Clock::time_point::max()) {
      wake_.wait(lock);
    } else {
      wake_.wait_until(lock, next);
    }
    sleepsUntil_ = Clock::time_point::min();
  }
}

}  // namespace toolhost::runtime
