#include "protocol/json_parse.h"

#include <cctype>

#include <boost/json/basic_parser_impl.hpp>
#include <boost/json/value_stack.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <vector>

namespace toolhost::protocol {
namespace json = boost::json;

std::size_t utf8SequenceAt(std::string_view text, std::size_t at) {
  auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[at + i]); };
  const unsigned char lead = byte(0);
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (at + length > text.size() || byte(1) < low || byte(1) > high) return 0;
  for (std::size_t i = 2; i < length; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xBF) return 0;
  }
  return length;
}

namespace {

constexpr double kInt64Limit = 9223372036854775808.0;  // 2^63

// Why a byte outside ASCII stopped the parser: JSON allows one only inside a string.
std::string nonAsciiHint(std::string_view text, std::size_t at) {
  if (utf8SequenceAt(text, at) == 0) return " (invalid UTF-8)";
  if (at == 0 && text.substr(0, 3) == "\xEF\xBB\xBF")
    return " (a byte order mark: send JSON without one)";
  return " (a character outside ASCII where JSON allows only its own syntax: outside strings, "
         "JSON is ASCII)";
}

// Whether text[0, at) ends with an escape of a leading surrogate (\uD800 to \uDBFF) that is
// not itself escaped: Boost.JSON then stops at `at`, where the trailing half's "\u" should be.
bool afterLeadingSurrogate(std::string_view text, std::size_t at) {
  if (at < 6) return false;
  const std::string_view escape = text.substr(at - 6, 6);
  auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
  if (escape[0] != '\\' || escape[1] != 'u' || (escape[2] != 'd' && escape[2] != 'D') ||
      std::string_view("89abAB").find(escape[3]) == std::string_view::npos || !hex(escape[4]) ||
      !hex(escape[5])) {
    return false;
  }
  std::size_t backslashes = 0;  // before the escape's own: an odd count escapes it
  for (std::size_t i = at - 6; i > 0 && text[i - 1] == '\\'; --i) ++backslashes;
  return backslashes % 2 == 0;
}

// Marks the handler's own refusals so they can be told apart from Boost.JSON's syntax errors.
enum class HandlerFailure { none, duplicateKey, numberOutOfRange, tooManyValues };

class StrictHandler {
 public:
  static constexpr std::size_t max_object_size = json::object::max_size();
  static constexpr std::size_t max_array_size = json::array::max_size();
  static constexpr std::size_t max_key_size = json::string::max_size();
  static constexpr std::size_t max_string_size = json::string::max_size();

  json::value_stack stack;
  HandlerFailure failure = HandlerFailure::none;
  std::string failureDetail;
  // Off: keys are only counted (keysSeen), and parseJson compares the count with the keys of the
  // objects built, which drop a repeated key. On: each object's keys are kept and compared, to
  // name the key in the error (parseJson's second pass, once the count says there is one).
  bool trackKeys = false;
  std::size_t keysSeen = 0;
  std::size_t maxValues = SIZE_MAX;
  std::size_t values = 0;

  bool on_document_begin(json::error_code&) { return true; }
  bool on_document_end(json::error_code&) { return true; }

