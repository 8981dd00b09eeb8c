#include "runtime/message_channel.h"

#include "protocol/framing.h"
#include "protocol/json_parse.h"
#include "protocol/json_text.h"

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include <sys/socket.h>

namespace toolhost::runtime {
namespace asio = boost::asio;
namespace json = boost::json;

namespace {
constexpr std::size_t kReadChunk = 64 * 1024;
}  // namespace

std::shared_ptr<MessageChannel> MessageChannel::create(const asio::any_io_executor& executor,
                                                       int fd, std::size_t maxMessageBytes,
                                                       std::size_t maxDepth,
                                                       std::size_t maxValues) {
  return std::shared_ptr<MessageChannel>(
      new MessageChannel(executor, fd, maxMessageBytes, maxDepth, maxValues));
}

MessageChannel::MessageChannel(const asio::any_io_executor& executor, int fd,
                               std::size_t maxMessageBytes, std::size_t maxDepth,
                               std::size_t maxValues)
    : strand_(asio::make_strand(executor)),
      socket_(strand_, asio::local::stream_protocol(), fd),
      fd_(fd),
      maxMessageBytes_(maxMessageBytes),
      maxDepth_(maxDepth),
      maxValues_(maxValues) {}

MessageChannel::~MessageChannel() = default;

void MessageChannel::start(OnMessage onMessage, OnClosed onClosed) {
  asio::dispatch(strand_, [self = shared_from_this(), onMessage = std::move(onMessage),
                           onClosed = std::move(onClosed)]() mutable {
    if (self->finished_) {
      onClosed(self->closeReason_);
      return;
    }
    self->onMessage_ = std::move(onMessage);
    self->onClosed_ = std::move(onClosed);
    asio::co_spawn(self->strand_, self->readLoop(), asio::detached);
  });
}

asio::awaitable<void> MessageChannel::readLoop() {
  auto self = shared_from_this();
  std::string reason = co_await readUntilClosed();
  finish(reason);
  onMessage_ = nullptr;  // what it holds may refer back to this channel
}

asio::awaitable<std::string> MessageChannel::readUntilClosed() {
  protocol::LineFramer framer(maxMessageBytes_);
  protocol::JsonParseLimits limits;
  limits.maxDepth = maxDepth_;
  limits.maxValues = maxValues_;
  while (!finished_) {
    std::string_view line;
    const auto status = framer.next(line);
    if (status == protocol::LineFramer::Status::line) {
      auto parsed = protocol::parseJson(line, limits);
      if (!parsed) co_return "a message is not valid JSON: " + parsed.error().detail;
      if (!parsed->is_object()) co_return "a message is not a JSON object";
      onMessage_(std::move(parsed->as_object()));
      continue;
    }
    if (status == protocol::LineFramer::Status::tooLong) {
      co_return "a message is longer than " + std::to_string(maxMessageBytes_) + " bytes";
    }
    auto space = framer.prepare(kReadChunk);
    auto [error, bytes] = co_await socket_.async_read_some(asio::buffer(space.data(), space.size()),
                                                           asio::as_tuple(asio::use_awaitable));
    framer.commit(bytes);
    if (error == asio::error::eof) co_return "end of stream";
    if (error) co_return "read failed: " + error.message();
  }
  co_return closeReason_;
}

void MessageChannel::send(const json::object& message, bool batch) {
  std::string text;
  protocol::appendJson(text, message);
  text.push_back('\n');
  {
    std::lock_guard lock(mutex_);
    if (closed_) return;
    std::string_view rest = text;
    if (!writing_ && !batch) {
      // Nothing queued or being written: straight to the socket from this thread, which spares
      // waking the strand's thread for the common small message. The strand's read on the same
      // socket does not mind; finish() closes the socket only after setting closed_ under
      // mutex_, so fd_ is still open here. What the socket does not take now goes the
      // asynchronous way, which also reports an error.
      const ssize_t sent = ::send(fd_, rest.data(), rest.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (sent == static_cast<ssize_t>(rest.size())) return;
      if (sent > 0) rest.remove_prefix(static_cast<std::size_t>(sent));
    }
    // What is being written counts too: it is held until the other side has read enough.
    if (outgoing_.size() + inflight_.size() + rest.size() <= maxQueuedBytes_) {
      outgoing_ += rest;
      if (writing_) return;
      writing_ = true;
      asio::post(strand_, [self = shared_from_this()] { self->flush(); });
      return;
    }
    // The other side reads nothing, or far too little: the channel ends rather than hold ever
    // more. Posted, never run here: the caller may hold locks its close handler takes.
    closed_ = true;
    outgoing_.clear();
    asio::post(strand_,
               [self = shared_from_this(),
                reason = "more than " + std::to_string(maxQueuedBytes_ >> 20) +
                         " MiB wait to be read by the other side"] { self->finish(reason); });
  }
}

std::size_t MessageChannel::queued() {
  std::lock_guard lock(mutex_);
  return outgoing_.size() + inflight_.size();
}

void MessageChannel::limitQueue(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  maxQueuedBytes_ = bytes;
}

void MessageChannel::flush() {
  {
    std::lock_guard lock(mutex_);
    if (closed_ || outgoing_.empty()) {
      writing_ = false;
      return;
    }
    inflight_.clear();
    // A burst's buffer is not kept once written (a host that read nothing for a while).
    if (inflight_.capacity() > (std::size_t{1} << 20)) inflight_.shrink_to_fit();
    inflight_.swap(outgoing_);
  }
  asio::async_write(socket_, asio::buffer(inflight_),
                    [self = shared_from_this()](boost::system::error_code error, std::size_t) {
                      if (error) {
                        self->finish("write failed: " + error.message());
                        return;
                      }
                      self->flush();
                    });
}

void MessageChannel::close(std::string reason) {
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    outgoing_.clear();
  }
  asio::dispatch(strand_,
                 [self = shared_from_this(), reason = std::move(reason)] { self->finish(reason); });
}

void MessageChannel::finish(const std::string& reason) {
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    outgoing_.clear();
  }
  if (finished_) return;
  finished_ = true;
  closeReason_ = reason;
  boost::system::error_code ignored;
  socket_.close(ignored);
  if (auto onClosed = std::move(onClosed_)) {
    onClosed_ = nullptr;
    try {
      onClosed(reason);
    } catch (const std::exception& e) {
      spdlog::error("runtime: a sandbox channel's close handler threw: {}", e.what());
    }
  }
}

}  // namespace toolhost::runtime
