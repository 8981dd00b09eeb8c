#include "policy/audit.h"

#include "policy/decisions.h"
#include "protocol/json_parse.h"
#include "protocol/json_text.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <iterator>

namespace toolhost::policy {
namespace json = boost::json;

namespace {

constexpr std::string_view kAuditTable = "audit";

std::optional<AuditEntry> parseEntry(std::uint64_t sequence, std::string_view value) {
  auto parsed = protocol::parseJson(value);
  if (!parsed || !parsed->is_object()) return std::nullopt;
  const auto& row = parsed->as_object();
  auto text = [&](std::string_view name) -> std::string {
    const auto* member = row.if_contains(name);
    return member != nullptr && member->is_string() ? std::string(member->get_string()) : "";
  };
  AuditEntry entry;
  entry.sequence = sequence;
  entry.time = text("time");
  entry.kind = text("kind");
  entry.toolRevision = text("toolRevision");
  entry.toolName = text("toolName");
  entry.action = text("action");
  entry.target = text("target");
  entry.access = parseAccessClass(text("access"));
  entry.verdict = text("verdict");
  if (const auto* scope = row.if_contains("scope"); scope && scope->is_string()) {
    entry.scope = std::string(scope->get_string());
  }
  entry.reason = text("reason");
  if (const auto* status = row.if_contains("status"); status && status->is_int64()) {
    entry.status = static_cast<int>(status->get_int64());
  }
  if (const auto* bytes = row.if_contains("bytes")) {
    if (bytes->is_uint64()) entry.bytes = bytes->get_uint64();
    if (bytes->is_int64() && bytes->get_int64() >= 0) {
      entry.bytes = static_cast<std::uint64_t>(bytes->get_int64());
    }
  }
  if (const auto* duration = row.if_contains("durationMs"); duration && duration->is_int64()) {
    entry.durationMs = duration->get_int64();
  }
  return entry;
}

}  // namespace

json::object toJson(const AuditEntry& entry) {
  json::object out{{"sequence", entry.sequence}, {"time", entry.time},
                   {"kind", entry.kind},         {"toolRevision", entry.toolRevision},
                   {"toolName", entry.toolName}, {"action", entry.action},
                   {"target", entry.target},     {"verdict", entry.verdict},
                   {"reason", entry.reason}};
  if (entry.access) out["access"] = accessClassName(*entry.access);
  if (entry.scope) out["scope"] = *entry.scope;
  if (entry.status) out["status"] = *entry.status;
  if (entry.bytes) out["bytes"] = *entry.bytes;
  if (entry.durationMs) out["durationMs"] = *entry.durationMs;
  return out;
}

AuditLog::AuditLog(store::Store& store, std::size_t maxEntries)
    : store_(store),
      table_(store.table(kAuditTable)),
      maxEntries_(std::max<std::size_t>(maxEntries, 1)),
      thread_([this] { run(); }) {}

AuditLog::~AuditLog() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void AuditLog::append(AuditEntry entry) {
  if (entry.time.empty()) entry.time = formatTime(std::chrono::system_clock::now());
  // A target that is a URL (an external service's endpoint, as its manifest writes it) is kept
  // without its query and fragment: keys travel there, and the audit never holds a query.
  if (entry.target.starts_with("https://") || entry.target.starts_with("http://")) {
    if (const auto cut = entry.target.find_first_of("?#"); cut != std::string::npos) {
      entry.target.resize(cut);
      entry.target += "?...";
    }
  }
  {
    std::unique_lock lock(mutex_);
    if (entry.kind == "denial" && !entry.toolRevision.empty() && !admitDenial(entry)) return;
    changed_.wait(lock, [this] { return queue_.size() < kMaxQueued || stopping_; });
    queue_.push_back(std::move(entry));
    ++appended_;
  }
  changed_.notify_all();
}

bool AuditLog::admitDenial(AuditEntry& entry) {
  const auto now = std::chrono::steady_clock::now();
  auto tokensNow = [&](const DenialBudget& budget, double perSecond, double burst) {
    const std::chrono::duration<double> elapsed = now - budget.refilled;
    return std::min(burst, budget.tokens + elapsed.count() * perSecond);
  };
  auto refill = [&](DenialBudget& budget, double perSecond, double burst) {
    budget.tokens = tokensNow(budget, perSecond, burst);
    budget.refilled = now;
  };
  // Revisions whose buckets are full again hold nothing worth keeping: forget them when many.
  constexpr std::size_t kMaxTracked = 4096;
  if (denials_.size() >= kMaxTracked) {
    std::erase_if(denials_, [&](const auto& item) {
      return item.second.withheld == 0 &&
             tokensNow(item.second, kDenialsPerSecond, kDenialBurst) >= kDenialBurst;
    });
    if (denials_.size() >= kMaxTracked) denials_.clear();
  }
  auto [found, added] =
      denials_.try_emplace(entry.toolRevision, DenialBudget{kDenialBurst, now, 0});
  DenialBudget& own = found->second;
  refill(own, kDenialsPerSecond, kDenialBurst);
  refill(allDenials_, kAllDenialsPerSecond, kAllDenialBurst);
  if (own.tokens < 1 || allDenials_.tokens < 1) {
    ++own.withheld;
    return false;
  }
  own.tokens -= 1;
  allDenials_.tokens -= 1;
  if (own.withheld > 0) {
    entry.reason += " (" + std::to_string(own.withheld) +
                    " earlier denials of this tool revision were left out of the audit log: too "
                    "many at once)";
    own.withheld = 0;
  }
  return true;
}

void AuditLog::flush() const {
  std::unique_lock lock(mutex_);
  const std::uint64_t target = appended_;
  changed_.wait(lock, [&] { return done_ >= target; });
}

void AuditLog::run() {
  std::vector<AuditEntry> batch;
  for (;;) {
    batch.clear();
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued was written
      batch.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
      queue_.clear();
    }
    changed_.notify_all();  // room for appends that waited
    boost::system::result<void> written;
    try {
      written = write(batch);
    } catch (const std::exception& error) {
      written = boost::system::errc::make_error_code(boost::system::errc::io_error);
      spdlog::error("audit: writing {} entries threw: {}", batch.size(), error.what());
    }
    if (!written) {
      spdlog::warn("audit: {} entries could not be written and are lost: {}", batch.size(),
                   store_.describe(written.error()));
    }
    {
      std::lock_guard lock(mutex_);
      done_ += batch.size();
    }
    changed_.notify_all();
  }
}

