#include "runtime/sandbox.h"

#include "protocol/json_text.h"
#include "runtime/capabilities.h"
#include "runtime/fetch_api.h"
#include "runtime/module_specifier.h"
#include "runtime/v8_platform.h"

#include <libplatform/libplatform.h>
#include <spdlog/spdlog.h>

#include <pthread.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

namespace toolhost::runtime {
namespace json = boost::json;

namespace {

constexpr std::uint32_t kSandboxSlot = 0;  // Isolate::GetData slot holding the Sandbox*
constexpr const char* kSourceName = "source.js";
constexpr std::size_t kMaxErrorText = 4096;
constexpr std::size_t kMaxStackText = 16 * 1024;
constexpr int kMaxPumpedTasks = 64;  // platform tasks run per drain
// How long a kill waits once a module's evaluation began (see loadModule): until the thread has
// run this much CPU time, far more than V8 takes to start the module's code and short next to any
// limit (CPU time, so that a thread preempted at that moment is still held when it resumes), and
// at most the wall-clock cap.
constexpr auto kModuleStartCpu = std::chrono::milliseconds(10);
constexpr auto kModuleStartWallCap = std::chrono::seconds(1);
// Heap limits granted after a heap kill, so that V8 never aborts the daemon while the
// termination unwinds (see nearHeapLimit). A single V8 allocation is at most about 1 GiB.
constexpr std::size_t kFirstKillHeadroom = std::size_t{1152} * kMiB;
constexpr std::size_t kHeapHeadroom = 64 * kMiB;
constexpr std::size_t kMaxHeapAfterKill = std::size_t{4096} * kMiB;

v8::MaybeLocal<v8::Promise> rejectDynamicImport(v8::Local<v8::Context> context,
                                                v8::Local<v8::Data> /*hostDefinedOptions*/,
                                                v8::Local<v8::Value> /*resourceName*/,
                                                v8::Local<v8::String> /*specifier*/,
                                                v8::Local<v8::FixedArray> /*assertions*/) {
  v8::Isolate* isolate = context->GetIsolate();
  v8::Local<v8::Promise::Resolver> resolver;
  if (!v8::Promise::Resolver::New(context).ToLocal(&resolver)) return {};
  resolver
      ->Reject(context, v8::Exception::TypeError(v8String(
                            isolate,
                            "import() is not available in a sandbox; use a static import of one "
                            "of the tool's own modules")))
      .FromMaybe(false);
  return resolver->GetPromise();
}

bool refuseWasm(v8::Local<v8::Context>, v8::Local<v8::String>) { return false; }

v8::ModifyCodeGenerationFromStringsResult refuseCodeGeneration(v8::Local<v8::Context>,
                                                               v8::Local<v8::Value>, bool) {
  return {};  // codegen_allowed = false
}

// Frees a backing store made by Sandbox::newArrayBuffer, through the allocator that counted it.
// The allocator outlives every backing store of the isolate (the isolate shares its ownership).
void freeThroughAllocator(void* data, std::size_t length, void* allocator) {
  static_cast<CountingAllocator*>(allocator)->Free(data, length);
}

void onOutOfMemory(const char* location, bool isHeap) {
  // V8 aborts right after this; the near-heap-limit callback exists so it never gets here.
  spdlog::critical("V8 ran out of {} memory at {}: the daemon is aborting",
                   isHeap ? "heap" : "process", location != nullptr ? location : "?");
}

}  // namespace

struct Sandbox::JsScope {
  v8::Isolate* isolate;
  v8::Local<v8::Context> context;
  CallState& call;
};

Sandbox::Sandbox(registry::ToolRevisionPtr tool, SandboxSettings settings, Watchdog& watchdog,
                 v8::Platform& platform)
    : tool_(std::move(tool)),
      settings_(settings),
      watchdog_(watchdog),
      platform_(platform),
      allocator_(std::make_shared<CountingAllocator>(
          static_cast<std::size_t>(settings.arrayBufferMb) * kMiB)) {
  v8::Isolate::CreateParams params;
  params.constraints.ConfigureDefaultsFromHeapSize(
      0, static_cast<std::size_t>(settings.heapMb) * kMiB);
  // That also sizes a code range, which V8 then reserves even --jitless, where nothing goes in
  // it. Reserving one means finding room near the embedded builtins by parsing /proc/self/maps,
  // which grows with every isolate alive: with 1,000 sandboxes retained, a new one took 6 ms
  // instead of 1.2. Zero means none without the JIT (and V8's own default with it).
  if (!V8Platform::jit()) params.constraints.set_code_range_size_in_bytes(0);
  params.array_buffer_allocator_shared = allocator_;
  params.allow_atomics_wait = false;
  isolate_ = v8::Isolate::New(params);
  isolate_->SetData(kSandboxSlot, this);
  allocator_->setRefusalHook(&Sandbox::arrayBufferRefused, this);
  isolate_->SetMicrotasksPolicy(v8::MicrotasksPolicy::kExplicit);
  isolate_->AddNearHeapLimitCallback(&Sandbox::nearHeapLimit, this);
  isolate_->SetHostImportModuleDynamicallyCallback(&rejectDynamicImport);
  isolate_->SetAllowWasmCodeGenerationCallback(&refuseWasm);
  isolate_->SetModifyCodeGenerationFromStringsCallback(&refuseCodeGeneration);
  isolate_->SetOOMErrorHandler(&onOutOfMemory);
  // Errors no TryCatch sees (one thrown in a FinalizationRegistry callback): without a listener
  // V8 prints them to the process's stderr, which is the daemon's log. They go to the console
  // output of the call running, if any, like anything else the tool says.
  isolate_->AddMessageListenerWithErrorLevel(&Sandbox::uncaughtMessage, v8::Isolate::kMessageError);
  // V8 10.2's import() clears a termination raised while it converts its specifier and rejects
  // its promise instead; a tool whose specifier's toString runs long catches every repeat of the
  // watchdog's kill that way. A rejection after a kill asks for the termination again at once:
  // it lands as soon as the tool's own code runs on.
  isolate_->SetPromiseRejectCallback(&Sandbox::promiseRejected);

  bool installed = false;
  {
    v8::Locker locker(isolate_);
    v8::Isolate::Scope isolateScope(isolate_);
    v8::HandleScope handleScope(isolate_);
    v8::Local<v8::Context> context = v8::Context::New(isolate_);
    context->AllowCodeGenerationFromStrings(false);
    v8::Context::Scope contextScope(context);
    context_.Reset(isolate_, context);
    installed = installGlobals(context, prelude_);
    if (!installed) {
      context_.Reset();
      prelude_.reset();
    }
  }
  if (!installed) {
    // Only V8 refusing memory gets here; the isolate cannot be used.
    allocator_->setRefusalHook(nullptr, nullptr);
    v8::platform::NotifyIsolateShutdown(&platform_, isolate_);
    isolate_->Dispose();
    throw std::runtime_error("the sandbox's context could not be set up");
  }
}

Sandbox::~Sandbox() {
  {
    v8::Locker locker(isolate_);
    v8::Isolate::Scope isolateScope(isolate_);
    pending_.clear();
    prelude_.reset();
    promise_.Reset();
    value_.Reset();
    main_.Reset();
    modules_.clear();
    context_.Reset();
  }
  allocator_->setRefusalHook(nullptr, nullptr);
  v8::platform::NotifyIsolateShutdown(&platform_, isolate_);
  isolate_->Dispose();
}

void Sandbox::adopt(registry::ToolRevisionPtr tool) {
  if (tool_ || !tool) throw std::logic_error("a sandbox adopts exactly one revision");
  tool_ = std::move(tool);
}

void Sandbox::uncaughtMessage(v8::Local<v8::Message> message, v8::Local<v8::Value> /*error*/) {
  v8::Isolate* isolate = message->GetIsolate();
  Sandbox& sandbox = from(isolate);
  if (sandbox.currentCall() == nullptr || isolate->IsExecutionTerminating()) return;
  v8::HandleScope scope(isolate);
  sandbox.appendLog("uncaught", toUtf8(isolate, message->Get(), kMaxErrorText));
}

void Sandbox::promiseRejected(v8::PromiseRejectMessage message) {
  v8::Isolate* isolate = message.GetPromise()->GetIsolate();
  if (from(isolate).kill() != Kill::none) isolate->TerminateExecution();
}

Sandbox& Sandbox::from(v8::Isolate* isolate) {
  return *static_cast<Sandbox*>(isolate->GetData(kSandboxSlot));
}

std::size_t Sandbox::nearHeapLimit(void* data, std::size_t current, std::size_t /*initial*/) {
  // V8 offers only "raise the limit" or "abort the process" here (pitfall 1). So: terminate, and
  // raise the limit above what the heap already holds (a large object can be admitted past the
  // limit before any callback) by enough for the termination to unwind. The first time, the
  // headroom also covers one maximal single allocation (V8 calls this once before its
  // last-resort collection and aborts if the retry does not fit); a limit V8 merely reserves
  // costs nothing until used. The sandbox is discarded after the call.
  auto* self = static_cast<Sandbox*>(data);
  self->terminate(Kill::memoryLimit);
  v8::HeapStatistics heap;
  self->isolate_->GetHeapStatistics(&heap);
  const std::size_t held = std::max(current, heap.total_heap_size());
  const std::size_t headroom =
      self->heapLimitRaised_ ? std::max(kHeapHeadroom, held / 2) : kFirstKillHeadroom;
  self->heapLimitRaised_ = true;
  const std::size_t raised = std::min(held + headroom, kMaxHeapAfterKill);
  return std::max(raised, current + kMiB);
}

void Sandbox::arrayBufferRefused(void* data) {
  static_cast<Sandbox*>(data)->terminate(Kill::arrayBufferLimit);
}

void Sandbox::terminate(Kill reason) {
  recordKill(kill_, reason);
  isolate_->TerminateExecution();
  // Through the watchdog too, so that it knows when this segment was told to stop: a builtin
  // that keeps running (and allocating) anyway shows as stalled a grace period after this, not
  // after the wall-clock deadline (SandboxPool::stalled).
  if (call_) watchdog_.kill(call_->epoch, reason);
}

void Sandbox::stop(Kill reason) { recordKill(kill_, reason); }

namespace {
// Below this wall time a segment is charged its wall time, an upper bound of its thread's CPU
// time, instead of reading the thread's CPU clock again: that read is a system call (the thread
// clocks have no vDSO path) and most segments of a warm call take a few microseconds. A segment
// can be over-charged only by the time it was preempted, at most this much.
constexpr auto kWallChargedSegment = std::chrono::microseconds(50);

std::int64_t segmentCpuNs(clockid_t cpuClock, std::int64_t cpuStart,
                          Watchdog::Clock::duration wall) {
  if (wall < kWallChargedSegment) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(wall).count();
  }
  return Watchdog::cpuNowNs(cpuClock) - cpuStart;
}
}  // namespace

