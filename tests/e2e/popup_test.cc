// ctx.popup() through the real daemon: both kinds reach the client that called popup.subscribe as
// popup.open and come back as its popup.result; authorization first (the manifest's ceiling, a
// decision); no host subscribed; the host's error and its disconnection; a call that ends first
// withdraws its popup (popup.close).
#include "tests/e2e/mediation_support.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <boost/json/parse.hpp>
#include <catch2/catch.hpp>

#include <chrono>
#include <string>

using namespace toolhost::testing;
using namespace toolhost::testing::e2e;
using namespace std::chrono_literals;

namespace {

// Opens the popup args.request and returns what the host answered, or the Error's code.
constexpr std::string_view kPopper = R"js(
export default async (args, ctx) => {
  try {
    return { answer: await ctx.popup(args.request) };
  } catch (e) {
    return { code: e.code ?? null, message: String(e.message) };
  }
}
)js";

constexpr std::string_view kOrigin = "https://login.example";

json::object popupCapabilities() {
  return json::object{{"popup", json::array{"custom-html", kOrigin}}};
}

json::object customHtml(std::string_view html = "<p>Pick one</p>") {
  return json::object{{"request", json::object{{"kind", "custom-html"}, {"html", html}}}};
}

std::string codeOf(const json::value& outcome) {
  INFO(json::serialize(outcome));
  REQUIRE(outcome.as_object().contains("code"));
  return text(outcome.at("code"));
}

}  // namespace

TEST_CASE("popup: both kinds go to the subscribed host and come back", "[e2e][popup]") {
  auto daemon = DaemonProcess::start();
  Peer agent(daemon->socket());
  auto revision = deploy(agent, jsTool("popper", kPopper, popupCapabilities()));
  decideAhead(agent, revision, "popup", "custom-html", "read");
  decideAhead(agent, revision, "popup", std::string(kOrigin), "read", "allow", "session");
  PopupHost host(daemon->socket());

  auto id = startCall(agent, "popper", customHtml());
  auto open = host.opened();
  CHECK(open.at("kind") == "custom-html");
  CHECK(open.at("html") == "<p>Pick one</p>");
  CHECK(open.at("tool").at("name") == "popper");
  CHECK(open.at("tool").at("revision") == json::value(revision));
  CHECK(resultOf(host.answer(open, json::parse(R"({"choice": 2})"))).at("accepted") == true);
  CHECK(toolResult(agent.response(id)).at("answer") == json::parse(R"({"choice": 2})"));
  // Answered once: a second answer finds nothing.
  CHECK(errorCode(host.answer(open, json::value(3))) == -32001);

  id = startCall(
      agent, "popper",
      json::object{{"request", json::object{{"kind", "origin"},
                                            {"url", std::string(kOrigin) + "/consent?x=1"}}}});
  auto page = host.opened();
  CHECK(page.at("kind") == "origin");
  CHECK(page.at("url") == json::value(std::string(kOrigin) + "/consent?x=1"));
  CHECK_FALSE(page.contains("html"));
  resultOf(host.answer(page, "granted"));
  CHECK(toolResult(agent.response(id)).at("answer") == "granted");

  // The host's error reaches the tool as its code.
  id = startCall(agent, "popper", customHtml());
  auto refused = host.opened();
  resultOf(host.call("popup.result",
                     json::object{{"popupId", refused.at("popupId")},
                                  {"error", json::object{{"code", "dismissed"},
                                                         {"message", "closed by the user"}}}}));
  CHECK(codeOf(toolResult(agent.response(id))) == "dismissed");

  // Audited as requests.
  auto entries = resultOf(agent.call("audit.tail", json::object{{"toolRevision", revision}}))
                     .at("entries")
                     .as_array();
  std::size_t popups = 0;
  for (const auto& entry : entries) {
    if (entry.at("kind") == "request" && entry.at("action") == "popup") ++popups;
  }
  CHECK(popups == 3);
}

