#include "registry/native_tools.h"

#include "protocol/content_hash.h"

#include <boost/json/parse.hpp>

#include <chrono>
#include <ctime>

namespace toolhost::registry {
namespace json = boost::json;

namespace {

// Identifies a compiled implementation: bump `version` whenever the code of that tool changes, so
// its revision changes and calls pinned to the old revision are told it is gone.
std::string implementationRevision(std::string_view name, int version) {
  return *protocol::contentHash("toolhost.native-implementation.v1",
                                json::object{{"name", name}, {"version", version}});
}

json::object nativeManifest(std::string_view name, std::string_view description, std::string_view parameters,
                            int version) {
  return json::object{{"name", name},
                      {"description", description},
                      {"parameters", json::parse(parameters)},
                      {"execution", json::object{{"class", "trusted-native"},
                                                 {"implementationRevision", implementationRevision(name, version)}}}};
}

std::string formatIso(std::chrono::system_clock::time_point time, int offsetMinutes) {
  using namespace std::chrono;
  auto shifted = time + minutes(offsetMinutes);
  auto since = shifted.time_since_epoch();
  auto secs = duration_cast<seconds>(since);
  auto millis = duration_cast<milliseconds>(since - secs).count();
  if (millis < 0) {
    millis += 1000;
    secs -= seconds(1);
  }
  std::time_t t = secs.count();
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[48];
  std::size_t n = std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &tm);
  n += std::snprintf(text + n, sizeof text - n, ".%03d", static_cast<int>(millis));
  if (offsetMinutes == 0) {
    std::snprintf(text + n, sizeof text - n, "Z");
  } else {
    int absolute = offsetMinutes < 0 ? -offsetMinutes : offsetMinutes;
    std::snprintf(text + n, sizeof text - n, "%c%02d:%02d", offsetMinutes < 0 ? '-' : '+', absolute / 60,
                  absolute % 60);
  }
  return text;
}

}  // namespace

std::vector<NativeTool> builtinNativeTools() {
  std::vector<NativeTool> tools;
  tools.push_back(NativeTool{
      nativeManifest("echo", "Returns its arguments unchanged: a way to check a call path end to end.",
                     R"({"type":"object","description":"any arguments; they come back as the result"})", 1),
      [](const json::object& arguments) -> boost::system::result<json::value, std::string> {
        return json::value(arguments);
      }});
  tools.push_back(NativeTool{
      nativeManifest("time-now",
                     "The current time: RFC 3339 (UTC, or at a fixed offset) and Unix milliseconds.",
                     R"({"type":"object","additionalProperties":false,"properties":{
                         "offsetMinutes":{"type":"integer","minimum":-1440,"maximum":1440,
                           "description":"render the time at this offset from UTC, e.g. 120 for UTC+02:00"}}})",
                     1),
      [](const json::object& arguments) -> boost::system::result<json::value, std::string> {
        auto now = std::chrono::system_clock::now();
        int offset = 0;
        if (const auto* given = arguments.if_contains("offsetMinutes")) {
          offset = static_cast<int>(given->to_number<std::int64_t>());
        }
        auto unixMs = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
        return json::value(json::object{{"iso", formatIso(now, offset)},
                                        {"utc", formatIso(now, 0)},
                                        {"unixMs", unixMs},
                                        {"offsetMinutes", offset}});
      }});
  return tools;
}

}  // namespace toolhost::registry
