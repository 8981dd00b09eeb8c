// Globals that tool code expects of a web-like runtime and that grant no authority: TextEncoder,
// TextDecoder, atob, btoa, crypto (getRandomValues, randomUUID, subtle.digest), DOMException, URL,
// URLSearchParams, and fetch's Headers and Response. Each is a lazy property of the global object:
// the prelude behind it is compiled the first time a tool reads one of its names, so that a sandbox
// that never uses them does not pay for them.
#pragma once

#include <v8.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace toolhost::runtime {

// Defines the lazy globals on `context`'s global object, and captures the built-ins their preludes
// use (kIntrinsics): a lazy prelude runs when a tool first reads one of its names, by which time
// the tool may have replaced any built-in method or global. Call before any tool code runs.
// False if V8 refused (out of memory).
bool installWebGlobals(v8::Local<v8::Context> context);

// The function the fetch prelude makes a Response from a host's answer with (fetch_api.h), the
// prelude run now if it has not run in `context` yet. Empty with an exception pending.
v8::MaybeLocal<v8::Function> responseMaker(v8::Local<v8::Context> context);

// The value of a lazy global whose prelude has already run in `context` (so that a tool's object
// can be one of its instances); empty otherwise, without running it.
v8::MaybeLocal<v8::Value> loadedWebGlobal(v8::Local<v8::Context> context, const char* name);

// The Encoding Standard's UTF-8 decoder over `bytes`, into UTF-16. With `fatal`, nullopt at the
// first invalid sequence; otherwise each becomes U+FFFD (the standard's maximal subparts). With
// `stream`, an incomplete sequence at the end is not an error: its length is put in `tail` and
// its bytes are left undecoded, for the caller to put before the next chunk.
std::optional<std::u16string> decodeUtf8(std::string_view bytes, bool fatal, bool stream,
                                         std::size_t& tail);

}  // namespace toolhost::runtime
