// The strict parser: exact doubles, duplicate keys, range, UTF-8, depth, and one text only.
#include "protocol/json_parse.h"

#include <boost/json.hpp>
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>

namespace json = boost::json;
using toolhost::protocol::jsonDepth;
using toolhost::protocol::JsonParseError;
using toolhost::protocol::parseJson;
using Kind = JsonParseError::Kind;

namespace {

// The input with every byte outside printable ASCII shown as \xHH, for failure messages.
std::string printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7F && byte != '\\') {
      out.push_back(c);
    } else {
      out += "\\x";
      out.push_back(kHex[byte >> 4]);
      out.push_back(kHex[byte & 0xF]);
    }
  }
  return out.size() <= 200 ? out : out.substr(0, 200) + "...";
}

json::value parsed(std::string_view text, std::size_t maxDepth = 128) {
  auto value = parseJson(text, {.maxDepth = maxDepth});
  INFO(printable(text));
  INFO("error: " << (value ? std::string() : value.error().detail));
  REQUIRE(value.has_value());
  return *value;
}

JsonParseError refused(std::string_view text, std::size_t maxDepth = 128) {
  auto value = parseJson(text, {.maxDepth = maxDepth});
  INFO(printable(text));
  REQUIRE_FALSE(value.has_value());
  return value.error();
}

std::uint64_t bitsOf(double number) { return std::bit_cast<std::uint64_t>(number); }

std::uint64_t parsedDoubleBits(std::string_view text) {
  const auto value = parsed(text);
  INFO(text);
  REQUIRE(value.is_double());
  return bitsOf(value.get_double());
}

std::string nested(std::size_t depth, bool objects = false) {
  std::string text;
  for (std::size_t i = 0; i < depth; ++i) text += objects ? "{\"k\":" : "[";
  text += "0";
  for (std::size_t i = 0; i < depth; ++i) text += objects ? "}" : "]";
  return text;
}

}  // namespace

TEST_CASE("doubles are converted exactly", "[json_parse]") {
  CHECK(parsedDoubleBits("333333333.33333329") == 0x41b3de4355555555);
  CHECK(parsedDoubleBits("2.2250738585072011e-308") == 0x000fffffffffffff);  // largest subnormal
  CHECK(parsedDoubleBits("2.2250738585072012e-308") == 0x0010000000000000);  // DBL_MIN
  CHECK(parsedDoubleBits("1.7976931348623157e308") == 0x7fefffffffffffff);
  CHECK(parsedDoubleBits("1.7976931348623158e308") == 0x7fefffffffffffff);
  CHECK(parsedDoubleBits("4.9e-324") == 0x0000000000000001);
  CHECK(parsedDoubleBits("2.4703282292062328e-324") == 0x0000000000000001);
  CHECK(parsedDoubleBits("-5e-324") == 0x8000000000000001);
  CHECK(parsedDoubleBits("0.1") == bitsOf(0.1));
  CHECK(parsed("9007199254740993.0").as_int64() == 9007199254740992);  // ties to even: 2^53
  CHECK(parsedDoubleBits("1424953923781206.25") == 0x43143ff3c1cb0959);
  CHECK(parsedDoubleBits("-0.5") == bitsOf(-0.5));
  CHECK(parsedDoubleBits("1e23") == 0x44b52d02c7e14af6);
  // Far more digits than a double holds: the decision sits in the last of them.
  CHECK(parsed("1.00000000000000011102230246251565404236316680908203125").as_int64() ==
        1);  // exactly halfway between 1 and its successor: ties to even, 1
  CHECK(parsedDoubleBits("1.00000000000000011102230246251565404236316680908203126") ==
        0x3ff0000000000001);
}

