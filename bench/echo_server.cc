// The transport floor: a bare Asio NDJSON JSON-RPC echo server. It does what toolhostd's
// transport does for every line, minus method dispatch: frame lines (protocol::LineFramer, same
// 64 KiB reads), decode each with the same strict parser and envelope checks
// (protocol::decodeMessage: Boost.JSON with duplicate-key, UTF-8, depth and number checks), build
// a response with the same id and the params as the result (protocol::resultResponse), and write
// it as one line (protocol::encodeLine). Responses to every line of one read go out in one write.
// One coroutine per connection, each on its own strand; the io_context runs on `threads` threads
// (1, the daemon's default io_threads). Stops on SIGINT or SIGTERM.
#include "bench/bench.h"
#include "protocol/framing.h"
#include "protocol/jsonrpc.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include <csignal>
#include <cstdio>
#include <thread>
#include <variant>

namespace toolhost::bench {
namespace asio = boost::asio;
using Socket = asio::local::stream_protocol::socket;

namespace {

constexpr std::size_t kReadChunk = 64 * 1024;
constexpr auto kAwaitable = asio::as_tuple(asio::use_awaitable);

void answer(std::string_view line, const protocol::WireLimits& limits, std::string& out) {
  auto decoded = protocol::decodeMessage(line, limits);
  if (!decoded) {
    out += protocol::encodeLine(protocol::errorResponse(nullptr, decoded.error()));
    return;
  }
  boost::json::array batch;
  for (auto& entry : decoded->entries) {
    boost::json::object response;
    if (auto* invalid = std::get_if<protocol::InvalidEntry>(&entry)) {
      response = protocol::errorResponse(invalid->id, invalid->error);
    } else {
      auto& request = std::get<protocol::Request>(entry);
      if (request.isNotification()) continue;
      response = protocol::resultResponse(*request.id, std::move(request.params));
    }
    if (!decoded->batch) {
      out += protocol::encodeLine(response);
      return;
    }
    batch.push_back(std::move(response));
  }
  if (!batch.empty()) out += protocol::encodeLine(batch);
}

asio::awaitable<void> serve(Socket socket) {
  const protocol::WireLimits limits;
  protocol::LineFramer framer(limits.maxMessageBytes);
  std::string out;
  for (;;) {
    auto space = framer.prepare(kReadChunk);
    auto [ec, n] = co_await socket.async_read_some(asio::buffer(space.data(), space.size()), kAwaitable);
    framer.commit(n);
    if (ec) break;
    out.clear();
    std::string_view line;
    protocol::LineFramer::Status status;
    while ((status = framer.next(line)) == protocol::LineFramer::Status::line) answer(line, limits, out);
    if (status == protocol::LineFramer::Status::tooLong) break;
    if (out.empty()) continue;
    auto [writeError, written] = co_await asio::async_write(socket, asio::buffer(out), kAwaitable);
    if (writeError) break;
  }
  boost::system::error_code ignored;
  socket.close(ignored);
}

asio::awaitable<void> acceptLoop(asio::local::stream_protocol::acceptor& acceptor, asio::io_context& io) {
  for (;;) {
    // Each connection's socket (and so its coroutine) lives on a strand of its own.
    Socket socket(asio::make_strand(io));
    auto [ec] = co_await acceptor.async_accept(socket, kAwaitable);
    if (ec == asio::error::operation_aborted) co_return;
    if (ec) continue;
    auto executor = socket.get_executor();
    asio::co_spawn(executor, serve(std::move(socket)), asio::detached);
  }
}

}  // namespace

int runEchoServer(const EchoServerOptions& options) {
  std::signal(SIGPIPE, SIG_IGN);
  asio::io_context io(static_cast<int>(options.threads));
  std::error_code ignored;
  std::filesystem::remove(options.socket, ignored);
  asio::local::stream_protocol::acceptor acceptor(io, asio::local::stream_protocol::endpoint(options.socket.string()));
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code&, int) { io.stop(); });
  asio::co_spawn(io, acceptLoop(acceptor, io), asio::detached);
  std::fprintf(stderr, "echo-server: listening on %s with %u thread(s)\n", options.socket.c_str(),
               options.threads);
  std::vector<std::thread> threads;
  for (unsigned i = 1; i < options.threads; ++i) threads.emplace_back([&io] { io.run(); });
  io.run();
  for (auto& thread : threads) thread.join();
  std::filesystem::remove(options.socket, ignored);
  return 0;
}

}  // namespace toolhost::bench
