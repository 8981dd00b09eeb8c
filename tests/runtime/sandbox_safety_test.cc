// The issue's "must never happen" list, one test each: a tool reaching the host; the daemon
// crashing, hanging or growing because of a tool; one call's state reaching another sandbox; a
// late watchdog kill hitting the next call. Each runaway tool is ended by its limit and the
// process (and the pool) keeps working afterwards.
#include "runtime/json_bridge.h"
#include "tests/runtime/runtime_test_support.h"

#include <catch2/catch.hpp>

#include <boost/json/parse.hpp>

#include <set>

using namespace toolhost::runtime;
using namespace toolhost::runtime::testing;
namespace json = boost::json;

namespace {

json::object limits(json::object values) { return json::object{{"limits", std::move(values)}}; }

// After a runaway tool, the pool still runs an ordinary call.
void requireHealthy(PoolFixture& f) {
  auto outcome = f.call(makeTool("export default () => 'still here'"));
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(*outcome.result == "still here");
}

}  // namespace

TEST_CASE("an infinite loop ends at the wall-clock limit", "[safety]") {
  PoolFixture f;
  auto tool = makeTool("export default () => { for (;;) {} }", limits({{"wallMs", 300}}));
  auto outcome = f.call(tool);
  INFO(describe(outcome));
  REQUIRE(errc(outcome) == CallErrc::timeout);
  CHECK_THAT(outcome.result.error().detail, Catch::Contains("300 ms"));
  CHECK(outcome.usage.wallMs >= 290);
  CHECK(outcome.usage.wallMs < 10000);  // a bound, not a speed: unchecked it would run for ever
  CHECK(f.pool.list().empty());  // a killed sandbox is never retained
  requireHealthy(f);
}

TEST_CASE("an infinite loop ends at the CPU limit", "[safety]") {
  PoolFixture f;
  auto tool = makeTool("export default () => { while (true) {} }",
                       limits({{"wallMs", 10000}, {"cpuMs", 200}}));
  auto outcome = f.call(tool);
  INFO(describe(outcome));
  REQUIRE(errc(outcome) == CallErrc::cpuLimit);
  CHECK(outcome.usage.cpuMs >= 190);
  CHECK(outcome.usage.cpuMs < 2000);
  requireHealthy(f);
}

TEST_CASE("an infinite microtask chain ends at its limit", "[safety]") {
  PoolFixture f;
  SECTION("a promise chain that never yields") {
    auto tool = makeTool(
        "export default async () => { const f = () => Promise.resolve().then(f); f();"
        " await new Promise(() => {}); }",
        limits({{"wallMs", 400}, {"cpuMs", 300}}));
    auto outcome = f.call(tool);
    INFO(describe(outcome));
    // Each turn also links one more promise into the chain, so the heap may run out first.
    CHECK((errc(outcome) == CallErrc::timeout || errc(outcome) == CallErrc::cpuLimit ||
           errc(outcome) == CallErrc::memoryLimit));
  }
  SECTION("an async function awaiting itself forever") {
    auto tool = makeTool(
        "const spin = async () => { await null; return spin(); };"
        "export default () => spin()",
        limits({{"wallMs", 400}, {"cpuMs", 300}}));
    auto outcome = f.call(tool);
    INFO(describe(outcome));
    // Each level keeps the one before it alive (40-70 MB of promises within these limits), so the
    // 32 MiB heap may run out before the clock does.
    CHECK((errc(outcome) == CallErrc::timeout || errc(outcome) == CallErrc::cpuLimit ||
           errc(outcome) == CallErrc::memoryLimit));
  }
  requireHealthy(f);
}

