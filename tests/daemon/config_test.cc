#include "daemon/config.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

using namespace toolhost::daemon;
namespace fs = std::filesystem;

namespace {

struct ConfigFile {
  fs::path path;
  explicit ConfigFile(const std::string& text) {
    char pattern[] = "/tmp/th-config-XXXXXX";
    int fd = ::mkstemp(pattern);
    ::close(fd);
    path = pattern;
    std::ofstream(path) << text;
  }
  ~ConfigFile() { fs::remove(path); }
};

// The runner's own TOOLHOST_SOCKET comes back when this goes.
struct RestoreSocketEnv {
  std::optional<std::string> value =
      std::getenv("TOOLHOST_SOCKET") ? std::optional<std::string>(std::getenv("TOOLHOST_SOCKET"))
                                     : std::nullopt;
  ~RestoreSocketEnv() {
    if (value) ::setenv("TOOLHOST_SOCKET", value->c_str(), 1);
  }
};

boost::system::result<Config, ConfigError> load(const std::string& text) {
  ConfigFile file(text);
  CommandLine commandLine;
  commandLine.configFile = file.path;
  commandLine.socketPath = "/tmp/x.sock";
  return loadConfig(commandLine);
}

}  // namespace

TEST_CASE("defaults: own uid is admin and nobody else", "[config]") {
  CommandLine commandLine;
  commandLine.socketPath = "/tmp/x.sock";
  auto config = loadConfig(commandLine);
  REQUIRE(config.has_value());
  CHECK(config->limits.maxMessageBytes == 8 * 1024 * 1024);
  CHECK(config->limits.maxDepth == 128);
  CHECK(config->access.rolesFor(PeerCredentials{1, ::geteuid(), ::getegid(), {}}) ==
        RoleSet{Role::admin});
  CHECK(config->access.rolesFor(PeerCredentials{1, 54321, 54321, {}}).empty());
}

TEST_CASE("limits, log and access rules from the file", "[config]") {
  auto config = load(R"(
[limits]
max_message_bytes = 4096
max_depth = 16
max_batch = 10
max_in_flight = 3
[log]
level = "debug"
format = "json"
[[access]]
uid = 54321
roles = ["agent", "approver"]
[[access]]
gid = 777
roles = ["host"]
)");
  REQUIRE(config.has_value());
  CHECK(config->limits.maxMessageBytes == 4096);
  CHECK(config->limits.maxDepth == 16);
  CHECK(config->limits.maxBatch == 10);
  CHECK(config->limits.maxInFlight == 3);
  CHECK(config->maxConnections == 256);
  CHECK(config->logLevel == "debug");
  CHECK(config->logFormat == LogFormat::json);
  CHECK(config->access.rolesFor(PeerCredentials{1, 54321, 1, {}}) ==
        RoleSet{Role::agent, Role::approver});
  CHECK(config->access.rolesFor(PeerCredentials{1, 54322, 777, {}}) == RoleSet{Role::host});
  // A group rule matches the process's own supplementary groups, nothing else.
  CHECK(config->access.rolesFor(PeerCredentials{1, 54322, 1, {5, 777}}) == RoleSet{Role::host});
  CHECK(config->access.rolesFor(PeerCredentials{1, 54322, 1, {5, 778}}).empty());
  // The daemon's own uid stays admin.
  CHECK(config->access.rolesFor(PeerCredentials{1, ::geteuid(), 1, {}}).has(Role::admin));
}

