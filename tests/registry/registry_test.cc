// The registry against a real LMDB store in a temporary directory.
#include "registry/registry.h"

#include "policy/destination.h"
#include "protocol/content_hash.h"
#include "protocol/json_text.h"
#include "registry/manifest.h"
#include "registry/native_tools.h"

#include <boost/json/parse.hpp>
#include <catch2/catch.hpp>
#include <openssl/evp.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>
#include <vector>

using namespace toolhost;
using namespace toolhost::registry;
namespace json = boost::json;
namespace fs = std::filesystem;

namespace {

struct TempStore {
  fs::path dir;
  store::StorePtr store;
  TempStore() {
    char pattern[] = "/tmp/th-reg-XXXXXX";
    dir = ::mkdtemp(pattern);
    reopen();
  }
  void reopen() {
    store.reset();
    store::Options options;
    options.stateDir = dir;
    options.tables = Registry::tables();
    store = std::move(*store::Store::open(options));
  }
  ~TempStore() {
    store.reset();
    fs::remove_all(dir);
  }
};

json::object manifest(std::string_view name = "weather-lookup", std::string_view source = "export default async (a) => a") {
  return json::object{
      {"name", name},
      {"description", "Current weather for a city"},
      {"parameters", json::parse(R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})")},
      {"execution", json::object{{"class", "sandboxed-code"}, {"runtime", "javascript"}, {"source", source}}},
      {"capabilities", json::parse(R"({"fetch":[{"origin":"https://api.weather.example","access":["read"]}]})")},
      {"limits", json::parse(R"({"wallMs":60000,"heapMb":64})")}};
}

// SHA-256 the way anyone can compute it offline: tag, NUL, canonical JSON; base64url, no padding.
std::string offlineHash(std::string_view tag, std::string_view canonical) {
  std::string input(tag);
  input.push_back('\0');
  input.append(canonical);
  unsigned char digest[32];
  unsigned int length = 0;
  EVP_Digest(input.data(), input.size(), digest, &length, EVP_sha256(), nullptr);
  unsigned char base64[64];
  int written = EVP_EncodeBlock(base64, digest, 32);
  std::string out(reinterpret_cast<char*>(base64), static_cast<std::size_t>(written));
  for (char& c : out) {
    if (c == '+') c = '-';
    if (c == '/') c = '_';
  }
  while (!out.empty() && out.back() == '=') out.pop_back();
  return "sha256:" + out;
}

std::size_t historySize(Registry& registry, const std::string& name) {
  auto history = registry.history(name);
  return history ? history->size() : 0;
}

}  // namespace

TEST_CASE("a revision is the hash of the manifest exactly as submitted", "[registry]") {
  TempStore temp;
  Registry registry(*temp.store);
  // Keys deliberately out of order, and a number written as 4.50: the canonical form fixes both.
  std::string submitted =
      R"({"parameters":{"type":"object","properties":{"n":{"type":"number","default":4.50e1}}},"name":"t1","execution":{"source":"export default () => 4.50","runtime":"javascript","class":"sandboxed-code"},"description":"d","limits":{"heapMb":45}})";
  std::string canonical =
      R"({"description":"d","execution":{"class":"sandboxed-code","runtime":"javascript","source":"export default () => 4.50"},"limits":{"heapMb":45},"name":"t1","parameters":{"properties":{"n":{"default":45,"type":"number"}},"type":"object"}})";
  auto installed = registry.install(json::parse(submitted).as_object());
  REQUIRE(installed.has_value());
  CHECK(installed->revision == offlineHash("toolhost.tool-manifest.v1", canonical));
  CHECK(installed->revision.size() == 50);
  CHECK(installed->created);
  CHECK(installed->name == "t1");
}

TEST_CASE("installing the same manifest again, in any key order, writes nothing", "[registry]") {
  TempStore temp;
  Registry registry(*temp.store);
  auto first = registry.install(manifest());
  REQUIRE(first.has_value());
  json::object reordered;
  auto original = manifest();
  for (auto it = original.end(); it != original.begin();) {
    --it;
    reordered[it->key()] = it->value();
  }
  auto again = registry.install(reordered);
  REQUIRE(again.has_value());
  CHECK(again->revision == first->revision);
  CHECK_FALSE(again->created);
  CHECK(historySize(registry, "weather-lookup") == 1);
  // No defaults are filled in before hashing: an explicit empty capabilities object differs.
  auto withEmpty = manifest();
  withEmpty["capabilities"] = json::object{};
  auto third = registry.install(withEmpty);
  REQUIRE(third.has_value());
  CHECK(third->revision != first->revision);
}

TEST_CASE("bindings: activate, conflict without replace, changes listed", "[registry]") {
  TempStore temp;
  Registry registry(*temp.store);
  auto v1 = registry.install(manifest());
  auto v2Manifest = manifest("weather-lookup", "export default async () => 2");
  v2Manifest["capabilities"] = json::parse(
      R"({"fetch":[{"origin":"https://api.weather.example","access":["read","write"]}],"storage":true})");
  v2Manifest["limits"] = json::parse(R"({"wallMs":30000,"heapMb":64})");
  auto v2 = registry.install(v2Manifest);
  REQUIRE(v1.has_value());
  REQUIRE(v2.has_value());

  CHECK_FALSE(registry.tryBinding("weather-lookup").has_value());
  // Installed, not active: the error says what to do.
  auto inactive = registry.getActive("weather-lookup");
  REQUIRE_FALSE(inactive.has_value());
  CHECK(inactive.error().code == RegistryErrc::notFound);
  CHECK_THAT(inactive.error().detail, Catch::Contains("2 installed revision(s), none active") &&
                                          Catch::Contains("tools.activate"));
  CHECK(registry.getActive("never-installed").error().detail ==
        "no active tool named never-installed");
  auto first = registry.activate("weather-lookup", v1->revision, false);
  REQUIRE(first.has_value());
  CHECK(first->changed);
  CHECK_FALSE(first->previous.has_value());
  CHECK(registry.tryBinding("weather-lookup")->revision == v1->revision);

  // Activating the bound revision again changes nothing, and says so: previous is itself, and
  // no capability or limit is listed as added.
  auto same = registry.activate("weather-lookup", v1->revision, false);
  REQUIRE(same.has_value());
  CHECK_FALSE(same->changed);
  CHECK(same->previous == v1->revision);
  CHECK(same->changes.at("capabilities").at("added").as_array().empty());
  CHECK(same->changes.at("capabilities").at("removed").as_array().empty());
  CHECK(same->changes.at("limits").as_object().empty());

  std::vector<std::string> moves;
  registry.onBindingMoved([&](const std::string& name, const std::string& from, const std::string& to) {
    moves.push_back(name + " " + from + " " + to);
  });
  auto refused = registry.activate("weather-lookup", v2->revision, false);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code == RegistryErrc::conflict);
  CHECK_THAT(refused.error().detail, Catch::Contains("replace"));
  CHECK(registry.tryBinding("weather-lookup")->revision == v1->revision);
  CHECK(moves.empty());

  auto moved = registry.activate("weather-lookup", v2->revision, true);
  REQUIRE(moved.has_value());
  CHECK(moved->previous == v1->revision);
  CHECK(moved->changes.at("capabilities").at("added") ==
        json::array{"fetch https://api.weather.example write", "storage"});
  CHECK(moved->changes.at("capabilities").at("removed").as_array().empty());
  CHECK(moved->changes.at("limits").at("wallMs").at("from") == 60000);
  CHECK(moved->changes.at("limits").at("wallMs").at("to") == 30000);
  CHECK(moves.size() == 1);

  auto history = registry.history("weather-lookup");
  REQUIRE(history.has_value());
  REQUIRE(history->size() == 2);
  CHECK(history->at(0).revision == v1->revision);
  CHECK_FALSE(history->at(0).active);
  CHECK(history->at(1).active);
}

TEST_CASE("a revision cannot be borrowed under another name", "[registry]") {
  TempStore temp;
  Registry registry(*temp.store);
  auto weather = registry.install(manifest("weather-lookup"));
  auto other = registry.install(manifest("other-tool"));
  REQUIRE(weather.has_value());
  REQUIRE(other.has_value());
  CHECK(registry.getRevision(weather->revision, std::string("weather-lookup")).has_value());
  auto borrowed = registry.getRevision(weather->revision, std::string("other-tool"));
  REQUIRE_FALSE(borrowed.has_value());
  CHECK(borrowed.error().code == RegistryErrc::notFound);
  auto bound = registry.activate("other-tool", weather->revision, true);
  REQUIRE_FALSE(bound.has_value());
  CHECK(bound.error().code == RegistryErrc::notFound);
  CHECK(registry.getRevision("sha256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA").error().code ==
        RegistryErrc::notFound);
  CHECK(registry.getRevision("not-a-revision").error().code == RegistryErrc::notFound);
}

TEST_CASE("stored manifests are re-hashed on read, a mismatch is never served", "[registry]") {
  TempStore temp;
  std::string revision;
  {
    Registry registry(*temp.store);
    revision = registry.install(manifest())->revision;
    REQUIRE(registry.activate("weather-lookup", revision, false).has_value());
  }
  // Flip one character of the stored bytes behind the registry's back.
  auto table = temp.store->table("tool_manifests");
  auto tampered = temp.store->write([&](store::WriteTxn& txn) -> boost::system::result<void> {
    auto stored = *txn.getCopy(table, revision);
    auto at = stored.find("Current");
    stored[at] = 'c';
    txn.put(table, revision, stored);
    return {};
  });
  REQUIRE(tampered.has_value());
  Registry fresh(*temp.store);  // no cache
  auto read = fresh.getRevision(revision);
  REQUIRE_FALSE(read.has_value());
  CHECK(read.error().code == RegistryErrc::integrity);
  CHECK(fresh.getActive("weather-lookup").error().code == RegistryErrc::integrity);
  auto problems = fresh.verifyAll();
  REQUIRE(problems.has_value());
  REQUIRE(problems->size() == 1);
  CHECK_THAT(problems->front(), Catch::Contains(revision));
}

TEST_CASE("built-in tools: registered once, reserved, not installable", "[registry]") {
  TempStore temp;
  std::string echoRevision;
  {
    Registry registry(*temp.store);
    for (auto& tool : builtinNativeTools()) {
      auto registered = registry.registerNative(std::move(tool));
      REQUIRE(registered.has_value());
      CHECK(registered->created);
      if (registered->name == "echo") echoRevision = registered->revision;
    }
    CHECK(registry.tryBinding("echo")->revision == echoRevision);
    REQUIRE(registry.tryNative(echoRevision) != nullptr);
    auto echoed = registry.tryNative(echoRevision)->run(json::object{{"x", 1}});
    CHECK(*echoed == json::object{{"x", 1}});
  }
  // A restart registers them again without writing anything.
  Registry registry(*temp.store);
  for (auto& tool : builtinNativeTools()) {
    auto registered = registry.registerNative(std::move(tool));
    REQUIRE(registered.has_value());
    CHECK_FALSE(registered->created);
  }
  CHECK(historySize(registry, "echo") == 1);

  auto native = manifest("my-native");
  native["execution"] = json::object{{"class", "trusted-native"},
                                     {"implementationRevision", echoRevision}};
  auto refused = registry.install(native);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code == RegistryErrc::invalidDefinition);
  CHECK_THAT(refused.error().detail, Catch::Contains("compiled into the daemon"));
  // Without what only a built-in tool has, the refusal says the same, not what to add.
  native["execution"] = json::object{{"class", "trusted-native"}};
  refused = registry.install(native);
  REQUIRE_FALSE(refused.has_value());
  CHECK_THAT(refused.error().detail, Catch::Contains("compiled into the daemon"));

  auto taken = registry.install(manifest("echo"));
  REQUIRE_FALSE(taken.has_value());
  CHECK(taken.error().code == RegistryErrc::reservedName);
}

TEST_CASE("a changed built-in moves its binding", "[registry]") {
  TempStore temp;
  Registry registry(*temp.store);
  auto tools = builtinNativeTools();
  auto first = registry.registerNative(tools[0]);
  NativeTool changed = tools[0];
  changed.manifest["description"] = "a newer build's echo";
  std::vector<std::string> moves;
  registry.onBindingMoved([&](const std::string& name, const std::string&, const std::string&) { moves.push_back(name); });
  auto second = registry.registerNative(changed);
  REQUIRE(second.has_value());
  CHECK(second->revision != first->revision);
  CHECK(registry.tryBinding("echo")->revision == second->revision);
  CHECK(moves == std::vector<std::string>{"echo"});
}

TEST_CASE("time-now answers the time at an offset", "[registry]") {
  auto tools = builtinNativeTools();
  auto& timeNow = tools[1];
  REQUIRE(timeNow.manifest.at("name") == "time-now");
  auto answer = timeNow.run(json::object{{"offsetMinutes", -90}});
  REQUIRE(answer.has_value());
  std::string iso(answer->at("iso").as_string());
  CHECK_THAT(iso, Catch::EndsWith("-01:30"));
  CHECK_THAT(std::string(answer->at("utc").as_string()), Catch::EndsWith("Z"));
  CHECK(answer->at("unixMs").as_int64() > 1700000000000);
}

TEST_CASE("settings are content-addressed and resolve only for their own tool revision", "[registry]") {
  TempStore temp;
  Registry registry(*temp.store);
  auto withSchema = manifest();
  withSchema["settings"] = json::parse(R"({"type":"object","properties":{"units":{"enum":["metric","imperial"]}},"additionalProperties":false})");
  auto tool = registry.install(withSchema);
  auto other = registry.install(manifest("other-tool"));
  REQUIRE(tool.has_value());
  auto configured = registry.configure("weather-lookup", tool->revision, json::object{{"units", "metric"}});
  REQUIRE(configured.has_value());
  CHECK(configured->created);
  CHECK(protocol::isContentHash(configured->settingsRevision));
  // Salted with a secret of the store: hashing guessed values does not find the revision.
  CHECK(configured->settingsRevision !=
        offlineHash("toolhost.tool-settings.v1",
                    R"({"settings":{"units":"metric"},"tool":"weather-lookup","toolRevision":")" +
                        tool->revision + R"("})"));
  auto again = registry.configure("weather-lookup", tool->revision, json::object{{"units", "metric"}});
  CHECK_FALSE(again->created);
  CHECK(again->settingsRevision == configured->settingsRevision);
  // The salt's key lasts with the store; another store salts with its own.
  Registry reopened(*temp.store);
  CHECK(reopened.configure("weather-lookup", tool->revision, json::object{{"units", "metric"}})
            ->settingsRevision == configured->settingsRevision);
  TempStore elsewhere;
  Registry otherStore(*elsewhere.store);
  REQUIRE(otherStore.install(withSchema).has_value());
  CHECK(otherStore.configure("weather-lookup", tool->revision, json::object{{"units", "metric"}})
            ->settingsRevision != configured->settingsRevision);
  auto problems = registry.verifyAll();
  REQUIRE(problems.has_value());
  CHECK(problems->empty());
  CHECK(registry.trySettingsRevision("weather-lookup", tool->revision) == configured->settingsRevision);

