#include "daemon/external_tools.h"

#include "daemon/errors.h"
#include "protocol/json_parse.h"
#include "protocol/json_text.h"

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/json/serialize.hpp>
#include <boost/system/system_error.hpp>

#include <chrono>

namespace toolhost::daemon {
namespace asio = boost::asio;
namespace json = boost::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Failure {
  int code = app_error::kUnavailable;
  std::string kind;
  std::string detail;
  json::object extra = {};
};

MethodResult toResult(Failure failure, const registry::ToolRevision& tool) {
  protocol::RpcError error{failure.code, std::string(app_error::message(failure.code)),
                           std::move(failure.kind), std::move(failure.detail),
                           std::move(failure.extra)};
  error.extra["revision"] = tool.revision;
  return error;
}

std::chrono::milliseconds since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
}

std::string requestText(const registry::ToolRevision& tool, const json::object& arguments) {
  return json::serialize(
      json::object{{"jsonrpc", "2.0"},
                   {"id", 1},
                   {"method", "tools.call"},
                   {"params", json::object{{"name", tool.name}, {"arguments", arguments}}}});
}

// The tool's answer from a JSON-RPC response: its result, or its error as a tool error.
boost::system::result<json::value, Failure> interpret(std::string_view text,
                                                      const std::string& endpoint) {
  auto parsed = protocol::parseJson(text);
  const json::object* response = parsed ? parsed->if_object() : nullptr;
  if (response == nullptr || response->if_contains("jsonrpc") == nullptr ||
      *response->if_contains("jsonrpc") != "2.0") {
    return Failure{app_error::kUnavailable, "invalid-response",
                   endpoint +
                       " did not answer with a JSON-RPC 2.0 response object; an "
                       "external-service endpoint answers tools.call as JSON-RPC"};
  }
  if (const json::value* error = response->if_contains("error")) {
    const json::object* fields = error->if_object();
    const json::value* message = fields ? fields->if_contains("message") : nullptr;
    const json::value* code = fields ? fields->if_contains("code") : nullptr;
    if (message == nullptr || !message->is_string() || code == nullptr || !code->is_number()) {
      return Failure{app_error::kUnavailable, "invalid-response",
                     endpoint +
                         " answered with an error that is not a JSON-RPC error object "
                         "{code, message, data?}"};
    }
    std::string words(std::string_view(message->get_string()).substr(0, 500));
    return Failure{app_error::kToolThrew, "tool-error",
                   "the external service answered with an error: " + words,
                   json::object{{"remoteError", *error}}};
  }
  const json::value* id = response->if_contains("id");
  const json::value* result = response->if_contains("result");
  if (result == nullptr || id == nullptr || *id != 1) {
    return Failure{app_error::kUnavailable, "invalid-response",
                   endpoint + " answered without a result for request id 1"};
  }
  return *result;
}

Failure fromFetchError(const policy::FetchError& error) {
  using policy::FetchErrc;
  int code = app_error::kUnavailable;
  switch (error.code) {
    case FetchErrc::timeout:
      code = app_error::kTimeout;
      break;
    case FetchErrc::cancelled:
      code = app_error::kCancelled;
      break;
    case FetchErrc::responseTooLarge:
      code = app_error::kOutputTooLarge;
      break;
    case FetchErrc::requestTooLarge:
      code = protocol::rpc_error::kInvalidParams;
      break;
    default:
      break;
  }
  Failure failure{code, std::string(policy::errorCode(error.code)), error.message};
  return failure;
}

Failure cancelled() {
  return Failure{app_error::kCancelled, "cancelled",
                 "the call was cancelled; the request to the external service was aborted"};
}

// ---------------------------------------------------------------------------------------------
// unix: one NDJSON request line, one response line.

struct UnixExchange {
  boost::system::error_code error;
  std::string stage;  // where it failed: "connecting", "sending the request", ...
  std::string line;
  bool tooLarge = false;
};

