// The mediated HTTPS request against a local HTTPS server with its own test CA (loopback only,
// opened with allow_private): allowed requests by address and by name, certificate, name and
// address verification, redirects returned, size limits, the one timeout, header and method
// checks that send nothing, DNS rebinding against a scripted resolver, DNS and connection
// failures, and cancellation mid-request.
#include "policy/http_client.h"
#include "policy/access_class.h"
#include "policy/destination.h"
#include "tests/support/https_test_server.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/parse.hpp>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <exception>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace asio = boost::asio;
namespace json = boost::json;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using toolhost::policy::AddressRules;
using toolhost::policy::checkRequest;
using toolhost::policy::defaultUserAgent;
using toolhost::policy::errorCode;
using toolhost::policy::FetchErrc;
using toolhost::policy::FetchError;
using toolhost::policy::FetchLimits;
using toolhost::policy::FetchResult;
using toolhost::policy::HttpClient;
using toolhost::policy::HttpRequest;
using toolhost::policy::HttpResponse;
using toolhost::policy::isForbiddenRequestHeader;
using toolhost::policy::normalizeMethod;
using toolhost::policy::parseCidr;
using toolhost::policy::parseDestination;
using toolhost::policy::Resolver;
using toolhost::policy::ResolveResult;
using toolhost::policy::SystemResolver;
using toolhost::testing::HttpsTestServer;
using toolhost::testing::HttpsTestServerOptions;
using toolhost::testing::TestCa;

namespace {

constexpr std::string_view kName = HttpsTestServer::kDnsName;

// What the suite's configuration would say: allow_private = ["127.0.0.1/32"].
AddressRules loopbackOpened() { return AddressRules({parseCidr("127.0.0.1/32").value()}); }

HttpRequest requestFor(std::string_view url, std::string_view method = "GET",
                       const AddressRules& rules = loopbackOpened()) {
  HttpRequest request;
  request.method = normalizeMethod(method);
  request.destination = parseDestination(url, rules).value();
  return request;
}

// Answers lookups from a script, one entry per lookup, the last one repeating; or never answers.
class ScriptedResolver final : public Resolver {
 public:
  explicit ScriptedResolver(std::vector<ResolveResult> script) : script_(std::move(script)) {}

  asio::awaitable<ResolveResult> resolve(std::string host, std::uint16_t) override {
    hosts.push_back(host);
    if (script_.empty()) {  // hang until cancelled
      asio::steady_timer never(co_await asio::this_coro::executor, std::chrono::hours(1));
      co_await never.async_wait(asio::as_tuple(asio::use_awaitable));
      co_return FetchError{FetchErrc::cancelled, "lookup cancelled"};
    }
    co_return script_[std::min(hosts.size(), script_.size()) - 1];
  }

  std::vector<std::string> hosts;  // one entry per lookup

 private:
  std::vector<ResolveResult> script_;
};

ResolveResult answers(std::initializer_list<const char*> addresses) {
  std::vector<asio::ip::address> out;
  for (const char* address : addresses) out.push_back(asio::ip::make_address(address));
  return out;
}

// Runs one fetch to completion on a fresh io_context.
FetchResult runFetch(HttpClient& client, HttpRequest request, FetchLimits limits = {},
                     std::string owner = {}) {
  asio::io_context ioc;
  std::optional<FetchResult> out;
  std::exception_ptr failure;
  asio::co_spawn(ioc, client.fetch(std::move(request), limits, std::move(owner)),
                 [&](std::exception_ptr e, FetchResult result) {
                   failure = e;
                   out.emplace(std::move(result));
                 });
  ioc.run();
  if (failure) std::rethrow_exception(failure);
  REQUIRE(out);
  return std::move(*out);
}

void requireError(const FetchResult& result, FetchErrc expected) {
  REQUIRE_FALSE(result.has_value());
  INFO(result.error().message);
  CHECK(errorCode(result.error().code) == errorCode(expected));
}

HttpResponse requireResponse(FetchResult result) {
  if (!result) FAIL(std::string(errorCode(result.error().code)) + ": " + result.error().message);
  return std::move(*result);
}

void rethrow(std::exception_ptr failure) {
  if (failure) std::rethrow_exception(failure);
}

std::optional<std::string> header(const HttpResponse& response, std::string_view name) {
  for (const auto& [n, v] : response.headers) {
    if (n == name) return v;
  }
  return std::nullopt;
}

// The request headers /echo saw, names lowercased.
std::vector<std::pair<std::string, std::string>> echoedHeaders(const json::value& echo) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& entry : echo.at("headers").as_array()) {
    std::string name(entry.as_array().at(0).as_string());
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    out.emplace_back(std::move(name), std::string(entry.as_array().at(1).as_string()));
  }
  return out;
}

