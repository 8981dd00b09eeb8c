// The transport floor: a bare Asio NDJSON JSON-RPC echo server. It does what toolhostd's
// transport does for every line, minus method dispatch: frame lines (protocol::LineFramer, same
// 64 KiB reads), decode each with the same strict parser and envelope checks
// (protocol::decodeMessage: Boost.JSON with duplicate-key, UTF-8, depth and number checks), build
// a response with the same id and the params as the result (protocol::resultResponse), and write
// it as one line (protocol::encodeLine). Responses to every line of one read go out in one write.
// One coroutine per connection, each on its own strand; the io_context runs on `threads` threads
// (1, the daemon's default io_threads). Stops on SIGINT or SIGTERM.
//
// With a hop (`--hop thread` or `--hop process`) it is the floor of a server whose calls run
// elsewhere: each connection gets a mirror (a thread of this process, or a child process) at the
// other end of a socket pair, a loop of blocking read() and write() of the same bytes. The lines
// of each client read go to the mirror in one write, come back, and only then are decoded and
// answered as above. This is the cheapest shape such a hop can take (one write and one read per
// batch each way, no encoding, one thread on the far side), so a server that runs its calls in
// another thread or process pays at least this.
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

#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <csignal>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <system_error>
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

// The far side of a hop: sends back whatever it reads, until end of stream.
void mirror(int fd) {
  std::array<char, kReadChunk> buffer;
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n <= 0) break;
    for (ssize_t sent = 0; sent < n;) {
      const ssize_t w = ::write(fd, buffer.data() + sent, static_cast<std::size_t>(n - sent));
      if (w <= 0) {
        ::close(fd);
        return;
      }
      sent += w;
    }
  }
  ::close(fd);
}

// A socket connected to a new mirror: a thread of this process or a child process.
Socket startMirror(const Socket::executor_type& executor, EchoServerOptions::Hop hop) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    throw std::system_error(errno, std::generic_category(), "socketpair");
  }
  if (hop == EchoServerOptions::Hop::process) {
    const pid_t child = ::fork();
    if (child < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      throw std::system_error(errno, std::generic_category(), "fork");
    }
    if (child == 0) {
      ::close(fds[0]);
      mirror(fds[1]);
      ::_exit(0);
    }
    ::close(fds[1]);
  } else {
    std::thread(mirror, fds[1]).detach();
  }
  Socket peer(executor);
  peer.assign(asio::local::stream_protocol(), fds[0]);
  return peer;
}

// Sends `lines` (newline-terminated) through the mirror and appends the answers to what comes
// back to `out`. False when the mirror is gone.
asio::awaitable<bool> answerThroughHop(Socket& peer, protocol::LineFramer& returned, const std::string& lines,
                                       std::size_t count, const protocol::WireLimits& limits, std::string& out) {
  auto [sendError, sent] = co_await asio::async_write(peer, asio::buffer(lines), kAwaitable);
  if (sendError) co_return false;
  std::size_t back = 0;
  std::string_view line;
  for (;;) {
    while (back < count && returned.next(line) == protocol::LineFramer::Status::line) {
      answer(line, limits, out);
      ++back;
    }
    if (back == count) co_return true;
    auto room = returned.prepare(kReadChunk);
    auto [readError, got] = co_await peer.async_read_some(asio::buffer(room.data(), room.size()), kAwaitable);
    returned.commit(got);
    if (readError) co_return false;
  }
}

// One connection. With a mirror (`peer`), the lines of each read go through it before they are
// answered.
asio::awaitable<void> serve(Socket socket, std::optional<Socket> peer) {
  const protocol::WireLimits limits;
  protocol::LineFramer framer(limits.maxMessageBytes);
  protocol::LineFramer returned(limits.maxMessageBytes);
  std::string forward;
  std::string out;
  for (;;) {
    auto space = framer.prepare(kReadChunk);
    auto [ec, n] = co_await socket.async_read_some(asio::buffer(space.data(), space.size()), kAwaitable);
    framer.commit(n);
    if (ec) break;
    out.clear();
    forward.clear();
    std::size_t lines = 0;
    std::string_view line;
    protocol::LineFramer::Status status;
    while ((status = framer.next(line)) == protocol::LineFramer::Status::line) {
      if (!peer) {
        answer(line, limits, out);
        continue;
      }
      forward.append(line);
      forward.push_back('\n');
      ++lines;
    }
    if (status == protocol::LineFramer::Status::tooLong) break;
    if (lines > 0 && !co_await answerThroughHop(*peer, returned, forward, lines, limits, out)) break;
    if (out.empty()) continue;
    auto [writeError, written] = co_await asio::async_write(socket, asio::buffer(out), kAwaitable);
    if (writeError) break;
  }
  boost::system::error_code ignored;
  socket.close(ignored);
  if (peer) peer->close(ignored);  // the mirror reads end of stream and exits
}

asio::awaitable<void> acceptLoop(asio::local::stream_protocol::acceptor& acceptor, asio::io_context& io,
                                 EchoServerOptions::Hop hop) {
  for (;;) {
    // Each connection's socket (and so its coroutine) lives on a strand of its own.
    Socket socket(asio::make_strand(io));
    auto [ec] = co_await acceptor.async_accept(socket, kAwaitable);
    if (ec == asio::error::operation_aborted) co_return;
    if (ec) continue;
    auto executor = socket.get_executor();
    std::optional<Socket> peer;
    if (hop != EchoServerOptions::Hop::none) peer.emplace(startMirror(executor, hop));
    asio::co_spawn(executor, serve(std::move(socket), std::move(peer)), asio::detached);
  }
}

}  // namespace

int runEchoServer(const EchoServerOptions& options) {
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGCHLD, SIG_IGN);  // mirror processes are reaped by the kernel
  asio::io_context io(static_cast<int>(options.threads));
  std::error_code ignored;
  std::filesystem::remove(options.socket, ignored);
  asio::local::stream_protocol::acceptor acceptor(io, asio::local::stream_protocol::endpoint(options.socket.string()));
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code&, int) { io.stop(); });
  asio::co_spawn(io, acceptLoop(acceptor, io, options.hop), asio::detached);
  std::fprintf(stderr, "echo-server: listening on %s with %u thread(s)%s\n", options.socket.c_str(),
               options.threads,
               options.hop == EchoServerOptions::Hop::none     ? ""
               : options.hop == EchoServerOptions::Hop::thread ? ", each line through a mirror thread"
                                                               : ", each line through a mirror process");
  std::vector<std::thread> threads;
  for (unsigned i = 1; i < options.threads; ++i) threads.emplace_back([&io] { io.run(); });
  io.run();
  for (auto& thread : threads) thread.join();
  std::filesystem::remove(options.socket, ignored);
  return 0;
}

}  // namespace toolhost::bench
