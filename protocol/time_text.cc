#include "protocol/time_text.h"

#include <cstdio>
#include <ctime>

namespace toolhost::protocol {

std::string formatTime(std::chrono::system_clock::time_point time) {
  using namespace std::chrono;
  // Floor, not truncation toward zero, so times before 1970 keep a valid millisecond field.
  const auto secs = floor<seconds>(time);
  const auto millis = duration_cast<milliseconds>(time - secs).count();
  const std::time_t t = system_clock::to_time_t(secs);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[48];
  std::size_t n = std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(text + n, sizeof text - n, ".%03dZ", static_cast<int>(millis));
  return text;
}

}  // namespace toolhost::protocol
