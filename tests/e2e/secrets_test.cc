// Secrets through the real daemon, against two local HTTPS test servers (one CA, two ports: two
// origins). A tool gets a placeholder from ctx.secret(); the daemon puts the value into request
// headers (and bodies, when allowed) toward granted origins only, and takes it back out of what
// the server echoes. The tool cannot get the value out: not by returning, throwing or logging the
// placeholder, not by sending it to an ungranted origin, in a URL or a disallowed body, not with
// another revision's placeholder. The value never reaches the daemon's log, the audit,
// secrets.list or the LMDB file. Carry across revisions, the activate answer, a wrong or missing
// key at start (the data file unchanged), systemd credentials, and toolhostctl secrets.
#include "tests/e2e/mediation_support.h"

#include <boost/json/parse.hpp>
#include <catch2/catch.hpp>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>

using namespace toolhost::testing;
using namespace toolhost::testing::e2e;
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kValue = "sk-live-7Hq2VwZ9-VALUE-of-the-api-key";

// Gets the secret args.secret (default api_key) and, by args.mode: returns it, throws it, logs it,
// or fetches args.url ("{key}" replaced by the placeholder) with "Authorization: Bearer <it>"
// (unless args.header is false) and args.body ("{key}" replaced). Describes the Response (its
// text, its headers) or the Error.
constexpr std::string_view kUser = R"js(
export default async (args, ctx) => {
  let key;
  try {
    key = args.placeholder ?? await ctx.secret(args.secret ?? 'api_key');
    if (args.mode === 'return') return { placeholder: key };
    if (args.mode === 'throw') throw new Error('the key is ' + key);
    if (args.mode === 'log') { console.log('the key is', key); return { logged: true }; }
    const init = { method: args.method ?? 'GET', headers: {} };
    if (args.header !== false) init.headers['Authorization'] = 'Bearer ' + key;
    if (args.body !== undefined) init.body = args.body.replaceAll('{key}', key);
    if (args.redirect) init.redirect = args.redirect;
    const r = await fetch(args.url.replaceAll('{key}', key), init);
    return { status: r.status, statusText: r.statusText, text: await r.text(), headers: [...r.headers],
             url: r.url, placeholder: key };
  } catch (e) {
    if (args.mode === 'throw') throw e;
    return { code: e.code ?? null, message: String(e.message), placeholder: key ?? null };
  }
}
)js";

json::object fetchEntry(const std::string& origin) {
  return json::object{{"origin", origin}, {"access", json::array{"read", "write"}}};
}

// Two origins, both decided ahead: a refusal can only come from the secret's grant.
struct Setup {
  // `fetchMore`: more lines of the config's [fetch] section.
  explicit Setup(std::string_view fetchMore = "") : granted(options()), other(options()) {
    DaemonOptions daemonOptions;
    daemonOptions.configToml = fetchConfig(granted, fetchMore);
    daemon = DaemonProcess::start(daemonOptions);
    admin.emplace(daemon->socket());
  }
  HttpsTestServerOptions options() {
    HttpsTestServerOptions out;
    out.ca = ca;
    return out;
  }
  json::object capabilities(json::array secrets = json::array{"api_key"}) const {
    return json::object{
        {"fetch", json::array{fetchEntry(granted.origin()), fetchEntry(other.origin())}},
        {"secrets", std::move(secrets)}};
  }
  // Installs and activates a tool running kUser; decides both origins ahead for it.
  std::string deployUser(std::string_view name, std::string_view description = "",
                         std::optional<json::array> secrets = std::nullopt) {
    auto manifest = jsTool(name, kUser, capabilities(secrets.value_or(json::array{"api_key"})));
    if (!description.empty()) manifest["description"] = description;
    auto revision = deploy(*admin, manifest);
    for (const auto& origin : {granted.origin(), other.origin()}) {
      for (const char* access : {"read", "write"}) {
        decideAhead(*admin, revision, "fetch", origin, access);
      }
    }
    return revision;
  }
  json::object setSecret(json::object params) {
    if (!params.contains("value")) params["value"] = kValue;
    if (!params.contains("name")) params["name"] = "api_key";
    if (!params.contains("origins")) params["origins"] = json::array{granted.origin()};
    return resultOf(admin->call("secrets.set", std::move(params)));
  }
  // Calls `tool` by name, or by revision when it starts with "sha256:".
  json::object run(std::string_view tool, json::object arguments) {
    const char* by = tool.starts_with("sha256:") ? "revision" : "name";
    auto response = admin->call("tools.call", json::object{{by, tool}, {"arguments", arguments}});
    INFO(daemon->log());
    CHECK(json::serialize(response).find(kValue) == std::string::npos);
    auto result = toolResult(response);
    REQUIRE(result.is_object());
    return result.as_object();
  }
  std::string auditText() {
    return json::serialize(
        resultOf(admin->call("audit.tail", json::object{{"limit", 10000}})).at("entries"));
  }

