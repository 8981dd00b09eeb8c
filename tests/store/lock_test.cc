#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "store/store.h"
#include "tests/store/test_support.h"

using namespace toolhost::store;
using namespace toolhost::store::test;

TEST_CASE("a second Store on the same directory in this process is refused") {
  TempDir tmp;
  auto first = openOrFail(options(tmp.state()));
  // Also through another spelling of the same path.
  auto second = Store::open(options(tmp.state() / "db" / ".."));
  REQUIRE(second.has_error());
  CHECK(second.error().code == StoreErrc::alreadyOpen);
  CHECK_THAT(second.error().message, Catch::Contains("already open in this process"));
  // The refused open did not disturb the first one.
  const Table items = first->table("items");
  REQUIRE(first->write([&](WriteTxn& txn) -> boost::system::result<void> {
    txn.put(items, "k", "v");
    return {};
  }));
  first.reset();
  auto third = Store::open(options(tmp.state()));
  CHECK(third.has_value());
}

TEST_CASE("a second process gets 'in use by pid N' until the first one exits") {
  TempDir tmp;
  int ready[2];
  int release[2];
  REQUIRE(::pipe(ready) == 0);
  REQUIRE(::pipe(release) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(ready[0]);
    ::close(release[1]);
    auto store = Store::open(options(tmp.state()));
    if (!store) ::_exit(2);
    char c = 'r';
    if (::write(ready[1], &c, 1) != 1) ::_exit(3);
    // Hold the store until the parent closes its end.
    while (::read(release[0], &c, 1) > 0) {
    }
    ::_exit(0);
  }
  ::close(ready[1]);
  ::close(release[0]);
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);

  auto refused = Store::open(options(tmp.state()));
  REQUIRE(refused.has_error());
  CHECK(refused.error().code == StoreErrc::locked);
  CHECK_THAT(refused.error().message, Catch::Contains("in use by pid " + std::to_string(child)));
  // The lock file removed by hand (taken for a stale one) lets nobody in either.
  std::filesystem::remove(tmp.state() / "toolhost.lock");
  auto stillRefused = Store::open(options(tmp.state()));
  REQUIRE(stillRefused.has_error());
  CHECK(stillRefused.error().code == StoreErrc::locked);
  CHECK_THAT(stillRefused.error().message, Catch::Contains("in use by another process"));
  CHECK_FALSE(std::filesystem::exists(tmp.state() / "toolhost.lock"));

  ::close(release[1]);
  CHECK(waitChild(child) == 0);
  ::close(ready[0]);
  auto store = Store::open(options(tmp.state()));
  REQUIRE(store.has_value());
  CHECK(readFile(tmp.state() / "toolhost.lock") == std::to_string(::getpid()) + "\n");
}

TEST_CASE("entries of the state directory another user made, or others may write, are refused") {
  TempDir tmp;
  const auto state = tmp.state();
  { openOrFail(options(state)); }
  const auto db = state / "db";
  std::string expected;
  SECTION("db/ writable by others") {
    std::filesystem::permissions(db, std::filesystem::perms::others_write,
                                 std::filesystem::perm_options::add);
    expected = "may be written by its group or by others";
  }
  SECTION("the data file writable by its group") {
    std::filesystem::permissions(db / "data.mdb", std::filesystem::perms::group_write,
                                 std::filesystem::perm_options::add);
    expected = "may be written by its group or by others";
  }
  SECTION("the data file a link to another file") {
    std::filesystem::rename(db / "data.mdb", state / "elsewhere.mdb");
    std::filesystem::create_symlink(state / "elsewhere.mdb", db / "data.mdb");
    expected = "is not a regular file";
  }
  SECTION("db/ a link to another directory") {
    std::filesystem::rename(db, state / "elsewhere");
    std::filesystem::create_directory_symlink(state / "elsewhere", db);
    expected = "is not a directory";
  }
  if (::geteuid() == 0) {
    // Only root can give a file away; as another user this is what a sticky state directory
    // (as /tmp) lets them make before the daemon's first start.
    SECTION("db/ of another user") {
      REQUIRE(::chown(db.c_str(), 65534, 65534) == 0);
      expected = "belongs to uid 65534";
    }
    SECTION("the reader table of another user") {
      REQUIRE(::chown((db / "lock.mdb").c_str(), 65534, 65534) == 0);
      expected = "belongs to uid 65534";
    }
    SECTION("the lock file of another user") {
      REQUIRE(::chown((state / "toolhost.lock").c_str(), 65534, 65534) == 0);
      expected = "belongs to uid 65534";
    }
    SECTION("a db/ made by another user before the first start") {
      std::filesystem::remove_all(db);
      std::filesystem::remove(state / "db.created");
      std::filesystem::create_directory(db);
      REQUIRE(::chown(db.c_str(), 65534, 65534) == 0);
      expected = "belongs to uid 65534";
    }
  }
  if (expected.empty()) return;  // a root-only section, run as another user
  auto refused = Store::open(options(state));
  REQUIRE(refused.has_error());
  CHECK(refused.error().code == StoreErrc::permissionDenied);
  CHECK_THAT(refused.error().message, Catch::Contains(expected));
}
