#include "daemon/sandbox_methods.h"

#include "daemon/errors.h"

#include <boost/json/parse.hpp>

namespace toolhost::daemon {
namespace asio = boost::asio;
namespace json = boost::json;

void registerSandboxMethods(MethodTable& methods, runtime::ToolRunner& sandboxes) {
  methods.add(MethodSpec{
      "sandboxes.list",
      "Each retained sandbox, least recently used first: revision, tool name, calls served, heap "
      "bytes after its last call, idle milliseconds, and whether a call is running.",
      RoleSet{Role::admin},
      {},
      json::parse(R"({"type":"object","required":["sandboxes","maxRetained","memoryBudgetMb"]})"),
      [&sandboxes](CallContext&, json::object) -> asio::awaitable<MethodResult> {
        json::array list;
        for (const auto& info : sandboxes.list()) {
          list.push_back(json::object{{"revision", info.revision},
                                      {"name", info.name},
                                      {"calls", info.calls},
                                      {"heapBytes", info.heapBytes},
                                      {"idleMs", info.idleMs},
                                      {"busy", info.busy}});
        }
        co_return json::value(json::object{{"sandboxes", std::move(list)},
                                           {"maxRetained", sandboxes.config().maxRetained},
                                           {"memoryBudgetMb", sandboxes.config().memoryBudgetMb}});
      }});

  methods.add(MethodSpec{
      "sandboxes.terminate",
      "Destroys the retained sandbox of a revision; a call running in it ends as cancelled.",
      RoleSet{Role::admin},
      json::parse(R"({"type":"object","additionalProperties":false,"required":["revision"],
                      "properties":{"revision":{"type":"string","minLength":50,"maxLength":50}}})"),
      json::parse(R"({"type":"object","required":["terminated"]})"),
      [&sandboxes](CallContext&, json::object params) -> asio::awaitable<MethodResult> {
        std::string revision(params.at("revision").as_string());
        if (!sandboxes.terminate(revision)) {
          co_return appError(app_error::kNotFound, "not-found", "no retained sandbox for " + revision);
        }
        co_return json::value(json::object{{"terminated", true}, {"revision", revision}});
      }});
}

}  // namespace toolhost::daemon
