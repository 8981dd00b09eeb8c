// fetch() from sandboxed tools through the real daemon, against the local HTTPS test server (its
// CA given as [fetch] extra_ca_file, 127.0.0.1 opened with allow_private): an allowed read, a
// write the manifest does not request, prompts answered each way and each scope, no approver,
// the prompt timeout, decisions across a restart, a new revision, oversized bodies, redirects,
// header injection, blocked destinations, cancellation mid-request, the wall clock paused while a
// person is asked, and the audit.
#include "tests/e2e/mediation_support.h"

#include <boost/json/parse.hpp>
#include <catch2/catch.hpp>

#include <cctype>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

using namespace toolhost::testing;
using namespace toolhost::testing::e2e;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// Fetches args.url with args.{method, headers, body} through fetch() (or ctx.fetch when
// args.viaCtx) and describes the Response, or the Error's code and message.
constexpr std::string_view kReader = R"js(
export default async (args, ctx) => {
  const init = { method: args.method ?? 'GET' };
  if (args.headers) init.headers = args.headers;
  if (args.redirect) init.redirect = args.redirect;
  if (args.body !== undefined) init.body = args.body;
  try {
    const r = args.viaCtx ? await ctx.fetch(args.url, init) : await fetch(args.url, init);
    return { status: r.status, statusText: r.statusText, url: r.url, ok: r.ok,
             redirected: r.redirected,
             location: r.headers.get('location'), type: r.headers.get('content-type'),
             text: await r.text() };
  } catch (e) {
    return { code: e.code ?? null, name: e.name, message: String(e.message) };
  }
}
)js";

json::object readCapabilities(const HttpsTestServer& server, std::string_view access = "read") {
  return json::object{{"fetch", json::array{json::object{{"origin", server.origin()},
                                                         {"access", json::array{access}}}}}};
}

struct Setup {
  explicit Setup(std::string_view moreConfig = "") {
    DaemonOptions options;
    options.configToml = fetchConfig(server, moreConfig);
    daemon = DaemonProcess::start(options);
    admin.emplace(daemon->socket());
  }
  json::object fetch(std::string_view tool, json::object arguments) {
    auto response =
        admin->call("tools.call", json::object{{"name", tool}, {"arguments", arguments}});
    INFO(daemon->log());
    auto result = toolResult(response);
    REQUIRE(result.is_object());
    return result.as_object();
  }

  HttpsTestServer server;
  std::unique_ptr<DaemonProcess> daemon;
  std::optional<Peer> admin;
};

std::string codeOf(const json::object& outcome) {
  INFO(json::serialize(outcome));
  REQUIRE(outcome.contains("code"));
  return text(outcome.at("code"));
}

}  // namespace

TEST_CASE("fetch: an allowed read returns a Response, the request is audited", "[e2e][fetch]") {
  Setup s;
  auto revision = deploy(*s.admin, jsTool("reader", kReader, readCapabilities(s.server)));
  decideAhead(*s.admin, revision, "fetch", s.server.origin(), "read");

  auto ok = s.fetch("reader", json::object{{"url", s.server.url("/ok?key=sekrit")}});
  CHECK(ok.at("status") == 200);
  CHECK(ok.at("ok") == true);
  CHECK(ok.at("statusText") == "OK");
  CHECK(ok.at("text") == "ok");
  CHECK(ok.at("type") == "text/plain");
  CHECK(ok.at("url") == json::value(s.server.url("/ok?key=sekrit")));
  auto viaCtx = s.fetch("reader", json::object{{"url", s.server.url("/json")}, {"viaCtx", true}});
  CHECK(viaCtx.at("text") == R"({"ok":true})");
  CHECK(s.server.requestCount("/ok") == 1);
  CHECK(s.server.requestCount("/json") == 1);

  auto entries = resultOf(s.admin->call("audit.tail", json::object{{"toolRevision", revision}}))
                     .at("entries")
                     .as_array();
  std::vector<json::object> requests;
  for (const auto& entry : entries) {
    if (entry.at("kind") == "request") requests.push_back(entry.as_object());
  }
  REQUIRE(requests.size() == 2);
  CHECK(requests[0].at("action") == "fetch");
  CHECK(requests[0].at("target") == json::value(s.server.origin()));
  CHECK(requests[0].at("access") == "read");
  CHECK(requests[0].at("verdict") == "allow");
  CHECK(requests[0].at("status") == 200);
  CHECK(requests[0].at("bytes") == 2);
  CHECK(requests[0].contains("durationMs"));
  CHECK(json::serialize(entries).find("sekrit") == std::string::npos);
}