TEST_CASE("an allocation bomb hits the heap limit and the process survives", "[safety]") {
  PoolFixture f;
  const char* bombs[] = {
      "export default () => { const keep = []; for (;;) keep.push(new Array(100000).fill(1.5)); }",
      "export default () => { const keep = []; for (let i = 0;; i++) keep.push(JSON.stringify({i, "
      "pad: 'x'.repeat(1000)})); }",
      "export default () => { const keep = []; for (;;) keep.push({a: keep.length, b: "
      "[keep.length]}); }",
      "export default () => { let a = [1]; for (;;) a = a.concat(a); }",
      "export default () => { const m = new Map(); for (let i = 0;; i++) m.set(i, "
      "String(i).repeat(20)); }",
      // Single allocations far past the limit, admitted before V8 asks (the headroom must cover
      // what the heap already holds, or V8 aborts with "Reached heap limit").
      "export default () => 'x'.repeat(1 << 26).toUpperCase().length",
      "export default () => JSON.stringify(new Array(1e7).fill('abcdefgh')).length",
      // One young large object is admitted whatever the limit; kept, it is caught at the end of
      // the segment, so it is this call (not the next) that ends.
      "export default () => { globalThis.keep = new Array(3e7).fill(0); return keep.length; }",
  };
  for (const char* bomb : bombs) {
    auto tool = makeTool(bomb, limits({{"heapMb", 16}, {"wallMs", 20000}, {"cpuMs", 20000}}));
    auto outcome = f.call(tool);
    INFO(bomb << "\n" << describe(outcome));
    CHECK(errc(outcome) == CallErrc::memoryLimit);
  }
  CHECK(f.pool.list().empty());
  requireHealthy(f);
}

TEST_CASE("an ArrayBuffer bomb hits the ArrayBuffer limit", "[safety]") {
  PoolFixture f;
  const char* bombs[] = {
      "export default () => { const keep = []; for (;;) keep.push(new ArrayBuffer(1 << 20)); }",
      "export default () => { new Uint8Array(1024 * 1024 * 1024); }",
      "export default () => { try { new ArrayBuffer(64 * 1024 * 1024); } catch (e) { return "
      "'caught'; } }",
      "export default () => { const keep = []; for (;;) keep.push(new Float64Array(1 << 17)); }",
  };
  for (const char* bomb : bombs) {
    auto tool = makeTool(bomb, limits({{"arrayBufferMb", 8}}));
    auto outcome = f.call(tool);
    INFO(bomb << "\n" << describe(outcome));
    CHECK(errc(outcome) == CallErrc::arrayBufferLimit);
  }
  SECTION("buffers within the limit work, and are counted in the heap peak") {
    auto tool = makeTool("export default () => new Uint8Array(4 << 20).length",
                         limits({{"arrayBufferMb", 8}}));
    auto outcome = f.call(tool);
    INFO(describe(outcome));
    REQUIRE(outcome.result);
    CHECK(*outcome.result == 4 << 20);
    CHECK(outcome.usage.heapPeakBytes >= (4u << 20));
  }
  requireHealthy(f);
}

TEST_CASE("deep recursion hits the stack limit", "[safety]") {
  PoolFixture f;
  SECTION("uncaught: stackLimit, and the sandbox is discarded") {
    auto tool = makeTool("const down = (n) => down(n + 1) + 1; export default () => down(0)",
                         limits({{"stackKb", 256}}));
    auto outcome = f.call(tool);
    INFO(describe(outcome));
    REQUIRE(errc(outcome) == CallErrc::stackLimit);
    CHECK_THAT(outcome.result.error().detail, Catch::Contains("256 KiB"));
    CHECK(outcome.result.error().toolError.at("name") == "RangeError");
    CHECK(f.pool.list().empty());
  }
  SECTION("caught by the tool: the call succeeds") {
    auto tool = makeTool(
        "let depth = 0; const down = () => { depth++; down(); };"
        "export default () => { try { down(); } catch (e) { return {caught: e instanceof "
        "RangeError, deep: depth > 100}; } }",
        limits({{"stackKb", 256}}));
    auto outcome = f.call(tool);
    INFO(describe(outcome));
    REQUIRE(outcome.result);
    CHECK(*outcome.result == json::parse(R"({"caught":true,"deep":true})"));
  }
  SECTION("the limit follows stackKb: a deeper stack allows deeper recursion") {
    auto tool = makeTool(
        "let depth = 0; const down = () => { depth++; down(); };"
        "export default () => { depth = 0; try { down(); } catch (e) {} return depth; }");
    CallOptions shallow;
    shallow.limits.stackKb = 128;
    auto small = f.call(tool, {}, shallow);
    auto large = f.call(tool);  // 984 KiB by default
    INFO(describe(small) << " / " << describe(large));
    REQUIRE(small.result);
    REQUIRE(large.result);
    CHECK(large.result->as_int64() > 4 * small.result->as_int64());
  }
  requireHealthy(f);
}

