// ctx.storage through the real daemon: values per tool name that outlive calls, sandboxes,
// revisions and restarts, quotas and bad keys as error codes the tool sees, the manifest's
// capabilities.storage, [storage] reloads, and the storage.* methods for operators.
#include "tests/support/daemon_process.h"

#include "protocol/json_text.h"

#include <boost/json/parse.hpp>
#include <catch2/catch.hpp>

#include <csignal>
#include <fstream>
#include <thread>

using namespace toolhost::testing;
namespace json = boost::json;

namespace {

json::object storageTool(std::string_view name, std::string_view source, bool storage = true) {
  json::object manifest{
      {"name", name},
      {"description", "a tool that keeps state"},
      {"parameters", json::parse(R"({"type":"object"})")},
      {"execution",
       json::object{{"class", "sandboxed-code"}, {"runtime", "javascript"}, {"source", source}}}};
  if (storage) manifest["capabilities"] = json::object{{"storage", true}};
  return manifest;
}

std::string deploy(RawClient& client, const json::object& manifest) {
  auto installed = client.call("tools.install", json::object{{"manifest", manifest}});
  INFO(toolhost::protocol::writeJson(installed));
  REQUIRE(installed.contains("result"));
  std::string revision(installed.at("result").at("revision").as_string());
  auto activated = client.call(
      "tools.activate",
      json::object{{"name", manifest.at("name")}, {"revision", revision}, {"replace", true}});
  INFO(toolhost::protocol::writeJson(activated));
  REQUIRE(activated.contains("result"));
  return revision;
}

json::value callTool(RawClient& client, std::string_view name, json::object extra = {}) {
  json::object params{{"name", name}, {"arguments", json::object{}}};
  for (auto& [key, value] : extra) params[key] = value;
  auto response = client.call("tools.call", params);
  INFO(toolhost::protocol::writeJson(response));
  REQUIRE(response.contains("result"));
  return response.at("result").at("result");
}

json::value resultOf(const json::object& response) {
  INFO(toolhost::protocol::writeJson(response));
  REQUIRE(response.contains("result"));
  return response.at("result");
}

// A module variable (the retained sandbox: a cache) next to a stored counter (the store).
constexpr std::string_view kCounter =
    "let calls = 0;\n"
    "export default async (args, ctx) => {\n"
    "  calls += 1;\n"
    "  const n = ((await ctx.storage.get('n')) ?? 0) + 1;\n"
    "  const usage = await ctx.storage.set('n', n);\n"
    "  return { n, calls, usage, keys: await ctx.storage.list() };\n"
    "};";

}  // namespace

