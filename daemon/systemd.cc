#include "daemon/systemd.h"

#include "daemon/logging.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/strand.hpp>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <systemd/sd-daemon.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>

namespace toolhost::daemon {
namespace asio = boost::asio;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

// STATUS= is refreshed at least this often (connection counts), even without a watchdog.
constexpr std::chrono::microseconds kStatusInterval = 5s;

std::uint64_t monotonicMicroseconds() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<std::uint64_t>(now.tv_sec) * 1000000u +
         static_cast<std::uint64_t>(now.tv_nsec) / 1000u;
}

// Where a Unix socket is bound, for logs and daemon.info.
fs::path boundPath(int fd) {
  sockaddr_un address{};
  socklen_t length = sizeof address;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return {};
  std::size_t size =
      length > offsetof(sockaddr_un, sun_path) ? length - offsetof(sockaddr_un, sun_path) : 0;
  if (size == 0) return {};
  if (address.sun_path[0] == '\0') return "@" + std::string(address.sun_path + 1, size - 1);
  return std::string(address.sun_path, ::strnlen(address.sun_path, size));
}

// Takes the sockets systemd passed, if any. Errors name what the unit should change.
boost::system::result<std::optional<ActivatedSocket>, ServerError> takeActivatedSocket() {
  int count = ::sd_listen_fds(1);  // 1: LISTEN_* leave the environment
  if (count < 0) {
    return ServerError{std::string("cannot take the sockets systemd passed: ") +
                       std::strerror(-count)};
  }
  if (count == 0) return std::optional<ActivatedSocket>{};
  if (count > 1) {
    for (int fd = SD_LISTEN_FDS_START; fd < SD_LISTEN_FDS_START + count; ++fd) ::close(fd);
    return ServerError{"systemd passed " + std::to_string(count) +
                       " sockets; toolhost.socket must have exactly one ListenStream="};
  }
  int fd = SD_LISTEN_FDS_START;
  if (::sd_is_socket_unix(fd, SOCK_STREAM, 1, nullptr, 0) <= 0) {
    ::close(fd);
    return ServerError{
        "the socket systemd passed is not a listening Unix stream socket; "
        "toolhost.socket needs ListenStream=/path/to/toolhost.sock"};
  }
  // Not inherited by anything the daemon runs.
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  return std::optional<ActivatedSocket>{ActivatedSocket{fd, boundPath(fd)}};
}

}  // namespace

bool canMakeWritablePagesExecutable() {
  const long page = ::sysconf(_SC_PAGESIZE);
  const auto size = static_cast<std::size_t>(page > 0 ? page : 4096);
  void* mapped = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) return false;
  const bool allowed = ::mprotect(mapped, size, PROT_READ | PROT_EXEC) == 0;
  ::munmap(mapped, size);
  return allowed;
}

void notifyServiceManager(const std::string& state) {
  int rc = ::sd_notify(0, state.c_str());
  if (rc < 0) spdlog::debug("sd_notify failed: {}", std::strerror(-rc));
}

// Heartbeat

Heartbeat::Heartbeat(asio::any_io_executor executor, std::chrono::microseconds interval,
                     bool watchdog, std::function<std::string()> status)
    : timer_(std::move(executor)),
      interval_(interval),
      watchdog_(watchdog),
      status_(std::move(status)) {}

void Heartbeat::start() {
  asio::post(timer_.get_executor(), [this] {
    stopped_ = false;
    schedule();
  });
}

void Heartbeat::stop() {
  asio::post(timer_.get_executor(), [this] {
    stopped_ = true;
    timer_.cancel();
  });
}

void Heartbeat::schedule() {
  if (stopped_) return;
  std::string message;
  if (watchdog_) message = "WATCHDOG=1";
  if (status_) {
    std::string status = status_();
    if (status != lastStatus_) {
      if (!message.empty()) message += '\n';
      message += "STATUS=" + status;
      lastStatus_ = std::move(status);
    }
  }
  if (!message.empty()) notifyServiceManager(message);
  timer_.expires_after(interval_);
  timer_.async_wait([this](const boost::system::error_code& error) {
    if (!error) schedule();
  });
}

// ServiceLifecycle

struct ServiceLifecycle::State {
  State(asio::io_context& context, Server& s, ConfigHolder& c, CommandLine line, bool activated,
        std::optional<std::chrono::microseconds> watchdog)
      : io(context),
        server(s),
        configs(c),
        commandLine(std::move(line)),
        socketActivated(activated),
        signals(context, SIGINT, SIGTERM, SIGHUP),
        heartbeat(asio::make_strand(context),
                  watchdog ? std::min(*watchdog / 2, kStatusInterval) : kStatusInterval,
                  watchdog.has_value(), [this] { return status(); }),
        watchdogPeriod(watchdog) {}

  void awaitSignal() {
    signals.async_wait([this](const boost::system::error_code& error, int number) {
      if (error) return;
      if (number == SIGHUP) {
        if (!stopping) reload();
      } else {
        stop(number);
      }
      awaitSignal();
    });
  }

  void stop(int number) {
    if (stopping.exchange(true)) {
      spdlog::warn("second signal ({}); exiting now", number);
      notifyServiceManager("STATUS=Second signal: exiting without waiting");
      io.stop();
      return;
    }
    auto grace = configs.current()->shutdownGrace;
    spdlog::info("signal {}: no new connections; finishing requests in flight (up to {} ms)",
                 number, grace.count());
    notifyServiceManager("STOPPING=1\nSTATUS=" + status());
    // A call stuck in V8 past its cancel is answered once its sandbox process is killed, up to
    // two kill graces and a second later (runtime/process_sandbox_pool.cc, cancelAnswerTime).
    const auto afterCancel = std::chrono::milliseconds(2 * configs.current()->runtime.killGraceMs) +
                             std::chrono::seconds(2);
    asio::co_spawn(io, server.shutdown(grace, afterCancel), [this](std::exception_ptr) {
      spdlog::info("stopped");
      notifyServiceManager("STATUS=Stopped");
      heartbeat.stop();
      io.stop();
    });
  }

