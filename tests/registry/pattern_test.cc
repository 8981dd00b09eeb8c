// Pattern against what Node 20's `new RegExp(source, "u")` does (every expectation below was
// checked with node), and the bounds that keep a hostile pattern or subject cheap.
#include "registry/pattern.h"

#include <catch2/catch.hpp>

#include <limits>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using namespace toolhost::registry;
using namespace std::literals;

namespace {

constexpr std::uint64_t kNoLimit = std::numeric_limits<std::uint64_t>::max();

Pattern compiled(std::string_view source) {
  auto pattern = Pattern::compile(source);
  INFO(source << ": " << (pattern ? "" : pattern.error().detail));
  REQUIRE(pattern.has_value());
  return *pattern;
}

// "" when `source` compiles.
std::string errorOf(std::string_view source) {
  auto pattern = Pattern::compile(source);
  return pattern ? "" : pattern.error().detail;
}

std::optional<bool> search(const Pattern& pattern, std::string_view subject) {
  std::uint64_t budget = kNoLimit;
  return pattern.search(subject, budget);
}

std::string repeated(std::string_view part, std::size_t times) {
  std::string out;
  for (std::size_t i = 0; i < times; ++i) out.append(part);
  return out;
}

struct Case {
  std::string_view pattern;
  std::string_view subject;
  bool matches;
};

struct Refusal {
  std::string_view pattern;
  std::string_view word;  // in the detail
};

}  // namespace

