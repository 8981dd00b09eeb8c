#include "runtime/json_bridge.h"

#include "protocol/json_parse.h"
#include "protocol/json_text.h"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/string.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

namespace toolhost::runtime {
namespace json = boost::json;

namespace {

constexpr double kInt64Limit = 9223372036854775808.0;  // 2^63
constexpr std::size_t kKillCheckEvery = 256;
// Room reserved up front for an array's elements or an object's members, at most: the count is
// known, but an array's length says nothing of the memory it holds.
constexpr std::uint32_t kReserveAtMost = 1024;
constexpr const char* kLoneSurrogate =
    "holds a lone surrogate (half of a UTF-16 pair, such as a string cut inside an emoji), which "
    "JSON text cannot carry";

// Bytes `text` takes as a JSON string, quotes included (the escaping of protocol::writeJson).
std::size_t jsonStringSize(std::string_view text) {
  std::size_t size = text.size() + 2;
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      size += 1;
    } else if (c < 0x20) {
      size += (c == '\b' || c == '\t' || c == '\n' || c == '\f' || c == '\r') ? 1 : 5;
    }
  }
  return size;
}

std::size_t integerSize(std::int64_t number) {
  std::size_t size = number < 0 ? 2 : 1;
  std::uint64_t magnitude = number < 0 ? 0 - static_cast<std::uint64_t>(number) : number;
  while (magnitude >= 10) {
    magnitude /= 10;
    ++size;
  }
  return size;
}

// A token of the pointer shown in errors, cut at 64 bytes.
void appendShortPointerToken(std::string& out, std::string_view token) {
  protocol::appendPointerToken(out, token.substr(0, 64));
  if (token.size() > 64) out += "...";
}

class Walker {
 public:
  Walker(v8::Local<v8::Context> context, const ToJsonOptions& options)
      : context_(context), isolate_(context->GetIsolate()), options_(options) {}

  boost::system::result<json::value, ToJsonError> walk(v8::Local<v8::Value> value) {
    if (value->IsUndefined()) return emit(4, json::value(nullptr));
    return convert(value, 0);
  }

 private:
  // A path segment: an array index, or an object key (owned by the frame that pushed it).
  struct Segment {
    std::uint32_t index;
    const std::string* key;
  };

  std::string pointer() const {
    std::string out;
    for (const auto& segment : path_) {
      if (segment.key != nullptr) {
        appendShortPointerToken(out, *segment.key);
      } else {
        appendShortPointerToken(out, std::to_string(segment.index));
      }
    }
    return out;
  }

  std::string where() const {
    std::string at = pointer();
    return std::string(options_.what) + (at.empty() ? "" : " at " + at);
  }

  ToJsonError invalid(const std::string& what) const {
    return ToJsonError{ToJsonError::Kind::invalid, where() + " " + what};
  }

  ToJsonError tooLarge() const {
    return ToJsonError{ToJsonError::Kind::tooLarge,
                       std::string(options_.what) + " is larger than the output limit of " +
                           std::to_string(options_.maxBytes) + " bytes of JSON"};
  }

  ToJsonError tooManyValues() const {
    return ToJsonError{ToJsonError::Kind::tooLarge, std::string(options_.what) + " has more than " +
                                                        std::to_string(options_.maxValues) +
                                                        " JSON values"};
  }

  // A scalar of `bytes` bytes of JSON text, unless that passes the limit.
  boost::system::result<json::value, ToJsonError> emit(std::size_t bytes, json::value value) {
    if (!charge(bytes)) return tooLarge();
    return value;
  }

  bool charge(std::size_t bytes) {
    bytes_ += bytes;
    return bytes_ <= options_.maxBytes;
  }

  bool killed() {
    if (++visited_ % kKillCheckEvery != 0 || options_.killed == nullptr) return false;
    return options_.killed->load() != 0;
  }

