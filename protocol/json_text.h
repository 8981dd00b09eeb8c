// JSON text out: RFC 8785 canonical JSON (for content hashes) and the daemon's ordinary output
// (insertion order kept, numbers and strings written the way RFC 8785 / ECMAScript writes them).
// Pure functions; any thread.
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <boost/system/result.hpp>

#include <string>
#include <string_view>

namespace toolhost::protocol {

struct CanonicalJsonError {
  std::string detail;  // e.g. "non-finite number at /limits/wallMs"
};

// RFC 8785 (JCS): object members sorted by their UTF-16 code units, no whitespace, numbers as
// ECMAScript's Number.prototype.toString (integers beyond 2^53 are first converted to double, as
// a JavaScript reader would), strings with the minimal escaping. Non-finite numbers and strings
// that are not valid UTF-8 are refused; the error names the value's JSON pointer.
boost::system::result<std::string, CanonicalJsonError> canonicalJson(
    const boost::json::value& value);

// Compact JSON with object members in insertion order; numbers and strings as in canonicalJson.
// Non-finite numbers become null (as JSON.stringify does); each byte of invalid UTF-8 becomes
// U+FFFD, so the output is always valid JSON in valid UTF-8.
std::string writeJson(const boost::json::value& value);
// The same for an object, without first copying it into a value.
std::string writeJson(const boost::json::object& object);

// writeJson appended to `out`, for callers that add framing around it.
void appendJson(std::string& out, const boost::json::value& value);
void appendJson(std::string& out, const boost::json::object& object);

// Appends "/" and `token` escaped as a JSON pointer (RFC 6901) token: '~' as "~0", '/' as "~1".
void appendPointerToken(std::string& out, std::string_view token);

// ECMAScript Number.prototype.toString for a finite double ("1e+21", "0.000001", "-0" -> "0");
// NaN and the infinities give "NaN", "Infinity", "-Infinity" as in JavaScript.
std::string formatNumber(double number);

}  // namespace toolhost::protocol
