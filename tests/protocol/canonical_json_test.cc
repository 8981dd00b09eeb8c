// RFC 8785 canonical JSON and the daemon's compact writer: the RFC's own examples, ECMAScript
// number layout, UTF-16 key order, minimal string escaping, error pointers, deep nesting.
#include "protocol/json_parse.h"
#include "protocol/json_text.h"

#include <boost/json.hpp>
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace json = boost::json;
using toolhost::protocol::canonicalJson;
using toolhost::protocol::formatNumber;
using toolhost::protocol::parseJson;
using toolhost::protocol::writeJson;

namespace {

json::value parsed(std::string_view text) {
  auto value = parseJson(text, {.maxDepth = 10000});
  INFO(text);
  REQUIRE(value.has_value());
  return *value;
}

std::string canonical(const json::value& value) {
  auto text = canonicalJson(value);
  REQUIRE(text.has_value());
  return *text;
}

std::string canonicalError(const json::value& value) {
  auto text = canonicalJson(value);
  REQUIRE_FALSE(text.has_value());
  return text.error().detail;
}

void appendUtf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

void appendUtf16(std::u16string& out, char32_t c) {
  if (c < 0x10000) {
    out.push_back(static_cast<char16_t>(c));
  } else {
    out.push_back(static_cast<char16_t>(0xD800 + ((c - 0x10000) >> 10)));
    out.push_back(static_cast<char16_t>(0xDC00 + ((c - 0x10000) & 0x3FF)));
  }
}

}  // namespace