TEST_CASE("patterns match where RegExp with the u flag matches", "[pattern]") {
  const std::vector<Case> cases = {
      // literals, astral code points
      {"abc", "xxabcxx"sv, true},
      {"abc", "ab"sv, false},
      {"😀", "a😀b"sv, true},
      {"^a$", "A"sv, false},
      {"^a/b,c$", "a/b,c"sv, true},
      {"^.$", "😀"sv, true},
      {"^..$", "😀"sv, false},
      {"^.$", "é"sv, true},
      {"^😀+$", "😀😀😀"sv, true},
      {R"(^\uD83D\uDE00$)", "😀"sv, true},
      {R"(^\uD83D$)", "😀"sv, false},
      {R"(^\u{1F600}$)", "😀"sv, true},
      {R"(^\u{61}\u0062\u{0000000063}$)", "abc"sv, true},
      {R"(^[\uD83D\uDE00]$)", "😀"sv, true},
      {"^[😀-😂]$", "😁"sv, true},
      {"^[😀-😂]$", "😃"sv, false},
      {R"(^[\u{1F600}-\u{1F64F}]+$)", "😀🙏"sv, true},
      {"^[^a]$", "😀"sv, true},
      {"^[^😀]$", "😀"sv, false},
      // the dot
      {"^.$", "\n"sv, false},
      {"^.$", "\r"sv, false},
      {"^.$", "\u2028"sv, false},
      {"^.$", "\u2029"sv, false},
      {"^.$", "\t"sv, true},
      {"^[^]$", "\n"sv, true},
      {"a[]|b", "a"sv, false},
      {"a[]|b", "b"sv, true},
      // anchors: start and end of the input only
      {"^a", "ba"sv, false},
      {"a$", "ab"sv, false},
      {"a$", "ba"sv, true},
      {"^$", ""sv, true},
      {"^$", "\n"sv, false},
      {"a$", "a\n"sv, false},
      {"^b", "a\nb"sv, false},
      {"a^", "a"sv, false},
      {"$^", ""sv, true},
      // word boundaries: ASCII word characters
      {R"(\bfoo\b)", "a foo b"sv, true},
      {R"(\bfoo\b)", "afoo"sv, false},
      {R"(\Boo\B)", "foox"sv, true},
      {R"(\Boo\B)", "oo"sv, false},
      {R"(\bé)", "é"sv, false},
      {R"(\B)", ""sv, true},
      {R"(^\b$)", ""sv, false},
      {R"(a\b)", "a😀"sv, true},
      {R"(\b_)", "_"sv, true},
      // alternation and groups
      {"^(?:cat|dog)$", "dog"sv, true},
      {"^(cat|dog)$", "cow"sv, false},
      {"a|", "zzz"sv, true},
      {"^(|a)$", ""sv, true},
      {"^(ab)+$", "ababab"sv, true},
      {"^(?:ab)+$", "aba"sv, false},
      {R"(^(?<year>\d{4})-(?<month>\d\d)$)", "2024-05"sv, true},
      {"(?<a>x)(?<$b_1>y)", "xy"sv, true},
      {R"(^(?<\u0061>x)$)", "x"sv, true},
      // quantifiers
      {"^a*$", ""sv, true},
      {"^a+$", ""sv, false},
      {"^a?b$", "b"sv, true},
      {"^a{3}$", "aaa"sv, true},
      {"^a{3}$", "aa"sv, false},
      {"^a{2,}$", "aaaaa"sv, true},
      {"^a{2,}$", "a"sv, false},
      {"^a{1,2}$", "aaa"sv, false},
      {"^a{0}$", ""sv, true},
      {"^a{0,0}b$", "ab"sv, false},
      {"^a*?b+?c??$", "aabb"sv, true},
      {"^a{2,3}?$", "aaa"sv, true},
      {"^(?:a{2}){2}$", "aaaa"sv, true},
      {"^(?:a{2}){2}$", "aaa"sv, false},
      {"^(?:ab|c){2,3}$", "abcab"sv, true},
      {"^(?:ab|c){2,3}$", "abcabc"sv, false},
      {"^a{1,99999999999}$", "aaaa"sv, true},
      {"^😀{2}$", "😀😀"sv, true},
      // nested quantifiers and empty loops
      {"^(a*)*$", "aaa"sv, true},
      {"^(a*)*b$", "aaa"sv, false},
      {"^(|a)+$", "aa"sv, true},
      {"^(?:)*$", ""sv, true},
      {"^((a|b)+c)*$", "abcbac"sv, true},
      {"^(a+)+$", "aaab"sv, false},
      {"^(?:a?){3}a{3}$", "aaa"sv, true},
      {"^(?:(?:a*)*b)+$", "abaab"sv, true},
      // character classes
      {"^[abc]+$", "cab"sv, true},
      {"^[^abc]$", "d"sv, true},
      {"^[a-c]$", "d"sv, false},
      {"^[-a]$", "-"sv, true},
      {"^[a-]$", "-"sv, true},
      {R"(^[a\-z]$)", "-"sv, true},
      {R"(^[a\-z]$)", "b"sv, false},
      {"^[--/]$", "."sv, true},
      {R"(^[\d-]$)", "-"sv, true},
      {R"(^[a-b-\d]$)", "5"sv, true},
      {R"(^[\w]+$)", "a_1"sv, true},
      {R"(^[^\d\s]$)", "x"sv, true},
      {R"(^[^\d\s]$)", " "sv, false},
      {R"(^[\b]$)", "\b"sv, true},
      {R"(^[\D]$)", "😀"sv, true},
      {R"(^[\^]$)", "^"sv, true},
      {"^[a^]$", "^"sv, true},
      {"^[[]$", "["sv, true},
      {R"(^[\]]$)", "]"sv, true},
      {"^[.]$", "x"sv, false},
      {"^[(){}|*+?$]+$", "(){}|*+?$"sv, true},
      {R"(^[\u{0}-\u{10FFFF}]$)", "😀"sv, true},
      {R"(^[\0-\cZ]+$)", "\x00\x1a"sv, true},
      // class escapes
      {R"(^\d+$)", "0123456789"sv, true},
      {R"(^\d$)", "٣"sv, false},
      {R"(^\D$)", "a"sv, true},
      {R"(^\w+$)", "Az_9"sv, true},
      {R"(^\w$)", "é"sv, false},
      {R"(^\W$)", "é"sv, true},
      {R"(^\s+$)", "\t\n\v\f\r \u00a0\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"sv,
       true},
      {R"(^\s$)", "\u200b"sv, false},
      {R"(^\s$)", "\u180e"sv, false},
      {R"(^\S$)", "a"sv, true},
      // character escapes
      {R"(^\t\n\v\f\r$)", "\t\n\v\f\r"sv, true},
      {R"(^\0$)", "\x00"sv, true},
      {R"(^\0a$)", "\0a"sv, true},
      {R"(^\cJ\cj$)", "\n\n"sv, true},
      {R"(^\x41\x2d$)", "A-"sv, true},
      {R"(^\u00e9$)", "é"sv, true},
      {R"(^\^\$\\\.\*\+\?\(\)\[\]\{\}\|\/$)", "^$\\.*+?()[]{}|/"sv, true},
  };
  for (const Case& c : cases) {
    CAPTURE(c.pattern, c.subject);
    CHECK(search(compiled(c.pattern), c.subject) == c.matches);
  }
}