template <typename Body>
auto Sandbox::segment(Body&& body) -> decltype(body(std::declval<JsScope&>())) {
  CallState& call = *call_;
  v8::Locker locker(isolate_);
  v8::Isolate::Scope isolateScope(isolate_);
  v8::HandleScope handleScope(isolate_);
  v8::Local<v8::Context> context = context_.Get(isolate_);
  v8::Context::Scope contextScope(context);
  // The stack belongs to whichever worker runs this segment: set the limit from here.
  const auto here = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  isolate_->SetStackLimit(here - static_cast<std::uintptr_t>(call.limits.stackKb) * 1024);

  clockid_t cpuClock{};
  if (pthread_getcpuclockid(pthread_self(), &cpuClock) != 0) cpuClock = CLOCK_THREAD_CPUTIME_ID;
  const auto wallStart = Watchdog::Clock::now();
  const std::int64_t cpuStart = Watchdog::cpuNowNs(cpuClock);
  const std::int64_t cpuLeft = call.limits.cpuMs * 1'000'000 - call.cpuUsedNs;
  // A pause of the wall clock moves the deadline; operations complete between segments, so the
  // deadline taken here holds for the whole segment.
  watchdog_.arm(call.epoch, {isolate_, &kill_, call.wallClock().deadline, cpuClock,
                             cpuStart + cpuLeft, cpuStart});
  // A cancel that came before the arm could not reach it; it is seen here instead.
  if (call.cancelRequested.load()) recordKill(kill_, Kill::cancelled);

  JsScope js{isolate_, context, call};
  using Result = decltype(body(js));
  Result out{};
  try {
    if (kill() == Kill::none) out = body(js);
  } catch (...) {
    // The sandbox is discarded by the caller: its isolate must be out of the watchdog first.
    watchdog_.disarm(call.epoch);
    isolate_->CancelTerminateExecution();
    throw;
  }

  // A large object can be admitted past the heap limit without a collection (and so without the
  // near-heap-limit callback); the next collection would then kill whichever call comes next.
  // Check here, so the call that went over the limit is the one that ends.
  v8::HeapStatistics heap;
  isolate_->GetHeapStatistics(&heap);
  const auto heapLimit = static_cast<std::size_t>(settings_.heapMb) * kMiB;
  if (kill() == Kill::none && heap.used_heap_size() > heapLimit) {
    isolate_->LowMemoryNotification();  // only garbage over the limit: collect it and look again
    isolate_->GetHeapStatistics(&heap);
    if (heap.used_heap_size() > heapLimit) recordKill(kill_, Kill::memoryLimit);
  }

  watchdog_.disarm(call.epoch);
  // From here no kill of this segment can arrive. One that landed after the JavaScript finished
  // would still be pending in the isolate: clear it (the sandbox is discarded anyway).
  if (kill() != Kill::none || isolate_->IsExecutionTerminating()) {
    isolate_->CancelTerminateExecution();
  }
  call.cpuUsedNs += segmentCpuNs(cpuClock, cpuStart, Watchdog::Clock::now() - wallStart);
  call.heapPeakBytes =
      std::max<std::uint64_t>(call.heapPeakBytes, heap.used_heap_size() + allocator_->peak());
  usedHeapAfterSegment_ = heap.used_heap_size();
  return out;
}