TEST_CASE("popup: no host, not requested, not decided", "[e2e][popup]") {
  auto daemon = DaemonProcess::start();
  Peer agent(daemon->socket());
  auto revision = deploy(agent, jsTool("popper", kPopper, popupCapabilities()));
  decideAhead(agent, revision, "popup", "custom-html", "read");

  auto alone = toolResult(
      agent.call("tools.call", json::object{{"name", "popper"}, {"arguments", customHtml()}}));
  CHECK(codeOf(alone) == "no-popup-host");
  CHECK_THAT(text(alone.at("message")), Catch::Contains("popup.subscribe"));

  PopupHost host(daemon->socket());
  auto elsewhere = toolResult(agent.call(
      "tools.call",
      json::object{{"name", "popper"},
                   {"arguments",
                    json::object{{"request", json::object{{"kind", "origin"},
                                                          {"url", "https://other.example/"}}}}}}));
  CHECK(codeOf(elsewhere) == "not-authorized");
  // Requested but undecided, and nobody to ask.
  auto undecided = toolResult(agent.call(
      "tools.call",
      json::object{
          {"name", "popper"},
          {"arguments", json::object{{"request", json::object{{"kind", "origin"},
                                                              {"url", std::string(kOrigin)}}}}}}));
  CHECK(codeOf(undecided) == "not-authorized");
  host.expectNoNotification();
}

TEST_CASE("popup: a prompt first, then the popup, the host leaving or the call ending",
          "[e2e][popup]") {
  auto daemon = DaemonProcess::start();
  Peer agent(daemon->socket());
  auto revision = deploy(agent, jsTool("popper", kPopper, popupCapabilities()));
  Approver approver(daemon->socket());
  PopupHost host(daemon->socket());

  auto id = startCall(agent, "popper", customHtml());
  auto prompt = approver.prompt();
  CHECK(prompt.at("action") == "popup");
  CHECK(prompt.at("target") == "custom-html");
  resultOf(approver.decide(prompt, "allow", "session"));
  auto open = host.opened();
  resultOf(host.answer(open, true));
  CHECK(toolResult(agent.response(id)).at("answer") == true);

  // The call is cancelled while its popup is open: the host is told to close it.
  id = startCall(agent, "popper", customHtml());
  auto abandoned = host.opened();
  auto cancelId = agent.nextId();
  agent.send("$/cancelRequest", json::object{{"id", id}}, cancelId);
  CHECK(errorCode(agent.response(id)) == -32009);
  auto close = host.notification();
  CHECK(close.at("method") == "popup.close");
  CHECK(close.at("params").at("popupId") == abandoned.at("popupId"));
  CHECK(errorCode(host.answer(abandoned, 1)) == -32001);

  // The host disconnects with a popup open: the tool learns it.
  {
    PopupHost leaving(daemon->socket());  // the most recent host gets the popup
    id = startCall(agent, "popper", customHtml());
    leaving.opened();
  }
  CHECK(codeOf(toolResult(agent.response(id))) == "popup-closed");
  host.expectNoNotification();
  CHECK_FALSE(revision.empty());
}

TEST_CASE("popup: a host that never answers is closed after [popup] timeout_ms", "[e2e][popup]") {
  DaemonOptions options;
  options.configToml = "[popup]\ntimeout_ms = 400\n";
  auto daemon = DaemonProcess::start(options);
  Peer agent(daemon->socket());
  auto revision = deploy(agent, jsTool("popper", kPopper, popupCapabilities()));
  decideAhead(agent, revision, "popup", "custom-html", "read");
  PopupHost host(daemon->socket());

  auto id = startCall(agent, "popper", customHtml());
  auto open = host.opened();
  auto outcome = toolResult(agent.response(id));
  CHECK(codeOf(outcome) == "popup-timeout");
  CHECK_THAT(text(outcome.at("message")), Catch::Contains("[popup] timeout_ms"));
  auto close = host.notification();
  CHECK(close.at("method") == "popup.close");
  CHECK(close.at("params").at("popupId") == open.at("popupId"));
  CHECK(errorCode(host.answer(open, 1)) == -32001);
}

