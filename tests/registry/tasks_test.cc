// Tasks: hashing, pinning, lineage scoping, all-or-nothing commit, integrity, and the shapes of
// lineage, providerTools and messages. Each test has its own store in a temporary directory.
#include "registry/tasks.h"

#include "protocol/content_hash.h"
#include "protocol/json_parse.h"
#include "protocol/json_text.h"
#include "registry/registry.h"
#include "store/store.h"
#include "tests/support/temp_dir.h"

#include <unistd.h>
#include <boost/json/serialize.hpp>
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

using namespace toolhost;
using namespace toolhost::registry;
namespace json = boost::json;

namespace {

using toolhost::testing::TempDir;

store::StorePtr openStore(const std::filesystem::path& stateDir) {
  store::Options options;
  options.stateDir = stateDir;
  options.tables = Registry::tables();
  for (auto& table : TaskStore::tables()) options.tables.push_back(table);
  options.mapSizeMb = 64;
  auto opened = store::Store::open(options);
  if (!opened) FAIL("open failed: " << opened.error().message);
  return std::move(*opened);
}

template <class T>
T value(Result<T> outcome) {
  if (!outcome) FAIL("unexpected error: " << outcome.error().detail);
  return std::move(*outcome);
}

template <class T>
RegistryError failure(Result<T> outcome) {
  if (outcome) FAIL("expected an error, got a value");
  return outcome.error();
}

json::value parse(std::string_view text) {
  auto parsed = protocol::parseJson(text);
  if (!parsed) FAIL("bad test JSON: " << text);
  return *parsed;
}
json::object object(std::string_view text) { return parse(text).as_object(); }
json::array array(std::string_view text) { return parse(text).as_array(); }

std::string str(const json::value& v) { return std::string(v.as_string()); }

json::object manifest(std::string_view name,
                      std::string_view source = "export default async () => 1") {
  json::object m = object(R"({
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "settings": {"type": "object"}
  })");
  m["name"] = name;
  m["execution"] =
      json::object{{"class", "sandboxed-code"}, {"runtime", "javascript"}, {"source", source}};
  return m;
}

struct Fixture {
  TempDir dir;
  store::StorePtr store = openStore(dir.path() / "state");
  Registry registry{*store};
  TaskStore tasks{*store, registry};

  std::string installActive(std::string_view name,
                            std::string_view source = "export default async () => 1") {
    auto installed = value(registry.install(manifest(name, source)));
    value(registry.activate(installed.name, installed.revision, true));
    return installed.revision;
  }

  json::array compile(std::string_view drafts, std::optional<std::string> parentId = std::nullopt) {
    return value(tasks.compile(array(drafts), parentId));
  }

  // Compiles and commits; returns the tasks.
  json::array append(std::string_view drafts, std::optional<std::string> parentId = std::nullopt) {
    auto compiled = compile(drafts, std::move(parentId));
    auto committed = value(tasks.commit(compiled));
    REQUIRE(committed.ids.size() == compiled.size());
    return compiled;
  }

  bool stored(const std::string& id) {
    auto got = tasks.get(id);
    if (got) return true;
    REQUIRE(got.error().code == RegistryErrc::notFound);
    return false;
  }
};

std::string idOf(const json::value& task) { return str(task.at("id")); }

constexpr std::string_view kUser = R"([{"kind":"message","role":"user","content":"hi"}])";

json::object codeDefinition(std::string_view name, std::string_view source) {
  json::object task = object(R"({"kind":"tooldefinition","role":"system","definition":{
      "description":"a lineage tool",
      "parameters":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]},
      "implementation":{"type":"code"}}})");
  task["definition"].as_object()["name"] = name;
  task["definition"].as_object()["implementation"].as_object()["source"] = source;
  return task;
}

std::string drafts(std::initializer_list<json::value> items) {
  json::array out;
  for (const auto& item : items) out.push_back(item);
  return protocol::writeJson(out);
}

json::object callDraft(std::string_view name, json::object arguments) {
  return json::object{{"kind", "functioncall"},
                      {"role", "assistant"},
                      {"call", json::object{{"name", name}, {"arguments", std::move(arguments)}}}};
}

}  // namespace