TEST_CASE("ctx.storage keeps values per tool name across calls, sandboxes, revisions and restarts",
          "[e2e][storage]") {
  TempDir state;
  DaemonOptions options;
  options.stateDir = state.path() / "state";
  auto daemon = DaemonProcess::start(options);
  {
    RawClient client(daemon->socket());
    const std::string v1 = deploy(client, storageTool("counter", kCounter));

    auto first = callTool(client, "counter");
    CHECK(first.at("n") == 1);
    CHECK(first.at("calls") == 1);
    CHECK(first.at("keys") == json::parse(R"(["n"])"));
    // The usage after the write: key "n" (1 byte) and the value "1" (1 byte); and the quotas.
    CHECK(first.at("usage") ==
          json::parse(R"({"keys":1,"bytes":2,"maxKeys":1000,"maxBytes":10485760})"));
    auto second = callTool(client, "counter");
    CHECK(second.at("n") == 2);
    CHECK(second.at("calls") == 2);

    // A disposable call has a fresh sandbox, and the same storage.
    auto disposable = callTool(client, "counter", json::object{{"mode", "disposable"}});
    CHECK(disposable.at("n") == 3);
    CHECK(disposable.at("calls") == 1);

    // Retained memory is a cache: terminating the sandbox resets the module variable, not the
    // stored value.
    CHECK(callTool(client, "counter").at("calls") == 3);
    REQUIRE(client.call("sandboxes.terminate", json::object{{"revision", v1}}).contains("result"));
    auto afterTerminate = callTool(client, "counter");
    CHECK(afterTerminate.at("n") == 5);
    CHECK(afterTerminate.at("calls") == 1);

    // A new revision of the same name shares the storage.
    auto v2Manifest = storageTool("counter", kCounter);
    v2Manifest["description"] = "counts, revised";
    const std::string v2 = deploy(client, v2Manifest);
    REQUIRE(v2 != v1);
    auto revised = callTool(client, "counter");
    CHECK(revised.at("n") == 6);
    CHECK(revised.at("calls") == 1);
    // So does a call pinned to the old revision.
    auto pinned =
        client.call("tools.call", json::object{{"revision", v1}, {"arguments", json::object{}}});
    CHECK(resultOf(pinned).at("result").at("n") == 7);

    // Another tool name does not see it.
    deploy(client, storageTool("other-counter", kCounter));
    CHECK(callTool(client, "other-counter").at("n") == 1);
  }

  REQUIRE(daemon->stop() == 0);
  daemon = DaemonProcess::start(options);
  RawClient client(daemon->socket());
  auto restarted = callTool(client, "counter");
  CHECK(restarted.at("n") == 8);
  CHECK(restarted.at("calls") == 1);
  CHECK(callTool(client, "other-counter").at("n") == 2);

  // Operators see what tools keep, and can clear one tool's data.
  auto tools = resultOf(client.call("storage.list")).at("tools");
  CHECK(tools == json::parse(R"([{"keys":1,"bytes":2,"tool":"counter"},
                                 {"keys":1,"bytes":2,"tool":"other-counter"}])"));
  auto entries = resultOf(client.call("storage.list", json::object{{"tool", "counter"}}));
  CHECK(entries.at("entries") == json::parse(R"([{"key":"n","bytes":2}])"));
  CHECK(resultOf(client.call("storage.get", json::object{{"tool", "counter"}, {"key", "n"}})) ==
        json::parse(R"({"found":true,"value":8})"));
  CHECK(resultOf(client.call("storage.get", json::object{{"tool", "counter"}, {"key", "m"}})) ==
        json::parse(R"({"found":false})"));
  CHECK(resultOf(client.call("storage.clear", json::object{{"tool", "counter"}})) ==
        json::parse(R"({"keys":1,"bytes":2,"tool":"counter"})"));
  CHECK(callTool(client, "counter").at("n") == 1);
  CHECK(callTool(client, "other-counter").at("n") == 3);
  auto badName = client.call("storage.clear", json::object{{"tool", "Not A Name"}});
  CHECK(badName.at("error").at("code") == -32602);
  // A name no tool ever had (a typo) is not found, rather than an empty store.
  for (const auto& [method, params] :
       {std::pair{"storage.get", json::object{{"tool", "countr"}, {"key", "n"}}},
        std::pair{"storage.list", json::object{{"tool", "countr"}}},
        std::pair{"storage.clear", json::object{{"tool", "countr"}}}}) {
    INFO(method);
    auto typo = client.call(method, params);
    CHECK(typo.at("error").at("code") == -32001);
    CHECK_THAT(std::string(typo.at("error").at("data").at("detail").as_string()),
               Catch::Contains("no tool named countr was ever installed"));
  }
  // A tool that keeps nothing now is still found.
  resultOf(client.call("storage.clear", json::object{{"tool", "counter"}}));
  CHECK(resultOf(client.call("storage.clear", json::object{{"tool", "counter"}})).at("keys") == 0);
  CHECK(resultOf(client.call("storage.list", json::object{{"tool", "counter"}})).at("keys") == 0);
}

