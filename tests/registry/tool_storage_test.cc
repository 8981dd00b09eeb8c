// ctx.storage's store (registry::ToolStorage) against a real LMDB store in a temporary directory.
#include "registry/tool_storage.h"

#include <unistd.h>
#include <boost/json/parse.hpp>
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

using namespace toolhost;
using namespace toolhost::registry;
namespace json = boost::json;
namespace fs = std::filesystem;

namespace {

struct TempStore {
  fs::path dir;
  store::StorePtr store;
  std::unique_ptr<ToolStorage> storage;
  explicit TempStore(std::size_t mapSizeMb = 64) {
    char pattern[] = "/tmp/th-kv-XXXXXX";
    dir = ::mkdtemp(pattern);
    reopen(mapSizeMb);
  }
  void reopen(std::size_t mapSizeMb = 64) {
    storage.reset();
    store.reset();
    store::Options options;
    options.stateDir = dir;
    options.tables = ToolStorage::tables();
    options.mapSizeMb = mapSizeMb;
    store = std::move(*store::Store::open(options));
    storage = std::make_unique<ToolStorage>(*store);
  }
  ~TempStore() {
    storage.reset();
    store.reset();
    fs::remove_all(dir);
  }
};

// Bytes a key and value count for: the key's UTF-8 plus the value's compact JSON.
std::uint64_t cost(std::string_view key, std::string_view json) { return key.size() + json.size(); }

// Whether an outcome holds a value (Catch cannot print a result<T, StorageError>).
bool ok(const auto& result) {
  if (!result) UNSCOPED_INFO(result.error().detail);
  return result.has_value();
}

StorageOp op(StorageOp::Kind kind, std::string tool, std::string key, json::value value = nullptr) {
  return StorageOp{kind, std::move(tool), std::move(key), std::move(value), std::nullopt};
}

StorageErrc errorOf(const auto& result) {
  REQUIRE_FALSE(result.has_value());
  return result.error().code;
}

}  // namespace

TEST_CASE("storage: set, get, delete and list JSON values", "[registry][storage]") {
  TempStore t;
  ToolStorage& s = *t.storage;
  const StorageQuotas quotas;

  CHECK(s.get("counter", "n")->has_value() == false);
  CHECK(s.list("counter")->empty());
  CHECK(*s.usage("counter") == StorageUsage{});

  auto value = json::parse(R"({"z":1,"a":[true,null,"é ☃ 😀"],"n":-1.5e-7,"big":12345678901})");
  auto usage = s.set("counter", "state", value, quotas);
  REQUIRE(ok(usage));
  CHECK(usage->keys == 1);
  // Compact JSON, member order kept (what the tool wrote is what it reads back).
  const std::string text = R"({"z":1,"a":[true,null,"é ☃ 😀"],"n":-1.5e-7,"big":12345678901})";
  CHECK(usage->bytes == cost("state", text));
  auto got = s.get("counter", "state");
  REQUIRE(ok(got));
  REQUIRE(got->has_value());
  CHECK(**got == value);
  CHECK((*got)->as_object().begin()->key() == "z");

  REQUIRE(ok(s.set("counter", "n", 41, quotas)));
  REQUIRE(ok(s.set("counter", "n", 42, quotas)));  // overwrite
  REQUIRE(ok(s.set("counter", "a/b", "x", quotas)));
  REQUIRE(ok(s.set("counter", "Ä", nullptr, quotas)));  // null is a value; list shows the key
  CHECK(**s.get("counter", "n") == 42);
  CHECK(**s.get("counter", "Ä") == nullptr);
  // Byte order: "Ä" (C3 84) after the ASCII keys.
  CHECK(*s.list("counter") == std::vector<std::string>{"a/b", "n", "state", "Ä"});

  CHECK(*s.erase("counter", "n") == true);
  CHECK(*s.erase("counter", "n") == false);
  CHECK(s.get("counter", "n")->has_value() == false);
  CHECK(*s.list("counter") == std::vector<std::string>{"a/b", "state", "Ä"});
}

