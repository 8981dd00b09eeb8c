#include "registry/tool_storage.h"

#include "protocol/json_parse.h"
#include "protocol/json_text.h"
#include "registry/registry.h"

#include <spdlog/spdlog.h>
#include <boost/json/object.hpp>

#include <algorithm>
#include <utility>

namespace toolhost::registry {
namespace json = boost::json;

static_assert(kMaxStorageKeyBytes + kMaxToolNameLength + 1 <= store::kMaxKeySize,
              "a storage key, its tool name and the separator must fit in one LMDB key");

namespace {

constexpr std::string_view kValuesTable = "tool_storage";
constexpr std::string_view kUsageTable = "tool_storage_usage";
// Values were bounded by the runtime's result depth when stored; this only guards the parser.
constexpr std::size_t kMaxStoredDepth = 100000;

StorageError invalid(std::string detail) {
  return StorageError{StorageErrc::invalidArgument, std::move(detail)};
}

StorageError quota(std::string detail) {
  return StorageError{StorageErrc::quotaExceeded, std::move(detail)};
}

// The next code point of valid UTF-8 (no overlong forms, surrogates or values past U+10FFFF),
// or std::nullopt.
std::optional<char32_t> nextCodePoint(std::string_view text, std::size_t& at) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  if (lead < 0x80) {
    ++at;
    return lead;
  }
  const std::size_t length = (lead & 0xE0) == 0xC0   ? 2
                             : (lead & 0xF0) == 0xE0 ? 3
                             : (lead & 0xF8) == 0xF0 ? 4
                                                     : 0;
  if (length == 0 || at + length > text.size()) return std::nullopt;
  static constexpr char32_t kLowest[] = {0, 0, 0x80, 0x800, 0x10000};  // shorter forms: overlong
  char32_t point = lead & (0x7F >> length);
  for (std::size_t i = 1; i < length; ++i) {
    if ((byte(at + i) & 0xC0) != 0x80) return std::nullopt;
    point = (point << 6) | (byte(at + i) & 0x3F);
  }
  if (point < kLowest[length] || point > 0x10FFFF || (point >= 0xD800 && point <= 0xDFFF)) {
    return std::nullopt;
  }
  at += length;
  return point;
}

std::string usageText(const StorageUsage& usage) {
  return protocol::writeJson(json::object{{"keys", usage.keys}, {"bytes", usage.bytes}});
}

std::optional<StorageUsage> parseUsage(std::string_view text) {
  auto parsed = protocol::parseJson(text);
  if (!parsed || !parsed->is_object()) return std::nullopt;
  const auto* keys = parsed->as_object().if_contains("keys");
  const auto* bytes = parsed->as_object().if_contains("bytes");
  if (keys == nullptr || bytes == nullptr) return std::nullopt;
  auto count = [](const json::value& value) -> std::optional<std::uint64_t> {
    if (value.is_uint64()) return value.get_uint64();
    if (value.is_int64() && value.get_int64() >= 0) return value.get_int64();
    return std::nullopt;
  };
  auto k = count(*keys);
  auto b = count(*bytes);
  if (!k || !b) return std::nullopt;
  return StorageUsage{*k, *b};
}

std::uint64_t minus(std::uint64_t a, std::uint64_t b) { return a > b ? a - b : 0; }

}  // namespace

// The operations against one transaction (a WriteTxn for set and erase). Store failures poison
// the transaction; read()/write() then report them, whatever these return.
class ToolStorage::Session {
 public:
  Session(const ToolStorage& storage, store::ReadTxn& txn, store::WriteTxn* write)
      : storage_(storage), txn_(txn), write_(write) {}

  StorageResult<StorageOpOutcome> run(const StorageOp& op, const std::string& text,
                                      const StorageQuotas& quotas) {
    StorageOpOutcome out;
    switch (op.kind) {
      case StorageOp::Kind::get: {
        auto value = get(op.tool, op.key);
        if (!value) return value.error();
        out.value = std::move(*value);
        break;
      }
      case StorageOp::Kind::set: {
        auto usage = set(op.tool, op.key, text, quotas);
        if (!usage) return usage.error();
        out.usage = *usage;
        break;
      }
      case StorageOp::Kind::erase:
        out.existed = erase(op.tool, op.key);
        break;
      case StorageOp::Kind::list:
        out.keys = list(op.tool);
        break;
    }
    return out;
  }

