// The daemon's disk thread: the LMDB writes that methods make (installs, activations, settings,
// task commits, policy decisions, secrets) and its slow whole-store reads run here, one job at a
// time in the order they were queued, instead of on an I/O thread. Each write ends with an
// fdatasync (no MDB_NOSYNC: store/store.h), which takes milliseconds on a laptop's disk and far
// longer on a busy or failing one; on an I/O thread it would stall every connection that thread
// serves. (ctx.storage and the audit log have writer threads of their own, which batch.)
//
//   auto outcome = co_await disk.run([&] { return registry.install(manifest); });
//
// Caveats:
//  - Pass a lambda that captures by reference only ([&]): g++ 12 destroys the by-value captures
//    of a closure made inside a co_await expression twice (a double free under AddressSanitizer).
//    Compute what the job needs into locals first.
//  - A job must not touch the awaiting coroutine's session or strand-bound state: it runs on the
//    disk thread while the coroutine is suspended. References to the coroutine's own locals are
//    fine (its frame outlives the job).
//  - Jobs of one connection keep the order in which its requests reached run(): requests start
//    in the order they arrived, and each reaches run() before its first suspension, so a
//    pipelined install then activate writes in that order.
//  - A job that has started is not cancellable: it finishes (a cancelled request resumes after
//    it, then ends). A job still queued when its request is cancelled (terminal cancellation:
//    $/cancelRequest, the client gone, the end of the shutdown grace) never runs: run() throws
//    boost::system::system_error(operation_aborted) instead. While a job is out, the caller's
//    executor has outstanding work, so a graceful stop waits for it.
//  - stop() runs (or skips, as above) every queued job, then joins. Call it after the io_context
//    has stopped and before it is destroyed (the completions are posted to it); the destructor
//    calls it too.
#pragma once

#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>

#include <atomic>
#include <exception>
#include <memory>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>

namespace toolhost::daemon {

class DiskThread {
 public:
  DiskThread();
  ~DiskThread();
  DiskThread(const DiskThread&) = delete;
  DiskThread& operator=(const DiskThread&) = delete;

  // Runs fn() on the disk thread and resumes the caller on its own executor with what fn
  // returned; an exception fn throws is rethrown in the caller.
  template <class F>
  boost::asio::awaitable<std::invoke_result_t<F&>> run(F fn);

  // Runs every queued job, then joins the thread. Idempotent.
  void stop();

  // True on the disk thread (for assertions and tests).
  bool onDiskThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  boost::asio::io_context context_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> keepAlive_;
  std::thread thread_;
};

template <class F>
boost::asio::awaitable<std::invoke_result_t<F&>> DiskThread::run(F fn) {
  using Result = std::invoke_result_t<F&>;
  static_assert(!std::is_void_v<Result> && !std::is_reference_v<Result>,
                "a disk job returns a value (a result<T> for a store write)");
  static_assert(std::is_trivially_destructible_v<F>,
                "a disk job captures by reference only (see the caveats above)");
  std::optional<Result> result;
  std::exception_ptr failure;
  co_await boost::asio::async_initiate<const boost::asio::use_awaitable_t<>&, void()>(
      [&](auto handler) {
        // The guard keeps the caller's executor busy (a graceful stop waits for the job); the
        // completion goes back to that executor, never runs on the disk thread.
        auto work = boost::asio::make_work_guard(boost::asio::get_associated_executor(handler));
        // Set by the caller's terminal cancellation (on the caller's executor, like the slot's
        // clearing below): a job still queued then is skipped.
        auto abandoned = std::make_shared<std::atomic<bool>>(false);
        auto slot = boost::asio::get_associated_cancellation_slot(handler);
        if (slot.is_connected()) {
          slot.assign([abandoned](boost::asio::cancellation_type type) {
            if ((type & boost::asio::cancellation_type::terminal) !=
                boost::asio::cancellation_type::none) {
              abandoned->store(true);
            }
          });
        }
        boost::asio::post(context_, [&, abandoned, handler = std::move(handler),
                                     work = std::move(work)]() mutable {
          if (abandoned->load()) {
            failure = std::make_exception_ptr(
                boost::system::system_error(boost::asio::error::operation_aborted));
          } else {
            try {
              result.emplace(fn());
            } catch (...) {
              failure = std::current_exception();
            }
          }
          auto executor = boost::asio::get_associated_executor(handler);
          boost::asio::post(executor, [handler = std::move(handler)]() mutable {
            auto assigned = boost::asio::get_associated_cancellation_slot(handler);
            if (assigned.is_connected()) assigned.clear();
            std::move(handler)();
          });
          work.reset();
        });
      },
      boost::asio::use_awaitable);
  if (failure) std::rethrow_exception(failure);
  co_return std::move(*result);
}

}  // namespace toolhost::daemon