TEST_CASE("storage: keys must be short, non-empty text without control characters",
          "[registry][storage]") {
  TempStore t;
  ToolStorage& s = *t.storage;
  StorageQuotas quotas;
  quotas.maxKeyBytes = 8;

  CHECK(errorOf(s.set("t", "", 1, quotas)) == StorageErrc::invalidArgument);
  CHECK(errorOf(s.get("t", "")) == StorageErrc::invalidArgument);
  CHECK(ok(s.set("t", "12345678", 1, quotas)));  // at the limit
  auto over = s.set("t", "123456789", 1, quotas);
  CHECK(errorOf(over) == StorageErrc::invalidArgument);
  CHECK(over.error().detail.find("max_key_bytes") != std::string::npos);
  CHECK(over.error().detail.find("9 bytes") != std::string::npos);
  CHECK(ok(s.set("t", "ü☃", 1, quotas)));  // 5 bytes of UTF-8
  CHECK(errorOf(s.set("t", "ü☃☃x", 1, quotas)) == StorageErrc::invalidArgument);  // 9 bytes

  for (std::string bad : {std::string("a\nb"), std::string("a\0b", 3), std::string("tab\t"),
                          std::string("del\x7f"), std::string("c1\xc2\x85")}) {
    INFO(bad);
    CHECK(errorOf(s.set("t", bad, 1, quotas)) == StorageErrc::invalidArgument);
    CHECK(errorOf(s.get("t", bad)) == StorageErrc::invalidArgument);
    CHECK(errorOf(s.erase("t", bad)) == StorageErrc::invalidArgument);
  }
  for (std::string bad : {std::string("\xff"), std::string("\xc0\xaf"), std::string("\xed\xa0\x80"),
                          std::string("\xe2\x98")}) {
    CHECK(errorOf(s.set("t", bad, 1, quotas)) == StorageErrc::invalidArgument);
  }
  // get and delete accept any key up to the hard cap, so keys stored under a larger quota stay
  // reachable after the quota is lowered.
  CHECK(s.get("t", std::string(kMaxStorageKeyBytes, 'k'))->has_value() == false);
  CHECK(errorOf(s.get("t", std::string(kMaxStorageKeyBytes + 1, 'k'))) ==
        StorageErrc::invalidArgument);
  StorageQuotas wide;
  wide.maxKeyBytes = 100000;  // never above the cap
  CHECK(ok(s.set("t", std::string(kMaxStorageKeyBytes, 'k'), 1, wide)));
  CHECK(errorOf(s.set("t", std::string(kMaxStorageKeyBytes + 1, 'k'), 1, wide)) ==
        StorageErrc::invalidArgument);
  CHECK(*s.erase("t", std::string(kMaxStorageKeyBytes, 'k')));

  CHECK(errorOf(s.set("Not A Tool", "k", 1, quotas)) == StorageErrc::invalidArgument);
  CHECK(errorOf(s.list("")) == StorageErrc::invalidArgument);
}

TEST_CASE("storage: quotas hold at their limit and refuse past it", "[registry][storage]") {
  TempStore t;
  ToolStorage& s = *t.storage;

  SECTION("max_keys") {
    StorageQuotas quotas;
    quotas.maxKeys = 3;
    for (const char* key : {"a", "b", "c"}) REQUIRE(ok(s.set("t", key, 1, quotas)));
    auto over = s.set("t", "d", 1, quotas);
    CHECK(errorOf(over) == StorageErrc::quotaExceeded);
    CHECK(over.error().detail.find("max_keys") != std::string::npos);
    CHECK(over.error().detail.find("3") != std::string::npos);
    CHECK(ok(s.set("t", "a", 2, quotas)));      // overwriting adds no key
    CHECK(ok(s.set("other", "d", 1, quotas)));  // per tool
    REQUIRE(*s.erase("t", "a"));
    CHECK(ok(s.set("t", "d", 1, quotas)));
    CHECK(s.usage("t")->keys == 3);
  }
  SECTION("max_value_bytes") {
    StorageQuotas quotas;
    quotas.maxValueBytes = 12;
    CHECK(ok(s.set("t", "k", json::string(10, 'x'), quotas)));  // "xxxxxxxxxx" is 12 bytes of JSON
    auto over = s.set("t", "k", json::string(11, 'x'), quotas);
    CHECK(errorOf(over) == StorageErrc::quotaExceeded);
    CHECK(over.error().detail.find("max_value_bytes") != std::string::npos);
    CHECK(over.error().detail.find("13 bytes") != std::string::npos);
    CHECK(**s.get("t", "k") == json::string(10, 'x'));  // the refused write changed nothing
  }
  SECTION("max_total_bytes") {
    StorageQuotas quotas;
    quotas.maxTotalBytes = 20;
    REQUIRE(ok(s.set("t", "a", "12345678", quotas)));  // 1 + 10: 11
    REQUIRE(ok(s.set("t", "b", 123456, quotas)));      // 1 + 6: 18
    auto atLimit = s.set("t", "c", 1, quotas);         // 1 + 1: 20
    REQUIRE(ok(atLimit));
    CHECK(*atLimit == StorageUsage{3, 20});
    auto over = s.set("t", "d", 1, quotas);
    CHECK(errorOf(over) == StorageErrc::quotaExceeded);
    CHECK(over.error().detail.find("max_total_bytes") != std::string::npos);
    CHECK(over.error().detail.find("22 bytes") != std::string::npos);
    CHECK(over.error().detail.find("20 bytes") != std::string::npos);
    CHECK(errorOf(s.set("t", "c", 12, quotas)) == StorageErrc::quotaExceeded);  // grows to 21
    CHECK(ok(s.set("t", "c", 2, quotas)));                                      // same size

    // A lowered quota: writes that do not grow the usage still pass, so a tool can clean up.
    quotas.maxTotalBytes = 10;
    CHECK(*s.set("t", "b", 1, quotas) == StorageUsage{3, 15});
    CHECK(ok(s.set("t", "c", 3, quotas)));
    CHECK(errorOf(s.set("t", "e", 1, quotas)) == StorageErrc::quotaExceeded);
    REQUIRE(*s.erase("t", "a"));
    CHECK(*s.set("t", "e", 1, quotas) == StorageUsage{3, 6});
  }
}

