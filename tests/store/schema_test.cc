#include <lmdb.h>

#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "store/page_check.h"
#include "store/store.h"
#include "tests/store/test_support.h"

using namespace toolhost::store;
using namespace toolhost::store::test;

namespace {

// Writes key=value into `table` ("" = LMDB's main table) of the environment in `db` with raw
// LMDB, for states the store's API cannot produce. Only while no Store has the directory open.
void rawPut(const std::filesystem::path& db, const char* table, const std::string& key,
            const std::string& value) {
  MDB_env* env = nullptr;
  REQUIRE(mdb_env_create(&env) == 0);
  REQUIRE(mdb_env_set_maxdbs(env, 8) == 0);
  std::filesystem::create_directories(db);
  REQUIRE(mdb_env_open(env, db.c_str(), MDB_NOTLS, 0600) == 0);
  MDB_txn* txn = nullptr;
  REQUIRE(mdb_txn_begin(env, nullptr, 0, &txn) == 0);
  MDB_dbi dbi = 0;
  REQUIRE(mdb_dbi_open(txn, *table != '\0' ? table : nullptr, MDB_CREATE, &dbi) == 0);
  MDB_val k{key.size(), const_cast<char*>(key.data())};
  MDB_val v{value.size(), const_cast<char*>(value.data())};
  REQUIRE(mdb_put(txn, dbi, &k, &v, 0) == 0);
  REQUIRE(mdb_txn_commit(txn) == 0);
  mdb_env_close(env);
}

std::optional<std::string> rawGet(const std::filesystem::path& db, const char* table,
                                  const std::string& key) {
  MDB_env* env = nullptr;
  REQUIRE(mdb_env_create(&env) == 0);
  REQUIRE(mdb_env_set_maxdbs(env, 8) == 0);
  REQUIRE(mdb_env_open(env, db.c_str(), MDB_NOTLS | MDB_RDONLY, 0600) == 0);
  MDB_txn* txn = nullptr;
  REQUIRE(mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn) == 0);
  MDB_dbi dbi = 0;
  std::optional<std::string> out;
  if (mdb_dbi_open(txn, table, 0, &dbi) == 0) {
    MDB_val k{key.size(), const_cast<char*>(key.data())};
    MDB_val v{};
    if (mdb_get(txn, dbi, &k, &v) == 0) out.emplace(static_cast<const char*>(v.mv_data), v.mv_size);
  }
  mdb_txn_abort(txn);
  mdb_env_close(env);
  return out;
}

}  // namespace

TEST_CASE("a fresh store gets the current schema version") {
  TempDir tmp;
  { openOrFail(options(tmp.state())); }
  CHECK(rawGet(tmp.state() / "db", "meta", "schema_version") == std::to_string(kSchemaVersion));
}

TEST_CASE("a store with a newer schema version is refused, naming both, and not written") {
  TempDir tmp;
  {
    auto store = openOrFail(options(tmp.state()));
    const Table items = store->table("items");
    REQUIRE(store->write([&](WriteTxn& txn) -> boost::system::result<void> {
      txn.put(items, "k", "v");
      return {};
    }));
  }
  const auto db = tmp.state() / "db";
  rawPut(db, "meta", "schema_version", std::to_string(kSchemaVersion + 1));
  const std::string before = readFile(db / "data.mdb");

  // Even with a new table in the list, which an accepted open would create.
  auto refused = Store::open(options(tmp.state(), {"items", "other", "brand-new"}));
  REQUIRE(refused.has_error());
  CHECK(refused.error().code == StoreErrc::versionMismatch);
  CHECK_THAT(refused.error().message,
             Catch::Contains("schema version " + std::to_string(kSchemaVersion + 1)) &&
                 Catch::Contains("supports (" + std::to_string(kSchemaVersion) + ")"));
  CHECK(readFile(db / "data.mdb") == before);
  CHECK(rawGet(db, "brand-new", "anything") == std::nullopt);

  // The refusal released the lock: after a downgrade of the row the store opens again.
  rawPut(db, "meta", "schema_version", std::to_string(kSchemaVersion));
  auto store = openOrFail(options(tmp.state()));
  auto value = store->read([&](ReadTxn& txn) { return txn.getCopy(store->table("items"), "k"); });
  REQUIRE(value);
  CHECK(*value == "v");
}

TEST_CASE("an unreadable schema version is reported as corrupt") {
  TempDir tmp;
  { openOrFail(options(tmp.state())); }
  rawPut(tmp.state() / "db", "meta", "schema_version", "one");
  auto refused = Store::open(options(tmp.state()));
  REQUIRE(refused.has_error());
  CHECK(refused.error().code == StoreErrc::corrupt);
  CHECK_THAT(refused.error().message, Catch::Contains("'one'"));
}

