#include "tests/support/https_test_server.h"

#include <stdlib.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <cctype>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>

namespace toolhost::testing {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using Stream = ssl::stream<tcp::socket>;
using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

namespace {

constexpr std::size_t kMaxRequestBody = std::size_t{64} << 20;

std::optional<std::string> queryParameter(std::string_view query, std::string_view key) {
  while (!query.empty()) {
    const auto end = query.find('&');
    const std::string_view pair = query.substr(0, end);
    if (pair.size() > key.size() && pair.substr(0, key.size()) == key && pair[key.size()] == '=') {
      return std::string(pair.substr(key.size() + 1));
    }
    if (end == std::string_view::npos) break;
    query.remove_prefix(end + 1);
  }
  return std::nullopt;
}

// %XX sequences as the bytes they stand for (the tests write them well-formed).
std::string percentDecoded(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size()) {
      out += static_cast<char>(std::stoi(std::string(text.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

std::size_t numberParameter(std::string_view query, std::string_view key, std::size_t fallback) {
  const auto text = queryParameter(query, key);
  if (!text) return fallback;
  try {
    return static_cast<std::size_t>(std::stoull(*text));
  } catch (const std::exception&) {
    return fallback;
  }
}

Response textResponse(http::status status, std::string body,
                      std::string_view contentType = "text/plain") {
  Response response{status, 11};
  response.set(http::field::content_type, contentType);
  response.body() = std::move(body);
  return response;
}

// What a route did with the connection.
enum class After { keepServing, closed };

}  // namespace

struct HttpsTestServer::Impl {
  explicit Impl(HttpsTestServerOptions options);

  asio::awaitable<void> acceptLoop();
  asio::awaitable<void> serve(tcp::socket socket);
  asio::awaitable<After> respond(Stream& stream, Request& request);
  asio::awaitable<After> send(Stream& stream, bool head, bool keepAlive, Response response);
  void record(const std::string& path);
  void markClosed();

  HttpsTestServerOptions options;
  std::shared_ptr<const TestCa> ca;
  std::filesystem::path dir;
  std::filesystem::path caFile;
  // Order matters: coroutine frames destroyed with ioc use tls, and the acceptor must go first.
  ssl::context tls{ssl::context::tls_server};
  asio::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  std::uint16_t port = 0;
  std::thread thread;

  mutable std::mutex mutex;
  mutable std::condition_variable changed;
  std::string note;  // what the last POST to /notes stored (under mutex)
  std::map<std::string, std::size_t, std::less<>> requests;
  std::size_t total = 0;
  std::size_t accepted = 0;
  std::size_t closed = 0;
};

HttpsTestServer::Impl::Impl(HttpsTestServerOptions opts)
    : options(std::move(opts)), ca(options.ca ? options.ca : std::make_shared<const TestCa>()) {
  std::string pattern = (std::filesystem::temp_directory_path() / "toolhost-https-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("cannot create a temp dir");
  dir = pattern;
  caFile = dir / "ca.pem";
  ca->writeCertificate(caFile);

  const IssuedCertificate leaf = options.commonNameOnly.empty()
                                     ? ca->issue(options.dnsNames, options.ipAddresses)
                                     : ca->issue({}, {}, options.commonNameOnly);
  tls.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                  ssl::context::no_sslv3);
  tls.use_certificate_chain(asio::buffer(leaf.certificatePem));
  tls.use_private_key(asio::buffer(leaf.privateKeyPem), ssl::context::pem);

  const tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"), 0);
  acceptor.open(endpoint.protocol());
  acceptor.set_option(tcp::acceptor::reuse_address(true));
  acceptor.bind(endpoint);
  acceptor.listen();
  port = acceptor.local_endpoint().port();
}

void HttpsTestServer::Impl::record(const std::string& path) {
  {
    std::lock_guard lock(mutex);
    ++requests[path];
    ++total;
  }
  changed.notify_all();
}

void HttpsTestServer::Impl::markClosed() {
  {
    std::lock_guard lock(mutex);
    ++closed;
  }
  changed.notify_all();
}

asio::awaitable<void> HttpsTestServer::Impl::acceptLoop() {
  for (;;) {
    auto [ec, socket] = co_await acceptor.async_accept(asio::as_tuple(asio::use_awaitable));
    if (ec) {
      if (!acceptor.is_open()) co_return;
      continue;
    }
    {
      std::lock_guard lock(mutex);
      ++accepted;
    }
    asio::co_spawn(ioc, serve(std::move(socket)), [](std::exception_ptr failure) {
      if (!failure) return;
      try {
        std::rethrow_exception(failure);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "https test server: connection failed: %s\n", e.what());
      }
    });
  }
}

asio::awaitable<void> HttpsTestServer::Impl::serve(tcp::socket socket) {
  Stream stream(std::move(socket), tls);
  auto [handshakeError] = co_await stream.async_handshake(ssl::stream_base::server,
                                                          asio::as_tuple(asio::use_awaitable));
  if (!handshakeError) {
    beast::flat_buffer buffer;
    for (;;) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(kMaxRequestBody);
      // Room for what the daemon may send: 64 KiB of the tool's headers and what secrets add.
      parser.header_limit(1U << 20);
      auto [readError, read] =
          co_await http::async_read(stream, buffer, parser, asio::as_tuple(asio::use_awaitable));
      if (readError) break;  // the client closed, or sent something that is not HTTP
      Request request = parser.release();
      const bool keepAlive = request.keep_alive();
      if (co_await respond(stream, request) == After::closed) break;
      if (!keepAlive) {
        co_await stream.async_shutdown(asio::as_tuple(asio::use_awaitable));
        break;
      }
    }
  }
  markClosed();
}

asio::awaitable<After> HttpsTestServer::Impl::send(Stream& stream, bool head, bool keepAlive,
                                                   Response response) {
  response.keep_alive(keepAlive);
  if (!response.chunked()) response.prepare_payload();
  if (head) {
    if (response.chunked()) response.chunked(false);  // (which also erases Content-Length)
    http::response<http::empty_body> headOnly{std::move(response.base())};
    auto [ec, n] =
        co_await http::async_write(stream, headOnly, asio::as_tuple(asio::use_awaitable));
    co_return ec ? After::closed : After::keepServing;
  }
  auto [ec, n] = co_await http::async_write(stream, response, asio::as_tuple(asio::use_awaitable));
  co_return ec ? After::closed : After::keepServing;
}

asio::awaitable<After> HttpsTestServer::Impl::respond(Stream& stream, Request& request) {
  const std::string target(request.target());
  const auto question = target.find('?');
  const std::string path = target.substr(0, question);
  const std::string query = question == std::string::npos ? "" : target.substr(question + 1);
  const bool head = request.method() == http::verb::head;
  const bool keepAlive = request.keep_alive();
  record(path);

  if (path == "/ok")
    co_return co_await send(stream, head, keepAlive, textResponse(http::status::ok, "ok"));
  if (path == "/json") {
    co_return co_await send(stream, head, keepAlive,
                            textResponse(http::status::ok, R"({"ok":true})", "application/json"));
  }
  if (path == "/echo") {
    boost::json::array headers;
    for (const auto& field : request) {
      headers.push_back(boost::json::array{boost::json::string_view(field.name_string()),
                                           boost::json::string_view(field.value())});
    }
    boost::json::object echo{{"method", std::string(request.method_string())},
                             {"target", target},
                             {"headers", std::move(headers)},
                             {"body", request.body()}};
    co_return co_await send(
        stream, head, keepAlive,
        textResponse(http::status::ok, boost::json::serialize(echo), "application/json"));
  }
  if (path == "/notes") {
    // Keeps what a POST sends; a GET reads it back (a notes or paste service).
    std::string body;
    {
      std::lock_guard lock(mutex);
      if (request.method() == http::verb::post) note = request.body();
      body = note;
    }
    co_return co_await send(stream, head, keepAlive, textResponse(http::status::ok, body));
  }
  if (path == "/auth-in-names") {
    // The last word of the Authorization header, echoed where a value is not looked for
    // usually: in a response header's name and in the reason phrase.
    const std::string authorization(request[http::field::authorization]);
    const std::string token = authorization.substr(authorization.rfind(' ') + 1);
    Response response = textResponse(http::status::ok, "ok");
    response.reason("OK " + token);
    if (!token.empty()) response.set("X-" + token, "1");
    co_return co_await send(stream, head, keepAlive, std::move(response));
  }
  if (path == "/redirect") {
    Response response = textResponse(http::status::found, "see /ok");
    response.set(http::field::location, "/ok");
    co_return co_await send(stream, head, keepAlive, std::move(response));
  }
  if (path == "/redirect-auth") {
    // A 302 to `to` (percent-decoded) with the last word of the Authorization header as its
    // token query parameter: a server that sends a credential on. `form`: "upper" writes the
    // word in capitals, "encoded" percent-encodes each of its bytes ("double": twice, as a URL in
    // a query parameter), "path" puts it in the path.
    const std::string authorization(request[http::field::authorization]);
    std::string token = authorization.substr(authorization.rfind(' ') + 1);
    const std::string form(queryParameter(query, "form").value_or(""));
    if (form == "upper") {
      for (char& c : token) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    } else if (form == "encoded" || form == "double") {
      static constexpr char kHex[] = "0123456789abcdef";
      for (int round = form == "double" ? 2 : 1; round > 0; --round) {
        std::string encoded;
        for (const char c : token) {
          encoded += '%';
          encoded += kHex[static_cast<unsigned char>(c) >> 4];
          encoded += kHex[static_cast<unsigned char>(c) & 0xF];
        }
        token = encoded;
      }
    }
    std::string location = percentDecoded(queryParameter(query, "to").value_or(""));
    location += form == "path" ? "/" + token : "?token=" + token;
    Response response = textResponse(http::status::found, "see elsewhere");
    response.set(http::field::location, location);
    co_return co_await send(stream, head, keepAlive, std::move(response));
  }
  if (path == "/redirect-loop") {
    Response response = textResponse(http::status::found, "again");
    response.set(http::field::location, "/redirect-loop");
    co_return co_await send(stream, head, keepAlive, std::move(response));
  }
  if (path == "/redirect-to") {
    // A redirect with status `code` (default 302) to `to`, percent-decoded (absent: none).
    const auto code = static_cast<unsigned>(numberParameter(query, "code", 302));
    Response response = textResponse(static_cast<http::status>(code), "redirect");
    if (auto to = queryParameter(query, "to")) {
      response.set(http::field::location, percentDecoded(*to));
    }
    co_return co_await send(stream, head, keepAlive, std::move(response));
  }
  if (path == "/big") {
    Response response =
        textResponse(http::status::ok, std::string(numberParameter(query, "bytes", 0), 'x'));
    if (queryParameter(query, "chunked") == "1") response.chunked(true);
    co_return co_await send(stream, head, keepAlive, std::move(response));
  }
  if (path == "/big-header") {
    // Beast caps one field value below 64 KiB: spread the bytes over X-Big-<i> headers.
    Response response = textResponse(http::status::ok, "ok");
    std::size_t left = numberParameter(query, "bytes", 0);
    for (int i = 0; left > 0; ++i) {
      const std::size_t n = std::min<std::size_t>(left, 8192);
      response.set("X-Big-" + std::to_string(i), std::string(n, 'y'));
      left -= n;
    }
    co_return co_await send(stream, head, keepAlive, std::move(response));
  }
  if (path == "/close-delimited") {
    // No Content-Length, no chunking: the body ends when the TCP connection does, and it ends
    // without close_notify, as many servers end such bodies.
    Response response =
        textResponse(http::status::ok, std::string(numberParameter(query, "bytes", 0), 'z'));
    response.keep_alive(false);
    if (!head) {
      co_await http::async_write(stream, response, asio::as_tuple(asio::use_awaitable));
    }
    boost::system::error_code ignored;
    stream.next_layer().shutdown(tcp::socket::shutdown_send, ignored);
    // Wait for the client to close its side, so the close is a FIN and not a reset.
    char byte = 0;
    co_await stream.next_layer().async_read_some(asio::buffer(&byte, 1),
                                                 asio::as_tuple(asio::use_awaitable));
    stream.next_layer().close(ignored);
    co_return After::closed;
  }
  if (path == "/early-hints") {
    http::response<http::empty_body> hints{static_cast<http::status>(103), 11};
    hints.set(http::field::link, "</style.css>; rel=preload; as=style");
    co_await http::async_write(stream, hints, asio::as_tuple(asio::use_awaitable));
    co_return co_await send(stream, head, keepAlive, textResponse(http::status::ok, "ok"));
  }
  if (path == "/slow") {
    asio::steady_timer timer(stream.get_executor(),
                             std::chrono::milliseconds(numberParameter(query, "ms", 1000)));
    co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
    co_return co_await send(stream, head, keepAlive, textResponse(http::status::ok, "ok"));
  }
  if (path == "/stall") {
    const std::string start = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " +
                              std::to_string(numberParameter(query, "bytes", 2)) + "\r\n\r\nx";
    co_await asio::async_write(stream, asio::buffer(start), asio::as_tuple(asio::use_awaitable));
    if (const std::size_t ms = numberParameter(query, "ms", 0); ms > 0) {
      asio::steady_timer timer(stream.get_executor(), std::chrono::milliseconds(ms));
      co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
      co_return After::closed;
    }
    char byte = 0;
    for (;;) {
      auto [ec, n] = co_await stream.async_read_some(asio::buffer(&byte, 1),
                                                     asio::as_tuple(asio::use_awaitable));
      if (ec) co_return After::closed;
    }
  }
  if (path == "/framing") {
    const std::string kind = queryParameter(query, "kind").value_or("");
    std::string framing =
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
        "Transfer-Encoding: chunked\r\n\r\n";
    const std::size_t n = numberParameter(query, "bytes", 0);
    if (kind == "extension") {
      framing += "5;x=" + std::string(n, 'a');
    } else if (kind == "zeros") {
      framing += std::string(n, '0');
    } else {
      framing += "1\r\nx\r\n0\r\nX-T: " + std::string(n, 'a');
    }
    auto [ec, written] = co_await asio::async_write(stream, asio::buffer(framing),
                                                    asio::as_tuple(asio::use_awaitable));
    char byte = 0;
    while (!ec) {
      std::tie(ec, written) = co_await stream.async_read_some(asio::buffer(&byte, 1),
                                                              asio::as_tuple(asio::use_awaitable));
    }
    co_return After::closed;
  }
  if (path == "/hang") {
    // Read until the client goes away; whatever it sends is ignored.
    char byte = 0;
    for (;;) {
      auto [ec, n] = co_await stream.async_read_some(asio::buffer(&byte, 1),
                                                     asio::as_tuple(asio::use_awaitable));
      if (ec) co_return After::closed;
    }
  }
  if (path == "/rpc") {
    boost::json::object answer{{"jsonrpc", "2.0"}, {"id", nullptr}};
    boost::system::error_code parseError;
    const boost::json::value call = boost::json::parse(request.body(), parseError);
    const boost::json::object* fields = parseError ? nullptr : call.if_object();
    const boost::json::value* params = fields ? fields->if_contains("params") : nullptr;
    if (fields == nullptr || params == nullptr || !params->is_object() ||
        fields->if_contains("method") == nullptr || fields->at("method") != "tools.call") {
      answer["error"] = boost::json::object{{"code", -32600}, {"message", "not a tools.call"}};
    } else {
      if (const auto* id = fields->if_contains("id")) answer["id"] = *id;
      const auto& object = params->as_object();
      const boost::json::value* arguments = object.if_contains("arguments");
      const boost::json::value* fail = arguments && arguments->is_object()
                                           ? arguments->as_object().if_contains("fail")
                                           : nullptr;
      if (fail != nullptr && fail->is_string()) {
        answer["error"] = boost::json::object{{"code", -32000}, {"message", *fail}};
      } else {
        answer["result"] = boost::json::object{
            {"name", object.contains("name") ? object.at("name") : boost::json::value()},
            {"arguments", arguments ? *arguments : boost::json::value()}};
      }
    }
    co_return co_await send(
        stream, head, keepAlive,
        textResponse(http::status::ok, boost::json::serialize(answer), "application/json"));
  }
  if (path == "/status") {
    const auto code = static_cast<unsigned>(numberParameter(query, "code", 200));
    Response response{static_cast<http::status>(code), 11};
    if (code >= 200 && code != 204 && code != 304)
      response.body() = "status " + std::to_string(code);
    co_return co_await send(stream, head, keepAlive, std::move(response));
  }
  co_return co_await send(stream, head, keepAlive,
                          textResponse(http::status::not_found, "no such route"));
}

HttpsTestServer::HttpsTestServer(HttpsTestServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {
  asio::co_spawn(impl_->ioc, impl_->acceptLoop(), [](std::exception_ptr failure) {
    if (failure) std::fprintf(stderr, "https test server: the accept loop failed\n");
  });
  impl_->thread = std::thread([impl = impl_.get()] { impl->ioc.run(); });
}

HttpsTestServer::~HttpsTestServer() {
  asio::post(impl_->ioc, [impl = impl_.get()] {
    boost::system::error_code ignored;
    impl->acceptor.close(ignored);
    impl->ioc.stop();
  });
  impl_->thread.join();
  std::error_code ignored;
  std::filesystem::remove_all(impl_->dir, ignored);
}

std::uint16_t HttpsTestServer::port() const { return impl_->port; }

std::string HttpsTestServer::origin() const {
  return "https://127.0.0.1:" + std::to_string(impl_->port);
}

std::string HttpsTestServer::url(std::string_view pathAndQuery) const {
  return origin() + std::string(pathAndQuery);
}

std::string HttpsTestServer::urlForName(std::string_view pathAndQuery,
                                        std::string_view name) const {
  return "https://" + std::string(name) + ":" + std::to_string(impl_->port) +
         std::string(pathAndQuery);
}

const TestCa& HttpsTestServer::ca() const { return *impl_->ca; }

const std::filesystem::path& HttpsTestServer::caFile() const { return impl_->caFile; }

std::size_t HttpsTestServer::requestCount(std::string_view path) const {
  std::lock_guard lock(impl_->mutex);
  const auto found = impl_->requests.find(path);
  return found == impl_->requests.end() ? 0 : found->second;
}

std::size_t HttpsTestServer::totalRequests() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->total;
}

std::size_t HttpsTestServer::connectionsAccepted() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->accepted;
}

std::size_t HttpsTestServer::connectionsClosed() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->closed;
}

bool HttpsTestServer::waitForConnectionsClosed(std::size_t count,
                                               std::chrono::milliseconds timeout) const {
  std::unique_lock lock(impl_->mutex);
  return impl_->changed.wait_for(lock, timeout, [&] { return impl_->closed >= count; });
}

bool HttpsTestServer::waitForRequests(std::string_view path, std::size_t count,
                                      std::chrono::milliseconds timeout) const {
  std::unique_lock lock(impl_->mutex);
  return impl_->changed.wait_for(lock, timeout, [&] {
    const auto found = impl_->requests.find(path);
    return found != impl_->requests.end() && found->second >= count;
  });
}

}  // namespace toolhost::testing
