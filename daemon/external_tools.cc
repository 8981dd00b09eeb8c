#include "daemon/external_tools.h"

#include "daemon/errors.h"
#include "protocol/json_parse.h"
#include "protocol/json_text.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
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

#include <algorithm>
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
// At most `max` bytes of `text`, cut before a UTF-8 character that would not fit whole.
std::string_view utf8Prefix(std::string_view text, std::size_t max) {
  if (text.size() <= max) return text;
  std::size_t end = max;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end);
}

boost::system::result<json::value, Failure> interpret(std::string_view text,
                                                      const std::string& endpoint) {
  auto parsed = protocol::parseJson(text);
  if (!parsed) {
    return Failure{app_error::kUnavailable, "invalid-response",
                   endpoint + " answered with text that is not JSON (" + parsed.error().detail +
                       "); an external-service endpoint answers tools.call as JSON-RPC"};
  }
  const json::object* response = parsed->if_object();
  if (response == nullptr || response->if_contains("jsonrpc") == nullptr ||
      *response->if_contains("jsonrpc") != "2.0") {
    return Failure{app_error::kUnavailable, "invalid-response",
                   endpoint +
                       " did not answer with a JSON-RPC 2.0 response object; an "
                       "external-service endpoint answers tools.call as JSON-RPC"};
  }
  const json::value* id = response->if_contains("id");
  const json::value* result = response->if_contains("result");
  if (const json::value* error = response->if_contains("error")) {
    const json::object* fields = error->if_object();
    const json::value* message = fields ? fields->if_contains("message") : nullptr;
    const json::value* code = fields ? fields->if_contains("code") : nullptr;
    // An error answers request 1 (or, for a request it could not read, null), alone.
    if (result != nullptr || id == nullptr || (!id->is_null() && *id != 1) || message == nullptr ||
        !message->is_string() || code == nullptr || !(code->is_int64() || code->is_uint64())) {
      return Failure{app_error::kUnavailable, "invalid-response",
                     endpoint +
                         " answered with an error that is not a JSON-RPC error response "
                         "{id: 1, error: {code: integer, message: string, data?}}"};
    }
    std::string words(utf8Prefix(message->get_string(), 500));
    return Failure{app_error::kToolThrew, "tool-error",
                   "the external service answered with an error: " + words,
                   json::object{{"remoteError", *error}}};
  }
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
  bool ownSocket = false;  // the peer is this daemon
  policy::BufferedShare::Grown buffered = policy::BufferedShare::Grown::yes;  // else past a pool
};

asio::awaitable<void> sleepFor(std::chrono::milliseconds delay) {
  asio::steady_timer timer(co_await asio::this_coro::executor, delay);
  co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
}

// One exchange with the service at `path`, its answer's bytes charged to `share` as they arrive.
// A service whose listen backlog is full refuses connections at once (EAGAIN, which Asio takes
// for a connect in progress that succeeded): it is busy, so the connect is tried again, briefly
// later, until the caller's deadline ends the exchange.
asio::awaitable<UnixExchange> unixExchange(std::string path, std::string request,
                                           const policy::FetchLimits& limits,
                                           std::shared_ptr<policy::BufferedShare> share) {
  using asio::local::stream_protocol;
  const auto executor = co_await asio::this_coro::executor;
  UnixExchange out;
  stream_protocol::socket socket(executor);
  for (int attempt = 0;; ++attempt) {
    socket = stream_protocol::socket(executor);
    auto [connectError] = co_await socket.async_connect(stream_protocol::endpoint(path),
                                                        asio::as_tuple(asio::use_awaitable));
    bool busy = connectError == asio::error::would_block || connectError == asio::error::try_again;
    if (!connectError) {
      sockaddr_un peerAddress{};
      socklen_t addressLength = sizeof peerAddress;
      if (::getpeername(socket.native_handle(), reinterpret_cast<sockaddr*>(&peerAddress),
                        &addressLength) != 0) {
        const int error = errno;
        busy = error == ENOTCONN;
        if (!busy)
          connectError = boost::system::error_code(error, boost::system::system_category());
      }
    }
    if (!busy && connectError) {
      out.error = connectError;
      out.stage = "connecting";
      co_return out;
    }
    if (!busy) break;
    co_await sleepFor(std::chrono::milliseconds(std::min(100, 5 << std::min(attempt, 5))));
  }
  // By path the endpoint was not this daemon's socket; what answered must not be it either (the
  // path may have been switched since).
  ucred peer{};
  socklen_t peerLength = sizeof peer;
  if (::getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &peer, &peerLength) == 0 &&
      peer.pid == ::getpid()) {
    out.ownSocket = true;
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
  std::vector<char> chunk(64 * 1024);
  for (;;) {
    auto [readError, length] =
        co_await socket.async_read_some(asio::buffer(chunk), asio::as_tuple(asio::use_awaitable));
    const std::size_t before = buffer.size();
    buffer.append(chunk.data(), length);
    const std::size_t newline = buffer.find('\n', before);
    if ((newline == std::string::npos ? buffer.size() : newline) > limits.maxResponseBytes) {
      out.tooLarge = true;
      co_return out;
    }
    out.buffered =
        share->growTo(buffer.size(), limits.maxBufferedBytes, limits.maxOwnerBufferedBytes);
    if (out.buffered != policy::BufferedShare::Grown::yes) co_return out;
    if (newline != std::string::npos) {
      buffer.resize(newline);
      break;
    }
    if (readError == asio::error::eof && !buffer.empty()) break;  // a last line without its LF
    if (readError) {
      out.error = readError;
      out.stage = "reading the response";
      co_return out;
    }
  }
  while (!buffer.empty() && buffer.back() == '\r') buffer.pop_back();
  out.line = std::move(buffer);
  boost::system::error_code ignored;
  socket.shutdown(stream_protocol::socket::shutdown_both, ignored);
  co_return out;
}

