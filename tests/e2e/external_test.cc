// External-service tools through the real daemon: tools.call forwarded as JSON-RPC to a unix:
// socket (a tiny server in this file) and to an https endpoint (the test server's /rpc route),
// after the same authorization as fetch (action invoke, target the endpoint, access write): the
// result, a remote error, no decision, a stored deny, a prompt, cancellation, and the audit.
#include "tests/e2e/mediation_support.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

using namespace toolhost::testing;
using namespace toolhost::testing::e2e;
using namespace std::chrono_literals;

namespace {

// A JSON-RPC server on a Unix socket, one connection at a time on its own thread: reads one
// line, answers tools.call with {name, arguments} (an echo), with the error {code: -32000,
// message: arguments.fail} when that is a string, with a line that is not JSON when
// arguments.garbage, and never when arguments.hang (it waits for the daemon to close). With
// arguments.big = N the result also holds a string of N bytes; with arguments.stall = N it sends
// N bytes of an answer and then waits for the daemon to close.
class UnixRpcServer {
 public:
  explicit UnixRpcServer(std::filesystem::path path) : path_(std::move(path)) {
    REQUIRE(::pipe2(stop_, O_CLOEXEC) == 0);
    listen_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(listen_ >= 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    REQUIRE(path_.native().size() < sizeof address.sun_path);
    std::memcpy(address.sun_path, path_.c_str(), path_.native().size() + 1);
    REQUIRE(::bind(listen_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    REQUIRE(::listen(listen_, 8) == 0);
    thread_ = std::thread([this] { serve(); });
  }
  ~UnixRpcServer() {
    (void)!::write(stop_[1], "x", 1);
    thread_.join();
    ::close(listen_);
    ::close(stop_[0]);
    ::close(stop_[1]);
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }

  std::size_t requests() const {
    std::lock_guard lock(mutex_);
    return requests_;
  }
  bool waitForRequests(std::size_t count, std::chrono::milliseconds timeout) const {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return requests_ >= count; });
  }
  bool waitForClosedHang(std::chrono::milliseconds timeout) const {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return closedHangs_ > 0; });
  }
  std::string lastRequest() const {
    std::lock_guard lock(mutex_);
    return last_;
  }

 private:
  // Waits for `fd` to be readable; false when the server is stopping.
  bool readable(int fd) {
    pollfd fds[2] = {{fd, POLLIN, 0}, {stop_[0], POLLIN, 0}};
    for (;;) {
      if (::poll(fds, 2, -1) < 0) return false;
      if (fds[1].revents != 0) return false;
      if (fds[0].revents != 0) return true;
    }
  }
  void serve() {
    while (readable(listen_)) {
      int connection = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
      if (connection < 0) continue;
      handle(connection);
      ::close(connection);
    }
  }
  void handle(int connection) {
    std::string line;
    char buffer[4096];
    while (line.find('\n') == std::string::npos) {
      if (!readable(connection)) return;
      const ssize_t n = ::read(connection, buffer, sizeof buffer);
      if (n <= 0) return;
      line.append(buffer, static_cast<std::size_t>(n));
    }
    line.resize(line.find('\n'));
    {
      std::lock_guard lock(mutex_);
      ++requests_;
      last_ = line;
    }
    changed_.notify_all();
    boost::system::error_code ec;
    auto request = boost::json::parse(line, ec);
    json::object answer{
        {"jsonrpc", "2.0"},
        {"id", request.is_object() && request.as_object().contains("id") ? request.at("id")
                                                                         : json::value(nullptr)}};
    const json::value* arguments = nullptr;
    if (!ec && request.is_object()) {
      if (const auto* params = request.as_object().if_contains("params");
          params && params->is_object()) {
        arguments = params->as_object().if_contains("arguments");
        answer["result"] = json::object{{"name", params->as_object().at("name")},
                                        {"arguments", arguments ? *arguments : json::value()}};
      }
    }
    std::string reply;
    const json::object* args = arguments ? arguments->if_object() : nullptr;
    if (args && args->contains("big")) {
      answer["result"].as_object()["big"] =
          std::string(static_cast<std::size_t>(args->at("big").to_number<std::int64_t>()), 'b');
    }
    if (args && args->contains("stall")) {
      const std::string part(static_cast<std::size_t>(args->at("stall").to_number<std::int64_t>()),
                             ' ');
      (void)!::write(connection, part.data(), part.size());
    }
    if (args && (args->contains("hang") || args->contains("stall"))) {
      // Hold the connection until the daemon closes it.
      while (readable(connection)) {
        if (::read(connection, buffer, sizeof buffer) <= 0) break;
      }
      {
        std::lock_guard lock(mutex_);
        ++closedHangs_;
      }
      changed_.notify_all();
      return;
    }
    if (args && args->contains("garbage")) {
      reply = "this is not JSON\n";
    } else {
      if (args && args->contains("fail") && args->at("fail").is_string()) {
        answer.erase("result");
        answer["error"] = json::object{{"code", -32000},
                                       {"message", args->at("fail")},
                                       {"data", json::object{{"retry", false}}}};
      }
      reply = json::serialize(answer) + "\n";
    }
    (void)!::write(connection, reply.data(), reply.size());
  }