TEST_CASE("ctx.storage: values, missing keys, delete, and many operations at once",
          "[e2e][storage]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  deploy(
      client,
      storageTool(
          "kv",
          "export default async (args, ctx) => {\n"
          "  const doc = { z: 1, a: [true, null, 'é ☃ 😀'], n: -1.5e-7 };\n"
          "  await ctx.storage.set('doc', doc);\n"
          "  await ctx.storage.set('undef', undefined);\n"
          "  const got = await ctx.storage.get('doc');\n"
          "  const missing = await ctx.storage.get('nothing');\n"
          "  const deleted = [await ctx.storage.delete('doc'),\n"
          "                   await ctx.storage.delete('doc')];\n"
          "  await Promise.all(Array.from({ length: 100 },\n"
          "      (_, i) => ctx.storage.set('k' + String(i).padStart(3, '0'), i)));\n"
          "  const keys = await ctx.storage.list();\n"
          "  const values = await Promise.all(keys.slice(0, 3).map((k) => ctx.storage.get(k)));\n"
          "  return { got, order: Object.keys(got), missing, deleted,\n"
          "           undef: await ctx.storage.get('undef'), count: keys.length,\n"
          "           first: keys.slice(0, 3), last: keys[keys.length - 1], values };\n"
          "};"));
  auto result = callTool(client, "kv");
  CHECK(result.at("got") == json::parse(R"({"z":1,"a":[true,null,"é ☃ 😀"],"n":-1.5e-7})"));
  CHECK(result.at("order") == json::parse(R"(["z","a","n"])"));
  CHECK(result.at("missing") == nullptr);
  CHECK(result.at("deleted") == json::parse("[true,false]"));
  CHECK(result.at("undef") == nullptr);  // undefined is stored as null, as JSON has no undefined
  CHECK(result.at("count") == 101);
  CHECK(result.at("first") == json::parse(R"(["k000","k001","k002"])"));
  CHECK(result.at("last") == "undef");
  CHECK(result.at("values") == json::parse("[0,1,2]"));
}