TEST_CASE("storage: usage follows overwrites and deletes, clear removes a tool's data",
          "[registry][storage]") {
  TempStore t;
  ToolStorage& s = *t.storage;
  const StorageQuotas quotas;
  REQUIRE(ok(s.set("t", "k1", "abc", quotas)));                      // 2 + 5
  REQUIRE(ok(s.set("t", "k2", json::parse(R"([1,2,3])"), quotas)));  // 2 + 7
  CHECK(*s.usage("t") == StorageUsage{2, 16});
  REQUIRE(ok(s.set("t", "k1", "abcdef", quotas)));  // 2 + 8
  CHECK(*s.usage("t") == StorageUsage{2, 19});
  REQUIRE(ok(s.set("t", "k1", 1, quotas)));  // 2 + 1
  CHECK(*s.usage("t") == StorageUsage{2, 12});
  REQUIRE(*s.erase("t", "k2"));
  CHECK(*s.usage("t") == StorageUsage{1, 3});
  REQUIRE(ok(s.set("u", "x", 1, quotas)));

  auto tools = s.tools();
  REQUIRE(ok(tools));
  REQUIRE(tools->size() == 2);
  CHECK((*tools)[0].tool == "t");
  CHECK((*tools)[0].usage == StorageUsage{1, 3});
  CHECK((*tools)[1].tool == "u");
  auto entries = s.entries("t");
  REQUIRE(ok(entries));
  REQUIRE(entries->size() == 1);
  CHECK((*entries)[0].key == "k1");
  CHECK((*entries)[0].bytes == 3);

  // The last key gone: the tool no longer shows.
  REQUIRE(*s.erase("t", "k1"));
  CHECK(*s.usage("t") == StorageUsage{});
  CHECK(s.tools()->size() == 1);

  for (int i = 0; i < 5; ++i) REQUIRE(ok(s.set("t", "key" + std::to_string(i), i, quotas)));
  CHECK(*s.clear("t") == StorageUsage{5, 25});
  CHECK(s.list("t")->empty());
  CHECK(*s.usage("t") == StorageUsage{});
  CHECK(*s.clear("t") == StorageUsage{});
  CHECK(s.list("u")->size() == 1);
}

TEST_CASE("storage: tool names are isolated, including names that prefix each other",
          "[registry][storage]") {
  TempStore t;
  ToolStorage& s = *t.storage;
  const StorageQuotas quotas;
  REQUIRE(ok(s.set("a", "k", "of a", quotas)));
  REQUIRE(ok(s.set("a-b", "k", "of a-b", quotas)));
  REQUIRE(ok(s.set("ab", "k", "of ab", quotas)));
  CHECK(**s.get("a", "k") == "of a");
  CHECK(**s.get("a-b", "k") == "of a-b");
  CHECK(*s.list("a") == std::vector<std::string>{"k"});
  CHECK(s.get("b", "k")->has_value() == false);
  REQUIRE(ok(s.clear("a")));
  CHECK(**s.get("a-b", "k") == "of a-b");
  CHECK(**s.get("ab", "k") == "of ab");
  CHECK(s.usage("ab")->keys == 1);
}

TEST_CASE("storage: values and usage persist across a reopen", "[registry][storage]") {
  TempStore t;
  const StorageQuotas quotas;
  REQUIRE(ok(t.storage->set("counter", "n", 7, quotas)));
  REQUIRE(
      ok(t.storage->set("counter", "doc", json::parse(R"({"b":[1,{"c":null}],"a":"x"})"), quotas)));
  const auto before = *t.storage->usage("counter");
  t.reopen();
  CHECK(**t.storage->get("counter", "n") == 7);
  CHECK(**t.storage->get("counter", "doc") == json::parse(R"({"b":[1,{"c":null}],"a":"x"})"));
  CHECK(*t.storage->usage("counter") == before);
}

