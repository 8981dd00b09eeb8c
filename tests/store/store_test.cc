#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <stdexcept>
#include <string>

#include "store/store.h"
#include "tests/store/test_support.h"

using namespace toolhost::store;
using namespace toolhost::store::test;
using boost::system::result;

namespace {

unsigned modeOf(const std::filesystem::path& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_mode & 07777U;
}

result<void> putOne(Store& store, std::string_view table, std::string_view key,
                    std::string_view value) {
  const Table t = store.table(table);
  return store.write([&](WriteTxn& txn) -> result<void> {
    txn.put(t, key, value);
    return {};
  });
}

std::optional<std::string> getOne(const Store& store, std::string_view table,
                                  std::string_view key) {
  const Table t = store.table(table);
  auto value = store.read([&](ReadTxn& txn) { return txn.getCopy(t, key); });
  REQUIRE(value.has_value());
  return *value;
}

}  // namespace

TEST_CASE("open creates the state directory 0700, files 0600, and records the pid") {
  TempDir tmp;
  const auto dir = tmp.path() / "nested" / "state";
  auto store = openOrFail(options(dir));
  CHECK(store->path() == std::filesystem::canonical(dir));
  CHECK(store->databasePath() == store->path() / "db");
  CHECK(modeOf(dir.parent_path()) == 0700U);
  CHECK(modeOf(dir) == 0700U);
  CHECK(modeOf(dir / "db") == 0700U);
  CHECK(modeOf(dir / "db" / "data.mdb") == 0600U);
  CHECK(modeOf(dir / "db" / "lock.mdb") == 0600U);
  CHECK(modeOf(dir / "toolhost.lock") == 0600U);
  CHECK(readFile(dir / "toolhost.lock") == std::to_string(::getpid()) + "\n");
}

TEST_CASE("put, get, putIfAbsent, erase, count and clear") {
  TempDir tmp;
  auto store = openOrFail(options(tmp.state()));
  const Table items = store->table("items");
  const Table other = store->table("other");
  CHECK(items.name() == "items");

  auto done = store->write([&](WriteTxn& txn) -> result<void> {
    txn.put(items, "a", "1");
    txn.put(items, "b", "2");
    txn.put(other, "a", "other-a");  // tables are separate key spaces
    CHECK(txn.putIfAbsent(items, "c", "3"));
    CHECK_FALSE(txn.putIfAbsent(items, "a", "replaced?"));
    CHECK(txn.tryGet(items, "a") == "1");  // a write transaction reads its own writes
    CHECK(txn.count(items) == 3);
    return {};
  });
  REQUIRE(done);

  CHECK(getOne(*store, "items", "a") == "1");
  CHECK(getOne(*store, "other", "a") == "other-a");
  CHECK(getOne(*store, "items", "missing") == std::nullopt);

  REQUIRE(store->write([&](WriteTxn& txn) -> result<void> {
    CHECK(txn.erase(items, "b"));
    CHECK_FALSE(txn.erase(items, "b"));
    txn.put(items, "a", "1b");  // put overwrites
    return {};
  }));
  auto state = store->read([&](ReadTxn& txn) {
    CHECK(txn.contains(items, "a"));
    CHECK_FALSE(txn.contains(items, "b"));
    CHECK(txn.tryGet(items, "a") == "1b");
    return txn.count(items);
  });
  REQUIRE(state);
  CHECK(*state == 2);

  REQUIRE(store->write([&](WriteTxn& txn) -> result<void> {
    txn.clear(items);
    return {};
  }));
  auto counts =
      store->read([&](ReadTxn& txn) { return std::pair(txn.count(items), txn.count(other)); });
  REQUIRE(counts);
  CHECK(counts->first == 0);
  CHECK(counts->second == 1);
}

