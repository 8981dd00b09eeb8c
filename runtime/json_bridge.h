// JSON across the sandbox boundary. Values leave JavaScript through our own walker (never
// JSON.stringify, toJSON or anything a tool can replace): null, booleans, finite numbers,
// strings, arrays and ordinary objects' own enumerable string-keyed properties, nothing from a
// prototype. Values enter as JSON text parsed by V8's internal parser. Called inside a sandbox
// segment (isolate locked and entered, context entered), on the thread running it.
#pragma once

#include <v8.h>

#include <boost/json/value.hpp>
#include <boost/system/result.hpp>

#include <atomic>
#include <cstddef>
#include <optional>
#include <string>

namespace toolhost::runtime {

// Values in one converted value at most (a result, a stored value, drafts). Each costs the
// daemon tens of bytes once parsed, however few bytes of JSON text it takes ("0,"): with
// outputBytes alone, a result of 64 MiB of zeros would be a gigabyte in the daemon.
inline constexpr std::size_t kMaxJsonValues = std::size_t{1} << 21;

struct ToJsonOptions {
  std::size_t maxDepth = 128;
  std::size_t maxBytes = 2 * 1024 * 1024;  // of the compact JSON text
  std::size_t maxValues = kMaxJsonValues;
  // Checked every few hundred values: a kill stops a walk over a huge value promptly (the walk
  // itself runs no JavaScript unless a getter does, so TerminateExecution alone would not).
  const std::atomic<int>* killed = nullptr;
  const char* what = "the result";  // names the value in errors ("the result at /a/0 is ...")
};

struct ToJsonError {
  enum class Kind {
    invalid,   // not JSON data; detail names the JSON pointer
    tooLarge,  // the text would pass maxBytes, or the values maxValues
    killed,    // the walk stopped because of a kill; the caller reports the kill
  };
  Kind kind;
  std::string detail;
};

// The value as JSON, or why it cannot be. A getter that throws is an `invalid` error naming the
// property and the exception. Top-level undefined is null; undefined array elements and holes are
// null; properties whose value is undefined are left out (as JSON.stringify does).
boost::system::result<boost::json::value, ToJsonError> toJson(v8::Local<v8::Context> context,
                                                              v8::Local<v8::Value> value,
                                                              const ToJsonOptions& options);

// The size of `value`'s compact JSON text (protocol::writeJson), computed without writing it.
std::size_t jsonTextSize(const boost::json::value& value);

// An upper estimate of the V8 heap that fromJson(object) takes: its JSON text (the source string
// and the strings made from it) and about kHeapBytesPerValue for each value. V8's JSON.parse
// never checks for termination, so arguments that outgrow the heap limit would run on past the
// limit (the near-heap-limit callback grants headroom) until the whole process is killed as
// stalled: they are refused by this estimate before V8 sees them.
inline constexpr std::size_t kHeapBytesPerValue = 48;
std::size_t parseHeapEstimate(const boost::json::object& object, std::size_t textBytes);

// `value` as a fresh JavaScript value in `context` (through JSON text). Empty if V8 refuses it
// (a string past V8's maximum length, or the heap is exhausted).
v8::MaybeLocal<v8::Value> fromJson(v8::Local<v8::Context> context, const boost::json::value& value);
v8::MaybeLocal<v8::Value> fromJson(v8::Local<v8::Context> context, const boost::json::object& object);
// The same from JSON text already written (protocol::writeJson).
v8::MaybeLocal<v8::Value> fromJsonText(v8::Local<v8::Context> context, const std::string& text);

// A JavaScript string as UTF-8 (lone surrogates become U+FFFD), cut to at most `maxBytes` bytes
// on a character boundary.
std::string toUtf8(v8::Isolate* isolate, v8::Local<v8::String> text,
                   std::size_t maxBytes = static_cast<std::size_t>(-1));

// `text` as UTF-8 when that is at most `maxBytes`, else nullopt. A string longer than `maxBytes`
// in UTF-16 units (a lower bound of its UTF-8 length) is refused before anything reads it: a
// tool's string may be a rope of a gigabyte, which reading would flatten and copy outside every
// limit of the call.
std::optional<std::string> toUtf8Within(v8::Isolate* isolate, v8::Local<v8::String> text,
                                        std::size_t maxBytes);

// Whether `text` has no lone surrogate (half of a UTF-16 pair), so that its UTF-8 says exactly
// what it holds: toUtf8 would make a lone surrogate U+FFFD, and two different strings one.
bool wellFormed(v8::Isolate* isolate, v8::Local<v8::String> text);

// A JavaScript string from UTF-8.
v8::Local<v8::String> v8String(v8::Isolate* isolate, std::string_view text);

}  // namespace toolhost::runtime
