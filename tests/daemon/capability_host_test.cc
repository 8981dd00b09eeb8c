// The daemon's capability host without V8: fetch and popup operations started the way the runtime
// starts them, with a fake HostOperation, against the real policy engine (LMDB in a temporary
// directory), the real HTTPS client and the local HTTPS test server (its CA trusted, 127.0.0.1
// opened). Covers the checks before any prompt and any I/O, the manifest ceiling, stored and
// prompted decisions with the wall clock paused, the response shape, redirects, limits,
// cancellation mid-request, the audit, and popups through subscribed hosts.
#include "daemon/capability_host.h"
#include "daemon/config.h"
#include "daemon/mediation.h"
#include "daemon/popups.h"
#include "policy/approvals.h"
#include "policy/audit.h"
#include "policy/decisions.h"
#include "policy/http_client.h"
#include "registry/registry.h"
#include "registry/tasks.h"
#include "store/store.h"
#include "tests/support/https_test_server.h"

#include <stdlib.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace asio = boost::asio;
namespace json = boost::json;
using namespace toolhost;
using namespace std::chrono_literals;
using runtime::HostOperation;
using runtime::HostOpFailure;
using runtime::HostOpResult;
using toolhost::testing::HttpsTestServer;

namespace {

// The runtime's side of one operation: records what the host does with it.
class FakeOperation final : public HostOperation {
 public:
  void complete(HostOpResult result) override {
    {
      std::lock_guard lock(mutex_);
      if (result_) return;
      result_ = std::move(result);
    }
    changed_.notify_all();
  }
  void pauseWallClock() override {
    std::lock_guard lock(mutex_);
    ++pauses;
  }
  void resumeWallClock() override {
    std::lock_guard lock(mutex_);
    ++resumes;
  }
  void onAbort(std::function<void()> abort) override {
    bool now = false;
    {
      std::lock_guard lock(mutex_);
      if (ended_) {
        now = true;
      } else {
        abort_ = std::move(abort);
      }
    }
    if (now) abort();
  }
  // The call ended (cancelled): runs the abort the host registered.
  void end() {
    std::function<void()> abort;
    {
      std::lock_guard lock(mutex_);
      ended_ = true;
      abort = std::move(abort_);
    }
    if (abort) abort();
  }
  HostOpResult wait(std::chrono::milliseconds timeout = 10s) {
    std::unique_lock lock(mutex_);
    REQUIRE(changed_.wait_for(lock, timeout, [&] { return result_.has_value(); }));
    return *result_;
  }
  bool done() const {
    std::lock_guard lock(mutex_);
    return result_.has_value();
  }
  int pausesSoFar() const {
    std::lock_guard lock(mutex_);
    return pauses;
  }
  int resumesSoFar() const {
    std::lock_guard lock(mutex_);
    return resumes;
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<HostOpResult> result_;
  std::function<void()> abort_;
  bool ended_ = false;
  int pauses = 0;
  int resumes = 0;
};

// Notifications a subscribed approver or popup host received.
class Inbox {
 public:
  void push(std::string_view method, json::object params) {
    {
      std::lock_guard lock(mutex_);
      messages_.push_back({std::string(method), std::move(params)});
    }
    changed_.notify_all();
  }
  std::pair<std::string, json::object> next(std::chrono::milliseconds timeout = 10s) {
    std::unique_lock lock(mutex_);
    REQUIRE(changed_.wait_for(lock, timeout, [&] { return !messages_.empty(); }));
    auto first = std::move(messages_.front());
    messages_.erase(messages_.begin());
    return first;
  }
  std::size_t size() const {
    std::lock_guard lock(mutex_);
    return messages_.size();
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::pair<std::string, json::object>> messages_;
};

std::filesystem::path makeTempDir() {
  std::string pattern = "/tmp/th-caphost-XXXXXX";
  REQUIRE(::mkdtemp(pattern.data()) != nullptr);
  return pattern;
}

daemon::Config configFor() {
  daemon::Config config;
  config.promptTimeout = 5000ms;
  config.fetch.allowPrivate = {policy::parseCidr("127.0.0.1/32").value()};
  return config;
}

// Everything the host needs, wired as main.cc wires it, with one I/O thread.
struct Daemon {
  explicit Daemon(daemon::Config config = configFor())
      : dir(makeTempDir()), configs(std::move(config)) {
    store::Options options;
    options.stateDir = dir / "state";
    options.mapSizeMb = 64;
    for (auto& table : registry::Registry::tables()) options.tables.push_back(table);
    for (auto& table : registry::TaskStore::tables()) options.tables.push_back(table);
    for (auto& table : policy::DecisionStore::tables()) options.tables.push_back(table);
    auto opened = store::Store::open(options);
    REQUIRE(opened.has_value());
    store = std::move(*opened);
    registry.emplace(*store);
    tasks.emplace(*store, *registry);
    decisions.emplace(*store);
    audit.emplace(*store, 1000);
    approvals.emplace(*decisions, *audit);
    auto current = configs.current();
    http.emplace(policy::AddressRules(current->fetch.allowPrivate), server.caFile());
    host.emplace(
        daemon::CapabilityServices{
            *registry, *tasks,
            daemon::MediationServices{*decisions, *approvals, *audit, *http, configs}, popups},
        io.get_executor());
    thread = std::thread([this] { io.run(); });
  }
  ~Daemon() {
    work.reset();
    io.stop();
    thread.join();
    host.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }

