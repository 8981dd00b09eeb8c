#include "runtime/capabilities.h"

#include "protocol/json_text.h"
#include "registry/tool_storage.h"
#include "runtime/fetch_api.h"
#include "runtime/json_bridge.h"
#include "runtime/sandbox.h"
#include "runtime/web_globals.h"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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

void reject(v8::Local<v8::Context> context, v8::Local<v8::Promise::Resolver> resolver,
            std::string_view message, std::string_view code, bool typeError = false) {
  resolver->Reject(context, makeHostError(context, message, code, typeError)).FromMaybe(false);
}

// The host's answer to resolveInvocation, reduced to the opaque revisions.
HostOpResult opaqueRevisions(HostOpResult resolved, const std::string& name) {
  if (!resolved) return resolved;
  json::object out;
  if (const auto* object = resolved->if_object()) {
    for (const char* key : {"toolRevision", "settingsRevision"}) {
      if (const auto* value = object->if_contains(key); value != nullptr && value->is_string()) {
        out[key] = *value;
      }
    }
  }
  if (!out.contains("toolRevision")) {
    return HostOpFailure{"failed", "no revision could be resolved for \"" + name + "\""};
  }
  return json::value(std::move(out));
}

HostOpResult subtasksArray(HostOpResult tasks) {
  if (tasks && !tasks->is_array()) {
    return HostOpFailure{"failed", "the daemon's answer was not an array of tasks"};
  }
  return tasks;
}

// An operation whose result goes through `map` before it reaches `inner`.
class MappedOperation final : public HostOperation {
 public:
  MappedOperation(std::shared_ptr<HostOperation> inner,
                  std::function<HostOpResult(HostOpResult)> map)
      : inner_(std::move(inner)), map_(std::move(map)) {}
  void complete(HostOpResult result) override { inner_->complete(map_(std::move(result))); }
  void pauseWallClock() override { inner_->pauseWallClock(); }
  void resumeWallClock() override { inner_->resumeWallClock(); }
  void onAbort(std::function<void()> abort) override { inner_->onAbort(std::move(abort)); }

 private:
  const std::shared_ptr<HostOperation> inner_;
  const std::function<HostOpResult(HostOpResult)> map_;
};

// What an operation door hands to CapabilityHost::startOperation.
struct OperationRequest {
  const char* kind;
  json::value request;
  ReplyKind reply = ReplyKind::json;
};

// Secret names are short identifiers (the vault takes at most 64 bytes, and says so); a far
// longer one is refused here, before it is copied.
constexpr std::size_t kMaxSecretNameBytes = 1024;

// A string argument, or a TypeError naming it.
std::optional<std::string> stringArgument(v8::Local<v8::Context> context,
                                          v8::Local<v8::Value> value, const std::string& what,
                                          std::size_t maxBytes) {
  if (!value->IsString()) {
    throwInvalidArgument(context, what + " must be a string");
    return std::nullopt;
  }
  // Before anything reads it (see toUtf8Within); the exact UTF-8 size is checked after.
  const auto tooLong = [&] {
    throwInvalidArgument(context, what + " is longer than " + std::to_string(maxBytes) + " bytes");
    return std::nullopt;
  };
  if (static_cast<std::size_t>(value.As<v8::String>()->Length()) > maxBytes) return tooLong();
  if (!wellFormed(context->GetIsolate(), value.As<v8::String>())) {
    throwInvalidArgument(context, what +
                                      " holds a lone surrogate (half of a UTF-16 pair): it "
                                      "has no UTF-8 form and could not be told from others");
    return std::nullopt;
  }
  auto text = toUtf8Within(context->GetIsolate(), value.As<v8::String>(), maxBytes);
  if (!text) return tooLong();
  return text;
}