TEST_CASE("formatNumber matches RFC 8785 Appendix B", "[canonical_json]") {
  const std::pair<std::uint64_t, const char*> table[] = {
      {0x0000000000000000, "0"},
      {0x8000000000000000, "0"},
      {0x0000000000000001, "5e-324"},
      {0x8000000000000001, "-5e-324"},
      {0x7fefffffffffffff, "1.7976931348623157e+308"},
      {0xffefffffffffffff, "-1.7976931348623157e+308"},
      {0x4340000000000000, "9007199254740992"},
      {0xc340000000000000, "-9007199254740992"},
      {0x4430000000000000, "295147905179352830000"},
      {0x44b52d02c7e14af5, "9.999999999999997e+22"},
      {0x44b52d02c7e14af6, "1e+23"},
      {0x44b52d02c7e14af7, "1.0000000000000001e+23"},
      {0x444b1ae4d6e2ef4e, "999999999999999700000"},
      {0x444b1ae4d6e2ef4f, "999999999999999900000"},
      {0x444b1ae4d6e2ef50, "1e+21"},
      {0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
      {0x3eb0c6f7a0b5ed8d, "0.000001"},
      {0x41b3de4355555553, "333333333.3333332"},
      {0x41b3de4355555554, "333333333.33333325"},
      {0x41b3de4355555555, "333333333.3333333"},
      {0x41b3de4355555556, "333333333.3333334"},
      {0x41b3de4355555557, "333333333.33333343"},
      {0xbecbf647612f3696, "-0.0000033333333333333333"},
      {0x43143ff3c1cb0959, "1424953923781206.2"},
  };
  for (const auto& [bits, expected] : table) {
    const double number = std::bit_cast<double>(bits);
    INFO("bits 0x" << std::hex << bits);
    CHECK(formatNumber(number) == expected);
    CHECK(canonical(json::value(number)) == expected);
    CHECK(writeJson(json::value(number)) == expected);
  }
}

TEST_CASE("formatNumber agrees with V8 on random and boundary doubles", "[canonical_json]") {
  // Generated once with node 20: String(new DataView(bits).getFloat64(0)) for boundary values
  // and pseudo-random bit patterns, half of them with exponents between 1e-11 and 1e25.
  const std::pair<std::uint64_t, const char*> table[] = {
      {0x444b1ae4d6e2ef50, "1e+21"},
      {0x444b1ae4d6e2ef4f, "999999999999999900000"},
      {0x444b1ae4d6e2ef50, "1e+21"},
      {0x3eb0c6f7a0b5ed8d, "0.000001"},
      {0x3e7ad7f29abcaf48, "1e-7"},
      {0x3e801b2b29a4692b, "1.2e-7"},
      {0x3ea0c6f7a0b5ed8d, "5e-7"},
      {0x3eb4b66dc015e19b, "0.00000123456789"},
      {0x4340000000000001, "9007199254740994"},
      {0x43b0000000000000, "1152921504606847000"},
      {0x43f0000000000000, "18446744073709552000"},
      {0x3fd3333333333334, "0.30000000000000004"},
      {0x3fd5555555555555, "0.3333333333333333"},
      {0xbfd5555555555555, "-0.3333333333333333"},
      {0x3fe5555555555555, "0.6666666666666666"},
      {0x400921fb54442d18, "3.141592653589793"},
      {0x4005bf0a8b145769, "2.718281828459045"},
      {0x00005c0ab9347ed7, "5e-310"},
      {0x0010000000000000, "2.2250738585072014e-308"},
      {0x7ea6f5522ab07104, "1.23e+302"},
      {0x4011666666666666, "4.35"},
      {0x3f201f31f46ed246, "0.000123"},
      {0x7e41eb2d66005835, "1.5e+300"},
      {0x4059000000000000, "100"},
      {0x430c6bf526340000, "1000000000000000"},
      {0x4341c37937e08000, "10000000000000000"},
      {0x4376345785d8a000, "100000000000000000"},
      {0x437b69b4ba630f35, "123456789012345680"},
      {0x1c0d57f10c894254, "1.4830122828920016e-173"},
      {0x43f04a6ece53d613, "18781959765316678000"},
      {0xe2b8410510668fa6, "-3.575532127436644e+167"},
      {0xd5f2e30a9e501b7d, "-1.0829258728928171e+106"},
      {0x535c8ea8a4e05948, "3.7230187291668613e+93"},
      {0x8f7b1bac9609eaf7, "-4.262874002980358e-234"},
      {0xcb3af636587957ba, "-2.5824242072052563e+54"},
      {0x6438f14dfe833301, "6.169062368256605e+174"},
      {0xd0af9825c659f77c, "-4.682717518917287e+80"},
      {0x302bd02b522a861b, "1.2009957333271821e-76"},
      {0xfd70522e931f790e, "-1.6677967842578716e+296"},
      {0xfba9a1630e23bac5, "-4.878446657335358e+287"},
      {0x29616ccb5e0010f0, "2.318589285015657e-109"},
      {0xd37bf421a1818b7f, "-1.4577297053362402e+94"},
      {0x7a5b1baa844c07a2, "2.4603368763737895e+281"},
      {0x552e421879d836c9, "2.1178316544328792e+102"},
      {0xa92e8eaf3493d9a4, "-2.5412503051231247e-110"},
      {0x5fe48bdeead11f23, "8.60880578948587e+153"},
      {0x618d3e487ffb5776, "8.222691106237041e+161"},
      {0x5cd158ba16a76b0d, "1.29107691235244e+139"},
      {0x07727df42b81c598, "8.54570675525937e-273"},
      {0x16e635e91fb5a507, "2.3213088696070116e-198"},
      {0x38c4ac26c846fc8a, "3.1104470921459883e-35"},
      {0x8ade8c37577c5b91, "-2.5430944865444634e-256"},
      {0xa7e5b8ad611588cc, "-1.722738704669676e-116"},
      {0x83785723e5c9c12b, "-6.097780315332402e-292"},
      {0xdab33022a4b9cade, "-8.312822724526027e+128"},
      {0x41b96ab112ea4c55, "426422546.91522723"},
      {0x4b0e14fa2fee1740, "3.601597095685222e+53"},
      {0x7402f3fb0a0a578f, "6.784931974924426e+250"},
      {0xf33082c146e3d672, "-7.215120195549942e+246"},
      {0x087799f31d30c159, "7.14794175889519e-268"},
      {0x0c996e223db1a4f4, "5.6829459783155954e-248"},
      {0xe7860860627a8c33, "-4.908348627938077e+190"},
      {0xc360b934d02e7346, "-37657888876108340"},
      {0x48a12d9e7a7f7e9d, "7.482161107104073e+41"},
      {0x42cb2a840d01a5e8, "59738836042571.81"},
      {0x43bed0278207c317, "2220318055723112200"},
      {0x4262df6d0cf0355a, "648463017857.6672"},
      {0x425adb8d2d7a8821, "461410448874.127"},
      {0xc50f5767c6aece1c, "-4.736182577913705e+24"},
      {0x43ffc827e2ada03b, "36641988240751178000"},
      {0x3f2254f4b8c0f0ae, "0.0001398609859978353"},
      {0x3e1ac880e5fe21e5, "1.5589884036240089e-9"},
      {0xbf4f347b2e2d1190, "-0.0009523011652637237"},
      {0x3e3b68d069da079f, "6.381755261071192e-9"},
      {0xc16685c1600db942, "-11808267.001675252"},
      {0x3ed560ba1422cfe9, "0.000005096874078503574"},
      {0xc48d7a22f547a444, "-1.7400206222318713e+22"},
      {0xc37202bd6b111d43, "-81112994386400300"},
      {0xbfad555532ece316, "-0.057291662661049056"},
      {0xbe1299e52381562d, "-1.0827295848268206e-9"},
      {0x43c74f28e314fa38, "3359212283614228500"},
      {0xc1bf6fac8cd14527, "-527412364.81746143"},
      {0x41e820df5d32022a, "3238460137.562764"},
      {0x3f52921fe2b6b8b1, "0.0011334716208284796"},
      {0x3f8c5add822ac76c, "0.013845186743626413"},
      {0x3ffacc1833b7234b, "1.6748277683384056"},
      {0x402b85a8b7c1ea7e, "13.761052839681039"},
      {0xc19f82f15b283b75, "-132168790.78928931"},
      {0x3fc233c74a11ffe0, "0.1422051536246718"},
      {0x3ebf621657e19baf, "0.0000018705817122156595"},
      {0xc1e5194fe726b012, "-2831843129.208993"},
      {0xc2dab32a9d076279, "-117427265609097.89"},
      {0xc38557b077fad794, "-192236478390792830"},
      {0xc47fb30ce895d253, "-9.356016144762914e+21"},
      {0xc3ab4a613b63a6e6, "-983245547501744900"},
      {0xc41e80074395f1bd, "-140656934721065800000"},
  };
  for (const auto& [bits, expected] : table) {
    INFO("bits 0x" << std::hex << bits);
    CHECK(formatNumber(std::bit_cast<double>(bits)) == expected);
  }
}

TEST_CASE("canonicalJson refuses NaN and the infinities", "[canonical_json]") {
  // Appendix B lists 0x7fffffffffffffff (NaN) and 0x7ff0000000000000 (Infinity) as errors.
  for (std::uint64_t bits : {0x7fffffffffffffffULL, 0x7ff0000000000000ULL, 0xfff0000000000000ULL,
                             0x7ff8000000000000ULL}) {
    INFO("bits 0x" << std::hex << bits);
    CHECK(canonicalError(json::value(std::bit_cast<double>(bits))) ==
          "non-finite number at the root");
  }
  CHECK(formatNumber(std::numeric_limits<double>::quiet_NaN()) == "NaN");
  CHECK(formatNumber(std::numeric_limits<double>::infinity()) == "Infinity");
  CHECK(formatNumber(-std::numeric_limits<double>::infinity()) == "-Infinity");
}

TEST_CASE("formatNumber lays digits out as ECMAScript Number::toString", "[canonical_json]") {
  const std::pair<double, const char*> cases[] = {
      {1, "1"},
      {-1, "-1"},
      {-0.0, "0"},
      {0.1, "0.1"},
      {-0.5, "-0.5"},
      {4.5, "4.5"},
      {0.002, "0.002"},
      {1e-27, "1e-27"},
      {1e30, "1e+30"},
      {1e20, "100000000000000000000"},
      {1.5e20, "150000000000000000000"},
      {1e21, "1e+21"},
      {1.5e21, "1.5e+21"},
      {123456789012345680000.0, "123456789012345680000"},
      {1e-6, "0.000001"},
      {1.5e-6, "0.0000015"},
      {1e-7, "1e-7"},
      {1.5e-7, "1.5e-7"},
      {-1.5e-7, "-1.5e-7"},
      {123e-20, "1.23e-18"},
      {1e300, "1e+300"},
      {1.2345e25, "1.2345e+25"},
      {9007199254740991.0, "9007199254740991"},
      {9007199254740994.0, "9007199254740994"},
      {12345.678, "12345.678"},
      {2.2250738585072014e-308, "2.2250738585072014e-308"},
      {0.30000000000000004, "0.30000000000000004"},
  };
  for (const auto& [number, expected] : cases) {
    INFO(expected);
    CHECK(formatNumber(number) == expected);
  }
}

TEST_CASE("formatNumber round-trips random doubles in the right layout", "[canonical_json]") {
  std::mt19937_64 random(20240611);
  for (int i = 0; i < 20000; ++i) {
    const double number = std::bit_cast<double>(random());
    if (!std::isfinite(number)) continue;
    const std::string text = formatNumber(number);
    INFO(text);
    double back = 0;
    auto result = std::from_chars(text.data(), text.data() + text.size(), back);
    REQUIRE(result.ec == std::errc{});
    REQUIRE(result.ptr == text.data() + text.size());
    CHECK(std::bit_cast<std::uint64_t>(back) ==
          std::bit_cast<std::uint64_t>(number == 0 ? 0.0 : number));
    const double magnitude = std::abs(number);
    const bool plain = magnitude == 0 || (magnitude >= 1e-6 && magnitude < 1e21);
    CHECK((text.find('e') == std::string::npos) == plain);
    CHECK(text.find('E') == std::string::npos);
    CHECK(text.find('+') == (magnitude >= 1e21 ? text.find('e') + 1 : std::string::npos));
  }
}

TEST_CASE("integers are written as a JavaScript reader would see them", "[canonical_json]") {
  CHECK(canonical(json::value(std::int64_t{0})) == "0");
  CHECK(canonical(json::value(std::int64_t{-42})) == "-42");
  CHECK(canonical(json::value(std::int64_t{9007199254740991})) == "9007199254740991");
  CHECK(canonical(json::value(std::int64_t{9007199254740992})) == "9007199254740992");
  CHECK(canonical(json::value(std::int64_t{9007199254740993})) == "9007199254740992");
  CHECK(canonical(json::value(std::int64_t{-9007199254740993})) == "-9007199254740992");
  CHECK(canonical(json::value(std::numeric_limits<std::int64_t>::min())) == "-9223372036854776000");
  CHECK(canonical(json::value(std::numeric_limits<std::int64_t>::max())) == "9223372036854776000");
  CHECK(canonical(json::value(std::uint64_t{7})) == "7");
  CHECK(canonical(json::value(std::uint64_t{9007199254740993})) == "9007199254740992");
  CHECK(canonical(json::value(std::numeric_limits<std::uint64_t>::max())) ==
        "18446744073709552000");
  CHECK(writeJson(json::value(std::int64_t{9007199254740993})) == "9007199254740992");
  CHECK(writeJson(json::value(std::numeric_limits<std::uint64_t>::max())) ==
        "18446744073709552000");
  // Parsed text takes the same path: the integer branch of Boost.JSON, then double rounding.
  CHECK(canonical(parsed("[9007199254740993, 1.0, 1e0, -0, 100, 1E2]")) ==
        "[9007199254740992,1,1,0,100,100]");
}

TEST_CASE("RFC 8785 section 3.2.2 example", "[canonical_json]") {
  const std::string input = R"({
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
})";
  const std::string expected =
      "{\"literals\":[null,true,false],\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],"
      "\"string\":\"\xE2\x82\xAC$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}";
  CHECK(canonical(parsed(input)) == expected);
}

