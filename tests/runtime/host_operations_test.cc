// Host operations end to end, in process, with real isolates: fetch and its Response, ctx.popup,
// storage and secrets through CapabilityHost::startOperation; completions from other threads,
// before and after the call's end; aborts; wall-clock pauses; and what a tool cannot do to the
// host's objects by replacing intrinsics.
#include "runtime/call_state.h"
#include "runtime/base64.h"
#include "tests/runtime/runtime_test_support.h"

#include <catch2/catch.hpp>

#include <boost/json/parse.hpp>

#include <thread>

using namespace toolhost::runtime;
using namespace toolhost::runtime::testing;
namespace json = boost::json;
using std::chrono::milliseconds;

namespace {

json::object limits(json::object values) { return json::object{{"limits", std::move(values)}}; }

// Runs functions on threads of their own after a delay, as a host's I/O would; joins them when
// destroyed (declare it before the pool to let completions outlive the pool).
class Later {
 public:
  Later() = default;
  Later(const Later&) = delete;
  Later& operator=(const Later&) = delete;
  ~Later() { join(); }

  void after(milliseconds delay, std::function<void()> fn) {
    std::lock_guard lock(mutex_);
    threads_.emplace_back([delay, fn = std::move(fn)] {
      std::this_thread::sleep_for(delay);
      fn();
    });
  }
  void join() {
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mutex_);
      threads.swap(threads_);
    }
    for (auto& thread : threads) thread.join();
  }

 private:
  std::mutex mutex_;
  std::vector<std::thread> threads_;
};

json::value fetchReply(int status, std::string_view body, json::array headers = {},
                       std::string statusText = "OK", std::string url = "https://api.example/") {
  return json::object{{"status", status},
                      {"statusText", statusText},
                      {"url", url},
                      {"headers", std::move(headers)},
                      {"bodyBase64", base64Encode(body)}};
}

using Answer = std::function<HostOpResult(const json::value& request)>;

// The host answers every fetch with `answer(request)` from another thread after `delay`; other
// kinds are refused at once.
void answerFetch(PoolFixture& f, Later& later, milliseconds delay, Answer answer) {
  f.host.onOperation([&later, delay, answer](const std::string& kind, const json::value& request,
                                             std::shared_ptr<HostOperation> operation) {
    if (kind != "fetch") {
      operation->complete(HostOpFailure{"not-authorized", kind + " is not granted"});
      return;
    }
    later.after(delay, [operation, answer, request] { operation->complete(answer(request)); });
  });
}

// Operations the host keeps and never completes by itself; counts aborts.
struct HeldOperations {
  std::mutex mutex;
  std::vector<std::shared_ptr<HostOperation>> operations;
  std::atomic<int> aborts{0};

  void hold(PoolFixture& f) {
    f.host.onOperation(
        [this](const std::string&, const json::value&, std::shared_ptr<HostOperation> operation) {
          // As a host does: cancel, then complete at once (which the ended call ignores).
          operation->onAbort([this, weak = std::weak_ptr<HostOperation>(operation)] {
            ++aborts;
            if (auto self = weak.lock()) self->complete(HostOpFailure{"cancelled", "aborted"});
          });
          std::lock_guard lock(mutex);
          operations.push_back(std::move(operation));
        });
  }
  std::vector<std::shared_ptr<HostOperation>> all() {
    std::lock_guard lock(mutex);
    return operations;
  }
};

std::string text(const json::value& value) { return std::string(value.as_string()); }

}  // namespace

TEST_CASE("base64 encodes and strictly decodes standard padded base64", "[ops][base64]") {
  const std::pair<std::string, std::string> cases[] = {
      {"", ""},        {"f", "Zg=="},        {"fo", "Zm8="},
      {"foo", "Zm9v"}, {"foob", "Zm9vYg=="}, {std::string("\0\xff\xfe", 3), "AP/+"},
      {"hé", "aMOp"},  {"\xfb\xff", "+/8="},
  };
  for (const auto& [bytes, encoded] : cases) {
    INFO(encoded);
    CHECK(base64Encode(bytes) == encoded);
    auto size = base64DecodedSize(encoded);
    REQUIRE(size);
    REQUIRE(*size == bytes.size());
    std::string decoded(*size, '\0');
    CHECK(base64Decode(encoded, reinterpret_cast<std::uint8_t*>(decoded.data())));
    CHECK(decoded == bytes);
  }
  for (const char* bad : {"Zg=", "Zg", "Z===", "Zm9v\n", "Zm-_", "Zg==Zg==", "Z=g="}) {
    INFO(bad);
    auto size = base64DecodedSize(bad);
    std::string out(size.value_or(0) + 4, '\0');
    CHECK((!size || !base64Decode(bad, reinterpret_cast<std::uint8_t*>(out.data()))));
  }
}