std::optional<OperationRequest> popupRequest(v8::Local<v8::Context> context,
                                             v8::Local<v8::Value> argument) {
  v8::Isolate* isolate = context->GetIsolate();
  static constexpr const char* kUsage =
      "ctx.popup(request) takes {kind: \"custom-html\", html: string} or {kind: \"origin\", url: "
      "string}";
  if (!argument->IsObject()) {
    throwInvalidArgument(context, kUsage);
    return std::nullopt;
  }
  auto object = argument.As<v8::Object>();
  v8::Local<v8::Value> kind;
  if (!object->Get(context, v8String(isolate, "kind")).ToLocal(&kind)) return std::nullopt;
  const std::string kindText = kind->IsString() ? toUtf8(isolate, kind.As<v8::String>(), 64) : "";
  const char* member = kindText == "custom-html" ? "html" : kindText == "origin" ? "url" : nullptr;
  if (member == nullptr) {
    throwInvalidArgument(context, kUsage);
    return std::nullopt;
  }
  v8::Local<v8::Value> value;
  if (!object->Get(context, v8String(isolate, member)).ToLocal(&value)) return std::nullopt;
  if (!value->IsString()) {
    throwInvalidArgument(context, kUsage);
    return std::nullopt;
  }
  auto text = toUtf8Within(isolate, value.As<v8::String>(), kMaxOutstandingRequestBytes);
  if (!text) {
    throwTooLarge(context, "ctx.popup(request): request." + std::string(member) +
                               " holds more than " +
                               std::to_string(kMaxOutstandingRequestBytes >> 20) +
                               " MiB, the most one call's requests may hold");
    return std::nullopt;
  }
  json::object request;
  request["kind"] = kindText;
  request[member] = std::move(*text);
  return OperationRequest{"popup", std::move(request)};
}

// The arguments the tool passed to a door: the callback's own for the global fetch; after the
// epoch and the door's index for the native door behind ctx (see kCtxFactory).
struct DoorArgs {
  const v8::FunctionCallbackInfo<v8::Value>& info;
  int first = 0;

  v8::Local<v8::Value> operator[](int i) const { return info[first + i]; }
  int length() const { return std::max(info.Length() - first, 0); }
};

// The request of an operation door, or nullopt with an exception pending (or nothing pending if
// the call is being killed).
template <Door door>
std::optional<OperationRequest> operationRequest(v8::Local<v8::Context> context, Sandbox& sandbox,
                                                 const DoorArgs& info) {
  if constexpr (door == Door::globalFetch || door == Door::fetch) {
    auto request = fetchRequest(context, info[0], info[1]);
    if (!request) return std::nullopt;
    return OperationRequest{"fetch", std::move(*request), ReplyKind::fetchResponse};
  } else if constexpr (door == Door::popup) {
    return popupRequest(context, info[0]);
  } else if constexpr (door == Door::secret) {
    auto name = stringArgument(context, info[0], "ctx.secret(name): name", kMaxSecretNameBytes);
    if (!name) return std::nullopt;
    return OperationRequest{"secret", json::object{{"name", *name}}};
  } else if constexpr (door == Door::storageList) {
    (void)sandbox;
    return OperationRequest{"storage", json::object{{"op", "list"}}};
  } else {
    static_assert(door == Door::storageGet || door == Door::storageSet ||
                  door == Door::storageDelete);
    const char* op = door == Door::storageGet ? "get" : door == Door::storageSet ? "set" : "delete";
    auto key = stringArgument(context, info[0], std::string("ctx.storage.") + op + "(key): key",
                              registry::kMaxStorageKeyBytes);
    if (!key) return std::nullopt;
    json::object request{{"op", op}, {"key", *key}};
    if constexpr (door == Door::storageSet) {
      auto value = toJson(context, info[1], sandbox.toJsonOptions("the value"));
      if (!value) {
        if (value.error().kind != ToJsonError::Kind::killed) {
          throwInvalidArgument(context, "ctx.storage.set(key, value): " + value.error().detail);
        }
        return std::nullopt;
      }
      request["value"] = std::move(*value);
    }
    return OperationRequest{"storage", std::move(request)};
  }
}