  std::shared_ptr<const TestCa> ca = std::make_shared<const TestCa>();
  HttpsTestServer granted;
  HttpsTestServer other;
  std::unique_ptr<DaemonProcess> daemon;
  std::optional<Peer> admin;
};

std::string codeOf(const json::object& outcome) {
  INFO(json::serialize(outcome));
  REQUIRE(outcome.contains("code"));
  REQUIRE(outcome.at("code").is_string());
  return text(outcome.at("code"));
}

// The /echo route's answer as the tool saw it: {method, target, headers, body}.
json::object echoOf(const json::object& outcome) {
  INFO(json::serialize(outcome));
  REQUIRE(outcome.contains("status"));
  CHECK(outcome.at("status") == 200);
  return json::parse(text(outcome.at("text"))).as_object();
}

std::string headerOf(const json::object& echo, std::string_view name) {
  for (const auto& header : echo.at("headers").as_array()) {
    std::string got(header.as_array()[0].as_string());
    for (auto& c : got) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (got == name) return std::string(header.as_array()[1].as_string());
  }
  return "";
}

std::string readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void checkNoValueAnywhere(Setup& s) {
  CHECK(s.daemon->log().find(kValue) == std::string::npos);
  CHECK(s.auditText().find(kValue) == std::string::npos);
  CHECK(json::serialize(resultOf(s.admin->call("secrets.list"))).find(kValue) == std::string::npos);
  CHECK(readFile(s.daemon->stateDir() / "db" / "data.mdb").find(kValue) == std::string::npos);
}

}  // namespace

TEST_CASE("secrets: the value goes only to a granted origin, its echo comes back redacted",
          "[e2e][secrets]") {
  Setup s;
  s.deployUser("user");
  auto stored = s.setSecret(json::object{{"tool", "user"}});
  CHECK(stored.at("requested") == true);
  CHECK(stored.at("origins") == json::array{json::value(s.granted.origin())});
  CHECK_FALSE(stored.contains("value"));

  // Granted: the server received "Bearer <value>" (its echo is redacted exactly where the value
  // was; had it received the placeholder, the placeholder would come back).
  auto sent = s.run("user", json::object{{"url", s.granted.url("/echo")}});
  auto echo = echoOf(sent);
  CHECK(headerOf(echo, "authorization") == "Bearer [redacted]");
  CHECK(text(sent.at("text")).find("toolhost-secret:") == std::string::npos);
  CHECK(s.granted.requestCount("/echo") == 1);

  // Echoed in the reason phrase and in a header's name (which the tool sees lowercased).
  auto names = s.run("user", json::object{{"url", s.granted.url("/auth-in-names")}});
  INFO(json::serialize(names));
  CHECK(names.at("statusText") == "OK [redacted]");
  CHECK(headerOf(names, "x-[redacted]") == "1");
  std::string lowered(kValue);
  for (auto& c : lowered) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  CHECK(json::serialize(names).find(lowered) == std::string::npos);

  // The same placeholder toward another origin: refused, nothing sent there.
  auto refused = s.run("user", json::object{{"url", s.other.url("/echo")}});
  CHECK(codeOf(refused) == "secret-not-allowed");
  CHECK_THAT(text(refused.at("message")), Catch::Contains("api_key"));
  CHECK_THAT(text(refused.at("message")), Catch::Contains(s.other.origin()));
  CHECK(s.other.totalRequests() == 0);

  // In the URL: refused, even toward the granted origin.
  auto inUrl =
      s.run("user", json::object{{"url", s.granted.url("/echo?key={key}")}, {"header", false}});
  CHECK(codeOf(inUrl) == "secret-not-allowed");
  CHECK_THAT(text(inUrl.at("message")), Catch::Contains("secrets may not be placed in URLs"));
  auto inPath =
      s.run("user", json::object{{"url", s.granted.url("/echo/{key}")}, {"header", false}});
  CHECK(codeOf(inPath) == "secret-not-allowed");

  // In the body without allowBody: refused.
  auto inBody = s.run("user", json::object{{"url", s.granted.url("/echo")},
                                           {"method", "POST"},
                                           {"header", false},
                                           {"body", "token={key}"}});
  CHECK(codeOf(inBody) == "secret-not-allowed");
  CHECK_THAT(text(inBody.at("message")), Catch::Contains("--allow-body"));
  CHECK(s.granted.requestCount("/echo") == 1);

  // With allowBody: substituted in the body (and the echo redacted again).
  s.setSecret(json::object{{"tool", "user"}, {"allowBody", true}});
  auto bodySent = s.run("user", json::object{{"url", s.granted.url("/echo")},
                                             {"method", "POST"},
                                             {"body", "token={key}&again={key}"}});
  auto bodyEcho = echoOf(bodySent);
  CHECK(bodyEcho.at("body") == "token=[redacted]&again=[redacted]");
  CHECK(headerOf(bodyEcho, "authorization") == "Bearer [redacted]");
  CHECK(s.granted.requestCount("/echo") == 2);
  // A request without placeholders is sent untouched.
  auto plain = echoOf(s.run("user", json::object{{"url", s.granted.url("/echo")},
                                                 {"header", false},
                                                 {"method", "POST"},
                                                 {"body", "nothing secret"}}));
  CHECK(plain.at("body") == "nothing secret");
  CHECK(headerOf(plain, "authorization").empty());

  // The audit names the secret of each request that carried it, never the value.
  auto entries =
      resultOf(s.admin->call("audit.tail", json::object{{"limit", 100}})).at("entries").as_array();
  std::size_t withSecret = 0;
  for (const auto& entry : entries) {
    if (entry.at("kind") == "request" &&
        text(entry.at("reason")).find("(secrets: api_key)") != std::string::npos) {
      ++withSecret;
    }
  }
  CHECK(withSecret == 3);  // /echo, /auth-in-names and the POST with the value in its body
  CHECK_THAT(s.auditText(), Catch::Contains("secret-not-allowed"));
  checkNoValueAnywhere(s);
}