  bool on_object_begin(json::error_code& ec) {
    if (!counted(ec)) return false;
    if (trackKeys) keys_.emplace_back();
    return true;
  }
  bool on_object_end(std::size_t n, json::error_code& ec) {
    if (trackKeys) {
      auto& keys = keys_.back();
      if (keys.size() > 1) {
        std::sort(keys.begin(), keys.end());
        auto dup = std::adjacent_find(keys.begin(), keys.end());
        if (dup != keys.end()) {
          return fail(ec, HandlerFailure::duplicateKey, "duplicate object key \"" + *dup + "\"");
        }
      }
      keys_.pop_back();
    }
    stack.push_object(n);
    return true;
  }
  bool on_array_begin(json::error_code& ec) { return counted(ec); }
  bool on_array_end(std::size_t n, json::error_code&) {
    stack.push_array(n);
    return true;
  }
  bool on_key_part(json::string_view s, std::size_t, json::error_code&) {
    stack.push_chars(s);
    if (trackKeys) key_.append(s.data(), s.size());
    return true;
  }
  bool on_key(json::string_view s, std::size_t, json::error_code&) {
    stack.push_key(s);
    ++keysSeen;
    if (trackKeys) {
      key_.append(s.data(), s.size());
      keys_.back().push_back(std::move(key_));
      key_.clear();
    }
    return true;
  }
  bool on_string_part(json::string_view s, std::size_t, json::error_code&) {
    stack.push_chars(s);
    return true;
  }
  bool on_string(json::string_view s, std::size_t, json::error_code& ec) {
    if (!counted(ec)) return false;
    stack.push_string(s);
    return true;
  }
  bool on_number_part(json::string_view s, json::error_code&) {
    number_.append(s.data(), s.size());
    return true;
  }
  bool on_int64(std::int64_t i, json::string_view, json::error_code& ec) {
    if (!counted(ec)) return false;
    number_.clear();
    stack.push_int64(i);
    return true;
  }
  bool on_uint64(std::uint64_t u, json::string_view, json::error_code& ec) {
    if (!counted(ec)) return false;
    number_.clear();
    stack.push_uint64(u);
    return true;
  }
  bool on_double(double, json::string_view s, json::error_code& ec) {
    if (!counted(ec)) return false;
    number_.append(s.data(), s.size());
    double exact = 0;
    auto result = std::from_chars(number_.data(), number_.data() + number_.size(), exact);
    if (result.ec == std::errc::result_out_of_range && isUnderflow(number_)) {
      exact = number_.front() == '-' ? -0.0 : 0.0;
    } else if (result.ec != std::errc{} || !std::isfinite(exact)) {
      return fail(ec, HandlerFailure::numberOutOfRange,
                  "number " + abbreviate(number_) + " is outside the range of a double");
    }
    number_.clear();
    // An integral number is one number however it is written (2, 2.0, 2e0, -0): stored as an
    // integer within int64, as its hash (RFC 8785) and JavaScript take it, so that a schema's
    // "type": "integer" and the code reading it agree with the revision or task id it gets.
    if (exact == std::trunc(exact) && exact >= -kInt64Limit && exact < kInt64Limit) {
      stack.push_int64(static_cast<std::int64_t>(exact));
    } else {
      stack.push_double(exact);
    }
    return true;
  }
  bool on_bool(bool b, json::error_code& ec) {
    if (!counted(ec)) return false;
    stack.push_bool(b);
    return true;
  }
  bool on_null(json::error_code& ec) {
    if (!counted(ec)) return false;
    stack.push_null();
    return true;
  }
  bool on_comment_part(json::string_view, json::error_code&) { return true; }
  bool on_comment(json::string_view, json::error_code&) { return true; }

 private:
  // One more value: false (the parse stops) past maxValues.
  bool counted(json::error_code& ec) {
    if (++values <= maxValues) return true;
    return fail(ec, HandlerFailure::tooManyValues,
                "more than " + std::to_string(maxValues) + " JSON values");
  }
  bool fail(json::error_code& ec, HandlerFailure failure_kind, std::string detail) {
    failure = failure_kind;
    failureDetail = std::move(detail);
    ec = json::error::extra_data;  // any error stops the parser; the kind is kept above
    return false;
  }
  // A magnitude below the smallest subnormal rounds to zero, as every JSON reader does. Told apart
  // from overflow by the decimal exponent of the first significant digit, not by the sign of the
  // written exponent: "1000...0e-1" overflows and "0.000...01" underflows. `text` is a valid JSON
  // number whose magnitude is below 1e-323 or above 1e308, so the sign of that exponent decides.
  static bool isUnderflow(const std::string& text) {
    std::size_t i = text.front() == '-' ? 1 : 0;
    long long integerDigits = 0;
    long long digitIndex = 0;
    long long firstSignificant = -1;
    bool inFraction = false;
    for (; i < text.size() && text[i] != 'e' && text[i] != 'E'; ++i) {
      if (text[i] == '.') {
        inFraction = true;
        continue;
      }
      if (firstSignificant < 0 && text[i] != '0') firstSignificant = digitIndex;
      ++digitIndex;
      if (!inFraction) ++integerDigits;
    }
    if (firstSignificant < 0) return true;  // zero never leaves the range; harmless either way
    long long exponent = 0;
    if (i < text.size()) {
      ++i;
      bool negative = false;
      if (i < text.size() && (text[i] == '+' || text[i] == '-')) negative = text[i++] == '-';
      // Boost.JSON refuses exponents beyond INT_MAX before we get here; saturate anyway.
      for (; i < text.size(); ++i) exponent = std::min(exponent * 10 + (text[i] - '0'), 1LL << 40);
      if (negative) exponent = -exponent;
    }
    return integerDigits - 1 - firstSignificant + exponent < 0;
  }
  static std::string abbreviate(const std::string& text) {
    return text.size() <= 40 ? text : text.substr(0, 37) + "...";
  }