TEST_CASE("a task id is the content hash of everything but the id", "[tasks][hash]") {
  auto a = object(R"({"kind":"message","role":"user","content":{"x":1,"y":[1,2]}})");
  auto b = object(R"({"content":{"y":[1,2],"x":1},"role":"user","kind":"message"})");
  auto idA = value(taskId(a));
  CHECK(idA == value(taskId(b)));
  CHECK(protocol::isContentHash(idA));
  auto direct = protocol::contentHash(protocol::domain::kTask, json::value(a));
  REQUIRE(direct.has_value());
  CHECK(idA == *direct);

  auto withId = a;
  withId["id"] = "sha256:whatever";
  CHECK(value(taskId(withId)) == idA);

  auto other = a;
  other["role"] = "assistant";
  CHECK(value(taskId(other)) != idA);
}

TEST_CASE("compile chains drafts under the given parent and returns hashed tasks",
          "[tasks][compile]") {
  Fixture f;
  auto roots = f.compile(R"([{"kind":"message","role":"system","content":"be brief"},
                             {"kind":"message","role":"user","content":"hi"}])");
  REQUIRE(roots.size() == 2);
  CHECK_FALSE(roots[0].as_object().contains("parentId"));
  CHECK(roots[1].at("parentId") == roots[0].at("id"));
  for (const auto& task : roots) CHECK(idOf(task) == value(taskId(task.as_object())));
  // Compile writes nothing.
  CHECK_FALSE(f.stored(idOf(roots[0])));
  value(f.tasks.commit(roots));

  // Under a stored parent; priorId is kept as given.
  auto answer =
      f.compile(R"([{"kind":"message","role":"assistant","content":"hello"}])", idOf(roots[1]));
  json::object retry{{"kind", "message"},
                     {"role", "assistant"},
                     {"content", "hello!"},
                     {"priorId", answer[0].at("id")}};
  auto retried = f.compile(drafts({retry}), idOf(roots[1]));
  CHECK(retried[0].at("parentId") == roots[1].at("id"));
  CHECK(retried[0].at("priorId") == answer[0].at("id"));
  CHECK(idOf(retried[0]) == value(taskId(retried[0].as_object())));
}

