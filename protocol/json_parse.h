// Strict JSON parsing for everything that enters the daemon: exact number conversion (Boost.JSON
// 1.81 rounds some doubles wrongly, which would change content hashes), duplicate object keys and
// non-finite numbers refused, invalid UTF-8 refused, nesting depth bounded. Any thread.
#pragma once

#include <boost/json/value.hpp>
#include <boost/system/result.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace toolhost::protocol {

// The length of the valid UTF-8 sequence of two to four bytes at text[at], or 0 when there is
// none there (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF); `at` < size.
std::size_t utf8SequenceAt(std::string_view text, std::size_t at);

struct JsonParseLimits {
  std::size_t maxDepth = 128;
  // Values (objects, arrays, strings, numbers, booleans, nulls) in the whole text: a value costs
  // tens of bytes parsed, a few bytes written ("0,"), so this bounds what a text may grow to.
  std::size_t maxValues = SIZE_MAX;
};

struct JsonParseError {
  enum class Kind {
    syntax,            // not JSON, or invalid UTF-8
    tooDeep,           // nesting deeper than the limit
    duplicateKey,      // an object names the same key twice
    numberOutOfRange,  // a number that is not a finite double
    tooManyValues      // more values than the limit
  };
  Kind kind;
  std::string detail;
};

// Parses exactly one JSON text (surrounding whitespace allowed, nothing after it).
boost::system::result<boost::json::value, JsonParseError> parseJson(std::string_view text,
                                                                     const JsonParseLimits& limits = {});

// Values in `object`, itself included (objects, arrays and scalars alike), without recursion.
std::size_t countJsonValues(const boost::json::object& object);

// Nesting depth of a value (a scalar is 0, `[]` is 1).
std::size_t jsonDepth(const boost::json::value& value);

}  // namespace toolhost::protocol