TEST_CASE("config errors name the key and what is wrong", "[config]") {
  auto check = [](const std::string& text, const std::string& expected) {
    auto config = load(text);
    REQUIRE_FALSE(config.has_value());
    CHECK_THAT(config.error().detail, Catch::Contains(expected));
  };
  check("[limits]\nmax_depth = 0\n", "limits.max_depth");
  check("[runtime]\ndefault_wall_ms = 60000\nmax_wall_ms = 1000\n",
        "runtime.default_wall_ms (60000) is above runtime.max_wall_ms (1000)");
  check("[runtime]\ndefault_heap_mb = 2048\n", "runtime.default_heap_mb (2048) is above");
  check("[limits]\nmax_depth = 1001\n", "limits.max_depth");
  check("[limits]\nmax_in_flight = \"x\"\n", "limits.max_in_flight");
  check("[limits]\nmax_connections = 0\n", "limits.max_connections");
  check("[log]\nlevel = \"loud\"\n", "log.level");
  check("[[access]]\nroles = [\"agent\"]\n", "needs one of user, uid, group or gid");
  check("[[access]]\nuid = 5\nroles = [\"emperor\"]\n", "unknown role");
  check("[[access]]\nuser = \"no-such-user-here\"\nroles = [\"agent\"]\n", "no user");
  check("[[access]]\nuser = \"root\"\nuid = 5\nroles = [\"agent\"]\n", "names both user and uid");
  check("[[access]]\ngroup = \"root\"\ngid = 5\nroles = [\"agent\"]\n", "names both group and gid");
  check("[[access]]\nuid = 5\ngid = 5\nroles = [\"agent\"]\n", "names both uid and gid");
  check("[[access]]\nuser = 5\nroles = [\"agent\"]\n", "access.user (line 2) must be a string");
  check("[[access]]\ngroup = true\nuid = 1\nroles = [\"agent\"]\n", "names both uid and group");
  check("[sever]\nsocket = \"/x\"\n", "not a known section");
  check("this is = = not toml", ":1:");
  check("[runtime]\njit = \"yes\"\n", "must be true or false");
  check("[runtime]\njit = 1\n", "must be true or false");
  check("[runtime]\nprewarmed = 65\n", "runtime.prewarmed");
  // A float is no integer, even with nothing after its point.
  check("[server]\nio_threads = 1.0\n", "server.io_threads (line 2) must be an integer");
  check("[limits]\nmax_batch = 2e0\n", "limits.max_batch (line 2) must be an integer");
  // No answer may exceed 64 MiB, so a result cap above 63 MiB could never be delivered.
  check("[runtime]\nmax_output_bytes = 66060289\n", "from 1 to 66060288");
  check("[runtime]\ndefault_output_bytes = 536870912\n", "from 1 to 66060288");
  REQUIRE(load("[runtime]\nmax_output_bytes = 66060288\n").has_value());
  // A typo or a wrong type is an error, never a silent default.
  check("[limits]\nmax_inflight = 4\n", "limits.max_inflight (line 2) is not a known key");
  check("[runtime]\nmax_restart = 3\n", "runtime.max_restart (line 2) is not a known key");
  check("[server]\nshutdown_grace = 5\n", "server.shutdown_grace (line 2) is not a known key");
  check("[policy]\nprompt_timeout = 5\n", "policy.prompt_timeout (line 2) is not a known key");
  check("[popup]\ntimeout = 5\n", "popup.timeout (line 2) is not a known key");
  check("[popup]\ntimeout_ms = 0\n", "popup.timeout_ms");
  check("runtime = 5\n", "must be a table ([runtime])");
  check("[log]\nlevel = 5\n", "log.level (line 2) must be a string");
  check("[server]\nsocket = 5\n", "server.socket (line 2) must be a string");
  check("[server]\nsocket_group = 0\n", "server.socket_group (line 2) must be a string");
  check("[[access]]\nuid = -1\nroles = [\"agent\"]\n", "must be an integer from 0 to 4294967294");
  check("[[access]]\ngid = 4294967295\nroles = [\"agent\"]\n",
        "must be an integer from 0 to 4294967294");
  check("[[access]]\nuid = 5\nrole = [\"agent\"]\n",
        "is not a known key; use user, uid, group, gid or roles");
}

TEST_CASE("[runtime]: V8 --jitless and two pre-warmed shells unless the file says otherwise",
          "[config]") {
  auto defaults = load("");
  REQUIRE(defaults.has_value());
  CHECK_FALSE(defaults->runtime.jit);
  CHECK(defaults->runtime.prewarmed == 2);
  auto set = load("[runtime]\njit = true\nprewarmed = 0\n");
  REQUIRE(set.has_value());
  CHECK(set->runtime.jit);
  CHECK(set->runtime.prewarmed == 0);
}

