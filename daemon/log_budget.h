// How many log lines one source (a connection, the listening socket) may write: a client that
// sends failing requests, or connects to be refused, in bulk must not fill the operator's disk
// through the daemon's log. Also the shortening of client-chosen text that goes into a line.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

namespace toolhost::daemon {

class LogBudget {
 public:
  using Clock = std::chrono::steady_clock;

  // `perSecond` lines on average, `burst` at once.
  explicit LogBudget(double perSecond = 20, double burst = 200);

  // Whether a line may be written now. When lines were held back since the last one allowed,
  // the returned note says how many ("" otherwise), for the end of that line. Any thread.
  bool allow(std::string& note);
  bool allow(std::string& note, Clock::time_point now);  // for tests
  // The lines held back since the last one allowed, which no later line will now report (its
  // source has ended); the count starts again from zero. Any thread.
  std::uint64_t takeWithheld();

 private:
  std::mutex mutex_;
  const double perSecond_;
  const double burst_;
  double tokens_;
  Clock::time_point refilled_;
  std::uint64_t withheld_ = 0;
};

// For a line a client caused: within its connection's budget and the daemon-wide one for
// every client's lines (so that many connections, or reconnecting, cannot get around it).
bool allowClientLine(LogBudget& connection, std::string& note);
// Within the daemon-wide budget only (a line once per connection, a refused connection).
bool allowClientLine(std::string& note);

// `text` as a log line may carry it: at most `max` bytes (cut at a UTF-8 boundary), with the
// length it had when longer.
std::string logText(std::string_view text, std::size_t max = 200);

}  // namespace toolhost::daemon
