// Content hashes: known values computed outside this code, key-order independence, domain
// separation, and the format check.
#include "protocol/content_hash.h"
#include "protocol/json_parse.h"

#include <boost/json.hpp>
#include <catch2/catch.hpp>

#include <limits>
#include <random>
#include <string>

namespace json = boost::json;
using toolhost::protocol::base64UrlEncode;
using toolhost::protocol::contentHash;
using toolhost::protocol::contentHashOfCanonical;
using toolhost::protocol::isContentHash;
using toolhost::protocol::parseJson;
namespace domain = toolhost::protocol::domain;

namespace {

json::value parsed(std::string_view text) {
  auto value = parseJson(text);
  INFO(text);
  REQUIRE(value.has_value());
  return *value;
}

std::string hashOf(std::string_view tag, std::string_view text) {
  auto hash = contentHash(tag, parsed(text));
  REQUIRE(hash.has_value());
  return *hash;
}

}  // namespace

TEST_CASE("content hashes match values computed with openssl", "[content_hash]") {
  // printf 'toolhost.task.v1\0{"a":1}' | openssl dgst -sha256 -binary | basenc --base64url
  CHECK(hashOf(domain::kTask, R"({"a":1})") ==
        "sha256:lVCXGhTZWOrerac3UKwB5Q0Mq8CgrnKh1A-PeYv2yWM");
  CHECK(hashOf(domain::kTask, " {\n \"a\" : 1.0 } ") ==
        "sha256:lVCXGhTZWOrerac3UKwB5Q0Mq8CgrnKh1A-PeYv2yWM");
  // printf 'toolhost.tool-manifest.v1\0{"a":[1,"x"],"b":{"c":null}}' | openssl dgst ...
  CHECK(hashOf(domain::kToolManifest, R"({"b": {"c": null}, "a": [1e0, "x"]})") ==
        "sha256:4mmyoP5dExzMSZx4BjQV9D8fVeOE8Q0L3h_AeV3dKpo");
  // printf 'toolhost.tool-settings.v1\0{"a":1}' | openssl dgst ...
  CHECK(hashOf(domain::kToolSettings, R"({"a":1})") ==
        "sha256:VLINIlgPfqbJr1Uh1zE4XYfTJPyYmhIsZ67u3BFfFx0");
  // printf 'toolhost.task.v1\0' | openssl dgst ...
  CHECK(contentHashOfCanonical(domain::kTask, "") ==
        "sha256:yXtMrITRB-IivxH2dWiltpyIsSlGgAS2sCxIRyFhD_4");
  CHECK(contentHashOfCanonical(domain::kTask, R"({"a":1})") ==
        "sha256:lVCXGhTZWOrerac3UKwB5Q0Mq8CgrnKh1A-PeYv2yWM");
}

TEST_CASE("content hashes do not depend on key order or number spelling", "[content_hash]") {
  const auto hash = hashOf(domain::kTask, R"({"a":1,"b":{"x":[1,2],"y":"z"},"c":0.5})");
  CHECK(hashOf(domain::kTask, R"({"c":5e-1,"b":{"y":"z","x":[1.0,2]},"a":1})") == hash);
  CHECK(hashOf(domain::kTask, R"({"b":{"x":[10e-1,2E0],"y":"\u007a"},"c":0.50,"a":1})") == hash);
  // Array order and values do count.
  CHECK(hashOf(domain::kTask, R"({"a":1,"b":{"x":[2,1],"y":"z"},"c":0.5})") != hash);
  CHECK(hashOf(domain::kTask, R"({"a":1,"b":{"x":[1,2],"y":"Z"},"c":0.5})") != hash);

  json::object built;
  built["c"] = 0.5;
  built["a"] = std::uint64_t{1};
  built["b"] = json::object{{"y", "z"}, {"x", json::array{1.0, std::int64_t{2}}}};
  CHECK(*contentHash(domain::kTask, built) == hash);
}

TEST_CASE("the domain tag separates hashes", "[content_hash]") {
  const auto value = parsed(R"({"a":1})");
  CHECK(*contentHash(domain::kTask, value) != *contentHash(domain::kToolManifest, value));
  CHECK(*contentHash(domain::kToolManifest, value) != *contentHash(domain::kToolSettings, value));
  // The NUL byte keeps tag and content apart: "ab" + "c" differs from "a" + "bc".
  CHECK(contentHashOfCanonical("ab", "c") != contentHashOfCanonical("a", "bc"));
}