TEST_CASE("secrets: a value kept by the server comes back redacted in a later response too",
          "[e2e][secrets]") {
  Setup s;
  s.deployUser("user");
  s.setSecret(json::object{{"tool", "user"}, {"allowBody", true}});
  // Stored in a notes service, then read back by a request that carries no placeholder.
  auto stored = s.run("user", json::object{{"url", s.granted.url("/notes")},
                                           {"method", "POST"},
                                           {"header", false},
                                           {"body", "note: {key}"}});
  CHECK(stored.at("status") == 200);
  auto readBack = s.run("user", json::object{{"url", s.granted.url("/notes")}, {"header", false}});
  CHECK(text(readBack.at("text")) == "note: [redacted]");
  // Only from an origin the secret is granted to: elsewhere the value was never sent, and a
  // redacted echo would tell a tool that a guess of it is right.
  auto guesser = jsTool("guesser",
                        "export default async (args) => {\n"
                        "  const r = await fetch(args.url, {method: 'POST', body: args.guess});\n"
                        "  return {same: (await r.json()).body === args.guess};\n"
                        "}",
                        s.capabilities());
  auto revision = deploy(*s.admin, guesser);
  for (const auto& origin : {s.granted.origin(), s.other.origin()}) {
    decideAhead(*s.admin, revision, "fetch", origin, "write");
  }
  s.setSecret(json::object{{"tool", "guesser"}});
  auto guessed = resultOf(s.admin->call(
      "tools.call",
      json::object{{"name", "guesser"},
                   {"arguments", json::object{{"url", s.other.url("/echo")}, {"guess", kValue}}}}));
  CHECK(guessed.at("result").at("same") == true);
  checkNoValueAnywhere(s);
}

TEST_CASE("secrets: a value sent trimmed is redacted too and Content-Length follows the redaction",
          "[e2e][secrets]") {
  Setup s;
  s.deployUser("user");
  // Header values go out trimmed: "Bearer " + value loses the value's trailing blanks.
  s.setSecret(json::object{{"tool", "user"}, {"value", "  " + std::string(kValue) + " \t"}});
  auto sent = s.run("user", json::object{{"url", s.granted.url("/echo")}});
  auto echo = echoOf(sent);
  CHECK(headerOf(echo, "authorization") == "Bearer [redacted]");
  // The tool's view of the headers: [[name, value], ...].
  std::string length;
  for (const auto& header : sent.at("headers").as_array()) {
    if (header.as_array()[0] == "content-length") length = text(header.as_array()[1]);
  }
  CHECK(length == std::to_string(text(sent.at("text")).size()));
}