TEST_CASE("compile refuses drafts with ids, parentIds or pins, and unknown members",
          "[tasks][compile]") {
  Fixture f;
  auto root = f.append(kUser);

  auto withId = failure(f.tasks.compile(array(R"([{"kind":"message","role":"user","content":"a"},
                {"kind":"message","role":"user","content":"b","id":"sha256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}])"),
                                        std::nullopt));
  CHECK(withId.code == RegistryErrc::invalidDefinition);
  CHECK_THAT(withId.detail, Catch::StartsWith("drafts[1].id"));

  json::object withParent{
      {"kind", "message"}, {"role", "user"}, {"content", "x"}, {"parentId", root[0].at("id")}};
  auto parent = failure(f.tasks.compile(json::array{withParent}, std::nullopt));
  CHECK(parent.code == RegistryErrc::invalidDefinition);
  CHECK_THAT(parent.detail, Catch::StartsWith("drafts[0].parentId"));

  auto revision = f.installActive("weather");
  json::object pinned = callDraft("weather", object(R"({"city":"Oslo"})"));
  pinned["call"].as_object()["toolRevision"] = revision;
  auto pin = failure(f.tasks.compile(json::array{pinned}, std::nullopt));
  CHECK_THAT(pin.detail, Catch::Contains("call.toolRevision"));

  auto unknown = failure(f.tasks.compile(
      array(R"([{"kind":"message","role":"user","content":"x","extra":1}])"), std::nullopt));
  CHECK(unknown.code == RegistryErrc::invalidDefinition);
  CHECK_THAT(unknown.detail, Catch::Contains("\"extra\""));

  auto badKind =
      failure(f.tasks.compile(array(R"([{"kind":"note","role":"user"}])"), std::nullopt));
  CHECK_THAT(badKind.detail, Catch::StartsWith("drafts[0].kind"));
  auto badRole = failure(
      f.tasks.compile(array(R"([{"kind":"message","role":"robot","content":""}])"), std::nullopt));
  CHECK_THAT(badRole.detail, Catch::StartsWith("drafts[0].role"));
  auto both = failure(f.tasks.compile(json::array{json::object{{"kind", "toolresult"},
                                                               {"role", "tool"},
                                                               {"callId", root[0].at("id")},
                                                               {"result", 1},
                                                               {"error", "x"}}},
                                      idOf(root[0])));
  CHECK_THAT(both.detail, Catch::Contains("exactly one of result and error"));

  auto noParent =
      failure(f.tasks.compile(array(kUser), "sha256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"));
  CHECK(noParent.code == RegistryErrc::notFound);
  CHECK_THAT(noParent.detail, Catch::StartsWith("parentId"));

  auto empty = failure(f.tasks.compile(json::array{}, std::nullopt));
  CHECK(empty.code == RegistryErrc::invalidDefinition);
}

TEST_CASE("a call is pinned to the bound registry revision and its settings revision",
          "[tasks][pin]") {
  Fixture f;
  auto revision = f.installActive("weather");
  auto root = f.append(kUser);
  auto call =
      f.compile(drafts({callDraft("weather", object(R"({"city":"Oslo"})"))}), idOf(root[0]));
  auto pinned = call[0].at("call").as_object();
  CHECK(pinned.at("name") == "weather");
  CHECK(str(pinned.at("toolRevision")) == revision);
  CHECK_FALSE(pinned.contains("settingsRevision"));
  CHECK(pinned.at("arguments") == object(R"({"city":"Oslo"})"));

  auto configured =
      value(f.registry.configure("weather", revision, object(R"({"apiKey":"s3cret-value"})")));
  auto withSettings =
      f.compile(drafts({callDraft("weather", object(R"({"city":"Oslo"})"))}), idOf(root[0]));
  auto pinnedWithSettings = withSettings[0].at("call").as_object();
  CHECK(str(pinnedWithSettings.at("settingsRevision")) == configured.settingsRevision);
  // Settings values never enter a task.
  CHECK(protocol::writeJson(withSettings).find("s3cret-value") == std::string::npos);
  auto committed = value(f.tasks.commit(withSettings));
  CHECK(committed.created == 1);

  // A newer binding does not move what was pinned.
  auto newer = f.installActive("weather", "export default async () => 2");
  CHECK(newer != revision);
  CHECK(str(value(f.tasks.get(idOf(withSettings[0]))).at("call").at("toolRevision")) == revision);
}

TEST_CASE("an unresolved call is refused and named, bad arguments name the field", "[tasks][pin]") {
  Fixture f;
  f.installActive("weather");
  auto unresolved = failure(f.tasks.compile(
      array(drafts({json::object{{"kind", "message"}, {"role", "user"}, {"content", "x"}},
                    callDraft("no-such-tool", {})})),
      std::nullopt));
  CHECK(unresolved.code == RegistryErrc::notFound);
  CHECK_THAT(unresolved.detail, Catch::Contains("drafts[1].call.name"));
  CHECK_THAT(unresolved.detail, Catch::Contains("no-such-tool"));

  auto badArguments = failure(
      f.tasks.compile(json::array{callDraft("weather", object(R"({"city":7})"))}, std::nullopt));
  CHECK(badArguments.code == RegistryErrc::invalidArguments);
  CHECK_THAT(badArguments.detail, Catch::Contains("drafts[0]"));
  CHECK_THAT(badArguments.detail, Catch::Contains("weather"));
  CHECK_THAT(badArguments.detail, Catch::Contains("arguments/city"));
}

TEST_CASE("the nearest ancestor definition wins over farther ones and the registry",
          "[tasks][scope]") {
  Fixture f;
  auto registryRevision = f.installActive("echo");
  auto root = f.append(kUser);
  auto chain =
      f.append(drafts({codeDefinition("echo", "export default async () => 'far'"),
                       callDraft("echo", object(R"({"text":"a"})")),
                       json::object{{"kind", "message"}, {"role", "user"}, {"content", "again"}}}),
               idOf(root[0]));
  const std::string far = idOf(chain[0]);
  CHECK(str(chain[1].at("call").at("toolRevision")) == far);
  CHECK_FALSE(chain[1].at("call").as_object().contains("settingsRevision"));

  // A nearer definition in the same compile shadows the stored one from there on.
  auto nearer = f.compile(drafts({callDraft("echo", object(R"({"text":"b"})")),
                                  codeDefinition("echo", "export default async () => 'near'"),
                                  callDraft("echo", object(R"({"text":"c"})"))}),
                          idOf(chain[2]));
  CHECK(str(nearer[0].at("call").at("toolRevision")) == far);
  CHECK(nearer[2].at("call").at("toolRevision") == nearer[1].at("id"));
  value(f.tasks.commit(nearer));

  // Outside that lineage, the registry binding resolves.
  auto outside = f.compile(drafts({callDraft("echo", object(R"({"city":"x"})"))}), idOf(root[0]));
  CHECK(str(outside[0].at("call").at("toolRevision")) == registryRevision);

  // Definition arguments are checked against the definition's parameters.
  auto bad = failure(
      f.tasks.compile(json::array{callDraft("echo", object(R"({"city":"x"})"))}, idOf(chain[2])));
  CHECK(bad.code == RegistryErrc::invalidArguments);
  CHECK_THAT(bad.detail, Catch::Contains(far));
}

TEST_CASE("a definition in a sibling branch is not visible", "[tasks][scope]") {
  Fixture f;
  auto root = f.append(kUser);
  auto branchA = f.append(drafts({codeDefinition("local-tool", "export default async () => 1")}),
                          idOf(root[0]));
  CHECK(f.compile(drafts({callDraft("local-tool", object(R"({"text":"x"})"))}), idOf(branchA[0]))[0]
            .at("call")
            .at("toolRevision") == branchA[0].at("id"));

  auto sibling = failure(f.tasks.compile(
      json::array{callDraft("local-tool", object(R"({"text":"x"})"))}, idOf(root[0])));
  CHECK(sibling.code == RegistryErrc::notFound);
  CHECK_THAT(sibling.detail, Catch::Contains("local-tool"));

  // Nor can a commit pin a call to it by hand.
  json::object forged{{"kind", "functioncall"},
                      {"role", "assistant"},
                      {"parentId", root[0].at("id")},
                      {"call", json::object{{"name", "local-tool"},
                                            {"toolRevision", branchA[0].at("id")},
                                            {"arguments", object(R"({"text":"x"})")}}}};
  forged["id"] = value(taskId(forged));
  auto refused = failure(f.tasks.commit(json::array{forged}));
  CHECK(refused.code == RegistryErrc::notFound);
  CHECK_THAT(refused.detail, Catch::StartsWith("tasks[0].call.toolRevision"));
  // The definition is never installed in the registry.
  CHECK_FALSE(f.registry.tryBinding("local-tool").has_value());
}

TEST_CASE("a binding definition pins a registry revision, its calls pin the definition",
          "[tasks][scope]") {
  Fixture f;
  auto target = f.installActive("weather");
  auto root = f.append(kUser);
  json::object binding = object(R"({"kind":"tooldefinition","role":"system","definition":{
      "name":"forecast","description":"weather, renamed",
      "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}})");
  binding["definition"].as_object()["implementation"] =
      json::object{{"type", "binding"}, {"targetRevision", target}};
  auto chain = f.append(drafts({binding, callDraft("forecast", object(R"({"city":"Oslo"})"))}),
                        idOf(root[0]));
  CHECK(chain[1].at("call").at("toolRevision") == chain[0].at("id"));

  // The bound revision's parameters hold too (it requires city).
  auto missingCity =
      failure(f.tasks.compile(json::array{callDraft("forecast", {})}, idOf(chain[0])));
  CHECK(missingCity.code == RegistryErrc::invalidArguments);
  CHECK_THAT(missingCity.detail, Catch::Contains(target));

  // A target that is not a registry revision is refused.
  binding["definition"].as_object()["implementation"].as_object()["targetRevision"] =
      "sha256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
  auto unknownTarget = failure(f.tasks.compile(json::array{binding}, idOf(root[0])));
  CHECK(unknownTarget.code == RegistryErrc::notFound);
  CHECK_THAT(unknownTarget.detail, Catch::Contains("targetRevision"));

  auto badSchema = codeDefinition("bad", "x");
  badSchema["definition"].as_object()["parameters"] =
      object(R"j({"type":"object","properties":{"s":{"type":"string","pattern":"(?<=a)"}}})j");
  auto pattern = failure(f.tasks.compile(json::array{badSchema}, std::nullopt));
  CHECK(pattern.code == RegistryErrc::invalidDefinition);
  CHECK_THAT(pattern.detail, Catch::Contains("drafts[0].definition.parameters"));
}

TEST_CASE("a toolresult answers a functioncall of its own lineage", "[tasks][compile]") {
  Fixture f;
  f.installActive("weather");
  auto root = f.append(kUser);
  auto call = f.append(drafts({callDraft("weather", object(R"({"city":"Oslo"})"))}), idOf(root[0]));
  json::object result{{"kind", "toolresult"},
                      {"role", "tool"},
                      {"callId", call[0].at("id")},
                      {"result", object(R"({"temp":3})")}};
  auto answered = f.append(drafts({result}), idOf(call[0]));
  CHECK(answered[0].at("callId") == call[0].at("id"));

  // Not from a sibling branch, and not pointing at a message.
  auto sibling = failure(f.tasks.compile(json::array{result}, idOf(root[0])));
  CHECK_THAT(sibling.detail, Catch::StartsWith("drafts[0].callId"));
  result["callId"] = root[0].at("id");
  auto message = failure(f.tasks.compile(json::array{result}, idOf(call[0])));
  CHECK_THAT(message.detail, Catch::StartsWith("drafts[0].callId"));
}

TEST_CASE("commit writes everything or nothing", "[tasks][commit]") {
  Fixture f;
  auto root = f.append(kUser);
  auto chain = f.compile(R"([{"kind":"message","role":"assistant","content":"one"},
                             {"kind":"message","role":"user","content":"two"},
                             {"kind":"message","role":"assistant","content":"three"}])",
                         idOf(root[0]));

  SECTION("a tampered third task") {
    chain[2].as_object()["content"] = "changed";
    auto refused = failure(f.tasks.commit(chain));
    CHECK(refused.code == RegistryErrc::invalidDefinition);
    CHECK_THAT(refused.detail, Catch::StartsWith("tasks[2].id"));
  }
  SECTION("a third task whose parent is not stored") {
    json::object orphan{{"kind", "message"},
                        {"role", "user"},
                        {"content", "x"},
                        {"parentId", "sha256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}};
    orphan["id"] = value(taskId(orphan));
    chain[2] = orphan;
    auto refused = failure(f.tasks.commit(chain));
    CHECK(refused.code == RegistryErrc::notFound);
    CHECK_THAT(refused.detail, Catch::StartsWith("tasks[2].parentId"));
  }
  SECTION("a third task with a prior that is not stored") {
    auto third = chain[2].as_object();
    third.erase("id");
    third["priorId"] = "sha256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    third["id"] = value(taskId(third));
    chain[2] = third;
    auto refused = failure(f.tasks.commit(chain));
    CHECK_THAT(refused.detail, Catch::StartsWith("tasks[2].priorId"));
  }
  SECTION("a third task that links to a later one") {
    std::swap(chain[1], chain[2]);
    auto refused = failure(f.tasks.commit(chain));
    CHECK_THAT(refused.detail, Catch::StartsWith("tasks[1].parentId"));
    CHECK_THAT(refused.detail, Catch::Contains("later"));
  }
  CHECK_FALSE(f.stored(idOf(chain[0])));
  CHECK_FALSE(f.stored(idOf(chain[1])));
  CHECK(f.stored(idOf(root[0])));
}

TEST_CASE("commit is idempotent and answers ids in order", "[tasks][commit]") {
  Fixture f;
  auto chain = f.compile(R"([{"kind":"message","role":"user","content":"a"},
                             {"kind":"message","role":"assistant","content":"b"}])");
  auto first = value(f.tasks.commit(chain));
  CHECK(first.created == 2);
  CHECK(first.ids == std::vector<std::string>{idOf(chain[0]), idOf(chain[1])});
  auto again = value(f.tasks.commit(chain));
  CHECK(again.created == 0);
  CHECK(again.ids == first.ids);
  CHECK(value(f.tasks.get(idOf(chain[1]))) == chain[1].as_object());
}