  // Re-reads the config file; a config that does not load changes nothing.
  void reload() {
    notifyServiceManager("RELOADING=1\nMONOTONIC_USEC=" + std::to_string(monotonicMicroseconds()) +
                         "\nSTATUS=Reloading the configuration");
    auto running = configs.current();
    auto loaded = loadConfig(commandLine);
    if (!loaded) {
      spdlog::error("reload failed, the configuration in force is kept: {}", loaded.error().detail);
      setReloadNote("last reload failed, previous configuration kept: " + loaded.error().detail);
      notifyServiceManager("READY=1\nSTATUS=" + status());
      return;
    }
    Config next = std::move(*loaded);
    // Under socket activation the socket is systemd's, whatever the config names.
    if (socketActivated) next.socketPath = running->socketPath;
    ConfigChanges changes = reconcileReload(*running, next);
    std::string level = next.logLevel;
    configs.replace(std::make_shared<const Config>(std::move(next)));
    setLogLevel(level);

    std::string source = running->configFile ? running->configFile->string()
                                              : "the defaults (no --config)";
    if (changes.applied.empty()) {
      spdlog::info("reloaded {}: nothing to apply", source);
    } else {
      spdlog::info(
          "reloaded {}: {} ([limits] and [[access]] hold for connections accepted from now on, "
          "the rest at once)",
          source, fmt::join(changes.applied, ", "));
    }
    for (const auto& change : changes.needRestart) {
      spdlog::warn("reload: {} changed in the configuration; it takes effect after a restart",
                   change);
    }
    setReloadNote(changes.needRestart.empty()
                      ? std::string()
                      : "restart to apply: " +
                            fmt::format("{}", fmt::join(changes.needRestart, ", ")));
    notifyServiceManager("READY=1\nSTATUS=" + status());
  }

  // One line for `systemctl status`. Any thread.
  std::string status() {
    std::size_t open = server.connectionCount();
    std::string text;
    if (stopping) {
      text = "Stopping: finishing requests on " + std::to_string(open) + " connection(s)";
    } else {
      text = "Serving on " + server.socketPath().string() + ": " + std::to_string(open) +
             " connection(s) open, " + std::to_string(server.connectionsAccepted()) +
             " since start";
    }
    std::lock_guard lock(noteMutex);
    if (!reloadNote.empty()) text += " (" + reloadNote + ")";
    return text;
  }

  void setReloadNote(std::string note) {
    std::lock_guard lock(noteMutex);
    reloadNote = std::move(note);
  }

  asio::io_context& io;
  Server& server;
  ConfigHolder& configs;
  CommandLine commandLine;
  bool socketActivated;
  std::atomic<bool> stopping{false};
  std::mutex noteMutex;
  std::string reloadNote;
  asio::signal_set signals;
  Heartbeat heartbeat;
  std::optional<std::chrono::microseconds> watchdogPeriod;
};

// SystemdService

boost::system::result<SystemdService, ServerError> SystemdService::fromEnvironment() {
  SystemdService service;
  auto socket = takeActivatedSocket();
  if (!socket) return socket.error();
  service.socket_ = std::move(*socket);
  std::uint64_t usec = 0;
  if (::sd_watchdog_enabled(1, &usec) > 0 && usec > 0) {
    service.watchdog_ = std::chrono::microseconds(usec);
  }
  return service;
}

SystemdService::SystemdService(SystemdService&& other) noexcept
    : socket_(std::move(other.socket_)), watchdog_(other.watchdog_) {
  other.socket_.reset();
}

SystemdService::~SystemdService() {
  if (socket_ && socket_->fd >= 0) ::close(socket_->fd);  // never handed to a server
}

boost::system::result<void, ServerError> SystemdService::listen(Server& server,
                                                                ConfigHolder& configs) {
  if (!socket_) return server.listen();
  auto config = configs.current();
  if (config->socketPath != socket_->path) {
    spdlog::info("serving the socket systemd passed ({}); the configured {} is not used",
                 socket_->path.string(), config->socketPath.string());
  }
  int fd = socket_->fd;
  if (auto adopted = server.adopt(fd, socket_->path); !adopted) return adopted;
  socket_->fd = -1;  // the server owns it now
  auto next = std::make_shared<Config>(*config);
  next->socketPath = socket_->path;
  configs.replace(std::move(next));
  return {};
}

ServiceLifecycle::ServiceLifecycle(asio::io_context& io, Server& server, ConfigHolder& configs,
                                   const SystemdService& systemd, CommandLine commandLine)
    : state_(std::make_unique<State>(io, server, configs, std::move(commandLine),
                                     systemd.socketActivated(), systemd.watchdog())) {}

ServiceLifecycle::~ServiceLifecycle() = default;

void ServiceLifecycle::start() {
  State& state = *state_;
  state.awaitSignal();
  if (state.watchdogPeriod) {
    spdlog::info("systemd watchdog: {} ms; pinging every {} ms",
                 state.watchdogPeriod->count() / 1000,
                 std::min(*state.watchdogPeriod / 2, kStatusInterval).count() / 1000);
  }
  // Posted, so READY=1 goes out only once the event loop really runs.
  asio::post(state.io, [&state] { notifyServiceManager("READY=1\nSTATUS=" + state.status()); });
  if (std::getenv("NOTIFY_SOCKET") != nullptr) state.heartbeat.start();
}

}  // namespace toolhost::daemon
