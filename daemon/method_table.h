// The table of JSON-RPC methods: name, roles allowed, params schema (also published by
// rpc.discover), and the coroutine that serves it. Filled on the main thread before the server
// starts; read-only (so safe from any thread) afterwards.
#pragma once

#include "daemon/log_budget.h"
#include "daemon/roles.h"
#include "protocol/jsonrpc.h"
#include "registry/json_schema.h"

#include <boost/asio/awaitable.hpp>
#include <boost/json/value.hpp>
#include <boost/system/result.hpp>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace toolhost::daemon {

class Session;

// What a method learns about its caller. Lives as long as the request's coroutine.
struct CallContext {
  std::uint64_t connectionId = 0;
  std::string requestId;  // printable form of the JSON-RPC id, for logs ("-" for notifications)
  PeerCredentials peer;
  RoleSet roles;
  std::shared_ptr<Session> session;  // for server-to-client notifications
  LogBudget* logBudget = nullptr;    // the connection's, for lines about its failed requests
};

using MethodResult = boost::system::result<boost::json::value, protocol::RpcError>;
using MethodHandler =
    std::function<boost::asio::awaitable<MethodResult>(CallContext&, boost::json::object params)>;

// Schemas for MethodSpec. `schema` parses a literal (a bad one throws: a bug). `paramsWith` is the
// params object: these properties, no others, `required` among them. No `pattern` in any of them:
// valijson evaluates it with std::regex, which overflows the stack on long input; names and
// revisions are checked in code.
boost::json::value schema(std::string_view text);
boost::json::value paramsWith(boost::json::object properties,
                              std::initializer_list<std::string_view> required);

struct MethodSpec {
  std::string name;
  std::string summary;
  RoleSet roles;                  // empty: any connected peer
  boost::json::value params;      // JSON Schema of the params object
  boost::json::value result;      // JSON Schema of the result (documentation only)
  MethodHandler handler;
};

struct CompiledMethod {
  MethodSpec spec;
  registry::JsonSchema paramsSchema;
};

class MethodTable {
 public:
  // Throws std::logic_error on a duplicate name or an invalid schema: both are bugs.
  void add(MethodSpec spec);
  const CompiledMethod* tryFind(std::string_view name) const;
  const std::map<std::string, CompiledMethod, std::less<>>& all() const { return methods_; }

  // The OpenRPC document describing every method.
  boost::json::object openRpcDocument(std::string_view version) const;

 private:
  std::map<std::string, CompiledMethod, std::less<>> methods_;
};

// Helpers for handlers.
MethodResult invalidParams(std::string detail);
MethodResult appError(int code, std::string kind, std::string detail);

}  // namespace toolhost::daemon
