// JSON-RPC 2.0 over the real daemon's socket: the specification's rules and examples (with our
// methods in place of its "subtract"), and hostile input.
#include "tests/support/daemon_process.h"

#include "protocol/jsonrpc.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstring>
#include <set>
#include <thread>

#include "protocol/json_parse.h"
#include "protocol/json_text.h"

using namespace toolhost::testing;
namespace json = boost::json;

namespace {

const json::object& errorOf(const json::value& response) {
  REQUIRE(response.is_object());
  REQUIRE(response.as_object().contains("error"));
  return response.as_object().at("error").as_object();
}

std::int64_t codeOf(const json::value& response) { return errorOf(response).at("code").as_int64(); }

}  // namespace

TEST_CASE("a request with named params is answered under its id", "[e2e][jsonrpc]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  client.send(R"({"jsonrpc":"2.0","method":"ping","params":{},"id":"abc"})" "\n");
  auto response = client.readJson().as_object();
  CHECK(response.at("jsonrpc") == "2.0");
  CHECK(response.at("id") == "abc");
  CHECK(response.at("result").at("pong") == true);
  CHECK_FALSE(response.contains("error"));

  client.send(R"({"jsonrpc":"2.0","method":"ping","id":42})" "\n");
  CHECK(client.readJson().at("id") == 42);
  client.send(R"({"jsonrpc":"2.0","method":"ping","id":1.5})" "\n");
  CHECK(client.readJson().at("id") == 1.5);
  client.send(R"({"jsonrpc":"2.0","method":"ping","id":null})" "\n");
  auto nullId = client.readJson().as_object();
  CHECK(nullId.at("id").is_null());
  CHECK(nullId.contains("result"));
  // Integers past 64 bits could not come back exactly as sent: refused, not answered under
  // another id.
  for (const char* id : {"18446744073709551616", "-9223372036854775810000", "1e30"}) {
    client.send(std::string(R"({"jsonrpc":"2.0","method":"ping","id":)") + id + "}\n");
    auto refused = client.readJson().as_object();
    INFO(id);
    CHECK(refused.at("id").is_null());
    CHECK(refused.at("error").at("code") == -32600);
  }
  client.send(R"({"jsonrpc":"2.0","method":"ping","id":18446744073709551615})"
              "\n");
  CHECK(client.readJson().at("id") == std::uint64_t{18446744073709551615u});
  // A request with a null id can be cancelled by it.
  client.send(R"({"jsonrpc":"2.0","method":"ping","params":{"delayMs":30000},"id":null})"
              "\n");
  client.send(R"({"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":null},"id":"c"})"
              "\n");
  bool cancelled = false, answered = false;
  for (int i = 0; i < 2; ++i) {
    auto answer = client.readJson().as_object();
    if (answer.at("id") == "c") {
      answered = answer.at("result").at("cancelled") == true;
    } else {
      CHECK(answer.at("id").is_null());
      cancelled = answer.at("error").at("code") == -32009;
    }
  }
  CHECK(answered);
  CHECK(cancelled);
}

TEST_CASE("an answer's bytes are given back once it is written", "[e2e][jsonrpc]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  const std::string id(1'000'000, 'i');
  client.send(R"({"jsonrpc":"2.0","method":"ping","id":")" + id + "\"}\n");
  CHECK(client.readJson().at("id").as_string().size() == id.size());
  // Read by the client: no longer held against the daemon's budget of unread answers.
  auto info = client.call("daemon.info");
  REQUIRE(info.contains("result"));
  CHECK(info.at("result").at("answerBytesHeld").to_number<std::uint64_t>() < 65536);
}

TEST_CASE("notifications are never answered", "[e2e][jsonrpc]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  client.send(R"({"jsonrpc":"2.0","method":"ping"})" "\n");
  client.send(R"({"jsonrpc":"2.0","method":"no.such.method"})" "\n");
  client.send(R"({"jsonrpc":"2.0","method":"ping","params":{"delayMs":"x"}})" "\n");
  client.send(R"({"jsonrpc":"2.0","method":"ping","id":7})" "\n");
  // The only answer is the request's.
  CHECK(client.readJson().at("id") == 7);
  CHECK_FALSE(client.readLine(std::chrono::milliseconds(200)).has_value());
}

