// V8 works from our build: an isolate is created, evaluates JavaScript, and is disposed.
#include "runtime/v8_platform.h"
#include "tests/runtime/runtime_test_support.h"

#include <catch2/catch.hpp>
#include <libplatform/libplatform.h>
#include <v8.h>

#include <memory>
#include <string>

namespace {

// The platform lives for the whole test process, as in the daemon (shared with the other tests).
toolhost::runtime::V8Platform& platform() { return toolhost::runtime::testing::v8Platform(); }

std::string evaluate(const char* source) {
  platform();
  std::unique_ptr<v8::ArrayBuffer::Allocator> allocator(
      v8::ArrayBuffer::Allocator::NewDefaultAllocator());
  v8::Isolate::CreateParams params;
  params.array_buffer_allocator = allocator.get();
  v8::Isolate* isolate = v8::Isolate::New(params);
  std::string out;
  {
    v8::Locker locker(isolate);
    v8::Isolate::Scope isolateScope(isolate);
    v8::HandleScope handleScope(isolate);
    v8::Local<v8::Context> context = v8::Context::New(isolate);
    v8::Context::Scope contextScope(context);
    v8::TryCatch tryCatch(isolate);
    auto code = v8::String::NewFromUtf8(isolate, source).ToLocalChecked();
    v8::Local<v8::Script> script;
    v8::Local<v8::Value> result;
    if (v8::Script::Compile(context, code).ToLocal(&script) && script->Run(context).ToLocal(&result)) {
      v8::String::Utf8Value text(isolate, result);
      out = *text ? *text : "";
    } else {
      v8::String::Utf8Value text(isolate, tryCatch.Exception());
      out = std::string("threw: ") + (*text ? *text : "?");
    }
  }
  isolate->Dispose();
  return out;
}

}  // namespace

TEST_CASE("an isolate evaluates JavaScript and is disposed", "[v8]") {
  CHECK(evaluate("6 * 7") == "42");
  CHECK(evaluate("JSON.stringify({a: [1, 'two', null]})") == R"({"a":[1,"two",null]})");
  CHECK(evaluate("(async () => 1)() instanceof Promise") == "true");
  CHECK(evaluate("new Intl.NumberFormat('en-US').format(1234.5)") == "1,234.5");
  CHECK(evaluate("throw new Error('nope')") == "threw: Error: nope");
}

TEST_CASE("code generation from strings and WebAssembly are off", "[v8]") {
  CHECK_THAT(evaluate("eval('1 + 1')"), Catch::StartsWith("threw: EvalError"));
  CHECK_THAT(evaluate("new Function('return 1')()"), Catch::StartsWith("threw: EvalError"));
  CHECK(evaluate("typeof WebAssembly") == "undefined");
}

TEST_CASE("the platform reports V8 10.2", "[v8]") {
  CHECK_THAT(toolhost::runtime::v8Version(), Catch::StartsWith("10.2."));
}
