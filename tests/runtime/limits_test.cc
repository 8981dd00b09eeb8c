// Effective limits: manifest or default, tightened by the request, capped by the daemon.
#include "runtime/limits.h"

#include <catch2/catch.hpp>

using namespace toolhost::runtime;
namespace json = boost::json;

TEST_CASE("limits come from the manifest, else the defaults, capped", "[limits]") {
  RuntimeConfig config;
  auto plain = effectiveLimits(json::object{}, {}, config);
  REQUIRE(plain.has_value());
  CHECK(plain->wallMs == 60000);
  CHECK(plain->cpuMs == 30000);
  CHECK(plain->heapMb == 64);
  CHECK(plain->arrayBufferMb == 64);
  CHECK(plain->stackKb == 984);
  CHECK(plain->outputBytes == 2 * 1024 * 1024);

  json::object manifest{{"limits", {{"wallMs", 1000}, {"heapMb", 4096}, {"outputBytes", 10}}}};
  auto fromManifest = effectiveLimits(manifest, {}, config);
  REQUIRE(fromManifest.has_value());
  CHECK(fromManifest->wallMs == 1000);
  CHECK(fromManifest->heapMb == 1024);  // capped
  CHECK(fromManifest->outputBytes == 10);
  CHECK(fromManifest->cpuMs == 30000);  // default

  CallLimits request;
  request.wallMs = 500;
  request.heapMb = 1024;
  auto tightened = effectiveLimits(manifest, request, config);
  REQUIRE(tightened.has_value());
  CHECK(tightened->wallMs == 500);
  CHECK(tightened->heapMb == 1024);
}

TEST_CASE("a request may only tighten", "[limits]") {
  RuntimeConfig config;
  json::object manifest{{"limits", {{"cpuMs", 100}}}};
  CallLimits looser;
  looser.cpuMs = 101;
  auto refused = effectiveLimits(manifest, looser, config);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error() ==
        "limits.cpuMs: 101 is looser than the tool's 100; a call may only tighten a tool's limits");
  CallLimits overDefault;
  overDefault.stackKb = 985;
  CHECK_FALSE(effectiveLimits({}, overDefault, config).has_value());
  CallLimits zero;
  zero.outputBytes = 0;
  auto notPositive = effectiveLimits({}, zero, config);
  REQUIRE_FALSE(notPositive.has_value());
  CHECK(notPositive.error() == "limits.outputBytes: 0 is not a positive integer");
  auto badManifest = effectiveLimits(json::object{{"limits", {{"wallMs", "soon"}}}}, {}, config);
  REQUIRE_FALSE(badManifest.has_value());
  CHECK(badManifest.error() == "the tool's manifest limits.wallMs is not a positive integer");
}

TEST_CASE("configured defaults and caps apply, unset ones fall back to the built-in values",
          "[limits]") {
  RuntimeConfig config;
  config.defaults.wallMs = 1234;
  config.caps.cpuMs = 50;
  config.defaults.heapMb.reset();
  auto limits = effectiveLimits({}, {}, config);
  REQUIRE(limits.has_value());
  CHECK(limits->wallMs == 1234);
  CHECK(limits->cpuMs == 50);
  CHECK(limits->heapMb == 64);
  auto base = baseLimits(json::object{{"limits", {{"cpuMs", 10}}}}, config);
  REQUIRE(base.has_value());
  CHECK(base->cpuMs == 10);
}
