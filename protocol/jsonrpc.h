// JSON-RPC 2.0 envelope: decoding one NDJSON line into requests (single or batch) with every rule
// of the specification checked, and encoding responses and notifications. Pure; any thread.
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <boost/system/result.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace toolhost::protocol {

// The specification's own error codes. Application codes (-32000..-32099) belong to daemon/.
namespace rpc_error {
inline constexpr int kParseError = -32700;
inline constexpr int kInvalidRequest = -32600;
inline constexpr int kMethodNotFound = -32601;
inline constexpr int kInvalidParams = -32602;
inline constexpr int kInternalError = -32603;
}  // namespace rpc_error

// Limits on what one connection may send; every one is answered with a clear error.
struct WireLimits {
  std::size_t maxMessageBytes = 8 * 1024 * 1024;  // one line; longer closes the connection
  std::size_t maxDepth = 128;                     // JSON nesting
  std::size_t maxBatch = 256;                     // entries in one batch
  std::size_t maxInFlight = 64;                   // requests being served per connection
};

struct RpcError {
  int code = rpc_error::kInternalError;
  std::string message;             // short, fixed per code ("Invalid Request")
  std::string kind;                // error.data.kind: a stable, machine-readable word
  std::string detail;              // error.data.detail: words a user can act on
  boost::json::object extra = {};  // further error.data members, if any
};

struct Request {
  std::optional<boost::json::value> id;  // absent: a notification, never answered
  std::string method;
  boost::json::value params;  // object, array, or null when absent

  bool isNotification() const { return !id.has_value(); }
};

// An entry that is not a valid request: answered with this error and id (null if unknown).
struct InvalidEntry {
  boost::json::value id;
  RpcError error;
};

using Entry = std::variant<Request, InvalidEntry>;

struct Incoming {
  bool batch = false;
  std::vector<Entry> entries;  // one unless batch
};

// A line that cannot be taken apart into entries (parse error, empty or oversized batch) is
// answered with one error whose id is null.
boost::system::result<Incoming, RpcError> decodeMessage(std::string_view line, const WireLimits& limits);

// Checks one parsed value against the Request object rules. Its params move into the request.
Entry decodeEntry(boost::json::value&& value);

RpcError makeError(int code, std::string kind, std::string detail);
std::string_view standardMessage(int code);

boost::json::object resultResponse(const boost::json::value& id, boost::json::value result);
boost::json::object errorResponse(const boost::json::value& id, const RpcError& error);
boost::json::object notification(std::string_view method, boost::json::value params);

// One response or notification as an NDJSON line, "\n" included.
std::string encodeLine(const boost::json::value& message);
std::string encodeLine(const boost::json::object& message);  // without a copy into a value

}  // namespace toolhost::protocol
