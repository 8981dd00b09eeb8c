#include "daemon/server.h"

#include "daemon/errors.h"
#include "protocol/jsonrpc.h"
#include "protocol/path_trust.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace toolhost::daemon {
namespace asio = boost::asio;
namespace fs = std::filesystem;
using stream_protocol = asio::local::stream_protocol;

namespace {

std::string errnoText(int error) { return std::strerror(error); }

// Connects to `path`; true when something is listening there. Never waits: a listener whose
// backlog is full (stopped, or out of descriptors) answers EAGAIN, and that is somebody too.
bool somebodyListens(const fs::path& path, int& error) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    error = errno;
    return false;
  }
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.native().size());
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  error = rc == 0 ? 0 : errno;
  ::close(fd);
  return rc == 0 || error == EAGAIN;
}

void logIfThrew(const char* what, std::exception_ptr error) {
  if (!error) return;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    spdlog::error("{} ended with an exception: {}", what, e.what());
  }
}

}  // namespace

Server::Server(asio::io_context& io, const ConfigHolder& configs, Dispatcher& dispatcher)
    : io_(io),
      configs_(configs),
      startup_(configs.current()),
      socketPath_(startup_->socketPath),
      dispatcher_(dispatcher),
      acceptStrand_(asio::make_strand(io)),
      socketWatch_(acceptStrand_) {}

Server::~Server() { unlinkSocket(); }

bool Server::somebodyListensAt(const fs::path& path) {
  int error = 0;
  return path.native().size() <= kMaxSocketPathBytes && somebodyListens(path, error);
}

boost::system::result<void, ServerError> Server::listen() {
  const Config& config = *startup_;
  auto fd = bindSocket(true);
  if (!fd) return fd.error();
  // Rules for other users are of no use on a socket only its owner may open.
  if (!config.socketGroup) {
    for (const auto& rule : config.access.rules()) {
      // Root passes file modes: a rule for uid 0 works all the same.
      if ((rule.uid && *rule.uid != ::geteuid() && *rule.uid != 0) || rule.gid) {
        spdlog::warn(
            "[[access]] names other users or groups, but the socket {} is mode 0600 (no [server] "
            "socket_group): only its owner can connect",
            config.socketPath.string());
        break;
      }
    }
  }
  return adopt(*fd, config.socketPath);
}

boost::system::result<bool, ServerError> Server::checkSocketDirectory(const Config& config) {
  const fs::path& path = config.socketPath;
  if (path.native().size() > kMaxSocketPathBytes) {
    return ServerError{"socket path " + path.string() + " is longer than " +
                       std::to_string(kMaxSocketPathBytes) + " bytes"};
  }
  // A directory another user controls (say /tmp/toolhost-<uid> made by them first) would let
  // them put their own socket in place of ours and read what clients send. Directories made here
  // let only the owner (and the socket's group, if configured) reach the socket.
  const fs::path parent = path.parent_path();
  auto made =
      protocol::makeTrustedDirectories(parent.empty() ? fs::path(".") : parent,
                                       config.socketGroup ? 0710 : 0700, config.socketGroup);
  if (!made) return ServerError{"refusing to listen at " + path.string() + ": " + made.error()};
  return *made;
}