TEST_CASE("secrets: a value's length never decides whether a request fails, at most 16 go in one",
          "[e2e][secrets]") {
  Setup s("max_request_bytes = 1000\n");
  // Pads the headers (and, with args.body, the body) to args.total bytes as the tool wrote them,
  // placeholder included; args.copies more headers carry the placeholder too.
  constexpr std::string_view kPadded = R"js(
export default async (args, ctx) => {
  const key = await ctx.secret('api_key');
  const headers = [['Authorization', 'Bearer ' + key]];
  if (args.short) headers.push(['X-Short', await ctx.secret('short')]);
  for (let i = 0; i < (args.copies ?? 0); ++i) headers.push(['X-Copy-' + i, key]);
  const used = headers.reduce((n, [name, value]) => n + name.length + value.length + 4, 0);
  const init = { method: args.body ? 'POST' : 'GET', headers };
  if (args.body) init.body = key + 'b'.repeat(args.total - key.length);
  else headers.push(['X-Pad', 'p'.repeat(args.total - used - 'X-Pad'.length - 4)]);
  try {
    const r = await fetch(args.url, init);
    const echo = JSON.parse(await r.text());
    return { status: r.status, bodyBytes: echo.body.length };
  } catch (e) {
    return { code: e.code, message: String(e.message) };
  }
}
)js";
  auto revision =
      deploy(*s.admin, jsTool("padded", kPadded, s.capabilities(json::array{"api_key", "short"})));
  decideAhead(*s.admin, revision, "fetch", s.granted.origin(), "read");
  decideAhead(*s.admin, revision, "fetch", s.granted.origin(), "write");
  // Longer than the placeholder: before, the headers at the limit failed, and the message gave
  // the value's length.
  const std::string value(3000, 'v');
  s.setSecret(json::object{{"tool", "padded"}, {"value", value}, {"allowBody", true}});
  // Shorter than its placeholder: in a header, it must not make room for the other in the body.
  s.setSecret(json::object{{"tool", "padded"}, {"name", "short"}, {"value", "0123456789"}});
  const auto url = s.granted.url("/echo");
  for (const bool body : {false, true}) {
    INFO("in the body: " << body);
    const int limit = body ? 1000 : 65536;
    auto atLimit = s.run(
        "padded", json::object{{"url", url}, {"total", limit}, {"body", body}, {"short", body}});
    INFO(json::serialize(atLimit));
    CHECK(atLimit.at("status") == 200);
    if (body) CHECK(atLimit.at("bodyBytes").as_int64() == limit - 48 + 10);  // "[redacted]"
    // One byte more, whatever the value: refused, and the message names only the tool's bytes.
    auto over =
        s.run("padded",
              json::object{{"url", url}, {"total", limit + 1}, {"body", body}, {"short", body}});
    CHECK(codeOf(over) == "request-too-large");
    CHECK_THAT(text(over.at("message")), Catch::Contains(std::to_string(limit + 1)));
  }
  // 16 placeholders go in; a 17th is refused before anything is sent.
  auto sixteen = s.run("padded", json::object{{"url", url}, {"total", 60000}, {"copies", 15}});
  CHECK(sixteen.at("status") == 200);
  const auto served = s.granted.totalRequests();
  auto seventeen = s.run("padded", json::object{{"url", url}, {"total", 60000}, {"copies", 16}});
  CHECK(codeOf(seventeen) == "request-too-large");
  CHECK_THAT(text(seventeen.at("message")), Catch::Contains("at most 16 secret placeholders"));
  CHECK(s.granted.totalRequests() == served);
}

TEST_CASE("secrets: returning, throwing or logging the placeholder gives only the placeholder",
          "[e2e][secrets]") {
  Setup s;
  s.deployUser("user");
  s.setSecret(json::object{{"tool", "user"}});

  auto returned = s.run("user", json::object{{"mode", "return"}});
  const std::string placeholder = text(returned.at("placeholder"));
  CHECK(placeholder.starts_with("toolhost-secret:"));
  CHECK(placeholder.size() == 48);
  // The same revision keeps its placeholder within the daemon's run.
  CHECK(s.run("user", json::object{{"mode", "return"}}).at("placeholder") ==
        json::value(placeholder));

  auto thrown = s.admin->call(
      "tools.call", json::object{{"name", "user"}, {"arguments", json::object{{"mode", "throw"}}}});
  CHECK(errorCode(thrown) == -32008);
  CHECK_THAT(json::serialize(thrown), Catch::Contains(placeholder));
  CHECK(json::serialize(thrown).find(kValue) == std::string::npos);

  auto logged = s.admin->call(
      "tools.call", json::object{{"name", "user"}, {"arguments", json::object{{"mode", "log"}}}});
  auto answer = resultOf(logged);
  CHECK_THAT(json::serialize(answer.at("logs")), Catch::Contains(placeholder));
  CHECK(json::serialize(logged).find(kValue) == std::string::npos);
  checkNoValueAnywhere(s);
}