TEST_CASE("random doubles printed with %.17g round-trip exactly", "[json_parse]") {
  std::mt19937_64 random(7159);
  int checked = 0;
  for (int i = 0; i < 10000; ++i) {
    const double number = std::bit_cast<double>(random());
    if (!std::isfinite(number)) continue;
    char text[40];
    std::snprintf(text, sizeof text, "%.17g", number);
    const auto value = parsed(text);
    INFO(text);
    if (value.is_double()) {
      CHECK(bitsOf(value.get_double()) == bitsOf(number));
    } else {
      // An integral value printed without '.' or exponent arrives as an integer.
      CHECK(value.to_number<double>() == number);
    }
    ++checked;
  }
  CHECK(checked > 9900);
}

TEST_CASE("integers keep their Boost.JSON kinds", "[json_parse]") {
  CHECK(parsed("0").as_int64() == 0);
  CHECK(parsed("-0").as_int64() == 0);
  CHECK(parsed("-9223372036854775808").as_int64() == std::numeric_limits<std::int64_t>::min());
  CHECK(parsed("9223372036854775807").as_int64() == std::numeric_limits<std::int64_t>::max());
  CHECK(parsed("18446744073709551615").as_uint64() == std::numeric_limits<std::uint64_t>::max());
  CHECK(parsed("18446744073709551616").as_double() == 18446744073709551616.0);
  // Rounded to a double, -2^63: an integral number within int64, stored as one (see below).
  CHECK(parsed("-9223372036854775809").as_int64() == std::numeric_limits<std::int64_t>::min());
}

TEST_CASE("an integral number is an integer however it is written", "[json_parse]") {
  // As its hash (RFC 8785) and JavaScript take it: 2.0 and 2 are one number, and a schema's
  // "type": "integer" must say so for both.
  CHECK(parsed("2.0").as_int64() == 2);
  CHECK(parsed("2e0").as_int64() == 2);
  CHECK(parsed("-3.000").as_int64() == -3);
  CHECK(parsed("-0.0").as_int64() == 0);
  CHECK(parsed("1e18").as_int64() == 1000000000000000000);
  CHECK(parsed("9.2233720368547748e18").as_int64() == 9223372036854774784);
  // From 2^63 up, and every fraction, a double.
  CHECK(parsed("9.2233720368547758e18").is_double());
  CHECK(parsed("1e21").is_double());
  CHECK(parsed("2.5").is_double());
}

TEST_CASE("numbers beyond a double are refused, below one they become zero", "[json_parse]") {
  CHECK(refused("1e400").kind == Kind::numberOutOfRange);
  CHECK(refused("-1e400").kind == Kind::numberOutOfRange);
  CHECK(refused("[1, 1.8e308]").kind == Kind::numberOutOfRange);
  CHECK(refused("{\"a\": 1" + std::string(400, '0') + ".5}").kind == Kind::numberOutOfRange);
  // Overflow written with a negative exponent is still overflow (10^399).
  CHECK(refused("1" + std::string(400, '0') + "e-1").kind == Kind::numberOutOfRange);
  CHECK(refused("1e99999999999").kind == Kind::numberOutOfRange);

  // Zero, an integral number (see above).
  CHECK(parsed("1e-400").as_int64() == 0);
  CHECK(parsed("-1e-400").as_int64() == 0);
  CHECK(parsed("2e-324").as_int64() == 0);
  CHECK(parsed("0.0000000000000000000000000000000000000000000000000000000000000001e-300")
            .as_int64() == 0);
  // Underflow written without an exponent.
  CHECK(parsed("0." + std::string(400, '0') + "1").as_int64() == 0);
  CHECK(parsed("-0." + std::string(400, '0') + "1").as_int64() == 0);
  // Underflow written with a positive exponent.
  CHECK(parsed("0." + std::string(400, '0') + "1e5").as_int64() == 0);
}