TEST_CASE("socket path: flag, then TOOLHOST_SOCKET, then config, too long refused", "[config]") {
  ConfigFile file("[server]\nsocket = \"/tmp/from-config.sock\"\n");
  CommandLine commandLine;
  commandLine.configFile = file.path;
  RestoreSocketEnv restore;
  ::unsetenv("TOOLHOST_SOCKET");
  CHECK(loadConfig(commandLine)->socketPath == "/tmp/from-config.sock");
  ::setenv("TOOLHOST_SOCKET", "/tmp/from-env.sock", 1);
  CHECK(loadConfig(commandLine)->socketPath == "/tmp/from-env.sock");
  commandLine.socketPath = "/tmp/from-flag.sock";
  CHECK(loadConfig(commandLine)->socketPath == "/tmp/from-flag.sock");
  ::unsetenv("TOOLHOST_SOCKET");
  commandLine.socketPath = "/tmp/" + std::string(103, 'x');  // 108 bytes
  auto tooLong = loadConfig(commandLine);
  REQUIRE_FALSE(tooLong.has_value());
  CHECK_THAT(tooLong.error().detail, Catch::Contains("at most 107 bytes"));
  commandLine.socketPath = "/tmp/" + std::string(102, 'x');  // 107 bytes
  CHECK(loadConfig(commandLine).has_value());
  // Empty (a script's unset variable) is refused, never taken for the default.
  commandLine.socketPath = "";
  auto emptyFlag = loadConfig(commandLine);
  REQUIRE_FALSE(emptyFlag.has_value());
  CHECK_THAT(emptyFlag.error().detail, Catch::Contains("--socket is empty"));
  commandLine.socketPath.reset();
  ::setenv("TOOLHOST_SOCKET", "", 1);
  auto emptyEnv = loadConfig(commandLine);
  REQUIRE_FALSE(emptyEnv.has_value());
  CHECK_THAT(emptyEnv.error().detail, Catch::Contains("TOOLHOST_SOCKET is set but empty"));
  ::unsetenv("TOOLHOST_SOCKET");
  commandLine.stateDir = "";
  auto emptyState = loadConfig(commandLine);
  REQUIRE_FALSE(emptyState.has_value());
  CHECK_THAT(emptyState.error().detail, Catch::Contains("--state-dir is empty"));
}

TEST_CASE("relative paths in the config file are relative to its folder", "[config]") {
  ConfigFile file(
      "[server]\nsocket = \"s.sock\"\n[state]\ndir = \"st\"\n"
      "[secrets]\nkey_file = \"k.key\"\n");
  CommandLine commandLine;
  commandLine.configFile = file.path;
  RestoreSocketEnv restore;
  ::unsetenv("TOOLHOST_SOCKET");
  auto config = loadConfig(commandLine);
  REQUIRE(config.has_value());
  const fs::path folder = file.path.parent_path();
  CHECK(config->socketPath == folder / "s.sock");
  CHECK(config->stateDir == folder / "st");
  REQUIRE(config->secrets.keyFile.has_value());
  CHECK(*config->secrets.keyFile == folder / "k.key");
}