TEST_CASE("secrets: only what the manifest requests, another revision's placeholder is refused",
          "[e2e][secrets]") {
  Setup s;
  s.deployUser("user");
  s.setSecret(json::object{{"tool", "user"}});
  // A tool that does not request the secret: not-authorized, whether or not one exists.
  s.deployUser("bystander", "", json::array{});
  s.setSecret(json::object{{"tool", "bystander"}});
  for (const char* name : {"api_key", "no_such_secret"}) {
    auto refused = s.run("bystander", json::object{{"mode", "return"}, {"secret", name}});
    CHECK(codeOf(refused) == "not-authorized");
    CHECK_THAT(text(refused.at("message")), Catch::Contains("capabilities.secrets"));
  }
  // A tool that requests it but has none set: secret-not-found, with the command to run.
  s.deployUser("unset");
  auto missing = s.run("unset", json::object{{"mode", "return"}});
  CHECK(codeOf(missing) == "secret-not-found");
  CHECK_THAT(text(missing.at("message")),
             Catch::Contains("toolhostctl secrets set unset api_key --origin") &&
                 Catch::Contains(" --revision sha256:"));

  // user's placeholder, sent by another tool (with a secret of its own for the same origin):
  // refused, nothing sent.
  const std::string foreign =
      text(s.run("user", json::object{{"mode", "return"}}).at("placeholder"));
  s.deployUser("thief");
  s.setSecret(json::object{{"tool", "thief"}, {"value", "the thief's own value"}});
  auto stolen =
      s.run("thief", json::object{{"url", s.granted.url("/echo")}, {"placeholder", foreign}});
  CHECK(codeOf(stolen) == "secret-not-allowed");
  CHECK_THAT(text(stolen.at("message")), Catch::Contains("another tool revision"));
  // A made-up placeholder: refused too.
  auto forged =
      s.run("thief", json::object{{"url", s.granted.url("/echo")},
                                  {"placeholder", "toolhost-secret:" + std::string(32, 'A')}});
  CHECK(codeOf(forged) == "secret-not-allowed");
  CHECK(s.granted.totalRequests() == 0);
  checkNoValueAnywhere(s);
}