std::optional<std::string> echoed(const json::value& echo, std::string_view name) {
  for (const auto& [n, v] : echoedHeaders(echo)) {
    if (n == name) return v;
  }
  return std::nullopt;
}

// Cancels `signal` (terminal) 100 ms after the server received a request for `path`.
asio::awaitable<void> cancelOnceServed(const HttpsTestServer* server, std::string path,
                                       asio::cancellation_signal* signal) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (server->requestCount(path) == 0) {
    timer.expires_after(5ms);
    co_await timer.async_wait(asio::use_awaitable);
  }
  timer.expires_after(100ms);
  co_await timer.async_wait(asio::use_awaitable);
  signal->emit(asio::cancellation_type::terminal);
}

asio::awaitable<void> cancelAfter(std::chrono::milliseconds delay,
                                  asio::cancellation_signal* signal) {
  asio::steady_timer timer(co_await asio::this_coro::executor, delay);
  co_await timer.async_wait(asio::use_awaitable);
  signal->emit(asio::cancellation_type::terminal);
}

}  // namespace

TEST_CASE("fetch: a GET to an opened loopback address returns the response") {
  HttpsTestServer server;
  HttpClient client(loopbackOpened(), server.caFile());

  const FetchResult result = runFetch(client, requestFor(server.url("/ok")));
  const HttpResponse& response = requireResponse(result);
  CHECK(response.status == 200);
  CHECK(response.statusText == "OK");
  CHECK(response.body == "ok");
  CHECK(response.remoteAddress == "127.0.0.1");
  CHECK(header(response, "content-type") == "text/plain");
  CHECK(header(response, "content-length") == "2");
  CHECK(server.requestCount("/ok") == 1);
}

TEST_CASE("fetch: a GET by name resolves once, sends SNI and verifies the name") {
  HttpsTestServer server;
  auto resolver = std::make_shared<ScriptedResolver>(std::vector{answers({"127.0.0.1"})});
  HttpClient client(loopbackOpened(), server.caFile(), resolver);

  const FetchResult result = runFetch(client, requestFor(server.urlForName("/echo")));
  const HttpResponse& response = requireResponse(result);
  CHECK(response.status == 200);
  CHECK(response.remoteAddress == "127.0.0.1");
  CHECK(resolver->hosts == std::vector<std::string>{std::string(kName)});
  const json::value echo = json::parse(response.body);
  CHECK(echoed(echo, "host") == std::string(kName) + ":" + std::to_string(server.port()));
}

TEST_CASE("fetch: the tool's headers and body go out with the daemon's own, nothing else") {
  HttpsTestServer server;
  HttpClient client(loopbackOpened(), server.caFile());

  SECTION("POST with a body") {
    HttpRequest request = requestFor(server.url("/echo?x=1"), "post");
    request.headers = {{"Content-Type", "application/json"},
                       {"X-Custom", "  padded value\t"},
                       {"Authorization", "Bearer token"},
                       {"X-Empty", ""}};
    request.body = R"({"a":1})";
    const HttpResponse& response = requireResponse(runFetch(client, std::move(request)));
    const json::value echo = json::parse(response.body);
    CHECK(echo.at("method").as_string() == "POST");
    CHECK(echo.at("target").as_string() == "/echo?x=1");
    CHECK(echo.at("body").as_string() == R"({"a":1})");
    CHECK(echoed(echo, "content-type") == "application/json");
    CHECK(echoed(echo, "x-custom") == "padded value");
    CHECK(echoed(echo, "authorization") == "Bearer token");
    CHECK(echoed(echo, "x-empty") == "");
    CHECK(echoed(echo, "content-length") == "7");
    CHECK(echoed(echo, "host") == "127.0.0.1:" + std::to_string(server.port()));
    CHECK(echoed(echo, "user-agent") == std::string(defaultUserAgent()));
    CHECK(echoed(echo, "accept") == "*/*");
    CHECK(echoed(echo, "accept-encoding") == "identity");
    CHECK(echoed(echo, "connection") == "close");
    // Exactly these: no cookie, no proxy or other ambient header.
    std::vector<std::string> names;
    for (const auto& [name, value] : echoedHeaders(echo)) names.push_back(name);
    std::sort(names.begin(), names.end());
    CHECK(names == std::vector<std::string>{"accept", "accept-encoding", "authorization",
                                            "connection", "content-length", "content-type", "host",
                                            "user-agent", "x-custom", "x-empty"});
  }
  SECTION("the tool's User-Agent and Accept win; GET has no Content-Length") {
    HttpRequest request = requestFor(server.url("/echo"));
    request.headers = {{"user-agent", "weather-tool/2"}, {"Accept", "application/json"}};
    const HttpResponse& response = requireResponse(runFetch(client, std::move(request)));
    const json::value echo = json::parse(response.body);
    CHECK(echo.at("method").as_string() == "GET");
    CHECK(echoed(echo, "user-agent") == "weather-tool/2");
    CHECK(echoed(echo, "accept") == "application/json");
    CHECK_FALSE(echoed(echo, "content-length"));
  }
  SECTION("PATCH keeps its case-sensitive name; an empty POST says Content-Length: 0") {
    const HttpResponse& patch =
        requireResponse(runFetch(client, requestFor(server.url("/echo"), "PATCH")));
    CHECK(json::parse(patch.body).at("method").as_string() == "PATCH");
    const HttpResponse& post =
        requireResponse(runFetch(client, requestFor(server.url("/echo"), "POST")));
    CHECK(echoed(json::parse(post.body), "content-length") == "0");
  }
}

