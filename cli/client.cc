#include "cli/client.h"

#include "protocol/json_parse.h"
#include "protocol/jsonrpc.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace toolhost::cli {
namespace json = boost::json;
using Clock = std::chrono::steady_clock;

boost::system::result<Client, ClientError> Client::connect(const std::filesystem::path& socket) {
  if (socket.native().size() >= sizeof(sockaddr_un::sun_path)) {
    return ClientError{ClientError::Kind::cannotConnect,
                       "socket path " + socket.string() + " is too long for a Unix socket"};
  }
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ClientError{ClientError::Kind::cannotConnect, std::strerror(errno)};
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, socket.c_str(), socket.native().size());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    int error = errno;
    ::close(fd);
    std::string hint = error == ENOENT || error == ECONNREFUSED
                           ? " (is toolhostd running? --socket or TOOLHOST_SOCKET names another path)"
                           : "";
    return ClientError{ClientError::Kind::cannotConnect,
                       "cannot connect to " + socket.string() + ": " + std::strerror(error) + hint};
  }
  return Client(fd);
}

Client::Client(Client&& other) noexcept
    : onNotification(std::move(other.onNotification)),
      fd_(std::exchange(other.fd_, -1)),
      buffer_(std::move(other.buffer_)),
      nextId_(other.nextId_) {}

Client::~Client() {
  if (fd_ >= 0) ::close(fd_);
}

boost::system::result<void, ClientError> Client::sendLine(const std::string& line) {
  std::size_t sent = 0;
  while (sent < line.size()) {
    ssize_t n = ::send(fd_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return ClientError{ClientError::Kind::connectionLost,
                         std::string("the daemon closed the connection: ") + std::strerror(errno)};
    }
    sent += static_cast<std::size_t>(n);
  }
  return {};
}

boost::system::result<json::object, ClientError> Client::receive(std::chrono::milliseconds timeout) {
  auto deadline = timeout == std::chrono::milliseconds::max() ? Clock::time_point::max()
                                                              : Clock::now() + timeout;
  for (;;) {
    auto newline = buffer_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      auto parsed = protocol::parseJson(line, protocol::JsonParseLimits{100000});
      if (!parsed || !parsed->is_object()) {
        return ClientError{ClientError::Kind::badResponse,
                           "the daemon sent something that is not "
                           "a JSON object: " +
                               terminalSafe(line.substr(0, 200))};
      }
      return parsed->as_object();
    }
    int waitMs = -1;
    if (deadline != Clock::time_point::max()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      // Past the deadline: one look at what has already arrived, without waiting.
      waitMs = static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, 1 << 30));
    }
    pollfd descriptor{fd_, POLLIN, 0};
    int ready = ::poll(&descriptor, 1, waitMs);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) return ClientError{ClientError::Kind::timeout, "no answer in time"};
    char chunk[65536];
    ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return ClientError{ClientError::Kind::connectionLost, "the daemon closed the connection"};
    }
    buffer_.append(chunk, static_cast<std::size_t>(n));
  }
}

boost::system::result<json::object, ClientError> Client::call(const std::string& method,
                                                               const json::value& params,
                                                               std::chrono::milliseconds timeout) {
  std::int64_t id = nextId_++;
  json::object request{{"jsonrpc", "2.0"}, {"id", id}, {"method", method}};
  if (!params.is_null()) request["params"] = params;
  if (auto sent = sendLine(protocol::encodeLine(request)); !sent) {
    // A refused peer is told why before the daemon closes; that message beats "broken pipe".
    auto farewell = receive(std::chrono::milliseconds(500));
    if (farewell && farewell->contains("error")) return *farewell;
    return sent.error();
  }
  for (;;) {
    auto message = receive(timeout);
    if (!message) return message.error();
    const auto* responseId = message->if_contains("id");
    if (responseId == nullptr) {
      if (onNotification) onNotification(*message);
      continue;
    }
    // A refusal before any request (peer not allowed) arrives with id null.
    if (responseId->is_null() && message->contains("error")) return *message;
    if (responseId->is_int64() && responseId->get_int64() == id) return *message;
  }
}

namespace {

// terminalSafe, writing C0 controls and DEL as \xNN; or (`json`) for JSON text, DEL as \u007f
// and C0 controls as they are: in JSON text they are only its layout (strings hold them escaped).
std::string escapeForTerminal(std::string_view text, bool json) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (json && byte < 0x20) {
      out += text[i];
      continue;
    }
    if (byte < 0x20 || byte == 0x7f) {
      out += json ? "\\u00" : "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
      continue;
    }
    // U+0080..U+009F (C1 controls) and U+202A..U+202E, U+2066..U+2069 (bidirectional
    // embeddings, overrides and isolates), in UTF-8.
    std::optional<unsigned> code;
    if (byte == 0xC2 && i + 1 < text.size()) {
      const auto next = static_cast<unsigned char>(text[i + 1]);
      if (next >= 0x80 && next <= 0x9F) code = next;
    } else if (byte == 0xE2 && i + 2 < text.size()) {
      const auto b1 = static_cast<unsigned char>(text[i + 1]);
      const auto b2 = static_cast<unsigned char>(text[i + 2]);
      const unsigned point = 0x2000u + ((b1 & 0x3Fu) << 6) + (b2 & 0x3Fu);
      if ((b1 == 0x80 && b2 >= 0xAA && b2 <= 0xAE) || (b1 == 0x81 && b2 >= 0xA6 && b2 <= 0xA9)) {
        code = point;
      }
    }
    if (code) {
      out += "\\u";
      for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(*code >> shift) & 15];
      i += *code < 0x100 ? 1 : 2;
      continue;
    }
    out += text[i];
  }
  return out;
}

}  // namespace

std::string terminalSafe(std::string_view text) { return escapeForTerminal(text, false); }

std::string terminalSafeJson(std::string_view jsonText) {
  return escapeForTerminal(jsonText, true);
}

std::string errorDetail(const boost::json::object& response) {
  const auto* error = response.if_contains("error");
  if (error == nullptr || !error->is_object()) return "unknown error";
  const auto& object = error->as_object();
  if (const auto* data = object.if_contains("data"); data && data->is_object()) {
    if (const auto* detail = data->as_object().if_contains("detail");
        detail && detail->is_string() && !detail->get_string().empty()) {
      return terminalSafe(detail->get_string());
    }
  }
  if (const auto* message = object.if_contains("message"); message && message->is_string()) {
    return terminalSafe(message->get_string());
  }
  return "unknown error";
}

boost::system::result<boost::json::object, int> subscribe(Client& client, const std::string& method,
                                                          std::string_view role) {
  auto subscribed = client.call(method, boost::json::object{});
  if (!subscribed) {
    std::fprintf(stderr, "toolhostctl: %s\n", subscribed.error().detail.c_str());
    return {boost::system::in_place_error, kExitConnect};
  }
  if (subscribed->contains("error")) {
    std::fprintf(stderr, "toolhostctl: cannot become %.*s: %s\n", static_cast<int>(role.size()),
                 role.data(), errorDetail(*subscribed).c_str());
    return {boost::system::in_place_error, kExitRpcError};
  }
  const auto* result = subscribed->if_contains("result");
  if (result != nullptr && result->is_object()) return result->as_object();
  return boost::json::object{};
}

}  // namespace toolhost::cli