  registry::ToolRevisionPtr install(json::object capabilities, int variant = 0) {
    json::object manifest{{"name", "fetcher"},
                          {"description", "fetches"},
                          {"parameters", json::parse(R"({"type":"object"})")},
                          {"execution", json::object{{"class", "sandboxed-code"},
                                                     {"runtime", "javascript"},
                                                     {"source", "export default async () => " +
                                                                    std::to_string(variant)}}},
                          {"capabilities", std::move(capabilities)}};
    auto installed = registry->install(manifest);
    INFO((installed ? "" : installed.error().detail));
    REQUIRE(installed.has_value());
    auto tool = registry->getRevision(installed->revision);
    REQUIRE(tool.has_value());
    return *tool;
  }
  // Requests read and write on the test server, and a custom-html popup.
  registry::ToolRevisionPtr installFetcher(std::string_view access = R"(["read"])") {
    return install(json::parse(R"({"fetch":[{"origin":")" + server.origin() + R"(","access":)" +
                               std::string(access) + R"(}],"popup":["custom-html",")" +
                               server.origin() + R"("]})")
                       .as_object());
  }

  std::shared_ptr<FakeOperation> start(const registry::ToolRevision& tool, std::string kind,
                                       json::value request) {
    auto operation = std::make_shared<FakeOperation>();
    host->startOperation(tool, json::object{}, kind, std::move(request), operation);
    return operation;
  }
  std::shared_ptr<FakeOperation> fetch(const registry::ToolRevision& tool, std::string url,
                                       std::string method = "GET", json::array headers = {},
                                       std::optional<std::string> body = std::nullopt) {
    json::object request{{"url", url}, {"method", method}, {"headers", std::move(headers)}};
    if (body) request["bodyBase64"] = daemon::base64Encode(*body);
    return start(tool, "fetch", std::move(request));
  }
  void allowAlways(const registry::ToolRevision& tool, std::string_view access = "read") {
    auto stored = decisions->set(policy::DecisionKey{tool.revision, "fetch", server.origin(),
                                                     *policy::parseAccessClass(access)},
                                 policy::Verdict::allow, policy::Scope::always, "test");
    REQUIRE(stored.has_value());
  }
  std::vector<policy::AuditEntry> auditTail() {
    auto entries = audit->tail(100);
    REQUIRE(entries.has_value());
    return *entries;
  }

