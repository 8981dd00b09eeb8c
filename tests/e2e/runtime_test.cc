// Sandboxed JavaScript tools through the real daemon: tools.call, retained and disposable
// sandboxes, cancellation, limits as JSON-RPC errors, and the sandboxes family.
#include "daemon/errors.h"
#include "tests/support/daemon_process.h"

#include "protocol/json_parse.h"
#include "protocol/json_text.h"
#include "protocol/jsonrpc.h"

#include <linux/landlock.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <boost/json/parse.hpp>
#include <catch2/catch.hpp>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace toolhost::testing;
namespace json = boost::json;

namespace {

json::object jsTool(std::string_view name, std::string_view source, json::object extra = {}) {
  json::object manifest{
      {"name", name},
      {"description", "a test tool"},
      {"parameters", json::parse(R"({"type":"object"})")},
      {"execution", json::object{{"class", "sandboxed-code"}, {"runtime", "javascript"}, {"source", source}}}};
  for (auto& [key, value] : extra) manifest[key] = value;
  return manifest;
}

// Installs and activates; returns the revision.
std::string deploy(RawClient& client, const json::object& manifest) {
  auto installed = client.call("tools.install", json::object{{"manifest", manifest}});
  INFO(toolhost::protocol::writeJson(installed));
  REQUIRE(installed.contains("result"));
  std::string revision(installed.at("result").at("revision").as_string());
  auto activated = client.call("tools.activate", json::object{{"name", manifest.at("name")}, {"revision", revision}, {"replace", true}});
  REQUIRE(activated.contains("result"));
  return revision;
}

json::object call(RawClient& client, std::string_view name, json::object arguments = {}, json::object extra = {}) {
  json::object params{{"name", name}, {"arguments", std::move(arguments)}};
  for (auto& [key, value] : extra) params[key] = value;
  return client.call("tools.call", params);
}

std::int64_t errorCode(const json::object& response) {
  INFO(toolhost::protocol::writeJson(response));
  REQUIRE(response.contains("error"));
  return response.at("error").at("code").as_int64();
}

std::string errorKind(const json::object& response) {
  return std::string(response.at("error").at("data").at("kind").as_string());
}

json::value resultOf(const json::object& response) {
  INFO(toolhost::protocol::writeJson(response));
  REQUIRE(response.contains("result"));
  return response.at("result").at("result");
}

std::size_t retainedCount(RawClient& client) {
  return client.call("sandboxes.list").at("result").at("sandboxes").as_array().size();
}

}  // namespace

TEST_CASE("a sandboxed tool runs with its modules, state is retained per revision", "[e2e][runtime]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  auto counter = jsTool("counter",
                        "import { step } from './lib/step.js';\n"
                        "let n = 0;\n"
                        "export default async function (args, ctx) {\n"
                        "  n += step(args.by ?? 1);\n"
                        "  console.log('n =', n);\n"
                        "  return { n, tool: ctx.tool.name };\n"
                        "}");
  counter["execution"].as_object()["modules"] = json::object{{"lib/step.js", "export const step = (x) => x * 10;"}};
  counter["parameters"] = json::parse(R"({"type":"object","properties":{"by":{"type":"integer"}}})");
  std::string revision = deploy(client, counter);

  auto first = call(client, "counter", json::object{{"by", 2}});
  CHECK(resultOf(first) == json::parse(R"({"n":20,"tool":"counter"})"));
  CHECK(first.at("result").at("revision") == json::value(revision));
  CHECK(first.at("result").at("usage").at("freshSandbox") == true);
  CHECK(first.at("result").at("logs") == "[log] n = 20\n");
  auto second = call(client, "counter");
  CHECK(resultOf(second).at("n") == 30);
  CHECK(second.at("result").at("usage").at("freshSandbox") == false);
  // A disposable call gets a fresh sandbox of its own and leaves the retained one alone.
  CHECK(resultOf(call(client, "counter", {}, json::object{{"mode", "disposable"}})).at("n") == 10);
  CHECK(resultOf(call(client, "counter")).at("n") == 40);

  auto listed = client.call("sandboxes.list").at("result").at("sandboxes").as_array();
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].at("revision") == json::value(revision));
  CHECK(listed[0].at("calls") == 3);

  // Moving the binding discards the old revision's sandbox; the new one starts fresh.
  auto v2 = counter;
  v2["description"] = "counts, again";
  std::string revision2 = deploy(client, v2);
  CHECK(resultOf(call(client, "counter")).at("n") == 10);
  auto after = client.call("sandboxes.list").at("result").at("sandboxes").as_array();
  REQUIRE(after.size() == 1);
  CHECK(after[0].at("revision") == json::value(revision2));

  // The old revision is still callable by revision (pinned calls keep working), in a new sandbox.
  auto pinned = client.call("tools.call", json::object{{"revision", revision}, {"arguments", json::object{}}});
  CHECK(resultOf(pinned).at("n") == 10);

  CHECK(client.call("sandboxes.terminate", json::object{{"revision", revision2}}).contains("result"));
  CHECK(errorCode(client.call("sandboxes.terminate", json::object{{"revision", revision2}})) == -32001);
  CHECK(resultOf(call(client, "counter")).at("n") == 10);
}

