// MessageChannel: the socket between the daemon and a sandbox host, over a real socket pair.
#include "runtime/message_channel.h"

#include <sys/socket.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/json.hpp>
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace asio = boost::asio;
namespace json = boost::json;
using toolhost::runtime::MessageChannel;

namespace {

constexpr std::size_t kMaxBytes = 1 << 20;
constexpr std::size_t kMaxDepth = 16;

// Both ends of a socket pair, each a channel on its own I/O thread.
struct Pair {
  asio::io_context senderIo;
  asio::io_context receiverIo;
  asio::executor_work_guard<asio::io_context::executor_type> senderWork{senderIo.get_executor()};
  asio::executor_work_guard<asio::io_context::executor_type> receiverWork{
      receiverIo.get_executor()};
  std::shared_ptr<MessageChannel> sender;
  std::shared_ptr<MessageChannel> receiver;
  std::thread senderThread;
  std::thread receiverThread;

  std::mutex mutex;
  std::condition_variable changed;
  std::vector<json::object> received;
  bool closed = false;

  Pair() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    sender = MessageChannel::create(senderIo.get_executor(), fds[0], kMaxBytes, kMaxDepth);
    receiver = MessageChannel::create(receiverIo.get_executor(), fds[1], kMaxBytes, kMaxDepth);
    sender->start([](json::object) {}, [](const std::string&) {});
    receiver->start(
        [this](json::object message) {
          std::lock_guard lock(mutex);
          received.push_back(std::move(message));
          changed.notify_all();
        },
        [this](const std::string&) {
          std::lock_guard lock(mutex);
          closed = true;
          changed.notify_all();
        });
    senderThread = std::thread([this] { senderIo.run(); });
    receiverThread = std::thread([this] { receiverIo.run(); });
  }

  ~Pair() {
    sender->close("test over");
    receiver->close("test over");
    senderWork.reset();
    receiverWork.reset();
    senderThread.join();
    receiverThread.join();
  }

  bool waitFor(std::size_t count) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, std::chrono::seconds(10),
                            [&] { return received.size() >= count; });
  }
};

}  // namespace

TEST_CASE("messages sent directly and batched arrive whole and in each sender's order",
          "[channel]") {
  Pair pair;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 2000;
  std::vector<std::thread> senders;
  for (int t = 0; t < kThreads; ++t) {
    senders.emplace_back([&pair, t] {
      for (int i = 0; i < kPerThread; ++i) {
        // Every third message batched; some large enough that the socket takes them in parts.
        json::object message{{"thread", t}, {"seq", i}};
        if (i % 97 == 0) message["pad"] = std::string(200'000, 'x');
        pair.sender->send(message, i % 3 == 0);
      }
    });
  }
  for (auto& sender : senders) sender.join();
  REQUIRE(pair.waitFor(kThreads * kPerThread));

  std::lock_guard lock(pair.mutex);
  REQUIRE(pair.received.size() == kThreads * kPerThread);
  std::map<std::int64_t, std::int64_t> next;
  for (const auto& message : pair.received) {
    const auto thread = message.at("thread").as_int64();
    const auto seq = message.at("seq").as_int64();
    REQUIRE(seq == next[thread]);
    next[thread] = seq + 1;
    if (seq % 97 == 0) REQUIRE(message.at("pad").as_string().size() == 200'000);
  }
}

TEST_CASE("a batched message alone is written without another send to push it", "[channel]") {
  Pair pair;
  pair.sender->send(json::object{{"only", true}}, true);
  REQUIRE(pair.waitFor(1));
  std::lock_guard lock(pair.mutex);
  CHECK(pair.received.front().at("only").as_bool());
}

TEST_CASE("messages sent after close are dropped", "[channel]") {
  Pair pair;
  pair.sender->send(json::object{{"n", 1}}, true);
  REQUIRE(pair.waitFor(1));
  pair.sender->close("done");
  pair.sender->send(json::object{{"n", 2}});
  pair.sender->send(json::object{{"n", 3}}, true);
  {
    std::unique_lock lock(pair.mutex);
    REQUIRE(pair.changed.wait_for(lock, std::chrono::seconds(10), [&] { return pair.closed; }));
    CHECK(pair.received.size() == 1);
  }
}

TEST_CASE("a channel whose other side reads nothing ends at its queue's limit", "[channel]") {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  auto channel = MessageChannel::create(io.get_executor(), fds[0], kMaxBytes, kMaxDepth);
  channel->limitQueue(1 << 20);
  std::mutex mutex;
  std::condition_variable changed;
  std::optional<std::string> reason;
  channel->start([](json::object) {},
                 [&](const std::string& why) {
                   std::lock_guard lock(mutex);
                   reason = why;
                   changed.notify_all();
                 });
  std::thread thread([&] { io.run(); });
  // fds[1] is never read: the socket's buffer fills, then the queue, past 1 MiB. Sent on the
  // channel's strand, holding the lock its close handler takes, as the daemon's backstop and
  // operations do: the close must not run inside send().
  const json::object message{{"t", "x"}, {"pad", std::string(64 * 1024, 'p')}};
  asio::post(channel->strand(), [&] {
    std::lock_guard lock(mutex);
    for (int i = 0; i < 200; ++i) channel->send(message, i % 2 == 0);
  });
  {
    std::unique_lock lock(mutex);
    CHECK(changed.wait_for(lock, std::chrono::seconds(10), [&] { return reason.has_value(); }));
  }
  CHECK_THAT(reason.value_or(""), Catch::Contains("1 MiB wait to be read by the other side"));
  work.reset();
  io.stop();
  thread.join();
  ::close(fds[1]);
}
