#include "runtime/web_globals.h"

#include "protocol/json_parse.h"
#include "runtime/base64.h"
#include "runtime/fetch_api.h"
#include "runtime/json_bridge.h"
#include "runtime/sandbox.h"
#include "runtime/url_prelude.h"

#include <openssl/evp.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

namespace toolhost::runtime {

namespace {

// The most bytes one getRandomValues call fills, as in browsers.
constexpr std::size_t kMaxRandomBytes = 65536;

// The built-ins the lazy preludes use, by path from the global object. No RegExp: its exec sets
// the legacy RegExp.lastMatch and $1 a tool can read, which a native URL never touches, so the
// URL prelude scans with loops instead. Their values are taken when
// the context is made, before any tool code runs (a tool may replace any of them later), and kept
// in an array, which costs a sandbox far less than an object or a prelude script would; a lazy
// prelude gets them as an object keyed by these paths (natives.intrinsics, or its argument).
constexpr const char* kIntrinsics[] = {"ArrayBuffer",
                                       "ArrayBuffer.isView",
                                       "JSON.parse",
                                       "JSON.stringify",
                                       "Math.trunc",
                                       "Number",
                                       "Error",
                                       "Promise",
                                       "RangeError",
                                       "String",
                                       "TypeError",
                                       "Uint8Array",
                                       "Array.prototype.join",
                                       "Function.prototype.bind",
                                       "Function.prototype.call",
                                       "Math.floor",
                                       "Number.prototype.toString",
                                       "Object.defineProperty",
                                       "Object.freeze",
                                       "Object.getPrototypeOf",
                                       "Object.setPrototypeOf",
                                       "Promise.reject",
                                       "Promise.resolve",
                                       "Reflect.apply",
                                       "Reflect.getOwnPropertyDescriptor",
                                       "Reflect.ownKeys",
                                       "String.fromCharCode",
                                       "String.prototype.charCodeAt",
                                       "String.prototype.indexOf",
                                       "String.prototype.lastIndexOf",
                                       "String.prototype.normalize",
                                       "String.prototype.slice",
                                       "String.prototype.toLowerCase",
                                       "Symbol.iterator",
                                       "Symbol.toStringTag"};

// The prelude behind TextEncoder, TextDecoder, atob, btoa, crypto and DOMException. It takes
// every built-in it uses from the intrinsics (kIntrinsics), never from the global object or a
// prototype, and the objects it hands out keep their state in private fields.
constexpr const char* kWebPrelude = R"JS((function (natives) {
  'use strict';
  const I = natives.intrinsics;
  const uncurry = (f) => I['Reflect.apply'](I['Function.prototype.bind'],
                                           I['Function.prototype.call'], [f]);
  const encode = natives.encode;
  const encodeInto = natives.encodeInto;
  const decode = natives.decode;
  const randomFill = natives.randomFill;
  const digest = natives.digest;
  const base64Encode = natives.base64Encode;
  const base64Decode = natives.base64Decode;
  const ErrorCtor = I['Error'];
  const TypeErrorCtor = I['TypeError'];
  const RangeErrorCtor = I['RangeError'];
  const StringCtor = I['String'];
  const Uint8ArrayCtor = I['Uint8Array'];
  const PromiseCtor = I['Promise'];
  const promiseResolve = I['Promise.resolve'];
  const promiseReject = I['Promise.reject'];
  const PromiseResolve = (value) => I['Reflect.apply'](promiseResolve, PromiseCtor, [value]);
  const PromiseReject = (error) => I['Reflect.apply'](promiseReject, PromiseCtor, [error]);
  const ObjectFreeze = I['Object.freeze'];
  const ObjectDefineProperty = I['Object.defineProperty'];
  const toLowerCase = uncurry(I['String.prototype.toLowerCase']);
  const charCodeAt = uncurry(I['String.prototype.charCodeAt']);
  const stringSlice = uncurry(I['String.prototype.slice']);
  const numberToString = uncurry(I['Number.prototype.toString']);
  const SymbolToStringTag = I['Symbol.toStringTag'];

  function define(object, key, value) {
    ObjectDefineProperty(object, key, {
      __proto__: null, value, writable: false, enumerable: false, configurable: true,
    });
  }