TEST_CASE("binary keys and values with NUL bytes and large values round-trip") {
  TempDir tmp;
  auto store = openOrFail(options(tmp.state()));
  const std::string key("k\0\xff", 3);
  const std::string value("v\0\0w", 4);
  const std::string big(3 << 20, 'x');  // several overflow pages
  REQUIRE(putOne(*store, "items", key, value));
  REQUIRE(putOne(*store, "items", "big", big));
  CHECK(getOne(*store, "items", key) == value);
  CHECK(getOne(*store, "items", "big") == big);
}

TEST_CASE("write returns the callback's value, read wraps plain values") {
  TempDir tmp;
  auto store = openOrFail(options(tmp.state()));
  const Table items = store->table("items");
  result<int> written = store->write([&](WriteTxn& txn) -> result<int> {
    txn.put(items, "k", "v");
    return 42;
  });
  REQUIRE(written);
  CHECK(*written == 42);

  result<bool> found = store->read([&](ReadTxn& txn) { return txn.contains(items, "k"); });
  REQUIRE(found);
  CHECK(*found);

  // A read callback returning a result is passed through, error included.
  result<int> failed = store->read([&](ReadTxn&) -> result<int> { return StoreErrc::aborted; });
  REQUIRE(failed.has_error());
  CHECK(failed.error() == StoreErrc::aborted);

  result<void> nothing = store->read([&](ReadTxn&) {});
  CHECK(nothing.has_value());
}

TEST_CASE("committed writes survive closing and reopening") {
  TempDir tmp;
  {
    auto store = openOrFail(options(tmp.state()));
    REQUIRE(putOne(*store, "items", "durable", "yes"));
  }
  auto store = openOrFail(options(tmp.state()));
  CHECK(getOne(*store, "items", "durable") == "yes");
}

TEST_CASE("a write callback returning an error aborts: nothing is written, the error returns") {
  TempDir tmp;
  {
    auto store = openOrFail(options(tmp.state()));
    const Table items = store->table("items");
    REQUIRE(putOne(*store, "items", "kept", "old"));
    result<int> r = store->write([&](WriteTxn& txn) -> result<int> {
      txn.put(items, "kept", "new");
      txn.put(items, "added", "x");
      return boost::system::errc::make_error_code(boost::system::errc::operation_canceled);
    });
    REQUIRE(r.has_error());
    CHECK(r.error() == boost::system::errc::operation_canceled);
    CHECK(getOne(*store, "items", "kept") == "old");
    CHECK(getOne(*store, "items", "added") == std::nullopt);
  }
  auto store = openOrFail(options(tmp.state()));
  CHECK(getOne(*store, "items", "kept") == "old");
  CHECK(getOne(*store, "items", "added") == std::nullopt);
}

TEST_CASE("an exception in a write callback aborts and propagates, the store stays usable") {
  TempDir tmp;
  {
    auto store = openOrFail(options(tmp.state()));
    const Table items = store->table("items");
    CHECK_THROWS_AS(store->write([&](WriteTxn& txn) -> result<void> {
      txn.put(items, "thrown", "x");
      throw std::runtime_error("boom");
    }),
                    std::runtime_error);
    CHECK(getOne(*store, "items", "thrown") == std::nullopt);
    // The writer lock was released: another write goes through.
    REQUIRE(putOne(*store, "items", "after", "y"));
  }
  auto store = openOrFail(options(tmp.state()));
  CHECK(getOne(*store, "items", "thrown") == std::nullopt);
  CHECK(getOne(*store, "items", "after") == "y");
}