// One door. `epoch` is the epoch the ctx was made for (empty for the global fetch, which belongs
// to whichever call is running).
template <Door door>
void onDoor(const DoorArgs& info, v8::Local<v8::Value> epoch) {
  v8::Isolate* isolate = info.info.GetIsolate();
  v8::HandleScope scope(isolate);
  v8::Local<v8::Context> context = isolate->GetCurrentContext();
  v8::Local<v8::Promise::Resolver> resolver;
  if (!v8::Promise::Resolver::New(context).ToLocal(&resolver)) return;
  info.info.GetReturnValue().Set(resolver->GetPromise());

  Sandbox& sandbox = Sandbox::from(isolate);
  CallState* call = sandbox.currentCall();
  const bool sameCall =
      call != nullptr && !call->ended &&
      (door == Door::globalFetch ||
       (!epoch.IsEmpty() && epoch->IsNumber() &&
        epoch.As<v8::Number>()->Value() == static_cast<double>(call->epoch)));
  if (!sameCall) {
    reject(context, resolver,
           std::string(doorName(door)) +
               ": this call has ended; a ctx belongs to the call it was passed to and cannot be "
               "used after that call returns",
           "call-ended");
    return;
  }
  auto refuseTooMany = [&] {
    reject(context, resolver,
           std::string(doorName(door)) + ": this call already has " +
               std::to_string(kMaxOutstandingOps) +
               " host requests outstanding, the most one call may have; await some first",
           "too-many-operations");
  };
  if (call->outstandingOps >= kMaxOutstandingOps) {
    refuseTooMany();
    return;
  }
  CapabilityHost* host = call->host;
  registry::ToolRevisionPtr tool = call->tool;
  Sandbox::StartOp start;
  ReplyKind reply = ReplyKind::json;
  std::size_t requestBytes = 0;

  if constexpr (door == Door::resolveInvocation || door == Door::createSubtasksResult) {
    if (!subtasksRequested(sandbox.tool())) {
      reject(context, resolver,
             std::string(doorName(door)) + " is not authorized: " +
                 registry::notRequestedWords(sandbox.tool(), doorName(door),
                                             "add \"subtasks\": true to its capabilities"),
             "not-authorized");
      return;
    }
    if constexpr (door == Door::resolveInvocation) {
      // The length in UTF-16 units first: no scan of a huge string.
      if (info.length() < 1 || !info[0]->IsString() ||
          static_cast<std::size_t>(info[0].As<v8::String>()->Length()) > kMaxToolNameBytes ||
          static_cast<std::size_t>(info[0].As<v8::String>()->Utf8Length(isolate)) >
              kMaxToolNameBytes) {
        reject(context, resolver,
               "ctx.resolveInvocation(name) takes a tool name: a string of at most 256 bytes",
               "invalid-argument", true);
        return;
      }
      std::string name = toUtf8(isolate, info[0].As<v8::String>());
      requestBytes = name.size();
      start = [host, tool, name,
               invocation = call->invocation](std::shared_ptr<HostOperation> operation) {
        host->startQuickRequest(
            *tool, invocation, std::string(kResolveInvocation), json::object{{"name", name}},
            std::make_shared<MappedOperation>(std::move(operation), [name](HostOpResult result) {
              return opaqueRevisions(std::move(result), name);
            }));
      };
    } else {
      auto drafts =
          toJson(context, info.length() > 0 ? info[0] : v8::Undefined(isolate).As<v8::Value>(),
                 sandbox.toJsonOptions("the drafts"));
      if (!drafts) {
        if (drafts.error().kind == ToJsonError::Kind::killed) return;  // the call is ending
        reject(context, resolver, "ctx.createSubtasksResult(drafts): " + drafts.error().detail,
               "invalid-argument", true);
        return;
      }
      requestBytes = jsonTextSize(*drafts);
      start = [host, tool, drafts = std::move(*drafts),
               invocation = call->invocation](std::shared_ptr<HostOperation> operation) mutable {
        host->startQuickRequest(
            *tool, invocation, std::string(kCreateSubtasks),
            json::object{{"drafts", std::move(drafts)}},
            std::make_shared<MappedOperation>(std::move(operation), &subtasksArray));
      };
    }
  } else {
    v8::TryCatch tryCatch(isolate);
    auto request = operationRequest<door>(context, sandbox, info);
    if (!request) {
      if (tryCatch.HasTerminated()) {
        // ReThrow would hand the tool a catchable `throw null` (what a terminated TryCatch
        // holds): the termination is asked for again instead, and the tool's code stops.
        isolate->TerminateExecution();
      } else if (tryCatch.HasCaught()) {
        resolver->Reject(context, tryCatch.Exception()).FromMaybe(false);
      }
      return;
    }
    reply = request->reply;
    requestBytes = jsonTextSize(request->request);
    start = [host, tool, kind = std::string(request->kind), body = std::move(request->request),
             invocation = call->invocation](std::shared_ptr<HostOperation> operation) mutable {
      host->startOperation(*tool, invocation, kind, std::move(body), std::move(operation));
    };
  }
  // Building the request may have run the tool's getters, and they may have started operations.
  switch (sandbox.startHostOp(resolver, reply, std::move(start), requestBytes)) {
    case Sandbox::HostOpStart::started:
      break;
    case Sandbox::HostOpStart::callEnded:
      reject(context, resolver, std::string(doorName(door)) + ": this call has ended",
             "call-ended");
      break;
    case Sandbox::HostOpStart::tooMany:
      refuseTooMany();
      break;
    case Sandbox::HostOpStart::tooLarge:
      reject(context, resolver,
             std::string(doorName(door)) + ": this request (" + std::to_string(requestBytes) +
                 " bytes) with those of the call's outstanding requests would hold more than " +
                 std::to_string(kMaxOutstandingRequestBytes >> 20) +
                 " MiB outside its heap, the most one call's requests may; await some first",
             "request-too-large");
      break;
  }
}