TEST_CASE("a catastrophic regular expression ends at its limit", "[safety]") {
  PoolFixture f;
  auto tool = makeTool("export default () => /(a+)+b/.test('a'.repeat(40) + 'c')",
                       limits({{"wallMs", 500}, {"cpuMs", 300}}));
  auto outcome = f.call(tool);
  INFO(describe(outcome));
  CHECK((errc(outcome) == CallErrc::timeout || errc(outcome) == CallErrc::cpuLimit));
  CHECK(outcome.usage.wallMs < 10000);  // a bound, not a speed: unchecked it would run for ever
  requireHealthy(f);
}

TEST_CASE("huge results are refused with outputTooLarge", "[safety]") {
  PoolFixture f;
  const char* huge[] = {
      "export default () => 'x'.repeat(3 * 1024 * 1024)",
      "export default () => new Array(2000000).fill(0)",
      "export default () => { const a = []; a.length = 4294967295; return a; }",
      "export default () => { let a = [1]; for (let i = 0; i < 40; i++) a = [a, a]; return a; }",
      "export default () => Object.fromEntries(Array.from({length: 100000}, (_, i) => "
      "['k'.repeat(20) + i, i]))",
      "export default () => ({['k'.repeat(3 * 1024 * 1024)]: 1})",
  };
  for (const char* source : huge) {
    auto outcome = f.call(makeTool(source));
    INFO(source << "\n" << describe(outcome));
    CHECK(errc(outcome) == CallErrc::outputTooLarge);
  }
  SECTION("the limit is exact and follows outputBytes") {
    auto tool = makeTool("export default (args) => 'x'.repeat(args.n)");
    CallOptions options;
    options.limits.outputBytes = 100;
    auto fits = f.call(tool, {{"n", 98}}, options);  // 98 + 2 quotes
    auto over = f.call(tool, {{"n", 99}}, options);
    INFO(describe(fits) << " / " << describe(over));
    CHECK(fits.result);
    CHECK(errc(over) == CallErrc::outputTooLarge);
  }
  SECTION("values are bounded too, whatever outputBytes allows") {
    // Zeros: two bytes of JSON each, tens of bytes each in the daemon once parsed.
    // Holes too: each is a null in the JSON.
    for (const char* source : {"export default (args) => new Array(args.n).fill(0)",
                               "export default (args) => new Array(args.n)"}) {
      auto tool = makeTool(source, limits({{"outputBytes", 64 * 1024 * 1024}}));
      auto over = f.call(tool, {{"n", static_cast<std::int64_t>(kMaxJsonValues)}});
      INFO(source << "\n" << describe(over));
      CHECK(errc(over) == CallErrc::outputTooLarge);
      CHECK_THAT(over.result.error().detail,
                 Catch::Contains("more than " + std::to_string(kMaxJsonValues) + " JSON values"));
    }
  }
  requireHealthy(f);
}