  std::filesystem::path path_;
  int listen_ = -1;
  int stop_[2] = {-1, -1};
  std::thread thread_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::size_t requests_ = 0;
  std::size_t closedHangs_ = 0;
  std::string last_;
};

json::object externalTool(std::string_view name, const std::string& endpoint) {
  return json::object{
      {"name", name},
      {"description", "an external service"},
      {"parameters", json::parse(R"({"type":"object"})")},
      {"execution", json::object{{"class", "external-service"}, {"endpoint", endpoint}}}};
}

json::object callTool(Peer& agent, std::string_view name, json::object arguments) {
  return agent.call("tools.call",
                    json::object{{"name", name}, {"arguments", std::move(arguments)}});
}

}  // namespace

TEST_CASE("external service over unix: forwarded once authorized", "[e2e][external]") {
  auto daemon = DaemonProcess::start();
  const std::string endpoint = "unix:" + (daemon->dir() / "svc.sock").string();
  UnixRpcServer service(daemon->dir() / "svc.sock");
  Peer agent(daemon->socket());
  auto revision = deploy(agent, externalTool("remote", endpoint));

  // Nothing decided and nobody to ask: refused, nothing sent.
  auto refused = callTool(agent, "remote", json::object{{"x", 1}});
  CHECK(errorCode(refused) == -32003);
  CHECK(refused.at("error").at("data").at("kind") == "not-authorized");
  CHECK(service.requests() == 0);

  decideAhead(agent, revision, "invoke", endpoint, "write");
  auto answered = callTool(agent, "remote", json::object{{"x", 1}});
  auto result = resultOf(answered);
  CHECK(result.at("result") == json::parse(R"({"name":"remote","arguments":{"x":1}})"));
  CHECK(result.at("revision") == json::value(revision));
  CHECK(result.at("usage").as_object().contains("wallMs"));
  auto sent = json::parse(service.lastRequest()).as_object();
  CHECK(sent.at("jsonrpc") == "2.0");
  CHECK(sent.at("method") == "tools.call");
  CHECK(sent.at("params") == json::parse(R"({"name":"remote","arguments":{"x":1}})"));

  // The service's error is the tool's error.
  auto failed = callTool(agent, "remote", json::object{{"fail", "no such city"}});
  CHECK(errorCode(failed) == -32008);
  CHECK(failed.at("error").at("data").at("remoteError").at("message") == "no such city");
  CHECK_THAT(text(failed.at("error").at("data").at("detail")), Catch::Contains("no such city"));
  // An answer that is not JSON-RPC.
  auto garbage = callTool(agent, "remote", json::object{{"garbage", true}});
  CHECK(errorCode(garbage) == -32014);
  CHECK(garbage.at("error").at("data").at("kind") == "invalid-response");

  // Cancelling the call closes the connection to the service.
  auto id = startCall(agent, "remote", json::object{{"hang", true}});
  REQUIRE(service.waitForRequests(4, 10s));
  auto cancelId = agent.nextId();
  agent.send("$/cancelRequest", json::object{{"id", id}}, cancelId);
  CHECK(errorCode(agent.response(id)) == -32009);
  CHECK(service.waitForClosedHang(5s));

  // Audited: the denial and each request.
  auto entries = resultOf(agent.call("audit.tail", json::object{{"toolRevision", revision}}))
                     .at("entries")
                     .as_array();
  std::size_t requests = 0;
  bool denial = false;
  for (const auto& entry : entries) {
    if (entry.at("action") != "invoke") continue;
    CHECK(entry.at("target") == json::value(endpoint));
    if (entry.at("kind") == "request") ++requests;
    if (entry.at("kind") == "denial") denial = true;
  }
  CHECK(requests == 4);
  CHECK(denial);
}

