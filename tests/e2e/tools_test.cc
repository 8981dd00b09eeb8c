// The tools family over the real daemon's socket.
#include "tests/support/daemon_process.h"

#include "protocol/json_parse.h"
#include "protocol/json_text.h"
#include "protocol/jsonrpc.h"

#include <boost/json/parse.hpp>
#include <catch2/catch.hpp>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <set>
#include <thread>

using namespace toolhost::testing;
namespace json = boost::json;

namespace {

json::object manifest(std::string_view name, std::string_view source = "export default async (a) => a") {
  return json::object{
      {"name", name},
      {"description", "A test tool"},
      {"parameters", json::parse(R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})")},
      {"execution", json::object{{"class", "sandboxed-code"}, {"runtime", "javascript"}, {"source", source}}}};
}

json::object resultOf(const json::object& response) {
  INFO(toolhost::protocol::encodeLine(response));
  REQUIRE(response.contains("result"));
  return response.at("result").as_object();
}

std::int64_t errorCode(const json::object& response) {
  INFO(toolhost::protocol::encodeLine(response));
  REQUIRE(response.contains("error"));
  return response.at("error").at("code").as_int64();
}

std::string errorDetail(const json::object& response) {
  return std::string(response.at("error").at("data").at("detail").as_string());
}

}  // namespace

TEST_CASE("install, activate, get, list, history over the socket", "[e2e][tools]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());

  auto installed = resultOf(client.call("tools.install", json::object{{"manifest", manifest("weather-lookup")}}));
  std::string v1(installed.at("revision").as_string());
  CHECK(installed.at("created") == true);
  CHECK(installed.at("name") == "weather-lookup");
  auto again = resultOf(client.call("tools.install", json::object{{"manifest", manifest("weather-lookup")}}));
  CHECK(again.at("revision") == json::value(v1));
  CHECK(again.at("created") == false);

  // Installed but not active: not reachable by name yet.
  CHECK(errorCode(client.call("tools.get", json::object{{"name", "weather-lookup"}})) == -32001);
  auto byRevision = resultOf(client.call("tools.get", json::object{{"revision", v1}}));
  CHECK(byRevision.at("active") == false);
  CHECK(byRevision.at("manifest") == manifest("weather-lookup"));

  auto activated = resultOf(client.call("tools.activate", json::object{{"name", "weather-lookup"}, {"revision", v1}}));
  CHECK(activated.at("changed") == true);
  CHECK(activated.at("previous").is_null());
  CHECK(activated.contains("secrets"));
  auto reactivated = resultOf(
      client.call("tools.activate", json::object{{"name", "weather-lookup"}, {"revision", v1}}));
  CHECK(reactivated.at("changed") == false);
  CHECK(reactivated.at("previous") == json::value(v1));
  CHECK(reactivated.at("changes").at("capabilities").at("added").as_array().empty());
  CHECK(reactivated.contains("secrets"));

  auto v2 = std::string(resultOf(client.call(
      "tools.install", json::object{{"manifest", manifest("weather-lookup", "export default async () => 2")}}))
                            .at("revision").as_string());
  auto conflict = client.call("tools.activate", json::object{{"name", "weather-lookup"}, {"revision", v2}});
  CHECK(errorCode(conflict) == -32012);
  CHECK_THAT(errorDetail(conflict), Catch::Contains("replace: true"));
  auto moved = resultOf(client.call("tools.activate",
                                    json::object{{"name", "weather-lookup"}, {"revision", v2}, {"replace", true}}));
  CHECK(moved.at("previous") == json::value(v1));
  CHECK(moved.contains("changes"));

  auto active = resultOf(client.call("tools.get", json::object{{"name", "weather-lookup"}}));
  CHECK(active.at("revision") == json::value(v2));
  CHECK(active.at("active") == true);

  auto list = resultOf(client.call("tools.list"));
  std::set<std::string> names;
  for (const auto& tool : list.at("tools").as_array()) names.insert(std::string(tool.at("name").as_string()));
  CHECK(names == std::set<std::string>{"echo", "time-now", "weather-lookup"});

  auto history = resultOf(client.call("tools.history", json::object{{"name", "weather-lookup"}}));
  auto& revisions = history.at("revisions").as_array();
  REQUIRE(revisions.size() == 2);
  CHECK(revisions[0].at("revision") == json::value(v1));
  CHECK(revisions[0].at("active") == false);
  CHECK(revisions[1].at("revision") == json::value(v2));
  CHECK(revisions[1].at("active") == true);

  // A revision under another name is not found.
  resultOf(client.call("tools.install", json::object{{"manifest", manifest("other-tool")}}));
  CHECK(errorCode(client.call("tools.get", json::object{{"name", "other-tool"}, {"revision", v1}})) == -32001);
  CHECK(errorCode(client.call("tools.activate", json::object{{"name", "other-tool"}, {"revision", v1}})) == -32001);

  // And everything survives a restart.
  REQUIRE(daemon->stop() == 0);
  DaemonOptions options;
  options.stateDir = daemon->stateDir();
  auto restarted = DaemonProcess::start(options);
  RawClient after(restarted->socket());
  CHECK(resultOf(after.call("tools.get", json::object{{"name", "weather-lookup"}})).at("revision") == json::value(v2));
  CHECK(resultOf(after.call("store.verify")).at("ok") == true);
}

