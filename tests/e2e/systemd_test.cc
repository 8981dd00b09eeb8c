// toolhost as a systemd service: socket activation through systemd-socket-activate, the sd_notify
// protocol on a NOTIFY_SOCKET of the test's own, the watchdog, SIGHUP reloads, the units
// (systemd-analyze verify and security), the system call filter, and the Debian package.
// Nothing here needs systemd as PID 1.
#include "daemon/systemd.h"
#include "protocol/json_parse.h"
#include "protocol/json_text.h"
#include "tests/support/daemon_process.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/json/parse.hpp>
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

using namespace toolhost::testing;
namespace json = boost::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

extern char** environ;

namespace {

const fs::path kSourceDir = TOOLHOST_SOURCE_DIR;
const fs::path kBuildDir = TOOLHOST_BUILD_DIR;

std::string readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

void writeFile(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// The program's path on $PATH, or nothing (the caller warns and skips).
std::optional<fs::path> findProgram(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    fs::path candidate = fs::path(dir) / name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

#define REQUIRE_PROGRAM(var, name)                                         \
  auto var = findProgram(name);                                            \
  if (!var) {                                                              \
    WARN(name " is not installed (scripts/deps.sh installs it); skipped"); \
    return;                                                                \
  }

unsigned modeOf(const fs::path& path) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) return 0;
  return info.st_mode & 07777;
}

bool isSocket(const fs::path& path) {
  struct stat info {};
  return ::lstat(path.c_str(), &info) == 0 && S_ISSOCK(info.st_mode);
}

// True once something listens on the socket at `path`, found in /proc/net/unix (__SO_ACCEPTCON in
// Flags) without connecting, since a connection would start a socket-activated daemon.
bool isListening(const fs::path& path) {
  std::istringstream lines(readFile("/proc/net/unix"));
  std::string line;
  std::getline(lines, line);  // the header
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string slot, refs, protocol, flags, type, state, inode, bound;
    if (!(fields >> slot >> refs >> protocol >> flags >> type >> state >> inode >> bound)) continue;
    if (bound == path.string() && (std::stoul(flags, nullptr, 16) & 0x10000) != 0) return true;
  }
  return false;
}

bool canConnect(const fs::path& socket) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, socket.c_str(), sizeof address.sun_path - 1);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  ::close(fd);
  return ok;
}

bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout = 10s) {
  auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return condition();
}

json::value parse(const std::string& text) {
  auto parsed = toolhost::protocol::parseJson(text);
  if (!parsed) FAIL("not JSON: " << text);
  return *parsed;
}

// A NOTIFY_SOCKET of the test's own: a datagram socket that collects what sd_notify sends.
class NotifyListener {
 public:
  explicit NotifyListener(fs::path path) : path_(std::move(path)) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path_.c_str(), sizeof address.sun_path - 1);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  }
  ~NotifyListener() { ::close(fd_); }
  NotifyListener(const NotifyListener&) = delete;
  NotifyListener& operator=(const NotifyListener&) = delete;

  const fs::path& path() const { return path_; }

  // Waits for a message containing `line` (a whole line, e.g. "READY=1"); every message received
  // meanwhile is kept in messages().
  std::optional<std::string> waitFor(const std::string& line,
                                     std::chrono::milliseconds timeout = 20s) {
    for (std::size_t i = checked_; i < messages_.size(); ++i) {
      if (hasLine(messages_[i], line)) {
        checked_ = i + 1;
        return messages_[i];
      }
    }
    checked_ = messages_.size();
    auto deadline = Clock::now() + timeout;
    for (;;) {
      auto message = receive(deadline);
      if (!message) return std::nullopt;
      checked_ = messages_.size();
      if (hasLine(*message, line)) return message;
    }
  }

  // Waits for a STATUS= line containing `text`.
  std::optional<std::string> waitForStatus(const std::string& text,
                                           std::chrono::milliseconds timeout = 20s) {
    auto matches = [&](const std::string& message) {
      std::istringstream lines(message);
      for (std::string each; std::getline(lines, each);) {
        if (each.rfind("STATUS=", 0) == 0 && each.find(text) != std::string::npos) return true;
      }
      return false;
    };
    auto deadline = Clock::now() + timeout;
    for (std::size_t i = 0;; ++i) {
      while (i >= messages_.size()) {
        if (!receive(deadline)) return std::nullopt;
      }
      if (matches(messages_[i])) return messages_[i];
    }
  }

  // Everything that arrives within `window`.
  std::vector<std::string> collect(std::chrono::milliseconds window) {
    std::vector<std::string> out;
    auto deadline = Clock::now() + window;
    while (auto message = receive(deadline)) out.push_back(*message);
    checked_ = messages_.size();
    return out;
  }

  const std::vector<std::string>& messages() const { return messages_; }

  static bool hasLine(const std::string& message, const std::string& line) {
    std::istringstream lines(message);
    for (std::string each; std::getline(lines, each);) {
      if (each == line || (line.back() == '=' && each.rfind(line, 0) == 0)) return true;
    }
    return false;
  }

 private:
  std::optional<std::string> receive(Clock::time_point deadline) {
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd descriptor{fd_, POLLIN, 0};
      int ready = ::poll(&descriptor, 1, static_cast<int>(left.count()));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) return std::nullopt;
      char buffer[4096];
      ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n < 0) continue;
      messages_.emplace_back(buffer, static_cast<std::size_t>(n));
      return messages_.back();
    }
  }

  fs::path path_;
  int fd_ = -1;
  std::vector<std::string> messages_;
  std::size_t checked_ = 0;
};