TEST_CASE("ctx.storage: quotas, bad keys and a manifest without the capability are error codes",
          "[e2e][storage]") {
  DaemonOptions options;
  options.configToml =
      "[storage]\nmax_keys = 2\nmax_key_bytes = 16\nmax_value_bytes = 100\nmax_total_bytes = 150\n";
  auto daemon = DaemonProcess::start(options);
  RawClient client(daemon->socket());
  constexpr std::string_view kProbe =
      "export default async (args, ctx) => {\n"
      "  const outcome = async (f) => {\n"
      "    try { return { ok: await f() }; } catch (e) { return { code: e.code, message: e.message "
      "}; }\n"
      "  };\n"
      "  return {\n"
      "    a: await outcome(() => ctx.storage.set('a', 'x'.repeat(98))),\n"
      "    bigValue: await outcome(() => ctx.storage.set('b', 'x'.repeat(99))),\n"
      "    b: await outcome(() => ctx.storage.set('b', 'x'.repeat(40))),\n"
      "    total: await outcome(() => ctx.storage.set('b', 'x'.repeat(60))),\n"
      "    c: await outcome(() => ctx.storage.set('c', 1)),\n"
      "    empty: await outcome(() => ctx.storage.set('', 1)),\n"
      "    long: await outcome(() => ctx.storage.set('k'.repeat(17), 1)),\n"
      "    control: await outcome(() => ctx.storage.get('line\\nbreak')),\n"
      "    notString: await outcome(() => ctx.storage.get(42)),\n"
      "    loneSurrogate: await outcome(() => ctx.storage.set('\\ud800', 1)),\n"
      "    pairedSurrogates: await outcome(() => ctx.storage.get('\\ud83d\\ude00')),\n"
      "    overwrite: await outcome(() => ctx.storage.set('a', 'y')),\n"
      "    keys: await outcome(() => ctx.storage.list()),\n"
      "  };\n"
      "};";
  deploy(client, storageTool("probe", kProbe));
  auto r = callTool(client, "probe");
  INFO(toolhost::protocol::writeJson(r));
  CHECK(r.at("a").at("ok").at("bytes") == 101);  // 1 + 100: a value exactly at max_value_bytes
  CHECK(r.at("bigValue").at("code") == "quota-exceeded");
  CHECK_THAT(std::string(r.at("bigValue").at("message").as_string()),
             Catch::Contains("max_value_bytes") && Catch::Contains("101 bytes") &&
                 Catch::Contains("100 bytes"));
  CHECK(r.at("b").at("ok").at("bytes") == 144);
  CHECK(r.at("total").at("code") == "quota-exceeded");
  CHECK_THAT(std::string(r.at("total").at("message").as_string()),
             Catch::Contains("max_total_bytes") && Catch::Contains("164 bytes") &&
                 Catch::Contains("150 bytes"));
  CHECK(r.at("c").at("code") == "quota-exceeded");
  CHECK_THAT(std::string(r.at("c").at("message").as_string()), Catch::Contains("max_keys"));
  CHECK(r.at("empty").at("code") == "invalid-argument");
  CHECK(r.at("long").at("code") == "invalid-argument");
  CHECK_THAT(std::string(r.at("long").at("message").as_string()),
             Catch::Contains("max_key_bytes") && Catch::Contains("16 bytes"));
  CHECK(r.at("control").at("code") == "invalid-argument");
  CHECK(r.at("notString").at("code") == "invalid-argument");
  // A lone surrogate has no UTF-8 form: refused, not stored as U+FFFD under another key's name.
  CHECK(r.at("loneSurrogate").at("code") == "invalid-argument");
  CHECK(r.at("pairedSurrogates").at("ok").is_null());
  CHECK(r.at("overwrite").at("ok").at("bytes") == 47);  // 43 + 1 + 3
  CHECK(r.at("keys").at("ok") == json::parse(R"(["a","b"])"));

  // The same code without capabilities.storage: refused, and nothing is read or written.
  deploy(client, storageTool("unrequested", kProbe, false));
  auto refused = callTool(client, "unrequested");
  CHECK(refused.at("a").at("code") == "not-authorized");
  CHECK_THAT(std::string(refused.at("a").at("message").as_string()),
             Catch::Contains("capabilities"));
  CHECK(refused.at("keys").at("code") == "not-authorized");
  CHECK(resultOf(client.call("storage.list", json::object{{"tool", "unrequested"}})).at("keys") ==
        0);

  // A reload applies [storage] to the operations that follow.
  std::ofstream(daemon->dir() / "toolhost.toml")
      << "[storage]\nmax_keys = 3\nmax_key_bytes = 16\nmax_value_bytes = 100\n"
         "max_total_bytes = 150\n";
  ::kill(daemon->pid(), SIGHUP);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (daemon->log().find("storage.max_keys: 2 -> 3") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  INFO(daemon->log());
  REQUIRE(daemon->log().find("storage.max_keys: 2 -> 3") != std::string::npos);
  auto again = callTool(client, "probe");
  CHECK(again.at("c").at("ok").at("keys") == 3);
  CHECK(again.at("c").at("ok").at("maxKeys") == 3);
}

TEST_CASE("storage.clear frees a state database a tool filled", "[e2e][storage]") {
  DaemonOptions options;
  options.configToml = "[store]\nmap_size_mb = 8\n";
  auto daemon = DaemonProcess::start(options);
  RawClient client(daemon->socket());
  deploy(
      client,
      storageTool("filler",
                  "export default async (a, ctx) => {\n"
                  "  let i = 0;\n"
                  "  try {\n"
                  "    for (; i < 1000; i++) await ctx.storage.set('k' + i, 'x'.repeat(60000));\n"
                  "  } catch (e) { return { stored: i, code: e.code }; }\n"
                  "  return { stored: i };\n"
                  "};"));
  auto filled = callTool(client, "filler");
  INFO(toolhost::protocol::writeJson(filled));
  REQUIRE(filled.at("code") == "storage-full");
  const auto stored = filled.at("stored").to_number<std::int64_t>();
  REQUIRE(stored > 64);
  auto health = resultOf(client.call("daemon.health"));
  CHECK(health.at("status") == "degraded");
  CHECK(health.at("checks").at("store").at("ok") == false);
  // One transaction over every row would not fit in the full map; the clear still goes through.
  auto cleared = resultOf(client.call("storage.clear", json::object{{"tool", "filler"}}));
  CHECK(cleared.at("keys") == stored);
  CHECK(resultOf(client.call("daemon.health")).at("status") == "ok");
  CHECK(resultOf(client.call("storage.list", json::object{{"tool", "filler"}})).at("keys") == 0);
  // The room is the tool's again (less what LMDB keeps for its own bookkeeping meanwhile).
  auto again = callTool(client, "filler");
  CHECK(again.at("stored").to_number<std::int64_t>() > stored / 2);
}

TEST_CASE("[storage] settings out of range stop the daemon with a clear message",
          "[e2e][storage]") {
  DaemonOptions options;
  options.configToml = "[storage]\nmax_key_bytes = 1000\n";
  options.waitUntilReady = false;
  auto daemon = DaemonProcess::start(options);
  auto status = daemon->wait(std::chrono::seconds(10));
  REQUIRE(status);
  CHECK(*status == 2);
  CHECK_THAT(daemon->log(),
             Catch::Contains("storage.max_key_bytes") && Catch::Contains("from 1 to 446"));
  options.configToml = "[storage]\nmax_entries = 10\n";
  daemon = DaemonProcess::start(options);
  status = daemon->wait(std::chrono::seconds(10));
  REQUIRE(status);
  CHECK_THAT(daemon->log(),
             Catch::Contains("storage.max_entries") && Catch::Contains("not a known key"));
}

TEST_CASE("a file size limit reached by the state database is a full disk, not the daemon's end",
          "[e2e][storage]") {
  // Past RLIMIT_FSIZE a write raises SIGXFSZ, whose default action ends the process: the write
  // must fail with the disk-full error instead, and the daemon go on serving.
  DaemonOptions options;
  options.fileSizeLimitBytes = 3 << 20;
  auto daemon = DaemonProcess::start(options);
  RawClient client(daemon->socket());
  deploy(client,
         storageTool("grower",
                     "export default async (a, ctx) => {\n"
                     "  let stored = 0, code = null, failed = 0;\n"
                     "  for (let i = 0; i < 60; i++) {\n"
                     "    try { await ctx.storage.set('k' + i, 'y'.repeat(3000)); ++stored; }\n"
                     "    catch (e) { if (code === null) code = e.code; ++failed; }\n"
                     "  }\n"
                     "  return { stored, code, failed };\n"
                     "};"));
  // Large revisions first, until the file reaches the limit.
  bool full = false;
  for (int i = 0; i < 40 && !full; ++i) {
    auto big = storageTool("big" + std::to_string(i),
                           "export default async () => '" + std::string(300000, 'z') + "';");
    full = client.call("tools.install", json::object{{"manifest", big}}).contains("error");
  }
  REQUIRE(full);
  auto grown = callTool(client, "grower");
  INFO(toolhost::protocol::writeJson(grown));
  CHECK(grown.at("failed").to_number<std::int64_t>() > 0);
  CHECK(grown.at("code") == "storage-full");
  REQUIRE(daemon->running());
  CHECK(client.call("ping").contains("result"));
  CHECK(resultOf(client.call("daemon.health")).at("status") == "degraded");
  CHECK(resultOf(client.call("storage.list", json::object{{"tool", "grower"}})).at("keys") ==
        grown.at("stored"));
}

TEST_CASE("writes failing on a full state database do not each cost a log line", "[e2e][storage]") {
  DaemonOptions options;
  options.configToml = "[store]\nmap_size_mb = 4\n";
  auto daemon = DaemonProcess::start(options);
  RawClient client(daemon->socket());
  deploy(client, storageTool("flooder",
                             "export default async (a, ctx) => {\n"
                             "  let failed = 0;\n"
                             "  for (let i = 0; i < 400; i++) {\n"
                             "    try { await ctx.storage.set('k' + i, 'x'.repeat(60000)); }\n"
                             "    catch (e) { ++failed; }\n"
                             "  }\n"
                             "  return { failed };\n"
                             "};"));
  auto flooded = callTool(client, "flooder");
  INFO(toolhost::protocol::writeJson(flooded));
  REQUIRE(flooded.at("failed").to_number<std::int64_t>() > 200);
  const std::string log = daemon->log();
  std::size_t lines = 0;
  for (std::size_t at = 0; (at = log.find("state database", at)) != std::string::npos; ++at) {
    ++lines;
  }
  CHECK(lines < 60);
}

TEST_CASE("daemon.health says so when writes fail for a reason other than room", "[e2e][storage]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  deploy(client, storageTool("writer",
                             "export default async (a, ctx) => {\n"
                             "  try { await ctx.storage.set('k', 'v'); return { ok: true }; }\n"
                             "  catch (e) { return { code: e.code }; }\n"
                             "};"));
  const auto data = daemon->stateDir() / "db" / "data.mdb";
  // An immutable data file: every write fails with EPERM (needs CAP_LINUX_IMMUTABLE and a file
  // system with the attribute).
  auto chattr = [&](const char* flag) {
    return runProgram({"/usr/bin/chattr", flag, data.string()}).status == 0;
  };
  if (!chattr("+i")) {
    WARN("chattr +i is not available here; not checked");
    return;
  }
  auto failed = callTool(client, "writer");
  const auto health = resultOf(client.call("daemon.health"));
  chattr("-i");
  INFO(toolhost::protocol::writeJson(failed));
  INFO(toolhost::protocol::writeJson(health));
  CHECK(failed.at("code") == "storage-failed");
  CHECK(health.at("status") == "degraded");
  CHECK(health.at("checks").at("store").at("ok") == false);
  CHECK_THAT(std::string(health.at("checks").at("store").at("detail").as_string()),
             Catch::Contains("the last write failed: permission denied"));
  // A write that goes through clears it.
  CHECK(callTool(client, "writer").at("ok") == true);
  CHECK(resultOf(client.call("daemon.health")).at("status") == "ok");
}

