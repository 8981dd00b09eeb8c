#include "policy/http_client.h"

#include "policy/access_class.h"

#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <unistd.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <tuple>
#include <variant>

#ifndef TOOLHOST_VERSION
#define TOOLHOST_VERSION "0.0.0"
#endif

namespace toolhost::policy {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;
using tcp = asio::ip::tcp;

namespace {

// Why a socket of `protocol` cannot be opened now (EMFILE, ENFILE, ENOBUFS), if it cannot.
std::optional<std::string> socketOpenFailure(const tcp& protocol) {
  const int fd = ::socket(protocol.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    ::close(fd);
    return std::nullopt;
  }
  const int error = errno;
  std::string reason = std::strerror(error);
  if (error == EMFILE || error == ENFILE) {
    reason += "; raise the daemon's limit on open files (ulimit -n, systemd's LimitNOFILE=)";
  }
  return reason;
}

// Interim (1xx) responses read before the final one; more is a misbehaving server.
constexpr int kMaxInterimResponses = 8;
// The read buffer: a whole header, and room beyond it. Once the header is parsed the parser
// takes body bytes out as they come, so then only framing waits here (a chunk-size line with its
// extensions, the trailer), up to the whole buffer, and none of it counts against the body's
// limits. Without this bound a server could send one endless chunk extension and fill the
// daemon's memory until the timeout.
constexpr std::size_t kReadBufferBytes = kMaxResponseHeaderBytes + 64 * 1024;
// How long a successful exchange waits for the server's close_notify. Most servers send it with
// the last byte (we asked for Connection: close); one that does not costs at most this.
constexpr std::chrono::milliseconds kShutdownGrace{500};

// ---------------------------------------------------------------------------------------------
// Request checks.

// RFC 9110 5.6.2: tchar.
bool isTchar(unsigned char c) {
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
}

bool isToken(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return isTchar(static_cast<unsigned char>(c));
  });
}

// RFC 9110 5.5: field-vchar (VCHAR, obs-text), SP and HTAB. No CR, LF, NUL or other controls.
bool isFieldValueChar(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); }

char toLower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

std::string lowercase(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), toLower);
  return out;
}

bool equalsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return toLower(x) == toLower(y);
         });
}

bool startsWithIgnoreCase(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() && equalsIgnoreCase(text.substr(0, prefix.size()), prefix);
}

std::string_view trimWhitespace(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

// A name or method as it may appear in a message: quoted, non-printable bytes escaped, cut short.
std::string describe(std::string_view text) {
  constexpr std::size_t kMax = 64;
  std::string out = "\"";
  for (std::size_t i = 0; i < text.size() && i < kMax; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\r') {
      out += "\\r";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') {
      constexpr std::string_view kHex = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > kMax) out += "...";
  return out + "\"";
}

constexpr std::array<std::string_view, 19> kForbiddenHeaders{{
    "host",
    "content-length",
    "transfer-encoding",
    "te",
    "trailer",
    "connection",
    "keep-alive",
    "upgrade",
    "expect",
    "http2-settings",
    "accept-encoding",
    "cookie",
    "cookie2",
    "set-cookie",
    "x-http-method",
    "x-http-method-override",
    "x-method-override",
    "x-original-method",
    "proxy-connection",
}};

bool validHostName(std::string_view host) {
  return !host.empty() && std::all_of(host.begin(), host.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
  });
}

// ---------------------------------------------------------------------------------------------
// The exchange.

FetchError cancelledError(const Destination& destination) {
  return {FetchErrc::cancelled,
          "The call was cancelled; the request to " + destination.origin + " was aborted."};
}

FetchError timeoutError(const Destination& destination, const FetchLimits& limits,
                        std::string_view stage) {
  return {FetchErrc::timeout, "No complete response from " + destination.origin + " within " +
                                  std::to_string(limits.timeout.count()) + " ms (it timed out " +
                                  std::string(stage) +
                                  "; the limit covers DNS, connection, TLS and the whole "
                                  "exchange). Try again later, or ask for less data."};
}

std::string bytes(std::size_t n) { return std::to_string(n) + " bytes"; }