  // The DOMException codes of the names this runtime throws, and a few a tool may construct.
  const legacyCodes = {
    __proto__: null, IndexSizeError: 1, NotFoundError: 8, NotSupportedError: 9,
    InvalidStateError: 11, SyntaxError: 12, InvalidAccessError: 15, TypeMismatchError: 17,
    QuotaExceededError: 22, TimeoutError: 23, DataCloneError: 25, AbortError: 20,
    InvalidCharacterError: 5, NetworkError: 19,
  };
  class DOMException extends ErrorCtor {
    #name;
    // The name, or an options object {name, cause}, as WebIDL's DOMException takes them.
    constructor(message = '', options = 'Error') {
      const isOptions = options !== null && typeof options === 'object';
      const hasCause = isOptions && 'cause' in options;
      super(StringCtor(message), hasCause ? {cause: options.cause} : undefined);
      this.#name = isOptions ? (options.name === undefined ? 'Error' : StringCtor(options.name))
                             : StringCtor(options);
    }
    get name() { return this.#name; }
    get code() { return legacyCodes[this.#name] || 0; }
  }
  define(DOMException.prototype, SymbolToStringTag, 'DOMException');

  class TextEncoder {
    get encoding() { return 'utf-8'; }
    encode(input = '') { return encode(StringCtor(input)); }
    encodeInto(source, destination) {
      const counts = encodeInto(StringCtor(source), destination);
      return {read: counts[0], written: counts[1]};
    }
  }
  define(TextEncoder.prototype, SymbolToStringTag, 'TextEncoder');

  function isAsciiWhitespace(c) {
    return c === 0x09 || c === 0x0a || c === 0x0c || c === 0x0d || c === 0x20;
  }
  function trimAscii(text) {
    let start = 0;
    let end = text.length;
    while (start < end && isAsciiWhitespace(charCodeAt(text, start))) start++;
    while (end > start && isAsciiWhitespace(charCodeAt(text, end - 1))) end--;
    return stringSlice(text, start, end);
  }
  const utf8Labels = {
    __proto__: null, 'unicode-1-1-utf-8': true, 'unicode11utf8': true, 'unicode20utf8': true,
    'utf-8': true, 'utf8': true, 'x-unicode20utf8': true,
  };

  class TextDecoder {
    #fatal;
    #ignoreBOM;
    #pending = null;  // the bytes of a sequence a streaming decode() ended inside
    #bomSeen = false;
    constructor(label = 'utf-8', options = undefined) {
      const name = toLowerCase(trimAscii(StringCtor(label)));
      if (utf8Labels[name] !== true) {
        throw new RangeErrorCtor('TextDecoder: the encoding "' + StringCtor(label) +
                                 '" is not supported (only UTF-8 is)');
      }
      if (options !== undefined && options !== null && typeof options !== 'object' &&
          typeof options !== 'function') {
        throw new TypeErrorCtor('TextDecoder: options must be an object');
      }
      this.#fatal = options == null ? false : !!options.fatal;
      this.#ignoreBOM = options == null ? false : !!options.ignoreBOM;
    }
    get encoding() { return 'utf-8'; }
    get fatal() { return this.#fatal; }
    get ignoreBOM() { return this.#ignoreBOM; }
    decode(input = undefined, options = undefined) {
      if (options !== undefined && options !== null && typeof options !== 'object' &&
          typeof options !== 'function') {
        throw new TypeErrorCtor('TextDecoder.decode: options must be an object');
      }
      const stream = options == null ? false : !!options.stream;
      const pending = this.#pending;
      this.#pending = null;
      // [text, the undecoded tail or null]; throws a TypeError when fatal and malformed.
      let out;
      try {
        out = decode(input, pending, this.#fatal, stream);
      } catch (error) {
        this.#bomSeen = false;
        throw error;
      }
      let text = out[0];
      if (!this.#ignoreBOM && !this.#bomSeen && text.length > 0) {
        if (charCodeAt(text, 0) === 0xfeff) text = stringSlice(text, 1);
        this.#bomSeen = true;
      } else if (text.length > 0) {
        this.#bomSeen = true;
      }
      if (stream) {
        this.#pending = out[1];
      } else {
        this.#bomSeen = false;
      }
      return text;
    }
  }
  define(TextDecoder.prototype, SymbolToStringTag, 'TextDecoder');

  function atob(data) {
    if (arguments.length < 1) throw new TypeErrorCtor('atob: 1 argument required');
    const out = base64Decode(StringCtor(data));
    if (out === undefined) {
      throw new DOMException('atob: the string is not correctly encoded base64',
                             'InvalidCharacterError');
    }
    return out;
  }
  function btoa(data) {
    if (arguments.length < 1) throw new TypeErrorCtor('btoa: 1 argument required');
    const out = base64Encode(StringCtor(data));
    if (out === undefined) {
      throw new DOMException('btoa: the string has characters outside Latin1',
                             'InvalidCharacterError');
    }
    return out;
  }

  function getRandomValues(array) {
    const failure = randomFill(array);
    if (failure === 1) {
      throw new DOMException(
          'crypto.getRandomValues: the argument must be an integer-type TypedArray',
          'TypeMismatchError');
    }
    if (failure === 2) {
      throw new DOMException(
          'crypto.getRandomValues: at most 65536 bytes can be requested at once',
          'QuotaExceededError');
    }
    return array;
  }
  function hex(byte) {
    return byte < 16 ? '0' + numberToString(byte, 16) : numberToString(byte, 16);
  }
  function randomUUID() {
    const bytes = new Uint8ArrayCtor(16);
    randomFill(bytes);
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let out = '';
    for (let i = 0; i < 16; i++) {
      if (i === 4 || i === 6 || i === 8 || i === 10) out += '-';
      out += hex(bytes[i]);
    }
    return out;
  }
  const digestNames = {
    __proto__: null, 'sha-1': 'SHA-1', 'sha-256': 'SHA-256', 'sha-384': 'SHA-384',
    'sha-512': 'SHA-512',
  };
  function subtleDigest(algorithm, data) {
    try {
      if (arguments.length < 2) throw new TypeErrorCtor('crypto.subtle.digest: 2 arguments required');
      const name = typeof algorithm === 'object' && algorithm !== null
          ? StringCtor(algorithm.name) : StringCtor(algorithm);
      const known = digestNames[toLowerCase(name)];
      if (known === undefined) {
        throw new DOMException('crypto.subtle.digest: unknown algorithm "' + name + '"',
                               'NotSupportedError');
      }
      return PromiseResolve(digest(known, data));
    } catch (error) {
      return PromiseReject(error);
    }
  }
  const subtle = {digest: subtleDigest};
  define(subtle, SymbolToStringTag, 'SubtleCrypto');
  ObjectFreeze(subtle);
  const crypto = {getRandomValues, randomUUID, subtle};
  define(crypto, SymbolToStringTag, 'Crypto');
  ObjectFreeze(crypto);

  const bindings = {
    __proto__: null, DOMException, TextEncoder, TextDecoder, atob, btoa, crypto,
  };
  return (name) => bindings[name];
}))JS";

constexpr const char* kWebNames[] = {"DOMException", "TextEncoder", "TextDecoder",
                                     "atob",         "btoa",        "crypto"};
constexpr const char* kUrlNames[] = {"URL", "URLSearchParams"};
constexpr const char* kFetchNames[] = {"Headers", "Response"};

// The lazy preludes, by the index each lazy global's getter carries.
enum LazyPrelude : int { kWeb = 0, kUrl = 1, kFetch = 2 };

// The prelude behind `name`'s global.
LazyPrelude preludeOf(const char* name) {
  for (const char* known : kUrlNames) {
    if (std::strcmp(known, name) == 0) return kUrl;
  }
  for (const char* known : kFetchNames) {
    if (std::strcmp(known, name) == 0) return kFetch;
  }
  return kWeb;
}

void throwTypeError(v8::Isolate* isolate, const std::string& message) {
  isolate->ThrowException(v8::Exception::TypeError(v8String(isolate, message)));
}

// Whether `text` is short enough to copy out of the heap: a tool's string may be a rope of a
// gigabyte that costs the heap little, and the natives below copy what they read. Bounded by the
// call's ArrayBuffer limit; throws a RangeError otherwise.
bool copyable(v8::Isolate* isolate, v8::Local<v8::String> text, const char* what) {
  const std::size_t limit = Sandbox::from(isolate).arrayBufferLimit();
  if (static_cast<std::size_t>(text->Length()) <= limit) return true;
  isolate->ThrowException(v8::Exception::RangeError(
      v8String(isolate, std::string(what) + ": the string has " + std::to_string(text->Length()) +
                            " characters, more than the call's ArrayBuffer limit of " +
                            std::to_string(limit) + " bytes")));
  return false;
}

// A JavaScript string of UTF-16 units, one-byte when every unit fits.
v8::MaybeLocal<v8::String> fromUtf16(v8::Isolate* isolate, const std::u16string& text) {
  if (text.size() > static_cast<std::size_t>(v8::String::kMaxLength)) return {};
  bool oneByte = true;
  for (char16_t unit : text) {
    if (unit > 0xFF) {
      oneByte = false;
      break;
    }
  }
  if (!oneByte) {
    return v8::String::NewFromTwoByte(isolate, reinterpret_cast<const std::uint16_t*>(text.data()),
                                      v8::NewStringType::kNormal, static_cast<int>(text.size()));
  }
  std::string bytes(text.begin(), text.end());
  return v8::String::NewFromOneByte(isolate, reinterpret_cast<const std::uint8_t*>(bytes.data()),
                                    v8::NewStringType::kNormal, static_cast<int>(bytes.size()));
}

// encode(string) -> Uint8Array of its UTF-8 (lone surrogates as U+FFFD).
void onEncode(const v8::FunctionCallbackInfo<v8::Value>& info) {
  v8::Isolate* isolate = info.GetIsolate();
  v8::HandleScope scope(isolate);
  if (info.Length() < 1 || !info[0]->IsString()) return throwTypeError(isolate, "not a string");
  auto text = info[0].As<v8::String>();
  Sandbox& sandbox = Sandbox::from(isolate);
  // Its UTF-8 has at least as many bytes as it has characters: past the limit, the allocation is
  // refused (and the call killed) before a rope is flattened to measure it.
  if (static_cast<std::size_t>(text->Length()) > sandbox.arrayBufferLimit()) {
    (void)sandbox.newArrayBuffer(static_cast<std::size_t>(text->Length()));
    return;
  }
  const int length = text->Utf8Length(isolate);
  v8::Local<v8::ArrayBuffer> buffer;
  if (!sandbox.newArrayBuffer(static_cast<std::size_t>(length)).ToLocal(&buffer)) {
    return;
  }
  if (length > 0) {
    text->WriteUtf8(isolate, static_cast<char*>(buffer->GetBackingStore()->Data()), length, nullptr,
                    v8::String::NO_NULL_TERMINATION | v8::String::REPLACE_INVALID_UTF8);
  }
  info.GetReturnValue().Set(v8::Uint8Array::New(buffer, 0, static_cast<std::size_t>(length)));
}

// encodeInto(string, Uint8Array) -> [UTF-16 units read, bytes written]: as much of the string as
// fits whole characters.
void onEncodeInto(const v8::FunctionCallbackInfo<v8::Value>& info) {
  v8::Isolate* isolate = info.GetIsolate();
  v8::HandleScope scope(isolate);
  if (info.Length() < 2 || !info[0]->IsString() || !info[1]->IsUint8Array()) {
    return throwTypeError(isolate, "TextEncoder.encodeInto: the destination must be a Uint8Array");
  }
  auto text = info[0].As<v8::String>();
  auto view = info[1].As<v8::Uint8Array>();
  const std::size_t capacity = view->ByteLength();
  std::size_t read = 0, written = 0;
  if (capacity > 0 && text->Length() > 0) {
    char* out = static_cast<char*>(view->Buffer()->GetBackingStore()->Data()) + view->ByteOffset();
    // WriteUtf8 stops before a character that does not fit whole; it counts what it read in
    // characters, where a surrogate pair is one.
    const int capped = static_cast<int>(std::min<std::size_t>(capacity, INT32_MAX));
    int characters = 0;
    written = static_cast<std::size_t>(
        text->WriteUtf8(isolate, out, capped, &characters,
                        v8::String::NO_NULL_TERMINATION | v8::String::REPLACE_INVALID_UTF8));
    // UTF-16 units read: a four-byte sequence came from two units, every other from one.
    std::size_t fourByte = 0;
    for (std::size_t i = 0; i < written; ++i) {
      if ((static_cast<unsigned char>(out[i]) & 0xF8) == 0xF0) ++fourByte;
    }
    read = static_cast<std::size_t>(characters) + fourByte;
    if (read > static_cast<std::size_t>(text->Length())) read = text->Length();
  }
  v8::Local<v8::Value> counts[] = {v8::Number::New(isolate, static_cast<double>(read)),
                                   v8::Number::New(isolate, static_cast<double>(written))};
  info.GetReturnValue().Set(v8::Array::New(isolate, counts, 2));
}

// The bytes of a BufferSource (ArrayBuffer or view), or nullopt if `value` is none.
std::optional<std::string_view> bufferBytes(v8::Local<v8::Value> value) {
  if (value->IsArrayBuffer()) {
    auto store = value.As<v8::ArrayBuffer>()->GetBackingStore();
    return std::string_view(static_cast<const char*>(store->Data()), store->ByteLength());
  }
  if (value->IsArrayBufferView()) {
    auto view = value.As<v8::ArrayBufferView>();
    auto store = view->Buffer()->GetBackingStore();
    if (store->Data() == nullptr) return std::string_view();
    return std::string_view(static_cast<const char*>(store->Data()) + view->ByteOffset(),
                            view->ByteLength());
  }
  return std::nullopt;
}

// The length of an incomplete but so far valid UTF-8 sequence that ends `bytes` (0 if none): what
// a streaming decode leaves for the next chunk. A lead byte never continues a sequence, so the
// sequence starts at the last lead byte among the final three, if the bytes after it fit.
std::size_t incompleteTail(std::string_view bytes) {
  for (std::size_t back = 1; back <= 3 && back <= bytes.size(); ++back) {
    const unsigned byte = static_cast<unsigned char>(bytes[bytes.size() - back]);
    if (byte >= 0x80 && byte <= 0xBF) continue;
    const std::size_t length = byte >= 0xC2 && byte <= 0xDF   ? 2
                               : byte >= 0xE0 && byte <= 0xEF ? 3
                               : byte >= 0xF0 && byte <= 0xF4 ? 4
                                                              : 0;
    if (length <= back) return 0;
    if (back >= 2) {
      const unsigned second = static_cast<unsigned char>(bytes[bytes.size() - back + 1]);
      const unsigned lower = byte == 0xE0 ? 0xA0 : byte == 0xF0 ? 0x90 : 0x80;
      const unsigned upper = byte == 0xED ? 0x9F : byte == 0xF4 ? 0x8F : 0xBF;
      if (second < lower || second > upper) return 0;
    }
    return back;
  }
  return 0;
}

bool validUtf8(std::string_view bytes) {
  for (std::size_t i = 0; i < bytes.size();) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    const std::size_t length = protocol::utf8SequenceAt(bytes, i);
    if (length == 0) return false;
    i += length;
  }
  return true;
}

// decode(input, pending: Uint8Array | null, fatal, stream) -> [text, tail: Uint8Array | null].
// The bulk of the input is decoded by V8 straight into the heap (its decoder replaces invalid
// sequences as the Encoding Standard says), so the only copies outside the heap are a few bytes
// around a sequence the previous chunk ended inside.
void onDecode(const v8::FunctionCallbackInfo<v8::Value>& info) {
  v8::Isolate* isolate = info.GetIsolate();
  v8::HandleScope scope(isolate);
  std::string_view pending, input;
  if (info.Length() >= 2 && !info[1]->IsNullOrUndefined()) {
    pending = bufferBytes(info[1]).value_or(std::string_view());
  }
  if (info.Length() >= 1 && !info[0]->IsUndefined()) {
    auto bytes = bufferBytes(info[0]);
    if (!bytes) {
      return throwTypeError(isolate,
                            "TextDecoder.decode: the input must be an ArrayBuffer, a TypedArray "
                            "or a DataView");
    }
    input = *bytes;
  }
  const bool fatal = info.Length() >= 3 && info[2]->BooleanValue(isolate);
  const bool stream = info.Length() >= 4 && info[3]->BooleanValue(isolate);
  const auto invalid = [isolate] {
    throwTypeError(isolate, "TextDecoder.decode: the data is not valid UTF-8");
  };
  const auto tooLong = [isolate] {
    if (isolate->IsExecutionTerminating()) return;
    isolate->ThrowException(
        v8::Exception::RangeError(v8String(isolate, "TextDecoder.decode: the text is too long")));
  };

  // The sequence the last chunk ended inside, with the few bytes that finish it (or show it
  // broken): at most 3 + 3 bytes, decoded here.
  v8::Local<v8::String> text = v8::String::Empty(isolate);
  std::string tailBytes;
  if (!pending.empty()) {
    const std::size_t taken = std::min<std::size_t>(input.size(), 3);
    std::string head(pending);
    head.append(input.substr(0, taken));
    const bool more = taken < input.size();
    std::size_t headTail = 0;
    auto decoded = decodeUtf8(head, fatal, stream || more, headTail);
    if (!decoded) return invalid();
    if (!fromUtf16(isolate, *decoded).ToLocal(&text)) return tooLong();
    if (!more) {
      tailBytes = head.substr(head.size() - headTail);
      input = std::string_view();
    } else {
      // What is left undecoded of the head is the start of a sequence within the input's first
      // bytes: the input resumes there.
      input = input.substr(taken - headTail);
    }
  }
  if (!input.empty()) {
    const std::size_t tail = stream ? incompleteTail(input) : 0;
    const std::string_view body = input.substr(0, input.size() - tail);
    tailBytes = std::string(input.substr(input.size() - tail));
    if (fatal && !validUtf8(body)) return invalid();
    if (body.size() > static_cast<std::size_t>(v8::String::kMaxLength)) return tooLong();
    v8::Local<v8::String> decoded;
    if (!v8::String::NewFromUtf8(isolate, body.data(), v8::NewStringType::kNormal,
                                 static_cast<int>(body.size()))
             .ToLocal(&decoded)) {
      return tooLong();
    }
    text = v8::String::Concat(isolate, text, decoded);
  }
  v8::Local<v8::Value> tailValue = v8::Null(isolate);
  if (!tailBytes.empty()) {
    auto buffer = v8::ArrayBuffer::New(isolate, tailBytes.size());
    std::memcpy(buffer->GetBackingStore()->Data(), tailBytes.data(), tailBytes.size());
    tailValue = v8::Uint8Array::New(buffer, 0, tailBytes.size());
  }
  v8::Local<v8::Value> out[] = {text, tailValue};
  info.GetReturnValue().Set(v8::Array::New(isolate, out, 2));
}

// randomFill(array) -> 0, or 1 when not an integer TypedArray, 2 when over kMaxRandomBytes.
void onRandomFill(const v8::FunctionCallbackInfo<v8::Value>& info) {
  v8::Isolate* isolate = info.GetIsolate();
  if (info.Length() < 1 || !info[0]->IsTypedArray() || info[0]->IsFloat32Array() ||
      info[0]->IsFloat64Array()) {
    info.GetReturnValue().Set(1);
    return;
  }
  auto view = info[0].As<v8::TypedArray>();
  const std::size_t length = view->ByteLength();
  if (length > kMaxRandomBytes) {
    info.GetReturnValue().Set(2);
    return;
  }
  if (length > 0) {
    auto* out =
        static_cast<std::uint8_t*>(view->Buffer()->GetBackingStore()->Data()) + view->ByteOffset();
    std::size_t filled = 0;
    while (filled < length) {
      const ssize_t got = getrandom(out + filled, length - filled, 0);
      if (got < 0) {
        if (errno == EINTR) continue;
        isolate->ThrowException(v8::Exception::Error(v8String(
            isolate,
            std::string("crypto: the system gave no random bytes: ") + std::strerror(errno))));
        return;
      }
      filled += static_cast<std::size_t>(got);
    }
  }
  info.GetReturnValue().Set(0);
}

// digest(name, data) -> ArrayBuffer; name is one of the four the prelude checked.
void onDigest(const v8::FunctionCallbackInfo<v8::Value>& info) {
  v8::Isolate* isolate = info.GetIsolate();
  v8::HandleScope scope(isolate);
  const std::string name = info.Length() >= 1 ? toUtf8(isolate, info[0].As<v8::String>()) : "";
  const EVP_MD* md = name == "SHA-1"     ? EVP_sha1()
                     : name == "SHA-256" ? EVP_sha256()
                     : name == "SHA-384" ? EVP_sha384()
                     : name == "SHA-512" ? EVP_sha512()
                                         : nullptr;
  std::optional<std::string_view> data;
  if (info.Length() >= 2) data = bufferBytes(info[1]);
  if (!data) {
    return throwTypeError(
        isolate,
        "crypto.subtle.digest: the data must be an ArrayBuffer, a TypedArray or a DataView");
  }
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (md == nullptr || EVP_Digest(data->data(), data->size(), out, &size, md, nullptr) != 1) {
    isolate->ThrowException(
        v8::Exception::Error(v8String(isolate, "crypto.subtle.digest: the digest failed")));
    return;
  }
  v8::Local<v8::ArrayBuffer> buffer;
  if (!Sandbox::from(isolate).newArrayBuffer(size).ToLocal(&buffer)) return;
  std::memcpy(buffer->GetBackingStore()->Data(), out, size);
  info.GetReturnValue().Set(buffer);
}

// base64Encode(string) -> btoa's answer, or undefined when a unit is above 0xFF.
void onBase64Encode(const v8::FunctionCallbackInfo<v8::Value>& info) {
  v8::Isolate* isolate = info.GetIsolate();
  v8::HandleScope scope(isolate);
  if (info.Length() < 1 || !info[0]->IsString()) return;
  auto text = info[0].As<v8::String>();
  if (!copyable(isolate, text, "btoa")) return;
  const int length = text->Length();
  // base64 of n bytes is 4/3 n characters: refuse what could not be a string afterwards.
  if (static_cast<std::size_t>(length) / 3 * 4 + 4 >
      static_cast<std::size_t>(v8::String::kMaxLength)) {
    isolate->ThrowException(
        v8::Exception::RangeError(v8String(isolate, "btoa: the string is too long")));
    return;
  }
  if (!text->ContainsOnlyOneByte()) return;
  std::string bytes(static_cast<std::size_t>(length), '\0');
  text->WriteOneByte(isolate, reinterpret_cast<std::uint8_t*>(bytes.data()), 0, length,
                     v8::String::NO_NULL_TERMINATION);
  const std::string encoded = base64Encode(bytes);
  bytes = std::string();
  info.GetReturnValue().Set(v8String(isolate, encoded));
}

// base64Decode(string) -> atob's answer (the HTML standard's forgiving-base64 decode, as a string
// of code units 0-255), or undefined when it is not base64.
void onBase64Decode(const v8::FunctionCallbackInfo<v8::Value>& info) {
  v8::Isolate* isolate = info.GetIsolate();
  v8::HandleScope scope(isolate);
  if (info.Length() < 1 || !info[0]->IsString()) return;
  auto text = info[0].As<v8::String>();
  if (!copyable(isolate, text, "atob")) return;
  const int length = text->Length();
  // Base64 is ASCII: a string with any unit above 0xFF is not base64.
  if (!text->ContainsOnlyOneByte()) return;
  std::string data(static_cast<std::size_t>(length), '\0');
  text->WriteOneByte(isolate, reinterpret_cast<std::uint8_t*>(data.data()), 0, length,
                     v8::String::NO_NULL_TERMINATION);
  data.erase(std::remove_if(data.begin(), data.end(),
                            [](char c) {
                              return c == '\t' || c == '\n' || c == '\f' || c == '\r' || c == ' ';
                            }),
             data.end());
  if (data.size() % 4 == 0) {
    if (!data.empty() && data.back() == '=') data.pop_back();
    if (!data.empty() && data.back() == '=') data.pop_back();
  }
  if (data.size() % 4 == 1) return;
  std::string out;
  out.reserve(data.size() / 4 * 3 + 3);
  std::uint32_t buffer = 0;
  int bits = 0;
  for (char c : data) {
    const int value = base64Sextet(c);
    if (value < 0) return;
    buffer = (buffer << 6) | static_cast<std::uint32_t>(value);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buffer >> bits) & 0xFF));
    }
  }
  v8::Local<v8::String> result;
  if (!v8::String::NewFromOneByte(isolate, reinterpret_cast<const std::uint8_t*>(out.data()),
                                  v8::NewStringType::kNormal, static_cast<int>(out.size()))
           .ToLocal(&result)) {
    return;
  }
  info.GetReturnValue().Set(result);
}