TEST_CASE("storage.clear frees a full disk too", "[e2e][storage]") {
  // As a full map, but the file cannot grow (here: the file size limit): only the pages earlier
  // commits freed make room, which LMDB reuses from the commit after the next.
  DaemonOptions options;
  options.fileSizeLimitBytes = 3 << 20;
  auto daemon = DaemonProcess::start(options);
  RawClient client(daemon->socket());
  deploy(client,
         storageTool(
             "filler",
             "export default async (a, ctx) => {\n"
             "  let stored = 0;\n"
             "  for (const [count, size] of [[200, 60000], [2000, 100]]) {\n"
             "    for (let i = 0; i < count; i++) {\n"
             "      try { await ctx.storage.set(size + '-' + i, 'y'.repeat(size)); ++stored; }\n"
             "      catch (e) { break; }\n"
             "    }\n"
             "  }\n"
             "  return { stored };\n"
             "};"));
  auto filled = callTool(client, "filler");
  INFO(toolhost::protocol::writeJson(filled));
  const auto stored = filled.at("stored").to_number<std::int64_t>();
  REQUIRE(stored > 40);
  auto cleared = client.call("storage.clear", json::object{{"tool", "filler"}});
  INFO(toolhost::protocol::writeJson(cleared));
  REQUIRE(cleared.contains("result"));
  CHECK(cleared.at("result").at("keys") == stored);
  CHECK(resultOf(client.call("storage.list", json::object{{"tool", "filler"}})).at("keys") == 0);
}