  auto values = registry.getSettings(configured->settingsRevision, "weather-lookup", tool->revision);
  REQUIRE(values.has_value());
  CHECK(values->at("units") == "metric");
  CHECK(registry.getSettings(configured->settingsRevision, "other-tool", other->revision).error().code ==
        RegistryErrc::notFound);
  CHECK(registry.getSettings(configured->settingsRevision, "weather-lookup", other->revision).error().code ==
        RegistryErrc::notFound);

  auto invalid = registry.configure("weather-lookup", tool->revision, json::object{{"units", "kelvin"}});
  REQUIRE_FALSE(invalid.has_value());
  CHECK_THAT(invalid.error().detail, Catch::Contains("settings/units"));
  CHECK(registry.configure("other-tool", tool->revision, json::object{}).error().code == RegistryErrc::notFound);
}

TEST_CASE("manifest refusals name the field and the reason", "[registry]") {
  TempStore temp;
  Registry registry(*temp.store);
  auto refused = [&](json::object m, const std::string& expected) {
    auto outcome = registry.install(m);
    REQUIRE_FALSE(outcome.has_value());
    CHECK(outcome.error().code == RegistryErrc::invalidDefinition);
    CHECK_THAT(outcome.error().detail, Catch::Contains(expected));
  };
  for (const char* bad : {"Weather", "-x", "x-", "a--b", "1tool", "tool name", "", "ünïcode",
                          "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}) {
    refused(manifest(bad), "manifest/name");
  }
  CHECK(isValidToolName("a"));
  CHECK(isValidToolName("weather-lookup"));
  CHECK(isValidToolName("time_now2"));

  auto m = manifest();
  m.erase("description");
  refused(m, "description");

  m = manifest();
  m["parameters"] = json::parse(R"({"type":"array"})");
  refused(m, "manifest/parameters");

  // Patterns are compiled at install: one toolhost's matcher cannot run is refused there.
  m = manifest();
  m["parameters"] =
      json::parse(R"j({"type":"object","properties":{"a":{"type":"string","pattern":"^(?=a)"}}})j");
  refused(m, "manifest/parameters/properties/a/pattern");
  m = manifest();
  m["parameters"] =
      json::parse(R"({"type":"object","properties":{"a":{"type":"string","pattern":"a{2,1}"}}})");
  refused(m, "manifest/parameters/properties/a/pattern");
  m = manifest();
  m["parameters"] = json::parse(R"({"type":"object","properties":{"a":{"pattern":5}}})");
  refused(m, "manifest/parameters/properties/a/pattern: must be a string");

  m = manifest();
  m["parameters"] = json::parse(R"({"type":"object","patternProperties":{"^x":{}}})");
  refused(m, "patternProperties");

  m = manifest();
  m["parameters"] = json::parse(R"({"type":"object","properties":{"a":{"type":"array","uniqueItems":true}}})");
  refused(m, "uniqueItems");

  m = manifest();
  m["parameters"] = json::parse(R"({"type":"object","properties":{"a":{"$ref":"https://evil.example/schema"}}})");
  refused(m, "$ref");

  // Schemas valijson cannot take: refused with its words (without exceptions it would abort).
  for (const char* invalid :
       {R"({"type":"object","minLength":-1})", R"({"type":"objekt"})",
        R"({"type":"object","required":"x"})", R"({"type":"object","maxItems":1.5})",
        R"({"type":"object","properties":{"a":5}})",
        R"({"type":"object","maxProperties":18446744073709551615})"}) {
    INFO(invalid);
    m = manifest();
    m["parameters"] = json::parse(invalid);
    refused(m, "manifest/parameters: invalid JSON Schema");
  }

  // References that never end, or fan out, are refused before valijson follows them.
  for (const char* recursive :
       {R"({"type":"object","$ref":"#"})", R"({"type":"object","allOf":[{"$ref":"#"}]})",
        R"({"type":"object","not":{"not":{"$ref":"#"}}})",
        R"({"type":"object","properties":{"a":{"$ref":"#/definitions/a"}},
            "definitions":{"a":{"$ref":"#/definitions/b"},"b":{"$ref":"#/definitions/a"}}})",
        R"({"type":"object","properties":{"children":{"type":"array","items":{"$ref":"#"}}}})"}) {
    m = manifest();
    m["parameters"] = json::parse(recursive);
    refused(m, "leads back to itself");
  }
  // Also where a schema stands under a property named like a data keyword, or a reference
  // leads into data, or a pointer has an empty token (which valijson skips).
  for (
      const char* hidden :
      {R"({"type":"object","properties":{"enum":{"allOf":[{"$ref":"#/properties/enum"}]}}})",
       R"({"type":"object","definitions":{"default":{"not":{"$ref":"#/definitions/default"}}}})"}) {
    m = manifest();
    m["parameters"] = json::parse(hidden);
    refused(m, "leads back to itself");
  }
  m = manifest();
  m["parameters"] = json::parse(
      R"({"type":"object","$ref":"#/enum/0","enum":[{"allOf":[{"$ref":"#/enum/0"}]}]})");
  refused(m, "leads into the data of \"enum\"");
  m = manifest();
  m["parameters"] = json::parse(R"({"type":"object","properties":{"x":{"$ref":"#/definitions/a"}},
      "definitions":{"a":{"":{},"allOf":[{"$ref":"#/definitions/a/"}]}}})");
  refused(m, "empty tokens");
  m = manifest();
  m["parameters"] = json::parse(
      R"({"type":"object","properties":{"default":{"type":"string","pattern":"^(a|b)*\\1$"}}})");
  refused(m, "manifest/parameters/properties/default/pattern");
  m = manifest();
  m["parameters"] = json::parse(
      R"({"type":"object","properties":{"enum":{"type":"array","uniqueItems":true,"maxItems":101}}})");
  refused(m, "at most 100");
  // A property named "pattern" is no keyword.
  m = manifest();
  m["parameters"] = json::parse(R"({"type":"object","properties":{"pattern":{"type":"string"}}})");
  CHECK(registry.install(m).has_value());

  json::object definitions;
  for (int level = 0; level < 20; ++level) {
    const std::string next = "#/definitions/d" + std::to_string(level + 1);
    definitions["d" + std::to_string(level)] = json::object{
        {"anyOf", json::array{json::object{{"$ref", next}}, json::object{{"$ref", next}}}}};
  }
  definitions["d20"] = json::object{{"type", "string"}};
  m = manifest();
  m["parameters"] =
      json::object{{"type", "object"},
                   {"properties", json::object{{"a", json::object{{"$ref", "#/definitions/d0"}}}}},
                   {"definitions", definitions}};
  refused(m, "written out");
  m = manifest();
  m["parameters"] =
      json::parse(R"({"type":"object","properties":{"a":{"$ref":"#/definitions/nope"}}})");
  refused(m, "leads nowhere");
  m = manifest();
  m["parameters"] =
      json::parse(R"({"type":"object","properties":{"a":{"$ref":"#/required"}},"required":["a"]})");
  refused(m, "does not lead to a schema");
  m = manifest();
  m["parameters"] =
      json::parse(R"({"type":"object","properties":{"a":{"id":"other","$ref":"#"}}})");
  refused(m, "\"id\" is not supported");

  for (const char* origin :
       {"http://api.example", "https://API.example", "https://api.example/",
        "https://api.example/path", "https://user@api.example", "https://api.example:443",
        "https://api.example?q", "https://api.example:0",
        // Forms fetch reads as another origin, or never reaches.
        "https://127.1", "https://0x7f000001:8443", "https://api.example.", "https://%61pi.example",
        "https://[::ffff:127.0.0.1]", "https://[0::1]", "https://a..example", "https://localhost",
        "https://api.example:08443", "https://api.example#x"}) {
    m = manifest();
    m["capabilities"] = json::object{
        {"fetch", json::array{json::object{{"origin", origin}, {"access", json::array{"read"}}}}}};
    refused(m, "manifest/capabilities/fetch/0/origin");
  }
  CHECK(isCanonicalHttpsOrigin("https://api.example"));
  CHECK(isCanonicalHttpsOrigin("https://api.example:8443"));
  CHECK(isCanonicalHttpsOrigin("https://[::1]:8443"));
  // Literals of any range: the operator may open them ([fetch] allow_private).
  CHECK(isCanonicalHttpsOrigin("https://127.0.0.1:8443"));
  CHECK(isCanonicalHttpsOrigin("https://[::ffff:7f00:1]"));
  CHECK(isCanonicalHttpsOrigin("https://169.254.169.254"));
  m = manifest();
  m["capabilities"] = json::object{
      {"fetch",
       json::array{json::object{{"origin", "https://127.1"}, {"access", json::array{"read"}}}}}};
  refused(m, "write https://127.0.0.1");
  // The refusal never quotes what was given: it may carry a password.
  auto why = toolhost::policy::whyNotCanonicalOrigin("https://bot:hunter2@api.example");
  REQUIRE(why.has_value());
  CHECK(why->find("hunter2") == std::string::npos);
  why = toolhost::policy::whyNotCanonicalOrigin("https://api.example:99999/?key=sk-SECRET");
  REQUIRE(why.has_value());
  CHECK(why->find("sk-SECRET") == std::string::npos);

  m = manifest();
  m["capabilities"] = json::parse(R"({"fetch":[{"origin":"https://a.example","access":["delete"]}]})");
  refused(m, "access");

  m = manifest();
  m["capabilities"] = json::parse(R"({"popup":["http://a.example"]})");
  refused(m, "manifest/capabilities/popup/0");

  m = manifest();
  m["capabilities"] = json::parse(R"({"teleport":true})");
  refused(m, "capabilities");

  for (const char* module : {"../escape.js", "/abs.js", "util.py", "a//b.js", ".hidden.js"}) {
    m = manifest();
    m["execution"].as_object()["modules"] = json::object{{module, "export const x = 1"}};
    refused(m, "manifest/execution/modules");
  }

  m = manifest();
  m["execution"] = json::parse(R"({"class":"external-service","endpoint":"http://plain.example/rpc"})");
  refused(m, "manifest/execution/endpoint");
  m["execution"] = json::parse(R"({"class":"external-service","endpoint":"unix:relative.sock"})");
  refused(m, "manifest/execution/endpoint");
  // Control characters would reach an approver's terminal and the logs.
  m["execution"] = json::object{{"class", "external-service"},
                                {"endpoint", "unix:/s\r\x1b[K  https://api.trusted.example"}};
  refused(m, "manifest/execution/endpoint");
  m["execution"] = json::parse(R"({"class":"external-service","endpoint":"https://svc.example/rpc"})");
  CHECK(registry.install(m).has_value());
  m["execution"] = json::parse(R"({"class":"external-service","endpoint":"unix:/run/svc.sock"})");
  CHECK(registry.install(m).has_value());

  m = manifest();
  m["execution"].as_object()["source"] = std::string(3 * 1024 * 1024, ' ');
  refused(m, "manifest/execution");

  m = manifest();
  m["limits"] = json::parse(R"({"wallMs":-1})");
  refused(m, "limits/wallMs");
}

TEST_CASE("format is an annotation: no regular expression ever runs on arguments", "[registry]") {
  auto schema = compileToolSchema(
      json::parse(R"({"type":"object","properties":{"when":{"type":"string","format":"date-time"}}})"), "parameters");
  REQUIRE(schema.has_value());
  // A string long enough to overflow std::regex's recursion if it were matched.
  json::object arguments{{"when", std::string(500000, '1')}};
  CHECK_FALSE(schema->validate(arguments).has_value());
  CHECK(schema->validate(json::object{{"when", 5}}).has_value());
}

TEST_CASE("pattern is matched in linear time, wherever a schema stands", "[registry][pattern]") {
  auto schema = compileToolSchema(json::parse(R"({
    "type": "object",
    "properties": {
      "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
      "slug": {"$ref": "#/definitions/slug"},
      "either": {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "^x+$"}]},
      "never": {"not": {"type": "string", "pattern": "^(a+)+$"}},
      "pattern": {"type": "string"},
      "names": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}},
      "any": {"pattern": "\\d"}
    },
    "definitions": {"slug": {"type": "string", "pattern": "^[a-z0-9]+(?:-[a-z0-9]+)*$"}}
  })"),
                                  "parameters");
  REQUIRE(schema.has_value());
  auto ok = [&](const char* arguments) {
    INFO(arguments);
    auto violation = schema->validate(json::parse(arguments));
    if (violation) INFO(violation->describe("arguments"));
    CHECK_FALSE(violation.has_value());
  };
  auto bad = [&](const char* arguments, const std::string& path, const std::string& reason) {
    INFO(arguments);
    auto violation = schema->validate(json::parse(arguments));
    REQUIRE(violation);
    CHECK(violation->path == path);
    CHECK_THAT(violation->reason, Catch::Contains(reason));
  };
  ok(R"({"code":"CDG","slug":"new-york","either":5,"pattern":"(","names":{"ab":1},"any":3})");
  ok(R"({"either":"xxx","never":"aab","any":"a1"})");
  bad(R"({"code":"cdg"})", "/code", "must match the pattern \"^[A-Z]{3}$\"");
  bad(R"({"code":"CDGX"})", "/code", "must match the pattern");
  bad(R"({"slug":"new--york"})", "/slug", "must match the pattern");
  bad(R"({"never":"aaaa"})", "/never", "");
  bad(R"({"names":{"A":1}})", "/names", "a property name that its \"propertyNames\" schema");
  bad(R"({"any":"abc"})", "/any", R"(must match the pattern "\\d")");  // no digit anywhere
  bad(R"({"either":"xy"})", "/either", "");

  // The classic catastrophic patterns: a backtracking engine would not finish these in a
  // lifetime; the matcher takes a step per state per character.
  auto catastrophic = compileToolSchema(json::parse(R"({"type":"object","properties":{
      "a": {"type": "string", "pattern": "^(a+)+$"},
      "b": {"type": "string", "pattern": "^(\\w+\\s?)*$"}}})"),
                                        "parameters");
  REQUIRE(catastrophic.has_value());
  const std::string longA = std::string(30000, 'a') + "!";
  auto violation = catastrophic->validate(json::object{{"a", longA}});
  REQUIRE(violation);
  CHECK(violation->path == "/a");
  violation = catastrophic->validate(json::object{{"b", std::string(20000, 'w') + " w!"}});
  REQUIRE(violation);
  CHECK(violation->path == "/b");
  CHECK_FALSE(catastrophic->validate(json::object{{"b", std::string(20000, 'w') + " w"}}));

  // Past the budget of one validation, the arguments are refused as too costly, also where a
  // failure would have passed (under "not").
  json::array many(200, json::value(std::string(100000, 'a') + "!"));
  auto costly = compileToolSchema(json::parse(R"({"type":"object","properties":{
      "xs": {"type": "array", "items": {"not": {"type": "string", "pattern": "^(a|aa)+$"}}}}})"),
                                  "parameters");
  REQUIRE(costly.has_value());
  violation = costly->validate(json::object{{"xs", many}});
  REQUIRE(violation);
  CHECK(violation->path.empty());
  CHECK_THAT(violation->reason, Catch::Contains("too costly to check"));
  CHECK(costly->checkCost(json::object{{"xs", many}}) > 1'000'000);
  // Any instance may spend the budget (a property name, an empty string against a long program,
  // a pattern used through many references): never checked inline on an I/O thread.
  CHECK(costly->checkCost(json::object{}) >= 2 * JsonSchema::kMaxPatternSteps);

  // A 7-byte pattern can be 10,000 instructions: a schema's patterns are bounded together.
  json::array heavy;
  for (const char c : std::string("abcdef")) {
    heavy.push_back(json::object{{"pattern", std::string(1, c) + "{9998}"}});
  }
  auto tooHeavy = compileToolSchema(
      json::object{{"type", "object"},
                   {"properties", json::object{{"s", json::object{{"allOf", heavy}}}}}},
      "parameters");
  REQUIRE_FALSE(tooHeavy.has_value());
  CHECK_THAT(tooHeavy.error().detail, Catch::Contains("instructions of the matcher"));

  // What valijson would read as its own keyword is not ours to write.
  auto smuggled = compileToolSchema(
      json::parse(R"({"type":"object","properties":{"a":{"toolhost:pattern":"^$"}}})"),
      "parameters");
  REQUIRE(smuggled.has_value());
  CHECK_FALSE(smuggled->validate(json::object{{"a", "x"}}));
}

TEST_CASE("list shows every active binding", "[registry]") {
  TempStore temp;
  Registry registry(*temp.store);
  auto a = registry.install(manifest("tool-a"));
  auto b = registry.install(manifest("tool-b"));
  registry.install(manifest("tool-c"));  // installed, never activated
  REQUIRE(registry.activate("tool-a", a->revision, false).has_value());
  REQUIRE(registry.activate("tool-b", b->revision, false).has_value());
  auto bindings = registry.list();
  REQUIRE(bindings.has_value());
  REQUIRE(bindings->size() == 2);
  CHECK(bindings->at(0).name == "tool-a");
  CHECK(bindings->at(1).name == "tool-b");
  CHECK(registry.history("tool-c")->size() == 1);
  CHECK(registry.history("tool-z").error().code == RegistryErrc::notFound);
}

TEST_CASE("the state survives reopening the store", "[registry]") {
  TempStore temp;
  std::string revision;
  {
    Registry registry(*temp.store);
    revision = registry.install(manifest())->revision;
    registry.activate("weather-lookup", revision, false);
  }
  temp.reopen();
  Registry registry(*temp.store);
  auto active = registry.getActive("weather-lookup");
  REQUIRE(active.has_value());
  CHECK((*active)->revision == revision);
  CHECK((*active)->manifest == manifest());
  CHECK(registry.verifyAll()->empty());
}

TEST_CASE("a binding read while activations race never leaves an old binding behind",
          "[registry]") {
  TempStore temp;
  Registry registry(*temp.store);
  auto v1 = registry.install(manifest());
  auto v2 = registry.install(manifest("weather-lookup", "export default async () => 2"));
  REQUIRE(v1.has_value());
  REQUIRE(v2.has_value());
  REQUIRE(registry.activate("weather-lookup", v1->revision, false).has_value());

  std::atomic<bool> stop{false};
  std::atomic<int> unexpected{0};
  std::atomic<int> reads{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < 3; ++i) {
    readers.emplace_back([&] {
      while (!stop.load()) {
        auto active = registry.getActive("weather-lookup");
        if (!active || ((*active)->revision != v1->revision && (*active)->revision != v2->revision)) {
          unexpected.fetch_add(1);
        }
        reads.fetch_add(1);
      }
    });
  }
  // The readers are running before the activations start.
  while (reads.load() < 3) std::this_thread::yield();
  const int readsBefore = reads.load();
  for (int round = 0; round < 100; ++round) {
    const std::string& next = round % 2 == 0 ? v2->revision : v1->revision;
    REQUIRE(registry.activate("weather-lookup", next, true).has_value());
    // Once activate has returned, every read sees the new binding.
    CHECK(registry.tryBinding("weather-lookup")->revision == next);
    CHECK((*registry.getActive("weather-lookup"))->revision == next);
  }
  stop.store(true);
  for (auto& reader : readers) reader.join();
  CHECK(unexpected.load() == 0);
  CHECK(reads.load() > readsBefore);  // reads raced the activations
  CHECK(registry.tryBinding("weather-lookup")->revision == v1->revision);
}

TEST_CASE("parameters may share definitions through local references", "[registry]") {
  TempStore temp;
  Registry registry(*temp.store);
  auto m = manifest();
  m["parameters"] = json::parse(R"({"type":"object",
      "properties":{"from":{"$ref":"#/definitions/place"},"to":{"$ref":"#/definitions/place"},
                    "via":{"type":"array","items":{"$ref":"#/definitions/place"}}},
      "definitions":{"place":{"type":"object","required":["city"],
                              "properties":{"city":{"$ref":"#/definitions/a~1name"}}},
                     "a/name":{"type":"string","minLength":1}}})");
  auto installed = registry.install(m);
  REQUIRE(installed.has_value());
  auto tool = registry.getRevision(installed->revision, std::nullopt);
  REQUIRE(tool.has_value());
  const auto& parameters = (*tool)->parameters;
  CHECK_FALSE(
      parameters.validate(json::parse(R"({"from":{"city":"Paris"},"via":[{"city":"Lyon"}]})")));
  auto violation =
      parameters.validate(json::parse(R"({"from":{"city":"Paris"},"via":[{"city":""}]})"));
  REQUIRE(violation);
  CHECK(violation->path == "/via/0/city");
}