// A child process with its stdout and stderr in a log file; killed if still running at the end.
class Child {
 public:
  Child(std::vector<std::string> argv, const std::map<std::string, std::string>& env, fs::path log)
      : log_(std::move(log)) {
    std::vector<std::string> envStorage = childEnvironment(env);
    std::vector<char*> envp;
    for (auto& text : envStorage) envp.push_back(text.data());
    envp.push_back(nullptr);
    std::vector<char*> args;
    for (auto& arg : argv) args.push_back(arg.data());
    args.push_back(nullptr);
    int logFd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(logFd, STDOUT_FILENO);
      ::dup2(logFd, STDERR_FILENO);
      int devnull = ::open("/dev/null", O_RDONLY);
      ::dup2(devnull, STDIN_FILENO);
      ::execve(args[0], args.data(), envp.data());
      _exit(127);
    }
    ::close(logFd);
  }
  ~Child() {
    if (running()) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  bool running() {
    if (status_) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return false;
    }
    return true;
  }
  std::optional<int> wait(std::chrono::milliseconds timeout = 15s) {
    eventually([this] { return !running(); }, timeout);
    return status_;
  }
  std::optional<int> stop(int signal = SIGTERM) {
    if (running()) ::kill(pid_, signal);
    return wait();
  }
  void signal(int number) { ::kill(pid_, number); }
  // The program the process runs now (its name changes when it execs).
  std::string comm() const {
    std::string name = readFile("/proc/" + std::to_string(pid_) + "/comm");
    while (!name.empty() && name.back() == '\n') name.pop_back();
    return name;
  }
  std::string log() const { return readFile(log_); }

 private:
  fs::path log_;
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// The system calls a SystemCallFilter= setting allows: its @groups expanded the way systemd-analyze
// lists them, then "~" lines taken away, in order.
std::set<std::string> expandGroup(const fs::path& analyze, const std::string& group,
                                  std::set<std::string>& seen) {
  std::set<std::string> out;
  if (!seen.insert(group).second) return out;
  auto listed = runProgram({analyze.string(), "syscall-filter", group});
  REQUIRE(listed.status == 0);
  std::istringstream lines(listed.out);
  std::string line;
  std::getline(lines, line);  // the group's own name
  while (std::getline(lines, line)) {
    auto start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    std::string name = line.substr(start);
    if (name[0] == '@') {
      auto nested = expandGroup(analyze, name, seen);
      out.insert(nested.begin(), nested.end());
    } else {
      out.insert(name);
    }
  }
  return out;
}

std::set<std::string> allowedSyscalls(const fs::path& analyze, const std::string& unitText) {
  std::set<std::string> allowed;
  std::istringstream lines(unitText);
  bool sawAllowList = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("SystemCallFilter=", 0) != 0) continue;
    std::string value = line.substr(std::strlen("SystemCallFilter="));
    bool deny = !value.empty() && value[0] == '~';
    if (deny) value.erase(0, 1);
    std::istringstream words(value);
    for (std::string word; words >> word;) {
      std::set<std::string> seen;
      std::set<std::string> names;
      if (word[0] == '@') {
        names = expandGroup(analyze, word, seen);
      } else {
        names.insert(word);
      }
      for (const auto& name : names) {
        if (deny) {
          allowed.erase(name);
        } else {
          allowed.insert(name);
        }
      }
      sawAllowList = sawAllowList || !deny;
    }
  }
  REQUIRE(sawAllowList);
  return allowed;
}

// `DESTDIR=<root> cmake --install <build> --prefix <prefix>`: what a package or an admin installs.
void install(const fs::path& destdir, const std::string& prefix) {
  auto installed = runProgram({"cmake", "--install", kBuildDir.string(), "--prefix", prefix}, "",
                              {{"DESTDIR", destdir.string()}});
  INFO(installed.out << installed.err);
  REQUIRE(installed.status == 0);
}

std::string firstMatch(const std::string& text, const std::regex& pattern) {
  std::smatch match;
  if (!std::regex_search(text, match, pattern)) return {};
  return match[1].str();
}

}  // namespace

TEST_CASE(
    "socket activation: the first connection starts the daemon, it serves two clients, "
    "SIGTERM is clean and the socket is left alone",
    "[systemd][activation]") {
  REQUIRE_PROGRAM(activate, "systemd-socket-activate");
  TempDir dir;
  auto socket = dir.path() / "s";
  auto state = dir.path() / "state";
  NotifyListener notify(dir.path() / "n");
  Child daemon({activate->string(), "--listen=" + socket.string(), "-E",
                "NOTIFY_SOCKET=" + notify.path().string(), daemonBinary().string(), "--state-dir",
                state.string(), "--log-level", "debug", "--log-format", "text"},
               {}, dir.path() / "log");
  REQUIRE(eventually([&] { return isListening(socket); }));

  // Nothing has started yet: systemd-socket-activate holds the socket, the daemon is not running.
  std::this_thread::sleep_for(300ms);
  CHECK(daemon.comm() != "toolhostd");
  CHECK_FALSE(fs::exists(state));
  CHECK(notify.messages().empty());

  RawClient first(socket);  // the kernel queues the connection until the daemon accepts it
  auto pong = first.call("ping");
  CHECK(pong.at("result").at("pong") == true);
  CHECK(daemon.comm() == "toolhostd");
  CHECK(fs::exists(state / "db" / "data.mdb"));
  CHECK(notify.waitFor("READY=1"));

  auto info = first.call("daemon.info", nullptr, 2).at("result");
  CHECK(info.at("socket") ==
        json::value(socket.string()));    // the passed socket, not a configured path
  CHECK(info.at("pid") == daemon.pid());  // systemd-socket-activate exec'd the daemon

  RawClient second(socket);
  CHECK(second.call("ping").contains("result"));
  CHECK(first.call("ping", nullptr, 3).contains("result"));
  first.close();
  second.close();

  CHECK(daemon.stop(SIGTERM) == 0);
  CHECK(notify.waitFor("STOPPING=1"));
  std::string log = daemon.log();
  INFO(log);
  CHECK_THAT(log, Catch::Contains("listening on " + socket.string()));
  CHECK_THAT(log, Catch::Contains("stopped"));
  // The daemon did not create the socket file and must not remove it.
  CHECK(isSocket(socket));
}

namespace {

// toolhostd under systemd-socket-activate, once that listens on `socket`; the first client
// starts the daemon.
std::unique_ptr<Child> activatedDaemon(const fs::path& activate, const fs::path& socket,
                                       const TempDir& dir) {
  auto daemon = std::make_unique<Child>(
      std::vector<std::string>{activate.string(), "--listen=" + socket.string(),
                               daemonBinary().string(), "--state-dir",
                               (dir.path() / "state").string(), "--log-format", "text"},
      std::map<std::string, std::string>{}, dir.path() / "log");
  REQUIRE(eventually([&] { return isListening(socket); }));
  return daemon;
}

// daemon.health's socket check, asked with request id `id` (then the next one).
json::object socketCheck(RawClient& client, int& id) {
  return client.call("daemon.health", nullptr, id++)
      .at("result")
      .at("checks")
      .at("socket")
      .as_object();
}

}  // namespace

