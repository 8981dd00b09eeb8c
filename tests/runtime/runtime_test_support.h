// Helpers for the runtime tests: the process-wide V8 platform, tool revisions built in memory,
// a recording CapabilityHost, and ways to await ToolRunner::call (SandboxPool or
// ProcessSandboxPool) from a test thread.
#pragma once

#include "registry/registry.h"
#include "runtime/sandbox_pool.h"
#include "runtime/tool_runner.h"
#include "runtime/v8_platform.h"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace toolhost::runtime::testing {

// The platform lives for the whole test process, as in the daemon.
inline V8Platform& v8Platform() {
  static V8Platform platform;
  return platform;
}

// A sandboxed-code revision held only in memory. `extra` adds or replaces manifest members
// (limits, capabilities, ...); `modules` becomes execution.modules.
inline registry::ToolRevisionPtr makeTool(const std::string& source, boost::json::object extra = {},
                                          boost::json::object modules = {},
                                          std::string name = "test-tool") {
  static std::atomic<int> counter{0};
  auto tool = std::make_shared<registry::ToolRevision>();
  boost::json::object execution{
      {"class", "sandboxed-code"}, {"runtime", "javascript"}, {"source", source}};
  if (!modules.empty()) execution["modules"] = std::move(modules);
  boost::json::object manifest{{"name", name},
                               {"description", "a test tool"},
                               {"parameters", boost::json::object{{"type", "object"}}},
                               {"execution", std::move(execution)}};
  for (auto& [key, value] : extra) manifest[key] = value;
  tool->name = name;
  tool->revision = "sha256:test-" + std::to_string(++counter) + "-" + name;
  tool->manifest = std::move(manifest);
  tool->executionClass = registry::ExecutionClass::sandboxedCode;
  return tool;
}

// Records what the tools ask for; answers with fixed data.
class FakeHost : public CapabilityHost {
 public:
  // When set, runs first in every resolveInvocation (a test may block it there).
  std::function<void()> beforeResolve;

  boost::system::result<boost::json::object, HostOpFailure> resolveInvocation(
      const registry::ToolRevision& caller, const std::string& name,
      const boost::json::object&) override {
    if (beforeResolve) beforeResolve();
    std::lock_guard lock(mutex_);
    resolved.push_back(caller.name + " -> " + name);
    if (name == "missing") return HostOpFailure{"not-found", "no tool named \"missing\""};
    return boost::json::object{{"toolRevision", "sha256:resolved-" + name},
                               {"settingsRevision", "sha256:settings-" + name},
                               {"secretPath", "/etc/shadow"}};
  }

  boost::system::result<boost::json::array, std::string> createSubtasks(
      const registry::ToolRevision& caller, const boost::json::value& drafts,
      const boost::json::object& invocation) override {
    std::lock_guard lock(mutex_);
    subtasks.push_back(caller.name + " " + boost::json::serialize(drafts) + " " +
                       boost::json::serialize(invocation));
    return boost::json::array{boost::json::object{{"id", "sha256:task-1"}, {"drafts", drafts}}};
  }

  // Records "kind request-json", then hands the operation to `onOperation` if set, else to the
  // default CapabilityHost (which refuses it as not-authorized, synchronously).
  using OperationHandler =
      std::function<void(const std::string& kind, const boost::json::value& request,
                         std::shared_ptr<HostOperation> operation)>;
  void startOperation(const registry::ToolRevision& caller, const boost::json::object& invocation,
                      const std::string& kind, boost::json::value request,
                      std::shared_ptr<HostOperation> operation) override {
    OperationHandler handler;
    {
      std::lock_guard lock(mutex_);
      operations_.push_back(kind + " " + boost::json::serialize(request));
      handler = onOperation_;
    }
    if (handler) {
      handler(kind, request, std::move(operation));
    } else {
      CapabilityHost::startOperation(caller, invocation, kind, std::move(request),
                                     std::move(operation));
    }
  }

  void onOperation(OperationHandler handler) {
    std::lock_guard lock(mutex_);
    onOperation_ = std::move(handler);
  }
  std::vector<std::string> operations() const {
    std::lock_guard lock(mutex_);
    return operations_;
  }

  std::vector<std::string> resolved;
  std::vector<std::string> subtasks;

 private:
  mutable std::mutex mutex_;
  OperationHandler onOperation_;
  std::vector<std::string> operations_;
};

// A small pool for tests: short defaults so a runaway tool ends quickly.
// Polls `predicate` until it holds (true) or `timeout` passes (false).
// Stops an io_context and joins the thread running it when the scope ends, also when a REQUIRE
// throws (a joinable std::thread destroyed would end the whole test binary).
struct StopAndJoin {
  boost::asio::io_context& io;
  std::thread& thread;
  ~StopAndJoin() {
    io.stop();
    if (thread.joinable()) thread.join();
  }
};