// Where a context keeps the binding function of each lazy prelude, once made.
v8::Local<v8::Private> preludeKey(v8::Isolate* isolate, int which) {
  return v8::Private::ForApi(isolate, v8String(isolate, which == kWeb   ? "toolhost:web"
                                                        : which == kUrl ? "toolhost:url"
                                                                        : "toolhost:fetch"));
}

// Where a context keeps the built-ins captured when it was made (kIntrinsics).
v8::Local<v8::Private> intrinsicsKey(v8::Isolate* isolate) {
  return v8::Private::ForApi(isolate, v8String(isolate, "toolhost:intrinsics"));
}

// The values of kIntrinsics now, in order: what installWebGlobals keeps.
v8::MaybeLocal<v8::Array> captureIntrinsics(v8::Local<v8::Context> context) {
  v8::Isolate* isolate = context->GetIsolate();
  v8::EscapableHandleScope scope(isolate);
  std::vector<v8::Local<v8::Value>> values;
  values.reserve(std::size(kIntrinsics));
  for (const char* path : kIntrinsics) {
    v8::Local<v8::Value> value = context->Global();
    std::string_view rest(path);
    while (!rest.empty()) {
      const auto dot = rest.find('.');
      const std::string_view part = rest.substr(0, dot);
      rest = dot == std::string_view::npos ? std::string_view() : rest.substr(dot + 1);
      if (!value->IsObject() ||
          !value.As<v8::Object>()->Get(context, v8String(isolate, part)).ToLocal(&value)) {
        return {};
      }
    }
    values.push_back(value);
  }
  // %IteratorPrototype%, which no global path reaches: the prototype of an array iterator's.
  v8::Local<v8::Value> iterate, iterator;
  v8::Local<v8::Array> empty = v8::Array::New(isolate);
  if (!empty->Get(context, v8::Symbol::GetIterator(isolate)).ToLocal(&iterate) ||
      !iterate->IsFunction() ||
      !iterate.As<v8::Function>()->Call(context, empty, 0, nullptr).ToLocal(&iterator) ||
      !iterator->IsObject()) {
    return {};
  }
  v8::Local<v8::Value> arrayIteratorPrototype = iterator.As<v8::Object>()->GetPrototype();
  if (!arrayIteratorPrototype->IsObject()) return {};
  values.push_back(arrayIteratorPrototype.As<v8::Object>()->GetPrototype());
  return scope.Escape(v8::Array::New(isolate, values.data(), values.size()));
}