TEST_CASE("RFC 8785 section 3.2.3 sorts keys by UTF-16 code units", "[canonical_json]") {
  const std::string input = R"({
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
})";
  const std::string expected =
      "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\xC2\x80\":\"Control\","
      "\"\xC3\xB6\":\"Latin Small Letter O With Diaeresis\",\"\xE2\x82\xAC\":\"Euro Sign\","
      "\"\xF0\x9F\x98\x80\":\"Emoji: Grinning Face\","
      "\"\xEF\xAC\xB3\":\"Hebrew Letter Dalet With Dagesh\"}";
  CHECK(canonical(parsed(input)) == expected);
}

TEST_CASE("the reference implementation's weird.json vector", "[canonical_json]") {
  // cyberphone/json-canonicalization testdata: "</script>" and U+007F stay raw.
  const std::string input = R"({
  "\u20ac": "Euro Sign",
  "1": "One",
  "\u0080": "Control\u007f",
  "\ud83d\ude02": "Smiley",
  "\u00f6": "Latin Small Letter O With Diaeresis",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "</script>": "Browser Challenge"
})";
  const std::string expected =
      "{\"1\":\"One\",\"</script>\":\"Browser Challenge\",\"\xC2\x80\":\"Control\x7F\","
      "\"\xC3\xB6\":\"Latin Small Letter O With Diaeresis\",\"\xE2\x82\xAC\":\"Euro Sign\","
      "\"\xF0\x9F\x98\x82\":\"Smiley\",\"\xEF\xAC\xB3\":\"Hebrew Letter Dalet With Dagesh\"}";
  CHECK(canonical(parsed(input)) == expected);
}

