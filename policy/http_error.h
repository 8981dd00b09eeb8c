// Outcomes of the mediated HTTPS request that are not a response: the code a tool sees in its
// Error and a message that says what to do. Plain values: any thread.
#pragma once

#include <boost/assert/source_location.hpp>

#include <string>
#include <string_view>

namespace toolhost::policy {

enum class FetchErrc {
  invalidUrl,          // "invalid-url": a Destination that parseDestination() would not make
  invalidHeader,       // "invalid-header": a bad or daemon-owned header name, a bad value or method
  requestTooLarge,     // "request-too-large": body or header block over the limit
  destinationBlocked,  // "destination-blocked": a literal or a DNS answer in a blocked range
  dnsFailed,           // "dns-failed": no answer, or no address, for the name
  connectFailed,       // "connect-failed": TCP failed, or the connection broke mid-exchange
  tlsFailed,           // "tls-failed": handshake, certificate chain or name verification failed
  timeout,             // "timeout": the whole exchange did not finish within FetchLimits::timeout
  responseTooLarge,    // "response-too-large": body or header block over the limit
  cancelled,           // "cancelled": the caller cancelled the call
};

// The code a tool sees in its Error: "dns-failed", "tls-failed", ...
std::string_view errorCode(FetchErrc code);

struct FetchError {
  FetchErrc code;
  // Says what went wrong and what to do. Names headers, hosts and addresses, never a header value
  // or a body (they may carry secrets).
  std::string message;
};
[[noreturn]] void throw_exception_from_error(const FetchError& e,
                                             const boost::source_location& loc);

}  // namespace toolhost::policy
