// The daemon's side of systemd: socket activation (sd_listen_fds), sd_notify messages (READY,
// STATUS, RELOADING, STOPPING, WATCHDOG), and the signals a service manager sends: SIGTERM/SIGINT
// stop gracefully, SIGHUP reloads the configuration. Outside systemd (no LISTEN_FDS, NOTIFY_SOCKET
// or WATCHDOG_USEC) only the signals remain. SystemdService is made on the main thread before any
// other thread exists, since it edits the environment; its timers and signal handlers then run on
// the io_context.
#pragma once

#include "daemon/config.h"
#include "daemon/server.h"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/system/result.hpp>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace toolhost::daemon {

// Whether this process may map a page writable and then make it executable, as V8's JIT does;
// false under MemoryDenyWriteExecute= (a seccomp filter) and similar rules.
bool canMakeWritablePagesExecutable();

// A listening socket passed by the service manager.
struct ActivatedSocket {
  int fd = -1;
  std::filesystem::path path;  // where it is bound; "@name" for an abstract socket
};

// Sends one sd_notify(3) message, e.g. "READY=1\nSTATUS=...". A no-op without $NOTIFY_SOCKET.
// Thread-safe. The send is a blocking datagram: systemd reads its notify socket promptly, but a
// reader that stops reading (a test, say) makes it wait once ten messages are queued.
void notifyServiceManager(const std::string& state);

// Sends STATUS= whenever `status` says something new and, if `watchdog`, WATCHDOG=1, every
// `interval`, from a timer on `executor`. Because the timer runs on the event loop, a loop wedged
// on all its threads stops the pings, and systemd kills and restarts the daemon. Construct, start
// and stop on one thread, or on the executor.
class Heartbeat {
 public:
  Heartbeat(boost::asio::any_io_executor executor, std::chrono::microseconds interval,
            bool watchdog, std::function<std::string()> status);
  void start();
  void stop();

 private:
  void schedule();

  boost::asio::steady_timer timer_;
  std::chrono::microseconds interval_;
  bool watchdog_;
  std::function<std::string()> status_;
  std::string lastStatus_;
  bool stopped_ = false;
};

// What systemd handed over through the environment: the socket (socket activation) and the
// watchdog period.
class SystemdService {
 public:
  // Takes LISTEN_FDS/LISTEN_PID and WATCHDOG_USEC/WATCHDOG_PID out of the environment, so no
  // child inherits them. Call before any thread starts. Fails when systemd passed sockets that
  // toolhostd cannot serve (anything but one listening SOCK_STREAM Unix socket).
  static boost::system::result<SystemdService, ServerError> fromEnvironment();

  SystemdService(SystemdService&& other) noexcept;
  SystemdService& operator=(SystemdService&&) = delete;
  ~SystemdService();

  bool socketActivated() const { return socket_.has_value(); }
  // WATCHDOG_USEC, when systemd expects pings.
  std::optional<std::chrono::microseconds> watchdog() const { return watchdog_; }

  // Serves the socket systemd passed (and records its path in the configuration in force), or
  // binds the configured path. Main thread, before the io_context runs.
  boost::system::result<void, ServerError> listen(Server& server, ConfigHolder& configs);

 private:
  SystemdService() = default;

  std::optional<ActivatedSocket> socket_;
  std::optional<std::chrono::microseconds> watchdog_;
};

// The daemon's life as a service, on the event loop: SIGINT/SIGTERM stop accepting, let requests
// in flight finish within the grace period, then stop the io_context (a second signal stops it at
// once); SIGHUP reloads the config file with the command line applied over it, as at start-up.
// Tells systemd READY=1 once the loop runs, then keeps STATUS= and WATCHDOG=1 going. Declare it
// after the io_context and the server (it must be destroyed before them); start() on the main
// thread before io.run().
class ServiceLifecycle {
 public:
  ServiceLifecycle(boost::asio::io_context& io, Server& server, ConfigHolder& configs,
                   const SystemdService& systemd, CommandLine commandLine);
  ~ServiceLifecycle();
  void start();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace toolhost::daemon