  std::filesystem::path dir;
  HttpsTestServer server;
  daemon::ConfigHolder configs;
  store::StorePtr store;
  std::optional<registry::Registry> registry;
  std::optional<registry::TaskStore> tasks;
  std::optional<policy::DecisionStore> decisions;
  std::optional<policy::AuditLog> audit;
  std::optional<policy::ApprovalBroker> approvals;
  std::optional<policy::HttpClient> http;
  daemon::PopupHosts popups;
  asio::io_context io{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work{
      asio::make_work_guard(io)};
  std::optional<daemon::DaemonCapabilityHost> host;
  std::thread thread;
};

HostOpFailure failureOf(const HostOpResult& result) {
  INFO((result ? json::serialize(*result) : ""));
  REQUIRE_FALSE(result.has_value());
  return result.error();
}

json::object replyOf(const HostOpResult& result) {
  INFO((result ? "" : result.error().code + ": " + result.error().message));
  REQUIRE(result.has_value());
  return result->as_object();
}

std::string bodyOf(const json::object& reply) {
  auto body = daemon::base64Decode(reply.at("bodyBase64").as_string());
  REQUIRE(body.has_value());
  return *body;
}

}  // namespace

TEST_CASE("base64 as the runtime passes bodies", "[daemon][fetch]") {
  for (std::string bytes : {std::string(), std::string("f"), std::string("fo"), std::string("foo"),
                            std::string("foob"), std::string("\0\xff\x10 binary", 10)}) {
    auto encoded = daemon::base64Encode(bytes);
    CHECK(encoded.size() % 4 == 0);
    CHECK(daemon::base64Decode(encoded) == bytes);
  }
  CHECK(daemon::base64Encode("foobar") == "Zm9vYmFy");
  CHECK(daemon::base64Encode("fo") == "Zm8=");
  CHECK_FALSE(daemon::base64Decode("Zm8"));
  CHECK_FALSE(daemon::base64Decode("Zm9=="));
  CHECK_FALSE(daemon::base64Decode("Z=8="));
  CHECK_FALSE(daemon::base64Decode("Zm9v YmFy"));
  CHECK_FALSE(daemon::base64Decode("Zm9=Zm9v"));
  CHECK_FALSE(daemon::base64Decode("Zm9-"));
}

TEST_CASE("fetch: refusals before any prompt and any I/O", "[daemon][fetch]") {
  Daemon d;
  auto tool = d.installFetcher();
  Inbox approver;
  d.approvals->addApprover(1, "approver test", [&](std::string_view m, json::object p) {
    approver.push(m, std::move(p));
  });

  auto codeOf = [&](std::string url, std::string method = "GET", json::array headers = {}) {
    auto operation = d.fetch(*tool, std::move(url), std::move(method), std::move(headers));
    auto failure = failureOf(operation->wait());
    CHECK(operation->pausesSoFar() == 0);
    return failure;
  };
  CHECK(codeOf("https://169.254.169.254/latest/meta-data/").code == "destination-blocked");
  CHECK(codeOf("https://localhost:" + std::to_string(d.server.port()) + "/ok").code ==
        "destination-blocked");
  CHECK(codeOf("https://[::1]/").code == "destination-blocked");
  CHECK(codeOf("http://" + d.server.origin().substr(8) + "/ok").code == "scheme-not-allowed");
  CHECK(codeOf("not a url").code == "invalid-url");
  auto credentials = codeOf("https://user:hunter2@" + d.server.origin().substr(8) + "/ok");
  CHECK(credentials.code == "credentials-in-url");
  CHECK(credentials.message.find("hunter2") == std::string::npos);
  auto injected = codeOf(d.server.url("/ok"), "GET",
                         json::array{json::array{"X-Note", "a\r\nX-Evil: secret-value"}});
  CHECK(injected.code == "invalid-header");
  CHECK(injected.message.find("secret-value") == std::string::npos);
  CHECK(codeOf(d.server.url("/ok"), "GET", json::array{json::array{"Cookie", "a=b"}}).code ==
        "invalid-header");
  CHECK(codeOf(d.server.url("/ok"), "TRACE").code == "invalid-header");

  CHECK(d.server.totalRequests() == 0);
  CHECK(d.server.connectionsAccepted() == 0);
  CHECK(approver.size() == 0);
  // Each refusal is audited, naming the code only.
  auto entries = d.auditTail();
  REQUIRE(entries.size() == 9);
  CHECK(entries[0].kind == "denial");
  CHECK(entries[0].reason == "refused before authorization: destination-blocked");
  for (const auto& entry : entries) CHECK(entry.reason.find("hunter2") == std::string::npos);
}