boost::system::result<int, ServerError> Server::bindSocket(bool atStart) {
  const Config& config = *startup_;
  const fs::path& path = config.socketPath;
  auto made = checkSocketDirectory(config);
  if (!made) return made.error();
  const fs::path shown = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  if (!*made && config.socketGroup && atStart) {
    // A directory that was there already keeps its mode: say so when the group cannot pass it.
    struct stat dir {};
    if (::stat(shown.c_str(), &dir) == 0 && (dir.st_mode & S_IXOTH) == 0 &&
        !(dir.st_gid == *config.socketGroup && (dir.st_mode & S_IXGRP) != 0)) {
      spdlog::warn(
          "[server] socket_group cannot reach the socket: its directory {} is mode {:04o}, group "
          "{}; give it to the group with mode 0710 (chgrp {} {}; chmod 0710 {})",
          shown.string(), dir.st_mode & 07777, dir.st_gid, *config.socketGroup, shown.string(),
          shown.string());
    }
  }

  struct stat existing {};
  if (::lstat(path.c_str(), &existing) == 0) {
    if (!atStart) return ServerError{path.string() + " exists"};
    if (!S_ISSOCK(existing.st_mode)) {
      return ServerError{path.string() + " exists and is not a socket; refusing to replace it"};
    }
    int error = 0;
    if (somebodyListens(path, error)) {
      return ServerError{"another daemon is already listening on " + path.string()};
    }
    if (error != ECONNREFUSED && error != ENOENT) {
      return ServerError{"cannot tell whether " + path.string() + " is in use: " + errnoText(error)};
    }
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return ServerError{"cannot remove the stale socket " + path.string() + ": " +
                         errnoText(errno)};
    }
    spdlog::info("replaced a stale socket at {}", path.string());
  }

  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return ServerError{"cannot create a socket: " + errnoText(errno)};
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.native().size());
  // The socket file is created 0600 from the start: no window in which others could connect.
  // (The mask is the process's: when the file is made again while the daemon runs, nothing else
  // in it makes files, and a process it starts meanwhile makes none either.)
  mode_t previous = ::umask(0177);
  int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  int bindError = errno;
  ::umask(previous);
  if (rc != 0) {
    ::close(fd);
    return ServerError{"cannot bind " + path.string() + ": " + errnoText(bindError)};
  }
  if (config.socketGroup) {
    if (::chown(path.c_str(), static_cast<uid_t>(-1), *config.socketGroup) != 0 ||
        ::chmod(path.c_str(), 0660) != 0) {
      int error = errno;
      ::close(fd);
      ::unlink(path.c_str());
      return ServerError{"cannot give the socket to its group: " + errnoText(error)};
    }
  }
  struct stat created {};
  if (::stat(path.c_str(), &created) != 0) {
    const int error = errno;
    ::close(fd);
    return ServerError{"cannot inspect the socket file just made at " + path.string() + ": " +
                       errnoText(error)};
  }
  socketDevice_ = created.st_dev;
  socketInode_ = created.st_ino;
  ownsSocketFile_ = true;
  madeSocket_ = true;
  if (::listen(fd, SOMAXCONN) != 0) {
    int error = errno;
    ::close(fd);
    unlinkSocket();
    return ServerError{"cannot listen on " + path.string() + ": " + errnoText(error)};
  }
  return fd;
}

boost::system::result<void, ServerError> Server::adopt(int listeningFd, fs::path path) {
  auto acceptor = std::make_shared<stream_protocol::acceptor>(acceptStrand_);
  boost::system::error_code ec;
  acceptor->assign(stream_protocol(), listeningFd, ec);
  if (ec) return ServerError{"cannot use the listening socket: " + ec.message()};
  socketPath_ = std::move(path);
  // What the watch compares the path with: the file made here, or the one systemd made (an
  // abstract socket, "@name", has none). A file already gone when systemd's socket is taken is
  // reported as gone.
  watched_ = madeSocket_ || !socketPath_.native().starts_with("@");
  if (!madeSocket_ && watched_) {
    struct stat passed {};
    if (::lstat(socketPath_.c_str(), &passed) == 0 && S_ISSOCK(passed.st_mode)) {
      socketDevice_ = passed.st_dev;
      socketInode_ = passed.st_ino;
    }
  }
  listeners_.assign(1, Listener{std::move(acceptor), socketDevice_, socketInode_});
  return {};
}

void Server::onSocketsChanged(std::function<void(FileIds)> listener) {
  onSocketsChanged_ = std::move(listener);
}

void Server::start() {
  spawnAcceptLoop(listeners_.front().acceptor);
  asio::co_spawn(acceptStrand_, watchSocket(),
                 [](std::exception_ptr e) { logIfThrew("socket watch", e); });
}