TEST_CASE("duplicate keys are refused at any depth", "[json_parse]") {
  CHECK(refused(R"({"a":1,"a":2})").kind == Kind::duplicateKey);
  CHECK(refused(R"({"a":1,"b":2,"a":1})").kind == Kind::duplicateKey);
  CHECK(refused(R"({"x":{"a":1,"a":2}})").kind == Kind::duplicateKey);
  CHECK(refused(R"([1,[{"b":{"c":[{"d":0,"d":0}]}}]])").kind == Kind::duplicateKey);
  // Equal after unescaping.
  CHECK(refused(R"({"a":1,"\u0061":2})").kind == Kind::duplicateKey);
  CHECK(refused(R"({"\u00e9":1,"é":2})").kind == Kind::duplicateKey);
  CHECK(refused(R"({"":1,"":2})").kind == Kind::duplicateKey);
  // Long escaped keys reach the handler in parts.
  std::string longKey;
  for (int i = 0; i < 3000; ++i) longKey += "\\u0078";
  CHECK(refused("{\"" + longKey + "\":1,\"" + std::string(3000, 'x') + "\":2}").kind ==
        Kind::duplicateKey);
  CHECK(parsed("{\"" + longKey + "\":1,\"" + std::string(2999, 'x') + "\":2}").as_object().size() ==
        2);

  CHECK(refused(R"({"a":1,"a":2})").detail.find("\"a\"") != std::string::npos);
  // The repeated key's first value held objects of its own, which vanish with it: still refused,
  // and named.
  auto nested = refused(R"({"k":{"x":{"y":1},"z":[{"w":2}]},"m":0,"k":3})");
  CHECK(nested.kind == Kind::duplicateKey);
  CHECK(nested.detail.find("\"k\"") != std::string::npos);
  CHECK(refused(R"([{"a":{"b":1,"c":2}},{"d":{"e":{"f":1}},"d":{"e":{"f":1}}}])").kind ==
        Kind::duplicateKey);

  // The same key in different objects is fine.
  CHECK(parsed(R"({"a":{"a":{"a":1}}})").is_object());
  CHECK(parsed(R"([{"a":1},{"a":2}])").is_array());
  CHECK(parsed(R"({"a":1,"A":2,"a ":3})").as_object().size() == 3);
}

