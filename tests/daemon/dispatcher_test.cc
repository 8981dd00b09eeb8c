#include "daemon/dispatcher.h"
#include "daemon/errors.h"
#include "protocol/json_text.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/json/parse.hpp>
#include <catch2/catch.hpp>

#include <stdexcept>

using namespace toolhost;
using namespace toolhost::daemon;
namespace asio = boost::asio;
namespace json = boost::json;

namespace {

MethodTable makeTable() {
  MethodTable table;
  table.add(MethodSpec{"open.echo", "echo", {},
                       json::parse(R"({"type":"object","properties":{"n":{"type":"integer"}},
                                       "required":["n"],"additionalProperties":false})"),
                       {},
                       [](CallContext&, json::object params) -> asio::awaitable<MethodResult> {
                         co_return json::value(params.at("n"));
                       }});
  table.add(MethodSpec{"admin.only", "admin", RoleSet{Role::admin}, {}, {},
                       [](CallContext&, json::object) -> asio::awaitable<MethodResult> {
                         co_return json::value("secret");
                       }});
  table.add(MethodSpec{"agent.or.approver", "two roles", RoleSet{Role::agent, Role::approver}, {},
                       {},
                       [](CallContext&, json::object) -> asio::awaitable<MethodResult> {
                         co_return json::value(true);
                       }});
  table.add(MethodSpec{"buggy", "throws", {}, {}, {},
                       [](CallContext&, json::object) -> asio::awaitable<MethodResult> {
                         throw std::runtime_error("boom with details");
                         co_return json::value(nullptr);
                       }});
  return table;
}

std::optional<json::value> serve(Dispatcher& dispatcher, RoleSet roles, const char* requestText) {
  asio::io_context io;
  CallContext context;
  context.roles = roles;
  context.requestId = "1";
  auto decoded = protocol::decodeMessage(requestText, protocol::WireLimits{});
  REQUIRE(decoded.has_value());
  auto request = std::get<protocol::Request>(decoded->entries.front());
  auto future = asio::co_spawn(io, dispatcher.serve(context, request), asio::use_future);
  io.run();
  return future.get();
}

std::int64_t errorCode(const std::optional<json::value>& response) {
  REQUIRE(response.has_value());
  REQUIRE(response->as_object().contains("error"));
  return response->at("error").at("code").as_int64();
}

}  // namespace

TEST_CASE("methods run only for the roles they name, admin runs everything", "[dispatcher]") {
  auto table = makeTable();
  Dispatcher dispatcher(table);
  const char* adminCall = R"({"jsonrpc":"2.0","method":"admin.only","id":1})";
  CHECK(serve(dispatcher, RoleSet{Role::admin}, adminCall)->at("result") == "secret");
  auto refused = serve(dispatcher, RoleSet{Role::agent}, adminCall);
  CHECK(errorCode(refused) == app_error::kUnauthorized);
  std::string detail(refused->at("error").at("data").at("detail").as_string());
  CHECK_THAT(detail, Catch::Contains("admin") && Catch::Contains("agent"));

  const char* shared = R"({"jsonrpc":"2.0","method":"agent.or.approver","id":1})";
  CHECK(serve(dispatcher, RoleSet{Role::approver}, shared)->at("result") == true);
  CHECK(serve(dispatcher, RoleSet{Role::admin}, shared)->at("result") == true);
  CHECK(errorCode(serve(dispatcher, RoleSet{Role::host}, shared)) == app_error::kUnauthorized);
}