TEST_CASE("a foreign LMDB database in the state directory is refused, not adopted") {
  TempDir tmp;
  std::filesystem::create_directories(tmp.state());
  rawPut(tmp.state() / "db", "", "someone-else", "data");
  auto refused = Store::open(options(tmp.state()));
  REQUIRE(refused.has_error());
  CHECK(refused.error().code == StoreErrc::corrupt);
  CHECK_THAT(refused.error().message, Catch::Contains("not a toolhost state database"));
}

TEST_CASE("a data file that is not LMDB is refused as corrupt") {
  TempDir tmp;
  std::filesystem::create_directories(tmp.state() / "db");
  {
    std::ofstream junk(tmp.state() / "db" / "data.mdb", std::ios::binary);
    junk << std::string(16384, 'j');
  }
  auto refused = Store::open(options(tmp.state()));
  REQUIRE(refused.has_error());
  CHECK(refused.error().code == StoreErrc::corrupt);
  CHECK_THAT(refused.error().message, Catch::Contains("not an LMDB file"));
}

TEST_CASE("a truncated data file is refused at open and never read past its end") {
  TempDir tmp;
  {
    auto store = Store::open(options(tmp.state()));
    REQUIRE(store.has_value());
    auto table = (*store)->table("items");
    REQUIRE((*store)->write([&](WriteTxn& txn) -> boost::system::result<void> {
      for (int i = 0; i < 200; ++i)
        txn.put(table, "key" + std::to_string(i), std::string(4000, 'v'));
      return {};
    }));
  }
  const auto file = tmp.state() / "db" / "data.mdb";
  std::filesystem::resize_file(file, std::filesystem::file_size(file) / 2);
  auto refused = Store::open(options(tmp.state()));
  REQUIRE(refused.has_error());
  CHECK(refused.error().code == StoreErrc::corrupt);
  CHECK_THAT(refused.error().message, Catch::Contains("truncated"));
}

TEST_CASE("a database lost after it was created is refused, not begun again") {
  TempDir tmp;
  const auto marker = tmp.state() / "db.created";
  {
    auto store = openOrFail(options(tmp.state()));
    REQUIRE(store->write([&](WriteTxn& txn) -> boost::system::result<void> {
      txn.put(store->table("items"), "kept", "yes");
      return {};
    }));
  }
  REQUIRE(std::filesystem::is_regular_file(marker));

  std::string restore = "restore db/ from a backup";
  bool dbKept = true;
  bool empty = false;
  SECTION("truncated to nothing") {
    std::filesystem::resize_file(tmp.state() / "db" / "data.mdb", 0);
    empty = true;
  }
  SECTION("deleted with its directory") {
    std::filesystem::remove_all(tmp.state() / "db");
    dbKept = false;
  }
  SECTION("its data file deleted") {
    std::filesystem::remove(tmp.state() / "db" / "data.mdb");
    restore = "restore data.mdb into " + (tmp.state() / "db").string();
  }
  for (int attempt = 0; attempt < 2; ++attempt) {  // a refused open hides nothing from the next
    auto refused = Store::open(options(tmp.state()));
    REQUIRE(refused.has_error());
    CHECK(refused.error().code == StoreErrc::corrupt);
    CHECK_THAT(refused.error().message, Catch::Contains("is missing"));
    CHECK_THAT(refused.error().message, Catch::Contains(restore));
    CHECK_THAT(refused.error().message, Catch::Contains(marker.string()));
    // Nothing is made in the lost database's place, so a backup moved back lands where it was.
    CHECK(std::filesystem::exists(tmp.state() / "db") == dbKept);
    // Nor is anything written into an empty data file.
    if (empty) CHECK(std::filesystem::file_size(tmp.state() / "db" / "data.mdb") == 0);
  }
  // Removing the marker is how one starts again on purpose.
  std::filesystem::remove(marker);
  auto store = openOrFail(options(tmp.state()));
  auto kept = store->read([&](ReadTxn& txn) { return txn.getCopy(store->table("items"), "kept"); });
  REQUIRE(kept);
  CHECK(*kept == std::nullopt);
  CHECK(std::filesystem::is_regular_file(marker));
}

