// SandboxPool end to end, in process, with real isolates: results, state retained per revision,
// modules, the ctx doors, console, serialization, parallelism, cancellation, eviction, limits.
#include "tests/runtime/runtime_test_support.h"

#include "runtime/fetch_api.h"

#include <catch2/catch.hpp>

#include <boost/json/parse.hpp>

#include <algorithm>
#include <map>
#include <thread>

using namespace toolhost::runtime;
using namespace toolhost::runtime::testing;
namespace json = boost::json;
using std::chrono::milliseconds;

namespace {

json::object limits(json::object values) { return json::object{{"limits", std::move(values)}}; }

CallOptions disposable() {
  CallOptions options;
  options.mode = CallOptions::Mode::disposable;
  return options;
}

// A tool that busy-waits args.ms and reports when it ran (wall clock, ms since the epoch).
const char* kBusy = R"(export default (args) => {
    const start = Date.now();
    while (Date.now() < start + args.ms) {}
    return {start, end: Date.now()};
  })";

std::int64_t field(const CallOutcome& outcome, const char* name) {
  return outcome.result->at(name).as_int64();
}

}  // namespace

TEST_CASE("a tool's default export runs with the arguments and its result comes back", "[pool]") {
  PoolFixture f;
  auto tool =
      makeTool("export default async (args, ctx) => ({sum: args.a + args.b, tool: ctx.tool})");
  auto outcome = f.call(tool, {{"a", 2}, {"b", 40}});
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(*outcome.result == json::parse(R"({"sum":42,"tool":{"name":"test-tool","revision":")" +
                                       tool->revision + R"("}})"));
  CHECK(outcome.revision == tool->revision);
  CHECK(outcome.usage.freshSandbox);
  CHECK(outcome.usage.heapPeakBytes > 0);
  SECTION("a synchronous default export works too; undefined becomes null") {
    auto sync = f.call(makeTool("export default () => {}"));
    REQUIRE(sync.result);
    CHECK(sync.result->is_null());
  }
}

TEST_CASE("module state is retained per revision, disposable calls get a fresh module", "[pool]") {
  PoolFixture f;
  const char* counter = "let calls = 0; export default () => ++calls;";
  auto tool = makeTool(counter);
  auto other = makeTool(counter, {}, {}, "other-tool");
  CHECK(*f.call(tool).result == 1);
  CHECK(*f.call(tool).result == 2);
  CHECK(*f.call(other).result == 1);
  auto isolated = f.call(tool, {}, disposable());
  CHECK(*isolated.result == 1);
  CHECK(isolated.usage.freshSandbox);
  auto third = f.call(tool);
  CHECK(*third.result == 3);
  CHECK_FALSE(third.usage.freshSandbox);
  auto list = f.pool.list();
  REQUIRE(list.size() == 2);
  CHECK(list[0].revision == other->revision);  // least recently used first
  CHECK(list[1].revision == tool->revision);
  CHECK(list[1].calls == 3);
  CHECK(list[1].name == "test-tool");
  CHECK_FALSE(list[1].busy);
  CHECK(list[1].heapBytes > 0);
  CHECK(list[1].idleMs >= 0);
}

TEST_CASE("the preludes are parsed once per process and later sandboxes take their code cache",
          "[pool]") {
  PoolFixture f;
  auto tool = makeTool(
      "export default async (args, ctx) => ({tool: ctx.tool.name, fetch: typeof fetch, "
      "headers: typeof Headers, frozen: Object.isFrozen(ctx)})");
  const auto before = preludeCacheStats();
  for (int i = 0; i < 3; ++i) {
    auto outcome = f.call(tool, {}, disposable());
    INFO(describe(outcome));
    REQUIRE(outcome.result);
    CHECK(outcome.usage.freshSandbox);
    CHECK(*outcome.result ==
          json::parse(
              R"({"tool":"test-tool","fetch":"function","headers":"function","frozen":true})"));
  }
  const auto after = preludeCacheStats();
  // The ctx factory and the dates prelude, made with each sandbox, and the fetch prelude, made
  // when the tool reads Headers: once each.
  CHECK(after.made == 3);
  // At most two sandboxes were ready before: the third call's was built since, from the caches.
  CHECK(after.consumed - before.consumed >= 3);
  CHECK(after.rejected == 0);
}

TEST_CASE("a tool that throws keeps its sandbox, the error says what was thrown", "[pool]") {
  PoolFixture f;
  auto tool = makeTool(R"(let calls = 0;
      export default async (args) => {
        calls++;
        if (args.fail === 'error') throw Object.assign(new TypeError('bad input'), {code: 'E_BAD'});
        if (args.fail === 'string') throw 'plain string';
        if (args.fail === 'reject') return Promise.reject(new RangeError('rejected'));
        return calls;
      })");
  auto error = f.call(tool, {{"fail", "error"}});
  REQUIRE(errc(error) == CallErrc::toolThrew);
  CHECK(error.result.error().detail == "the tool's promise rejected: TypeError: bad input");
  auto toolError = error.result.error().toolError;
  CHECK(toolError.at("name") == "TypeError");
  CHECK(toolError.at("message") == "bad input");
  CHECK(toolError.at("code") == "E_BAD");
  CHECK_THAT(std::string(toolError.at("stack").as_string()), Catch::Contains("source.js:4"));
  auto text = f.call(tool, {{"fail", "string"}});
  REQUIRE(errc(text) == CallErrc::toolThrew);
  CHECK(text.result.error().toolError.at("message") == "plain string");
  auto rejected = f.call(tool, {{"fail", "reject"}});
  REQUIRE(errc(rejected) == CallErrc::toolThrew);
  CHECK(rejected.result.error().toolError.at("name") == "RangeError");
  auto after = f.call(tool);
  REQUIRE(after.result);
  CHECK(*after.result == 4);  // same module state throughout
}