void Sandbox::drain(JsScope& js) {
  for (int i = 0; i < kMaxPumpedTasks && kill() == Kill::none; ++i) {
    if (!v8::platform::PumpMessageLoop(&platform_, js.isolate,
                                       v8::platform::MessageLoopBehavior::kDoNotWait)) {
      break;
    }
  }
  if (kill() == Kill::none) js.isolate->PerformMicrotaskCheckpoint();
}

void Sandbox::beginCall(std::shared_ptr<CallState> call) {
  call_ = std::move(call);
  allocator_->resetPeak();
  usedHeapAfterSegment_.reset();
  result_.reset();
  failing_ = false;
  failure_.reset();
}

Sandbox::Step Sandbox::start(const json::object& arguments) {
  return segment([&](JsScope& js) -> Step {
    if (js.call.checkOnly) {  // runs nothing of the tool
      if (auto error = loadModule(js, false)) return Step{Progress::failed, std::move(error)};
      result_ = Result(json::value(nullptr));
      return Step{Progress::settled, {}};
    }
    if (main_.IsEmpty()) {
      if (auto error = loadModule(js)) return Step{Progress::failed, std::move(error)};
    }
    const std::string text = protocol::writeJson(arguments);
    const std::size_t heapLimit = static_cast<std::size_t>(settings_.heapMb) * kMiB;
    if (const auto needed = parseHeapEstimate(arguments, text.size()); needed > heapLimit / 2) {
      // Checked against what the heap holds now only when it could matter (the figure costs a
      // walk of the heap's spaces).
      v8::HeapStatistics heap;
      js.isolate->GetHeapStatistics(&heap);
      if (heap.used_heap_size() + needed > heapLimit) {
        return Step{
            Progress::failed,
            CallError{CallErrc::memoryLimit,
                      "the arguments (" + std::to_string(text.size()) +
                          " bytes of JSON) would take about " + std::to_string(needed / kMiB + 1) +
                          " MiB of the sandbox's heap, more than its limit of " +
                          std::to_string(settings_.heapMb) + " MiB leaves",
                      {}}};
      }
    }
    v8::TryCatch tryCatch(js.isolate);
    v8::Local<v8::Value> args;
    v8::Local<v8::Object> ctx;
    if (!fromJsonText(js.context, text).ToLocal(&args) ||
        !makeCtx(js.context, js.call, prelude_).ToLocal(&ctx)) {
      return Step{Progress::failed,
                  CallError{CallErrc::memoryLimit, "the arguments do not fit in the sandbox", {}}};
    }
    v8::Local<v8::Value> argv[] = {args, ctx};
    v8::Local<v8::Value> returned;
    if (!main_.Get(js.isolate)
             ->Call(js.context, v8::Undefined(js.isolate), 2, argv)
             .ToLocal(&returned)) {
      if (tryCatch.HasTerminated()) return Step{};
      return failWith(js, tryCatch.Exception(), "the tool threw");
    }
    if (returned->IsPromise()) {
      promise_.Reset(js.isolate, returned.As<v8::Promise>());
    } else {
      value_.Reset(js.isolate, returned);
    }
    drain(js);
    return inspectAndConvert(js);
  });
}

