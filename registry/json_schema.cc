#include "registry/json_schema.h"

#include <valijson/adapters/boost_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validation_results.hpp>
#include <valijson/validator.hpp>

#include <exception>

namespace toolhost::registry {

namespace {

// valijson reports a path as {"<root>", "[city]", "[0]"}; we speak JSON pointers.
std::string toPointer(const std::vector<std::string>& context) {
  std::string pointer;
  for (const auto& part : context) {
    if (part == "<root>") continue;
    std::string name = part;
    if (name.size() >= 2 && name.front() == '[' && name.back() == ']') {
      name = name.substr(1, name.size() - 2);
    }
    if (name.size() >= 2 && name.front() == '"' && name.back() == '"') {
      name = name.substr(1, name.size() - 2);
    }
    pointer += '/';
    for (char c : name) {
      if (c == '~') {
        pointer += "~0";
      } else if (c == '/') {
        pointer += "~1";
      } else {
        pointer += c;
      }
    }
  }
  return pointer;
}

}  // namespace

std::string SchemaViolation::describe(std::string_view what) const {
  return std::string(what) + path + ": " + reason;
}

boost::system::result<JsonSchema, SchemaError> JsonSchema::compile(const boost::json::value& schema) {
  if (!schema.is_object() && !schema.is_bool()) {
    return SchemaError{"a JSON Schema must be an object or a boolean"};
  }
  JsonSchema compiled;
  compiled.document_ = std::make_shared<const boost::json::value>(schema);
  auto parsed = std::make_shared<valijson::Schema>();
  try {
    valijson::SchemaParser parser(valijson::SchemaParser::kDraft7);
    valijson::adapters::BoostJsonAdapter adapter(*compiled.document_);
    parser.populateSchema(adapter, *parsed);
  } catch (const std::exception& error) {
    return SchemaError{std::string("invalid JSON Schema: ") + error.what()};
  }
  compiled.schema_ = std::move(parsed);
  return compiled;
}

std::optional<SchemaViolation> JsonSchema::validate(const boost::json::value& instance) const {
  // valijson's Validator caches regexes in itself, so each validation gets its own.
  valijson::Validator validator;
  valijson::ValidationResults results;
  valijson::adapters::BoostJsonAdapter adapter(instance);
  bool ok = false;
  try {
    ok = validator.validate(*schema_, adapter, &results);
  } catch (const std::exception& error) {
    return SchemaViolation{"", std::string("could not be validated: ") + error.what()};
  }
  if (ok) return std::nullopt;
  // The deepest error is the most specific one.
  valijson::ValidationResults::Error error;
  std::optional<SchemaViolation> best;
  std::size_t bestDepth = 0;
  while (results.popError(error)) {
    if (!best || error.context.size() > bestDepth) {
      best = SchemaViolation{toPointer(error.context), error.description};
      bestDepth = error.context.size();
    }
  }
  if (!best) best = SchemaViolation{"", "does not match the schema"};
  return best;
}

}  // namespace toolhost::registry