TEST_CASE("socket activation: systemd's socket file removed is reported, never made again",
          "[systemd][activation]") {
  REQUIRE_PROGRAM(activate, "systemd-socket-activate");
  TempDir dir;
  auto socket = dir.path() / "s";
  auto daemon = activatedDaemon(*activate, socket, dir);
  RawClient client(socket);
  CHECK(client.call("ping").contains("result"));
  fs::remove(socket);
  json::object check;
  int id = 2;
  // Until the socket check's detail says `words`.
  auto checkSays = [&](const std::string& words) {
    return eventually([&] {
      check = socketCheck(client, id);
      const auto* detail = check.if_contains("detail");
      return detail != nullptr && detail->as_string().find(words) != json::string::npos;
    });
  };
  REQUIRE(checkSays("is gone"));
  CHECK(check.at("ok") == false);
  CHECK_THAT(std::string(check.at("detail").as_string()),
             Catch::Contains("is gone") && Catch::Contains("restart toolhost.socket"));
  CHECK_FALSE(fs::exists(socket));
  // Something else in its place is no cure.
  std::ofstream(socket) << "not a socket";
  REQUIRE(checkSays("was replaced"));
  CHECK(check.at("ok") == false);
  CHECK(client.call("ping", nullptr, id++).contains("result"));
  CHECK(daemon->stop(SIGTERM) == 0);
}

TEST_CASE("socket activation: systemd's socket file gone before the daemon started is reported",
          "[systemd][activation]") {
  REQUIRE_PROGRAM(activate, "systemd-socket-activate");
  TempDir dir;
  auto socket = dir.path() / "s";
  auto daemon = activatedDaemon(*activate, socket, dir);
  // Reached through a link: the first connection starts the daemon with the file already gone.
  fs::create_hard_link(socket, dir.path() / "link");
  fs::remove(socket);
  RawClient client(dir.path() / "link");
  int id = 1;
  json::object check;
  REQUIRE(eventually([&] {
    check = socketCheck(client, id);
    return check.at("ok") == false;
  }));
  CHECK_THAT(std::string(check.at("detail").as_string()), Catch::Contains("is gone"));
  CHECK(daemon->stop(SIGTERM) == 0);
}

TEST_CASE("socket activation: an abstract socket has no file to watch", "[systemd][activation]") {
  REQUIRE_PROGRAM(activate, "systemd-socket-activate");
  TempDir dir;
  const std::string name = "toolhost-test-" + std::to_string(::getpid());
  Child daemon({activate->string(), "--listen=@" + name, daemonBinary().string(), "--state-dir",
                (dir.path() / "state").string(), "--log-format", "text"},
               {}, dir.path() / "log");
  int fd = -1;
  REQUIRE(eventually([&] {
    if (fd >= 0) ::close(fd);
    fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path + 1, name.data(), name.size());
    const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    return ::connect(fd, reinterpret_cast<const sockaddr*>(&address), length) == 0;
  }));
  const std::string request = R"({"jsonrpc":"2.0","id":1,"method":"daemon.health"})"
                              "\n";
  json::value health;
  // Until the daemon has run long enough for a check or more.
  for (int i = 0; i < 100; ++i) {
    REQUIRE(::write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size()));
    std::string answer;
    char buffer[4096];
    while (answer.find('\n') == std::string::npos) {
      const ssize_t got = ::read(fd, buffer, sizeof buffer);
      if (got <= 0) break;
      answer.append(buffer, static_cast<std::size_t>(got));
    }
    INFO(answer);
    health = json::parse(answer).at("result");
    if (health.at("uptimeMs").as_int64() >= 2500) break;
    std::this_thread::sleep_for(100ms);
  }
  ::close(fd);
  CHECK(health.at("checks").at("socket").at("ok") == true);
  CHECK(health.at("status") == "ok");
  CHECK(daemon.stop(SIGTERM) == 0);
}

TEST_CASE("socket activation refuses sockets it cannot serve", "[systemd][activation]") {
  REQUIRE_PROGRAM(activate, "systemd-socket-activate");
  TempDir dir;
  // Two sockets: toolhost.socket must have exactly one ListenStream=.
  Child daemon({activate->string(), "--listen=" + (dir.path() / "a").string(),
                "--listen=" + (dir.path() / "b").string(), daemonBinary().string(), "--state-dir",
                (dir.path() / "state").string(), "--log-format", "text"},
               {}, dir.path() / "log");
  REQUIRE(eventually([&] { return isListening(dir.path() / "a"); }));
  try {
    RawClient client(dir.path() / "a");
  } catch (const std::exception&) {
  }
  CHECK(daemon.wait() == 1);
  CHECK_THAT(daemon.log(), Catch::Contains("exactly one ListenStream="));
}

TEST_CASE("READY=1 comes once the socket listens and the store is open, then STATUS and STOPPING",
          "[systemd][notify]") {
  TempDir dir;
  auto socket = dir.path() / "s";
  auto state = dir.path() / "state";
  NotifyListener notify(dir.path() / "n");
  Child daemon({daemonBinary().string(), "--socket", socket.string(), "--state-dir", state.string(),
                "--log-format", "text"},
               {{"NOTIFY_SOCKET", notify.path().string()}}, dir.path() / "log");
  auto ready = notify.waitFor("READY=1");
  REQUIRE(ready);
  // Checked right away, before anything else can catch up: READY=1 was not premature.
  CHECK(canConnect(socket));
  CHECK(fs::exists(state / "db" / "data.mdb"));
  CHECK(NotifyListener::hasLine(
      *ready, "STATUS=Serving on " + socket.string() + ": 0 connection(s) open, 0 since start"));
  for (const auto& message : notify.messages())
    CHECK_FALSE(NotifyListener::hasLine(message, "STOPPING=1"));

  {
    RawClient client(socket);
    CHECK(client.call("ping").contains("result"));
    // The status line follows the connections (refreshed every few seconds).
    CHECK(notify.waitForStatus(": 1 connection(s) open, 2 since start", 10s));
  }

  daemon.signal(SIGTERM);
  auto stopping = notify.waitFor("STOPPING=1");
  REQUIRE(stopping);
  CHECK_THAT(*stopping, Catch::Contains("\nSTATUS=Stopping: finishing requests on "));
  CHECK(notify.waitFor("STATUS=Stopped"));
  CHECK(daemon.wait() == 0);
  CHECK_FALSE(fs::exists(socket));  // this one the daemon created, so it removes it
}