TEST_CASE("fetch: a write the manifest does not request is refused without a prompt",
          "[e2e][fetch]") {
  Setup s;
  auto revision = deploy(*s.admin, jsTool("reader", kReader, readCapabilities(s.server)));
  Approver approver(s.daemon->socket());
  auto refused = s.fetch(
      "reader", json::object{{"url", s.server.url("/echo")}, {"method", "POST"}, {"body", "{}"}});
  CHECK(codeOf(refused) == "not-authorized");
  CHECK_THAT(text(refused.at("message")), Catch::Contains("capabilities.fetch"));
  approver.expectNoNotification();
  CHECK(s.server.totalRequests() == 0);
  // Even a stored allow does not lift the ceiling.
  auto set = resultOf(s.admin->call("policy.set", json::object{{"toolRevision", revision},
                                                               {"action", "fetch"},
                                                               {"target", s.server.origin()},
                                                               {"access", "write"},
                                                               {"verdict", "allow"},
                                                               {"scope", "always"}}));
  CHECK(set.at("requested") == false);
  CHECK(codeOf(s.fetch("reader", json::object{{"url", s.server.url("/echo")},
                                              {"method", "PUT"}})) == "not-authorized");
  CHECK(s.server.totalRequests() == 0);
}

TEST_CASE("fetch: prompts answered each way and each scope, no approver, the timeout",
          "[e2e][fetch]") {
  Setup s("[policy]\nprompt_timeout_ms = 400\n");
  auto revision = deploy(*s.admin, jsTool("reader", kReader, readCapabilities(s.server)));
  const json::object args{{"url", s.server.url("/ok")}};

  // Nobody to ask: denied at once.
  CHECK(codeOf(s.fetch("reader", args)) == "not-authorized");
  CHECK(s.server.totalRequests() == 0);

  Approver approver(s.daemon->socket());
  auto answered = [&](std::string_view verdict, std::string_view scope) {
    auto id = startCall(*s.admin, "reader", args);
    auto prompt = approver.prompt();
    CHECK(prompt.at("tool").at("revision") == json::value(revision));
    CHECK(prompt.at("action") == "fetch");
    CHECK(prompt.at("target") == json::value(s.server.origin()));
    CHECK(prompt.at("access") == "read");
    CHECK(prompt.at("private") == true);
    CHECK(resultOf(approver.decide(prompt, verdict, scope)).at("requests") == 1);
    auto result = toolResult(s.admin->response(id));
    REQUIRE(result.is_object());
    return result.as_object();
  };
  CHECK(answered("allow", "once").at("status") == 200);
  CHECK(codeOf(answered("deny", "once")) == "not-authorized");
  CHECK(answered("allow", "session").at("status") == 200);
  CHECK(s.fetch("reader", args).at("status") == 200);  // decided for the session: no prompt
  approver.expectNoNotification();
  CHECK(s.server.requestCount("/ok") == 3);

  // Unanswered: denied when the prompt times out.
  deploy(*s.admin, jsTool("other-reader", kReader, readCapabilities(s.server)));
  auto id = startCall(*s.admin, "other-reader", args);
  auto prompt = approver.prompt();
  CHECK(prompt.at("timeoutMs") == 400);
  auto timedOut = toolResult(s.admin->response(id)).as_object();
  CHECK(codeOf(timedOut) == "not-authorized");
  CHECK(approver.notification().at("params").at("resolution") == "timeout");
  CHECK(s.server.requestCount("/ok") == 3);
}