  // The description of a caught exception, for "reading /x threw ...".
  std::string describe(v8::TryCatch& tryCatch) {
    v8::Local<v8::Value> exception = tryCatch.Exception();
    if (exception.IsEmpty()) return "an exception";
    v8::TryCatch inner(isolate_);
    v8::Local<v8::String> text;
    if (exception->IsSymbol() || !exception->ToString(context_).ToLocal(&text)) {
      if (inner.HasTerminated()) {
        // The tool's toString was stopped: the call ends, whatever is described here.
        terminated_ = true;
        isolate_->TerminateExecution();
      }
      return "a value that cannot be shown";
    }
    return toUtf8(isolate_, text, 512);
  }

  boost::system::result<json::value, ToJsonError> convert(v8::Local<v8::Value> value,
                                                          std::size_t depth) {
    if (killed()) return ToJsonError{ToJsonError::Kind::killed, "stopped"};
    if (visited_ > options_.maxValues) return tooManyValues();
    if (value->IsNull()) return emit(4, json::value(nullptr));
    if (value->IsTrue()) return emit(4, json::value(true));
    if (value->IsFalse()) return emit(5, json::value(false));
    if (value->IsNumber()) return number(value.As<v8::Number>()->Value());
    if (value->IsString()) {
      auto text = string(value.As<v8::String>());
      if (!text) return text.error();
      return json::value(json::string(*text));
    }
    if (value->IsUndefined()) return invalid("is undefined");  // only inside objects; see walk
    if (value->IsBigInt()) {
      return invalid("is a BigInt, which JSON cannot carry; convert it to a string or a number");
    }
    if (value->IsSymbol()) return invalid("is a Symbol, which JSON cannot carry");
    if (!value->IsObject()) return invalid("is not a JSON value");
    if (value->IsProxy()) return invalid("is a Proxy; return plain data instead");
    if (value->IsFunction()) return invalid("is a function, which JSON cannot carry");
    if (auto exotic = exoticKind(value)) {
      return invalid(std::string("is ") + exotic + ", which JSON cannot carry");
    }
    auto object = value.As<v8::Object>();
    if (depth >= options_.maxDepth) {
      return invalid("is nested deeper than " + std::to_string(options_.maxDepth) + " levels");
    }
    for (const auto& ancestor : ancestors_) {
      if (ancestor == object) return invalid("refers back to an enclosing value (a cycle)");
    }
    ancestors_.push_back(object);
    auto out =
        value->IsArray() ? array(object.As<v8::Array>(), depth) : ordinaryObject(object, depth);
    ancestors_.pop_back();
    return out;
  }

  // Built-in objects that are not plain data. Error objects and class instances are walked as
  // ordinary objects (their own enumerable properties), as JSON.stringify would.
  static const char* exoticKind(v8::Local<v8::Value> value) {
    if (value->IsDate()) return "a Date (convert it with toISOString())";
    if (value->IsRegExp()) return "a RegExp";
    if (value->IsMap()) return "a Map (convert it with Object.fromEntries())";
    if (value->IsSet()) return "a Set (convert it with Array.from())";
    if (value->IsWeakMap() || value->IsWeakSet()) return "a WeakMap or WeakSet";
    if (value->IsPromise()) return "a Promise (await it first)";
    if (value->IsArrayBuffer() || value->IsSharedArrayBuffer()) return "an ArrayBuffer";
    if (value->IsArrayBufferView())
      return "a typed array or DataView (convert it with Array.from())";
    if (value->IsNumberObject() || value->IsStringObject() || value->IsBooleanObject() ||
        value->IsBigIntObject() || value->IsSymbolObject()) {
      return "a boxed primitive (new Number(), new String(), ...)";
    }
    if (value->IsModuleNamespaceObject()) return "a module namespace";
    if (value->IsGeneratorObject()) return "a generator";
    if (value->IsMapIterator() || value->IsSetIterator()) return "an iterator";
    if (value->IsExternal()) return "a host object";
    return nullptr;
  }

