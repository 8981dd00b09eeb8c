#include "protocol/json_text.h"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/string.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace toolhost::protocol {
namespace json = boost::json;

namespace {

// 2^53: below it every integer is a double and prints as its own digits.
constexpr double kExactIntegerLimit = 9007199254740992.0;
constexpr std::int64_t kExactIntegerLimitInt = std::int64_t{1} << 53;

// What the string writer does with each byte: copy it, escape it, or check a UTF-8 sequence.
enum class ByteClass : unsigned char { plain, escape, multibyte };

constexpr std::array<ByteClass, 256> makeByteClasses() {
  std::array<ByteClass, 256> classes{};
  for (int c = 0; c < 256; ++c) {
    if (c < 0x20 || c == '"' || c == '\\') {
      classes[c] = ByteClass::escape;
    } else if (c >= 0x80) {
      classes[c] = ByteClass::multibyte;
    } else {
      classes[c] = ByteClass::plain;
    }
  }
  return classes;
}
constexpr std::array<ByteClass, 256> kByteClasses = makeByteClasses();

// Length of the well-formed UTF-8 sequence starting at `p` (Unicode table 3-7: no overlong forms,
// no surrogates, nothing above U+10FFFF), or 0 if there is none.
std::size_t utf8SequenceLength(const unsigned char* p, const unsigned char* end) {
  const unsigned char lead = p[0];
  const std::size_t available = static_cast<std::size_t>(end - p);
  auto continuation = [](unsigned char c) { return c >= 0x80 && c <= 0xBF; };
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) {
    return available >= 2 && continuation(p[1]) ? 2 : 0;
  }
  if (lead >= 0xE0 && lead <= 0xEF) {
    if (available < 3) return 0;
    const unsigned char low = lead == 0xE0 ? 0xA0 : 0x80;
    const unsigned char high = lead == 0xED ? 0x9F : 0xBF;
    return p[1] >= low && p[1] <= high && continuation(p[2]) ? 3 : 0;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    if (available < 4) return 0;
    const unsigned char low = lead == 0xF0 ? 0x90 : 0x80;
    const unsigned char high = lead == 0xF4 ? 0x8F : 0xBF;
    return p[1] >= low && p[1] <= high && continuation(p[2]) && continuation(p[3]) ? 4 : 0;
  }
  return 0;
}

// Where the writers put bytes: gathered in a fixed array and appended to the string in blocks,
// which keeps a capacity check and an out-of-line call per character out of the hot loop. The
// owner calls flush() when done (not the destructor, which must not throw).
class Sink {
 public:
  explicit Sink(std::string& out) : out_(out) {}
  Sink(const Sink&) = delete;
  Sink& operator=(const Sink&) = delete;

  void push_back(char c) {
    if (used_ == kCapacity) flush();
    buffer_[used_++] = c;
  }
  void append(const char* data, std::size_t size) {
    if (size > kCapacity - used_) {
      flush();
      if (size > kCapacity / 2) {
        out_.append(data, size);
        return;
      }
    }
    std::memcpy(buffer_ + used_, data, size);
    used_ += size;
  }
  void flush() {
    out_.append(buffer_, used_);
    used_ = 0;
  }

 private:
  static constexpr std::size_t kCapacity = 512;
  std::string& out_;
  std::size_t used_ = 0;
  char buffer_[kCapacity];
};

void appendEscape(Sink& out, unsigned char c) {
  static constexpr char kHex[] = "0123456789abcdef";
  switch (c) {
    case '"':
      out.append("\\\"", 2);
      return;
    case '\\':
      out.append("\\\\", 2);
      return;
    case '\b':
      out.append("\\b", 2);
      return;
    case '\t':
      out.append("\\t", 2);
      return;
    case '\n':
      out.append("\\n", 2);
      return;
    case '\f':
      out.append("\\f", 2);
      return;
    case '\r':
      out.append("\\r", 2);
      return;
    default: {
      const char escaped[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xF]};
      out.append(escaped, sizeof escaped);
    }
  }
}