TEST_CASE("U+E000..U+FFFF sort after the supplementary planes", "[canonical_json]") {
  // Code point (and UTF-8 byte) order would put U+E000 and U+FFFF first.
  json::object object;
  object["\xEF\xBF\xBF"] = 1;      // U+FFFF
  object["\xEE\x80\x80"] = 2;      // U+E000
  object["\xF4\x8F\xBF\xBF"] = 3;  // U+10FFFF
  object["\xF0\x90\x80\x80"] = 4;  // U+10000
  object["\xED\x9F\xBF"] = 5;      // U+D7FF
  CHECK(canonical(object) ==
        "{\"\xED\x9F\xBF\":5,\"\xF0\x90\x80\x80\":4,\"\xF4\x8F\xBF\xBF\":3,"
        "\"\xEE\x80\x80\":2,\"\xEF\xBF\xBF\":1}");
}

TEST_CASE("key order agrees with UTF-16 order on random keys", "[canonical_json]") {
  std::mt19937 random(8785);
  // Ranges chosen to hit every UTF-8 length and both sides of the surrogate gap.
  const std::pair<char32_t, char32_t> ranges[] = {{0x20, 0x7E},       {0x80, 0x7FF},
                                                  {0x800, 0xD7FF},    {0xE000, 0xFFFF},
                                                  {0x10000, 0x1FFFF}, {0x100000, 0x10FFFF}};
  for (int round = 0; round < 200; ++round) {
    json::object object;
    std::vector<std::pair<std::u16string, std::string>> keys;
    for (int i = 0; i < 30; ++i) {
      std::string utf8;
      std::u16string utf16;
      const int length = 1 + static_cast<int>(random() % 3);
      for (int j = 0; j < length; ++j) {
        const auto& [low, high] = ranges[random() % std::size(ranges)];
        const char32_t c = low + static_cast<char32_t>(random() % (high - low + 1));
        appendUtf8(utf8, c);
        appendUtf16(utf16, c);
      }
      if (object.contains(utf8)) continue;
      object[utf8] = i;
      keys.emplace_back(utf16, utf8);
    }
    std::sort(keys.begin(), keys.end());
    const auto back = parsed(canonical(object)).as_object();
    REQUIRE(back.size() == keys.size());
    std::size_t index = 0;
    for (const auto& member : back) {
      CHECK(std::string(member.key()) == keys[index++].second);
    }
  }
}