TEST_CASE("fetch: decisions survive a restart, a new revision needs its own approval",
          "[e2e][fetch]") {
  HttpsTestServer server;
  DaemonOptions options;
  options.configToml = fetchConfig(server);
  auto daemon = DaemonProcess::start(options);
  std::string stateDir = daemon->stateDir().string();
  const json::object args{{"url", server.url("/ok")}};
  std::string v1;
  {
    Peer admin(daemon->socket());
    v1 = deploy(admin, jsTool("reader", kReader, readCapabilities(server)));
    Approver approver(daemon->socket());
    auto id = startCall(admin, "reader", args);
    resultOf(approver.decide(approver.prompt(), "allow", "always"));
    CHECK(toolResult(admin.response(id)).at("status") == 200);
  }
  REQUIRE(daemon->stop() == 0);

  options.stateDir = stateDir;
  auto restarted = DaemonProcess::start(options);
  Peer admin(restarted->socket());
  Approver approver(restarted->socket());
  auto again =
      toolResult(admin.call("tools.call", json::object{{"name", "reader"}, {"arguments", args}}));
  CHECK(again.at("status") == 200);
  approver.expectNoNotification();

  // The same tool with other source: a new revision, asked about in its own right.
  auto v2 =
      deploy(admin, jsTool("reader", std::string(kReader) + "\n// v2\n", readCapabilities(server)));
  REQUIRE(v2 != v1);
  auto id = startCall(admin, "reader", args);
  auto prompt = approver.prompt();
  CHECK(prompt.at("tool").at("revision") == json::value(v2));
  resultOf(approver.decide(prompt, "deny", "once"));
  CHECK(codeOf(toolResult(admin.response(id)).as_object()) == "not-authorized");
  CHECK(server.requestCount("/ok") == 2);
}

TEST_CASE("fetch: one tool's responses held at once stay within its share", "[e2e][fetch]") {
  Setup s("max_response_bytes = 1000\nmax_buffered_bytes_per_tool = 1500\n");
  // A response whose body stalls holds its declared length from its headers on; by the time a
  // slow response has come, its headers are in.
  constexpr std::string_view kHog = R"js(
export default async (args) => {
  fetch(args.stall).catch(() => {});
  await fetch(args.wait);
  try {
    const r = await fetch(args.url);
    return { status: r.status, size: (await r.text()).length };
  } catch (e) {
    return { code: e.code ?? null, message: String(e.message) };
  }
}
)js";
  auto hog = deploy(*s.admin, jsTool("hog", kHog, readCapabilities(s.server)));
  decideAhead(*s.admin, hog, "fetch", s.server.origin(), "read");
  auto reader = deploy(*s.admin, jsTool("reader", kReader, readCapabilities(s.server)));
  decideAhead(*s.admin, reader, "fetch", s.server.origin(), "read");

  const json::object args{{"stall", s.server.url("/stall?bytes=1000&ms=600")},
                          {"wait", s.server.url("/slow?ms=200")},
                          {"url", s.server.url("/big?bytes=600")}};
  auto refused = s.fetch("hog", args);
  CHECK(codeOf(refused) == "response-too-large");
  CHECK_THAT(text(refused.at("message")), Catch::Contains("max_buffered_bytes_per_tool"));
  // Within the share, and for another tool, the same response is read.
  auto within = args;
  within["url"] = s.server.url("/big?bytes=500");
  CHECK(s.fetch("hog", within).at("size") == 500);
  CHECK(s.fetch("reader", json::object{{"url", s.server.url("/big?bytes=1000")}}).at("text") ==
        json::value(std::string(1000, 'x')));
}