asio::awaitable<UnixExchange> unixExchange(std::string path, std::string request,
                                           std::size_t maxBytes) {
  using asio::local::stream_protocol;
  stream_protocol::socket socket(co_await asio::this_coro::executor);
  UnixExchange out;
  auto [connectError] = co_await socket.async_connect(stream_protocol::endpoint(path),
                                                      asio::as_tuple(asio::use_awaitable));
  if (connectError) {
    out.error = connectError;
    out.stage = "connecting";
    co_return out;
  }
  auto [writeError, written] = co_await asio::async_write(socket, asio::buffer(request),
                                                          asio::as_tuple(asio::use_awaitable));
  if (writeError) {
    out.error = writeError;
    out.stage = "sending the request";
    co_return out;
  }
  std::string buffer;
  auto [readError, length] =
      co_await asio::async_read_until(socket, asio::dynamic_buffer(buffer, maxBytes + 1), '\n',
                                      asio::as_tuple(asio::use_awaitable));
  if (readError == asio::error::not_found) {
    out.tooLarge = true;
    co_return out;
  }
  if (readError == asio::error::eof && !buffer.empty()) {
    length = buffer.size();  // a last line without its newline still counts
  } else if (readError) {
    out.error = readError;
    out.stage = "reading the response";
    co_return out;
  }
  out.line = buffer.substr(0, length);
  while (!out.line.empty() && (out.line.back() == '\n' || out.line.back() == '\r')) {
    out.line.pop_back();
  }
  boost::system::error_code ignored;
  socket.shutdown(stream_protocol::socket::shutdown_both, ignored);
  co_return out;
}

asio::awaitable<void> sleepUntil(Clock::time_point deadline) {
  asio::steady_timer timer(co_await asio::this_coro::executor, deadline);
  co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
}

}  // namespace

void ExternalTools::setOwnSocket(const std::filesystem::path& socket) {
  struct stat own {};
  if (::stat(socket.c_str(), &own) == 0) ownSocket_ = std::make_pair(own.st_dev, own.st_ino);
}

