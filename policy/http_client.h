// The mediated HTTPS request: the daemon's own HTTP/1.1 client for sandboxed fetch, called after
// the policy engine authorized the destination. Checks the request, resolves and checks every DNS
// answer, connects to an address that passed (pinned), verifies TLS, sends exactly what the tool
// asked plus the headers the daemon owns, and returns the response or a FetchError. No cookies,
// no redirects, no proxies, no ambient credentials.
// Threads: fetch() may be called concurrently from any coroutine; each fetch runs its I/O on the
// awaiting coroutine's executor, which must be a strand or a single-threaded io_context (as every
// connection and sandbox strand in the daemon is). The client must outlive every fetch.
#pragma once

#include "policy/destination.h"
#include "policy/http_error.h"
#include "policy/http_resolver.h"

#include <boost/asio/awaitable.hpp>
#include <boost/system/result.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace toolhost::policy {

struct HttpRequest {
  std::string method = "GET";  // as normalizeMethod() gives it; any other token is sent as is
  Destination destination;     // from parseDestination()
  // Sent in order, names as given, values with surrounding spaces and tabs trimmed. Names the
  // daemon owns are refused (see checkRequest()).
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};

// Response bytes held at once by every fetch of one client together: charged while a body is
// received, given back when the response that holds them is destroyed. Thread-safe.
class BufferedBytes {
 public:
  // Takes `bytes` more unless that would pass `cap`.
  bool take(std::size_t bytes, std::size_t cap);
  void give(std::size_t bytes);
  std::size_t held() const { return held_.load(); }

 private:
  std::atomic<std::size_t> held_{0};
};

// A response's share of its client's BufferedBytes and of its owner's (when the fetch has an
// owner), given back to both when the last copy goes.
class BufferedShare {
 public:
  BufferedShare(std::shared_ptr<BufferedBytes> pool, std::shared_ptr<BufferedBytes> ownerPool)
      : pool_(std::move(pool)), ownerPool_(std::move(ownerPool)) {}
  ~BufferedShare();
  BufferedShare(const BufferedShare&) = delete;
  BufferedShare& operator=(const BufferedShare&) = delete;
  enum class Grown { yes, ownerFull, clientFull };
  // Grows the share to `total` bytes; unchanged if the owner's pool would pass `ownerCap` or the
  // client's would pass `cap`.
  Grown growTo(std::size_t total, std::size_t cap, std::size_t ownerCap);
  std::size_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<BufferedBytes> pool_;
  std::shared_ptr<BufferedBytes> ownerPool_;  // null: no owner
  std::size_t bytes_ = 0;
};

struct HttpResponse {
  unsigned status = 0;
  std::string statusText;
  // In the order received, names lowercased. Set-Cookie is returned like any header, never stored.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;           // empty for HEAD, 1xx, 204 and 304
  std::string remoteAddress;  // the address connected to, as formatAddress() writes it
  // The body's bytes in the client's BufferedBytes (FetchLimits::maxBufferedBytes), held until
  // the response and its copies are destroyed. Drop the response once its body is passed on.
  std::shared_ptr<BufferedShare> buffered;
};

struct FetchLimits {
  std::size_t maxRequestBodyBytes = std::size_t{8} << 20;
  std::size_t maxResponseBytes = std::size_t{16} << 20;  // the body; headers have their own cap
  // Every response body the client holds at once (being received, or returned and not yet
  // destroyed), all fetches together: a body that would pass it fails with response-too-large.
  std::size_t maxBufferedBytes = std::size_t{256} << 20;
  // Of those, what the fetches of one owner (fetch()'s `owner`) hold at once, so that one owner
  // cannot take the room of all others.
  std::size_t maxOwnerBufferedBytes = std::size_t{64} << 20;
  std::chrono::milliseconds timeout{30000};  // DNS, connect, TLS, request and response together
  // Bytes the daemon's secrets added to the header values and to the body after the tool's
  // request passed checkRequest() with its placeholders: allowed beyond the header and body
  // limits, each for its own part, so that a secret's length never decides whether a request
  // fails (a tool could measure it so).
  std::size_t secretHeaderBytes = 0;
  std::size_t secretBodyBytes = 0;
};

