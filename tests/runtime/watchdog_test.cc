// The watchdog stops exactly the segment it was armed for: by wall clock, by thread CPU time, or
// on request, and never after that segment was disarmed.
#include "runtime/watchdog.h"
#include "tests/runtime/runtime_test_support.h"

#include <v8.h>
#include <catch2/catch.hpp>

#include <pthread.h>

#include <memory>
#include <thread>

using namespace toolhost::runtime;
using namespace std::chrono_literals;

namespace {

struct RawIsolate {
  RawIsolate() {
    testing::v8Platform();
    v8::Isolate::CreateParams params;
    params.array_buffer_allocator = allocator.get();
    isolate = v8::Isolate::New(params);
  }
  ~RawIsolate() { isolate->Dispose(); }
  std::unique_ptr<v8::ArrayBuffer::Allocator> allocator{
      v8::ArrayBuffer::Allocator::NewDefaultAllocator()};
  v8::Isolate* isolate;
};

clockid_t thisThreadClock() {
  clockid_t clock{};
  pthread_getcpuclockid(pthread_self(), &clock);
  return clock;
}

Kill killOf(const std::atomic<int>& slot) { return static_cast<Kill>(slot.load()); }

}  // namespace

TEST_CASE("the watchdog kills only the segment it was armed for", "[watchdog]") {
  RawIsolate raw;
  Watchdog watchdog;
  std::atomic<int> kill{0};
  const auto clock = thisThreadClock();
  const auto farCpu = Watchdog::cpuNowNs(clock) + std::int64_t{3600} * 1'000'000'000;
  auto arm = [&](auto wallIn, std::int64_t cpuDeadline) {
    return Watchdog::Arm{raw.isolate, &kill, Watchdog::Clock::now() + wallIn, clock, cpuDeadline};
  };

  SECTION("disarmed before its deadline, it never fires") {
    watchdog.arm(1, arm(30ms, farCpu));
    watchdog.disarm(1);
    std::this_thread::sleep_for(80ms);
    CHECK(killOf(kill) == Kill::none);
  }
  SECTION("a kill for another epoch does nothing; one for its own stops it") {
    watchdog.arm(2, arm(10s, farCpu));
    watchdog.kill(3, Kill::cancelled);
    CHECK(killOf(kill) == Kill::none);
    watchdog.kill(2, Kill::cancelled);
    CHECK(killOf(kill) == Kill::cancelled);
    watchdog.kill(2, Kill::timeout);  // already fired and removed: nothing more
    CHECK(killOf(kill) == Kill::cancelled);
    watchdog.disarm(2);
  }
  SECTION("the wall-clock deadline fires once") {
    watchdog.arm(4, arm(20ms, farCpu));
    std::this_thread::sleep_for(150ms);
    CHECK(killOf(kill) == Kill::timeout);
    watchdog.disarm(4);
  }
  SECTION("the CPU deadline of the armed thread fires, not its wall clock") {
    watchdog.arm(5, arm(10s, Watchdog::cpuNowNs(clock) + 30'000'000));
    const auto start = Watchdog::Clock::now();
    while (killOf(kill) == Kill::none && Watchdog::Clock::now() - start < 5s) {
    }  // burn this thread's CPU
    CHECK(killOf(kill) == Kill::cpuLimit);
    watchdog.disarm(5);
  }
  SECTION("an arm due before the one the watchdog sleeps for still fires by its own deadline") {
    std::atomic<int> later{0};
    watchdog.arm(9, Watchdog::Arm{raw.isolate, &later, Watchdog::Clock::now() + 1h, clock, farCpu});
    std::this_thread::sleep_for(20ms);  // the watchdog now sleeps until the first arm's check
    watchdog.arm(10, arm(10ms, farCpu));
    // Without a wake-up it would fire only when the first arm is due, an hour from now.
    const auto start = Watchdog::Clock::now();
    while (killOf(kill) == Kill::none && Watchdog::Clock::now() - start < 60s) {
      std::this_thread::sleep_for(5ms);
    }
    CHECK(killOf(kill) == Kill::timeout);
    CHECK(killOf(later) == Kill::none);
    watchdog.disarm(10);
    watchdog.disarm(9);
  }
  SECTION("a segment told to stop and still armed a grace later is overdue until disarmed") {
    watchdog.arm(7, arm(10s, farCpu));
    CHECK(watchdog.overdue(0ms).empty());  // running, not told to stop
    watchdog.kill(7, Kill::cancelled);
    CHECK(watchdog.overdue(1s).empty());  // within the grace
    std::this_thread::sleep_for(30ms);
    auto overdue = watchdog.overdue(20ms);
    REQUIRE(overdue.size() == 1);
    CHECK(overdue[0].epoch == 7);
    CHECK(overdue[0].reason == Kill::cancelled);
    watchdog.disarm(7);
    CHECK(watchdog.overdue(0ms).empty());
  }
  SECTION("held past its deadline (modules compiling), it is not overdue within the slack") {
    watchdog.arm(14, arm(30ms, farCpu));
    watchdog.hold(14, Watchdog::Clock::time_point::max());
    std::this_thread::sleep_for(80ms);
    CHECK(watchdog.overdue(10ms).empty());
    watchdog.release(14);  // the timeout is carried out now: a grace from here
    std::this_thread::sleep_for(30ms);
    CHECK(watchdog.overdue(10ms).size() == 1);
    watchdog.disarm(14);
  }
  SECTION("fired by its deadline, it reports the reason that stuck first") {
    recordKill(kill, Kill::memoryLimit);
    watchdog.arm(8, arm(0ms, farCpu));
    std::this_thread::sleep_for(50ms);
    auto overdue = watchdog.overdue(10ms);
    REQUIRE(overdue.size() == 1);
    CHECK(overdue[0].reason == Kill::memoryLimit);
    watchdog.disarm(8);
  }
  SECTION("held, a kill waits for the release") {
    watchdog.arm(9, arm(10s, farCpu));
    watchdog.hold(9, Watchdog::Clock::time_point::max());
    watchdog.kill(9, Kill::cancelled);
    std::this_thread::sleep_for(50ms);
    CHECK(killOf(kill) == Kill::none);
    watchdog.release(9);
    CHECK(killOf(kill) == Kill::cancelled);
    watchdog.disarm(9);
  }
  SECTION("held, a deadline waits for the release") {
    watchdog.arm(10, arm(10ms, farCpu));
    watchdog.hold(10, Watchdog::Clock::time_point::max());
    std::this_thread::sleep_for(80ms);
    CHECK(killOf(kill) == Kill::none);
    watchdog.release(10);
    CHECK(killOf(kill) == Kill::timeout);
    watchdog.disarm(10);
  }
  SECTION("a hold with a CPU budget lasts until the thread has run it, however long it sleeps") {
    watchdog.arm(15, arm(10s, farCpu));
    watchdog.hold(15, Watchdog::Clock::now() + 10s, 20ms);
    watchdog.kill(15, Kill::cancelled);
    std::this_thread::sleep_for(150ms);  // preempted, as it were: no CPU time runs
    CHECK(killOf(kill) == Kill::none);
    const auto start = Watchdog::cpuNowNs(clock);
    while (Watchdog::cpuNowNs(clock) - start < 60'000'000 && killOf(kill) == Kill::none) {
    }
    std::this_thread::sleep_for(20ms);
    CHECK(killOf(kill) == Kill::cancelled);
    watchdog.disarm(15);
  }
  SECTION("a kill held for ever is carried out when a shorter hold replaces it") {
    // As a module's compile (held for ever) then its evaluation's start (held briefly).
    watchdog.arm(13, arm(10s, farCpu));
    watchdog.hold(13, Watchdog::Clock::time_point::max());
    watchdog.kill(13, Kill::cancelled);
    std::this_thread::sleep_for(30ms);  // the watchdog's thread now sleeps without end
    watchdog.hold(13, Watchdog::Clock::now() + 20ms);
    std::this_thread::sleep_for(300ms);
    CHECK(killOf(kill) == Kill::cancelled);  // without release()
    watchdog.disarm(13);
  }
  SECTION("a hold runs out by itself, then the kill is carried out") {
    watchdog.arm(11, arm(10s, farCpu));
    watchdog.hold(11, Watchdog::Clock::now() + 40ms);
    watchdog.kill(11, Kill::cancelled);
    CHECK(killOf(kill) == Kill::none);
    std::this_thread::sleep_for(200ms);
    CHECK(killOf(kill) == Kill::cancelled);
    watchdog.release(11);  // nothing left to do
    watchdog.disarm(11);
  }
  SECTION("released with nothing pending, it is armed as before") {
    watchdog.arm(12, arm(30ms, farCpu));
    watchdog.hold(12, Watchdog::Clock::time_point::max());
    watchdog.release(12);
    std::this_thread::sleep_for(150ms);
    CHECK(killOf(kill) == Kill::timeout);
    watchdog.disarm(12);
  }
  SECTION("the first reason wins") {
    recordKill(kill, Kill::memoryLimit);
    watchdog.arm(6, arm(0ms, farCpu));
    std::this_thread::sleep_for(50ms);
    CHECK(killOf(kill) == Kill::memoryLimit);
    watchdog.disarm(6);
  }
  {
    v8::Locker locker(raw.isolate);
    raw.isolate->CancelTerminateExecution();
  }
}