// The kept intrinsics as an object keyed by their paths, with no prototype: how a lazy prelude
// gets them.
v8::MaybeLocal<v8::Value> intrinsics(v8::Local<v8::Context> context) {
  v8::Isolate* isolate = context->GetIsolate();
  v8::EscapableHandleScope scope(isolate);
  v8::Local<v8::Value> kept;
  if (!context->Global()->GetPrivate(context, intrinsicsKey(isolate)).ToLocal(&kept) ||
      !kept->IsArray() || kept.As<v8::Array>()->Length() != std::size(kIntrinsics) + 1) {
    return {};
  }
  std::vector<v8::Local<v8::Name>> names;
  std::vector<v8::Local<v8::Value>> values;
  for (std::uint32_t i = 0; i <= std::size(kIntrinsics); ++i) {
    v8::Local<v8::Value> value;
    if (!kept.As<v8::Array>()->Get(context, i).ToLocal(&value)) return {};
    names.push_back(
        v8String(isolate, i < std::size(kIntrinsics) ? kIntrinsics[i] : "%IteratorPrototype%"));
    values.push_back(value);
  }
  return scope.Escape(
      v8::Object::New(isolate, v8::Null(isolate), names.data(), values.data(), names.size()));
}

v8::MaybeLocal<v8::Function> makeWebBinding(v8::Local<v8::Context> context,
                                            v8::Local<v8::Value> intrinsics) {
  v8::Isolate* isolate = context->GetIsolate();
  v8::Local<v8::Object> natives = v8::Object::New(isolate);
  if (!natives->CreateDataProperty(context, v8String(isolate, "intrinsics"), intrinsics)
           .FromMaybe(false)) {
    return {};
  }
  if (!setNatives(context, natives,
                  {{"encode", &onEncode},
                   {"encodeInto", &onEncodeInto},
                   {"decode", &onDecode},
                   {"randomFill", &onRandomFill},
                   {"digest", &onDigest},
                   {"base64Encode", &onBase64Encode},
                   {"base64Decode", &onBase64Decode}})) {
    return {};
  }
  return runPreludeFactory(context, "toolhost:web", kWebPrelude, natives);
}