TEST_CASE("fetch: oversized bodies, redirects returned, header injection refused", "[e2e][fetch]") {
  Setup s("max_response_bytes = 1000\n");
  auto revision = deploy(*s.admin, jsTool("reader", kReader, readCapabilities(s.server)));
  decideAhead(*s.admin, revision, "fetch", s.server.origin(), "read");

  CHECK(codeOf(s.fetch("reader", json::object{{"url", s.server.url("/big?bytes=5000")}})) ==
        "response-too-large");
  CHECK(s.fetch("reader", json::object{{"url", s.server.url("/big?bytes=1000")}}).at("text") ==
        json::value(std::string(1000, 'x')));

  // No automatic redirects: the 3xx is the answer, unless the tool asks to follow.
  auto redirect = s.fetch("reader", json::object{{"url", s.server.url("/redirect")}});
  CHECK(redirect.at("status") == 302);
  CHECK(redirect.at("redirected") == false);
  CHECK(s.fetch("reader", json::object{{"url", s.server.url("/redirect")}, {"redirect", "manual"}})
            .at("status") == 302);
  CHECK(redirect.at("location") == "/ok");
  CHECK(s.server.requestCount("/ok") == 0);

  const auto before = s.server.totalRequests();
  auto injected = s.fetch(
      "reader", json::object{{"url", s.server.url("/echo")},
                             {"headers", json::parse(R"([["X-Note","a\r\nX-Injected: 1"]])")}});
  CHECK(codeOf(injected) == "invalid-header");
  CHECK(s.server.totalRequests() == before);
  // A cookie never leaves: refused by the daemon, or dropped by fetch() as browsers drop it.
  auto cookie = s.fetch("reader", json::object{{"url", s.server.url("/echo")},
                                               {"headers", json::parse(R"([["Cookie","a=b"]])")}});
  if (cookie.contains("code")) {
    CHECK(codeOf(cookie) == "invalid-header");
  } else {
    CHECK(text(cookie.at("text")).find("a=b") == std::string::npos);
  }
}

TEST_CASE("fetch: blocked destinations are refused before any prompt", "[e2e][fetch]") {
  Setup s;
  auto capabilities = readCapabilities(s.server);
  capabilities["fetch"].as_array().push_back(
      json::object{{"origin", "https://169.254.169.254"}, {"access", json::array{"read"}}});
  deploy(*s.admin, jsTool("reader", kReader, capabilities));
  Approver approver(s.daemon->socket());
  CHECK(codeOf(s.fetch("reader",
                       json::object{{"url", "https://169.254.169.254/latest/meta-data/"}})) ==
        "destination-blocked");
  CHECK(codeOf(s.fetch("reader",
                       json::object{{"url", "https://localhost:" + std::to_string(s.server.port()) +
                                                "/ok"}})) == "destination-blocked");
  CHECK(codeOf(s.fetch("reader", json::object{{"url", "https://0x7f000002/"}})) ==
        "destination-blocked");
  CHECK(codeOf(s.fetch("reader",
                       json::object{{"url", "http://127.0.0.1:" + std::to_string(s.server.port()) +
                                                "/ok"}})) == "scheme-not-allowed");
  auto credentials =
      s.fetch("reader", json::object{{"url", "https://me:pw-sekrit@127.0.0.1:" +
                                                 std::to_string(s.server.port()) + "/ok"}});
  CHECK(codeOf(credentials) == "credentials-in-url");
  CHECK(text(credentials.at("message")).find("pw-sekrit") == std::string::npos);
  approver.expectNoNotification();
  CHECK(s.server.totalRequests() == 0);
}

TEST_CASE("fetch: cancelling tools.call aborts the request", "[e2e][fetch]") {
  Setup s;
  auto revision = deploy(*s.admin, jsTool("reader", kReader, readCapabilities(s.server)));
  decideAhead(*s.admin, revision, "fetch", s.server.origin(), "read");
  auto id = startCall(*s.admin, "reader", json::object{{"url", s.server.url("/hang")}});
  REQUIRE(s.server.waitForRequests("/hang", 1, 10s));
  const auto closedBefore = s.server.connectionsClosed();
  auto cancelId = s.admin->nextId();
  s.admin->send("$/cancelRequest", json::object{{"id", id}}, cancelId);
  CHECK(resultOf(s.admin->response(cancelId)).at("cancelled") == true);
  CHECK(errorCode(s.admin->response(id)) == -32009);
  // The daemon closed the connection to the server.
  INFO(s.daemon->log());
  CHECK(s.server.waitForConnectionsClosed(closedBefore + 1, 5s));
}

TEST_CASE("fetch: the wall clock pauses while a person is asked", "[e2e][fetch]") {
  Setup s;
  deploy(*s.admin,
         jsTool("reader", kReader, readCapabilities(s.server), json::object{{"wallMs", 500}}));
  Approver approver(s.daemon->socket());
  auto id = startCall(*s.admin, "reader", json::object{{"url", s.server.url("/ok")}});
  auto prompt = approver.prompt();
  std::this_thread::sleep_for(1000ms);  // twice the tool's wall clock
  resultOf(approver.decide(prompt, "allow", "once"));
  // Answered after twice its wall clock, the call still succeeds: the wait did not count.
  auto response = s.admin->response(id);
  CHECK(toolResult(response).at("status") == 200);
}