TEST_CASE("limits and failures become distinct JSON-RPC errors, the daemon survives", "[e2e][runtime]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  auto limits = json::object{{"limits", json::parse(R"({"wallMs":400,"cpuMs":300,"heapMb":32,"arrayBufferMb":8,"outputBytes":1000})")}};
  deploy(client, jsTool("spin", "export default async () => { for (;;) {} }", limits));
  // The memory bombs get wall and CPU limits they cannot reach first, even on a loaded machine.
  auto memoryLimits = json::object{{"limits", json::parse(R"({"wallMs":60000,"cpuMs":30000,"heapMb":32,"arrayBufferMb":8})")}};
  deploy(client, jsTool("hog", "export default async () => { const a = []; for (;;) a.push({x: [1,2,3,4]}); }", memoryLimits));
  deploy(client, jsTool("buffers", "export default async () => { const k = []; for (;;) k.push(new ArrayBuffer(1 << 20)); }", memoryLimits));
  deploy(client, jsTool("chatty", "export default async () => 'x'.repeat(5000)", limits));
  deploy(client, jsTool("thrower", "export default async () => { const e = new Error('no city given'); e.code = 'bad-city'; throw e; }", limits));
  deploy(client, jsTool("recursive", "const f = (n) => f(n + 1) + 1; export default async () => f(0)", limits));
  deploy(client, jsTool("cyclic", "export default async () => { const o = {}; o.self = o; return o; }", limits));
  deploy(client, jsTool("broken", "export default 42", limits));

  auto spin = call(client, "spin");
  CHECK((errorCode(spin) == -32004 || errorCode(spin) == -32006));
  CHECK(errorCode(call(client, "hog")) == -32005);
  CHECK(errorCode(call(client, "buffers")) == -32016);
  CHECK(errorCode(call(client, "chatty")) == -32007);
  auto thrown = call(client, "thrower");
  CHECK(errorCode(thrown) == -32008);
  CHECK(thrown.at("error").at("data").at("toolError").at("message") == "no city given");
  CHECK(thrown.at("error").at("data").at("toolError").at("code") == "bad-city");
  CHECK(errorCode(call(client, "recursive")) == -32017);
  auto cyclic = call(client, "cyclic");
  CHECK(errorCode(cyclic) == -32008);
  CHECK(errorKind(cyclic) == "invalid-result");
  auto broken = call(client, "broken");
  CHECK(errorCode(broken) == -32011);
  CHECK(errorKind(broken) == "invalid-module");
  auto looser = call(client, "spin", {}, json::object{{"limits", json::object{{"wallMs", 5000}}}});
  CHECK(errorCode(looser) == -32602);
  CHECK(errorKind(looser) == "invalid-limits");

  CHECK(client.call("daemon.health").at("result").at("status") == "ok");
  CHECK(daemon->running());
}