TEST_CASE("secrets: carry follows later revisions that request it, the activate answer says so",
          "[e2e][secrets]") {
  Setup s;
  const std::string v1 = s.deployUser("carried");
  auto stored = s.setSecret(json::object{{"tool", "carried"}, {"carry", true}});
  CHECK(stored.at("revision") == json::value(v1));
  CHECK(stored.at("carry") == true);
  s.deployUser("stays");
  s.setSecret(json::object{{"tool", "stays"}});

  // New revisions: one still requests the secret, one does not.
  auto activate = [&](std::string_view name, std::string_view description, json::array secrets) {
    auto manifest = jsTool(name, kUser, s.capabilities(std::move(secrets)));
    manifest["description"] = description;
    auto installed = resultOf(s.admin->call("tools.install", json::object{{"manifest", manifest}}));
    std::string revision = text(installed.at("revision"));
    auto answer = resultOf(s.admin->call(
        "tools.activate", json::object{{"name", name}, {"revision", revision}, {"replace", true}}));
    for (const auto& origin : {s.granted.origin(), s.other.origin()}) {
      decideAhead(*s.admin, revision, "fetch", origin, "read");
    }
    return answer;
  };
  auto moved = activate("carried", "revision two", json::array{"api_key"});
  REQUIRE(moved.contains("secrets"));
  CHECK(moved.at("secrets").at("carried") == json::array{"api_key"});
  CHECK(moved.at("secrets").at("missing") == json::array{});
  auto echo = echoOf(s.run("carried", json::object{{"url", s.granted.url("/echo")}}));
  CHECK(headerOf(echo, "authorization") == "Bearer [redacted]");
  // Deleting it from the active revision deletes nothing, and says where it lives.
  auto notHere = resultOf(
      s.admin->call("secrets.delete", json::object{{"tool", "carried"}, {"name", "api_key"}}));
  CHECK(notHere.at("deleted") == false);
  CHECK(notHere.at("carriedFrom") == json::value(v1));

  auto notCarried = activate("stays", "revision two", json::array{"api_key"});
  CHECK(notCarried.at("secrets").at("carried") == json::array{});
  CHECK(notCarried.at("secrets").at("missing") == json::array{"api_key"});
  CHECK(codeOf(s.run("stays", json::object{{"url", s.granted.url("/echo")}})) ==
        "secret-not-found");

  // Carry reaches later revisions only: a key set with carry on the revision that replaced
  // another does not reach the one replaced, even when called by its revision.
  const std::string replaced = s.deployUser("rotated", "revision one");
  const std::string replacing = s.deployUser("rotated", "revision two");
  CHECK(s.setSecret(json::object{{"tool", "rotated"}, {"carry", true}}).at("revision") ==
        json::value(replacing));
  CHECK(headerOf(echoOf(s.run(replacing, json::object{{"url", s.granted.url("/echo")}})),
                 "authorization") == "Bearer [redacted]");
  CHECK(codeOf(s.run(replaced, json::object{{"url", s.granted.url("/echo")}})) ==
        "secret-not-found");

  auto dropped = activate("carried", "revision three", json::array{});
  CHECK(dropped.at("secrets").at("carried") == json::array{});
  CHECK(dropped.at("secrets").at("missing") == json::array{});
  CHECK(codeOf(s.run("carried", json::object{{"url", s.granted.url("/echo")}})) ==
        "not-authorized");

  // secrets.list shows scopes and origins; deleting the carried secret ends its use.
  auto listed = resultOf(s.admin->call("secrets.list", json::object{{"tool", "carried"}}))
                    .at("secrets")
                    .as_array();
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].at("revision") == json::value(v1));
  CHECK(listed[0].at("active") == false);
  CHECK(listed[0].at("carry") == true);
  CHECK_FALSE(listed[0].as_object().contains("value"));
  auto deleted = resultOf(s.admin->call(
      "secrets.delete", json::object{{"tool", "carried"}, {"revision", v1}, {"name", "api_key"}}));
  CHECK(deleted.at("deleted") == true);
  CHECK(resultOf(s.admin->call("secrets.list", json::object{{"tool", "carried"}}))
            .at("secrets")
            .as_array()
            .empty());
  checkNoValueAnywhere(s);
}

TEST_CASE("secrets: a refused secrets.set never repeats or logs its value", "[e2e][secrets]") {
  Setup s;
  s.deployUser("user");
  const std::string value(kValue);
  for (const auto& params : {
           json::object{{"tool", "user"},
                        {"name", "api_key"},
                        {"value", value},
                        {"origins", json::array{"http://insecure.example"}}},
           json::object{{"tool", "user"},
                        {"name", "api_key"},
                        {"value", value},
                        {"origins", json::array{value}}},
           json::object{{"tool", "user"},
                        {"name", "api_key"},
                        {"value", value},
                        {"origins", json::array{s.granted.origin()}},
                        {"unknown", value}},
           json::object{{"tool", "user"},
                        {"name", "api_key"},
                        {"value", 12345},
                        {"origins", json::array{s.granted.origin()}}},
           json::object{{"tool", "user"},
                        {"name", "1 bad name"},
                        {"value", value},
                        {"origins", json::array{s.granted.origin()}}},
           json::object{{"tool", "no-such-tool"},
                        {"name", "api_key"},
                        {"value", value},
                        {"origins", json::array{s.granted.origin()}}},
           json::object{{"tool", "user"},
                        {"name", "api_key"},
                        {"value", std::string(70000, 'v')},
                        {"origins", json::array{s.granted.origin()}}},
       }) {
    auto response = s.admin->call("secrets.set", params);
    INFO(json::serialize(response));
    CHECK(response.contains("error"));
    CHECK(json::serialize(response).find(kValue) == std::string::npos);
    CHECK(json::serialize(response).find(std::string(100, 'v')) == std::string::npos);
  }
  CHECK(resultOf(s.admin->call("secrets.list")).at("secrets").as_array().empty());
  CHECK(s.daemon->log().find(kValue) == std::string::npos);
  CHECK(s.daemon->log().find(std::string(100, 'v')) == std::string::npos);
}