TEST_CASE("fetch: a tool builds its request with URL, URLSearchParams, Headers and crypto",
          "[e2e][fetch]") {
  Setup s;
  constexpr std::string_view kForm = R"js(
export default async (args) => {
  const url = new URL('/echo', args.base);
  url.searchParams.set('q', 'a b');
  const r = await fetch(url, {
    method: 'POST',
    headers: new Headers({'X-Request-Id': crypto.randomUUID()}),
    body: new URLSearchParams({grant_type: 'client_credentials', scope: 'x y'}),
  });
  const echo = await r.json();
  const header = (name) => (echo.headers.find(([n]) => n.toLowerCase() === name) ?? [])[1];
  const digest = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(echo.body));
  return {target: echo.target, body: echo.body, type: header('content-type'),
          id: header('x-request-id').length, response: r instanceof Response,
          sha256: Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, '0')).join('')};
}
)js";
  auto revision = deploy(*s.admin, jsTool("form", kForm, readCapabilities(s.server, "write")));
  decideAhead(*s.admin, revision, "fetch", s.server.origin(), "write");
  auto sent = s.fetch("form", json::object{{"base", s.server.url("/")}});
  INFO(json::serialize(sent));
  CHECK(sent.at("target") == "/echo?q=a+b");
  CHECK(sent.at("body") == "grant_type=client_credentials&scope=x+y");
  CHECK(sent.at("type") == "application/x-www-form-urlencoded;charset=UTF-8");
  CHECK(sent.at("id") == 36);
  CHECK(sent.at("response") == true);
  CHECK(sent.at("sha256") == "2f30a38804991f9282a4d88808b9b825449bfdf392c931d4f0b3817c36c93812");
}

