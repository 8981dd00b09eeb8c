// Name resolution for the mediated fetch, behind an interface so tests can script answers that
// change between lookups (DNS rebinding). The client checks every answer itself; a resolver only
// resolves. resolve() runs on the awaiting coroutine's executor and honours its cancellation.
#pragma once

#include "policy/http_error.h"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/system/result.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace toolhost::policy {

using ResolveResult = boost::system::result<std::vector<boost::asio::ip::address>, FetchError>;

class Resolver {
 public:
  virtual ~Resolver() = default;

  // Every address `host` has, in the order to try them; an error is dnsFailed (no such name, no
  // address, resolver failure) or cancelled. An empty list counts as dnsFailed for the client.
  virtual boost::asio::awaitable<ResolveResult> resolve(std::string host, std::uint16_t port) = 0;
};

// The system resolver: getaddrinfo (via asio's resolver), so /etc/hosts and nsswitch apply.
// getaddrinfo cannot be interrupted: a cancelled lookup returns at once and its thread finishes
// in the background, its answer discarded.
class SystemResolver final : public Resolver {
 public:
  boost::asio::awaitable<ResolveResult> resolve(std::string host, std::uint16_t port) override;
};

std::shared_ptr<Resolver> makeSystemResolver();

}  // namespace toolhost::policy