// True if none of the 8 bytes at `p` needs attention: no control character, '"', '\\' or
// non-ASCII byte (the usual "has zero byte" bit tricks, one word at a time).
bool allPlain(const unsigned char* p) {
  constexpr std::uint64_t kOnes = 0x0101010101010101;
  constexpr std::uint64_t kHigh = 0x8080808080808080;
  std::uint64_t word;
  std::memcpy(&word, p, sizeof word);
  auto hasZeroByte = [](std::uint64_t x) { return (x - kOnes) & ~x & kHigh; };
  const std::uint64_t special = (word & kHigh) | ((word - kOnes * 0x20) & ~word & kHigh) |
                                hasZeroByte(word ^ (kOnes * '"')) |
                                hasZeroByte(word ^ (kOnes * '\\'));
  return special == 0;
}

enum class InvalidUtf8 { refuse, replace };

// Appends `text` as a JSON string with RFC 8785's minimal escaping. Invalid UTF-8 is either
// refused (returns false, `out` partly written) or each offending byte becomes U+FFFD.
bool appendString(Sink& out, std::string_view text, InvalidUtf8 invalid) {
  const auto* const begin = reinterpret_cast<const unsigned char*>(text.data());
  const auto* const end = begin + text.size();
  const auto* run = begin;  // start of bytes not yet copied
  out.push_back('"');
  for (const auto* p = begin; p < end;) {
    switch (kByteClasses[*p]) {
      case ByteClass::plain:
        ++p;
        while (end - p >= 8 && allPlain(p)) p += 8;
        break;
      case ByteClass::escape:
        out.append(reinterpret_cast<const char*>(run), static_cast<std::size_t>(p - run));
        appendEscape(out, *p);
        run = ++p;
        break;
      case ByteClass::multibyte:
        if (std::size_t length = utf8SequenceLength(p, end)) {
          p += length;
        } else if (invalid == InvalidUtf8::refuse) {
          return false;
        } else {
          out.append(reinterpret_cast<const char*>(run), static_cast<std::size_t>(p - run));
          out.append("\xEF\xBF\xBD", 3);
          run = ++p;
        }
        break;
    }
  }
  out.append(reinterpret_cast<const char*>(run), static_cast<std::size_t>(end - run));
  out.push_back('"');
  return true;
}

void appendInteger(Sink& out, std::int64_t number) {
  char buffer[24];
  auto result = std::to_chars(buffer, buffer + sizeof buffer, number);
  out.append(buffer, static_cast<std::size_t>(result.ptr - buffer));
}

// ECMAScript Number::toString (ECMA-262, "Number::toString") for a finite double. std::to_chars
// gives the shortest digits that round-trip, closest to the value, exactly the digits ECMAScript
// asks for; only their layout differs.
void appendNumber(Sink& out, double number) {
  if (number == 0) {  // +0 and -0 alike
    out.push_back('0');
    return;
  }
  if (std::abs(number) < kExactIntegerLimit && number == std::trunc(number)) {
    appendInteger(out, static_cast<std::int64_t>(number));
    return;
  }
  // Scientific form "-d.ddde-xxx": the digits, then the exponent.
  char scientific[32];
  auto converted = std::to_chars(scientific, scientific + sizeof scientific, number,
                                 std::chars_format::scientific);
  const char* p = scientific;
  const char* const scientificEnd = converted.ptr;

  char text[48];  // longest layout: "-0.000000" + 17 digits, or "-d." + 16 digits + "e-324"
  char* w = text;
  if (*p == '-') {
    *w++ = '-';
    ++p;
  }
  char digits[20];
  int k = 0;  // number of significant digits
  for (; p < scientificEnd && *p != 'e'; ++p) {
    if (*p != '.') digits[k++] = *p;
  }
  int exponent = 0;
  std::from_chars(p + 1 + (p[1] == '+' ? 1 : 0), scientificEnd, exponent);
  const int n = exponent + 1;  // the value is 0.digits * 10^n

  if (k <= n && n <= 21) {
    w = std::copy(digits, digits + k, w);
    w = std::fill_n(w, n - k, '0');
  } else if (0 < n && n <= 21) {
    w = std::copy(digits, digits + n, w);
    *w++ = '.';
    w = std::copy(digits + n, digits + k, w);
  } else if (-6 < n && n <= 0) {
    *w++ = '0';
    *w++ = '.';
    w = std::fill_n(w, -n, '0');
    w = std::copy(digits, digits + k, w);
  } else {
    *w++ = digits[0];
    if (k > 1) {
      *w++ = '.';
      w = std::copy(digits + 1, digits + k, w);
    }
    *w++ = 'e';
    *w++ = n - 1 >= 0 ? '+' : '-';
    w = std::to_chars(w, text + sizeof text, n - 1 >= 0 ? n - 1 : 1 - n).ptr;
  }
  out.append(text, static_cast<std::size_t>(w - text));
}

