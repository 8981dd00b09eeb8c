// fetch() inside a sandbox: the request a tool's (input, init) becomes, the Response a host's
// reply becomes, and the prelude (Response, Headers) a context runs on first use
// (web_globals.h). Shapes: see capabilities.h. Called inside a segment of the sandbox (or while it
// is built), on the thread running it.
#pragma once

#include "runtime/capability_host.h"

#include <v8.h>

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <boost/system/result.hpp>

#include <initializer_list>
#include <optional>
#include <string_view>
#include <utility>

namespace toolhost::runtime {

class Sandbox;

// An Error (or TypeError) of the context's realm, made through the intrinsic constructor (never
// the global a tool may have replaced), with a `code` data property.
v8::Local<v8::Value> makeHostError(v8::Local<v8::Context> context, std::string_view message,
                                   std::string_view code, bool typeError = false);

// Throws makeHostError(message, "invalid-argument") as a TypeError: how a door refuses a bad
// argument.
void throwInvalidArgument(v8::Local<v8::Context> context, std::string_view message);
// Throws makeHostError(message, "request-too-large"): how a door refuses a request larger than
// it could ever send, before building it.
void throwTooLarge(v8::Local<v8::Context> context, std::string_view message);

// Compiles and runs the fetch prelude in `context`, with the built-ins captured when the context
// was made (runtime/web_globals.cc); returns its binding function: "make" gives the function that
// makes a Response (status, statusText, url, headers: [[name, value]...] sorted and combined,
// body: ArrayBuffer), "Headers" and "Response" the classes. Empty only if V8 refused. Loaded
// on first use through web_globals.h (fetchPrelude).
v8::MaybeLocal<v8::Function> installFetchPrelude(v8::Local<v8::Context> context,
                                                 v8::Local<v8::Value> intrinsics);

// Compiles and runs `source` (a script whose value is a factory function) in `context`, then
// calls the factory with `argument`; returns what it made, which must be a function. For code
// that runs before any tool code. Empty if V8 refused or the script misbehaved.
// The first compile of each source in this process leaves a code cache that later compiles of it
// consume instead of parsing (V8 falls back to the source if it refuses the cache).
v8::MaybeLocal<v8::Function> runPreludeFactory(v8::Local<v8::Context> context, const char* name,
                                               const char* source, v8::Local<v8::Value> argument);

// Sets each callback as a function property of `natives`, the object a prelude's factory gets.
// False if V8 refused.
bool setNatives(v8::Local<v8::Context> context, v8::Local<v8::Object> natives,
                std::initializer_list<std::pair<const char*, v8::FunctionCallback>> functions);

// What the preludes' code caches did in this process: made, consumed, refused by V8.
struct PreludeCacheStats {
  std::uint64_t made = 0;
  std::uint64_t consumed = 0;
  std::uint64_t rejected = 0;
};
PreludeCacheStats preludeCacheStats();

// fetch(input, init) as the request handed to the host. Empty with an exception pending: a
// TypeError (code "invalid-argument") naming what is wrong, an Error with code
// "request-too-large", whatever a getter or iterator of the tool threw, or termination.
std::optional<boost::json::object> fetchRequest(v8::Local<v8::Context> context,
                                                v8::Local<v8::Value> input,
                                                v8::Local<v8::Value> init);

// The Response for a host's "fetch" reply, or the failure to reject with (code "failed" for a
// malformed reply; the sandbox is killed if the body passes its ArrayBuffer limit).
boost::system::result<v8::Local<v8::Value>, HostOpFailure> fetchResponse(
    Sandbox& sandbox, v8::Local<v8::Context> context, v8::Local<v8::Function> makeResponse,
    const boost::json::value& reply);

}  // namespace toolhost::runtime