void onGlobalFetch(const v8::FunctionCallbackInfo<v8::Value>& info) {
  onDoor<Door::globalFetch>(DoorArgs{info, 0}, {});
}

// The native door behind every ctx function: (epoch, door index, ...the tool's arguments).
// Reachable only through the closures kCtxFactory makes.
void onCtxDoor(const v8::FunctionCallbackInfo<v8::Value>& info) {
  const DoorArgs args{info, 2};
  const v8::Local<v8::Value> epoch = info[0];
  const int index = info[1]->IsInt32() ? info[1].As<v8::Int32>()->Value() : -1;
  switch (static_cast<Door>(index)) {
    case Door::fetch:
      return onDoor<Door::fetch>(args, epoch);
    case Door::popup:
      return onDoor<Door::popup>(args, epoch);
    case Door::secret:
      return onDoor<Door::secret>(args, epoch);
    case Door::storageGet:
      return onDoor<Door::storageGet>(args, epoch);
    case Door::storageSet:
      return onDoor<Door::storageSet>(args, epoch);
    case Door::storageDelete:
      return onDoor<Door::storageDelete>(args, epoch);
    case Door::storageList:
      return onDoor<Door::storageList>(args, epoch);
    case Door::resolveInvocation:
      return onDoor<Door::resolveInvocation>(args, epoch);
    case Door::createSubtasksResult:
      return onDoor<Door::createSubtasksResult>(args, epoch);
    case Door::globalFetch:
      break;
  }
  // Only the factory calls this, always with a valid index.
  info.GetIsolate()->ThrowException(
      v8::Exception::TypeError(v8String(info.GetIsolate(), "not a door")));
}

// Compiled and run in each context before any tool code: wraps Date.prototype.toLocaleString,
// toLocaleDateString and toLocaleTimeString. V8 keeps an ICU pattern generator for every locale
// they meet, in a process-wide cache that is never emptied, keyed with the locale's Unicode
// extensions (-u-ca-..., -u-nu-...) and the calendar and numberingSystem options: about 40 KB
// each, so a tool, or an agent choosing the locale, could grow the sandbox process by gigabytes.
// The wrappers drop those extensions and options, leaving as many keys as ICU has locales. They
// read nothing the tool could replace: captured functions, called through the captured apply;
// lists and options built on null-prototype objects or with defineProperty.
constexpr const char* kLocaleDatesPrelude = R"JS((function () {
  'use strict';
  const apply = Reflect.apply;
  const define = Reflect.defineProperty;
  const has = Reflect.has;
  const isArray = Array.isArray;
  const toString = String;
  const indexOf = String.prototype.indexOf;
  const slice = String.prototype.slice;
  const TypeErrorCtor = TypeError;
  const kept = ['dateStyle', 'timeStyle', 'weekday', 'era', 'year', 'month', 'day', 'dayPeriod',
                'hour', 'minute', 'second', 'fractionalSecondDigits', 'timeZoneName', 'timeZone',
                'hour12', 'hourCycle', 'formatMatcher', 'localeMatcher'];
  // The tag up to its first singleton subtag (u, t, x, ...): language, script, region, variants.
  const bare = (value) => {
    const tag = typeof value === 'string' ? value : toString(value);
    let start = 0;
    for (;;) {
      const dash = apply(indexOf, tag, ['-', start]);
      const end = dash < 0 ? tag.length : dash;
      if (end - start === 1 && start > 0) return apply(slice, tag, [0, start - 1]);
      if (dash < 0) return tag;
      start = dash + 1;
    }
  };
  const locales = (given) => {
    if (given === undefined) return undefined;
    if (typeof given === 'string') return bare(given);
    if (!isArray(given)) {
      throw new TypeErrorCtor('locales must be a string or an array of strings');
    }
    const out = [];
    let count = 0;
    for (let i = 0; i < given.length; i++) {
      if (!has(given, i)) continue;  // a hole, skipped as the native method skips it
      define(out, count++, {__proto__: null, value: bare(given[i]), writable: true,
                            enumerable: true, configurable: true});
    }
    return out;
  };
  const options = (given) => {
    if (given === undefined || given === null) return given;
    const out = {__proto__: null};
    for (let i = 0; i < kept.length; i++) {
      const value = given[kept[i]];
      if (value !== undefined) out[kept[i]] = value;
    }
    return out;
  };
  const proto = Date.prototype;
  const wrap = (name) => {
    const original = proto[name];
    const wrapped = {
      [name](given, choices) {
        return apply(original, this, [locales(given), options(choices)]);
      },
    }[name];
    define(proto, name, {__proto__: null, value: wrapped, writable: true, enumerable: false,
                         configurable: true});
  };
  wrap('toLocaleString');
  wrap('toLocaleDateString');
  wrap('toLocaleTimeString');
  return () => {};
}))JS";