TEST_CASE("invalid UTF-8 is refused", "[json_parse]") {
  const char* const invalid[] = {
      "\xC0\x80",                  // overlong NUL
      "\xC1\xBF",                  // overlong
      "\xE0\x80\x80",              // overlong
      "\xE0\x9F\xBF",              // overlong
      "\xF0\x80\x80\x80",          // overlong
      "\xF0\x8F\xBF\xBF",          // overlong
      "\xED\xA0\x80",              // U+D800 encoded in UTF-8
      "\xED\xBF\xBF",              // U+DFFF encoded in UTF-8
      "\xED\xA0\xBD\xED\xB8\x80",  // a surrogate pair encoded as two 3-byte sequences (CESU-8)
      "\xF4\x90\x80\x80",          // above U+10FFFF
      "\xF5\x80\x80\x80",
      "\xC3",  // truncated
      "\xE2\x82",
      "\xF0\x9F\x98",
      "\xC3x",
      "\x80",  // lone continuation byte
      "\xBF",
      "\xFE",
      "\xFF",
  };
  for (const char* bytes : invalid) {
    INFO("bytes " << printable(bytes));
    CHECK(refused(std::string("\"") + bytes + "\"").kind == Kind::syntax);
    CHECK(refused(std::string("{\"") + bytes + "\":1}").kind == Kind::syntax);
    CHECK(refused(std::string("[\"ok\", \"a") + bytes + "b\"]").kind == Kind::syntax);
  }
  // Outside strings, any non-ASCII byte is a syntax error anyway; the message says which kind.
  CHECK(refused("\xEF\xBB\xBF{}").kind == Kind::syntax);  // byte order mark
  CHECK_THAT(refused("\xEF\xBB\xBF{}").detail, Catch::Contains("byte order mark"));
  CHECK_THAT(refused("{\"a\":\xC3\xA9}").detail, Catch::Contains("outside ASCII"));
  CHECK_THAT(refused("{\"a\":\xC2\xA0 1}").detail, Catch::Contains("outside ASCII"));
  CHECK_THAT(refused("{\"a\":\xC3}").detail, Catch::Contains("invalid UTF-8"));
  CHECK_THAT(refused("{\"a\":\xED\xA0\x80}").detail, Catch::Contains("invalid UTF-8"));

  // A surrogate escape without its other half: refused, and the message says why.
  CHECK_THAT(refused(R"({"a":"\ud800"})").detail, Catch::Contains("lone leading surrogate"));
  CHECK_THAT(refused(R"({"a":"x\uDBFFy"})").detail, Catch::Contains("lone leading surrogate"));
  CHECK_THAT(refused(R"(["\ud800\u0041"])").detail, Catch::Contains("trailing surrogate"));
  CHECK_THAT(refused(R"(["\udc00"])").detail, Catch::Contains("trailing surrogate"));
  // After an escaped backslash, "ud800" is text: a control character right after it is the
  // error, not a surrogate; after two escaped ones and a real escape, it is.
  CHECK_THAT(refused(std::string(R"(["\\ud800)") + "\x01\"]").detail,
             !Catch::Contains("surrogate"));
  CHECK_THAT(refused(R"(["\\\\\ud800"])").detail, Catch::Contains("lone leading surrogate"));
  CHECK(parsed(R"(["\ud83d\ude00"])").as_array()[0].as_string() == "\xF0\x9F\x98\x80");

  // The boundaries of every valid form.
  const char* const valid[] = {"\xC2\x80",         "\xDF\xBF",         "\xE0\xA0\x80",
                               "\xED\x9F\xBF",     "\xEE\x80\x80",     "\xEF\xBF\xBF",
                               "\xF0\x90\x80\x80", "\xF4\x8F\xBF\xBF", "\x7F"};
  for (const char* bytes : valid) {
    const auto value = parsed(std::string("\"") + bytes + "\"");
    CHECK(value.as_string() == bytes);
  }

  // Escapes must name whole characters too.
  CHECK(refused(R"("\ud800")").kind == Kind::syntax);
  CHECK(refused(R"("\udc00")").kind == Kind::syntax);
  CHECK(refused(R"("\ud800x")").kind == Kind::syntax);
  CHECK(refused(R"("\ude00\ud83d")").kind == Kind::syntax);
  CHECK(parsed(R"("\ud83d\ude00")").as_string() == "\xF0\x9F\x98\x80");
  CHECK(parsed(R"("\u0000")").as_string() == std::string_view("\0", 1));
}

TEST_CASE("more values than the limit are refused", "[json_parse]") {
  toolhost::protocol::JsonParseLimits limits;
  limits.maxValues = 4;  // the array and its three members
  CHECK(parseJson("[0,0,0]", limits).has_value());
  CHECK(parseJson(R"({"a":"x","b":null,"c":true})", limits).has_value());
  for (const char* text : {"[0,0,0,0]", "[[],[],[],[]]", R"({"a":1,"b":2.5,"c":"x","d":false})",
                           "[0,0,0,18446744073709551615]"}) {
    INFO(text);
    auto result = parseJson(text, limits);
    REQUIRE_FALSE(result.has_value());
    CHECK(result.error().kind == Kind::tooManyValues);
    CHECK(result.error().detail == "more than 4 JSON values");
  }
  // Unbounded by default.
  std::string many = "[0";
  for (int i = 1; i < 100000; ++i) many += ",0";
  many += "]";
  CHECK(parseJson(many).has_value());
}