TEST_CASE("fetch: status, status text and lowercased response headers in order") {
  HttpsTestServer server;
  HttpClient client(loopbackOpened(), server.caFile());

  const HttpResponse& unavailable =
      requireResponse(runFetch(client, requestFor(server.url("/status?code=503"))));
  CHECK(unavailable.status == 503);
  CHECK(unavailable.statusText == "Service Unavailable");
  CHECK(unavailable.body == "status 503");

  const HttpResponse& json = requireResponse(runFetch(client, requestFor(server.url("/json"))));
  CHECK(json.body == R"({"ok":true})");
  std::vector<std::string> names;
  for (const auto& [name, value] : json.headers) names.push_back(name);
  CHECK(names == std::vector<std::string>{"content-type", "connection", "content-length"});

  const HttpResponse& noContent =
      requireResponse(runFetch(client, requestFor(server.url("/status?code=204"))));
  CHECK(noContent.status == 204);
  CHECK(noContent.body.empty());
}

TEST_CASE("fetch: HEAD returns the headers without waiting for a body") {
  HttpsTestServer server;
  HttpClient client(loopbackOpened(), server.caFile());
  const auto start = Clock::now();
  const HttpResponse& response = requireResponse(runFetch(
      client, requestFor(server.url("/big?bytes=100"), "head"), FetchLimits{.timeout = 5s}));
  CHECK(Clock::now() - start < 2s);
  CHECK(response.status == 200);
  CHECK(header(response, "content-length") == "100");
  CHECK(response.body.empty());
}

TEST_CASE("fetch: a redirect is returned, not followed") {
  HttpsTestServer server;
  HttpClient client(loopbackOpened(), server.caFile());
  const HttpResponse& response =
      requireResponse(runFetch(client, requestFor(server.url("/redirect"))));
  CHECK(response.status == 302);
  CHECK(header(response, "location") == "/ok");
  CHECK(server.requestCount("/redirect") == 1);
  CHECK(server.requestCount("/ok") == 0);
  CHECK(server.totalRequests() == 1);
}

TEST_CASE("fetch: interim responses are skipped, a body ended by the close is accepted") {
  HttpsTestServer server;
  HttpClient client(loopbackOpened(), server.caFile());

  const HttpResponse& hinted =
      requireResponse(runFetch(client, requestFor(server.url("/early-hints"))));
  CHECK(hinted.status == 200);
  CHECK(hinted.body == "ok");

  const HttpResponse& closeDelimited =
      requireResponse(runFetch(client, requestFor(server.url("/close-delimited?bytes=5000"))));
  CHECK(closeDelimited.status == 200);
  CHECK(closeDelimited.body == std::string(5000, 'z'));
  CHECK_FALSE(header(closeDelimited, "content-length"));
}