TEST_CASE("WATCHDOG=1 comes every WATCHDOG_USEC/2 and only when systemd asks for it",
          "[systemd][watchdog]") {
  TempDir dir;
  auto start = [&](const std::string& name, std::map<std::string, std::string> env) {
    env["NOTIFY_SOCKET"] = (dir.path() / (name + ".n")).string();
    return std::make_unique<Child>(
        std::vector<std::string>{daemonBinary().string(), "--socket",
                                 (dir.path() / (name + ".s")).string(), "--state-dir",
                                 (dir.path() / name).string(), "--log-format", "text"},
        env, dir.path() / (name + ".log"));
  };
  auto countPings = [](const std::vector<std::string>& messages) {
    return std::count_if(messages.begin(), messages.end(), [](const std::string& message) {
      return NotifyListener::hasLine(message, "WATCHDOG=1");
    });
  };

  NotifyListener asked(dir.path() / "a.n");
  auto watched = start("a", {{"WATCHDOG_USEC", "200000"}});
  REQUIRE(asked.waitFor("READY=1"));
  auto pings = countPings(asked.collect(1000ms));
  CHECK(pings >= 5);  // every 100 ms
  CHECK(pings <= 13);
  CHECK_THAT(watched->log(), Catch::Contains("systemd watchdog: 200 ms; pinging every 100 ms"));

  // A stopped process sends nothing; systemd would kill it after WatchdogSec.
  watched->signal(SIGSTOP);
  std::this_thread::sleep_for(100ms);
  asked.collect(50ms);
  CHECK(countPings(asked.collect(500ms)) == 0);
  watched->signal(SIGCONT);
  CHECK(countPings(asked.collect(500ms)) >= 3);
  // Stopped while its pings are still read: sd_notify blocks once ten datagrams wait unread.
  CHECK(watched->stop() == 0);

  // No WatchdogSec, or a WATCHDOG_PID that is not the daemon: no pings.
  NotifyListener unasked(dir.path() / "b.n");
  auto unwatched = start("b", {});
  REQUIRE(unasked.waitFor("READY=1"));
  CHECK(countPings(unasked.collect(700ms)) == 0);
  NotifyListener other(dir.path() / "c.n");
  auto otherPid = start("c", {{"WATCHDOG_USEC", "200000"}, {"WATCHDOG_PID", "1"}});
  REQUIRE(other.waitFor("READY=1"));
  CHECK(countPings(other.collect(700ms)) == 0);

  CHECK(unwatched->stop() == 0);
  CHECK(otherPid->stop() == 0);
}

TEST_CASE("the watchdog ping comes from the event loop: a wedged loop stops it",
          "[systemd][watchdog]") {
  TempDir dir;
  NotifyListener notify(dir.path() / "n");
  ::setenv("NOTIFY_SOCKET", notify.path().c_str(), 1);
  boost::asio::io_context io(1);
  std::atomic<int> statusCalls{0};
  toolhost::daemon::Heartbeat heartbeat(io.get_executor(), 50ms, true, [&] {
    ++statusCalls;
    return std::string("fine");
  });
  heartbeat.start();
  auto work = boost::asio::make_work_guard(io);
  std::thread loop([&] { io.run(); });

  auto pings = [](const std::vector<std::string>& messages) {
    return std::count_if(messages.begin(), messages.end(), [](const std::string& message) {
      return NotifyListener::hasLine(message, "WATCHDOG=1");
    });
  };
  auto before = notify.collect(400ms);
  CHECK(pings(before) >= 5);
  // STATUS= only when it changes.
  CHECK(std::count_if(before.begin(), before.end(), [](const std::string& message) {
          return NotifyListener::hasLine(message, "STATUS=fine");
        }) == 1);

  // Wedge the loop's only thread for 800 ms.
  boost::asio::post(io, [] { std::this_thread::sleep_for(800ms); });
  notify.collect(100ms);  // a ping already on its way
  CHECK(pings(notify.collect(600ms)) == 0);
  std::this_thread::sleep_for(200ms);
  CHECK(pings(notify.collect(400ms)) >= 4);  // the loop is back, so are the pings

  heartbeat.stop();
  std::this_thread::sleep_for(100ms);
  notify.collect(60ms);
  CHECK(pings(notify.collect(300ms)) == 0);
  work.reset();
  io.stop();
  loop.join();
  ::unsetenv("NOTIFY_SOCKET");
  CHECK(statusCalls > 0);
}

TEST_CASE("a SIGHUP while the daemon starts is ignored, not fatal", "[systemd][reload]") {
  TempDir dir;
  auto socket = dir.path() / "s";
  Child daemon({daemonBinary().string(), "--socket", socket.string(), "--state-dir",
                (dir.path() / "state").string(), "--log-format", "text"},
               {}, dir.path() / "log");
  // Its first line comes before the reload handler is in place (the store opens first).
  REQUIRE(eventually([&] { return daemon.log().find("store: opened") != std::string::npos; }));
  daemon.signal(SIGHUP);
  REQUIRE(eventually([&] { return fs::exists(socket) || !daemon.running(); }));
  INFO(daemon.log());
  CHECK(daemon.running());
  RawClient client(socket);
  CHECK(client.call("ping").contains("result"));
  CHECK(daemon.stop() == 0);
}

