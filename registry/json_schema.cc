#include "registry/json_schema.h"

#include "protocol/json_text.h"

#include <valijson/adapters/boost_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validation_results.hpp>
#include <valijson/validator.hpp>

#include <algorithm>
#include <exception>
#include <string_view>
#include <utility>
#include <vector>

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
    protocol::appendPointerToken(pointer, name);
  }
  return pointer;
}

// --- References ---
//
// valijson follows "$ref" while it parses a schema and while it validates, by recursion, with
// no guard: a reference that leads back to itself ({"$ref": "#"}, or "allOf": [{"$ref": "#"}])
// exhausts the stack of the thread, and references that fan out (each level an anyOf of two
// references to the next) take exponential time. So compile() admits only references that end:
// each resolves inside the document, none leads back to itself, and the schema with every
// reference written out in full stays within kMaxExpandedValues values.

constexpr std::size_t kMaxReferences = 1000;
constexpr std::size_t kMaxExpandedValues = 20000;

using Pointer = std::vector<std::string>;

std::string pointerText(const Pointer& pointer) {
  std::string out;
  for (const auto& token : pointer) protocol::appendPointerToken(out, token);
  return out;
}

struct Reference {
  Pointer at;      // the object holding the "$ref"
  Pointer target;  // where it leads
  std::string text;
  std::size_t valuesBelow = 0;  // values in the target's subtree
};

struct ReferenceScan {
  std::vector<Reference> references;
  std::optional<std::string> refusal;
};

// Keywords whose values are data, never schemas.
bool isDataKeyword(std::string_view key) {
  return key == "enum" || key == "const" || key == "default" || key == "examples";
}

void collectReferences(const boost::json::value& node, Pointer& at, ReferenceScan& scan) {
  if (scan.refusal) return;
  if (const auto* object = node.if_object()) {
    for (const auto& [key, value] : *object) {
      if (key == "$ref" && value.is_string()) {
        if (scan.references.size() == kMaxReferences) {
          scan.refusal = "more than " + std::to_string(kMaxReferences) + " references (\"$ref\")";
          return;
        }
        scan.references.push_back(Reference{at, {}, std::string(value.get_string()), 0});
        continue;
      }
      // valijson lets "id" change the base that references resolve against; a tool's schema is
      // one document, so its references are read against that document only.
      if (key == "id" && value.is_string()) {
        scan.refusal = pointerText(at) +
                       "/id: \"id\" is not supported (references resolve "
                       "against this document only)";
        return;
      }
      if (isDataKeyword(key)) continue;
      at.emplace_back(key);
      collectReferences(value, at, scan);
      at.pop_back();
    }
  } else if (const auto* array = node.if_array()) {
    for (std::size_t i = 0; i < array->size(); ++i) {
      at.push_back(std::to_string(i));
      collectReferences((*array)[i], at, scan);
      at.pop_back();
    }
  }
}

std::size_t countValues(const boost::json::value& node) {
  std::size_t count = 1;
  if (const auto* object = node.if_object()) {
    for (const auto& member : *object) count += countValues(member.value());
  } else if (const auto* array = node.if_array()) {
    for (const auto& item : *array) count += countValues(item);
  }
  return count;
}

// Resolves a "#" or "#/..." reference to its pointer and the value there, or says why not.
boost::system::result<std::pair<Pointer, const boost::json::value*>, std::string> resolve(
    const boost::json::value& document, std::string_view text) {
  if (text != "#" && !text.starts_with("#/")) {
    return std::string(
        "only references to a place in this schema (\"#\" or \"#/...\") are resolved");
  }
  if (text.find('%') != std::string_view::npos) {
    return std::string("percent-encoded references are not supported");
  }
  Pointer pointer;
  const boost::json::value* here = &document;
  std::string_view rest = text.substr(1);
  while (!rest.empty()) {
    rest.remove_prefix(1);  // the '/'
    const auto end = std::min(rest.find('/'), rest.size());
    std::string token;
    for (std::size_t i = 0; i < end; ++i) {
      if (rest[i] == '~' && i + 1 < end && (rest[i + 1] == '0' || rest[i + 1] == '1')) {
        token += rest[i + 1] == '0' ? '~' : '/';
        ++i;
      } else {
        token += rest[i];
      }
    }
    rest.remove_prefix(end);
    if (const auto* object = here->if_object()) {
      here = object->if_contains(token);
    } else if (const auto* array = here->if_array()) {
      const bool index = !token.empty() && token.size() <= 9 &&
                         token.find_first_not_of("0123456789") == std::string::npos &&
                         (token == "0" || token.front() != '0');
      here = index && std::stoul(token) < array->size() ? &(*array)[std::stoul(token)] : nullptr;
    } else {
      here = nullptr;
    }
    if (here == nullptr) return std::string("it leads nowhere in this schema");
    pointer.push_back(std::move(token));
  }
  if (!here->is_object() && !here->is_bool()) return std::string("it does not lead to a schema");
  return std::make_pair(std::move(pointer), here);
}