TEST_CASE("fetch resolves to a Response answered from another thread", "[ops][fetch]") {
  Later later;
  PoolFixture f;
  answerFetch(f, later, milliseconds(50), [](const json::value&) -> HostOpResult {
    return fetchReply(201, R"({"hello":"world","n":[1,2]})",
                      json::array{json::array{"content-type", "application/json"},
                                  json::array{"x-multi", "a"}, json::array{"set-cookie", "a=1"},
                                  json::array{"X-Multi", "b"}, json::array{"set-cookie", "b=2"}},
                      "Created", "https://api.example/items?q=1");
  });
  auto tool = makeTool(R"(export default async (args, ctx) => {
      const r = await fetch('https://api.example/items?q=1');
      const h = r.headers;
      const seen = [];
      h.forEach((value, name, self) => seen.push([name, value, self === h]));
      const it = h.entries();
      const entries = [];
      for (let step = it.next(); !step.done; step = it.next()) entries.push(step.value);
      const before = r.bodyUsed;
      const pending = r.json();
      const body = await pending;
      const errors = [];
      for (const use of [() => r.text(), () => r.json(), () => r.arrayBuffer()]) {
        try { await use(); errors.push('resolved'); } catch (e) { errors.push(`${e.name}: ${e.message}`); }
      }
      const made = new r.constructor(); const illegal = [made.status, r instanceof Response];
      let immutable; try { h.set('a', 'b'); } catch (e) { immutable = e.name; }
      return {
        ok: r.ok, status: r.status, statusText: r.statusText, url: r.url,
        redirected: r.redirected, type: r.type,
        contentType: h.get('Content-Type'), multi: h.get('X-MULTI'), cookies: h.get('set-cookie'),
        missing: h.get('x-missing'), has: [h.has('x-multi'), h.has('X-Multi'), h.has('nope')],
        keys: [...h.keys()], values: [...h.values()], spread: [...h], entries, seen,
        setCookie: h.getSetCookie(), sameHeaders: r.headers === h,
        iteratorIsSelf: it[Symbol.iterator]() === it,
        tags: [Object.prototype.toString.call(h), Object.prototype.toString.call(r)],
        promise: pending instanceof Promise,
        before, after: r.bodyUsed, body, errors, illegal, immutable,
        globals: [typeof Response, typeof Headers],
      };
    })");
  auto outcome = f.call(tool);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(*outcome.result == json::parse(R"({
      "ok": true, "status": 201, "statusText": "Created", "url": "https://api.example/items?q=1",
      "redirected": false, "type": "basic",
      "contentType": "application/json", "multi": "a, b", "cookies": "a=1, b=2", "missing": null,
      "has": [true, true, false],
      "keys": ["content-type", "set-cookie", "set-cookie", "x-multi"],
      "values": ["application/json", "a=1", "b=2", "a, b"],
      "spread": [["content-type", "application/json"], ["set-cookie", "a=1"],
                 ["set-cookie", "b=2"], ["x-multi", "a, b"]],
      "entries": [["content-type", "application/json"], ["set-cookie", "a=1"],
                  ["set-cookie", "b=2"], ["x-multi", "a, b"]],
      "seen": [["content-type", "application/json", true], ["set-cookie", "a=1", true],
               ["set-cookie", "b=2", true], ["x-multi", "a, b", true]],
      "setCookie": ["a=1", "b=2"], "sameHeaders": true, "iteratorIsSelf": true,
      "tags": ["[object Headers]", "[object Response]"], "promise": true,
      "before": false, "after": true, "body": {"hello": "world", "n": [1, 2]},
      "errors": ["TypeError: body already used", "TypeError: body already used",
                 "TypeError: body already used"],
      "illegal": [200, true], "immutable": "TypeError",
      "globals": ["function", "function"]
    })"));
  CHECK(f.host.operations() ==
        std::vector<std::string>{
            R"(fetch {"url":"https://api.example/items?q=1","method":"GET","headers":[]})"});
  CHECK(outcome.usage.wallMs >= 45);
}

TEST_CASE("response bodies: bytes arrive intact, text() decodes UTF-8 with replacement",
          "[ops][fetch]") {
  Later later;
  PoolFixture f;
  std::string allBytes;
  for (int i = 0; i < 256; ++i) allBytes += static_cast<char>(i);
  answerFetch(f, later, milliseconds(5), [&](const json::value& request) -> HostOpResult {
    const std::string url = text(request.at("url"));
    if (url.ends_with("/text")) {
      // BOM, é, a lone 0xFF, a truncated 3-byte sequence, a 4-byte emoji.
      return fetchReply(200, "\xEF\xBB\xBFh\xC3\xA9llo \xFF|\xE2\x82|\xF0\x9F\x98\x80");
    }
    if (url.ends_with("/empty")) return fetchReply(204, "");
    if (url.ends_with("/bad-json")) return fetchReply(200, "{not json");
    return fetchReply(200, allBytes);
  });
  auto tool = makeTool(R"(export default async () => {
      const text = await (await fetch('https://a.example/text')).text();
      const buffer = await (await fetch('https://a.example/bytes')).arrayBuffer();
      const bytesAsText = await (await fetch('https://a.example/bytes')).text();
      const empty = await fetch('https://a.example/empty');
      let badJson;
      try { await (await fetch('https://a.example/bad-json')).json(); } catch (e) { badJson = e.name; }
      return {
        text, codes: Array.from(text, (c) => c.codePointAt(0)),
        isArrayBuffer: buffer instanceof ArrayBuffer, length: buffer.byteLength,
        bytes: Array.from(new Uint8Array(buffer)),
        replaced: bytesAsText.length,
        empty: [empty.status, empty.ok, await empty.text()], badJson,
      };
    })");
  auto outcome = f.call(tool);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  const auto& r = outcome.result->as_object();
  CHECK(text(r.at("text")) == "h\xC3\xA9llo \xEF\xBF\xBD|\xEF\xBF\xBD|\xF0\x9F\x98\x80");
  CHECK(r.at("codes") ==
        json::parse("[104,233,108,108,111,32,65533,124,65533,124,128512]"));  // BOM dropped
  CHECK(r.at("isArrayBuffer") == true);
  CHECK(r.at("length") == 256);
  json::array expected;
  for (int i = 0; i < 256; ++i) expected.push_back(i);
  CHECK(r.at("bytes") == expected);
  CHECK(r.at("replaced").as_int64() == 128 + 128);  // ASCII as is; each byte >= 0x80 -> U+FFFD
  CHECK(r.at("empty") == json::parse(R"([204, true, ""])"));
  CHECK(r.at("badJson") == "SyntaxError");
}