TEST_CASE("storage: a batch runs in order in one transaction, refusals fail alone",
          "[registry][storage]") {
  TempStore t;
  ToolStorage& s = *t.storage;
  StorageQuotas quotas;
  quotas.maxKeys = 2;
  std::vector<StorageOp> ops{
      op(StorageOp::Kind::set, "t", "a", 1),
      op(StorageOp::Kind::get, "t", "a", nullptr),
      op(StorageOp::Kind::set, "t", "", 1),  // invalid key
      op(StorageOp::Kind::set, "t", "b", 2),
      op(StorageOp::Kind::set, "t", "c", 3),  // a third key: over max_keys
      op(StorageOp::Kind::erase, "t", "a", nullptr),
      op(StorageOp::Kind::set, "t", "c", 3),  // fits now
      op(StorageOp::Kind::list, "t", "", nullptr),
  };
  auto out = s.apply(ops, quotas);
  REQUIRE(out.size() == ops.size());
  CHECK(out[0]->usage == StorageUsage{1, 2});
  CHECK(out[1]->value == json::value(1));
  CHECK(errorOf(out[2]) == StorageErrc::invalidArgument);
  CHECK(out[3]->usage.keys == 2);
  CHECK(errorOf(out[4]) == StorageErrc::quotaExceeded);
  CHECK(out[5]->existed);
  CHECK(out[6]->usage == StorageUsage{2, 4});
  CHECK(out[7]->keys == std::vector<std::string>{"b", "c"});
  CHECK(*s.list("t") == std::vector<std::string>{"b", "c"});

  // Reads only: a read transaction.
  std::vector<StorageOp> reads{op(StorageOp::Kind::get, "t", "b", nullptr),
                               op(StorageOp::Kind::get, "t", "zz", nullptr)};
  auto read = s.apply(reads, quotas);
  CHECK(read[0]->value == json::value(2));
  CHECK(read[1]->value.has_value() == false);
}

TEST_CASE("storage: a full state database is storage-full, and only what does not fit fails",
          "[registry][storage]") {
  TempStore t(1);  // a 1 MiB map
  ToolStorage& s = *t.storage;
  StorageQuotas quotas;
  quotas.maxValueBytes = std::size_t{8} << 20;
  quotas.maxTotalBytes = std::size_t{64} << 20;
  const json::value huge = json::string(2 << 20, 'x');
  auto full = s.set("t", "huge", huge, quotas);
  CHECK(errorOf(full) == StorageErrc::full);
  CHECK(full.error().detail.find("map_size_mb") != std::string::npos);
  CHECK(s.list("t")->empty());
  CHECK(*s.usage("t") == StorageUsage{});

  std::vector<StorageOp> ops{op(StorageOp::Kind::set, "t", "small", 1),
                             op(StorageOp::Kind::set, "t", "huge", huge),
                             op(StorageOp::Kind::set, "t", "other", 2)};
  auto out = s.apply(ops, quotas);
  CHECK(ok(out[0]));
  CHECK(errorOf(out[1]) == StorageErrc::full);
  CHECK(ok(out[2]));
  CHECK(*s.list("t") == std::vector<std::string>{"other", "small"});
  CHECK(*s.usage("t") == StorageUsage{2, 12});
}

TEST_CASE("storage: clear frees a state database that is full", "[registry][storage]") {
  TempStore t(8);  // an 8 MiB map: ~135 values, whose freed pages one transaction cannot record
  ToolStorage& s = *t.storage;
  StorageQuotas quotas;
  quotas.maxKeys = 100000;
  quotas.maxValueBytes = std::size_t{1} << 20;
  quotas.maxTotalBytes = std::size_t{64} << 20;
  const json::value value = json::string(60000, 'x');
  std::uint64_t stored = 0;
  for (int i = 0; i < 1000; ++i) {
    auto set = s.set("filler", "k" + std::to_string(i), value, quotas);
    if (!set) {
      CHECK(set.error().code == StorageErrc::full);
      break;
    }
    ++stored;
  }
  REQUIRE(stored > 16);
  auto cleared = s.clear("filler");
  REQUIRE(ok(cleared));
  CHECK(cleared->keys == stored);
  CHECK(s.list("filler")->empty());
  CHECK(*s.usage("filler") == StorageUsage{});
  CHECK(ok(s.set("filler", "again", value, quotas)));
  CHECK(*s.usage("filler") == StorageUsage{1, cost("again", value.as_string().c_str()) + 2});
}

TEST_CASE("storage: concurrent writers keep the usage exact", "[registry][storage]") {
  TempStore t;
  ToolStorage& s = *t.storage;
  const StorageQuotas quotas;
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&s, &quotas, w] {
      for (int i = 0; i < 25; ++i) {
        (void)s.set("t", "w" + std::to_string(w) + "-" + std::to_string(i % 10), i, quotas);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  auto entries = *s.entries("t");
  CHECK(entries.size() == 40);
  std::uint64_t bytes = 0;
  for (const auto& entry : entries) bytes += entry.bytes;
  CHECK(*s.usage("t") == StorageUsage{40, bytes});
}