// Errors once the connection exists: reading, writing, and the timeouts and limits met there.
FetchError exchangeError(const error_code& ec, const Destination& destination,
                         const FetchLimits& limits, std::string_view stage) {
  const std::string& origin = destination.origin;
  if (ec == beast::error::timeout) return timeoutError(destination, limits, stage);
  if (ec == http::error::body_limit) {
    return {FetchErrc::responseTooLarge,
            "The response body from " + origin + " is larger than the limit of " +
                bytes(limits.maxResponseBytes) +
                ". Ask for less data (a smaller page, a range or a filter)."};
  }
  if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
    return {FetchErrc::responseTooLarge, "The response headers from " + origin +
                                             " are larger than the limit of " +
                                             bytes(kMaxResponseHeaderBytes) + "."};
  }
  if (ec == http::error::end_of_stream || ec == http::error::partial_message ||
      ec == asio::error::eof || ec == ssl::error::stream_truncated ||
      ec == asio::error::connection_reset || ec == asio::error::broken_pipe) {
    return {FetchErrc::connectFailed,
            origin + " closed the connection " + std::string(stage) +
                ", before a complete response. Try again later; if it persists, the server "
                "may not speak HTTP/1.1."};
  }
  if (ec.category() == http::make_error_code(http::error::bad_version).category()) {
    return {FetchErrc::connectFailed,
            "The response from " + origin + " is not valid HTTP/1.1 (" + ec.message() + ")."};
  }
  if (ec.category() == asio::error::get_ssl_category() ||
      ec.category() == ssl::error::get_stream_category()) {
    return {FetchErrc::tlsFailed,
            "TLS failed with " + origin + " " + std::string(stage) + " (" + ec.message() + ")."};
  }
  return {FetchErrc::connectFailed, "The connection to " + origin + " failed " +
                                        std::string(stage) + " (" + ec.message() + ")."};
}

FetchError bufferedError(const Destination& destination, const FetchLimits& limits,
                         BufferedShare::Grown grown) {
  const bool owner = grown == BufferedShare::Grown::ownerFull;
  return {FetchErrc::responseTooLarge,
          "The response from " + destination.origin + " was not read to its end: " +
              (owner ? "this tool's fetches already hold " + bytes(limits.maxOwnerBufferedBytes) +
                           " of responses, the most one tool may ([fetch] "
                           "max_buffered_bytes_per_tool). "
                     : "the daemon already holds " + bytes(limits.maxBufferedBytes) +
                           " of fetch responses for running tools, its limit ([fetch] "
                           "max_buffered_bytes). ") +
              "Fetch fewer large responses at once, or ask for less data."};
}

FetchError handshakeError(SSL* ssl, const error_code& ec, const Destination& destination) {
  const long verify = SSL_get_verify_result(ssl);
  const std::string& origin = destination.origin;
  if (verify == X509_V_ERR_HOSTNAME_MISMATCH || verify == X509_V_ERR_IP_ADDRESS_MISMATCH) {
    return {FetchErrc::tlsFailed, "The certificate of " + origin + " is not valid for " +
                                      (destination.literal ? "the address " : "the name ") +
                                      destination.host + " (" +
                                      X509_verify_cert_error_string(verify) +
                                      "). Use the host name the certificate is issued for."};
  }
  if (verify == X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY ||
      verify == X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT ||
      verify == X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN ||
      verify == X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT ||
      verify == X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE || verify == X509_V_ERR_CERT_UNTRUSTED) {
    return {FetchErrc::tlsFailed,
            "The certificate of " + origin + " is not trusted (" +
                X509_verify_cert_error_string(verify) +
                "). If the server uses a private CA, the operator can add that CA's certificate "
                "with [fetch] extra_ca_file."};
  }
  if (verify != X509_V_OK) {
    return {FetchErrc::tlsFailed, "The certificate of " + origin + " was refused (" +
                                      X509_verify_cert_error_string(verify) + ")."};
  }
  return {FetchErrc::tlsFailed, "The TLS handshake with " + origin + " failed (" + ec.message() +
                                    "). The server must offer TLS 1.2 or later."};
}

