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
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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
  // there: one removed (a cleaner of /tmp or /run, a mistaken rm) is made again as at start,
  // beside the sockets listening so far (a hard link or a bind mount may lead to them; the first
  // and the kMaxListeners - 1 made last stay open); a path taken by something else is left alone
  // (never connected to) and reported. systemd's socket is only reported.
  void start();
  static constexpr std::chrono::milliseconds kSocketCheckInterval{1000};
  // Runs on the accept strand each time the socket file was made again, with the device and
  // inode of the file of each socket listening now. Set before start().
  using FileIds = std::vector<std::pair<dev_t, ino_t>>;
  void onSocketsChanged(std::function<void(FileIds)> listener);
  // At most this many sockets listen: the first, and the ones made last.
  static constexpr std::size_t kMaxListeners = 8;
  // Why new clients cannot reach this daemon through its socket file, as of the last check;
  // nothing while they can. Any thread.
  std::optional<std::string> socketProblem() const;

  // Where sessions parse large lines (Session::decodeLargeOn). Set before start().
  void decodeLargeOn(DiskThread* thread) { largeDecodes_ = thread; }

  // Stops accepting, lets sessions finish what is in flight for up to `grace`, then aborts the
  // rest and waits up to `afterCancel` more for their cancelled requests to be answered (a call
  // stuck inside V8 is answered once its sandbox process is killed). Completes when every
  // session has ended. Sessions serving others (popup hosts, approvers) keep reading until all
  // the others have ended.
  boost::asio::awaitable<void> shutdown(
      std::chrono::milliseconds grace,
      std::chrono::milliseconds afterCancel = std::chrono::seconds(2));

  // Whether something listens on the Unix socket at `path` now (a connect succeeds or its
  // backlog is full). Never waits.
  static bool somebodyListensAt(const std::filesystem::path& path);

  // The checks on the socket's path that come before binding it: its length, and its directory
  // (made, private, if missing; refused if another user could replace what is in it). True if
  // the directory was made now. main() runs it before it makes the state directory, so that a
  // refused start leaves nothing behind.
  static boost::system::result<bool, ServerError> checkSocketDirectory(const Config& config);

  std::size_t connectionCount() const;
  std::uint64_t connectionsAccepted() const { return nextId_.load() - 1; }
  const std::filesystem::path& socketPath() const { return socketPath_; }

 private:
  using Acceptor = boost::asio::local::stream_protocol::acceptor;
  boost::asio::awaitable<void> acceptLoop(std::shared_ptr<Acceptor> acceptor);
  void spawnAcceptLoop(std::shared_ptr<Acceptor> acceptor);
  boost::asio::awaitable<void> watchSocket();
  // The file at socketPath_, made again if it is gone: what is wrong with it now. Accept strand.
  std::optional<std::string> checkSocket();
  // A listening socket at the configured path. atStart: a dead socket there is replaced, and a
  // socket_group its directory keeps out is warned about; later, the path must be free.
  boost::system::result<int, ServerError> bindSocket(bool atStart);
  void startSession(boost::asio::local::stream_protocol::socket socket);
  void removeSession(std::uint64_t id);
  void unlinkSocket();
  std::size_t othersCount() const;  // open sessions not serving others

  boost::asio::io_context& io_;
  const ConfigHolder& configs_;
  std::shared_ptr<const Config> startup_;  // socket path and group: a restart changes them
  std::filesystem::path socketPath_;
  Dispatcher& dispatcher_;
  DiskThread* largeDecodes_ = nullptr;
  boost::asio::strand<boost::asio::io_context::executor_type> acceptStrand_;
  // The sockets listening: the first (from listen() or systemd), then those made since, oldest
  // first, each with its file's device and inode (0 when unknown). Accept strand once started.
  struct Listener {
    std::shared_ptr<Acceptor> acceptor;
    dev_t device = 0;
    ino_t inode = 0;
  };
  std::vector<Listener> listeners_;
  boost::asio::steady_timer socketWatch_;  // accept strand
  bool stopping_ = false;                  // accept strand
  bool watched_ = false;  // the path has a file to compare (not an abstract socket)
  std::function<void(FileIds)> onSocketsChanged_;
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