TEST_CASE("every install refusal names the field and the reason", "[e2e][tools]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  auto refuse = [&](json::object m, std::int64_t code, const std::string& expected) {
    auto response = client.call("tools.install", json::object{{"manifest", std::move(m)}});
    CHECK(errorCode(response) == code);
    CHECK_THAT(errorDetail(response), Catch::Contains(expected));
  };
  refuse(manifest("Bad Name"), -32011, "manifest/name");
  refuse(manifest("echo"), -32012, "built-in");
  auto m = manifest("t");
  m["execution"] = json::parse(R"({"class":"trusted-native","implementationRevision":"sha256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"})");
  refuse(m, -32011, "trusted-native");
  m = manifest("t");
  m["parameters"] =
      json::parse(R"j({"type":"object","properties":{"p":{"type":"string","pattern":"x(?!y)"}}})j");
  refuse(m, -32011, "manifest/parameters/properties/p/pattern");
  m = manifest("t");
  m["surprise"] = 1;
  refuse(m, -32602, "params/manifest");
  m = manifest("t");
  m["execution"].as_object()["runtime"] = "python";
  refuse(m, -32602, "params/manifest/execution/runtime");
  m = manifest("t");
  m["capabilities"] = json::parse(R"({"fetch":[{"origin":"https://x.example/path","access":["read"]}]})");
  refuse(m, -32011, "manifest/capabilities/fetch/0/origin");
  CHECK(errorCode(client.call("tools.install", json::object{})) == -32602);
  CHECK(errorCode(client.call("tools.activate", json::object{{"name", "nope"}, {"revision", "x"}})) == -32602);
  CHECK(errorCode(client.call("tools.get", json::object{})) == -32602);
  CHECK(errorCode(client.call("tools.history", json::object{{"name", "never-installed"}})) == -32001);
}