// Boost.JSON integers are numbers like any other to a JavaScript reader: beyond 2^53 they are
// rounded to the nearest double before printing.
void appendInt64(Sink& out, std::int64_t number) {
  if (number > -kExactIntegerLimitInt && number < kExactIntegerLimitInt) {
    appendInteger(out, number);
  } else {
    appendNumber(out, static_cast<double>(number));
  }
}

void appendUint64(Sink& out, std::uint64_t number) {
  if (number < static_cast<std::uint64_t>(kExactIntegerLimitInt)) {
    appendInteger(out, static_cast<std::int64_t>(number));
  } else {
    appendNumber(out, static_cast<double>(number));
  }
}

void appendCompact(Sink& out, const json::object& object);

void appendCompact(Sink& out, const json::value& value) {
  switch (value.kind()) {
    case json::kind::null:
      out.append("null", 4);
      return;
    case json::kind::bool_:
      if (value.get_bool()) {
        out.append("true", 4);
      } else {
        out.append("false", 5);
      }
      return;
    case json::kind::int64:
      appendInt64(out, value.get_int64());
      return;
    case json::kind::uint64:
      appendUint64(out, value.get_uint64());
      return;
    case json::kind::double_: {
      const double number = value.get_double();
      if (std::isfinite(number)) {
        appendNumber(out, number);
      } else {
        out.append("null", 4);
      }
      return;
    }
    case json::kind::string:
      appendString(out, value.get_string(), InvalidUtf8::replace);
      return;
    case json::kind::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& item : value.get_array()) {
        if (!first) out.push_back(',');
        first = false;
        appendCompact(out, item);
      }
      out.push_back(']');
      return;
    }
    case json::kind::object:
      appendCompact(out, value.get_object());
      return;
  }
}

void appendCompact(Sink& out, const json::object& object) {
  out.push_back('{');
  bool first = true;
  for (const auto& member : object) {
    if (!first) out.push_back(',');
    first = false;
    appendString(out, member.key(), InvalidUtf8::replace);
    out.push_back(':');
    appendCompact(out, member.value());
  }
  out.push_back('}');
}

// Orders UTF-8 strings by their UTF-16 code units (RFC 8785 section 3.2.3). Byte order already is
// code point order; UTF-16 differs only in putting U+E000..U+FFFF (lead bytes EE, EF) after the
// supplementary planes (lead bytes F0..F4, surrogates in UTF-16). Mapping EE, EF to FE, FF, bytes
// that never occur in UTF-8, and comparing bytewise gives exactly that order.
bool utf16Less(std::string_view a, std::string_view b) {
  auto rank = [](char c) {
    auto byte = static_cast<unsigned char>(c);
    return byte == 0xEE || byte == 0xEF ? static_cast<unsigned char>(byte + 0x10) : byte;
  };
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(),
                                      [&](char x, char y) { return rank(x) < rank(y); });
}

// One step of the path from the root to the value being written, kept on the call stack so the
// JSON pointer is only built for an error.
struct PathStep {
  const PathStep* parent;
  std::string_view key;
  std::size_t index;
  bool isIndex;
};

