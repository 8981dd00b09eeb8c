// JSON Schema (draft 7, through valijson) for method params, tool manifests and call arguments.
// A compiled schema is immutable and may be shared by any number of threads.
#pragma once

#include <boost/json/value.hpp>
#include <boost/system/result.hpp>

#include <memory>
#include <optional>
#include <string>

namespace valijson {
class Schema;
}

namespace toolhost::registry {

struct SchemaViolation {
  std::string path;    // JSON pointer of the offending value ("" for the root)
  std::string reason;  // valijson's description of what failed
  std::string describe(std::string_view what) const;  // "arguments/city: Value type not permitted..."
};

struct SchemaError {
  std::string detail;
};

class JsonSchema {
 public:
  static boost::system::result<JsonSchema, SchemaError> compile(const boost::json::value& schema);

  // The first violation, if any. Any thread.
  std::optional<SchemaViolation> validate(const boost::json::value& instance) const;

  const boost::json::value& document() const { return *document_; }

 private:
  std::shared_ptr<const boost::json::value> document_;
  std::shared_ptr<const valijson::Schema> schema_;
};

}  // namespace toolhost::registry