TEST_CASE("secrets: a wrong or missing key stops the daemon at start and changes nothing",
          "[e2e][secrets]") {
  auto setSecret = [](Peer& admin) {
    resultOf(
        admin.call("secrets.set", json::object{{"tool", "user"},
                                               {"name", "api_key"},
                                               {"value", kValue},
                                               {"origins", json::array{"https://a.example"}}}));
  };
  TempDir state;
  DaemonOptions options;
  options.stateDir = state.path() / "state";
  {
    auto daemon = DaemonProcess::start(options);
    Peer admin(daemon->socket());
    deploy(admin, jsTool("user", kUser, json::object{{"secrets", json::array{"api_key"}}}));
    setSecret(admin);
    REQUIRE(daemon->stop() == 0);
  }
  const fs::path keyFile = *options.stateDir / "secrets.key";
  const fs::path dataFile = *options.stateDir / "db" / "data.mdb";
  const std::string key = readFile(keyFile);
  REQUIRE(key.size() == 32);
  const std::string before = readFile(dataFile);
  CHECK(before.find(kValue) == std::string::npos);

  auto refusedStart = [&](std::string_view expected) {
    DaemonOptions again = options;
    again.waitUntilReady = false;
    auto daemon = DaemonProcess::start(again);
    CHECK(daemon->wait(std::chrono::seconds(20)) == 1);
    CHECK_THAT(daemon->log(), Catch::Contains(std::string(expected)));
    CHECK(readFile(dataFile) == before);
  };
  SECTION("a different key") {
    std::ofstream(keyFile, std::ios::binary | std::ios::trunc) << std::string(32, 'x');
    refusedStart("the secrets key " + keyFile.string() +
                 " does not match the one the secrets were stored with");
    CHECK(readFile(keyFile) == std::string(32, 'x'));
    // The old key is lost for good: the stored secrets go, everything else stays, and the
    // daemon starts with the new key.
    auto nowhere = runProgram({daemonBinary().string(), "--state-dir",
                               (state.path() / "typo").string(), "--forget-secrets"});
    CHECK(nowhere.status == 1);
    CHECK_FALSE(fs::exists(state.path() / "typo"));
    auto forgot = runProgram({daemonBinary().string(), "--state-dir", options.stateDir->string(),
                              "--log-format", "text", "--forget-secrets"});
    INFO(forgot.out << forgot.err);
    CHECK(forgot.status == 0);
    CHECK_THAT(forgot.out, Catch::Contains("removed 1 stored secrets"));
    auto daemon = DaemonProcess::start(options);
    Peer admin(daemon->socket());
    CHECK(resultOf(admin.call("secrets.list")).at("secrets").as_array().empty());
    bool kept = false;
    const auto tools = resultOf(admin.call("tools.list"));
    for (const auto& tool : tools.at("tools").as_array()) {
      kept = kept || tool.at("name") == "user";
    }
    CHECK(kept);
    setSecret(admin);
    REQUIRE(daemon->stop() == 0);
  }
  SECTION("no key") {
    fs::remove(keyFile);
    refusedStart("the secrets key " + keyFile.string() +
                 " is missing; restore it (the stored secrets cannot be read without it). If "
                 "it is lost, nothing can read those secrets: `toolhostd --forget-secrets`");
    CHECK_FALSE(fs::exists(keyFile));
  }
  SECTION("a malformed key") {
    std::ofstream(keyFile, std::ios::binary | std::ios::trunc) << "not a key\n";
    refusedStart("32 raw bytes, 64 hex characters, or 44 base64 characters");
  }
  SECTION("the key as a systemd credential, in hex") {
    TempDir credentials;
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string hexKey;
    for (unsigned char c : key) {
      hexKey += kDigits[c >> 4];
      hexKey += kDigits[c & 15];
    }
    std::ofstream(credentials.path() / "toolhost.key") << hexKey << "\n";
    fs::remove(keyFile);  // the state directory's copy is not used
    DaemonOptions withCredentials = options;
    withCredentials.env["CREDENTIALS_DIRECTORY"] = credentials.path().string();
    auto daemon = DaemonProcess::start(withCredentials);
    Peer admin(daemon->socket());
    auto listed = resultOf(admin.call("secrets.list")).at("secrets").as_array();
    CHECK(listed.size() == 1);
    CHECK_FALSE(fs::exists(keyFile));
    REQUIRE(daemon->stop() == 0);
    // A credential directory without the key: refused, nothing created.
    fs::remove(credentials.path() / "toolhost.key");
    withCredentials.waitUntilReady = false;
    auto refused = DaemonProcess::start(withCredentials);
    CHECK(refused->wait(std::chrono::seconds(20)) == 1);
    CHECK_THAT(refused->log(), Catch::Contains("toolhost.key"));
    CHECK_FALSE(fs::exists(credentials.path() / "toolhost.key"));
  }
}