TEST_CASE("nesting deeper than the limit is refused", "[json_parse]") {
  for (std::size_t limit : {1, 2, 5, 128}) {
    INFO("limit " << limit);
    CHECK(jsonDepth(parsed(nested(limit), limit)) == limit);
    CHECK(jsonDepth(parsed(nested(limit, true), limit)) == limit);
    CHECK(refused(nested(limit + 1), limit).kind == Kind::tooDeep);
    CHECK(refused(nested(limit + 1, true), limit).kind == Kind::tooDeep);
  }
  // The default limit is 128.
  CHECK(parseJson(nested(128)).has_value());
  CHECK(parseJson(nested(129)).error().kind == Kind::tooDeep);
  // Depth counts nesting, not the number of containers.
  CHECK(parsed("[[1],[2],{\"a\":1},[]]", 2).as_array().size() == 4);
  CHECK(refused("[[1],[[2]]]", 2).kind == Kind::tooDeep);
  CHECK(refused(R"({"a":{"b":[]}})", 2).kind == Kind::tooDeep);
  // A scalar has depth 0 and needs no nesting at all.
  CHECK(parsed("1", 0).as_int64() == 1);
  CHECK(refused("[]", 0).kind == Kind::tooDeep);
  // Deep inputs far past the limit fail fast instead of exhausting the stack.
  CHECK(refused(std::string(100000, '['), 128).kind == Kind::tooDeep);
}

TEST_CASE("jsonDepth counts containers", "[json_parse]") {
  CHECK(jsonDepth(parsed("1")) == 0);
  CHECK(jsonDepth(parsed("\"[[\"")) == 0);
  CHECK(jsonDepth(parsed("[]")) == 1);
  CHECK(jsonDepth(parsed("{}")) == 1);
  CHECK(jsonDepth(parsed(R"({"a":[[]],"b":1})")) == 3);
  CHECK(jsonDepth(parsed(R"([1,{"a":{"b":{}}},[]])")) == 4);
}

TEST_CASE("exactly one JSON text is accepted", "[json_parse]") {
  CHECK(parsed(" \t\r\n{\"a\":1} \t\r\n").is_object());
  CHECK(parsed("\"x\"").as_string() == "x");
  const char* const trailing[] = {"1 2",        "{}x",       "{} {}", "[1]]", "01",  "00",  "-01",
                                  "\"a\"\"b\"", "null null", "truex", "1,",   "{},", "[] ]"};
  for (const char* text : trailing) {
    const auto error = refused(text);
    CHECK(error.kind == Kind::syntax);
  }
  CHECK(refused(std::string("1\0", 2)).kind == Kind::syntax);
  CHECK(refused(std::string("{}\0", 3)).kind == Kind::syntax);
  CHECK(refused("1 2").detail.find("byte 2") != std::string::npos);
}

TEST_CASE("comments, trailing commas and other extensions are refused", "[json_parse]") {
  const char* const rejected[] = {"[1,]",      "{\"a\":1,}",
                                  "[1,,2]",    "[,1]",
                                  "/*c*/1",    "1 /*c*/",
                                  "// c\n1",   "1 // c",
                                  "[1 /*c*/]", "{\"a\" /*c*/ : 1}",
                                  "# c\n1",    "",
                                  "   ",       "NaN",
                                  "Infinity",  "-Infinity",
                                  "'a'",       "{'a':1}",
                                  "{a:1}",     "+1",
                                  ".5",        "1.",
                                  "1.e5",      "1e",
                                  "1e+",       "0x10",
                                  "-",         "tru",
                                  "nul",       "True",
                                  "\"a",       "\"\t\"",
                                  "\"\n\"",    "\"\\x41\"",
                                  "\"\\u12\"", "[1 2]",
                                  "{\"a\" 1}", "{\"a\":1 \"b\":2}",
                                  "{1:2}",     "\"\\\"",
                                  "\x01",      "[\"a\"]\x1F"};
  for (const char* text : rejected) {
    INFO(printable(text));
    CHECK(refused(text).kind == Kind::syntax);
  }
}