TEST_CASE("a violation says what the value must be, from the schema", "[registry]") {
  auto schema = JsonSchema::compile(json::parse(R"({
    "type": "object",
    "properties": {
      "delayMs": {"type": "integer", "minimum": 0, "maximum": 1440},
      "mode": {"enum": ["retained", "disposable"]},
      "note": {"type": ["string", "null"]},
      "step": {"multipleOf": 0.5},
      "tiny": {"maximum": 1e-7},
      "\"q\"": {"type": "string"},
      "list": {"type": "array", "items": {"$ref": "#/definitions/item"}}
    },
    "additionalProperties": false,
    "definitions": {"item": {"type": "object", "properties": {"kind": {"const": "a"}}}}
  })"));
  REQUIRE(schema.has_value());
  auto reason = [&](const char* arguments, const std::string& path) {
    auto violation = schema->validate(json::parse(arguments));
    REQUIRE(violation);
    CHECK(violation->path == path);
    return violation->reason;
  };
  CHECK(reason(R"({"delay":5})", "") ==
        R"(has no property "delay"; the properties it takes are "delayMs", "mode", "note", )"
        R"("step", "tiny", "\"q\"", "list")");
  CHECK(reason(R"({"delayMs":"5"})", "/delayMs") == "must be an integer (it is a string)");
  CHECK(reason(R"({"delayMs":100000})", "/delayMs") == "must be at most 1440 (it is 100000)");
  CHECK(reason(R"({"delayMs":-1})", "/delayMs") == "must be at least 0 (it is -1)");
  CHECK(reason(R"({"mode":"dispose"})", "/mode") ==
        R"(must be one of "retained", "disposable")");  // a string given is never repeated
  CHECK(reason(R"({"note":5})", "/note") == "must be a string or null (it is a number)");
  CHECK(reason(R"({"step":0.3})", "/step") == "must be a multiple of 0.5 (it is 0.3)");
  CHECK(reason(R"({"tiny":1})", "/tiny") == "must be at most 1e-7 (it is 1)");
  CHECK(reason(R"({"\"q\"":1})", "/\"q\"") == "must be a string (it is a number)");
  // Through items and a reference.
  CHECK(reason(R"({"list":[{"kind":"a"},{"kind":"b"}]})", "/list/1/kind") == R"(must be "a")");
  // A long value is cut short.
  const std::string longMode = R"({"mode":")" + std::string(500, 'x') + R"("})";
  CHECK(reason(longMode.c_str(), "/mode").size() < 200);
}