TEST_CASE("fetch: the manifest's ceiling refuses without a prompt", "[daemon][fetch]") {
  Daemon d;
  auto tool = d.installFetcher();  // read only
  Inbox approver;
  d.approvals->addApprover(1, "approver test", [&](std::string_view m, json::object p) {
    approver.push(m, std::move(p));
  });
  auto write = d.fetch(*tool, d.server.url("/echo"), "post", {}, std::string("{}"));
  auto failure = failureOf(write->wait());
  CHECK(failure.code == "not-authorized");
  CHECK_THAT(failure.message, Catch::Contains("capabilities.fetch"));
  CHECK_THAT(failure.message, Catch::Contains("(write)"));
  auto other = d.fetch(*tool, "https://example.com/");
  CHECK(failureOf(other->wait()).code == "not-authorized");
  CHECK(approver.size() == 0);
  CHECK(d.server.totalRequests() == 0);
  // No approver connected either: denied at once.
  d.approvals->removeApprover(1);
  auto undecided = d.fetch(*tool, d.server.url("/ok"));
  auto lonely = failureOf(undecided->wait());
  CHECK(lonely.code == "not-authorized");
  CHECK_THAT(lonely.message, Catch::Contains("no approver"));
  CHECK(d.server.totalRequests() == 0);
}

TEST_CASE("fetch: a stored decision allows, the reply has the runtime's shape", "[daemon][fetch]") {
  Daemon d;
  auto tool = d.installFetcher(R"(["read","write"])");
  d.allowAlways(*tool, "write");
  auto operation = d.fetch(*tool, d.server.url("/echo?q=1"), "post",
                           json::array{json::array{"X-Note", "  hello  "},
                                       json::array{"Content-Type", "application/json"}},
                           std::string("{\"a\":1}"));
  const auto reply = replyOf(operation->wait());
  CHECK(operation->pausesSoFar() == 0);
  CHECK(reply.at("status") == 200);
  CHECK(reply.at("statusText") == "OK");
  CHECK(reply.at("url") == json::value(d.server.url("/echo?q=1")));
  bool sawType = false;
  for (const auto& header : reply.at("headers").as_array()) {
    const auto& name = header.as_array()[0].as_string();
    for (char c : name) CHECK_FALSE((c >= 'A' && c <= 'Z'));
    sawType = sawType || name == "content-type";
  }
  CHECK(sawType);
  auto echo = json::parse(bodyOf(reply)).as_object();
  CHECK(echo.at("method") == "POST");
  CHECK(echo.at("target") == "/echo?q=1");
  CHECK(echo.at("body") == "{\"a\":1}");
  bool sawNote = false;
  for (const auto& header : echo.at("headers").as_array()) {
    const auto& pair = header.as_array();
    CHECK(pair[0] != "Cookie");
    if (pair[0] == "X-Note") sawNote = pair[1] == "hello";
  }
  CHECK(sawNote);

  // The read class has no decision: denied (nobody to ask), and nothing was sent for it.
  auto read = d.fetch(*tool, d.server.url("/ok"));
  CHECK(failureOf(read->wait()).code == "not-authorized");
  CHECK(d.server.requestCount("/ok") == 0);

  // The request is audited: status and bytes, never the query, a header or the body.
  auto entries = d.auditTail();
  auto request = std::find_if(entries.begin(), entries.end(),
                              [](const auto& entry) { return entry.kind == "request"; });
  REQUIRE(request != entries.end());
  CHECK(request->toolRevision == tool->revision);
  CHECK(request->action == "fetch");
  CHECK(request->target == d.server.origin());
  CHECK(request->access == policy::AccessClass::write);
  CHECK(request->verdict == "allow");
  CHECK(request->scope == "always");
  CHECK(request->status == 200);
  CHECK(request->bytes == bodyOf(reply).size());
  CHECK(request->durationMs.has_value());
  CHECK(request->reason == "POST: ok");
  auto text = json::serialize(policy::toJson(*request));
  CHECK(text.find("q=1") == std::string::npos);
  CHECK(text.find("hello") == std::string::npos);
}