TEST_CASE("a failed operation poisons the transaction: never committed, whatever is returned") {
  TempDir tmp;
  auto store = openOrFail(options(tmp.state()));
  const Table items = store->table("items");
  const std::string tooLong(kMaxKeySize + 1, 'k');

  result<void> r = store->write([&](WriteTxn& txn) -> result<void> {
    txn.put(items, "before", "x");
    txn.put(items, tooLong, "x");
    CHECK(txn.error() == StoreErrc::invalidKey);
    // Later operations do nothing.
    CHECK_FALSE(txn.putIfAbsent(items, "after", "x"));
    CHECK(txn.tryGet(items, "before") == std::nullopt);
    return {};  // asks to commit, but the transaction is poisoned
  });
  REQUIRE(r.has_error());
  CHECK(r.error() == StoreErrc::invalidKey);
  CHECK(getOne(*store, "items", "before") == std::nullopt);
  CHECK(getOne(*store, "items", "after") == std::nullopt);

  // Empty keys are refused too, in reads as well.
  auto empty = store->read([&](ReadTxn& txn) { return txn.contains(items, ""); });
  REQUIRE(empty.has_error());
  CHECK(empty.error() == StoreErrc::invalidKey);
  // The longest allowed key works.
  REQUIRE(putOne(*store, "items", std::string(kMaxKeySize, 'k'), "ok"));
}

TEST_CASE("write inside a write callback on the same thread is a bug, read inside sees the past") {
  TempDir tmp;
  auto store = openOrFail(options(tmp.state()));
  const Table items = store->table("items");
  REQUIRE(putOne(*store, "items", "k", "old"));
  auto r = store->write([&](WriteTxn& txn) -> result<void> {
    txn.put(items, "k", "new");
    auto outer = store->read([&](ReadTxn& snapshot) { return snapshot.getCopy(items, "k"); });
    CHECK(outer.has_value());
    if (outer) CHECK(*outer == "old");
    CHECK_THROWS_AS(store->write([](WriteTxn&) -> result<void> { return {}; }), std::logic_error);
    return {};
  });
  REQUIRE(r);
  CHECK(getOne(*store, "items", "k") == "new");
}

TEST_CASE("tables are fixed at open and bound to their Store") {
  TempDir a;
  TempDir b;
  auto storeA = openOrFail(options(a.state()));
  auto storeB = openOrFail(options(b.state()));
  CHECK_THROWS_AS(storeA->table("undeclared"), std::out_of_range);
  CHECK_FALSE(storeA->tryTable("undeclared").has_value());
  CHECK_FALSE(storeA->tryTable("meta").has_value());
  REQUIRE(storeA->tryTable("other").has_value());
  CHECK(*storeA->tryTable("other") == storeA->table("other"));
  CHECK_FALSE(storeA->table("items") == storeB->table("items"));

  const Table foreign = storeB->table("items");
  CHECK_THROWS_AS(storeA->read([&](ReadTxn& txn) { return txn.contains(foreign, "k"); }),
                  std::logic_error);
}

TEST_CASE("a Table of a closed Store is refused by its successor") {
  TempDir tmp;
  auto store = openOrFail(options(tmp.state()));
  const Table stale = store->table("items");
  store.reset();
  store = openOrFail(options(tmp.state()));  // may well reuse the same address
  CHECK_THROWS_AS(store->read([&](ReadTxn& txn) { return txn.contains(stale, "k"); }),
                  std::logic_error);
  CHECK_FALSE(stale == store->table("items"));
}

TEST_CASE("tables added to the list later are created on the next open") {
  TempDir tmp;
  {
    auto store = openOrFail(options(tmp.state(), {"items"}));
    REQUIRE(putOne(*store, "items", "k", "v"));
  }
  auto store = openOrFail(options(tmp.state(), {"items", "added"}));
  REQUIRE(putOne(*store, "added", "k", "w"));
  CHECK(getOne(*store, "items", "k") == "v");
  CHECK(getOne(*store, "added", "k") == "w");
}