// The binding function of lazy prelude `which` in `context`, run now if it has not run yet.
// Empty with an exception pending (termination, or V8 refusing memory).
v8::MaybeLocal<v8::Function> preludeBinding(v8::Local<v8::Context> context, int which) {
  v8::Isolate* isolate = context->GetIsolate();
  v8::EscapableHandleScope scope(isolate);
  v8::Local<v8::Object> global = context->Global();
  v8::Local<v8::Private> key = preludeKey(isolate, which);
  v8::Local<v8::Value> stored, captured;
  if (!global->GetPrivate(context, key).ToLocal(&stored)) return {};
  if (stored->IsFunction()) return scope.Escape(stored.As<v8::Function>());
  if (!intrinsics(context).ToLocal(&captured)) return {};
  const auto made = which == kWeb ? makeWebBinding(context, captured)
                    : which == kUrl
                        ? runPreludeFactory(context, "toolhost:url", kUrlPrelude, captured)
                        : installFetchPrelude(context, captured);
  v8::Local<v8::Function> binding;
  if (!made.ToLocal(&binding) || !global->SetPrivate(context, key, binding).FromMaybe(false)) {
    if (!isolate->IsExecutionTerminating()) {
      isolate->ThrowException(
          v8::Exception::Error(v8String(isolate, "the runtime could not load its web APIs")));
    }
    return {};
  }
  return scope.Escape(binding);
}