// Compiled and run in each context before any tool code: returns the per-call ctx maker. The
// door indexes are those of `Door`. Arrow functions: not constructible, named by their keys,
// `length` as declared; they read nothing the tool could replace (a direct call of a captured
// binding, no spread), and `freeze` is the original Object.freeze.
constexpr const char* kCtxFactory = R"JS((function (door) {
  'use strict';
  const freeze = Object.freeze;
  const values = Object.values;
  // Settings arrive as plain data (JSON.parse's objects and arrays): frozen all the way down, so
  // that what one call does to them no other call of the sandbox sees.
  const freezeDeep = (value) => {
    if (typeof value === 'object' && value !== null) {
      freeze(value);
      const members = values(value);
      for (let i = 0; i < members.length; i++) freezeDeep(members[i]);
    }
    return value;
  };
  // `fresh`: settings just parsed, to be frozen (the same value comes back in later calls).
  return (epoch, tool, settings, fresh) => {
    if (fresh) freezeDeep(settings);
    const storage = freeze({
      get: (key) => door(epoch, 4, key),
      set: (key, value) => door(epoch, 5, key, value),
      delete: (key) => door(epoch, 6, key),
      list: () => door(epoch, 7),
    });
    return freeze({
      tool,
      settings,
      fetch: (input, init) => door(epoch, 1, input, init),
      popup: (request) => door(epoch, 2, request),
      secret: (name) => door(epoch, 3, name),
      storage,
      resolveInvocation: (name) => door(epoch, 8, name),
      createSubtasksResult: (drafts) => door(epoch, 9, drafts),
    });
  };
}))JS";
static_assert(static_cast<int>(Door::fetch) == 1 && static_cast<int>(Door::popup) == 2 &&
              static_cast<int>(Door::secret) == 3 && static_cast<int>(Door::storageGet) == 4 &&
              static_cast<int>(Door::storageSet) == 5 &&
              static_cast<int>(Door::storageDelete) == 6 &&
              static_cast<int>(Door::storageList) == 7 &&
              static_cast<int>(Door::resolveInvocation) == 8 &&
              static_cast<int>(Door::createSubtasksResult) == 9);

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

bool subtasksRequested(const registry::ToolRevision& tool) {
  const auto* capabilities = tool.manifest.if_contains("capabilities");
  if (capabilities == nullptr || !capabilities->is_object()) return false;
  const auto* subtasks = capabilities->as_object().if_contains("subtasks");
  return subtasks != nullptr && subtasks->is_bool() && subtasks->as_bool();
}

void CapabilityHost::startQuickRequest(const registry::ToolRevision& caller,
                                       const json::object& invocation, const std::string& kind,
                                       json::value request,
                                       std::shared_ptr<HostOperation> operation) {
  if (!subtasksRequested(caller)) {
    operation->complete(HostOpFailure{
        "not-authorized", kind + " is not authorized: " +
                              registry::notRequestedWords(
                                  caller, kind, "add \"subtasks\": true to its capabilities")});
    return;
  }
  const json::object* fields = request.if_object();
  if (kind == kResolveInvocation && fields != nullptr && fields->contains("name") &&
      fields->at("name").is_string()) {
    auto resolved =
        resolveInvocation(caller, std::string(fields->at("name").get_string()), invocation);
    if (!resolved) {
      operation->complete(std::move(resolved.error()));
    } else {
      operation->complete(json::value(std::move(*resolved)));
    }
  } else if (kind == kCreateSubtasks && fields != nullptr && fields->contains("drafts")) {
    auto tasks = createSubtasks(caller, fields->at("drafts"), invocation);
    if (!tasks) {
      operation->complete(HostOpFailure{"failed", tasks.error()});
    } else {
      operation->complete(json::value(std::move(*tasks)));
    }
  } else {
    operation->complete(HostOpFailure{"invalid-argument", "a malformed " + kind + " request"});
  }
}

