// The policy engine over the real daemon: the manifest ceiling, approvers (programs speaking
// policy.subscribe/policy.decide, and toolhostctl approve fed through stdin), every answer and
// scope, no approver, the prompt timeout, decisions across a restart, a new revision needing its
// own approval, policy.list/set/revoke/reset and audit.tail. Authorization is triggered through
// the admin's diagnostic policy.check, which runs the same authorize() a fetch does.
#include "tests/e2e/mediation_support.h"
#include "tests/support/daemon_process.h"

#include "protocol/json_parse.h"
#include "protocol/json_text.h"
#include "protocol/jsonrpc.h"

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>
#include <boost/json/parse.hpp>
#include <catch2/catch.hpp>

#include <chrono>
#include <deque>
#include <map>
#include <string>
#include <thread>
#include <vector>

using namespace toolhost::testing;
using namespace toolhost::testing::e2e;
namespace json = boost::json;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kApi = "https://api.example";
const std::string kOther = "https://b.example";

// Requests fetch https://api.example (read, write), https://b.example (read) and a custom-html
// popup. `variant` changes the source, and so the revision.
json::object manifest(std::string_view name, int variant = 0) {
  return json::object{{"name", name},
                      {"description", "A tool that fetches"},
                      {"parameters", json::parse(R"({"type":"object"})")},
                      {"execution", json::object{{"class", "sandboxed-code"},
                                                 {"runtime", "javascript"},
                                                 {"source", "export default async () => " +
                                                                std::to_string(variant)}}},
                      {"capabilities", json::parse(R"({"fetch": [
          {"origin": "https://api.example", "access": ["read", "write"]},
          {"origin": "https://b.example", "access": ["read"]}],
        "popup": ["custom-html"]})")}};
}

template <class Client>
std::string install(Client& admin, const json::object& m) {
  auto installed = resultOf(admin.call("tools.install", json::object{{"manifest", m}}));
  return std::string(installed.at("revision").as_string());
}

json::object key(const std::string& revision, const std::string& target = kApi,
                 std::string_view access = "read", std::string_view action = "fetch") {
  return json::object{
      {"toolRevision", revision}, {"action", action}, {"target", target}, {"access", access}};
}

// Runs policy.check for `k` while `approver` answers the prompt it receives.
json::object checkAnswered(Peer& admin, Approver& approver, const json::object& k,
                           std::string_view verdict, std::string_view scope) {
  auto id = admin.nextId();
  admin.send("policy.check", k, id);
  auto prompt = approver.prompt();
  CHECK(prompt.at("tool").at("revision") == k.at("toolRevision"));
  CHECK(prompt.at("target") == k.at("target"));
  CHECK(prompt.at("access") == k.at("access"));
  auto decided = resultOf(approver.decide(prompt, verdict, scope));
  CHECK(decided.at("requests") == 1);
  return resultOf(admin.response(id));
}

// A check that must be answered without any prompt.
json::object checkSilently(Peer& admin, Approver& approver, const json::object& k) {
  auto result = resultOf(admin.call("policy.check", k));
  approver.expectNoNotification();
  return result;
}