TEST_CASE("fetch hands the host exactly the request shape", "[ops][fetch]") {
  Later later;
  PoolFixture f;
  answerFetch(f, later, milliseconds(1),
              [](const json::value&) -> HostOpResult { return fetchReply(200, ""); });
  auto tool = makeTool(R"(export default async (args, ctx) => {
      const send = async (input, init) => {
        try { return (await fetch(input, init)).status; }
        catch (e) { return `${e.name} ${e.code}: ${e.message}`; }
      };
      const bytes = new Uint8Array([0, 1, 2, 253, 254, 255]);
      return [
        await send('https://a.example/1'),
        await send({url: 'https://a.example/2'},
                   {method: 'POST', headers: {'Content-Type': 'text/plain', 'X-Num': 5}, body: 'h\u00e9'}),
        await send({href: 'https://a.example/3'},
                   {method: 'put', headers: [['X-A', '1'], ['x-a', '2']], body: bytes}),
        await send('https://a.example/4',
                   {method: 'POST', headers: new Map([['X-M', 'm']]), body: bytes.buffer}),
        await send('https://a.example/5',
                   {method: 'PATCH', headers: {entries() { return [['X-E', 'e']][Symbol.iterator](); }},
                    body: new DataView(bytes.buffer, 1, 3)}),
        await send('https://a.example/6', {method: 'DELETE', body: null, redirect: 'follow',
                                           credentials: 'include', mode: 'cors', cache: 'no-store'}),
        await ctx.fetch('https://a.example/7', {method: 'POST', body: bytes.subarray(3)}).then((r) => r.status),
        await send('https://a.example/8', {method: 'POST', body: ''}),
        // Refused before the host hears of them.
        await send(42),
        await send({}),
        await send('https://a.example/x', 'init'),
        await send('https://a.example/x', {headers: [['only-name']]}),
        await send('https://a.example/x', {headers: 'x-a: 1'}),
        await send('https://a.example/x', {method: 'POST', body: {}}),
        await send('https://a.example/x', {body: 'x'}),
        await send('https://a.example/x', {method: 'head', body: new Uint8Array(1)}),
        await send('https://a.example/x', {method: 42}),
        await send('https://a.example/x', {redirect: 'follow-me'}),
        await send('https://a.example/x', {get headers() { throw new RangeError('from a getter'); }}),
      ];
    })");
  auto outcome = f.call(tool);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  const auto& r = outcome.result->as_array();
  REQUIRE(r.size() == 19);
  for (std::size_t i = 0; i < 8; ++i) CHECK(r[i] == 200);
  const char* refusals[] = {
      "TypeError invalid-argument: fetch(input, init): input must be a URL string or an object "
      "with a string url or href",
      "TypeError invalid-argument: fetch(input, init): input must be a URL string or an object "
      "with a string url or href",
      "TypeError invalid-argument: fetch(input, init): init must be an object",
      "TypeError invalid-argument: fetch: each header in a list must be a [name, value] pair",
      "TypeError invalid-argument: fetch: init.headers must be an object, an array of [name, "
      "value] pairs, or something with entries()",
      "TypeError invalid-argument: fetch: init.body must be a string, an ArrayBuffer, a "
      "TypedArray or DataView, a URLSearchParams, or null",
      "TypeError invalid-argument: fetch: a GET request cannot have a body",
      "TypeError invalid-argument: fetch: a head request cannot have a body",
      "TypeError invalid-argument: fetch: init.method must be a string",
      "TypeError invalid-argument: fetch: init.redirect must be \"follow\", \"manual\" or "
      "\"error\"",
      "RangeError undefined: from a getter",
  };
  for (std::size_t i = 0; i < std::size(refusals); ++i) {
    INFO(i);
    CHECK(text(r[8 + i]) == refusals[i]);
  }
  CHECK(
      f.host.operations() ==
      std::vector<std::string>{
          R"(fetch {"url":"https://a.example/1","method":"GET","headers":[]})",
          R"(fetch {"url":"https://a.example/2","method":"POST","headers":[["Content-Type","text/plain"],["X-Num","5"]],"bodyBase64":"aMOp"})",
          R"(fetch {"url":"https://a.example/3","method":"put","headers":[["X-A","1"],["x-a","2"]],"bodyBase64":"AAEC/f7/"})",
          R"(fetch {"url":"https://a.example/4","method":"POST","headers":[["X-M","m"]],"bodyBase64":"AAEC/f7/"})",
          R"(fetch {"url":"https://a.example/5","method":"PATCH","headers":[["X-E","e"]],"bodyBase64":"AQL9"})",
          R"(fetch {"url":"https://a.example/6","method":"DELETE","headers":[],"redirect":"follow"})",
          R"(fetch {"url":"https://a.example/7","method":"POST","headers":[],"bodyBase64":"/f7/"})",
          R"(fetch {"url":"https://a.example/8","method":"POST","headers":[["content-type","text/plain;charset=UTF-8"]],"bodyBase64":""})",
      });
}

TEST_CASE("host failures reject with an Error of the sandbox's realm carrying the code",
          "[ops][fetch]") {
  Later later;
  PoolFixture f;
  f.host.onOperation([&later](const std::string&, const json::value& request,
                              std::shared_ptr<HostOperation> operation) {
    const std::string url = text(request.at("url"));
    const std::string code = url.substr(url.rfind('/') + 1);
    if (code == "sync") {  // synchronously, inside startOperation, twice: the first counts
      operation->complete(HostOpFailure{"destination-blocked", "127.0.0.1 is loopback"});
      operation->complete(fetchReply(200, "ignored"));
      return;
    }
    if (code == "malformed") {
      operation->complete(json::value(json::object{{"status", "teapot"}}));
      return;
    }
    later.after(milliseconds(10), [operation, code] {
      operation->complete(HostOpFailure{code, "the request failed: " + code});
      operation->complete(fetchReply(200, "ignored"));  // exactly once: ignored
    });
  });
  auto tool = makeTool(R"(export default async () => {
      const OriginalError = Error;
      globalThis.Error = function FakeError() {};
      const out = [];
      for (const code of ['sync', 'timeout', 'dns-failed', 'response-too-large', 'malformed']) {
        try { await fetch('https://fail.example/' + code); out.push('resolved'); }
        catch (e) {
          out.push({code: e.code, message: e.message, name: e.name,
                    realm: e instanceof OriginalError && Object.getPrototypeOf(e) === OriginalError.prototype});
        }
      }
      return out;
    })");
  auto outcome = f.call(tool);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(*outcome.result == json::parse(R"([
      {"code": "destination-blocked", "message": "127.0.0.1 is loopback", "name": "Error", "realm": true},
      {"code": "timeout", "message": "the request failed: timeout", "name": "Error", "realm": true},
      {"code": "dns-failed", "message": "the request failed: dns-failed", "name": "Error", "realm": true},
      {"code": "response-too-large", "message": "the request failed: response-too-large", "name": "Error", "realm": true},
      {"code": "failed", "message": "the host's reply to fetch is malformed: status is not an HTTP status code", "name": "Error", "realm": true}
    ])"));
}

