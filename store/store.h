// The state database: one LMDB environment in the state directory, named tables fixed at open,
// a schema version, and short transactions reached only through callbacks. Any thread.
//
// Caveats (every thread and lifetime rule of this module, stated once):
//  - One process per state directory, and one Store per state directory in that process. open()
//    takes an exclusive flock(2) on <stateDir> itself and on <stateDir>/toolhost.lock (which
//    then holds the pid; removing it by hand does not let a second opener in) and refuses a
//    second opener: StoreErrc::alreadyOpen in the same process, StoreErrc::locked
//    ("in use by pid N") from another. Never use a Store inherited through fork(); open one in
//    the child instead (an LMDB rule).
//  - A Store is neither copyable nor movable. It must outlive every call into it and every Table
//    taken from it; destroy it only when no read() or write() is running.
//  - read(), write() and stats() may be called from any thread, concurrently. Writes are
//    serialized (one write transaction at a time); reads never wait for writes and each sees one
//    whole committed state: every write that returned before the read began, and none that began
//    after. A write still committing may be seen or not, and two reads during its commit may
//    disagree in either order (LMDB writes a commit's meta page before it publishes the commit's
//    transaction id, and a reader picks the meta page by that id).
//  - A transaction lives exactly as long as its callback, on the calling thread. The callback
//    must not suspend (co_await), pass the ReadTxn/WriteTxn to another thread, or keep it. Keep
//    callbacks short: a write blocks every other writer, and a long read pins old pages so the
//    file grows. A write callback must never wait for another thread's write (deadlock).
//  - Calling write() from inside a write callback on the same thread would deadlock, so it throws
//    std::logic_error. read() inside a write callback works but sees the state before that
//    write; a WriteTxn is a ReadTxn, so read your own writes through it.
//  - The string_views from tryGet() and scan() point into the database map: valid until the
//    callback returns, and in a WriteTxn only until its next put/erase/clear. Copy (getCopy)
//    what must live longer; nothing read may be kept past the callback.
//  - A scan visitor must not modify the transaction (that throws std::logic_error): collect the
//    keys, then modify after the scan.
//  - Expected failures are values; exceptions (std::logic_error, std::out_of_range) only report
//    bugs in the caller, as listed here. The first failure inside a transaction poisons it:
//    later operations do nothing (tryGet gives std::nullopt, putIfAbsent/erase give false) and
//    read()/write() return that error whatever the callback returned; a poisoned write is never
//    committed. "Not found" is not a failure.
//  - write(): the callback returns boost::system::result<T>. A value commits and is returned; an
//    error aborts and is returned unchanged; an exception aborts and propagates. A failed commit
//    (map full, disk full) returns the error and leaves the previous state. Every transaction
//    aborts in its destructor unless it was committed.
//  - Durable: a write() that returned a value has reached the disk (no MDB_NOSYNC, no
//    MDB_NOMETASYNC), and a crash at any point leaves the last committed state.
//
// Layout of the state directory (created 0700, files 0600):
//   <stateDir>/toolhost.lock   flock + pid of the owning process
//   <stateDir>/db.created      made once the database first held a schema version: a database
//                              missing or empty after that is refused (StoreErrc::corrupt)
//   <stateDir>/db/data.mdb     the LMDB data file
//   <stateDir>/db/lock.mdb     LMDB's reader table
// Each of these that exists when open() starts must be a directory or regular file (no link)
// of this process's user or root, not writable by group or others (StoreErrc::permissionDenied):
// in a state directory others may write to (sticky, as /tmp), they could have made it.
#pragma once

#include <atomic>
#include <boost/system/error_code.hpp>
#include <boost/system/result.hpp>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "store/errors.h"
#include "store/keys.h"

// LMDB's opaque handles; lmdb.h itself stays out of this header.
struct MDB_env;
struct MDB_txn;

