// The URL and URLSearchParams classes of the URL Standard, as JavaScript source compiled into a
// sandbox context (tool code sees a bare V8 realm otherwise).
#pragma once

namespace toolhost::runtime {

// The source of a factory expression `(function () { ... })`. Called with no argument it returns a
// function `(name) => binding` giving "URL" or "URLSearchParams" (undefined for other names).
// Called with no argument it must run before any tool code; a runtime that runs it later passes
// an object without a prototype mapping paths ("String.prototype.slice") to built-ins it took
// before tool code ran (the prelude's opening comment lists the paths it reads).
extern const char* const kUrlPrelude;

}  // namespace toolhost::runtime
