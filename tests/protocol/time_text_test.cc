#include "protocol/time_text.h"

#include <catch2/catch.hpp>

#include <chrono>

using toolhost::protocol::formatTime;
using namespace std::chrono;

TEST_CASE("times are RFC 3339 in UTC with milliseconds", "[time_text]") {
  const system_clock::time_point epoch{};
  CHECK(formatTime(epoch) == "1970-01-01T00:00:00.000Z");
  CHECK(formatTime(epoch + milliseconds(1'796'054'655'123)) == "2026-11-30T16:04:15.123Z");
  // Microseconds are cut, not rounded: the text never runs ahead of the time.
  CHECK(formatTime(epoch + microseconds(1'999'999)) == "1970-01-01T00:00:01.999Z");
  // Before the epoch the millisecond field stays between 000 and 999.
  CHECK(formatTime(epoch - milliseconds(1)) == "1969-12-31T23:59:59.999Z");
  // A leap day.
  CHECK(formatTime(epoch + seconds(951'782'400)) == "2000-02-29T00:00:00.000Z");
}
