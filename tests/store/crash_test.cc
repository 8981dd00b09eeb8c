// kill -9 at a random moment while a child commits batches; every batch must be all or nothing.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <random>
#include <string>
#include <thread>

#include "store/store.h"
#include "tests/store/test_support.h"

using namespace toolhost::store;
using namespace toolhost::store::test;
using boost::system::result;

namespace {

constexpr std::uint64_t kKeysPerBatch = 6;
constexpr std::uint64_t kBatchesKept = 4;  // batch i erases batch i - kBatchesKept

std::string batchKey(std::uint64_t batch, std::uint64_t part) {
  return "b" + u64Key(batch) + u64Key(part);
}

// Deterministic per (batch, part), with sizes from a few bytes to overflow pages.
std::string batchValue(std::uint64_t batch, std::uint64_t part) {
  std::mt19937_64 rng(batch * 131 + part);
  const std::size_t size = 1 + rng() % 9000;
  std::string value(size, '\0');
  for (auto& c : value) c = static_cast<char>('a' + rng() % 26);
  return value;
}

// The child: opens the store, reports ready, then commits batches until it is killed. Batch i
// writes its keys, erases batch i - kBatchesKept, and moves "next" to i + 1, all in one txn.
[[noreturn]] void writeForever(const std::filesystem::path& stateDir, int readyFd) {
  auto opened = Store::open(options(stateDir));
  if (!opened) ::_exit(10);
  Store& store = **opened;
  const Table items = store.table("items");
  const Table other = store.table("other");
  auto next = store.read([&](ReadTxn& txn) {
    auto v = txn.tryGet(other, "next");
    return v ? *tryParseU64Key(*v) : 0;
  });
  if (!next) ::_exit(11);
  const char ready = 'r';
  if (::write(readyFd, &ready, 1) != 1) ::_exit(12);
  for (std::uint64_t batch = *next;; ++batch) {
    auto r = store.write([&](WriteTxn& txn) -> result<void> {
      for (std::uint64_t part = 0; part < kKeysPerBatch; ++part) {
        txn.put(items, batchKey(batch, part), batchValue(batch, part));
      }
      if (batch >= kBatchesKept) {
        for (std::uint64_t part = 0; part < kKeysPerBatch; ++part) {
          txn.erase(items, batchKey(batch - kBatchesKept, part));
        }
      }
      txn.put(other, "next", u64Key(batch + 1));
      return {};
    });
    if (!r) ::_exit(13);
  }
}

// Returns the number of committed batches after checking that exactly the last kBatchesKept of
// them are present, each complete and with its own values.
std::uint64_t checkBatches(const Store& store) {
  const Table items = store.table("items");
  const Table other = store.table("other");
  auto next = store.read([&](ReadTxn& txn) -> result<std::uint64_t> {
    auto v = txn.tryGet(other, "next");
    const std::uint64_t n = v ? *tryParseU64Key(*v) : 0;
    const std::uint64_t first = n > kBatchesKept ? n - kBatchesKept : 0;
    CHECK(txn.count(items) == (n - first) * kKeysPerBatch);
    for (std::uint64_t batch = first; batch < n; ++batch) {
      for (std::uint64_t part = 0; part < kKeysPerBatch; ++part) {
        auto value = txn.tryGet(items, batchKey(batch, part));
        REQUIRE(value.has_value());
        REQUIRE(*value == batchValue(batch, part));
      }
    }
    return n;
  });
  REQUIRE(next);
  return *next;
}

}  // namespace

TEST_CASE("kill -9 during writes leaves every committed batch complete") {
  TempDir tmp;
  std::uint64_t committed = 0;
  for (std::uint32_t seed = 1; seed <= 8; ++seed) {
    std::mt19937 rng(seed);
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      ::close(ready[0]);
      writeForever(tmp.state(), ready[1]);
    }
    ::close(ready[1]);
    pollfd pfd{ready[0], POLLIN, 0};
    REQUIRE(::poll(&pfd, 1, 5000) == 1);
    char c = 0;
    const bool childReady = ::read(ready[0], &c, 1) == 1;
    ::close(ready[0]);

    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 60000));
    ::kill(child, SIGKILL);
    const int status = waitChild(child);
    REQUIRE(childReady);
    REQUIRE(status == -SIGKILL);  // not an early exit with an error code

    auto store = openOrFail(options(tmp.state()));
    const std::uint64_t now = checkBatches(*store);
    INFO("seed " << seed << ": " << committed << " -> " << now << " batches");
    CHECK(now >= committed);
    committed = now;
  }
  // The kills did not all land before the first commit.
  CHECK(committed > 0);
}