TEST_CASE("a tool that does not await its fetch still waits for it before the call ends",
          "[ops][fetch]") {
  Later later;
  PoolFixture f;
  answerFetch(f, later, milliseconds(200),
              [](const json::value&) -> HostOpResult { return fetchReply(204, ""); });
  auto tool = makeTool(R"(export default (args, ctx) => {
      const out = {started: true};
      fetch('https://slow.example/').then((r) => { out.status = r.status; });
      return out;
    })");
  auto outcome = f.call(tool);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  // The result is read when the operation finished: its continuation ran first.
  CHECK(*outcome.result == json::parse(R"({"started": true, "status": 204})"));
  CHECK(outcome.usage.wallMs >= 190);
  SECTION("also when the tool threw: the error is the tool's, after the operation finished") {
    auto thrower = makeTool(R"(export default async () => {
        fetch('https://slow.example/');
        throw new RangeError('gave up');
      })");
    auto failed = f.call(thrower);
    INFO(describe(failed));
    REQUIRE(errc(failed) == CallErrc::toolThrew);
    CHECK(failed.result.error().toolError.at("message") == "gave up");
    CHECK(failed.usage.wallMs >= 190);
  }
}

TEST_CASE("onAbort runs when a call ends with the operation outstanding", "[ops][abort]") {
  Later later;
  PoolFixture f;
  HeldOperations held;
  held.hold(f);
  SECTION("cancelled: the call ends promptly, without waiting for the completion") {
    auto tool =
        makeTool("export default async () => (await fetch('https://never.example/')).status",
                 limits({{"wallMs", 30000}}));
    auto outcome = callAndCancel(f.pool, tool, milliseconds(150));
    INFO(describe(outcome));
    CHECK(errc(outcome) == CallErrc::cancelled);
    CHECK(outcome.usage.wallMs < 10000);  // not the 30 s wall limit
    CHECK(held.aborts == 1);
  }
  SECTION("timed out") {
    auto tool = makeTool(
        "export default async (args, ctx) => ctx.popup({kind: 'origin', url: "
        "'https://x.example/'})",
        limits({{"wallMs", 300}}));
    auto outcome = f.call(tool);
    INFO(describe(outcome));
    CHECK(errc(outcome) == CallErrc::timeout);
    CHECK(outcome.usage.wallMs >= 290);
    CHECK(outcome.usage.wallMs < 10000);  // the popup never answers
    CHECK(held.aborts == 1);
  }
  SECTION("the promise settled with an operation pending, then the deadline cut it short") {
    auto tool = makeTool(
        "export default (args, ctx) => { ctx.storage.set('k', 1); fetch('https://x.example/'); "
        "return 'returned'; }",
        limits({{"wallMs", 300}}));
    auto outcome = f.call(tool);
    INFO(describe(outcome));
    CHECK(errc(outcome) == CallErrc::timeout);
    CHECK(held.aborts == 2);
  }
  SECTION("the pool shut down") {
    Later late;
    boost::asio::io_context io;  // outlives the pool: the outcome is delivered to it
    std::optional<CallOutcome> out;
    FakeHost host;
    HeldOperations localHeld;
    host.onOperation([&localHeld](const std::string&, const json::value&,
                                  std::shared_ptr<HostOperation> operation) {
      operation->onAbort([&localHeld] { ++localHeld.aborts; });
      std::lock_guard lock(localHeld.mutex);
      localHeld.operations.push_back(std::move(operation));
    });
    {
      SandboxPool pool(testConfig(), host);
      json::object args;
      boost::asio::co_spawn(
          io, pool.call(makeTool("export default () => fetch('https://x.example/')"), args, {}),
          [&](std::exception_ptr, CallOutcome outcome) { out = std::move(outcome); });
      io.run_for(milliseconds(100));
      REQUIRE(localHeld.all().size() == 1);
      CHECK(localHeld.aborts == 0);
    }  // the destructor cancels the call, which aborts its operation
    CHECK(localHeld.aborts == 1);
    for (const auto& operation : localHeld.all()) {
      late.after(milliseconds(20), [operation] { operation->complete(fetchReply(200, "")); });
    }
    io.restart();
    io.run();
    late.join();
    REQUIRE(out);
    CHECK(errc(*out) == CallErrc::cancelled);
  }
  // After the end, the host's calls are harmless: complete() is dropped and pause and resume do
  // nothing. Each operation was completed by its own abort, so a new abort function never runs.
  for (const auto& operation : held.all()) {
    std::atomic<bool> ran{false};
    operation->onAbort([&ran] { ran = true; });
    CHECK_FALSE(ran);
    later.after(milliseconds(10), [operation] {
      operation->pauseWallClock();
      operation->resumeWallClock();
      operation->complete(fetchReply(200, "late"));
    });
  }
  later.join();
  // The pool is healthy afterwards.
  auto healthy = f.call(makeTool("export default () => 'still here'"));
  CHECK(healthy.result);
}