  boost::system::result<json::value, ToJsonError> number(double number) {
    if (!std::isfinite(number)) {
      return invalid(std::string("is ") + (std::isnan(number) ? "NaN" : "an infinite number") +
                     ", which JSON cannot carry");
    }
    // Integral doubles print the same as int64 below 2^63 (JavaScript uses exponents only from
    // 1e21), so they travel as integers; -0 becomes 0 as JSON.stringify writes it.
    if (number == std::trunc(number) && number >= -kInt64Limit && number < kInt64Limit) {
      auto integer = static_cast<std::int64_t>(number);
      return emit(integerSize(integer), json::value(integer));
    }
    return emit(protocol::formatNumber(number).size(), json::value(number));
  }

  boost::system::result<std::string, ToJsonError> string(v8::Local<v8::String> text) {
    // The length in UTF-16 code units is a lower bound of the UTF-8 length, and so of the JSON
    // size: refuse before copying a huge string (charge() below has the exact size).
    const auto length = static_cast<std::size_t>(text->Length());
    if (bytes_ + length + 2 > options_.maxBytes) return tooLarge();
    if (!wellFormed(isolate_, text)) return invalid(kLoneSurrogate);
    std::string out = toUtf8(isolate_, text);
    if (!charge(jsonStringSize(out))) return tooLarge();
    return out;
  }

  boost::system::result<json::value, ToJsonError> array(v8::Local<v8::Array> array,
                                                        std::size_t depth) {
    const std::uint32_t length = array->Length();
    if (!charge(2)) return tooLarge();
    json::array out;
    out.reserve(std::min<std::uint32_t>(length, kReserveAtMost));  // a sparse array may be huge
    for (std::uint32_t index = 0; index < length; ++index) {
      if (index > 0 && !charge(1)) return tooLarge();
      v8::HandleScope scope(isolate_);  // a huge array must not pile up handles
      path_.push_back(Segment{index, nullptr});
      v8::TryCatch tryCatch(isolate_);
      bool own = false;
      v8::Local<v8::Value> element;
      if (!array->HasRealIndexedProperty(context_, index).To(&own) ||
          (own && !array->Get(context_, index).ToLocal(&element))) {
        return threw(tryCatch);
      }
      if (!own || element->IsUndefined()) {  // a hole: never the prototype's element
        if (!charge(4)) return tooLarge();
        if (++visited_ > options_.maxValues) return tooManyValues();  // a null all the same
        out.emplace_back(nullptr);
      } else {
        auto converted = convert(element, depth + 1);
        if (!converted) return converted.error();
        out.push_back(std::move(*converted));
      }
      path_.pop_back();
    }
    return json::value(std::move(out));
  }

