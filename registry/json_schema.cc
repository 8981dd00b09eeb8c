#include "registry/json_schema.h"

#include "protocol/json_parse.h"
#include "protocol/json_text.h"
#include "registry/pattern.h"

#include <valijson/adapters/boost_json_adapter.hpp>
#include <valijson/constraint_builder.hpp>
#include <valijson/constraints/concrete_constraints.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validation_results.hpp>
#include <valijson/validator.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <exception>
#include <functional>
#include <map>
#include <new>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

namespace toolhost::registry {

namespace {

// --- Where schemas stand ---

// How the value of a schema's keyword is read (draft 7, as valijson reads it).
enum class Place { schema, schemaList, schemaMap, data };

Place placeOf(std::string_view key, const boost::json::value& value) {
  if (key == "enum" || key == "const" || key == "default" || key == "examples") return Place::data;
  if (key == "allOf" || key == "anyOf" || key == "oneOf") return Place::schemaList;
  if (key == "items") return value.is_array() ? Place::schemaList : Place::schema;
  if (key == "properties" || key == "patternProperties" || key == "definitions" || key == "$defs" ||
      key == "dependencies") {
    return Place::schemaMap;
  }
  // not, if, then, else, additionalItems, additionalProperties, contains, propertyNames, and
  // every keyword valijson does not know (read as a schema: a reference may lead into it).
  return Place::schema;
}

using Pointer = std::vector<std::string>;

std::string pointerText(const Pointer& pointer) {
  std::string out;
  for (const auto& token : pointer) protocol::appendPointerToken(out, token);
  return out;
}

using SchemaVisitor = std::function<void(const boost::json::object&, const Pointer&)>;

void visitSchema(const boost::json::value& node, Pointer& at, const SchemaVisitor& visit) {
  if (const auto* array = node.if_array()) {  // not a schema: read each element as one
    for (std::size_t i = 0; i < array->size(); ++i) {
      at.push_back(std::to_string(i));
      visitSchema((*array)[i], at, visit);
      at.pop_back();
    }
    return;
  }
  const auto* object = node.if_object();
  if (object == nullptr) return;
  visit(*object, at);
  for (const auto& [key, value] : *object) {
    const Place place = placeOf(key, value);
    if (place == Place::data) continue;
    at.emplace_back(key);
    if (place == Place::schemaMap && value.is_object()) {
      for (const auto& [name, member] : value.get_object()) {
        at.emplace_back(name);
        visitSchema(member, at, visit);
        at.pop_back();
      }
    } else {
      visitSchema(value, at, visit);  // a schema, or a list of them (an array)
    }
    at.pop_back();
  }
}

// valijson evaluates "pattern" with std::regex, which a hostile string drives to exponential
// time or a stack overflow. What valijson reads has each "pattern" under this keyword of ours
// instead, which it hands to PatternCheck (below): registry::Pattern, linear in the string.
constexpr std::string_view kPatternKeyword = "toolhost:pattern";

// What strip() rewrites for valijson.
enum class Rewrite {
  none,
  // Every "multipleOf" becomes a double (checkKeywords() admitted only numbers > 0): valijson's
  // integer form truncates a fractional instance to an integer (4.5 passed multipleOf 2; a huge
  // one is undefined behaviour) before taking `%`. Every "pattern" moves to kPatternKeyword, and
  // a kPatternKeyword the schema wrote itself is dropped.
  forValijson,
};

// The schema without `keyword` wherever a schema stands, rewritten as `rewrite` says.
boost::json::value strip(const boost::json::value& node, std::string_view keyword,
                         Rewrite rewrite = Rewrite::none) {
  if (const auto* array = node.if_array()) {
    boost::json::array out;
    for (const auto& item : *array) out.push_back(strip(item, keyword, rewrite));
    return out;
  }
  const auto* object = node.if_object();
  if (object == nullptr) return node;
  boost::json::object out;
  for (const auto& [key, value] : *object) {
    if (!keyword.empty() && key == keyword) continue;
    const bool forValijson = rewrite == Rewrite::forValijson;
    if (forValijson && key == kPatternKeyword) continue;
    const Place place = placeOf(key, value);
    if (forValijson && key == "multipleOf" && value.is_number()) {
      out[key] = value.to_number<double>();
    } else if (forValijson && key == "pattern") {
      out[kPatternKeyword] = value;
    } else if (place == Place::data) {
      out[key] = value;
    } else if (place == Place::schemaMap && value.is_object()) {
      boost::json::object members;
      for (const auto& [name, member] : value.get_object()) {
        members[name] = strip(member, keyword, rewrite);
      }
      out[key] = std::move(members);
    } else {
      out[key] = strip(value, keyword, rewrite);
    }
  }
  return out;
}

// Keywords valijson reads without checking them in a way that can bring the process down:
// "multipleOf" 0 (or a string of digits, which it reads as a number) is an integer division by
// zero at the first validation, -1 one that overflows for the smallest integer. Draft 7 asks
// for a number strictly greater than 0.
std::optional<std::string> checkKeywords(const boost::json::value& document) {
  std::optional<std::string> refusal;
  Pointer at;
  visitSchema(document, at, [&](const boost::json::object& node, const Pointer& where) {
    const auto* divisor = node.if_contains("multipleOf");
    if (refusal || divisor == nullptr) return;
    const bool positive = divisor->is_number() && std::isfinite(divisor->to_number<double>()) &&
                          divisor->to_number<double>() > 0;
    if (!positive) {
      refusal = pointerText(where) + "/multipleOf: must be a number greater than 0";
    }
  });
  return refusal;
}

// --- Patterns ---

using PatternTable = std::map<std::string, Pattern, std::less<>>;

// The programs of one schema's patterns, summed (12 bytes an instruction): a 7-byte `a{9999}`
// is 10,000 of them, so without a bound a schema's patterns could hold gigabytes.
constexpr std::size_t kMaxSchemaPatternInstructions = 50'000;

// Every "pattern" where a schema stands, compiled (a source written twice is compiled once), or
// the first that does not compile, with its place. `instructions` sums the programs' sizes.
std::optional<std::string> compilePatterns(const boost::json::value& document, PatternTable& table,
                                           std::size_t& instructions) {
  std::optional<std::string> refusal;
  Pointer at;
  visitSchema(document, at, [&](const boost::json::object& node, const Pointer& where) {
    const auto* source = node.if_contains("pattern");
    if (refusal || source == nullptr) return;
    if (!source->is_string()) {
      refusal = pointerText(where) + "/pattern: must be a string (a regular expression)";
      return;
    }
    const std::string_view text = source->get_string();
    if (table.find(text) != table.end()) return;
    auto compiled = Pattern::compile(text);
    if (!compiled) {
      refusal = pointerText(where) + "/pattern: " + compiled.error().detail;
      return;
    }
    instructions += compiled->instructions();
    if (instructions > kMaxSchemaPatternInstructions) {
      refusal = pointerText(where) + "/pattern: the schema's patterns come to more than " +
                std::to_string(kMaxSchemaPatternInstructions) +
                " instructions of the matcher (each is held in memory while the schema is)";
      return;
    }
    table.emplace(std::string(text), std::move(*compiled));
  });
  return refusal;
}

// The budget of the pattern matching of the validation this thread runs (JsonSchema::validate
// sets it): PatternCheck is called by valijson, which passes no state of ours.
struct PatternBudget {
  std::uint64_t steps = JsonSchema::kMaxPatternSteps;
  bool exhausted = false;
};
thread_local PatternBudget* tPatternBudget = nullptr;

class ScopedPatternBudget {
 public:
  ScopedPatternBudget() : previous_(std::exchange(tPatternBudget, &budget_)) {}
  ~ScopedPatternBudget() { tPatternBudget = previous_; }
  ScopedPatternBudget(const ScopedPatternBudget&) = delete;
  ScopedPatternBudget& operator=(const ScopedPatternBudget&) = delete;
  bool exhausted() const { return budget_.exhausted; }

