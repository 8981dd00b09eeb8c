#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "store/store.h"
#include "tests/store/test_support.h"

using namespace toolhost::store;
using namespace toolhost::store::test;
using boost::system::result;

namespace {

std::string valueFor(std::uint64_t i, std::size_t size) {
  return std::string(size, static_cast<char>('a' + i % 26));
}

// Checks that keys [0, committed) hold their values and nothing else is in `items`.
void checkCommitted(const Store& store, std::uint64_t committed, std::size_t valueSize) {
  const Table items = store.table("items");
  auto r = store.read([&](ReadTxn& txn) {
    CHECK(txn.count(items) == committed);
    for (std::uint64_t i = 0; i < committed; ++i) {
      auto v = txn.tryGet(items, u64Key(i));
      REQUIRE(v.has_value());
      CHECK(*v == valueFor(i, valueSize));
    }
  });
  REQUIRE(r);
}

}  // namespace

TEST_CASE("a full map is a clear error and leaves the committed state usable") {
  TempDir tmp;
  Options o = options(tmp.state());
  o.mapSizeMb = 1;
  auto store = openOrFail(o);
  const Table items = store->table("items");
  constexpr std::size_t kValueSize = 20000;

  // One commit per value until the map is full.
  std::uint64_t committed = 0;
  boost::system::error_code failure;
  for (; committed < 1000; ++committed) {
    auto r = store->write([&](WriteTxn& txn) -> result<void> {
      txn.put(items, u64Key(committed), valueFor(committed, kValueSize));
      return {};
    });
    if (!r) {
      failure = r.error();
      break;
    }
  }
  REQUIRE(committed > 5);
  REQUIRE(committed < 1000);
  CHECK(failure == StoreErrc::mapFull);
  CHECK(store->describe(failure) ==
        "the state database is full (map size 1 MiB); raise [store] map_size_mb");
  CHECK(store->stats()->writesFull);
  // A write that changes nothing says nothing about room.
  REQUIRE(store->write([&](WriteTxn&) -> result<void> { return {}; }));
  CHECK(store->stats()->writesFull);
  checkCommitted(*store, committed, kValueSize);

  // One transaction that ignores the failure and asks to commit: nothing of it is written.
  auto big = store->write([&](WriteTxn& txn) -> result<void> {
    txn.put(items, "small-first", "x");
    for (std::uint64_t i = 0; i < 100; ++i) txn.put(items, u64Key(5000 + i), valueFor(i, 20000));
    return {};
  });
  REQUIRE(big.has_error());
  CHECK(big.error() == StoreErrc::mapFull);
  checkCommitted(*store, committed, kValueSize);

  // Smaller writes still work, and so does freeing space.
  auto small = store->write([&](WriteTxn& txn) -> result<void> {
    txn.put(items, "small", "x");
    return {};
  });
  CHECK(small.has_value());
  CHECK_FALSE(store->stats()->writesFull);
  REQUIRE(store->write([&](WriteTxn& txn) -> result<void> {
    txn.erase(items, "small");
    for (std::uint64_t i = 0; i < committed / 2; ++i) txn.erase(items, u64Key(i));
    return {};
  }));
  // LMDB reuses the pages a commit frees only after one more commit (the snapshot before it
  // stays readable until then); the store makes that commit itself when a write does not fit,
  // so the room freed is there for the very next write, and its callback runs again whole.
  int attempts = 0;
  REQUIRE(store->write([&](WriteTxn& txn) -> result<void> {
    ++attempts;
    for (std::uint64_t i = 0; i < committed / 2; ++i)
      txn.put(items, u64Key(i), valueFor(i, kValueSize));
    return {};
  }));
  CHECK(attempts == 2);
  checkCommitted(*store, committed, kValueSize);

  // A larger map on the next open makes room.
  store.reset();
  o.mapSizeMb = 4;
  store = openOrFail(o);
  const Table reopened = store->table("items");
  CHECK(store->stats()->mapSizeBytes == 4ULL << 20);
  REQUIRE(store->write([&](WriteTxn& txn) -> result<void> {
    for (std::uint64_t i = 0; i < 60; ++i) txn.put(reopened, u64Key(i), valueFor(i, kValueSize));
    return {};
  }));
}

// A full disk is simulated with RLIMIT_FSIZE in a child process (the limit is per process): the
// data file cannot grow past it, and LMDB's writes fail with EFBIG or a short write.
TEST_CASE("a full disk is a clear error and leaves the committed state usable") {
  TempDir tmp;
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto exitWith = [](int code) { ::_exit(code); };
    auto opened = Store::open(options(tmp.state()));
    if (!opened) exitWith(10);
    StorePtr store = std::move(*opened);
    const Table items = store->table("items");
    auto first = store->write([&](WriteTxn& txn) -> result<void> {
      txn.put(items, "committed", std::string(10000, 'c'));
      return {};
    });
    if (!first) exitWith(11);

    struct stat st {};
    if (::stat((store->databasePath() / "data.mdb").c_str(), &st) != 0) exitWith(12);
    ::signal(SIGXFSZ, SIG_IGN);
    const auto limit = static_cast<rlim_t>(st.st_size + 64 * 1024);
    rlimit rl{limit, limit};
    if (::setrlimit(RLIMIT_FSIZE, &rl) != 0) exitWith(13);

    auto tooBig = store->write([&](WriteTxn& txn) -> result<void> {
      txn.put(items, "too-big", std::string(2 << 20, 'b'));
      return {};
    });
    if (tooBig) exitWith(14);
    if (tooBig.error() != StoreErrc::diskFull && tooBig.error() != StoreErrc::ioError) {
      exitWith(15);
    }
    auto state = store->read([&](ReadTxn& txn) {
      return txn.getCopy(items, "committed") == std::string(10000, 'c') &&
             !txn.contains(items, "too-big");
    });
    if (!state || !*state) exitWith(16);
    auto small = store->write([&](WriteTxn& txn) -> result<void> {
      txn.put(items, "small", "s");
      return {};
    });
    if (!small) exitWith(17);
    store.reset();

    auto reopened = Store::open(options(tmp.state()));
    if (!reopened) exitWith(18);
    auto after = (*reopened)->read([&](ReadTxn& txn) {
      const Table t = (*reopened)->table("items");
      return txn.getCopy(t, "committed") == std::string(10000, 'c') &&
             txn.getCopy(t, "small") == std::string("s") && !txn.contains(t, "too-big");
    });
    if (!after || !*after) exitWith(19);
    exitWith(0);
  }
  CHECK(waitChild(child) == 0);
}
