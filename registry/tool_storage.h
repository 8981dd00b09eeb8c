// Durable storage of sandboxed tools (ctx.storage): JSON values under string keys, per tool NAME
// (shared by every revision of that name, kept across calls, sandboxes and restarts), within
// quotas. Retained sandbox memory is a cache; this is the store.
// Thread-safe: every method may be called from any thread; each runs one short LMDB transaction
// (a write waits for the disk: call it where a few milliseconds of blocking do no harm).
#pragma once

#include "store/keys.h"
#include "store/store.h"

#include <boost/json/value.hpp>
#include <boost/system/result.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace toolhost::registry {

// What one tool name may keep ([storage] in the config). Bytes are counted as the UTF-8 bytes of
// each key plus the compact JSON text of its value (as protocol::writeJson writes it).
struct StorageQuotas {
  std::size_t maxKeys = 1000;                         // keys per tool
  std::size_t maxKeyBytes = 256;                      // one key
  std::size_t maxValueBytes = std::size_t{64} << 10;  // one value's JSON text
  std::size_t maxTotalBytes = std::size_t{10} << 20;  // keys and values of one tool together
};

// The longest key any quota may allow: one LMDB key (511 bytes) holds the tool name (at most 64
// bytes), a NUL and the key.
inline constexpr std::size_t kMaxStorageKeyBytes = store::kMaxKeySize - 64 - 1;

enum class StorageErrc {
  invalidArgument,  // an empty, over-long or non-text key, control characters, a bad tool name
  quotaExceeded,    // the write would pass max_keys, max_value_bytes or max_total_bytes
  full,             // the state database (LMDB map) or the disk is full
  failed,           // any other failure of the state database, or a stored value that is corrupt
};

struct StorageError {
  StorageErrc code;
  std::string detail;  // a sentence a tool author can act on; names the quota and the numbers
};

template <typename T>
using StorageResult = boost::system::result<T, StorageError>;

struct StorageUsage {
  std::uint64_t keys = 0;
  std::uint64_t bytes = 0;
  friend bool operator==(const StorageUsage&, const StorageUsage&) = default;
};

struct StorageEntry {
  std::string key;
  std::uint64_t bytes = 0;  // key plus value
};

struct ToolUsage {
  std::string tool;
  StorageUsage usage;
};

// One operation of a batch (ToolStorage::apply).
struct StorageOp {
  enum class Kind { get, set, erase, list };
  Kind kind = Kind::get;
  std::string tool;
  std::string key;           // not for list
  boost::json::value value;  // set only
  // set: protocol::writeJson(value), when the caller wrote it already (then `value` is ignored).
  std::optional<std::string> valueJson;
};

// What an operation of a batch gave; only the member of its kind is filled.
struct StorageOpOutcome {
  std::optional<boost::json::value> value;  // get: the stored value, if the key exists
  StorageUsage usage;                       // set: the tool's usage after the write
  bool existed = false;                     // erase: whether the key existed
  std::vector<std::string> keys;            // list: every key, in byte order
};

class ToolStorage {
 public:
  explicit ToolStorage(store::Store& store);

  // The tables this module keeps in the store (pass them to store::Options at open).
  static std::vector<std::string> tables();

  // The value under `key`, or std::nullopt when there is none.
  StorageResult<std::optional<boost::json::value>> get(std::string_view tool, std::string_view key);
  // Stores `value` under `key` (replacing what was there); the tool's usage afterwards. Quotas
  // are checked against the usage the write leaves: a write that adds a key past max_keys, or
  // bytes past max_total_bytes, is refused, while one that shrinks the usage always passes
  // (so a tool over a lowered quota can still clean up).
  StorageResult<StorageUsage> set(std::string_view tool, std::string_view key,
                                  const boost::json::value& value, const StorageQuotas& quotas);
  // Removes `key`; whether it existed.
  StorageResult<bool> erase(std::string_view tool, std::string_view key);
  // Every key of the tool in byte order (UTF-8, so code point order). At most max_keys of the
  // quota the keys were written under.
  StorageResult<std::vector<std::string>> list(std::string_view tool);

  // For operators: usage, entries with their sizes, every tool that stores something, and
  // removing everything a tool stored (what was removed).
  StorageResult<StorageUsage> usage(std::string_view tool);
  StorageResult<std::vector<StorageEntry>> entries(std::string_view tool);
  StorageResult<std::vector<ToolUsage>> tools();
  StorageResult<StorageUsage> clear(std::string_view tool);

  // Runs `ops` in order, each seeing the ones before it, in ONE transaction committed once (one
  // wait for the disk for all of them), and returns one outcome per op. An op refused on its own
  // (bad key, quota) fails alone. If the commit fails (the database is full), each op is retried
  // in a transaction of its own, so only those that do not fit fail.
  std::vector<StorageResult<StorageOpOutcome>> apply(std::span<const StorageOp> ops,
                                                     const StorageQuotas& quotas);

  // Checks a key as get/erase do (set also checks it against quotas.maxKeyBytes).
  static std::optional<StorageError> checkKey(std::string_view key, std::size_t maxBytes);
  // Checks the size of a value's JSON text against quotas.maxValueBytes.
  static std::optional<StorageError> checkValueSize(std::size_t bytes, const StorageQuotas& quotas);

 private:
  class Session;

  store::Store& store_;
  store::Table values_;  // tool \0 key -> compact JSON text of the value
  store::Table usage_;   // tool -> {"keys": n, "bytes": n}; absent when the tool stores nothing
};

}  // namespace toolhost::registry