TEST_CASE("completions racing the end of a call, or arriving after the pool is gone, are dropped",
          "[ops][abort]") {
  Later later;  // outlives the pool: some completions come after it
  boost::asio::io_context io;
  std::optional<CallOutcome> last;
  std::vector<std::shared_ptr<HostOperation>> kept, outstanding;
  std::mutex keptMutex;
  {
    PoolFixture f;
    f.host.onOperation(
        [&](const std::string&, const json::value&, std::shared_ptr<HostOperation> operation) {
          {
            std::lock_guard lock(keptMutex);
            kept.push_back(operation);
          }
          later.after(milliseconds(20), [operation] {
            operation->complete(fetchReply(200, std::string(64 * 1024, 'x')));
          });
        });
    auto tool = makeTool(
        "export default async () => { const rs = await Promise.all([fetch('https://a.example/'), "
        "fetch('https://b.example/')]); return rs.length; }",
        limits({{"wallMs", 30000}}));
    int completed = 0, cancelled = 0;
    for (int i = 0; i < 20; ++i) {
      // The cancel lands around the time the completions do: before, between or after them.
      auto outcome = callAndCancel(f.pool, tool, milliseconds(18 + i % 5));
      INFO(describe(outcome));
      if (outcome.result) {
        CHECK(*outcome.result == 2);
        ++completed;
      } else {
        CHECK(errc(outcome) == CallErrc::cancelled);
        ++cancelled;
      }
    }
    // Either outcome is right; which one depends on the race (the checks are above).
    WARN(completed << " completed, " << cancelled << " cancelled");
    // Two more outstanding when the pool goes, held by the host past it.
    f.host.onOperation(
        [&](const std::string&, const json::value&, std::shared_ptr<HostOperation> operation) {
          std::lock_guard lock(keptMutex);
          outstanding.push_back(std::move(operation));
        });
    json::object args;
    boost::asio::co_spawn(
        io, f.pool.call(tool, args, {}),
        [&](std::exception_ptr, CallOutcome outcome) { last = std::move(outcome); });
    io.run_for(milliseconds(100));
    CHECK_FALSE(last);
  }  // the pool, then the host, are destroyed with two operations outstanding
  io.restart();
  io.run();
  REQUIRE(last);
  CHECK(errc(*last) == CallErrc::cancelled);
  std::lock_guard lock(keptMutex);
  REQUIRE(outstanding.size() == 2);
  for (const auto& operation : outstanding) {
    // Never completed, and its call is gone: an abort function registered now runs at once.
    bool ran = false;
    operation->onAbort([&ran] { ran = true; });
    CHECK(ran);
  }
  kept.insert(kept.end(), outstanding.begin(), outstanding.end());
  for (const auto& operation : kept) {
    later.after(milliseconds(5), [operation] {
      operation->pauseWallClock();
      operation->complete(fetchReply(200, "after the pool"));
      operation->resumeWallClock();
      operation->onAbort([] {});
    });
  }
  later.join();
  SUCCEED("no crash, no use after free (run under ASan)");
}

TEST_CASE("a paused wall clock moves the call's deadline", "[ops][pause]") {
  Later later;
  PoolFixture f;
  bool pause = true;
  int answerAfterMs = 600;
  f.host.onOperation(
      [&](const std::string&, const json::value&, std::shared_ptr<HostOperation> operation) {
        // As the policy engine does before it asks a person.
        if (pause) operation->pauseWallClock();
        later.after(milliseconds(answerAfterMs), [operation] {
          operation->resumeWallClock();
          operation->complete(fetchReply(200, "approved"));
        });
      });
  // After the pause, a segment spins 150 ms: it must run under the moved deadline.
  auto tool = makeTool(R"(export default async () => {
      const text = await (await fetch('https://prompted.example/')).text();
      const end = Date.now() + 150; while (Date.now() < end) {}
      return text;
    })",
                       // Well under the 600 ms pause, with room for a loaded machine (asan).
                       limits({{"wallMs", 450}}));
  SECTION("paused for 600 ms, a 450 ms call still succeeds") {
    auto outcome = f.call(tool);
    INFO(describe(outcome));
    REQUIRE(outcome.result);
    CHECK(*outcome.result == "approved");
    CHECK(outcome.usage.wallMs >= 740);
  }
  SECTION("the time after the pause still counts") {
    auto slow = makeTool(R"(export default async () => {
        await fetch('https://prompted.example/');
        for (;;) {}
      })",
                         limits({{"wallMs", 300}, {"cpuMs", 10000}}));
    auto outcome = f.call(slow);
    INFO(describe(outcome));
    CHECK(errc(outcome) == CallErrc::timeout);
    CHECK(outcome.usage.wallMs < 1500);
  }
  SECTION("without the pause, it times out") {
    pause = false;
    answerAfterMs = 3000;
    auto outcome = f.call(tool);
    INFO(describe(outcome));
    CHECK(errc(outcome) == CallErrc::timeout);
    CHECK(outcome.usage.wallMs < 2900);  // at its deadline, not when the answer came
  }
}

