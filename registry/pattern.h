// JSON Schema's `pattern`: an ECMA-262 regular expression, read as `new RegExp(source, "u")`
// reads it (as Ajv does), matched by a program simulated breadth-first (a Pike VM), so that
// matching takes time linear in the subject whatever the pattern. Immutable once compiled: any
// thread may search with it.
//
// Refused as unsupported although ECMAScript has them: lookahead and lookbehind, backreferences,
// Unicode property escapes, and group names that are not ASCII. None changes what the rest means.
#pragma once

#include <boost/system/result.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace toolhost::registry {

struct PatternError {
  std::string detail;  // "at offset 4: lookahead assertions are not supported" (offsets in bytes)
};

class Pattern {
 public:
  static boost::system::result<Pattern, PatternError> compile(std::string_view source);

  // Whether the pattern matches somewhere in `subject` (UTF-8; a JSON Schema pattern is not
  // anchored unless it says ^ or $). Every thread state the simulation processes at a position
  // costs one unit of `budget`; std::nullopt when the budget ran out before the answer (budget is
  // then 0). An invalid byte of `subject` reads as U+FFFD.
  std::optional<bool> search(std::string_view subject, std::uint64_t& budget) const;

  // Size of the program: the most states one position can cost, so a search costs at most
  // (code points of the subject + 1) * instructions().
  std::size_t instructions() const;

  static constexpr std::size_t kMaxSourceBytes = 4096;
  static constexpr std::size_t kMaxInstructions = 10'000;

 private:
  struct Program;
  explicit Pattern(std::shared_ptr<const Program> program) : program_(std::move(program)) {}

  std::shared_ptr<const Program> program_;  // shared by copies: cheap to copy
};

}  // namespace toolhost::registry