TEST_CASE("install refuses source that cannot load, without running any of it", "[e2e][tools]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  auto install = [&](json::object m) {
    return client.call("tools.install", json::object{{"manifest", std::move(m)}});
  };
  auto withModules = [](std::string_view source, json::object modules) {
    auto m = manifest("loader", source);
    m["execution"].as_object()["modules"] = std::move(modules);
    return m;
  };
  struct Refused {
    json::object manifest;
    const char* expected;
  };
  for (auto& [m, expected] : std::vector<Refused>{
           {manifest("loader", "export default async (a) => { a +"), "(source.js:1)"},
           {withModules("import {f} from './lib.js'; export default f;",
                        json::object{{"lib.js", "export const f = ("}}),
            "module lib.js does not compile"},
           {manifest("loader", "import x from './missing.js'; export default x;"),
            R"(imports "./missing.js", which is not one of this revision's modules)"},
           {withModules("import './wait.js'; export default async () => 1;",
                        json::object{{"wait.js", "await 1;"}}),
            "wait.js uses top-level await"}}) {
    INFO(expected);
    auto response = install(m);
    CHECK(errorCode(response) == -32011);
    CHECK_THAT(errorDetail(response),
               Catch::Contains(expected) && Catch::Contains("nothing was installed"));
  }
  CHECK(errorCode(client.call("tools.history", json::object{{"name", "loader"}})) == -32001);

  // Only compiled: a module whose code never ends, or throws, installs (its first call says so).
  auto spins = manifest("spins", "for (;;) {} export default async () => 1;");
  spins["limits"] = json::object{{"wallMs", 500}};
  const auto revision = resultOf(install(spins)).at("revision");
  resultOf(client.call("tools.activate", json::object{{"name", "spins"}, {"revision", revision}}));
  CHECK(errorCode(client.call("tools.call",
                              json::object{{"name", "spins"},
                                           {"arguments", json::object{{"city", "x"}}}})) == -32004);
  CHECK(resultOf(install(manifest("throws",
                                  "throw new Error('at load'); export default async () => 1;")))
            .at("created") == true);
  // Installing a stored manifest again answers as before, without a check.
  CHECK(resultOf(install(spins)).at("created") == false);
}

TEST_CASE("install stores a revision unchecked, and says so, while the runtime fails fast",
          "[e2e][tools]") {
  DaemonOptions options;
  options.configToml =
      "[runtime]\nmax_restarts = 1\nrestart_window_ms = 120000\nkill_grace_ms = 300\n";
  auto daemon = DaemonProcess::start(options);
  RawClient client(daemon->socket());
  // A builtin that loops in C++ without checking for termination: its process is killed.
  auto wedge =
      manifest("wedge", "export default async () => { new Array(5e7).fill(0); return 1; }");
  wedge["limits"] = json::parse(R"({"wallMs":300,"heapMb":64})");
  const auto revision =
      resultOf(client.call("tools.install", json::object{{"manifest", wedge}})).at("revision");
  CHECK_FALSE(resultOf(client.call("tools.install", json::object{{"manifest", manifest("before")}}))
                  .contains("notChecked"));
  resultOf(client.call("tools.activate", json::object{{"name", "wedge"}, {"revision", revision}}));
  for (int i = 0; i < 3; ++i) {
    client.call("tools.call",
                json::object{{"name", "wedge"}, {"arguments", json::object{{"city", "x"}}}});
  }
  // The runtime now fails fast; a fix can still be installed.
  auto fixed = resultOf(
      client.call("tools.install",
                  json::object{{"manifest", manifest("wedge", "export default async () => 1")}}));
  CHECK(fixed.at("created") == true);
  CHECK_THAT(std::string(fixed.at("notChecked").as_string()),
             Catch::Contains("not compiled before it was stored"));
  // A lineage's code definition is still checked: agents' code has a process of its own.
  auto compiled =
      client.call("tasks.compile",
                  json::parse(R"({"drafts":[{"kind":"tooldefinition","role":"system","definition":{
          "name":"adder","description":"adds","parameters":{"type":"object"},
          "implementation":{"type":"code","source":"export default async () => {"}}}]})"));
  CHECK(errorCode(compiled) == -32011);
}