TEST_CASE("imports resolve only to the revision's own modules", "[pool][modules]") {
  PoolFixture f;
  json::object modules{
      {"util.js", "export const twice = (x) => 2 * x; export { label } from './lib/label.js';"},
      {"lib/label.js",
       "import { prefix } from '../prefix.js'; export const label = (x) => prefix + x;"},
      {"prefix.js", "export const prefix = 'n=';"},
      {"lib/tla.js", "export const ready = await Promise.resolve('awaited');"},
  };
  SECTION("relative, bare and rooted specifiers, nested folders") {
    auto tool = makeTool(
        "import { twice, label } from './util.js'; import * as again from 'util.js';"
        "import { prefix } from '/prefix.js';"
        "export default (args) => [label(twice(args.n)), again.twice === twice, prefix];",
        {}, modules);
    auto outcome = f.call(tool, {{"n", 21}});
    INFO(describe(outcome));
    REQUIRE(outcome.result);
    CHECK(*outcome.result == json::parse(R"(["n=42",true,"n="])"));
  }
  SECTION("top-level await is refused, naming the module that awaits") {
    struct Case {
      const char* source;
      const char* says;
    };
    const Case cases[] = {
        {"import { ready } from '/lib/tla.js'; export default () => ready;", "lib/tla.js uses"},
        {"import './util.js'; await 0; export default () => 1;", "source.js uses"},
        {"import { ready } from './lib/tla.js'; await 0; export default () => ready;",
         "lib/tla.js uses"},
    };
    for (const auto& c : cases) {
      auto outcome = f.call(makeTool(c.source, {}, modules));
      INFO(c.source << "\n" << describe(outcome));
      REQUIRE(errc(outcome) == CallErrc::invalidModule);
      CHECK_THAT(outcome.result.error().detail, Catch::Contains(c.says));
      CHECK_THAT(outcome.result.error().detail, Catch::Contains("top-level await"));
    }
  }
  SECTION("unknown specifiers are refused, naming the specifier") {
    const char* sources[] = {
        "import fs from 'fs'; export default () => 1;",
        "import x from 'node:fs'; export default () => 1;",
        "import x from 'https://example.com/x.js'; export default () => 1;",
        "import x from '../util.js'; export default () => 1;",
        "import x from './missing.js'; export default () => 1;",
    };
    for (const char* source : sources) {
      auto outcome = f.call(makeTool(source, {}, modules));
      INFO(source << "\n" << describe(outcome));
      REQUIRE(errc(outcome) == CallErrc::invalidModule);
      CHECK_THAT(outcome.result.error().detail,
                 Catch::Contains("which is not one of this revision's modules"));
    }
    auto nested = f.call(makeTool("import './lib/bad.js'; export default () => 1;", {},
                                  {{"lib/bad.js", "import '../../escape.js';"}}));
    INFO(describe(nested));
    CHECK_THAT(nested.result.error().detail,
               Catch::Contains("lib/bad.js imports \"../../escape.js\""));
  }
  SECTION("modules that do not compile, throw, or export no function are invalidModule") {
    struct Case {
      const char* source;
      const char* says;
    };
    const Case cases[] = {
        {"export default (args => 1", "does not compile: SyntaxError"},
        {"throw new Error('top level'); export default () => 1;", "Error: top level"},
        {"export const x = 1;", "default export is not a function (it is missing)"},
        {"export default 42;", "default export is not a function (it is a number)"},
        {"import { nope } from './util.js'; export default () => 1;", "cannot be linked"},
    };
    for (const auto& c : cases) {
      auto outcome = f.call(makeTool(c.source, {}, modules));
      INFO(c.source << "\n" << describe(outcome));
      REQUIRE(errc(outcome) == CallErrc::invalidModule);
      CHECK_THAT(outcome.result.error().detail, Catch::Contains(c.says));
    }
    CHECK(f.pool.list().empty());  // never retained
  }
  SECTION("a module that loops at top level is stopped by the call's limits") {
    auto outcome =
        f.call(makeTool("for (;;) {} export default () => 1;", limits({{"wallMs", 300}})));
    CHECK(errc(outcome) == CallErrc::timeout);
  }
}

TEST_CASE("ctx offers exactly its doors, frozen, and denies what policy has not granted",
          "[pool][ctx]") {
  PoolFixture f;
  auto tool = makeTool(R"(export default async (args, ctx) => {
      const outcome = async (f) => { try { return {ok: await f()}; } catch (e) { return {name: e.name, code: e.code, message: e.message}; } };
      return {
        keys: Object.keys(ctx).sort(),
        storageKeys: Object.keys(ctx.storage).sort(),
        frozen: [Object.isFrozen(ctx), Object.isFrozen(ctx.tool), Object.isFrozen(ctx.storage)],
        fetch: await outcome(() => fetch('https://example.com')),
        ctxFetch: await outcome(() => ctx.fetch('https://example.com')),
        popup: await outcome(() => ctx.popup({kind: 'origin', url: 'https://example.com'})),
        secret: await outcome(() => ctx.secret('api_key')),
        storage: await outcome(() => ctx.storage.get('k')),
        storageSet: await outcome(() => ctx.storage.set('k', 1)),
        resolve: await outcome(() => ctx.resolveInvocation('weather')),
        subtasks: await outcome(() => ctx.createSubtasksResult([])),
        construct: await outcome(() => new ctx.fetch('x')),
      };
    })");
  auto outcome = f.call(tool);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  const auto& r = outcome.result->as_object();
  CHECK(
      r.at("keys") ==
      json::parse(
          R"(["createSubtasksResult","fetch","popup","resolveInvocation","secret","settings","storage","tool"])"));
  CHECK(r.at("storageKeys") == json::parse(R"(["delete","get","list","set"])"));
  CHECK(r.at("frozen") == json::parse("[true,true,true]"));
  for (const char* door : {"fetch", "ctxFetch", "popup", "secret", "storage", "storageSet"}) {
    INFO(door);
    CHECK(r.at(door).at("code") == "not-authorized");
    CHECK_THAT(std::string(r.at(door).at("message").as_string()),
               Catch::Contains("is not granted to sandboxed tools by this daemon"));
  }
  for (const char* door : {"resolve", "subtasks"}) {
    INFO(door);
    CHECK(r.at(door).at("code") == "not-authorized");
    CHECK_THAT(std::string(r.at(door).at("message").as_string()),
               Catch::Contains(R"(add "subtasks": true to its capabilities)"));
  }
  CHECK(r.at("construct").at("name") == "TypeError");
  CHECK(f.host.resolved.empty());
  CHECK(f.host.subtasks.empty());
  // Every operation reached the host, which refused it.
  CHECK(
      f.host.operations() ==
      std::vector<std::string>{R"(fetch {"url":"https://example.com","method":"GET","headers":[]})",
                               R"(fetch {"url":"https://example.com","method":"GET","headers":[]})",
                               R"(popup {"kind":"origin","url":"https://example.com"})",
                               R"(secret {"name":"api_key"})", R"(storage {"op":"get","key":"k"})",
                               R"(storage {"op":"set","key":"k","value":1})"});
}

TEST_CASE("resolveInvocation and createSubtasksResult reach the host with subtasks granted",
          "[pool][ctx]") {
  PoolFixture f;
  json::object subtasks{{"capabilities", json::object{{"subtasks", true}}}};
  auto tool = makeTool(R"(export default async (args, ctx) => {
      const resolved = await ctx.resolveInvocation('weather');
      let missing;
      try { await ctx.resolveInvocation('missing'); } catch (e) { missing = {code: e.code, message: e.message}; }
      const [a, b] = await Promise.all([ctx.resolveInvocation('a'), ctx.resolveInvocation('b')]);
      const tasks = await ctx.createSubtasksResult([{call: 'weather', args: {city: 'Oslo'}}]);
      let bad;
      try { await ctx.createSubtasksResult({f() {}}); } catch (e) { bad = {name: e.name, message: e.message}; }
      let badName;
      try { await ctx.resolveInvocation(42); } catch (e) { badName = e.name; }
      return {resolved, missing, a: a.toolRevision, b: b.toolRevision, tasks, bad, badName};
    })",
                       subtasks);
  CallOptions options;
  options.invocation = {{"taskId", "sha256:parent"}};
  auto outcome = f.call(tool, {}, options);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  const auto& r = outcome.result->as_object();
  // Only the opaque revisions come back, never anything else the host had.
  CHECK(
      r.at("resolved") ==
      json::parse(
          R"({"toolRevision":"sha256:resolved-weather","settingsRevision":"sha256:settings-weather"})"));
  CHECK(r.at("missing") ==
        json::parse(R"({"code":"not-found","message":"no tool named \"missing\""})"));
  CHECK(r.at("a") == "sha256:resolved-a");
  CHECK(r.at("b") == "sha256:resolved-b");
  CHECK(r.at("tasks") ==
        json::parse(
            R"([{"id":"sha256:task-1","drafts":[{"call":"weather","args":{"city":"Oslo"}}]}])"));
  CHECK(r.at("bad").at("name") == "TypeError");
  CHECK_THAT(std::string(r.at("bad").at("message").as_string()),
             Catch::Contains("/f is a function"));
  CHECK(r.at("badName") == "TypeError");
  CHECK(f.host.resolved == std::vector<std::string>{"test-tool -> weather", "test-tool -> missing",
                                                    "test-tool -> a", "test-tool -> b"});
  REQUIRE(f.host.subtasks.size() == 1);
  CHECK(f.host.subtasks[0] ==
        R"(test-tool [{"call":"weather","args":{"city":"Oslo"}}] {"taskId":"sha256:parent"})");
}