Sandbox::Step Sandbox::resume() {
  return segment([&](JsScope& js) -> Step {
    while (!js.call.completions.empty() && kill() == Kill::none) {
      CallState::Completion completion = std::move(js.call.completions.front());
      js.call.completions.pop_front();
      --js.call.outstandingOps;
      // Its place with the host goes to the operation that waited longest.
      --runningOps_;
      if (!waitingOps_.empty() && js.call.post) {
        auto [operation, start] = std::move(waitingOps_.front());
        waitingOps_.pop_front();
        launchOp(std::move(operation), std::move(start));
      }
      v8::HandleScope scope(js.isolate);
      PendingOp& pending = pending_.at(completion.resolver);
      js.call.outstandingRequestBytes -= pending.requestBytes;
      pending.requestBytes = 0;
      v8::Local<v8::Promise::Resolver> resolver = pending.resolver.Get(js.isolate);
      pending.resolver.Reset();
      if (completion.result) {
        auto value = replyToJs(*this, js.context, pending.kind, *completion.result);
        if (kill() != Kill::none) break;
        if (value) {
          resolver->Resolve(js.context, *value).FromMaybe(false);
          continue;
        }
        completion.result = std::move(value.error());
      }
      const HostOpFailure& failure = completion.result.error();
      resolver->Reject(js.context, makeHostError(js.context, failure.message, failure.code))
          .FromMaybe(false);
    }
    drain(js);
    return inspectAndConvert(js);
  });
}