// The getter of every lazy global: runs its prelude once per context, then answers the name. V8
// replaces the property by the value returned.
void onLazyGlobal(v8::Local<v8::Name> property, const v8::PropertyCallbackInfo<v8::Value>& info) {
  v8::Isolate* isolate = info.GetIsolate();
  v8::HandleScope scope(isolate);
  v8::Local<v8::Context> context = isolate->GetCurrentContext();
  v8::Local<v8::Function> binding;
  if (!preludeBinding(context, info.Data().As<v8::Int32>()->Value()).ToLocal(&binding)) return;
  v8::Local<v8::Value> argv[] = {property};
  v8::Local<v8::Value> value;
  if (!binding->Call(context, v8::Undefined(isolate), 1, argv).ToLocal(&value)) return;
  info.GetReturnValue().Set(value);
}

}  // namespace

std::optional<std::u16string> decodeUtf8(std::string_view bytes, bool fatal, bool stream,
                                         std::size_t& tail) {
  std::u16string out;
  out.reserve(bytes.size());
  std::uint32_t codePoint = 0;
  int needed = 0, seen = 0;
  unsigned lower = 0x80, upper = 0xBF;
  tail = 0;
  auto emit = [&out](std::uint32_t c) {
    if (c > 0xFFFF) {
      c -= 0x10000;
      out.push_back(static_cast<char16_t>(0xD800 + (c >> 10)));
      out.push_back(static_cast<char16_t>(0xDC00 + (c & 0x3FF)));
    } else {
      out.push_back(static_cast<char16_t>(c));
    }
  };
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const unsigned byte = static_cast<unsigned char>(bytes[i]);
    if (needed == 0) {
      if (byte <= 0x7F) {
        out.push_back(static_cast<char16_t>(byte));
      } else if (byte >= 0xC2 && byte <= 0xDF) {
        needed = 1;
        codePoint = byte & 0x1F;
      } else if (byte >= 0xE0 && byte <= 0xEF) {
        if (byte == 0xE0) lower = 0xA0;
        if (byte == 0xED) upper = 0x9F;
        needed = 2;
        codePoint = byte & 0xF;
      } else if (byte >= 0xF0 && byte <= 0xF4) {
        if (byte == 0xF0) lower = 0x90;
        if (byte == 0xF4) upper = 0x8F;
        needed = 3;
        codePoint = byte & 0x7;
      } else {
        if (fatal) return std::nullopt;
        out.push_back(u'\uFFFD');
      }
      continue;
    }
    if (byte < lower || byte > upper) {
      // The sequence ends before this byte, which starts over.
      codePoint = 0;
      needed = seen = 0;
      lower = 0x80;
      upper = 0xBF;
      if (fatal) return std::nullopt;
      out.push_back(u'\uFFFD');
      --i;
      continue;
    }
    lower = 0x80;
    upper = 0xBF;
    codePoint = (codePoint << 6) | (byte & 0x3F);
    if (++seen == needed) {
      emit(codePoint);
      codePoint = 0;
      needed = seen = 0;
    }
  }
  if (needed != 0) {
    if (stream) {
      tail = static_cast<std::size_t>(seen) + 1;
    } else {
      if (fatal) return std::nullopt;
      out.push_back(u'\uFFFD');
    }
  }
  return out;
}