boost::system::result<void> AuditLog::write(std::vector<AuditEntry>& batch) {
  return store_.write([&](store::WriteTxn& txn) -> boost::system::result<void> {
    // The next number follows the newest row; the table is never emptied by trimming, so numbers
    // only grow.
    std::uint64_t last = 0;
    txn.scan(table_, store::KeyRange::all().reversed(),
             [&](std::string_view key, std::string_view) {
               last = store::tryParseU64Key(key).value_or(0);
               return false;
             });
    for (auto& entry : batch) {
      entry.sequence = ++last;
      json::object row = toJson(entry);
      row.erase("sequence");  // the key holds it
      txn.put(table_, store::u64Key(entry.sequence),
              protocol::writeJson(json::value(std::move(row))));
    }
    std::uint64_t count = txn.count(table_);
    if (count > maxEntries_) {
      std::vector<std::string> oldest;
      auto excess = count - maxEntries_;
      txn.scan(table_, store::KeyRange::all(), [&](std::string_view key, std::string_view) {
        oldest.emplace_back(key);
        return oldest.size() < excess;
      });
      for (const auto& key : oldest) txn.erase(table_, key);
    }
    return {};
  });
}

boost::system::result<std::vector<AuditEntry>> AuditLog::tail(std::size_t limit,
                                                              const AuditFilter& filter) const {
  flush();
  return store_.read([&](store::ReadTxn& txn) {
    std::vector<AuditEntry> newestFirst;
    if (limit == 0) return newestFirst;
    txn.scan(table_, store::KeyRange::all().reversed(),
             [&](std::string_view key, std::string_view value) {
               auto sequence = store::tryParseU64Key(key);
               if (!sequence) return true;
               auto entry = parseEntry(*sequence, value);
               if (!entry) return true;
               if (filter.toolRevision && entry->toolRevision != *filter.toolRevision) return true;
               newestFirst.push_back(std::move(*entry));
               return newestFirst.size() < limit;
             });
    std::reverse(newestFirst.begin(), newestFirst.end());
    return newestFirst;
  });
}

}  // namespace toolhost::policy
