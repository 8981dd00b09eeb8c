#include "tests/support/daemon_process.h"

#include "protocol/json_parse.h"
#include "protocol/jsonrpc.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace toolhost::testing {
namespace fs = std::filesystem;
namespace json = boost::json;
using Clock = std::chrono::steady_clock;

fs::path daemonBinary() { return TOOLHOST_DAEMON_PATH; }
fs::path ctlBinary() { return TOOLHOST_CTL_PATH; }

namespace {

bool canConnect(const fs::path& socket) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, socket.c_str(), sizeof address.sun_path - 1);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  ::close(fd);
  return ok;
}

std::vector<char*> pointersTo(std::vector<std::string>& storage) {
  std::vector<char*> pointers;
  for (auto& text : storage) pointers.push_back(text.data());
  pointers.push_back(nullptr);
  return pointers;
}

int decodeStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

std::string readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace

std::vector<std::string> childEnvironment(const std::map<std::string, std::string>& extra) {
  auto inherited = [](std::string_view name) {
    for (std::string_view dropped :
         {"NOTIFY_SOCKET", "CREDENTIALS_DIRECTORY", "RUNTIME_DIRECTORY", "STATE_DIRECTORY"}) {
      if (name == dropped) return false;
    }
    for (std::string_view prefix : {"LISTEN_", "WATCHDOG_", "TOOLHOST_"}) {
      if (name.substr(0, prefix.size()) == prefix) return false;
    }
    return true;
  };
  std::vector<std::string> out;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string text = *entry;
    const std::string name = text.substr(0, text.find('='));
    if (extra.count(name) == 0 && inherited(name)) out.push_back(std::move(text));
  }
  for (const auto& [name, value] : extra) out.push_back(name + "=" + value);
  return out;
}

std::unique_ptr<DaemonProcess> DaemonProcess::start(DaemonOptions options) {
  std::unique_ptr<DaemonProcess> daemon(new DaemonProcess());
  daemon->socket_ = options.socketPath.value_or(daemon->dir() / "s");
  daemon->stateDir_ = options.stateDir.value_or(daemon->dir() / "state");
  daemon->logFile_ = daemon->dir() / "daemon.log";
  std::vector<std::string> args{daemonBinary().string(), "--socket", daemon->socket_.string(),
                                "--state-dir", daemon->stateDir_.string(), "--log-level", "debug",
                                "--log-format", options.logFormat};
  if (!options.configToml.empty()) {
    auto configPath = daemon->dir() / "toolhost.toml";
    std::ofstream(configPath) << options.configToml;
    args.push_back("--config");
    args.push_back(configPath.string());
  }
  for (auto& arg : options.extraArgs) args.push_back(arg);
  std::vector<std::string> envStorage = childEnvironment(options.env);
  auto envp = pointersTo(envStorage);
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);

  int logFd = ::open(daemon->logFile_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(logFd, STDERR_FILENO);
    ::dup2(logFd, STDOUT_FILENO);
    int devnull = ::open("/dev/null", O_RDONLY);
    ::dup2(devnull, STDIN_FILENO);
    if (options.stackLimitBytes) {
      struct rlimit limit {
        *options.stackLimitBytes, *options.stackLimitBytes
      };
      if (::setrlimit(RLIMIT_STACK, &limit) != 0) _exit(126);
    }
    if (options.fileSizeLimitBytes) {
      struct rlimit limit {
        *options.fileSizeLimitBytes, *options.fileSizeLimitBytes
      };
      if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(126);
    }
    ::execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  ::close(logFd);
  daemon->pid_ = pid;
  if (!options.waitUntilReady) return daemon;
  auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < deadline) {
    if (canConnect(daemon->socket_)) return daemon;
    if (!daemon->running()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  FAIL("toolhostd did not start listening; its log:\n" << daemon->log());
  return daemon;
}

DaemonProcess::~DaemonProcess() {
  if (running()) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

bool DaemonProcess::running() {
  if (exitStatus_) return false;
  int status = 0;
  pid_t done = ::waitpid(pid_, &status, WNOHANG);
  if (done == pid_) {
    exitStatus_ = decodeStatus(status);
    return false;
  }
  return true;
}

std::optional<int> DaemonProcess::wait(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (running()) {
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return exitStatus_;
}

std::optional<int> DaemonProcess::stop(int signal, std::chrono::milliseconds timeout) {
  if (running()) ::kill(pid_, signal);
  return wait(timeout);
}

std::string DaemonProcess::log() const { return readFile(logFile_); }

ProgramResult runProgram(const std::vector<std::string>& args, const std::string& input,
                         const std::map<std::string, std::string>& env) {
  TempDir dir;
  auto outPath = dir.path() / "out";
  auto errPath = dir.path() / "err";
  auto inPath = dir.path() / "in";
  std::ofstream(inPath) << input;
  std::vector<std::string> envStorage = childEnvironment(env);
  auto envp = pointersTo(envStorage);
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& arg : copy) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    int in = ::open(inPath.c_str(), O_RDONLY);
    int out = ::open(outPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = ::open(errPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(in, STDIN_FILENO);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    ::execvpe(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return ProgramResult{decodeStatus(status), readFile(outPath), readFile(errPath)};
}

RawClient::RawClient(const fs::path& socket) {
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, socket.c_str(), sizeof address.sun_path - 1);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    int error = errno;
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error("cannot connect to " + socket.string() + ": " + std::strerror(error));
  }
}

RawClient::~RawClient() { close(); }

void RawClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void RawClient::send(std::string_view bytes) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(std::string("send failed: ") + std::strerror(errno));
    sent += static_cast<std::size_t>(n);
  }
}

std::optional<std::string> RawClient::readLine(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    auto newline = buffer_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd descriptor{fd_, POLLIN, 0};
    int ready = ::poll(&descriptor, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return std::nullopt;
    char chunk[65536];
    ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    buffer_.append(chunk, static_cast<std::size_t>(n));
  }
}

json::value RawClient::readJson(std::chrono::milliseconds timeout) {
  auto line = readLine(timeout);
  if (!line) FAIL("no line from the daemon");
  auto parsed = protocol::parseJson(*line, protocol::JsonParseLimits{1000});
  if (!parsed) FAIL("the daemon sent invalid JSON: " << *line);
  return *parsed;
}

json::object RawClient::call(const std::string& method, json::value params, json::value id) {
  json::object request{{"jsonrpc", "2.0"}, {"id", id}, {"method", method}};
  if (!params.is_null()) request["params"] = std::move(params);
  send(protocol::encodeLine(request));
  for (;;) {
    auto message = readJson();
    REQUIRE(message.is_object());
    if (message.as_object().contains("id")) return message.as_object();
  }
}

bool RawClient::closedByPeer(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd descriptor{fd_, POLLIN, 0};
    int ready = ::poll(&descriptor, 1, static_cast<int>(left.count()));
    if (ready <= 0) continue;
    char chunk[65536];
    ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n == 0) return true;
    if (n < 0 && errno != EINTR && errno != EAGAIN) return true;
    if (n > 0) buffer_.append(chunk, static_cast<std::size_t>(n));
  }
}

void RawClient::shutdownWrite() { ::shutdown(fd_, SHUT_WR); }

}  // namespace toolhost::testing