TEST_CASE("a limit error says when the daemon's cap, not the manifest, set the limit",
          "[e2e][runtime]") {
  DaemonOptions options;
  options.configToml = "[runtime]\nmax_output_bytes = 1000\n";
  auto daemon = DaemonProcess::start(options);
  RawClient client(daemon->socket());
  deploy(client, jsTool("chatty", "export default async () => 'x'.repeat(5000)",
                        json::object{{"limits", json::object{{"outputBytes", 1000000}}}}));
  deploy(client, jsTool("modest", "export default async () => 'x'.repeat(5000)",
                        json::object{{"limits", json::object{{"outputBytes", 500}}}}));
  auto capped = call(client, "chatty");
  CHECK(errorCode(capped) == -32007);
  CHECK_THAT(std::string(capped.at("error").at("data").at("detail").as_string()),
             Catch::Contains("the tool's manifest asks for 1000000, which the daemon's [runtime] "
                             "max_output_bytes caps at 1000"));
  // A manifest that sets none runs at the default, which the cap may cut too.
  deploy(client, jsTool("plain", "export default async () => 'x'.repeat(5000)"));
  auto plain = call(client, "plain");
  CHECK(errorCode(plain) == -32007);
  CHECK_THAT(std::string(plain.at("error").at("data").at("detail").as_string()),
             Catch::Contains("the tool's manifest sets no outputBytes, and the default is 2097152, "
                             "which the daemon's [runtime] max_output_bytes caps at 1000"));
  // A call asking for more than the cap is told why the tool's limit is what it is.
  auto looser =
      call(client, "chatty", {}, json::object{{"limits", json::object{{"outputBytes", 5000}}}});
  CHECK(errorKind(looser) == "invalid-limits");
  CHECK_THAT(std::string(looser.at("error").at("data").at("detail").as_string()),
             Catch::Contains("looser than the tool's 1000; the tool's manifest asks for 1000000"));
  // The caller's own limit, or the manifest's own, is no cap's doing.
  for (const auto& response :
       {call(client, "chatty", {}, json::object{{"limits", json::object{{"outputBytes", 900}}}}),
        call(client, "modest")}) {
    CHECK(errorCode(response) == -32007);
    CHECK_THAT(std::string(response.at("error").at("data").at("detail").as_string()),
               !Catch::Contains("caps at"));
  }
}

TEST_CASE("a failed call is described once: what its error's getters start is refused",
          "[e2e][runtime]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  // Each description of the error reads its message, whose getter writes storage. Described on
  // every later segment, the call kept itself alive with those writes until its wall clock.
  const std::string failing =
      "  const e = new Error('boom');\n"
      "  Object.defineProperty(e, 'message', { get() { k++; ctx.storage.set('count', k); return "
      "'boom'; } });\n"
      "  throw e;\n"
      "};\n";
  // A promise that rejects, and a throw before there is any promise.
  const std::map<std::string, std::string> sources{
      {"rejects",
       "let k = 0;\n"
       "export default async (args, ctx) => {\n"
       "  if (args.read) return (await ctx.storage.get('count')) ?? 'nothing written';\n" +
           failing},
      {"throws",
       "let k = 0;\n"
       "export default (args, ctx) => {\n"
       "  if (args.read) return ctx.storage.get('count').then((v) => v ?? 'nothing written');\n" +
           failing}};
  auto extra = json::object{{"capabilities", json::object{{"storage", true}}},
                            {"limits", json::object{{"wallMs", 20000}}}};
  for (const auto& [kind, code] : sources) {
    INFO(kind);
    deploy(client, jsTool("getter-" + kind, code, extra));
    // Tool-threw at once, not a timeout at the wall clock.
    auto failed = call(client, "getter-" + kind);
    CHECK(errorCode(failed) == -32008);
    CHECK(failed.at("error").at("data").at("toolError").at("message") == "boom");
    CHECK(resultOf(call(client, "getter-" + kind, json::object{{"read", true}})) ==
          "nothing written");
  }
}

