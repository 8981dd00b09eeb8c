#include "registry/pattern.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <span>
#include <tuple>
#include <vector>

namespace toolhost::registry {

namespace {

// --- Code points and UTF-8 ---

constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr char32_t kReplacement = 0xFFFD;

struct Decoded {
  char32_t codePoint;
  std::size_t length;  // bytes
};

// The code point whose encoding starts at `at`; std::nullopt where the bytes there are not
// well-formed UTF-8 (Unicode table 3-7: no overlong forms, surrogates or values past 10FFFF).
std::optional<Decoded> decodeUtf8(std::string_view text, std::size_t at) {
  const auto byte = [&](std::size_t i) -> unsigned {
    return at + i < text.size() ? static_cast<unsigned char>(text[at + i]) : 0x100;
  };
  const unsigned lead = byte(0);
  if (lead < 0x80) return Decoded{lead, 1};
  std::size_t length = 0;
  char32_t codePoint = 0;
  unsigned low = 0x80;  // the bounds of the second byte, narrower after some leads
  unsigned high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    codePoint = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    codePoint = lead & 0x0F;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    codePoint = lead & 0x07;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return std::nullopt;
  }
  for (std::size_t i = 1; i < length; ++i) {
    const unsigned next = byte(i);
    if (next < low || next > high) return std::nullopt;
    low = 0x80;
    high = 0xBF;
    codePoint = codePoint << 6 | (next & 0x3F);
  }
  return Decoded{codePoint, length};
}

void appendUtf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | c >> 6));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | c >> 12));
    out.push_back(static_cast<char>(0x80 | (c >> 6 & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | c >> 18));
    out.push_back(static_cast<char>(0x80 | (c >> 12 & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c >> 6 & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

bool isAsciiWordChar(char32_t c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

bool isDigit(char32_t c) { return c >= '0' && c <= '9'; }

std::optional<std::uint32_t> hexValue(char32_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return std::nullopt;
}

// --- Sets of code points ---

struct Range {
  char32_t first;
  char32_t last;
};

// Sorted ranges that neither overlap nor touch.
using CodePointSet = std::vector<Range>;

CodePointSet normalized(CodePointSet set) {
  std::sort(set.begin(), set.end(), [](Range a, Range b) { return a.first < b.first; });
  CodePointSet out;
  for (const Range range : set) {
    if (!out.empty() && range.first <= out.back().last + 1) {
      out.back().last = std::max(out.back().last, range.last);
    } else {
      out.push_back(range);
    }
  }
  return out;
}

CodePointSet complement(const CodePointSet& set) {
  CodePointSet out;
  char32_t next = 0;  // the first code point not yet placed
  for (const Range range : set) {
    if (range.first > next) out.push_back({next, range.first - 1});
    next = range.last + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

bool contains(const CodePointSet& set, char32_t c) {
  auto after = std::upper_bound(set.begin(), set.end(), c,
                                [](char32_t value, Range range) { return value < range.first; });
  return after != set.begin() && c <= std::prev(after)->last;
}

// The sets the class escapes name; with the u flag and without i, \w and \b are ASCII only.
struct ClassEscapeSets {
  CodePointSet digit{{'0', '9'}};
  CodePointSet word{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  // ECMAScript's WhiteSpace and LineTerminator.
  CodePointSet space{{0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                     {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                     {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
  CodePointSet notDigit = complement(digit);
  CodePointSet notWord = complement(word);
  CodePointSet notSpace = complement(space);
  CodePointSet dot = complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}});
};

const ClassEscapeSets& classEscapeSets() {
  static const ClassEscapeSets sets;
  return sets;
}

// --- The parsed pattern ---

enum class Op : std::uint8_t {
  codePoint,        // consume the code point `arg`
  set,              // consume a code point of sets[arg]
  split,            // go on at `arg` and at `arg2`
  jump,             // go on at `arg`
  atStart,          // ^: go on at the next instruction at the subject's start
  atEnd,            // $
  wordBoundary,     // \b
  notWordBoundary,  // \B
  match,
};

// Counts of a quantifier. V8 reads any count past 2^31 - 1 as that, and that as a maximum as no
// bound at all, which only a subject of that many code points could tell apart.
constexpr std::uint64_t kUnbounded = std::numeric_limits<std::int32_t>::max();

// Groups leave no node of their own: without captures they only bracket.
struct Node {
  enum class Kind : std::uint8_t { codePoint, set, assertion, sequence, alternation, repetition };
  Kind kind = Kind::sequence;  // an empty sequence matches the empty string
  std::uint32_t value = 0;     // codePoint: the code point; set: its index; assertion: its Op
  std::uint64_t min = 0;       // repetition: the counts (max kUnbounded for none)
  std::uint64_t max = 0;
  std::vector<Node> children{};  // sequence, alternation: the parts; repetition: the one repeated
};

struct ClassAtom {
  char32_t codePoint = 0;
  const CodePointSet* set = nullptr;  // for \d \D \w \W \s \S, instead of the code point
};

// Recursive descent over the grammar of ECMA-262 22.2.1 with the u flag ([+UnicodeMode]).
// Recursion is one level per group, and groups may nest only kMaxDepth deep.
class Parser {
 public:
  static constexpr std::size_t kMaxDepth = 256;

  // `source` must be valid UTF-8.
  explicit Parser(std::string_view source) {
    for (std::size_t at = 0; at < source.size();) {
      const Decoded decoded = *decodeUtf8(source, at);
      chars_.push_back(decoded.codePoint);
      offsets_.push_back(at);
      at += decoded.length;
    }
    offsets_.push_back(source.size());
  }

  boost::system::result<Node, PatternError> parse() {
    std::optional<Node> root = disjunction();
    if (root && !atEnd()) root = fail(at_, "')' closes no group");  // disjunction stops only there
    if (root && firstBackreference_) root = rejectBackreference(*firstBackreference_);
    if (!root) return *error_;
    return std::move(*root);
  }

  std::vector<CodePointSet> takeSets() { return std::move(sets_); }

 private:
  // Past the end; no code point is this large.
  static constexpr char32_t kEnd = kMaxCodePoint + 1;

  struct Backreference {
    std::size_t at;
    std::uint64_t number = 0;  // \1, \2, ...; 0 for \k<name>
    std::string name{};
  };

  bool atEnd() const { return at_ == chars_.size(); }
  char32_t peek(std::size_t ahead = 0) const {
    return at_ + ahead < chars_.size() ? chars_[at_ + ahead] : kEnd;
  }
  bool eat(char32_t c) {
    if (peek() != c) return false;
    ++at_;
    return true;
  }

  std::nullopt_t fail(std::size_t at, std::string_view what) {
    error_ = PatternError{"at offset " + std::to_string(offsets_[at]) + ": " + std::string(what)};
    return std::nullopt;
  }

  static constexpr std::string_view kLoneBrace =
      "'{' starts no quantifier ({n}, {n,} or {n,m}); write \\{ to match it";

  static std::string quoted(char32_t c) {
    std::string out = "'";
    appendUtf8(out, c);
    return out + "'";
  }

  Node setNode(CodePointSet set) {
    sets_.push_back(std::move(set));
    return Node{.kind = Node::Kind::set, .value = static_cast<std::uint32_t>(sets_.size() - 1)};
  }

  std::optional<Node> disjunction() {
    Node alternation{.kind = Node::Kind::alternation};
    do {
      std::optional<Node> alternative = sequence();
      if (!alternative) return std::nullopt;
      alternation.children.push_back(std::move(*alternative));
    } while (eat('|'));
    if (alternation.children.size() == 1) return std::move(alternation.children.front());
    return alternation;
  }

  std::optional<Node> sequence() {
    Node sequence{.kind = Node::Kind::sequence};
    while (!atEnd() && peek() != '|' && peek() != ')') {
      std::optional<Node> term = this->term();
      if (!term) return std::nullopt;
      sequence.children.push_back(std::move(*term));
    }
    return sequence;
  }

  std::optional<Node> term() {
    // With the u flag an assertion takes no quantifier: the next term finds nothing to repeat.
    if (eat('^')) return assertion(Op::atStart);
    if (eat('$')) return assertion(Op::atEnd);
    if (peek() == '\\' && (peek(1) == 'b' || peek(1) == 'B')) {
      at_ += 2;
      return assertion(chars_[at_ - 1] == 'b' ? Op::wordBoundary : Op::notWordBoundary);
    }
    std::optional<Node> atom = this->atom();
    if (!atom) return std::nullopt;
    return quantified(std::move(*atom));
  }

  static Node assertion(Op op) {
    return Node{.kind = Node::Kind::assertion, .value = static_cast<std::uint32_t>(op)};
  }

  std::optional<Node> atom() {
    const std::size_t start = at_;
    const char32_t c = peek();
    switch (c) {
      case '(':
        return group();
      case '[':
        return characterClass();
      case '\\':
        return atomEscape();
      case '.':
        ++at_;
        return setNode(classEscapeSets().dot);
      case '*':
      case '+':
      case '?':
        return fail(start, quoted(c) + " has nothing to repeat");
      case '{':
        if (interval()) return fail(start, "the quantifier has nothing to repeat");
        return fail(start, kLoneBrace);
      case '}':
      case ']':
        return fail(start,
                    quoted(c) + " must be escaped to match it (\\" + static_cast<char>(c) + ")");
      default:
        ++at_;
        return Node{.kind = Node::Kind::codePoint, .value = c};
    }
  }

  std::optional<Node> quantified(Node atom) {
    const std::size_t start = at_;
    std::uint64_t min = 0;
    std::uint64_t max = kUnbounded;
    if (eat('+')) {
      min = 1;
    } else if (eat('?')) {
      max = 1;
    } else if (peek() == '{') {
      const std::optional<std::pair<std::uint64_t, std::uint64_t>> counts = interval();
      if (!counts) return fail(start, kLoneBrace);
      std::tie(min, max) = *counts;
      if (min > max) return fail(start, "the quantifier's minimum is larger than its maximum");
    } else if (!eat('*')) {
      return atom;
    }
    eat('?');  // lazy: it changes which match is found, never whether one is
    Node repetition{.kind = Node::Kind::repetition, .min = min, .max = max};
    repetition.children.push_back(std::move(atom));
    return repetition;
  }

  // {n}, {n,} or {n,m} at at_, consumed; otherwise std::nullopt and nothing consumed.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> interval() {
    const std::size_t start = at_;
    ++at_;  // {
    const std::optional<std::uint64_t> min = count();
    std::optional<std::uint64_t> max = min;
    if (min && eat(',')) max = isDigit(peek()) ? count() : kUnbounded;
    if (!min || !max || !eat('}')) {
      at_ = start;
      return std::nullopt;
    }
    return std::pair{*min, *max};
  }

  std::optional<std::uint64_t> count() {
    if (!isDigit(peek())) return std::nullopt;
    std::uint64_t value = 0;
    while (isDigit(peek())) value = std::min(value * 10 + (chars_[at_++] - '0'), kUnbounded);
    return value;
  }

  std::optional<Node> group() {
    const std::size_t start = at_;
    ++at_;  // (
    if (depth_ == kMaxDepth) {
      return fail(start, "groups nest deeper than " + std::to_string(kMaxDepth) + " levels");
    }
    if (eat('?')) {
      if (peek() == '=' || peek() == '!') {
        return fail(start, "lookahead assertions are not supported");
      }
      if (peek() == '<' && (peek(1) == '=' || peek(1) == '!')) {
        return fail(start, "lookbehind assertions are not supported");
      }
      if (eat('<')) {
        std::optional<std::string> name = groupName();
        if (!name) return std::nullopt;
        if (std::find(names_.begin(), names_.end(), *name) != names_.end()) {
          return fail(start, "the group name '" + *name + "' is used twice");
        }
        names_.push_back(std::move(*name));
        ++groups_;
      } else if (!eat(':')) {
        return fail(start, "'(?' must be followed by ':' or by a group name in <>");
      }
    } else {
      ++groups_;
    }
    ++depth_;
    std::optional<Node> body = disjunction();
    --depth_;
    if (!body) return std::nullopt;
    if (!eat(')')) return fail(start, "the group is not closed");
    return body;
  }

  // After '<', through '>'. ECMAScript takes any identifier; we take the ASCII ones.
  std::optional<std::string> groupName() {
    const std::size_t start = at_;
    std::string name{};
    while (!eat('>')) {
      const std::size_t charStart = at_;
      char32_t c = peek();
      if (c == '\\' && peek(1) == 'u') {
        at_ += 2;
        const std::optional<char32_t> escaped = unicodeEscape(charStart);
        if (!escaped) return std::nullopt;
        c = *escaped;
      } else if (c == kEnd) {
        return fail(start, "the group name is not closed by '>'");
      } else {
        ++at_;
      }
      if (c >= 0x80) return fail(charStart, "group names that are not ASCII are not supported");
      const bool valid = c == '$' || (isAsciiWordChar(c) && !(name.empty() && isDigit(c)));
      if (!valid) return fail(charStart, quoted(c) + " cannot be part of a group name");
      name.push_back(static_cast<char>(c));
    }
    if (name.empty()) return fail(start, "the group name is empty");
    return name;
  }

  std::optional<Node> atomEscape() {
    const std::size_t start = at_;
    ++at_;  // backslash
    if (peek() >= '1' && peek() <= '9') {
      const std::uint64_t number = *count();
      if (!firstBackreference_) firstBackreference_ = Backreference{.at = start, .number = number};
      return Node{};
    }
    if (eat('k')) {
      if (!eat('<')) return fail(start, "\\k must be followed by a group name in <>");
      std::optional<std::string> name = groupName();
      if (!name) return std::nullopt;
      if (!firstBackreference_) firstBackreference_ = Backreference{.at = start, .name = *name};
      return Node{};
    }
    const std::optional<ClassAtom> escaped = escape(start, /*inClass=*/false);
    if (!escaped) return std::nullopt;
    if (escaped->set) return setNode(*escaped->set);
    return Node{.kind = Node::Kind::codePoint, .value = escaped->codePoint};
  }

  // Every backreference is refused, but one to a group that does not exist is a syntax error.
  std::nullopt_t rejectBackreference(const Backreference& reference) {
    if (reference.number > groups_) {
      return fail(reference.at, "there is no group " + std::to_string(reference.number));
    }
    if (reference.number == 0 &&
        std::find(names_.begin(), names_.end(), reference.name) == names_.end()) {
      return fail(reference.at, "there is no group named '" + reference.name + "'");
    }
    return fail(reference.at, "backreferences are not supported");
  }

  // The escape whose backslash is at `start`, at_ just after the backslash: a CharacterEscape or
  // CharacterClassEscape, or in a class a ClassEscape.
  std::optional<ClassAtom> escape(std::size_t start, bool inClass) {
    const ClassEscapeSets& sets = classEscapeSets();
    const char32_t c = peek();
    if (c == kEnd) return fail(start, "'\\' ends the pattern");
    ++at_;
    switch (c) {
      case 'd':
        return ClassAtom{.set = &sets.digit};
      case 'D':
        return ClassAtom{.set = &sets.notDigit};
      case 'w':
        return ClassAtom{.set = &sets.word};
      case 'W':
        return ClassAtom{.set = &sets.notWord};
      case 's':
        return ClassAtom{.set = &sets.space};
      case 'S':
        return ClassAtom{.set = &sets.notSpace};
      case 'p':
      case 'P':
        return fail(start, "Unicode property escapes (\\p, \\P) are not supported");
      case 'f':
        return ClassAtom{.codePoint = '\f'};
      case 'n':
        return ClassAtom{.codePoint = '\n'};
      case 'r':
        return ClassAtom{.codePoint = '\r'};
      case 't':
        return ClassAtom{.codePoint = '\t'};
      case 'v':
        return ClassAtom{.codePoint = '\v'};
      case 'c': {
        const char32_t letter = peek();
        if (!((letter >= 'a' && letter <= 'z') || (letter >= 'A' && letter <= 'Z'))) {
          return fail(start, "\\c must be followed by a letter A-Z or a-z");
        }
        ++at_;
        return ClassAtom{.codePoint = letter % 32};
      }
      case '0':
        if (isDigit(peek())) return fail(start, "\\0 must not be followed by a digit");
        return ClassAtom{.codePoint = 0};
      case 'x': {
        const std::optional<std::uint32_t> high = hexValue(peek());
        const std::optional<std::uint32_t> low = hexValue(peek(1));
        if (!high || !low) return fail(start, "\\x must be followed by two hex digits");
        at_ += 2;
        return ClassAtom{.codePoint = *high * 16 + *low};
      }
      case 'u': {
        const std::optional<char32_t> escaped = unicodeEscape(start);
        if (!escaped) return std::nullopt;
        return ClassAtom{.codePoint = *escaped};
      }
      case '^':
      case '$':
      case '\\':
      case '.':
      case '*':
      case '+':
      case '?':
      case '(':
      case ')':
      case '[':
      case ']':
      case '{':
      case '}':
      case '|':
      case '/':
        return ClassAtom{.codePoint = c};
      default: {
        if (inClass && c == 'b') return ClassAtom{.codePoint = '\b'};
        if (inClass && c == '-') return ClassAtom{.codePoint = '-'};
        std::string written = "'\\";
        appendUtf8(written, c);
        return fail(start, written + "' is not an escape: with the u flag only ^$\\.*+?()[]{}|/ " +
                               "(and - in a class) may be escaped");
      }
    }
  }

  // After "\u": \uHHHH (a surrogate pair of them as the one code point it encodes) or \u{H...}.
  std::optional<char32_t> unicodeEscape(std::size_t start) {
    if (eat('{')) {
      std::uint32_t value = 0;
      std::size_t digits = 0;
      while (const std::optional<std::uint32_t> digit = hexValue(peek())) {
        value = value * 16 + *digit;
        if (value > kMaxCodePoint) return fail(start, "\\u{...} is past U+10FFFF");
        ++at_;
        ++digits;
      }
      if (digits == 0 || !eat('}')) return fail(start, "\\u{ must be followed by hex digits and }");
      return value;
    }
    const std::optional<char32_t> unit = hex4();
    if (!unit) return fail(start, "\\u must be followed by four hex digits or by {hex digits}");
    if (*unit >= 0xD800 && *unit <= 0xDBFF && peek() == '\\' && peek(1) == 'u') {
      const std::size_t lead = at_;
      at_ += 2;
      const std::optional<char32_t> trail = hex4();
      if (trail && *trail >= 0xDC00 && *trail <= 0xDFFF) {
        return 0x10000 + ((*unit - 0xD800) << 10) + (*trail - 0xDC00);
      }
      at_ = lead;  // a lone lead surrogate, followed by an escape of its own
    }
    return *unit;
  }

  std::optional<char32_t> hex4() {
    char32_t value = 0;
    for (std::size_t i = 0; i < 4; ++i) {
      const std::optional<std::uint32_t> digit = hexValue(peek(i));
      if (!digit) return std::nullopt;
      value = value * 16 + *digit;
    }
    at_ += 4;
    return value;
  }

  std::optional<Node> characterClass() {
    const std::size_t start = at_;
    ++at_;  // [
    const bool negated = eat('^');
    CodePointSet members;
    while (!eat(']')) {
      if (atEnd()) return fail(start, "the character class is not closed by ']'");
      const std::size_t rangeStart = at_;
      const std::optional<ClassAtom> first = classAtom();
      if (!first) return std::nullopt;
      // A '-' right before ']' is itself a member.
      if (peek() != '-' || peek(1) == ']' || peek(1) == kEnd) {
        if (first->set) {
          members.insert(members.end(), first->set->begin(), first->set->end());
        } else {
          members.push_back({first->codePoint, first->codePoint});
        }
        continue;
      }
      ++at_;  // -
      const std::optional<ClassAtom> last = classAtom();
      if (!last) return std::nullopt;
      if (first->set || last->set) {
        return fail(rangeStart, "a class escape (\\d, \\w, \\s, ...) cannot end a range");
      }
      if (first->codePoint > last->codePoint) {
        return fail(rangeStart, "the range " + quoted(first->codePoint) + "-" +
                                    quoted(last->codePoint) + " is out of order");
      }
      members.push_back({first->codePoint, last->codePoint});
    }
    members = normalized(std::move(members));
    return setNode(negated ? complement(members) : std::move(members));
  }

  std::optional<ClassAtom> classAtom() {
    const std::size_t start = at_;
    if (eat('\\')) return escape(start, /*inClass=*/true);
    return ClassAtom{.codePoint = chars_[at_++]};
  }

  std::vector<char32_t> chars_;       // the source's code points
  std::vector<std::size_t> offsets_;  // the byte offset of each, and the source's size after them
  std::size_t at_ = 0;                // index into chars_
  std::size_t depth_ = 0;             // groups open around at_
  std::size_t groups_ = 0;            // capturing groups so far
  std::vector<std::string> names_;    // of the named groups so far
  std::optional<Backreference> firstBackreference_;
  std::vector<CodePointSet> sets_;  // what Node::Kind::set nodes index
  std::optional<PatternError> error_;
};

// --- The program ---

struct Instruction {
  Op op;
  std::uint32_t arg = 0;
  std::uint32_t arg2 = 0;
};

std::uint64_t saturatingAdd(std::uint64_t a, std::uint64_t b) {
  std::uint64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<std::uint64_t>::max() : sum;
}

std::uint64_t saturatingMultiply(std::uint64_t a, std::uint64_t b) {
  std::uint64_t product = 0;
  return __builtin_mul_overflow(a, b, &product) ? std::numeric_limits<std::uint64_t>::max()
                                                : product;
}

// The instructions `node` compiles to, measured without building them: ((a{1000}){1000}){1000}
// costs a few additions here rather than 10^9 instructions. Must agree with Compiler::emit.
std::uint64_t sizeOf(const Node& node) {
  switch (node.kind) {
    case Node::Kind::codePoint:
    case Node::Kind::set:
    case Node::Kind::assertion:
      return 1;
    case Node::Kind::sequence:
    case Node::Kind::alternation: {
      std::uint64_t size =
          node.kind == Node::Kind::alternation ? 2 * (node.children.size() - 1) : 0;
      for (const Node& child : node.children) size = saturatingAdd(size, sizeOf(child));
      return size;
    }
    case Node::Kind::repetition: {
      const std::uint64_t body = sizeOf(node.children.front());
      if (body == 0) return 0;  // repeats the empty string: nothing to emit
      const std::uint64_t required = saturatingMultiply(node.min, body);
      if (node.max == kUnbounded) return node.min == 0 ? body + 2 : saturatingAdd(required, 1);
      return saturatingAdd(required, saturatingMultiply(node.max - node.min, body + 1));
    }
  }
  return 0;
}

// Thompson's construction, with counted repetitions written out. Each node is emitted once from
// the tree; further copies of a repeated body are copied instructions.
class Compiler {
 public:
  explicit Compiler(std::vector<Instruction>& code) : code_(code) {}

  void emit(const Node& node) {
    switch (node.kind) {
      case Node::Kind::codePoint:
        place(Op::codePoint, node.value);
        return;
      case Node::Kind::set:
        place(Op::set, node.value);
        return;
      case Node::Kind::assertion:
        place(static_cast<Op>(node.value));
        return;
      case Node::Kind::sequence:
        for (const Node& child : node.children) emit(child);
        return;
      case Node::Kind::alternation:
        alternation(node.children);
        return;
      case Node::Kind::repetition:
        repetition(node);
        return;
    }
  }

 private:
  std::uint32_t here() const { return static_cast<std::uint32_t>(code_.size()); }

  std::uint32_t place(Op op, std::uint32_t arg = 0, std::uint32_t arg2 = 0) {
    code_.push_back({op, arg, arg2});
    return here() - 1;
  }

  // split first, second; first: a; jump end; second: split ...; last: z; end:
  void alternation(const std::vector<Node>& alternatives) {
    std::vector<std::uint32_t> jumps;
    for (std::size_t i = 0; i + 1 < alternatives.size(); ++i) {
      const std::uint32_t split = place(Op::split, here() + 1);
      emit(alternatives[i]);
      jumps.push_back(place(Op::jump));
      code_[split].arg2 = here();
    }
    emit(alternatives.back());
    for (const std::uint32_t jump : jumps) code_[jump].arg = here();
  }

  // x{n,m}: n copies of x, then m - n of (split next, end; x; end:). x{n,} for n > 0: n copies,
  // the last looped back into (x+ as x; split back, end), so that nested pluses as in ((a+)+)+
  // grow the program by one instruction each rather than doubling it; x{0,} is x*.
  void repetition(const Node& node) {
    const Node& body = node.children.front();
    if (node.max == 0 || sizeOf(body) == 0) return;  // as sizeOf: only the empty string
    if (node.min == 0) {
      const std::uint32_t split = place(Op::split, here() + 1);
      emit(body);
      if (node.max == kUnbounded) place(Op::jump, split);
      code_[split].arg2 = here();
      const std::uint32_t end = here();
      for (std::uint64_t i = 1; node.max != kUnbounded && i < node.max; ++i) copy(split, end);
      return;
    }
    const std::uint32_t first = here();
    emit(body);
    const std::uint32_t last = here();
    std::uint32_t lastCopy = first;
    for (std::uint64_t i = 1; i < node.min; ++i) {
      lastCopy = here();
      copy(first, last);
    }
    if (node.max == kUnbounded) {
      place(Op::split, lastCopy, here() + 1);
      return;
    }
    for (std::uint64_t i = node.min; i < node.max; ++i) {
      const std::uint32_t split = place(Op::split, here() + 1);
      copy(first, last);
      code_[split].arg2 = here();
    }
  }

  // Appends a copy of code_[first, last). Its targets lie in [first, last] and move with it.
  void copy(std::uint32_t first, std::uint32_t last) {
    const std::uint32_t shift = here() - first;
    for (std::uint32_t pc = first; pc < last; ++pc) {
      Instruction instruction = code_[pc];
      if (instruction.op == Op::split || instruction.op == Op::jump) {
        instruction.arg += shift;
        if (instruction.op == Op::split) instruction.arg2 += shift;
      }
      code_.push_back(instruction);
    }
  }

  std::vector<Instruction>& code_;
};

// --- The simulation ---

bool isWordByteAt(std::string_view subject, std::size_t at) {
  return at < subject.size() && isAsciiWordChar(static_cast<unsigned char>(subject[at]));
}

// \b needs only the bytes on either side: no byte of a multi-byte code point is ASCII, and an
// ASCII byte is always a whole code point.
bool atWordBoundary(std::string_view subject, std::size_t at) {
  return (at > 0 && isWordByteAt(subject, at - 1)) != isWordByteAt(subject, at);
}

// Thompson's simulation: the set of instructions the threads at one position have reached,
// advanced a code point at a time. An instruction joins the set for a position at most once,
// which bounds the work per position by the program's size and ends empty loops such as (a*)*.
class Simulation {
 public:
  Simulation(std::span<const Instruction> code, std::span<const CodePointSet> sets,
             std::string_view subject, std::uint64_t& budget)
      : code_(code), sets_(sets), subject_(subject), budget_(budget), stampOf_(code.size(), 0) {
    stack_.reserve(code.size());
  }

  // Whether the program matches starting anywhere (at offset 0 only if `anchored`); std::nullopt
  // when the budget ran out first.
  std::optional<bool> run(bool anchored) {
    std::vector<std::uint32_t> current;  // consuming instructions reached at `at`
    std::vector<std::uint32_t> next;
    std::size_t stamp = 1;  // names the set being built; stampOf_ starts at 0, never one
    for (std::size_t at = 0;; ++stamp) {
      if (at == 0 || !anchored) {
        const Step step = follow(0, current, stamp, at);
        if (step != Step::goOn) return verdict(step);
      }
      if (current.empty() && anchored) return false;
      if (at == subject_.size()) return false;
      const std::optional<Decoded> decoded = decodeUtf8(subject_, at);
      const char32_t c = decoded ? decoded->codePoint : kReplacement;
      const std::size_t after = at + (decoded ? decoded->length : 1);
      next.clear();
      for (const std::uint32_t pc : current) {
        if (!consumes(code_[pc], c)) continue;
        const Step step = follow(pc + 1, next, stamp + 1, after);
        if (step != Step::goOn) return verdict(step);
      }
      std::swap(current, next);
      at = after;
    }
  }

 private:
  enum class Step { goOn, matched, outOfBudget };

  static std::optional<bool> verdict(Step step) {
    if (step == Step::matched) return true;
    return std::nullopt;
  }

  bool consumes(const Instruction& instruction, char32_t c) const {
    if (instruction.op == Op::codePoint) return instruction.arg == c;
    return contains(sets_[instruction.arg], c);
  }

  // Adds to `reached` the consuming instructions that `start` leads to at byte offset `at`
  // without consuming, one unit of budget for each instruction followed.
  Step follow(std::uint32_t start, std::vector<std::uint32_t>& reached, std::size_t stamp,
              std::size_t at) {
    push(start, stamp);
    while (!stack_.empty()) {
      const std::uint32_t pc = stack_.back();
      stack_.pop_back();
      if (budget_ == 0) return Step::outOfBudget;
      --budget_;
      const Instruction& instruction = code_[pc];
      switch (instruction.op) {
        case Op::codePoint:
        case Op::set:
          reached.push_back(pc);
          break;
        case Op::split:
          push(instruction.arg2, stamp);
          push(instruction.arg, stamp);
          break;
        case Op::jump:
          push(instruction.arg, stamp);
          break;
        case Op::atStart:
          if (at == 0) push(pc + 1, stamp);
          break;
        case Op::atEnd:
          if (at == subject_.size()) push(pc + 1, stamp);
          break;
        case Op::wordBoundary:
          if (atWordBoundary(subject_, at)) push(pc + 1, stamp);
          break;
        case Op::notWordBoundary:
          if (!atWordBoundary(subject_, at)) push(pc + 1, stamp);
          break;
        case Op::match:
          return Step::matched;
      }
    }
    return Step::goOn;
  }

  void push(std::uint32_t pc, std::size_t stamp) {
    if (stampOf_[pc] == stamp) return;
    stampOf_[pc] = stamp;
    stack_.push_back(pc);
  }

  std::span<const Instruction> code_;
  std::span<const CodePointSet> sets_;
  std::string_view subject_;
  std::uint64_t& budget_;
  std::vector<std::size_t> stampOf_;  // per instruction: the set it last joined
  std::vector<std::uint32_t> stack_;  // reached, not yet followed
};

}  // namespace

struct Pattern::Program {
  std::vector<Instruction> code;  // starts at 0, ends with Op::match
  std::vector<CodePointSet> sets;
  bool anchored = false;  // opens with ^: threads start at offset 0 only
};

boost::system::result<Pattern, PatternError> Pattern::compile(std::string_view source) {
  if (source.size() > kMaxSourceBytes) {
    return PatternError{"the pattern is " + std::to_string(source.size()) +
                        " bytes long, more than the " + std::to_string(kMaxSourceBytes) +
                        " allowed"};
  }
  for (std::size_t at = 0; at < source.size();) {
    const std::optional<Decoded> decoded = decodeUtf8(source, at);
    if (!decoded) return PatternError{"at offset " + std::to_string(at) + ": not valid UTF-8"};
    at += decoded->length;
  }
  Parser parser(source);
  boost::system::result<Node, PatternError> root = parser.parse();
  if (!root) return root.error();
  const std::uint64_t size = saturatingAdd(sizeOf(*root), 1);  // and Op::match
  if (size > kMaxInstructions) {
    const std::string count =
        size == std::numeric_limits<std::uint64_t>::max() ? "over 10^19" : std::to_string(size);
    return PatternError{"with its repetitions written out the pattern is " + count +
                        " instructions, more than the " + std::to_string(kMaxInstructions) +
                        " allowed"};
  }
  auto program = std::make_shared<Program>();
  program->code.reserve(size);
  Compiler(program->code).emit(*root);
  program->code.push_back({Op::match});
  program->sets = parser.takeSets();
  program->anchored = program->code.front().op == Op::atStart;
  return Pattern(std::move(program));
}

std::optional<bool> Pattern::search(std::string_view subject, std::uint64_t& budget) const {
  return Simulation(program_->code, program_->sets, subject, budget).run(program_->anchored);
}

std::size_t Pattern::instructions() const { return program_->code.size(); }

}  // namespace toolhost::registry