void Server::spawnAcceptLoop(std::shared_ptr<stream_protocol::acceptor> acceptor) {
  asio::co_spawn(acceptStrand_, acceptLoop(std::move(acceptor)),
                 [](std::exception_ptr e) { logIfThrew("accept loop", e); });
}

std::optional<std::string> Server::socketProblem() const {
  std::lock_guard lock(mutex_);
  return socketProblem_;
}

asio::awaitable<void> Server::watchSocket() {
  std::string logged;  // the problem last logged: each is logged once, and its end
  for (;;) {
    socketWatch_.expires_after(kSocketCheckInterval);
    co_await socketWatch_.async_wait(asio::as_tuple(asio::use_awaitable));
    if (stopping_) co_return;
    std::optional<std::string> problem = checkSocket();
    {
      std::lock_guard lock(mutex_);
      socketProblem_ = problem;
    }
    if (problem && *problem != logged) {
      spdlog::error("{}", *problem);
    } else if (!problem && !logged.empty()) {
      spdlog::info("clients can connect to {} again", socketPath_.string());
    }
    logged = problem.value_or("");
  }
}

std::optional<std::string> Server::checkSocket() {
  if (!watched_) return std::nullopt;
  struct stat current {};
  const bool present = ::lstat(socketPath_.c_str(), &current) == 0;
  const int error = present ? 0 : errno;
  if (present && std::any_of(listeners_.begin(), listeners_.end(), [&](const Listener& listener) {
        return listener.inode != 0 && current.st_dev == listener.device &&
               current.st_ino == listener.inode;
      })) {
    return std::nullopt;  // a file of a socket listening (one made here, or linked back)
  }
  if (present) {
    // Something else took the path: never ours to remove, nor to connect to.
    const std::string what = S_ISSOCK(current.st_mode) ? "a socket" : "a file that is no socket";
    return socketPath_.string() + " was replaced by " + what +
           " this daemon did not make: new clients do not reach this daemon; remove it, and " +
           (madeSocket_ ? "this daemon makes its socket again"
                        : "restart toolhost.socket and toolhost.service (systemd makes the "
                          "socket file)");
  }
  if (error != ENOENT && error != ENOTDIR) {
    return "cannot inspect the socket file " + socketPath_.string() + ": " + errnoText(error);
  }
  if (!madeSocket_) {
    return "the socket file " + socketPath_.string() + " is gone (" + errnoText(error) +
           "): no new client can connect; systemd made it, so restart toolhost.socket and "
           "toolhost.service to make it again";
  }
  // Gone (a cleaner of /tmp or /run, a mistaken rm): a new one, made as at start. The sockets
  // listening so far stay open (a hard link or a bind mount may still lead clients to them),
  // up to kMaxListeners: the first one, and those made last.
  ownsSocketFile_ = false;
  auto fd = bindSocket(false);
  if (!fd) {
    return "the socket file " + socketPath_.string() +
           " is gone and cannot be made again: " + fd.error().detail +
           "; no new client can connect";
  }
  auto acceptor = std::make_shared<stream_protocol::acceptor>(acceptStrand_);
  boost::system::error_code assigned;
  acceptor->assign(stream_protocol(), *fd, assigned);
  if (assigned) {
    ::close(*fd);
    unlinkSocket();
    return "the socket file " + socketPath_.string() +
           " is gone and cannot be made again: " + assigned.message();
  }
  if (listeners_.size() >= kMaxListeners) {
    boost::system::error_code ignored;
    listeners_[1].acceptor->close(ignored);  // its accept loop ends
    listeners_.erase(listeners_.begin() + 1);
  }
  listeners_.push_back(Listener{acceptor, socketDevice_, socketInode_});
  spawnAcceptLoop(std::move(acceptor));
  if (onSocketsChanged_) {
    FileIds files;
    for (const auto& listener : listeners_) {
      if (listener.inode != 0) files.emplace_back(listener.device, listener.inode);
    }
    onSocketsChanged_(std::move(files));
  }
  spdlog::warn("the socket file {} was gone; made it again", socketPath_.string());
  return std::nullopt;
}