TEST_CASE(
    "fetch: redirects a tool asks to follow are followed, each request checked and authorized",
    "[e2e][fetch]") {
  auto ca = std::make_shared<const TestCa>();
  HttpsTestServerOptions serverOptions;
  serverOptions.ca = ca;
  HttpsTestServer a(serverOptions);
  HttpsTestServer b(serverOptions);
  DaemonOptions options;
  options.configToml = fetchConfig(a);
  auto daemon = DaemonProcess::start(options);
  Peer admin(daemon->socket());
  json::object capabilities{
      {"fetch",
       json::array{json::object{{"origin", a.origin()}, {"access", json::array{"read", "write"}}},
                   json::object{{"origin", b.origin()}, {"access", json::array{"read"}}}}}};
  const auto revision = deploy(admin, jsTool("reader", kReader, capabilities));
  decideAhead(admin, revision, "fetch", a.origin(), "read");
  decideAhead(admin, revision, "fetch", a.origin(), "write");
  auto fetch = [&](json::object arguments) {
    if (!arguments.contains("redirect")) arguments["redirect"] = "follow";
    auto response =
        admin.call("tools.call", json::object{{"name", "reader"}, {"arguments", arguments}});
    INFO(daemon->log());
    auto result = toolResult(response);
    REQUIRE(result.is_object());
    return result.as_object();
  };
  auto to = [](std::string_view target, int code = 302) {
    return "/redirect-to?code=" + std::to_string(code) + "&to=" + percentEncoded(target, "/.-");
  };

  // Followed as browsers follow, and the Response says where it ended.
  auto followed = fetch(json::object{{"url", a.url("/redirect")}});
  CHECK(followed.at("status") == 200);
  CHECK(followed.at("text") == "ok");
  CHECK(text(followed.at("url")) == a.url("/ok"));
  CHECK(followed.at("redirected") == true);
  CHECK(a.requestCount("/ok") == 1);
  CHECK(codeOf(fetch(json::object{{"url", a.url("/redirect")}, {"redirect", "error"}})) ==
        "redirect-failed");
  CHECK(a.requestCount("/ok") == 1);
  auto looped = fetch(json::object{{"url", a.url("/redirect-loop")}});
  CHECK(codeOf(looped) == "redirect-failed");
  CHECK_THAT(text(looped.at("message")), Catch::Contains("More than 20 redirects"));
  CHECK(a.requestCount("/redirect-loop") == 21);
  auto bad = fetch(json::object{{"url", a.url("/redirect")}, {"redirect", "sideways"}});
  CHECK(codeOf(bad) == "invalid-argument");
  // A redirect status without a Location: "error" fails on it, as the Fetch standard says;
  // "follow" answers with it.
  CHECK(codeOf(fetch(json::object{{"url", a.url("/redirect-to?code=302")},
                                  {"redirect", "error"}})) == "redirect-failed");
  CHECK(fetch(json::object{{"url", a.url("/redirect-to?code=302")}}).at("status") == 302);
  // A Location as the URL Standard reads it: without tabs, a backslash as a slash.
  // "https:" without "//" is relative to the URL fetched; a '%' that starts no escape is kept.
  for (const char* written : {"/o\tk", "\\ok", "https:ok", "https:/ok", "/x/../ok", "./ok"}) {
    INFO(written);
    auto normalized = fetch(json::object{{"url", a.url(to(written))}});
    CHECK(normalized.at("status") == 200);
    CHECK(text(normalized.at("url")) == a.url("/ok"));
  }
  auto stray = fetch(json::object{{"url", a.url(to("/ok%zz"))}});
  CHECK(stray.at("status") == 404);
  CHECK(text(stray.at("url")) == a.url("/ok%25zz"));
  // An encoded slash stays encoded: on many servers it names another resource than a slash.
  auto slash = fetch(json::object{{"url", a.url(to("/ok%2Fzz"))}});
  CHECK(slash.at("status") == 404);
  CHECK(text(slash.at("url")) == a.url("/ok%2Fzz"));
  // What fails on the way says that the request followed a redirect.
  auto tooLarge = fetch(json::object{{"url", a.url(to("/big?bytes=17000000"))}});
  CHECK(codeOf(tooLarge) == "response-too-large");
  CHECK_THAT(text(tooLarge.at("message")), Catch::Contains("followed a redirect"));

  // 303 turns a POST into a GET without its body; 307 keeps both.
  auto seeOther =
      fetch(json::object{{"url", a.url(to("/echo", 303))}, {"method", "POST"}, {"body", "data"}});
  auto echoed = json::parse(text(seeOther.at("text"))).as_object();
  CHECK(echoed.at("method") == "GET");
  CHECK(echoed.at("body") == "");
  auto temporary =
      fetch(json::object{{"url", a.url(to("/echo", 307))}, {"method", "POST"}, {"body", "data"}});
  echoed = json::parse(text(temporary.at("text"))).as_object();
  CHECK(echoed.at("method") == "POST");
  CHECK(echoed.at("body") == "data");

  // Another origin is authorized on its own: no decision for it yet, so nothing reaches it.
  const json::object crossing{
      {"url", a.url(to(b.url("/echo")))},
      {"headers", json::parse(R"([["Authorization","Bearer t"],["X-Keep","1"]])")}};
  auto refused = fetch(crossing);
  CHECK(codeOf(refused) == "not-authorized");
  CHECK_THAT(text(refused.at("message")), Catch::Contains("redirect"));
  CHECK(b.totalRequests() == 0);
  decideAhead(admin, revision, "fetch", b.origin(), "read");
  auto crossed = fetch(crossing);
  CHECK(crossed.at("status") == 200);
  CHECK(text(crossed.at("url")) == b.url("/echo"));
  const std::string sent = text(crossed.at("text"));
  CHECK(sent.find("X-Keep") != std::string::npos);
  CHECK(sent.find("Bearer t") == std::string::npos);  // Authorization stays with its origin
  // A redirect to plain http is refused as a tool's own request would be.
  auto insecure = fetch(json::object{{"url", a.url(to("http://127.0.0.1:1/x"))}});
  CHECK(codeOf(insecure) == "scheme-not-allowed");
  CHECK_THAT(text(insecure.at("message")), Catch::Contains("followed a redirect"));
}