namespace toolhost::store {

// Bumped when the meaning of stored rows changes. A store written by a newer build is refused.
inline constexpr std::uint32_t kSchemaVersion = 1;
// Reserved for the store's own rows (the schema version); not available as a user table.
inline constexpr std::string_view kMetaTable = "meta";

// What a check of every page (Options::checkPages) found: damage, or a check that could not be
// made (then `damaged` is false and `text` says why).
struct PageCheckFailure {
  bool damaged = false;
  std::string text;
};

struct Options {
  std::filesystem::path stateDir;   // created (0700) if missing
  std::vector<std::string> tables;  // named tables, created if missing; not "meta"
  std::size_t mapSizeMb = 1024;     // config: [store] map_size_mb
  unsigned maxTables = 64;          // LMDB maxdbs; must exceed tables.size()
  unsigned maxReaders = 126;        // LMDB maxreaders: concurrent read transactions
  // Checks every page of the database (page_check.h runs it in a child process), given the LMDB
  // directory: what is damaged or why it could not check, or nothing. open() calls it before
  // anything reads a table, once the data file holds something, and refuses a damaged database
  // (StoreErrc::corrupt) or one it could not check (StoreErrc::ioError); checkPages() calls it
  // again. Unset: no check.
  std::function<std::optional<PageCheckFailure>(const std::filesystem::path& db)> checkPages;
  // Whether a line about a failed read or write may be logged now (`note`: what was held back,
  // for the end of the line): a full disk fails every write a client or tool makes, and each
  // must not cost the operator's disk a line. Unset: every line is logged.
  std::function<bool(std::string& note)> allowFailureLine;
};

// Why open() failed: the code to branch on, and a sentence for the user that names the path and
// whatever else they need (the pid holding the lock, both schema versions, ...).
struct OpenError {
  boost::system::error_code code;
  std::string message;
};
[[noreturn]] void throw_exception_from_error(const OpenError& e, const boost::source_location& loc);

struct TableStats {
  std::string name;
  std::uint64_t entries = 0;
};

// For daemon.health: how full the map is and what the tables hold.
struct Stats {
  std::filesystem::path path;  // the state directory
  std::uint64_t mapSizeBytes = 0;
  std::uint64_t usedBytes = 0;  // pages in use up to the high-water mark, times the page size
  std::uint32_t pageSize = 0;
  std::uint32_t readersUsed = 0;
  std::uint32_t maxReaders = 0;
  std::uint32_t schemaVersion = 0;
  std::vector<TableStats> tables;  // in the order given at open
  // The most recent write failed because the map or the disk was full (a later write that
  // succeeds clears it).
  bool writesFull = false;
  // Or it failed for another reason that is the store's, not the write's (an I/O error, a
  // permission, a fatal LMDB error): that error. Cleared the same way.
  boost::system::error_code writesFailing;
};

class Store;
class ReadTxn;
class WriteTxn;
using StorePtr = std::unique_ptr<Store>;

namespace detail {

// A non-owning reference to a callable, so the transaction logic lives in store.cc.
template <class Sig>
class FunctionRef;
template <class R, class... A>
class FunctionRef<R(A...)> {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::remove_cvref_t<F>, FunctionRef>>>
  FunctionRef(F& f) noexcept  // NOLINT(google-explicit-constructor)
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, A... a) -> R {
          return std::invoke(*static_cast<F*>(o), std::forward<A>(a)...);
        }) {}
  R operator()(A... a) const { return call_(object_, std::forward<A>(a)...); }

 private:
  void* object_;
  R (*call_)(void*, A...);
};

template <class R>
struct IsResult : std::false_type {};
template <class T, class E>
struct IsResult<boost::system::result<T, E>> : std::true_type {};

// What read() returns for a callback returning R: R itself if it is a result, else result<R>.
template <class R>
struct ReadOutcome {
  using type = boost::system::result<R>;
};
template <class T>
struct ReadOutcome<boost::system::result<T>> {
  using type = boost::system::result<T>;
};

}  // namespace detail

// A named table (LMDB DBI) of one Store. A small value; valid while its Store lives. Using it
// with another Store, even one reopened at the same address, throws std::logic_error.
class Table {
 public:
  std::string_view name() const noexcept { return *name_; }
  friend bool operator==(const Table& a, const Table& b) noexcept {
    return a.storeId_ == b.storeId_ && a.dbi_ == b.dbi_;
  }

 private:
  friend class Store;
  friend class ReadTxn;
  friend class WriteTxn;
  Table(std::uint64_t storeId, unsigned dbi, const std::string* name) noexcept
      : storeId_(storeId), dbi_(dbi), name_(name) {}

  std::uint64_t storeId_;  // Store::id_, unique per Store in this process
  unsigned dbi_;
  const std::string* name_;
};

// A read-only snapshot. Exists only inside Store::read() (or as the base of a WriteTxn).
class ReadTxn {
 public:
  ReadTxn(const ReadTxn&) = delete;
  ReadTxn& operator=(const ReadTxn&) = delete;
  ~ReadTxn();  // aborts unless committed