TEST_CASE("the standard error codes", "[e2e][jsonrpc]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());

  SECTION("method not found") {
    client.send(R"({"jsonrpc":"2.0","method":"foobar","id":"1"})" "\n");
    auto response = client.readJson();
    CHECK(codeOf(response) == -32601);
    CHECK(response.at("id") == "1");
    CHECK(errorOf(response).at("message") == "Method not found");
  }
  SECTION("invalid JSON is a parse error with id null") {
    client.send(R"({"jsonrpc":"2.0","method":"foobar,"params":"bar","baz])" "\n");
    auto response = client.readJson();
    CHECK(codeOf(response) == -32700);
    CHECK(response.at("id").is_null());
  }
  SECTION("invalid request object") {
    client.send(R"({"jsonrpc":"2.0","method":1,"params":"bar"})" "\n");
    auto response = client.readJson();
    CHECK(codeOf(response) == -32600);
    CHECK(response.at("id").is_null());
  }
  SECTION("invalid params name the field") {
    client.send(R"({"jsonrpc":"2.0","method":"ping","params":{"delayMs":-5},"id":3})" "\n");
    auto response = client.readJson();
    CHECK(codeOf(response) == -32602);
    std::string detail(errorOf(response).at("data").at("detail").as_string());
    CHECK_THAT(detail, Catch::Contains("delayMs"));
    client.send(R"({"jsonrpc":"2.0","method":"ping","params":{"bogus":1},"id":4})" "\n");
    CHECK(codeOf(client.readJson()) == -32602);
    client.send(R"({"jsonrpc":"2.0","method":"ping","params":[1],"id":5})" "\n");
    CHECK(codeOf(client.readJson()) == -32602);
  }
  // The connection survives every one of these.
  CHECK(client.call("ping").contains("result"));
}

TEST_CASE("id and jsonrpc member rules", "[e2e][jsonrpc]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  for (const char* badId : {R"({"a":1})", "[1]", "true", "false"}) {
    client.send(std::string(R"({"jsonrpc":"2.0","method":"ping","id":)") + badId + "}\n");
    auto response = client.readJson();
    CHECK(codeOf(response) == -32600);
    CHECK(response.at("id").is_null());
  }
  for (const char* version : {R"("2.00")", "2.0", R"("1.0")", "null", R"(" 2.0")"}) {
    client.send(std::string(R"({"jsonrpc":)") + version + R"(,"method":"ping","id":9})" "\n");
    auto response = client.readJson();
    CHECK(codeOf(response) == -32600);
    CHECK(response.at("id") == 9);  // the id was valid, so the error carries it
  }
  client.send(R"({"method":"ping","id":10})" "\n");
  CHECK(codeOf(client.readJson()) == -32600);
  client.send(R"({"jsonrpc":"2.0","method":"ping","params":"x","id":11})" "\n");
  CHECK(codeOf(client.readJson()) == -32600);
  client.send("[1,2]\n");
  auto batch = client.readJson().as_array();
  CHECK(batch.size() == 2);
}