TEST_CASE("results that are not JSON data are refused with a clear error", "[safety]") {
  PoolFixture f;
  struct Case {
    const char* source;
    const char* says;
  };
  const Case cases[] = {
      {"export default () => { const a = {}; a.self = a; return a; }", "/self refers back"},
      {"export default () => { const a = [1]; a.push({x: a}); return a; }", "/1/x refers back"},
      {"export default () => new Proxy({}, {})", "Proxy"},
      {"export default () => ({inner: new Proxy({}, {ownKeys() { throw new Error('trap'); }})})",
       "/inner is a Proxy"},
      {"export default () => ({get boom() { throw new Error('getter says no'); }})",
       "/boom could not be read: it threw Error: getter says no"},
      {"export default () => ({n: 10n})", "/n is a BigInt"},
      {"export default () => ({n: NaN})", "/n is NaN"},
      {"export default () => [Infinity]", "/0 is an infinite number"},
      {"export default () => ({f() {}})", "/f is a function"},
      {"export default () => ({s: Symbol('x')})", "/s is a Symbol"},
      {"export default () => ({when: new Date(0)})", "/when is a Date"},
      {"export default () => new Map([[1, 2]])", "is a Map"},
      {"export default () => ({'a/b~c': {x: 1n}})", "/a~1b~0c/x is a BigInt"},
      {"export default () => { let v = 1; for (let i = 0; i < 200; i++) v = [v]; return v; }",
       "nested deeper than 128 levels"},
      {"export default () => ({then: 1, p: Promise.resolve(1)})", "/p is a Promise"},
      // A lone surrogate would become U+FFFD: different values alike, one of two keys lost.
      {"export default () => ({s: '\\u{1F600}'.slice(0, 1)})", "/s holds a lone surrogate"},
      {"export default () => ['ok', 'x\\udc00']", "/1 holds a lone surrogate"},
      {"export default () => ({v: {'\\ud800': 1, '\\udbff': 2}})",
       "/v has a key that holds a lone surrogate"},
  };
  for (const auto& c : cases) {
    auto outcome = f.call(makeTool(c.source));
    INFO(c.source << "\n" << describe(outcome));
    REQUIRE(errc(outcome) == CallErrc::invalidResult);
    CHECK_THAT(outcome.result.error().detail, Catch::Contains(c.says));
  }
  SECTION("whole surrogate pairs are characters like any other") {
    auto ok = f.call(makeTool("export default () => ({'\\u{1F600}': '\\u{1F600}'.slice(0, 2)})"));
    REQUIRE(ok.result);
    CHECK(*ok.result == json::parse("{\"\xF0\x9F\x98\x80\":\"\xF0\x9F\x98\x80\"}"));
  }
  SECTION("getters that work run, inside the call's limits") {
    auto ok = f.call(makeTool("export default () => ({get x() { return 42; }})"));
    REQUIRE(ok.result);
    CHECK(*ok.result == json::parse(R"({"x":42})"));
    auto slow = f.call(
        makeTool("export default () => ({get x() { for (;;) {} }})", limits({{"wallMs", 300}})));
    INFO(describe(slow));
    CHECK(errc(slow) == CallErrc::timeout);
  }
  requireHealthy(f);
}