bool isPrefix(const Pointer& prefix, const Pointer& of) {
  return prefix.size() <= of.size() && std::equal(prefix.begin(), prefix.end(), of.begin());
}

std::optional<std::string> checkReferences(const boost::json::value& document) {
  ReferenceScan scan;
  Pointer at;
  collectReferences(document, at, scan);
  if (scan.refusal) return scan.refusal;
  auto& refs = scan.references;
  if (refs.empty()) return std::nullopt;
  for (auto& ref : refs) {
    auto resolved = resolve(document, ref.text);
    if (!resolved) {
      return pointerText(ref.at) + "/$ref: \"" + ref.text + "\": " + resolved.error();
    }
    ref.target = std::move(resolved->first);
    ref.valuesBelow = countValues(*resolved->second);
  }
  // Following reference i reaches every reference inside its target's subtree. A cycle in that
  // graph is a schema that never ends; without one, the expansion is finite and counted.
  const std::size_t n = refs.size();
  std::vector<std::vector<std::size_t>> next(n);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      if (isPrefix(refs[i].target, refs[j].at)) next[i].push_back(j);
    }
  }
  enum class Mark { unseen, open, done };
  std::vector<Mark> mark(n, Mark::unseen);
  std::vector<std::size_t> expanded(n, 0);  // values of the target written out in full
  std::optional<std::string> refusal;
  auto visit = [&](auto&& self, std::size_t i) -> void {
    mark[i] = Mark::open;
    std::size_t total = refs[i].valuesBelow;
    for (std::size_t j : next[i]) {
      if (refusal) return;
      if (mark[j] == Mark::open) {
        refusal = pointerText(refs[j].at) + "/$ref: \"" + refs[j].text +
                  "\" leads back to itself: recursive schemas are not supported";
        return;
      }
      if (mark[j] == Mark::unseen) self(self, j);
      if (refusal) return;
      total += expanded[j];
      if (total > kMaxExpandedValues) break;
    }
    expanded[i] = total;
    mark[i] = Mark::done;
    if (total > kMaxExpandedValues) {
      refusal = pointerText(refs[i].at) + "/$ref: \"" + refs[i].text + "\" stands for more than " +
                std::to_string(kMaxExpandedValues) + " values once its references are written out";
    }
  };
  for (std::size_t i = 0; i < n && !refusal; ++i) {
    if (mark[i] == Mark::unseen) visit(visit, i);
  }
  if (refusal) return refusal;
  std::size_t total = countValues(document);
  for (std::size_t i = 0; i < n; ++i) {
    total += expanded[i];
    if (total > kMaxExpandedValues) {
      return "the schema stands for more than " + std::to_string(kMaxExpandedValues) +
             " values once its references are written out";
    }
  }
  return std::nullopt;
}

}  // namespace

std::string SchemaViolation::describe(std::string_view what) const {
  return std::string(what) + path + ": " + reason;
}

boost::system::result<JsonSchema, SchemaError> JsonSchema::compile(const boost::json::value& schema) {
  if (!schema.is_object() && !schema.is_bool()) {
    return SchemaError{"a JSON Schema must be an object or a boolean"};
  }
  if (auto refused = checkReferences(schema)) return SchemaError{*refused};
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
