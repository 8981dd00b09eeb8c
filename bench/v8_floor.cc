// The in-process V8 floors, with the daemon's V8 (libnode's 10.2) and the same platform and flags
// (runtime::V8Platform), on this one thread:
//   - rss: N isolates, each with a context kept alive (v8::Global), VmRSS delta / N. Measured
//     before the timing loops, which free memory, and after one isolate already exists (as in the
//     daemon, whose warm tool's sandbox exists before its baseline is taken).
//   - warm: one isolate and context; each call enters it (Locker, Isolate::Scope, HandleScope,
//     Context::Scope, TryCatch, as every entry into a sandbox does), JSON.parse of the arguments'
//     text, v8::Function::Call, JSON.stringify of the result into a std::string. Once with
//     `(args) => args`, once with `async (args) => args` plus the microtask checkpoint and the
//     promise's result (what a tool's default export costs).
//   - cold: isolate create + context + compile, instantiate and evaluate the ES module
//     `export default async (args) => args` (distinct text each time) + one call as above; then
//     dispose (NotifyIsolateShutdown + Dispose), timed separately.
//   - prewarmed: only the module's compile + evaluate + the call, in an isolate and context
//     created beforehand (what a pool of pre-warmed isolates would leave on the critical path).
//   - kept: the same create + call, but every isolate stays alive, as retained sandboxes do. In
//     a process of its own: V8 10.2 places each isolate's code range near its builtins and, unless
//     a disposed isolate left a range to reuse, finds room by parsing /proc/self/maps
//     (CodeRangeAddressHint::GetAddressHint -> OS::GetFreeMemoryRangesWithin), which grows with
//     every live isolate. The create + dispose loop above always reuses; retained sandboxes never.
#include "bench/bench.h"
#include "runtime/v8_platform.h"

#include <libplatform/libplatform.h>
#include <v8.h>

#include <memory>
#include <stdexcept>