TEST_CASE("[fetch]: opened ranges, the extra CA file, limits, what a reload applies",
          "[config][fetch]") {
  auto defaults = load("");
  REQUIRE(defaults.has_value());
  CHECK(defaults->fetch.allowPrivate.empty());
  CHECK_FALSE(defaults->fetch.extraCaFile.has_value());
  CHECK(defaults->fetch.timeout == std::chrono::milliseconds(30000));
  CHECK(defaults->fetch.maxResponseBytes == 16u << 20);
  CHECK(defaults->fetch.maxRequestBytes == 8u << 20);
  CHECK(defaults->fetch.maxBufferedBytes == 256u << 20);
  CHECK(defaults->fetch.maxBufferedBytesPerTool == 64u << 20);

  ConfigFile ca("-----BEGIN CERTIFICATE-----\n");
  auto config =
      load("[fetch]\nallow_private = [\"10.1.2.0/24\", \"127.0.0.1\"]\nextra_ca_file = \"" +
           ca.path.string() +
           "\"\ntimeout_ms = 5000\nmax_response_bytes = 1000\nmax_request_bytes = 10\n");
  REQUIRE(config.has_value());
  REQUIRE(config->fetch.allowPrivate.size() == 2);
  CHECK(config->fetch.allowPrivate[0].toString() == "10.1.2.0/24");
  CHECK(config->fetch.allowPrivate[1].toString() == "127.0.0.1/32");
  CHECK(config->fetch.extraCaFile == ca.path);
  CHECK(config->fetch.timeout == std::chrono::milliseconds(5000));
  CHECK(config->fetch.maxResponseBytes == 1000);
  CHECK(config->fetch.maxRequestBytes == 10);
  // A relative path is read from the config file's directory.
  auto relative = load("[fetch]\nextra_ca_file = \"" + ca.path.filename().string() + "\"\n");
  REQUIRE(relative.has_value());
  CHECK(relative->fetch.extraCaFile == ca.path);

  auto check = [](const std::string& text, const std::string& expected) {
    auto loaded = load(text);
    REQUIRE_FALSE(loaded.has_value());
    CHECK_THAT(loaded.error().detail, Catch::Contains(expected));
  };
  check("[fetch]\nallow_private = [\"10.1.2.5/24\"]\n", "fetch.allow_private[0]");
  check("[fetch]\nallow_private = [\"10.1.2.5/24\"]\n", "10.1.2.0/24");
  check("[fetch]\nallow_private = \"10.0.0.0/8\"\n", "must be a list");
  check("[fetch]\nallow_private = [\"localhost\"]\n", "fetch.allow_private[0]");
  check("[fetch]\nextra_ca_file = \"/no/such/ca.pem\"\n", "fetch.extra_ca_file");
  check("[fetch]\ntimeout_ms = 0\n", "fetch.timeout_ms");
  check("[fetch]\nallow_privat = []\n", "fetch.allow_privat");
  // A larger body could not cross to the sandbox host; every response must fit the buffer.
  check("[fetch]\nmax_response_bytes = 134217729\n", "fetch.max_response_bytes");
  check("[fetch]\nmax_request_bytes = 33554433\n", "fetch.max_request_bytes");
  check("[fetch]\nmax_buffered_bytes = 999\nmax_response_bytes = 1000\n",
        "fetch.max_buffered_bytes (999) must be at least fetch.max_response_bytes (1000)");
  auto largest = load("[fetch]\nmax_response_bytes = 134217728\nmax_buffered_bytes = 134217728\n");
  REQUIRE(largest.has_value());
  CHECK(largest->fetch.maxBufferedBytes == 128u << 20);
  // One tool's share: a quarter of the whole unless set, never less than one largest response.
  CHECK(largest->fetch.maxBufferedBytesPerTool == 128u << 20);
  auto quarter = load("[fetch]\nmax_response_bytes = 1000\nmax_buffered_bytes = 8000\n");
  REQUIRE(quarter.has_value());
  CHECK(quarter->fetch.maxBufferedBytesPerTool == 2000);
  auto share = load("[fetch]\nmax_response_bytes = 1000\nmax_buffered_bytes_per_tool = 3000\n");
  REQUIRE(share.has_value());
  CHECK(share->fetch.maxBufferedBytesPerTool == 3000);
  check("[fetch]\nmax_response_bytes = 1000\nmax_buffered_bytes_per_tool = 999\n",
        "fetch.max_buffered_bytes_per_tool (999) must be at least fetch.max_response_bytes (1000)");
  check(
      "[fetch]\nmax_response_bytes = 1000\nmax_buffered_bytes = 8000\n"
      "max_buffered_bytes_per_tool = 8001\n",
      "at most fetch.max_buffered_bytes (8000)");

  // A reload applies the limits; the HTTPS client's ranges and CA need a restart.
  Config next = *config;
  next.fetch.timeout = std::chrono::milliseconds(100);
  next.fetch.allowPrivate.clear();
  next.fetch.extraCaFile.reset();
  next.fetch.maxBufferedBytesPerTool = 5000;
  auto changes = reconcileReload(*config, next);
  auto mentions = [](const std::vector<std::string>& lines, const std::string& key) {
    return std::any_of(lines.begin(), lines.end(),
                       [&](const std::string& line) { return line.starts_with(key); });
  };
  CHECK(mentions(changes.applied, "fetch.timeout_ms"));
  CHECK(mentions(changes.applied, "fetch.max_buffered_bytes_per_tool"));
  CHECK(mentions(changes.needRestart, "fetch.allow_private"));
  CHECK(mentions(changes.needRestart, "fetch.extra_ca_file"));
  CHECK(next.fetch.timeout == std::chrono::milliseconds(100));
  CHECK(next.fetch.allowPrivate.size() == 2);
  CHECK(next.fetch.extraCaFile == ca.path);

  // [runtime] is read at start: a reload says which of its settings wait for a restart.
  Config changed = *config;
  changed.runtime.maxRestarts = config->runtime.maxRestarts + 1;
  changed.runtime.workers = config->runtime.workers + 1;
  changed.runtime.caps.heapMb = 99;
  auto runtimeChanges = reconcileReload(*config, changed);
  CHECK(mentions(runtimeChanges.needRestart, "runtime.max_restarts"));
  CHECK(mentions(runtimeChanges.needRestart, "runtime.workers"));
  CHECK(mentions(runtimeChanges.needRestart, "runtime.max_heap_mb"));
  CHECK(runtimeChanges.applied.empty());
  CHECK(changed.runtime.maxRestarts == config->runtime.maxRestarts);
}