 private:
  PatternBudget budget_;
  PatternBudget* previous_;
};

constexpr std::string_view kPatternFailed = "Failed to match toolhost pattern.";
constexpr std::string_view kPropertyFailed =
    "Failed to validate against schema associated with property name '";
constexpr std::string_view kPatternUnchecked = "Not matched: toolhost pattern budget spent.";

// A combinator's failure in our words. Whatever failed inside it and said so at a deeper place
// ranks above it; at its own place it ranks above its branches' failures, which each tell only
// part of the story.
std::optional<std::string_view> combinatorWords(const std::string& description) {
  static constexpr std::pair<std::string_view, std::string_view> kCombinators[] = {
      {"Failed to validate against any schemas allowed by anyOf constraint.",
       "matches none of the schemas its \"anyOf\" allows"},
      {"Failed to validate against any child schemas allowed by oneOf constraint.",
       "matches none of the schemas its \"oneOf\" allows"},
      {"Failed to validate against exactly one child schema.",
       "matches more than one of the schemas its \"oneOf\" allows"},
      {"Failed to validate against a conditional schema set by if-then-else constraints.",
       "does not match the schema its \"if\" selects (\"then\" or \"else\")"},
      {"Failed to any values against subschema in 'contains' constraint.",
       "holds no item that its \"contains\" schema allows"},
      {"Failed to validate against additional properties schema",
       "has a property that its \"additionalProperties\" schema does not allow"},
      {"Failed to validate against dependent schema.",
       "does not match a schema its \"dependencies\" require"}};
  for (const auto& [words, ours] : kCombinators) {
    if (description == words) return ours;
  }
  return std::nullopt;
}

// The member whose subschema failed, when valijson says so in words at the parent's place (a
// property by name, an item by index): the error then belongs at the member's place.
std::optional<std::string> failedChild(const std::string& description) {
  auto between = [&](std::string_view prefix,
                     std::string_view suffix) -> std::optional<std::string> {
    if (description.size() < prefix.size() + suffix.size() || !description.starts_with(prefix) ||
        !description.ends_with(suffix)) {
      return std::nullopt;
    }
    return description.substr(prefix.size(), description.size() - prefix.size() - suffix.size());
  };
  if (auto name = between(kPropertyFailed, "'.")) return name;
  for (std::string_view suffix : {" in array.", " against additional items schema."}) {
    auto index = between("Failed to validate item #", suffix);
    if (index && !index->empty() && index->find_first_not_of("0123456789") == std::string::npos) {
      return index;
    }
  }
  return std::nullopt;
}

// kPatternKeyword as valijson evaluates it. A string that would take the pattern matcher past
// the validation's budget fails, and marks the budget spent: validate() then answers that the
// strings took too long to check, whatever valijson concluded (under "not" a failure passes).
class PatternCheck final : public valijson::constraints::PolyConstraint {
 public:
  explicit PatternCheck(Pattern pattern) : pattern_(std::move(pattern)) {}