TEST_CASE("fetch: a prompt pauses the wall clock, each answer and scope", "[daemon][fetch]") {
  Daemon d;
  auto tool = d.installFetcher();
  Inbox approver;
  d.approvals->addApprover(7, "approver test", [&](std::string_view m, json::object p) {
    approver.push(m, std::move(p));
  });
  auto answer = [&](std::string_view verdict, std::string_view scope) {
    auto operation = d.fetch(*tool, d.server.url("/ok?token=abc"));
    auto [method, prompt] = approver.next();
    REQUIRE(method == "policy.prompt");
    CHECK(prompt.at("action") == "fetch");
    CHECK(prompt.at("target") == json::value(d.server.origin()));
    CHECK(prompt.at("access") == "read");
    CHECK(prompt.at("private") == true);
    CHECK_THAT(std::string(prompt.at("privateRange").as_string()), Catch::Contains("127.0.0.1/32"));
    CHECK(prompt.at("detail") == "GET /ok");  // never the query
    CHECK(operation->pausesSoFar() == 1);
    CHECK(operation->resumesSoFar() == 0);
    CHECK_FALSE(operation->done());
    REQUIRE(d.approvals
                ->decide(7, std::string(prompt.at("promptId").as_string()),
                         *policy::parseVerdict(verdict), *policy::parseScope(scope))
                .has_value());
    auto result = operation->wait();
    CHECK(operation->resumesSoFar() == 1);
    return result;
  };
  CHECK(replyOf(answer("allow", "once")).at("status") == 200);
  CHECK(failureOf(answer("deny", "once")).code == "not-authorized");
  CHECK(replyOf(answer("allow", "session")).at("status") == 200);
  // Decided for the session: no prompt, no pause.
  auto silent = d.fetch(*tool, d.server.url("/ok"));
  CHECK(replyOf(silent->wait()).at("status") == 200);
  CHECK(silent->pausesSoFar() == 0);
  CHECK(approver.size() == 0);
  CHECK(d.server.requestCount("/ok") == 3);

  // A new revision needs its own approval.
  auto v2 = d.install(
      json::parse(R"({"fetch":[{"origin":")" + d.server.origin() + R"(","access":["read"]}]})")
          .as_object(),
      2);
  auto asked = d.fetch(*v2, d.server.url("/ok"));
  auto [method, prompt] = approver.next();
  CHECK(prompt.at("tool").at("revision") == json::value(v2->revision));
  REQUIRE(d.approvals
              ->decide(7, std::string(prompt.at("promptId").as_string()), policy::Verdict::deny,
                       policy::Scope::always)
              .has_value());
  CHECK(failureOf(asked->wait()).code == "not-authorized");
  auto again = d.fetch(*v2, d.server.url("/ok"));
  CHECK(failureOf(again->wait()).code == "not-authorized");
  CHECK(approver.size() == 0);
}

TEST_CASE("fetch: redirects are returned, limits and timeouts apply", "[daemon][fetch]") {
  auto config = configFor();
  config.fetch.maxResponseBytes = 1000;
  config.fetch.timeout = 300ms;
  Daemon d(config);
  auto tool = d.installFetcher();
  d.allowAlways(*tool);

  const auto redirect = replyOf(d.fetch(*tool, d.server.url("/redirect"))->wait());
  CHECK(redirect.at("status") == 302);
  bool location = false;
  for (const auto& header : redirect.at("headers").as_array()) {
    if (header.as_array()[0] == "location") location = header.as_array()[1] == "/ok";
  }
  CHECK(location);
  CHECK(d.server.requestCount("/ok") == 0);

  CHECK(failureOf(d.fetch(*tool, d.server.url("/big?bytes=5000"))->wait()).code ==
        "response-too-large");
  CHECK(replyOf(d.fetch(*tool, d.server.url("/big?bytes=1000"))->wait()).at("status") == 200);
  CHECK(failureOf(d.fetch(*tool, d.server.url("/slow?ms=2000"))->wait()).code == "timeout");

  auto large = d.fetch(*tool, d.server.url("/echo"), "PUT", {}, std::string(9u << 20, 'b'));
  CHECK(failureOf(large->wait()).code == "request-too-large");
}

