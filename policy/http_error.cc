#include "policy/http_error.h"

#include <boost/throw_exception.hpp>

#include <stdexcept>

namespace toolhost::policy {

std::string_view errorCode(FetchErrc code) {
  switch (code) {
    case FetchErrc::invalidUrl:
      return "invalid-url";
    case FetchErrc::invalidHeader:
      return "invalid-header";
    case FetchErrc::requestTooLarge:
      return "request-too-large";
    case FetchErrc::destinationBlocked:
      return "destination-blocked";
    case FetchErrc::dnsFailed:
      return "dns-failed";
    case FetchErrc::connectFailed:
      return "connect-failed";
    case FetchErrc::tlsFailed:
      return "tls-failed";
    case FetchErrc::timeout:
      return "timeout";
    case FetchErrc::responseTooLarge:
      return "response-too-large";
    case FetchErrc::cancelled:
      return "cancelled";
  }
  return "connect-failed";
}

void throw_exception_from_error(const FetchError& e, const boost::source_location& loc) {
  boost::throw_exception(std::runtime_error(std::string(errorCode(e.code)) + ": " + e.message),
                         loc);
}

}  // namespace toolhost::policy