TEST_CASE("secrets: toolhostctl secrets set reads the value from stdin, never argv",
          "[e2e][secrets]") {
  Setup s;
  s.deployUser("user");
  const std::string socket = s.daemon->socket().string();
  const std::string ctl = ctlBinary().string();

  auto set = runProgram({ctl, "--socket", socket, "--compact", "secrets", "set", "user", "api_key",
                         "--origin", s.granted.origin(), "--allow-body"},
                        std::string(kValue) + "\n");
  INFO(set.err);
  CHECK(set.status == 0);
  CHECK(set.out.find(kValue) == std::string::npos);
  auto stored = json::parse(set.out).as_object();
  CHECK(stored.at("allowBody") == true);
  CHECK(set.err.find("note") == std::string::npos);
  // A name the manifest does not request is stored, and the note says nothing will use it.
  auto typo = runProgram({ctl, "--socket", socket, "--compact", "secrets", "set", "user", "api_kye",
                          "--origin", s.granted.origin()},
                         "other-value\n");
  CHECK(typo.status == 0);
  CHECK(json::parse(typo.out).at("requested") == false);
  CHECK_THAT(typo.err, Catch::Contains("does not request this secret"));
  // The trailing newline was not part of the value: the body echo shows exactly the redaction.
  auto echo = echoOf(s.run(
      "user",
      json::object{{"url", s.granted.url("/echo")}, {"method", "POST"}, {"body", "[{key}]"}}));
  CHECK(echo.at("body") == "[[redacted]]");

  // A value on the command line is refused without being repeated.
  auto onArgv = runProgram({ctl, "--socket", socket, "secrets", "set", "user", "api_key",
                            "argv-VALUE-123", "--origin", s.granted.origin()},
                           "ignored\n");
  CHECK(onArgv.status == 2);
  CHECK(onArgv.err.find("argv-VALUE-123") == std::string::npos);
  CHECK_THAT(onArgv.err, Catch::Contains("never taken from the command line"));
  auto empty = runProgram({ctl, "--socket", socket, "secrets", "set", "user", "api_key", "--origin",
                           s.granted.origin()},
                          "");
  CHECK(empty.status == 2);

  auto listed = runProgram({ctl, "--socket", socket, "--compact", "secrets", "list", "user"});
  CHECK(listed.status == 0);
  CHECK_THAT(listed.out, Catch::Contains("api_key"));
  CHECK(listed.out.find(kValue) == std::string::npos);
  auto deleted =
      runProgram({ctl, "--socket", socket, "--compact", "secrets", "delete", "user", "api_key"});
  CHECK(deleted.status == 0);
  CHECK(json::parse(deleted.out).at("deleted") == true);
  checkNoValueAnywhere(s);
}

TEST_CASE("secrets: a redirect carries no secret to another origin, nor back to the tool",
          "[e2e][secrets]") {
  Setup s;
  s.deployUser("user");
  s.setSecret(json::object{{"tool", "user"}});
  // The granted server sends the value on in the Location it answers with: as it is, in
  // capitals, percent-encoded, in the path; toward the other origin or back to itself. Such a
  // redirect is not followed: the value goes nowhere, and no prompt, audit entry or error of a
  // next request holds it.
  for (const char* form : {"", "upper", "encoded", "double", "path"}) {
    for (HttpsTestServer* target : {&s.other, &s.granted}) {
      INFO(form << " to " << target->origin());
      auto refused =
          s.run("user", json::object{{"url", s.granted.url("/redirect-auth?to=" +
                                                           percentEncoded(target->url("/echo")) +
                                                           "&form=" + form)},
                                     {"redirect", "follow"}});
      INFO(json::serialize(refused));
      CHECK(codeOf(refused) == "redirect-failed");
      CHECK_THAT(text(refused.at("message")), Catch::Contains("holds the value of a secret"));
      CHECK(json::serialize(refused).find(std::string(kValue)) == std::string::npos);
    }
  }
  CHECK(s.other.requestCount("/echo") == 0);
  CHECK(s.granted.requestCount("/echo") == 0);
  checkNoValueAnywhere(s);

  // Without the value in it, the redirect is followed; the Authorization header (holding the
  // placeholder) stays with the granted origin.
  auto followed = s.run(
      "user", json::object{
                  {"url", s.granted.url("/redirect-to?to=" + percentEncoded(s.other.url("/echo")))},
                  {"redirect", "follow"}});
  INFO(json::serialize(followed));
  REQUIRE(followed.contains("status"));
  CHECK(followed.at("status") == 200);
  CHECK(s.other.requestCount("/echo") == 1);
  CHECK(json::serialize(followed).find(std::string(kValue)) == std::string::npos);
  CHECK(text(followed.at("text")).find("toolhost-secret:") == std::string::npos);
}
