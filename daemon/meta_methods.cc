#include "daemon/meta_methods.h"

#include "daemon/session.h"

#include "protocol/time_text.h"

#include "runtime/v8_platform.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value_from.hpp>
#include <unistd.h>

#include <ctime>

namespace toolhost::daemon {
namespace asio = boost::asio;
namespace json = boost::json;

namespace {

std::int64_t uptimeMs(const DaemonFacts& facts) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               facts.started)
      .count();
}

}  // namespace

void registerMetaMethods(MethodTable& methods, const DaemonFacts& facts) {
  methods.add(MethodSpec{
      "rpc.discover",
      "The OpenRPC document describing every method, its params and the roles it needs.",
      {},
      {},
      schema(R"({"type":"object","required":["openrpc","info","methods"]})"),
      [&methods, &facts](CallContext&, json::object) -> asio::awaitable<MethodResult> {
        co_return json::value(methods.openRpcDocument(facts.version));
      }});

  methods.add(MethodSpec{
      "ping",
      "Answers {pong: true}; with delayMs, after that many milliseconds (cancellable), which "
      "shows whether requests are served concurrently.",
      {},
      schema(R"({"type":"object","additionalProperties":false,"properties":{
          "delayMs":{"type":"integer","minimum":0,"maximum":60000,
                     "description":"answer after this many milliseconds"}}})"),
      schema(R"({"type":"object","properties":{"pong":{"const":true},"time":{"type":"string"}}})"),
      [](CallContext&, json::object params) -> asio::awaitable<MethodResult> {
        if (const auto* delay = params.if_contains("delayMs")) {
          asio::steady_timer timer(co_await asio::this_coro::executor);
          timer.expires_after(std::chrono::milliseconds(delay->to_number<std::int64_t>()));
          co_await timer.async_wait(asio::use_awaitable);  // cancellation throws, answered as such
        }
        co_return json::value(json::object{{"pong", true},
                                           {"time", protocol::formatTime(std::chrono::system_clock::now())}});
      }});

  methods.add(MethodSpec{
      "daemon.info",
      "Version, V8 version, malloc, uptime, the caller's credentials and roles, and the limits in force.",
      {},
      {},
      schema(R"({"type":"object","required":["name","version","v8Version","uptimeMs","caller","limits"]})"),
      [&facts](CallContext& context, json::object) -> asio::awaitable<MethodResult> {
        auto snapshot = facts.config->current();
        const Config& config = *snapshot;
        json::object caller{{"uid", context.peer.uid},
                            {"gid", context.peer.gid},
                            {"pid", context.peer.pid},
                            {"roles", json::value_from(context.roles.names())},
                            {"connection", context.connectionId}};
        // The caller's connection keeps the limits it was accepted with: those are in force for
        // it, whatever a reload set since.
        const protocol::WireLimits& wire =
            context.session ? context.session->limits() : config.limits;
        json::object limits{{"maxMessageBytes", wire.maxMessageBytes},
                            {"maxDepth", wire.maxDepth},
                            {"maxBatch", wire.maxBatch},
                            {"maxInFlight", wire.maxInFlight},
                            {"maxConnections", config.maxConnections},
                            {"shutdownGraceMs", config.shutdownGrace.count()}};
        json::object info{{"name", "toolhost"},
                          {"version", facts.version},
                          {"v8Version", runtime::v8Version()},
                          {"malloc", facts.malloc},
                          {"pid", ::getpid()},
                          {"startedAt", protocol::formatTime(facts.startedWall)},
                          {"uptimeMs", uptimeMs(facts)},
                          {"socket", config.socketPath.string()},
                          {"caller", std::move(caller)},
                          {"limits", std::move(limits)}};
        if (context.roles.has(Role::admin)) {
          info["stateDir"] = config.stateDir.string();
          // Encoded answers not yet written to their clients, all connections together.
          info["answerBytesHeld"] = Session::heldAnswerBytes();
        }
        co_return json::value(std::move(info));
      }});

  methods.add(MethodSpec{
      "daemon.health",
      "Whether the daemon and each subsystem (state store, runtime, socket) is working: {status, "
      "checks}.",
      {},
      {},
      schema(R"({"type":"object","required":["status","checks"],"properties":{
          "status":{"enum":["ok","degraded"]}}})"),
      [&facts](CallContext&, json::object) -> asio::awaitable<MethodResult> {
        json::object checks;
        bool allOk = true;
        for (const auto& health : facts.healthChecks) {
          json::object result;
          try {
            result = health.check();
          } catch (const std::exception& error) {
            result = json::object{{"ok", false}, {"detail", error.what()}};
          }
          const auto* ok = result.if_contains("ok");
          allOk = allOk && ok && ok->is_bool() && ok->get_bool();
          checks[health.name] = std::move(result);
        }
        co_return json::value(json::object{
            {"status", allOk ? "ok" : "degraded"},
            {"uptimeMs", uptimeMs(facts)},
            {"connections", facts.connectionCount ? facts.connectionCount() : 0},
            {"checks", std::move(checks)}});
      }});
}

}  // namespace toolhost::daemon