Sandbox::Step Sandbox::inspect(JsScope& js) {
  if (kill() != Kill::none) return Step{};
  if (failure_) return Step{Progress::failed, failure_};
  if (promise_.IsEmpty()) return Step{Progress::settled, {}};
  v8::Local<v8::Promise> promise = promise_.Get(js.isolate);
  switch (promise->State()) {
    case v8::Promise::kPending:
      return Step{Progress::pending, {}};
    case v8::Promise::kRejected:
      return failWith(js, promise->Result(), "the tool's promise rejected");
    case v8::Promise::kFulfilled:
      break;
  }
  return Step{Progress::settled, {}};
}

Sandbox::Step Sandbox::failWith(JsScope& js, v8::Local<v8::Value> exception,
                                const std::string& what) {
  failing_ = true;
  failure_ = thrown(js, exception, CallErrc::toolThrew, what);
  return Step{Progress::failed, failure_};
}

Sandbox::Step Sandbox::inspectAndConvert(JsScope& js) {
  Step step = inspect(js);
  if (step.progress == Progress::settled && js.call.outstandingOps == 0) result_ = convert(js);
  return step;
}

Sandbox::Result Sandbox::convert(JsScope& js) {
  v8::Local<v8::Value> value =
      promise_.IsEmpty() ? value_.Get(js.isolate) : promise_.Get(js.isolate)->Result();
  if (value.IsEmpty()) value = v8::Undefined(js.isolate);
  ToJsonOptions options = toJsonOptions("the result");
  options.maxBytes = static_cast<std::size_t>(js.call.limits.outputBytes);
  auto converted = toJson(js.context, value, options);
  if (converted) return std::move(*converted);
  switch (converted.error().kind) {
    case ToJsonError::Kind::tooLarge:
      return CallError{CallErrc::outputTooLarge, converted.error().detail, {}};
    case ToJsonError::Kind::invalid:
      return CallError{CallErrc::invalidResult, converted.error().detail, {}};
    case ToJsonError::Kind::killed:
      break;
  }
  return CallError{CallErrc::cancelled, "stopped", {}};  // the caller reports the kill
}

Sandbox::Result Sandbox::result() {
  if (result_) {
    Result out = std::move(*result_);
    result_.reset();
    return out;
  }
  return segment([&](JsScope& js) { return convert(js); });
}

void Sandbox::endCall() {
  // Operations still waiting never reached the host: nothing of them to abort.
  waitingOps_.clear();
  runningOps_ = 0;
  {
    v8::Locker locker(isolate_);
    v8::Isolate::Scope isolateScope(isolate_);
    pending_.clear();
    promise_.Reset();
    value_.Reset();
    result_.reset();
    // GetHeapStatistics walks every space and page: skip it when the last segment just did.
    std::size_t used = 0;
    if (usedHeapAfterSegment_) {
      used = *usedHeapAfterSegment_;
    } else {
      v8::HeapStatistics heap;
      isolate_->GetHeapStatistics(&heap);
      used = heap.used_heap_size();
    }
    heapBytes_ = used + allocator_->used();
  }
  if (call_) {
    // Operations still outstanding are aborted, outside every V8 lock: the host cancels its I/O
    // or prompt; a completion that comes anyway is dropped.
    auto aborts = endOperations(*call_);
    const std::string name = call_->tool->name;
    call_.reset();
    runAborts(std::move(aborts), name);
  }
}

Sandbox::HostOpStart Sandbox::startHostOp(v8::Local<v8::Promise::Resolver> resolver, ReplyKind kind,
                                          StartOp start, std::size_t requestBytes) {
  if (!call_ || call_->ended || !call_->post || failing_) return HostOpStart::callEnded;
  if (call_->outstandingOps >= kMaxOutstandingOps) return HostOpStart::tooMany;
  if (requestBytes > kMaxOutstandingRequestBytes - call_->outstandingRequestBytes) {
    return HostOpStart::tooLarge;
  }
  const std::size_t index = pending_.size();
  pending_.push_back(
      PendingOp{v8::Global<v8::Promise::Resolver>(isolate_, resolver), kind, requestBytes});
  ++call_->outstandingOps;
  call_->outstandingRequestBytes += requestBytes;
  std::shared_ptr<CallOperation> operation = newOperation(call_, index);
  if (runningOps_ >= kMaxRunningOps) {
    waitingOps_.emplace_back(std::move(operation), std::move(start));
    return HostOpStart::started;
  }
  launchOp(std::move(operation), std::move(start));
  return HostOpStart::started;
}