TEST_CASE("commit refuses unpinned or falsely pinned calls", "[tasks][commit]") {
  Fixture f;
  auto revision = f.installActive("weather");
  auto other = f.installActive("other");
  auto root = f.append(kUser);
  auto call =
      f.compile(drafts({callDraft("weather", object(R"({"city":"Oslo"})"))}), idOf(root[0]));
  auto rehash = [](json::object task) {
    task.erase("id");
    task["id"] = value(taskId(task));
    return task;
  };

  auto unpinned = call[0].as_object();
  unpinned["call"].as_object().erase("toolRevision");
  auto noRevision = failure(f.tasks.commit(json::array{rehash(unpinned)}));
  CHECK(noRevision.code == RegistryErrc::invalidDefinition);
  CHECK_THAT(noRevision.detail, Catch::StartsWith("tasks[0].call.toolRevision"));

  auto borrowed = call[0].as_object();
  borrowed["call"].as_object()["toolRevision"] = other;
  auto borrow = failure(f.tasks.commit(json::array{rehash(borrowed)}));
  CHECK_THAT(borrow.detail, Catch::StartsWith("tasks[0].call.toolRevision"));

  auto forgedSettings = call[0].as_object();
  forgedSettings["call"].as_object()["settingsRevision"] =
      "sha256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
  auto settings = failure(f.tasks.commit(json::array{rehash(forgedSettings)}));
  CHECK_THAT(settings.detail, Catch::StartsWith("tasks[0].call.settingsRevision"));

  auto badArguments = call[0].as_object();
  badArguments["call"].as_object()["arguments"] = object(R"({"city":1})");
  auto arguments = failure(f.tasks.commit(json::array{rehash(badArguments)}));
  CHECK(arguments.code == RegistryErrc::invalidArguments);

  auto withSettingsValues = call[0].as_object();
  withSettingsValues["call"].as_object()["settings"] = object(R"({"apiKey":"x"})");
  auto values = failure(f.tasks.commit(json::array{rehash(withSettingsValues)}));
  CHECK_THAT(values.detail, Catch::Contains("\"settings\""));

  // Pinned to a definition of another name in the same batch.
  auto definitionTask = codeDefinition("helper", "export default async () => 1");
  definitionTask["parentId"] = root[0].at("id");
  definitionTask = rehash(definitionTask);
  auto misnamed = call[0].as_object();
  misnamed["parentId"] = definitionTask.at("id");
  misnamed["call"].as_object()["toolRevision"] = definitionTask.at("id");
  auto wrongName = failure(f.tasks.commit(json::array{definitionTask, rehash(misnamed)}));
  CHECK_THAT(wrongName.detail, Catch::StartsWith("tasks[1].call.toolRevision"));
  CHECK_THAT(wrongName.detail, Catch::Contains("not a definition of weather"));
  CHECK_FALSE(f.stored(idOf(definitionTask)));

  CHECK(value(f.tasks.commit(call)).created == 1);
  (void)revision;
}