TEST_CASE("an over-long array against uniqueItems fails at maxItems without comparing its items",
          "[registry]") {
  auto schema = JsonSchema::compile(json::parse(
      R"({"type":"object","properties":{"tags":{"type":"array","maxItems":10,"uniqueItems":true}}})"));
  REQUIRE(schema.has_value());
  json::array tags;
  for (int i = 0; i < 20000; ++i) tags.emplace_back("same");
  // Collecting every error, valijson would record each of the 2 * 10^8 equal pairs.
  auto violation = schema->validate(json::object{{"tags", tags}});
  REQUIRE(violation);
  CHECK(violation->path == "/tags");
  auto repeated = schema->validate(json::parse(R"({"tags":["a","b","a"]})"));
  REQUIRE(repeated);
  CHECK_THAT(repeated->reason, Catch::Contains("unique"));
  CHECK_FALSE(schema->validate(json::parse(R"({"tags":["a","b"]})")));
}

TEST_CASE("a failure that records no error of its own is named in our words at its place",
          "[registry]") {
  // valijson checks property names without recording why, and says what its combinators and
  // containers found in words of its own at the parent's place.
  auto schema = compileToolSchema(json::parse(R"({
    "type": "object",
    "propertyNames": {"pattern": "^[a-z]+$"},
    "properties": {
      "list": {"type": "array", "items": {"type": "object", "propertyNames": {"maxLength": 2}}},
      "extra": {"type": "object", "additionalProperties": {"type": "object",
                                                          "propertyNames": {"pattern": "^x"}}},
      "either": {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "^x+$"}]},
      "one": {"oneOf": [{"type": "integer"}, {"minimum": 0}]},
      "has": {"type": "array", "contains": {"const": 1}}
    }
  })"),
                                  "parameters");
  REQUIRE(schema.has_value());
  auto failure = [&](const char* arguments) {
    INFO(arguments);
    auto violation = schema->validate(json::parse(arguments));
    REQUIRE(violation);
    return *violation;
  };
  SchemaViolation root = failure(R"({"Upper":1})");
  CHECK(root.path.empty());
  CHECK(root.reason == "has a property name that its \"propertyNames\" schema does not allow");
  SchemaViolation item = failure(R"({"list":[{"ab":1},{"abc":1}]})");
  CHECK(item.path == "/list/1");
  CHECK_THAT(item.reason, Catch::Contains("\"propertyNames\""));
  SchemaViolation extra = failure(R"({"extra":{"k":{"xa":1,"b":2}}})");
  CHECK(extra.path == "/extra");
  CHECK(extra.reason == "has a property that its \"additionalProperties\" schema does not allow");
  CHECK(failure(R"({"either":"xy"})").reason == "matches none of the schemas its \"anyOf\" allows");
  CHECK(failure(R"({"one":3})").reason ==
        "matches more than one of the schemas its \"oneOf\" allows");
  CHECK(failure(R"({"one":-0.5})").reason == "matches none of the schemas its \"oneOf\" allows");
  CHECK(failure(R"({"has":[2,3]})").reason == "holds no item that its \"contains\" schema allows");
  for (const char* fine : {R"({"list":[{"ab":1}],"extra":{"k":{"xa":1}},"one":-1,"has":[2,1]})",
                           R"({"either":"xx"})"}) {
    INFO(fine);
    CHECK_FALSE(schema->validate(json::parse(fine)).has_value());
  }
}