TEST_CASE("a database made before the marker existed gets one, and a failed first open none") {
  TempDir tmp;
  const auto marker = tmp.state() / "db.created";
  { openOrFail(options(tmp.state())); }
  std::filesystem::remove(marker);
  {
    auto store = openOrFail(options(tmp.state()));
    CHECK(std::filesystem::is_regular_file(marker));
  }

  // A first open that fails before the database holds its schema version leaves no marker, so
  // the next one starts afresh.
  TempDir other;
  std::filesystem::create_directories(other.state() / "db");
  {
    std::ofstream junk(other.state() / "db" / "data.mdb", std::ios::binary);
    junk << std::string(20000, 'x');
  }
  REQUIRE(Store::open(options(other.state())).has_error());
  CHECK_FALSE(std::filesystem::exists(other.state() / "db.created"));
  std::filesystem::remove(other.state() / "db" / "data.mdb");
  CHECK(Store::open(options(other.state())).has_value());

  // A first open that a full disk stopped part way leaves less than LMDB's two meta pages:
  // without the marker, that database is begun again rather than refused for ever.
  TempDir half;
  std::filesystem::create_directories(half.state() / "db");
  {
    std::ofstream partial(half.state() / "db" / "data.mdb", std::ios::binary);
    partial << std::string(4096, '\0');
  }
  // An empty lock file left by a start killed before it took its room is given its room too.
  { std::ofstream emptyLock(half.state() / "db" / "lock.mdb"); }
  std::filesystem::permissions(
      half.state() / "db" / "lock.mdb",
      std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  {
    auto store = openOrFail(options(half.state()));
    CHECK(std::filesystem::is_regular_file(half.state() / "db.created"));
    // Its lock file, made afresh, has its room taken (LMDB writes it through a map, where a
    // full disk would be SIGBUS).
    struct stat lock {};
    REQUIRE(::stat((half.state() / "db" / "lock.mdb").c_str(), &lock) == 0);
    CHECK(lock.st_blocks * 512 >= lock.st_size);
  }
  // With the marker, the same is a database that was lost, and refused.
  std::filesystem::resize_file(half.state() / "db" / "data.mdb", 4096);
  CHECK(Store::open(options(half.state())).has_error());
}

TEST_CASE("the page check runs before any table is read, and what it reports refuses the store",
          "[store][pages]") {
  TempDir tmp;
  int calls = 0;
  std::optional<PageCheckFailure> report;
  auto withCheck = [&] {
    auto opts = options(tmp.state());
    opts.checkPages = [&](const std::filesystem::path& db) {
      ++calls;
      CHECK(db == std::filesystem::canonical(tmp.state()) / "db");
      return report;
    };
    return opts;
  };
  {
    // A database just made has nothing to check.
    auto store = openOrFail(withCheck());
    CHECK(calls == 0);
    REQUIRE(store->write([&](WriteTxn& txn) -> boost::system::result<void> {
      txn.put(store->table("items"), "big", std::string(100000, 'x'));  // overflow pages
      return {};
    }));
    CHECK_FALSE(store->checkPages().has_value());
    CHECK(calls == 1);
  }
  // The walk itself, of a healthy database (no other environment open on it in this process,
  // an LMDB rule), finds nothing.
  CHECK(walkDatabase(tmp.state() / "db").empty());
  {
    auto store = openOrFail(withCheck());
    CHECK(calls == 2);
  }
  report = PageCheckFailure{true, "table items: entry 1 points outside the database's pages"};
  auto refused = Store::open(withCheck());
  REQUIRE(refused.has_error());
  CHECK(calls == 3);
  CHECK(refused.error().code == StoreErrc::corrupt);
  CHECK_THAT(refused.error().message,
             Catch::Contains("is damaged: table items: entry 1 points outside") &&
                 Catch::Contains("restore db/ from a backup"));
  // A check that could not be made is no damage: refused too, without the advice to restore.
  report = PageCheckFailure{false, "the check of every page did not finish in 60 s"};
  refused = Store::open(withCheck());
  REQUIRE(refused.has_error());
  CHECK(refused.error().code == StoreErrc::ioError);
  CHECK_THAT(refused.error().message, Catch::Contains("cannot check the pages") &&
                                          Catch::Contains("did not finish in 60 s") &&
                                          !Catch::Contains("restore"));
}

TEST_CASE("the page walk reports a table whose record counts entries its pages do not hold",
          "[store][pages]") {
  TempDir tmp;
  const auto db = tmp.state() / "db";
  rawPut(db, "items", "a", "1");
  rawPut(db, "items", "b", "2");
  CHECK(walkDatabase(db).empty());
  // A table record in the main table that counts more entries than its pages hold. The record
  // is the MDB_db value under the table's name: pad (4 bytes), flags (2), depth (2), then branch,
  // leaf and overflow page counts, entries and root (8 bytes each). In data.mdb the key "items"
  // of the main table is followed by it; change every copy (the older ones are in free pages).
  std::fstream file(db / "data.mdb", std::ios::in | std::ios::out | std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  int changed = 0;
  for (auto at = bytes.find("items"); at != std::string::npos; at = bytes.find("items", at + 1)) {
    const std::size_t entriesAt = at + 5 + 32;
    if (entriesAt + 8 > bytes.size() || bytes[entriesAt] != 2) continue;
    file.seekp(static_cast<std::streamoff>(entriesAt));
    file.put(7);
    ++changed;
  }
  file.close();
  REQUIRE(changed > 0);
  auto problems = walkDatabase(db);
  REQUIRE(problems.size() == 1);
  CHECK(problems[0] == "table items: its record says 7 entries, its pages hold 2");
}

TEST_CASE("a page check that stops talking but keeps running is ended at its time limit",
          "[store][pages]") {
  // A child that closes its output and goes on (as one stuck reading a failing disk would after
  // printing): the caller gets "did not finish" at the time limit, not when the child exits.
  TempDir dir;
  PageCheckLaunch launch{"/bin/sh", {"-c", "exec >&- 2>&-; sleep 30", "sh"}};
  launch.timeout = std::chrono::milliseconds(300);
  const auto started = std::chrono::steady_clock::now();
  const auto failure = checkInChild(launch, dir.path());
  const auto took = std::chrono::steady_clock::now() - started;
  REQUIRE(failure.has_value());
  CHECK_FALSE(failure->damaged);
  CHECK_THAT(failure->text, Catch::Contains("did not finish"));
  CHECK(took < std::chrono::seconds(20));
}

TEST_CASE("a page check killed by what it read is damage, killed by anything else it is not",
          "[store][pages]") {
  TempDir dir;
  auto killedBy = [&](const char* signal) {
    return checkInChild(
        PageCheckLaunch{"/bin/sh", {"-c", std::string("kill -") + signal + " $$", "sh"}},
        dir.path());
  };
  for (const char* signal : {"SEGV", "BUS", "ABRT"}) {
    INFO(signal);
    const auto failure = killedBy(signal);
    REQUIRE(failure.has_value());
    CHECK(failure->damaged);
  }
  for (const char* signal : {"TERM", "KILL", "INT"}) {
    INFO(signal);
    const auto failure = killedBy(signal);
    REQUIRE(failure.has_value());
    CHECK_FALSE(failure->damaged);
    CHECK_THAT(failure->text, Catch::Contains("was killed"));
  }
}

namespace {
// Overwrites `bytes` at `offset` within data.mdb.
void patch(const std::filesystem::path& db, std::size_t offset, const std::string& bytes) {
  std::fstream file(db / "data.mdb", std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(static_cast<std::streamoff>(offset));
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string dataFile(const std::filesystem::path& db) {
  std::ifstream file(db / "data.mdb", std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}
}  // namespace

TEST_CASE("the page walk reports damage that only a write would meet", "[store][pages]") {
  // Reads follow a page's node offsets but never its free-space bounds or an overflow run's
  // length; LMDB's copy-on-write does, and a damaged one killed the daemon at its first write
  // to the page after a check that found nothing.
  const auto pageSize = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  SECTION("a leaf page's free-space bounds") {
    TempDir tmp;
    const auto db = tmp.state() / "db";
    rawPut(db, "items", "MARKERKEY", "hello");
    rawPut(db, "items", "other", "x");
    REQUIRE(walkDatabase(db).empty());
    const std::string bytes = dataFile(db);
    int changed = 0;
    for (auto at = bytes.find("MARKERKEY"); at != std::string::npos;
         at = bytes.find("MARKERKEY", at + 1)) {
      patch(db, at / pageSize * pageSize + 14, std::string("\xF0\xFF", 2));  // mp_upper
      ++changed;
    }
    REQUIRE(changed > 0);
    auto problems = walkDatabase(db);
    REQUIRE_FALSE(problems.empty());
    CHECK_THAT(problems[0],
               Catch::Contains("table items: page") && Catch::Contains("its free space runs from"));
  }
  SECTION("an overflow run's length") {
    TempDir tmp;
    const auto db = tmp.state() / "db";
    rawPut(db, "items", "big", std::string(100000, 'q'));
    REQUIRE(walkDatabase(db).empty());
    const std::string bytes = dataFile(db);
    int changed = 0;
    for (std::size_t page = 2; (page + 1) * pageSize <= bytes.size(); ++page) {
      std::uint64_t number = 0;
      std::uint16_t flags = 0;
      std::memcpy(&number, bytes.data() + page * pageSize, 8);
      std::memcpy(&flags, bytes.data() + page * pageSize + 10, 2);
      if (number != page || (flags & 0x04) == 0) continue;
      patch(db, page * pageSize + 12, std::string("\x01\x00\x00\x00", 4));  // mp_pages
      ++changed;
    }
    REQUIRE(changed > 0);
    auto problems = walkDatabase(db);
    REQUIRE_FALSE(problems.empty());
    CHECK_THAT(problems[0], Catch::Contains("table items: overflow page") &&
                                Catch::Contains("counts 1 pages for a value that takes " +
                                                std::to_string((15 + 100000) / pageSize + 1)));
  }
}

TEST_CASE("the page walk finds nothing wrong with a database being written meanwhile",
          "[store][pages]") {
  // The walk runs beside the daemon's writes (store.verify): commits that overwrite the meta
  // page of its snapshot, free pages and reuse them must not read as damage.
  TempDir tmp;
  const auto db = tmp.state() / "db";
  rawPut(db, "items", "seed", "x");
  int report[2];
  REQUIRE(::pipe(report) == 0);
  const pid_t walker = ::fork();
  if (walker == 0) {
    ::close(report[0]);
    char found = 0;
    try {
      for (int i = 0; i < 100; ++i) {
        if (!walkDatabase(db).empty()) found = 1;
      }
    } catch (const std::exception&) {
      found = 2;
    }
    (void)!::write(report[1], &found, 1);
    ::_exit(0);
  }
  ::close(report[1]);
  MDB_env* env = nullptr;
  REQUIRE(mdb_env_create(&env) == 0);
  REQUIRE(mdb_env_set_maxdbs(env, 8) == 0);
  REQUIRE(mdb_env_set_mapsize(env, std::size_t{64} << 20) == 0);
  REQUIRE(mdb_env_open(env, db.c_str(), MDB_NOTLS | MDB_NOSYNC, 0600) == 0);
  pollfd done{report[0], POLLIN, 0};
  for (int round = 0; ::poll(&done, 1, 0) == 0 && round < 200000; ++round) {
    MDB_txn* txn = nullptr;
    REQUIRE(mdb_txn_begin(env, nullptr, 0, &txn) == 0);
    MDB_dbi dbi = 0;
    REQUIRE(mdb_dbi_open(txn, "items", 0, &dbi) == 0);
    for (int i = 0; i < 20; ++i) {
      const std::string key = "k" + std::to_string((round * 20 + i) % 500);
      const std::string value((round + i) % 7 == 0 ? 6000 : 200, 'v');
      MDB_val k{key.size(), const_cast<char*>(key.data())};
      MDB_val v{value.size(), const_cast<char*>(value.data())};
      if ((round + i) % 3 == 0) {
        mdb_del(txn, dbi, &k, nullptr);
      } else {
        REQUIRE(mdb_put(txn, dbi, &k, &v, 0) == 0);
      }
    }
    REQUIRE(mdb_txn_commit(txn) == 0);
  }
  char found = 1;
  CHECK(::read(report[0], &found, 1) == 1);
  int status = 0;
  ::waitpid(walker, &status, 0);
  ::close(report[0]);
  mdb_env_close(env);
  CHECK(WIFEXITED(status));
  CHECK(found == 0);
}

TEST_CASE(
    "a value rewritten smaller in one transaction keeps its longer overflow run, and that is "
    "no damage",
    "[store][pages]") {
  // LMDB writes the smaller value over the run the larger one took earlier in the same
  // transaction and keeps the run's length (ctx.storage batches can do this to one key).
  TempDir tmp;
  const auto db = tmp.state() / "db";
  std::filesystem::create_directories(db);
  MDB_env* env = nullptr;
  REQUIRE(mdb_env_create(&env) == 0);
  REQUIRE(mdb_env_set_maxdbs(env, 8) == 0);
  REQUIRE(mdb_env_open(env, db.c_str(), MDB_NOTLS, 0600) == 0);
  MDB_txn* txn = nullptr;
  REQUIRE(mdb_txn_begin(env, nullptr, 0, &txn) == 0);
  MDB_dbi dbi = 0;
  REQUIRE(mdb_dbi_open(txn, "items", MDB_CREATE, &dbi) == 0);
  std::string value(40000, 'x');
  MDB_val k{1, const_cast<char*>("k")};
  MDB_val v{value.size(), value.data()};
  REQUIRE(mdb_put(txn, dbi, &k, &v, 0) == 0);
  v.mv_size = 5000;
  REQUIRE(mdb_put(txn, dbi, &k, &v, 0) == 0);
  REQUIRE(mdb_txn_commit(txn) == 0);
  mdb_env_close(env);
  CHECK(walkDatabase(db).empty());
}