  // The value stored under `key`, pointing into the map (see Caveats for how long it is valid).
  std::optional<std::string_view> tryGet(Table table, std::string_view key);
  std::optional<std::string> getCopy(Table table, std::string_view key);
  bool contains(Table table, std::string_view key) { return tryGet(table, key).has_value(); }
  // Entries in the table (as of this transaction, including its own writes).
  std::uint64_t count(Table table);
  // The bytes of the pages the table takes (branch, leaf and overflow pages).
  std::uint64_t bytes(Table table);

  // Calls visit(key, value) for each entry in `range`, in key order (or reverse). The visitor
  // returns bool (false stops the scan) or void (visit everything). It must not modify the
  // transaction.
  template <class Visit>
  void scan(Table table, const KeyRange& range, Visit&& visit) {
    using R = std::invoke_result_t<Visit&, std::string_view, std::string_view>;
    static_assert(std::is_same_v<R, bool> || std::is_void_v<R>,
                  "scan visitor returns bool (false stops) or void");
    auto adapter = [&visit](std::string_view key, std::string_view value) -> bool {
      if constexpr (std::is_void_v<R>) {
        std::invoke(visit, key, value);
        return true;
      } else {
        return std::invoke(visit, key, value);
      }
    };
    scanImpl(table, range, detail::FunctionRef<bool(std::string_view, std::string_view)>(adapter));
  }

  // The first failure in this transaction (empty while all went well).
  const boost::system::error_code& error() const noexcept { return error_; }

 protected:
  ReadTxn(const Store& store, MDB_txn* txn) noexcept : store_(&store), txn_(txn) {}

  unsigned dbiOf(Table table) const;  // std::logic_error for a Table of another Store
  bool checkKey(std::string_view key, const char* op, Table table);
  void fail(int rc, const char* op, Table table);
  // mdb_stat of the table: entries, then the bytes of its pages (zeros after a failure).
  std::pair<std::uint64_t, std::uint64_t> stat(Table table, const char* op);

  const Store* store_;
  MDB_txn* txn_;  // null once committed
  boost::system::error_code error_;
  int scanning_ = 0;  // > 0 while a scan visitor runs

 private:
  friend class Store;
  void scanImpl(Table table, const KeyRange& range,
                detail::FunctionRef<bool(std::string_view, std::string_view)> visit);
};

// A write transaction. Exists only inside Store::write(); committed by the Store when the callback
// returns a value, aborted otherwise.
class WriteTxn : public ReadTxn {
 public:
  void put(Table table, std::string_view key, std::string_view value);
  // MDB_NOOVERWRITE: true if inserted, false if the key already existed (left unchanged).
  bool putIfAbsent(Table table, std::string_view key, std::string_view value);
  // True if the key existed.
  bool erase(Table table, std::string_view key);
  // Removes every entry of the table (the table itself stays).
  void clear(Table table);

 private:
  friend class Store;
  WriteTxn(const Store& store, MDB_txn* txn) noexcept : ReadTxn(store, txn) {}
  void checkNotScanning() const;
  boost::system::error_code commit();
  bool wrote_ = false;  // something was put or erased
};

class Store {
 public:
  // Opens (creating if needed) the store in options.stateDir. See the Caveats for the lock.
  static boost::system::result<StorePtr, OpenError> open(Options options);

  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;
  ~Store();

  // The state directory (absolute) and the LMDB directory inside it.
  const std::filesystem::path& path() const noexcept { return path_; }
  std::filesystem::path databasePath() const { return path_ / "db"; }
  std::size_t mapSizeMb() const noexcept { return mapSizeMb_; }

  // A table named at open. Asking for any other name is a bug: std::out_of_range.
  Table table(std::string_view name) const;
  std::optional<Table> tryTable(std::string_view name) const noexcept;

  // Runs fn(ReadTxn&) in a read-only snapshot. fn may return boost::system::result<T> (returned
  // as is), void, or any value T (returned as result<T>). Failures of the transaction itself
  // (begin, or a poisoned txn) are returned instead of fn's outcome.
  template <class F>
  auto read(F&& fn) const;

  // Runs fn(WriteTxn&), which returns boost::system::result<T>, and returns that result: committed
  // if it holds a value, aborted if it holds an error. A store failure (poisoned txn, failed
  // begin or commit) is returned instead, with nothing written. See the Caveats.
  template <class F>
  auto write(F&& fn);

