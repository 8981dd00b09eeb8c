// The JSON log's formatter: every line is one JSON object, whatever bytes the message holds.
#include "daemon/logging.h"
#include "protocol/json_parse.h"

#include <spdlog/details/log_msg.h>
#include <catch2/catch.hpp>

#include <string>
#include <string_view>

namespace {

std::string formatted(std::string_view text) {
  auto formatter = toolhost::daemon::jsonLogFormatter();
  spdlog::details::log_msg message("test", spdlog::level::warn,
                                   spdlog::string_view_t(text.data(), text.size()));
  spdlog::memory_buf_t out;
  formatter->format(message, out);
  return std::string(out.data(), out.size());
}

}  // namespace

TEST_CASE("the JSON log stays JSON whatever bytes a message holds", "[logging]") {
  const std::string cases[] = {
      "plain",
      "quote \" backslash \\ newline \n escape \x1b[2J",
      "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
      "\xff\xfe\xc3",                        // not UTF-8 at all, and a sequence cut short
      "\xc3\xa9" + std::string("\xe2\x82"),  // a character cut at its second byte
      "\xed\xa0\x80 \xc0\xaf",               // a surrogate, an overlong form
  };
  for (const auto& text : cases) {
    INFO(text);
    const std::string line = formatted(text);
    REQUIRE(!line.empty());
    CHECK(line.back() == '\n');
    auto parsed = toolhost::protocol::parseJson(std::string_view(line).substr(0, line.size() - 1));
    REQUIRE(parsed.has_value());
    CHECK(parsed->at("level") == "warning");
  }
  // Valid characters stay as they are; each byte that starts none becomes U+FFFD.
  auto message = [](std::string_view text) {
    const std::string line = formatted(text);
    return toolhost::protocol::parseJson(std::string_view(line).substr(0, line.size() - 1))
        ->at("msg");
  };
  CHECK(message("caf\xc3\xa9") == "caf\xc3\xa9");
  CHECK(message("a\xffz") == "a\xef\xbf\xbdz");
}
