#include "policy/http_resolver.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <atomic>
#include <utility>

namespace toolhost::policy {

namespace asio = boost::asio;
using boost::system::error_code;
using tcp = asio::ip::tcp;

namespace {

// One lookup, shared with its completion handler: asio's resolver runs getaddrinfo on a private
// thread and cannot interrupt it, so the coroutine waits on `done` (which cancellation does
// interrupt) and a lookup it gave up on completes into this state and is dropped with it.
struct Lookup {
  explicit Lookup(const asio::any_io_executor& executor)
      : resolver(executor), done(executor, asio::steady_timer::time_point::max()) {}

  tcp::resolver resolver;
  asio::steady_timer done;
  std::atomic<bool> finished{false};
  error_code error;
  tcp::resolver::results_type results;
};

}  // namespace

asio::awaitable<ResolveResult> SystemResolver::resolve(std::string host, std::uint16_t port) {
  auto lookup = std::make_shared<Lookup>(co_await asio::this_coro::executor);
  lookup->resolver.async_resolve(host, std::to_string(port),
                                 tcp::resolver::numeric_service | tcp::resolver::address_configured,
                                 [lookup](error_code ec, tcp::resolver::results_type results) {
                                   lookup->error = ec;
                                   lookup->results = std::move(results);
                                   lookup->finished = true;
                                   // Also completes a wait that has not started yet.
                                   lookup->done.expires_at(asio::steady_timer::time_point::min());
                                 });
  co_await lookup->done.async_wait(asio::as_tuple(asio::use_awaitable));
  if (!lookup->finished) {
    lookup->resolver.cancel();
    co_return FetchError{FetchErrc::cancelled, "The lookup of " + host + " was cancelled."};
  }
  if (lookup->error) {
    co_return FetchError{FetchErrc::dnsFailed, "Could not resolve " + host + ": " +
                                                   lookup->error.message() +
                                                   ". Check the host name in the URL."};
  }
  std::vector<asio::ip::address> addresses;
  for (const auto& entry : lookup->results) {
    auto address = entry.endpoint().address();
    if (std::find(addresses.begin(), addresses.end(), address) == addresses.end()) {
      addresses.push_back(std::move(address));
    }
  }
  co_return addresses;
}

std::shared_ptr<Resolver> makeSystemResolver() { return std::make_shared<SystemResolver>(); }

}  // namespace toolhost::policy