TEST_CASE("sizes and required properties are named in our words", "[registry]") {
  auto schema = compileToolSchema(json::parse(R"({
    "type": "object",
    "required": ["name"],
    "properties": {
      "name": {"type": "string", "minLength": 2, "maxLength": 4},
      "tags": {"type": "array", "minItems": 1, "maxItems": 2},
      "meta": {"type": "object", "minProperties": 1, "maxProperties": 1}
    }
  })"),
                                  "parameters");
  REQUIRE(schema.has_value());
  auto reason = [&](const char* arguments, const std::string& path) {
    INFO(arguments);
    auto violation = schema->validate(json::parse(arguments));
    REQUIRE(violation);
    CHECK(violation->path == path);
    return violation->reason;
  };
  CHECK(reason(R"({})", "") == "lacks the required property \"name\"");
  // A string's length is not shown (it may be a secret's); an array's or object's size is.
  CHECK(reason(R"({"name":"a"})", "/name") == "must be at least 2 characters long");
  CHECK(reason(R"({"name":"abcde"})", "/name") == "must be at most 4 characters long");
  CHECK(reason(R"({"name":"ab","tags":[]})", "/tags") == "must have at least 1 item (it has 0)");
  CHECK(reason(R"({"name":"ab","tags":[1,2,3]})", "/tags") ==
        "must have at most 2 items (it has 3)");
  CHECK(reason(R"({"name":"ab","meta":{}})", "/meta") ==
        "must have at least 1 property (it has 0)");
  CHECK(reason(R"({"name":"ab","meta":{"a":1,"b":2}})", "/meta") ==
        "must have at most 1 property (it has 2)");
}

