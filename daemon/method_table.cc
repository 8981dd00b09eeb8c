#include "daemon/method_table.h"

#include "daemon/errors.h"

#include <boost/json/parse.hpp>
#include <boost/json/value_from.hpp>

#include <stdexcept>

namespace toolhost::daemon {
namespace json = boost::json;

json::value schema(std::string_view text) { return json::parse(text); }

json::value paramsWith(json::object properties, std::initializer_list<std::string_view> required) {
  json::array requiredList;
  for (auto name : required) requiredList.emplace_back(name);
  return json::object{{"type", "object"},
                      {"additionalProperties", false},
                      {"properties", std::move(properties)},
                      {"required", std::move(requiredList)}};
}

void MethodTable::add(MethodSpec spec) {
  if (spec.params.is_null()) {
    spec.params = json::object{{"type", "object"}, {"properties", json::object{}},
                               {"additionalProperties", false}};
  }
  auto compiled = registry::JsonSchema::compile(spec.params);
  if (!compiled) {
    throw std::logic_error("method " + spec.name + ": " + compiled.error().detail);
  }
  std::string name = spec.name;
  auto [it, inserted] = methods_.emplace(name, CompiledMethod{std::move(spec), *compiled});
  if (!inserted) throw std::logic_error("method " + name + " registered twice");
}

const CompiledMethod* MethodTable::tryFind(std::string_view name) const {
  auto it = methods_.find(name);
  return it == methods_.end() ? nullptr : &it->second;
}

json::object MethodTable::openRpcDocument(std::string_view version) const {
  json::array methods;
  // Served by the connection itself (daemon/session.cc), not by this table.
  methods.push_back(json::object{
      {"name", "$/cancelRequest"},
      {"summary",
       "Cancels a request of this connection that has not been answered yet: it is answered "
       "with a cancelled error (-32009). Returns {cancelled}: false when no such request was "
       "running (already answered, or never sent)."},
      {"paramStructure", "by-name"},
      {"params", json::array{json::object{
                     {"name", "id"},
                     {"required", true},
                     {"schema", json::object{{"type", json::array{"string", "number"}}}}}}},
      {"x-roles", json::array{"any"}},
      {"result", json::object{{"name", "result"},
                              {"schema", json::object{{"type", "object"},
                                                      {"required", json::array{"cancelled"}}}}}}});
  for (const auto& [name, method] : methods_) {
    const auto& spec = method.spec;
    json::array params;
    const auto& schema = spec.params.as_object();
    json::array required;
    if (const auto* found = schema.if_contains("required")) required = found->as_array();
    if (const auto* properties = schema.if_contains("properties")) {
      for (const auto& [param, paramSchema] : properties->as_object()) {
        bool isRequired = false;
        for (const auto& entry : required) isRequired = isRequired || entry.as_string() == param;
        params.push_back(json::object{{"name", param},
                                      {"required", isRequired},
                                      {"schema", paramSchema}});
      }
    }
    json::object entry{{"name", name},
                       {"summary", spec.summary},
                       {"paramStructure", "by-name"},
                       {"params", std::move(params)},
                       {"x-roles", json::value_from(spec.roles.empty()
                                                        ? std::vector<std::string>{"any"}
                                                        : spec.roles.names())}};
    if (!spec.result.is_null()) {
      entry["result"] = json::object{{"name", "result"}, {"schema", spec.result}};
    } else {
      entry["result"] = json::object{{"name", "result"}, {"schema", json::object{}}};
    }
    methods.push_back(std::move(entry));
  }
  return json::object{
      {"openrpc", "1.2.6"},
      {"info", json::object{{"title", "toolhost"},
                            {"version", version},
                            {"description", "Hosts the tools AI agents call: JSON-RPC 2.0 over a "
                                            "Unix socket, one JSON text per line."}}},
      {"methods", std::move(methods)}};
}

MethodResult invalidParams(std::string detail) {
  return protocol::makeError(protocol::rpc_error::kInvalidParams, "invalid-params", std::move(detail));
}

MethodResult appError(int code, std::string kind, std::string detail) {
  return app_error::error(code, std::move(kind), std::move(detail));
}

}  // namespace toolhost::daemon