TEST_CASE("peer credentials carry the connecting process's own groups", "[config][access]") {
  int pair[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) == 0);
  PeerCredentials peer;
  const bool read = readPeerCredentials(pair[0], peer);
  ::close(pair[0]);
  ::close(pair[1]);
  REQUIRE(read);
  CHECK(peer.uid == ::geteuid());
  CHECK(peer.gid == ::getegid());
  CHECK(peer.pid == ::getpid());
  std::vector<gid_t> own(static_cast<std::size_t>(::getgroups(0, nullptr)));
  own.resize(static_cast<std::size_t>(::getgroups(static_cast<int>(own.size()), own.data())));
  std::sort(own.begin(), own.end());
  std::sort(peer.groups.begin(), peer.groups.end());
  CHECK(peer.groups == own);
}

TEST_CASE("a config path that is not a regular file is refused at once", "[config]") {
  char pattern[] = "/tmp/th-config-dir-XXXXXX";
  REQUIRE(::mkdtemp(pattern) != nullptr);
  const fs::path dir = pattern;
  const fs::path fifo = dir / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto loadFrom = [](const fs::path& path) {
    CommandLine commandLine;
    commandLine.configFile = path;
    commandLine.socketPath = "/tmp/x.sock";
    return loadConfig(commandLine);
  };
  // A FIFO nobody writes to: refused without blocking (a reload reads it on an I/O thread).
  auto fromFifo = loadFrom(fifo);
  REQUIRE_FALSE(fromFifo.has_value());
  CHECK_THAT(fromFifo.error().detail, Catch::Contains("is not a regular file"));
  auto fromDir = loadFrom(dir);
  REQUIRE_FALSE(fromDir.has_value());
  CHECK_THAT(fromDir.error().detail, Catch::Contains("is not a regular file"));
  auto missing = loadFrom(dir / "missing.toml");
  REQUIRE_FALSE(missing.has_value());
  CHECK_THAT(missing.error().detail, Catch::Contains("cannot be opened"));
  fs::remove_all(dir);
}