TEST_CASE("a stored task that no longer matches its id is never served", "[tasks][integrity]") {
  Fixture f;
  auto chain = f.append(R"([{"kind":"message","role":"user","content":"a"},
                            {"kind":"message","role":"assistant","content":"b"}])");
  const std::string id = idOf(chain[0]);
  auto table = f.store->table(TaskStore::tables().front());
  auto corrupted = f.store->write([&](store::WriteTxn& txn) -> boost::system::result<void> {
    txn.put(table, id, R"({"content":"evil","kind":"message","role":"user"})");
    return {};
  });
  REQUIRE(corrupted.has_value());
  CHECK(failure(f.tasks.get(id)).code == RegistryErrc::integrity);
  CHECK(failure(f.tasks.lineage(idOf(chain[1]))).code == RegistryErrc::integrity);
  CHECK(failure(f.tasks.messages(idOf(chain[1]))).code == RegistryErrc::integrity);
  CHECK(failure(f.tasks.compile(array(kUser), idOf(chain[1]))).code == RegistryErrc::integrity);
  CHECK(value(f.tasks.get(idOf(chain[1]))).at("content") == "b");
}

TEST_CASE("lineage is root first and ends at the task", "[tasks][lineage]") {
  Fixture f;
  auto first = f.append(R"([{"kind":"message","role":"system","content":"s"},
                            {"kind":"message","role":"user","content":"u"}])");
  auto second =
      f.append(R"([{"kind":"message","role":"assistant","content":"a"}])", idOf(first[1]));
  f.append(R"([{"kind":"message","role":"assistant","content":"sibling"}])", idOf(first[1]));
  auto lineage = value(f.tasks.lineage(idOf(second[0])));
  REQUIRE(lineage.size() == 3);
  CHECK(lineage[0] == first[0]);
  CHECK(lineage[1] == first[1]);
  CHECK(lineage[2] == second[0]);
  CHECK(value(f.tasks.lineage(idOf(first[0]))).size() == 1);
  CHECK(failure(f.tasks.lineage("sha256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")).code ==
        RegistryErrc::notFound);
  CHECK(failure(f.tasks.get("nonsense")).code == RegistryErrc::notFound);
}