TEST_CASE("external service over unix: its limits, the answers held, a busy service",
          "[e2e][external]") {
  DaemonOptions options;
  options.configToml =
      "[fetch]\nmax_response_bytes = 100000\nmax_buffered_bytes = 100000\n"
      "max_buffered_bytes_per_tool = 100000\n";
  auto daemon = DaemonProcess::start(options);
  const std::string holdingEndpoint = "unix:" + (daemon->dir() / "a.sock").string();
  const std::string endpoint = "unix:" + (daemon->dir() / "b.sock").string();
  UnixRpcServer holdingService(daemon->dir() / "a.sock");
  UnixRpcServer service(daemon->dir() / "b.sock");
  Peer agent(daemon->socket());
  auto holding = deploy(agent, externalTool("holding", holdingEndpoint));
  decideAhead(agent, holding, "invoke", holdingEndpoint, "write");
  auto manifest = externalTool("remote", endpoint);
  manifest["limits"] = json::object{{"outputBytes", 60000}};
  auto revision = deploy(agent, manifest);
  decideAhead(agent, revision, "invoke", endpoint, "write");

  // outputBytes holds for the service's result as for a sandboxed tool's.
  auto large = callTool(agent, "remote", json::object{{"big", 70000}});
  CHECK(errorCode(large) == -32007);
  CHECK_THAT(text(large.at("error").at("data").at("detail")), Catch::Contains("outputBytes"));
  CHECK(resultOf(callTool(agent, "remote", json::object{{"big", 50000}})).contains("result"));
  // The service's error object reaches the agent within the same limit.
  auto failed = callTool(agent, "remote", json::object{{"fail", std::string(70000, 'f')}});
  CHECK(errorCode(failed) == -32008);
  CHECK_FALSE(failed.at("error").at("data").as_object().contains("remoteError"));
  CHECK_THAT(text(failed.at("error").at("data").at("detail")), Catch::Contains("is left out"));
  // A call's wallMs only tightens; a huge one is no overflow into a timeout at once.
  auto patient =
      agent.call("tools.call", json::object{{"name", "remote"},
                                            {"arguments", json::object{{"x", 1}}},
                                            {"limits", json::object{{"wallMs", 9300000000000}}}});
  CHECK(resultOf(patient).at("result").at("arguments").at("x") == 1);

  // An answer being read counts against max_buffered_bytes, like a fetch's body: while one
  // service holds 60 KB of an unfinished answer, another's 50 KB answer does not fit.
  auto held = startCall(agent, "holding", json::object{{"stall", 60000}});
  std::size_t holdingRequests = 1;
  REQUIRE(holdingService.waitForRequests(holdingRequests, 10s));
  bool refused = false;
  for (int attempt = 0; attempt < 100 && !refused; ++attempt) {
    auto answer = callTool(agent, "remote", json::object{{"big", 50000}});
    if (answer.contains("error")) {
      CHECK(answer.at("error").at("data").at("kind") == "response-too-large");
      CHECK_THAT(text(answer.at("error").at("data").at("detail")),
                 Catch::Contains("max_buffered_bytes"));
      refused = true;
    } else {
      if (agent.answered(held)) {
        // The held answer arrived while this one was being read and was the one refused (a
        // slow machine): hold again.
        CHECK(errorCode(agent.response(held)) == -32007);
        held = startCall(agent, "holding", json::object{{"stall", 60000}});
        REQUIRE(holdingService.waitForRequests(++holdingRequests, 10s));
      }
      std::this_thread::sleep_for(50ms);
    }
  }
  CHECK(refused);
  agent.send("$/cancelRequest", json::object{{"id", held}}, agent.nextId());
  CHECK(errorCode(agent.response(held)) == -32009);
  CHECK(holdingService.waitForClosedHang(5s));
  CHECK(resultOf(callTool(agent, "remote", json::object{{"big", 50000}})).contains("result"));
}