TEST_CASE("JSON data round-trips exactly, with JSON's rules for the rest", "[safety]") {
  PoolFixture f;
  auto tool = makeTool(R"(export default (args) => ({
      echo: args,
      numbers: [0, -0, 1.5, -2, 2 ** 53, 1e21, 5e-324, 0.1 + 0.2],
      strings: ['', 'é', '\u2028', '\ud83d\ude00', 'a\u0000b', '"\\'],
      skipped: {u: undefined, [Symbol('s')]: 1, kept: null},
      holes: [1, , undefined, 3],
      nested: {a: [{b: {c: [true, false, null]}}]},
      numericKeys: {1: 'one', 0: 'zero', b: 'b'},
      keys: {'clé': 1, ['\xff' + 'x'.repeat(3)]: 2, '☃': 3, 'plain': 'ÿ'.repeat(2) + 'a'},
      instance: new (class Point { constructor() { this.x = 1; } get len() { return 1; } })(),
      error: Object.assign(new Error('e'), {code: 'E1'}),
    }))");
  json::object args{{"text", "hé \xF0\x9F\x98\x80"},
                    {"list", json::array{1, 2.5, nullptr}},
                    {"deep", json::object{{"x", json::object{{"y", true}}}}}};
  auto outcome = f.call(tool, args);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  const auto& result = outcome.result->as_object();
  CHECK(result.at("echo") == args);
  CHECK(result.at("numbers") ==
        json::parse("[0,0,1.5,-2,9007199254740992,1e21,5e-324,0.30000000000000004]"));
  CHECK(result.at("strings") == json::parse(R"(["","é","\u2028","\ud83d\ude00","a\u0000b","\"\\"])"));
  CHECK(result.at("skipped") == json::parse(R"({"kept":null})"));
  CHECK(result.at("holes") == json::parse("[1,null,null,3]"));
  CHECK(result.at("nested") == json::parse(R"({"a":[{"b":{"c":[true,false,null]}}]})"));
  CHECK(result.at("numericKeys") == json::parse(R"({"0":"zero","1":"one","b":"b"})"));
  CHECK(result.at("keys") == json::parse(R"({"clé":1,"ÿxxx":2,"☃":3,"plain":"ÿÿa"})"));
  CHECK(result.at("instance") == json::parse(R"({"x":1})"));
  CHECK(result.at("error") == json::parse(R"({"code":"E1"})"));
}

TEST_CASE("what a tool does to its prototypes and JSON never reaches the host", "[safety]") {
  PoolFixture f;
  auto tool = makeTool(R"(
    let polluted = false;
    const keys = Object.keys;
    export default (args) => {
      if (!polluted) {
        polluted = true;
        Object.prototype.injected = 'from the prototype';
        Object.defineProperty(Object.prototype, 'trap', {set() { throw new Error('setter'); }, get() { return 'trap'; }});
        Array.prototype[1] = 'array hole filler';
        Array.prototype.toJSON = () => 'array toJSON';
        Object.prototype.toJSON = () => 'object toJSON';
        JSON.stringify = () => '"stringify replaced"';
        JSON.parse = () => ({parse: 'replaced'});
        String.prototype.toString = () => 'string replaced';
        Number.prototype.valueOf = () => 7;
        globalThis.Object = null;
        return 'polluted';
      }
      return {args, own: keys(args), holes: [0, , 2], nested: {a: 1}, trap: 1};
    })");
  auto first = f.call(tool);
  INFO(describe(first));
  REQUIRE(first.result);
  json::object args{{"x", 1}, {"list", json::array{1, 2}}, {"trap", "value"}};
  auto second = f.call(tool, args);
  INFO(describe(second));
  REQUIRE(second.result);
  CHECK(*second.result ==
        json::parse(R"({"args":{"x":1,"list":[1,2],"trap":"value"},"own":["x","list","trap"],)"
                    R"("holes":[0,null,2],"nested":{"a":1},"trap":1})"));
  CHECK(second.usage.freshSandbox == false);  // the polluted context was really reused
}