std::string jsonPointer(const PathStep* step) {
  std::vector<const PathStep*> steps;
  for (; step != nullptr; step = step->parent) steps.push_back(step);
  if (steps.empty()) return "the root";
  std::string pointer;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    appendPointerToken(pointer,
                       (*it)->isIndex ? std::to_string((*it)->index) : std::string((*it)->key));
  }
  return pointer;
}

class CanonicalWriter {
 public:
  // Returns false with error_ set on the first value that has no canonical form.
  bool write(const json::value& value, const PathStep* path) {
    switch (value.kind()) {
      case json::kind::null:
      case json::kind::bool_:
      case json::kind::int64:
      case json::kind::uint64:
        appendCompact(sink_, value);
        return true;
      case json::kind::double_:
        if (!std::isfinite(value.get_double())) return fail("non-finite number", path);
        appendNumber(sink_, value.get_double());
        return true;
      case json::kind::string:
        if (!appendString(sink_, value.get_string(), InvalidUtf8::refuse)) {
          return fail("invalid UTF-8 in string", path);
        }
        return true;
      case json::kind::array: {
        sink_.push_back('[');
        std::size_t index = 0;
        for (const auto& item : value.get_array()) {
          if (index != 0) sink_.push_back(',');
          PathStep step{path, {}, index++, true};
          if (!write(item, &step)) return false;
        }
        sink_.push_back(']');
        return true;
      }
      case json::kind::object:
        return writeObject(value.get_object(), path);
    }
    return true;
  }

  std::string takeText() {
    sink_.flush();
    return std::move(text_);
  }
  std::string takeError() { return std::move(error_); }

 private:
  bool writeObject(const json::object& object, const PathStep* path) {
    std::vector<const json::key_value_pair*> members;
    members.reserve(object.size());
    for (const auto& member : object) members.push_back(&member);
    std::sort(members.begin(), members.end(),
              [](const auto* a, const auto* b) { return utf16Less(a->key(), b->key()); });
    sink_.push_back('{');
    bool first = true;
    for (const auto* member : members) {
      if (!first) sink_.push_back(',');
      first = false;
      PathStep step{path, member->key(), 0, false};
      if (!appendString(sink_, member->key(), InvalidUtf8::refuse)) {
        return fail("invalid UTF-8 in object key", &step);
      }
      sink_.push_back(':');
      if (!write(member->value(), &step)) return false;
    }
    sink_.push_back('}');
    return true;
  }

  bool fail(std::string_view what, const PathStep* path) {
    error_.assign(what);
    error_ += " at ";
    error_ += jsonPointer(path);
    return false;
  }

  std::string text_;
  Sink sink_{text_};
  std::string error_;
};

}  // namespace

boost::system::result<std::string, CanonicalJsonError> canonicalJson(const json::value& value) {
  CanonicalWriter writer;
  if (!writer.write(value, nullptr)) return CanonicalJsonError{writer.takeError()};
  return {boost::system::in_place_value, writer.takeText()};
}

namespace {
template <typename Json>
std::string writeCompact(const Json& json) {
  std::string out;
  out.reserve(512);
  appendJson(out, json);
  return out;
}

template <typename Json>
void appendCompactTo(std::string& out, const Json& json) {
  Sink sink(out);
  appendCompact(sink, json);
  sink.flush();
}
}  // namespace

std::string writeJson(const json::value& value) { return writeCompact(value); }
std::string writeJson(const json::object& object) { return writeCompact(object); }
void appendJson(std::string& out, const json::value& value) { appendCompactTo(out, value); }

void appendPointerToken(std::string& out, std::string_view token) {
  out.push_back('/');
  for (char c : token) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out.push_back(c);
    }
  }
}
void appendJson(std::string& out, const json::object& object) { appendCompactTo(out, object); }

std::string formatNumber(double number) {
  if (std::isnan(number)) return "NaN";
  if (std::isinf(number)) return number > 0 ? "Infinity" : "-Infinity";
  std::string out;
  Sink sink(out);
  appendNumber(sink, number);
  sink.flush();
  return out;
}

}  // namespace toolhost::protocol
