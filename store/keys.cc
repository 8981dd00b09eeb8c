#include "store/keys.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace toolhost::store {

int compareKeys(std::string_view a, std::string_view b) noexcept {
  const std::size_t common = std::min(a.size(), b.size());
  if (common != 0) {
    if (int c = std::memcmp(a.data(), b.data(), common); c != 0) return c < 0 ? -1 : 1;
  }
  if (a.size() == b.size()) return 0;
  return a.size() < b.size() ? -1 : 1;
}

std::string u64Key(std::uint64_t value) {
  std::string key(8, '\0');
  for (int i = 7; i >= 0; --i) {
    key[static_cast<std::size_t>(i)] = static_cast<char>(value & 0xFFU);
    value >>= 8U;
  }
  return key;
}

std::optional<std::uint64_t> tryParseU64Key(std::string_view key) noexcept {
  if (key.size() != 8) return std::nullopt;
  std::uint64_t value = 0;
  for (char c : key) value = (value << 8U) | static_cast<unsigned char>(c);
  return value;
}

std::string compositeKey(std::initializer_list<std::string_view> parts) {
  std::string key;
  std::size_t index = 0;
  for (std::string_view part : parts) {
    const bool last = index + 1 == parts.size();
    if (!last && part.find(kKeySeparator) != std::string_view::npos) {
      throw std::invalid_argument("store: a composite key part other than the last contains NUL");
    }
    if (index != 0) key.push_back(kKeySeparator);
    key.append(part);
    ++index;
  }
  return key;
}

std::string compositePrefix(std::initializer_list<std::string_view> parts) {
  for (std::string_view part : parts) {
    if (part.find(kKeySeparator) != std::string_view::npos) {
      throw std::invalid_argument("store: a composite key prefix part contains NUL");
    }
  }
  std::string key = compositeKey(parts);
  key.push_back(kKeySeparator);
  return key;
}

std::optional<std::vector<std::string_view>> trySplitCompositeKey(std::string_view key,
                                                                  std::size_t parts) {
  if (parts == 0) return std::nullopt;
  std::vector<std::string_view> out;
  out.reserve(parts);
  while (out.size() + 1 < parts) {
    const std::size_t at = key.find(kKeySeparator);
    if (at == std::string_view::npos) return std::nullopt;
    out.push_back(key.substr(0, at));
    key.remove_prefix(at + 1);
  }
  out.push_back(key);
  return out;
}

std::optional<std::string> prefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last != 0xFFU) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::nullopt;
}

KeyRange KeyRange::all() { return {}; }

KeyRange KeyRange::prefix(std::string_view prefix) {
  return KeyRange{std::string(prefix), prefixEnd(prefix), false};
}

KeyRange KeyRange::startingAt(std::string_view from) {
  return KeyRange{std::string(from), std::nullopt, false};
}

KeyRange KeyRange::between(std::string_view from, std::string_view to) {
  return KeyRange{std::string(from), std::string(to), false};
}

KeyRange KeyRange::reversed() const {
  KeyRange r = *this;
  r.reverse = !reverse;
  return r;
}

bool KeyRange::contains(std::string_view key) const noexcept {
  if (compareKeys(key, from) < 0) return false;
  return !to || compareKeys(key, *to) < 0;
}

}  // namespace toolhost::store