  std::vector<std::vector<std::string>> keys_;
  std::string key_;
  std::string number_;
};

// Members of every object in `value`: fewer than the keys the parser saw when an object named a
// key twice (Boost.JSON keeps the last), whatever the nesting, since a dropped member's own
// objects drop out of the count too.
std::size_t countMembers(const json::value& root) {
  std::size_t members = 0;
  std::vector<const json::value*> pending{&root};
  while (!pending.empty()) {
    const json::value* value = pending.back();
    pending.pop_back();
    if (const auto* object = value->if_object()) {
      members += object->size();
      for (const auto& member : *object) {
        if (member.value().is_structured()) pending.push_back(&member.value());
      }
    } else if (const auto* array = value->if_array()) {
      for (const auto& item : *array) {
        if (item.is_structured()) pending.push_back(&item);
      }
    }
  }
  return members;
}

boost::system::result<json::value, JsonParseError> parseWith(std::string_view text,
                                                             const JsonParseLimits& limits,
                                                             bool trackKeys) {
  json::parse_options options;
  options.max_depth = limits.maxDepth;
  json::basic_parser<StrictHandler> parser(options);
  parser.handler().stack.reset();
  parser.handler().trackKeys = trackKeys;
  parser.handler().maxValues = limits.maxValues;
  json::error_code ec;
  std::size_t used = parser.write_some(false, text.data(), text.size(), ec);
  const auto& handler = parser.handler();
  if (handler.failure == HandlerFailure::duplicateKey) {
    return JsonParseError{JsonParseError::Kind::duplicateKey, handler.failureDetail};
  }
  if (handler.failure == HandlerFailure::tooManyValues) {
    return JsonParseError{JsonParseError::Kind::tooManyValues, handler.failureDetail};
  }
  if (handler.failure == HandlerFailure::numberOutOfRange) {
    return JsonParseError{JsonParseError::Kind::numberOutOfRange, handler.failureDetail};
  }
  if (ec == json::error::exponent_overflow) {
    return JsonParseError{JsonParseError::Kind::numberOutOfRange,
                          "number exponent at byte " + std::to_string(used) + " is out of range"};
  }
  if (ec == json::error::too_deep) {
    return JsonParseError{
        JsonParseError::Kind::tooDeep,
        "JSON nesting is deeper than the limit of " + std::to_string(limits.maxDepth)};
  }
  if (ec) {
    std::string what = ec == json::error::syntax && used < text.size()
                           ? "invalid JSON at byte " + std::to_string(used)
                           : "invalid JSON";
    if (ec == json::error::syntax && used < text.size() &&
        static_cast<unsigned char>(text[used]) >= 0x80) {
      what += nonAsciiHint(text, used);
    } else if (ec == json::error::syntax && afterLeadingSurrogate(text, used)) {
      what +=
          ": a lone leading surrogate (\\uD800 to \\uDBFF must be followed by \\uDC00 to "
          "\\uDFFF)";
    } else if (ec != json::error::syntax) {
      what += ": " + ec.message();
    }
    return JsonParseError{JsonParseError::Kind::syntax, what};
  }
  // write_some stops after one complete value and its trailing whitespace; anything left over
  // ("1 2", "{}x", "01") is not one JSON text.
  if (used < text.size()) {
    return JsonParseError{
        JsonParseError::Kind::syntax,
        "invalid JSON at byte " + std::to_string(used) + ": data after the value"};
  }
  json::value parsed = parser.handler().stack.release();
  if (!trackKeys && countMembers(parsed) != handler.keysSeen) {
    // A key repeated somewhere: parse again, keeping keys, to say which.
    auto named = parseWith(text, limits, true);
    if (!named && named.error().kind == JsonParseError::Kind::duplicateKey) return named.error();
    return JsonParseError{JsonParseError::Kind::duplicateKey, "duplicate object key"};
  }
  return parsed;
}

}  // namespace

boost::system::result<json::value, JsonParseError> parseJson(std::string_view text,
                                                             const JsonParseLimits& limits) {
  return parseWith(text, limits, false);
}

std::size_t countJsonValues(const json::object& object) {
  std::size_t values = 1;
  std::vector<const json::value*> pending;
  for (const auto& member : object) pending.push_back(&member.value());
  while (!pending.empty()) {
    const json::value* value = pending.back();
    pending.pop_back();
    ++values;
    if (const auto* inner = value->if_object()) {
      for (const auto& member : *inner) pending.push_back(&member.value());
    } else if (const auto* array = value->if_array()) {
      for (const auto& item : *array) pending.push_back(&item);
    }
  }
  return values;
}

std::size_t jsonDepth(const json::value& value) {
  std::size_t deepest = 0;
  if (const auto* object = value.if_object()) {
    for (const auto& entry : *object) deepest = std::max(deepest, jsonDepth(entry.value()));
    return deepest + 1;
  }
  if (const auto* array = value.if_array()) {
    for (const auto& item : *array) deepest = std::max(deepest, jsonDepth(item));
    return deepest + 1;
  }
  return 0;
}

}  // namespace toolhost::protocol
