// The doors of a sandbox: the globals `console` and `fetch` and the lazy web globals
// (web_globals.h), installed once per context before any tool code runs, and the per-call `ctx`.
// Called inside a segment of the sandbox (or while the sandbox is built), on the thread running it.
//
// ctx = frozen {tool: {name, revision}, fetch, popup, secret, storage: {get, set, delete, list},
//               resolveInvocation, createSubtasksResult}
// Every ctx function is bound to its call's epoch: used after that call ended (a ctx kept in
// module state), it rejects with code "call-ended" and nothing reaches the host. The ctx is made
// per call by a small factory compiled into the context before any tool code (so it holds the
// original Object.freeze): its functions are arrow closures over the call's epoch that forward
// to one native door, which only the factory can reach and which checks the epoch against the
// running call in C++. (A JavaScript closure costs far less than a v8::Function::New per door.) The
// global `fetch` behaves as ctx.fetch of whichever call is running. resolveInvocation and
// createSubtasksResult need `capabilities.subtasks: true` and are quick requests to the
// CapabilityHost; everything else is an operation, CapabilityHost::startOperation(kind, request),
// which the host authorizes (the default host refuses every kind with "not-authorized").
//
// Operation kinds, requests and replies (plain JSON; the host's side of the contract):
//
//  "fetch"   fetch(input, init) / ctx.fetch(input, init)
//     input: a URL string, or an object with a string `url` (else `href`) property.
//     init:  {method = "GET", headers, body}; headers: a plain object (own enumerable string
//            keys), an array of [name, value] pairs, or anything with entries(); names and values
//            are converted to strings. body: a string (sent as UTF-8), an ArrayBuffer, a
//            TypedArray or DataView, or null/undefined. GET and HEAD cannot have a body. Every
//            other member (signal, redirect, credentials, mode, cache, ...) is ignored; in
//            particular redirects are never followed (`redirect: "follow"` is not honoured):
//            a 3xx comes back as the Response.
//     request: {"url": string as given, "method": string as given (not upper-cased),
//               "headers": [[name, value], ...] (strings, in the tool's order),
//               "bodyBase64": string (standard base64 with padding; only when there is a body)}
//     reply:   {"status": int, "statusText": string, "url": string,
//               "headers": [[lower-case name, value], ...], "bodyBase64": string}
//     The promise resolves to a Response: ok, status, statusText, url, redirected (false), type
//     ("basic"), headers (get/has case-insensitive, repeated names joined with ", ";
//     getSetCookie, forEach, entries, keys, values, [Symbol.iterator], sorted by name as in
//     browsers; immutable), bodyUsed, text() (UTF-8 with replacement, BOM stripped), json(),
//     arrayBuffer(); each body method works once, then rejects with TypeError "body already
//     used". The body is held in an ArrayBuffer from the moment the reply arrives, so it counts
//     against the call's ArrayBuffer limit; arrayBuffer() hands that buffer over.
//  "popup"   ctx.popup({kind: "custom-html", html} | {kind: "origin", url})
//     request: {"kind": "custom-html", "html": string} or {"kind": "origin", "url": string};
//              anything else rejects with a TypeError before reaching the host.
//     reply:   any JSON, resolved as a plain JavaScript value.
//  "storage" ctx.storage.get(key) / set(key, value) / delete(key) / list()
//     request: {"op": "get"|"set"|"delete"|"list", "key": string (not for list),
//               "value": JSON (set only; the value as the result walker converts it)}
//     reply:   any JSON (the value for get, the keys for list), resolved as a plain value.
//  "secret"  ctx.secret(name)
//     request: {"name": string}
//     reply:   a string (an opaque placeholder the host substitutes toward granted origins).
//
// A HostOpFailure{code, message} rejects the promise with an Error of the sandbox's realm
// (made by the host, not through the global `Error`) whose `code` is the failure's code:
// "not-authorized", "invalid-url", "scheme-not-allowed", "credentials-in-url",
// "destination-blocked", "dns-failed", "connect-failed", "tls-failed", "timeout",
// "response-too-large", "invalid-header", "request-too-large", "cancelled", ... A reply the
// runtime cannot use rejects with code "failed". Bad arguments reject with a TypeError whose code
// is "invalid-argument"; an exception a tool's getter threw while its arguments were read
// rejects the promise as it is.
#pragma once

#include "runtime/capability_host.h"

#include <v8.h>

#include <boost/json/value.hpp>
#include <boost/system/result.hpp>

namespace toolhost::runtime {

struct CallState;
class Sandbox;

// What the host keeps of a context's prelude, made before any tool code ran (so it holds the
// original intrinsics whatever the tool later does to the globals).
struct Prelude {
  v8::Global<v8::Function> makeCtx;       // (epoch, tool, settings, fresh) -> frozen ctx
  v8::Global<v8::Object> tool;            // frozen {name, revision}, made by the first makeCtx
  // ctx.settings as last made (deep-frozen), and the settings revision it was made from.
  v8::Global<v8::Value> settings;
  std::string settingsRevision;

  void reset() {
    makeCtx.Reset();
    tool.Reset();
    settings.Reset();
    settingsRevision.clear();
  }
};

// How an operation's reply becomes the value its promise resolves to.
enum class ReplyKind {
  json,           // the reply as a plain JavaScript value
  fetchResponse,  // the "fetch" reply as a Response
};

// Removes what sandboxed code must not have (SharedArrayBuffer, Atomics, WebAssembly), adds
// console and fetch, and runs the prelude. False only if V8 refused (out of memory).
bool installGlobals(v8::Local<v8::Context> context, Prelude& prelude);

// A fresh, frozen ctx for `call` (its `tool` member is the same frozen object in every call of
// the context). Empty only if the isolate is being terminated.
v8::MaybeLocal<v8::Object> makeCtx(v8::Local<v8::Context> context, const CallState& call,
                                   Prelude& prelude);

// The value an operation's reply settles its promise with, or the failure to reject it with
// (the sandbox may have been killed meanwhile, e.g. by the ArrayBuffer limit: check kill()).
boost::system::result<v8::Local<v8::Value>, HostOpFailure> replyToJs(
    Sandbox& sandbox, v8::Local<v8::Context> context, ReplyKind kind,
    const boost::json::value& reply);

}  // namespace toolhost::runtime