TEST_CASE("activation lists an external service's endpoint among what changed", "[e2e][tools]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  auto activate = [&](const char* endpoint, bool replace) {
    json::object m{
        {"name", "remote"},
        {"description", "an external service"},
        {"parameters", json::parse(R"({"type":"object"})")},
        {"execution", json::object{{"class", "external-service"}, {"endpoint", endpoint}}}};
    auto revision =
        resultOf(client.call("tools.install", json::object{{"manifest", m}})).at("revision");
    return resultOf(client.call("tools.activate", json::object{{"name", "remote"},
                                                               {"revision", revision},
                                                               {"replace", replace}}))
        .at("changes")
        .at("capabilities");
  };
  CHECK(activate("https://a.example/rpc", false) ==
        json::parse(R"({"added":["invoke https://a.example/rpc"],"removed":[]})"));
  CHECK(
      activate("https://b.example/rpc", true) ==
      json::parse(
          R"({"added":["invoke https://b.example/rpc"],"removed":["invoke https://a.example/rpc"]})"));
}

TEST_CASE("built-in tools are registered, callable and pinned", "[e2e][tools]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  auto echo = resultOf(client.call("tools.call", json::object{{"name", "echo"}, {"arguments", json::object{{"a", json::array{1, "two"}}}}}));
  CHECK(echo.at("result") == json::object{{"a", json::array{1, "two"}}});
  CHECK(echo.at("name") == "echo");
  CHECK(echo.at("usage").as_object().contains("wallMs"));
  std::string echoRevision(echo.at("revision").as_string());
  CHECK(resultOf(client.call("tools.get", json::object{{"name", "echo"}})).at("class") == "trusted-native");

  auto time = resultOf(client.call("tools.call", json::object{{"name", "time-now"}, {"arguments", json::object{{"offsetMinutes", 60}}}}));
  CHECK_THAT(std::string(time.at("result").at("iso").as_string()), Catch::EndsWith("+01:00"));

  auto invalid = client.call("tools.call", json::object{{"name", "time-now"}, {"arguments", json::object{{"offsetMinutes", 9999}}}});
  CHECK(errorCode(invalid) == -32602);
  CHECK_THAT(errorDetail(invalid), Catch::Contains("arguments/offsetMinutes"));
  CHECK(errorCode(client.call("tools.call", json::object{{"name", "no-such-tool"}})) == -32001);
  // By revision, and the revision must carry the name if both are given.
  CHECK(resultOf(client.call("tools.call", json::object{{"revision", echoRevision}})).at("name") == "echo");
  CHECK(errorCode(client.call("tools.call", json::object{{"revision", echoRevision}, {"name", "time-now"}})) == -32001);

  // A restart re-registers them without writing: the history keeps one revision each.
  REQUIRE(daemon->stop() == 0);
  DaemonOptions options;
  options.stateDir = daemon->stateDir();
  auto restarted = DaemonProcess::start(options);
  RawClient after(restarted->socket());
  auto history = resultOf(after.call("tools.history", json::object{{"name", "echo"}}));
  CHECK(history.at("revisions").as_array().size() == 1);
  CHECK(history.at("revisions").as_array()[0].at("revision") == json::value(echoRevision));
}

TEST_CASE("tools.configure stores settings revisions per tool revision", "[e2e][tools]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  auto rev = std::string(resultOf(client.call("tools.install", json::object{{"manifest", manifest("weather-lookup")}})).at("revision").as_string());
  auto configured = resultOf(client.call("tools.configure", json::object{{"name", "weather-lookup"}, {"revision", rev}, {"settings", json::object{{"units", "metric"}}}}));
  CHECK(configured.at("created") == true);
  std::string settingsRevision(configured.at("settingsRevision").as_string());
  CHECK(settingsRevision.rfind("sha256:", 0) == 0);
  auto got = resultOf(client.call("tools.get", json::object{{"revision", rev}}));
  CHECK(got.at("settingsRevision") == json::value(settingsRevision));
  CHECK(errorCode(client.call("tools.configure", json::object{{"name", "other"}, {"revision", rev}, {"settings", json::object{}}})) == -32001);
  // Settings values are not in tools.get: only the revision.
  CHECK(toolhost::protocol::encodeLine(got).find("metric") == std::string::npos);
}

TEST_CASE("toolhostctl install puts the source files in the manifest, and activates on request",
          "[e2e][tools]") {
  auto daemon = DaemonProcess::start();
  const auto dir = daemon->dir();
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name, std::ios::binary) << text;
    return (dir / name).string();
  };
  const std::string manifestFile = write(
      "greet.json", R"({"name":"greet","description":"says hello","parameters":{"type":"object",)"
                    R"("properties":{"who":{"type":"string"}},"required":["who"]},)"
                    R"("execution":{"class":"sandboxed-code","runtime":"javascript"}})");
  const std::string source =
      write("main.js",
            "import { greeting } from 'words.js';\n"
            "export default async ({who}) => ({text: `${greeting}, ${who}!`});\n");
  const std::string words = write("words.js", "export const greeting = 'Hello';\n");
  auto ctl = [&](std::vector<std::string> args) {
    std::vector<std::string> command{ctlBinary().string(), "--socket", daemon->socket().string(),
                                     "--compact"};
    command.insert(command.end(), args.begin(), args.end());
    return runProgram(command);
  };
  auto installed = ctl(
      {"install", manifestFile, "--source", source, "--module", "words.js=" + words, "--activate"});
  INFO(installed.err);
  REQUIRE(installed.status == 0);
  auto answer = json::parse(installed.out).as_object();
  CHECK(answer.at("created") == true);
  CHECK(answer.at("activated").at("revision") == answer.at("revision"));
  auto called = ctl({"call", "greet", R"({"who":"Paris"})"});
  CHECK(called.status == 0);
  CHECK_THAT(called.out, Catch::Contains("Hello, Paris!"));
  // The same files again: the same revision, nothing written.
  auto again = ctl({"install", manifestFile, "--source", source, "--module", "words.js=" + words});
  CHECK(again.status == 0);
  CHECK(json::parse(again.out).at("created") == false);
  CHECK(json::parse(again.out).at("revision") == answer.at("revision"));
  // Another source: activating over the bound name needs --replace.
  const std::string other = write("other.js", "export default async () => ({text: 'hi'});\n");
  auto held = ctl({"install", manifestFile, "--source", other, "--activate"});
  CHECK(held.status == 1);
  CHECK_THAT(held.err, Catch::Contains("installed sha256:") && Catch::Contains("not activated"));
  CHECK(ctl({"install", manifestFile, "--source", other, "--activate", "--replace"}).status == 0);
  CHECK_THAT(ctl({"call", "greet", R"({"who":"x"})"}).out, Catch::Contains("\"hi\""));
  // What cannot go into a manifest is refused before anything is sent.
  const std::string binary = write("binary.js", std::string("\xff\xfe", 2));
  auto notText = ctl({"install", manifestFile, "--source", binary});
  CHECK(notText.status == 2);
  CHECK_THAT(notText.err, Catch::Contains("is not UTF-8 text"));
  CHECK(ctl({"install", manifestFile, "--module", "words.js"}).status == 2);
  CHECK(ctl({"install", (dir / "missing.json").string()}).status == 2);
}

TEST_CASE("only admins install, agents read and call", "[e2e][tools][peers]") {
  if (::geteuid() != 0) {
    WARN("needs root to run a client as another uid; skipped");
    return;
  }
  DaemonOptions options;
  options.configToml = "[[access]]\nuid = 65534\nroles = [\"agent\"]\n";
  auto daemon = DaemonProcess::start(options);
  ::chmod(daemon->dir().c_str(), 0755);
  ::chmod(daemon->socket().c_str(), 0777);
  auto asNobody = [&](std::vector<std::string> args) {
    std::vector<std::string> command{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                     ctlBinary().string(), "--socket", daemon->socket().string()};
    command.insert(command.end(), args.begin(), args.end());
    return runProgram(command);
  };
  auto install = asNobody({"call", "tools.install", toolhost::protocol::writeJson(json::object{{"manifest", manifest("t")}})});
  CHECK(install.status == 1);
  CHECK_THAT(install.out, Catch::Contains("-32002"));
  CHECK_THAT(install.err, Catch::Contains("admin"));
  CHECK(asNobody({"call", "tools.list"}).status == 0);
  CHECK(asNobody({"call", "tools.call", R"({"name":"echo","arguments":{"x":1}})"}).status == 0);
  CHECK(asNobody({"call", "store.verify"}).status == 1);
}

TEST_CASE("kill -9 during installs leaves every stored manifest intact", "[e2e][tools][crash]") {
  TempDir state;
  std::mt19937 random(20261130);
  std::set<std::string> acknowledged;  // revisions the daemon answered for
  for (int round = 0; round < 5; ++round) {
    DaemonOptions options;
    options.stateDir = state.path() / "state";
    auto daemon = DaemonProcess::start(options);
    std::atomic<bool> stop{false};
    std::mutex mutex;
    std::thread writer([&, round] {
      try {
        RawClient client(daemon->socket());
        for (int i = 0; !stop; ++i) {
          auto name = "tool-" + std::to_string(round) + "-" + std::to_string(i);
          // No Catch assertions on this thread: a killed daemon just ends the loop.
          auto quietCall = [&](const char* method, json::object params) -> std::optional<json::value> {
            client.send(toolhost::protocol::encodeLine(json::object{
                {"jsonrpc", "2.0"}, {"id", 1}, {"method", method}, {"params", std::move(params)}}));
            auto line = client.readLine(std::chrono::seconds(5));
            if (!line) return std::nullopt;
            auto parsed = toolhost::protocol::parseJson(*line);
            if (!parsed || !parsed->is_object() || !parsed->as_object().contains("result")) return std::nullopt;
            return parsed->at("result");
          };
          auto installed = quietCall("tools.install", json::object{{"manifest", manifest(name)}});
          if (!installed) break;
          std::string revision(installed->at("revision").as_string());
          if (!quietCall("tools.activate", json::object{{"name", name}, {"revision", revision}})) break;
          std::lock_guard lock(mutex);
          acknowledged.insert(revision);
        }
      } catch (...) {
        // The daemon was killed under us: expected.
      }
    });
    // Kill only once this round has had answers (a loaded machine installs slowly), then at a
    // random point of a later install.
    auto before = [&] {
      std::lock_guard lock(mutex);
      return acknowledged.size();
    }();
    for (int wait = 0; wait < 1000; ++wait) {
      {
        std::lock_guard lock(mutex);
        if (acknowledged.size() >= before + 2) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(random() % 100));
    daemon->stop(SIGKILL);
    stop = true;
    writer.join();
  }
  DaemonOptions options;
  options.stateDir = state.path() / "state";
  auto daemon = DaemonProcess::start(options);
  RawClient client(daemon->socket());
  auto verify = resultOf(client.call("store.verify"));
  CHECK(verify.at("problems").as_array().empty());
  CHECK(verify.at("ok") == true);
  REQUIRE(acknowledged.size() > 5);
  for (const auto& revision : acknowledged) {
    auto got = client.call("tools.get", json::object{{"revision", revision}});
    CHECK(got.contains("result"));
  }
}

TEST_CASE("2.0 and 2 are one number: one revision, and both are integers", "[e2e][tools]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  auto install = [&](std::string_view wallMs) {
    client.send(
        R"({"jsonrpc":"2.0","id":1,"method":"tools.install","params":{"manifest":{"name":"n",)"
        R"("description":"d","parameters":{"type":"object","properties":{"x":{"type":"integer"}}},)"
        R"("limits":{"wallMs":)" +
        std::string(wallMs) +
        R"(},"execution":{"class":"sandboxed-code","runtime":"javascript",)"
        R"("source":"export default (args) => args.x"}}}})"
        "\n");
    return resultOf(client.readJson().as_object());
  };
  auto asWritten = install("2000.0");
  auto plain = install("2000");
  CHECK(asWritten.at("revision") == plain.at("revision"));
  CHECK(asWritten.at("created") == true);
  resultOf(client.call("tools.activate",
                       json::object{{"name", "n"}, {"revision", plain.at("revision")}}));
  client.send(
      R"({"jsonrpc":"2.0","id":2,"method":"tools.call","params":{"name":"n","arguments":{"x":2.0}}})"
      "\n");
  CHECK(resultOf(client.readJson().as_object()).at("result") == 2);
  client.send(
      R"({"jsonrpc":"2.0","id":3,"method":"tools.call","params":{"name":"n","arguments":{"x":2.5}}})"
      "\n");
  CHECK(errorCode(client.readJson().as_object()) == -32602);
}

TEST_CASE("checking large arguments does not hold up other connections", "[e2e][tools]") {
  auto daemon = DaemonProcess::start();
  RawClient caller(daemon->socket());
  // 30 object shapes to choose from for each item; the items match the last one.
  json::array shapes;
  for (int i = 0; i < 30; ++i) {
    const std::string key = "k" + std::to_string(i);
    shapes.push_back(json::object{{"type", "object"},
                                  {"required", json::array{key.c_str()}},
                                  {"properties", json::object{{key, {{"type", "integer"}}}}}});
  }
  auto m = manifest("union", "export default async (a) => a.items.length");
  m["parameters"] = json::object{
      {"type", "object"},
      {"properties",
       json::object{{"items", json::object{{"type", "array"},
                                           {"items", json::object{{"anyOf", shapes}}}}}}}};
  const auto installed = resultOf(caller.call("tools.install", json::object{{"manifest", m}}));
  resultOf(caller.call("tools.activate",
                       json::object{{"name", "union"}, {"revision", installed.at("revision")}}));
  json::array items(30'000, json::object{{"k29", 1}});
  caller.send(toolhost::protocol::encodeLine(json::object{
      {"jsonrpc", "2.0"},
      {"id", 1},
      {"method", "tools.call"},
      {"params", json::object{{"name", "union"}, {"arguments", {{"items", std::move(items)}}}}}}));

  // While those arguments are checked (seconds in a debug build), another connection is served.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  RawClient other(daemon->socket());
  const auto pinged = std::chrono::steady_clock::now();
  CHECK(other.call("ping").contains("result"));
  const auto pingTook = std::chrono::steady_clock::now() - pinged;
  const auto answer = caller.readJson(std::chrono::seconds(120)).as_object();
  const auto callTook = std::chrono::steady_clock::now() - pinged;
  INFO("ping " << std::chrono::duration<double>(pingTook).count() << " s, call "
               << std::chrono::duration<double>(callTook).count() << " s");
  REQUIRE(answer.contains("result"));
  CHECK(answer.at("result").at("result") == 30'000);
  CHECK(pingTook * 4 < callTook);
}

TEST_CASE("a pattern in a tool's parameters is checked before the tool runs", "[e2e][tools]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  auto m = manifest("airport", "export default async (a) => a.code.toLowerCase()");
  m["parameters"] = json::parse(R"({"type":"object","required":["code"],
      "properties":{"code":{"type":"string","pattern":"^[A-Z]{3}$"},
                    "note":{"type":"string","pattern":"^(\\w+\\s?)*$"}}})");
  const auto installed = resultOf(client.call("tools.install", json::object{{"manifest", m}}));
  resultOf(client.call("tools.activate",
                       json::object{{"name", "airport"}, {"revision", installed.at("revision")}}));
  auto call = [&](json::object arguments) {
    return client.call("tools.call",
                       json::object{{"name", "airport"}, {"arguments", std::move(arguments)}});
  };
  CHECK(resultOf(call(json::object{{"code", "CDG"}})).at("result") == "cdg");
  auto refused = call(json::object{{"code", "Paris"}});
  CHECK(errorCode(refused) == -32602);
  CHECK_THAT(errorDetail(refused), Catch::Contains("arguments/code: must match the pattern"));
  // A backtracking engine would not answer this in a lifetime: about 2 MB of words and a '!'
  // (checked off the I/O thread), and the daemon goes on.
  std::string words;
  while (words.size() < 2'000'000) words += "word ";
  words += "!";
  refused = call(json::object{{"code", "CDG"}, {"note", words}});
  CHECK(errorCode(refused) == -32602);
  CHECK_THAT(errorDetail(refused), Catch::Contains("arguments"));
  CHECK(resultOf(call(json::object{{"code", "ORY"}, {"note", "a quiet airport"}})).at("result") ==
        "ory");
}