TEST_CASE("$/cancelRequest and a closed connection cancel a running call", "[e2e][runtime]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  std::string revision = deploy(client, jsTool("spin", "export default async () => { for (;;) {} }"));

  client.send(R"({"jsonrpc":"2.0","id":"long","method":"tools.call","params":{"name":"spin"}})" "\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto started = std::chrono::steady_clock::now();
  client.send(R"({"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":"long"}})" "\n");
  auto response = client.readJson(std::chrono::seconds(10)).as_object();
  CHECK(response.at("id") == "long");
  CHECK(errorCode(response) == -32009);
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
  // A cancelled call's sandbox is discarded (the daemon's list follows the sandbox host's
  // report, which may come just after the answer).
  auto discardedBy = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (retainedCount(client) != 0 && std::chrono::steady_clock::now() < discardedBy) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(retainedCount(client) == 0);

  // As a request, $/cancelRequest answers whether it found the request.
  auto unknown = client.call("$/cancelRequest", json::object{{"id", "nothing-in-flight"}}, 5);
  CHECK(unknown.at("result").at("cancelled") == false);

  {
    RawClient doomed(daemon->socket());
    doomed.send(R"({"jsonrpc":"2.0","id":1,"method":"tools.call","params":{"name":"spin"}})" "\n");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  // The connection closed: the call is cancelled, not left spinning for 60 s.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool idle = false;
  while (std::chrono::steady_clock::now() < deadline && !idle) {
    auto listed = client.call("sandboxes.list").at("result").at("sandboxes").as_array();
    idle = listed.empty();
    if (!idle) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(idle);
  // And the next call works.
  deploy(client, jsTool("quick", "export default async () => 'ok'"));
  CHECK(resultOf(call(client, "quick")) == "ok");
}

TEST_CASE("$/cancelRequest answers a call waiting behind another at once", "[e2e][runtime]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  deploy(client, jsTool("spin", "export default async () => { for (;;) {} }"));

  client.send(R"({"jsonrpc":"2.0","id":"first","method":"tools.call","params":{"name":"spin"}})"
              "\n");
  client.send(R"({"jsonrpc":"2.0","id":"second","method":"tools.call","params":{"name":"spin"}})"
              "\n");
  // The first is running once its sandbox shows busy (seen from another connection).
  RawClient observer(daemon->socket());
  bool busy = false;
  for (int i = 0; i < 500 && !busy; ++i) {
    const auto listed = observer.call("sandboxes.list");
    for (const auto& sandbox : listed.at("result").at("sandboxes").as_array()) {
      busy = busy || sandbox.at("busy") == true;
    }
    if (!busy) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(busy);
  client.send(R"({"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":"second"}})"
              "\n");
  // The second waits for the sandbox the first keeps spinning in (for the default 60 s wall
  // clock): it is answered at once, before the first, which runs on until it is cancelled too.
  auto second = client.readJson(std::chrono::seconds(10)).as_object();
  CHECK(second.at("id") == "second");
  CHECK(errorCode(second) == -32009);
  client.send(R"({"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":"first"}})"
              "\n");
  auto first = client.readJson(std::chrono::seconds(10)).as_object();
  CHECK(first.at("id") == "first");
  CHECK(errorCode(first) == -32009);
  // The tool still runs, in a fresh sandbox, up to its limits.
  CHECK(errorCode(call(client, "spin", {},
                       json::object{{"limits", json::object{{"wallMs", 100}}}})) == -32004);
}

TEST_CASE("capabilities: policy-gated ones refuse, subtasks go through the core", "[e2e][runtime]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  deploy(client, jsTool("gated",
                        "export default async (args, ctx) => {\n"
                        "  const codes = [];\n"
                        "  for (const attempt of [() => fetch('https://example.com/'), () => ctx.fetch('https://example.com/'),\n"
                        "                         () => ctx.storage.get('k'), () => ctx.popup({kind: 'custom-html', html: ''})]) {\n"
                        "    try { await attempt(); codes.push('succeeded'); } catch (e) { codes.push(e.code); }\n"
                        "  }\n"
                        "  return codes;\n"
                        "}"));
  auto gated = resultOf(call(client, "gated"));
  for (const auto& code : gated.as_array()) CHECK(code == "not-authorized");

  auto planner = jsTool(
      "planner",
      "export default async (args, ctx) => {\n"
      "  const target = await ctx.resolveInvocation('echo');\n"
      "  const missing = await ctx.resolveInvocation('no-such-tool').then(() => 'found', (e) => "
      "e.code);\n"
      "  const empty = await ctx.resolveInvocation('').then(() => 'found', (e) => e.code);\n"
      "  const tasks = await ctx.createSubtasksResult([\n"
      "    { kind: 'message', role: 'assistant', content: 'hello' },\n"
      "    { kind: 'functioncall', role: 'assistant', call: { name: 'echo', arguments: { a: 1 } } "
      "}]);\n"
      "  return { target, missing, empty, ids: tasks.map((t) => t.id), "
      "pinned: tasks[1].call.toolRevision };\n"
      "}");
  planner["capabilities"] = json::object{{"subtasks", true}};
  deploy(client, planner);
  auto planned = resultOf(call(client, "planner"));
  auto echoRevision = client.call("tools.get", json::object{{"name", "echo"}}).at("result").at("revision");
  CHECK(planned.at("target").at("toolRevision") == echoRevision);
  CHECK(planned.at("pinned") == echoRevision);
  CHECK(planned.at("missing") == "not-found");
  // A name no tool can have is not looked up (the store would log an error for an empty key).
  CHECK(planned.at("empty") == "not-found");
  CHECK(daemon->log().find("key of 0 bytes") == std::string::npos);
  CHECK(planned.at("ids").as_array().size() == 2);
  // Without the capability in the manifest, the same code is refused.
  auto unplanned = planner;
  unplanned["name"] = "unplanned";
  unplanned.erase("capabilities");
  deploy(client, unplanned);
  auto refused = call(client, "unplanned");
  CHECK(errorCode(refused) == -32008);
  CHECK(refused.at("error").at("data").at("toolError").at("code") == "not-authorized");
}

TEST_CASE("a tool that crashes or wedges V8 takes down only its sandbox process", "[e2e][runtime]") {
  DaemonOptions options;
  options.configToml = "[runtime]\nkill_grace_ms = 300\n";
  auto daemon = DaemonProcess::start(options);
  RawClient client(daemon->socket());
  auto limits = json::object{{"limits", json::parse(R"({"wallMs":10000,"heapMb":16})")}};
  // V8 aborts the whole process on this ("invalid size error"), whatever the heap limit.
  deploy(client, jsTool("fatal", "export default async () => 'x'.repeat(2 ** 28).split('')", limits));
  // A builtin that loops in C++ without checking for termination.
  auto wedgeLimits = json::object{{"limits", json::parse(R"({"wallMs":300,"heapMb":64})")}};
  deploy(client, jsTool("wedge", "export default async () => { new Array(5e7).fill(0); return 1; }", wedgeLimits));
  deploy(client, jsTool("fine", "export default async () => 'still here'"));

  auto crashed = call(client, "fatal");
  CHECK(errorCode(crashed) == -32018);
  CHECK(errorKind(crashed) == "sandbox-crashed");
  CHECK(resultOf(call(client, "fine")) == "still here");

  auto started = std::chrono::steady_clock::now();
  auto wedged = call(client, "wedge");
  CHECK((errorCode(wedged) == -32004 || errorCode(wedged) == -32005));
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(10));
  CHECK(resultOf(call(client, "fine")) == "still here");
  CHECK(daemon->running());
  CHECK(client.call("daemon.health").at("result").at("status") == "ok");
}

namespace {

// /proc/PID/status: field -> what follows its colon.
std::map<std::string, std::string> statusOf(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::map<std::string, std::string> fields;
  for (std::string line; std::getline(status, line);) {
    const auto colon = line.find(':');
    if (colon != std::string::npos) fields[line.substr(0, colon)] = line.substr(colon + 1);
  }
  return fields;
}

// The sandbox host processes of a daemon: its children (every thread's list).
std::vector<pid_t> childrenOf(pid_t parent) {
  std::vector<pid_t> children;
  std::error_code error;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/" + std::to_string(parent) + "/task", error)) {
    std::ifstream list(task.path() / "children");
    pid_t child = 0;
    while (list >> child) children.push_back(child);
  }
  return children;
}

// Mappings of `pid` that are executable and backed by no file: machine code made at run time.
std::vector<std::string> anonymousExecutable(pid_t pid) {
  std::vector<std::string> found;
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream fields(line);
    std::string range, permissions, offset, device, inode, path;
    fields >> range >> permissions >> offset >> device >> inode;
    std::getline(fields >> std::ws, path);
    const bool anonymous = inode == "0" && (path.empty() || path.front() == '[');
    if (permissions.size() > 2 && permissions[2] == 'x' && anonymous && path != "[vdso]" &&
        path != "[vsyscall]") {
      found.push_back(line);
    }
  }
  return found;
}

}  // namespace