void Sandbox::launchOp(std::shared_ptr<HostOperation> operation, StartOp start) {
  ++runningOps_;
  // `post` is written only on this strand, so it may be read here without the mutex.
  call_->post([call = call_, operation = std::move(operation), start = std::move(start)]() {
    if (call->ended) return;  // cut short before the host heard of it: nothing to abort
    try {
      start(operation);
    } catch (const std::exception& e) {
      spdlog::error("runtime: starting a host operation of {} threw: {}", call->tool->name,
                    e.what());
      operation->complete(HostOpFailure{"failed", "the host failed to start the operation"});
    }
  });
}

v8::MaybeLocal<v8::ArrayBuffer> Sandbox::newArrayBuffer(std::size_t length) {
  if (length == 0) return v8::ArrayBuffer::New(isolate_, 0);
  void* data = allocator_->AllocateUninitialized(length);
  if (data == nullptr) {
    // Over the limit (the allocator already recorded the kill), or malloc failed.
    terminate(Kill::arrayBufferLimit);
    return {};
  }
  std::shared_ptr<v8::BackingStore> store =
      v8::ArrayBuffer::NewBackingStore(data, length, &freeThroughAllocator, allocator_.get());
  return v8::ArrayBuffer::New(isolate_, std::move(store));
}

void Sandbox::appendLog(std::string_view level, std::string_view text) {
  if (!call_ || call_->logsTruncated) return;
  CallState& call = *call_;
  std::string line = "[" + std::string(level) + "] " + std::string(text) + "\n";
  if (call.logs.size() + line.size() > call.maxLogBytes) {
    call.logs += "[truncated] console output past " + std::to_string(call.maxLogBytes) +
                 " bytes was dropped\n";
    call.logsTruncated = true;
    return;
  }
  call.logs += line;
}

ToJsonOptions Sandbox::toJsonOptions(const char* what) const {
  ToJsonOptions options;
  options.maxDepth = call_ ? call_->maxResultDepth : 128;
  options.maxBytes = call_ ? static_cast<std::size_t>(call_->limits.outputBytes) : 2 * kMiB;
  options.killed = &kill_;
  options.what = what;
  return options;
}

// --- Modules ---

v8::MaybeLocal<v8::Module> Sandbox::compileModule(JsScope& js, const std::string& name,
                                                  const std::string& source) {
  v8::ScriptOrigin origin(js.isolate, v8String(js.isolate, name), 0, 0, false, -1,
                          v8::Local<v8::Value>(), false, false, /*is_module=*/true);
  v8::ScriptCompiler::Source compilerSource(v8String(js.isolate, source), origin);
  v8::Local<v8::Module> module;
  if (!v8::ScriptCompiler::CompileModule(js.isolate, &compilerSource).ToLocal(&module)) return {};
  modules_.push_back(LoadedModule{name, v8::Global<v8::Module>(js.isolate, module)});
  return module;
}

v8::MaybeLocal<v8::Module> Sandbox::resolveModule(v8::Local<v8::Context> context,
                                                  v8::Local<v8::String> specifier,
                                                  v8::Local<v8::FixedArray> /*assertions*/,
                                                  v8::Local<v8::Module> referrer) {
  v8::Isolate* isolate = context->GetIsolate();
  Sandbox& self = from(isolate);
  // Every module was compiled (and every specifier checked) before instantiation.
  for (const auto& importer : self.modules_) {
    if (importer.module != referrer) continue;
    auto name = resolveModuleSpecifier(importer.name, toUtf8(isolate, specifier));
    for (const auto& candidate : self.modules_) {
      if (name && candidate.name == *name) return candidate.module.Get(isolate);
    }
  }
  isolate->ThrowException(v8::Exception::SyntaxError(v8String(isolate, "unresolved import")));
  return {};
}

CallError Sandbox::compileError(JsScope& js, v8::TryCatch& tryCatch, const std::string& what) {
  if (tryCatch.HasTerminated()) return CallError{CallErrc::cancelled, "stopped", {}};
  CallError error = thrown(js, tryCatch.Exception(), CallErrc::invalidModule, what);
  v8::Local<v8::Message> message = tryCatch.Message();
  if (!message.IsEmpty()) {
    const int line = message->GetLineNumber(js.context).FromMaybe(0);
    std::string resource = "?";
    if (message->GetScriptResourceName()->IsString()) {
      resource = toUtf8(js.isolate, message->GetScriptResourceName().As<v8::String>(), 256);
    }
    error.detail += " (" + resource + ":" + std::to_string(line) + ")";
  }
  return error;
}