TEST_CASE("strings are escaped minimally", "[canonical_json]") {
  for (int c = 0; c < 0x20; ++c) {
    std::string expected;
    switch (c) {
      case 0x08:
        expected = "\"\\b\"";
        break;
      case 0x09:
        expected = "\"\\t\"";
        break;
      case 0x0A:
        expected = "\"\\n\"";
        break;
      case 0x0C:
        expected = "\"\\f\"";
        break;
      case 0x0D:
        expected = "\"\\r\"";
        break;
      default: {
        static constexpr char kHex[] = "0123456789abcdef";
        expected = std::string("\"\\u00") + kHex[c >> 4] + kHex[c & 0xF] + "\"";
      }
    }
    const json::value value(json::string(1, static_cast<char>(c)));
    INFO("control character " << c);
    CHECK(canonical(value) == expected);
    CHECK(writeJson(value) == expected);
  }
  CHECK(canonical(json::value("\"")) == R"("\"")");
  CHECK(canonical(json::value("\\")) == R"("\\")");
  // Everything else is raw: '/', DEL, C1 controls, U+2028/U+2029, non-characters, emoji.
  const std::string raw =
      "/ \x7F \xC2\x80 \xC2\x9F \xE2\x80\xA8 \xE2\x80\xA9 \xEF\xBF\xBF \xF0\x9F\x98\x80 <>&'";
  CHECK(canonical(json::value(raw)) == "\"" + raw + "\"");
  CHECK(canonical(json::value("a\nb\"c\\d")) == R"("a\nb\"c\\d")");
  // A NUL inside the string is escaped, not a terminator.
  CHECK(canonical(json::value(json::string("a\0b", 3))) == R"("a\u0000b")");
  // Keys are escaped the same way.
  json::object object;
  object["\t/\x01"] = 1;
  CHECK(canonical(object) == "{\"\\t/\\u0001\":1}");
  CHECK(writeJson(object) == "{\"\\t/\\u0001\":1}");
}