  bool validate(const valijson::adapters::Adapter& target, const std::vector<std::string>& context,
                valijson::ValidationResults* results) const override {
    std::string subject;
    if (!target.isString() || !target.getString(subject)) return true;
    PatternBudget fallback;  // validate() always sets one; this only keeps the bound without it
    PatternBudget& budget = tPatternBudget != nullptr ? *tPatternBudget : fallback;
    std::optional<bool> found;
    if (!budget.exhausted) found = pattern_.search(subject, budget.steps);
    if (!found) budget.exhausted = true;
    if (found && *found) return true;
    if (results != nullptr) {
      results->pushError(context, std::string(found ? kPatternFailed : kPatternUnchecked));
    }
    return false;
  }

 private:
  Constraint* cloneInto(void* memory) const override { return new (memory) PatternCheck(*this); }
  std::size_t sizeOf() const override { return sizeof(PatternCheck); }

  Pattern pattern_;
};

class PatternBuilder final : public valijson::ConstraintBuilder {
 public:
  explicit PatternBuilder(const PatternTable& table) : table_(table) {}

  valijson::constraints::Constraint* make(const valijson::adapters::Adapter& value) const override {
    std::string source;
    auto found = value.getString(source) ? table_.find(source) : table_.end();
    // compilePatterns() saw every pattern where valijson reads one.
    if (found == table_.end()) throw std::logic_error("a pattern that was not compiled");
    return new PatternCheck(found->second);
  }