TEST_CASE("batches as the specification shows them", "[e2e][jsonrpc]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());

  SECTION("batch with invalid JSON") {
    client.send(R"([{"jsonrpc":"2.0","method":"ping","params":{},"id":"1"},{"jsonrpc":"2.0","method")" "\n");
    auto response = client.readJson();
    CHECK(response.is_object());
    CHECK(codeOf(response) == -32700);
  }
  SECTION("empty batch") {
    client.send("[]\n");
    auto response = client.readJson();
    CHECK(response.is_object());
    CHECK(codeOf(response) == -32600);
    CHECK(response.at("id").is_null());
  }
  SECTION("invalid batch of one") {
    client.send("[1]\n");
    auto response = client.readJson();
    REQUIRE(response.is_array());
    REQUIRE(response.as_array().size() == 1);
    CHECK(codeOf(response.as_array()[0]) == -32600);
  }
  SECTION("invalid batch of three") {
    client.send("[1,2,3]\n");
    auto response = client.readJson().as_array();
    REQUIRE(response.size() == 3);
    for (const auto& entry : response) {
      CHECK(codeOf(entry) == -32600);
      CHECK(entry.at("id").is_null());
    }
  }
  SECTION("mixed batch") {
    client.send(
        R"([{"jsonrpc":"2.0","method":"ping","params":{},"id":"1"},)"
        R"({"jsonrpc":"2.0","method":"ping","params":{}},)"
        R"({"jsonrpc":"2.0","method":"ping","params":{"delayMs":20},"id":"2"},)"
        R"({"foo":"boo"},)"
        R"({"jsonrpc":"2.0","method":"foo.get","params":{"name":"myself"},"id":"5"},)"
        R"({"jsonrpc":"2.0","method":"daemon.info","id":"9"}])" "\n");
    std::string line = *client.readLine();
    auto parsed = toolhost::protocol::parseJson(line);
    REQUIRE(parsed.has_value());
    auto& responses = parsed->as_array();
    REQUIRE(responses.size() == 5);
    std::map<std::string, json::value> byId;
    int nullIds = 0;
    for (const auto& entry : responses) {
      if (entry.at("id").is_null()) {
        ++nullIds;
        CHECK(codeOf(entry) == -32600);
      } else {
        byId[std::string(entry.at("id").as_string())] = entry;
      }
    }
    CHECK(nullIds == 1);
    CHECK(byId.at("1").as_object().contains("result"));
    CHECK(byId.at("2").as_object().contains("result"));
    CHECK(codeOf(byId.at("5")) == -32601);
    CHECK(byId.at("9").at("result").at("name") == "toolhost");
  }
  SECTION("a batch whose entries all finish at once is answered once") {
    for (const char* batch :
         {R"([{"jsonrpc":"2.0","method":"ping","id":1}])",
          R"([{"jsonrpc":"2.0","method":"ping","id":1},{"jsonrpc":"2.0","method":"nope","id":2}])",
          R"([{"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":7},"id":3}])"}) {
      INFO(batch);
      client.send(std::string(batch) + "\n");
      auto answer = client.readJson();
      REQUIRE(answer.is_array());
      for (const auto& entry : answer.as_array()) CHECK(entry.as_object().contains("id"));
      // The next line answers the next request, not the batch again.
      client.send(R"({"jsonrpc":"2.0","method":"ping","id":"next"})"
                  "\n");
      auto next = client.readJson();
      REQUIRE(next.is_object());
      CHECK(next.at("id") == "next");
    }
  }
  SECTION("a batch of notifications gets nothing back") {
    client.send(R"([{"jsonrpc":"2.0","method":"ping"},{"jsonrpc":"2.0","method":"ping","params":{}}])" "\n");
    CHECK_FALSE(client.readLine(std::chrono::milliseconds(300)).has_value());
    CHECK(client.call("ping").contains("result"));
  }
}

TEST_CASE("responses complete out of order, a slow method blocks nobody", "[e2e][jsonrpc]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  client.send(R"({"jsonrpc":"2.0","method":"ping","params":{"delayMs":1500},"id":"slow"})" "\n");
  client.send(R"({"jsonrpc":"2.0","method":"ping","id":"fast"})" "\n");
  CHECK(client.readJson(std::chrono::milliseconds(1000)).at("id") == "fast");

  // Another connection is served while the slow request is pending.
  RawClient other(daemon->socket());
  CHECK(other.call("ping").contains("result"));
  CHECK(client.readJson().at("id") == "slow");
}

TEST_CASE("hundreds of pipelined requests are all answered", "[e2e][jsonrpc]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  std::string burst;
  constexpr int kCount = 500;
  for (int i = 0; i < kCount; ++i) {
    burst += R"({"jsonrpc":"2.0","method":"ping","id":)" + std::to_string(i) + "}\n";
  }
  client.send(burst);
  std::set<std::int64_t> seen;
  for (int i = 0; i < kCount; ++i) {
    auto response = client.readJson();
    CHECK(response.as_object().contains("result"));
    seen.insert(response.at("id").as_int64());
  }
  CHECK(seen.size() == kCount);
  CHECK(*seen.begin() == 0);
  CHECK(*seen.rbegin() == kCount - 1);
}

TEST_CASE("a message over the size limit is answered and the connection closed", "[e2e][limits]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  // 10 MB without a newline: the daemon must not wait for the end of it.
  std::string huge = R"({"jsonrpc":"2.0","method":"ping","params":{"x":")";
  huge.append(10 * 1024 * 1024, 'a');
  try {
    client.send(huge);
  } catch (const std::exception&) {
    // The daemon may close before the whole line is written; that is the point.
  }
  auto response = client.readJson();
  CHECK(codeOf(response) == -32600);
  CHECK(errorOf(response).at("data").at("kind") == "limit-exceeded");
  CHECK(client.closedByPeer());
  // The daemon is fine.
  RawClient other(daemon->socket());
  CHECK(other.call("ping").contains("result"));
}