TEST_CASE("a tool reaches nothing of the host", "[safety]") {
  PoolFixture f;
  SECTION("the global object holds only ECMAScript, console, fetch and computing web APIs") {
    auto tool = makeTool(R"(export default () => {
        const names = Object.getOwnPropertyNames(globalThis);
        return {names, types: {process: typeof process, require: typeof require, Deno: typeof Deno,
          Bun: typeof Bun, setTimeout: typeof setTimeout, setInterval: typeof setInterval,
          queueMicrotask: typeof queueMicrotask, WebAssembly: typeof WebAssembly,
          SharedArrayBuffer: typeof SharedArrayBuffer, Atomics: typeof Atomics, module: typeof module,
          exports: typeof exports, global: typeof global, importScripts: typeof importScripts,
          Buffer: typeof Buffer, navigator: typeof navigator, performance: typeof performance,
          Intl: typeof Intl}, localized: new Date(0).toLocaleString('en-US', {timeZone: 'UTC'}),
          number: (1234.5).toLocaleString('de-DE'), compared: 'a'.localeCompare('b', 'en')};
      })");
    auto outcome = f.call(tool);
    INFO(describe(outcome));
    REQUIRE(outcome.result);
    const std::set<std::string> allowed{
        // ECMA-262 (2022) value, function and constructor properties of the global object.
        "globalThis", "Infinity", "NaN", "undefined", "eval", "isFinite", "isNaN", "parseFloat",
        "parseInt", "decodeURI", "decodeURIComponent", "encodeURI", "encodeURIComponent",
        "AggregateError", "Array", "ArrayBuffer", "BigInt", "BigInt64Array", "BigUint64Array",
        "Boolean", "DataView", "Date", "Error", "EvalError", "FinalizationRegistry", "Float32Array",
        "Float64Array", "Function", "Int8Array", "Int16Array", "Int32Array", "Map", "Number",
        "Object", "Promise", "Proxy", "RangeError", "ReferenceError", "RegExp", "Set", "String",
        "Symbol", "SyntaxError", "TypeError", "Uint8Array", "Uint8ClampedArray", "Uint16Array",
        "Uint32Array", "URIError", "WeakMap", "WeakRef", "WeakSet", "JSON", "Math", "Reflect",
        // Annex B (ECMA-402's Intl is removed: its objects keep memory outside every limit).
        "escape", "unescape",
        // The sandbox's own doors.
        "console", "fetch",
        // Web APIs that compute and grant nothing (runtime/web_globals.h, the fetch prelude).
        "Headers", "Response", "DOMException", "TextEncoder", "TextDecoder", "atob", "btoa",
        "crypto", "URL", "URLSearchParams"};
    std::vector<std::string> unexpected;
    for (const auto& name : outcome.result->at("names").as_array()) {
      if (!allowed.count(std::string(name.as_string()))) unexpected.emplace_back(name.as_string());
    }
    CHECK(unexpected == std::vector<std::string>{});
    for (const auto& [name, type] : outcome.result->at("types").as_object()) {
      INFO(name);
      CHECK(type == "undefined");
    }
    // Locale-sensitive formatting stays, through the methods that keep nothing.
    CHECK(outcome.result->at("localized") == "1/1/1970, 12:00:00 AM");
    CHECK(outcome.result->at("number") == "1.234,5");
    CHECK(outcome.result->at("compared") == -1);
  }
  SECTION("Date's locale methods take no calendar or numbering system, however asked") {
    // V8 keeps an ICU pattern generator per locale with its extensions, for the process's life.
    auto tool = makeTool(R"(export default () => {
        const d = new Date(0);
        const tz = {timeZone: 'UTC'};
        const threw = (f) => { try { f(); return 'no'; } catch (e) { return e.name; } };
        return {
          plain: d.toLocaleString('en-US', tz),
          extension: d.toLocaleString('en-US-u-nu-arab-ca-japanese', tz),
          options: d.toLocaleString('en-US', {timeZone: 'UTC', numberingSystem: 'arab', calendar: 'japanese'}),
          list: d.toLocaleDateString(['ar-EG-u-nu-arab', 'en'], tz),
          holes: d.toLocaleString([, 'en-US-u-nu-arab'], tz),
          time: d.toLocaleTimeString('en-US-u-hc-h23', {timeZone: 'UTC', hourCycle: 'h23'}),
          arrayLike: threw(() => d.toLocaleString({length: 1, 0: 'en-u-nu-arab'})),
        };
      })");
    auto outcome = f.call(tool);
    INFO(describe(outcome));
    REQUIRE(outcome.result);
    const auto& got = outcome.result->as_object();
    CHECK(got.at("plain") == "1/1/1970, 12:00:00 AM");
    CHECK(got.at("extension") == got.at("plain"));
    CHECK(got.at("options") == got.at("plain"));
    CHECK(got.at("holes") == got.at("plain"));
    // The locale's own defaults stay (Egyptian Arabic writes Arabic digits); hourCycle stays.
    CHECK(got.at("list") != "1/1/1970");
    CHECK(got.at("time") == "00:00:00");
    CHECK(got.at("arrayLike") == "TypeError");
  }
  SECTION("code generation, dynamic import, WebAssembly and Atomics.wait are unavailable") {
    auto tool = makeTool(R"(export default async () => {
        const attempt = async (f) => { try { await f(); return 'allowed'; } catch (e) { return e.name; } };
        return {
          eval: await attempt(() => eval('1 + 1')),
          indirectEval: await attempt(() => (0, eval)('1 + 1')),
          newFunction: await attempt(() => new Function('return 1')()),
          asyncFunction: await attempt(() => (async function () {}).constructor('return 1')()),
          generatorFunction: await attempt(() => (function* () {}).constructor('yield 1')().next()),
          dynamicImport: await attempt(() => import('./util.js')),
          dynamicImportData: await attempt(() => import('data:text/javascript,export default 1')),
          wasm: typeof WebAssembly,
          sab: typeof SharedArrayBuffer,
          atomics: typeof Atomics,
        };
      })");
    auto outcome = f.call(tool);
    INFO(describe(outcome));
    REQUIRE(outcome.result);
    CHECK(*outcome.result == json::parse(R"({"eval":"EvalError","indirectEval":"EvalError",
        "newFunction":"EvalError","asyncFunction":"EvalError","generatorFunction":"EvalError",
        "dynamicImport":"TypeError","dynamicImportData":"TypeError","wasm":"undefined",
        "sab":"undefined","atomics":"undefined"})"));
  }
  SECTION("no host stack or path leaks through errors") {
    auto outcome = f.call(makeTool("export default () => { null.x; }"));
    REQUIRE(errc(outcome) == CallErrc::toolThrew);
    const std::string stack(outcome.result.error().toolError.at("stack").as_string());
    CHECK_THAT(stack, Catch::Contains("source.js:1"));
    const std::string thisFile = __FILE__;
    const std::string sourceTree = thisFile.substr(0, thisFile.rfind("/tests/"));
    CHECK_THAT(stack, !Catch::Contains(sourceTree));
    CHECK_THAT(stack, !Catch::Contains("/usr/"));
    CHECK_THAT(stack, !Catch::Contains(".cc"));
  }
}