TEST_CASE("a ctx kept in module state rejects in later calls", "[pool][ctx]") {
  PoolFixture f;
  json::object subtasks{{"capabilities", json::object{{"subtasks", true}}}};
  auto tool = makeTool(R"(let saved;
      export default async (args, ctx) => {
        if (!saved) { saved = ctx; return 'saved'; }
        const errors = [];
        for (const f of [() => saved.resolveInvocation('x'), () => saved.fetch('https://a.example'),
                         () => saved.storage.get('k'), () => saved.createSubtasksResult([])]) {
          try { await f(); errors.push('resolved'); } catch (e) { errors.push(e.code); }
        }
        // The current ctx still works.
        const fresh = await ctx.resolveInvocation('y');
        return {errors, fresh: fresh.toolRevision, same: saved.tool.revision === ctx.tool.revision};
      })",
                       subtasks);
  REQUIRE(*f.call(tool).result == "saved");
  auto outcome = f.call(tool);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(
      *outcome.result ==
      json::parse(
          R"({"errors":["call-ended","call-ended","call-ended","call-ended"],"fresh":"sha256:resolved-y","same":true})"));
  CHECK(f.host.resolved == std::vector<std::string>{"test-tool -> y"});
  CHECK(f.host.operations().empty());  // nothing of the stale ctx reached the host
}

TEST_CASE("each call gets its own ctx, and a stale one's functions reject even taken apart",
          "[pool][ctx]") {
  PoolFixture f;
  json::object subtasks{{"capabilities", json::object{{"subtasks", true}}}};
  // The tool replaces Object.freeze and Function.prototype.apply before its first call: the ctx is
  // made by code that captured the originals, so nothing of that reaches it.
  auto tool = makeTool(R"(Object.freeze = (o) => o;
      Function.prototype.apply = () => 'hijacked';
      let saved, resolve;
      export default async (args, ctx) => {
        if (!saved) { saved = ctx; resolve = ctx.resolveInvocation; return 'saved'; }
        const codes = [];
        for (const f of [() => resolve('x'), () => saved.storage.list.call(null),
                         () => (0, saved.storage.get)('k')]) {
          try { await f(); codes.push('resolved'); } catch (e) { codes.push(e.code); }
        }
        let construct;
        try { new ctx.fetch('x'); construct = 'constructed'; } catch (e) { construct = e.name; }
        const added = (() => { try { ctx.extra = 1; return 'extra' in ctx; } catch (e) { return e.name; } })();
        return {codes, construct, added,
                distinct: saved !== ctx && saved.fetch !== ctx.fetch && saved.storage !== ctx.storage,
                frozen: [Object.isFrozen(ctx), Object.isFrozen(ctx.tool), Object.isFrozen(ctx.storage)],
                names: [ctx.fetch.name, ctx.storage.delete.name, ctx.createSubtasksResult.name],
                lengths: [ctx.fetch.length, ctx.storage.set.length, ctx.storage.list.length],
                fresh: (await ctx.resolveInvocation('y')).toolRevision};
      })",
                       subtasks);
  REQUIRE(*f.call(tool).result == "saved");
  auto outcome = f.call(tool);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(*outcome.result == json::parse(R"({"codes":["call-ended","call-ended","call-ended"],
      "construct":"TypeError","added":"TypeError","distinct":true,"frozen":[true,true,true],
      "names":["fetch","delete","createSubtasksResult"],"lengths":[2,2,0],
      "fresh":"sha256:resolved-y"})"));
  CHECK(f.host.resolved == std::vector<std::string>{"test-tool -> y"});
  CHECK(f.host.operations().empty());
}

TEST_CASE("console output is collected per call and bounded", "[pool][console]") {
  RuntimeConfig config = testConfig();
  config.maxLogBytes = 1024;
  PoolFixture f(config);
  auto tool = makeTool(R"(console.log('loading');
      export default (args) => {
        console.log('hello', 42, {a: [1, 'two']}, null, undefined, true);
        console.info('info'); console.warn('warn'); console.error(new Error('boom').message); console.debug(10n);
        if (args.flood) for (let i = 0; i < 1000; i++) console.log('line', i);
        return 'done';
      })");
  auto first = f.call(tool);
  REQUIRE(first.result);
  CHECK(first.logs ==
        "[log] loading\n"
        "[log] hello 42 {\"a\":[1,\"two\"]} null undefined true\n"
        "[info] info\n[warn] warn\n[error] boom\n[debug] 10n\n");
  auto second = f.call(tool);  // module already loaded: no "loading"
  CHECK_THAT(second.logs, Catch::StartsWith("[log] hello"));
  auto flood = f.call(tool, {{"flood", true}});
  REQUIRE(flood.result);
  CHECK(flood.logs.size() < 1200);
  CHECK_THAT(flood.logs,
             Catch::EndsWith("[truncated] console output past 1024 bytes was dropped\n"));
}

TEST_CASE("calls to one revision are serialized, different revisions run in parallel",
          "[pool][threads]") {
  PoolFixture f;
  auto a = makeTool(kBusy, {}, {}, "busy-a");
  auto b = makeTool(kBusy, {}, {}, "busy-b");
  SECTION("two revisions overlap") {
    auto outcomes = callTogether(f.pool, {{a, {{"ms", 300}}, {}}, {b, {{"ms", 300}}, {}}});
    REQUIRE(outcomes[0].result);
    REQUIRE(outcomes[1].result);
    INFO(describe(outcomes[0]) << " / " << describe(outcomes[1]));
    CHECK(field(outcomes[0], "start") < field(outcomes[1], "end"));
    CHECK(field(outcomes[1], "start") < field(outcomes[0], "end"));
  }
  SECTION("one revision never overlaps itself, and runs its calls in order") {
    auto outcomes = callTogether(
        f.pool, {{a, {{"ms", 100}}, {}}, {a, {{"ms", 100}}, {}}, {a, {{"ms", 100}}, {}}});
    for (auto& outcome : outcomes) REQUIRE(outcome.result);
    CHECK(field(outcomes[0], "end") <= field(outcomes[1], "start"));
    CHECK(field(outcomes[1], "end") <= field(outcomes[2], "start"));
    CHECK(outcomes[0].usage.freshSandbox);
    CHECK_FALSE(outcomes[1].usage.freshSandbox);
    CHECK_FALSE(outcomes[2].usage.freshSandbox);
  }
}