TEST_CASE("a busy unix service is waited for, not taken for a broken one", "[e2e][external]") {
  auto daemon = DaemonProcess::start();
  const auto path = daemon->dir() / "busy.sock";
  const std::string endpoint = "unix:" + path.string();
  // A listener with room for one pending connection, taken by another client: the daemon's
  // connect is refused at once (EAGAIN) until the service accepts.
  int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(listener >= 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.native().size() + 1);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  REQUIRE(::listen(listener, 0) == 0);
  int filler = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  REQUIRE(::connect(filler, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  Peer agent(daemon->socket());
  auto revision = deploy(agent, externalTool("busy", endpoint));
  decideAhead(agent, revision, "invoke", endpoint, "write");
  std::thread service([&] {
    std::this_thread::sleep_for(300ms);
    ::close(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));  // the filler
    int connection = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    std::string line;
    char buffer[4096];
    while (line.find('\n') == std::string::npos) {
      const ssize_t n = ::read(connection, buffer, sizeof buffer);
      if (n <= 0) break;
      line.append(buffer, static_cast<std::size_t>(n));
    }
    const std::string reply = R"({"jsonrpc":"2.0","id":1,"result":"served"})"
                              "\n";
    (void)!::write(connection, reply.data(), reply.size());
    ::close(connection);
  });
  auto answer = callTool(agent, "busy", json::object{});
  service.join();
  ::close(filler);
  ::close(listener);
  CHECK(resultOf(answer).at("result") == "served");
}

TEST_CASE("an external service that is the daemon's own socket is refused", "[e2e][external]") {
  auto daemon = DaemonProcess::start();
  Peer agent(daemon->socket());
  // By its path, and through a symbolic link to it.
  const auto link = daemon->dir() / "self.sock";
  std::filesystem::create_symlink(daemon->socket(), link);
  for (const auto& path : {daemon->socket(), link}) {
    const std::string endpoint = "unix:" + path.string();
    const std::string name = path == link ? "self-link" : "self";
    auto revision = deploy(agent, externalTool(name, endpoint));
    decideAhead(agent, revision, "invoke", endpoint, "write");
    auto refused = callTool(agent, name, json::object{{"x", 1}});
    INFO(refused);
    CHECK(refused.at("error").at("data").at("kind") == "invalid-definition");
    CHECK_THAT(text(refused.at("error").at("data").at("detail")), Catch::Contains("own socket"));
  }
  CHECK(resultOf(agent.call("daemon.health")).at("connections") == 1);
  // The socket file made again after it went is the daemon's own all the same.
  std::filesystem::remove(daemon->socket());
  bool remade = false;
  for (int i = 0; i < 100 && !remade; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    remade = std::filesystem::is_socket(daemon->socket()) &&
             daemon->log().find("made it again") != std::string::npos;
  }
  REQUIRE(remade);
  auto refused = callTool(agent, "self", json::object{{"x", 2}});
  INFO(refused);
  CHECK_THAT(text(refused.at("error").at("data").at("detail")),
             Catch::Contains("is this daemon's own socket"));
  CHECK(daemon->log().find("a connection from this daemon's own process") == std::string::npos);
}

TEST_CASE("external service over https: the same checks, a prompt, a stored deny",
          "[e2e][external]") {
  HttpsTestServer server;
  DaemonOptions options;
  options.configToml = fetchConfig(server);
  auto daemon = DaemonProcess::start(options);
  Peer agent(daemon->socket());
  const std::string endpoint = server.url("/rpc");
  auto revision = deploy(agent, externalTool("remote", endpoint));
  Approver approver(daemon->socket());

  auto id = startCall(agent, "remote", json::object{{"city", "Paris"}});
  auto prompt = approver.prompt();
  CHECK(prompt.at("action") == "invoke");
  CHECK(prompt.at("target") == json::value(endpoint));
  CHECK(prompt.at("access") == "write");
  CHECK(prompt.at("private") == true);
  resultOf(approver.decide(prompt, "allow", "once"));
  CHECK(toolResult(agent.response(id)) ==
        json::parse(R"({"name":"remote","arguments":{"city":"Paris"}})"));
  CHECK(server.requestCount("/rpc") == 1);

  id = startCall(agent, "remote", json::object{{"fail", "quota exceeded"}});
  resultOf(approver.decide(approver.prompt(), "allow", "session"));
  auto failed = agent.response(id);
  CHECK(errorCode(failed) == -32008);
  CHECK(failed.at("error").at("data").at("remoteError").at("code") == -32000);

  // Revoked, then denied ahead: refused without a prompt, nothing sent.
  resultOf(agent.call("policy.revoke", json::object{{"toolRevision", revision},
                                                    {"action", "invoke"},
                                                    {"target", endpoint},
                                                    {"access", "write"}}));
  decideAhead(agent, revision, "invoke", endpoint, "write", "deny", "always");
  auto denied = callTool(agent, "remote", json::object{});
  CHECK(errorCode(denied) == -32003);
  approver.expectNoNotification();
  CHECK(server.requestCount("/rpc") == 2);
}

TEST_CASE("external service over https: blocked endpoints are refused before any prompt",
          "[e2e][external]") {
  HttpsTestServer server;
  auto daemon = DaemonProcess::start();  // 127.0.0.1 not opened
  Peer agent(daemon->socket());
  deploy(agent, externalTool("remote", server.url("/rpc")));
  Approver approver(daemon->socket());
  auto refused = callTool(agent, "remote", json::object{});
  CHECK(errorCode(refused) == -32014);
  CHECK(refused.at("error").at("data").at("kind") == "destination-blocked");
  approver.expectNoNotification();
  CHECK(server.totalRequests() == 0);
}