  boost::system::result<json::value, ToJsonError> ordinaryObject(v8::Local<v8::Object> object,
                                                                 std::size_t depth) {
    v8::TryCatch tryCatch(isolate_);
    v8::Local<v8::Array> keys;
    if (!object
             ->GetOwnPropertyNames(
                 context_, static_cast<v8::PropertyFilter>(v8::ONLY_ENUMERABLE | v8::SKIP_SYMBOLS),
                 v8::KeyConversionMode::kConvertToString)
             .ToLocal(&keys)) {
      return threw(tryCatch);
    }
    if (!charge(2)) return tooLarge();
    json::object out;
    const std::uint32_t count = keys->Length();
    out.reserve(std::min<std::uint32_t>(count, kReserveAtMost));
    for (std::uint32_t i = 0; i < count; ++i) {
      v8::HandleScope scope(isolate_);
      v8::Local<v8::Value> key;
      if (!keys->Get(context_, i).ToLocal(&key)) return threw(tryCatch);
      if (!key->IsString()) continue;
      // As for string values: a key that cannot fit is refused before it is copied.
      if (bytes_ + static_cast<std::size_t>(key.As<v8::String>()->Length()) + 3 >
          options_.maxBytes) {
        return tooLarge();
      }
      // Its U+FFFD form could be another key's: one member would silently replace the other.
      if (!wellFormed(isolate_, key.As<v8::String>())) {
        return invalid(std::string("has a key that ") + kLoneSurrogate);
      }
      std::string name = toUtf8(isolate_, key.As<v8::String>());
      path_.push_back(Segment{0, &name});
      bool own = false;
      v8::Local<v8::Value> member;
      // A getter may have deleted this key; never fall back to the prototype's value.
      if (!object->HasRealNamedProperty(context_, key.As<v8::Name>()).To(&own)) {
        return threw(tryCatch);
      }
      if (own && !object->Get(context_, key).ToLocal(&member)) return threw(tryCatch);
      if (own && !member->IsUndefined()) {
        if (!charge(jsonStringSize(name) + 1 + (out.empty() ? 0 : 1))) return tooLarge();
        auto converted = convert(member, depth + 1);
        if (!converted) return converted.error();
        out.emplace(name, std::move(*converted));  // own keys are distinct
      }
      path_.pop_back();
    }
    return json::value(std::move(out));
  }

  ToJsonError threw(v8::TryCatch& tryCatch) {
    if (tryCatch.HasTerminated() || (options_.killed != nullptr && options_.killed->load() != 0)) {
      return ToJsonError{ToJsonError::Kind::killed, "stopped"};
    }
    std::string description = describe(tryCatch);
    if (terminated_) return ToJsonError{ToJsonError::Kind::killed, "stopped"};
    return invalid("could not be read: it threw " + description);
  }

  v8::Local<v8::Context> context_;
  v8::Isolate* isolate_;
  const ToJsonOptions& options_;
  std::size_t bytes_ = 0;
  std::size_t visited_ = 0;
  bool terminated_ = false;  // stopped while describing what the tool threw
  std::vector<Segment> path_;
  std::vector<v8::Local<v8::Object>> ancestors_;
};

}  // namespace

boost::system::result<json::value, ToJsonError> toJson(v8::Local<v8::Context> context,
                                                       v8::Local<v8::Value> value,
                                                       const ToJsonOptions& options) {
  v8::HandleScope scope(context->GetIsolate());
  return Walker(context, options).walk(value);
}

std::size_t jsonTextSize(const json::value& value) {
  switch (value.kind()) {
    case json::kind::null:
      return 4;
    case json::kind::bool_:
      return value.get_bool() ? 4 : 5;
    case json::kind::int64:
      return integerSize(value.get_int64());
    case json::kind::uint64:
      return std::to_string(value.get_uint64()).size();
    case json::kind::double_:
      return protocol::formatNumber(value.get_double()).size();
    case json::kind::string:
      return jsonStringSize(value.get_string());
    case json::kind::array: {
      const auto& array = value.get_array();
      std::size_t size = 2 + (array.empty() ? 0 : array.size() - 1);
      for (const auto& element : array) size += jsonTextSize(element);
      return size;
    }
    case json::kind::object: {
      const auto& object = value.get_object();
      std::size_t size = 2 + (object.empty() ? 0 : object.size() - 1);
      for (const auto& member : object) {
        size += jsonStringSize(member.key()) + 1 + jsonTextSize(member.value());
      }
      return size;
    }
  }
  return 0;
}

namespace {
v8::MaybeLocal<v8::Value> parseInContext(v8::Local<v8::Context> context, const std::string& text) {
  v8::Isolate* isolate = context->GetIsolate();
  if (text.size() > static_cast<std::size_t>(v8::String::kMaxLength)) return {};
  v8::Local<v8::String> source;
  if (!v8::String::NewFromUtf8(isolate, text.data(), v8::NewStringType::kNormal,
                               static_cast<int>(text.size()))
           .ToLocal(&source)) {
    return {};
  }
  return v8::JSON::Parse(context, source);
}
}  // namespace