TEST_CASE("a tool replacing intrinsics cannot break or subvert Response and Headers",
          "[ops][fetch][safety]") {
  Later later;
  PoolFixture f;
  answerFetch(f, later, milliseconds(5), [](const json::value&) -> HostOpResult {
    return fetchReply(200, R"({"a":[1,2]})",
                      json::array{json::array{"content-type", "application/json"},
                                  json::array{"x-multi", "1"}, json::array{"x-multi", "2"}});
  });
  auto tool = makeTool(R"(export default async () => {
      const OriginalTypeError = TypeError;
      const iterator = Symbol.iterator;
      let leaked = 0;
      Reflect.defineProperty(Array.prototype, '0', {
        get() { leaked++; return 'tampered'; }, set(v) { leaked++; }, configurable: true });
      Reflect.defineProperty(Object.prototype, 'get', { get() { leaked++; return () => 'tampered'; }, configurable: true });
      Reflect.defineProperty(Object.prototype, 'set', { get() { leaked++; return () => {}; }, configurable: true });
      Object.freeze = Object.defineProperty = Object.setPrototypeOf = Object.getPrototypeOf =
          () => { throw new Error('tampered'); };
      JSON.parse = () => 'tampered';
      for (const name of ['map', 'forEach', 'push', 'join', 'slice', 'concat', 'sort', 'entries', 'keys', 'values']) {
        Array.prototype[name] = function () { throw new Error('tampered Array.prototype.' + name); };
      }
      const arrayIterator = Reflect.getPrototypeOf([][iterator]());
      arrayIterator.next = () => ({value: 'tampered', done: false});
      Reflect.getPrototypeOf(arrayIterator)[iterator] = () => { throw new Error('tampered'); };
      Array.prototype[iterator] = function* () { yield 'tampered'; };
      String.prototype.toLowerCase = String.prototype.toUpperCase = () => 'tampered';
      Function.prototype.call = Function.prototype.apply = Function.prototype.bind = () => 'tampered';
      Reflect.apply = () => 'tampered';
      globalThis.TypeError = function FakeTypeError() {};
      globalThis.Symbol = function FakeSymbol() {};
      globalThis.String = () => 'tampered';
      globalThis.Error = function FakeError() {};

      const r = await fetch('https://api.example/');
      const h = r.headers;
      let keys = '';
      const it = h.keys();
      for (let s = it.next(); s.done !== true; s = it.next()) keys += s.value + ';';
      let each = '';
      h.forEach((v, n) => { each += n + '=' + v + ';'; });
      let forOf = '';
      for (const entry of h) forOf += entry[0] + '=' + entry[1] + ';';
      let tampering = '';
      const proto = Reflect.getPrototypeOf(h);
      try { proto.get = () => 'evil'; } catch (e) { tampering += e.name === 'TypeError' ? 'frozen;' : e.name; }
      try { Reflect.getPrototypeOf(r).text = () => 'evil'; } catch (e) { tampering += 'frozen;'; }
      const data = await r.json();
      let second = '';
      try { await r.arrayBuffer(); } catch (e) { second = (e instanceof OriginalTypeError) + ':' + e.message; }
      return {status: r.status, ok: r.ok, type: h.get('CONTENT-TYPE'), multi: h.get('X-Multi'),
              has: h.has('X-MULTI'), keys, each, forOf, tampering, a0: data.a.length, data, second, leaked};
    })");
  auto outcome = f.call(tool);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(*outcome.result == json::parse(R"({
      "status": 200, "ok": true, "type": "application/json", "multi": "1, 2", "has": true,
      "keys": "content-type;x-multi;", "each": "content-type=application/json;x-multi=1, 2;",
      "forOf": "content-type=application/json;x-multi=1, 2;", "tampering": "frozen;frozen;",
      "a0": 2, "data": {"a": [1, 2]}, "second": "true:body already used", "leaked": 0
    })"));
}

TEST_CASE("a response body counts against the ArrayBuffer limit", "[ops][fetch][limits]") {
  Later later;
  PoolFixture f;
  answerFetch(f, later, milliseconds(5), [](const json::value& request) -> HostOpResult {
    const std::size_t size =
        text(request.at("url")).ends_with("/large") ? 6 * 1024 * 1024 : 1024 * 1024;
    return fetchReply(200, std::string(size, 'z'));
  });
  const char* source = R"(export default async (args) => {
      const buffer = await (await fetch('https://a.example/' + args.size)).arrayBuffer();
      return buffer.byteLength;
    })";
  auto tool = makeTool(source, limits({{"arrayBufferMb", 4}}));
  auto small = f.call(tool, {{"size", "small"}});
  INFO(describe(small));
  REQUIRE(small.result);
  CHECK(*small.result == 1024 * 1024);
  CHECK(small.usage.heapPeakBytes >= 1024u * 1024);
  auto large = f.call(tool, {{"size", "large"}});
  INFO(describe(large));
  CHECK(errc(large) == CallErrc::arrayBufferLimit);
  CHECK(f.call(makeTool("export default () => 'still here'")).result);
}

