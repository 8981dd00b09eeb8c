// The daemon as a process: its socket, its peers, its signals, its log, and toolhostctl.
#include "tests/support/daemon_process.h"

#include "protocol/json_parse.h"

#include <grp.h>
#include <lmdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <boost/json/serialize.hpp>
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

using namespace toolhost::testing;
namespace json = boost::json;
namespace fs = std::filesystem;

namespace {

json::value parse(const std::string& text) {
  auto parsed = toolhost::protocol::parseJson(text);
  if (!parsed) FAIL("not JSON: " << text);
  return *parsed;
}

sockaddr_un addressOf(const fs::path& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
  return address;
}

// A socket file with nobody listening, as a crashed daemon leaves behind.
void makeStaleSocket(const fs::path& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  const sockaddr_un address = addressOf(path);
  REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
  ::close(fd);
}

// A daemon started with `options` exits at once with status 1, its log saying `words`.
void checkStartRefused(DaemonOptions options, const std::string& words,
                       const std::string& more = "") {
  options.waitUntilReady = false;
  auto daemon = DaemonProcess::start(options);
  CHECK(daemon->wait(std::chrono::seconds(10)) == 1);
  CHECK_THAT(daemon->log(), Catch::Contains(words) && Catch::Contains(more));
}

// A second daemon on `socket` exits at once, saying another one listens there.
void checkRivalRefused(const fs::path& socket) {
  DaemonOptions second;
  second.socketPath = socket;
  checkStartRefused(second, "already listening");
}

}  // namespace

TEST_CASE("the socket is created 0600 and removed on exit", "[e2e][daemon]") {
  auto daemon = DaemonProcess::start();
  struct stat info {};
  REQUIRE(::stat(daemon->socket().c_str(), &info) == 0);
  CHECK(S_ISSOCK(info.st_mode));
  CHECK((info.st_mode & 0777) == 0600);
  CHECK(daemon->stop() == 0);
  CHECK_FALSE(fs::exists(daemon->socket()));
}

TEST_CASE("a state directory made by the daemon is 0700 and an existing one keeps its mode",
          "[e2e][daemon]") {
  TempDir dir;
  DaemonOptions fresh;
  fresh.stateDir = dir.path() / "made";
  auto made = DaemonProcess::start(fresh);
  CHECK((fs::status(*fresh.stateDir).permissions() & fs::perms::all) == fs::perms::owner_all);
  CHECK(made->stop() == 0);

  DaemonOptions existing;
  existing.stateDir = dir.path() / "shared";
  fs::create_directories(*existing.stateDir);
  fs::permissions(*existing.stateDir, fs::perms::owner_all | fs::perms::group_read |
                                          fs::perms::group_exec | fs::perms::others_read |
                                          fs::perms::others_exec);
  auto daemon = DaemonProcess::start(existing);
  CHECK((fs::status(*existing.stateDir).permissions() & fs::perms::all) ==
        (fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
         fs::perms::others_read | fs::perms::others_exec));
  // What it keeps there is private all the same.
  CHECK((fs::status(*existing.stateDir / "db").permissions() & fs::perms::all) ==
        fs::perms::owner_all);
  CHECK(daemon->stop() == 0);
}

TEST_CASE("a socket or state directory, or a secrets key, others control is refused at start",
          "[e2e][daemon]") {
  TempDir dir;
  // Writable by others without a sticky bit: anyone could put their own socket or database there.
  const fs::path open = dir.path() / "open";
  fs::create_directory(open);
  REQUIRE(::chmod(open.c_str(), 0777) == 0);
  DaemonOptions socketThere;
  socketThere.socketPath = open / "s";
  // Refused before the state directory is made: a refused start leaves nothing behind.
  socketThere.stateDir = dir.path() / "unmade";
  checkStartRefused(socketThere, "refusing to listen at " + (open / "s").string(), "0777");
  CHECK_FALSE(fs::exists(dir.path() / "unmade"));
  DaemonOptions stateThere;
  stateThere.stateDir = open / "state";
  checkStartRefused(stateThere, "refusing the state directory", "0777");
  CHECK_FALSE(fs::exists(open / "state"));

  if (::geteuid() != 0) {
    WARN("needs root to give a directory to another uid; the rest is skipped");
    return;
  }
  // Made first by another user, as /tmp/toolhost-<uid> could be.
  const fs::path theirs = dir.path() / "theirs";
  fs::create_directory(theirs);
  REQUIRE(::chmod(theirs.c_str(), 0755) == 0);
  REQUIRE(::chown(theirs.c_str(), 65534, 65534) == 0);
  socketThere.socketPath = theirs / "s";
  checkStartRefused(socketThere, "refusing to listen", "uid 65534");
  stateThere.stateDir = theirs / "state";
  checkStartRefused(stateThere, "refusing the state directory", "uid 65534");
  // A key another user wrote is a key they know.
  const fs::path key = dir.path() / "key";
  {
    std::ofstream out(key);
    out << std::string(64, 'a') << "\n";
  }
  REQUIRE(::chmod(key.c_str(), 0600) == 0);
  REQUIRE(::chown(key.c_str(), 65534, 65534) == 0);
  DaemonOptions keyOfTheirs;
  keyOfTheirs.configToml = "[secrets]\nkey_file = \"" + key.string() + "\"\n";
  checkStartRefused(keyOfTheirs, "belongs to uid 65534", "cannot be trusted");
}

