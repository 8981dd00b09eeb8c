// One sandbox: an isolate, its context and the tool's evaluated module, kept across the calls of
// one revision. Not thread-safe: used from one strand (one thread at a time, maybe a different
// worker each time). Every entry into the isolate is a segment that takes v8::Locker +
// Isolate::Scope + HandleScope + Context::Scope, sets the stack limit for the current thread and
// arms the watchdog; between segments only v8::Global members remain, so the strand may suspend.
#pragma once

#include "registry/registry.h"
#include "runtime/call_outcome.h"
#include "runtime/call_state.h"
#include "runtime/capabilities.h"
#include "runtime/capability_host.h"
#include "runtime/counting_allocator.h"
#include "runtime/json_bridge.h"
#include "runtime/limits.h"
#include "runtime/watchdog.h"

#include <v8.h>

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <boost/system/result.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace toolhost::runtime {

struct SandboxSettings {
  std::int64_t heapMb = 64;
  std::int64_t arrayBufferMb = 64;
  bool operator==(const SandboxSettings&) const = default;
};

class Sandbox {
 public:
  enum class Progress { settled, pending, failed };
  struct Step {
    Progress progress = Progress::failed;
    std::optional<CallError> error;  // with Progress::failed
  };

  // Creates the isolate and context (no tool code runs yet). `watchdog` and `platform` outlive it.
  // Without a tool it is a pre-warmed shell: adopt() gives it its one revision before its first
  // call (SandboxPool keeps one ready so that a first call does not wait for Isolate::New).
  Sandbox(registry::ToolRevisionPtr tool, SandboxSettings settings, Watchdog& watchdog,
          v8::Platform& platform);
  // Disposes the isolate. No call may be active.
  ~Sandbox();
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  // One call: beginCall, start, then resume while it is pending or has host operations
  // outstanding, then result (if settled), then always endCall.
  void beginCall(std::shared_ptr<CallState> call);
  // Evaluates the module on the first call, then invokes the default export with the arguments
  // and a fresh ctx, and drains microtasks.
  Step start(const boost::json::object& arguments);
  // Settles completed host operations into their promises and drains microtasks.
  Step resume();
  // The settled value as JSON (getters run here, inside the call's limits). A start() or
  // resume() that left the promise settled with no host operation outstanding already converted
  // it in its own segment (one lock, watchdog arm and heap measurement fewer per call): then this
  // only hands it over, and hasResult() is true until it does.
  using Result = boost::system::result<boost::json::value, CallError>;
  Result result();
  bool hasResult() const { return result_.has_value(); }
  // Ends the call: ctx functions reject from now on, no host operation can start, per-call
  // handles are released, and the heap is measured.
  void endCall();

  // Why JavaScript was stopped, if it was. Sticky: a killed sandbox must be discarded.
  Kill kill() const { return static_cast<Kill>(kill_.load()); }
  // Records a stop decided outside JavaScript (a cancel or timeout between segments).
  void stop(Kill reason);
  // Heap in use plus ArrayBuffer bytes, measured at the end of the last call.
  std::uint64_t heapBytes() const { return heapBytes_; }
  const SandboxSettings& settings() const { return settings_; }
  const registry::ToolRevision& tool() const { return *tool_; }
  // Gives a shell made without a tool its revision, once, before any call. Throws
  // std::logic_error if it already has one.
  void adopt(registry::ToolRevisionPtr tool);

  // --- For the capability callbacks (capabilities.cc), inside a segment. ---
  static Sandbox& from(v8::Isolate* isolate);
  // Isolate message listener: an error nothing caught, into the running call's console output.
  static void uncaughtMessage(v8::Local<v8::Message> message, v8::Local<v8::Value> error);
  // Isolate promise-reject callback: after a kill, any rejection asks for termination again.
  static void promiseRejected(v8::PromiseRejectMessage message);
  // The running call, or nullptr.
  CallState* currentCall() { return call_.get(); }
  // Starts a host operation settling `resolver` with a reply of `kind`: `start` runs on the
  // strand after this segment, outside the isolate, with the operation's HostOperation (which it
  // hands to the host, or completes itself); the completion is settled in a later segment. With
  // kMaxRunningOps of the call's operations started and not yet settled, it waits until one is.
  // Nothing is started once the call ended, with kMaxOutstandingOps outstanding, or when the
  // request's `requestBytes` would take the call's outstanding requests past
  // kMaxOutstandingRequestBytes (checked here, after the request was built: building it may have
  // run the tool's getters, which may have started operations of their own).
  using StartOp = std::function<void(std::shared_ptr<HostOperation>)>;
  enum class HostOpStart { started, callEnded, tooMany, tooLarge };
  HostOpStart startHostOp(v8::Local<v8::Promise::Resolver> resolver, ReplyKind kind, StartOp start,
                          std::size_t requestBytes);
  // A fresh ArrayBuffer of `length` uninitialized bytes allocated through the counting allocator
  // (never V8's fatal out-of-memory path). Empty when refused: the call is then killed with the
  // ArrayBuffer limit.
  v8::MaybeLocal<v8::ArrayBuffer> newArrayBuffer(std::size_t length);
  // The ArrayBuffer limit in bytes: also what the runtime's natives copy of a tool's data at most.
  std::size_t arrayBufferLimit() const { return allocator_->limit(); }
  const Prelude& prelude() const { return prelude_; }
  void appendLog(std::string_view level, std::string_view text);
  ToJsonOptions toJsonOptions(const char* what) const;

 private:
  struct JsScope;

  template <typename Body>
  auto segment(Body&& body) -> decltype(body(std::declval<JsScope&>()));

  // Compiles and links the tool's modules, then (unless only checking) evaluates them.
  std::optional<CallError> loadModule(JsScope& js, bool evaluate = true);
  v8::MaybeLocal<v8::Module> compileModule(JsScope& js, const std::string& name,
                                           const std::string& source);
  static v8::MaybeLocal<v8::Module> resolveModule(v8::Local<v8::Context> context,
                                                  v8::Local<v8::String> specifier,
                                                  v8::Local<v8::FixedArray> assertions,
                                                  v8::Local<v8::Module> referrer);
  // The call's state after its last segment. A rejection is described once (its getters run
  // once), and its description kept: each later segment would otherwise run them again.
  Step inspect(JsScope& js);
  // The call failed with `exception`: describes it (with failing_ set, so that what its getters
  // start is refused) and keeps the description in failure_.
  Step failWith(JsScope& js, v8::Local<v8::Value> exception, const std::string& what);
  // inspect(), and the settled value's conversion when nothing remains for the call to wait for.
  Step inspectAndConvert(JsScope& js);
  Result convert(JsScope& js);
  CallError thrown(JsScope& js, v8::Local<v8::Value> exception, CallErrc code,
                   const std::string& what);
  CallError compileError(JsScope& js, v8::TryCatch& tryCatch, const std::string& what);
  void drain(JsScope& js);

  static std::size_t nearHeapLimit(void* data, std::size_t current, std::size_t initial);
  static void arrayBufferRefused(void* data);
  // Stops the running JavaScript for `reason` (the first reason recorded sticks). Isolate thread.
  void terminate(Kill reason);

  registry::ToolRevisionPtr tool_;
  SandboxSettings settings_;
  Watchdog& watchdog_;
  v8::Platform& platform_;
  std::shared_ptr<CountingAllocator> allocator_;
  v8::Isolate* isolate_ = nullptr;
  std::atomic<int> kill_{0};
  bool heapLimitRaised_ = false;  // by nearHeapLimit, on the isolate's thread
  std::uint64_t heapBytes_ = 0;
  // V8's used heap as the call's last segment ended, for endCall (no JavaScript runs between
  // them, so the heap is the same). Reset by beginCall.
  std::optional<std::size_t> usedHeapAfterSegment_;
  std::optional<Result> result_;  // converted by the segment that saw the call settle
  // The call failed (the tool threw, or its promise rejected): no host operation starts from
  // then on, and failure_ is its outcome, whatever ran since.
  bool failing_ = false;
  std::optional<CallError> failure_;

  v8::Global<v8::Context> context_;
  v8::Global<v8::Function> main_;  // the default export, once the module evaluated

  // While loading the module: every compiled module with its name, for resolveModule.
  struct LoadedModule {
    std::string name;
    v8::Global<v8::Module> module;
  };
  std::vector<LoadedModule> modules_;

  // The running call and its JavaScript-side state.
  std::shared_ptr<CallState> call_;
  v8::Global<v8::Promise> promise_;  // what the default export returned, if a promise
  v8::Global<v8::Value> value_;      // what it returned otherwise
  struct PendingOp {
    v8::Global<v8::Promise::Resolver> resolver;
    ReplyKind kind;
    std::size_t requestBytes = 0;
  };
  std::vector<PendingOp> pending_;  // host operations of this call, by CallState::Completion index
  // Operations of this call started with the host and not yet settled, and those waiting for one
  // of them to settle (kMaxRunningOps).
  std::size_t runningOps_ = 0;
  std::deque<std::pair<std::shared_ptr<HostOperation>, StartOp>> waitingOps_;
  void launchOp(std::shared_ptr<HostOperation> operation, StartOp start);

  Prelude prelude_;  // made with the context, before any tool code
};

}  // namespace toolhost::runtime
