#include "runtime/fetch_api.h"

#include "runtime/base64.h"
#include "runtime/json_bridge.h"
#include "runtime/sandbox.h"
#include "runtime/web_globals.h"

#include <boost/json/array.hpp>
#include <boost/json/string.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace toolhost::runtime {
namespace json = boost::json;

namespace {

// What a tool can put in one request before the runtime refuses it (the host has its own, usually
// smaller, limits): a bound on memory outside the sandbox's heap, and on a runaway iterator.
constexpr std::size_t kMaxRequestHeaders = 1024;
constexpr std::size_t kMaxRequestHeaderBytes = 1024 * 1024;
// The longest URL and method a request is built with (a method is a short token; browsers stop
// near 2 MB for URLs, servers far earlier).
constexpr std::size_t kMaxUrlBytes = 1024 * 1024;
constexpr std::size_t kMaxMethodBytes = 256;

// The prelude: Response and Headers. It runs the first time a sandbox needs one of them (a fetch
// answered, or a tool reading the global Headers or Response: runtime/web_globals.h), by which
// time the tool may have replaced any built-in, so it takes the built-ins it uses from the ones
// captured when the context was made (natives.intrinsics) and from then on looks up nothing a
// tool can replace: no global names, no methods of built-in prototypes, no iteration of arrays
// (internal lists have no prototype and are read by index), no property descriptors that
// inherit from Object.prototype. State lives in private fields, so a tool can neither read nor
// forge it; the classes and their prototypes are frozen, and a Response made from a host's
// answer needs the prelude's private token.
constexpr const char* kPrelude = R"JS((function (natives) {
  'use strict';
  const I = natives.intrinsics;
  const utf8Decode = natives.utf8Decode;
  const toBytes = natives.toBytes;
  const isArrayBuffer = natives.isArrayBuffer;
  const formBody = natives.formBody;
  const isView = I['ArrayBuffer.isView'];
  const ArrayBufferCtor = I['ArrayBuffer'];
  const NumberCtor = I['Number'];
  const MathTrunc = I['Math.trunc'];
  const RangeErrorCtor = I['RangeError'];
  const JSONStringify = I['JSON.stringify'];
  const ObjectFreeze = I['Object.freeze'];
  const ObjectDefineProperty = I['Object.defineProperty'];
  const ObjectSetPrototypeOf = I['Object.setPrototypeOf'];
  const ReflectApply = I['Reflect.apply'];
  const ReflectOwnKeys = I['Reflect.ownKeys'];
  const ReflectGetOwnPropertyDescriptor = I['Reflect.getOwnPropertyDescriptor'];
  const JSONParse = I['JSON.parse'];
  const TypeErrorCtor = I['TypeError'];
  const StringCtor = I['String'];
  const SymbolIterator = I['Symbol.iterator'];
  const SymbolToStringTag = I['Symbol.toStringTag'];
  const uncurry = (f) => ReflectApply(I['Function.prototype.bind'], I['Function.prototype.call'],
                                      [f]);
  const toLowerCase = uncurry(I['String.prototype.toLowerCase']);
  const charCodeAt = uncurry(I['String.prototype.charCodeAt']);
  const stringSlice = uncurry(I['String.prototype.slice']);
  const IteratorPrototype = I['%IteratorPrototype%'];
  const kHost = {__proto__: null};  // marks the host's own constructor calls; never handed out

  function headerName(name, method) {
    if (typeof name === 'symbol') {
      throw new TypeErrorCtor('Headers.' + method + ': a header name must be a string');
    }
    return toLowerCase(StringCtor(name));
  }
  function define(object, key, value, enumerable) {
    ObjectDefineProperty(object, key, {
      __proto__: null, value, writable: !!enumerable, enumerable: !!enumerable, configurable: true,
    });
  }
  const immutableMessage = 'the headers of a Response are immutable';