std::optional<CallError> Sandbox::loadModule(JsScope& js, bool evaluate) {
  auto invalid = [](std::string detail) {
    return CallError{CallErrc::invalidModule, std::move(detail), {}};
  };
  const json::object& execution = tool_->manifest.at("execution").as_object();
  const json::string& source = execution.at("source").as_string();
  const json::object* modules = nullptr;
  if (const auto* found = execution.if_contains("modules");
      found != nullptr && found->is_object()) {
    modules = &found->as_object();
  }

  // No termination may land between Module::Evaluate's entry and the start of the module's
  // code: V8 10.2 then aborts the whole process (a CHECK on the module's status), so a cancel
  // that came at that moment took down the sandbox host and every call in it. Kills wait until
  // the module's code has been running for a while; compiling and linking run no JavaScript.
  struct Release {
    Watchdog& watchdog;
    std::uint64_t epoch;
    ~Release() { watchdog.release(epoch); }
  } release{watchdog_, js.call.epoch};
  watchdog_.hold(js.call.epoch, Watchdog::Clock::time_point::max());

  v8::TryCatch tryCatch(js.isolate);
  modules_.clear();
  v8::Local<v8::Module> root;
  if (!compileModule(js, kSourceName, std::string(source)).ToLocal(&root)) {
    return compileError(js, tryCatch, "the tool's source does not compile");
  }
  // Compile everything reachable first, so an unknown specifier is named before instantiation.
  for (std::size_t i = 0; i < modules_.size(); ++i) {
    v8::HandleScope scope(js.isolate);
    const std::string importer = modules_[i].name;
    v8::Local<v8::FixedArray> requests = modules_[i].module.Get(js.isolate)->GetModuleRequests();
    for (int r = 0; r < requests->Length(); ++r) {
      auto request = requests->Get(js.context, r).As<v8::ModuleRequest>();
      const std::string specifier = toUtf8(js.isolate, request->GetSpecifier(), 512);
      auto name = resolveModuleSpecifier(importer, specifier);
      const json::value* text = name && modules != nullptr ? modules->if_contains(*name) : nullptr;
      if (text == nullptr || !text->is_string()) {
        std::string known;
        if (modules != nullptr) {
          for (const auto& [moduleName, unused] : *modules) {
            if (known.size() > 200) {
              known += ", ...";
              break;
            }
            known += (known.empty() ? "" : ", ") + std::string(moduleName);
          }
        }
        return invalid(importer + " imports \"" + specifier +
                       "\", which is not one of this revision's modules (" +
                       (known.empty() ? "it has none" : known) +
                       "); a tool can import only its own execution.modules");
      }
      const bool compiled = std::any_of(modules_.begin(), modules_.end(),
                                        [&](const LoadedModule& m) { return m.name == *name; });
      if (!compiled) {
        v8::Local<v8::Module> unused;
        if (!compileModule(js, *name, std::string(text->as_string())).ToLocal(&unused)) {
          return compileError(js, tryCatch, "module " + *name + " does not compile");
        }
      }
    }
  }
  if (!root->InstantiateModule(js.context, &Sandbox::resolveModule).FromMaybe(false)) {
    return compileError(js, tryCatch, "the tool's modules cannot be linked");
  }
  // No top-level await: V8 10.2 aborts the whole process (a CHECK in ExecuteAsyncModule) when a
  // kill lands as one async module's evaluation completes and its async importer's begins, which
  // a tool can make happen at will, racing its own wall-clock limit or a cancel. Module scope has
  // nothing to await anyway (no ctx, no host operation can complete while modules load).
  if (root->IsGraphAsync()) {
    std::string where = "one of the tool's modules (an import cycle)";
    for (const auto& loaded : modules_) {
      v8::Local<v8::Module> module = loaded.module.Get(js.isolate);
      if (!module->IsGraphAsync()) continue;
      // Its own code awaits when none of the modules it imports does.
      bool importsAsync = false;
      v8::Local<v8::FixedArray> requests = module->GetModuleRequests();
      for (int r = 0; r < requests->Length() && !importsAsync; ++r) {
        auto request = requests->Get(js.context, r).As<v8::ModuleRequest>();
        auto name =
            resolveModuleSpecifier(loaded.name, toUtf8(js.isolate, request->GetSpecifier(), 512));
        for (const auto& other : modules_) {
          if (name && other.name == *name && other.module.Get(js.isolate)->IsGraphAsync()) {
            importsAsync = true;
          }
        }
      }
      if (!importsAsync) {
        where = loaded.name;
        break;
      }
    }
    return invalid(where +
                   " uses top-level await, which tools cannot: await inside the default "
                   "export instead");
  }
  if (!evaluate) {
    modules_.clear();
    return std::nullopt;
  }
  // A kill recorded while the modules compiled or linked (the near-heap-limit callback terminates
  // at once, past the watchdog's hold) would still be pending when Evaluate begins, where V8 10.2
  // aborts the process instead of failing the evaluation: stop before it.
  if (kill() != Kill::none || js.isolate->IsExecutionTerminating()) {
    return CallError{CallErrc::cancelled, "stopped", {}};
  }
  v8::Local<v8::Value> evaluated;
  watchdog_.hold(js.call.epoch, Watchdog::Clock::now() + kModuleStartWallCap, kModuleStartCpu);
  const bool ran = root->Evaluate(js.context).ToLocal(&evaluated);
  watchdog_.release(js.call.epoch);
  if (!ran) return compileError(js, tryCatch, "the module threw while it was evaluated");
  drain(js);
  if (kill() != Kill::none) return CallError{CallErrc::cancelled, "stopped", {}};
  if (evaluated->IsPromise()) {
    auto promise = evaluated.As<v8::Promise>();
    if (promise->State() == v8::Promise::kRejected) {
      return thrown(js, promise->Result(), CallErrc::invalidModule,
                    "the module threw while it was evaluated");
    }
    if (promise->State() == v8::Promise::kPending) {
      return invalid("the module's top-level await never settles");
    }
  }
  v8::Local<v8::Value> exported;
  if (!root->GetModuleNamespace()
           .As<v8::Object>()
           ->Get(js.context, v8String(js.isolate, "default"))
           .ToLocal(&exported)) {
    return compileError(js, tryCatch, "the module's default export cannot be read");
  }
  if (!exported->IsFunction()) {
    v8::Local<v8::String> type = exported->TypeOf(js.isolate);
    return invalid(
        "the module's default export is not a function (it is " +
        (exported->IsUndefined() ? std::string("missing") : "a " + toUtf8(js.isolate, type)) +
        "); write `export default async (args, ctx) => result`");
  }
  main_.Reset(js.isolate, exported.As<v8::Function>());
  modules_.clear();  // the module graph lives on through the default export
  return std::nullopt;
}