 private:
  const PatternTable& table_;
};

// --- References ---
//
// valijson follows "$ref" while it parses a schema and while it validates, by recursion, with
// no guard: a reference that leads back to itself ({"$ref": "#"}, or "allOf": [{"$ref": "#"}])
// exhausts the stack of the thread, and references that fan out (each level an anyOf of two
// references to the next) take exponential time. So compile() admits only references that end:
// each resolves, where a schema stands, inside the document (read exactly as valijson reads it:
// no empty or percent-encoded tokens, which it reads differently), none leads back to itself,
// and the schema with every reference written out in full stays within kMaxExpandedValues
// values (which bounds a schema without references too).

constexpr std::size_t kMaxReferences = 1000;
constexpr std::size_t kMaxSchemaDepth = 128;
constexpr std::size_t kMaxExpandedValues = 20000;
// Past this many values an instance's violation is reported without its place.
constexpr std::size_t kMaxDiagnosedValues = 100'000;

struct Reference {
  Pointer at;      // the object holding the "$ref"
  Pointer target;  // where it leads
  std::string text;
  std::size_t valuesBelow = 0;  // values in the target's subtree
};

std::size_t countValues(const boost::json::value& node) {
  std::size_t count = 1;
  if (const auto* object = node.if_object()) {
    for (const auto& member : *object) count += countValues(member.value());
  } else if (const auto* array = node.if_array()) {
    for (const auto& item : *array) count += countValues(item);
  }
  return count;
}

std::optional<std::size_t> arrayIndex(const std::string& token, std::size_t size) {
  const bool digits = !token.empty() && token.size() <= 9 &&
                      token.find_first_not_of("0123456789") == std::string::npos &&
                      (token == "0" || token.front() != '0');
  if (!digits || std::stoul(token) >= size) return std::nullopt;
  return std::stoul(token);
}

// Resolves a "#" or "#/..." reference to its pointer and the schema there, or says why not.
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
  Place place = Place::schema;
  std::string_view rest = text.substr(1);
  while (!rest.empty()) {
    rest.remove_prefix(1);  // the '/'
    const auto end = std::min(rest.find('/'), rest.size());
    if (end == 0) return std::string("empty tokens (\"//\", a trailing \"/\") are not supported");
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
    const boost::json::value* next = nullptr;
    Place nextPlace = Place::schema;
    if (const auto* array = here->if_array()) {  // a list of schemas (or not a schema at all)
      if (auto index = arrayIndex(token, array->size())) next = &(*array)[*index];
    } else if (const auto* object = here->if_object()) {
      next = object->if_contains(token);
      // A member of a map of schemas is a schema; a schema's member is read by its keyword.
      if (next != nullptr && place != Place::schemaMap) nextPlace = placeOf(token, *next);
    }
    if (next == nullptr) return std::string("it leads nowhere in this schema");
    if (nextPlace == Place::data) {
      return std::string("it leads into the data of \"" + token + "\", not to a schema");
    }
    here = next;
    place = nextPlace;
    pointer.push_back(std::move(token));
  }
  if (place != Place::schema || (!here->is_object() && !here->is_bool())) {
    return std::string("it does not lead to a schema");
  }
  return std::make_pair(std::move(pointer), here);
}

bool isPrefix(const Pointer& prefix, const Pointer& of) {
  return prefix.size() <= of.size() && std::equal(prefix.begin(), prefix.end(), of.begin());
}

std::optional<std::string> checkReferences(const boost::json::value& document,
                                           std::size_t& expandedValues) {
  const std::size_t documentValues = countValues(document);
  expandedValues = documentValues;
  if (documentValues > kMaxExpandedValues) {
    return "the schema has more than " + std::to_string(kMaxExpandedValues) + " values";
  }
  std::vector<Reference> refs;
  std::optional<std::string> refusal;
  Pointer at;
  visitSchema(document, at, [&](const boost::json::object& node, const Pointer& where) {
    if (refusal) return;
    // valijson lets "id" change the base that references resolve against; a tool's schema is
    // one document, so its references are read against that document only.
    if (const auto* id = node.if_contains("id"); id != nullptr && id->is_string()) {
      refusal = pointerText(where) +
                "/id: \"id\" is not supported (references resolve against this document only)";
      return;
    }
    const auto* ref = node.if_contains("$ref");
    if (ref == nullptr || !ref->is_string()) return;
    if (refs.size() == kMaxReferences) {
      refusal = "more than " + std::to_string(kMaxReferences) + " references (\"$ref\")";
      return;
    }
    refs.push_back(Reference{where, {}, std::string(ref->get_string()), 0});
  });
  if (refusal) return refusal;
  if (refs.empty()) return std::nullopt;
  std::map<Pointer, std::size_t> valuesAt;  // by target, counted once
  for (auto& ref : refs) {
    auto resolved = resolve(document, ref.text);
    if (!resolved) {
      return pointerText(ref.at) + "/$ref: \"" + ref.text + "\": " + resolved.error();
    }
    ref.target = std::move(resolved->first);
    auto [counted, fresh] = valuesAt.try_emplace(ref.target, 0);
    if (fresh) counted->second = countValues(*resolved->second);
    ref.valuesBelow = counted->second;
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
  std::size_t total = documentValues;
  for (std::size_t i = 0; i < n; ++i) {
    total += expanded[i];
    if (total > kMaxExpandedValues) {
      return "the schema stands for more than " + std::to_string(kMaxExpandedValues) +
             " values once its references are written out";
    }
  }
  expandedValues = total;
  return std::nullopt;
}

std::shared_ptr<const valijson::Schema> parseSchema(const boost::json::value& document,
                                                    const PatternTable& patterns) {
  auto parsed = std::make_shared<valijson::Schema>();
  valijson::SchemaParser parser(valijson::SchemaParser::kDraft7);
  parser.addConstraintBuilder(std::string(kPatternKeyword), new PatternBuilder(patterns));
  valijson::adapters::BoostJsonAdapter adapter(document);
  parser.populateSchema(adapter, *parsed);
  return parsed;
}

// Values in an instance (as countValues), and whether one is an integer above 2^63.
std::size_t countInstance(const boost::json::value& node, bool& wide, bool& nul) {
  std::size_t count = 1;
  if (const auto* object = node.if_object()) {
    for (const auto& member : *object) {
      if (member.key().find('\0') != std::string_view::npos) nul = true;
      count += countInstance(member.value(), wide, nul);
    }
  } else if (const auto* array = node.if_array()) {
    for (const auto& item : *array) count += countInstance(item, wide, nul);
  } else if (node.is_uint64()) {
    wide = true;
  } else if (const auto* text = node.if_string()) {
    if (text->find('\0') != boost::json::string::npos) nul = true;
  }
  return count;
}

// The place of the first string or property name holding U+0000 in `node`, and whether it is a
// name. valijson reads strings only up to such a character (it compares, measures and matches
// them through c_str()): "abc\u0000zzz" would pass an enum of "abc".
std::optional<std::pair<std::string, bool>> firstNul(const boost::json::value& node,
                                                     std::string& pointer) {
  if (const auto* object = node.if_object()) {
    for (const auto& member : *object) {
      if (member.key().find('\0') != std::string_view::npos) {
        return std::pair{pointer, true};
      }
      const std::size_t size = pointer.size();
      protocol::appendPointerToken(pointer, member.key());
      if (auto found = firstNul(member.value(), pointer)) return found;
      pointer.resize(size);
    }
  } else if (const auto* array = node.if_array()) {
    for (std::size_t i = 0; i < array->size(); ++i) {
      const std::size_t size = pointer.size();
      pointer += '/' + std::to_string(i);
      if (auto found = firstNul((*array)[i], pointer)) return found;
      pointer.resize(size);
    }
  } else if (const auto* text = node.if_string()) {
    if (text->find('\0') != boost::json::string::npos) return std::pair{pointer, false};
  }
  return std::nullopt;
}

boost::json::value withWideIntegersAsDoubles(const boost::json::value& node) {
  if (const auto* object = node.if_object()) {
    boost::json::object out;
    out.reserve(object->size());
    for (const auto& [key, value] : *object) out.emplace(key, withWideIntegersAsDoubles(value));
    return out;
  }
  if (const auto* array = node.if_array()) {
    boost::json::array out;
    out.reserve(array->size());
    for (const auto& item : *array) out.push_back(withWideIntegersAsDoubles(item));
    return out;
  }
  if (node.is_uint64()) return static_cast<double>(node.get_uint64());
  return node;
}

// --- Words for a violation ---
//
// valijson's descriptions name the constraint that failed ("Value type not permitted by 'type'
// constraint."), not what to write instead. For the common ones, the schema and the value at the
// violation's place give the words: the type it must have, the properties it takes, the values
// it may be, the bound it passed.

// valijson's context ({"<root>", "[city]", "[0]"}) as pointer tokens.
std::vector<std::string> contextTokens(const std::vector<std::string>& context) {
  std::vector<std::string> tokens;
  for (const auto& part : context) {
    if (part == "<root>") continue;
    std::string name = part;
    // valijson writes "[name]" and "[index]", a name as it is (quotes in it are its own).
    if (name.size() >= 2 && name.front() == '[' && name.back() == ']') {
      name = name.substr(1, name.size() - 2);
    }
    tokens.push_back(std::move(name));
  }
  return tokens;
}

// The violation's place as a JSON pointer.
std::string toPointer(const std::vector<std::string>& context) {
  std::string pointer;
  for (const auto& token : contextTokens(context)) protocol::appendPointerToken(pointer, token);
  return pointer;
}

// The schema object that applies at `tokens` when the path leads through "properties",
// "additionalProperties" and "items" alone (references followed); nullptr otherwise (a
// combinator, a pattern), when the caller says less.
const boost::json::object* schemaAt(const boost::json::value& document,
                                    const std::vector<std::string>& tokens,
                                    const boost::json::value& instance) {
  auto follow = [&](const boost::json::value* node) -> const boost::json::object* {
    // compile() admitted only references that end; the count is a second guard.
    for (int hops = 0; node != nullptr && hops < 64; ++hops) {
      const auto* object = node->if_object();
      if (object == nullptr) return nullptr;
      const auto* ref = object->if_contains("$ref");
      if (ref == nullptr || !ref->is_string()) return object;
      auto resolved = resolve(document, ref->get_string());
      node = resolved ? resolved->second : nullptr;
    }
    return nullptr;
  };
  const boost::json::object* node = follow(&document);
  const boost::json::value* value = &instance;
  for (const auto& token : tokens) {
    if (node == nullptr || value == nullptr) return nullptr;
    const boost::json::value* next = nullptr;
    if (const auto* object = value->if_object()) {
      value = object->if_contains(token);
      const auto* properties = node->if_contains("properties");
      if (properties != nullptr && properties->is_object()) {
        next = properties->get_object().if_contains(token);
      }
      if (next == nullptr) next = node->if_contains("additionalProperties");
    } else if (const auto* array = value->if_array()) {
      auto index = arrayIndex(token, array->size());
      if (!index) return nullptr;
      value = &(*array)[*index];
      const auto* items = node->if_contains("items");
      if (items != nullptr && items->is_array()) {
        next = *index < items->get_array().size() ? &items->get_array()[*index]
                                                  : node->if_contains("additionalItems");
      } else {
        next = items;
      }
    } else {
      return nullptr;
    }
    node = follow(next);
  }
  return node;
}

const boost::json::value* valueAt(const boost::json::value& instance,
                                  const std::vector<std::string>& tokens) {
  const boost::json::value* value = &instance;
  for (const auto& token : tokens) {
    if (const auto* object = value->if_object()) {
      value = object->if_contains(token);
    } else if (const auto* array = value->if_array()) {
      auto index = arrayIndex(token, array->size());
      value = index ? &(*array)[*index] : nullptr;
    } else {
      value = nullptr;
    }
    if (value == nullptr) return nullptr;
  }
  return value;
}

std::string kindOf(const boost::json::value& value) {
  switch (value.kind()) {
    case boost::json::kind::null:
      return "null";
    case boost::json::kind::bool_:
      return "a boolean";
    case boost::json::kind::string:
      return "a string";
    case boost::json::kind::array:
      return "an array";
    case boost::json::kind::object:
      return "an object";
    default:
      return "a number";
  }
}

std::string typeWords(std::string_view type) {
  if (type == "null") return "null";
  if (type == "integer" || type == "array" || type == "object") return "an " + std::string(type);
  return "a " + std::string(type);
}

// A JSON value as the message shows it: its text, cut short.
std::string shown(const boost::json::value& value, std::size_t limit = 60) {
  std::string text = protocol::writeJson(value);
  if (text.size() > limit) {
    std::size_t cut = limit;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0U) == 0x80U) --cut;
    text = text.substr(0, cut) + "...";
  }
  return text;
}