http::request<http::string_body> buildRequest(HttpRequest& request) {
  const Destination& destination = request.destination;
  http::request<http::string_body> message;
  message.method_string(request.method);
  message.target(destination.pathAndQuery);
  message.version(11);
  message.set(http::field::host, destination.port == 443
                                     ? destination.host
                                     : destination.host + ":" + std::to_string(destination.port));
  bool hasUserAgent = false;
  bool hasAccept = false;
  for (const auto& [name, value] : request.headers) {
    hasUserAgent = hasUserAgent || equalsIgnoreCase(name, "user-agent");
    hasAccept = hasAccept || equalsIgnoreCase(name, "accept");
    message.insert(name, trimWhitespace(value));
  }
  if (!hasUserAgent) message.set(http::field::user_agent, defaultUserAgent());
  if (!hasAccept) message.set(http::field::accept, "*/*");
  message.set(http::field::accept_encoding, "identity");
  message.set(http::field::connection, "close");
  const bool methodHasContent =
      request.method == "POST" || request.method == "PUT" || request.method == "PATCH";
  if (!request.body.empty() || methodHasContent) message.content_length(request.body.size());
  message.body() = std::move(request.body);
  return message;
}

HttpResponse toResponse(http::response<http::string_body>&& message,
                        const asio::ip::address& remote) {
  HttpResponse response;
  response.status = message.result_int();
  response.statusText = std::string(message.reason());
  for (const auto& field : message) {
    response.headers.emplace_back(lowercase(field.name_string()), std::string(field.value()));
  }
  response.body = std::move(message.body());
  response.remoteAddress = formatAddress(remote);
  return response;
}

asio::awaitable<void> sleepUntil(Clock::time_point deadline) {
  asio::steady_timer timer(co_await asio::this_coro::executor, deadline);
  co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
}

// A resolver that throws would leave the deadline timer to decide; make it an answer instead.
asio::awaitable<ResolveResult> guardedResolve(Resolver& resolver, std::string host,
                                              std::uint16_t port) {
  try {
    co_return co_await resolver.resolve(host, port);
  } catch (const std::exception& e) {
    co_return FetchError{FetchErrc::dnsFailed,
                         "Could not resolve " + host + ": the resolver failed (" + e.what() + ")."};
  }
}

}  // namespace

// Shared by every fetch: OpenSSL makes each connection's SSL from it, safely from any thread.
struct HttpClient::Tls {
  ssl::context context{ssl::context::tls_client};
};

std::string_view defaultUserAgent() { return "toolhost/" TOOLHOST_VERSION; }

bool isForbiddenRequestHeader(std::string_view name) {
  // Servers that read headers through CGI-style variables see '-' and '_' as one character.
  std::string folded(name);
  std::replace(folded.begin(), folded.end(), '_', '-');
  if (startsWithIgnoreCase(folded, "proxy-") || startsWithIgnoreCase(folded, "sec-")) return true;
  return std::any_of(
      kForbiddenHeaders.begin(), kForbiddenHeaders.end(),
      [&](std::string_view forbidden) { return equalsIgnoreCase(folded, forbidden); });
}