TEST_CASE("fetch: the server certificate is verified") {
  HttpsTestServer server;

  SECTION("without extra_ca_file the test CA is not trusted") {
    HttpClient client(loopbackOpened(), std::nullopt);
    const FetchResult result = runFetch(client, requestFor(server.url("/ok")));
    requireError(result, FetchErrc::tlsFailed);
    CHECK_THAT(result.error().message, Catch::Contains("extra_ca_file"));
  }
  SECTION("a certificate from another CA") {
    HttpsTestServer other;  // its own CA
    HttpClient client(loopbackOpened(), server.caFile());
    requireError(runFetch(client, requestFor(other.url("/ok"))), FetchErrc::tlsFailed);
    CHECK(other.totalRequests() == 0);
  }
  SECTION("a name the certificate is not for") {
    auto resolver = std::make_shared<ScriptedResolver>(std::vector{answers({"127.0.0.1"})});
    HttpClient client(loopbackOpened(), server.caFile(), resolver);
    const FetchResult result =
        runFetch(client, requestFor(server.urlForName("/ok", "other-name.example")));
    requireError(result, FetchErrc::tlsFailed);
    CHECK_THAT(result.error().message, Catch::Contains("not valid for the name"));
  }
  SECTION("an address the certificate is not for") {
    HttpsTestServerOptions options;
    options.ipAddresses = {};
    HttpsTestServer namesOnly(options);
    HttpClient client(loopbackOpened(), namesOnly.caFile());
    const FetchResult result = runFetch(client, requestFor(namesOnly.url("/ok")));
    requireError(result, FetchErrc::tlsFailed);
    CHECK_THAT(result.error().message, Catch::Contains("not valid for the address"));
    CHECK(namesOnly.totalRequests() == 0);
  }
  SECTION("a name only in the subject's common name") {
    HttpsTestServerOptions options;
    options.commonNameOnly = std::string(HttpsTestServer::kDnsName);
    HttpsTestServer legacy(options);
    auto resolver = std::make_shared<ScriptedResolver>(std::vector{answers({"127.0.0.1"})});
    HttpClient client(loopbackOpened(), legacy.caFile(), resolver);
    const FetchResult result =
        runFetch(client, requestFor(legacy.urlForName("/ok", HttpsTestServer::kDnsName)));
    requireError(result, FetchErrc::tlsFailed);
    CHECK(legacy.totalRequests() == 0);
  }
  SECTION("a shared CA trusts both servers") {
    auto ca = std::make_shared<const TestCa>();
    HttpsTestServerOptions options;
    options.ca = ca;
    HttpsTestServer first(options);
    HttpsTestServer second(options);
    HttpClient client(loopbackOpened(), first.caFile());
    CHECK(requireResponse(runFetch(client, requestFor(second.url("/ok")))).status == 200);
  }
  CHECK(server.totalRequests() == 0);
}

TEST_CASE("fetch: a response over the limit is response-too-large") {
  HttpsTestServer server;
  HttpClient client(loopbackOpened(), server.caFile());
  const FetchLimits limits{.maxResponseBytes = 1000};

  SECTION("at the limit") {
    CHECK(requireResponse(runFetch(client, requestFor(server.url("/big?bytes=1000")), limits))
              .body.size() == 1000);
  }
  SECTION("with Content-Length") {
    requireError(runFetch(client, requestFor(server.url("/big?bytes=1001")), limits),
                 FetchErrc::responseTooLarge);
  }
  SECTION("chunked") {
    requireError(runFetch(client, requestFor(server.url("/big?bytes=5000&chunked=1")), limits),
                 FetchErrc::responseTooLarge);
  }
  SECTION("delimited by the close") {
    requireError(runFetch(client, requestFor(server.url("/close-delimited?bytes=5000")), limits),
                 FetchErrc::responseTooLarge);
  }
  SECTION("headers") {
    requireError(runFetch(client, requestFor(server.url("/big-header?bytes=70000"))),
                 FetchErrc::responseTooLarge);
  }
  SECTION("chunked framing that never ends") {
    // Framing is no body byte: without its own bound it would be buffered until the timeout.
    FetchLimits patient = limits;
    patient.timeout = std::chrono::seconds(20);
    const char* kind = GENERATE("extension", "zeros", "trailer");
    INFO(kind);
    const FetchResult result =
        runFetch(client, requestFor(server.url(std::string("/framing?bytes=1048576&kind=") + kind)),
                 patient);
    requireError(result, FetchErrc::responseTooLarge);
    CHECK_THAT(result.error().message, Catch::Contains("framing"));
    CHECK(client.bufferedBytes() == 0);
  }
}

TEST_CASE("fetch: a status that answers no fetch is refused") {
  HttpsTestServer server;
  HttpClient client(loopbackOpened(), server.caFile());
  for (const char* code : {"101", "600"}) {
    INFO(code);
    const FetchResult result =
        runFetch(client, requestFor(server.url(std::string("/status?code=") + code)));
    requireError(result, FetchErrc::connectFailed);
    CHECK_THAT(result.error().message, Catch::Contains(std::string("status ") + code));
  }
}

