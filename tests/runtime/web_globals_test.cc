// The web globals a tool can use without any authority (runtime/web_globals.h), and the Headers
// and Response constructors: each behaves as in browsers, and a tool that replaces built-ins
// before using them still gets the same answers.
#include "runtime/web_globals.h"
#include "tests/runtime/runtime_test_support.h"

#include <catch2/catch.hpp>

#include <boost/json/parse.hpp>

using namespace toolhost::runtime;
using namespace toolhost::runtime::testing;
namespace json = boost::json;

namespace {

// The result of a tool whose default export is `body`, or a failed check naming the failure.
json::value run(PoolFixture& f, const std::string& body) {
  auto outcome = f.call(makeTool("export default async () => {\n" + body + "\n}"));
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  return *outcome.result;
}

}  // namespace

TEST_CASE("TextEncoder gives UTF-8 and encodeInto stops before a character that does not fit",
          "[runtime][web]") {
  PoolFixture f;
  CHECK(run(f, "return Array.from(new TextEncoder().encode('a\\u00e9\\u20ac\\u{1F600}'))") ==
        json::parse("[97,195,169,226,130,172,240,159,152,128]"));
  CHECK(run(f, "return Array.from(new TextEncoder().encode('x\\ud800'))") ==
        json::parse("[120,239,191,189]"));
  CHECK(run(f, "return new TextEncoder().encode().length") == 0);
  CHECK(run(f,
            "const e = new TextEncoder(); return [e.encoding, "
            "e.encodeInto('a\\u{1F600}b', new Uint8Array(10)), "
            "e.encodeInto('a\\u{1F600}b', new Uint8Array(3)), "
            "e.encodeInto('\\ud800x', new Uint8Array(10))]") ==
        json::parse(R"(["utf-8",{"read":4,"written":6},{"read":1,"written":1},)"
                    R"({"read":2,"written":4}])"));
  CHECK(run(f, "try { new TextEncoder().encodeInto('a', [0]); } catch (e) { return e.name; }") ==
        "TypeError");
}

TEST_CASE("TextDecoder decodes UTF-8 as the Encoding Standard says, streaming and fatal",
          "[runtime][web]") {
  PoolFixture f;
  // Maximal subparts: E0 80 is two errors, a truncated four-byte sequence one.
  CHECK(
      run(f, "return new TextDecoder().decode(new Uint8Array([0xE0,0x80,0x41,0xF0,0x9F,0x98]))") ==
      "\xEF\xBF\xBD\xEF\xBF\xBD"
      "A"
      "\xEF\xBF\xBD");
  CHECK(run(f,
            "const d = new TextDecoder(); "
            "const a = d.decode(new Uint8Array([0xEF,0xBB,0xBF,0x61,0xE2,0x82]), {stream: true}); "
            "return [a, d.decode(new Uint8Array([0xAC]))]") == json::parse(R"(["a","\u20ac"])"));
  CHECK(run(f,
            "return new TextDecoder('utf-8', {ignoreBOM: true}).decode("
            "new Uint8Array([0xEF,0xBB,0xBF,0x61])).length") == 2);
  CHECK(run(f, "return new TextDecoder(' UTF8 ').decode(new Uint8Array([104,105]).buffer)") ==
        "hi");
  CHECK(
      run(f,
          "return new TextDecoder().decode(new DataView(new Uint8Array([0,104,105]).buffer, 1))") ==
      "hi");
  CHECK(run(f, "return new TextDecoder().decode()") == "");
  CHECK(run(f,
            "const d = new TextDecoder('utf-8', {fatal: true}); "
            "try { d.decode(new Uint8Array([0xFF])); } catch (e) { "
            "return [e.name, d.fatal, d.decode(new Uint8Array([0x6F,0x6B]))]; }") ==
        json::parse(R"(["TypeError",true,"ok"])"));
  CHECK(run(f, "try { new TextDecoder('latin1'); } catch (e) { return e.name; }") == "RangeError");
  CHECK(run(f, "try { new TextDecoder().decode('text'); } catch (e) { return e.name; }") ==
        "TypeError");
}

