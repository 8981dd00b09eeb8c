#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
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

  ::close(release[1]);
  CHECK(waitChild(child) == 0);
  ::close(ready[0]);
  auto store = Store::open(options(tmp.state()));
  REQUIRE(store.has_value());
  CHECK(readFile(tmp.state() / "toolhost.lock") == std::to_string(::getpid()) + "\n");
}