template <typename Predicate>
bool waitFor(Predicate predicate,
             std::chrono::milliseconds timeout = std::chrono::milliseconds(15000)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!predicate()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

inline RuntimeConfig testConfig() {
  RuntimeConfig config;
  config.workers = 2;
  config.defaults.wallMs = 5000;
  config.defaults.cpuMs = 5000;
  config.defaults.heapMb = 32;
  config.defaults.arrayBufferMb = 16;
  return config;
}

// Awaits one call on a private io_context.
inline CallOutcome callTool(ToolRunner& pool, const registry::ToolRevisionPtr& tool,
                            const boost::json::object& arguments = {}, CallOptions options = {}) {
  boost::asio::io_context io;
  std::optional<CallOutcome> out;
  std::exception_ptr failure;
  boost::asio::co_spawn(io, pool.call(tool, arguments, std::move(options)),
                        [&](std::exception_ptr error, CallOutcome outcome) {
                          failure = error;
                          out = std::move(outcome);
                        });
  io.run();
  if (failure) std::rethrow_exception(failure);
  return std::move(*out);
}

struct CallRequest {
  registry::ToolRevisionPtr tool;
  boost::json::object arguments;
  CallOptions options;
};

// Starts every call at once (in order) and waits for all.
inline std::vector<CallOutcome> callTogether(ToolRunner& pool, std::vector<CallRequest> requests) {
  boost::asio::io_context io;
  std::vector<std::optional<CallOutcome>> out(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    boost::asio::co_spawn(io,
                          pool.call(requests[i].tool, requests[i].arguments, requests[i].options),
                          [&out, i](std::exception_ptr error, CallOutcome outcome) {
                            if (error) std::rethrow_exception(error);
                            out[i] = std::move(outcome);
                          });
  }
  io.run();
  std::vector<CallOutcome> results;
  for (auto& outcome : out) results.push_back(std::move(*outcome));
  return results;
}

// Starts a call, cancels it (terminal) after `after`, and waits for it.
inline CallOutcome callAndCancel(ToolRunner& pool, const registry::ToolRevisionPtr& tool,
                                 std::chrono::milliseconds after, CallOptions options = {}) {
  boost::asio::io_context io;
  boost::asio::cancellation_signal signal;
  std::optional<CallOutcome> out;
  boost::json::object arguments;
  boost::asio::co_spawn(io, pool.call(tool, arguments, std::move(options)),
                        boost::asio::bind_cancellation_slot(
                            signal.slot(), [&](std::exception_ptr error, CallOutcome outcome) {
                              if (error) std::rethrow_exception(error);
                              out = std::move(outcome);
                            }));
  boost::asio::steady_timer timer(io, after);
  timer.async_wait([&](boost::system::error_code) {
    if (!out) signal.emit(boost::asio::cancellation_type::terminal);
  });
  io.run();
  return std::move(*out);
}

// Cancels the call once `ready()` (polled every 10 ms, from this thread), not after a fixed time:
// on a loaded machine (a sanitizer build) the tool may take long to reach the point a test
// cancels it at. Cancels anyway after 20 s.
inline CallOutcome callAndCancelWhen(ToolRunner& pool, const registry::ToolRevisionPtr& tool,
                                     const std::function<bool()>& ready) {
  boost::asio::io_context io;
  boost::asio::cancellation_signal signal;
  std::optional<CallOutcome> out;
  boost::json::object arguments;
  boost::asio::co_spawn(io, pool.call(tool, arguments, {}),
                        boost::asio::bind_cancellation_slot(
                            signal.slot(), [&](std::exception_ptr error, CallOutcome outcome) {
                              if (error) std::rethrow_exception(error);
                              out = std::move(outcome);
                            }));
  boost::asio::steady_timer timer(io);
  const auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::function<void()> poll = [&] {
    timer.expires_after(std::chrono::milliseconds(10));
    timer.async_wait([&](boost::system::error_code) {
      if (out) return;
      if (ready() || std::chrono::steady_clock::now() > giveUp) {
        signal.emit(boost::asio::cancellation_type::terminal);
      } else {
        poll();
      }
    });
  };
  poll();
  io.run();
  return std::move(*out);
}

inline std::int64_t nowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The error code of an outcome, or nullopt for a result.
inline std::optional<CallErrc> errc(const CallOutcome& outcome) {
  if (outcome.result) return std::nullopt;
  return outcome.result.error().code;
}

inline std::string describe(const CallOutcome& outcome) {
  if (outcome.result) return "result " + boost::json::serialize(*outcome.result);
  return std::string(callErrcName(outcome.result.error().code)) + ": " +
         outcome.result.error().detail;
}

}  // namespace toolhost::runtime::testing

namespace toolhost::runtime::testing {

// A pool with a recording host, built after the platform.
struct PoolFixture {
  explicit PoolFixture(RuntimeConfig config = testConfig())
      : platform((v8Platform(), true)), pool(std::move(config), host) {}
  bool platform;
  FakeHost host;
  SandboxPool pool;

  CallOutcome call(const registry::ToolRevisionPtr& tool, const boost::json::object& arguments = {},
                   CallOptions options = {}) {
    return callTool(pool, tool, arguments, std::move(options));
  }
};

}  // namespace toolhost::runtime::testing