boost::system::result<void, FetchError> checkRequest(const HttpRequest& request,
                                                     const FetchLimits& limits) {
  const std::string& method = request.method;
  if (!isToken(method)) {
    return FetchError{FetchErrc::invalidHeader,
                      "The method " + describe(method) +
                          " is not a valid HTTP method. Use a method such as GET or POST."};
  }
  for (std::string_view refused : {"CONNECT", "TRACE", "TRACK"}) {
    if (equalsIgnoreCase(method, refused)) {
      return FetchError{FetchErrc::invalidHeader,
                        "The method " + std::string(refused) +
                            " is not allowed in fetch. Use GET, POST or another method."};
    }
  }

  // A read (GET, HEAD, OPTIONS) is authorized as one that sends nothing but its URL and headers.
  if (!request.body.empty() && accessClassOf(method) == AccessClass::read) {
    return FetchError{FetchErrc::invalidHeader,
                      "A " + method +
                          " request cannot carry a body: it is authorized as a read. Send data "
                          "with POST, PUT or PATCH."};
  }

  // A Destination comes from parseDestination(); a hand-made one must not smuggle anything into
  // the request line, the Host header or the SNI.
  const Destination& destination = request.destination;
  auto invalidUrl = [&](std::string_view what) {
    return FetchError{FetchErrc::invalidUrl, "The destination is not valid (" + std::string(what) +
                                                 "). Pass the URL through parseDestination()."};
  };
  if (destination.scheme != "https") return invalidUrl("only https is fetched");
  if (destination.port == 0) return invalidUrl("port 0");
  if (destination.literal) {
    const std::string address = formatAddress(*destination.literal);
    const std::string expected = destination.literal->is_v6() ? "[" + address + "]" : address;
    if (destination.host != expected) return invalidUrl("the host is not its literal address");
  } else if (!validHostName(destination.host)) {
    return invalidUrl("the host is not a lowercase host name");
  } else if (auto why = tryFindBlockedName(destination.host)) {
    return FetchError{FetchErrc::destinationBlocked,
                      destination.host + " is " + *why + ": the daemon never fetches from it."};
  }
  const std::string& target = destination.pathAndQuery;
  if (target.empty() || target.front() != '/' ||
      !std::all_of(target.begin(), target.end(), [](char c) {
        const auto u = static_cast<unsigned char>(c);
        return u > 0x20 && u < 0x7f && c != '#';
      })) {
    return invalidUrl("the request target must be a percent-encoded path and query");
  }

  if (request.headers.size() > kMaxRequestHeaders) {
    return FetchError{FetchErrc::requestTooLarge,
                      "The request has " + std::to_string(request.headers.size()) +
                          " headers; at most " + std::to_string(kMaxRequestHeaders) + " are sent."};
  }
  std::size_t headerBytes = 0;
  for (const auto& [name, value] : request.headers) {
    if (!isToken(name)) {
      return FetchError{FetchErrc::invalidHeader,
                        "The header name " + describe(name) +
                            " is not valid: names are letters, digits and !#$%&'*+-.^_`|~ only."};
    }
    if (isForbiddenRequestHeader(name)) {
      return FetchError{FetchErrc::invalidHeader,
                        "The header " + describe(name) +
                            " is set by the daemon or never sent (cookies, proxies, framing, "
                            "method overrides); remove it from the request."};
    }
    if (!std::all_of(value.begin(), value.end(),
                     [](char c) { return isFieldValueChar(static_cast<unsigned char>(c)); })) {
      return FetchError{FetchErrc::invalidHeader,
                        "The value of the header " + describe(name) +
                            " contains a line break or another control character; header values "
                            "must be a single line of text."};
    }
    headerBytes += name.size() + value.size() + 4;  // ": " and CRLF
  }
  if (headerBytes > kMaxRequestHeaderBytes + limits.secretHeaderBytes) {
    return FetchError{FetchErrc::requestTooLarge, "The request headers take " + bytes(headerBytes) +
                                                      "; at most " + bytes(kMaxRequestHeaderBytes) +
                                                      " are sent."};
  }
  if (request.body.size() > limits.maxRequestBodyBytes + limits.secretBodyBytes) {
    return FetchError{FetchErrc::requestTooLarge,
                      "The request body has " + bytes(request.body.size()) + "; the limit is " +
                          bytes(limits.maxRequestBodyBytes) + "."};
  }
  return {};
}

bool BufferedBytes::take(std::size_t bytes, std::size_t cap) {
  std::size_t held = held_.load();
  do {
    if (held > cap || bytes > cap - held) return false;
  } while (!held_.compare_exchange_weak(held, held + bytes));
  return true;
}

void BufferedBytes::give(std::size_t bytes) { held_.fetch_sub(bytes); }

BufferedShare::~BufferedShare() {
  if (bytes_ == 0) return;
  pool_->give(bytes_);
  if (ownerPool_) ownerPool_->give(bytes_);
}

BufferedShare::Grown BufferedShare::growTo(std::size_t total, std::size_t cap,
                                           std::size_t ownerCap) {
  if (total <= bytes_) return Grown::yes;
  const std::size_t more = total - bytes_;
  if (ownerPool_ && !ownerPool_->take(more, ownerCap)) return Grown::ownerFull;
  if (!pool_->take(more, cap)) {
    if (ownerPool_) ownerPool_->give(more);
    return Grown::clientFull;
  }
  bytes_ = total;
  return Grown::yes;
}