TEST_CASE("contentHash refuses what has no canonical form", "[content_hash]") {
  json::object value;
  value["x"] = std::numeric_limits<double>::infinity();
  auto hash = contentHash(domain::kTask, value);
  REQUIRE_FALSE(hash.has_value());
  CHECK(hash.error().detail == "non-finite number at /x");
}

TEST_CASE("base64UrlEncode follows RFC 4648 section 5 without padding", "[content_hash]") {
  CHECK(base64UrlEncode("") == "");
  CHECK(base64UrlEncode("f") == "Zg");
  CHECK(base64UrlEncode("fo") == "Zm8");
  CHECK(base64UrlEncode("foo") == "Zm9v");
  CHECK(base64UrlEncode("foob") == "Zm9vYg");
  CHECK(base64UrlEncode("fooba") == "Zm9vYmE");
  CHECK(base64UrlEncode("foobar") == "Zm9vYmFy");
  CHECK(base64UrlEncode("\xFB\xFF\xBF") == "-_-_");
  CHECK(base64UrlEncode(std::string("\0\0\0", 3)) == "AAAA");
  CHECK(base64UrlEncode("\xFF") == "_w");
}

TEST_CASE("isContentHash accepts exactly the hashes this code can produce", "[content_hash]") {
  const std::string good = "sha256:lVCXGhTZWOrerac3UKwB5Q0Mq8CgrnKh1A-PeYv2yWM";
  CHECK(isContentHash(good));
  CHECK(isContentHash("sha256:yXtMrITRB-IivxH2dWiltpyIsSlGgAS2sCxIRyFhD_4"));
  CHECK(isContentHash("sha256:" + std::string(43, 'A')));
  CHECK(isContentHash("sha256:" + std::string(42, '_') + "w"));

  CHECK_FALSE(isContentHash(""));
  CHECK_FALSE(isContentHash("sha256:"));
  CHECK_FALSE(isContentHash(good.substr(0, good.size() - 1)));  // 42 characters
  CHECK_FALSE(isContentHash(good + "A"));                       // 44 characters
  CHECK_FALSE(isContentHash(good + "="));                       // padding
  CHECK_FALSE(isContentHash(good + "\n"));
  CHECK_FALSE(isContentHash("SHA256:" + good.substr(7)));
  CHECK_FALSE(isContentHash("sha512:" + good.substr(7)));
  CHECK_FALSE(isContentHash("sha256 " + good.substr(7)));
  CHECK_FALSE(isContentHash(good.substr(7)));                    // no prefix
  CHECK_FALSE(isContentHash("sha256:" + std::string(43, '+')));  // standard base64
  CHECK_FALSE(isContentHash("sha256:" + std::string(42, 'A') + "/"));
  CHECK_FALSE(isContentHash("sha256:lVCXGhTZWOrerac3UKwB5Q0Mq8CgrnKh1A PeYv2yWM"));
  CHECK_FALSE(isContentHash("sha256:lVCXGhTZWOrerac3UKwB5Q0Mq8CgrnKh1A.PeYv2yWM"));
  CHECK_FALSE(
      isContentHash(std::string("sha256:lVCXGhTZWOrerac3UKwB5Q0Mq8CgrnKh1A\0PeYv2yWM", 50)));
  CHECK_FALSE(isContentHash("sha256:lVCXGhTZWOrerac3UKwB5Q0Mq8CgrnKh1A\xC3\xA9PeYv2yW"));

  // The last character carries 4 bits of digest and 2 bits that must be zero: only the characters
  // whose base64 value is a multiple of 4 can end a 32-byte encoding.
  const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  const std::string validLast = "AEIMQUYcgkosw048";
  for (char last : alphabet) {
    INFO("last character " << last);
    CHECK(isContentHash(good.substr(0, good.size() - 1) + last) ==
          (validLast.find(last) != std::string::npos));
  }
}

TEST_CASE("every produced hash passes isContentHash", "[content_hash]") {
  std::mt19937 random(4648);
  for (int i = 0; i < 500; ++i) {
    json::object value;
    value["n"] = static_cast<std::int64_t>(random());
    value["s"] = std::to_string(random());
    const auto hash = contentHash(domain::kTask, value);
    REQUIRE(hash.has_value());
    CHECK(hash->size() == 50);
    CHECK(isContentHash(*hash));
  }
}
