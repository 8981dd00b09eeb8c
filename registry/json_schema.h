// JSON Schema (draft 7, through valijson) for method params, tool manifests and call arguments.
// A compiled schema is immutable and may be shared by any number of threads.
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <boost/system/result.hpp>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace valijson {
class Schema;
}

namespace toolhost::registry {

struct SchemaViolation {
  std::string path;    // JSON pointer of the offending value ("" for the root)
  std::string reason;  // what failed, in words: "must be an integer (it is a string)"
  std::string describe(std::string_view what) const;  // "arguments/city: must be a string (...)"
};

struct SchemaError {
  std::string detail;
};

// Every place of `schema` where a schema stands (the root, a "properties" member, an "allOf"
// entry, ...), as valijson reads draft 7: the values of "enum", "const", "default" and
// "examples" are data and never visited, whatever their shape; a member named "enum" under
// "properties" is a schema and is. Unknown keywords are visited as schemas (a reference may
// lead into them). `visit(node, pointer)` gets each object among them with its JSON pointer.
void forEachSubschema(
    const boost::json::value& schema,
    const std::function<void(const boost::json::object&, const std::string&)>& visit);

// `schema` without `keyword` wherever a schema stands (data such as "enum" values untouched).
boost::json::value withoutKeyword(const boost::json::value& schema, std::string_view keyword);

class JsonSchema {
 public:
  static boost::system::result<JsonSchema, SchemaError> compile(const boost::json::value& schema);

  // Validation visits each value of the instance with each part of the schema that applies to
  // it, so its time is bounded by their product: a schema of 10,000 allOf entries took 34 s
  // with 100,000 arguments, and 2 * 10^7 pairs take up to about a third of a second. The bound
  // for arguments a client sent (tools.call checks large ones on a thread of their own, small
  // ones on the connection's I/O thread).
  static constexpr std::size_t kMaxPairsForArguments = 20'000'000;
  // The steps of the pattern matcher (registry::Pattern::search) one validation may take, about
  // a tenth of a second: past it the instance is refused as too costly to check.
  static constexpr std::uint64_t kMaxPatternSteps = 20'000'000;

  // An estimate of the work of validating `instance`, in the unit of maxPairs: its values times
  // the schema's, plus twice kMaxPatternSteps when the schema has patterns (any instance may
  // spend the budget of both passes). Any thread.
  std::size_t checkCost(const boost::json::object& instance) const;

  // The first violation, if any; past `maxPairs` (instance values times the schema's values,
  // references written out) a violation that says so, without validating. Any thread.
  std::optional<SchemaViolation> validate(
      const boost::json::value& instance,
      std::size_t maxPairs = std::numeric_limits<std::size_t>::max()) const;
  // The schema's values with every reference written out, less those of "examples" and
  // "default" (what maxPairs counts).
  std::size_t expandedValues() const { return expandedValues_; }

  const boost::json::value& document() const { return *document_; }

 private:
  std::shared_ptr<const boost::json::value> document_;
  // What valijson reads: document_ with every "multipleOf" a double (json_schema.cc, strip()).
  std::shared_ptr<const boost::json::value> validatedDocument_;
  std::shared_ptr<const valijson::Schema> schema_;
  // The same without "uniqueItems", for the message: collecting every error, valijson compares
  // (and records) every pair of an array's items even when maxItems already failed.
  std::shared_ptr<const boost::json::value> diagnosticDocument_;
  std::shared_ptr<const valijson::Schema> diagnostic_;
  std::size_t expandedValues_ = 0;  // values of the schema with its references written out
  std::size_t patternInstructions_ = 0;  // the sizes of its patterns' programs, summed

  static std::optional<SchemaViolation> patternsTooCostly();
};

}  // namespace toolhost::registry