  StorageUsage usage(std::string_view tool) {
    auto text = txn_.tryGet(storage_.usage_, tool);
    if (!text) return {};
    if (auto usage = parseUsage(*text)) return *usage;
    // Never expected: recount rather than refuse every write of the tool.
    spdlog::error("storage: the usage row of {} is unreadable; recounting", tool);
    StorageUsage counted;
    txn_.scan(storage_.values_, prefixOf(tool), [&](std::string_view key, std::string_view value) {
      ++counted.keys;
      counted.bytes += key.size() - tool.size() - 1 + value.size();
    });
    return counted;
  }

  StorageResult<std::optional<json::value>> get(std::string_view tool, std::string_view key) {
    auto text = txn_.tryGet(storage_.values_, store::compositeKey({tool, key}));
    if (!text) return std::optional<json::value>();
    auto parsed = protocol::parseJson(*text, protocol::JsonParseLimits{kMaxStoredDepth});
    if (!parsed) {
      spdlog::error("storage: the value of {} under a key of {} bytes is unreadable: {}", tool,
                    key.size(), parsed.error().detail);
      return StorageError{StorageErrc::failed,
                          "the stored value of this key is unreadable; delete it and set it again"};
    }
    return std::optional<json::value>(std::move(*parsed));
  }

  StorageResult<StorageUsage> set(std::string_view tool, std::string_view key,
                                  const std::string& text, const StorageQuotas& quotas) {
    const std::string row = store::compositeKey({tool, key});
    const auto old = txn_.tryGet(storage_.values_, row);
    const StorageUsage before = usage(tool);
    const std::uint64_t oldBytes = old ? key.size() + old->size() : 0;
    const std::uint64_t newBytes = key.size() + text.size();
    const StorageUsage after{before.keys + (old ? 0 : 1), minus(before.bytes, oldBytes) + newBytes};
    if (!old && after.keys > quotas.maxKeys) {
      return quota("storage quota max_keys exceeded: " + std::string(tool) + " already stores " +
                   std::to_string(before.keys) + " keys and may keep at most " +
                   std::to_string(quotas.maxKeys) + "; delete keys it no longer needs");
    }
    if (newBytes > oldBytes && after.bytes > quotas.maxTotalBytes) {
      return quota("storage quota max_total_bytes exceeded: this write would bring what " +
                   std::string(tool) + " stores to " + std::to_string(after.bytes) +
                   " bytes (keys and values, now " + std::to_string(before.bytes) +
                   "); the limit is " + std::to_string(quotas.maxTotalBytes) + " bytes");
    }
    write_->put(storage_.values_, row, text);
    write_->put(storage_.usage_, tool, usageText(after));
    return after;
  }

  bool erase(std::string_view tool, std::string_view key) {
    const std::string row = store::compositeKey({tool, key});
    const auto old = txn_.tryGet(storage_.values_, row);
    if (!old) return false;
    const StorageUsage before = usage(tool);
    const StorageUsage after{minus(before.keys, 1), minus(before.bytes, key.size() + old->size())};
    write_->erase(storage_.values_, row);
    if (after.keys == 0) {
      write_->erase(storage_.usage_, tool);
    } else {
      write_->put(storage_.usage_, tool, usageText(after));
    }
    return true;
  }

  std::vector<std::string> list(std::string_view tool) {
    std::vector<std::string> keys;
    const std::size_t skip = tool.size() + 1;
    txn_.scan(storage_.values_, prefixOf(tool),
              [&](std::string_view key, std::string_view) { keys.emplace_back(key.substr(skip)); });
    return keys;
  }

  static store::KeyRange prefixOf(std::string_view tool) {
    return store::KeyRange::prefix(store::compositePrefix({tool}));
  }