std::size_t parseHeapEstimate(const json::object& object, std::size_t textBytes) {
  return 2 * textBytes + protocol::countJsonValues(object) * kHeapBytesPerValue;
}

v8::MaybeLocal<v8::Value> fromJsonText(v8::Local<v8::Context> context, const std::string& text) {
  return parseInContext(context, text);
}

v8::MaybeLocal<v8::Value> fromJson(v8::Local<v8::Context> context, const json::value& value) {
  return parseInContext(context, protocol::writeJson(value));
}

v8::MaybeLocal<v8::Value> fromJson(v8::Local<v8::Context> context, const json::object& object) {
  return parseInContext(context, protocol::writeJson(object));
}

std::string toUtf8(v8::Isolate* isolate, v8::Local<v8::String> text, std::size_t maxBytes) {
  // Most strings (and nearly every key) are ASCII, stored one byte per character: copied as they
  // are, they are already UTF-8, which spares the two scans of the general path below.
  if (text->IsOneByte()) {
    const int length = text->Length();
    if (static_cast<std::size_t>(length) <= maxBytes) {
      std::string out(static_cast<std::size_t>(length), '\0');
      text->WriteOneByte(isolate, reinterpret_cast<std::uint8_t*>(out.data()), 0, length,
                         v8::String::NO_NULL_TERMINATION);
      if (std::none_of(out.begin(), out.end(),
                       [](char c) { return static_cast<unsigned char>(c) >= 0x80; })) {
        return out;
      }
      // Latin-1 beyond ASCII takes two bytes in UTF-8: the general path.
    }
  }
  // Longer than maxBytes in UTF-16 units: longer in UTF-8 too, and only the first maxBytes
  // bytes are wanted, without a scan of the whole string.
  const std::size_t capacity =
      static_cast<std::size_t>(text->Length()) > maxBytes
          ? maxBytes
          : std::min(static_cast<std::size_t>(text->Utf8Length(isolate)), maxBytes);
  std::string out(capacity, '\0');
  const int written =
      text->WriteUtf8(isolate, out.data(), static_cast<int>(capacity), nullptr,
                      v8::String::NO_NULL_TERMINATION | v8::String::REPLACE_INVALID_UTF8);
  out.resize(static_cast<std::size_t>(written));
  return out;
}

bool wellFormed(v8::Isolate* isolate, v8::Local<v8::String> text) {
  if (text->IsOneByte()) return true;
  std::vector<std::uint16_t> units(static_cast<std::size_t>(text->Length()));
  if (units.empty()) return true;
  text->Write(isolate, units.data(), 0, static_cast<int>(units.size()),
              v8::String::NO_NULL_TERMINATION);
  for (std::size_t i = 0; i < units.size(); ++i) {
    const std::uint16_t unit = units[i];
    if (unit >= 0xD800 && unit <= 0xDBFF && i + 1 < units.size() && units[i + 1] >= 0xDC00 &&
        units[i + 1] <= 0xDFFF) {
      ++i;  // a pair
    } else if (unit >= 0xD800 && unit <= 0xDFFF) {
      return false;
    }
  }
  return true;
}

std::optional<std::string> toUtf8Within(v8::Isolate* isolate, v8::Local<v8::String> text,
                                        std::size_t maxBytes) {
  if (static_cast<std::size_t>(text->Length()) > maxBytes) return std::nullopt;
  std::string out = toUtf8(isolate, text);
  if (out.size() > maxBytes) return std::nullopt;
  return out;
}

v8::Local<v8::String> v8String(v8::Isolate* isolate, std::string_view text) {
  return v8::String::NewFromUtf8(isolate, text.data(), v8::NewStringType::kNormal,
                                 static_cast<int>(text.size()))
      .ToLocalChecked();
}

}  // namespace toolhost::runtime