namespace {

const char* kSpin = "export default (args) => { for (;;) {} }";

// What cancelBehind saw.
struct CancelledBehind {
  CallOutcome waiting;
  std::vector<CallOutcome> busy;
  std::chrono::steady_clock::duration lag{};  // from the cancel to the waiting call's answer
  bool busyStillRunning = false;              // when that answer came
};

// Starts a call of each of `busy` with {spin: true} (tools that spin until stopped), then a call
// of `waiting`, which waits behind them; cancels that call 200 ms later, and terminates the busy
// ones once it is answered (or after 5 s without an answer).
CancelledBehind cancelBehind(PoolFixture& f,
                             const std::vector<toolhost::registry::ToolRevisionPtr>& busy,
                             const toolhost::registry::ToolRevisionPtr& waiting,
                             const json::object& waitingArgs) {
  boost::asio::io_context io;
  boost::asio::cancellation_signal signal;
  std::vector<std::optional<CallOutcome>> busyOut(busy.size());
  std::optional<CallOutcome> waitingOut;
  CancelledBehind seen;
  auto cancelledAt = std::chrono::steady_clock::now();
  boost::asio::steady_timer start(io);
  boost::asio::steady_timer cancel(io);
  boost::asio::steady_timer backstop(io, milliseconds(5000));
  auto terminateBusy = [&] {
    for (const auto& tool : busy) f.pool.terminate(tool->revision);
  };
  backstop.async_wait([&](boost::system::error_code error) {
    if (error) return;
    start.cancel();
    terminateBusy();
  });
  for (std::size_t i = 0; i < busy.size(); ++i) {
    boost::asio::co_spawn(
        io, f.pool.call(busy[i], json::object{{"spin", true}}, {}),
        [&, i](std::exception_ptr, CallOutcome outcome) { busyOut[i] = std::move(outcome); });
  }
  // The waiting call comes once every busy call has reached its sandbox (shown busy) and had
  // 100 ms to start; the cancel 200 ms after it.
  std::function<void()> startOnceBusy = [&] {
    const auto listed = f.pool.list();
    const auto running = std::count_if(listed.begin(), listed.end(),
                                       [](const SandboxInfo& info) { return info.busy; });
    if (static_cast<std::size_t>(running) < busy.size()) {
      start.expires_after(milliseconds(5));
      start.async_wait([&](boost::system::error_code error) {
        if (!error) startOnceBusy();
      });
      return;
    }
    start.expires_after(milliseconds(100));
    start.async_wait([&](boost::system::error_code error) {
      if (error) return;
      boost::asio::co_spawn(io, f.pool.call(waiting, waitingArgs, {}),
                            boost::asio::bind_cancellation_slot(
                                signal.slot(), [&](std::exception_ptr, CallOutcome outcome) {
                                  seen.lag = std::chrono::steady_clock::now() - cancelledAt;
                                  seen.busyStillRunning =
                                      std::none_of(busyOut.begin(), busyOut.end(),
                                                   [](const auto& out) { return out.has_value(); });
                                  waitingOut = std::move(outcome);
                                  backstop.cancel();
                                  terminateBusy();
                                }));
      cancel.expires_after(milliseconds(200));
      cancel.async_wait([&](boost::system::error_code) {
        cancelledAt = std::chrono::steady_clock::now();
        signal.emit(boost::asio::cancellation_type::terminal);
      });
    });
  };
  startOnceBusy();
  io.run();
  REQUIRE(waitingOut);
  seen.waiting = std::move(*waitingOut);
  for (auto& out : busyOut) {
    REQUIRE(out);
    seen.busy.push_back(std::move(*out));
  }
  return seen;
}

}  // namespace

TEST_CASE("a cancel is answered at once when no V8 runs for the call", "[pool][cancel]") {
  PoolFixture f;  // two workers
  auto spinA = makeTool(kSpin, limits({{"wallMs", 30000}, {"cpuMs", 30000}}), {}, "spin-a");
  auto spinB = makeTool(kSpin, limits({{"wallMs", 30000}, {"cpuMs", 30000}}), {}, "spin-b");
  SECTION("a call waiting for a worker") {
    auto quick = makeTool("export default () => 'ran'", {}, {}, "quick");
    auto behind = cancelBehind(f, {spinA, spinB}, quick, {});
    INFO(describe(behind.waiting));
    CHECK(errc(behind.waiting) == CallErrc::cancelled);
    CHECK(behind.busyStillRunning);
    CHECK(behind.lag < milliseconds(3000));  // at once, not after the busy calls
    // It never ran: once its strand had a worker again it left no sandbox behind, and the next
    // call of it runs.
    CHECK(waitFor([&] {
      const auto list = f.pool.list();
      return std::none_of(list.begin(), list.end(), [&](const SandboxInfo& info) {
        return info.revision == quick->revision;
      });
    }));
    auto next = f.call(quick);
    CHECK(*next.result == "ran");
  }
  SECTION("a call awaiting a host operation while every worker is busy") {
    std::atomic<int> aborts{0};
    std::mutex mutex;
    std::vector<std::shared_ptr<HostOperation>> held;
    f.host.onOperation(
        [&](const std::string&, const json::value&, std::shared_ptr<HostOperation> operation) {
          operation->onAbort([&] { ++aborts; });
          std::lock_guard lock(mutex);
          held.push_back(std::move(operation));
        });
    auto fetching =
        makeTool("export default async () => (await fetch('https://slow.example/')).status", {}, {},
                 "fetching");
    boost::asio::io_context io;
    auto work = boost::asio::make_work_guard(io);
    boost::asio::cancellation_signal signal;
    std::atomic<bool> answered{false};
    std::atomic<int> spinsEnded{0};
    std::optional<CallOutcome> out;  // read after the join
    boost::asio::co_spawn(io, f.pool.call(fetching, {}, {}),
                          boost::asio::bind_cancellation_slot(
                              signal.slot(), [&](std::exception_ptr, CallOutcome outcome) {
                                out = std::move(outcome);
                                answered = true;
                              }));
    std::thread caller([&] { io.run(); });
    // It awaits its fetch; then both workers are taken by spinning calls.
    REQUIRE(waitFor([&] {
      std::lock_guard lock(mutex);
      return held.size() == 1;
    }));
    for (const auto& spin : {spinA, spinB}) {
      boost::asio::co_spawn(io, f.pool.call(spin, json::object{{"spin", true}}, {}),
                            [&](std::exception_ptr, CallOutcome) { ++spinsEnded; });
    }
    std::this_thread::sleep_for(milliseconds(200));
    const auto cancelledAt = std::chrono::steady_clock::now();
    boost::asio::post(io, [&] { signal.emit(boost::asio::cancellation_type::terminal); });
    const bool prompt = waitFor([&] { return answered.load(); }, milliseconds(1000));
    const auto lag = std::chrono::steady_clock::now() - cancelledAt;
    const int spinsEndedThen = spinsEnded.load();
    f.pool.terminate(spinA->revision);
    f.pool.terminate(spinB->revision);
    REQUIRE(waitFor([&] { return answered && spinsEnded == 2; }));
    work.reset();
    caller.join();
    CHECK(prompt);
    CHECK(lag < milliseconds(3000));  // at once, not after the busy calls
    CHECK(spinsEndedThen == 0);
    REQUIRE(out);
    INFO(describe(*out));
    CHECK(errc(*out) == CallErrc::cancelled);
    CHECK(waitFor([&] { return aborts == 1; }));  // its fetch, once its strand ran again
  }
}

TEST_CASE("a module's top-level code is stopped by a cancel and by its limits",
          "[pool][cancel][modules]") {
  // Kills wait while a module's evaluation starts (Watchdog::hold), never longer.
  PoolFixture f;
  SECTION("cancelled") {
    auto tool = makeTool("for (;;) {}\nexport default () => 1",
                         limits({{"wallMs", 30000}, {"cpuMs", 30000}}));
    const auto start = std::chrono::steady_clock::now();
    auto outcome = callAndCancel(f.pool, tool, milliseconds(100));
    INFO(describe(outcome));
    CHECK(errc(outcome) == CallErrc::cancelled);
    CHECK(std::chrono::steady_clock::now() - start < milliseconds(3000));  // not its 30 s
  }
  SECTION("past its wall clock") {
    auto tool = makeTool("for (;;) {}\nexport default () => 1", limits({{"wallMs", 200}}));
    auto outcome = f.call(tool);
    INFO(describe(outcome));
    CHECK(errc(outcome) == CallErrc::timeout);
    CHECK(outcome.usage.wallMs < 3000);  // its limit, not for ever
  }
  SECTION("past its CPU time") {
    auto tool =
        makeTool("let n = 0; for (;;) { n++; }\nexport default () => n", limits({{"cpuMs", 150}}));
    auto outcome = f.call(tool);
    INFO(describe(outcome));
    CHECK(errc(outcome) == CallErrc::cpuLimit);
  }
}