asio::awaitable<void> sleepUntil(Clock::time_point deadline) {
  asio::steady_timer timer(co_await asio::this_coro::executor, deadline);
  co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
}

}  // namespace

void ExternalTools::addOwnSocket(const std::filesystem::path& socket) {
  struct stat own {};
  if (::stat(socket.c_str(), &own) != 0) return;
  std::lock_guard lock(ownMutex_);
  ownSockets_.emplace_back(own.st_dev, own.st_ino);
}

void ExternalTools::setOwnSockets(std::vector<std::pair<dev_t, ino_t>> files) {
  std::lock_guard lock(ownMutex_);
  ownSockets_ = std::move(files);
}

bool ExternalTools::isOwnSocket(const std::filesystem::path& path) const {
  struct stat target {};
  if (::stat(path.c_str(), &target) != 0) return false;
  std::lock_guard lock(ownMutex_);
  return std::find(ownSockets_.begin(), ownSockets_.end(),
                   std::make_pair(target.st_dev, target.st_ino)) != ownSockets_.end();
}

asio::awaitable<MethodResult> ExternalTools::call(registry::ToolRevisionPtr tool,
                                                  json::object arguments,
                                                  runtime::CallLimits requested) {
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
  std::int64_t wallMs = config->fetch.timeout.count();
  std::int64_t outputLimit = config->runtime.defaults.outputBytes.value_or(2 << 20);
  if (const auto* declared = tool->manifest.if_contains("limits");
      declared && declared->is_object()) {
    if (const auto* value = declared->as_object().if_contains("wallMs")) {
      wallMs = value->to_number<std::int64_t>();
    }
    if (const auto* value = declared->as_object().if_contains("outputBytes")) {
      outputLimit = value->to_number<std::int64_t>();
    }
  }
  if (const auto cap = config->runtime.caps.wallMs) wallMs = std::min(wallMs, *cap);
  if (const auto cap = config->runtime.caps.outputBytes) outputLimit = std::min(outputLimit, *cap);
  if (requested.wallMs) wallMs = std::min(wallMs, *requested.wallMs);
  if (requested.outputBytes) outputLimit = std::min(outputLimit, *requested.outputBytes);
  const auto outputBytes = static_cast<std::size_t>(std::max<std::int64_t>(outputLimit, 0));
  policy::FetchLimits limits = fetchLimits(*config);
  limits.timeout = std::chrono::milliseconds(std::max<std::int64_t>(wallMs, 1));
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
    if (outcome) {
      const std::size_t size = protocol::writeJson(*outcome).size();
      if (size > outputBytes) {
        outcome = Failure{app_error::kOutputTooLarge, "output-too-large",
                          "the external service's result is " + std::to_string(size) +
                              " bytes of JSON; the call's limit (outputBytes) is " +
                              std::to_string(outputBytes)};
      }
    } else {
      // The service's error object reaches the agent too: within the same limit. (result's
      // error() is a copy: the failure is taken out, changed and put back.)
      Failure failure = outcome.error();
      if (const auto* remote = failure.extra.if_contains("remoteError")) {
        const std::size_t size = protocol::writeJson(*remote).size();
        if (size > outputBytes) {
          failure.extra.erase("remoteError");
          failure.detail += " (its error object, " + std::to_string(size) +
                            " bytes of JSON, is left out: the call's limit (outputBytes) is " +
                            std::to_string(outputBytes) + ")";
          outcome = std::move(failure);
        }
      }
    }
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
    auto response = co_await services_.http.fetch(std::move(request), limits, tool->name);
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
  if (isOwnSocket(path)) {
    co_return finish(Failure{
        app_error::kInvalidDefinition, "invalid-definition",
        "the endpoint " + endpoint + " is this daemon's own socket: the call would call itself"});
  }
  std::optional<UnixExchange> exchanged;
  // The answer's bytes count with the fetches' ([fetch] max_buffered_bytes and its per-tool
  // share) until the answer is handed on.
  auto share = services_.http.bufferedShare(tool->name);
  try {
    auto raced = co_await (unixExchange(path, body + "\n", limits, share) ||
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
  if (exchanged->ownSocket) {
    co_return finish(Failure{app_error::kInvalidDefinition, "invalid-definition",
                             "the endpoint " + endpoint +
                                 " led to this daemon's own socket: the call would call itself"});
  }
  if (exchanged->buffered != policy::BufferedShare::Grown::yes) {
    const bool owner = exchanged->buffered == policy::BufferedShare::Grown::ownerFull;
    co_return finish(Failure{
        app_error::kOutputTooLarge, "response-too-large",
        "the answer from " + endpoint + " was not read to its end: " +
            (owner ? "this tool's requests already hold " +
                         std::to_string(limits.maxOwnerBufferedBytes) +
                         " bytes of answers, the most one tool may ([fetch] "
                         "max_buffered_bytes_per_tool)"
                   : "the daemon already holds " + std::to_string(limits.maxBufferedBytes) +
                         " bytes of answers for running tools ([fetch] max_buffered_bytes)")});
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
