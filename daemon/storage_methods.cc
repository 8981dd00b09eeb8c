#include "daemon/storage_methods.h"

#include "daemon/errors.h"

#include <boost/json/parse.hpp>

namespace toolhost::daemon {
namespace asio = boost::asio;
namespace json = boost::json;

namespace {

MethodResult failure(const registry::StorageError& error) {
  switch (error.code) {
    case registry::StorageErrc::invalidArgument:
      return invalidParams(error.detail);
    case registry::StorageErrc::full:
      return appError(app_error::kStorageFull, "storage-full", error.detail);
    case registry::StorageErrc::quotaExceeded:
    case registry::StorageErrc::failed:
      break;
  }
  return protocol::makeError(protocol::rpc_error::kInternalError, "storage-failed", error.detail);
}

// A name that keeps nothing and that no revision ever had is most likely mistyped: said so,
// rather than answered as an empty store.
std::optional<MethodResult> unknownTool(registry::Registry& registry, const std::string& name) {
  auto history = registry.history(name);
  if (history && !history->empty()) return std::nullopt;
  if (!history && history.error().code != registry::RegistryErrc::notFound) return std::nullopt;
  return appError(app_error::kNotFound, "not-found",
                  "no tool named " + name +
                      " was ever installed; storage.list without a tool names those that "
                      "keep something");
}

json::object usageJson(const registry::StorageUsage& usage) {
  return json::object{{"keys", usage.keys}, {"bytes", usage.bytes}};
}

}  // namespace

void registerStorageMethods(MethodTable& methods, registry::ToolStorage& storage,
                            registry::Registry& registry, DiskThread& disk) {
  methods.add(MethodSpec{
      "storage.list",
      "What tools keep with ctx.storage. Without `tool`: every tool name that stores something, "
      "with its keys and bytes. With `tool`: that tool's usage and each key with its bytes (key "
      "plus JSON value), in key order.",
      RoleSet{Role::admin}, json::parse(R"({"type":"object","additionalProperties":false,
                      "properties":{"tool":{"type":"string","minLength":1,"maxLength":64}}})"),
      json::parse(R"({"type":"object","properties":{"tools":{"type":"array"},
                      "tool":{"type":"string"},"keys":{"type":"integer"},
                      "bytes":{"type":"integer"},"entries":{"type":"array"}}})"),
      [&storage, &registry](CallContext&, json::object params) -> asio::awaitable<MethodResult> {
        if (const auto* tool = params.if_contains("tool")) {
          const std::string name(tool->as_string());
          auto entries = storage.entries(name);
          if (!entries) co_return failure(entries.error());
          if (entries->empty()) {
            if (auto unknown = unknownTool(registry, name)) co_return std::move(*unknown);
          }
          json::array list;
          registry::StorageUsage usage;
          for (const auto& entry : *entries) {
            ++usage.keys;
            usage.bytes += entry.bytes;
            list.push_back(json::object{{"key", entry.key}, {"bytes", entry.bytes}});
          }
          json::object out = usageJson(usage);
          out["tool"] = name;
          out["entries"] = std::move(list);
          co_return json::value(std::move(out));
        }
        auto tools = storage.tools();
        if (!tools) co_return failure(tools.error());
        json::array list;
        for (const auto& tool : *tools) {
          json::object entry = usageJson(tool.usage);
          entry["tool"] = tool.tool;
          list.push_back(std::move(entry));
        }
        co_return json::value(json::object{{"tools", std::move(list)}});
      }});

  methods.add(MethodSpec{
      "storage.get", "One value a tool keeps with ctx.storage: {found, value?}.",
      RoleSet{Role::admin},
      json::parse(R"({"type":"object","additionalProperties":false,"required":["tool","key"],
                      "properties":{"tool":{"type":"string","minLength":1,"maxLength":64},
                                    "key":{"type":"string","minLength":1}}})"),
      json::parse(R"({"type":"object","required":["found"]})"),
      [&storage, &registry](CallContext&, json::object params) -> asio::awaitable<MethodResult> {
        auto value = storage.get(params.at("tool").as_string(), params.at("key").as_string());
        if (!value) co_return failure(value.error());
        if (!*value) {
          if (auto unknown = unknownTool(registry, std::string(params.at("tool").as_string()))) {
            co_return std::move(*unknown);
          }
        }
        json::object out{{"found", value->has_value()}};
        if (*value) out["value"] = std::move(**value);
        co_return json::value(std::move(out));
      }});

  methods.add(MethodSpec{
      "storage.clear",
      "Removes everything a tool name keeps with ctx.storage (for every revision of that name); "
      "answers what was removed.",
      RoleSet{Role::admin},
      json::parse(R"({"type":"object","additionalProperties":false,"required":["tool"],
                      "properties":{"tool":{"type":"string","minLength":1,"maxLength":64}}})"),
      json::parse(R"({"type":"object","required":["tool","keys","bytes"]})"),
      [&storage, &registry, &disk](CallContext&,
                                   json::object params) -> asio::awaitable<MethodResult> {
        const std::string name(params.at("tool").as_string());
        auto removed = co_await disk.run([&] { return storage.clear(name); });
        if (!removed) co_return failure(removed.error());
        if (removed->keys == 0) {
          if (auto unknown = unknownTool(registry, name)) co_return std::move(*unknown);
        }
        json::object out = usageJson(*removed);
        out["tool"] = name;
        co_return json::value(std::move(out));
      }});
}

}  // namespace toolhost::daemon
