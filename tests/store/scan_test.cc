#include <catch2/catch.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "store/store.h"
#include "tests/store/test_support.h"

using namespace std::string_literals;
using namespace toolhost::store;
using namespace toolhost::store::test;
using boost::system::result;

namespace {

struct Fixture {
  TempDir tmp;
  StorePtr store = openOrFail(options(tmp.state()));
  Table items = store->table("items");

  void putAll(const std::vector<std::string>& keys) {
    REQUIRE(store->write([&](WriteTxn& txn) -> result<void> {
      for (const auto& k : keys) txn.put(items, k, "v:" + k);
      return {};
    }));
  }

  std::vector<std::string> keys(const KeyRange& range) {
    std::vector<std::string> out;
    auto r = store->read([&](ReadTxn& txn) {
      txn.scan(items, range, [&](std::string_view k, std::string_view v) {
        CHECK(v == "v:" + std::string(k));
        out.emplace_back(k);
      });
    });
    REQUIRE(r);
    return out;
  }
};

using Keys = std::vector<std::string>;

}  // namespace

TEST_CASE("scan visits a range forward and in reverse") {
  Fixture f;
  f.putAll({"b", "a", "d", "c", "e"});
  CHECK(f.keys(KeyRange::all()) == Keys{"a", "b", "c", "d", "e"});
  CHECK(f.keys(KeyRange::all().reversed()) == Keys{"e", "d", "c", "b", "a"});
  CHECK(f.keys(KeyRange::between("b", "d")) == Keys{"b", "c"});
  CHECK(f.keys(KeyRange::between("b", "d").reversed()) == Keys{"c", "b"});
  // Bounds between existing keys.
  CHECK(f.keys(KeyRange::between("bb", "dd")) == Keys{"c", "d"});
  CHECK(f.keys(KeyRange::between("bb", "dd").reversed()) == Keys{"d", "c"});
  CHECK(f.keys(KeyRange::startingAt("c")) == Keys{"c", "d", "e"});
  CHECK(f.keys(KeyRange::startingAt("c").reversed()) == Keys{"e", "d", "c"});
  // Bounds beyond both ends.
  CHECK(f.keys(KeyRange::between("0", "z")) == Keys{"a", "b", "c", "d", "e"});
  CHECK(f.keys(KeyRange::between("0", "z").reversed()) == Keys{"e", "d", "c", "b", "a"});
  CHECK(f.keys(KeyRange::startingAt("f")).empty());
  CHECK(f.keys(KeyRange::startingAt("f").reversed()).empty());
  CHECK(f.keys(KeyRange::between("0", "a").reversed()).empty());
  // Empty and inverted ranges.
  CHECK(f.keys(KeyRange::between("c", "c")).empty());
  CHECK(f.keys(KeyRange::between("d", "b")).empty());
  CHECK(f.keys(KeyRange::between("d", "b").reversed()).empty());
}

TEST_CASE("scan of an empty table visits nothing") {
  Fixture f;
  CHECK(f.keys(KeyRange::all()).empty());
  CHECK(f.keys(KeyRange::all().reversed()).empty());
  CHECK(f.keys(KeyRange::prefix("x").reversed()).empty());
}

TEST_CASE("prefix scans stay inside the prefix, including 0xFF bytes") {
  Fixture f;
  f.putAll({"a", "ab", "ab\xff"s, "ab\xff\xff"s, "abc", "ac", "b", "\xff"s, "\xff\xff"s});
  CHECK(f.keys(KeyRange::prefix("ab")) == Keys{"ab", "abc", "ab\xff"s, "ab\xff\xff"s});
  CHECK(f.keys(KeyRange::prefix("ab").reversed()) == Keys{"ab\xff\xff"s, "ab\xff"s, "abc", "ab"});
  CHECK(f.keys(KeyRange::prefix("\xff"s)) == Keys{"\xff"s, "\xff\xff"s});
  CHECK(f.keys(KeyRange::prefix("\xff"s).reversed()) == Keys{"\xff\xff"s, "\xff"s});
  CHECK(f.keys(KeyRange::prefix("zz")).empty());
}

TEST_CASE("u64 keys iterate in numeric order, composite keys group by name") {
  Fixture f;
  std::vector<std::string> keys;
  for (std::uint64_t id : {300ULL, 1ULL, 65536ULL, 255ULL, 256ULL}) keys.push_back(u64Key(id));
  f.putAll(keys);
  std::vector<std::uint64_t> ids;
  for (const auto& k : f.keys(KeyRange::all())) ids.push_back(*tryParseU64Key(k));
  CHECK(ids == std::vector<std::uint64_t>{1, 255, 256, 300, 65536});

  Fixture g;
  g.putAll({compositeKey({"a", u64Key(2)}), compositeKey({"ab", u64Key(1)}),
            compositeKey({"a", u64Key(1)}), compositeKey({"b", u64Key(0)})});
  const auto revisionsOfA = g.keys(KeyRange::prefix(compositePrefix({"a"})));
  CHECK(revisionsOfA == Keys{compositeKey({"a", u64Key(1)}), compositeKey({"a", u64Key(2)})});
}

TEST_CASE("a visitor returning false stops the scan (an audit tail)") {
  Fixture f;
  std::vector<std::string> keys;
  for (std::uint64_t seq = 1; seq <= 50; ++seq) keys.push_back(u64Key(seq));
  f.putAll(keys);
  std::vector<std::uint64_t> tail;
  auto r = f.store->read([&](ReadTxn& txn) {
    txn.scan(f.items, KeyRange::all().reversed(), [&](std::string_view k, std::string_view) {
      tail.push_back(*tryParseU64Key(k));
      return tail.size() < 3;
    });
  });
  REQUIRE(r);
  CHECK(tail == std::vector<std::uint64_t>{50, 49, 48});
}

TEST_CASE("a write transaction scans its own writes, and may not modify while scanning") {
  Fixture f;
  f.putAll({"a", "b"});
  auto r = f.store->write([&](WriteTxn& txn) -> result<void> {
    txn.put(f.items, "c", "v:c");
    std::vector<std::string> seen;
    txn.scan(f.items, KeyRange::all(),
             [&](std::string_view k, std::string_view) { seen.emplace_back(k); });
    CHECK(seen == Keys{"a", "b", "c"});
    CHECK_THROWS_AS(txn.scan(f.items, KeyRange::all(),
                             [&](std::string_view k, std::string_view) { txn.erase(f.items, k); }),
                    std::logic_error);
    // Modifying after the scan is fine.
    for (const auto& k : seen) txn.erase(f.items, k);
    return {};
  });
  REQUIRE(r);
  CHECK(f.keys(KeyRange::all()).empty());
}

TEST_CASE("scan bounds longer than the maximum key size poison the transaction") {
  Fixture f;
  auto r = f.store->read([&](ReadTxn& txn) {
    txn.scan(f.items, KeyRange::prefix(std::string(kMaxKeySize + 1, 'a')),
             [](std::string_view, std::string_view) {});
  });
  REQUIRE(r.has_error());
  CHECK(r.error() == StoreErrc::invalidKey);
}