TEST_CASE("popup: at SIGTERM the approver and the host stay to finish the call waiting on them",
          "[e2e][popup]") {
  DaemonOptions options;
  options.configToml = "[server]\nshutdown_grace_ms = 20000\n";
  auto daemon = DaemonProcess::start(options);
  Peer agent(daemon->socket());
  deploy(agent, jsTool("popper", kPopper, popupCapabilities()));
  Approver approver(daemon->socket());
  PopupHost host(daemon->socket());

  auto id = startCall(agent, "popper", customHtml());
  auto prompt = approver.prompt();
  ::kill(daemon->pid(), SIGTERM);
  // Both still read and answer while the agent's call is in flight.
  resultOf(approver.decide(prompt, "allow", "once"));
  auto open = host.opened();
  resultOf(host.answer(open, "chosen"));
  CHECK(toolResult(agent.response(id)).at("answer") == "chosen");
  // Then everyone is let go, well before the grace runs out.
  auto status = daemon->wait(std::chrono::seconds(10));
  REQUIRE(status.has_value());
  CHECK(*status == 0);
}

namespace {

// toolhostctl popup-host with pipes on stdin and stdout.
class PopupHostProcess {
 public:
  explicit PopupHostProcess(const std::filesystem::path& socket) {
    int in[2], out[2];
    REQUIRE(::pipe2(in, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    std::string binary = ctlBinary().string();
    std::string socketText = socket.string();
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::dup2(in[0], STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      const char* argv[] = {binary.c_str(), "--socket", socketText.c_str(), "popup-host", nullptr};
      ::execv(argv[0], const_cast<char* const*>(argv));
      _exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    stdout_ = out[0];
  }
  ~PopupHostProcess() {
    closeInput();
    ::close(stdout_);
    if (!exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  void write(const std::string& line) {
    REQUIRE(::write(stdin_, line.data(), line.size()) == static_cast<ssize_t>(line.size()));
  }
  void closeInput() {
    if (stdin_ >= 0) ::close(stdin_);
    stdin_ = -1;
  }
  // The next line it printed, as JSON.
  json::object line() {
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (buffer_.find('\n') == std::string::npos) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) FAIL("toolhostctl popup-host printed no line: " << buffer_);
      pollfd descriptor{stdout_, POLLIN, 0};
      if (::poll(&descriptor, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[4096];
      const ssize_t n = ::read(stdout_, chunk, sizeof chunk);
      if (n <= 0) FAIL("toolhostctl popup-host ended: " << buffer_);
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
    const auto newline = buffer_.find('\n');
    auto parsed = json::parse(buffer_.substr(0, newline));
    buffer_.erase(0, newline + 1);
    return parsed.as_object();
  }
  int wait() {
    int status = 0;
    REQUIRE(::waitpid(pid_, &status, 0) == pid_);
    exited_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  int stdout_ = -1;
  bool exited_ = false;
  std::string buffer_;
};

}  // namespace

TEST_CASE("popup: toolhostctl popup-host shows popups and sends answers", "[e2e][popup][cli]") {
  auto daemon = DaemonProcess::start();
  Peer agent(daemon->socket());
  auto revision = deploy(agent, jsTool("popper", kPopper, popupCapabilities()));
  decideAhead(agent, revision, "popup", "custom-html", "read");
  PopupHostProcess host(daemon->socket());
  CHECK(host.line().at("subscribed") == true);

  auto id = startCall(agent, "popper", customHtml("<b>ok?</b>"));
  auto open = host.line();
  CHECK(open.at("method") == "popup.open");
  CHECK(open.at("params").at("html") == "<b>ok?</b>");
  host.write(json::serialize(json::object{{"popupId", open.at("params").at("popupId")},
                                          {"result", json::object{{"ok", true}}}}) +
             "\n");
  CHECK(toolResult(agent.response(id)).at("answer") == json::parse(R"({"ok":true})"));

  // The end of input: the host leaves, and a popup finds nobody to open it.
  host.closeInput();
  CHECK(host.wait() == 0);
  auto alone = toolResult(
      agent.call("tools.call", json::object{{"name", "popper"}, {"arguments", customHtml()}}));
  CHECK(codeOf(alone) == "no-popup-host");
}