TEST_CASE("a string holding U+0000 is refused, never read up to it", "[registry]") {
  // valijson reads strings through c_str(): "abc\0zzz" would pass an enum of "abc", a pattern,
  // a maxLength.
  auto schema = compileToolSchema(json::parse(R"({
    "type": "object",
    "properties": {
      "mode": {"enum": ["abc"]},
      "word": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3},
      "list": {"type": "array", "items": {"type": "object"}}
    }
  })"),
                                  "parameters");
  REQUIRE(schema.has_value());
  const std::string nul(1, '\0');
  auto violation = schema->validate(json::object{{"mode", "abc" + nul + "zzz"}});
  REQUIRE(violation);
  CHECK(violation->path == "/mode");
  CHECK_THAT(violation->reason, Catch::Contains("U+0000"));
  violation = schema->validate(json::object{{"word", "ab" + nul + "DEF!"}});
  REQUIRE(violation);
  CHECK(violation->path == "/word");
  json::object named;
  named["k" + nul] = 1;
  violation = schema->validate(json::object{{"list", json::array{json::object{}, named}}});
  REQUIRE(violation);
  CHECK(violation->path == "/list/1");
  CHECK_THAT(violation->reason, Catch::Contains("property name"));
  CHECK_FALSE(schema->validate(json::object{{"mode", "abc"}, {"word", "ab"}}));

  // Nor may a schema hold one: its enum would be cut short.
  auto refused =
      JsonSchema::compile(json::object{{"enum", json::array{json::value("abc" + nul + "x")}}});
  REQUIRE_FALSE(refused.has_value());
  CHECK_THAT(refused.error().detail, Catch::Contains("U+0000") && Catch::Contains("/enum/0"));
}