TEST_CASE("limits are refused clearly", "[tasks][limits]") {
  TempDir dir;
  auto store = openStore(dir.path() / "state");
  Registry registry(*store);
  TaskLimits limits;
  limits.maxBatch = 2;
  limits.maxLineage = 3;
  limits.maxTaskBytes = 200;
  TaskStore tasks(*store, registry, limits);
  auto three = array(
      R"([{"kind":"message","role":"user","content":"1"},{"kind":"message","role":"user","content":"2"},
                         {"kind":"message","role":"user","content":"3"}])");
  CHECK_THAT(failure(tasks.compile(three, std::nullopt)).detail, Catch::Contains("limit is 2"));
  auto two = value(tasks.compile(array(R"([{"kind":"message","role":"user","content":"1"},
                                           {"kind":"message","role":"user","content":"2"}])"),
                                 std::nullopt));
  value(tasks.commit(two));
  auto third = value(tasks.compile(array(kUser), idOf(two[1])));
  value(tasks.commit(third));
  CHECK_THAT(failure(tasks.compile(array(kUser), idOf(third[0]))).detail,
             Catch::Contains("limit is 3"));
  json::array big{
      json::object{{"kind", "message"}, {"role", "user"}, {"content", std::string(300, 'x')}}};
  CHECK_THAT(failure(tasks.compile(big, std::nullopt)).detail,
             Catch::Contains("limit for one task is 200"));
  // Commit holds the lineage bound too, for tasks built without compile.
  json::object fourth{
      {"kind", "message"}, {"role", "user"}, {"content", "4"}, {"parentId", third[0].at("id")}};
  fourth["id"] = value(taskId(fourth));
  CHECK_THAT(failure(tasks.commit(json::array{fourth})).detail, Catch::Contains("limit is 3"));

  // Each branch a commit extends walks its own lineage; the sum is bounded too.
  TaskLimits walkLimits;
  walkLimits.maxCommitWalk = 4;
  TaskStore walkTasks(*store, registry, walkLimits);
  json::array branches;
  for (const auto& parent : {two[1], third[0]}) {
    json::object branch{
        {"kind", "message"}, {"role", "user"}, {"content", "b"}, {"parentId", parent.at("id")}};
    branch["id"] = value(taskId(branch));
    branches.push_back(branch);
  }
  CHECK_THAT(failure(walkTasks.commit(branches)).detail, Catch::Contains("tasks[1].parentId"));
  branches.pop_back();
  CHECK(value(walkTasks.commit(branches)).created == 1);

  // A lineage read stops once its stored text passes maxReadBytes: that answer could not be sent.
  TaskLimits readLimits;
  readLimits.maxReadBytes = 100;
  TaskStore readTasks(*store, registry, readLimits);
  CHECK(value(readTasks.lineage(idOf(two[0]))).size() == 1);
  for (auto refused : {readTasks.lineage(idOf(third[0])), readTasks.messages(idOf(third[0]))}) {
    CHECK(failure(refused).code == RegistryErrc::tooLarge);
    CHECK_THAT(failure(refused).detail, Catch::Contains("more than one answer can carry"));
  }
  // providerTools keeps only definitions: its answer stays small.
  CHECK(readTasks.providerTools(idOf(third[0])).has_value());
}

