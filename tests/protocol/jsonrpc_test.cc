#include "protocol/jsonrpc.h"

#include <boost/json/parse.hpp>
#include <catch2/catch.hpp>

using namespace toolhost::protocol;
namespace json = boost::json;

namespace {

const Request& requestOf(const Entry& entry) {
  REQUIRE(std::holds_alternative<Request>(entry));
  return std::get<Request>(entry);
}

const InvalidEntry& invalidOf(const Entry& entry) {
  REQUIRE(std::holds_alternative<InvalidEntry>(entry));
  return std::get<InvalidEntry>(entry);
}

Entry decodeOne(std::string_view text) {
  auto incoming = decodeMessage(text, WireLimits{});
  REQUIRE(incoming.has_value());
  REQUIRE_FALSE(incoming->batch);
  REQUIRE(incoming->entries.size() == 1);
  return incoming->entries.front();
}

}  // namespace

TEST_CASE("a request and a notification", "[jsonrpc]") {
  auto request = requestOf(decodeOne(R"({"jsonrpc":"2.0","method":"m","params":{"a":1},"id":3})"));
  CHECK(request.method == "m");
  CHECK(request.id == json::value(3));
  CHECK(request.params.at("a") == 1);
  CHECK_FALSE(request.isNotification());

  auto notification = requestOf(decodeOne(R"({"jsonrpc":"2.0","method":"m"})"));
  CHECK(notification.isNotification());
  CHECK(notification.params.is_null());

  auto nullId = requestOf(decodeOne(R"({"jsonrpc":"2.0","method":"m","id":null})"));
  CHECK_FALSE(nullId.isNotification());
  CHECK(nullId.id->is_null());
}

TEST_CASE("invalid request objects", "[jsonrpc]") {
  CHECK(invalidOf(decodeOne("1")).id.is_null());
  CHECK(invalidOf(decodeOne(R"("x")")).error.code == rpc_error::kInvalidRequest);
  CHECK(invalidOf(decodeOne(R"({"jsonrpc":"2.0","method":"m","id":{}})")).id.is_null());
  CHECK(invalidOf(decodeOne(R"({"jsonrpc":"2.0","method":"m","id":true})")).id.is_null());
  CHECK(invalidOf(decodeOne(R"({"jsonrpc":"2.0","method":"m","id":[]})")).id.is_null());
  auto badVersion = invalidOf(decodeOne(R"({"jsonrpc":"1.0","method":"m","id":"k"})"));
  CHECK(badVersion.id == "k");
  CHECK(badVersion.error.detail.find("2.0") != std::string::npos);
  CHECK(invalidOf(decodeOne(R"({"jsonrpc":2.0,"method":"m","id":1})")).id == 1);
  CHECK(invalidOf(decodeOne(R"({"method":"m","id":1})")).error.code == rpc_error::kInvalidRequest);
  CHECK(invalidOf(decodeOne(R"({"jsonrpc":"2.0","id":1})")).error.detail.find("method") !=
        std::string::npos);
  CHECK(invalidOf(decodeOne(R"({"jsonrpc":"2.0","method":7,"id":1})")).id == 1);
  CHECK(invalidOf(decodeOne(R"({"jsonrpc":"2.0","method":"m","params":3,"id":1})")).id == 1);
  CHECK(invalidOf(decodeOne(R"({"jsonrpc":"2.0","method":"m","params":null,"id":1})")).id == 1);
}

TEST_CASE("parse errors and whole-message refusals", "[jsonrpc]") {
  auto parse = decodeMessage(R"({"jsonrpc":"2.0",)", WireLimits{});
  REQUIRE_FALSE(parse.has_value());
  CHECK(parse.error().code == rpc_error::kParseError);

  auto empty = decodeMessage("[]", WireLimits{});
  REQUIRE_FALSE(empty.has_value());
  CHECK(empty.error().code == rpc_error::kInvalidRequest);

  WireLimits small;
  small.maxBatch = 2;
  small.maxDepth = 4;
  auto big = decodeMessage("[1,2,3]", small);
  REQUIRE_FALSE(big.has_value());
  CHECK(big.error().kind == "limit-exceeded");
  auto deep = decodeMessage("[[[[[1]]]]]", small);
  REQUIRE_FALSE(deep.has_value());
  CHECK(deep.error().kind == "limit-exceeded");
  CHECK(decodeMessage("[[[[1]]]]", small).has_value());
}

TEST_CASE("batches keep each entry's verdict", "[jsonrpc]") {
  auto incoming = decodeMessage(
      R"([{"jsonrpc":"2.0","method":"a","id":1},2,{"jsonrpc":"2.0","method":"b"}])", WireLimits{});
  REQUIRE(incoming.has_value());
  CHECK(incoming->batch);
  REQUIRE(incoming->entries.size() == 3);
  CHECK(requestOf(incoming->entries[0]).method == "a");
  CHECK(invalidOf(incoming->entries[1]).id.is_null());
  CHECK(requestOf(incoming->entries[2]).isNotification());
}

TEST_CASE("responses are encoded as the specification shapes them", "[jsonrpc]") {
  CHECK(encodeLine(resultResponse(1, json::object{{"x", 1}})) ==
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"x\":1}}\n");
  auto error = makeError(rpc_error::kMethodNotFound, "method-not-found", "no such method");
  CHECK(encodeLine(errorResponse(nullptr, error)) ==
        "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32601,\"message\":\"Method not "
        "found\",\"data\":{\"kind\":\"method-not-found\",\"detail\":\"no such method\"}}}\n");
  CHECK(encodeLine(notification("policy.prompt", json::object{{"a", 1}})) ==
        "{\"jsonrpc\":\"2.0\",\"method\":\"policy.prompt\",\"params\":{\"a\":1}}\n");
}

TEST_CASE("an answer carries its request's integer id exactly however large", "[jsonrpc]") {
  for (const char* id : {"9007199254740993", "-9007199254740995", "1234567890123456789",
                         "18446744073709551615", "9007199254740991"}) {
    INFO(id);
    auto incoming = decodeMessage(R"({"jsonrpc":"2.0","method":"m","id":)" + std::string(id) + "}",
                                  WireLimits{});
    REQUIRE(incoming.has_value());
    const auto& request = std::get<Request>(incoming->entries.front());
    REQUIRE(request.id);
    const std::string expected = "{\"jsonrpc\":\"2.0\",\"id\":" + std::string(id) +
                                 ",\"result\":{\"big\":9007199254740992}}\n";
    // The result's numbers are still written as JavaScript reads them; only the id is exact.
    CHECK(encodeLine(resultResponse(*request.id, json::object{{"big", 9007199254740993LL}})) ==
          expected);
    CHECK(encodeLine(json::value(json::array{
              resultResponse(*request.id, json::object{{"big", 9007199254740993LL}})})) ==
          "[" + expected.substr(0, expected.size() - 1) + "]\n");
  }
}
