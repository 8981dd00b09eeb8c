#include "daemon/logging.h"

#include "protocol/json_parse.h"
#include "protocol/time_text.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <ctime>

namespace toolhost::daemon {

namespace {

// One JSON object per line: {"time":"...","level":"info","thread":N,"msg":"..."}.
class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const std::string stamp = protocol::formatTime(msg.time);
    append(dest, R"({"time":")");
    append(dest, stamp);
    append(dest, R"(","level":")");
    auto level = spdlog::level::to_string_view(msg.level);
    dest.append(level.data(), level.data() + level.size());
    append(dest, R"(","thread":)");
    append(dest, std::to_string(msg.thread_id));
    append(dest, R"(,"msg":")");
    escape(dest, std::string_view(msg.payload.data(), msg.payload.size()));
    append(dest, "\"}\n");
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }

 private:
  static void append(spdlog::memory_buf_t& dest, std::string_view text) {
    dest.append(text.data(), text.data() + text.size());
  }
  // Also keeps the line valid JSON when the text is not valid UTF-8 (a sandbox process's output,
  // a line cut inside a character): each byte that starts no valid sequence becomes U+FFFD.
  static void escape(spdlog::memory_buf_t& dest, std::string_view text) {
    static constexpr char kHex[] = "0123456789abcdef";
    for (std::size_t i = 0; i < text.size();) {
      const char c = text[i];
      auto u = static_cast<unsigned char>(c);
      if (u >= 0x80) {
        const std::size_t length = protocol::utf8SequenceAt(text, i);
        if (length == 0) {
          append(dest, "\\ufffd");
          ++i;
        } else {
          dest.append(text.data() + i, text.data() + i + length);
          i += length;
        }
        continue;
      }
      if (c == '"' || c == '\\') {
        dest.push_back('\\');
        dest.push_back(c);
      } else if (u < 0x20) {
        char esc[6] = {'\\', 'u', '0', '0', kHex[u >> 4], kHex[u & 15]};
        dest.append(esc, esc + 6);
      } else {
        dest.push_back(c);
      }
      ++i;
    }
  }
};

// The text log's message (%v with its control characters escaped): a method name, a tool's
// name or any other text a client chose cannot start a line of its own, or move a terminal's
// cursor, in the log.
class EscapedPayload final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    static constexpr char kHex[] = "0123456789abcdef";
    for (char c : std::string_view(msg.payload.data(), msg.payload.size())) {
      auto u = static_cast<unsigned char>(c);
      if (c == '\n') {
        dest.append(std::string_view("\\n"));
      } else if (c == '\r') {
        dest.append(std::string_view("\\r"));
      } else if (c == '\t') {
        dest.append(std::string_view("\\t"));
      } else if (u < 0x20 || u == 0x7f) {
        char esc[4] = {'\\', 'x', kHex[u >> 4], kHex[u & 15]};
        dest.append(esc, esc + 4);
      } else {
        dest.push_back(c);
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<EscapedPayload>();
  }
};

}  // namespace

std::unique_ptr<spdlog::formatter> jsonLogFormatter() { return std::make_unique<JsonFormatter>(); }

void setupLogging(const std::string& level, LogFormat format) {
  bool json = format == LogFormat::json || (format == LogFormat::automatic && !isatty(STDERR_FILENO));
  std::shared_ptr<spdlog::logger> logger;
  if (json) {
    logger = spdlog::stderr_logger_mt("toolhost");
    logger->set_formatter(jsonLogFormatter());
  } else {
    logger = spdlog::stderr_color_mt("toolhost");
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<EscapedPayload>('*').set_pattern("%Y-%m-%d %H:%M:%S.%e %^%-5l%$ %*");
    logger->set_formatter(std::move(formatter));
  }
  spdlog::set_default_logger(logger);
  setLogLevel(level);
  spdlog::flush_on(spdlog::level::info);
}

void setLogLevel(const std::string& level) { spdlog::set_level(spdlog::level::from_str(level)); }

}  // namespace toolhost::daemon