TEST_CASE("providerTools merges registry bindings with the lineage's definitions",
          "[tasks][provider]") {
  Fixture f;
  f.installActive("weather");
  f.installActive("echo");
  auto root = f.append(kUser);
  auto chain = f.append(drafts({codeDefinition("echo", "export default async () => 'lineage'"),
                                codeDefinition("local-tool", "export default async () => 1")}),
                        idOf(root[0]));

  auto atRoot = value(f.tasks.providerTools(idOf(root[0])));
  REQUIRE(atRoot.size() == 2);
  CHECK(atRoot[0].at("type") == "function");
  CHECK(atRoot[0].at("function").at("name") == "echo");
  CHECK(atRoot[0].at("function").at("description") == "Current weather for a city");
  CHECK(atRoot[1].at("function").at("name") == "weather");
  CHECK(atRoot[1].at("function").at("parameters").at("required") == json::array{"city"});

  auto atLeaf = value(f.tasks.providerTools(idOf(chain[1])));
  REQUIRE(atLeaf.size() == 3);
  CHECK(atLeaf[0].at("function").at("name") == "echo");
  CHECK(atLeaf[0].at("function").at("description") == "a lineage tool");  // shadowed
  CHECK(atLeaf[1].at("function").at("name") == "local-tool");
  CHECK(atLeaf[2].at("function").at("name") == "weather");
  for (const auto& tool : atLeaf) {
    CHECK(tool.as_object().size() == 2);
    CHECK(tool.at("function").as_object().size() == 3);  // name, description, parameters only
  }
}