bool installGlobals(v8::Local<v8::Context> context, Prelude& prelude) {
  v8::Isolate* isolate = context->GetIsolate();
  v8::Local<v8::Object> global = context->Global();
  // Intl goes too: its objects (a DateTimeFormat, a Segmenter's segments of a long string) keep
  // ICU memory outside the V8 heap that no limit sees, so a tool holding thousands of them grows
  // its sandbox process by gigabytes. toLocaleString and localeCompare stay (Date's toLocale*
  // wrapped: kLocaleDatesPrelude).
  for (const char* name : {"SharedArrayBuffer", "Atomics", "WebAssembly", "Intl", "console"}) {
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
                          orEmpty(function(context, &onGlobalFetch, none, 2, "fetch")),
                          v8::DontEnum)
      .FromMaybe(false);
  v8::Local<v8::Function> installed;
  // The web globals (Headers and Response among them) are lazy: their preludes run on first use.
  if (!runPreludeFactory(context, "toolhost:dates", kLocaleDatesPrelude, v8::Undefined(isolate))
           .ToLocal(&installed) ||
      !installWebGlobals(context)) {
    return false;
  }

  v8::Local<v8::Function> door, made;
  if (!function(context, &onCtxDoor, none, 0, "door").ToLocal(&door) ||
      !runPreludeFactory(context, "toolhost:ctx", kCtxFactory, door).ToLocal(&made)) {
    return false;
  }
  prelude.makeCtx.Reset(isolate, made);
  return true;
}

v8::MaybeLocal<v8::Object> makeCtx(v8::Local<v8::Context> context, const CallState& call,
                                   Prelude& prelude) {
  v8::Isolate* isolate = context->GetIsolate();
  v8::EscapableHandleScope scope(isolate);
  if (prelude.tool.IsEmpty()) {
    v8::Local<v8::Object> tool = v8::Object::New(isolate);
    if (!fillFrozen(context, tool,
                    {{"name", v8String(isolate, call.tool->name)},
                     {"revision", v8String(isolate, call.tool->revision)}})) {
      return {};
    }
    prelude.tool.Reset(isolate, tool);
  }
  // ctx.settings: made once per settings revision the sandbox sees, then the same frozen value.
  v8::Local<v8::Value> settings = v8::Null(isolate);
  bool fresh = false;
  if (call.settings != nullptr) {
    if (prelude.settings.IsEmpty() || prelude.settingsRevision != call.settingsRevision) {
      if (!fromJson(context, *call.settings).ToLocal(&settings)) return {};
      prelude.settings.Reset(isolate, settings);
      prelude.settingsRevision = call.settingsRevision;
      fresh = true;
    } else {
      settings = prelude.settings.Get(isolate);
    }
  }
  // The epoch binds every function to this call (exact in a double: epochs stay below 2^53).
  v8::Local<v8::Value> argv[] = {v8::Number::New(isolate, static_cast<double>(call.epoch)),
                                 prelude.tool.Get(isolate), settings,
                                 v8::Boolean::New(isolate, fresh)};
  v8::Local<v8::Value> ctx;
  if (!prelude.makeCtx.Get(isolate)->Call(context, v8::Undefined(isolate), 4, argv).ToLocal(&ctx) ||
      !ctx->IsObject()) {
    if (fresh) {  // not frozen: never handed out
      prelude.settings.Reset();
      prelude.settingsRevision.clear();
    }
    return {};
  }
  return scope.Escape(ctx.As<v8::Object>());
}

}  // namespace toolhost::runtime

namespace toolhost::runtime {

boost::system::result<v8::Local<v8::Value>, HostOpFailure> replyToJs(Sandbox& sandbox,
                                                                     v8::Local<v8::Context> context,
                                                                     ReplyKind kind,
                                                                     const json::value& reply) {
  switch (kind) {
    case ReplyKind::fetchResponse: {
      v8::Local<v8::Function> makeResponse;
      if (!responseMaker(context).ToLocal(&makeResponse)) {
        return HostOpFailure{"failed", "the runtime could not make the Response"};
      }
      return fetchResponse(sandbox, context, makeResponse, reply);
    }
    case ReplyKind::json:
      break;
  }
  v8::Local<v8::Value> value;
  if (!fromJson(context, reply).ToLocal(&value)) {
    return HostOpFailure{"failed", "the host's answer does not fit in the sandbox"};
  }
  return value;
}

}  // namespace toolhost::runtime
