// Serves one decoded request: method lookup, role check, params validation against the method's
// schema, the handler itself, and the response. Runs on the calling connection's strand; holds
// only the read-only method table, so one Dispatcher serves every connection.
#pragma once

#include "daemon/method_table.h"

#include <boost/asio/awaitable.hpp>
#include <boost/json/value.hpp>

#include <optional>

namespace toolhost::daemon {

class Dispatcher {
 public:
  explicit Dispatcher(const MethodTable& methods) : methods_(methods) {}

  // The response to send, or nothing for a notification.
  boost::asio::awaitable<std::optional<boost::json::value>> serve(CallContext& context,
                                                                  protocol::Request request);

 private:
  // Moves the params out of `request`.
  boost::asio::awaitable<MethodResult> invoke(CallContext& context, protocol::Request& request);

  const MethodTable& methods_;
};

}  // namespace toolhost::daemon