TEST_CASE("invalid options are refused with a clear message") {
  TempDir tmp;
  auto refused = [&](Options o, std::string_view needle) {
    auto r = Store::open(o);
    REQUIRE(r.has_error());
    CHECK(r.error().code == StoreErrc::invalidArgument);
    CHECK_THAT(r.error().message, Catch::Contains(std::string(needle)));
  };
  refused(options(tmp.state(), {"a", "a"}), "listed twice");
  refused(options(tmp.state(), {"meta"}), "reserved");
  refused(options(tmp.state(), {""}), "empty");
  Options many = options(tmp.state(), {"a", "b", "c"});
  many.maxTables = 3;
  refused(many, "maxTables");
  Options zero = options(tmp.state());
  zero.mapSizeMb = 0;
  refused(zero, "map_size_mb");
  refused(options(""), "state directory");
  // Nothing was created by a refused open.
  CHECK_FALSE(std::filesystem::exists(tmp.state()));
}

TEST_CASE("a state directory path that is a file is refused") {
  TempDir tmp;
  { std::ofstream(tmp.path() / "file") << "x"; }
  auto r = Store::open(options(tmp.path() / "file"));
  REQUIRE(r.has_error());
  CHECK_THAT(r.error().message, Catch::Contains("not a directory"));
}

TEST_CASE("stats report map size, used bytes and entries per table") {
  TempDir tmp;
  auto store = openOrFail(options(tmp.state()));
  auto before = store->stats();
  REQUIRE(before);
  CHECK(before->path == store->path());
  CHECK(before->mapSizeBytes == (1ULL << 30));
  CHECK(before->schemaVersion == kSchemaVersion);
  CHECK(before->pageSize > 0);
  CHECK(before->maxReaders >= 126);
  REQUIRE(before->tables.size() == 2);
  CHECK(before->tables[0].name == "items");
  CHECK(before->tables[0].entries == 0);

  const Table items = store->table("items");
  REQUIRE(store->write([&](WriteTxn& txn) -> result<void> {
    for (int i = 0; i < 100; ++i) txn.put(items, u64Key(static_cast<std::uint64_t>(i)), "value");
    return {};
  }));
  auto after = store->stats();
  REQUIRE(after);
  CHECK(after->tables[0].entries == 100);
  CHECK(after->tables[1].entries == 0);
  CHECK(after->usedBytes > before->usedBytes);
  CHECK(after->usedBytes < after->mapSizeBytes);
}

TEST_CASE("describe adds the map size and path to store errors") {
  TempDir tmp;
  Options o = options(tmp.state());
  o.mapSizeMb = 3;
  auto store = openOrFail(o);
  CHECK(store->describe(StoreErrc::mapFull) ==
        "the state database is full (map size 3 MiB); raise [store] map_size_mb");
  CHECK(store->describe(StoreErrc::diskFull) ==
        "the disk holding the state database " + store->databasePath().string() +
            " is full (or its file reached the file size limit, ulimit -f)");
  CHECK_THAT(store->describe(StoreErrc::ioError), Catch::Contains(store->databasePath().string()));
  const boost::system::error_code other =
      boost::system::errc::make_error_code(boost::system::errc::timed_out);
  CHECK(store->describe(other) == other.message());
  CHECK(boost::system::error_code(StoreErrc::locked).category().name() ==
        std::string("toolhost.store"));
}

TEST_CASE("a database larger than map_size_mb opens with the map it needs, and says so") {
  TempDir tmp;
  Options o = options(tmp.state());
  o.mapSizeMb = 16;
  {
    auto store = openOrFail(o);
    const Table items = store->table("items");
    const std::string value(64 * 1024, 'x');
    REQUIRE(store->write([&](WriteTxn& txn) -> result<void> {
      for (int i = 0; i < 96; ++i) txn.put(items, u64Key(static_cast<std::uint64_t>(i)), value);
      return {};
    }));
  }
  o.mapSizeMb = 2;
  auto store = openOrFail(o);
  auto stats = store->stats();
  REQUIRE(stats);
  CHECK(stats->mapSizeBytes >= 6ULL << 20);
  const auto inUseMb = std::to_string(stats->mapSizeBytes >> 20);
  CHECK(store->describe(StoreErrc::mapFull) ==
        "the state database is full (map size " + inUseMb + " MiB); raise [store] map_size_mb");
}