TEST_CASE("fetch: one owner's responses stay within its share of the buffer") {
  HttpsTestServer server;
  HttpClient client(loopbackOpened(), server.caFile());
  const FetchLimits limits{
      .maxResponseBytes = 1000, .maxBufferedBytes = 2500, .maxOwnerBufferedBytes = 1500};
  auto fetchAs = [&](const std::string& owner, const char* path) {
    return runFetch(client, requestFor(server.url(path)), limits, owner);
  };

  std::optional<HttpResponse> held = requireResponse(fetchAs("greedy", "/big?bytes=1000"));
  CHECK(client.bufferedBytes("greedy") == 1000);
  CHECK(client.bufferedBytes() == 1000);
  const char* path =
      GENERATE("/big?bytes=600", "/big?bytes=600&chunked=1", "/close-delimited?bytes=600");
  INFO(path);
  // The same owner is refused past its share, naming it; its bytes are as they were.
  auto refused = fetchAs("greedy", path);
  requireError(refused, FetchErrc::responseTooLarge);
  CHECK(refused.error().message.find("max_buffered_bytes_per_tool") != std::string::npos);
  CHECK(client.bufferedBytes("greedy") == 1000);
  CHECK(client.bufferedBytes() == 1000);
  // Another owner, and a fetch without one, still find room in the whole.
  std::optional<HttpResponse> other = requireResponse(fetchAs("other", "/big?bytes=1000"));
  CHECK(client.bufferedBytes("other") == 1000);
  CHECK(client.bufferedBytes() == 2000);
  // Past the whole, the whole is named, and neither owner's count moves.
  auto full = fetchAs("third", path);
  requireError(full, FetchErrc::responseTooLarge);
  CHECK(full.error().message.find("max_buffered_bytes)") != std::string::npos);
  CHECK(client.bufferedBytes("third") == 0);
  CHECK(client.bufferedBytes() == 2000);
  // Dropped responses give back to both.
  held.reset();
  other.reset();
  CHECK(client.bufferedBytes("greedy") == 0);
  CHECK(client.bufferedBytes() == 0);
  CHECK(requireResponse(fetchAs("greedy", "/big?bytes=1000")).body.size() == 1000);
}

TEST_CASE("fetch: the responses held at once stay within max_buffered_bytes") {
  HttpsTestServer server;
  HttpClient client(loopbackOpened(), server.caFile());
  const FetchLimits limits{.maxResponseBytes = 1000, .maxBufferedBytes = 1500};

  std::optional<HttpResponse> held =
      requireResponse(runFetch(client, requestFor(server.url("/big?bytes=1000")), limits));
  CHECK(client.bufferedBytes() == 1000);
  SECTION("a second body that would pass the limit is refused while the first is held") {
    const char* path =
        GENERATE("/big?bytes=600", "/big?bytes=600&chunked=1", "/close-delimited?bytes=600");
    INFO(path);
    auto refused = runFetch(client, requestFor(server.url(path)), limits);
    requireError(refused, FetchErrc::responseTooLarge);
    CHECK(refused.error().message.find("max_buffered_bytes") != std::string::npos);
    CHECK(client.bufferedBytes() == 1000);
    CHECK(requireResponse(runFetch(client, requestFor(server.url("/big?bytes=500")), limits))
              .body.size() == 500);
  }
  SECTION("dropping the response gives its bytes back") {
    held.reset();
    CHECK(client.bufferedBytes() == 0);
    CHECK(requireResponse(runFetch(client, requestFor(server.url("/big?bytes=1000")), limits))
              .body.size() == 1000);
    CHECK(client.bufferedBytes() == 0);
  }
}

TEST_CASE("fetch: one timeout covers the whole exchange") {
  HttpsTestServer server;
  const FetchLimits limits{.timeout = 300ms};
  const auto start = Clock::now();

  SECTION("slow headers") {
    HttpClient client(loopbackOpened(), server.caFile());
    requireError(runFetch(client, requestFor(server.url("/slow?ms=3000")), limits),
                 FetchErrc::timeout);
  }
  SECTION("no answer at all; the connection is closed") {
    HttpClient client(loopbackOpened(), server.caFile());
    requireError(runFetch(client, requestFor(server.url("/hang")), limits), FetchErrc::timeout);
    CHECK(server.waitForConnectionsClosed(1, 2s));
  }
  SECTION("a lookup that never answers") {
    auto resolver = std::make_shared<ScriptedResolver>(std::vector<ResolveResult>{});
    HttpClient client(loopbackOpened(), server.caFile(), resolver);
    const FetchResult result = runFetch(client, requestFor(server.urlForName("/ok")), limits);
    requireError(result, FetchErrc::timeout);
    CHECK(server.connectionsAccepted() == 0);
  }
  const auto elapsed = Clock::now() - start;
  CHECK(elapsed >= 300ms);
  CHECK(elapsed < 10s);  // the limits, not the 30 s default
}