namespace toolhost::bench {

namespace {

constexpr const char* kArguments = R"({"text":"hello","n":1})";

std::int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

v8::Local<v8::String> text(v8::Isolate* isolate, std::string_view value) {
  return v8::String::NewFromUtf8(isolate, value.data(), v8::NewStringType::kNormal,
                                 static_cast<int>(value.size()))
      .ToLocalChecked();
}

v8::Isolate* newIsolate(v8::ArrayBuffer::Allocator* allocator) {
  v8::Isolate::CreateParams params;
  params.array_buffer_allocator = allocator;
  v8::Isolate* isolate = v8::Isolate::New(params);
  isolate->SetMicrotasksPolicy(v8::MicrotasksPolicy::kExplicit);
  return isolate;
}

void dispose(v8::Isolate* isolate) {
  v8::platform::NotifyIsolateShutdown(runtime::V8Platform::current(), isolate);
  isolate->Dispose();
}

// JSON text in, `function` called, JSON text out; inside an entered isolate and context.
std::string callWithJson(v8::Isolate* isolate, v8::Local<v8::Context> context,
                         v8::Local<v8::Function> function, std::string_view arguments, bool async) {
  v8::TryCatch tryCatch(isolate);
  v8::Local<v8::Value> args;
  v8::Local<v8::Value> result;
  if (!v8::JSON::Parse(context, text(isolate, arguments)).ToLocal(&args) ||
      !function->Call(context, v8::Undefined(isolate), 1, &args).ToLocal(&result)) {
    throw std::runtime_error("the call threw");
  }
  if (async) {
    isolate->PerformMicrotaskCheckpoint();
    auto promise = result.As<v8::Promise>();
    if (promise->State() != v8::Promise::kFulfilled) throw std::runtime_error("the promise did not settle");
    result = promise->Result();
  }
  v8::Local<v8::String> out;
  if (!v8::JSON::Stringify(context, result).ToLocal(&out)) throw std::runtime_error("stringify failed");
  std::string json(static_cast<std::size_t>(out->Utf8Length(isolate)), '\0');
  out->WriteUtf8(isolate, json.data(), static_cast<int>(json.size()), nullptr,
                 v8::String::NO_NULL_TERMINATION);
  return json;
}

v8::Local<v8::Function> compileFunction(v8::Local<v8::Context> context, const char* source) {
  v8::Isolate* isolate = context->GetIsolate();
  auto script = v8::Script::Compile(context, text(isolate, source)).ToLocalChecked();
  return script->Run(context).ToLocalChecked().As<v8::Function>();
}

v8::MaybeLocal<v8::Module> noImports(v8::Local<v8::Context>, v8::Local<v8::String>,
                                     v8::Local<v8::FixedArray>, v8::Local<v8::Module>) {
  return {};
}

// The default export of an ES module, compiled and evaluated in `context`.
v8::Local<v8::Function> loadModule(v8::Local<v8::Context> context, const std::string& source) {
  v8::Isolate* isolate = context->GetIsolate();
  v8::ScriptOrigin origin(isolate, text(isolate, "source.js"), 0, 0, false, -1, v8::Local<v8::Value>(),
                          false, false, /*is_module=*/true);
  v8::ScriptCompiler::Source compilerSource(text(isolate, source), origin);
  v8::Local<v8::Module> module = v8::ScriptCompiler::CompileModule(isolate, &compilerSource).ToLocalChecked();
  if (!module->InstantiateModule(context, &noImports).FromMaybe(false)) throw std::runtime_error("instantiate failed");
  module->Evaluate(context).ToLocalChecked();
  isolate->PerformMicrotaskCheckpoint();
  return module->GetModuleNamespace()
      .As<v8::Object>()
      ->Get(context, text(isolate, "default"))
      .ToLocalChecked()
      .As<v8::Function>();
}

void measureRss(const V8FloorOptions& options, v8::ArrayBuffer::Allocator* allocator) {
  if (options.isolates.empty()) return;
  struct Kept {
    v8::Isolate* isolate;
    v8::Global<v8::Context> context;
  };
  auto create = [&](std::vector<Kept>& kept) {
    v8::Isolate* isolate = newIsolate(allocator);
    v8::Locker locker(isolate);
    v8::Isolate::Scope isolateScope(isolate);
    v8::HandleScope handleScope(isolate);
    kept.push_back(Kept{isolate, v8::Global<v8::Context>(isolate, v8::Context::New(isolate))});
  };
  std::vector<Kept> kept;
  kept.reserve(options.isolates.back() + 1);
  create(kept);  // the first isolate pays one-time costs; the baseline comes after it
  const std::uint64_t before = selfRssKb();
  std::size_t checkpoint = 0;
  std::vector<std::int64_t> window;  // create + context times since the previous checkpoint
  for (std::size_t n = 1; checkpoint < options.isolates.size(); ++n) {
    const auto start = nowNs();
    create(kept);
    window.push_back(nowNs() - start);
    if (n == options.isolates[checkpoint]) {
      const std::uint64_t after = selfRssKb();
      const std::string key = options.prefix + "rss." + std::to_string(n);
      emit(key + ".kb_per_isolate", static_cast<double>(after - before) / static_cast<double>(n));
      emit(key + ".create_p50_us", percentileNs(window, 50) / 1e3);
      window.clear();
      ++checkpoint;
    }
  }
  for (auto& item : kept) {
    {
      v8::Locker locker(item.isolate);
      item.context.Reset();
    }
    dispose(item.isolate);
  }
}

void measureWarm(const V8FloorOptions& options, v8::ArrayBuffer::Allocator* allocator) {
  if (options.warm == 0) return;
  v8::Isolate* isolate = newIsolate(allocator);
  v8::Global<v8::Context> globalContext;
  v8::Global<v8::Function> syncFunction, asyncFunction;
  {
    v8::Locker locker(isolate);
    v8::Isolate::Scope isolateScope(isolate);
    v8::HandleScope handleScope(isolate);
    auto context = v8::Context::New(isolate);
    v8::Context::Scope contextScope(context);
    globalContext.Reset(isolate, context);
    syncFunction.Reset(isolate, compileFunction(context, "(args) => args"));
    asyncFunction.Reset(isolate, compileFunction(context, "(async (args) => args)"));
  }
  for (bool async : {false, true}) {
    const auto& function = async ? asyncFunction : syncFunction;
    std::vector<std::int64_t> latencies;
    latencies.reserve(options.warm);
    const std::size_t warmup = options.warm / 10;
    for (std::size_t i = 0; i < warmup + options.warm; ++i) {
      const auto start = nowNs();
      {
        v8::Locker locker(isolate);
        v8::Isolate::Scope isolateScope(isolate);
        v8::HandleScope handleScope(isolate);
        auto context = globalContext.Get(isolate);
        v8::Context::Scope contextScope(context);
        auto out = callWithJson(isolate, context, function.Get(isolate), kArguments, async);
        if (out.size() != std::string_view(kArguments).size()) throw std::runtime_error("unexpected result " + out);
      }
      if (i >= warmup) latencies.push_back(nowNs() - start);
    }
    const std::string key = options.prefix + (async ? "warm_async" : "warm");
    emit(key + ".p50_us", percentileNs(latencies, 50) / 1e3);
    emit(key + ".p99_us", percentileNs(latencies, 99) / 1e3);
  }
  {
    v8::Locker locker(isolate);
    syncFunction.Reset();
    asyncFunction.Reset();
    globalContext.Reset();
  }
  dispose(isolate);
}

// A new isolate with a context, the module `source` evaluated and its default export called once.
v8::Isolate* createAndCall(v8::ArrayBuffer::Allocator* allocator, const std::string& source) {
  v8::Isolate* isolate = newIsolate(allocator);
  v8::Locker locker(isolate);
  v8::Isolate::Scope isolateScope(isolate);
  v8::HandleScope handleScope(isolate);
  auto context = v8::Context::New(isolate);
  v8::Context::Scope contextScope(context);
  auto function = loadModule(context, source);
  auto out = callWithJson(isolate, context, function, kArguments, /*async=*/true);
  if (out.size() != std::string_view(kArguments).size()) throw std::runtime_error("unexpected result " + out);
  return isolate;
}

void measureColdKept(const V8FloorOptions& options, v8::ArrayBuffer::Allocator* allocator) {
  if (options.kept == 0) return;
  std::vector<v8::Isolate*> kept;  // the context and module live on in each isolate's heap
  std::vector<std::int64_t> latencies;
  for (std::size_t i = 0; i < options.kept; ++i) {
    const auto start = nowNs();
    kept.push_back(createAndCall(allocator, "export default async (args) => args; // kept " + std::to_string(i)));
    latencies.push_back(nowNs() - start);
  }
  const std::string key = options.prefix + "cold_kept." + std::to_string(options.kept);
  emit(key + ".p50_us", percentileNs(latencies, 50) / 1e3);
  emit(key + ".p90_us", percentileNs(latencies, 90) / 1e3);
  for (v8::Isolate* isolate : kept) dispose(isolate);
}

void measureCold(const V8FloorOptions& options, v8::ArrayBuffer::Allocator* allocator) {
  if (options.cold == 0) return;
  std::vector<std::int64_t> createCall, withDispose;
  const std::size_t warmup = 5;
  for (std::size_t i = 0; i < warmup + options.cold; ++i) {
    const std::string source = "export default async (args) => args; // isolate " + std::to_string(i);
    const auto start = nowNs();
    v8::Isolate* isolate = createAndCall(allocator, source);
    const auto called = nowNs();
    dispose(isolate);
    const auto disposed = nowNs();
    if (i < warmup) continue;
    createCall.push_back(called - start);
    withDispose.push_back(disposed - start);
  }
  // What a pre-warmed isolate (created, with its context, before the call needs it) would leave
  // on the critical path: compile, instantiate and evaluate the module, then the call.
  std::vector<std::int64_t> prewarmed;
  for (std::size_t i = 0; i < warmup + options.cold; ++i) {
    v8::Isolate* isolate = newIsolate(allocator);
    {
      v8::Locker locker(isolate);
      v8::Isolate::Scope isolateScope(isolate);
      v8::HandleScope handleScope(isolate);
      auto context = v8::Context::New(isolate);
      v8::Context::Scope contextScope(context);
      const auto start = nowNs();
      auto function = loadModule(context, "export default async (args) => args; // warm " + std::to_string(i));
      callWithJson(isolate, context, function, kArguments, /*async=*/true);
      if (i >= warmup) prewarmed.push_back(nowNs() - start);
    }
    dispose(isolate);
  }
  emit(options.prefix + "prewarmed.p50_us", percentileNs(prewarmed, 50) / 1e3);
  emit(options.prefix + "cold.p50_us", percentileNs(createCall, 50) / 1e3);
  emit(options.prefix + "cold.p90_us", percentileNs(createCall, 90) / 1e3);
  emit(options.prefix + "cold_dispose.p50_us", percentileNs(withDispose, 50) / 1e3);
}

}  // namespace

int runV8Floor(const V8FloorOptions& options) {
  if (!options.v8Flags.empty()) {
    v8::V8::SetFlagsFromString(options.v8Flags.data(), options.v8Flags.size());
    emit(options.prefix + "v8_flags", options.v8Flags);
  }
  runtime::V8Platform platform(0, options.jit);
  emit(options.prefix + "version", runtime::v8Version());
  emit(options.prefix + "jit", options.jit ? "on" : "off");
  std::unique_ptr<v8::ArrayBuffer::Allocator> allocator(v8::ArrayBuffer::Allocator::NewDefaultAllocator());
  measureColdKept(options, allocator.get());
  measureRss(options, allocator.get());
  measureWarm(options, allocator.get());
  measureCold(options, allocator.get());
  return 0;
}

}  // namespace toolhost::bench