TEST_CASE("messages shows the lineage as chat messages without definitions", "[tasks][messages]") {
  Fixture f;
  f.installActive("weather");
  auto start = f.append(
      drafts({json::object{{"kind", "message"}, {"role", "system"}, {"content", "be brief"}},
              json::object{{"kind", "message"}, {"role", "user"}, {"content", "weather?"}},
              codeDefinition("echo", "export default async () => 1"),
              callDraft("weather", object(R"({"city":"Oslo"})")),
              callDraft("echo", object(R"({"text":"hi"})"))}));
  const std::string weatherCall = idOf(start[3]);
  const std::string echoCall = idOf(start[4]);
  auto end = f.append(
      drafts({json::object{{"kind", "toolresult"},
                           {"role", "tool"},
                           {"callId", weatherCall},
                           {"result", object(R"({"temp":3})")}},
              json::object{{"kind", "toolresult"},
                           {"role", "tool"},
                           {"callId", echoCall},
                           {"error", "echo failed"}},
              json::object{{"kind", "message"}, {"role", "assistant"}, {"content", "3 degrees"}}}),
      echoCall);
  auto messages = value(f.tasks.messages(idOf(end[2])));
  REQUIRE(messages.size() == 6);
  CHECK(messages[0] == object(R"({"role":"system","content":"be brief"})"));
  CHECK(messages[1] == object(R"({"role":"user","content":"weather?"})"));
  const auto& calls = messages[2].as_object();
  CHECK(calls.at("role") == "assistant");
  CHECK(calls.at("content").is_null());
  REQUIRE(calls.at("tool_calls").as_array().size() == 2);
  CHECK(calls.at("tool_calls").at(0) ==
        json::object{
            {"id", weatherCall},
            {"type", "function"},
            {"function", json::object{{"name", "weather"}, {"arguments", R"({"city":"Oslo"})"}}}});
  CHECK(str(calls.at("tool_calls").at(1).at("id")) == echoCall);
  CHECK(messages[3] == json::object{{"role", "tool"},
                                    {"tool_call_id", weatherCall},
                                    {"content", R"({"temp":3})"}});
  CHECK(messages[4] == json::object{{"role", "tool"},
                                    {"tool_call_id", echoCall},
                                    {"content", R"({"error":"echo failed"})"}});
  CHECK(messages[5] == object(R"({"role":"assistant","content":"3 degrees"})"));
  for (const auto& message : messages) {
    CHECK(protocol::writeJson(message).find("tooldefinition") == std::string::npos);
  }
}

TEST_CASE("a lineage definition's arguments are checked within bounds", "[tasks][limits]") {
  Fixture f;
  auto root = f.append(kUser);
  // The agent writes the schema and the arguments: 1000 allOf entries against 100,000 values
  // took 34 s on the thread that reads lineages (900 here: a definition's parameters have at
  // most 2000 values).
  json::object definition = codeDefinition("wide", "export default async (a) => a");
  json::array entries(900, json::value(object(R"({"type":"number"})")));
  definition["definition"].as_object()["parameters"] = json::object{
      {"type", "object"},
      {"properties",
       json::object{
           {"xs", json::object{{"type", "array"}, {"items", json::object{{"allOf", entries}}}}}}}};
  auto bad = failure(f.tasks.compile(
      json::array{definition, callDraft("wide", json::object{{"xs", json::array(100'000, 1)}})},
      idOf(root[0])));
  CHECK(bad.code == RegistryErrc::invalidArguments);
  CHECK_THAT(bad.detail, Catch::Contains("too large to check"));
  // Many calls of one definition in one request: fine (it is compiled once).
  json::array many{definition};
  for (int i = 0; i < 200; ++i)
    many.push_back(callDraft("wide", json::object{{"xs", json::array{i}}}));
  auto compiled = f.tasks.compile(many, idOf(root[0]));
  REQUIRE(compiled.has_value());
  CHECK(compiled->size() == 201);
}

TEST_CASE("stored tasks stay within their share of the state database", "[tasks][limits]") {
  Fixture f;
  TaskLimits limits;
  limits.maxStoredBytes = 256 * 1024;
  TaskStore bounded(*f.store, f.registry, limits);
  const std::string text(20 * 1024, 'x');
  std::optional<std::string> parent;
  int committed = 0;
  RegistryError refused{RegistryErrc::notFound, ""};
  std::optional<json::array> lastCommitted;
  for (int i = 0; i < 100; ++i) {
    json::array draft{
        json::object{{"kind", "message"}, {"role", "user"}, {"content", text + std::to_string(i)}}};
    auto compiled = bounded.compile(draft, parent);
    REQUIRE(compiled.has_value());
    auto outcome = bounded.commit(*compiled);
    if (!outcome) {
      refused = outcome.error();
      break;
    }
    lastCommitted = *compiled;
    parent = str(compiled->at(0).at("id"));
    ++committed;
  }
  // Every task wrote 20 KiB: about a dozen fit in 256 KiB of pages.
  CHECK(committed >= 5);
  CHECK(committed < 14);
  CHECK(refused.code == RegistryErrc::storage);
  CHECK_THAT(refused.detail, Catch::Contains("map_size_mb"));
  // Committing stored tasks again adds nothing: harmless, even at the bound.
  REQUIRE(lastCommitted);
  auto again = bounded.commit(*lastCommitted);
  INFO((again ? "" : again.error().detail));
  REQUIRE(again.has_value());
  CHECK(again->created == 0);
  // Everything else still writes, and what was committed is there.
  f.installActive("after");
  CHECK(f.stored(*parent));
}