TEST_CASE("calls a busy sandbox process has not read are refused, never the process killed",
          "[e2e][runtime]") {
  DaemonOptions options;
  options.configToml = "[runtime]\nkill_grace_ms = 60000\n";
  auto daemon = DaemonProcess::start(options);
  RawClient client(daemon->socket());
  deploy(client, jsTool("sized", "export default async (args) => args.pad.length"));
  CHECK(resultOf(call(client, "sized", json::object{{"pad", "x"}})) == 1);
  const auto hosts = childrenOf(daemon->pid());
  REQUIRE(hosts.size() == 1);
  // A host that reads nothing for a while (here: stopped) while a client sends large arguments.
  REQUIRE(::kill(hosts[0], SIGSTOP) == 0);
  const std::string pad(7 << 20, 'x');
  constexpr int kCalls = 24;
  for (int id = 1; id <= kCalls; ++id) {
    client.send(R"({"jsonrpc":"2.0","id":)" + std::to_string(id) +
                R"(,"method":"tools.call","params":{"name":"sized","arguments":{"pad":")" + pad +
                "\"}}}\n");
  }
  // Those past what may wait for the host are refused at once; the host is not killed for it.
  // (128 MiB may wait: 18 or 19 calls of 7 MiB.)
  int refused = 0;
  while (refused < kCalls - 19) {
    auto answer = client.readJson(std::chrono::seconds(60)).as_object();
    INFO(toolhost::protocol::writeJson(answer));
    REQUIRE(answer.contains("error"));
    CHECK(errorKind(answer) == "overloaded");
    CHECK_THAT(std::string(answer.at("error").at("data").at("detail").as_string()),
               Catch::Contains("has not yet read"));
    ++refused;
  }
  REQUIRE(::kill(hosts[0], SIGCONT) == 0);
  int answered = 0;
  while (refused + answered < kCalls) {
    auto answer = client.readJson(std::chrono::seconds(60)).as_object();
    INFO(toolhost::protocol::writeJson(answer));
    if (answer.contains("error")) {
      CHECK(errorKind(answer) == "overloaded");
      ++refused;
    } else {
      CHECK(answer.at("result").at("result") == static_cast<std::int64_t>(pad.size()));
      ++answered;
    }
  }
  CHECK(answered >= 17);
  CHECK(childrenOf(daemon->pid()) == hosts);
  CHECK(client.call("daemon.health").at("result").at("status") == "ok");
}