 private:
  const ToolStorage& storage_;
  store::ReadTxn& txn_;
  store::WriteTxn* write_;
};

ToolStorage::ToolStorage(store::Store& store)
    : store_(store), values_(store.table(kValuesTable)), usage_(store.table(kUsageTable)) {}

std::vector<std::string> ToolStorage::tables() {
  return {std::string(kValuesTable), std::string(kUsageTable)};
}

std::optional<StorageError> ToolStorage::checkKey(std::string_view key, std::size_t maxBytes) {
  if (key.empty()) return invalid("a storage key must not be empty");
  if (key.size() > maxBytes) {
    return invalid("the storage key is " + std::to_string(key.size()) +
                   " bytes of UTF-8; keys may be at most " + std::to_string(maxBytes) +
                   " bytes (storage quota max_key_bytes)");
  }
  for (std::size_t at = 0; at < key.size();) {
    auto point = nextCodePoint(key, at);
    if (!point) return invalid("a storage key must be valid UTF-8 text");
    if (*point < 0x20 || (*point >= 0x7F && *point <= 0x9F)) {
      return invalid(
          "a storage key must not contain control characters (U+0000-U+001F, "
          "U+007F-U+009F)");
    }
  }
  return std::nullopt;
}

std::optional<StorageError> ToolStorage::checkValueSize(std::size_t bytes,
                                                        const StorageQuotas& quotas) {
  if (bytes <= quotas.maxValueBytes) return std::nullopt;
  return quota("storage quota max_value_bytes exceeded: the value is " + std::to_string(bytes) +
               " bytes as JSON; one value may be at most " + std::to_string(quotas.maxValueBytes) +
               " bytes");
}

namespace {

std::optional<StorageError> checkTool(std::string_view tool) {
  if (isValidToolName(tool)) return std::nullopt;
  return invalid("\"" + std::string(tool.substr(0, 80)) + "\" is not a tool name");
}

// The outcome of a failed transaction, for every op it carried.
StorageError storeFailure(const store::Store& store, const boost::system::error_code& ec) {
  const bool full = ec == store::StoreErrc::mapFull || ec == store::StoreErrc::diskFull;
  if (std::string note; store.allowFailureLine(note)) {
    spdlog::warn("storage: the state database failed: {}{}", store.describe(ec), note);
  }
  if (ec == store::StoreErrc::diskFull) {
    return StorageError{StorageErrc::full,
                        "the disk holding the daemon's state database is full; ask the operator "
                        "to free space on it"};
  }
  if (full) {
    return StorageError{StorageErrc::full,
                        "the daemon's state database is full; ask the operator to free space in "
                        "it (storage.clear) or raise [store] map_size_mb"};
  }
  return StorageError{StorageErrc::failed,
                      "the daemon's state database failed; the operator will find the cause in "
                      "its log"};
}

}  // namespace