asio::awaitable<MethodResult> ExternalTools::call(registry::ToolRevisionPtr tool,
                                                  json::object arguments,
                                                  std::optional<std::int64_t> wallMs) {
  using namespace asio::experimental::awaitable_operators;
  const json::value* endpointValue = nullptr;
  if (const auto* execution = tool->manifest.if_contains("execution")) {
    endpointValue = execution->as_object().if_contains("endpoint");
  }
  if (endpointValue == nullptr || !endpointValue->is_string()) {
    co_return toResult(Failure{app_error::kInvalidDefinition, "invalid-definition",
                               "the manifest names no endpoint"},
                       *tool);
  }
  const std::string endpoint(endpointValue->get_string());
  const bool overUnix = endpoint.starts_with("unix:");
  auto config = services_.configs.current();
  policy::FetchLimits limits = fetchLimits(*config);
  if (wallMs) limits.timeout = std::chrono::milliseconds(*wallMs);
  const asio::cancellation_state cancellation = co_await asio::this_coro::cancellation_state;
  auto isCancelled = [&cancellation] {
    return cancellation.cancelled() != asio::cancellation_type::none;
  };

  // For https: the destination rules before anyone is asked.
  std::optional<policy::Destination> destination;
  if (!overUnix) {
    auto parsed = policy::parseDestination(endpoint, services_.http.rules());
    if (!parsed) {
      const std::string code(policy::errorCode(parsed.error().code));
      auditRefusal(services_.audit, tool->revision, tool->name, policy::kActionInvoke, endpoint,
                   policy::AccessClass::write, code);
      co_return toResult(
          Failure{app_error::kUnavailable, code,
                  "the endpoint " + endpoint + " cannot be called: " + parsed.error().message},
          *tool);
    }
    destination = std::move(*parsed);
  }

  // Authorization: (revision, invoke, the endpoint exactly as the manifest names it, write).
  policy::AuthorizationRequest ask;
  ask.key = policy::DecisionKey{tool->revision, std::string(policy::kActionInvoke), endpoint,
                                policy::AccessClass::write};
  ask.toolName = tool->name;
  ask.manifestRequests = policy::manifestRequests(tool->manifest, ask.key);
  if (destination) ask.privateRange = privateRangeText(*destination);
  ask.detail = "tools.call " + tool->name;
  const policy::DecisionKey key = ask.key;
  policy::Decision decision;
  try {
    decision = co_await services_.approvals.authorize(std::move(ask), config->promptTimeout);
  } catch (const boost::system::system_error&) {
    decision.source = policy::DecisionSource::cancelled;
  }
  if (decision.source == policy::DecisionSource::cancelled || isCancelled()) {
    co_return toResult(cancelled(), *tool);
  }
  if (!decision.allowed()) {
    co_return toResult(Failure{app_error::kDeniedByPolicy, "not-authorized",
                               "invoke " + endpoint + " was not authorized: " + decision.reason},
                       *tool);
  }

  RequestRecord record{key, tool->name, decision.scope, overUnix ? "" : "POST", "", {}, {}, {}};
  const auto started = Clock::now();
  auto finish = [&](boost::system::result<json::value, Failure> outcome) -> MethodResult {
    record.duration = since(started);
    record.outcome = outcome ? "ok" : outcome.error().kind;
    auditRequest(services_.audit, record);
    if (!outcome) return toResult(std::move(outcome.error()), *tool);
    return json::value(json::object{{"result", std::move(*outcome)},
                                    {"name", tool->name},
                                    {"revision", tool->revision},
                                    {"usage", json::object{{"wallMs", since(started).count()}}}});
  };
  const std::string body = requestText(*tool, arguments);

  if (!overUnix) {
    policy::HttpRequest request;
    request.method = "POST";
    request.destination = std::move(*destination);
    request.headers = {{"Content-Type", "application/json"}, {"Accept", "application/json"}};
    request.body = body;
    auto response = co_await services_.http.fetch(std::move(request), limits);
    if (!response) co_return finish(fromFetchError(response.error()));
    record.status = static_cast<int>(response->status);
    record.bytes = response->body.size();
    if (response->status < 200 || response->status > 299) {
      co_return finish(Failure{app_error::kUnavailable, "invalid-response",
                               endpoint + " answered HTTP " + std::to_string(response->status) +
                                   " instead of a JSON-RPC response"});
    }
    co_return finish(interpret(response->body, endpoint));
  }

  // unix:/path
  const std::string path = endpoint.substr(5);
  if (struct stat target{}; ownSocket_ && ::stat(path.c_str(), &target) == 0 &&
                            std::make_pair(target.st_dev, target.st_ino) == *ownSocket_) {
    co_return finish(Failure{
        app_error::kInvalidDefinition, "invalid-definition",
        "the endpoint " + endpoint + " is this daemon's own socket: the call would call itself"});
  }
  std::optional<UnixExchange> exchanged;
  try {
    auto raced = co_await (unixExchange(path, body + "\n", limits.maxResponseBytes) ||
                           sleepUntil(started + limits.timeout));
    if (raced.index() == 0) exchanged = std::move(std::get<0>(raced));
  } catch (const boost::system::system_error&) {
    // Cancelled before the exchange could start.
  }
  if (isCancelled()) co_return finish(cancelled());
  if (!exchanged) {
    co_return finish(Failure{app_error::kTimeout, "timeout",
                             "no answer from " + endpoint + " within " +
                                 std::to_string(limits.timeout.count()) + " ms"});
  }
  if (exchanged->tooLarge) {
    co_return finish(Failure{app_error::kOutputTooLarge, "response-too-large",
                             "the answer from " + endpoint + " is larger than the limit of " +
                                 std::to_string(limits.maxResponseBytes) + " bytes"});
  }
  if (exchanged->error) {
    co_return finish(Failure{app_error::kUnavailable, "connect-failed",
                             "the external service at " + endpoint + " failed " + exchanged->stage +
                                 " (" + exchanged->error.message() +
                                 "); check that it is running and listening on that socket"});
  }
  record.bytes = exchanged->line.size();
  co_return finish(interpret(exchanged->line, endpoint));
}

}  // namespace toolhost::daemon