TEST_CASE("fetch: header injection is refused before anything is sent") {
  HttpsTestServer server;
  HttpClient client(loopbackOpened(), server.caFile());

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"X-A", "b\r\nX-B: c"},
      {"X-A", "b\nX-B: c"},
      {"X-A", "b\rX-B: c"},
      {"X-A", std::string("b\0c", 3)},
      {"X-A", "b\x7f"},
      {"X-A", "b\x01"},
      {"X A", "b"},
      {"X-A:", "b"},
      {"", "b"},
      {"X-A\r\nX-B", "c"},
      {"X-\xc3\xa9", "b"},
      {"(X-A)", "b"},
  };
  for (const auto& [name, value] : bad) {
    HttpRequest request = requestFor(server.url("/echo"));
    request.headers = {{"X-Fine", "yes"}, {name, value}};
    const FetchResult result = runFetch(client, std::move(request));
    requireError(result, FetchErrc::invalidHeader);
    // The message names the header, never its value.
    CHECK_THAT(result.error().message, !Catch::Contains("X-B: c"));
  }
  CHECK(server.connectionsAccepted() == 0);
  CHECK(server.totalRequests() == 0);
}

TEST_CASE("fetch: headers the daemon owns or never sends are refused") {
  HttpsTestServer server;
  HttpClient client(loopbackOpened(), server.caFile());
  for (const char* name :
       {"Host", "content-length", "Transfer-Encoding", "TE", "Trailer", "Connection", "Keep-Alive",
        "Upgrade", "Expect", "Accept-Encoding", "Cookie", "Cookie2", "Set-Cookie",
        "Proxy-Authorization", "proxy-connection", "X-HTTP-Method-Override", "X-HTTP-Method",
        "X-Method-Override", "X-Original-Method", "Sec-Fetch-Site",
        // CGI-style servers read '_' and '-' alike: X_HTTP_METHOD_OVERRIDE is the override too.
        "X_HTTP_METHOD_OVERRIDE", "x_http_method", "X-Method_Override", "Proxy_Authorization",
        "sec_fetch_site", "Content_Length", "transfer_encoding"}) {
    INFO(name);
    CHECK(isForbiddenRequestHeader(name));
    HttpRequest request = requestFor(server.url("/echo"));
    request.headers = {{name, "x"}};
    const FetchResult result = runFetch(client, std::move(request));
    requireError(result, FetchErrc::invalidHeader);
    CHECK_THAT(result.error().message, Catch::Contains(name));
  }
  CHECK(server.connectionsAccepted() == 0);
  for (const char* name : {"Authorization", "User-Agent", "Accept", "Content-Type", "X-Api-Key",
                           "Origin", "Referer", "If-None-Match", "Range"}) {
    INFO(name);
    CHECK_FALSE(isForbiddenRequestHeader(name));
  }
}

TEST_CASE("fetch: methods are tokens, and CONNECT, TRACE and TRACK are refused") {
  HttpsTestServer server;
  HttpClient client(loopbackOpened(), server.caFile());
  for (const char* method : {"GE T", "GET\r\n", "", "CONNECT", "trace", "Track", "G(ET)"}) {
    INFO(method);
    HttpRequest request = requestFor(server.url("/echo"));
    request.method = method;
    requireError(runFetch(client, std::move(request)), FetchErrc::invalidHeader);
  }
  CHECK(server.connectionsAccepted() == 0);
}

TEST_CASE("fetch: a read method cannot carry a body") {
  HttpsTestServer server;
  HttpClient client(loopbackOpened(), server.caFile());
  for (const char* method : {"GET", "HEAD", "OPTIONS"}) {
    INFO(method);
    HttpRequest request = requestFor(server.url("/echo"), method);
    request.body = "data";
    requireError(runFetch(client, std::move(request)), FetchErrc::invalidHeader);
    CHECK(checkRequest(requestFor(server.url("/echo"), method), {}).has_value());
  }
  CHECK(server.connectionsAccepted() == 0);
}

TEST_CASE("fetch: request size limits") {
  HttpsTestServer server;
  HttpClient client(loopbackOpened(), server.caFile());
  const FetchLimits limits{.maxRequestBodyBytes = 10};

  HttpRequest atLimit = requestFor(server.url("/echo"), "POST");
  atLimit.body = std::string(10, 'a');
  CHECK(checkRequest(atLimit, limits).has_value());

  HttpRequest over = requestFor(server.url("/echo"), "POST");
  over.body = std::string(11, 'a');
  requireError(runFetch(client, over, limits), FetchErrc::requestTooLarge);

  HttpRequest manyHeaders = requestFor(server.url("/echo"));
  for (int i = 0; i < 101; ++i) manyHeaders.headers.emplace_back("X-H" + std::to_string(i), "v");
  requireError(runFetch(client, manyHeaders), FetchErrc::requestTooLarge);

  HttpRequest hugeHeader = requestFor(server.url("/echo"));
  hugeHeader.headers.emplace_back("X-Huge", std::string(70 * 1024, 'h'));
  requireError(runFetch(client, hugeHeader), FetchErrc::requestTooLarge);

  CHECK(server.connectionsAccepted() == 0);
}