TEST_CASE(
    "SIGHUP reloads access rules, limits and log level, names restart-only settings, "
    "and keeps the config in force when the new one is bad",
    "[systemd][reload]") {
  TempDir dir;
  auto socket = dir.path() / "s";
  auto config = dir.path() / "toolhost.toml";
  writeFile(config, "[limits]\nmax_batch = 2\n[log]\nlevel = \"info\"\n");
  NotifyListener notify(dir.path() / "n");
  Child daemon(
      {daemonBinary().string(), "--socket", socket.string(), "--state-dir",
       (dir.path() / "state").string(), "--config", config.string(), "--log-format", "text"},
      {{"NOTIFY_SOCKET", notify.path().string()}}, dir.path() / "log");
  REQUIRE(notify.waitFor("READY=1"));
  const std::string batchOfThree =
      R"([{"jsonrpc":"2.0","method":"ping","id":1},{"jsonrpc":"2.0","method":"ping","id":2},)"
      R"({"jsonrpc":"2.0","method":"ping","id":3}])"
      "\n";
  {
    RawClient client(socket);
    CHECK(client.call("daemon.info").at("result").at("limits").at("maxBatch") == 2);
    client.send(batchOfThree);
    auto refused = client.readJson();
    REQUIRE(refused.is_object());
    CHECK(refused.at("error").at("data").at("kind") == "limit-exceeded");
  }
  CHECK_THAT(daemon.log(), !Catch::Contains(" open uid="));  // debug lines are off at info

  bool asRoot = ::geteuid() == 0;
  if (asRoot) {
    ::chmod(dir.path().c_str(), 0755);
    ::chmod(socket.c_str(), 0777);
    auto refused = runProgram({"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                               ctlBinary().string(), "--socket", socket.string(), "ping"});
    CHECK(refused.status == 1);
  }

  RawClient accepted(socket);  // before the reload: it keeps the limits it was accepted with
  CHECK(accepted.call("ping").contains("result"));
  writeFile(config,
            "[limits]\nmax_batch = 3\n[log]\nlevel = \"debug\"\n[store]\nmap_size_mb = 2048\n"
            "[server]\nio_threads = 3\n[[access]]\nuid = 65534\nroles = [\"agent\"]\n");
  daemon.signal(SIGHUP);
  auto reloading = notify.waitFor("RELOADING=1");
  REQUIRE(reloading);
  CHECK(NotifyListener::hasLine(*reloading, "MONOTONIC_USEC="));
  auto ready = notify.waitFor("READY=1");
  REQUIRE(ready);
  CHECK_THAT(*ready, Catch::Contains("restart to apply: store.map_size_mb: 1024 -> 2048, "
                                     "server.io_threads: 1 -> 3"));
  std::string log = daemon.log();
  INFO(log);
  CHECK_THAT(log, Catch::Contains("limits.max_batch: 2 -> 3"));
  CHECK_THAT(log, Catch::Contains("log.level: info -> debug"));
  CHECK_THAT(log, Catch::Contains("access: 1 rule(s) -> 2 rule(s)"));
  CHECK_THAT(log, Catch::Contains("store.map_size_mb: 1024 -> 2048 changed in the configuration; "
                                  "it takes effect after a restart"));
  CHECK_THAT(log, Catch::Contains("server.io_threads: 1 -> 3 changed"));
  {
    RawClient client(socket);
    auto info = client.call("daemon.info").at("result");
    CHECK(info.at("limits").at("maxBatch") == 3);
    client.send(batchOfThree);
    auto answered = client.readJson();
    REQUIRE(answered.is_array());
    CHECK(answered.as_array().size() == 3);
  }
  // daemon.info shows a connection the limits that bind it.
  CHECK(accepted.call("daemon.info").at("result").at("limits").at("maxBatch") == 2);
  accepted.send(batchOfThree);
  CHECK(accepted.readJson().at("error").at("data").at("kind") == "limit-exceeded");
  CHECK(eventually(
      [&] { return daemon.log().find(" open uid=") != std::string::npos; }));  // debug on
  if (asRoot) {
    auto served = runProgram({"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                              ctlBinary().string(), "--socket", socket.string(), "info"});
    CHECK(served.status == 0);
    CHECK(parse(served.out).at("caller").at("roles").as_array() == json::array{"agent"});
  } else {
    WARN("needs root to connect as another uid; the access-rule part is skipped");
  }

  // A config that does not load changes nothing, and says so.
  writeFile(config, "[limits]\nmax_batch = \"many\"\n");
  daemon.signal(SIGHUP);
  REQUIRE(notify.waitFor("RELOADING=1"));
  auto kept = notify.waitFor("READY=1");
  REQUIRE(kept);
  CHECK_THAT(*kept, Catch::Contains("last reload failed, previous configuration kept"));
  CHECK(eventually([&] {
    return daemon.log().find("reload failed, the configuration in force is kept") !=
           std::string::npos;
  }));
  CHECK_THAT(daemon.log(), Catch::Contains("limits.max_batch"));
  {
    RawClient client(socket);
    CHECK(client.call("daemon.info").at("result").at("limits").at("maxBatch") == 3);
  }
  CHECK(daemon.stop() == 0);
}

TEST_CASE("the shipped /etc/toolhost/toolhost.toml is accepted by the daemon", "[systemd][units]") {
  DaemonOptions options;
  options.configToml = readFile(kSourceDir / "systemd" / "toolhost.toml");
  REQUIRE_FALSE(options.configToml.empty());
  auto daemon = DaemonProcess::start(options);
  RawClient client(daemon->socket());
  auto info = client.call("daemon.info").at("result");
  CHECK(info.at("limits").at("maxBatch") == 256);  // the commented values are the defaults
  CHECK(daemon->stop() == 0);
}

TEST_CASE("systemd-analyze verify passes on the installed units", "[systemd][units]") {
  REQUIRE_PROGRAM(analyze, "systemd-analyze");
  TempDir dir;

  // The system units as packaged (ExecStart=/usr/bin/toolhostd), in a root that also holds the
  // units and the kill(1) they refer to.
  auto root = dir.path() / "root";
  install(root, "/usr");
  std::error_code ec;
  fs::copy("/usr/lib/systemd/system", root / "usr/lib/systemd/system",
           fs::copy_options::recursive | fs::copy_options::skip_existing |
               fs::copy_options::copy_symlinks,
           ec);
  REQUIRE_FALSE(ec);
  fs::copy_file(*findProgram("kill"), root / "usr/bin/kill");
  auto units = root / "usr/lib/systemd/system";
  auto verified =
      runProgram({analyze->string(), "verify", "--root=" + root.string(),
                  (units / "toolhost.socket").string(), (units / "toolhost.service").string()});
  INFO(verified.out << verified.err);
  CHECK(verified.status == 0);
  CHECK(verified.out.empty());
  CHECK(verified.err.empty());  // warnings (unknown keys, bad values) fail the test too

  // The check can fail: a misspelt directive in a unit that takes precedence (under --root units
  // are found by name in the root's search path) is reported.
  auto override = root / "etc/systemd/system/toolhost.service";
  fs::create_directories(override.parent_path());
  writeFile(override, readFile(units / "toolhost.service") + "ProtectSytem=strict\n");
  auto complained = runProgram({analyze->string(), "verify", "--root=" + root.string(),
                                (units / "toolhost.socket").string(), override.string()});
  CHECK_THAT(complained.err, Catch::Contains("Unknown key 'ProtectSytem'"));
  fs::remove(override);

  // The sysusers.d snippet parses and creates the user and group the units name.
  REQUIRE_PROGRAM(sysusers, "systemd-sysusers");
  auto users = runProgram({sysusers->string(), "--root=" + root.string(), "--dry-run",
                           (root / "usr/lib/sysusers.d/toolhost.conf").string()});
  INFO(users.out << users.err);
  CHECK(users.status == 0);
  CHECK_THAT(users.err + users.out, Catch::Contains("Creating user 'toolhost'"));
  CHECK_THAT(readFile(units / "toolhost.service"), Catch::Contains("\nUser=toolhost\n"));
  CHECK_THAT(readFile(units / "toolhost.socket"), Catch::Contains("\nSocketGroup=toolhost\n"));

  // The user units: `systemd-analyze --user` has no --root, so they are installed with the
  // temporary directory as prefix (ExecStart=<dir>/prefix/bin/toolhostd).
  auto prefix = dir.path() / "prefix";
  install("", prefix.string());
  auto runtime = dir.path() / "xdg";
  fs::create_directories(runtime);
  ::chmod(runtime.c_str(), 0700);
  auto userUnits = prefix / "lib/systemd/user";
  CHECK_THAT(readFile(userUnits / "toolhost.service"),
             Catch::Contains("ExecStart=" + (prefix / "bin/toolhostd").string() + "\n"));
  auto user =
      runProgram({analyze->string(), "--user", "verify", (userUnits / "toolhost.socket").string(),
                  (userUnits / "toolhost.service").string()},
                 "", {{"XDG_RUNTIME_DIR", runtime.string()}});
  INFO(user.out << user.err);
  CHECK(user.status == 0);
  CHECK(user.out.empty());
  CHECK(user.err.empty());
}

TEST_CASE("the service's exposure score is no worse than the recorded one", "[systemd][units]") {
  REQUIRE_PROGRAM(analyze, "systemd-analyze");
  TempDir dir;
  install(dir.path(), "/usr");
  auto unit = dir.path() / "usr/lib/systemd/system/toolhost.service";
  auto analyzed = runProgram({analyze->string(), "security", "--offline=yes", unit.string()});
  INFO(analyzed.out << analyzed.err);
  REQUIRE(analyzed.status == 0);
  std::string scored = firstMatch(
      analyzed.out, std::regex(R"(Overall exposure level for toolhost\.service: ([0-9.]+))"));
  REQUIRE_FALSE(scored.empty());

  // The recorded value lives in one place, systemd/exposure-score.txt, and the README quotes it.
  std::string recorded = readFile(kSourceDir / "systemd" / "exposure-score.txt");
  recorded = firstMatch(recorded, std::regex(R"(^([0-9.]+))"));
  REQUIRE_FALSE(recorded.empty());
  INFO("scored " << scored << ", recorded " << recorded);
  CHECK(std::stod(scored) <= std::stod(recorded));
  CHECK_THAT(readFile(kSourceDir / "README.md"),
             Catch::Contains("exposure level **" + recorded + "**"));

  // And the reasons for what is left exposed are written down in the unit.
  std::string text = readFile(unit);
  CHECK_THAT(text, Catch::Contains("[runtime] jit = true needs a drop-in with\n# "
                                    "MemoryDenyWriteExecute=no"));
  CHECK_THAT(text, Catch::Contains("Not PrivateUsers="));
  CHECK_THAT(text, Catch::Contains("\nMemoryDenyWriteExecute=yes\n"));
}

TEST_CASE(
    "the daemon and V8 run under the unit's SystemCallFilter, and MemoryDenyWriteExecute "
    "would break V8's JIT but not V8 --jitless",
    "[systemd][seccomp]") {
  REQUIRE_PROGRAM(analyze, "systemd-analyze");
  REQUIRE_PROGRAM(activate, "systemd-socket-activate");
#ifdef TOOLHOST_SANITIZED
  // LeakSanitizer stops the world with ptrace at exit, which the unit's filter forbids: the
  // children would never finish. Leaks are checked by every other test of a sanitized build.
  ::setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
#endif
  TempDir dir;
  auto allowed =
      allowedSyscalls(*analyze, readFile(kSourceDir / "systemd" / "toolhost.service.in"));
  CHECK(allowed.count("mprotect") == 1);
  CHECK(allowed.count("setuid") == 0);  // ~@privileged took it away
  CHECK(allowed.count("landlock_restrict_self") == 1);  // the sandbox hosts confine themselves
  // The per-user unit runs the same daemon under the same filter.
  CHECK(allowedSyscalls(*analyze, readFile(kSourceDir / "systemd" / "user" /
                                           "toolhost.service.in")) == allowed);
  auto list = dir.path() / "syscalls";
  {
    std::ofstream out(list);
    for (const auto& name : allowed) out << name << "\n";
  }
  const std::string helper = TOOLHOST_SECCOMP_RUN;

  // JavaScript hot enough for the optimizing compiler, native regular expressions, GC: with
  // [runtime] jit = true, and with the default --jitless.
  auto jit = runProgram({helper, list.string(), "v8", "jit"});
  INFO("v8 with its JIT under the filter: status " << jit.status << "\n" << jit.out << jit.err);
  CHECK(jit.status == 0);
  CHECK_THAT(jit.out, Catch::Contains(R"("matched":2858,"objects":200000)"));
  auto jitless = runProgram({helper, list.string(), "v8"});
  INFO("v8 --jitless under the filter: status " << jitless.status << "\n"
                                                << jitless.out << jitless.err);
  CHECK(jitless.status == 0);
  CHECK_THAT(jitless.out, Catch::Contains(R"("matched":2858,"objects":200000)"));

  // What MemoryDenyWriteExecute= adds (no PROT_EXEC by mprotect, no W+X mappings) stops V8's
  // JIT; V8 --jitless makes no executable memory and runs under it.
  auto denied = runProgram({helper, "--mdwe", list.string(), "v8", "jit"});
  INFO("v8 with its JIT and MemoryDenyWriteExecute: status " << denied.status << "\n"
                                                             << denied.out << denied.err);
  CHECK(denied.status != 0);
  auto underMdwe = runProgram({helper, "--mdwe", list.string(), "v8"});
  INFO("v8 --jitless with MemoryDenyWriteExecute: status " << underMdwe.status << "\n"
                                                           << underMdwe.out << underMdwe.err);
  CHECK(underMdwe.status == 0);
  CHECK_THAT(underMdwe.out, Catch::Contains(R"("matched":2858,"objects":200000)"));

  // The daemon itself, socket-activated, under the filter and MemoryDenyWriteExecute= as the unit
  // sets them, running a JavaScript tool in its sandbox host, through a reload and a clean stop.
  auto socket = dir.path() / "s";
  NotifyListener notify(dir.path() / "n");
  std::vector<std::string> command{activate->string(), "--listen=" + socket.string(), "-E",
                                   "NOTIFY_SOCKET=" + notify.path().string(), "-E",
                                   "WATCHDOG_USEC=1000000"};
#ifdef TOOLHOST_SANITIZED
  // systemd-socket-activate passes on only the variables it is given.
  command.insert(command.end(), {"-E", "ASAN_OPTIONS=detect_leaks=0"});
#endif
  command.insert(command.end(), {helper, "--mdwe", list.string(), "exec", daemonBinary().string(),
                                 "--state-dir", (dir.path() / "state").string(), "--log-format",
                                 "text"});
  Child daemon(command, {}, dir.path() / "log");
  REQUIRE(eventually([&] { return isListening(socket); }));
  boost::json::value revision;
  {
    RawClient client(socket);
    CHECK(client.call("ping").contains("result"));
    CHECK(client.call("rpc.discover", nullptr, 2).contains("result"));
    CHECK(client.call("daemon.health", nullptr, 3).at("result").at("status") == "ok");
    auto manifest = boost::json::parse(R"({"manifest": {"name": "square",
        "description": "squares n", "parameters": {"type": "object"},
        "execution": {"class": "sandboxed-code", "runtime": "javascript",
                      "source": "export default async ({ n }) => n * n"}}})");
    auto installed = client.call("tools.install", manifest, 4);
    INFO(toolhost::protocol::writeJson(installed));
    REQUIRE(installed.contains("result"));
    revision = installed.at("result").at("revision");
    auto called = client.call(
        "tools.call",
        boost::json::object{{"revision", installed.at("result").at("revision")},
                            {"arguments", boost::json::object{{"n", 12}}}},
        5);
    INFO(toolhost::protocol::writeJson(called));
    REQUIRE(called.contains("result"));
    CHECK(called.at("result").at("result") == 144);
  }
  REQUIRE(notify.waitFor("READY=1"));
  CHECK(notify.waitFor("WATCHDOG=1"));
  daemon.signal(SIGHUP);
  CHECK(notify.waitFor("RELOADING=1"));
  CHECK(notify.waitFor("READY=1"));
  const auto stopped = daemon.stop();
  INFO(daemon.log());
  CHECK(stopped == 0);
  CHECK(notify.waitFor("STOPPING=1"));

  // Started again on the state it left, under the same filter: the page check of the database
  // (a child process) runs first and passes, and the tool is still there.
  {
    Child again(command, {}, dir.path() / "log2");
    REQUIRE(eventually([&] { return isListening(socket); }));
    RawClient client(socket);
    auto called = client.call(
        "tools.call",
        boost::json::object{{"revision", revision}, {"arguments", boost::json::object{{"n", 3}}}},
        6);
    INFO(toolhost::protocol::writeJson(called) << "\n" << again.log());
    REQUIRE(called.contains("result"));
    CHECK(called.at("result").at("result") == 9);
    CHECK(again.stop() == 0);
  }

  // With [runtime] jit = true under MemoryDenyWriteExecute=, the daemon says so and stops.
  auto jitConfig = dir.path() / "jit.toml";
  writeFile(jitConfig, "[runtime]\njit = true\n");
  auto refused = runProgram({helper, "--mdwe", list.string(), "exec", daemonBinary().string(),
                             "--state-dir", (dir.path() / "state").string(), "--socket",
                             (dir.path() / "j").string(), "--config", jitConfig.string()});
  INFO(refused.out << refused.err);
  CHECK(refused.status == 1);
  CHECK_THAT(refused.err, Catch::Contains("MemoryDenyWriteExecute=no"));
}

TEST_CASE(
    "the .deb holds the binaries, units, sysusers snippet and config with the right modes, "
    "and depends on what the binaries link",
    "[systemd][package]") {
  REQUIRE_PROGRAM(cpack, "cpack");
  REQUIRE_PROGRAM(dpkgDeb, "dpkg-deb");
  REQUIRE_PROGRAM(dpkg, "dpkg");
  REQUIRE_PROGRAM(readelf, "readelf");
  TempDir dir;
  auto built =
      runProgram({cpack->string(), "-G", "DEB", "--config",
                  (kBuildDir / "CPackConfig.cmake").string(), "-B", (dir.path() / "out").string()});
  INFO(built.out << built.err);
  REQUIRE(built.status == 0);
  auto arch = runProgram({dpkg->string(), "--print-architecture"}).out;
  while (!arch.empty() && arch.back() == '\n') arch.pop_back();
  auto deb = dir.path() / "out" / ("toolhost_" TOOLHOST_PACKAGE_VERSION "_" + arch + ".deb");
  REQUIRE(fs::exists(deb));

  auto field = [&](const char* name) {
    auto shown = runProgram({dpkgDeb->string(), "-f", deb.string(), name});
    std::string value = shown.out;
    while (!value.empty() && value.back() == '\n') value.pop_back();
    return value;
  };
  CHECK(field("Package") == "toolhost");
  CHECK(field("Version") == TOOLHOST_PACKAGE_VERSION);
  std::string depends = field("Depends");
  INFO("Depends: " << depends);

  auto root = dir.path() / "root";
  auto extracted = runProgram({dpkg->string(), "-x", deb.string(), root.string()});
  REQUIRE(extracted.status == 0);
  const std::vector<std::pair<std::string, unsigned>> expected{
      {"usr/bin/toolhostd", 0755},
      {"usr/bin/toolhostctl", 0755},
      {"usr/lib/systemd/system/toolhost.service", 0644},
      {"usr/lib/systemd/system/toolhost.socket", 0644},
      {"usr/lib/systemd/user/toolhost.service", 0644},
      {"usr/lib/systemd/user/toolhost.socket", 0644},
      {"usr/lib/sysusers.d/toolhost.conf", 0644},
      {"etc/toolhost/toolhost.toml", 0644},
      {"usr/share/doc/toolhost/README.md", 0644},
  };
  for (const auto& [path, mode] : expected) {
    INFO(path);
    CHECK(fs::is_regular_file(root / path));
    CHECK(modeOf(root / path) == mode);
  }
  // Owned by root in the archive, whoever built it.
  auto listing = runProgram({dpkgDeb->string(), "-c", deb.string()}).out;
  std::istringstream entries(listing);
  for (std::string entry; std::getline(entries, entry);) {
    INFO(entry);
    CHECK_THAT(entry, Catch::Contains(" root/root "));
  }
  // The units name the installed paths.
  std::string service = readFile(root / "usr/lib/systemd/system/toolhost.service");
  CHECK_THAT(service, Catch::Contains(
                          "ExecStart=/usr/bin/toolhostd --config /etc/toolhost/toolhost.toml\n"));
  CHECK_THAT(readFile(root / "usr/lib/systemd/user/toolhost.service"),
             Catch::Contains("ExecStart=/usr/bin/toolhostd\n"));
  CHECK_THAT(readFile(root / "usr/lib/sysusers.d/toolhost.conf"), Catch::Contains("u toolhost "));

  // Maintainer scripts and conffiles.
  auto control = dir.path() / "control";
  REQUIRE(runProgram({dpkgDeb->string(), "-e", deb.string(), control.string()}).status == 0);
  CHECK(readFile(control / "conffiles") == "/etc/toolhost/toolhost.toml\n");
  for (const char* script : {"postinst", "prerm", "postrm"}) {
    INFO(script);
    CHECK(modeOf(control / script) == 0755);
  }
  CHECK_THAT(readFile(control / "postinst"), Catch::Contains("systemd-sysusers toolhost.conf"));

  // Where this machine finds each library: ldd on the build tree's binaries, which link the same.
  std::map<std::string, std::string> resolved;
  for (const auto& binary : {daemonBinary(), ctlBinary()}) {
    auto listed = runProgram({"ldd", binary.string()});
    REQUIRE(listed.status == 0);
    std::regex line(R"((\S+) => (\S+) \()");
    for (std::sregex_iterator it(listed.out.begin(), listed.out.end(), line), end; it != end;
         ++it) {
      resolved[(*it)[1].str()] = (*it)[2].str();
    }
    std::regex loader(R"(^\s+(/\S+) \()");  // the dynamic loader has no "=>"
    std::istringstream lines(listed.out);
    for (std::string each; std::getline(lines, each);) {
      std::smatch match;
      if (std::regex_search(each, match, loader)) {
        resolved[fs::path(match[1].str()).filename().string()] = match[1].str();
      }
    }
  }
  // The package that ships a file (dpkg knows /lib and /usr/lib apart on merged-/usr systems).
  auto owner = [&](const std::string& path) -> std::string {
    std::vector<std::string> candidates{path, fs::weakly_canonical(path).string()};
    for (std::string candidate : std::vector<std::string>(candidates)) {
      if (candidate.rfind("/usr/", 0) == 0) {
        candidates.push_back(candidate.substr(4));
      } else {
        candidates.push_back("/usr" + candidate);
      }
    }
    for (const auto& candidate : candidates) {
      auto found = runProgram({dpkg->string(), "-S", candidate});
      if (found.status == 0) return found.out.substr(0, found.out.find_first_of(":,"));
    }
    return {};
  };

  // No RPATH into a build tree; every library the binaries link comes from a package in Depends.
  std::set<std::string> packages;
  for (const char* binary : {"usr/bin/toolhostd", "usr/bin/toolhostctl"}) {
    auto dynamic = runProgram({readelf->string(), "-d", (root / binary).string()});
    REQUIRE(dynamic.status == 0);
    CHECK_THAT(dynamic.out, !Catch::Contains("RPATH"));
    CHECK_THAT(dynamic.out, !Catch::Contains("RUNPATH"));
    std::regex needed(R"(\(NEEDED\)\s+Shared library: \[([^\]]+)\])");
    for (std::sregex_iterator it(dynamic.out.begin(), dynamic.out.end(), needed), end; it != end;
         ++it) {
      std::string soname = (*it)[1].str();
      INFO(binary << " needs " << soname);
      REQUIRE(resolved.count(soname) == 1);
      INFO("found at " << resolved.at(soname));
      std::string package = owner(resolved.at(soname));
      // V8 unpacked into .deps/ belongs to no installed package; Debian ships it as libnode108.
      if (package.empty() && soname == "libnode.so.108") package = "libnode108";
      REQUIRE_FALSE(package.empty());
      packages.insert(package);
    }
  }
  CHECK(packages.count("libnode108") == 1);
  std::set<std::string> depended;
  std::istringstream items(depends);
  for (std::string item; std::getline(items, item, ',');) {
    auto start = item.find_first_not_of(' ');
    if (start == std::string::npos) continue;
    item = item.substr(start);
    depended.insert(item.substr(0, item.find(' ')));
  }
  for (const auto& package : packages) {
    // Depends may name a virtual package the real one provides (libspdlog1.10-fmt9).
    auto provides = runProgram({"dpkg-query", "-W", "-f=${Provides}", package}).out;
    bool listed = depended.count(package) == 1;
    std::istringstream virtuals(provides);
    for (std::string name; std::getline(virtuals, name, ',');) {
      auto start = name.find_first_not_of(' ');
      if (start == std::string::npos) continue;
      name = name.substr(start);
      listed = listed || depended.count(name.substr(0, name.find(' '))) == 1;
    }
    INFO(package << " (provides: " << provides << ")");
    CHECK(listed);
  }
}