TEST_CASE("ctx.popup checks its request and resolves with the host's answer", "[ops][popup]") {
  Later later;
  PoolFixture f;
  f.host.onOperation([&later](const std::string& kind, const json::value& request,
                              std::shared_ptr<HostOperation> operation) {
    (void)kind;
    json::value answer = request.at("kind") == "custom-html"
                             ? json::parse(R"({"clicked":"ok","values":[1,"two",null]})")
                             : json::value("done");
    later.after(milliseconds(10), [operation, answer] { operation->complete(answer); });
  });
  auto tool = makeTool(R"(export default async (args, ctx) => {
      const refused = [];
      for (const request of [undefined, 'https://x.example/', {}, {kind: 'origin'},
                             {kind: 'custom-html', html: 5}, {kind: 'other', url: 'https://x.example/'},
                             {url: 'https://x.example/'}, null]) {
        try { await ctx.popup(request); refused.push('resolved'); }
        catch (e) { refused.push(e instanceof TypeError && e.code === 'invalid-argument'); }
      }
      const html = await ctx.popup({kind: 'custom-html', html: '<b>hi</b>', extra: 'dropped'});
      const origin = await ctx.popup({kind: 'origin', url: 'https://example.com/'});
      return {refused, html, origin};
    })");
  auto outcome = f.call(tool);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(*outcome.result == json::parse(R"({
      "refused": [true, true, true, true, true, true, true, true],
      "html": {"clicked": "ok", "values": [1, "two", null]}, "origin": "done"})"));
  CHECK(f.host.operations() ==
        std::vector<std::string>{R"(popup {"kind":"custom-html","html":"<b>hi</b>"})",
                                 R"(popup {"kind":"origin","url":"https://example.com/"})"});
}

TEST_CASE("storage and secrets are operations, the default host refuses them", "[ops][storage]") {
  PoolFixture f;
  auto tool = makeTool(R"(export default async (args, ctx) => {
      const out = [];
      for (const use of [() => ctx.storage.get('k'), () => ctx.storage.set('k', {a: [1, 'x']}),
                         () => ctx.storage.delete('k'), () => ctx.storage.list(),
                         () => ctx.secret('api_key'), () => ctx.storage.get(1), () => ctx.secret(),
                         () => ctx.storage.set('k', () => 1)]) {
        try { out.push({value: await use()}); } catch (e) { out.push(`${e.name} ${e.code}`); }
      }
      return out;
    })");
  SECTION("refused as not-authorized by the default host") {
    auto outcome = f.call(tool);
    INFO(describe(outcome));
    REQUIRE(outcome.result);
    CHECK(*outcome.result == json::parse(R"([
        "Error not-authorized", "Error not-authorized", "Error not-authorized",
        "Error not-authorized", "Error not-authorized", "TypeError invalid-argument",
        "TypeError invalid-argument", "TypeError invalid-argument"])"));
  }
  SECTION("answered by a host that grants them") {
    f.host.onOperation([](const std::string& kind, const json::value& request,
                          std::shared_ptr<HostOperation> operation) {
      if (kind == "secret") {
        operation->complete(json::value("{{secret:api_key}}"));
      } else if (request.at("op") == "list") {
        operation->complete(json::parse(R"(["k"])"));
      } else if (request.at("op") == "get") {
        operation->complete(json::parse(R"({"a":[1,"x"]})"));
      } else {
        operation->complete(json::value(nullptr));
      }
    });
    auto outcome = f.call(tool);
    INFO(describe(outcome));
    REQUIRE(outcome.result);
    CHECK(*outcome.result == json::parse(R"([
        {"value": {"a": [1, "x"]}}, {"value": null}, {"value": null}, {"value": ["k"]},
        {"value": "{{secret:api_key}}"}, "TypeError invalid-argument",
        "TypeError invalid-argument", "TypeError invalid-argument"])"));
  }
  CHECK(f.host.operations() ==
        std::vector<std::string>{R"(storage {"op":"get","key":"k"})",
                                 R"(storage {"op":"set","key":"k","value":{"a":[1,"x"]}})",
                                 R"(storage {"op":"delete","key":"k"})", R"(storage {"op":"list"})",
                                 R"(secret {"name":"api_key"})"});
}

TEST_CASE("a ctx stashed from an earlier call cannot start operations", "[ops][ctx]") {
  Later later;
  PoolFixture f;
  answerFetch(f, later, milliseconds(1),
              [](const json::value&) -> HostOpResult { return fetchReply(200, ""); });
  auto tool = makeTool(R"(let saved;
      export default async (args, ctx) => {
        if (!saved) { saved = ctx; return 'saved'; }
        const out = [];
        for (const use of [() => saved.fetch('https://a.example/'),
                           () => saved.popup({kind: 'origin', url: 'https://a.example/'}),
                           () => saved.storage.get('k'), () => saved.storage.set('k', 1),
                           () => saved.storage.delete('k'), () => saved.storage.list(),
                           () => saved.secret('api_key')]) {
          try { await use(); out.push('resolved'); } catch (e) { out.push(e.code); }
        }
        return out;
      })");
  REQUIRE(*f.call(tool).result == "saved");
  auto outcome = f.call(tool);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(*outcome.result ==
        json::parse(R"(["call-ended","call-ended","call-ended","call-ended","call-ended",
                        "call-ended","call-ended"])"));
  CHECK(f.host.operations().empty());  // startOperation was never called
  SECTION("the global fetch belongs to whichever call is running") {
    auto global = makeTool(
        "let saved; export default async (args, ctx) => { if (!saved) { saved = fetch; return 0; "
        "} return (await saved('https://a.example/')).status; }");
    REQUIRE(*f.call(global).result == 0);
    CHECK(*f.call(global).result == 200);
  }
}

TEST_CASE("at most kMaxRunningOps of a call's host requests run at once, the rest wait",
          "[ops][limits]") {
  Later later;
  PoolFixture f;
  // The host answers each fetch a second after it arrives (long enough for the tool to start
  // all it may on a loaded machine), and notes the most it held at once.
  std::atomic<int> held{0};
  std::atomic<int> most{0};
  f.host.onOperation([&](const std::string&, const json::value&,
                         std::shared_ptr<HostOperation> operation) {
    const int now = ++held;
    for (int seen = most.load(); now > seen && !most.compare_exchange_weak(seen, now);) {
    }
    later.after(milliseconds(1000), [&held, operation] {
      --held;
      operation->complete(fetchReply(200, "ok"));
    });
  });
  auto tool = makeTool(R"(export default async () => {
      const all = [];
      for (let i = 0; i < 100; i++) all.push(fetch('https://api.example/' + i).then((r) => r.status));
      return (await Promise.all(all)).filter((status) => status === 200).length;
    })",
                       limits({{"wallMs", 20000}}));
  auto outcome = f.call(tool);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(*outcome.result == 100);
  CHECK(most == static_cast<int>(kMaxRunningOps));
  CHECK(f.host.operations().size() == 100);
}

