// A blocking JSON-RPC client over the daemon's Unix socket, for toolhostctl. One thread.
#pragma once

#include <boost/json/value.hpp>
#include <boost/system/result.hpp>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace toolhost::cli {

// toolhostctl's exit codes, which scripts rely on.
inline constexpr int kExitResult = 0;    // a result (or, for approve and popup-host, a clean end)
inline constexpr int kExitRpcError = 1;  // a JSON-RPC error answered
inline constexpr int kExitUsage = 2;     // a bad command line
inline constexpr int kExitConnect = 3;   // the daemon could not be reached, or the connection broke

struct ClientError {
  enum class Kind { cannotConnect, connectionLost, timeout, badResponse };
  Kind kind;
  std::string detail;
};

class Client {
 public:
  static boost::system::result<Client, ClientError> connect(const std::filesystem::path& socket);
  Client(Client&& other) noexcept;
  Client& operator=(Client&&) = delete;
  ~Client();

  // Sends one request and waits for its response (the whole response object). Notifications
  // that arrive meanwhile go to `onNotification` if set.
  boost::system::result<boost::json::object, ClientError> call(
      const std::string& method, const boost::json::value& params,
      std::chrono::milliseconds timeout = std::chrono::milliseconds::max());

  // Waits for the next message of any kind. A zero timeout takes what has already arrived
  // without waiting (ClientError::Kind::timeout when nothing has).
  boost::system::result<boost::json::object, ClientError> receive(std::chrono::milliseconds timeout);

  // For callers that wait on several descriptors (toolhostctl approve): the socket to poll, and
  // whether a whole message is already buffered (so polling would not report it).
  int fd() const { return fd_; }
  bool hasBufferedMessage() const { return buffer_.find('\n') != std::string::npos; }

  std::function<void(const boost::json::object&)> onNotification;

 private:
  explicit Client(int fd) : fd_(fd) {}
  boost::system::result<void, ClientError> sendLine(const std::string& line);

  int fd_ = -1;
  std::string buffer_;
  std::int64_t nextId_ = 1;
};

// The words of a JSON-RPC error response for people: error.data.detail, else error.message.
std::string errorDetail(const boost::json::object& response);

// `text` safe to print on a terminal: control characters (C0, DEL, C1) and the bidirectional
// overrides that reorder what is shown are written as \xNN or \uNNNN, so text a tool or a
// remote server chose cannot move the cursor, erase a line or disguise itself in a prompt.
std::string terminalSafe(std::string_view text);
// The same for JSON text (compact or indented): DEL, C1 controls and those overrides (which JSON
// text holds only inside strings) become \u escapes, so the text stays JSON with the same
// meaning; its layout (newlines, spaces) is kept.
std::string terminalSafeJson(std::string_view jsonText);

// Calls `method` (a subscription: policy.subscribe, popup.subscribe) and answers its result
// object, or the exit code after saying on stderr why `role` could not be taken up.
boost::system::result<boost::json::object, int> subscribe(Client& client, const std::string& method,
                                                          std::string_view role);

}  // namespace toolhost::cli
