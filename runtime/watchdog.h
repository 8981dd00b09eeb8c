// The watchdog: one thread that ends JavaScript running past its wall-clock or thread-CPU
// deadline with Isolate::TerminateExecution. Every arm is keyed by the epoch of one call (unique
// for the pool's lifetime) and removed under the watchdog's mutex, so a kill can reach only the
// segment it was armed for: once disarm() returns, that arm can no longer fire. arm() and
// disarm() are called by the worker running the segment; kill() and overdue() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace v8 {
class Isolate;
}

namespace toolhost::runtime {

// Why JavaScript was stopped, recorded by whoever stopped it first (the watchdog, the heap
// callback, the ArrayBuffer allocator, a cancellation).
enum class Kill : int { none = 0, timeout, cpuLimit, memoryLimit, arrayBufferLimit, cancelled };

// Records `reason` in `slot` unless a reason is already there.
inline void recordKill(std::atomic<int>& slot, Kill reason) {
  int expected = static_cast<int>(Kill::none);
  slot.compare_exchange_strong(expected, static_cast<int>(reason));
}

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  struct Arm {
    v8::Isolate* isolate = nullptr;
    std::atomic<int>* kill = nullptr;  // where the reason goes (lives as long as the isolate)
    Clock::time_point wallDeadline;
    clockid_t cpuClock{};            // CPU clock of the thread running the segment
    std::int64_t cpuDeadlineNs = 0;  // reading of cpuClock at which the CPU limit is reached
    std::int64_t cpuNowNs = -1;      // reading of cpuClock at the arm, if the caller has one
    // Set by hold() and release(), not by the caller of arm().
    Clock::time_point heldUntil = Clock::time_point::min();
    std::int64_t heldUntilCpuNs = 0;  // if set, held only until cpuClock reaches it as well
    Kill pending = Kill::none;  // a kill that came while held
  };

  Watchdog();
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Wakes the watchdog's thread only when this arm's first check comes before the time that
  // thread already sleeps until (with the default limits, almost never).
  void arm(std::uint64_t epoch, const Arm& arm);
  void disarm(std::uint64_t epoch);
  // Stops the segment armed for `epoch` now, if there is one (once it is not held).
  void kill(std::uint64_t epoch, Kill reason);
  // A stopped segment that is still not disarmed kRepeatTerminate later is told again, and again
  // at that interval: code can swallow a termination (V8 10.2's import() clears one raised
  // while it converts its specifier), and the segment must not run on.
  static constexpr auto kRepeatTerminate = std::chrono::milliseconds(10);
  // How much longer than `grace` a held segment may run past its deadline before overdue()
  // reports it (see there).
  static constexpr auto kHeldSlack = std::chrono::seconds(10);
  // Until release(epoch), or `until` at the latest, a kill of the segment armed for `epoch` (by
  // kill() or by a deadline) waits and is carried out then. For the moment V8 10.2 cannot take
  // a termination: between Module::Evaluate's entry and the start of the module's own code, a
  // termination aborts the process ("Check failed: module->status() == kErrored"). Only the
  // segment's own thread holds and releases it.
  // With a cpuBudget, the hold also ends once the segment's thread has run that much CPU time
  // since the call: a thread preempted right after hold() is still held when it resumes.
  void hold(std::uint64_t epoch, Clock::time_point until,
            std::chrono::nanoseconds cpuBudget = std::chrono::nanoseconds::zero());
  void release(std::uint64_t epoch);

  // Segments still not disarmed `grace` after they were stopped (or, should this thread ever fall
  // behind, after their wall deadline; kHeldSlack more while held): JavaScript stuck in a builtin
  // that never checks for termination. With the reason each was stopped for.
  struct Overdue {
    std::uint64_t epoch = 0;
    Kill reason = Kill::none;
  };
  std::vector<Overdue> overdue(Clock::duration grace) const;

  // Nanoseconds on a thread CPU clock.
  static std::int64_t cpuNowNs(clockid_t clock);

 private:
  void run();
  static void fire(const Arm& arm, Kill reason);

  struct Fired {
    Clock::time_point at;
    Kill reason = Kill::none;
    v8::Isolate* isolate = nullptr;
    Clock::time_point lastTerminate;  // when TerminateExecution was last requested
  };
  // Records that the segment of `epoch` was stopped; under mutex_.
  void firedLocked(std::uint64_t epoch, const Arm& arm, Clock::time_point now);
  // Whether `arm` is held at `now` (by time, and by CPU time if it has a CPU budget).
  static bool held(const Arm& arm, Clock::time_point now);
  // When a held arm should be looked at again.
  static Clock::time_point heldRecheck(const Arm& arm, Clock::time_point now);
  // Whether the thread sleeps past the first repeat of a kill made now by another thread; if so,
  // marks it awake (the caller notifies). Under mutex_.
  bool wakeForRepeatLocked(Clock::time_point now);

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::map<std::uint64_t, Arm> arms_;     // by call epoch
  std::map<std::uint64_t, Fired> fired_;  // stopped, not yet disarmed
  bool stop_ = false;
  // When the thread next looks at the arms on its own (max: only when woken); under mutex_.
  Clock::time_point sleepsUntil_ = Clock::time_point::min();
  std::thread thread_;
};

}  // namespace toolhost::runtime