TEST_CASE("a never-settling promise ends at once with timeout", "[safety]") {
  PoolFixture f;
  auto tool = makeTool("export default () => new Promise(() => {})", limits({{"wallMs", 60000}}));
  auto outcome = f.call(tool);
  INFO(describe(outcome));
  REQUIRE(errc(outcome) == CallErrc::timeout);
  CHECK_THAT(outcome.result.error().detail, Catch::Contains("can settle"));
  CHECK(outcome.usage.wallMs < 10000);  // not the 60 s wall limit
  SECTION("so does a tool awaiting a promise nobody resolves after some real work") {
    auto chained =
        f.call(makeTool("export default async () => { await 1; await Promise.all([1, 2]); await "
                        "new Promise(() => {}); }"));
    CHECK(errc(chained) == CallErrc::timeout);
  }
}

TEST_CASE("a termination the tool's code swallows is asked for again", "[safety]") {
  PoolFixture f;
  // Each stops inside code that loses the termination (V8's import() while converting its
  // specifier; fetch's request getters), then loops: told again, the call still ends.
  const char* sources[] = {
      "export default async () => { try { await import({ toString() { for (;;) {} } }); } "
      "catch (e) {} for (;;) {} }",
      "export default () => { try { fetch('https://a.example/', { get method() { for (;;) {} } "
      "}); } catch (e) { if (e === null) for (;;) {} } for (;;) {} }",
  };
  for (const char* source : sources) {
    INFO(source);
    auto outcome = f.call(makeTool(source, limits({{"wallMs", 100}, {"cpuMs", 60000}})));
    INFO(describe(outcome));
    CHECK(errc(outcome) == CallErrc::timeout);
    auto cancelled =
        callAndCancel(f.pool, makeTool(source, limits({{"wallMs", 60000}, {"cpuMs", 60000}})),
                      std::chrono::milliseconds(50));
    INFO(describe(cancelled));
    CHECK(errc(cancelled) == CallErrc::cancelled);
  }
}