TEST_CASE("toolhostctl does not trust a default socket directory in /tmp made by another user",
          "[e2e][cli]") {
  // uid 64998 made /tmp/toolhost-64999 first; uid 64999 runs toolhostctl with no
  // XDG_RUNTIME_DIR, so its default socket is in that directory.
  const fs::path squatted = "/tmp/toolhost-64999";
  if (::geteuid() != 0 || fs::exists(squatted)) {
    WARN("needs root, and no " << squatted << " yet; skipped");
    return;
  }
  fs::create_directory(squatted);
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ignored;
      fs::remove_all(dir, ignored);
    }
  } cleanup{squatted};
  REQUIRE(::chown(squatted.c_str(), 64998, 64998) == 0);
  REQUIRE(::chmod(squatted.c_str(), 0755) == 0);
  auto result = runProgram({"setpriv", "--reuid=64999", "--regid=64999", "--clear-groups", "env",
                            "-i", ctlBinary().string(), "ping"});
  CHECK(result.status == 3);
  CHECK_THAT(result.err, Catch::Contains("not connecting to /tmp/toolhost-64999/toolhost.sock") &&
                             Catch::Contains("uid 64998"));
}

TEST_CASE("socket_group: the group may reach the socket, or the log says why not",
          "[e2e][daemon]") {
  const group* own = ::getgrgid(::getegid());
  REQUIRE(own != nullptr);
  TempDir dir;
  DaemonOptions options;
  options.configToml = "[server]\nsocket_group = \"" + std::string(own->gr_name) + "\"\n";
  options.socketPath = dir.path() / "made" / "s";
  auto made = DaemonProcess::start(options);
  struct stat info {};
  REQUIRE(::stat((dir.path() / "made").c_str(), &info) == 0);
  CHECK((info.st_mode & 07777) == 0710);
  CHECK(info.st_gid == ::getegid());
  REQUIRE(::stat(options.socketPath->c_str(), &info) == 0);
  CHECK((info.st_mode & 0777) == 0660);
  CHECK_THAT(made->log(), !Catch::Contains("cannot reach the socket"));
  CHECK(made->stop() == 0);

  // A directory that was there already keeps its mode; if the group cannot pass it, the log says.
  const fs::path closed = dir.path() / "closed";
  fs::create_directory(closed);
  REQUIRE(::chmod(closed.c_str(), 0700) == 0);
  options.socketPath = closed / "s";
  auto kept = DaemonProcess::start(options);
  CHECK_THAT(kept->log(), Catch::Contains("socket_group cannot reach the socket: its directory " +
                                          closed.string() + " is mode 0700"));
  CHECK(kept->stop() == 0);
}

TEST_CASE("a stale socket is replaced, a live one stops a second daemon", "[e2e][daemon]") {
  TempDir dir;
  auto socket = dir.path() / "s";
  makeStaleSocket(socket);
  DaemonOptions options;
  options.socketPath = socket;
  auto first = DaemonProcess::start(options);
  RawClient client(socket);
  CHECK(client.call("ping").contains("result"));

  checkRivalRefused(socket);
  // A rival with a state directory of its own leaves none behind.
  DaemonOptions rival;
  rival.socketPath = socket;
  rival.stateDir = dir.path() / "rival-state";
  checkStartRefused(rival, "already listening");
  CHECK_FALSE(fs::exists(dir.path() / "rival-state"));
  // The first daemon still serves, on the same socket file.
  CHECK(client.call("ping").contains("result"));
  RawClient again(socket);
  CHECK(again.call("ping").contains("result"));

  // A path that holds something else is left alone, and no state directory is made either.
  const auto file = dir.path() / "not-a-socket";
  { std::ofstream(file) << "keep me"; }
  DaemonOptions onFile;
  onFile.socketPath = file;
  onFile.stateDir = dir.path() / "file-state";
  checkStartRefused(onFile, "exists and is not a socket");
  CHECK_FALSE(fs::exists(dir.path() / "file-state"));
  CHECK(fs::file_size(file) == 7);
}

TEST_CASE("a listener that accepts nobody still stops a second daemon at once", "[e2e][daemon]") {
  TempDir dir;
  auto socket = dir.path() / "s";
  // A listener that never accepts, its backlog full: a blocking connect to it waits forever.
  int listener = ::socket(AF_UNIX, SOCK_STREAM, 0);
  const sockaddr_un address = addressOf(socket);
  const auto* raw = reinterpret_cast<const sockaddr*>(&address);
  REQUIRE(::bind(listener, raw, sizeof address) == 0);
  REQUIRE(::listen(listener, 0) == 0);
  std::vector<int> queued;
  for (int i = 0; i < 16; ++i) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (::connect(fd, raw, sizeof address) != 0) {
      ::close(fd);
      break;
    }
    queued.push_back(fd);
  }
  checkRivalRefused(socket);
  for (int fd : queued) ::close(fd);
  ::close(listener);
}

TEST_CASE("a socket path that is not a socket is left alone", "[e2e][daemon]") {
  TempDir dir;
  auto path = dir.path() / "s";
  std::ofstream(path) << "precious";
  DaemonOptions options;
  options.socketPath = path;
  checkStartRefused(options, "not a socket");
  std::ifstream in(path);
  std::string content;
  in >> content;
  CHECK(content == "precious");
}