HttpClient::HttpClient(AddressRules rules, std::optional<std::filesystem::path> extraCaFile,
                       std::shared_ptr<Resolver> resolver)
    : rules_(std::move(rules)),
      resolver_(resolver ? std::move(resolver) : makeSystemResolver()),
      tls_(std::make_unique<Tls>()) {
  ssl::context& tls = tls_->context;
  tls.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                  ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 |
                  ssl::context::no_compression);
  SSL_CTX* native = tls.native_handle();
  if (SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION) != 1) {
    throw std::runtime_error("cannot require TLS 1.2 in OpenSSL");
  }
  // ALPN: some servers speak only h2 without it; say plainly that this client is HTTP/1.1.
  static constexpr unsigned char kAlpn[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  SSL_CTX_set_alpn_protos(native, kAlpn, sizeof kAlpn);
  tls.set_verify_mode(ssl::verify_peer);
  error_code ec;
  tls.set_default_verify_paths(ec);
  if (ec) throw std::runtime_error("cannot use the system CA store: " + ec.message());
  if (extraCaFile) {
    tls.load_verify_file(extraCaFile->string(), ec);
    if (ec) {
      throw std::runtime_error("[fetch] extra_ca_file " + extraCaFile->string() +
                               " cannot be used: " + ec.message() +
                               ". It must be a readable file of PEM certificates.");
    }
  }
}

HttpClient::~HttpClient() = default;

std::shared_ptr<BufferedBytes> HttpClient::ownerPool(const std::string& owner) {
  std::lock_guard lock(ownersMutex_);
  auto& entry = owners_[owner];
  auto pool = entry.lock();
  if (!pool) {
    pool = std::make_shared<BufferedBytes>();
    entry = pool;
  }
  // An owner's entry outlives its last response; sweep the expired ones when they could be half.
  if (owners_.size() > 2 * ownersAfterSweep_ + 64) {
    std::erase_if(owners_, [](const auto& item) { return item.second.expired(); });
    ownersAfterSweep_ = owners_.size();
  }
  return pool;
}

std::shared_ptr<BufferedShare> HttpClient::bufferedShare(const std::string& owner) {
  return std::make_shared<BufferedShare>(buffered_, owner.empty() ? nullptr : ownerPool(owner));
}

std::size_t HttpClient::bufferedBytes(const std::string& owner) const {
  std::lock_guard lock(ownersMutex_);
  auto found = owners_.find(owner);
  if (found == owners_.end()) return 0;
  auto pool = found->second.lock();
  return pool ? pool->held() : 0;
}

asio::awaitable<FetchResult> HttpClient::fetch(HttpRequest request, FetchLimits limits,
                                               std::string owner) {
  // Cancellation must surface as a value (cancelled), not as an exception thrown by the next
  // co_await; restore the caller's setting afterwards, as it is per coroutine thread.
  const bool throwIfCancelled = co_await asio::this_coro::throw_if_cancelled();
  co_await asio::this_coro::throw_if_cancelled(false);
  std::exception_ptr failure;
  FetchResult result = FetchError{FetchErrc::cancelled, ""};
  try {
    // A named variable: g++ 12 destroys a temporary of a conditional expression in a co_await
    // operand twice.
    std::shared_ptr<BufferedBytes> pool;
    if (!owner.empty()) pool = ownerPool(owner);
    result = co_await exchange(std::move(request), limits, std::move(pool));
  } catch (...) {
    failure = std::current_exception();
  }
  co_await asio::this_coro::throw_if_cancelled(throwIfCancelled);
  if (failure) std::rethrow_exception(failure);
  co_return result;
}