TEST_CASE("canonicalJson refuses invalid UTF-8, writeJson replaces it", "[canonical_json]") {
  json::object object;
  object["ok"] = "fine";
  object["bad"] = json::array{1,
                              "a\xFF"
                              "b"};
  CHECK(canonicalError(object) == "invalid UTF-8 in string at /bad/1");
  CHECK(writeJson(object) ==
        "{\"ok\":\"fine\",\"bad\":[1,\"a\xEF\xBF\xBD"
        "b\"]}");

  json::object badKey;
  badKey["\xED\xA0\x80"] = 1;  // a UTF-16 surrogate encoded in UTF-8
  CHECK(canonicalError(badKey).starts_with("invalid UTF-8 in object key at /"));
  CHECK(writeJson(badKey) == "{\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\":1}");

  CHECK_FALSE(canonicalJson(json::value("\xC0\x80")).has_value());          // overlong
  CHECK_FALSE(canonicalJson(json::value("\xE2\x82")).has_value());          // truncated
  CHECK_FALSE(canonicalJson(json::value("\xF4\x90\x80\x80")).has_value());  // > U+10FFFF
  CHECK(writeJson(json::value("\xE2\x82")) == "\"\xEF\xBF\xBD\xEF\xBF\xBD\"");
}

TEST_CASE("canonicalJson names the JSON pointer of a non-finite number", "[canonical_json]") {
  const double inf = std::numeric_limits<double>::infinity();
  json::object limits;
  limits["cpuMs"] = 5;
  limits["wallMs"] = inf;
  json::object outer;
  outer["limits"] = limits;
  CHECK(canonicalError(outer) == "non-finite number at /limits/wallMs");

  json::object withArray;
  withArray["a/b~c"] = json::array{1, json::array{2, -inf}};
  CHECK(canonicalError(withArray) == "non-finite number at /a~1b~0c/1/1");

  // writeJson writes null, as JSON.stringify does.
  CHECK(writeJson(outer) == R"({"limits":{"cpuMs":5,"wallMs":null}})");
  CHECK(writeJson(json::value(std::numeric_limits<double>::quiet_NaN())) == "null");
}

TEST_CASE("writeJson keeps insertion order and writes nothing extra", "[canonical_json]") {
  const auto value =
      parsed(R"( { "z" : 1 , "a" : [ true , false , null , 1.50 , "x" ] , "m" : { } , "e": [] } )");
  CHECK(writeJson(value) == R"({"z":1,"a":[true,false,null,1.5,"x"],"m":{},"e":[]})");
  CHECK(canonical(value) == R"({"a":[true,false,null,1.5,"x"],"e":[],"m":{},"z":1})");
  CHECK(writeJson(json::value("\xE2\x80\xA8/")) == "\"\xE2\x80\xA8/\"");

  std::string framed = "prefix:";
  toolhost::protocol::appendJson(framed, value);
  CHECK(framed == "prefix:" + writeJson(value));
}

TEST_CASE("canonicalJson sorts nested objects and leaves arrays in order", "[canonical_json]") {
  const auto value =
      parsed(R"({"b":[{"z":1,"y":2},3,{"b":0,"a":0}],"a":{"d":{"f":1,"e":2},"c":3}})");
  CHECK(canonical(value) ==
        R"({"a":{"c":3,"d":{"e":2,"f":1}},"b":[{"y":2,"z":1},3,{"a":0,"b":0}]})");
  // Sorting is by code units, not by length or numeric value.
  CHECK(canonical(parsed(R"({"10":1,"9":2,"a":3,"B":4,"":5,"aa":6})")) ==
        R"({"":5,"10":1,"9":2,"B":4,"a":3,"aa":6})");
}

TEST_CASE("deeply nested values are written", "[canonical_json]") {
  for (int depth : {128, 1000, 3000}) {
    std::string text;
    for (int i = 0; i < depth; ++i) text += i % 2 == 0 ? "[" : "{\"k\":";
    text += "1";
    for (int i = depth - 1; i >= 0; --i) text += i % 2 == 0 ? "]" : "}";
    const auto value = parsed(text);
    INFO("depth " << depth);
    CHECK(canonical(value) == text);
    CHECK(writeJson(value) == text);
  }
}