// "1440.000000" (std::to_string of a double) as "1440", "0.500000" as "0.5".
std::string trimmedNumbers(std::string text) {
  std::string out;
  std::size_t i = 0;
  while (i < text.size()) {
    if (text[i] == '.' && i > 0 && std::isdigit(static_cast<unsigned char>(text[i - 1])) &&
        i + 1 < text.size() && std::isdigit(static_cast<unsigned char>(text[i + 1]))) {
      std::size_t end = i + 1;
      while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
      std::string fraction = text.substr(i + 1, end - i - 1);
      while (!fraction.empty() && fraction.back() == '0') fraction.pop_back();
      if (!fraction.empty()) out += "." + fraction;
      i = end;
      continue;
    }
    out += text[i++];
  }
  return out;
}

std::string explained(const boost::json::value& document, const boost::json::value& instance,
                      const std::vector<std::string>& tokens, const std::string& description) {
  const boost::json::value* value = valueAt(instance, tokens);
  const boost::json::object* node = schemaAt(document, tokens, instance);
  // Numbers, booleans and null are shown; a string is not (settings and arguments may hold
  // what should not reach an answer or the log).
  const std::string itIs = value == nullptr || value->is_string() || value->is_structured()
                               ? ""
                               : " (it is " + shown(*value) + ")";

  if (description.starts_with("Value type not permitted")) {
    const std::string actual = value != nullptr ? " (it is " + kindOf(*value) + ")" : "";
    const auto* type = node != nullptr ? node->if_contains("type") : nullptr;
    std::string expected;
    if (type != nullptr && type->is_string()) {
      expected = typeWords(type->get_string());
    } else if (type != nullptr && type->is_array()) {
      for (const auto& each : type->get_array()) {
        if (!each.is_string()) continue;
        if (!expected.empty()) expected += " or ";
        expected += typeWords(each.get_string());
      }
    }
    if (expected.empty()) return "has a type the schema does not allow" + actual;
    return "must be " + expected + actual;
  }
  constexpr std::string_view kUnknown =
      "Object contains a property that could not be validated using 'properties' or "
      "'additionalProperties' constraints: '";
  if (description.starts_with(kUnknown) && description.ends_with("'.")) {
    const std::string name =
        description.substr(kUnknown.size(), description.size() - kUnknown.size() - 2);
    std::string message = "has no property " + shown(boost::json::value(name));
    const auto* properties = node != nullptr ? node->if_contains("properties") : nullptr;
    if (properties != nullptr && properties->is_object() && !properties->get_object().empty()) {
      message += "; the properties it takes are ";
      std::size_t listed = 0;
      for (const auto& [key, ignored] : properties->get_object()) {
        if (listed == 20) {
          message += ", ...";
          break;
        }
        if (listed++ > 0) message += ", ";
        message += shown(boost::json::value(key), 40);
      }
    } else {
      message += "; it takes no properties but those the schema names";
    }
    return message;
  }
  if (description == kPropertyFailed) {
    const auto* names = node != nullptr ? node->if_contains("propertyNames") : nullptr;
    if (names != nullptr && value != nullptr && value->is_object()) {
      return "has a property name that its \"propertyNames\" schema does not allow";
    }
    return "does not match its schema";
  }
  if (auto words = combinatorWords(description)) return std::string(*words);
  // Sizes, in words of ours; an array's or an object's own size is shown, a string's is not.
  struct Size {
    std::string_view prefix, suffix, words, units, unit;
  };
  static constexpr Size kSizes[] = {
      {"String should be no fewer than ", " characters in length.", "must be at least ",
       " characters long", " character long"},
      {"String should be no more than ", " characters in length.", "must be at most ",
       " characters long", " character long"},
      {"Array should contain no fewer than ", " elements.", "must have at least ", " items",
       " item"},
      {"Array should contain no more than ", " elements.", "must have at most ", " items", " item"},
      {"Object should have no fewer than ", " properties.", "must have at least ", " properties",
       " property"},
      {"Object should have no more than ", " properties.", "must have at most ", " properties",
       " property"}};
  for (const auto& size : kSizes) {
    if (!description.starts_with(size.prefix) || !description.ends_with(size.suffix) ||
        description.size() <= size.prefix.size() + size.suffix.size()) {
      continue;
    }
    const std::string bound = description.substr(
        size.prefix.size(), description.size() - size.prefix.size() - size.suffix.size());
    std::string has;
    if (value != nullptr && value->is_array()) {
      has = " (it has " + std::to_string(value->get_array().size()) + ")";
    } else if (value != nullptr && value->is_object()) {
      has = " (it has " + std::to_string(value->get_object().size()) + ")";
    }
    return std::string(size.words) + bound + std::string(bound == "1" ? size.unit : size.units) +
           has;
  }
  constexpr std::string_view kRequired = "Missing required property '";
  if (description.starts_with(kRequired) && description.ends_with("'.")) {
    const std::string name =
        description.substr(kRequired.size(), description.size() - kRequired.size() - 2);
    return "lacks the required property " + shown(boost::json::value(name), 80);
  }
  if (description == kPatternFailed) {
    const auto* pattern = node != nullptr ? node->if_contains("pattern") : nullptr;
    if (pattern == nullptr || !pattern->is_string()) {
      return "does not match a pattern the schema requires";
    }
    return "must match the pattern " + shown(*pattern, 200);
  }
  if (description.starts_with("Failed to match against any enum values")) {
    const auto* values = node != nullptr ? node->if_contains("enum") : nullptr;
    if (values == nullptr || !values->is_array()) return "is not one of the values allowed" + itIs;
    std::string list;
    std::size_t listed = 0;
    for (const auto& each : values->get_array()) {
      if (listed == 10 || list.size() > 200) {
        list += ", ...";
        break;
      }
      if (listed++ > 0) list += ", ";
      list += shown(each, 40);
    }
    return "must be one of " + list + itIs;
  }
  if (description.starts_with("Failed to match expected value set by 'const'")) {
    const auto* expected = node != nullptr ? node->if_contains("const") : nullptr;
    if (expected == nullptr) return "is not the value the schema requires" + itIs;
    return "must be " + shown(*expected) + itIs;
  }
  // The bound as the schema writes it (valijson prints six decimals: 1e-7 would read 0).
  struct Bound {
    std::string_view prefix, words, keyword, exclusive;
  };
  static constexpr Bound kBounds[] = {
      {"Expected number less than or equal to ", "must be at most ", "maximum", ""},
      {"Expected number less than ", "must be less than ", "exclusiveMaximum", "maximum"},
      {"Expected number greater than or equal to ", "must be at least ", "minimum", ""},
      {"Expected number greater than ", "must be greater than ", "exclusiveMinimum", "minimum"},
      {"Value should be a multiple of ", "must be a multiple of ", "multipleOf", ""}};
  for (const auto& bound : kBounds) {
    if (!description.starts_with(bound.prefix)) continue;
    std::string number = trimmedNumbers(description.substr(bound.prefix.size()));
    const boost::json::value* written = nullptr;
    for (std::string_view keyword : {bound.keyword, bound.exclusive}) {
      if (written == nullptr && node != nullptr && !keyword.empty()) {
        if (const auto* found = node->if_contains(keyword); found && found->is_number()) {
          written = found;
        }
      }
    }
    if (written != nullptr) number = protocol::writeJson(*written);
    return std::string(bound.words) + number + itIs;
  }
  return trimmedNumbers(description);
}

}  // namespace