TEST_CASE("fetch: DNS rebinding cannot move the pinned connection") {
  HttpsTestServer server;
  // The first lookup answers the opened loopback address; every later one the metadata address.
  auto resolver = std::make_shared<ScriptedResolver>(
      std::vector{answers({"127.0.0.1"}), answers({"169.254.169.254"})});
  HttpClient client(loopbackOpened(), server.caFile(), resolver);

  // One lookup per fetch, and the connection goes to the address that lookup checked: a client
  // that resolved again to connect would have met 169.254.169.254.
  const HttpResponse& first =
      requireResponse(runFetch(client, requestFor(server.urlForName("/ok"))));
  CHECK(first.remoteAddress == "127.0.0.1");
  CHECK(resolver->hosts.size() == 1);
  CHECK(server.requestCount("/ok") == 1);

  // The next fetch looks up again and meets the rebound answer: refused, nothing sent.
  const FetchResult second = runFetch(client, requestFor(server.urlForName("/ok")));
  requireError(second, FetchErrc::destinationBlocked);
  CHECK_THAT(second.error().message, Catch::Contains("169.254.169.254"));
  CHECK(resolver->hosts.size() == 2);
  CHECK(server.connectionsAccepted() == 1);
  CHECK(server.requestCount("/ok") == 1);
}

TEST_CASE("fetch: a lookup with any blocked answer is refused, naming it") {
  HttpsTestServer server;
  const std::vector<std::pair<ResolveResult, std::string>> cases = {
      {answers({"127.0.0.1", "10.0.0.1"}), "10.0.0.1"},
      {answers({"::ffff:169.254.169.254"}), "169.254.169.254"},
      {answers({"127.0.0.2"}), "127.0.0.2"},  // loopback, but not the opened /32
      {answers({"::1"}), "::1"},
      {answers({"0.0.0.0"}), "0.0.0.0"},
  };
  for (const auto& [answer, named] : cases) {
    INFO(named);
    auto resolver = std::make_shared<ScriptedResolver>(std::vector{answer});
    HttpClient client(loopbackOpened(), server.caFile(), resolver);
    const FetchResult result = runFetch(client, requestFor(server.urlForName("/ok")));
    requireError(result, FetchErrc::destinationBlocked);
    CHECK_THAT(result.error().message, Catch::Contains(named));
    CHECK_THAT(result.error().message, Catch::Contains(std::string(kName)));
  }
  CHECK(server.connectionsAccepted() == 0);
}

TEST_CASE("fetch: a literal the client's rules block is refused again") {
  HttpsTestServer server;
  HttpClient client(AddressRules{}, server.caFile());  // nothing opened
  const FetchResult result = runFetch(client, requestFor(server.url("/ok")));
  requireError(result, FetchErrc::destinationBlocked);
  CHECK_THAT(result.error().message, Catch::Contains("allow_private"));
  CHECK(server.connectionsAccepted() == 0);
}