// Request headers the tool may not set, because the daemon owns them or because they would carry
// what the daemon never sends. Case-insensitive, and '_' counts as '-' (CGI, WSGI and PHP
// servers read X_HTTP_METHOD_OVERRIDE as X-HTTP-Method-Override); "proxy-" and "sec-" are
// prefixes.
//   framing and connection: host, content-length, transfer-encoding, te, trailer, connection,
//     keep-alive, upgrade, expect, http2-settings
//   content coding: accept-encoding (the daemon asks for identity: bodies are returned as sent)
//   cookies: cookie, cookie2, set-cookie (no cookies are ever sent or stored)
//   proxies: proxy-* (no proxy is used, and proxy credentials must not reach origins)
//   method overrides: x-http-method, x-http-method-override, x-method-override (they would let a
//     request authorized as read act as a write on servers that honour them)
//   browser-owned: sec-*
bool isForbiddenRequestHeader(std::string_view name);

// The checks fetch() makes before any I/O, for callers that want to refuse a request before
// asking a human: a method that is an RFC 9110 token other than CONNECT, TRACE and TRACK; header
// names that are tokens and not forbidden; values of visible ASCII, obs-text, SP and HTAB (no CR,
// LF, NUL or other controls); at most kMaxRequestHeaders headers in kMaxRequestHeaderBytes; a
// body within limits.maxRequestBodyBytes; a destination whose host, literal and target
// parseDestination() could have made.
constexpr std::size_t kMaxRequestHeaders = 100;
constexpr std::size_t kMaxRequestHeaderBytes = 64 * 1024;
constexpr std::size_t kMaxResponseHeaderBytes = 64 * 1024;
boost::system::result<void, FetchError> checkRequest(const HttpRequest& request,
                                                     const FetchLimits& limits);

using FetchResult = boost::system::result<HttpResponse, FetchError>;

class HttpClient {
 public:
  // Trusts the system CA store (OpenSSL's default paths) plus every certificate in
  // `extraCaFile` ([fetch] extra_ca_file, PEM), read now: a changed file needs a new client.
  // Throws std::runtime_error naming the file when it cannot be read or holds no certificate.
  // `rules` judges literal destinations again and every DNS answer ([fetch] allow_private).
  HttpClient(AddressRules rules, std::optional<std::filesystem::path> extraCaFile,
             std::shared_ptr<Resolver> resolver = makeSystemResolver());
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // One request on a fresh connection (Connection: close). A 3xx is returned, not followed.
  // Terminal cancellation of the awaiting coroutine (its cancellation slot) aborts the exchange,
  // closes the socket and answers cancelled; partial and total cancellation are ignored, as the
  // awaitable's default filter has it. The response's body counts against
  // limits.maxBufferedBytes, and against limits.maxOwnerBufferedBytes among the fetches of the
  // same non-empty `owner` (the daemon passes the tool's name).
  boost::asio::awaitable<FetchResult> fetch(HttpRequest request, FetchLimits limits = {},
                                            std::string owner = {});

  const AddressRules& rules() const { return rules_; }
  // Response bytes held now (FetchLimits::maxBufferedBytes), all owners' or one's. Any thread.
  std::size_t bufferedBytes() const { return buffered_->held(); }
  std::size_t bufferedBytes(const std::string& owner) const;
  // A share of these buffered bytes (and of `owner`'s, when not empty) for response bytes this
  // client does not read itself (an external service's answer over a Unix socket), grown with
  // FetchLimits' maxBufferedBytes and maxOwnerBufferedBytes like a fetch's.
  std::shared_ptr<BufferedShare> bufferedShare(const std::string& owner);

 private:
  boost::asio::awaitable<FetchResult> exchange(HttpRequest request, FetchLimits limits,
                                               std::shared_ptr<BufferedBytes> ownerPool);
  // The pool of `owner`'s fetches, shared while any of its responses holds bytes in it.
  std::shared_ptr<BufferedBytes> ownerPool(const std::string& owner);

  struct Tls;  // the OpenSSL client context, kept out of this header

  AddressRules rules_;
  std::shared_ptr<Resolver> resolver_;
  std::unique_ptr<Tls> tls_;
  std::shared_ptr<BufferedBytes> buffered_ = std::make_shared<BufferedBytes>();
  mutable std::mutex ownersMutex_;
  std::unordered_map<std::string, std::weak_ptr<BufferedBytes>> owners_;
  std::size_t ownersAfterSweep_ = 0;  // entries left by the last sweep of expired ones
};

// "toolhost/<version>", sent as User-Agent unless the request has one.
std::string_view defaultUserAgent();

}  // namespace toolhost::policy
