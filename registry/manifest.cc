#include "registry/manifest.h"

#include "policy/destination.h"
#include "protocol/content_hash.h"
#include "protocol/json_text.h"

#include <boost/json/parse.hpp>
#include <boost/url/parse.hpp>
#include <boost/url/url_view.hpp>

#include <algorithm>

namespace toolhost::registry {
namespace json = boost::json;

namespace {

// The published manifest schema. Names and origins are checked in code, with words a pattern's
// failure would not give.
constexpr std::string_view kManifestSchema = R"schema({
  "$schema": "http://json-schema.org/draft-07/schema#",
  "title": "ToolManifest",
  "description": "A tool: its name, what it takes, how it runs, what it may ask for, and its limits. Its revision is sha256 over 'toolhost.tool-manifest.v1', NUL, and the RFC 8785 canonical JSON of the manifest exactly as submitted.",
  "type": "object",
  "additionalProperties": false,
  "required": ["name", "description", "parameters", "execution"],
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 64,
             "description": "lowercase letters and digits in words joined by single '-' or '_', starting with a letter"},
    "description": {"type": "string", "maxLength": 8192},
    "parameters": {"type": "object", "description": "JSON Schema (draft 7) of the call arguments; its root is an object schema. A pattern is an ECMA-262 regular expression read as with the u flag, without lookaround, backreferences or \\p{...}; patternProperties is refused; format is an annotation only."},
    "settings": {"type": "object", "description": "JSON Schema of the per-tool settings (tools.configure)"},
    "execution": {
      "type": "object",
      "required": ["class"],
      "properties": {"class": {"enum": ["sandboxed-code", "external-service", "trusted-native"]}},
      "allOf": [
        {"if": {"properties": {"class": {"const": "sandboxed-code"}}},
         "then": {"additionalProperties": false, "required": ["class", "runtime", "source"],
                  "properties": {"class": {}, "runtime": {"const": "javascript"},
                                 "source": {"type": "string", "minLength": 1},
                                 "modules": {"type": "object", "maxProperties": 64,
                                             "additionalProperties": {"type": "string"}}}}},
        {"if": {"properties": {"class": {"const": "external-service"}}},
         "then": {"additionalProperties": false, "required": ["class", "endpoint"],
                  "properties": {"class": {}, "endpoint": {"type": "string", "maxLength": 2048,
                    "description": "an https URL, or unix:/absolute/path to a socket speaking JSON-RPC"}}}},
        {"if": {"properties": {"class": {"const": "trusted-native"}}},
         "then": {"additionalProperties": false, "required": ["class", "implementationRevision"],
                  "properties": {"class": {}, "implementationRevision": {"type": "string", "maxLength": 64}}}}
      ]
    },
    "capabilities": {
      "type": "object",
      "additionalProperties": false,
      "properties": {
        "fetch": {"type": "array", "maxItems": 64,
                  "items": {"type": "object", "additionalProperties": false, "required": ["origin", "access"],
                            "properties": {"origin": {"type": "string", "maxLength": 2048},
                                           "access": {"type": "array", "minItems": 1, "maxItems": 2,
                                                      "uniqueItems": true,
                                                      "items": {"enum": ["read", "write"]}}}}},
        "popup": {"type": "array", "maxItems": 64, "uniqueItems": true,
                  "items": {"type": "string", "maxLength": 2048,
                            "description": "\"custom-html\" or an exact https origin"}},
        "subtasks": {"type": "boolean"},
        "storage": {"type": "boolean"},
        "secrets": {"type": "array", "maxItems": 64, "uniqueItems": true,
                    "items": {"type": "string", "minLength": 1, "maxLength": 64}}
      }
    },
    "limits": {
      "type": "object",
      "additionalProperties": false,
      "properties": {
        "wallMs": {"type": "integer", "minimum": 1, "maximum": 3600000},
        "cpuMs": {"type": "integer", "minimum": 1, "maximum": 3600000},
        "heapMb": {"type": "integer", "minimum": 1, "maximum": 4096},
        "arrayBufferMb": {"type": "integer", "minimum": 1, "maximum": 4096},
        "stackKb": {"type": "integer", "minimum": 64, "maximum": 8192},
        "outputBytes": {"type": "integer", "minimum": 1, "maximum": 268435456}
      }
    }
  }
})schema";

RegistryError invalid(std::string detail) {
  return RegistryError{RegistryErrc::invalidDefinition, std::move(detail)};
}

