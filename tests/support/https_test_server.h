// Test support: a local HTTPS/1.1 server with its own test CA, listening on 127.0.0.1 on an
// ephemeral port, serving scripted routes on its own thread and io_context. The mediated fetch
// tests use it in process; end-to-end tests give the daemon caFile() as [fetch] extra_ca_file and
// open 127.0.0.1 with allow_private. Depends on Boost and OpenSSL only, never on daemon code.
// Counters and accessors may be read from any thread while the server runs.
//
// Routes (the path decides; the query carries parameters; HEAD works on every route):
//   /ok                 200 text/plain "ok"
//   /json               200 application/json {"ok":true}
//   /echo               200 application/json {"method","target","headers":[[name,value]...],"body"}
//   /notes              200, a POST's body kept; a GET answers the last one kept
//   /auth-in-names      200 "ok", the Authorization header's last word in the reason phrase
//                       ("OK <word>") and in the name of a header X-<word>: 1
//   /redirect           302 to /ok (Location: /ok)
//   /big?bytes=N        200 with N bytes of 'x'; &chunked=1 sends them chunked, no Content-Length
//   /big-header?bytes=N 200 with N bytes in X-Big-<i> headers
//   /close-delimited?bytes=N  200 without Content-Length, the body ended by closing the TCP
//                       connection without TLS close_notify
//   /early-hints        103 Early Hints, then 200 "ok"
//   /slow?ms=N          waits N ms before the response headers
//   /hang               never answers; holds the connection until the client closes it
//   /framing?kind=K&bytes=N  200 chunked, then N bytes of framing that never ends, and nothing
//                       more until the client closes the connection: K=extension a chunk-size
//                       line "5;x=aaa...", K=zeros a chunk size "000...", K=trailer a trailer
//                       field "X-T: aaa..." after the last chunk
//   /stall?bytes=N      headers with Content-Length N and one byte of the body, then nothing
//                       more until the client closes the connection; &ms=M closes it after M ms
//   /status?code=N      status N, body "status N" (no body for 1xx, 204, 304)
//   /rpc                a JSON-RPC endpoint of an external-service tool: a POSTed tools.call
//                       {name, arguments} is answered with the result {name, arguments} (an
//                       echo), or with the error {code: -32000, message: arguments.fail} when
//                       arguments.fail is a string; anything else gets a JSON-RPC error
//   anything else       404
#pragma once

#include "tests/support/test_ca.h"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace toolhost::testing {

struct HttpsTestServerOptions {
  // The CA that issues the server certificate; a fresh one when null. Share one to make two
  // servers trusted by the same extra_ca_file.
  std::shared_ptr<const TestCa> ca;
  // Subject alternative names of the server certificate.
  std::vector<std::string> dnsNames{"toolhost-test.example"};
  std::vector<std::string> ipAddresses{"127.0.0.1"};
  // Set: the certificate names only this, as its subject's common name, with no subject
  // alternative names (dnsNames and ipAddresses are then ignored).
  std::string commonNameOnly;
};

class HttpsTestServer {
 public:
  static constexpr std::string_view kDnsName = "toolhost-test.example";

  // Listens before returning. Throws std::runtime_error if it cannot.
  explicit HttpsTestServer(HttpsTestServerOptions options = {});
  // Stops the thread; connections still open are dropped.
  ~HttpsTestServer();
  HttpsTestServer(const HttpsTestServer&) = delete;
  HttpsTestServer& operator=(const HttpsTestServer&) = delete;

  std::uint16_t port() const;
  // "https://127.0.0.1:<port>" and that plus `pathAndQuery` ("/ok").
  std::string origin() const;
  std::string url(std::string_view pathAndQuery) const;
  // The same on the DNS name: "https://toolhost-test.example:<port>/ok" (resolve it to 127.0.0.1).
  std::string urlForName(std::string_view pathAndQuery, std::string_view name = kDnsName) const;

  const TestCa& ca() const;
  // A PEM file holding the CA certificate, removed with the server.
  const std::filesystem::path& caFile() const;

  // Requests received (fully read) for `path`, without its query, e.g. requestCount("/ok").
  std::size_t requestCount(std::string_view path) const;
  std::size_t totalRequests() const;
  // TCP connections accepted, and those the server has finished with (the client closed, the
  // handshake failed, or the exchange ended).
  std::size_t connectionsAccepted() const;
  std::size_t connectionsClosed() const;
  // Waits until connectionsClosed() >= count; false on timeout.
  bool waitForConnectionsClosed(std::size_t count, std::chrono::milliseconds timeout) const;
  // Waits until requestCount(path) >= count; false on timeout.
  bool waitForRequests(std::string_view path, std::size_t count,
                       std::chrono::milliseconds timeout) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace toolhost::testing
