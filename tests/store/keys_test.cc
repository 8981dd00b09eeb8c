#include "store/keys.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

using namespace std::string_literals;
using namespace toolhost::store;

TEST_CASE("u64Key is 8 bytes big-endian and round-trips") {
  CHECK(u64Key(0) == std::string(8, '\0'));
  CHECK(u64Key(0x0102030405060708ULL) == "\x01\x02\x03\x04\x05\x06\x07\x08"s);
  for (std::uint64_t v : {0ULL, 1ULL, 255ULL, 256ULL, 0x8000000000000000ULL, ~0ULL}) {
    CHECK(tryParseU64Key(u64Key(v)) == v);
  }
  CHECK_FALSE(tryParseU64Key("short").has_value());
  CHECK_FALSE(tryParseU64Key("ninebytes").has_value());
}

TEST_CASE("u64Key byte order is numeric order") {
  std::vector<std::uint64_t> values = {70000, 1, 256, 255, 0, 1ULL << 40, 65536, ~0ULL, 2};
  std::vector<std::string> keys;
  for (auto v : values) keys.push_back(u64Key(v));
  std::sort(keys.begin(), keys.end(),
            [](const std::string& a, const std::string& b) { return compareKeys(a, b) < 0; });
  std::sort(values.begin(), values.end());
  for (std::size_t i = 0; i < values.size(); ++i) CHECK(tryParseU64Key(keys[i]) == values[i]);
}

TEST_CASE("compareKeys compares bytes as unsigned, shorter first") {
  CHECK(compareKeys("a", "b") < 0);
  CHECK(compareKeys("a", "ab") < 0);
  CHECK(compareKeys("", "a") < 0);
  CHECK(compareKeys("\x7f"s, "\x80"s) < 0);
  CHECK(compareKeys("\xff"s, "\x01"s) > 0);
  CHECK(compareKeys("same", "same") == 0);
}

TEST_CASE("compositeKey joins with NUL and keeps one name's keys together") {
  CHECK(compositeKey({"name", "rev"}) == "name\0rev"s);
  CHECK(compositeKey({"solo"}) == "solo");
  CHECK(compositePrefix({"name"}) == "name\0"s);
  // Every key of "a" sorts before any key of "ab".
  CHECK(compareKeys(compositeKey({"a", "\xff\xff"s}), compositeKey({"ab", ""})) < 0);
  // The last part may be binary.
  const std::string withId = compositeKey({"tool", u64Key(7)});
  auto parts = trySplitCompositeKey(withId, 2);
  REQUIRE(parts.has_value());
  CHECK((*parts)[0] == "tool");
  CHECK(tryParseU64Key((*parts)[1]) == 7U);
  CHECK_THROWS_AS(compositeKey({"bad\0name"s, "x"}), std::invalid_argument);
  CHECK_THROWS_AS(compositePrefix({"x", "bad\0"s}), std::invalid_argument);
}

TEST_CASE("trySplitCompositeKey needs enough separators") {
  CHECK_FALSE(trySplitCompositeKey("nosep", 2).has_value());
  CHECK_FALSE(trySplitCompositeKey("a", 0).has_value());
  const std::string key = "a\0b\0c\0d"s;  // the parts point into it
  auto three = trySplitCompositeKey(key, 3);
  REQUIRE(three.has_value());
  REQUIRE(three->size() == 3);
  CHECK((*three)[2] == "c\0d"s);
}

TEST_CASE("prefixEnd is the first key after every key with the prefix") {
  CHECK(prefixEnd("abc") == "abd");
  CHECK(prefixEnd("a\xff"s) == "b");
  CHECK(prefixEnd("a\xff\xff"s) == "b");
  CHECK_FALSE(prefixEnd("\xff\xff"s).has_value());
  CHECK_FALSE(prefixEnd("").has_value());
}

TEST_CASE("KeyRange bounds are half-open") {
  const KeyRange p = KeyRange::prefix("ab");
  CHECK(p.contains("ab"));
  CHECK(p.contains("ab\xff\xff"s));
  CHECK_FALSE(p.contains("ac"));
  CHECK_FALSE(p.contains("aa\xff"s));
  const KeyRange b = KeyRange::between("b", "d");
  CHECK(b.contains("b"));
  CHECK(b.contains("czz"));
  CHECK_FALSE(b.contains("d"));
  CHECK(KeyRange::all().contains(""));
  CHECK(KeyRange::startingAt("m").contains("\xff"s));
  CHECK(KeyRange::all().reversed().reverse);
  CHECK_FALSE(KeyRange::all().reversed().reversed().reverse);
}