bool validSecretName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  if (!((name[0] >= 'a' && name[0] <= 'z') || (name[0] >= 'A' && name[0] <= 'Z'))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

bool validEndpoint(std::string_view endpoint) {
  if (endpoint.starts_with("unix:")) {
    auto path = endpoint.substr(5);
    // No control characters: the path is shown to approvers and written to logs.
    return path.size() > 1 && path.size() <= 107 && path.front() == '/' &&
           std::none_of(path.begin(), path.end(),
                        [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
  }
  auto parsed = boost::urls::parse_absolute_uri(endpoint);
  if (!parsed) return false;
  return parsed->scheme() == "https" && parsed->has_authority() && !parsed->host().empty() &&
         !parsed->has_userinfo() && !parsed->has_fragment();
}

}  // namespace

bool validModuleName(std::string_view name) {
  if (name.empty() || name.size() > 128 || name.front() == '/' || name.front() == '.') return false;
  if (name.find("..") != std::string_view::npos || name.find("//") != std::string_view::npos) {
    return false;
  }
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.' || c == '/';
    if (!ok) return false;
  }
  return name.ends_with(".js") || name.ends_with(".mjs");
}

const json::value& Registry::manifestSchema() {
  static const json::value schema = json::parse(kManifestSchema);
  return schema;
}

bool isCanonicalHttpsOrigin(std::string_view text) {
  return !policy::whyNotCanonicalOrigin(text).has_value();
}

ExecutionClass executionClassOf(const json::object& manifest) {
  auto name = manifest.at("execution").at("class").as_string();
  if (name == "external-service") return ExecutionClass::externalService;
  if (name == "trusted-native") return ExecutionClass::trustedNative;
  return ExecutionClass::sandboxedCode;
}

Result<std::string> validateManifest(const json::object& manifest, const RegistryLimits& limits) {
  // The name first, in code, so that nothing below ever sees an unbounded name.
  const auto* name = manifest.if_contains("name");
  if (name == nullptr || !name->is_string()) return invalid("manifest/name: required, a string");
  if (!isValidToolName(name->get_string())) {
    return invalid("manifest/name: \"" + std::string(name->get_string()).substr(0, 80) +
                   "\" is not a tool name; use lowercase letters and digits in words joined by "
                   "'-' or '_', starting with a letter, at most 64 characters");
  }
  static const JsonSchema schema = *JsonSchema::compile(Registry::manifestSchema());
  if (auto violation = schema.validate(manifest)) return invalid(violation->describe("manifest"));

  const auto& description = manifest.at("description").as_string();
  if (description.size() > limits.maxDescriptionBytes) {
    return invalid("manifest/description: longer than " + std::to_string(limits.maxDescriptionBytes) +
                   " bytes");
  }
  auto parameters = compileToolSchema(manifest.at("parameters"), "manifest/parameters");
  if (!parameters) return parameters.error();
  const auto& parameterSchema = manifest.at("parameters").as_object();
  if (const auto* type = parameterSchema.if_contains("type"); !type || *type != "object") {
    return invalid("manifest/parameters: the root must be an object schema (\"type\": \"object\"); "
                   "tools take named arguments");
  }
  if (const auto* settings = manifest.if_contains("settings")) {
    auto compiled = compileToolSchema(*settings, "manifest/settings");
    if (!compiled) return compiled.error();
  }

  const auto& execution = manifest.at("execution").as_object();
  switch (executionClassOf(manifest)) {
    case ExecutionClass::sandboxedCode: {
      std::size_t total = execution.at("source").as_string().size();
      if (const auto* modules = execution.if_contains("modules")) {
        if (modules->as_object().size() > limits.maxModules) {
          return invalid("manifest/execution/modules: more than " +
                         std::to_string(limits.maxModules) + " modules");
        }
        for (const auto& [moduleName, source] : modules->as_object()) {
          if (!validModuleName(moduleName)) {
            return invalid("manifest/execution/modules: \"" +
                           std::string(moduleName).substr(0, 80) + "\" is not a module name; " +
                           std::string(kModuleNameRule));
          }
          total += source.as_string().size();
        }
      }
      if (total > limits.maxSourceBytes) {
        return invalid("manifest/execution: source and modules hold " + std::to_string(total) +
                       " bytes; the limit is " + std::to_string(limits.maxSourceBytes));
      }
      break;
    }
    case ExecutionClass::externalService: {
      std::string_view endpoint = execution.at("endpoint").as_string();
      if (!validEndpoint(endpoint)) {
        return invalid("manifest/execution/endpoint: must be an https URL without credentials, or "
                       "unix:/absolute/path (at most 107 bytes)");
      }
      break;
    }
    case ExecutionClass::trustedNative: {
      std::string_view implementation = execution.at("implementationRevision").as_string();
      if (!protocol::isContentHash(implementation)) {
        return invalid("manifest/execution/implementationRevision: must be a content hash");
      }
      break;
    }
  }

  if (const auto* capabilities = manifest.if_contains("capabilities")) {
    const auto& caps = capabilities->as_object();
    if (const auto* fetch = caps.if_contains("fetch")) {
      std::size_t index = 0;
      for (const auto& entry : fetch->as_array()) {
        std::string_view origin = entry.at("origin").as_string();
        if (auto why = policy::whyNotCanonicalOrigin(origin)) {
          return invalid("manifest/capabilities/fetch/" + std::to_string(index) +
                         "/origin: must be an exact https origin in canonical form, such as "
                         "https://api.example.com or https://api.example.com:8443 (lowercase, no "
                         "path, no default port): " +
                         *why);
        }
        ++index;
      }
    }
    if (const auto* popup = caps.if_contains("popup")) {
      std::size_t index = 0;
      for (const auto& entry : popup->as_array()) {
        std::string_view target = entry.as_string();
        if (target == "custom-html") {
          ++index;
          continue;
        }
        if (auto why = policy::whyNotCanonicalOrigin(target)) {
          return invalid("manifest/capabilities/popup/" + std::to_string(index) +
                         ": must be \"custom-html\" or an exact https origin: " + *why);
        }
        ++index;
      }
    }
    if (const auto* secrets = caps.if_contains("secrets")) {
      std::size_t index = 0;
      for (const auto& entry : secrets->as_array()) {
        if (!validSecretName(entry.as_string())) {
          return invalid("manifest/capabilities/secrets/" + std::to_string(index) +
                         ": a secret name is letters, digits, '_' and '-', starting with a letter");
        }
        ++index;
      }
    }
  }

  auto canonical = protocol::canonicalJson(manifest);
  if (!canonical) return invalid("manifest: " + canonical.error().detail);
  if (canonical->size() > limits.maxManifestBytes) {
    return invalid("manifest: " + std::to_string(canonical->size()) + " bytes; the limit is " +
                   std::to_string(limits.maxManifestBytes));
  }
  return std::move(*canonical);
}

std::set<std::string> requestedCapabilities(const json::object& manifest) {
  std::set<std::string> out;
  // An external-service tool reaches its endpoint: what policy authorizes as `invoke`.
  if (const auto* execution = manifest.if_contains("execution");
      execution && execution->is_object()) {
    if (const auto* endpoint = execution->as_object().if_contains("endpoint");
        endpoint && endpoint->is_string() &&
        executionClassOf(manifest) == ExecutionClass::externalService) {
      out.insert("invoke " + std::string(endpoint->as_string()));
    }
  }
  const auto* capabilities = manifest.if_contains("capabilities");
  if (capabilities == nullptr || !capabilities->is_object()) return out;
  const auto& caps = capabilities->as_object();
  if (const auto* fetch = caps.if_contains("fetch"); fetch && fetch->is_array()) {
    for (const auto& entry : fetch->as_array()) {
      for (const auto& access : entry.at("access").as_array()) {
        out.insert("fetch " + std::string(entry.at("origin").as_string()) + " " +
                   std::string(access.as_string()));
      }
    }
  }
  if (const auto* popup = caps.if_contains("popup"); popup && popup->is_array()) {
    for (const auto& entry : popup->as_array()) out.insert("popup " + std::string(entry.as_string()));
  }
  if (const auto* subtasks = caps.if_contains("subtasks"); subtasks && *subtasks == true) {
    out.insert("subtasks");
  }
  if (const auto* storage = caps.if_contains("storage"); storage && *storage == true) {
    out.insert("storage");
  }
  if (const auto* secrets = caps.if_contains("secrets"); secrets && secrets->is_array()) {
    for (const auto& entry : secrets->as_array()) out.insert("secret " + std::string(entry.as_string()));
  }
  return out;
}

json::object describeChanges(const json::object& from, const json::object& to) {
  auto before = requestedCapabilities(from);
  auto after = requestedCapabilities(to);
  json::array added, removed;
  for (const auto& item : after) {
    if (!before.count(item)) added.emplace_back(item);
  }
  for (const auto& item : before) {
    if (!after.count(item)) removed.emplace_back(item);
  }
  json::object limits;
  auto limitsOf = [](const json::object& manifest) {
    const auto* found = manifest.if_contains("limits");
    return found && found->is_object() ? found->as_object() : json::object{};
  };
  auto fromLimits = limitsOf(from);
  auto toLimits = limitsOf(to);
  std::set<std::string> keys;
  for (const auto& [key, value] : fromLimits) keys.insert(std::string(key));
  for (const auto& [key, value] : toLimits) keys.insert(std::string(key));
  for (const auto& key : keys) {
    const auto* a = fromLimits.if_contains(key);
    const auto* b = toLimits.if_contains(key);
    if (a && b && *a == *b) continue;
    limits[key] = json::object{{"from", a ? *a : json::value(nullptr)}, {"to", b ? *b : json::value(nullptr)}};
  }
  return json::object{
      {"capabilities", json::object{{"added", std::move(added)}, {"removed", std::move(removed)}}},
      {"limits", std::move(limits)},
      {"executionClassChanged", from.at("execution").at("class") != to.at("execution").at("class")}};
}

}  // namespace toolhost::registry