std::vector<StorageResult<StorageOpOutcome>> ToolStorage::apply(std::span<const StorageOp> ops,
                                                                const StorageQuotas& quotas) {
  std::vector<std::optional<StorageResult<StorageOpOutcome>>> out(ops.size());
  std::vector<std::string> texts(ops.size());
  std::vector<bool> refused(ops.size(), false);
  std::size_t pending = 0;
  bool writes = false;
  // Checks that need no transaction: names, keys, value sizes.
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const StorageOp& op = ops[i];
    std::optional<StorageError> refusal = checkTool(op.tool);
    if (!refusal && op.kind != StorageOp::Kind::list) {
      refusal = checkKey(op.key, op.kind == StorageOp::Kind::set
                                     ? std::min(quotas.maxKeyBytes, kMaxStorageKeyBytes)
                                     : kMaxStorageKeyBytes);
    }
    if (!refusal && op.kind == StorageOp::Kind::set) {
      texts[i] = op.valueJson ? *op.valueJson : protocol::writeJson(op.value);
      refusal = checkValueSize(texts[i].size(), quotas);
    }
    if (refusal) {
      out[i] = *refusal;
      refused[i] = true;
      continue;
    }
    ++pending;
    writes = writes || op.kind == StorageOp::Kind::set || op.kind == StorageOp::Kind::erase;
  }

  if (pending > 0) {
    auto runAll = [&](store::ReadTxn& txn, store::WriteTxn* write) {
      Session session(*this, txn, write);
      for (std::size_t i = 0; i < ops.size(); ++i) {
        if (!refused[i]) out[i] = session.run(ops[i], texts[i], quotas);
      }
    };
    boost::system::error_code failure;
    if (writes) {
      auto written = store_.write([&](store::WriteTxn& txn) -> boost::system::result<void> {
        runAll(txn, &txn);
        return {};
      });
      if (!written) failure = written.error();
    } else {
      auto read = store_.read([&](store::ReadTxn& txn) { runAll(txn, nullptr); });
      if (!read) failure = read.error();
    }
    if (failure) {
      // Nothing of the transaction was kept. When it did not fit as a whole, each op gets a
      // transaction of its own, so that only the ops that do not fit fail.
      const bool retry =
          writes && pending > 1 &&
          (failure == store::StoreErrc::mapFull || failure == store::StoreErrc::diskFull ||
           failure == store::StoreErrc::txnFull);
      std::optional<StorageError> shared;
      for (std::size_t i = 0; i < ops.size(); ++i) {
        if (refused[i]) continue;
        if (retry) {
          out[i] = std::move(apply(ops.subspan(i, 1), quotas).front());
        } else {
          if (!shared) shared = storeFailure(store_, failure);
          out[i] = *shared;
        }
      }
    }
  }
  std::vector<StorageResult<StorageOpOutcome>> results;
  results.reserve(ops.size());
  for (auto& result : out) results.push_back(std::move(*result));
  return results;
}

namespace {

StorageOp makeOp(StorageOp::Kind kind, std::string_view tool, std::string_view key = {},
                 json::value value = nullptr) {
  return StorageOp{kind, std::string(tool), std::string(key), std::move(value), std::nullopt};
}

}  // namespace

StorageResult<std::optional<json::value>> ToolStorage::get(std::string_view tool,
                                                           std::string_view key) {
  const StorageOp op = makeOp(StorageOp::Kind::get, tool, key);
  auto outcome = std::move(apply({&op, 1}, StorageQuotas{}).front());
  if (!outcome) return outcome.error();
  return std::move(outcome->value);
}

StorageResult<StorageUsage> ToolStorage::set(std::string_view tool, std::string_view key,
                                             const json::value& value,
                                             const StorageQuotas& quotas) {
  const StorageOp op = makeOp(StorageOp::Kind::set, tool, key, value);
  auto outcome = std::move(apply({&op, 1}, quotas).front());
  if (!outcome) return outcome.error();
  return outcome->usage;
}

StorageResult<bool> ToolStorage::erase(std::string_view tool, std::string_view key) {
  const StorageOp op = makeOp(StorageOp::Kind::erase, tool, key);
  auto outcome = std::move(apply({&op, 1}, StorageQuotas{}).front());
  if (!outcome) return outcome.error();
  return outcome->existed;
}

StorageResult<std::vector<std::string>> ToolStorage::list(std::string_view tool) {
  const StorageOp op = makeOp(StorageOp::Kind::list, tool);
  auto outcome = std::move(apply({&op, 1}, StorageQuotas{}).front());
  if (!outcome) return outcome.error();
  return std::move(outcome->keys);
}

StorageResult<StorageUsage> ToolStorage::usage(std::string_view tool) {
  if (auto refusal = checkTool(tool)) return *refusal;
  auto read =
      store_.read([&](store::ReadTxn& txn) { return Session(*this, txn, nullptr).usage(tool); });
  if (!read) return storeFailure(store_, read.error());
  return *read;
}