// --- Errors ---

CallError Sandbox::thrown(JsScope& js, v8::Local<v8::Value> exception, CallErrc code,
                          const std::string& what) {
  v8::TryCatch tryCatch(js.isolate);  // a throwing getter on the error must not escape
  std::string name, message, stack, errorCode;
  bool haveMessage = false;
  if (!exception.IsEmpty() && exception->IsObject() && !exception->IsProxy()) {
    auto object = exception.As<v8::Object>();
    auto field = [&](const char* key, std::size_t max, std::string& out) {
      v8::Local<v8::Value> value;
      if (kill() == Kill::none &&
          object->Get(js.context, v8String(js.isolate, key)).ToLocal(&value) && value->IsString()) {
        out = toUtf8(js.isolate, value.As<v8::String>(), max);
        return true;
      }
      return false;
    };
    field("name", 256, name);
    haveMessage = field("message", kMaxErrorText, message);
    field("stack", kMaxStackText, stack);
    field("code", 256, errorCode);
  }
  if (!haveMessage && !exception.IsEmpty() && kill() == Kill::none) {
    v8::Local<v8::String> text;
    if (!exception->IsSymbol() && exception->ToString(js.context).ToLocal(&text)) {
      message = toUtf8(js.isolate, text, kMaxErrorText);
    } else {
      message = "a value that cannot be shown";
    }
  }
  json::object toolError{{"name", name}, {"message", message}, {"stack", stack}};
  if (!errorCode.empty()) toolError["code"] = errorCode;
  if (!exception.IsEmpty() && exception->IsNativeError() && name == "RangeError" &&
      message == "Maximum call stack size exceeded") {
    return CallError{CallErrc::stackLimit,
                     "the tool overflowed its stack limit of " +
                         std::to_string(js.call.limits.stackKb) +
                         " KiB (Maximum call stack size exceeded)",
                     std::move(toolError)};
  }
  return CallError{code, what + ": " + (name.empty() ? "" : name + ": ") + message,
                   std::move(toolError)};
}

}  // namespace toolhost::runtime
