#include "daemon/dispatcher.h"

#include "daemon/errors.h"
#include "protocol/json_text.h"

#include <boost/asio/error.hpp>
#include <boost/system/system_error.hpp>
#include <spdlog/spdlog.h>

#include <chrono>

namespace toolhost::daemon {
namespace asio = boost::asio;
namespace json = boost::json;

asio::awaitable<MethodResult> Dispatcher::invoke(CallContext& context, protocol::Request& request) {
  const CompiledMethod* method = methods_.tryFind(request.method);
  if (method == nullptr) {
    co_return protocol::makeError(protocol::rpc_error::kMethodNotFound, "method-not-found",
                                  "no method named \"" + request.method +
                                      "\"; rpc.discover lists the methods");
  }
  if (!context.roles.permits(method->spec.roles)) {
    auto held = context.roles.names();
    std::string heldText;
    for (const auto& name : held) heldText += (heldText.empty() ? "" : ", ") + name;
    std::string needed;
    for (const auto& name : method->spec.roles.names()) needed += (needed.empty() ? "" : " or ") + name;
    co_return appError(app_error::kUnauthorized, "unauthorized",
                       request.method + " needs the " + needed + " role; uid " +
                           std::to_string(context.peer.uid) + " has " +
                           (heldText.empty() ? "none" : heldText));
  }
  json::object params;
  if (auto* object = request.params.if_object()) {
    params = std::move(*object);
  } else if (const auto* array = request.params.if_array(); array && !array->empty()) {
    co_return invalidParams("params must be named: send an object, not an array");
  }
  if (auto violation = method->paramsSchema.validate(params)) {
    co_return invalidParams(violation->describe("params"));
  }
  co_return co_await method->spec.handler(context, std::move(params));
}

asio::awaitable<std::optional<json::value>> Dispatcher::serve(CallContext& context,
                                                              protocol::Request request) {
  // The clock is read only for the debug log, which is usually off.
  const bool timed = spdlog::should_log(spdlog::level::debug);
  // The client's text: a method name of megabytes must not go into every log line whole.
  const std::string method = logText(request.method, 64);
  const auto started =
      timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  spdlog::debug("conn={} req={} method={} start", context.connectionId, context.requestId, method);
  MethodResult result = protocol::makeError(protocol::rpc_error::kInternalError, "internal", "");
  try {
    result = co_await invoke(context, request);
  } catch (const boost::system::system_error& error) {
    if (error.code() == asio::error::operation_aborted) {
      result = appError(app_error::kCancelled, "cancelled", "the request was cancelled");
    } else {
      spdlog::error("conn={} req={} method={} failed: {}", context.connectionId, context.requestId,
                    method, error.what());
      result = protocol::makeError(protocol::rpc_error::kInternalError, "internal",
                                   "internal error; the daemon log has the details (conn " +
                                       std::to_string(context.connectionId) + ", request " +
                                       context.requestId + ")");
    }
  } catch (const std::exception& error) {
    spdlog::error("conn={} req={} method={} failed: {}", context.connectionId, context.requestId,
                  method, error.what());
    result = protocol::makeError(protocol::rpc_error::kInternalError, "internal",
                                 "internal error; the daemon log has the details (conn " +
                                     std::to_string(context.connectionId) + ", request " +
                                     context.requestId + ")");
  }
  if (result) {
    if (timed) {
      const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(
                              std::chrono::steady_clock::now() - started)
                              .count();
      spdlog::debug("conn={} req={} method={} ok in {} us", context.connectionId, context.requestId,
                    method, micros);
    }
  } else if (std::string note;
             context.logBudget == nullptr || allowClientLine(*context.logBudget, note)) {
    // Method and detail are the client's text (a name of megabytes would be logged twice).
    spdlog::warn("conn={} req={} method={} error {} ({}): {}{}", context.connectionId,
                 context.requestId, method, result.error().code, result.error().kind,
                 logText(result.error().detail, 300), note);
  }
  if (request.isNotification()) co_return std::nullopt;
  if (result) co_return json::value(protocol::resultResponse(*request.id, std::move(*result)));
  co_return json::value(protocol::errorResponse(*request.id, result.error()));
}

}  // namespace toolhost::daemon
