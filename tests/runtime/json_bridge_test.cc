// The walker's byte count is the exact size of the text protocol::writeJson produces.
#include "runtime/json_bridge.h"
#include "protocol/json_text.h"

#include <catch2/catch.hpp>

#include <boost/json/parse.hpp>

namespace json = boost::json;

TEST_CASE("jsonTextSize matches writeJson exactly", "[json]") {
  const char* texts[] = {
      "null",
      "true",
      "false",
      "0",
      "-1",
      "9007199254740993",
      "1.5",
      "1e+21",
      "5e-324",
      R"("")",
      R"("a\"b\\c\n\t\u0001\u001f é 😀")",
      "[]",
      "{}",
      "[1,[2,[3,{}]]]",
      R"({"a":1,"b":[true,null,"x"],"c\n":{"d":-0.5}})",
      "18446744073709551615",
  };
  for (const char* text : texts) {
    auto value = json::parse(text);
    INFO(text);
    CHECK(toolhost::runtime::jsonTextSize(value) == toolhost::protocol::writeJson(value).size());
  }
}