void Server::unlinkSocket() {
  if (!ownsSocketFile_) return;
  ownsSocketFile_ = false;
  // Only remove the file if it is still the one we created.
  struct stat current {};
  if (::lstat(socketPath_.c_str(), &current) == 0 && current.st_dev == socketDevice_ &&
      current.st_ino == socketInode_) {
    ::unlink(socketPath_.c_str());
  }
}

asio::awaitable<void> Server::acceptLoop(std::shared_ptr<stream_protocol::acceptor> acceptor) {
  asio::steady_timer backoff(acceptStrand_);
  for (;;) {
    auto [ec, socket] = co_await acceptor->async_accept(asio::make_strand(io_),
                                                        asio::as_tuple(asio::use_awaitable));
    if (ec == asio::error::operation_aborted || !acceptor->is_open()) co_return;
    if (ec) {
      // Out of descriptors and the like: wait a little rather than spin.
      spdlog::warn("accept failed: {}", ec.message());
      backoff.expires_after(std::chrono::milliseconds(100));
      co_await backoff.async_wait(asio::as_tuple(asio::use_awaitable));
      continue;
    }
    startSession(std::move(socket));
  }
}

namespace {
// Sends a refused peer one error line and closes the connection.
void refuse(stream_protocol::socket socket, const protocol::RpcError& error) {
  auto line =
      std::make_shared<std::string>(protocol::encodeLine(protocol::errorResponse(nullptr, error)));
  auto owned = std::make_shared<stream_protocol::socket>(std::move(socket));
  asio::async_write(*owned, asio::buffer(*line),
                    [owned, line](const boost::system::error_code&, std::size_t) {
                      boost::system::error_code ignored;
                      owned->shutdown(stream_protocol::socket::shutdown_both, ignored);
                      owned->close(ignored);
                    });
}
}  // namespace

void Server::startSession(stream_protocol::socket socket) {
  std::uint64_t id = nextId_++;
  PeerCredentials peer;
  if (!readPeerCredentials(socket.native_handle(), peer)) {
    if (std::string note; allowClientLine(note)) {
      spdlog::warn("conn={} no peer credentials: {}; closing{}", id, errnoText(errno), note);
    }
    return;
  }
  // The daemon never calls itself: a connection from its own process is an external-service
  // tool whose endpoint led here (a symbolic link switched after the path was checked), which
  // would call itself again as admin.
  if (peer.pid == ::getpid()) {
    spdlog::warn(
        "conn={} refused: a connection from this daemon's own process (an "
        "external-service endpoint that leads to this socket)",
        id);
    refuse(std::move(socket),
           protocol::RpcError{app_error::kUnauthorized,
                              std::string(app_error::message(app_error::kUnauthorized)),
                              "peer-refused",
                              "this daemon does not call itself: the endpoint leads to its own "
                              "socket"});
    return;
  }
  // The connection keeps the access rules and limits in force now, whatever a reload does later.
  std::shared_ptr<const Config> config = configs_.current();
  RoleSet roles = config->access.rolesFor(peer);
  if (roles.empty()) {
    if (std::string note; allowClientLine(note)) {
      spdlog::warn("conn={} refused uid={} gid={} pid={}: no access rule allows it{}", id, peer.uid,
                   peer.gid, peer.pid, note);
    }
    refuse(std::move(socket),
           protocol::RpcError{app_error::kUnauthorized,
                              std::string(app_error::message(app_error::kUnauthorized)),
                              "peer-refused",
                              "uid " + std::to_string(peer.uid) +
                                  " may not use this daemon; an [[access]] rule in its config "
                                  "can allow it"});
    return;
  }
  // Each connection may hold a partial line and answers in memory: their number is bounded too.
  // Admins are always let in, so that a flood of other clients never locks the operator out.
  if (!roles.has(Role::admin) && connectionCount() >= config->maxConnections) {
    if (std::string note; allowClientLine(note)) {
      spdlog::warn(
          "conn={} refused uid={} pid={}: {} connections are open, the limit "
          "([limits] max_connections){}",
          id, peer.uid, peer.pid, config->maxConnections, note);
    }
    refuse(std::move(socket),
           protocol::RpcError{app_error::kOverloaded,
                              std::string(app_error::message(app_error::kOverloaded)),
                              "too-many-connections",
                              std::to_string(config->maxConnections) +
                                  " connections are open, the daemon's limit ([limits] "
                                  "max_connections); close one, or try again later"});
    return;
  }
  spdlog::debug("conn={} open uid={} gid={} pid={} roles={}", id, peer.uid, peer.gid, peer.pid,
                fmt::join(roles.names(), ","));
  auto session = std::make_shared<Session>(std::move(socket), id, peer, roles, dispatcher_,
                                           config->limits);
  session->decodeLargeOn(largeDecodes_);
  {
    std::lock_guard lock(mutex_);
    sessions_.emplace(id, session);
  }
  auto executor = session->executor();
  asio::co_spawn(executor, session->run(), [this, id, session](std::exception_ptr e) {
    logIfThrew("session", e);
    removeSession(id);
  });
}