asio::awaitable<FetchResult> HttpClient::exchange(HttpRequest request, FetchLimits limits,
                                                  std::shared_ptr<BufferedBytes> ownerPool) {
  using namespace asio::experimental::awaitable_operators;
  const auto deadline = Clock::now() + limits.timeout;
  const asio::cancellation_state cancellation = co_await asio::this_coro::cancellation_state;
  auto cancelled = [&cancellation] {
    return cancellation.cancelled() != asio::cancellation_type::none;
  };

  if (auto checked = checkRequest(request, limits); !checked) co_return checked.error();
  const Destination destination = request.destination;
  if (cancelled()) co_return cancelledError(destination);

  // Where to connect: the literal, or every answer for the name, each judged by the rules.
  std::vector<asio::ip::address> addresses;
  if (destination.literal) {
    const AddressVerdict verdict = rules_.check(*destination.literal);
    if (!verdict.permitted()) {
      co_return FetchError{FetchErrc::destinationBlocked,
                           destination.host + " is " + verdict.range +
                               ": the daemon does not connect there unless the operator opens "
                               "the range with [fetch] allow_private."};
    }
    addresses.push_back(*destination.literal);
  } else {
    auto outcome = co_await (guardedResolve(*resolver_, destination.host, destination.port) ||
                             sleepUntil(deadline));
    if (cancelled()) co_return cancelledError(destination);
    if (outcome.index() == 1) co_return timeoutError(destination, limits, "resolving the name");
    ResolveResult& resolved = std::get<0>(outcome);
    if (!resolved) {
      if (resolved.error().code == FetchErrc::cancelled) co_return cancelledError(destination);
      co_return std::move(resolved).error();
    }
    if (resolved->empty()) {
      co_return FetchError{FetchErrc::dnsFailed, "Could not resolve " + destination.host +
                                                     ": the name has no address. Check the host "
                                                     "name in the URL."};
    }
    // Every answer must pass: skipping the bad ones would let a name that mixes a public and an
    // internal address probe the inside whenever the public one fails.
    for (const auto& address : *resolved) {
      const AddressVerdict verdict = rules_.check(address);
      if (!verdict.permitted()) {
        co_return FetchError{
            FetchErrc::destinationBlocked,
            destination.host + " resolves to " + formatAddress(address) + ", which is " +
                verdict.range +
                ": the daemon does not connect there unless the operator opens the range with "
                "[fetch] allow_private."};
      }
    }
    addresses = std::move(*resolved);
  }

  // Connect to the checked addresses only, in order: the name is never resolved again, so an
  // answer that changes (DNS rebinding) cannot move the connection.
  std::vector<tcp::endpoint> endpoints;
  for (const auto& address : addresses) endpoints.emplace_back(address, destination.port);
  ssl::stream<beast::tcp_stream> stream(co_await asio::this_coro::executor, tls_->context);
  beast::tcp_stream& transport = stream.next_layer();
  transport.expires_at(deadline);  // one deadline for connect, TLS, request and response
  auto [connectError, endpoint] =
      co_await transport.async_connect(endpoints, asio::as_tuple(asio::use_awaitable));
  if (cancelled()) co_return cancelledError(destination);
  if (connectError == beast::error::timeout) {
    co_return timeoutError(destination, limits, "connecting");
  }
  if (connectError) {
    // A socket that could not even be opened (no file descriptor left) comes back from the
    // range connect as "Operation canceled": say what it was.
    std::optional<std::string> local;
    if (connectError == asio::error::operation_aborted) {
      local = socketOpenFailure(endpoints.front().protocol());
    }
    if (local) {
      co_return FetchError{FetchErrc::connectFailed,
                           "Could not connect to " + destination.origin +
                               ": the daemon could not open a socket (" + *local +
                               "). It is out of resources, not the server; try again later."};
    }
    std::string tried;
    for (const auto& address : addresses) {
      tried += (tried.empty() ? "" : ", ") + formatAddress(address);
    }
    co_return FetchError{FetchErrc::connectFailed,
                         "Could not connect to " + destination.origin + " (" + tried + " port " +
                             std::to_string(destination.port) + "): " + connectError.message() +
                             ". Check that the server is up and reachable from the daemon."};
  }
  const asio::ip::address remote = endpoint.address();

  // TLS: SNI and host-name verification for names, IP-address verification for literals; the
  // chain against the system store and [fetch] extra_ca_file.
  SSL* tls = stream.native_handle();
  bool configured = false;
  if (destination.literal) {
    configured = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(tls),
                                               formatAddress(*destination.literal).c_str()) == 1;
  } else {
    // Names only from subjectAltName: never the subject's common name (browsers stopped
    // accepting it in 2017; a private CA's old certificates may still rely on it).
    SSL_set_hostflags(tls,
                      X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS | X509_CHECK_FLAG_NEVER_CHECK_SUBJECT);
    configured = SSL_set_tlsext_host_name(tls, destination.host.c_str()) == 1 &&
                 SSL_set1_host(tls, destination.host.c_str()) == 1;
  }
  if (!configured) {
    co_return FetchError{FetchErrc::tlsFailed,
                         "Could not set up TLS verification for " + destination.host + "."};
  }
  auto [handshakeFailure] = co_await stream.async_handshake(ssl::stream_base::client,
                                                            asio::as_tuple(asio::use_awaitable));
  if (cancelled()) co_return cancelledError(destination);
  if (handshakeFailure == beast::error::timeout) {
    co_return timeoutError(destination, limits, "in the TLS handshake");
  }
  if (handshakeFailure) co_return handshakeError(tls, handshakeFailure, destination);

  // The request, then the response: a fresh parser per message, limits on both parts.
  const bool head = request.method == "HEAD";
  http::request<http::string_body> outgoing = buildRequest(request);
  auto [writeError, written] =
      co_await http::async_write(stream, outgoing, asio::as_tuple(asio::use_awaitable));
  if (cancelled()) co_return cancelledError(destination);
  if (writeError) co_return exchangeError(writeError, destination, limits, "sending the request");

  beast::flat_buffer buffer(kReadBufferBytes);
  auto share = std::make_shared<BufferedShare>(buffered_, std::move(ownerPool));
  auto grow = [&](std::size_t total) {
    return share->growTo(total, limits.maxBufferedBytes, limits.maxOwnerBufferedBytes);
  };
  std::optional<http::response<http::string_body>> final;
  for (int interim = 0; !final; ++interim) {
    http::response_parser<http::string_body> parser;
    parser.header_limit(static_cast<std::uint32_t>(kMaxResponseHeaderBytes));
    parser.body_limit(static_cast<std::uint64_t>(limits.maxResponseBytes));
    parser.skip(head);
    // The body is charged to the client's buffered bytes (and its owner's) as it arrives, so
    // that all fetches together hold at most limits.maxBufferedBytes, and one owner's at most
    // limits.maxOwnerBufferedBytes, however many run at once.
    auto [readError, read] = co_await http::async_read_header(stream, buffer, parser,
                                                              asio::as_tuple(asio::use_awaitable));
    // A declared length is reserved whole as the body begins (string_body): charged at once.
    if (!readError && !parser.is_done() && parser.content_length()) {
      const auto grown = grow(static_cast<std::size_t>(*parser.content_length()));
      if (grown != BufferedShare::Grown::yes) co_return bufferedError(destination, limits, grown);
    }
    while (!readError && !cancelled() && !parser.is_done()) {
      std::tie(readError, read) = co_await http::async_read_some(
          stream, buffer, parser, asio::as_tuple(asio::use_awaitable));
      const auto grown = grow(parser.get().body().size());
      if (grown != BufferedShare::Grown::yes) co_return bufferedError(destination, limits, grown);
    }
    if (cancelled()) co_return cancelledError(destination);
    // A body that ends with the connection: the server may close without close_notify (pitfall
    // 7), which is how most servers end such a body; browsers accept it too.
    if (readError == ssl::error::stream_truncated && parser.is_header_done() && !parser.is_done() &&
        parser.need_eof()) {
      error_code eofError;
      parser.put_eof(eofError);
      if (!eofError) readError = {};
    }
    if (readError == http::error::buffer_overflow && parser.is_header_done()) {
      co_return FetchError{FetchErrc::responseTooLarge,
                           "The response from " + destination.origin +
                               " has chunked-encoding framing (a chunk-size line with its "
                               "extensions, or the trailer) longer than the limit of " +
                               bytes(kReadBufferBytes) + "."};
    }
    if (readError) co_return exchangeError(readError, destination, limits, "reading the response");
    const unsigned status = parser.get().result_int();
    // 1xx..5xx as HTTP defines them; 101 only answers an Upgrade, which fetch never asks for.
    if (status < 100 || status > 599 || status == 101) {
      co_return FetchError{FetchErrc::connectFailed, destination.origin + " answered with status " +
                                                         std::to_string(status) +
                                                         ", which is not a response to a fetch."};
    }
    if (status >= 100 && status < 200 && status != 101) {
      if (interim >= kMaxInterimResponses) {
        co_return FetchError{FetchErrc::connectFailed,
                             destination.origin + " sent more than " +
                                 std::to_string(kMaxInterimResponses) +
                                 " interim (1xx) responses without a final one."};
      }
      continue;
    }
    final.emplace(parser.release());
  }

  // Close politely but briefly: stream_truncated, eof or a timeout here change nothing, the
  // response is complete.
  const auto remaining =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (remaining.count() > 0) {
    transport.expires_after(std::min(remaining, kShutdownGrace));
    co_await stream.async_shutdown(asio::as_tuple(asio::use_awaitable));
  }
  transport.close();
  if (cancelled()) co_return cancelledError(destination);
  HttpResponse response = toResponse(std::move(*final), remote);
  response.buffered = std::move(share);
  co_return response;
}

}  // namespace toolhost::policy