v8::MaybeLocal<v8::Value> loadedWebGlobal(v8::Local<v8::Context> context, const char* name) {
  v8::Isolate* isolate = context->GetIsolate();
  v8::EscapableHandleScope scope(isolate);
  v8::Local<v8::Value> binding, value;
  v8::Local<v8::Value> argv[] = {v8String(isolate, name)};
  if (!context->Global()
           ->GetPrivate(context, preludeKey(isolate, preludeOf(name)))
           .ToLocal(&binding) ||
      !binding->IsFunction() ||
      !binding.As<v8::Function>()->Call(context, v8::Undefined(isolate), 1, argv).ToLocal(&value)) {
    return {};
  }
  return scope.Escape(value);
}

bool installWebGlobals(v8::Local<v8::Context> context) {
  v8::Isolate* isolate = context->GetIsolate();
  v8::Local<v8::Object> global = context->Global();
  v8::Local<v8::Array> captured;
  if (!captureIntrinsics(context).ToLocal(&captured) ||
      !global->SetPrivate(context, intrinsicsKey(isolate), captured).FromMaybe(false)) {
    return false;
  }
  auto define = [&](const char* name, int which) {
    return global
        ->SetLazyDataProperty(context, v8String(isolate, name), &onLazyGlobal,
                              v8::Int32::New(isolate, which), v8::DontEnum)
        .FromMaybe(false);
  };
  for (const char* name : kWebNames) {
    if (!define(name, kWeb)) return false;
  }
  for (const char* name : kUrlNames) {
    if (!define(name, kUrl)) return false;
  }
  for (const char* name : kFetchNames) {
    if (!define(name, kFetch)) return false;
  }
  return true;
}

v8::MaybeLocal<v8::Function> responseMaker(v8::Local<v8::Context> context) {
  v8::Isolate* isolate = context->GetIsolate();
  v8::EscapableHandleScope scope(isolate);
  v8::Local<v8::Function> binding;
  v8::Local<v8::Value> argv[] = {v8String(isolate, "make")};
  v8::Local<v8::Value> make;
  if (!preludeBinding(context, kFetch).ToLocal(&binding) ||
      !binding->Call(context, v8::Undefined(isolate), 1, argv).ToLocal(&make) ||
      !make->IsFunction()) {
    return {};
  }
  return scope.Escape(make.As<v8::Function>());
}

}  // namespace toolhost::runtime