TEST_CASE("a pattern is an error exactly where RegExp throws, saying what is wrong", "[pattern]") {
  const std::vector<Refusal> refusals = {
      {"{", "quantifier"},
      {"}", "escaped"},
      {"]", "escaped"},
      {"a{", "quantifier"},
      {"a{1,2", "quantifier"},
      {"a{,2}", "quantifier"},
      {"a{2,1}", "minimum"},
      {"*a", "nothing to repeat"},
      {"a**", "nothing to repeat"},
      {"a???", "nothing to repeat"},
      {"^*", "nothing to repeat"},
      {R"(\b+)", "nothing to repeat"},
      {"a{1}{2}", "nothing to repeat"},
      {"{1}", "nothing to repeat"},
      {"|+", "nothing to repeat"},
      {R"(\-)", "not an escape"},
      {R"(\a)", "not an escape"},
      {R"(\_)", "not an escape"},
      {R"([\B])", "not an escape"},
      {R"([\1])", "not an escape"},
      {R"([\k])", "not an escape"},
      {R"([\c_])", "letter"},
      {"[z-a]", "out of order"},
      {"[😃-😀]", "out of order"},
      {R"([\d-z])", "class escape"},
      {R"([a-\w])", "class escape"},
      {"(a", "not closed"},
      {"(?:a", "not closed"},
      {"(?<n>a", "not closed"},
      {"[a", "not closed"},
      {"[a-", "not closed"},
      {"a)", "closes no group"},
      {"())", "closes no group"},
      {"(?<a>x)(?<a>y)", "twice"},
      {"(?<a>x)|(?<a>y)", "twice"},
      {R"(\x4)", "two hex digits"},
      {R"(\xg0)", "two hex digits"},
      {R"(\u12)", "four hex digits"},
      {R"(\u{})", "hex digits"},
      {R"(\u{1F600)", "hex digits"},
      {R"(\u{110000})", "10FFFF"},
      {R"(\c)", "letter"},
      {R"(\c1)", "letter"},
      {R"(\00)", "digit"},
      {R"(\01)", "digit"},
      {R"(\)", "ends the pattern"},
      {"(?<1a>x)", "group name"},
      {"(?<a-b>x)", "group name"},
      {"(?<>x)", "empty"},
      {"(?<a", "not closed"},
      {"(?i:a)", "(?"},
      {"(?", "(?"},
      {"(?a)", "(?"},
      {R"(\1)", "no group 1"},
      {R"((a)\2)", "no group 2"},
      {R"(\k<a>)", "no group named"},
      {R"(\k)", "group name"},
      {R"(\k<a)", "not closed"},
  };
  for (const Refusal& refusal : refusals) {
    CAPTURE(refusal.pattern);
    CHECK_THAT(errorOf(refusal.pattern), Catch::Contains(std::string(refusal.word)));
  }
}

TEST_CASE("lookaround, backreferences and property escapes are refused as not supported",
          "[pattern]") {
  const std::vector<Refusal> refusals = {
      {"(?=a)", "lookahead"},
      {"a(?!b)", "lookahead"},
      {"(?<=a)b", "lookbehind"},
      {"(?<!a)b", "lookbehind"},
      {R"((a)\1)", "backreference"},
      {R"(\1(a))", "backreference"},
      {R"((?<n>a)\k<n>)", "backreference"},
      {R"(\k<n>(?<n>a))", "backreference"},
      {R"(\p{L})", "property"},
      {R"(\P{Lu})", "property"},
      {R"([\p{L}])", "property"},
      {"(?<é>x)", "ASCII"},
      {R"((?<\u00e9>x))", "ASCII"},
      {R"((?<a\u200c>x))", "ASCII"},
  };
  for (const Refusal& refusal : refusals) {
    CAPTURE(refusal.pattern);
    const std::string detail = errorOf(refusal.pattern);
    CHECK_THAT(detail, Catch::Contains(std::string(refusal.word)));
    CHECK_THAT(detail, Catch::Contains("not supported"));
  }
}

TEST_CASE("an error names the byte offset where the problem starts", "[pattern]") {
  CHECK(errorOf("a😀(?=b)") == "at offset 5: lookahead assertions are not supported");
  CHECK(errorOf("ab[z-a]") == "at offset 3: the range 'z'-'a' is out of order");
  CHECK(errorOf("(a)\\2") == "at offset 3: there is no group 2");
}

