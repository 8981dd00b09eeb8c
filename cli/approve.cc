#include "cli/approve.h"

#include "cli/client.h"

#include <poll.h>
#include <termios.h>
#include <unistd.h>
#include <boost/json/value.hpp>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <deque>
#include <optional>
#include <string>
#include <string_view>

namespace toolhost::cli {
namespace json = boost::json;

namespace {

constexpr int kExitDone = kExitResult;
// On a terminal, input read this soon after a request appears is not taken as its answer: it was
// typed for what was on the screen before.
constexpr auto kSettleTime = std::chrono::milliseconds(500);

constexpr std::string_view kChoices =
    "Answer: [a] allow once  [s] allow for this session  [A] allow always  [d] deny once  "
    "[w] deny always";

struct Answer {
  const char* verdict;
  const char* scope;
  const char* words;
};

std::optional<Answer> parseAnswer(std::string_view line) {
  while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r')) {
    line.remove_suffix(1);
  }
  while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
  if (line == "a" || line == "allow" || line == "once")
    return Answer{"allow", "once", "Allowed once."};
  if (line == "s" || line == "session") {
    return Answer{"allow", "session", "Allowed until the daemon restarts."};
  }
  if (line == "A" || line == "always") return Answer{"allow", "always", "Allowed always."};
  if (line == "d" || line == "deny") return Answer{"deny", "once", "Denied once."};
  if (line == "w" || line == "never" || line == "deny-always") {
    return Answer{"deny", "always", "Denied always."};
  }
  return std::nullopt;
}

std::string text(const json::value* value) {
  return value != nullptr && value->is_string() ? std::string(value->get_string()) : "";
}

std::string member(const json::object& object, std::string_view name) {
  return text(object.if_contains(name));
}

// A member as it may be shown: what a tool's manifest, code or server chose is in the prompt.
std::string shown(const json::object& object, std::string_view name) {
  return terminalSafe(member(object, name));
}

void say(const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

class Approver {
 public:
  explicit Approver(Client& client) : client_(client) {}

  int run() {
    client_.onNotification = [this](const json::object& message) { handle(message); };
    auto subscribed = subscribe(client_, "policy.subscribe", "an approver");
    if (!subscribed) return subscribed.error();
    if (const auto* pending = subscribed->if_contains("pending"); pending && pending->is_array()) {
      for (const auto& prompt : pending->get_array()) {
        if (prompt.is_object()) queue(prompt.as_object());
      }
    }
    interactive_ = ::isatty(STDIN_FILENO) == 1;
    say(interactive_ ? "Waiting for requests to approve. End of input (Ctrl-D) or Ctrl-C stops.\n"
                     : "Waiting for requests to approve. Each input line answers the next "
                       "request; end of input stops once every line has answered one, Ctrl-C "
                       "at once.\n");

    for (;;) {
      if (!current_ && !queue_.empty()) {
        current_ = std::move(queue_.front());
        queue_.pop_front();
        show(*current_);
      }
      if (int code = takeInput(); code >= 0) return code;
      if (inputEnded_ && !hasLine()) return kExitDone;

      pollfd fds[2] = {{client_.fd(), POLLIN, 0}, {STDIN_FILENO, POLLIN, 0}};
      nfds_t count = inputEnded_ ? 1 : 2;
      int waitMs = client_.hasBufferedMessage() ? 0 : -1;
      int ready = ::poll(fds, count, waitMs);
      if (ready < 0) {
        if (errno == EINTR) continue;
        std::perror("toolhostctl: poll");
        return kExitConnect;
      }
      if (client_.hasBufferedMessage() || (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
        if (int code = drainSocket(); code >= 0) return code;
      }
      if (count == 2 && (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) readInput();
    }
  }

 private:
  // Messages that have already arrived; a code when the connection is gone, else -1.
  int drainSocket() {
    for (;;) {
      auto message = client_.receive(std::chrono::milliseconds(0));
      if (!message) {
        if (message.error().kind == ClientError::Kind::timeout) return -1;
        say("The daemon closed the connection.\n");
        std::fprintf(stderr, "toolhostctl: %s\n", message.error().detail.c_str());
        return kExitConnect;
      }
      handle(*message);
    }
  }

  void handle(const json::object& message) {
    auto method = member(message, "method");
    const auto* params = message.if_contains("params");
    if (params == nullptr || !params->is_object()) return;
    if (method == "policy.prompt") {
      queue(params->as_object());
    } else if (method == "policy.resolved") {
      resolved(params->as_object());
    }
  }

  void queue(const json::object& prompt) {
    auto id = member(prompt, "promptId");
    if (id.empty()) return;
    if (current_ && member(*current_, "promptId") == id) return;
    for (const auto& queued : queue_) {
      if (member(queued, "promptId") == id) return;
    }
    queue_.push_back(prompt);
  }

  void resolved(const json::object& params) {
    auto id = member(params, "promptId");
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (member(*it, "promptId") == id) {
        queue_.erase(it);
        return;
      }
    }
    if (!current_ || member(*current_, "promptId") != id) return;
    auto resolution = member(params, "resolution");
    std::string words;
    if (resolution == "decided") {
      words = "answered by another approver: " + shown(params, "verdict") + " " +
              shown(params, "scope");
    } else if (resolution == "timeout") {
      words = "nobody answered in time; denied";
    } else if (resolution == "withdrawn") {
      words = "the tool no longer waits for it";
    } else {
      words = shown(params, "reason");
    }
    say("\nRequest " + std::to_string(shownNumber_) + " is settled: " + words + ".\n");
    current_.reset();
  }

  void show(const json::object& prompt) {
    ++shownNumber_;
    std::string toolName, revision;
    if (const auto* tool = prompt.if_contains("tool"); tool && tool->is_object()) {
      toolName = shown(tool->as_object(), "name");
      revision = shown(tool->as_object(), "revision");
    }
    auto action = shown(prompt, "action");
    auto target = shown(prompt, "target");
    auto access = shown(prompt, "access");
    std::string what;
    if (action == "fetch") {
      what = "wants to " + std::string(access == "write" ? "send data to" : "read from") + " " +
             target;
    } else if (action == "popup") {
      what = target == "custom-html" ? "wants to open a window showing its own page"
                                     : "wants to open a window at " + target;
    } else if (action == "invoke") {
      what = "wants to call its service at " + target;
    } else {
      what = "wants to " + action + " " + target;
    }
    std::string out = "\nRequest " + std::to_string(shownNumber_) + ": tool \"" + toolName +
                      "\" (revision " + revision + ")\n  " + what + "\n";
    out += "  access: " + access +
           (access == "write" ? " (may change data: POST, PUT, DELETE, ...)"
                              : " (GET, HEAD or OPTIONS only)") +
           "\n";
    bool isPrivate = false;
    if (const auto* flag = prompt.if_contains("private"); flag && flag->is_bool()) {
      isPrivate = flag->get_bool();
    }
    if (isPrivate) {
      out += "  PRIVATE destination: " + shown(prompt, "privateRange") +
             " (a range the operator opened)\n";
    } else {
      out += "  destination: public\n";
    }
    if (auto detail = shown(prompt, "detail"); !detail.empty()) out += "  detail: " + detail + "\n";
    if (auto expires = shown(prompt, "expiresAt"); !expires.empty()) {
      out += "  denied unless answered by " + expires + "\n";
    }
    out += std::string(kChoices) + "\n> ";
    // On a terminal, nothing typed before this request was shown answers it: what was typed for
    // the one before (settled meanwhile by another approver, or typed ahead) is dropped, and so
    // is input that arrives in the first moments after it appears.
    if (interactive_) {
      ::tcflush(STDIN_FILENO, TCIFLUSH);
      if (!input_.empty()) {
        input_.clear();
        out = "(input typed before this request was shown is ignored)\n" + out;
      }
      shownAt_ = std::chrono::steady_clock::now();
    }
    say(out);
  }

  bool hasLine() const {
    return input_.find('\n') != std::string::npos || (inputEnded_ && !input_.empty());
  }

  void readInput() {
    char chunk[4096];
    ssize_t n = ::read(STDIN_FILENO, chunk, sizeof chunk);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
      inputEnded_ = true;
      return;
    }
    if (interactive_ && current_ && std::chrono::steady_clock::now() - shownAt_ < kSettleTime) {
      say("(ignored: typed as request " + std::to_string(shownNumber_) +
          " appeared; read it, then answer)\n> ");
      return;
    }
    input_.append(chunk, static_cast<std::size_t>(n));
  }

  // Applies the buffered lines; a code to exit with, else -1.
  int takeInput() {
    while (hasLine()) {
      auto newline = input_.find('\n');
      std::string line = input_.substr(0, newline);
      if (!current_) {
        // Typed while nothing was asked: on a terminal it answers nothing (an early keypress must
        // never approve a request not yet shown); from a pipe it waits for the next prompt.
        if (!interactive_) return -1;
        input_.erase(0, newline == std::string::npos ? input_.size() : newline + 1);
        if (!line.empty()) say("(no request is waiting; input ignored)\n");
        continue;
      }
      input_.erase(0, newline == std::string::npos ? input_.size() : newline + 1);
      auto answer = parseAnswer(line);
      if (!answer) {
        say(std::string(kChoices) + "\n> ");
        continue;
      }
      auto promptId = member(*current_, "promptId");
      auto response = client_.call(
          "policy.decide",
          json::object{
              {"promptId", promptId}, {"verdict", answer->verdict}, {"scope", answer->scope}},
          std::chrono::seconds(30));
      if (!response) {
        std::fprintf(stderr, "toolhostctl: %s\n", response.error().detail.c_str());
        return kExitConnect;
      }
      if (response->contains("error")) {
        say("Could not answer: " + errorDetail(*response) + "\n");
      } else {
        say(std::string(answer->words) + "\n");
      }
      current_.reset();
      return -1;  // show the next prompt before reading more
    }
    return -1;
  }

  Client& client_;
  std::deque<json::object> queue_;
  std::optional<json::object> current_;
  std::string input_;
  bool inputEnded_ = false;
  bool interactive_ = false;
  std::uint64_t shownNumber_ = 0;
  std::chrono::steady_clock::time_point shownAt_;
};

}  // namespace

int runApprove(const std::filesystem::path& socket) {
  auto client = Client::connect(socket);
  if (!client) {
    std::fprintf(stderr, "toolhostctl: %s\n", client.error().detail.c_str());
    return kExitConnect;
  }
  Approver approver(*client);
  return approver.run();
}

}  // namespace toolhost::cli