TEST_CASE("decodeUtf8 replaces exactly the maximal subparts and keeps a streaming tail",
          "[runtime][web]") {
  std::size_t tail = 0;
  CHECK(decodeUtf8("\xED\xA0\x80", false, false, tail) == u"\uFFFD\uFFFD\uFFFD");  // a surrogate
  CHECK(decodeUtf8("\xC0\xAF", false, false, tail) == u"\uFFFD\uFFFD");            // overlong
  CHECK(decodeUtf8("\xF4\x90\x80\x80", false, false, tail) ==
        u"\uFFFD\uFFFD\uFFFD\uFFFD");  // past U+10FFFF
  CHECK(decodeUtf8("\xF0\x9F\x98\x80", false, false, tail) == u"\U0001F600");
  CHECK(decodeUtf8("ab\xF0\x9F", false, true, tail) == u"ab");
  CHECK(tail == 2);
  CHECK(decodeUtf8("ab\xF0\x9F", false, false, tail) == u"ab\uFFFD");
  CHECK(tail == 0);
  CHECK_FALSE(decodeUtf8("ab\xF0\x9F", true, false, tail));
  CHECK(decodeUtf8("ab\xF0\x9F", true, true, tail) == u"ab");
  CHECK_FALSE(decodeUtf8("\x80", true, true, tail));
}