TEST_CASE("operations a getter starts while a request is built count toward kMaxOutstandingOps",
          "[ops][limits]") {
  PoolFixture f;  // its host refuses storage requests at once, as not authorized
  auto tool = makeTool(R"(export default async (args, ctx) => {
      const all = [];
      const note = (p) => all.push(p.then(() => 'done', (e) => e.code));
      for (let i = 0; i < 1020; i++) note(ctx.storage.get('k' + i));
      // Reading init.method starts ten more: the fetch itself comes after them.
      const init = { get method() {
        for (let i = 0; i < 10; i++) note(ctx.storage.get('nested' + i));
        return 'POST';
      } };
      note(fetch('https://api.example/', init));
      const codes = {};
      for (const code of await Promise.all(all)) codes[code] = (codes[code] || 0) + 1;
      return codes;
    })",
                       json::object{{"capabilities", json::object{{"storage", true}}}});
  auto outcome = f.call(tool);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(outcome.result->at("too-many-operations") ==
        1031 - static_cast<std::int64_t>(kMaxOutstandingOps));
  CHECK(f.host.operations().size() == kMaxOutstandingOps);
}

TEST_CASE("a call's outstanding requests hold at most kMaxOutstandingRequestBytes",
          "[ops][limits]") {
  Later later;
  PoolFixture f;
  f.host.onOperation(
      [&](const std::string&, const json::value&, std::shared_ptr<HostOperation> operation) {
        later.after(milliseconds(50), [operation] { operation->complete(fetchReply(200, "ok")); });
      });
  // Each body is 10 MiB, about 13.3 MiB as the base64 of the request: four fit in 64 MiB.
  auto tool = makeTool(R"(export default async () => {
      const body = 'x'.repeat(10 * 1024 * 1024);
      const all = [];
      for (let i = 0; i < 6; i++) {
        all.push(fetch('https://api.example/' + i, { method: 'POST', body })
                   .then((r) => String(r.status), (e) => e.code));
      }
      const first = await Promise.all(all);
      // Settled requests hold nothing: the next one fits again.
      const again = await fetch('https://api.example/again', { method: 'POST', body });
      return { first, again: again.status };
    })",
                       // Copying 70 MiB of bodies takes seconds of CPU under the sanitizers.
                       limits({{"wallMs", 120000}, {"cpuMs", 120000}}));
  auto outcome = f.call(tool);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(outcome.result->at("first") ==
        json::array{"200", "200", "200", "200", "request-too-large", "request-too-large"});
  CHECK(outcome.result->at("again") == 200);
  CHECK(f.host.operations().size() == 5);
}

TEST_CASE("a call's host request past kMaxOutstandingOps is refused", "[ops][limits]") {
  PoolFixture f;  // its host refuses storage requests at once, as not authorized
  auto tool = makeTool(R"(export default async (args, ctx) => {
      const all = [];
      for (let i = 0; i < 1100; i++) {
        all.push(ctx.storage.get('k' + i).then(() => 'stored', (e) => e.code));
      }
      const codes = {};
      for (const code of await Promise.all(all)) codes[code] = (codes[code] || 0) + 1;
      return codes;
    })",
                       json::object{{"capabilities", json::object{{"storage", true}}}});
  auto outcome = f.call(tool);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(outcome.result->at("too-many-operations") == 1100 - static_cast<std::int64_t>(kMaxOutstandingOps));
  CHECK(f.host.operations().size() == kMaxOutstandingOps);
}

TEST_CASE("a request too large to send is refused before its strings are read", "[ops][limits]") {
  PoolFixture f;
  // Ropes of half a gigabyte cost the tool nothing to make; flattening or copying one would cost
  // the sandbox process a gigabyte and seconds outside every limit of the call.
  auto tool =
      makeTool(R"(export default async (args, ctx) => {
      const huge = 'a'.repeat(2 ** 29 - 24);
      const wide = '\u1234'.repeat(2 ** 28);
      const out = {};
      const attempt = async (name, start) => {
        try { await start(); out[name] = 'sent'; }
        catch (e) { out[name] = [e.code ?? null, String(e.message)]; }
      };
      await attempt('storageKey', () => ctx.storage.get(huge));
      await attempt('wideKey', () => ctx.storage.set(wide, 1));
      await attempt('secret', () => ctx.secret(huge));
      await attempt('body', () => fetch('https://api.example/', { method: 'POST', body: huge }));
      await attempt('url', () => fetch('https://api.example/' + 'a'.repeat(2 ** 28)));
      await attempt('header', () => fetch('https://api.example/', { headers: { 'x-big': wide } }));
      await attempt('method', () => fetch('https://api.example/', { method: huge }));
      await attempt('popup', () => ctx.popup({ kind: 'custom-html', html: huge }));
      await attempt('resolve', () => ctx.resolveInvocation(wide));
      console.log(wide);
      return out;
    })",
               json::object{{"capabilities", json::object{{"storage", true}, {"subtasks", true}}}});
  auto outcome = f.call(tool);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  auto refused = [&](const char* name, const char* code, const char* words) {
    INFO(name);
    const auto& entry = outcome.result->at(name);
    REQUIRE(entry.is_array());
    CHECK(entry.at(0) == code);
    CHECK_THAT(std::string(entry.at(1).as_string()), Catch::Contains(words));
  };
  refused("storageKey", "invalid-argument", "ctx.storage.get(key): key is longer than");
  refused("wideKey", "invalid-argument", "ctx.storage.set(key): key is longer than");
  refused("secret", "invalid-argument", "ctx.secret(name): name is longer than");
  refused("body", "request-too-large", "init.body holds more than 64 MiB");
  refused("url", "request-too-large", "the URL is longer than");
  refused("header", "request-too-large", "the request headers pass");
  refused("method", "invalid-argument", "init.method is longer than");
  refused("popup", "request-too-large", "request.html holds more than 64 MiB");
  refused("resolve", "invalid-argument", "takes a tool name");
  CHECK(f.host.operations().empty());
  // The log keeps the start of the line, read without the rest of the string.
  CHECK(outcome.logs.starts_with("[log] \u1234\u1234"));
  CHECK(outcome.logs.size() < 64 * 1024);
}