TEST_CASE("fetch: the call's end aborts the request", "[daemon][fetch]") {
  Daemon d;
  auto tool = d.installFetcher();
  d.allowAlways(*tool);
  auto operation = d.fetch(*tool, d.server.url("/hang"));
  REQUIRE(d.server.waitForRequests("/hang", 1, 10s));
  auto before = d.server.connectionsClosed();
  operation->end();
  CHECK(failureOf(operation->wait()).code == "cancelled");
  CHECK(d.server.waitForConnectionsClosed(before + 1, 5s));
  // A call that has already ended starts nothing.
  auto late = std::make_shared<FakeOperation>();
  late->end();
  d.host->startOperation(
      *tool, json::object{}, "fetch",
      json::object{{"url", d.server.url("/hang")}, {"method", "GET"}, {"headers", json::array{}}},
      late);
  CHECK(failureOf(late->wait()).code == "cancelled");
}

TEST_CASE("without a storage or secrets host, storage and secrets are refused", "[daemon][fetch]") {
  Daemon d;
  auto tool = d.installFetcher();
  CHECK(failureOf(d.start(*tool, "storage", json::object{})->wait()).code == "not-authorized");
  CHECK(failureOf(d.start(*tool, "secret", json::object{})->wait()).code == "not-authorized");
}

TEST_CASE("popup: through the most recent host, each way it can end", "[daemon][popup]") {
  Daemon d;
  auto tool = d.installFetcher();
  auto customHtml = json::object{{"kind", "custom-html"}, {"html", "<p>hi</p>"}};

  // No host: a clear error, nobody asked.
  auto alone = d.start(*tool, "popup", customHtml);
  CHECK(failureOf(alone->wait()).code == "no-popup-host");

  Inbox older, newer;
  d.popups.addHost(10, "host a", [&](std::string_view m, json::object p) { older.push(m, p); });
  d.popups.addHost(11, "host b", [&](std::string_view m, json::object p) { newer.push(m, p); });
  CHECK(d.popups.hostCount() == 2);
  auto decide = [&](std::string target, policy::Verdict verdict) {
    REQUIRE(
        d.decisions
            ->set(policy::DecisionKey{tool->revision, "popup", target, policy::AccessClass::read},
                  verdict, policy::Scope::session, "test")
            .has_value());
  };

  // Not requested by the manifest: not-authorized.
  auto elsewhere =
      d.start(*tool, "popup", json::object{{"kind", "origin"}, {"url", "https://example.com/x"}});
  CHECK(failureOf(elsewhere->wait()).code == "not-authorized");
  // Requested, no approver, no decision: not-authorized.
  CHECK(failureOf(d.start(*tool, "popup", customHtml)->wait()).code == "not-authorized");

  decide("custom-html", policy::Verdict::allow);
  auto popup = d.start(*tool, "popup", customHtml);
  auto [method, open] = newer.next();
  CHECK(method == "popup.open");
  CHECK(open.at("kind") == "custom-html");
  CHECK(open.at("html") == "<p>hi</p>");
  CHECK(open.at("tool").at("revision") == json::value(tool->revision));
  CHECK(popup->pausesSoFar() == 1);
  CHECK(older.size() == 0);
  // Only the host it went to may answer.
  std::string popupId(open.at("popupId").as_string());
  CHECK_FALSE(d.popups.answer(10, popupId, json::value(1)).has_value());
  REQUIRE(d.popups.answer(11, popupId, json::parse(R"({"clicked":"ok"})")).has_value());
  CHECK(replyOf(popup->wait()).at("clicked") == "ok");
  CHECK(popup->resumesSoFar() == 1);
  CHECK_FALSE(d.popups.answer(11, popupId, json::value(2)).has_value());

  // The origin kind: the target is the URL's exact origin.
  decide(d.server.origin(), policy::Verdict::allow);
  auto page = d.start(*tool, "popup",
                      json::object{{"kind", "origin"}, {"url", d.server.url("/login?x=1")}});
  auto [pageMethod, pageOpen] = newer.next();
  CHECK(pageOpen.at("kind") == "origin");
  CHECK(pageOpen.at("url") == json::value(d.server.url("/login?x=1")));
  REQUIRE(d.popups
              .answer(11, std::string(pageOpen.at("popupId").as_string()),
                      HostOpFailure{"dismissed", "the user closed the window"})
              .has_value());
  CHECK(failureOf(page->wait()).code == "dismissed");

  // The call ends first: the host is told to close it.
  auto abandoned = d.start(*tool, "popup", customHtml);
  auto [m3, open3] = newer.next();
  abandoned->end();
  auto [closeMethod, closeParams] = newer.next();
  CHECK(closeMethod == "popup.close");
  CHECK(closeParams.at("popupId") == open3.at("popupId"));
  CHECK(failureOf(abandoned->wait()).code == "cancelled");

  // The host goes away: its open popup fails; the older host takes the next one.
  auto orphan = d.start(*tool, "popup", customHtml);
  newer.next();
  d.popups.removeHost(11);
  CHECK(failureOf(orphan->wait()).code == "popup-closed");
  auto next = d.start(*tool, "popup", customHtml);
  auto [m4, open4] = older.next();
  CHECK(m4 == "popup.open");
  REQUIRE(d.popups.answer(10, std::string(open4.at("popupId").as_string()), json::value(nullptr))
              .has_value());
  auto answered = next->wait();
  REQUIRE(answered.has_value());
  CHECK(answered->is_null());
}

