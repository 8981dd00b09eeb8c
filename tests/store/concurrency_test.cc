#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "store/store.h"
#include "tests/store/test_support.h"

using namespace toolhost::store;
using namespace toolhost::store::test;
using boost::system::result;

namespace {

std::uint64_t parse(std::optional<std::string_view> v) {
  return v ? std::stoull(std::string(*v)) : 0;
}

}  // namespace

TEST_CASE("writes from several threads are serialized, readers see whole commits") {
  TempDir tmp;
  auto store = openOrFail(options(tmp.state()));
  const Table items = store->table("items");
  constexpr int kWriters = 4;
  constexpr int kIncrements = 25;

  std::atomic<bool> done{false};
  std::atomic<int> torn{0};
  std::atomic<int> readFailures{0};
  std::atomic<int> reads{0};
  // The value of the last write that returned: a read begun afterwards sees it or a later one.
  // (Two reads during one commit may disagree in either order; see the Caveats in store.h.)
  std::atomic<std::uint64_t> returned{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      while (!done.load()) {
        const std::uint64_t floor = returned.load();
        auto seen = store->read([&](ReadTxn& txn) {
          return std::pair(parse(txn.tryGet(items, "a")), parse(txn.tryGet(items, "b")));
        });
        if (!seen) {
          ++readFailures;
          continue;
        }
        // Both counters move in one transaction.
        if (seen->first != seen->second || seen->first < floor) ++torn;
        ++reads;
      }
    });
  }

  std::vector<std::thread> writers;
  std::atomic<int> writeFailures{0};
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&] {
      for (int i = 0; i < kIncrements; ++i) {
        auto r = store->write([&](WriteTxn& txn) -> result<std::uint64_t> {
          const std::uint64_t next = parse(txn.tryGet(items, "a")) + 1;
          txn.put(items, "a", std::to_string(next));
          std::this_thread::yield();  // widen the window a missing lock would expose
          txn.put(items, "b", std::to_string(next));
          return next;
        });
        if (!r) {
          ++writeFailures;
          continue;
        }
        std::uint64_t seen = returned.load();
        while (seen < *r && !returned.compare_exchange_weak(seen, *r)) {
        }
      }
    });
  }
  for (auto& t : writers) t.join();
  done = true;
  for (auto& t : readers) t.join();

  CHECK(writeFailures == 0);
  CHECK(readFailures == 0);
  CHECK(torn == 0);
  CHECK(reads > 0);
  auto final = store->read([&](ReadTxn& txn) { return parse(txn.tryGet(items, "a")); });
  REQUIRE(final);
  CHECK(*final == kWriters * kIncrements);
}

TEST_CASE("a read transaction keeps its snapshot while another thread commits") {
  TempDir tmp;
  auto store = openOrFail(options(tmp.state()));
  const Table items = store->table("items");
  REQUIRE(store->write([&](WriteTxn& txn) -> result<void> {
    txn.put(items, "k", "old");
    return {};
  }));
  auto r = store->read([&](ReadTxn& txn) {
    bool committed = false;  // Catch2 assertions stay on the test thread
    std::thread writer([&] {
      committed = store
                      ->write([&](WriteTxn& wtxn) -> result<void> {
                        wtxn.put(items, "k", "new");
                        return {};
                      })
                      .has_value();
    });
    writer.join();
    return std::pair(committed, txn.getCopy(items, "k"));
  });
  REQUIRE(r);
  CHECK(r->first);
  CHECK(r->second == "old");
  auto now = store->read([&](ReadTxn& txn) { return txn.getCopy(items, "k"); });
  REQUIRE(now);
  CHECK(*now == "new");
}