TEST_CASE("fetch: DNS and connection failures") {
  SECTION("the resolver fails") {
    auto resolver = std::make_shared<ScriptedResolver>(std::vector<ResolveResult>{
        FetchError{FetchErrc::dnsFailed, "Could not resolve nowhere.example: not found."}});
    HttpClient client(loopbackOpened(), std::nullopt, resolver);
    requireError(runFetch(client, requestFor("https://nowhere.example/")), FetchErrc::dnsFailed);
  }
  SECTION("the name has no address") {
    auto resolver = std::make_shared<ScriptedResolver>(std::vector{answers({})});
    HttpClient client(loopbackOpened(), std::nullopt, resolver);
    requireError(runFetch(client, requestFor("https://nowhere.example/")), FetchErrc::dnsFailed);
  }
  SECTION("nothing listening") {
    std::uint16_t port = 0;
    {
      asio::io_context ioc;
      asio::ip::tcp::acceptor probe(
          ioc, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
      port = probe.local_endpoint().port();
    }
    HttpClient client(loopbackOpened(), std::nullopt);
    const FetchResult result =
        runFetch(client, requestFor("https://127.0.0.1:" + std::to_string(port) + "/"));
    requireError(result, FetchErrc::connectFailed);
    CHECK_THAT(result.error().message, Catch::Contains("127.0.0.1"));
  }
}

TEST_CASE("fetch: cancelling the call aborts the request promptly") {
  HttpsTestServer server;
  asio::io_context ioc;
  asio::cancellation_signal signal;
  std::optional<FetchResult> out;
  auto collect = asio::bind_cancellation_slot(signal.slot(),
                                              [&](std::exception_ptr failure, FetchResult result) {
                                                if (failure) std::rethrow_exception(failure);
                                                out.emplace(std::move(result));
                                              });
  const FetchLimits limits{.timeout = 10s};
  const auto start = Clock::now();

  SECTION("mid-request: the server sees the connection close") {
    HttpClient client(loopbackOpened(), server.caFile());
    asio::co_spawn(ioc, client.fetch(requestFor(server.url("/hang")), limits), collect);
    asio::co_spawn(ioc, cancelOnceServed(&server, "/hang", &signal), rethrow);
    ioc.run();
    REQUIRE(out);
    requireError(*out, FetchErrc::cancelled);
    CHECK(server.waitForConnectionsClosed(1, 2s));
  }
  SECTION("during the lookup") {
    auto resolver = std::make_shared<ScriptedResolver>(std::vector<ResolveResult>{});
    HttpClient client(loopbackOpened(), server.caFile(), resolver);
    asio::co_spawn(ioc, client.fetch(requestFor(server.urlForName("/ok")), limits), collect);
    asio::co_spawn(ioc, cancelAfter(50ms, &signal), rethrow);
    ioc.run();
    REQUIRE(out);
    requireError(*out, FetchErrc::cancelled);
    CHECK(server.connectionsAccepted() == 0);
  }
  CHECK(Clock::now() - start < 2s);
}

TEST_CASE("SystemResolver: answers come from the system resolver, /etc/hosts included") {
  asio::io_context ioc;
  std::optional<ResolveResult> out;
  SystemResolver resolver;
  asio::co_spawn(ioc, resolver.resolve("localhost", 443),
                 [&](std::exception_ptr failure, ResolveResult result) {
                   if (failure) std::rethrow_exception(failure);
                   out.emplace(std::move(result));
                 });
  ioc.run();
  REQUIRE(out);
  REQUIRE(out->has_value());
  REQUIRE_FALSE((*out)->empty());
  for (const auto& address : **out) CHECK(address.is_loopback());
}

TEST_CASE("HttpClient: an unusable extra_ca_file is refused, naming it") {
  const std::filesystem::path missing = "/nonexistent/toolhost-ca.pem";
  CHECK_THROWS_WITH(HttpClient(AddressRules{}, missing), Catch::Contains(missing.string()));

  HttpsTestServer server;  // for a temp dir that is cleaned up
  const std::filesystem::path garbage = server.caFile().parent_path() / "garbage.pem";
  std::ofstream(garbage) << "not a certificate\n";
  CHECK_THROWS_WITH(HttpClient(AddressRules{}, garbage), Catch::Contains("extra_ca_file"));
}

TEST_CASE("checkRequest: a Destination parseDestination would not make is invalid-url") {
  HttpRequest request = requestFor("https://example.com/");
  CHECK(checkRequest(request, {}).has_value());

  SECTION("a request target with a line break") {
    request.destination.pathAndQuery = "/x HTTP/1.1\r\nX-Injected: 1\r\n\r\n";
  }
  SECTION("a target that is not a path") { request.destination.pathAndQuery = "http://other/"; }
  SECTION("a host with a space") { request.destination.host = "example.com evil"; }
  SECTION("a literal that is not the host") {
    request.destination.literal = asio::ip::make_address("127.0.0.1");
  }
  SECTION("another scheme") { request.destination.scheme = "http"; }
  const auto checked = checkRequest(request, {});
  REQUIRE_FALSE(checked.has_value());
  CHECK(errorCode(checked.error().code) == "invalid-url");
}

TEST_CASE("checkRequest: an internal name is destination-blocked") {
  HttpRequest request = requestFor("https://example.com/");
  request.destination.host = "localhost";
  const auto checked = checkRequest(request, {});
  REQUIRE_FALSE(checked.has_value());
  CHECK(errorCode(checked.error().code) == "destination-blocked");
}

TEST_CASE("FetchErrc: the codes a tool sees") {
  CHECK(errorCode(FetchErrc::invalidUrl) == "invalid-url");
  CHECK(errorCode(FetchErrc::invalidHeader) == "invalid-header");
  CHECK(errorCode(FetchErrc::requestTooLarge) == "request-too-large");
  CHECK(errorCode(FetchErrc::destinationBlocked) == "destination-blocked");
  CHECK(errorCode(FetchErrc::dnsFailed) == "dns-failed");
  CHECK(errorCode(FetchErrc::connectFailed) == "connect-failed");
  CHECK(errorCode(FetchErrc::tlsFailed) == "tls-failed");
  CHECK(errorCode(FetchErrc::timeout) == "timeout");
  CHECK(errorCode(FetchErrc::responseTooLarge) == "response-too-large");
  CHECK(errorCode(FetchErrc::cancelled) == "cancelled");
}
