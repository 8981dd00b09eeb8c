#include "runtime/capabilities.h"

#include "protocol/json_text.h"
#include "runtime/json_bridge.h"
#include "runtime/sandbox.h"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>

#include <string>

namespace toolhost::runtime {
namespace json = boost::json;

namespace {

constexpr std::size_t kMaxToolNameBytes = 256;
constexpr std::size_t kMaxLoggedValueBytes = 16 * 1024;

enum class Door {
  globalFetch,
  fetch,
  popup,
  secret,
  storageGet,
  storageSet,
  storageDelete,
  storageList,
  resolveInvocation,
  createSubtasksResult,
};

constexpr const char* doorName(Door door) {
  switch (door) {
    case Door::globalFetch:
      return "fetch";
    case Door::fetch:
      return "ctx.fetch";
    case Door::popup:
      return "ctx.popup";
    case Door::secret:
      return "ctx.secret";
    case Door::storageGet:
      return "ctx.storage.get";
    case Door::storageSet:
      return "ctx.storage.set";
    case Door::storageDelete:
      return "ctx.storage.delete";
    case Door::storageList:
      return "ctx.storage.list";
    case Door::resolveInvocation:
      return "ctx.resolveInvocation";
    case Door::createSubtasksResult:
      return "ctx.createSubtasksResult";
  }
  return "ctx";
}

bool subtasksRequested(const registry::ToolRevision& tool) {
  const auto* capabilities = tool.manifest.if_contains("capabilities");
  if (capabilities == nullptr || !capabilities->is_object()) return false;
  const auto* subtasks = capabilities->as_object().if_contains("subtasks");
  return subtasks != nullptr && subtasks->is_bool() && subtasks->as_bool();
}

v8::Local<v8::Value> makeError(v8::Local<v8::Context> context, std::string_view message,
                               std::string_view code, bool typeError = false) {
  v8::Isolate* isolate = context->GetIsolate();
  auto text = v8String(isolate, message);
  auto error = typeError ? v8::Exception::TypeError(text) : v8::Exception::Error(text);
  if (error->IsObject()) {
    error.As<v8::Object>()
        ->CreateDataProperty(context, v8String(isolate, "code"), v8String(isolate, code))
        .FromMaybe(false);
  }
  return error;
}

void reject(v8::Local<v8::Context> context, v8::Local<v8::Promise::Resolver> resolver,
            std::string_view message, std::string_view code, bool typeError = false) {
  resolver->Reject(context, makeError(context, message, code, typeError)).FromMaybe(false);
}

// The host's answer to resolveInvocation, reduced to the opaque revisions.
HostOpResult resolveInvocationOnHost(CapabilityHost& host, const registry::ToolRevision& tool,
                                     const std::string& name) {
  auto resolved = host.resolveInvocation(tool, name);
  if (!resolved) return HostOpFailure{"failed", resolved.error()};
  json::object out;
  for (const char* key : {"toolRevision", "settingsRevision"}) {
    if (const auto* value = resolved->if_contains(key); value != nullptr && value->is_string()) {
      out[key] = *value;
    }
  }
  if (!out.contains("toolRevision")) {
    return HostOpFailure{"failed", "no revision could be resolved for \"" + name + "\""};
  }
  return json::value(std::move(out));
}

template <Door door>
void onDoor(const v8::FunctionCallbackInfo<v8::Value>& info) {
  v8::Isolate* isolate = info.GetIsolate();
  v8::HandleScope scope(isolate);
  v8::Local<v8::Context> context = isolate->GetCurrentContext();
  v8::Local<v8::Promise::Resolver> resolver;
  if (!v8::Promise::Resolver::New(context).ToLocal(&resolver)) return;
  info.GetReturnValue().Set(resolver->GetPromise());

  Sandbox& sandbox = Sandbox::from(isolate);
  CallState* call = sandbox.currentCall();
  const bool sameCall = call != nullptr && !call->ended &&
                        (door == Door::globalFetch ||
                         (info.Data()->IsNumber() && info.Data().As<v8::Number>()->Value() ==
                                                         static_cast<double>(call->epoch)));
  if (!sameCall) {
    reject(context, resolver,
           std::string(doorName(door)) +
               ": this call has ended; a ctx belongs to the call it was passed to and cannot be "
               "used after that call returns",
           "call-ended");
    return;
  }

  if constexpr (door == Door::resolveInvocation || door == Door::createSubtasksResult) {
    if (!subtasksRequested(sandbox.tool())) {
      reject(context, resolver,
             std::string(doorName(door)) +
                 " is not authorized: the tool's manifest does not request capabilities.subtasks",
             "not-authorized");
      return;
    }
    CapabilityHost* host = call->host;
    registry::ToolRevisionPtr tool = call->tool;
    std::function<HostOpResult()> work;
    if constexpr (door == Door::resolveInvocation) {
      if (info.Length() < 1 || !info[0]->IsString() ||
          static_cast<std::size_t>(info[0].As<v8::String>()->Utf8Length(isolate)) >
              kMaxToolNameBytes) {
        reject(context, resolver,
               "ctx.resolveInvocation(name) takes a tool name: a string of at most 256 bytes",
               "invalid-argument", true);
        return;
      }
      std::string name = toUtf8(isolate, info[0].As<v8::String>());
      work = [host, tool, name] { return resolveInvocationOnHost(*host, *tool, name); };
    } else {
      auto drafts =
          toJson(context, info.Length() > 0 ? info[0] : v8::Undefined(isolate).As<v8::Value>(),
                 sandbox.toJsonOptions("the drafts"));
      if (!drafts) {
        if (drafts.error().kind == ToJsonError::Kind::killed) return;  // the call is ending
        reject(context, resolver, "ctx.createSubtasksResult(drafts): " + drafts.error().detail,
               "invalid-argument", true);
        return;
      }
      work = [host, tool, drafts = std::move(*drafts),
              invocation = call->invocation]() -> HostOpResult {
        auto tasks = host->createSubtasks(*tool, drafts, invocation);
        if (!tasks) return HostOpFailure{"failed", tasks.error()};
        return json::value(std::move(*tasks));
      };
    }
    if (!sandbox.startHostOp(resolver, std::move(work))) {
      reject(context, resolver, std::string(doorName(door)) + ": this call has ended",
             "call-ended");
    }
  } else {
    reject(context, resolver,
           std::string(doorName(door)) +
               " is not authorized: the policy engine has not granted it to this tool",
           "not-authorized");
  }
}

// One console argument as text: strings as they are, data as JSON, anything else described.
std::string describeForLog(v8::Local<v8::Context> context, v8::Local<v8::Value> value) {
  v8::Isolate* isolate = context->GetIsolate();
  v8::TryCatch tryCatch(isolate);
  if (value->IsString()) return toUtf8(isolate, value.As<v8::String>(), kMaxLoggedValueBytes);
  if (value->IsUndefined()) return "undefined";
  if (value->IsSymbol()) return "Symbol()";
  if (value->IsFunction()) return "[Function]";
  if (value->IsProxy()) return "[Proxy]";
  if (value->IsNativeError()) {
    v8::Local<v8::Value> stack;
    if (value.As<v8::Object>()->Get(context, v8String(isolate, "stack")).ToLocal(&stack) &&
        stack->IsString()) {
      return toUtf8(isolate, stack.As<v8::String>(), kMaxLoggedValueBytes);
    }
  }
  if (value->IsObject() && !value->IsDate() && !value->IsRegExp()) {
    ToJsonOptions options;
    options.maxDepth = 16;
    options.maxBytes = kMaxLoggedValueBytes;
    options.what = "value";
    if (auto data = toJson(context, value, options)) return protocol::writeJson(*data);
  }
  v8::Local<v8::String> text;
  if (!tryCatch.HasTerminated() && value->ToString(context).ToLocal(&text)) {
    std::string out = toUtf8(isolate, text, kMaxLoggedValueBytes);
    return value->IsBigInt() ? out + "n" : out;
  }
  return "[value]";
}

template <int level>
void onConsole(const v8::FunctionCallbackInfo<v8::Value>& info) {
  static constexpr const char* kLevels[] = {"log", "info", "warn", "error", "debug"};
  v8::Isolate* isolate = info.GetIsolate();
  v8::HandleScope scope(isolate);
  Sandbox& sandbox = Sandbox::from(isolate);
  CallState* call = sandbox.currentCall();
  if (call == nullptr || call->logsTruncated) return;
  v8::Local<v8::Context> context = isolate->GetCurrentContext();
  std::string line;
  for (int i = 0; i < info.Length(); ++i) {
    if (i > 0) line += ' ';
    line += describeForLog(context, info[i]);
    if (line.size() > call->maxLogBytes || isolate->IsExecutionTerminating()) break;
  }
  sandbox.appendLog(kLevels[level], line);
}

v8::MaybeLocal<v8::Function> function(v8::Local<v8::Context> context, v8::FunctionCallback callback,
                                      v8::Local<v8::Value> data, int length, const char* name) {
  v8::Local<v8::Function> out;
  if (!v8::Function::New(context, callback, data, length, v8::ConstructorBehavior::kThrow)
           .ToLocal(&out)) {
    return {};
  }
  out->SetName(v8String(context->GetIsolate(), name));
  return out;
}

// Sets each member and freezes the object. False if V8 refused (termination).
bool fillFrozen(v8::Local<v8::Context> context, v8::Local<v8::Object> object,
                std::initializer_list<std::pair<const char*, v8::Local<v8::Value>>> members) {
  v8::Isolate* isolate = context->GetIsolate();
  for (const auto& [key, value] : members) {
    if (value.IsEmpty()) return false;
    if (!object->CreateDataProperty(context, v8String(isolate, key), value).FromMaybe(false)) {
      return false;
    }
  }
  return object->SetIntegrityLevel(context, v8::IntegrityLevel::kFrozen).FromMaybe(false);
}

v8::Local<v8::Value> orEmpty(v8::MaybeLocal<v8::Function> function) {
  v8::Local<v8::Function> out;
  return function.ToLocal(&out) ? out.As<v8::Value>() : v8::Local<v8::Value>();
}

}  // namespace

void installGlobals(v8::Local<v8::Context> context) {
  v8::Isolate* isolate = context->GetIsolate();
  v8::Local<v8::Object> global = context->Global();
  for (const char* name : {"SharedArrayBuffer", "Atomics", "WebAssembly", "console"}) {
    global->Delete(context, v8String(isolate, name)).FromMaybe(false);
  }
  v8::Local<v8::Value> none;
  v8::Local<v8::Object> console = v8::Object::New(isolate);
  for (const auto& [name, callback] :
       std::initializer_list<std::pair<const char*, v8::FunctionCallback>>{
           {"log", &onConsole<0>},
           {"info", &onConsole<1>},
           {"warn", &onConsole<2>},
           {"error", &onConsole<3>},
           {"debug", &onConsole<4>}}) {
    console
        ->CreateDataProperty(context, v8String(isolate, name),
                             orEmpty(function(context, callback, none, 0, name)))
        .FromMaybe(false);
  }
  global->DefineOwnProperty(context, v8String(isolate, "console"), console, v8::DontEnum)
      .FromMaybe(false);
  global
      ->DefineOwnProperty(context, v8String(isolate, "fetch"),
                          orEmpty(function(context, &onDoor<Door::globalFetch>, none, 2, "fetch")),
                          v8::DontEnum)
      .FromMaybe(false);
}

v8::MaybeLocal<v8::Object> makeCtx(v8::Local<v8::Context> context, const CallState& call) {
  v8::Isolate* isolate = context->GetIsolate();
  v8::EscapableHandleScope scope(isolate);
  // The epoch binds every function to this call (exact in a double: epochs stay below 2^53).
  v8::Local<v8::Value> epoch = v8::Number::New(isolate, static_cast<double>(call.epoch));
  auto door = [&](v8::FunctionCallback callback, int length, const char* name) {
    return orEmpty(function(context, callback, epoch, length, name));
  };
  v8::Local<v8::Object> tool = v8::Object::New(isolate);
  v8::Local<v8::Object> storage = v8::Object::New(isolate);
  v8::Local<v8::Object> ctx = v8::Object::New(isolate);
  const bool ok =
      fillFrozen(context, tool,
                 {{"name", v8String(isolate, call.tool->name)},
                  {"revision", v8String(isolate, call.tool->revision)}}) &&
      fillFrozen(context, storage,
                 {{"get", door(&onDoor<Door::storageGet>, 1, "get")},
                  {"set", door(&onDoor<Door::storageSet>, 2, "set")},
                  {"delete", door(&onDoor<Door::storageDelete>, 1, "delete")},
                  {"list", door(&onDoor<Door::storageList>, 0, "list")}}) &&
      fillFrozen(
          context, ctx,
          {{"tool", tool},
           {"fetch", door(&onDoor<Door::fetch>, 2, "fetch")},
           {"popup", door(&onDoor<Door::popup>, 1, "popup")},
           {"secret", door(&onDoor<Door::secret>, 1, "secret")},
           {"storage", storage},
           {"resolveInvocation", door(&onDoor<Door::resolveInvocation>, 1, "resolveInvocation")},
           {"createSubtasksResult",
            door(&onDoor<Door::createSubtasksResult>, 1, "createSubtasksResult")}});
  if (!ok) return {};
  return scope.Escape(ctx);
}

}  // namespace toolhost::runtime