TEST_CASE("params are validated against the method's schema", "[dispatcher]") {
  auto table = makeTable();
  Dispatcher dispatcher(table);
  RoleSet any{Role::agent};
  CHECK(serve(dispatcher, any, R"({"jsonrpc":"2.0","method":"open.echo","params":{"n":5},"id":1})")
            ->at("result") == 5);
  auto wrongType =
      serve(dispatcher, any, R"({"jsonrpc":"2.0","method":"open.echo","params":{"n":"5"},"id":1})");
  CHECK(errorCode(wrongType) == protocol::rpc_error::kInvalidParams);
  CHECK_THAT(std::string(wrongType->at("error").at("data").at("detail").as_string()),
             Catch::Contains("params/n"));
  CHECK(errorCode(serve(dispatcher, any, R"({"jsonrpc":"2.0","method":"open.echo","id":1})")) ==
        protocol::rpc_error::kInvalidParams);
  CHECK(errorCode(serve(dispatcher, any,
                        R"({"jsonrpc":"2.0","method":"open.echo","params":{"n":1,"m":2},"id":1})")) ==
        protocol::rpc_error::kInvalidParams);
}

TEST_CASE("a throwing method is an internal error without its details", "[dispatcher]") {
  auto table = makeTable();
  Dispatcher dispatcher(table);
  auto response = serve(dispatcher, RoleSet{Role::agent}, R"({"jsonrpc":"2.0","method":"buggy","id":1})");
  CHECK(errorCode(response) == protocol::rpc_error::kInternalError);
  CHECK(protocol::writeJson(*response).find("boom") == std::string::npos);
}

TEST_CASE("notifications produce no response", "[dispatcher]") {
  auto table = makeTable();
  Dispatcher dispatcher(table);
  CHECK_FALSE(serve(dispatcher, RoleSet{Role::agent}, R"({"jsonrpc":"2.0","method":"buggy"})"));
  CHECK_FALSE(serve(dispatcher, RoleSet{Role::agent}, R"({"jsonrpc":"2.0","method":"nope"})"));
}

TEST_CASE("the OpenRPC document lists methods with params and roles", "[dispatcher]") {
  auto table = makeTable();
  auto document = table.openRpcDocument("1.2.3");
  CHECK(document.at("info").at("version") == "1.2.3");
  bool sawEcho = false;
  bool sawAdminOnly = false;
  for (const auto& method : document.at("methods").as_array()) {
    if (method.at("name") == "open.echo") {
      sawEcho = true;
      auto& params = method.at("params").as_array();
      REQUIRE(params.size() == 1);
      CHECK(params[0].at("name") == "n");
      CHECK(params[0].at("required") == true);
    }
    if (method.at("name") == "admin.only") {
      sawAdminOnly = true;
      CHECK(method.at("x-roles") == json::array{"admin"});
    }
  }
  CHECK(sawEcho);
  CHECK(sawAdminOnly);
}

TEST_CASE("a log budget allows a burst then a rate and counts what it held back", "[logging]") {
  using toolhost::daemon::LogBudget;
  LogBudget budget(10, 5);
  const auto start = LogBudget::Clock::now();
  std::string note;
  for (int i = 0; i < 5; ++i) CHECK(budget.allow(note, start));
  CHECK(note.empty());
  CHECK_FALSE(budget.allow(note, start));
  CHECK_FALSE(budget.allow(note, start));
  // A tenth of a second later, one more line, which says how many were not written.
  CHECK(budget.allow(note, start + std::chrono::milliseconds(100)));
  CHECK(note == " (2 similar line(s) before this one were not logged)");
  CHECK_FALSE(budget.allow(note, start + std::chrono::milliseconds(100)));
  // The burst refills, never beyond it.
  const auto later = start + std::chrono::seconds(60);
  for (int i = 0; i < 5; ++i) CHECK(budget.allow(note, later));
  CHECK_FALSE(budget.allow(note, later));
}

TEST_CASE("client text in a log line is cut at a character boundary", "[logging]") {
  using toolhost::daemon::logText;
  CHECK(logText("short", 10) == "short");
  CHECK(logText(std::string(300, 'a'), 200) == std::string(200, 'a') + "...(300 bytes)");
  // "é" is two bytes: a cut inside it goes back to its start.
  const std::string accents = "ab\xC3\xA9\xC3\xA9";
  CHECK(logText(accents, 3) == "ab...(6 bytes)");
  CHECK(logText(accents, 4) == "ab\xC3\xA9...(6 bytes)");
}