void forEachSubschema(
    const boost::json::value& schema,
    const std::function<void(const boost::json::object&, const std::string&)>& visit) {
  Pointer at;
  visitSchema(schema, at, [&](const boost::json::object& node, const Pointer& where) {
    visit(node, pointerText(where));
  });
}

boost::json::value withoutKeyword(const boost::json::value& schema, std::string_view keyword) {
  return strip(schema, keyword);
}

std::string SchemaViolation::describe(std::string_view what) const {
  return std::string(what) + path + ": " + reason;
}

boost::system::result<JsonSchema, SchemaError> JsonSchema::compile(const boost::json::value& schema) {
  if (!schema.is_object() && !schema.is_bool()) {
    return SchemaError{"a JSON Schema must be an object or a boolean"};
  }
  // valijson's parser takes about 10 KB of stack per level of a schema (more in a debug or
  // sanitizer build): the 1000 levels [limits] max_depth allows would overflow a thread's 8 MiB.
  if (const std::size_t depth = protocol::jsonDepth(schema); depth > kMaxSchemaDepth) {
    return SchemaError{"the schema nests " + std::to_string(depth) +
                       " levels of JSON deep; a schema may nest at most " +
                       std::to_string(kMaxSchemaDepth)};
  }
  {
    std::string pointer;
    if (auto found = firstNul(schema, pointer)) {
      return SchemaError{
          "the schema " + std::string(found->second ? "has a property name" : "has a string") +
          " holding the character U+0000 (NUL)" +
          (pointer.empty() ? std::string() : " at " + pointer) + "; a schema may not hold one"};
    }
  }
  JsonSchema compiled;
  if (auto refused = checkReferences(schema, compiled.expandedValues_)) {
    return SchemaError{*refused};
  }
  if (auto refused = checkKeywords(schema)) return SchemaError{*refused};
  // Annotations are never compared with an instance: they do not count against the bound of a
  // validation (enum and const values do).
  std::size_t annotations = 0;
  Pointer at;
  visitSchema(schema, at, [&](const boost::json::object& node, const Pointer&) {
    for (const char* keyword : {"examples", "default"}) {
      if (const auto* data = node.if_contains(keyword)) annotations += countValues(*data);
    }
  });
  compiled.expandedValues_ -= std::min(annotations, compiled.expandedValues_ - 1);
  PatternTable patterns;
  if (auto refused = compilePatterns(schema, patterns, compiled.patternInstructions_)) {
    return SchemaError{*refused};
  }
  compiled.document_ = std::make_shared<const boost::json::value>(schema);
  try {
    compiled.validatedDocument_ =
        std::make_shared<const boost::json::value>(strip(schema, "", Rewrite::forValijson));
    compiled.schema_ = parseSchema(*compiled.validatedDocument_, patterns);
    compiled.diagnosticDocument_ = std::make_shared<const boost::json::value>(
        strip(schema, "uniqueItems", Rewrite::forValijson));
    compiled.diagnostic_ = parseSchema(*compiled.diagnosticDocument_, patterns);
  } catch (const std::exception& error) {
    return SchemaError{std::string("invalid JSON Schema: ") + error.what()};
  }
  return compiled;
}