TEST_CASE("atob and btoa follow the forgiving base64 of the HTML standard", "[runtime][web]") {
  PoolFixture f;
  CHECK(run(f,
            "return [atob(' YW Jj\\n'), atob('YQ'), atob('YQ=='), btoa('\\xff\\xfe'), "
            "btoa(''), atob('')]") == json::parse(R"(["abc","a","a","//4=","",""])"));
  CHECK(run(f,
            "const name = (f) => { try { f(); return 'none'; } catch (e) { "
            "return e.name + ' ' + e.code + ' ' + (e instanceof DOMException) + ' ' + "
            "(e instanceof Error); } }; "
            "return [name(() => atob('a')), name(() => atob('YQ=')), name(() => atob('Y===')), "
            "name(() => btoa('\\u20ac'))]") ==
        json::parse(R"(["InvalidCharacterError 5 true true","InvalidCharacterError 5 true true",)"
                    R"("InvalidCharacterError 5 true true","InvalidCharacterError 5 true true"])"));
  CHECK(run(f, "return Array.from(atob('gP8='), (c) => c.charCodeAt(0))") ==
        json::parse("[128,255]"));
}

TEST_CASE("crypto gives random values, version 4 UUIDs and SHA digests", "[runtime][web]") {
  PoolFixture f;
  CHECK(run(f,
            "const a = crypto.getRandomValues(new Uint8Array(32)); "
            "const b = crypto.getRandomValues(new Uint32Array(8)); "
            "return [a.some((x) => x !== 0), b.some((x) => x !== 0), a.length]") ==
        json::parse("[true,true,32]"));
  CHECK(
      run(f,
          "const u = crypto.randomUUID(); "
          "return [/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/.test(u),"
          " u !== crypto.randomUUID()]") == json::parse("[true,true]"));
  CHECK(run(f,
            "const name = (f) => { try { f(); return 'none'; } catch (e) { return e.name; } }; "
            "return [name(() => crypto.getRandomValues(new Float64Array(2))), "
            "name(() => crypto.getRandomValues(new Uint8Array(65537))), "
            "name(() => crypto.getRandomValues(new Uint8Array(65536)))]") ==
        json::parse(R"(["TypeMismatchError","QuotaExceededError","none"])"));
  CHECK(run(f,
            "const hex = (b) => Array.from(new Uint8Array(b), "
            "(x) => x.toString(16).padStart(2, '0')).join(''); "
            "const abc = new TextEncoder().encode('abc'); "
            "return [hex(await crypto.subtle.digest('SHA-256', abc)), "
            "hex(await crypto.subtle.digest({name: 'sha-1'}, abc.buffer)), "
            "(await crypto.subtle.digest('SHA-384', abc)).byteLength, "
            "(await crypto.subtle.digest('SHA-512', new DataView(abc.buffer))).byteLength, "
            "await crypto.subtle.digest('MD5', abc).catch((e) => e.name), "
            "await crypto.subtle.digest('SHA-256', 'abc').catch((e) => e.name)]") ==
        json::parse(R"(["ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",)"
                    R"("a9993e364706816aba3e25717850c26c9cd0d89d",48,64,"NotSupportedError",)"
                    R"("TypeError"])"));
}

TEST_CASE("Headers can be made, changed and passed to fetch, a Response's stay immutable",
          "[runtime][web][fetch]") {
  PoolFixture f;
  CHECK(run(f,
            "const h = new Headers([['B', '2'], ['a', '1'], ['b', '3']]); "
            "h.append('Set-Cookie', 'x=1'); h.append('set-cookie', 'y=2'); h.append('X', ' y\\t'); "
            "return [[...h], h.get('b'), h.has('A'), h.getSetCookie()]") ==
        json::parse(R"([[["a","1"],["b","2, 3"],["set-cookie","x=1"],["set-cookie","y=2"],)"
                    R"(["x","y"]],"2, 3",true,["x=1","y=2"]])"));
  // Internal lists have no prototype: a setter on Object.prototype never sees them. A subclass's
  // append does not change how the constructor fills it, and names are checked by get and has.
  CHECK(run(f,
            "let leaked; Object.defineProperty(Object.prototype, '0', {configurable: true, "
            "set(v) { leaked = this; }}); const h = new Headers({'x-a': '1'}); h.append('b', '2'); "
            "h.set('c', '3'); const seen = [...h].length; delete Object.prototype[0]; "
            "class Upper extends Headers { append(n, v) { super.append(n, v.toUpperCase()); } } "
            "return [leaked === undefined, seen, [...new Upper({a: 'x'})]]") ==
        json::parse(R"([true,3,[["a","x"]]])"));
  CHECK(run(f,
            "const name = (f) => { try { f(); return 'none'; } catch (e) { return e.name; } }; "
            "return [name(() => new Headers().get('bad name')), name(() => new Headers().has('')), "
            "name(() => new Response('x').headers.get('a b'))]") ==
        json::parse(R"(["TypeError","TypeError","TypeError"])"));
  CHECK(run(f,
            "const h = new Headers({Accept: 'a', 'X-One': 1}); h.set('accept', 'b'); "
            "h.delete('x-one'); const seen = []; h.forEach((v, k) => seen.push(k + '=' + v)); "
            "return [seen, new Headers(h).get('accept')]") == json::parse(R"([["accept=b"],"b"])"));
  CHECK(
      run(f,
          "const name = (f) => { try { f(); return 'none'; } catch (e) { return e.name; } }; "
          "const h = new Headers(); "
          "return [name(() => h.append('bad name', '1')), name(() => h.append('x', 'a\\nb')), "
          "name(() => h.set('x', '\\u20ac')), name(() => new Headers(null)), "
          "name(() => new Headers([['a']])), name(() => new Headers(5))]") ==
      json::parse(R"(["TypeError","TypeError","TypeError","TypeError","TypeError","TypeError"])"));

  // A Headers goes to fetch as its entries.
  f.host.onOperation(
      [](const std::string&, const json::value&, std::shared_ptr<HostOperation> operation) {
        operation->complete(json::value(
            json::object{{"status", 200},
                         {"statusText", "OK"},
                         {"url", "https://example.com/"},
                         {"headers", json::array{json::array{"content-type", "text/plain"}}},
                         {"bodyBase64", ""}}));
      });
  auto outcome = f.call(makeTool(
      "export default async () => { const r = await fetch(new URL('https://example.com/'), "
      "{headers: new Headers({'X-Key': 'v'})}); "
      "const c = r.clone(); let cloned = 'set'; try { c.headers.set('a', 'b'); } "
      "catch (e) { cloned = e.name; } "
      "try { r.headers.set('a', 'b'); } catch (e) { return [e.name, r.headers.get('content-type'), "
      "r instanceof Response, r.headers instanceof Headers, cloned, c.url, c.type]; } }"));
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(*outcome.result == json::parse(R"(["TypeError","text/plain",true,true,"TypeError",)"
                                       R"("https://example.com/","basic"])"));
  CHECK(f.host.operations() ==
        std::vector<std::string>{
            R"(fetch {"url":"https://example.com/","method":"GET","headers":[["x-key","v"]]})"});
}

TEST_CASE("a Response can be made from text, bytes or JSON", "[runtime][web][fetch]") {
  PoolFixture f;
  CHECK(run(f,
            "const r = new Response('h\\u00e9llo', {status: 201, statusText: 'Made', "
            "headers: {'X-A': '1'}}); "
            "return [r.status, r.statusText, r.ok, [...r.headers], await r.text(), r.bodyUsed]") ==
        json::parse(R"([201,"Made",true,[["content-type","text/plain;charset=UTF-8"],["x-a","1"]],)"
                    R"("h\u00e9llo",true])"));
  CHECK(run(f,
            "const bytes = new Uint8Array([1, 2, 3]); const r = new Response(bytes); bytes[0] = 9; "
            "return [Array.from(new Uint8Array(await r.arrayBuffer())), "
            "r.headers.has('content-type')]") == json::parse("[[1,2,3],false]"));
  CHECK(run(f,
            "const r = Response.json({a: [1]}, {status: 202}); "
            "return [r.status, r.headers.get('content-type'), await r.json()]") ==
        json::parse(R"([202,"application/json",{"a":[1]}])"));
  // clone: the body and headers copied (a clone's headers change alone), not once read.
  CHECK(run(f,
            "const r = new Response('abc', {status: 201, headers: {'X-A': '1'}}); "
            "const c = r.clone(); c.headers.set('x-b', '2'); "
            "const texts = [await r.text(), await c.text()]; "
            "const again = (() => { try { r.clone(); return 'none'; } catch (e) { return e.name; } "
            "})(); "
            "const e = Response.error(); "
            "return [...texts, r.headers.has('x-b'), c.status, c.headers.get('x-a'), "
            "c instanceof Response, again, e.type, e.status, e.ok, [...e.headers]]") ==
        json::parse(R"(["abc","abc",false,201,"1",true,"TypeError","error",0,false,[]])"));
  CHECK(run(f,
            "const r = new Response(); return [await r.text(), await r.text(), r.bodyUsed, "
            "(await new Response(null).arrayBuffer()).byteLength, r.type, r.url]") ==
        json::parse(R"(["","",false,0,"default",""])"));
  CHECK(run(f,
            "const name = (f) => { try { f(); return 'none'; } catch (e) { return e.name; } }; "
            "return [name(() => new Response('x', {status: 204})), "
            "name(() => new Response('x', {status: 99})), "
            "name(() => new Response('x', {statusText: 'a\\nb'})), "
            "name(() => Response.json(undefined)), new Response('x', {status: 200.5}).status, "
            "new Response('x', {status: 65736}).status]") ==
        json::parse(R"(["TypeError","RangeError","TypeError","TypeError",200,200])"));
  CHECK(
      run(f,
          "let reads = 0; const init = {get status() { reads++; return 201; }}; "
          "const r = new Response('x', init); "
          "const form = new Response(new URLSearchParams({a: '1 2'})); "
          "const problem = Response.json({}, {headers: {'Content-Type': "
          "'application/problem+json'}}); "
          "return [reads, r.status, form.headers.get('content-type'), await form.text(), "
          "problem.headers.get('content-type'), new Response('y').headers.get('content-type')]") ==
      json::parse(R"([1,201,"application/x-www-form-urlencoded;charset=UTF-8","a=1+2",)"
                  R"("application/problem+json","text/plain;charset=UTF-8"])"));
}

TEST_CASE("the web globals are lazy, not enumerable, and made once per sandbox", "[runtime][web]") {
  PoolFixture f;
  CHECK(run(f,
            "return Object.keys(globalThis).filter((k) => ['TextEncoder', 'atob', 'crypto', "
            "'URL', 'Headers'].includes(k))") == json::array{});
  auto tool = makeTool(
      "export default () => { const same = globalThis.seen === undefined || "
      "globalThis.seen === TextDecoder; globalThis.seen = TextDecoder; "
      "return [same, typeof TextDecoder, typeof atob, typeof crypto.subtle.digest, "
      "Object.getOwnPropertyDescriptor(globalThis, 'atob').enumerable]; }");
  for (int i = 0; i < 2; ++i) {
    auto outcome = f.call(tool);
    INFO(describe(outcome));
    REQUIRE(outcome.result);
    CHECK(*outcome.result == json::parse(R"([true,"function","function","function",false])"));
  }
  // A tool may replace a global like any other.
  CHECK(run(f, "globalThis.atob = () => 'mine'; return atob('YQ==')") == "mine");
}

TEST_CASE("a tool replacing built-ins cannot break the web globals", "[runtime][web]") {
  PoolFixture f;
  CHECK(run(f,
            "const boom = () => { throw new Error('replaced'); }; "
            "for (const p of [String.prototype, Array.prototype]) { "
            "for (const k of Object.getOwnPropertyNames(p)) { "
            "if (k !== 'constructor' && k !== 'length') { try { p[k] = boom; } catch {} } } } "
            "globalThis.String = boom; globalThis.Promise = boom; globalThis.Uint8Array = boom; "
            "const d = new TextDecoder(); const h = new Headers({A: ' 1 '}); h.append('b', '2'); "
            "return [d.decode(new TextEncoder().encode('ok')), btoa('a'), atob('YQ=='), "
            "crypto.randomUUID().length, h.get('a'), new Response('x').status]") ==
        json::parse(R"(["ok","YQ==","a",36,"1",200])"));
}

TEST_CASE("a text or URLSearchParams body gets the Content-Type browsers give it",
          "[runtime][web][fetch]") {
  PoolFixture f;
  f.host.onOperation(
      [](const std::string&, const json::value&, std::shared_ptr<HostOperation> operation) {
        operation->complete(json::value(json::object{{"status", 204},
                                                     {"statusText", "No Content"},
                                                     {"url", "https://example.com/"},
                                                     {"headers", json::array{}},
                                                     {"bodyBase64", ""}}));
      });
  auto outcome = f.call(makeTool(
      "export default async () => { const url = 'https://example.com/'; "
      "await fetch(url, {method: 'POST', body: 'x'}); "
      "await fetch(url, {method: 'POST', body: new URLSearchParams({a: '1 2', b: '\\u00e9'})}); "
      "await fetch(url, {method: 'PUT', headers: {'Content-Type': 'application/json'}, body: "
      "'{}'}); "
      "await fetch(url, {method: 'POST', body: new Uint8Array([120])}); "
      "return 'sent'; }"));
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(
      f.host.operations() ==
      std::vector<std::string>{
          R"(fetch {"url":"https://example.com/","method":"POST","headers":[["content-type","text/plain;charset=UTF-8"]],"bodyBase64":"eA=="})",
          R"(fetch {"url":"https://example.com/","method":"POST","headers":[["content-type","application/x-www-form-urlencoded;charset=UTF-8"]],"bodyBase64":"YT0xKzImYj0lQzMlQTk="})",
          R"(fetch {"url":"https://example.com/","method":"PUT","headers":[["Content-Type","application/json"]],"bodyBase64":"e30="})",
          R"(fetch {"url":"https://example.com/","method":"POST","headers":[],"bodyBase64":"eA=="})"});
}

TEST_CASE("a huge string is refused before the natives copy it out of the heap",
          "[runtime][web][limits]") {
  PoolFixture f;
  // A rope of 268 million characters costs the heap little; a copy would cost gigabytes.
  CHECK(run(f,
            "const s = 'ab'.repeat(2 ** 27); const name = (f) => { try { f(); return 'none'; } "
            "catch (e) { return e.name; } }; return [name(() => btoa(s)), name(() => atob(s))]") ==
        json::parse(R"(["RangeError","RangeError"])"));
  for (const char* use : {"new TextEncoder().encode(s)", "new Response(s)"}) {
    INFO(use);
    auto outcome =
        f.call(makeTool(std::string("export default () => { const s = 'ab'.repeat(2 ** 27); ") +
                        use + "; return 'copied'; }"));
    INFO(describe(outcome));
    CHECK(errc(outcome) == CallErrc::arrayBufferLimit);
  }
  CHECK(run(f, "return 'still here'") == "still here");
}

TEST_CASE("TextDecoder gives the same text whole, byte by byte and split anywhere",
          "[runtime][web]") {
  // Sequences that end, break or start across chunk boundaries, checked against decodeUtf8.
  const std::vector<std::string> cases{"a\xC3\xA9z",
                                       "\xE2\x82\xAC\xF0\x9F\x98\x80",
                                       "\xE0\x80\x41\xF0\x9F\x98",
                                       "\xED\xA0\x80x",
                                       "\xF4\x90\x80\x80",
                                       "\xC0\xAF\xC3",
                                       "\xF0\x9F\x98\xE2\x82\xAC",
                                       "\xEF\xBB\xBF"
                                       "ab\xE2",
                                       "\x80\xBF\xC2\xC2\xA9",
                                       "\xF1\x80\x80\xE1\x80\xC2\x7F\xFF\xFE",
                                       "plain ascii"};
  json::array inputs;
  for (const auto& bytes : cases) {
    json::array list;
    for (unsigned char c : bytes) list.emplace_back(static_cast<int>(c));
    inputs.emplace_back(std::move(list));
  }
  PoolFixture f;
  auto outcome = f.call(
      makeTool("export default (args) => args.inputs.map((bytes) => {\n"
               "  const all = new Uint8Array(bytes);\n"
               "  const whole = new TextDecoder('utf-8', {ignoreBOM: true}).decode(all);\n"
               "  const ways = [];\n"
               "  let d = new TextDecoder('utf-8', {ignoreBOM: true}); let s = '';\n"
               "  for (const b of bytes) s += d.decode(new Uint8Array([b]), {stream: true});\n"
               "  ways.push(s + d.decode());\n"
               "  for (let at = 0; at <= bytes.length; at++) {\n"
               "    d = new TextDecoder('utf-8', {ignoreBOM: true});\n"
               "    ways.push(d.decode(all.subarray(0, at), {stream: true}) + "
               "d.decode(all.subarray(at)));\n"
               "  }\n"
               "  let fatal; try { fatal = new TextDecoder('utf-8', {fatal: true, ignoreBOM: true})"
               ".decode(all); } catch (e) { fatal = e.name; }\n"
               "  return {whole, same: ways.every((w) => w === whole), fatal};\n"
               "})"),
      json::object{{"inputs", inputs}});
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  const auto& results = outcome.result->as_array();
  REQUIRE(results.size() == cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    INFO("case " << i);
    std::size_t tail = 0;
    const auto expected = decodeUtf8(cases[i], false, false, tail);
    REQUIRE(expected);
    // As UTF-8, the way the result's JSON holds it.
    std::string utf8;
    for (std::size_t k = 0; k < expected->size(); ++k) {
      std::uint32_t c = (*expected)[k];
      if (c >= 0xD800 && c <= 0xDBFF)
        c = 0x10000 + ((c - 0xD800) << 10) + ((*expected)[++k] - 0xDC00);
      if (c < 0x80) {
        utf8 += static_cast<char>(c);
      } else if (c < 0x800) {
        utf8 += static_cast<char>(0xC0 | (c >> 6));
        utf8 += static_cast<char>(0x80 | (c & 0x3F));
      } else if (c < 0x10000) {
        utf8 += static_cast<char>(0xE0 | (c >> 12));
        utf8 += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        utf8 += static_cast<char>(0x80 | (c & 0x3F));
      } else {
        utf8 += static_cast<char>(0xF0 | (c >> 18));
        utf8 += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
        utf8 += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        utf8 += static_cast<char>(0x80 | (c & 0x3F));
      }
    }
    const auto& result = results[i].as_object();
    CHECK(result.at("whole").as_string() == utf8);
    CHECK(result.at("same") == true);
    const bool valid = decodeUtf8(cases[i], true, false, tail).has_value();
    CHECK((result.at("fatal") == "TypeError") == !valid);
  }
}

TEST_CASE("the lazy preludes' iterators inherit the real iterator prototype whatever a tool did",
          "[runtime][web]") {
  PoolFixture f;
  CHECK(run(f,
            "const real = Object.getPrototypeOf(Object.getPrototypeOf([][Symbol.iterator]())); "
            "Object.setPrototypeOf(Object.getPrototypeOf(function* () {}.prototype), {}); "
            "const proto = (it) => Object.getPrototypeOf(Object.getPrototypeOf(it)); "
            "return [proto(new Headers().entries()) === real, "
            "proto(new URLSearchParams().entries()) === real]") == json::parse("[true,true]"));
}

TEST_CASE("DOMException takes a name or options, and URL leaves RegExp's statics alone",
          "[runtime][web][url]") {
  PoolFixture f;
  CHECK(run(f,
            "const a = new DOMException('m', {name: 'AbortError', cause: 7}); "
            "const b = new DOMException('n', 'TimeoutError'); const c = new DOMException(); "
            "return [a.name, a.code, a.cause, a.message, b.name, b.code, c.name, c.message, "
            "a instanceof Error, Object.prototype.toString.call(a)]") ==
        json::parse(R"(["AbortError",20,7,"m","TimeoutError",23,"Error","",true,)"
                    R"("[object DOMException]"])"));
  CHECK(
      run(f,
          "/(x)y/.exec('xy'); new URL('http://a/b/../c?d=%41#e').href; "
          "new URLSearchParams('a=%41&b=c+d').toString(); return [RegExp.$1, RegExp.lastMatch]") ==
      json::parse(R"(["x","xy"])"));
}