TEST_CASE("popup: a host that never answers is closed at [popup] timeout_ms", "[daemon][popup]") {
  auto config = configFor();
  config.popupTimeout = 300ms;
  Daemon d(std::move(config));
  auto tool = d.installFetcher();
  REQUIRE(d.decisions
              ->set(policy::DecisionKey{tool->revision, "popup", "custom-html",
                                        policy::AccessClass::read},
                    policy::Verdict::allow, policy::Scope::session, "test")
              .has_value());
  Inbox host;
  d.popups.addHost(7, "host", [&](std::string_view m, json::object p) { host.push(m, p); });
  auto customHtml = json::object{{"kind", "custom-html"}, {"html", "<p>hi</p>"}};

  // Answered in time: no close follows, even after the timeout has passed.
  auto answered = d.start(*tool, "popup", customHtml);
  auto [m1, open1] = host.next();
  REQUIRE(
      d.popups.answer(7, std::string(open1.at("popupId").as_string()), json::parse(R"({"n":1})"))
          .has_value());
  CHECK(replyOf(answered->wait()).at("n") == 1);

  // Never answered: the host is told why it closes, the tool gets popup-timeout, and the wall
  // clock, paused for the popup, runs again.
  auto ignored = d.start(*tool, "popup", customHtml);
  auto [m2, open2] = host.next();
  CHECK(m2 == "popup.open");
  auto failure = failureOf(ignored->wait());
  CHECK(failure.code == "popup-timeout");
  CHECK_THAT(failure.message, Catch::Contains("300 ms ([popup] timeout_ms)"));
  CHECK(ignored->pausesSoFar() == 1);
  CHECK(ignored->resumesSoFar() == 1);
  auto [m3, close] = host.next();
  CHECK(m3 == "popup.close");
  CHECK(close.at("popupId") == open2.at("popupId"));
  CHECK_THAT(std::string(close.at("reason").as_string()), Catch::Contains("not answered within"));
  // It is gone: a late answer is refused, and the answered popup above never got a close.
  CHECK_FALSE(
      d.popups.answer(7, std::string(open2.at("popupId").as_string()), json::value(2)).has_value());
  CHECK(host.size() == 0);
}