  class HeadersIterator {
    #list;
    #kind;
    #index = 0;
    constructor(token, list, kind) {
      if (token !== kHost) throw new TypeErrorCtor('Illegal constructor');
      this.#list = list;
      this.#kind = kind;
    }
    next() {
      const list = this.#list;
      if (this.#index >= list.length) return {value: undefined, done: true};
      const entry = list[this.#index];
      this.#index += 1;
      const kind = this.#kind;
      return {value: kind === 0 ? [entry[0], entry[1]] : kind === 1 ? entry[0] : entry[1],
              done: false};
    }
    [SymbolIterator]() { return this; }
  }
  ObjectSetPrototypeOf(HeadersIterator.prototype, IteratorPrototype);
  define(HeadersIterator.prototype, SymbolToStringTag, 'Headers Iterator');

  // A header name is an HTTP token; a value is a byte string (units up to 0xFF) with no NUL, CR or
  // LF, its leading and trailing tabs and spaces removed.
  function isTokenUnit(c) {
    return (c >= 0x61 && c <= 0x7a) || (c >= 0x41 && c <= 0x5a) || (c >= 0x30 && c <= 0x39) ||
        c === 0x21 || (c >= 0x23 && c <= 0x27) || c === 0x2a || c === 0x2b || c === 0x2d ||
        c === 0x2e || c === 0x5e || c === 0x5f || c === 0x60 || c === 0x7c || c === 0x7e;
  }
  function checkedName(name, method) {
    const key = headerName(name, method);
    if (key.length === 0) throw new TypeErrorCtor('Headers.' + method + ': a header name is empty');
    for (let i = 0; i < key.length; i++) {
      if (!isTokenUnit(charCodeAt(key, i))) {
        throw new TypeErrorCtor('Headers.' + method + ': "' + key + '" is not a valid header name');
      }
    }
    return key;
  }
  function checkedValue(value, method) {
    if (typeof value === 'symbol') {
      throw new TypeErrorCtor('Headers.' + method + ': a header value must be a string');
    }
    const text = StringCtor(value);
    let start = 0;
    let end = text.length;
    const blank = (c) => c === 0x09 || c === 0x0a || c === 0x0d || c === 0x20;
    while (start < end && blank(charCodeAt(text, start))) start++;
    while (end > start && blank(charCodeAt(text, end - 1))) end--;
    for (let i = start; i < end; i++) {
      const c = charCodeAt(text, i);
      if (c === 0 || c === 0x0a || c === 0x0d || c > 0xff) {
        throw new TypeErrorCtor('Headers.' + method + ': the value of a header has a character ' +
                                'a header cannot carry');
      }
    }
    return stringSlice(text, start, end);
  }
  // Internal lists have no prototype: writing an index cannot reach a setter a tool put on
  // Array.prototype or Object.prototype.
  function newList() { return ObjectSetPrototypeOf([], null); }
  function appendTo(list, name, value, method) {
    const key = checkedName(name, method);
    const text = checkedValue(value, method);
    list[list.length] = [key, text];
  }
  // A Headers' entries as iteration shows them: sorted by name, values of one name combined
  // with ", " (set-cookie's kept apart).
  function sortedAndCombined(list) {
    const sorted = newList();
    for (let i = 0; i < list.length; i++) {
      const entry = list[i];
      let at = sorted.length;
      // Insertion keeps equal names in their order; lists are short.
      while (at > 0 && sorted[at - 1][0] > entry[0]) at--;
      for (let j = sorted.length; j > at; j--) sorted[j] = sorted[j - 1];
      sorted[at] = [entry[0], entry[1]];
    }
    const out = newList();
    for (let i = 0; i < sorted.length; i++) {
      const last = out.length > 0 ? out[out.length - 1] : null;
      if (last !== null && last[0] === sorted[i][0] && sorted[i][0] !== 'set-cookie') {
        last[1] = last[1] + ', ' + sorted[i][1];
      } else {
        out[out.length] = sorted[i];
      }
    }
    return out;
  }

  let copyHeaders;  // (headers) => an equal Headers of its own, as mutable as the original
  class Headers {
    #list;  // [[lower-case name, value], ...]; never handed out
    #immutable;  // a Response's: sorted and combined by the host
    static {
      copyHeaders = (headers) => {
        const list = headers.#list;
        const copy = newList();
        for (let i = 0; i < list.length; i++) copy[i] = [list[i][0], list[i][1]];
        const made = new Headers(kHost, copy);
        made.#immutable = headers.#immutable;
        return made;
      };
    }
    constructor(init = undefined, list = undefined) {
      if (init === kHost) {
        this.#list = list;
        this.#immutable = true;
        return;
      }
      const own = newList();
      this.#list = own;
      this.#immutable = false;
      if (init === undefined || init === null) {
        if (init === null) throw new TypeErrorCtor('Headers: init must be an object');
        return;
      }
      if (typeof init !== 'object' && typeof init !== 'function') {
        throw new TypeErrorCtor('Headers: init must be an object, or a list of [name, value] pairs');
      }
      const iterate = init[SymbolIterator];
      if (iterate !== undefined && iterate !== null) {
        if (typeof iterate !== 'function') {
          throw new TypeErrorCtor('Headers: init[Symbol.iterator] is not a function');
        }
        const pairs = newList();
        for (const pair of init) {
          if (pair === null || (typeof pair !== 'object' && typeof pair !== 'function')) {
            throw new TypeErrorCtor('Headers: each header in a list must be a [name, value] pair');
          }
          const items = newList();
          for (const item of pair) items[items.length] = item;
          if (items.length !== 2) {
            throw new TypeErrorCtor('Headers: each header in a list must be a [name, value] pair');
          }
          pairs[pairs.length] = items;
        }
        for (let i = 0; i < pairs.length; i++) appendTo(own, pairs[i][0], pairs[i][1], 'append');
        return;
      }
      const keys = ReflectOwnKeys(init);
      for (let i = 0; i < keys.length; i++) {
        const key = keys[i];
        if (typeof key === 'symbol') continue;
        const descriptor = ReflectGetOwnPropertyDescriptor(init, key);
        if (descriptor === undefined || !descriptor.enumerable) continue;
        appendTo(own, key, init[key], 'append');
      }
    }
    #mutable(method) {
      if (this.#immutable) throw new TypeErrorCtor('Headers.' + method + ': ' + immutableMessage);
    }
    get(name) {
      const key = checkedName(name, 'get');
      const list = this.#list;
      let out = null;
      for (let i = 0; i < list.length; i++) {
        if (list[i][0] === key) out = out === null ? list[i][1] : out + ', ' + list[i][1];
      }
      return out;
    }
    has(name) {
      const key = checkedName(name, 'has');
      const list = this.#list;
      for (let i = 0; i < list.length; i++) {
        if (list[i][0] === key) return true;
      }
      return false;
    }
    getSetCookie() {
      const list = this.#list;
      const out = [];
      for (let i = 0; i < list.length; i++) {
        if (list[i][0] === 'set-cookie') define(out, out.length, list[i][1], true);
      }
      return out;
    }
    append(name, value) {
      this.#mutable('append');
      appendTo(this.#list, name, value, 'append');
    }
    set(name, value) {
      this.#mutable('set');
      const key = checkedName(name, 'set');
      const text = checkedValue(value, 'set');
      const list = this.#list;
      const kept = newList();
      let placed = false;
      for (let i = 0; i < list.length; i++) {
        if (list[i][0] !== key) {
          kept[kept.length] = list[i];
        } else if (!placed) {
          kept[kept.length] = [key, text];
          placed = true;
        }
      }
      if (!placed) kept[kept.length] = [key, text];
      this.#list = kept;
    }
    delete(name) {
      this.#mutable('delete');
      const key = checkedName(name, 'delete');
      const list = this.#list;
      const kept = newList();
      for (let i = 0; i < list.length; i++) {
        if (list[i][0] !== key) kept[kept.length] = list[i];
      }
      this.#list = kept;
    }
    #view() { return this.#immutable ? this.#list : sortedAndCombined(this.#list); }
    forEach(callback, thisArg) {
      if (typeof callback !== 'function') {
        throw new TypeErrorCtor('Headers.forEach: the callback must be a function');
      }
      const list = this.#view();
      for (let i = 0; i < list.length; i++) {
        ReflectApply(callback, thisArg, [list[i][1], list[i][0], this]);
      }
    }
    entries() { return new HeadersIterator(kHost, this.#view(), 0); }
    keys() { return new HeadersIterator(kHost, this.#view(), 1); }
    values() { return new HeadersIterator(kHost, this.#view(), 2); }
  }
  define(Headers.prototype, SymbolIterator, Headers.prototype.entries, false);
  define(Headers.prototype, SymbolToStringTag, 'Headers', false);

  let jsonBody = false;  // set by Response.json for the constructor it calls
  class Response {
    #status;
    #statusText;
    #url;
    #headers;
    #body;  // an ArrayBuffer until a body method takes it; null for none
    #bodyUsed = false;
    #type = 'basic';
    #redirected = false;
    constructor(body = null, init = undefined) {
      if (body === kHost) {
        // From the host: (kHost, status, statusText, url, headers, body).
        const made = arguments;
        this.#status = made[1];
        this.#statusText = made[2];
        this.#url = made[3];
        this.#headers = new Headers(kHost, made[4]);
        this.#body = made[5];
        this.#redirected = made[6];
        return;
      }
      // Response.json's body: JSON unless the caller gave a Content-Type.
      const isJson = jsonBody;
      jsonBody = false;
      if (init !== undefined && init !== null && typeof init !== 'object' &&
          typeof init !== 'function') {
        throw new TypeErrorCtor('Response: init must be an object');
      }
      const givenStatus = init == null ? undefined : init.status;
      const givenText = init == null ? undefined : init.statusText;
      const givenHeaders = init == null ? undefined : init.headers;
      // An unsigned short, as WebIDL converts it: 200.5 is 200.
      let status = 200;
      if (givenStatus !== undefined) {
        const number = NumberCtor(givenStatus);
        status = number !== number || number === 1 / 0 || number === -1 / 0
            ? 0 : MathTrunc(number) % 65536;
        if (status < 0) status += 65536;
      }
      if (status < 200 || status > 599) {
        throw new RangeErrorCtor('Response: status must be from 200 to 599');
      }
      const statusText = givenText === undefined ? '' : StringCtor(givenText);
      for (let i = 0; i < statusText.length; i++) {
        const c = charCodeAt(statusText, i);
        if (!(c === 0x09 || (c >= 0x20 && c <= 0x7e) || (c >= 0x80 && c <= 0xff))) {
          throw new TypeErrorCtor('Response: statusText has a character a status line cannot carry');
        }
      }
      this.#status = status;
      this.#statusText = statusText;
      this.#url = '';
      this.#type = 'default';
      this.#headers = new Headers(givenHeaders);
      if (body === null || body === undefined) {
        this.#body = null;
        return;
      }
      if (status === 204 || status === 205 || status === 304) {
        throw new TypeErrorCtor('Response: a ' + status + ' response cannot have a body');
      }
      const form = formBody(body);
      const isText = form === undefined &&
          (typeof body !== 'object' || !(isArrayBuffer(body) || isView(body)));
      // Bytes are copied: a later change to the caller's buffer does not reach the body.
      this.#body = toBytes(form !== undefined ? form : isText ? StringCtor(body) : body);
      const type = isJson ? 'application/json'
          : form !== undefined ? 'application/x-www-form-urlencoded;charset=UTF-8'
          : isText ? 'text/plain;charset=UTF-8' : null;
      if (type !== null && !this.#headers.has('content-type')) {
        this.#headers.set('content-type', type);
      }
    }
    static error() {
      const made = new Response(kHost, 0, '', '', newList(), null, false);
      made.#type = 'error';
      return made;
    }
    clone() {
      if (this.#bodyUsed) throw new TypeErrorCtor('Response.clone: body already used');
      const made = new Response(kHost, this.#status, this.#statusText, this.#url, newList(),
                                this.#body === null ? null : toBytes(this.#body),
                                this.#redirected);
      made.#headers = copyHeaders(this.#headers);
      made.#type = this.#type;
      return made;
    }
    static json(data, init = undefined) {
      const text = JSONStringify(data);
      if (text === undefined) throw new TypeErrorCtor('Response.json: the data is not JSON');
      jsonBody = true;
      return new Response(text, init);
    }
    get type() { return this.#type; }
    get url() { return this.#url; }
    get redirected() { return this.#redirected; }
    get status() { return this.#status; }
    get ok() { return this.#status >= 200 && this.#status <= 299; }
    get statusText() { return this.#statusText; }
    get headers() { return this.#headers; }
    get bodyUsed() { return this.#bodyUsed; }
    #take() {
      // A null body reads as empty, as often as asked.
      if (this.#body === null && !this.#bodyUsed) return new ArrayBufferCtor(0);
      if (this.#bodyUsed) throw new TypeErrorCtor('body already used');
      this.#bodyUsed = true;
      const body = this.#body;
      this.#body = null;
      return body === null ? new ArrayBufferCtor(0) : body;
    }
    async arrayBuffer() { return this.#take(); }
    async text() { return utf8Decode(this.#take()); }
    async json() { return JSONParse(utf8Decode(this.#take())); }
  }
  define(Response.prototype, SymbolToStringTag, 'Response', false);

  const frozen = [HeadersIterator, Headers, Response];
  for (let i = 0; i < 3; i++) {
    ObjectFreeze(frozen[i].prototype);
    ObjectFreeze(frozen[i]);
  }
  const make = (status, statusText, url, headers, body, redirected) =>
      new Response(kHost, status, statusText, url, headers, body, redirected);
  // "make" for the runtime; the classes for the global object.
  const bindings = {__proto__: null, make, Headers, Response};
  return (name) => bindings[name];
}))JS";

v8::MaybeLocal<v8::String> tryString(v8::Isolate* isolate, std::string_view text) {
  if (text.size() > static_cast<std::size_t>(v8::String::kMaxLength)) return {};
  return v8::String::NewFromUtf8(isolate, text.data(), v8::NewStringType::kNormal,
                                 static_cast<int>(text.size()));
}

// The body bytes as text: UTF-8 with every invalid sequence replaced by U+FFFD and a leading BOM
// dropped, as TextDecoder and Response.text() do. Native, for the prelude only.
void onUtf8Decode(const v8::FunctionCallbackInfo<v8::Value>& info) {
  v8::Isolate* isolate = info.GetIsolate();
  v8::HandleScope scope(isolate);
  v8::Local<v8::Context> context = isolate->GetCurrentContext();
  if (info.Length() < 1 || !info[0]->IsArrayBuffer()) {
    throwInvalidArgument(context, "the body is not an ArrayBuffer");
    return;
  }
  std::shared_ptr<v8::BackingStore> store = info[0].As<v8::ArrayBuffer>()->GetBackingStore();
  const char* data = static_cast<const char*>(store->Data());
  std::size_t length = store->ByteLength();
  if (length >= 3 && static_cast<unsigned char>(data[0]) == 0xEF &&
      static_cast<unsigned char>(data[1]) == 0xBB && static_cast<unsigned char>(data[2]) == 0xBF) {
    data += 3;
    length -= 3;
  }
  if (length == 0) {
    info.GetReturnValue().Set(v8::String::Empty(isolate));
    return;
  }
  v8::Local<v8::String> text;
  if (!tryString(isolate, std::string_view(data, length)).ToLocal(&text)) {
    if (isolate->IsExecutionTerminating()) return;
    isolate->ThrowException(v8::Exception::RangeError(v8String(
        isolate, "the body (" + std::to_string(length) + " bytes) is too large for a string")));
    return;
  }
  info.GetReturnValue().Set(text);
}

// A new Response's body: a string's UTF-8 (lone surrogates as U+FFFD), or a copy of an
// ArrayBuffer's or a view's bytes, in an ArrayBuffer counted against the call's limit. Native, for
// the prelude.
void onToBytes(const v8::FunctionCallbackInfo<v8::Value>& info) {
  v8::Isolate* isolate = info.GetIsolate();
  v8::HandleScope scope(isolate);
  if (info.Length() < 1) return;
  Sandbox& sandbox = Sandbox::from(isolate);
  v8::Local<v8::ArrayBuffer> out;
  if (info[0]->IsString()) {
    auto text = info[0].As<v8::String>();
    // At least a byte per character: past the limit, refused before a rope is flattened.
    if (static_cast<std::size_t>(text->Length()) > sandbox.arrayBufferLimit()) {
      (void)sandbox.newArrayBuffer(static_cast<std::size_t>(text->Length()));
      return;
    }
    const int length = text->Utf8Length(isolate);
    if (!sandbox.newArrayBuffer(static_cast<std::size_t>(length)).ToLocal(&out)) return;
    if (length > 0) {
      text->WriteUtf8(isolate, static_cast<char*>(out->GetBackingStore()->Data()), length, nullptr,
                      v8::String::NO_NULL_TERMINATION | v8::String::REPLACE_INVALID_UTF8);
    }
  } else if (info[0]->IsArrayBuffer() || info[0]->IsArrayBufferView()) {
    const char* data = nullptr;
    std::size_t length = 0;
    if (info[0]->IsArrayBuffer()) {
      auto store = info[0].As<v8::ArrayBuffer>()->GetBackingStore();
      data = static_cast<const char*>(store->Data());
      length = store->ByteLength();
    } else {
      auto view = info[0].As<v8::ArrayBufferView>();
      length = view->ByteLength();
      if (length > 0) {
        data = static_cast<const char*>(view->Buffer()->GetBackingStore()->Data()) +
               view->ByteOffset();
      }
    }
    if (!sandbox.newArrayBuffer(length).ToLocal(&out)) return;
    if (length > 0) std::memcpy(out->GetBackingStore()->Data(), data, length);
  } else {
    return;
  }
  info.GetReturnValue().Set(out);
}

// The text of `value` when it is a URLSearchParams of this context (its prelude loaded), else
// empty with `ok` true; `ok` false with an exception pending.
v8::MaybeLocal<v8::String> searchParamsText(v8::Local<v8::Context> context,
                                            v8::Local<v8::Value> value, bool& ok) {
  ok = true;
  v8::Local<v8::Value> searchParams;
  v8::Local<v8::String> text;
  bool isParams = false;
  if (!value->IsObject() || value->IsArrayBuffer() || value->IsArrayBufferView() ||
      !loadedWebGlobal(context, "URLSearchParams").ToLocal(&searchParams) ||
      !searchParams->IsFunction()) {
    return {};
  }
  if (!value->InstanceOf(context, searchParams.As<v8::Object>()).To(&isParams)) {
    ok = false;
    return {};
  }
  if (!isParams) return {};
  if (!value->ToString(context).ToLocal(&text)) {
    ok = false;
    return {};
  }
  return text;
}

// formBody(value) -> the text of a URLSearchParams, or undefined. Native, for the prelude.
void onFormBody(const v8::FunctionCallbackInfo<v8::Value>& info) {
  if (info.Length() < 1) return;
  bool ok = true;
  v8::Local<v8::String> text;
  if (searchParamsText(info.GetIsolate()->GetCurrentContext(), info[0], ok).ToLocal(&text)) {
    info.GetReturnValue().Set(text);
  }
}

void onIsArrayBuffer(const v8::FunctionCallbackInfo<v8::Value>& info) {
  info.GetReturnValue().Set(info.Length() >= 1 && info[0]->IsArrayBuffer());
}

bool equalsIgnoringCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; };
           return lower(x) == lower(y);
         });
}

std::string asciiLower(std::string text) {
  for (char& c : text) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return text;
}

// The request headers as the host gets them, bounded.
class HeaderList {
 public:
  explicit HeaderList(v8::Local<v8::Context> context)
      : context_(context), isolate_(context->GetIsolate()) {}

  // Converts and appends one header. False with an exception pending.
  bool add(v8::Local<v8::Value> name, v8::Local<v8::Value> value) {
    std::string nameText, valueText;
    if (!text(name, nameText) || !text(value, valueText)) return false;
    bytes_ += nameText.size() + valueText.size();
    if (out_.size() >= kMaxRequestHeaders || bytes_ > kMaxRequestHeaderBytes) return tooLarge();
    out_.push_back(json::array{json::string(nameText), json::string(valueText)});
    return true;
  }

  // One [name, value] pair of an array or an iterator.
  bool addPair(v8::Local<v8::Value> pair) {
    if (!pair->IsArray() || pair.As<v8::Array>()->Length() != 2) {
      throwInvalidArgument(context_, "fetch: each header in a list must be a [name, value] pair");
      return false;
    }
    v8::Local<v8::Value> name, value;
    return pair.As<v8::Array>()->Get(context_, 0).ToLocal(&name) &&
           pair.As<v8::Array>()->Get(context_, 1).ToLocal(&value) && add(name, value);
  }

  // Whether a header of that name (lower-case) was given, in any case.
  bool has(std::string_view lowerName) const {
    for (const auto& pair : out_) {
      if (equalsIgnoringCase(pair.as_array()[0].as_string(), lowerName)) return true;
    }
    return false;
  }
  void addText(std::string_view name, std::string_view value) {
    out_.push_back(json::array{json::string(name), json::string(value)});
  }

  json::array take() { return std::move(out_); }

 private:
  bool text(v8::Local<v8::Value> value, std::string& out) {
    if (value->IsSymbol()) {
      throwInvalidArgument(context_, "fetch: a header name or value cannot be a Symbol");
      return false;
    }
    v8::Local<v8::String> string;
    if (!value->ToString(context_).ToLocal(&string)) return false;
    auto converted = toUtf8Within(isolate_, string, kMaxRequestHeaderBytes - bytes_);
    if (!converted) return tooLarge();
    out = std::move(*converted);
    return true;
  }

  bool tooLarge() {
    throwTooLarge(context_, "fetch: the request headers pass the runtime's limit of " +
                                std::to_string(kMaxRequestHeaders) + " headers or " +
                                std::to_string(kMaxRequestHeaderBytes) + " bytes");
    return false;
  }

  v8::Local<v8::Context> context_;
  v8::Isolate* isolate_;
  json::array out_;
  std::size_t bytes_ = 0;
};

bool readHeaders(v8::Local<v8::Context> context, v8::Local<v8::Value> headers, HeaderList& out) {
  v8::Isolate* isolate = context->GetIsolate();
  if (headers->IsNullOrUndefined()) return true;
  if (!headers->IsObject()) {
    throwInvalidArgument(
        context,
        "fetch: init.headers must be an object, an array of [name, value] pairs, or "
        "something with entries()");
    return false;
  }
  auto object = headers.As<v8::Object>();
  if (headers->IsArray()) {
    auto array = headers.As<v8::Array>();
    for (std::uint32_t i = 0; i < array->Length(); ++i) {
      v8::HandleScope scope(isolate);
      v8::Local<v8::Value> pair;
      if (!array->Get(context, i).ToLocal(&pair) || !out.addPair(pair)) return false;
    }
    return true;
  }
  v8::Local<v8::Value> entries;
  if (!object->Get(context, v8String(isolate, "entries")).ToLocal(&entries)) return false;
  if (entries->IsFunction()) {
    v8::Local<v8::Value> iterator, next;
    if (!entries.As<v8::Function>()->Call(context, object, 0, nullptr).ToLocal(&iterator)) {
      return false;
    }
    if (!iterator->IsObject()) {
      throwInvalidArgument(context, "fetch: init.headers.entries() did not return an iterator");
      return false;
    }
    if (!iterator.As<v8::Object>()->Get(context, v8String(isolate, "next")).ToLocal(&next)) {
      return false;
    }
    if (!next->IsFunction()) {
      throwInvalidArgument(context, "fetch: init.headers.entries() did not return an iterator");
      return false;
    }
    for (;;) {
      v8::HandleScope scope(isolate);
      v8::Local<v8::Value> step, done, pair;
      if (!next.As<v8::Function>()->Call(context, iterator, 0, nullptr).ToLocal(&step)) {
        return false;
      }
      if (!step->IsObject()) {
        throwInvalidArgument(context, "fetch: an iterator of init.headers returned a non-object");
        return false;
      }
      if (!step.As<v8::Object>()->Get(context, v8String(isolate, "done")).ToLocal(&done)) {
        return false;
      }
      if (done->BooleanValue(isolate)) return true;
      if (!step.As<v8::Object>()->Get(context, v8String(isolate, "value")).ToLocal(&pair) ||
          !out.addPair(pair)) {
        return false;
      }
    }
  }
  v8::Local<v8::Array> keys;
  if (!object
           ->GetOwnPropertyNames(
               context, static_cast<v8::PropertyFilter>(v8::ONLY_ENUMERABLE | v8::SKIP_SYMBOLS),
               v8::KeyConversionMode::kConvertToString)
           .ToLocal(&keys)) {
    return false;
  }
  for (std::uint32_t i = 0; i < keys->Length(); ++i) {
    v8::HandleScope scope(isolate);
    v8::Local<v8::Value> key, value;
    if (!keys->Get(context, i).ToLocal(&key) || !object->Get(context, key).ToLocal(&value) ||
        !out.add(key, value)) {
      return false;
    }
  }
  return true;
}

// The body's bytes: nullopt without a body; false in `ok` with an exception pending.
std::optional<std::string> readBody(v8::Local<v8::Context> context, v8::Local<v8::Value> body,
                                    bool& ok, const char*& contentType) {
  ok = true;
  contentType = nullptr;
  if (body->IsNullOrUndefined()) return std::nullopt;
  // URLSearchParams goes as its text, form-encoded, as browsers send it.
  v8::Local<v8::String> form;
  if (searchParamsText(context, body, ok).ToLocal(&form)) {
    body = form;
    contentType = "application/x-www-form-urlencoded;charset=UTF-8";
  } else if (!ok) {
    return std::nullopt;
  }
  // Measured before it is copied: a larger body could never be sent (kMaxOutstandingRequestBytes).
  auto tooLarge = [&] {
    ok = false;
    throwTooLarge(context, "fetch: init.body holds more than " +
                               std::to_string(kMaxOutstandingRequestBytes >> 20) +
                               " MiB, the most one call's requests may hold");
    return std::nullopt;
  };
  if (body->IsString()) {
    auto text =
        toUtf8Within(context->GetIsolate(), body.As<v8::String>(), kMaxOutstandingRequestBytes);
    if (!text) return tooLarge();
    if (contentType == nullptr) contentType = "text/plain;charset=UTF-8";
    return text;
  }
  std::string bytes;
  if (body->IsArrayBuffer()) {
    std::shared_ptr<v8::BackingStore> store = body.As<v8::ArrayBuffer>()->GetBackingStore();
    if (store->ByteLength() > kMaxOutstandingRequestBytes) return tooLarge();
    if (store->ByteLength() > 0) {
      bytes.assign(static_cast<const char*>(store->Data()), store->ByteLength());
    }
    return bytes;
  }
  if (body->IsArrayBufferView()) {
    auto view = body.As<v8::ArrayBufferView>();
    if (view->ByteLength() > kMaxOutstandingRequestBytes) return tooLarge();
    bytes.resize(view->ByteLength());
    if (!bytes.empty()) bytes.resize(view->CopyContents(bytes.data(), bytes.size()));
    return bytes;
  }
  ok = false;
  throwInvalidArgument(
      context,
      "fetch: init.body must be a string, an ArrayBuffer, a TypedArray or DataView, a "
      "URLSearchParams, or null");
  return std::nullopt;
}

}  // namespace

v8::Local<v8::Value> makeHostError(v8::Local<v8::Context> context, std::string_view message,
                                   std::string_view code, bool typeError) {
  v8::Isolate* isolate = context->GetIsolate();
  v8::Local<v8::String> text;
  if (!tryString(isolate, message).ToLocal(&text)) text = v8String(isolate, "(message too long)");
  auto error = typeError ? v8::Exception::TypeError(text) : v8::Exception::Error(text);
  if (error->IsObject()) {
    v8::Local<v8::String> codeText;
    if (tryString(isolate, code).ToLocal(&codeText)) {
      error.As<v8::Object>()
          ->CreateDataProperty(context, v8String(isolate, "code"), codeText)
          .FromMaybe(false);
    }
  }
  return error;
}

void throwInvalidArgument(v8::Local<v8::Context> context, std::string_view message) {
  context->GetIsolate()->ThrowException(
      makeHostError(context, message, "invalid-argument", /*typeError=*/true));
}

void throwTooLarge(v8::Local<v8::Context> context, std::string_view message) {
  context->GetIsolate()->ThrowException(makeHostError(context, message, "request-too-large"));
}

namespace {

// The bytecode of each prelude, from its first compile in this process, so that every later
// sandbox deserializes it instead of parsing the source again (a sixth of building a sandbox).
// Only ever made from, and given to, the preludes' own source: tool code is always compiled.
// V8 checks that a cache matches the source and its own version and flags, and compiles from
// source when it does not.
class PreludeCodeCache {
 public:
  std::shared_ptr<const std::vector<std::uint8_t>> find(const char* source) {
    std::lock_guard lock(mutex_);
    auto found = caches_.find(source);
    return found == caches_.end() ? nullptr : found->second;
  }
  void keep(const char* source, const v8::ScriptCompiler::CachedData& data) {
    auto bytes = std::make_shared<const std::vector<std::uint8_t>>(data.data, data.data + data.length);
    std::lock_guard lock(mutex_);
    if (caches_.emplace(source, std::move(bytes)).second) ++stats_.made;
  }
  void consumed(bool rejected) {
    std::lock_guard lock(mutex_);
    ++(rejected ? stats_.rejected : stats_.consumed);
  }
  PreludeCacheStats stats() {
    std::lock_guard lock(mutex_);
    return stats_;
  }

 private:
  std::mutex mutex_;
  PreludeCacheStats stats_;
  std::map<const char*, std::shared_ptr<const std::vector<std::uint8_t>>> caches_;  // by source
};

PreludeCodeCache& preludeCodeCache() {
  static PreludeCodeCache cache;
  return cache;
}

}  // namespace

v8::MaybeLocal<v8::Function> runPreludeFactory(v8::Local<v8::Context> context, const char* name,
                                               const char* source, v8::Local<v8::Value> argument) {
  v8::Isolate* isolate = context->GetIsolate();
  v8::EscapableHandleScope scope(isolate);
  v8::TryCatch tryCatch(isolate);
  v8::ScriptOrigin origin(isolate, v8String(isolate, name));
  // The Source owns the CachedData object, which only borrows the bytes `cached` keeps alive.
  const auto cached = preludeCodeCache().find(source);
  auto* cachedData =
      cached ? new v8::ScriptCompiler::CachedData(cached->data(), static_cast<int>(cached->size()))
             : nullptr;
  v8::ScriptCompiler::Source compilerSource(v8String(isolate, source), origin, cachedData);
  v8::Local<v8::Script> script;
  v8::Local<v8::Value> factory, made;
  v8::Local<v8::Value> argv[] = {argument};
  const auto options =
      cached ? v8::ScriptCompiler::kConsumeCodeCache : v8::ScriptCompiler::kNoCompileOptions;
  if (!v8::ScriptCompiler::Compile(context, &compilerSource, options).ToLocal(&script) ||
      !script->Run(context).ToLocal(&factory) || !factory->IsFunction() ||
      !factory.As<v8::Function>()->Call(context, v8::Undefined(isolate), 1, argv).ToLocal(&made) ||
      !made->IsFunction()) {
    return {};
  }
  if (cached) {
    preludeCodeCache().consumed(compilerSource.GetCachedData()->rejected);
  } else {
    // After running: the functions compiled while the factory ran are in the cache too.
    std::unique_ptr<v8::ScriptCompiler::CachedData> created(
        v8::ScriptCompiler::CreateCodeCache(script->GetUnboundScript()));
    if (created && created->length > 0) preludeCodeCache().keep(source, *created);
  }
  return scope.Escape(made.As<v8::Function>());
}

PreludeCacheStats preludeCacheStats() { return preludeCodeCache().stats(); }

bool setNatives(v8::Local<v8::Context> context, v8::Local<v8::Object> natives,
                std::initializer_list<std::pair<const char*, v8::FunctionCallback>> functions) {
  v8::Isolate* isolate = context->GetIsolate();
  for (const auto& [name, callback] : functions) {
    v8::Local<v8::Function> native;
    if (!v8::Function::New(context, callback, v8::Local<v8::Value>(), 0,
                           v8::ConstructorBehavior::kThrow)
             .ToLocal(&native) ||
        !natives->CreateDataProperty(context, v8String(isolate, name), native).FromMaybe(false)) {
      return false;
    }
  }
  return true;
}

v8::MaybeLocal<v8::Function> installFetchPrelude(v8::Local<v8::Context> context,
                                                 v8::Local<v8::Value> intrinsics) {
  v8::Isolate* isolate = context->GetIsolate();
  v8::EscapableHandleScope scope(isolate);
  v8::Local<v8::Object> natives = v8::Object::New(isolate);
  if (!natives->CreateDataProperty(context, v8String(isolate, "intrinsics"), intrinsics)
           .FromMaybe(false) ||
      !setNatives(context, natives,
                  {{"utf8Decode", &onUtf8Decode},
                   {"toBytes", &onToBytes},
                   {"isArrayBuffer", &onIsArrayBuffer},
                   {"formBody", &onFormBody}})) {
    return {};
  }
  v8::Local<v8::Function> made;
  if (!runPreludeFactory(context, "toolhost:fetch", kPrelude, natives).ToLocal(&made)) return {};
  return scope.Escape(made);
}

std::optional<json::object> fetchRequest(v8::Local<v8::Context> context, v8::Local<v8::Value> input,
                                         v8::Local<v8::Value> init) {
  v8::Isolate* isolate = context->GetIsolate();
  std::string url;
  bool haveUrl = false;
  bool urlTooLong = false;
  auto readUrl = [&](v8::Local<v8::String> text) {
    auto converted = toUtf8Within(isolate, text, kMaxUrlBytes);
    urlTooLong = !converted;
    url = converted.value_or("");
    haveUrl = true;
  };
  if (input->IsString()) {
    readUrl(input.As<v8::String>());
  } else if (input->IsObject()) {
    for (const char* key : {"url", "href"}) {
      v8::Local<v8::Value> value;
      if (!input.As<v8::Object>()->Get(context, v8String(isolate, key)).ToLocal(&value)) {
        return std::nullopt;
      }
      if (value->IsString()) {
        readUrl(value.As<v8::String>());
        break;
      }
    }
  }
  if (urlTooLong) {
    throwTooLarge(context,
                  "fetch: the URL is longer than " + std::to_string(kMaxUrlBytes >> 20) + " MiB");
    return std::nullopt;
  }
  if (!haveUrl) {
    throwInvalidArgument(
        context,
        "fetch(input, init): input must be a URL string or an object with a string url "
        "or href");
    return std::nullopt;
  }

  std::string method = "GET";
  // What follows a redirect: nothing unless the tool asks (ARCHITECTURE.md: no automatic
  // redirects; the daemon then returns the 3xx, as "manual" does).
  std::optional<std::string> redirect;
  HeaderList headers(context);
  std::optional<std::string> body;
  if (!init->IsNullOrUndefined()) {
    if (!init->IsObject()) {
      throwInvalidArgument(context, "fetch(input, init): init must be an object");
      return std::nullopt;
    }
    auto options = init.As<v8::Object>();
    v8::Local<v8::Value> value;
    if (!options->Get(context, v8String(isolate, "method")).ToLocal(&value)) return std::nullopt;
    if (value->IsString()) {
      auto converted = toUtf8Within(isolate, value.As<v8::String>(), kMaxMethodBytes);
      if (!converted) {
        throwInvalidArgument(context, "fetch: init.method is longer than " +
                                          std::to_string(kMaxMethodBytes) + " bytes");
        return std::nullopt;
      }
      method = std::move(*converted);
    } else if (!value->IsUndefined()) {
      throwInvalidArgument(context, "fetch: init.method must be a string");
      return std::nullopt;
    }
    if (!options->Get(context, v8String(isolate, "redirect")).ToLocal(&value)) return std::nullopt;
    if (!value->IsUndefined()) {
      std::optional<std::string> mode;
      if (value->IsString()) mode = toUtf8Within(isolate, value.As<v8::String>(), 16);
      if (mode != "follow" && mode != "manual" && mode != "error") {
        throwInvalidArgument(context,
                             "fetch: init.redirect must be \"follow\", \"manual\" or \"error\"");
        return std::nullopt;
      }
      redirect = std::move(*mode);
    }
    if (!options->Get(context, v8String(isolate, "headers")).ToLocal(&value) ||
        !readHeaders(context, value, headers)) {
      return std::nullopt;
    }
    if (!options->Get(context, v8String(isolate, "body")).ToLocal(&value)) return std::nullopt;
    bool ok = true;
    const char* contentType = nullptr;
    body = readBody(context, value, ok, contentType);
    if (!ok) return std::nullopt;
    // As browsers do: a text or form body says what it is unless the tool said otherwise.
    if (contentType != nullptr && !headers.has("content-type")) {
      headers.addText("content-type", contentType);
    }
    if (body && (equalsIgnoringCase(method, "GET") || equalsIgnoringCase(method, "HEAD") ||
                 equalsIgnoringCase(method, "OPTIONS"))) {
      throwInvalidArgument(context, "fetch: a " + method + " request cannot have a body");
      return std::nullopt;
    }
  }
  json::object request;
  request["url"] = url;
  request["method"] = method;
  request["headers"] = headers.take();
  if (redirect) request["redirect"] = *redirect;
  if (body) request["bodyBase64"] = base64Encode(*body);
  return request;
}

boost::system::result<v8::Local<v8::Value>, HostOpFailure> fetchResponse(
    Sandbox& sandbox, v8::Local<v8::Context> context, v8::Local<v8::Function> makeResponse,
    const json::value& reply) {
  v8::Isolate* isolate = context->GetIsolate();
  v8::EscapableHandleScope scope(isolate);
  auto malformed = [](const std::string& what) {
    return HostOpFailure{"failed", "the host's reply to fetch is malformed: " + what};
  };
  const json::object* object = reply.if_object();
  if (object == nullptr) return malformed("it is not an object");
  const json::value* status = object->if_contains("status");
  std::int64_t statusCode = -1;
  if (status != nullptr && status->is_int64()) statusCode = status->get_int64();
  if (status != nullptr && status->is_uint64() && status->get_uint64() < 1000) {
    statusCode = static_cast<std::int64_t>(status->get_uint64());
  }
  if (statusCode < 0 || statusCode > 999) return malformed("status is not an HTTP status code");
  const json::value* statusText = object->if_contains("statusText");
  const json::value* url = object->if_contains("url");
  const json::value* headers = object->if_contains("headers");
  const json::value* bodyBase64 = object->if_contains("bodyBase64");
  const json::value* redirected = object->if_contains("redirected");
  if (redirected != nullptr && !redirected->is_bool()) return malformed("redirected is no boolean");
  if (statusText == nullptr || !statusText->is_string()) return malformed("no statusText string");
  if (url == nullptr || !url->is_string()) return malformed("no url string");
  if (headers == nullptr || !headers->is_array()) return malformed("no headers array");
  if (bodyBase64 == nullptr || !bodyBase64->is_string()) return malformed("no bodyBase64 string");

  // Sorted by name and combined as browsers' Headers iterate them: repeated names joined with
  // ", ", except set-cookie, whose values stay apart.
  std::vector<std::pair<std::string, std::string>> list;
  for (const json::value& header : headers->get_array()) {
    const json::array* pair = header.if_array();
    if (pair == nullptr || pair->size() != 2 || !(*pair)[0].is_string() ||
        !(*pair)[1].is_string()) {
      return malformed("a header is not a [name, value] pair of strings");
    }
    list.emplace_back(asciiLower(std::string((*pair)[0].get_string())),
                      std::string((*pair)[1].get_string()));
  }
  std::stable_sort(list.begin(), list.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::pair<std::string, std::string>> combined;
  for (auto& [name, value] : list) {
    if (!combined.empty() && combined.back().first == name && name != "set-cookie") {
      combined.back().second += ", " + value;
    } else {
      combined.emplace_back(std::move(name), std::move(value));
    }
  }

  const std::string_view text = bodyBase64->get_string();
  const auto size = base64DecodedSize(text);
  if (!size) return malformed("bodyBase64 is not base64");
  v8::Local<v8::ArrayBuffer> body;
  if (!sandbox.newArrayBuffer(*size).ToLocal(&body)) {
    return HostOpFailure{"failed", "the response body does not fit in the sandbox"};
  }
  if (*size > 0 &&
      !base64Decode(text, static_cast<std::uint8_t*>(body->GetBackingStore()->Data()))) {
    return malformed("bodyBase64 is not base64");
  }

  std::vector<v8::Local<v8::Value>> entries;
  entries.reserve(combined.size());
  for (const auto& [name, value] : combined) {
    v8::Local<v8::String> nameText, valueText;
    if (!tryString(isolate, name).ToLocal(&nameText) ||
        !tryString(isolate, value).ToLocal(&valueText)) {
      return malformed("a header does not fit in a string");
    }
    v8::Local<v8::Value> pair[] = {nameText, valueText};
    entries.push_back(v8::Array::New(isolate, pair, 2));
  }
  v8::Local<v8::String> statusTextString, urlString;
  if (!tryString(isolate, statusText->get_string()).ToLocal(&statusTextString) ||
      !tryString(isolate, url->get_string()).ToLocal(&urlString)) {
    return malformed("statusText or url does not fit in a string");
  }
  v8::Local<v8::Value> argv[] = {
      v8::Integer::New(isolate, static_cast<std::int32_t>(statusCode)),
      statusTextString,
      urlString,
      v8::Array::New(isolate, entries.data(), entries.size()),
      body,
      v8::Boolean::New(isolate, redirected != nullptr && redirected->get_bool())};
  v8::TryCatch tryCatch(isolate);
  v8::Local<v8::Value> response;
  if (!makeResponse->Call(context, v8::Undefined(isolate), 6, argv).ToLocal(&response)) {
    return HostOpFailure{"failed", "the Response could not be made"};
  }
  return scope.Escape(response);
}

}  // namespace toolhost::runtime