TEST_CASE("parsing one client's megabytes of JSON does not hold up other connections",
          "[e2e][limits]") {
  auto daemon = DaemonProcess::start();
  RawClient big(daemon->socket());
  // About 1.7 million values on one line (seconds to parse in a debug build).
  std::string line = R"({"jsonrpc":"2.0","id":1,"method":"ping","params":{"values":[0)";
  line.reserve(4 * 1024 * 1024);
  while (line.size() < 3'500'000) line += ",0";
  line += "]}}\n";
  big.send(line);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  RawClient other(daemon->socket());
  const auto pinged = std::chrono::steady_clock::now();
  CHECK(other.call("ping").contains("result"));
  const auto pingTook = std::chrono::steady_clock::now() - pinged;
  auto answer = big.readJson(std::chrono::seconds(120));
  const auto bigTook = std::chrono::steady_clock::now() - pinged;
  INFO("ping " << std::chrono::duration<double>(pingTook).count() << " s, the large line "
               << std::chrono::duration<double>(bigTook).count() << " s");
  CHECK(codeOf(answer) == -32602);  // parsed, then refused: ping takes no such params
  CHECK(pingTook * 4 < bigTook);
}

TEST_CASE("configured limits: message bytes, depth, batch size", "[e2e][limits]") {
  DaemonOptions options;
  options.configToml = "[limits]\nmax_message_bytes = 2048\nmax_depth = 8\nmax_batch = 3\n";
  auto daemon = DaemonProcess::start(options);
  RawClient client(daemon->socket());

  std::string deep = R"({"jsonrpc":"2.0","method":"ping","id":1,"params":{"a":[[[[[[1]]]]]]}})";
  client.send(deep + "\n");  // depth 8: allowed through framing, refused by the params schema
  CHECK(codeOf(client.readJson()) == -32602);
  std::string tooDeep = R"({"jsonrpc":"2.0","method":"ping","id":1,"params":{"a":[[[[[[[1]]]]]]]}})";
  client.send(tooDeep + "\n");
  auto deepResponse = client.readJson();
  CHECK(codeOf(deepResponse) == -32600);
  CHECK(errorOf(deepResponse).at("data").at("kind") == "limit-exceeded");

  std::string batch = "[";
  for (int i = 0; i < 4; ++i) {
    batch += std::string(i ? "," : "") + R"({"jsonrpc":"2.0","method":"ping","id":)" +
             std::to_string(i) + "}";
  }
  client.send(batch + "]\n");
  auto batchResponse = client.readJson();
  REQUIRE(batchResponse.is_object());
  CHECK(errorOf(batchResponse).at("data").at("kind") == "limit-exceeded");

  CHECK(client.call("daemon.info").at("result").at("limits").at("maxBatch") == 3);

  client.send(R"({"jsonrpc":"2.0","method":"ping","params":{"x":")" + std::string(3000, 'b') +
              "\"}}\n");
  CHECK(codeOf(client.readJson()) == -32600);
  CHECK(client.closedByPeer());
}

TEST_CASE("deep nesting is refused without harm", "[e2e][limits]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  std::string deep(100000, '[');
  deep += std::string(100000, ']');
  client.send(deep + "\n");
  auto response = client.readJson();
  CHECK(codeOf(response) == -32600);
  CHECK(client.call("ping").contains("result"));
}

TEST_CASE("invalid UTF-8 and truncated JSON are parse errors", "[e2e][jsonrpc]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  for (std::string bad : {std::string(R"({"jsonrpc":"2.0","method":"ping","id":"\xff"})"),
                          std::string(R"({"jsonrpc":"2.0","method":"pi\xc0\xafng","id":1})"),
                          std::string(R"({"jsonrpc":"2.0","method":"\xed\xa0\x80","id":1})"),
                          std::string(R"({"jsonrpc":"2.0","method":"ping","id":1)"),
                          std::string(R"({"jsonrpc":"2.0",)"),
                          std::string("{\"jsonrpc\":\"2.0\",\"method\":\"ping\",\"id\":1,\"id\":2}")}) {
    client.send(bad + "\n");
    auto response = client.readJson();
    CHECK(codeOf(response) == -32700);
    CHECK(response.at("id").is_null());
  }
  CHECK(client.call("ping").contains("result"));
}