TEST_CASE("a cancelled call ends promptly with cancelled and its sandbox is discarded",
          "[pool][cancel]") {
  PoolFixture f;
  auto tool = makeTool(
      "let calls = 0; export default (args) => { calls++; if (args.spin) for (;;) {} return calls; "
      "}",
      limits({{"wallMs", 30000}, {"cpuMs", 30000}}));
  REQUIRE(*f.call(tool).result == 1);
  SECTION("while its JavaScript runs") {
    boost::asio::io_context io;
    boost::asio::cancellation_signal signal;
    std::optional<CallOutcome> out;
    json::object args{{"spin", true}};
    boost::asio::co_spawn(io, f.pool.call(tool, args, {}),
                          boost::asio::bind_cancellation_slot(
                              signal.slot(), [&](std::exception_ptr, CallOutcome outcome) {
                                out = std::move(outcome);
                              }));
    boost::asio::steady_timer timer(io, milliseconds(200));
    auto cancelledAt = std::chrono::steady_clock::now();
    timer.async_wait([&](boost::system::error_code) {
      cancelledAt = std::chrono::steady_clock::now();
      signal.emit(boost::asio::cancellation_type::terminal);
    });
    io.run();
    auto lag = std::chrono::steady_clock::now() - cancelledAt;
    REQUIRE(out);
    INFO(describe(*out));
    REQUIRE(errc(*out) == CallErrc::cancelled);
    CHECK(out->result.error().detail == "the caller cancelled the call");
    CHECK(lag < milliseconds(3000));  // at once, not after the busy calls
    auto next = f.call(tool);  // the sandbox was discarded: the counter starts again
    CHECK(*next.result == 1);
    CHECK(next.usage.freshSandbox);
  }
  SECTION("while it waits for the sandbox behind another call: answered at once") {
    auto behind = cancelBehind(f, {tool}, tool, {});
    INFO(describe(behind.waiting));
    CHECK(errc(behind.waiting) == CallErrc::cancelled);
    CHECK(behind.waiting.result.error().detail == "the caller cancelled the call");
    CHECK(behind.busyStillRunning);
    CHECK(behind.lag < milliseconds(3000));  // at once, not after the busy calls
    REQUIRE(behind.busy.size() == 1);
    CHECK(behind.busy[0].result.error().detail == "the sandbox was terminated by an administrator");
  }
  SECTION("a partial (non-terminal) cancellation is ignored") {
    auto slow = makeTool(kBusy);
    boost::asio::io_context io;
    boost::asio::cancellation_signal signal;
    std::optional<CallOutcome> out;
    json::object args{{"ms", 200}};
    boost::asio::co_spawn(io, f.pool.call(slow, args, {}),
                          boost::asio::bind_cancellation_slot(
                              signal.slot(), [&](std::exception_ptr, CallOutcome outcome) {
                                out = std::move(outcome);
                              }));
    boost::asio::steady_timer timer(io, milliseconds(50));
    timer.async_wait(
        [&](boost::system::error_code) { signal.emit(boost::asio::cancellation_type::partial); });
    io.run();
    REQUIRE(out);
    INFO(describe(*out));
    CHECK(out->result);
  }
}

TEST_CASE("idle sandboxes are evicted by count and by memory budget", "[pool][evict]") {
  SECTION("by count, least recently used first") {
    RuntimeConfig config = testConfig();
    config.maxRetained = 2;
    PoolFixture f(config);
    auto a = makeTool("export default () => 'a'", {}, {}, "tool-a");
    auto b = makeTool("export default () => 'b'", {}, {}, "tool-b");
    auto c = makeTool("export default () => 'c'", {}, {}, "tool-c");
    f.call(a);
    f.call(b);
    f.call(a);  // b is now least recently used
    f.call(c);
    auto list = f.pool.list();
    REQUIRE(list.size() == 2);
    CHECK(list[0].revision == a->revision);
    CHECK(list[1].revision == c->revision);
    CHECK(f.call(b).usage.freshSandbox);
  }
  SECTION("by memory budget") {
    const char* heavy =
        "globalThis.keep = new Array(1000000).fill(1.5); export default () => keep.length;";
    auto a = makeTool(heavy, {}, {}, "heavy-a");
    auto b = makeTool(heavy, {}, {}, "heavy-b");
    auto small = makeTool("export default () => 1", {}, {}, "small");
    // Measure what each holds, then give a pool room for one heavy and one small sandbox only.
    std::uint64_t heavyBytes = 0, smallBytes = 0;
    {
      PoolFixture measure;
      REQUIRE(measure.call(a).result);
      REQUIRE(measure.call(small).result);
      for (const auto& info : measure.pool.list()) {
        (info.name == "small" ? smallBytes : heavyBytes) = info.heapBytes;
      }
    }
    INFO("heavy " << heavyBytes << ", small " << smallBytes);
    REQUIRE(heavyBytes > 8u * 1024 * 1024);
    REQUIRE(smallBytes < heavyBytes / 4);
    RuntimeConfig config = testConfig();
    config.memoryBudgetMb = (heavyBytes + smallBytes + heavyBytes / 2) / (1024 * 1024);
    PoolFixture f(config);
    REQUIRE(f.call(a).result);
    REQUIRE(f.call(small).result);
    CHECK(f.pool.list().size() == 2);
    REQUIRE(f.call(b).result);
    std::vector<std::string> names;
    for (const auto& info : f.pool.list()) names.push_back(info.name);
    CHECK(names == std::vector<std::string>{"small", "heavy-b"});
  }
}

TEST_CASE("discard and terminate end a revision's sandbox", "[pool]") {
  PoolFixture f;
  auto tool = makeTool("let calls = 0; export default () => ++calls;");
  CHECK(*f.call(tool).result == 1);
  CHECK(*f.call(tool).result == 2);
  f.pool.discard(tool->revision);  // the binding moved
  CHECK(f.pool.list().empty());
  CHECK(*f.call(tool).result == 1);
  CHECK(f.pool.terminate(tool->revision));
  CHECK_FALSE(f.pool.terminate(tool->revision));
  CHECK_FALSE(f.pool.terminate("sha256:unknown"));
  f.pool.discard("sha256:unknown");
  CHECK(*f.call(tool).result == 1);
  SECTION("a discard while a call runs lets it finish, then drops the sandbox") {
    auto slow = makeTool(
        "let calls = 0; export default (args) => { const end = Date.now() + args.ms; while "
        "(Date.now() < end) {} return ++calls; }");
    boost::asio::io_context io;
    std::optional<CallOutcome> out;
    json::object args{{"ms", 200}};
    boost::asio::co_spawn(
        io, f.pool.call(slow, args, {}),
        [&](std::exception_ptr, CallOutcome outcome) { out = std::move(outcome); });
    boost::asio::steady_timer timer(io, milliseconds(50));
    timer.async_wait([&](boost::system::error_code) { f.pool.discard(slow->revision); });
    io.run();
    REQUIRE(out);
    REQUIRE(out->result);
    CHECK(*out->result == 1);
    CHECK(*f.call(slow, {{"ms", 0}}).result == 1);
  }
}

TEST_CASE("a discard while calls hold the sandbox keeps them and new calls one at a time",
          "[pool]") {
  PoolFixture f;
  auto tool = makeTool(
      "let calls = 0; export default (args) => { const end = Date.now() + args.ms; while "
      "(Date.now() < end) {} return ++calls; }");
  CHECK(*f.call(tool, {{"ms", 0}}).result == 1);
  boost::asio::io_context io;
  std::map<std::string, std::optional<CallOutcome>> out;
  auto start = [&](std::string name, int ms) {
    boost::asio::co_spawn(
        io, f.pool.call(tool, json::object{{"ms", ms}}, {}),
        [&out, name](std::exception_ptr, CallOutcome outcome) { out[name] = std::move(outcome); });
  };
  start("running", 300);
  start("waiting", 0);
  boost::asio::steady_timer timer(io, milliseconds(100));
  timer.async_wait([&](boost::system::error_code) {
    f.pool.discard(tool->revision);    // the binding moved
    CHECK(f.pool.list().size() == 1);  // still held
    start("after", 0);                 // by revision, or resolved just before the move
  });
  io.run();
  // One sandbox, one call at a time, in order: never a second sandbox of the revision beside it.
  for (const auto& [name, number] : {std::pair{"running", 2}, {"waiting", 3}, {"after", 4}}) {
    INFO(name);
    REQUIRE(out[name]);
    REQUIRE(out[name]->result);
    CHECK(*out[name]->result == number);
  }
  // Gone with the last of them.
  CHECK(f.pool.list().empty());
  CHECK(*f.call(tool, {{"ms", 0}}).result == 1);
}

