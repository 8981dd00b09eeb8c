#include "cli/popup_host.h"

#include "cli/client.h"
#include "protocol/json_parse.h"
#include "protocol/json_text.h"

#include <poll.h>
#include <unistd.h>
#include <boost/json/value.hpp>

#include <cerrno>
#include <cstdio>
#include <string>

namespace toolhost::cli {
namespace json = boost::json;

namespace {

constexpr int kExitDone = kExitResult;

void printLine(const json::object& message) {
  std::string line = protocol::writeJson(message) + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

void showNotification(const json::object& message) {
  const auto* method = message.if_contains("method");
  if (method != nullptr && method->is_string() && method->get_string().starts_with("popup.")) {
    printLine(message);
  }
}

// Sends one answer line; false when the connection is gone.
bool answer(Client& client, const std::string& line) {
  if (line.find_first_not_of(" \t\r") == std::string::npos) return true;
  auto params = protocol::parseJson(line);
  if (!params || !params->is_object()) {
    std::fprintf(stderr,
                 "toolhostctl: each line must be a JSON object {popupId, result} or {popupId, "
                 "error: {code?, message}}\n");
    return true;
  }
  auto response = client.call("popup.result", *params, std::chrono::seconds(30));
  if (!response) {
    std::fprintf(stderr, "toolhostctl: %s\n", response.error().detail.c_str());
    return false;
  }
  if (response->contains("error")) {
    std::fprintf(stderr, "toolhostctl: popup.result refused: %s\n", errorDetail(*response).c_str());
  }
  return true;
}

}  // namespace

int runPopupHost(const std::filesystem::path& socket) {
  auto connected = Client::connect(socket);
  if (!connected) {
    std::fprintf(stderr, "toolhostctl: %s\n", connected.error().detail.c_str());
    return kExitConnect;
  }
  Client& client = *connected;
  client.onNotification = showNotification;
  auto subscribed = subscribe(client, "popup.subscribe", "a popup host");
  if (!subscribed) return subscribed.error();
  // The first line says the host is ready: popup.subscribe's result.
  printLine(*subscribed);

  std::string input;
  for (;;) {
    // Answers already typed go first.
    for (auto newline = input.find('\n'); newline != std::string::npos;
         newline = input.find('\n')) {
      std::string line = input.substr(0, newline);
      input.erase(0, newline + 1);
      if (!answer(client, line)) return kExitConnect;
    }
    pollfd fds[2] = {{client.fd(), POLLIN, 0}, {STDIN_FILENO, POLLIN, 0}};
    const int ready = ::poll(fds, 2, client.hasBufferedMessage() ? 0 : -1);
    if (ready < 0) {
      if (errno == EINTR) continue;
      std::perror("toolhostctl: poll");
      return kExitConnect;
    }
    if (client.hasBufferedMessage() || (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      for (;;) {
        auto message = client.receive(std::chrono::milliseconds(0));
        if (!message) {
          if (message.error().kind == ClientError::Kind::timeout) break;
          std::fprintf(stderr, "toolhostctl: %s\n", message.error().detail.c_str());
          return kExitConnect;
        }
        showNotification(*message);
      }
    }
    if ((fds[1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      char chunk[65536];
      const ssize_t n = ::read(STDIN_FILENO, chunk, sizeof chunk);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        if (!input.empty() && !answer(client, input)) return kExitConnect;
        return kExitDone;
      }
      input.append(chunk, static_cast<std::size_t>(n));
    }
  }
}

}  // namespace toolhost::cli