StorageResult<std::vector<StorageEntry>> ToolStorage::entries(std::string_view tool) {
  if (auto refusal = checkTool(tool)) return *refusal;
  const std::size_t skip = tool.size() + 1;
  auto read = store_.read([&](store::ReadTxn& txn) {
    std::vector<StorageEntry> entries;
    txn.scan(values_, Session::prefixOf(tool), [&](std::string_view key, std::string_view value) {
      entries.push_back(
          StorageEntry{std::string(key.substr(skip)), key.size() - skip + value.size()});
    });
    return entries;
  });
  if (!read) return storeFailure(store_, read.error());
  return std::move(*read);
}

StorageResult<std::vector<ToolUsage>> ToolStorage::tools() {
  auto read = store_.read([&](store::ReadTxn& txn) {
    std::vector<ToolUsage> tools;
    txn.scan(usage_, store::KeyRange::all(), [&](std::string_view tool, std::string_view text) {
      tools.push_back(ToolUsage{std::string(tool), parseUsage(text).value_or(StorageUsage{})});
    });
    return tools;
  });
  if (!read) return storeFailure(store_, read.error());
  return std::move(*read);
}

StorageResult<StorageUsage> ToolStorage::clear(std::string_view tool) {
  if (auto refusal = checkTool(tool)) return *refusal;
  // In transactions of a few rows each. A delete needs room too: LMDB copies the pages it
  // changes and records the pages it frees, and in a full map one transaction over every row of
  // a large tool never fits, which left no way to free the room the tool holds. A transaction
  // that does not fit is tried again with half as many rows, down to one; one that fits lets the
  // next take twice as many (the room it freed is usable two commits later). Each commit keeps
  // the usage row true to the rows left, so a clear cut short leaves a consistent store.
  constexpr std::size_t kMaxRowsPerTransaction = 64;
  // The rows there now bound the commits: tools writing meanwhile cannot keep the clear going.
  auto counted = store_.read([&](store::ReadTxn& txn) {
    std::uint64_t rows = 0;
    txn.scan(values_, Session::prefixOf(tool), [&](std::string_view, std::string_view) { ++rows; });
    return rows;
  });
  if (!counted) return storeFailure(store_, counted.error());
  std::uint64_t commits = *counted + 2;  // each removes at least one row
  std::size_t rowsPerTransaction = kMaxRowsPerTransaction;
  StorageUsage removed;
  while (commits > 0) {
    auto written = store_.write([&](store::WriteTxn& txn) -> boost::system::result<StorageUsage> {
      std::vector<std::string> rows;
      StorageUsage chunk;
      txn.scan(values_, Session::prefixOf(tool), [&](std::string_view key, std::string_view value) {
        rows.emplace_back(key);
        ++chunk.keys;
        chunk.bytes += key.size() - tool.size() - 1 + value.size();
        return rows.size() < rowsPerTransaction;
      });
      for (const auto& row : rows) txn.erase(values_, row);
      if (rows.size() == rowsPerTransaction) {
        const auto text = txn.tryGet(usage_, tool);
        const StorageUsage before =
            text ? parseUsage(*text).value_or(StorageUsage{}) : StorageUsage{};
        txn.put(usage_, tool,
                usageText(StorageUsage{minus(before.keys, chunk.keys),
                                       minus(before.bytes, chunk.bytes)}));
      } else {
        txn.erase(usage_, tool);
      }
      return chunk;
    });
    const bool full = !written && (written.error() == store::StoreErrc::mapFull ||
                                   written.error() == store::StoreErrc::diskFull);
    if (full && rowsPerTransaction > 1) {
      rowsPerTransaction /= 2;
      continue;
    }
    if (!written) {
      auto failure = storeFailure(store_, written.error());
      if (removed.keys > 0) {
        failure.detail += "; " + std::to_string(removed.keys) +
                          " keys were removed before it stopped: clear again for the rest";
      }
      return failure;
    }
    --commits;
    removed.keys += written->keys;
    removed.bytes += written->bytes;
    if (written->keys < rowsPerTransaction) break;
    rowsPerTransaction = std::min(rowsPerTransaction * 2, kMaxRowsPerTransaction);
  }
  return removed;
}

}  // namespace toolhost::registry