TEST_CASE("a terminate with calls waiting keeps them in order on one fresh sandbox", "[pool]") {
  PoolFixture f;
  auto tool = makeTool(
      "let calls = 0; export default (args) => { if (args.spin) { for (;;) {} } return ++calls; }",
      limits({{"wallMs", 30000}, {"cpuMs", 30000}}));
  CHECK(*f.call(tool).result == 1);
  boost::asio::io_context io;
  std::optional<CallOutcome> spun, queued;
  boost::asio::co_spawn(
      io, f.pool.call(tool, {{"spin", true}}, {}),
      [&](std::exception_ptr, CallOutcome outcome) { spun = std::move(outcome); });
  std::thread runner([&] {
    auto work = boost::asio::make_work_guard(io);
    io.run_for(std::chrono::seconds(20));
  });
  StopAndJoin stopAndJoin{io, runner};
  REQUIRE(waitFor([&] {
    const auto listed = f.pool.list();
    return !listed.empty() && listed.front().busy;
  }));
  boost::asio::post(io, [&] {
    boost::asio::co_spawn(
        io, f.pool.call(tool, {}, {}),
        [&](std::exception_ptr, CallOutcome outcome) { queued = std::move(outcome); });
  });
  std::this_thread::sleep_for(milliseconds(50));  // queued behind the spinning call (or not yet)
  CHECK(f.pool.terminate(tool->revision));
  REQUIRE(waitFor([&] { return spun.has_value() && queued.has_value(); }, milliseconds(10000)));
  io.stop();
  runner.join();
  INFO(describe(*spun) << "\n" << describe(*queued));
  CHECK(errc(*spun) == CallErrc::cancelled);
  // The waiting call ran in a fresh sandbox (the terminated one's state is gone), which stays
  // retained: the next call sees its state, and no second sandbox ran beside it.
  REQUIRE(queued->result);
  CHECK(*queued->result == 1);
  CHECK(queued->usage.freshSandbox);
  CHECK(*f.call(tool).result == 2);
  CHECK(f.pool.list().size() == 1);
}

TEST_CASE("changes() replayed in order rebuild list() through evictions and terminations",
          "[pool][evict]") {
  RuntimeConfig config = testConfig();
  config.maxRetained = 2;
  PoolFixture f(config);
  std::map<std::string, SandboxInfo> mirror;
  auto replay = [&] {
    auto [updated, removed] = f.pool.changes();
    for (auto& info : updated) mirror[info.revision] = info;
    for (const auto& revision : removed) mirror.erase(revision);
    return updated.size() + removed.size();
  };
  auto matches = [&] {
    auto list = f.pool.list();
    if (list.size() != mirror.size()) return false;
    for (const auto& info : list) {
      auto found = mirror.find(info.revision);
      if (found == mirror.end()) return false;
      const SandboxInfo& known = found->second;
      if (known.name != info.name || known.calls != info.calls ||
          known.heapBytes != info.heapBytes || known.busy != info.busy) {
        return false;
      }
    }
    return true;
  };
  auto a = makeTool("let n = 0; export default () => ++n", {}, {}, "tool-a");
  auto b = makeTool("let n = 0; export default () => ++n", {}, {}, "tool-b");
  auto c = makeTool("let n = 0; export default () => ++n", {}, {}, "tool-c");
  auto broken = makeTool("throw new Error('no module'); export default () => 1", {}, {}, "broken");

  f.call(a);
  CHECK(replay() == 1);  // the first call lists every row
  CHECK(matches());
  CHECK(replay() == 0);  // nothing happened since
  f.call(b);
  f.call(a);
  CHECK(replay() == 2);
  CHECK(matches());
  f.call(c);  // evicts b, the least recently used
  CHECK(replay() == 2);
  CHECK(mirror.size() == 2);
  CHECK_FALSE(mirror.contains(b->revision));
  CHECK(matches());
  f.call(a, {}, disposable());  // a disposable call changes no row
  CHECK(replay() == 0);
  CHECK(!f.call(broken).result);  // a failed first call retains nothing (and evicted a)
  replay();
  CHECK_FALSE(mirror.contains(broken->revision));
  CHECK(matches());
  f.call(a);
  replay();
  REQUIRE(mirror.size() == 2);
  CHECK(matches());
  CHECK(f.pool.terminate(a->revision));
  f.pool.discard(c->revision);
  CHECK(replay() == 2);
  CHECK(mirror.empty());
  CHECK(matches());
  f.call(b);
  f.call(b);
  replay();
  REQUIRE(mirror.size() == 1);
  CHECK(mirror.at(b->revision).calls == 2);
  CHECK(matches());
}

TEST_CASE("limits: the manifest's, tightened by the request, capped by the daemon",
          "[pool][limits]") {
  PoolFixture f;
  auto tool = makeTool("export default () => 'ok'", limits({{"wallMs", 1000}, {"heapMb", 24}}));
  SECTION("a looser request is refused") {
    CallOptions options;
    options.limits.wallMs = 2000;
    auto outcome = f.call(tool, {}, options);
    REQUIRE(errc(outcome) == CallErrc::invalidLimits);
    CHECK(outcome.result.error().detail ==
          "limits.wallMs: 2000 is looser than the tool's 1000; a call may only tighten a tool's "
          "limits");
    options.limits.wallMs = 0;
    CHECK(errc(f.call(tool, {}, options)) == CallErrc::invalidLimits);
  }
  SECTION("a tighter request applies to that call") {
    auto spin = makeTool("export default () => { for (;;) {} }", limits({{"wallMs", 5000}}));
    CallOptions options;
    options.limits.wallMs = 100;
    auto outcome = f.call(spin, {}, options);
    CHECK(errc(outcome) == CallErrc::timeout);
    CHECK(outcome.usage.wallMs < 4500);  // the call's 100 ms, not the tool's 5000
  }
  SECTION("a tighter heap runs in a sandbox of its own") {
    auto counter =
        makeTool("let calls = 0; export default () => ++calls;", limits({{"heapMb", 24}}));
    CHECK(*f.call(counter).result == 1);
    CallOptions options;
    options.limits.heapMb = 8;
    auto tight = f.call(counter, {}, options);
    CHECK(*tight.result == 1);
    CHECK(tight.usage.freshSandbox);
    CHECK(*f.call(counter).result == 2);
  }
  SECTION("the daemon's caps bound every manifest") {
    RuntimeConfig config = testConfig();
    config.caps.wallMs = 200;
    PoolFixture capped(config);
    auto spin = makeTool("export default () => { for (;;) {} }", limits({{"wallMs", 3600000}}));
    auto outcome = capped.call(spin);
    CHECK(errc(outcome) == CallErrc::timeout);
    CHECK_THAT(outcome.result.error().detail, Catch::Contains("200 ms"));
  }
}

TEST_CASE("what the pool refuses to run", "[pool]") {
  PoolFixture f;
  SECTION("not sandboxed code") {
    auto native = makeTool("export default () => 1");
    auto copy = std::make_shared<toolhost::registry::ToolRevision>(*native);
    copy->executionClass = toolhost::registry::ExecutionClass::trustedNative;
    CHECK(errc(f.call(copy)) == CallErrc::notRunnable);
  }
  SECTION("too many calls waiting for one sandbox") {
    RuntimeConfig config = testConfig();
    config.maxQueuedPerSandbox = 2;
    PoolFixture small(config);
    auto tool = makeTool(kBusy);
    auto outcomes = callTogether(
        small.pool, {{tool, {{"ms", 50}}, {}}, {tool, {{"ms", 0}}, {}}, {tool, {{"ms", 0}}, {}}});
    CHECK(outcomes[0].result);
    CHECK(outcomes[1].result);
    CHECK(errc(outcomes[2]) == CallErrc::overloaded);
  }
}