TEST_CASE("catastrophic backtracking patterns cost at most one program per code point",
          "[pattern]") {
  const std::string as = repeated("a", 100'000) + "!";
  const std::string words = repeated("aaaa ", 20'000) + "!";
  const std::vector<std::pair<std::string_view, std::string_view>> cases = {
      {"(a+)+$", as}, {"(a|a)*b", as}, {"(a*)*b", as}, {"^(\\w+\\s?)*$", words}};
  for (const auto& [source, subject] : cases) {
    CAPTURE(source);
    const Pattern pattern = compiled(source);
    const std::uint64_t bound = (subject.size() + 1) * pattern.instructions();
    std::uint64_t budget = bound;
    CHECK(pattern.search(subject, budget) == false);  // an answer within the bound
  }
}

TEST_CASE("the budget stops a search, and exactly the cost of the answer suffices", "[pattern]") {
  const Pattern pattern = compiled("a+b");
  const std::string subject = repeated("a", 1000) + "b";

  std::uint64_t budget = 10;
  CHECK(pattern.search(subject, budget) == std::nullopt);
  CHECK(budget == 0);
  CHECK(pattern.search(subject, budget) == std::nullopt);

  budget = kNoLimit;
  REQUIRE(pattern.search(subject, budget) == true);
  const std::uint64_t cost = kNoLimit - budget;
  CHECK(cost <= (subject.size() + 1) * pattern.instructions());
  budget = cost;
  CHECK(pattern.search(subject, budget) == true);
  CHECK(budget == 0);
  budget = cost - 1;
  CHECK(pattern.search(subject, budget) == std::nullopt);
  CHECK(budget == 0);

  // An answer of no match costs its full price as well.
  budget = kNoLimit;
  REQUIRE(pattern.search(repeated("a", 1000), budget) == false);
  const std::uint64_t noCost = kNoLimit - budget;
  budget = noCost;
  CHECK(pattern.search(repeated("a", 1000), budget) == false);
  budget = noCost - 1;
  CHECK(pattern.search(repeated("a", 1000), budget) == std::nullopt);
}

TEST_CASE("an anchored pattern stops at the first position without threads", "[pattern]") {
  const Pattern pattern = compiled("^ab");
  std::uint64_t budget = kNoLimit;
  CHECK(pattern.search("ax" + repeated("a", 100'000), budget) == false);
  CHECK(kNoLimit - budget < 10);
}

TEST_CASE("pattern size, program size and nesting are bounded", "[pattern]") {
  CHECK(Pattern::compile(repeated("a", Pattern::kMaxSourceBytes)).has_value());
  const std::string tooLong = errorOf(repeated("a", Pattern::kMaxSourceBytes + 1));
  CHECK_THAT(tooLong, Catch::Contains("4097 bytes") && Catch::Contains("4096"));

  CHECK(compiled("a{9999}").instructions() == Pattern::kMaxInstructions);
  CHECK_THAT(errorOf("a{10001}"), Catch::Contains("10002") && Catch::Contains("10000"));
  CHECK_THAT(errorOf("(a{100}){101}"), Catch::Contains("10101") && Catch::Contains("10000"));
  // Measured, never built: 10^9 instructions, then 10^24.
  CHECK_THAT(errorOf("((a{1000}){1000}){1000}"), Catch::Contains("1000000001"));
  CHECK_THAT(errorOf("((((((((a{1000}){1000}){1000}){1000}){1000}){1000}){1000}){1000})"),
             Catch::Contains("over 10^19"));
  // A bound V8 reads as none (2^31 - 1 or more) costs what * does.
  CHECK(compiled("a{2,99999999999}").instructions() == compiled("a{2,}").instructions());

  CHECK(compiled(repeated("(", 256) + "a" + repeated(")", 256)).instructions() == 2);
  CHECK_THAT(errorOf(repeated("(", 257) + "a" + repeated(")", 257)), Catch::Contains("256"));
  CHECK_THAT(errorOf(repeated("(", 4000)), Catch::Contains("deeper"));
  CHECK_THAT(errorOf(repeated("[", 4000)), Catch::Contains("not closed"));

  CHECK_THAT(errorOf("ab\xff"), Catch::Contains("offset 2") && Catch::Contains("UTF-8"));
  CHECK_THAT(errorOf("\xed\xa0\x80"), Catch::Contains("UTF-8"));  // an encoded surrogate
}

TEST_CASE("each invalid byte of a subject reads as U+FFFD", "[pattern]") {
  CHECK(search(compiled("^.$"), "\xff") == true);
  CHECK(search(compiled("^\\uFFFD$"), "\xc3") == true);
  CHECK(search(compiled("^...$"), "\xed\xa0\x80") == true);  // an encoded surrogate: 3 bytes
  CHECK(search(compiled("^\\uFFFD{2}a$"), "\xf0\x9f\x61") == true);  // a truncated sequence
  CHECK(search(compiled("^\\uFFFD$"), "\xc0\x80") == false);         // overlong: 2 bytes
  CHECK(search(compiled("^[^a]+$"), "\x80\xbf\xfe\xf8\x88\x80\x80\x80") == true);
  CHECK(search(compiled("\\bb"), "\xff\x62") == true);
}

TEST_CASE("copies of a pattern share its program and search from any thread", "[pattern]") {
  const Pattern original = compiled("^[a-z]+@[a-z]+\\.com$");
  std::vector<std::thread> threads;
  std::vector<int> answers(4, -1);
  for (std::size_t i = 0; i < answers.size(); ++i) {
    threads.emplace_back([copy = original, &answers, i] {
      const bool matches = search(copy, i % 2 == 0 ? "me@example.com" : "me@example.org") == true;
      answers[i] = matches ? 1 : 0;
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(answers == std::vector<int>{1, 0, 1, 0});
}