// toolhostctl approve with pipes on stdin and stdout.
class ApproveProcess {
 public:
  // With `terminal`, its standard input is a pseudo-terminal (as when a person runs it), else a
  // pipe (as from a script).
  explicit ApproveProcess(const std::filesystem::path& socket, bool terminal = false) {
    int in[2], out[2];
    if (terminal) {
      REQUIRE(::openpty(&in[1], &in[0], nullptr, nullptr, nullptr) == 0);
      ::fcntl(in[1], F_SETFD, FD_CLOEXEC);
      ::fcntl(in[0], F_SETFD, FD_CLOEXEC);
      termios mode{};
      REQUIRE(::tcgetattr(in[0], &mode) == 0);
      mode.c_lflag &= ~static_cast<tcflag_t>(ECHO);  // nobody reads the echo
      REQUIRE(::tcsetattr(in[0], TCSANOW, &mode) == 0);
    } else {
      REQUIRE(::pipe2(in, O_CLOEXEC) == 0);
    }
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    std::string binary = ctlBinary().string();
    std::string socketText = socket.string();
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::dup2(in[0], STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      const char* argv[] = {binary.c_str(), "--socket", socketText.c_str(), "approve", nullptr};
      ::execv(argv[0], const_cast<char* const*>(argv));
      _exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    stdout_ = out[0];
  }
  ~ApproveProcess() {
    closeInput();
    if (stdout_ >= 0) ::close(stdout_);
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  void write(std::string_view bytes) {
    REQUIRE(::write(stdin_, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  }
  void closeInput() {
    if (stdin_ >= 0) ::close(stdin_);
    stdin_ = -1;
  }
  // Reads lines until one contains `needle`; returns everything read, that line included.
  std::string readUntil(std::string_view needle,
                        std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    auto deadline = Clock::now() + timeout;
    for (;;) {
      for (auto newline = buffer_.find('\n'); newline != std::string::npos;
           newline = buffer_.find('\n', newline + 1)) {
        auto found = buffer_.find(needle);
        if (found != std::string::npos && found < newline) {
          std::string read = buffer_.substr(0, newline + 1);
          buffer_.erase(0, newline + 1);
          return read;
        }
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0)
        FAIL("toolhostctl approve never printed \"" << needle << "\"; it printed: " << buffer_);
      pollfd descriptor{stdout_, POLLIN, 0};
      if (::poll(&descriptor, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[4096];
      ssize_t n = ::read(stdout_, chunk, sizeof chunk);
      if (n <= 0)
        FAIL("toolhostctl approve ended before printing \"" << needle << "\": " << buffer_);
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }
  // Waits for the exit status.
  int wait() {
    int status = 0;
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) FAIL("toolhostctl approve did not exit");
      pollfd descriptor{stdout_, POLLIN, 0};
      ::poll(&descriptor, 1, 50);  // drain what it prints so it never blocks on a full pipe
      char chunk[4096];
      if ((descriptor.revents & POLLIN) != 0 && ::read(stdout_, chunk, sizeof chunk) > 0) continue;
    }
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

TEST_CASE("the manifest ceiling refuses without a prompt, no approver denies at once",
          "[e2e][policy]") {
  auto daemon = DaemonProcess::start();
  Peer admin(daemon->socket());
  auto rev = install(admin, manifest("fetcher"));

  // Nobody subscribed: denied at once, saying how to be asked.
  auto alone = resultOf(admin.call("policy.check", key(rev)));
  CHECK(alone.at("verdict") == "deny");
  CHECK(alone.at("source") == "no-approver");
  CHECK_THAT(text(alone.at("reason")), Catch::Contains("toolhostctl approve"));

  Approver approver(daemon->socket());
  CHECK(approver.pending.empty());
  // Not requested: b.example write, another origin, a popup target the manifest does not list.
  for (const auto& k :
       std::vector<json::object>{key(rev, kOther, "write"), key(rev, "https://evil.example"),
                                 key(rev, "https://api.example:8443"),
                                 key(rev, "https://login.example", "read", "popup")}) {
    auto refused = checkSilently(admin, approver, k);
    CHECK(refused.at("verdict") == "deny");
    CHECK(refused.at("source") == "not-requested");
    CHECK_THAT(text(refused.at("reason")), Catch::StartsWith("not-authorized: "));
    CHECK(refused.at("promptMs") == 0);
  }

  // Malformed keys are refused before anything happens.
  CHECK(errorCode(admin.call("policy.check", key(rev, "https://API.example"))) == -32602);
  CHECK(errorCode(admin.call("policy.check", key(rev, "https://api.example/path"))) == -32602);
  CHECK(errorCode(admin.call("policy.check", key(std::string(50, 'x')))) == -32602);
  // A refused target is never echoed (it may carry a password), but the form to write is named.
  auto withPassword = admin.call("policy.check", key(rev, "https://bot:hunter2@api.example"));
  CHECK(errorCode(withPassword) == -32602);
  CHECK(toolhost::protocol::writeJson(withPassword).find("hunter2") == std::string::npos);
  auto shorthand = admin.call("policy.check", key(rev, "https://127.1:8443"));
  CHECK(errorCode(shorthand) == -32602);
  CHECK(toolhost::protocol::writeJson(shorthand).find("write https://127.0.0.1:8443") !=
        std::string::npos);
  CHECK(errorCode(admin.call("policy.check",
                             key("sha256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"))) == -32001);
  // Only subscribers answer.
  auto stranger = admin.call(
      "policy.decide", json::object{{"promptId", "x-1"}, {"verdict", "allow"}, {"scope", "once"}});
  CHECK(errorCode(stranger) == -32002);
  CHECK(stranger.at("error").at("data").at("kind") == "not-subscribed");
}

TEST_CASE("a program approver answers each way and each scope, decisions across a restart",
          "[e2e][policy]") {
  auto daemon = DaemonProcess::start();
  Peer admin(daemon->socket());
  auto rev = install(admin, manifest("fetcher"));
  std::string stateDir = daemon->stateDir().string();
  {
    Approver approver(daemon->socket());

    // allow once: allowed, and the next request asks again.
    auto once = checkAnswered(admin, approver, key(rev), "allow", "once");
    CHECK(once.at("verdict") == "allow");
    CHECK(once.at("scope") == "once");
    CHECK(once.at("source") == "prompt");
    CHECK(once.at("promptMs").as_int64() >= 0);
    // deny once: denied, and the next request asks again.
    auto deniedOnce = checkAnswered(admin, approver, key(rev), "deny", "once");
    CHECK(deniedOnce.at("verdict") == "deny");
    CHECK(deniedOnce.at("source") == "prompt");
    // allow for the session: no prompt afterwards.
    CHECK(checkAnswered(admin, approver, key(rev), "allow", "session").at("verdict") == "allow");
    auto session = checkSilently(admin, approver, key(rev));
    CHECK(session.at("verdict") == "allow");
    CHECK(session.at("scope") == "session");
    CHECK(session.at("source") == "stored");
    // allow always (b.example read) and deny always (api.example write).
    CHECK(checkAnswered(admin, approver, key(rev, kOther), "allow", "always").at("verdict") ==
          "allow");
    CHECK(checkAnswered(admin, approver, key(rev, kApi, "write"), "deny", "always").at("verdict") ==
          "deny");
    CHECK(checkSilently(admin, approver, key(rev, kOther)).at("source") == "stored");
    auto deniedAlways = checkSilently(admin, approver, key(rev, kApi, "write"));
    CHECK(deniedAlways.at("verdict") == "deny");
    CHECK(deniedAlways.at("source") == "stored");
    // A popup the manifest requests, allowed once.
    CHECK(checkAnswered(admin, approver, key(rev, "custom-html", "read", "popup"), "allow", "once")
              .at("verdict") == "allow");
  }

  auto stopped = daemon->stop();
  INFO(daemon->log());
  REQUIRE(stopped == 0);
  DaemonOptions options;
  options.stateDir = stateDir;
  auto restarted = DaemonProcess::start(options);
  Peer admin2(restarted->socket());
  Approver approver(restarted->socket());
  // always decisions survived; the session one did not.
  auto allowed = checkSilently(admin2, approver, key(rev, kOther));
  CHECK(allowed.at("verdict") == "allow");
  CHECK(allowed.at("scope") == "always");
  CHECK(checkSilently(admin2, approver, key(rev, kApi, "write")).at("verdict") == "deny");
  CHECK(checkAnswered(admin2, approver, key(rev), "deny", "once").at("verdict") == "deny");

  auto listed = resultOf(admin2.call("policy.list", json::object{{"toolRevision", rev}}));
  CHECK(listed.at("decisions").as_array().size() == 2);
  CHECK(listed.at("approvers") == 1);
}

TEST_CASE("an unanswered prompt is denied at the timeout", "[e2e][policy]") {
  DaemonOptions options;
  options.configToml = "[policy]\nprompt_timeout_ms = 300\n";
  auto daemon = DaemonProcess::start(options);
  Peer admin(daemon->socket());
  auto rev = install(admin, manifest("fetcher"));
  Approver approver(daemon->socket());

  auto id = admin.nextId();
  auto started = Clock::now();
  admin.send("policy.check", key(rev), id);
  auto prompt = approver.prompt();
  CHECK(prompt.at("timeoutMs") == 300);
  CHECK(prompt.at("private") == false);
  auto timedOut = resultOf(admin.response(id));
  CHECK(Clock::now() - started >= std::chrono::milliseconds(300));
  CHECK(timedOut.at("verdict") == "deny");
  CHECK(timedOut.at("source") == "timeout");
  CHECK(timedOut.at("promptMs").as_int64() >= 300);
  auto resolved = approver.notification();
  CHECK(resolved.at("method") == "policy.resolved");
  CHECK(resolved.at("params").at("promptId") == prompt.at("promptId"));
  CHECK(resolved.at("params").at("resolution") == "timeout");
  // Too late: the prompt is gone, and nothing was stored.
  CHECK(errorCode(approver.decide(prompt, "allow", "always")) == -32001);
  CHECK(resultOf(admin.call("policy.list")).at("decisions").as_array().empty());
}

TEST_CASE("a new revision of the same tool needs its own approval", "[e2e][policy]") {
  auto daemon = DaemonProcess::start();
  Peer admin(daemon->socket());
  auto v1 = install(admin, manifest("fetcher", 1));
  auto v2 = install(admin, manifest("fetcher", 2));
  REQUIRE(v1 != v2);
  Approver approver(daemon->socket());
  CHECK(checkAnswered(admin, approver, key(v1), "allow", "always").at("verdict") == "allow");
  CHECK(checkSilently(admin, approver, key(v1)).at("source") == "stored");
  // Same tool, same origin, same class: v2 is asked about in its own right.
  auto v2Answer = checkAnswered(admin, approver, key(v2), "deny", "once");
  CHECK(v2Answer.at("verdict") == "deny");
  CHECK(v2Answer.at("source") == "prompt");
}

TEST_CASE("policy.set, list, revoke, reset and audit.tail", "[e2e][policy]") {
  auto daemon = DaemonProcess::start();
  Peer admin(daemon->socket());
  auto rev = install(admin, manifest("fetcher"));
  auto other = install(admin, manifest("other-tool"));
  Approver approver(daemon->socket());

  auto setParams = key(rev);
  setParams["verdict"] = "allow";
  setParams["scope"] = "always";
  auto set = resultOf(admin.call("policy.set", setParams));
  CHECK(set.at("requested") == true);
  CHECK_THAT(text(set.at("decidedBy")), Catch::StartsWith("admin uid"));
  auto decidedAhead = checkSilently(admin, approver, key(rev));
  CHECK(decidedAhead.at("verdict") == "allow");
  CHECK(decidedAhead.at("source") == "stored");

  auto sessionParams = key(other, kOther);
  sessionParams["verdict"] = "deny";
  sessionParams["scope"] = "session";
  resultOf(admin.call("policy.set", sessionParams));
  auto beyond = key(rev, "https://c.example");
  beyond["verdict"] = "allow";
  beyond["scope"] = "always";
  CHECK(resultOf(admin.call("policy.set", beyond)).at("requested") == false);
  // The ceiling still wins over a decision made ahead.
  CHECK(checkSilently(admin, approver, key(rev, "https://c.example")).at("source") ==
        "not-requested");

  // A value that holds U+0000 after an allowed one is not that value: refused, nothing stored.
  for (const char* field : {"access", "verdict", "scope", "action"}) {
    INFO(field);
    auto padded = setParams;
    padded[field] = std::string(padded.at(field).as_string()) + std::string(1, '\0') + "x";
    CHECK(errorCode(admin.call("policy.set", padded)) == -32602);
  }

  auto all = resultOf(admin.call("policy.list")).at("decisions").as_array();
  CHECK(all.size() == 3);
  auto mine = resultOf(admin.call("policy.list", json::object{{"toolRevision", rev}}));
  REQUIRE(mine.at("decisions").as_array().size() == 2);
  auto first = mine.at("decisions").as_array()[0].as_object();
  CHECK(first.at("toolRevision") == json::value(rev));
  CHECK(first.contains("decidedAt"));

  // Revoke: the next request asks again.
  CHECK(resultOf(admin.call("policy.revoke", key(rev))).at("revoked") == true);
  CHECK(resultOf(admin.call("policy.revoke", key(rev))).at("revoked") == false);
  // A target set may not name can still be revoked: one stored before the origin rules tightened.
  CHECK(resultOf(admin.call("policy.revoke", key(rev, "https://127.1"))).at("revoked") == false);
  CHECK(checkAnswered(admin, approver, key(rev), "deny", "once").at("verdict") == "deny");

  // Reset one revision, then everything.
  CHECK(resultOf(admin.call("policy.reset", json::object{{"toolRevision", rev}})).at("removed") ==
        1);
  CHECK(resultOf(admin.call("policy.list")).at("decisions").as_array().size() == 1);
  CHECK(resultOf(admin.call("policy.reset")).at("removed") == 1);
  CHECK(resultOf(admin.call("policy.list")).at("decisions").as_array().empty());

  // Refusals.
  auto unknown = key("sha256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
  unknown["verdict"] = "allow";
  unknown["scope"] = "always";
  CHECK(errorCode(admin.call("policy.set", unknown)) == -32001);
  auto once = key(rev);
  once["verdict"] = "allow";
  once["scope"] = "once";
  CHECK(errorCode(admin.call("policy.set", once)) == -32602);

  // The audit shows changes, decisions and denials, newest last, with the key and the verdict.
  auto entries =
      resultOf(admin.call("audit.tail", json::object{{"limit", 100}})).at("entries").as_array();
  REQUIRE(entries.size() >= 6);
  std::vector<std::string> kinds;
  for (const auto& entry : entries) kinds.push_back(text(entry.at("kind")));
  CHECK(kinds.front() == "change");
  auto decision = std::find(kinds.begin(), kinds.end(), "decision");
  REQUIRE(decision != kinds.end());
  const auto& answered = entries[static_cast<std::size_t>(decision - kinds.begin())].as_object();
  CHECK(answered.at("toolRevision") == json::value(rev));
  CHECK(answered.at("toolName") == "fetcher");
  CHECK(answered.at("action") == "fetch");
  CHECK(answered.at("target") == json::value(kApi));
  CHECK(answered.at("access") == "read");
  CHECK(answered.at("verdict") == "deny");
  CHECK(answered.at("scope") == "once");
  CHECK(answered.contains("time"));
  CHECK(answered.contains("durationMs"));
  CHECK(std::find(kinds.begin(), kinds.end(), "denial") != kinds.end());
  CHECK(entries.back().at("verdict") == "reset");
  auto sequence = entries.front().at("sequence").as_int64();
  for (const auto& entry : entries) CHECK(entry.at("sequence").as_int64() == sequence++);
  auto lastTwo =
      resultOf(admin.call("audit.tail", json::object{{"limit", 2}})).at("entries").as_array();
  REQUIRE(lastTwo.size() == 2);
  CHECK(lastTwo[1] == entries.back());
  auto ofOther = resultOf(admin.call("audit.tail", json::object{{"toolRevision", other}}))
                     .at("entries")
                     .as_array();
  REQUIRE(ofOther.size() == 1);
  CHECK(ofOther[0].at("verdict") == "deny");
  CHECK(ofOther[0].at("scope") == "session");
}

TEST_CASE("two approvers: the first answer wins and the other sees the prompt resolved",
          "[e2e][policy]") {
  auto daemon = DaemonProcess::start();
  Peer admin(daemon->socket());
  auto rev = install(admin, manifest("fetcher"));
  Approver first(daemon->socket());
  Approver second(daemon->socket());

  auto id = admin.nextId();
  admin.send("policy.check", key(rev), id);
  auto prompt = first.prompt();
  auto same = second.prompt();
  CHECK(same.at("promptId") == prompt.at("promptId"));
  CHECK(resultOf(second.decide(same, "allow", "session")).at("verdict") == "allow");
  auto answer = resultOf(admin.response(id));
  CHECK(answer.at("verdict") == "allow");
  CHECK(answer.at("scope") == "session");
  auto resolved = first.notification();
  CHECK(resolved.at("method") == "policy.resolved");
  CHECK(resolved.at("params").at("promptId") == prompt.at("promptId"));
  CHECK(resolved.at("params").at("resolution") == "decided");
  CHECK(resolved.at("params").at("verdict") == "allow");
  // The first approver's late answer finds nothing; the one who answered is not told again.
  CHECK(errorCode(first.decide(prompt, "deny", "always")) == -32001);
  second.expectNoNotification();
}

TEST_CASE("a cancelled request withdraws its prompt", "[e2e][policy]") {
  auto daemon = DaemonProcess::start();
  Peer admin(daemon->socket());
  auto rev = install(admin, manifest("fetcher"));
  Approver approver(daemon->socket());
  auto id = admin.nextId();
  admin.send("policy.check", key(rev), id);
  auto prompt = approver.prompt();
  auto cancelId = admin.nextId();
  admin.send("$/cancelRequest", json::object{{"id", id}}, cancelId);
  CHECK(resultOf(admin.response(cancelId)).at("cancelled") == true);
  CHECK(errorCode(admin.response(id)) == -32009);
  auto resolved = approver.notification();
  CHECK(resolved.at("method") == "policy.resolved");
  CHECK(resolved.at("params").at("promptId") == prompt.at("promptId"));
  CHECK(resolved.at("params").at("resolution") == "withdrawn");
  CHECK(errorCode(approver.decide(prompt, "allow", "always")) == -32001);
  CHECK(resultOf(admin.call("policy.list")).at("pending").as_array().empty());
}

TEST_CASE("an approver that disconnects is no longer asked", "[e2e][policy]") {
  auto daemon = DaemonProcess::start();
  Peer admin(daemon->socket());
  auto rev = install(admin, manifest("fetcher"));
  auto id = admin.nextId();
  {
    Approver approver(daemon->socket());
    CHECK(resultOf(admin.call("policy.list")).at("approvers") == 1);
    // A prompt pending when the last approver leaves is denied at once.
    admin.send("policy.check", key(rev), id);
    approver.prompt();
  }
  auto abandoned = resultOf(admin.response(id));
  CHECK(abandoned.at("verdict") == "deny");
  CHECK(abandoned.at("source") == "no-approver");
  CHECK(resultOf(admin.call("policy.list")).at("approvers") == 0);
  CHECK(resultOf(admin.call("policy.check", key(rev))).at("source") == "no-approver");
}

TEST_CASE("toolhostctl approve on a terminal: nothing typed before a request appears answers it",
          "[e2e][policy][cli]") {
  auto daemon = DaemonProcess::start();
  Peer admin(daemon->socket());
  auto rev = install(admin, manifest("fetcher"));
  ApproveProcess approve(daemon->socket(), true);
  approve.readUntil("Waiting for requests");

  // Two requests queue; "d" answers the first, and the "A" typed with it is dropped when the
  // second appears instead of allowing it always.
  auto first = admin.nextId();
  admin.send("policy.check", key(rev, kApi, "write"), first);
  approve.readUntil("[A] allow always");
  auto second = admin.nextId();
  admin.send("policy.check", key(rev), second);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  approve.write("d\nA\n");
  CHECK(resultOf(admin.response(first)).at("verdict") == "deny");
  // Dropped whether the second request had arrived yet or not.
  approve.readUntil("ignored");
  approve.readUntil("[A] allow always");
  // Typed the moment it appeared: not taken either.
  approve.write("A\n");
  approve.readUntil("(ignored: typed as request 2 appeared");
  CHECK(resultOf(admin.call("policy.list")).at("decisions").as_array().empty());
  // Read, then answered.
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  approve.write("d\n");
  CHECK(resultOf(admin.response(second)).at("verdict") == "deny");
  CHECK(resultOf(admin.call("policy.list")).at("decisions").as_array().empty());
}

TEST_CASE("toolhostctl prints what the daemon relays as escapes never as control characters",
          "[e2e][policy][cli]") {
  auto daemon = DaemonProcess::start();
  // The error's detail names the method the client sent: ESC, CR and a right-to-left override.
  auto run = runProgram({ctlBinary().string(), "--socket", daemon->socket().string(), "call",
                         "no.such\x1b[2J\rmethod\xe2\x80\xae"});
  CHECK(run.status == 1);
  CHECK(run.err.find('\x1b') == std::string::npos);
  CHECK(run.err.find('\r') == std::string::npos);
  CHECK(run.err.find("\xe2\x80\xae") == std::string::npos);
  CHECK_THAT(run.err, Catch::Contains("no.such\\x1b[2J\\x0dmethod\\u202e"));
}

TEST_CASE("toolhostctl approve answers a prompt read from stdin", "[e2e][policy][cli]") {
  auto daemon = DaemonProcess::start();
  Peer admin(daemon->socket());
  auto rev = install(admin, manifest("fetcher"));
  ApproveProcess approve(daemon->socket());
  approve.readUntil("Waiting for requests");

  auto id = admin.nextId();
  admin.send("policy.check", key(rev, kApi, "write"), id);
  auto shown = approve.readUntil("[A] allow always");
  CHECK_THAT(shown, Catch::Contains("\"fetcher\""));
  CHECK_THAT(shown, Catch::Contains(rev));
  CHECK_THAT(shown, Catch::Contains("send data to https://api.example"));
  CHECK_THAT(shown, Catch::Contains("access: write"));
  CHECK_THAT(shown, Catch::Contains("destination: public"));
  approve.write("maybe\n");  // not an answer: asked again
  approve.readUntil("[A] allow always");
  approve.write("A\n");
  auto answer = resultOf(admin.response(id));
  CHECK(answer.at("verdict") == "allow");
  CHECK(answer.at("scope") == "always");
  CHECK_THAT(text(answer.at("reason")), Catch::Contains("approver uid"));
  approve.readUntil("Allowed always.");
  // Stored: no second prompt.
  CHECK(resultOf(admin.call("policy.check", key(rev, kApi, "write"))).at("source") == "stored");

  // Deny once through the same process, then the end of input stops it.
  id = admin.nextId();
  admin.send("policy.check", key(rev), id);
  approve.readUntil("[A] allow always");
  approve.write("d\n");
  CHECK(resultOf(admin.response(id)).at("verdict") == "deny");
  approve.readUntil("Denied once.");
  approve.closeInput();
  CHECK(approve.wait() == 0);

  // The thin wrappers over policy.* and audit.tail.
  auto ctl = [&](std::vector<std::string> args) {
    std::vector<std::string> command{ctlBinary().string(), "--compact", "--socket",
                                     daemon->socket().string()};
    command.insert(command.end(), args.begin(), args.end());
    return runProgram(command);
  };
  auto set = ctl({"policy", "set", rev, "fetch", kOther, "read", "deny", "--scope", "session"});
  CHECK(set.status == 0);
  CHECK_THAT(set.out, Catch::Contains("\"scope\":\"session\""));
  auto list = ctl({"policy", "list", "--revision", rev});
  CHECK(list.status == 0);
  CHECK(toolhost::protocol::parseJson(list.out)->at("decisions").as_array().size() == 2);
  auto check = ctl({"policy", "check", rev, "fetch", kOther, "read"});
  CHECK(check.status == 0);
  CHECK_THAT(check.out, Catch::Contains("\"source\":\"stored\""));
  CHECK(ctl({"policy", "revoke", rev, "fetch", kOther, "read"}).status == 0);
  auto audit = ctl({"audit", "--limit", "3"});
  CHECK(audit.status == 0);
  CHECK(toolhost::protocol::parseJson(audit.out)->at("entries").as_array().size() == 3);
  CHECK(ctl({"policy", "reset"}).status == 0);
  CHECK(ctl({"policy", "set", rev, "fetch", kOther, "read", "maybe"}).status == 2);
  CHECK(ctl({"policy", "set", "not-a-revision", "fetch", kOther, "read", "allow"}).status == 1);
}
