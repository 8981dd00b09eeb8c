// The doors of a sandbox: the global `console` and `fetch`, installed once per context, and the
// per-call `ctx`. Called inside a segment of the sandbox, on the thread running it.
//
// ctx = frozen {tool: {name, revision}, fetch, popup, secret, storage: {get, set, delete, list},
//               resolveInvocation, createSubtasksResult}
// Every ctx function is bound to its call's epoch: used after that call ended (a ctx kept in
// module state), it rejects with code "call-ended". fetch, popup, storage and secrets reject with
// code "not-authorized" until the policy engine grants them; resolveInvocation and
// createSubtasksResult need `capabilities.subtasks: true` and go to the CapabilityHost.
#pragma once

#include <v8.h>

namespace toolhost::runtime {

struct CallState;

// Removes what sandboxed code must not have (SharedArrayBuffer, Atomics, WebAssembly) and adds
// console and fetch.
void installGlobals(v8::Local<v8::Context> context);

// A fresh, frozen ctx for `call`. Empty only if the isolate is being terminated.
v8::MaybeLocal<v8::Object> makeCtx(v8::Local<v8::Context> context, const CallState& call);

}  // namespace toolhost::runtime