TEST_CASE("multipleOf must be a number above zero and is exact for fractions", "[registry]") {
  // valijson divides integers by an integer divisor: 0 (or "0", read as a number) and -1 with
  // the smallest integer stopped the process with SIGFPE at the first validation.
  for (const char* divisor : {"0", "-1", "-0.5", "\"0\"", "\"2\"", "null"}) {
    INFO(divisor);
    auto refused = JsonSchema::compile(json::parse(
        std::string(R"({"type":"object","properties":{"n":{"multipleOf":)") + divisor + "}}}"));
    REQUIRE_FALSE(refused.has_value());
    CHECK_THAT(refused.error().detail,
               Catch::Contains("/properties/n/multipleOf: must be a number greater than 0"));
  }
  auto schema =
      JsonSchema::compile(json::parse(R"({"type":"object","properties":{"n":{"multipleOf":2}}})"));
  REQUIRE(schema.has_value());
  CHECK_FALSE(schema->validate(json::parse(R"({"n":4})")));
  CHECK_FALSE(schema->validate(json::parse(R"({"n":-9223372036854775808})")));
  CHECK_FALSE(schema->validate(json::parse(R"({"n":6.0})")));
  // Truncated to 4 by valijson's integer form, 4.5 passed.
  CHECK(schema->validate(json::parse(R"({"n":4.5})")));
  CHECK(schema->validate(json::parse(R"({"n":7})")));
  CHECK_FALSE(schema->validate(json::parse(R"({"n":1e300})")));  // undefined behaviour before
  auto fractional = JsonSchema::compile(
      json::parse(R"({"type":"object","properties":{"n":{"multipleOf":0.5}}})"));
  REQUIRE(fractional.has_value());
  CHECK_FALSE(fractional->validate(json::parse(R"({"n":4.5})")));
  CHECK(fractional->validate(json::parse(R"({"n":4.25})")));
}