  boost::system::result<Stats> stats() const;

  // Options::checkPages on this database now (it sees the last committed state): what is
  // damaged or why it could not check, or nothing (also when no check was given). Blocks for as
  // long as the walk takes. Clears the reader slot of a check that was killed.
  std::optional<PageCheckFailure> checkPages() const;

  // Writes a copy of the database as it stands now (one read snapshot, taken without stopping
  // writers) to `target`, an absolute path to a new file (mode 0600). The pages are copied as
  // they are, never walked, so a damaged page is copied rather than followed. The copy is
  // written beside `target` under a temporary name, synced, and then moved in without replacing
  // anything: `target` is the whole copy or absent, and a file already there is kept. The bytes
  // written, or why nothing was (a sentence). Blocks for as long as the copy takes.
  struct BackupError {
    bool exists = false;  // something is at the path already
    std::string message;
  };
  boost::system::result<std::uint64_t, BackupError> backup(
      const std::filesystem::path& target) const;

  // ec's message with this store's details: the map size for mapFull, the path for disk errors.
  std::string describe(const boost::system::error_code& ec) const;
  // Options::allowFailureLine, for the lines of the store's users about its failures.
  bool allowFailureLine(std::string& note) const;

 private:
  friend class ReadTxn;
  friend class WriteTxn;
  struct Init;
  explicit Store(Init&& init);

  boost::system::error_code runRead(detail::FunctionRef<void(ReadTxn&)> fn) const;
  boost::system::error_code runWrite(detail::FunctionRef<bool(WriteTxn&)> fn);
  // One attempt of runWrite, under writeMutex_.
  boost::system::error_code writeOnce(detail::FunctionRef<bool(WriteTxn&)> fn);
  // A commit that changes nothing but moves LMDB's page reuse along (see runWrite); false if it
  // could not be made. Under writeMutex_.
  bool nudge();
  // Maps an LMDB or errno code to a StoreErrc and logs the raw code with its context.
  boost::system::error_code mapError(int rc, const char* op, std::string_view table) const;

  std::uint64_t id_;  // tells the Tables of this Store from those of any other
  std::filesystem::path path_;
  std::size_t mapSizeMb_;
  std::uint32_t schemaVersion_;
  MDB_env* env_;
  int lockFd_;
  int directoryLockFd_;
  // Stable storage: Table handles point at these strings.
  std::vector<std::string> tableNames_;
  std::vector<unsigned> dbis_;
  // LMDB's writer mutex (in lock.mdb) serializes processes; this one queues the threads of this
  // process before they reach it.
  std::mutex writeMutex_;
  std::atomic<bool> writesFull_{false};  // Stats::writesFull
  std::atomic<int> writesFailing_{0};    // Stats::writesFailing: a StoreErrc, 0 for none
  std::function<std::optional<PageCheckFailure>(const std::filesystem::path&)> checkPages_;
  std::function<bool(std::string&)> allowFailureLine_;
};

template <class F>
auto Store::read(F&& fn) const {
  using R = std::invoke_result_t<F&, ReadTxn&>;
  using Out = typename detail::ReadOutcome<R>::type;
  std::optional<Out> out;
  auto invoke = [&](ReadTxn& txn) {
    if constexpr (std::is_void_v<R>) {
      std::invoke(fn, txn);
      out.emplace();
    } else {
      out.emplace(std::invoke(fn, txn));
    }
  };
  if (boost::system::error_code ec = runRead(detail::FunctionRef<void(ReadTxn&)>(invoke))) {
    return Out(boost::system::in_place_error, ec);
  }
  return std::move(*out);
}

template <class F>
auto Store::write(F&& fn) {
  using R = std::invoke_result_t<F&, WriteTxn&>;
  static_assert(detail::IsResult<R>::value &&
                    std::is_same_v<typename R::error_type, boost::system::error_code>,
                "a store.write callback returns boost::system::result<T>: a value commits, an "
                "error aborts");
  std::optional<R> out;
  auto invoke = [&](WriteTxn& txn) -> bool {
    out.emplace(std::invoke(fn, txn));
    return out->has_value();
  };
  if (boost::system::error_code ec = runWrite(detail::FunctionRef<bool(WriteTxn&)>(invoke))) {
    return R(boost::system::in_place_error, ec);
  }
  return std::move(*out);
}

}  // namespace toolhost::store
