// DiskThread: jobs run on its thread, one at a time in order; the awaiting coroutine resumes on
// its own strand with the job's value or exception; the io_context keeps running (and stays
// busy) while a job is out; stop() runs what is queued.
#include "daemon/disk_thread.h"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace toolhost::daemon;
namespace asio = boost::asio;
using namespace std::chrono_literals;

TEST_CASE("disk thread: a job runs there and the caller resumes on its strand with the value",
          "[daemon][disk]") {
  asio::io_context io;
  DiskThread disk;
  auto strand = asio::make_strand(io);
  const auto ioThread = std::this_thread::get_id();
  bool done = false;
  asio::co_spawn(
      strand,
      [&]() -> asio::awaitable<void> {
        auto [value, jobOnDisk, jobThread] = co_await disk.run([&] {
          return std::tuple(std::string("written"), disk.onDiskThread(),
                            std::this_thread::get_id());
        });
        CHECK(value == "written");
        CHECK(jobOnDisk);
        CHECK(jobThread != ioThread);
        CHECK(std::this_thread::get_id() == ioThread);
        CHECK(strand.running_in_this_thread());
        done = true;
      },
      asio::detached);
  io.run();  // returns only once the coroutine is done: the job kept the io_context busy
  CHECK(done);
}

TEST_CASE("disk thread: a job's exception reaches the caller", "[daemon][disk]") {
  asio::io_context io;
  DiskThread disk;
  std::string caught;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        try {
          co_await disk.run([]() -> int { throw std::runtime_error("disk on fire"); });
        } catch (const std::runtime_error& error) {
          caught = error.what();
        }
      },
      asio::detached);
  io.run();
  CHECK(caught == "disk on fire");
}

TEST_CASE("disk thread: jobs run one at a time in the order they were queued while the I/O "
          "thread goes on",
          "[daemon][disk]") {
  asio::io_context io;
  DiskThread disk;
  std::promise<void> release;
  auto released = release.get_future().share();
  std::vector<int> order;  // written only on the disk thread
  std::atomic<int> running{0};
  std::atomic<int> overlapped{0};
  int finished = 0;
  for (int i = 0; i < 5; ++i) {
    asio::co_spawn(
        io,
        [&, i]() -> asio::awaitable<void> {
          co_await disk.run([&, i] {
            if (running.fetch_add(1) != 0) overlapped.fetch_add(1);
            if (i == 0) released.wait();  // the first job holds the disk thread
            order.push_back(i);
            running.fetch_sub(1);
            return i;
          });
          ++finished;
        },
        asio::detached);
  }
  // While the first job blocks the disk thread, a timer on the I/O thread still fires.
  bool timerFired = false;
  asio::steady_timer timer(io, 20ms);
  timer.async_wait([&](boost::system::error_code) {
    timerFired = true;
    CHECK(finished == 0);
    release.set_value();
  });
  io.run();
  CHECK(timerFired);
  CHECK(finished == 5);
  CHECK(overlapped.load() == 0);
  CHECK(order == std::vector<int>{0, 1, 2, 3, 4});
}

TEST_CASE("disk thread: stop runs the jobs still queued", "[daemon][disk]") {
  asio::io_context io;
  std::atomic<int> ran{0};
  {
    DiskThread disk;
    for (int i = 0; i < 3; ++i) {
      asio::co_spawn(
          io,
          [&]() -> asio::awaitable<void> {
            co_await disk.run([&] { return ran.fetch_add(1); });
          },
          asio::detached);
    }
    // Start the coroutines (each queues its job), then stop the io_context as a forced
    // shutdown does, with the jobs still out.
    io.poll();
    io.stop();
    disk.stop();
    CHECK(ran.load() == 3);
  }
}

TEST_CASE("disk thread: a job whose request is cancelled before it starts never runs",
          "[daemon][disk]") {
  asio::io_context io;
  DiskThread disk;
  std::promise<void> release;
  auto released = release.get_future().share();
  std::atomic<bool> firstRan{false}, secondRan{false};
  std::string firstOutcome, secondOutcome;
  asio::cancellation_signal first, second;
  auto job = [&](std::atomic<bool>& ran, std::string& outcome,
                 bool holds) -> asio::awaitable<void> {
    try {
      co_await disk.run([&] {
        ran = true;
        if (holds) released.wait();  // the first job holds the disk thread
        return 1;
      });
      outcome = "done";
    } catch (const boost::system::system_error& error) {
      outcome = error.code() == asio::error::operation_aborted ? "aborted" : error.what();
    }
  };
  asio::co_spawn(io, job(firstRan, firstOutcome, true),
                 asio::bind_cancellation_slot(first.slot(), asio::detached));
  asio::co_spawn(io, job(secondRan, secondOutcome, false),
                 asio::bind_cancellation_slot(second.slot(), asio::detached));
  // Once the first job runs (it holds the disk thread, so the second is queued), both requests
  // are cancelled: the first while its job runs, the second while queued.
  asio::steady_timer timer(io);
  std::function<void()> cancelOnceRunning = [&] {
    if (!firstRan.load()) {
      timer.expires_after(1ms);
      timer.async_wait([&](boost::system::error_code) { cancelOnceRunning(); });
      return;
    }
    first.emit(asio::cancellation_type::terminal);
    second.emit(asio::cancellation_type::terminal);
    release.set_value();
  };
  cancelOnceRunning();
  io.run();
  CHECK(firstRan.load());
  CHECK(firstOutcome == "done");  // a job that started finishes
  CHECK_FALSE(secondRan.load());
  CHECK(secondOutcome == "aborted");
}