std::size_t JsonSchema::checkCost(const boost::json::object& instance) const {
  std::size_t values = 1;
  auto walk = [&](const auto& self, const boost::json::value& node) -> void {
    ++values;
    if (const auto* object = node.if_object()) {
      for (const auto& member : *object) self(self, member.value());
    } else if (const auto* array = node.if_array()) {
      for (const auto& item : *array) self(self, item);
    }
  };
  for (const auto& member : instance) walk(walk, member.value());
  // With patterns, any instance may cost the whole pattern budget (twice, with the diagnostic
  // pass): a short string or a property name, a pattern used through many references.
  const std::size_t matching = patternInstructions_ == 0 ? 0 : 2 * kMaxPatternSteps;
  return values * expandedValues_ + matching;
}

std::optional<SchemaViolation> JsonSchema::patternsTooCostly() {
  return SchemaViolation{"", "too costly to check: its strings take more than " +
                                 std::to_string(kMaxPatternSteps) +
                                 " steps of the pattern matcher against the schema's patterns"};
}

std::optional<SchemaViolation> JsonSchema::validate(const boost::json::value& given,
                                                    std::size_t maxPairs) const {
  bool wide = false;
  bool nul = false;
  const std::size_t values = countInstance(given, wide, nul);
  if (values > maxPairs / std::max<std::size_t>(expandedValues_, 1)) {
    return SchemaViolation{"", "too large to check: " + std::to_string(values) +
                                   " values against a schema of " +
                                   std::to_string(expandedValues_) + " values (at most " +
                                   std::to_string(maxPairs) + " pairs of them are checked)"};
  }
  if (nul) {
    std::string pointer;
    if (auto found = firstNul(given, pointer)) {
      return SchemaViolation{found->first,
                             std::string(found->second ? "has a property name" : "is a string") +
                                 " holding the character U+0000 (NUL), which "
                                 "strings checked against a schema may not hold "
                                 "(send such data encoded, as base64)"};
    }
  }
  // valijson skips the numeric keywords for an integer above 2^63 (stored as unsigned): check
  // a copy where such integers are doubles, as JavaScript reads them anyway.
  boost::json::value widened;
  if (wide) widened = withWideIntegersAsDoubles(given);
  const boost::json::value& instance = wide ? widened : given;
  valijson::adapters::BoostJsonAdapter adapter(instance);
  // First without collecting errors: valijson then stops at the first constraint that fails
  // (maxItems before uniqueItems). valijson's Validator caches regexes in itself, so each
  // validation gets its own.
  try {
    ScopedPatternBudget budget;
    valijson::Validator validator;
    const bool valid = validator.validate(*schema_, adapter, nullptr);
    if (budget.exhausted()) return patternsTooCostly();
    if (valid) return std::nullopt;
  } catch (const std::exception& error) {
    return SchemaViolation{"", std::string("could not be validated: ") + error.what()};
  }
  // Collecting errors, valijson records one (with its path) for every value that fails: 1.8 GB
  // for 4 million wrong items. Past a size, the violation is reported without its place.
  if (values > kMaxDiagnosedValues) {
    return SchemaViolation{"", "does not match the schema (with " + std::to_string(values) +
                                   " values, too many to say where; at most " +
                                   std::to_string(kMaxDiagnosedValues) + " are searched)"};
  }
  // Then for the message, without uniqueItems (collecting errors, valijson would compare and
  // record every pair of items).
  valijson::ValidationResults results;
  bool diagnosticValid = false;
  try {
    ScopedPatternBudget budget;
    valijson::Validator validator;
    diagnosticValid = validator.validate(*diagnostic_, adapter, &results);
    // Collecting errors, valijson goes on past the first failure, and may match more strings.
    if (budget.exhausted()) return patternsTooCostly();
  } catch (const std::exception& error) {
    return SchemaViolation{"", std::string("could not be validated: ") + error.what()};
  }
  // The deepest error is the most specific one.
  valijson::ValidationResults::Error error;
  std::optional<SchemaViolation> best;
  std::size_t bestRank = 0;
  while (results.popError(error)) {
    // valijson says which property failed in words, at the object's place: the place is the
    // property's, where it ranks below any error of its own (there is none when what failed
    // pushes no error, as propertyNames).
    std::size_t rank = 2 * error.context.size() + 1;
    if (auto child = failedChild(error.description)) {
      error.context.push_back("[" + *child + "]");
      error.description = kPropertyFailed;
      rank = 2 * error.context.size();
    }
    if (!best || rank > bestRank ||
        (rank == bestRank && combinatorWords(error.description).has_value())) {
      best = SchemaViolation{
          toPointer(error.context),
          explained(*document_, instance, contextTokens(error.context), error.description)};
      bestRank = rank;
    }
  }
  if (best) return best;
  // Only uniqueItems is left out of the diagnostic schema.
  if (diagnosticValid) {
    return SchemaViolation{"", "an array whose items must be unique (uniqueItems) holds one twice"};
  }
  // What failed recorded no error of its own (valijson checks property names without
  // recording), and nothing above it did: the root.
  return SchemaViolation{"", explained(*document_, instance, {}, std::string(kPropertyFailed))};
}

}  // namespace toolhost::registry
