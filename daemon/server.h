// The Unix-socket server: binds the socket (stale-socket replacement, modes, group), accepts
// connections, maps each peer's SO_PEERCRED credentials to roles (from the configuration in force
// when the connection is accepted), and runs one Session per connection on its own strand.
// Shutdown stops accepting and lets sessions finish within a grace period. Created on the main
// thread; its coroutines run on the io_context's threads.
#pragma once

#include "daemon/config.h"
#include "daemon/dispatcher.h"
#include "daemon/session.h"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/system/result.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace toolhost::daemon {

struct ServerError {
  std::string detail;
};

class Server {
 public:
  // Socket path and group come from the configuration in force now; access rules and wire limits
  // are read again for every accepted connection, so a reload applies to new connections.
  Server(boost::asio::io_context& io, const ConfigHolder& configs, Dispatcher& dispatcher);
  ~Server();

  // Binds and listens, or says clearly why not. Main thread, before the io_context runs.
  boost::system::result<void, ServerError> listen();
  // Adopts an already listening socket bound at `path` (systemd socket activation). The socket
  // file belongs to whoever created it and is never unlinked.
  boost::system::result<void, ServerError> adopt(int listeningFd, std::filesystem::path path);
  // Starts accepting, and a check every kSocketCheckInterval that the socket file is still
  // there: one removed (a cleaner of /tmp or /run, a mistaken rm) or replaced by a dead socket
  // is made again as at start; a path taken by something else is left alone and logged.
  void start();
  static constexpr std::chrono::milliseconds kSocketCheckInterval{1000};
  // Why new clients cannot reach this daemon through its socket file, as of the last check;
  // nothing while they can. Any thread.
  std::optional<std::string> socketProblem() const;

  // Stops accepting, lets sessions finish what is in flight for up to `grace`, then aborts the
  // rest. Completes when every session has ended. Sessions serving others (popup hosts,
  // approvers) keep reading until all the others have ended.
  boost::asio::awaitable<void> shutdown(std::chrono::milliseconds grace);

  std::size_t connectionCount() const;
  std::uint64_t connectionsAccepted() const { return nextId_.load() - 1; }
  const std::filesystem::path& socketPath() const { return socketPath_; }

 private:
  boost::asio::awaitable<void> acceptLoop();
  boost::asio::awaitable<void> watchSocket();
  // The file at socketPath_, made again if it is gone: what is wrong with it now. Accept strand.
  std::optional<std::string> checkSocket();
  // A listening socket at the configured path (removing a dead one there when replaceStale).
  boost::system::result<int, ServerError> bindSocket(bool replaceStale);
  void startSession(boost::asio::local::stream_protocol::socket socket);
  void removeSession(std::uint64_t id);
  void unlinkSocket();
  std::size_t othersCount() const;  // open sessions not serving others

  boost::asio::io_context& io_;
  const ConfigHolder& configs_;
  std::shared_ptr<const Config> startup_;  // socket path and group: a restart changes them
  std::filesystem::path socketPath_;
  Dispatcher& dispatcher_;
  boost::asio::strand<boost::asio::io_context::executor_type> acceptStrand_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  boost::asio::steady_timer socketWatch_;  // accept strand
  bool stopping_ = false;                  // accept strand
  bool ownsSocketFile_ = false;
  bool madeSocket_ = false;  // by listen(), not adopted from systemd
  dev_t socketDevice_ = 0;
  ino_t socketInode_ = 0;
  std::atomic<std::uint64_t> nextId_{1};
  mutable std::mutex mutex_;
  std::map<std::uint64_t, std::weak_ptr<Session>> sessions_;
  std::optional<std::string> socketProblem_;  // under mutex_
};

}  // namespace toolhost::daemon