TEST_CASE("at shutdown a call stuck inside V8 is answered as cancelled before the daemon exits",
          "[e2e][runtime]") {
  DaemonOptions options;
  options.configToml = "[server]\nshutdown_grace_ms = 200\n[runtime]\nkill_grace_ms = 2500\n";
  auto daemon = DaemonProcess::start(options);
  RawClient client(daemon->socket());
  // A builtin that loops in C++ without checking for termination.
  deploy(client, jsTool("stuck",
                        "export default async () => { const a = []; a[2 ** 30] = 1; "
                        "a.sort(); return 1; }"));
  client.send(R"({"jsonrpc":"2.0","id":1,"method":"tools.call","params":{"name":"stuck"}})"
              "\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  REQUIRE(::kill(daemon->pid(), SIGTERM) == 0);
  auto answer = client.readJson(std::chrono::seconds(20)).as_object();
  INFO(toolhost::protocol::writeJson(answer));
  CHECK(answer.at("id") == 1);
  CHECK(errorCode(answer) == -32009);
  CHECK(daemon->wait(std::chrono::seconds(20)) == 0);
}

TEST_CASE("V8 makes no machine code unless [runtime] jit = true", "[e2e][runtime]") {
  // Hot enough for V8's baseline and optimizing compilers when they are on.
  const char* hot =
      "function step(x) { return (x * 31 + 7) % 1000003; }\n"
      "export default async () => { let s = 0; for (let i = 0; i < 2000000; i++) s = (s + step(i)) % "
      "1000003; return s; }";
  for (const bool jit : {false, true}) {
    DYNAMIC_SECTION("jit = " << (jit ? "true" : "false")) {
      DaemonOptions options;
      if (jit) options.configToml = "[runtime]\njit = true\n";
      auto daemon = DaemonProcess::start(options);
      RawClient client(daemon->socket());
      deploy(client, jsTool("hot", hot));
      for (int i = 0; i < 3; ++i) CHECK(resultOf(call(client, "hot")) == 609);
      auto hosts = childrenOf(daemon->pid());
      REQUIRE(hosts.size() == 1);
#ifdef TOOLHOST_MIMALLOC
      // The host is the same executable: mimalloc is its malloc too.
      std::ifstream maps("/proc/" + std::to_string(hosts.front()) + "/maps");
      std::string mapped((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
      CHECK_THAT(mapped, Catch::Contains("libmimalloc"));
#endif
      auto code = anonymousExecutable(hosts.front());
      std::string listed;
      for (const auto& line : code) listed += line + "\n";
      INFO("anonymous executable mappings of the sandbox host:\n" << listed);
      if (jit) {
        CHECK_FALSE(code.empty());
      } else {
        CHECK(code.empty());
      }
    }
  }
}

TEST_CASE("daemon.health is degraded while a sandbox process that keeps ending fails calls",
          "[e2e][runtime]") {
  DaemonOptions options;
  options.configToml = "[runtime]\nmax_restarts = 1\nrestart_window_ms = 600000\n";
  auto daemon = DaemonProcess::start(options);
  RawClient client(daemon->socket());
  deploy(client, jsTool("fine", "export default async () => 'fine'"));
  auto runtimeCheck = [&] {
    auto health = client.call("daemon.health").at("result").as_object();
    return health.at("checks").at("runtime").as_object();
  };
  CHECK(runtimeCheck().at("ok") == true);
  // max_restarts = 1: the process may end once and be replaced; after a second end within the
  // window, calls fail fast and the check says so.
  for (int end = 1; end <= 2; ++end) {
    CHECK(resultOf(call(client, "fine")) == "fine");
    auto hosts = childrenOf(daemon->pid());
    REQUIRE(hosts.size() == 1);
    REQUIRE(::kill(hosts.front(), SIGKILL) == 0);
    // The daemon notices the end when it reaps the process.
    json::object check;
    for (int i = 0; i < 500; ++i) {
      check = runtimeCheck();
      if (check.at("processes").at(0).at("recentUnexpectedEnds") == end) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    INFO(toolhost::protocol::writeJson(check));
    REQUIRE(check.at("processes").at(0).at("recentUnexpectedEnds") == end);
    CHECK(check.at("processes").at(0).at("pid") == 0);
    CHECK(check.at("ok") == (end == 1));
  }
  auto refused = call(client, "fine");
  CHECK(errorCode(refused) == toolhost::daemon::app_error::kSandboxCrashed);
  auto check = runtimeCheck();
  CHECK(check.at("ok") == false);
  CHECK(check.at("processes").at(0).at("failingForMs").as_int64() > 0);
  CHECK_THAT(std::string(check.at("detail").as_string()), Catch::Contains("ended unexpectedly"));
  CHECK(client.call("daemon.health").at("result").at("status") == "degraded");
}

TEST_CASE("requests as deep as max_depth allows are served on a small `ulimit -s`",
          "[e2e][limits]") {
  DaemonOptions options;
  options.configToml = "[limits]\nmax_depth = 1000\n";
  options.stackLimitBytes = 128 * 1024;  // every thread's stack would default to this
  auto daemon = DaemonProcess::start(options);
  RawClient client(daemon->socket());
  deploy(client, jsTool("takes-anything", "export default (args) => Object.keys(args).length"));
  // `open` `levels` times, then `inner`, then `close` as many times.
  auto nest = [](std::string_view open, int levels, std::string_view inner,
                 std::string_view close) {
    std::string text;
    for (int i = 0; i < levels; ++i) text += open;
    text += inner;
    for (int i = 0; i < levels; ++i) text += close;
    return text;
  };
  auto nested = [&](int levels) { return nest(R"({"a":)", levels, "1", "}"); };
  // A schema of array items (one JSON level each), or of object properties (two each).
  auto deepItems = [&](int levels) { return nest(R"({"items":)", levels, "{}", "}"); };
  auto deepSchema = [&](int levels) {
    return nest(R"({"type":"object","properties":{"a":)", levels, "{}", "}}");
  };
  const std::string lines[] = {
      R"({"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":)" + nested(990) + "}}",
      R"({"jsonrpc":"2.0","id":2,"method":"tools.call","params":{"name":"echo","arguments":)" +
          nested(990) + "}}",
      R"({"jsonrpc":"2.0","id":3,"method":"tools.call","params":{"name":"takes-anything",)"
      R"("arguments":)" +
          nested(990) + "}}",
      R"({"jsonrpc":"2.0","id":4,"method":"tools.install","params":{"manifest":{"name":"deep",)"
      R"("description":"d","parameters":)" +
          deepSchema(490) +
          R"(,"execution":{"class":"sandboxed-code","runtime":"javascript",)"
          R"("source":"export default () => 1"}}}})",
      R"({"jsonrpc":"2.0","id":5,"method":"tools.install","params":{"manifest":{"name":"deeper",)"
      R"("description":"d","parameters":{"type":"object","properties":{"a":)" +
          deepItems(985) +
          R"(}},"execution":{"class":"sandboxed-code","runtime":"javascript",)"
          R"("source":"export default () => 1"}}}})",
  };
  for (const auto& line : lines) {
    client.send(line + "\n");
    auto response = client.readJson().as_object();
    INFO(toolhost::protocol::writeJson(response).substr(0, 300));
    CHECK((response.contains("result") || response.contains("error")));
  }
  CHECK(client.call("ping").contains("result"));
  CHECK(daemon->running());
}

TEST_CASE("a sandbox host can gain no privileges and runs under its call filter",
          "[e2e][runtime][confinement]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  // Time zones, locales and randomness still work in a confined host.
  deploy(client, jsTool("fine",
                        "export default async () => typeof Math.random() + ' ' + "
                        "new Date(0).toLocaleDateString('de-DE', {timeZone: 'UTC'})"));
  CHECK(resultOf(call(client, "fine")) == "number 1.1.1970");
  auto hosts = childrenOf(daemon->pid());
  REQUIRE(hosts.size() == 1);
  auto fields = statusOf(hosts[0]);
  CHECK(fields["NoNewPrivs"] == "\t1");
  // A session of its own: no controlling terminal to type into.
  CHECK(::getsid(hosts[0]) == hosts[0]);
  // A few descriptors (each one an epoll watch or a pipe the user's share pays for).
  std::ifstream limits("/proc/" + std::to_string(hosts[0]) + "/limits");
  std::string limitsText((std::istreambuf_iterator<char>(limits)),
                         std::istreambuf_iterator<char>());
  CHECK_THAT(limitsText, Catch::Matches("[\\s\\S]*Max open files +128 +128 [\\s\\S]*"));
  // Filter mode, with one filter more than the daemon (runtime/confinement.h; what the filter
  // refuses: confinement_test.cc).
  CHECK(fields["Seccomp"] == "\t2");
  CHECK(std::stoi(fields["Seccomp_filters"]) ==
        std::stoi(statusOf(daemon->pid())["Seccomp_filters"]) + 1);
  // daemon.health says whether Landlock holds too: the kernel's ABI, or 0 where it has none.
  const long abi =
      ::syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  auto health = client.call("daemon.health").at("result");
  auto process = health.at("checks").at("runtime").at("processes").at(0);
  CHECK(process.at("pid") == hosts[0]);
  CHECK(process.at("landlockAbi") == std::max(abi, 0L));
  // Its stdout and stderr are a pipe the daemon reads and logs, never the daemon's own stderr.
  for (const char* fd : {"1", "2"}) {
    const auto target =
        std::filesystem::read_symlink("/proc/" + std::to_string(hosts[0]) + "/fd/" + fd);
    CHECK(target.string().rfind("pipe:", 0) == 0);
  }
  const std::string prefix = "sandbox process " + std::to_string(hosts[0]) + " (slot 0): ";
  CHECK_THAT(daemon->log(), Catch::Contains(prefix + (abi > 0 ? "confined: Landlock ABI "
                                                              : "Landlock is unavailable")));
}