TEST_CASE("a late watchdog kill never hits the next call", "[safety]") {
  PoolFixture f;
  // Each first call burns until exactly its deadline, so the watchdog's kill races the end of the
  // call. Whatever wins, the next call on the same revision (at once, same retained sandbox if it
  // survived) must succeed.
  auto tool = makeTool(R"(export default (args) => {
      if (args.burnMs) { const end = Date.now() + args.burnMs; while (Date.now() < end) {} }
      return 'ok';
    })");
  int killed = 0, survived = 0;
  for (int round = 0; round < 12; ++round) {
    CallOptions tight;
    tight.limits.wallMs = 40;
    auto first = f.call(tool, {{"burnMs", 39 + round % 3}}, tight);
    INFO(describe(first));
    CHECK((first.result || errc(first) == CallErrc::timeout));
    (first.result ? survived : killed)++;
    auto next = f.call(tool);
    INFO("round " << round << ": " << describe(next));
    REQUIRE(next.result);
    CHECK(*next.result == "ok");
  }
  // Which side wins each race varies; what matters is the next call (checked above).
  WARN("killed " << killed << ", survived " << survived);
}

TEST_CASE("one call's state and capabilities never reach another sandbox", "[safety]") {
  PoolFixture f;
  const char* source = R"(
      let count = 0;
      export default (args, ctx) => {
        count++;
        globalThis.leaked ??= args.mark;
        if (args.stash) globalThis.stashed = ctx;
        return {count, leaked: globalThis.leaked, sawStash: typeof globalThis.stashed};
      })";
  auto a = makeTool(source, {}, {}, "tool-a");
  auto b = makeTool(source, {}, {}, "tool-b");
  auto firstA = f.call(a, {{"mark", "A"}, {"stash", true}});
  auto secondA = f.call(a, {{"mark", "A2"}});
  auto firstB = f.call(b, {{"mark", "B"}});
  CallOptions disposable;
  disposable.mode = CallOptions::Mode::disposable;
  auto disposableA = f.call(a, {{"mark", "D"}}, disposable);
  auto thirdA = f.call(a, {{"mark", "A3"}});
  for (const auto* outcome : {&firstA, &secondA, &firstB, &disposableA, &thirdA}) {
    INFO(describe(*outcome));
    REQUIRE(outcome->result);
  }
  CHECK(*firstA.result == json::parse(R"({"count":1,"leaked":"A","sawStash":"object"})"));
  CHECK(*secondA.result == json::parse(R"({"count":2,"leaked":"A","sawStash":"object"})"));
  CHECK(*firstB.result == json::parse(R"({"count":1,"leaked":"B","sawStash":"undefined"})"));
  CHECK(*disposableA.result == json::parse(R"({"count":1,"leaked":"D","sawStash":"undefined"})"));
  CHECK(disposableA.usage.freshSandbox);
  CHECK(*thirdA.result == json::parse(R"({"count":3,"leaked":"A","sawStash":"object"})"));
  CHECK_FALSE(thirdA.usage.freshSandbox);
}
