#include "protocol/framing.h"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using toolhost::protocol::LineFramer;

namespace {

std::vector<std::string> drain(LineFramer& framer) {
  std::vector<std::string> lines;
  std::string_view line;
  while (framer.next(line) == LineFramer::Status::line) lines.emplace_back(line);
  return lines;
}

}  // namespace

TEST_CASE("lines are split on newline, CR stripped, blank lines skipped", "[framing]") {
  LineFramer framer(100);
  framer.append("one\ntwo\r\n\n   \nthree");
  CHECK(drain(framer) == std::vector<std::string>{"one", "two"});
  std::string_view line;
  CHECK(framer.next(line) == LineFramer::Status::needMore);
  framer.append("\n");
  CHECK(drain(framer) == std::vector<std::string>{"three"});
  CHECK(framer.buffered() == 0);
}

TEST_CASE("a line arriving one byte at a time", "[framing]") {
  LineFramer framer(100);
  std::string text = "{\"a\":1}\n{\"b\":2}\n";
  std::vector<std::string> lines;
  for (char c : text) {
    framer.append(std::string_view(&c, 1));
    for (auto& line : drain(framer)) lines.push_back(line);
  }
  CHECK(lines == std::vector<std::string>{"{\"a\":1}", "{\"b\":2}"});
}

TEST_CASE("prepare and commit receive in place", "[framing]") {
  LineFramer framer(100);
  auto space = framer.prepare(64);
  std::string text = "abc\nde";
  std::copy(text.begin(), text.end(), space.begin());
  framer.commit(text.size());
  CHECK(drain(framer) == std::vector<std::string>{"abc"});
  CHECK(framer.buffered() == 2);
}

TEST_CASE("a line over the limit is reported, complete or not", "[framing]") {
  SECTION("without its newline yet") {
    LineFramer framer(10);
    framer.append("12345678901");
    std::string_view line;
    CHECK(framer.next(line) == LineFramer::Status::tooLong);
  }
  SECTION("exactly at the limit is fine") {
    LineFramer framer(10);
    framer.append("1234567890\n");
    CHECK(drain(framer) == std::vector<std::string>{"1234567890"});
  }
  SECTION("a complete line over the limit after good ones") {
    LineFramer framer(10);
    framer.append("ok\n12345678901\n");
    std::string_view line;
    REQUIRE(framer.next(line) == LineFramer::Status::line);
    CHECK(line == "ok");
    CHECK(framer.next(line) == LineFramer::Status::tooLong);
  }
  SECTION("a line at the limit while unfinished is still waited for") {
    LineFramer framer(10);
    framer.append("1234567890");
    std::string_view line;
    CHECK(framer.next(line) == LineFramer::Status::needMore);
  }
  SECTION("a line at the limit ended by CRLF, its LF coming in a later read") {
    LineFramer framer(10);
    framer.append("1234567890\r");
    std::string_view line;
    CHECK(framer.next(line) == LineFramer::Status::needMore);
    framer.append("\n");
    CHECK(drain(framer) == std::vector<std::string>{"1234567890"});
  }
  SECTION("but not a byte more") {
    LineFramer framer(10);
    framer.append("12345678901\r");
    std::string_view line;
    CHECK(framer.next(line) == LineFramer::Status::tooLong);
  }
}

TEST_CASE("the buffer never grows beyond one line and one read", "[framing]") {
  LineFramer framer(1000);
  std::string chunk(999, 'x');
  chunk += '\n';
  for (int i = 0; i < 1000; ++i) {
    auto space = framer.prepare(chunk.size());
    std::copy(chunk.begin(), chunk.end(), space.begin());
    framer.commit(chunk.size());
    CHECK(drain(framer).size() == 1);
    CHECK(framer.buffered() == 0);
  }
}

TEST_CASE("peek leaves the line for next, skip drops it", "[framing]") {
  LineFramer framer(64);
  framer.append("\none\ntwo\nthr");
  std::string_view line;
  REQUIRE(framer.peek(line) == LineFramer::Status::line);
  CHECK(line == "one");
  REQUIRE(framer.peek(line) == LineFramer::Status::line);
  CHECK(line == "one");
  framer.skip();
  REQUIRE(framer.peek(line) == LineFramer::Status::line);
  CHECK(line == "two");
  REQUIRE(framer.next(line) == LineFramer::Status::line);
  CHECK(line == "two");
  CHECK(framer.peek(line) == LineFramer::Status::needMore);
  framer.append("ee\n");
  REQUIRE(framer.next(line) == LineFramer::Status::line);
  CHECK(line == "three");
  CHECK(framer.peek(line) == LineFramer::Status::needMore);
  CHECK(framer.buffered() == 0);
  // A line past the limit is reported by peek and by next alike.
  framer.append(std::string(100, 'x') + "\n");
  CHECK(framer.peek(line) == LineFramer::Status::tooLong);
  CHECK(framer.next(line) == LineFramer::Status::tooLong);
}

TEST_CASE("a buffer grown for a long line is given back once it is consumed", "[framing]") {
  LineFramer framer(8 * 1024 * 1024);
  const std::string big(4 * 1024 * 1024, 'x');
  framer.append(big);
  framer.append("\nshort");
  CHECK(framer.capacity() >= big.size());
  std::string_view line;
  REQUIRE(framer.next(line) == LineFramer::Status::line);
  CHECK(line.size() == big.size());
  // "short", the start of the next line, moves to a small buffer.
  CHECK(framer.next(line) == LineFramer::Status::needMore);
  CHECK(framer.capacity() <= 128 * 1024);
  CHECK(framer.buffered() == 5);
  framer.append("\n");
  REQUIRE(framer.next(line) == LineFramer::Status::line);
  CHECK(line == "short");
  CHECK(framer.next(line) == LineFramer::Status::needMore);
  CHECK(framer.capacity() <= 128 * 1024);
  // Small reads keep their buffer.
  auto space = framer.prepare(64 * 1024);
  framer.commit(0);
  CHECK(space.size() == 64 * 1024);
  CHECK(framer.next(line) == LineFramer::Status::needMore);
  CHECK(framer.capacity() <= 128 * 1024);
  framer.append("again\n");
  REQUIRE(framer.next(line) == LineFramer::Status::line);
  CHECK(line == "again");
}