// daemon.health's socket check, asked on `client`, until `ok` is what it says (or 10 s pass).
json::object waitForSocketCheck(RawClient& client, bool ok) {
  json::object check;
  for (int i = 0; i < 200; ++i) {
    check = client.call("daemon.health").at("result").at("checks").at("socket").as_object();
    if (check.at("ok") == ok) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return check;
}

// Connects to `socket` and pings; false if that fails.
bool pings(const fs::path& socket) {
  try {
    RawClient client(socket);
    return client.call("ping").contains("result");
  } catch (const std::exception&) {
    return false;
  }
}

TEST_CASE("a socket file removed while the daemon runs is made again", "[e2e][daemon]") {
  TempDir dir;
  auto socket = dir.path() / "sub" / "s";
  DaemonOptions options;
  options.socketPath = socket;
  auto daemon = DaemonProcess::start(options);
  RawClient kept(socket);
  CHECK(waitForSocketCheck(kept, true).at("path") == socket.c_str());

  bool linked = false;
  SECTION("the file") { fs::remove(socket); }
  SECTION("its directory") { fs::remove_all(socket.parent_path()); }
  SECTION("the file, with a hard link to it left") {
    fs::create_hard_link(socket, dir.path() / "link");
    fs::remove(socket);
    linked = true;
  }
  SECTION("the file made again, with a hard link to that one left") {
    fs::remove(socket);
    for (int i = 0; i < 100 && !pings(socket); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    fs::create_hard_link(socket, dir.path() / "link");
    fs::remove(socket);
    linked = true;
  }
  // Within the check's interval, new clients get in again, and the kept connection still works.
  bool connected = false;
  for (int i = 0; i < 100 && !connected; ++i) {
    struct stat st {};
    connected = ::stat(socket.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) &&
                (st.st_mode & 0777) == 0600 && pings(socket);
    if (!connected) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(connected);
  CHECK(kept.call("ping").contains("result"));
  CHECK(waitForSocketCheck(kept, true).at("ok") == true);
  CHECK_THAT(daemon->log(), Catch::Contains("was gone; made it again"));
  // The socket listening before still does: a link (or a bind mount) leads clients to it.
  if (linked) CHECK(pings(dir.path() / "link"));
  // It is removed at exit like the first one.
  ::kill(daemon->pid(), SIGTERM);
  CHECK(daemon->wait(std::chrono::seconds(10)) == 0);
  CHECK_FALSE(fs::exists(socket));
}

TEST_CASE("a socket path taken by something else while the daemon runs is left alone",
          "[e2e][daemon]") {
  TempDir dir;
  auto socket = dir.path() / "s";
  DaemonOptions options;
  options.socketPath = socket;
  auto daemon = DaemonProcess::start(options);
  RawClient kept(socket);
  int listener = -1;
  std::string kind;
  // Put in place at once (rename), so that the daemon never sees the path free.
  SECTION("a file") {
    std::ofstream(dir.path() / "file") << "precious";
    fs::rename(dir.path() / "file", socket);
    kind = "a file that is no socket";
  }
  SECTION("a dead socket") {
    makeStaleSocket(dir.path() / "dead");
    fs::rename(dir.path() / "dead", socket);
    kind = "a socket";
  }
  SECTION("another program's listening socket, never connected to") {
    listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
    const sockaddr_un address = addressOf(dir.path() / "live");
    REQUIRE(::bind(listener, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
    REQUIRE(::listen(listener, 8) == 0);
    fs::rename(dir.path() / "live", socket);
    kind = "a socket";
  }
  auto check = waitForSocketCheck(kept, false);
  CHECK(check.at("ok") == false);
  REQUIRE(check.contains("detail"));
  CHECK_THAT(std::string(check.at("detail").as_string()),
             Catch::Contains("was replaced by " + kind + " this daemon did not make"));
  CHECK(kept.call("daemon.health").at("result").at("status") == "degraded");
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // a check or two more
  if (listener >= 0) {
    CHECK(::accept(listener, nullptr, nullptr) < 0);  // nobody knocked
    ::close(listener);
  }
  // Once it is gone, the daemon's socket comes back.
  fs::remove(socket);
  CHECK(waitForSocketCheck(kept, true).at("ok") == true);
  CHECK(pings(socket));
  // The log says each once.
  const std::string log = daemon->log();
  CHECK(log.find("was replaced by") == log.rfind("was replaced by"));
  CHECK_THAT(log, Catch::Contains("can connect to " + socket.string() + " again"));
}

TEST_CASE("socket paths over 107 bytes are refused clearly", "[e2e][daemon]") {
  DaemonOptions options;
  options.socketPath = "/tmp/" + std::string(110, 'x');
  options.waitUntilReady = false;
  auto daemon = DaemonProcess::start(options);
  CHECK(daemon->wait(std::chrono::seconds(10)) == 2);
  CHECK_THAT(daemon->log(), Catch::Contains("at most 107 bytes"));
}

TEST_CASE("SIGTERM lets requests in flight finish, then exits 0", "[e2e][daemon]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  client.send(R"({"jsonrpc":"2.0","method":"ping","params":{"delayMs":400},"id":"late"})" "\n");
  // Answered once read: "late", sent before it, has been read and is in flight by then.
  client.send(R"({"jsonrpc":"2.0","method":"ping","id":"probe"})"
              "\n");
  CHECK(client.readJson().at("id") == "probe");
  ::kill(daemon->pid(), SIGTERM);
  auto response = client.readJson();
  CHECK(response.at("id") == "late");
  CHECK(response.as_object().contains("result"));
  CHECK(daemon->wait(std::chrono::seconds(10)) == 0);
  // No new connections once stopping.
  CHECK_THROWS(RawClient(daemon->socket()));
}

TEST_CASE("SIGINT with a request outlasting the grace period cancels it", "[e2e][daemon]") {
  DaemonOptions options;
  options.configToml = "[server]\nshutdown_grace_ms = 200\n";
  auto daemon = DaemonProcess::start(options);
  RawClient client(daemon->socket());
  client.send(R"({"jsonrpc":"2.0","method":"ping","params":{"delayMs":60000},"id":1})" "\n");
  client.send(R"({"jsonrpc":"2.0","method":"ping","id":"probe"})"
              "\n");
  CHECK(client.readJson().at("id") == "probe");  // the long one is in flight by now
  ::kill(daemon->pid(), SIGINT);
  // Cancelled at the end of the grace period, and told so before the connection ends.
  auto cancelled = client.readJson(std::chrono::seconds(10));
  CHECK(cancelled.at("id") == 1);
  CHECK(cancelled.at("error").at("code") == -32009);
  CHECK(daemon->wait(std::chrono::seconds(10)) == 0);
}

TEST_CASE("daemon.info, daemon.health and rpc.discover", "[e2e][daemon]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  auto info = client.call("daemon.info").at("result").as_object();
  CHECK(info.at("name") == "toolhost");
  CHECK_THAT(std::string(info.at("v8Version").as_string()), Catch::StartsWith("10.2"));
#ifdef TOOLHOST_MIMALLOC
  // Linked ahead of libc, mimalloc serves the daemon's mallocs (it checks with a probe).
  CHECK_THAT(std::string(info.at("malloc").as_string()), Catch::StartsWith("mimalloc 2."));
#else
  CHECK(info.at("malloc") == "libc");
#endif
  CHECK(info.at("caller").at("uid") == static_cast<std::int64_t>(::geteuid()));
  CHECK(info.at("caller").at("roles").as_array() == json::array{"admin"});
  CHECK(info.at("limits").at("maxMessageBytes") == 8 * 1024 * 1024);
  CHECK(info.at("limits").at("maxDepth") == 128);
  CHECK(info.at("limits").at("maxConnections") == 256);
  CHECK(info.at("uptimeMs").as_int64() >= 0);

  auto health = client.call("daemon.health").at("result").as_object();
  CHECK(health.at("status") == "ok");
  CHECK(health.at("checks").at("store").at("ok") == true);
  CHECK(health.at("checks").at("runtime").at("ok") == true);

  auto discover = client.call("rpc.discover").at("result").as_object();
  CHECK(discover.at("openrpc") == "1.2.6");
  std::set<std::string> names;
  for (const auto& method : discover.at("methods").as_array()) {
    names.insert(std::string(method.at("name").as_string()));
    CHECK(method.as_object().contains("params"));
  }
  for (const char* expected :
       {"rpc.discover", "ping", "daemon.info", "daemon.health", "$/cancelRequest"}) {
    CHECK(names.count(expected) == 1);
  }
}

TEST_CASE("toolhostctl prints JSON with exit codes a script can rely on", "[e2e][cli]") {
  auto daemon = DaemonProcess::start();
  std::string socket = daemon->socket().string();
  auto ctl = ctlBinary().string();

  auto ping = runProgram({ctl, "--socket", socket, "ping"});
  CHECK(ping.status == 0);
  CHECK(parse(ping.out).at("pong") == true);

  auto info = runProgram({ctl, "info"}, "", {{"TOOLHOST_SOCKET", socket}});
  CHECK(info.status == 0);
  CHECK(parse(info.out).at("name") == "toolhost");
  // An empty path (a script's unset variable) is a usage error, never the default socket.
  auto emptyFlag = runProgram({ctl, "--socket", "", "ping"});
  CHECK(emptyFlag.status == 2);
  CHECK_THAT(emptyFlag.err, Catch::Contains("--socket is empty"));
  auto emptyEnv = runProgram({ctl, "ping"}, "", {{"TOOLHOST_SOCKET", ""}});
  CHECK(emptyEnv.status == 2);
  CHECK_THAT(emptyEnv.err, Catch::Contains("TOOLHOST_SOCKET is set but empty"));

  auto call = runProgram({ctl, "--socket", socket, "call", "ping", R"({"delayMs":1})"});
  CHECK(call.status == 0);

  auto fromStdin = runProgram({ctl, "--socket", socket, "call", "ping", "-"}, R"({"delayMs":1})");
  CHECK(fromStdin.status == 0);

  auto unknown = runProgram({ctl, "--socket", socket, "call", "no.such"});
  CHECK(unknown.status == 1);
  CHECK(parse(unknown.out).at("code") == -32601);

  // A name the daemon has no method for is a tool: call TOOL ARGUMENTS runs tools.call.
  auto tool = runProgram({ctl, "--socket", socket, "call", "echo", R"({"city":"Paris"})"});
  CHECK(tool.status == 0);
  CHECK(parse(tool.out).at("result").at("city") == "Paris");
  CHECK(parse(tool.out).at("name") == "echo");
  auto noArguments = runProgram({ctl, "--socket", socket, "call", "time-now"});
  CHECK(noArguments.status == 0);
  CHECK(parse(noArguments.out).at("result").as_object().contains("iso"));
  auto noTool = runProgram({ctl, "--socket", socket, "call", "no-such-tool", "{}"});
  CHECK(noTool.status == 1);
  CHECK(parse(noTool.out).at("code") == -32001);
  // It could have been a mistyped method: the words say so.
  CHECK_THAT(noTool.err, Catch::Contains("no active tool named no-such-tool") &&
                             Catch::Contains("no method is named no-such-tool") &&
                             Catch::Contains("rpc.discover"));
  // A tool's name goes straight to tools.call: no "no method" warning in the daemon's log.
  CHECK(daemon->log().find("no method named \"echo\"") == std::string::npos);
  CHECK(daemon->log().find("no method named \"time-now\"") == std::string::npos);

  auto badParams = runProgram({ctl, "--socket", socket, "call", "ping", "{not json"});
  CHECK(badParams.status == 2);

  auto usage = runProgram({ctl, "--socket", socket, "frobnicate"});
  CHECK(usage.status == 2);
  CHECK_THAT(usage.err, Catch::Contains("unknown command \"frobnicate\"") &&
                            Catch::Contains("ping info health"));
  auto nested = runProgram({ctl, "--socket", socket, "policy", "frob"});
  CHECK(nested.status == 2);
  CHECK_THAT(nested.err, Catch::Contains("unknown command \"frob\" for policy") &&
                             Catch::Contains("list set revoke"));
  for (const char* timeout : {"nan", "1e300", "-1", "inf"}) {
    INFO(timeout);
    auto badTimeout = runProgram({ctl, "--socket", socket, "--timeout", timeout, "ping"});
    CHECK(badTimeout.status == 2);
    CHECK_THAT(badTimeout.err, Catch::Contains("--timeout must be a number of seconds"));
  }

  auto nobody = runProgram({ctl, "--socket", daemon->dir().string() + "/missing", "ping"});
  CHECK(nobody.status == 3);
  CHECK_THAT(nobody.err, Catch::Contains("cannot connect"));

  // What a tool or a server chose reaches the terminal without C1 controls, bidirectional
  // overrides or DEL, as JSON escapes: the same JSON.
  const std::string sneaky = "A\u009b31mRED\u202eXYZ\u007f";
  auto escaped = runProgram(
      {ctl, "--socket", socket, "--compact", "call", "echo", R"({"text":")" + sneaky + R"("})"});
  CHECK(escaped.status == 0);
  CHECK(escaped.out.find("\xc2\x9b") == std::string::npos);
  CHECK(escaped.out.find("\xe2\x80\xae") == std::string::npos);
  CHECK(escaped.out.find('\x7f') == std::string::npos);
  CHECK_THAT(escaped.out, Catch::Contains(R"(A\u009b31mRED\u202eXYZ\u007f)"));
  CHECK(parse(escaped.out).at("result").at("text") == json::value(sneaky));
  // Indented output (a terminal's default) keeps its layout and stays JSON.
  auto pretty = runProgram(
      {ctl, "--socket", socket, "--pretty", "call", "echo", R"({"text":")" + sneaky + R"("})"});
  CHECK(pretty.status == 0);
  CHECK_THAT(pretty.out, Catch::StartsWith("{\n  \""));
  CHECK(pretty.out.find("\xc2\x9b") == std::string::npos);
  CHECK(parse(pretty.out).at("result").at("text") == json::value(sneaky));
}

TEST_CASE("a peer without an access rule gets one error naming its uid", "[e2e][daemon][peers]") {
  if (::geteuid() != 0) {
    WARN("needs root to run a client as nobody; skipped");
    return;
  }
  auto daemon = DaemonProcess::start();
  // Open the socket to everyone for this test only; the daemon must still refuse the peer.
  ::chmod(daemon->dir().c_str(), 0755);
  ::chmod(daemon->socket().c_str(), 0777);
  auto refused = runProgram({"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                             ctlBinary().string(), "--socket", daemon->socket().string(), "ping"});
  INFO("stderr: " << refused.err);
  CHECK(refused.status == 1);
  auto error = parse(refused.out);
  CHECK(error.at("code") == -32002);
  CHECK(error.at("data").at("kind") == "peer-refused");
  CHECK_THAT(std::string(error.at("data").at("detail").as_string()), Catch::Contains("uid 65534"));
  CHECK_THAT(daemon->log(), Catch::Contains("refused uid=65534"));

  // With an access rule, the same peer is served as an agent.
  DaemonOptions options;
  options.configToml = "[[access]]\nuid = 65534\nroles = [\"agent\"]\n";
  auto allowing = DaemonProcess::start(options);
  ::chmod(allowing->dir().c_str(), 0755);
  ::chmod(allowing->socket().c_str(), 0777);
  // Without socket_group the socket is 0600: the log says the rule cannot be used as it is.
  CHECK_THAT(allowing->log(), Catch::Contains("only its owner can connect"));
  CHECK_THAT(daemon->log(), !Catch::Contains("only its owner can connect"));
  auto served = runProgram({"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            ctlBinary().string(), "--socket", allowing->socket().string(), "info"});
  CHECK(served.status == 0);
  CHECK(parse(served.out).at("caller").at("roles").as_array() == json::array{"agent"});
}

TEST_CASE("connections beyond max_connections are refused, admins still get in",
          "[e2e][daemon][peers]") {
  if (::geteuid() != 0) {
    WARN("needs root to run a client as another uid; skipped");
    return;
  }
  DaemonOptions options;
  options.configToml =
      "[limits]\nmax_connections = 2\n[[access]]\nuid = 65534\nroles = [\"agent\"]\n";
  auto daemon = DaemonProcess::start(options);
  ::chmod(daemon->dir().c_str(), 0755);
  ::chmod(daemon->socket().c_str(), 0777);
  auto agentInfo = [&] {
    return runProgram({"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                       ctlBinary().string(), "--socket", daemon->socket().string(), "info"});
  };
  auto first = std::make_unique<RawClient>(daemon->socket());
  RawClient second(daemon->socket());
  CHECK(first->call("ping").contains("result"));
  CHECK(second.call("ping").contains("result"));

  auto refused = agentInfo();
  CHECK(refused.status == 1);
  auto error = parse(refused.out);
  CHECK(error.at("code") == -32010);
  CHECK(error.at("data").at("kind") == "too-many-connections");
  CHECK_THAT(daemon->log(), Catch::Contains("max_connections"));
  // The operator is never locked out.
  RawClient admin(daemon->socket());
  CHECK(admin.call("ping").contains("result"));

  first.reset();
  admin.close();
  auto served = [&] { return agentInfo().status == 0; };
  bool agentServed = false;
  for (int i = 0; i < 50 && !agentServed; ++i) {
    agentServed = served();
    if (!agentServed) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(agentServed);
}

TEST_CASE("JSON log lines carry connection and request ids", "[e2e][daemon]") {
  DaemonOptions options;
  options.logFormat = "json";
  auto daemon = DaemonProcess::start(options);
  RawClient client(daemon->socket());
  client.call("no.such.method", nullptr, "req-77");
  daemon->stop();
  bool found = false;
  std::istringstream lines(daemon->log());
  for (std::string line; std::getline(lines, line);) {
    auto parsed = toolhost::protocol::parseJson(line);
    REQUIRE(parsed.has_value());  // every line is JSON
    auto message = std::string(parsed->at("msg").as_string());
    if (message.find("req=\"req-77\"") != std::string::npos && parsed->at("level") == "warning") {
      found = true;
      CHECK_THAT(message, Catch::Contains("conn="));
    }
  }
  CHECK(found);
}

TEST_CASE("text a client chose cannot forge a line of the text log", "[e2e][daemon]") {
  auto daemon = DaemonProcess::start();  // the text format
  RawClient client(daemon->socket());
  client.call("no.such\n2026-01-01 00:00:00.000 critical forged\r\x1b[2J", nullptr, "req-1");
  daemon->stop();
  const std::string log = daemon->log();
  CHECK(log.find("\ncritical") == std::string::npos);
  CHECK(log.find("\n2026-01-01 00:00:00.000 critical forged") == std::string::npos);
  CHECK(log.find('\x1b') == std::string::npos);
  CHECK_THAT(log, Catch::Contains("no.such\\n2026-01-01 00:00:00.000 critical forged\\r\\x1b[2J"));
}

TEST_CASE("a bad config file is a clear start-up error", "[e2e][daemon]") {
  DaemonOptions options;
  options.configToml = "[limits]\nmax_depth = \"deep\"\n";
  options.waitUntilReady = false;
  auto daemon = DaemonProcess::start(options);
  CHECK(daemon->wait(std::chrono::seconds(10)) == 2);
  CHECK_THAT(daemon->log(), Catch::Contains("limits.max_depth"));
}

TEST_CASE("the state store opens with the daemon and a second daemon on it is refused",
          "[e2e][daemon]") {
  auto daemon = DaemonProcess::start();
  CHECK(fs::exists(daemon->stateDir() / "db" / "data.mdb"));
  RawClient client(daemon->socket());
  auto health = client.call("daemon.health").at("result");
  CHECK(health.at("checks").at("store").at("ok") == true);
  CHECK(health.at("checks").at("store").at("schemaVersion") == 1);

  DaemonOptions rivalOptions;
  rivalOptions.stateDir = daemon->stateDir();
  rivalOptions.waitUntilReady = false;
  auto rival = DaemonProcess::start(rivalOptions);
  CHECK(rival->wait(std::chrono::seconds(10)) == 1);
  CHECK_THAT(rival->log(), Catch::Contains("in use by pid"));
}

namespace {

// Installs and activates a tool named `name`; returns its revision, the key of its manifest.
std::string installAndActivate(RawClient& client, const std::string& name) {
  client.send(
      R"({"jsonrpc":"2.0","id":1,"method":"tools.install","params":{"manifest":{"name":")" + name +
      R"(","description":"d","parameters":{"type":"object"},"execution":{"class":)"
      R"("sandboxed-code","runtime":"javascript","source":"export default async () => 1"}}}})"
      "\n");
  auto installed = client.readJson().as_object();
  REQUIRE(installed.contains("result"));
  auto activated = client.call(
      "tools.activate",
      json::object{{"name", name}, {"revision", installed.at("result").at("revision")}}, 2);
  REQUIRE(activated.contains("result"));
  return std::string(installed.at("result").at("revision").as_string());
}

// Damages data.mdb as a disk error could: every leaf node whose key is `key` is made to claim a
// value of 2 GiB, which LMDB hands out as it is (it keeps no checksums), pointing far past the
// end of the file. Returns how many nodes it changed.
int damageNodesKeyed(const fs::path& dataFile, const std::string& key) {
  std::fstream file(dataFile, std::ios::in | std::ios::out | std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  constexpr std::size_t kPage = 4096, kHeader = 16, kNodeHeader = 8;
  auto u16 = [&](std::size_t at) {
    return static_cast<unsigned>(static_cast<unsigned char>(bytes[at])) |
           static_cast<unsigned>(static_cast<unsigned char>(bytes[at + 1])) << 8U;
  };
  int damaged = 0;
  for (auto at = bytes.find(key); at != std::string::npos; at = bytes.find(key, at + 1)) {
    const std::size_t page = at - at % kPage;
    // A node: its header (data size low and high, flags, key size) just before the key, on a
    // leaf page (page flags at byte 10: P_LEAF = 0x02).
    if (at < page + kHeader + kNodeHeader || (u16(page + 10) & 0x02U) == 0) continue;
    const std::size_t node = at - kNodeHeader;
    if (u16(node + 6) != key.size() || u16(node + 4) != 0) continue;
    const char huge[4] = {'\xff', '\xff', '\xff', '\x7f'};
    file.seekp(static_cast<std::streamoff>(node));
    file.write(huge, sizeof huge);
    ++damaged;
  }
  file.flush();
  return damaged;
}

}  // namespace

TEST_CASE("a damaged page of the state database is found by a child, not by the daemon dying",
          "[e2e][daemon][store]") {
  auto daemon = DaemonProcess::start();
  std::string revision;
  {
    RawClient client(daemon->socket());
    revision = installAndActivate(client, "damaged");
    auto verify = client.call("store.verify").at("result");
    CHECK(verify.at("ok") == true);
  }

  SECTION("while it runs, store.verify reports it and the daemon lives on") {
    // store.verify hashes every manifest: in the daemon, hashing this one would read past the
    // end of the file and kill it (SIGBUS).
    REQUIRE(damageNodesKeyed(daemon->stateDir() / "db" / "data.mdb", revision) > 0);
    RawClient client(daemon->socket());
    auto verify = client.call("store.verify").at("result");
    CHECK(verify.at("ok") == false);
    REQUIRE(verify.at("problems").as_array().size() == 1);
    CHECK_THAT(std::string(verify.at("problems").at(0).as_string()),
               Catch::Contains("database pages") && Catch::Contains("table tool_manifests") &&
                   Catch::Contains("runs past the page"));
    CHECK(client.call("ping").contains("result"));
    CHECK(daemon->running());
  }
  SECTION("at start, the daemon refuses it and says what to do") {
    REQUIRE(daemon->stop() == 0);
    REQUIRE(damageNodesKeyed(daemon->stateDir() / "db" / "data.mdb", revision) > 0);
    DaemonOptions again;
    again.stateDir = daemon->stateDir();
    checkStartRefused(again, "is damaged: table tool_manifests", "restore db/ from a backup");
  }
}

TEST_CASE("store.backup writes a copy of the running daemon's state that a daemon starts from",
          "[e2e][daemon][store]") {
  auto daemon = DaemonProcess::start();
  RawClient client(daemon->socket());
  installAndActivate(client, "kept");
  auto secret =
      client.call("secrets.set", json::object{{"tool", "kept"},
                                              {"name", "api_key"},
                                              {"value", "v-123"},
                                              {"origins", json::array{"https://example.com"}}});
  REQUIRE(secret.contains("result"));

  const fs::path copy = daemon->dir() / "backup.mdb";
  auto written = client.call("store.backup", json::object{{"path", copy.string()}});
  INFO(json::serialize(written));
  REQUIRE(written.contains("result"));
  CHECK(written.at("result").at("path") == json::value(copy.string()));
  CHECK(written.at("result").at("bytes").to_number<std::uint64_t>() == fs::file_size(copy));
  CHECK((fs::status(copy).permissions() & fs::perms::all) ==
        (fs::perms::owner_read | fs::perms::owner_write));
  // Never over a file, never to a relative path or a missing directory; nothing left behind.
  auto again = client.call("store.backup", json::object{{"path", copy.string()}});
  CHECK(again.at("error").at("code") == -32012);
  CHECK(client.call("store.backup", json::object{{"path", "backup.mdb"}}).at("error").at("code") ==
        -32602);
  auto nowhere = client.call("store.backup",
                             json::object{{"path", (daemon->dir() / "none" / "b.mdb").string()}});
  CHECK(nowhere.at("error").at("code") == -32015);
  // A name too long is not "already there".
  auto tooLong = client.call(
      "store.backup", json::object{{"path", (daemon->dir() / std::string(300, 'n')).string()}});
  CHECK(tooLong.at("error").at("code") == -32015);
  CHECK_THAT(std::string(nowhere.at("error").at("data").at("detail").as_string()),
             Catch::Contains("no backup was written"));
  std::size_t partials = 0;
  for (const auto& entry : fs::directory_iterator(daemon->dir())) {
    partials += entry.path().filename().string().find(".partial-") != std::string::npos;
  }
  CHECK(partials == 0);

  // toolhostctl backup takes a path relative to where it runs.
  auto byCtl = runProgram({"/bin/sh", "-c",
                           "cd '" + daemon->dir().string() + "' && exec '" + ctlBinary().string() +
                               "' --socket '" + daemon->socket().string() +
                               "' --compact backup second.mdb"});
  INFO(byCtl.err);
  CHECK(byCtl.status == 0);
  CHECK_THAT(byCtl.out, Catch::Contains((daemon->dir() / "second.mdb").string()));
  CHECK(fs::file_size(daemon->dir() / "second.mdb") > 0);

  // What came after the backup is not in it.
  installAndActivate(client, "later");
  REQUIRE(daemon->stop() == 0);

  // Restored: the copy as db/data.mdb of a state directory, beside the secrets key it needs.
  const fs::path restored = daemon->dir() / "restored";
  fs::create_directories(restored / "db");
  fs::permissions(restored, fs::perms::owner_all);
  fs::permissions(restored / "db", fs::perms::owner_all);
  fs::copy_file(copy, restored / "db" / "data.mdb");
  fs::copy_file(daemon->stateDir() / "secrets.key", restored / "secrets.key");
  DaemonOptions options;
  options.stateDir = restored;
  options.socketPath = daemon->dir() / "r";
  auto second = DaemonProcess::start(options);
  RawClient after(second->socket());
  auto tools = json::serialize(after.call("tools.list").at("result"));
  CHECK(tools.find("\"kept\"") != std::string::npos);
  CHECK(tools.find("\"later\"") == std::string::npos);
  auto secrets = json::serialize(after.call("secrets.list").at("result"));
  CHECK(secrets.find("api_key") != std::string::npos);
  CHECK(after.call("store.verify").at("result").at("ok") == true);
}

namespace {

// LMDB's writer lock is shared by every process that opens the environment: holding it here
// makes the daemon's next write wait, as a slow or stalled disk would.
class HeldWriterLock {
 public:
  explicit HeldWriterLock(const fs::path& stateDir) {
    REQUIRE(mdb_env_create(&env_) == 0);
    REQUIRE(mdb_env_open(env_, (stateDir / "db").c_str(), MDB_NOTLS, 0600) == 0);
    REQUIRE(mdb_txn_begin(env_, nullptr, 0, &txn_) == 0);
  }
  void release() {
    if (txn_ != nullptr) mdb_txn_abort(txn_);
    txn_ = nullptr;
  }
  ~HeldWriterLock() {
    release();
    mdb_env_close(env_);
  }
  HeldWriterLock(const HeldWriterLock&) = delete;
  HeldWriterLock& operator=(const HeldWriterLock&) = delete;

 private:
  MDB_env* env_ = nullptr;
  MDB_txn* txn_ = nullptr;
};

std::string installLine(int id, const std::string& name) {
  return R"({"jsonrpc":"2.0","id":)" + std::to_string(id) +
         R"(,"method":"tools.install","params":{"manifest":{"name":")" + name +
         R"(","description":"d","parameters":{"type":"object"},"execution":{"class":"sandboxed-code",)"
         R"("runtime":"javascript","source":"export default async () => 1"}}}})"
         "\n";
}

}  // namespace

TEST_CASE("a write waiting for the disk holds no I/O thread: other requests are still answered",
          "[e2e][daemon][disk]") {
  // One I/O thread, so that a write made on it would stop the whole daemon.
  DaemonOptions options;
  options.configToml = "[server]\nio_threads = 1\n";
  auto daemon = DaemonProcess::start(options);
  HeldWriterLock disk(daemon->stateDir());

  RawClient admin(daemon->socket());
  admin.send(installLine(7, "slow-disk"));
  CHECK_FALSE(admin.readLine(std::chrono::milliseconds(300)));  // the install waits for the lock

  RawClient other(daemon->socket());
  auto pong = other.call("ping", nullptr, 8);
  CHECK(pong.contains("result"));
  auto info = other.call("daemon.info", nullptr, 9);
  CHECK(info.contains("result"));

  disk.release();
  auto installed = admin.readJson().as_object();
  CHECK(installed.at("id") == 7);
  REQUIRE(installed.contains("result"));
  CHECK(installed.at("result").at("name") == "slow-disk");
  // What was written is there.
  auto got = other.call("tools.get", json::object{{"revision", installed.at("result").at("revision")}}, 10);
  CHECK(got.contains("result"));
}

TEST_CASE("a client that leaves while its write waits for the disk loses nothing",
          "[e2e][daemon][disk]") {
  auto daemon = DaemonProcess::start();
  {
    HeldWriterLock disk(daemon->stateDir());
    {
      RawClient leaving(daemon->socket());
      leaving.send(installLine(1, "left-behind"));
      CHECK_FALSE(leaving.readLine(std::chrono::milliseconds(200)));
    }  // closed while the install waits
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }  // released: the install goes through
  RawClient client(daemon->socket());
  auto installedRevisions = [&] {
    auto listed = client.call("tools.history", json::object{{"name", "left-behind"}}, 2);
    const auto* result = listed.if_contains("result");
    return result != nullptr ? result->at("revisions").as_array().size() : 0;
  };
  std::size_t revisions = 0;
  for (int attempt = 0; attempt < 100 && revisions == 0; ++attempt) {
    revisions = installedRevisions();
    if (revisions == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(revisions == 1);
  CHECK(daemon->running());
}
