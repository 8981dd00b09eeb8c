// Key encodings for store tables (big-endian integers, NUL-joined composite keys) and the key
// ranges ReadTxn::scan visits. Pure functions on values: any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace toolhost::store {

// LMDB's limit for keys with its default build (mdb_env_get_maxkeysize).
inline constexpr std::size_t kMaxKeySize = 511;

// Tables order keys as LMDB does by default: bytes compared as unsigned, then shorter first.
int compareKeys(std::string_view a, std::string_view b) noexcept;

// 8 bytes, big-endian, so byte order is numeric order (ids, sequence numbers, timestamps).
std::string u64Key(std::uint64_t value);
// The inverse of u64Key; std::nullopt unless `key` is exactly 8 bytes.
std::optional<std::uint64_t> tryParseU64Key(std::string_view key) noexcept;

// Composite keys join parts with one NUL byte: compositeKey({"name", "rev"}) == "name\0rev".
// All keys of one leading part are contiguous ("a\0..." sorts before "ab\0...") and
// compositePrefix() selects them. Every part but the last must be free of NUL bytes (a
// std::invalid_argument otherwise: validate names before they reach a key); the last part may be
// binary, e.g. a u64Key, because nothing follows it.
inline constexpr char kKeySeparator = '\0';
std::string compositeKey(std::initializer_list<std::string_view> parts);
// compositeKey(parts) followed by the separator: the prefix of every key that extends `parts`.
std::string compositePrefix(std::initializer_list<std::string_view> parts);
// Splits a composite key into exactly `parts` parts at its first `parts - 1` separators (so the
// last part may contain NUL bytes). std::nullopt if the key has fewer separators. The views
// point into `key`.
std::optional<std::vector<std::string_view>> trySplitCompositeKey(std::string_view key,
                                                                  std::size_t parts);

// The smallest key greater than every key that starts with `prefix`; std::nullopt when there is
// none (the prefix is empty or all 0xFF bytes), meaning "to the end of the table".
std::optional<std::string> prefixEnd(std::string_view prefix);

// A half-open key range [from, to) visited in key order, or in reverse (highest key first, as an
// audit-log tail wants). Owns its bounds, so it may be built from temporaries.
struct KeyRange {
  std::string from;               // first key included; empty: from the first key of the table
  std::optional<std::string> to;  // first key excluded; std::nullopt: through the last key
  bool reverse = false;

  static KeyRange all();
  static KeyRange prefix(std::string_view prefix);
  static KeyRange startingAt(std::string_view from);
  static KeyRange between(std::string_view from, std::string_view to);

  KeyRange reversed() const;
  bool contains(std::string_view key) const noexcept;
};

}  // namespace toolhost::store