// Waits until daemon.health counts `expected` connections (this one included); false after 5 s.
bool connectionsDropTo(RawClient& probe, std::int64_t expected) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    if (probe.call("daemon.health").at("result").at("connections").as_int64() == expected) {
      return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

TEST_CASE("a client that disconnects mid-request harms nothing", "[e2e][jsonrpc]") {
  auto daemon = DaemonProcess::start();
  {
    RawClient client(daemon->socket());
    client.send(R"({"jsonrpc":"2.0","method":"ping","params":{"delayMs":30000},"id":1})" "\n");
    client.send(R"({"jsonrpc":"2.0","method":"ping","params":{"delay)");  // half a line
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  RawClient other(daemon->socket());
  CHECK(other.call("ping").contains("result"));
  // The abandoned request was cancelled, not left running for 30 s.
  CHECK(connectionsDropTo(other, 1));
  CHECK_THAT(daemon->log(), Catch::Contains("cancel"));
}

TEST_CASE("a client that half-closes still gets its answers", "[e2e][jsonrpc]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  client.send(R"({"jsonrpc":"2.0","method":"ping","params":{"delayMs":200},"id":1})" "\n");
  client.send(R"({"jsonrpc":"2.0","method":"ping","id":2})");  // last line without newline
  client.shutdownWrite();
  std::set<std::int64_t> ids;
  ids.insert(client.readJson().at("id").as_int64());
  ids.insert(client.readJson().at("id").as_int64());
  CHECK(ids == std::set<std::int64_t>{1, 2});
  CHECK(client.closedByPeer());
}

TEST_CASE("a client that hangs up while the daemon reads nothing from it is noticed",
          "[e2e][jsonrpc]") {
  DaemonOptions options;
  options.configToml = "[limits]\nmax_in_flight = 2\n";
  auto daemon = DaemonProcess::start(options);
  RawClient probe(daemon->socket());
  const std::string slow = R"({"jsonrpc":"2.0","method":"ping","params":{"delayMs":30000},"id":1})"
                           "\n";
  SECTION("held back by max_in_flight") {
    RawClient client(daemon->socket());
    client.send(slow + slow + slow + slow);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    client.close();
  }
  SECTION("after its end of input") {
    RawClient client(daemon->socket());
    client.send(slow);
    client.shutdownWrite();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    client.close();
  }
  // Its requests were cancelled and the connection closed, not held for 30 s.
  CHECK(connectionsDropTo(probe, 1));
}

TEST_CASE("requests in flight are bounded per connection", "[e2e][limits]") {
  DaemonOptions options;
  options.configToml = "[limits]\nmax_in_flight = 2\n";
  auto daemon = DaemonProcess::start(options);
  RawClient client(daemon->socket());
  auto started = std::chrono::steady_clock::now();
  std::string burst;
  for (int i = 0; i < 6; ++i) {
    burst += R"({"jsonrpc":"2.0","method":"ping","params":{"delayMs":150},"id":)" +
             std::to_string(i) + "}\n";
  }
  client.send(burst);
  for (int i = 0; i < 6; ++i) CHECK(client.readJson().as_object().contains("result"));
  // Two at a time: at least three rounds of 150 ms (a lower bound, so never flaky).
  CHECK(std::chrono::steady_clock::now() - started >= std::chrono::milliseconds(450));

  // Each entry of a batch counts: batches of two, or one ping then a batch of two, go one
  // after the other too; a batch larger than the limit is served alone.
  started = std::chrono::steady_clock::now();
  const std::string slow = R"({"jsonrpc":"2.0","method":"ping","params":{"delayMs":150},"id":1})";
  client.send("[" + slow + "," + slow + "]\n" + slow + "\n[" + slow + "," + slow + "]\n[" + slow +
              "," + slow + "," + slow + "]\n");
  for (int i = 0; i < 4; ++i) {
    auto answer = toolhost::protocol::writeJson(client.readJson());
    CHECK(answer.find("\"result\"") != std::string::npos);
    CHECK(answer.find("\"error\"") == std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - started >= std::chrono::milliseconds(450));
}

TEST_CASE("cancel notifications get through while max_in_flight holds the rest back",
          "[e2e][limits]") {
  DaemonOptions options;
  options.configToml = "[limits]\nmax_in_flight = 2\n";
  auto daemon = DaemonProcess::start(options);
  RawClient client(daemon->socket());
  auto slow = [](int id) {
    return R"({"jsonrpc":"2.0","method":"ping","params":{"delayMs":60000},"id":)" +
           std::to_string(id) + "}\n";
  };
  auto cancel = [](int id) {
    return R"({"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":)" + std::to_string(id) +
           "}}\n";
  };
  // 1 and 2 run; 3 waits for a slot, so nothing after it is served...
  client.send(slow(1) + slow(2) + slow(3));
  // ...but cancels are: the one waiting, then those running (sent in two writes, the second
  // read while the connection is full).
  client.send(cancel(3));
  auto first = client.readJson(std::chrono::seconds(10));
  CHECK(first.at("id") == 3);
  CHECK(first.at("error").at("code") == -32009);
  CHECK(first.at("error").at("message") == "Cancelled");  // as every -32009 says
  CHECK_THAT(std::string(first.at("error").at("data").at("detail").as_string()),
             Catch::Contains("before it was served"));
  client.send(cancel(1) + cancel(2));
  std::set<std::int64_t> ids;
  for (int i = 0; i < 2; ++i) {
    auto answer = client.readJson(std::chrono::seconds(10));
    CHECK(answer.at("error").at("code") == -32009);
    ids.insert(answer.at("id").as_int64());
  }
  CHECK(ids == std::set<std::int64_t>{1, 2});
  // Then the connection serves as before.
  client.send(R"({"jsonrpc":"2.0","method":"ping","id":4})"
              "\n");
  CHECK(client.readJson().at("id") == 4);

  // Full with nothing held back: the cancel is the next line, and is served.
  client.send(slow(5) + slow(6));
  client.send(cancel(5));
  auto fifth = client.readJson(std::chrono::seconds(10));
  CHECK(fifth.at("id") == 5);
  CHECK(fifth.at("error").at("code") == -32009);
  client.send(cancel(6));
  CHECK(client.readJson(std::chrono::seconds(10)).at("id") == 6);

  // A batch held back: a cancel of its entry waits for it (and is applied once it runs), the
  // cancels after it go ahead.
  const std::string ninth = slow(9);
  client.send(slow(7) + slow(8) + "[" + ninth.substr(0, ninth.size() - 1) + "]\n");
  client.send(cancel(9) + cancel(7) + cancel(8));
  std::set<std::string> answered;
  for (int i = 0; i < 3; ++i) {
    auto answer = client.readJson(std::chrono::seconds(10));
    if (answer.is_array()) {
      REQUIRE(answer.as_array().size() == 1);
      CHECK(answer.as_array()[0].at("id") == 9);
      CHECK(answer.as_array()[0].at("error").at("code") == -32009);
      answered.insert("batch");
    } else {
      CHECK(answer.at("error").at("code") == -32009);
      answered.insert(std::to_string(answer.at("id").as_int64()));
    }
  }
  CHECK(answered == std::set<std::string>{"7", "8", "batch"});
}

TEST_CASE("a client's failing requests cannot flood the daemon's log", "[e2e][jsonrpc]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  const std::size_t before = daemon->log().size();
  // Notifications are never answered: nothing to read, nothing to slow the client down. Each
  // names a method of 100 KB, and malformed lines come between them.
  const std::string method(100 * 1024, 'm');
  std::string burst;
  for (int i = 0; i < 20; ++i) {
    burst += R"({"jsonrpc":"2.0","method":")" + method + "\"}\n";
    burst += "{not json\n";
  }
  for (int round = 0; round < 25; ++round) {  // 1000 bad lines, 50 MB
    client.send(burst);
    for (int i = 0; i < 20; ++i) CHECK(client.readJson().at("error").at("code") == -32700);
  }
  // The request after them is answered: everything before it was read.
  CHECK(client.call("ping").contains("result"));
  const std::string log = daemon->log().substr(before);
  // The first 200 lines or so, each with the method cut to 64 bytes and the error's detail
  // (which names it) to 300; 50 MB of method names were logged twice each before.
  CHECK(log.find("line(s) before this one were not logged") != std::string::npos);
  CHECK(log.size() < 2 * 1024 * 1024);
  CHECK(log.find(std::string(301, 'm')) == std::string::npos);
  CHECK(log.find("(102400 bytes)") != std::string::npos);
  // Lines held back when the connection ends are counted in a line of their own.
  {
    RawClient brief(daemon->socket());
    std::string bad;
    for (int i = 0; i < 400; ++i) bad += "{not json\n";
    brief.send(bad);
    for (int i = 0; i < 400; ++i) CHECK(brief.readJson().at("error").at("code") == -32700);
    // Room in the daemon-wide budget (50 lines a second) for the line its end writes.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  bool counted = false;
  for (int i = 0; i < 200 && !counted; ++i) {
    counted = daemon->log().find("before its end were not logged") != std::string::npos;
    if (!counted) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  CHECK(counted);
}

TEST_CASE("past the daemon's bound on unread answers, clients that do not read get no more",
          "[e2e][jsonrpc]") {
  if (::geteuid() != 0) {
    WARN("needs root to run clients as another uid (admins are exempt from the bound); skipped");
    return;
  }
  DaemonOptions options;
  options.configToml =
      "[limits]\nmax_connections = 512\n[[access]]\nuid = 65534\nroles = [\"agent\"]\n";
  auto daemon = DaemonProcess::start(options);
  ::chmod(daemon->dir().c_str(), 0755);
  ::chmod(daemon->socket().c_str(), 0777);
  RawClient admin(daemon->socket());
  const std::size_t answerBytes = toolhost::protocol::writeJson(admin.call("rpc.discover")).size();

  // Agents that send a batch of 256 rpc.discover (about 6.7 MB of answers) on each of 120
  // connections and never read: every answer is small, and each connection holds one batch at
  // most, but together they held 800 MB.
  constexpr int kConnections = 120;
  constexpr int kBatch = 256;
  std::string batch = "[";
  for (int i = 0; i < kBatch; ++i) {
    batch += (i ? "," : "") + std::string(R"({"jsonrpc":"2.0","method":"rpc.discover","id":)") +
             std::to_string(i) + "}";
  }
  batch += "]\n";
  // Everything the child uses is made before fork(): it must not allocate.
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, daemon->socket().c_str(), sizeof address.sun_path - 1);
  std::vector<int> fds;
  fds.reserve(kConnections);
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t agents = ::fork();
  REQUIRE(agents >= 0);
  if (agents == 0) {
    ::close(ready[0]);
    if (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 ||
        ::setresuid(65534, 65534, 65534) != 0) {
      std::_Exit(3);
    }
    for (int i = 0; i < kConnections; ++i) {
      const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
        std::_Exit(4);
      }
      ::fcntl(fd, F_SETFL, O_NONBLOCK);
      fds.push_back(fd);
    }
    for (int fd : fds) (void)!::send(fd, batch.data(), batch.size(), MSG_NOSIGNAL);
    (void)!::write(ready[1], "x", 1);
    ::pause();
    std::_Exit(0);
  }
  ::close(ready[1]);
  char byte = 0;
  REQUIRE(::read(ready[0], &byte, 1) == 1);
  ::close(ready[0]);

  // Wait until the held total stops growing.
  std::uint64_t held = 0;
  for (int steady = 0, i = 0; steady < 10 && i < 600; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto info = admin.call("daemon.info");
    REQUIRE(info.contains("result"));
    const auto now = info.at("result").at("answerBytesHeld").to_number<std::uint64_t>();
    steady = now == held ? steady + 1 : 0;
    held = now;
  }
  ::kill(agents, SIGKILL);
  ::waitpid(agents, nullptr, 0);
  INFO("held " << held << " bytes; one batch's answers " << answerBytes * kBatch);
  // 512 MiB, overshot at most by 1 MiB and one answer per connection, and the short errors that
  // replaced the rest of its answers.
  CHECK(held > 400u * 1024 * 1024);
  CHECK(held <= 512u * 1024 * 1024 + kConnections * ((1u << 20) + answerBytes + kBatch * 400));
  // A client that reads its answers is still served, small answers and all.
  RawClient agentLike(daemon->socket());
  CHECK(agentLike.call("rpc.discover").contains("result"));
}