TEST_CASE("the pool shuts down with calls in flight", "[pool]") {
  v8Platform();
  FakeHost host;
  boost::asio::io_context io;
  std::optional<CallOutcome> out;
  auto spin = makeTool("export default () => { for (;;) {} }");
  json::object args;
  {
    SandboxPool pool(testConfig(), host);
    boost::asio::co_spawn(
        io, pool.call(spin, args, {}),
        [&](std::exception_ptr, CallOutcome outcome) { out = std::move(outcome); });
    io.run_for(milliseconds(100));  // the call is now spinning on a worker
  }                                 // the destructor cancels it and joins the workers
  io.restart();
  io.run();
  REQUIRE(out);
  CHECK(errc(*out) == CallErrc::cancelled);
  CHECK(out->result.error().detail == "the runtime is shutting down");
}

TEST_CASE("host operations: a call waits for those it started, and their wait is bounded",
          "[pool][ctx]") {
  PoolFixture f;
  json::object subtasks{{"capabilities", json::object{{"subtasks", true}}}};
  SECTION("an operation the tool did not await still finishes before the call ends") {
    auto tool =
        makeTool("export default (args, ctx) => { ctx.resolveInvocation('late'); return 'done'; }",
                 subtasks);
    auto outcome = f.call(tool);
    REQUIRE(outcome.result);
    CHECK(*outcome.result == "done");
    CHECK(f.host.resolved == std::vector<std::string>{"test-tool -> late"});
  }
  SECTION("an endless chain of operations ends at the wall-clock limit") {
    auto tool = makeTool(
        "export default async (args, ctx) => { for (;;) await ctx.resolveInvocation('again'); }",
        json::object{{"capabilities", json::object{{"subtasks", true}}},
                     {"limits", json::object{{"wallMs", 300}}}});
    auto outcome = f.call(tool);
    INFO(describe(outcome));
    CHECK((errc(outcome) == CallErrc::timeout || errc(outcome) == CallErrc::cpuLimit));
    CHECK(outcome.usage.wallMs < 10000);  // a bound: unchecked it would run for ever
    CHECK(f.host.resolved.size() > 10);
  }
  SECTION("a cancel reaches a call between its segments") {
    auto tool = makeTool(
        "export default async (args, ctx) => { for (;;) await ctx.resolveInvocation('again'); }",
        subtasks);
    auto outcome = callAndCancel(f.pool, tool, milliseconds(100));
    INFO(describe(outcome));
    CHECK(errc(outcome) == CallErrc::cancelled);
  }
}

// Not a test of behaviour: prints what a sandbox costs (run with "[.perf]").
TEST_CASE("what calls cost", "[.perf]") {
  PoolFixture f;
  auto tool = makeTool("let n = 0; export default (args) => ({n: ++n, echo: args})");
  auto time = [](auto&& fn, int times) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < times; ++i) fn();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
               .count() /
           times;
  };
  REQUIRE(f.call(tool).result);
  const double warm = time([&] { REQUIRE(f.call(tool, {{"x", 1}}).result); }, 500);
  const double fresh = time([&] { REQUIRE(f.call(tool, {{"x", 1}}, disposable()).result); }, 50);
  std::printf(
      "warm retained call: %.0f us; disposable call (new isolate + context + module): %.0f us\n",
      warm, fresh);
}

namespace {

// Waits (without a time limit of its own: ctest's timeout bounds it) until the pool has all its
// pre-warmed shells ready and has built at least `built` of them.
SandboxPool::Spares awaitSpare(const SandboxPool& pool, std::uint64_t built) {
  while (true) {
    auto spares = pool.spares();
    if (spares.ready == pool.config().prewarmed && spares.built >= built) return spares;
    std::this_thread::sleep_for(milliseconds(5));
  }
}

}  // namespace

TEST_CASE("a pre-warmed shell serves one revision only and is replaced once taken",
          "[pool][prewarm]") {
  PoolFixture f;
  const unsigned kept = f.pool.config().prewarmed;
  REQUIRE(kept >= 1);
  auto spares = awaitSpare(f.pool, kept);
  CHECK(spares.taken == 0);
  CHECK(f.pool.list().empty());  // the shell is not a retained sandbox

  // Each revision leaves a mark in its global object, then reports whether it found one: a shell
  // given to a second revision (after success, a thrown evaluation, a kill, a disposable call)
  // would show the first one's mark.
  const char* marking = "const seen = globalThis.owner ?? 'none'; globalThis.owner = '$';"
                        "export default () => seen;";
  auto named = [&](const std::string& name) {
    std::string source = marking;
    source.replace(source.find('$'), 1, name);
    return makeTool(source, {}, {}, name);
  };
  auto expectTaken = [&](std::uint64_t taken) {
    auto now = awaitSpare(f.pool, taken + kept);
    CHECK(now.taken == taken);
    CHECK(now.built == taken + kept);  // replaced after each take, never handed back
  };

  auto first = named("first");
  auto outcome = f.call(first);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(*outcome.result == "none");
  CHECK(outcome.usage.freshSandbox);
  expectTaken(1);
  CHECK(*f.call(first).result == "none");  // its own sandbox, kept

  auto throwing = makeTool("globalThis.owner = 'throwing'; throw new Error('no');"
                           "export default () => 1;");
  CHECK(errc(f.call(throwing)) == CallErrc::invalidModule);
  expectTaken(2);
  CHECK(*f.call(named("second")).result == "none");
  expectTaken(3);

  auto killed = makeTool("globalThis.owner = 'killed';"
                         "export default () => { const keep = []; for (;;) keep.push(new "
                         "Array(100000).fill(1.5)); };");
  CHECK(errc(f.call(killed)) == CallErrc::memoryLimit);
  expectTaken(4);
  CHECK(*f.call(named("third")).result == "none");
  expectTaken(5);

  auto once = named("once");
  CHECK(*f.call(once, {}, disposable()).result == "none");
  expectTaken(6);
  CHECK(*f.call(once, {}, disposable()).result == "none");
  expectTaken(7);
  CHECK(*f.call(named("fourth")).result == "none");
  expectTaken(8);

  std::vector<std::string> names;
  for (const auto& info : f.pool.list()) names.push_back(info.name);
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"first", "fourth", "second", "third"});
}

TEST_CASE("first calls faster than shells are built wait for the builds under way",
          "[pool][prewarm]") {
  RuntimeConfig config = testConfig();
  config.prewarmed = 1;  // one shell: each next call finds its replacement being built
  PoolFixture f(config);
  const unsigned kept = 1;
  awaitSpare(f.pool, kept);
  // First calls back to back, as fast as the pool answers: the ready shells go at once, and
  // later calls find the replacements still being built and wait for them (or build their own).
  // No shell may serve two revisions.
  const char* marking = "const seen = globalThis.owner ?? 'none'; globalThis.owner = '$';"
                        "export default () => seen;";
  const int calls = 12;
  for (int i = 0; i < calls; ++i) {
    std::string source = marking;
    source.replace(source.find('$'), 1, std::to_string(i));
    auto outcome = f.call(makeTool(source, {}, {}, "first-" + std::to_string(i)));
    INFO(describe(outcome));
    REQUIRE(outcome.result);
    CHECK(*outcome.result == "none");
    CHECK(outcome.usage.freshSandbox);
  }
  // Every shell built went to exactly one call or is still ready; none was lost or doubled.
  auto after = awaitSpare(f.pool, kept);
  CHECK(after.taken > kept);  // more than the ready ones: some calls took builds under way
  CHECK(after.taken <= static_cast<std::uint64_t>(calls));
  CHECK(after.built == after.taken + after.ready);
  CHECK(f.pool.list().size() == static_cast<std::size_t>(calls));
}