TEST_CASE("integers above 2^63 meet the numeric keywords", "[registry]") {
  // valijson skipped maximum for an integer stored as unsigned.
  auto schema =
      JsonSchema::compile(json::parse(R"({"type":"object","properties":{"n":{"maximum":100}}})"));
  REQUIRE(schema.has_value());
  auto violation = schema->validate(json::parse(R"({"n":18446744073709551615})"));
  REQUIRE(violation);
  CHECK(violation->path == "/n");
  CHECK_FALSE(schema->validate(json::parse(R"({"n":100})")));
}

TEST_CASE("one validation is bounded in time and memory whatever the instance", "[registry]") {
  auto strings = JsonSchema::compile(json::parse(
      R"({"type":"object","properties":{"tags":{"type":"array","items":{"type":"string"}}}})"));
  REQUIRE(strings.has_value());
  // Collecting every error for 4 million wrong items took 1.8 GB: past 100,000 values the
  // violation comes without its place.
  json::array many(200'000, json::value(0));
  auto violation = strings->validate(json::object{{"tags", many}});
  REQUIRE(violation);
  CHECK(violation->path.empty());
  CHECK_THAT(violation->reason, Catch::Contains("too many to say where"));
  json::array few(1000, json::value("a"));
  few.back() = 0;
  auto placed = strings->validate(json::object{{"tags", few}});
  REQUIRE(placed);
  CHECK(placed->path == "/tags/999");
  // A schema of 3000 values against 100,000 values is past the 2 * 10^7 pairs arguments may take.
  json::array entries(1000, json::parse(R"({"type":"number"})"));
  auto wide = JsonSchema::compile(json::object{
      {"type", "object"},
      {"properties",
       json::object{
           {"xs", json::object{{"type", "array"}, {"items", json::object{{"allOf", entries}}}}}}}});
  REQUIRE(wide.has_value());
  json::array numbers(100'000, json::value(1));
  auto refused = wide->validate(json::object{{"xs", numbers}}, JsonSchema::kMaxPairsForArguments);
  REQUIRE(refused);
  CHECK_THAT(refused->reason, Catch::Contains("too large to check"));
  // Examples are never compared: they do not shrink what the arguments may hold.
  auto annotated = JsonSchema::compile(
      json::object{{"type", "object"},
                   {"examples", json::array(10'000, json::value("an example"))},
                   {"properties", json::object{{"xs", json::object{{"type", "array"}}}}}});
  REQUIRE(annotated.has_value());
  CHECK(annotated->expandedValues() < 10);
  CHECK_FALSE(
      annotated->validate(json::object{{"xs", numbers}}, JsonSchema::kMaxPairsForArguments));
  CHECK_FALSE(wide->validate(json::object{{"xs", json::array(1000, json::value(1))}},
                             JsonSchema::kMaxPairsForArguments));
}

TEST_CASE("loaded revisions are cached within a count and a size", "[registry]") {
  TempStore temp;
  Registry registry(*temp.store);
  // Every revision ever called stayed in memory with its compiled schemas.
  std::vector<std::string> revisions;
  for (int i = 0; i < 300; ++i) {
    auto installed =
        registry.install(manifest("counted", "export default async () => " + std::to_string(i)));
    REQUIRE(installed.has_value());
    revisions.push_back(installed->revision);
    REQUIRE(registry.getRevision(installed->revision, std::nullopt).has_value());
  }
  CHECK(registry.cachedRevisions() == 256);
  // Least recently used first out: one used again stays while newer ones come.
  auto kept = registry.getRevision(revisions[100], std::nullopt);
  REQUIRE(kept.has_value());
  for (int i = 0; i < 100; ++i) {
    auto installed =
        registry.install(manifest("counted", "export default async () => -" + std::to_string(i)));
    REQUIRE(installed.has_value());
    REQUIRE(registry.getRevision(installed->revision, std::nullopt).has_value());
  }
  auto still = registry.getRevision(revisions[100], std::nullopt);
  REQUIRE(still.has_value());
  CHECK(still->get() == kept->get());
  // An evicted revision loads again, the same.
  auto first = registry.getRevision(revisions.front(), std::string("counted"));
  REQUIRE(first.has_value());
  CHECK((*first)->revision == revisions.front());
  CHECK((*first)->parameters.validate(json::parse(R"({"city":"Paris"})")) == std::nullopt);
  // Large manifests: 8 MiB of them at most.
  const std::string big(1900 * 1024, ' ');  // within the 2 MiB of source a manifest may have
  ToolRevisionPtr loaded;
  for (int i = 0; i < 6; ++i) {
    auto installed = registry.install(
        manifest("large", "export default async () => " + std::to_string(i) + big));
    REQUIRE(installed.has_value());
    auto got = registry.getRevision(installed->revision, std::nullopt);
    REQUIRE(got.has_value());
    loaded = *got;
  }
  CHECK(registry.cachedRevisions() == 4);
  auto again = registry.getRevision(loaded->revision, std::nullopt);
  REQUIRE(again.has_value());
  CHECK(again->get() == loaded.get());  // from the cache
}

TEST_CASE("a manifest stored before a rule tightened installs again as stored", "[registry]") {
  TempStore temp;
  Registry registry(*temp.store);
  auto old = manifest();
  old["capabilities"] = json::object{
      {"fetch",
       json::array{json::object{{"origin", "https://127.1"}, {"access", json::array{"read"}}}}}};
  REQUIRE_FALSE(registry.install(old).has_value());  // refused as new
  // As an earlier version stored it.
  const std::string canonical = *toolhost::protocol::canonicalJson(old);
  const std::string revision = toolhost::protocol::contentHashOfCanonical(
      toolhost::protocol::domain::kToolManifest, canonical);
  REQUIRE(temp.store->write([&](toolhost::store::WriteTxn& txn) -> boost::system::result<void> {
    txn.put(temp.store->table("tool_manifests"), revision, canonical);
    return {};
  }));
  auto again = registry.install(old);
  REQUIRE(again.has_value());
  CHECK(again->revision == revision);
  CHECK_FALSE(again->created);
  CHECK(again->name == "weather-lookup");
}
