// One end of the socket between the daemon and a sandbox host process: JSON objects in and out
// as NDJSON (runtime/sandbox_protocol.h). Reads run on the channel's strand and hand each
// message to one handler; send() and close() may be called from any thread.
//
// Caveats:
//  - Handlers run on the strand, one at a time, in the order the messages arrived; onClosed runs
//    exactly once (end of stream, a read or write error, a line over the limit, a message that is
//    not a JSON object, or close()), after which no handler runs and send() drops its message.
//  - Outgoing messages queue without bound: the peer is our own code, which always reads.
//  - send() writes on the calling thread when nothing is queued and the socket takes the whole
//    message at once, unless asked to batch; otherwise the strand writes it, together with
//    whatever queued meanwhile. Messages keep the order of the send()s.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/strand.hpp>
#include <boost/json/object.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace toolhost::runtime {

class MessageChannel : public std::enable_shared_from_this<MessageChannel> {
 public:
  using Strand = boost::asio::strand<boost::asio::any_io_executor>;
  using OnMessage = std::function<void(boost::json::object message)>;
  using OnClosed = std::function<void(const std::string& reason)>;

  // Takes ownership of `fd`, a connected SOCK_STREAM Unix socket. A message longer than
  // maxMessageBytes, nested deeper than maxDepth or with more than maxValues JSON values closes
  // the channel.
  static std::shared_ptr<MessageChannel> create(const boost::asio::any_io_executor& executor,
                                                int fd, std::size_t maxMessageBytes,
                                                std::size_t maxDepth,
                                                std::size_t maxValues = SIZE_MAX);
  ~MessageChannel();
  MessageChannel(const MessageChannel&) = delete;
  MessageChannel& operator=(const MessageChannel&) = delete;

  // Starts reading. Call once.
  void start(OnMessage onMessage, OnClosed onClosed);
  // Queues one message. Any thread; dropped once closed. `batch`: leave it to the strand's thread
  // to write, with whatever else queues meanwhile, instead of writing it from this thread.
  void send(const boost::json::object& message, bool batch = false);
  // Closes the socket; onClosed(reason) runs on the strand unless it already ran. Any thread.
  void close(std::string reason);
  // A send that would leave more than `bytes` queued (not yet taken by the socket) closes the
  // channel instead (onClosed runs later, on the strand, never inside send): the other side is
  // not reading. Unlimited unless set.
  void limitQueue(std::size_t bytes);
  // Bytes sent and not yet taken by the socket. Any thread.
  std::size_t queued();

  const Strand& strand() const { return strand_; }

 private:
  MessageChannel(const boost::asio::any_io_executor& executor, int fd, std::size_t maxMessageBytes,
                 std::size_t maxDepth, std::size_t maxValues);
  boost::asio::awaitable<void> readLoop();
  boost::asio::awaitable<std::string> readUntilClosed();  // why reading stopped
  void flush();                                           // strand
  void finish(const std::string& reason);                 // strand

  Strand strand_;
  boost::asio::local::stream_protocol::socket socket_;
  const int fd_;  // socket_'s; written to directly by send(), under mutex_, until closed_
  const std::size_t maxMessageBytes_;
  const std::size_t maxDepth_;
  const std::size_t maxValues_;

  // On the strand.
  OnMessage onMessage_;
  OnClosed onClosed_;
  bool finished_ = false;
  std::string closeReason_;
  std::string inflight_;  // being written

  std::mutex mutex_;
  std::string outgoing_;  // under mutex_: queued, not yet being written
  std::size_t maxQueuedBytes_ = SIZE_MAX;  // under mutex_
  bool writing_ = false;  // under mutex_: a flush is scheduled or a write is in progress
  bool closed_ = false;   // under mutex_
};

}  // namespace toolhost::runtime