TEST_CASE("as many shells are kept as configured, and none with prewarmed = 0",
          "[pool][prewarm]") {
  SECTION("three, taken by three first calls in a row") {
    RuntimeConfig config = testConfig();
    config.prewarmed = 3;
    PoolFixture f(config);
    awaitSpare(f.pool, 3);
    for (int i = 0; i < 3; ++i) {
      auto outcome = f.call(
          makeTool("export default () => " + std::to_string(i), {}, {}, "first-" + std::to_string(i)));
      REQUIRE(outcome.result);
      CHECK(*outcome.result == i);
      CHECK(outcome.usage.freshSandbox);
    }
    auto after = awaitSpare(f.pool, 6);
    CHECK(after.taken == 3);
    CHECK(after.built == 6);
  }
  SECTION("none") {
    RuntimeConfig config = testConfig();
    config.prewarmed = 0;
    PoolFixture f(config);
    auto outcome = f.call(makeTool("export default () => 'made on demand'"));
    REQUIRE(outcome.result);
    CHECK(*outcome.result == "made on demand");
    std::this_thread::sleep_for(milliseconds(50));  // a build would have been posted by now
    auto spares = f.pool.spares();
    CHECK(spares.ready == 0);
    CHECK(spares.built == 0);
    CHECK(spares.taken == 0);
  }
}

TEST_CASE("every limit applies in a pre-warmed shell as in a sandbox made on demand",
          "[pool][prewarm]") {
  RuntimeConfig config = testConfig();
  config.defaults.heapMb = 16;
  config.defaults.arrayBufferMb = 8;
  PoolFixture f(config);
  std::uint64_t taken = awaitSpare(f.pool, config.prewarmed).taken;
  auto run = [&](const toolhost::registry::ToolRevisionPtr& tool, bool takesShell) {
    auto outcome = f.call(tool);
    auto now = awaitSpare(f.pool, 1);
    CHECK(now.taken == taken + (takesShell ? 1 : 0));
    taken = now.taken;
    return outcome;
  };

  SECTION("heap") {
    auto outcome = run(makeTool("export default () => { const keep = []; for (;;) "
                                "keep.push(new Array(100000).fill(1.5)); }"),
                       true);
    INFO(describe(outcome));
    CHECK(errc(outcome) == CallErrc::memoryLimit);
    CHECK(outcome.result.error().detail.find("16 MiB") != std::string::npos);
    // The same bomb at module evaluation, in the first call.
    outcome = run(makeTool("const keep = []; for (;;) keep.push(new Array(100000).fill(1.5));"
                           "export default () => 1;"),
                  true);
    INFO(describe(outcome));
    CHECK(errc(outcome) == CallErrc::memoryLimit);
    // A revision with its own heap limit builds its sandbox on demand, with that limit.
    outcome = run(makeTool("export default () => { const keep = []; for (;;) "
                           "keep.push(new Array(100000).fill(1.5)); }",
                           limits({{"heapMb", 8}})),
                  false);
    INFO(describe(outcome));
    CHECK(errc(outcome) == CallErrc::memoryLimit);
    CHECK(outcome.result.error().detail.find("8 MiB") != std::string::npos);
  }
  SECTION("ArrayBuffer") {
    auto outcome = run(makeTool("export default () => new ArrayBuffer(12 * 1024 * 1024).byteLength"),
                       true);
    INFO(describe(outcome));
    CHECK(errc(outcome) == CallErrc::arrayBufferLimit);
    outcome = run(makeTool("export default () => new ArrayBuffer(6 * 1024 * 1024).byteLength"),
                  true);
    INFO(describe(outcome));
    REQUIRE(outcome.result);
    CHECK(*outcome.result == 6 * 1024 * 1024);
  }
  SECTION("wall clock, CPU and stack") {
    auto outcome =
        run(makeTool("export default () => { for (;;) {} }", limits({{"wallMs", 300}})), true);
    INFO(describe(outcome));
    CHECK((errc(outcome) == CallErrc::timeout || errc(outcome) == CallErrc::cpuLimit));
    outcome = run(makeTool("const f = (n) => f(n + 1) + 1; export default () => f(0);",
                           limits({{"stackKb", 256}})),
                  true);
    INFO(describe(outcome));
    CHECK(errc(outcome) == CallErrc::stackLimit);
  }
  SECTION("a request that tightens the heap limit of a disposable call") {
    auto options = disposable();
    options.limits.heapMb = 8;
    auto outcome = f.call(makeTool("export default () => { const keep = []; for (;;) "
                                   "keep.push(new Array(100000).fill(1.5)); }"),
                          {}, std::move(options));
    INFO(describe(outcome));
    CHECK(errc(outcome) == CallErrc::memoryLimit);
    CHECK(outcome.result.error().detail.find("8 MiB") != std::string::npos);
    CHECK(awaitSpare(f.pool, 1).taken == taken);
  }
}

TEST_CASE("calls in sandboxes of their own hold heaps within memory_budget_mb together",
          "[pool][limits]") {
  RuntimeConfig config = testConfig();
  config.memoryBudgetMb = 64;  // two heaps of 32 MiB
  PoolFixture f(config);
  auto spin = makeTool("export default () => { for (;;) {} }", limits({{"wallMs", 300}}));
  auto outcomes = callTogether(f.pool, {{spin, {}, disposable()},
                                        {spin, {}, disposable()},
                                        {spin, {}, disposable()},
                                        {spin, {}, {}}});  // retained: counted as before
  CHECK(errc(outcomes[0]) == CallErrc::timeout);
  CHECK(errc(outcomes[1]) == CallErrc::timeout);
  REQUIRE(errc(outcomes[2]) == CallErrc::overloaded);
  CHECK_THAT(outcomes[2].result.error().detail, Catch::Contains("memory_budget_mb"));
  CHECK(errc(outcomes[3]) == CallErrc::timeout);
  // Given back when they end.
  auto quick = makeTool("export default () => 'ok'");
  auto again = callTogether(f.pool, {{quick, {}, disposable()}, {quick, {}, disposable()}});
  CHECK(*again[0].result == "ok");
  CHECK(*again[1].result == "ok");
}

TEST_CASE("arguments that would outgrow the heap limit are refused before V8 parses them",
          "[pool][limits]") {
  // JSON.parse never checks for termination: past the heap limit it would run on (the callback
  // grants headroom) until its whole process is killed as stalled.
  PoolFixture f;  // a 32 MiB heap
  auto tool = makeTool("let calls = 0; export default (args) => ++calls;");
  REQUIRE(f.call(tool).result);

  json::array many(1'000'000, json::object{});  // 3 MB of JSON, about 48 MiB as V8 objects
  auto outcome = f.call(tool, json::object{{"a", std::move(many)}});
  INFO(describe(outcome));
  REQUIRE(errc(outcome) == CallErrc::memoryLimit);
  CHECK_THAT(outcome.result.error().detail,
             Catch::Contains("the arguments (3000007 bytes of JSON) would take"));
  CHECK_THAT(outcome.result.error().detail, Catch::Contains("32 MiB"));

  // A limit was hit, so the sandbox went (as for any limit), and the next call gets a fresh one.
  auto next = f.call(tool);
  REQUIRE(next.result);
  CHECK(*next.result == 1);
  // Large arguments that fit still pass: 200,000 numbers (estimated under 10 MiB).
  json::array numbers(200'000, 7);
  next = f.call(tool, json::object{{"n", std::move(numbers)}});
  REQUIRE(next.result);
  CHECK(*next.result == 2);
}
