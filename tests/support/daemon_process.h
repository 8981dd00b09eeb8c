// Test support: a real toolhostd started on a temporary socket and state directory, and a raw
// line client for its socket. Used by end-to-end tests only; each test owns its own daemon.
#pragma once

#include "tests/support/temp_dir.h"

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <sys/types.h>

#include <csignal>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace toolhost::testing {

// The environment for a daemon (or another program of ours) started by a test: the runner's,
// without what systemd or the user may have set for a daemon of theirs (NOTIFY_SOCKET, LISTEN_*,
// WATCHDOG_*, CREDENTIALS_DIRECTORY, RUNTIME_DIRECTORY, STATE_DIRECTORY, TOOLHOST_*), plus
// `extra`, which wins over anything of the same name.
std::vector<std::string> childEnvironment(const std::map<std::string, std::string>& extra);

struct DaemonOptions {
  std::string configToml;                  // written to a file and passed with --config if set
  std::vector<std::string> extraArgs;
  std::map<std::string, std::string> env;  // added to the daemon's environment
  std::optional<std::filesystem::path> stateDir;  // defaults to <tmp>/state
  std::optional<std::filesystem::path> socketPath;  // defaults to <tmp>/s
  std::string logFormat = "text";
  bool waitUntilReady = true;
  std::optional<std::size_t> stackLimitBytes;  // the daemon's `ulimit -s` (RLIMIT_STACK), if set
  std::optional<std::size_t> fileSizeLimitBytes;  // its `ulimit -f` (RLIMIT_FSIZE), if set
};

class DaemonProcess {
 public:
  static std::unique_ptr<DaemonProcess> start(DaemonOptions options = {});
  ~DaemonProcess();

  const std::filesystem::path& socket() const { return socket_; }
  const std::filesystem::path& stateDir() const { return stateDir_; }
  const std::filesystem::path& dir() const { return dir_.path(); }
  pid_t pid() const { return pid_; }

  // Sends `signal` and waits for exit; the exit status (or 128+signal), or nullopt on timeout.
  std::optional<int> stop(int signal = SIGTERM,
                          std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // Waits for the process to exit by itself.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  bool running();
  std::string log() const;  // what the daemon wrote to stderr so far

 private:
  DaemonProcess() = default;
  TempDir dir_;
  std::filesystem::path socket_;
  std::filesystem::path stateDir_;
  std::filesystem::path logFile_;
  pid_t pid_ = -1;
  std::optional<int> exitStatus_;
};

// Runs a program to completion; its exit status and what it printed.
struct ProgramResult {
  int status = -1;
  std::string out;
  std::string err;
};
ProgramResult runProgram(const std::vector<std::string>& argv, const std::string& input = "",
                         const std::map<std::string, std::string>& env = {});

class RawClient {
 public:
  explicit RawClient(const std::filesystem::path& socket);
  ~RawClient();
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  void send(std::string_view bytes);
  // The next line (without "\n"), or nullopt on EOF or timeout.
  std::optional<std::string> readLine(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // The next line parsed as JSON; fails the test if there is none.
  boost::json::value readJson(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // Sends a request with the given id and returns the response (skipping notifications).
  boost::json::object call(const std::string& method, boost::json::value params = nullptr,
                           boost::json::value id = 1);
  // True when the daemon closes the connection within the timeout (pending lines are discarded).
  bool closedByPeer(std::chrono::milliseconds timeout = std::chrono::seconds(5));
  void shutdownWrite();
  void close();
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  std::string buffer_;
};

std::filesystem::path daemonBinary();
std::filesystem::path ctlBinary();

}  // namespace toolhost::testing