void Server::removeSession(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  sessions_.erase(id);
}

std::size_t Server::othersCount() const {
  std::lock_guard lock(mutex_);
  std::size_t count = 0;
  for (const auto& [id, weak] : sessions_) {
    auto session = weak.lock();
    if (session && !session->servingOthers()) ++count;
  }
  return count;
}

std::size_t Server::connectionCount() const {
  std::lock_guard lock(mutex_);
  return sessions_.size();
}

asio::awaitable<void> Server::shutdown(std::chrono::milliseconds grace,
                                       std::chrono::milliseconds afterCancel) {
  asio::post(acceptStrand_, [this] {
    stopping_ = true;
    socketWatch_.cancel();
    boost::system::error_code ignored;
    for (auto& listener : listeners_) listener.acceptor->close(ignored);
    unlinkSocket();
  });
  // Popup hosts and approvers stay until the others have ended: calls there may wait on them.
  auto stopReading = [this](bool servingOthers) {
    std::vector<std::shared_ptr<Session>> live;
    {
      std::lock_guard lock(mutex_);
      for (auto& [id, weak] : sessions_) {
        auto session = weak.lock();
        if (session && session->servingOthers() == servingOthers) {
          live.push_back(std::move(session));
        }
      }
    }
    for (auto& session : live) session->beginShutdown();
  };
  stopReading(false);
  bool othersEnded = false;
  asio::steady_timer timer(co_await asio::this_coro::executor);
  auto deadline = std::chrono::steady_clock::now() + grace;
  bool aborted = false;
  bool dropped = false;
  for (;;) {
    if (!othersEnded && othersCount() == 0) {
      othersEnded = true;
      stopReading(true);
    }
    if (connectionCount() == 0) break;
    if (aborted &&
        std::chrono::steady_clock::now() >=
            deadline + std::max<std::chrono::milliseconds>(afterCancel, std::chrono::seconds(2))) {
      spdlog::error("{} connection(s) did not end after being cancelled; exiting anyway",
                    connectionCount());
      break;
    }
    // A second before giving up, answers a client has not read are dropped with it.
    if (aborted && !dropped &&
        std::chrono::steady_clock::now() >=
            deadline + std::max<std::chrono::milliseconds>(afterCancel, std::chrono::seconds(2)) -
                std::chrono::seconds(1)) {
      dropped = true;
      std::lock_guard lock(mutex_);
      for (auto& [id, weak] : sessions_) {
        if (auto session = weak.lock()) session->drop();
      }
    }
    if (!aborted && std::chrono::steady_clock::now() >= deadline) {
      aborted = true;
      std::lock_guard lock(mutex_);
      spdlog::warn("shutdown grace period over; cancelling requests on {} connection(s)",
                   sessions_.size());
      for (auto& [id, weak] : sessions_) {
        if (auto session = weak.lock()) session->abort();
      }
    }
    timer.expires_after(std::chrono::milliseconds(20));
    co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
  }
}

}  // namespace toolhost::daemon
