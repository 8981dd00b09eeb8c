#include "daemon/session.h"

#include "daemon/errors.h"
#include "protocol/json_text.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

namespace toolhost::daemon {
namespace asio = boost::asio;
namespace json = boost::json;
using asio::use_awaitable;

namespace {
constexpr std::size_t kReadChunk = 64 * 1024;
constexpr std::size_t kWriteGatherBytes = 256 * 1024;
// Notifications beyond this many queued bytes mean the client has stopped reading.
constexpr std::size_t kMaxQueuedNotificationBytes = 64 * 1024 * 1024;
// Beyond this many bytes of answers not yet written, nothing more is read from the client (the
// answers of what is in flight still queue: at most max_in_flight of them).
constexpr std::size_t kMaxQueuedAnswerBytes = 8 * 1024 * 1024;
// Cancel notifications read under backpressure that must wait for the request held back.
constexpr std::size_t kMaxDeferredCancels = 256;
// Answers held, encoded and not yet read by their client, per connection and for the whole
// daemon: an answer that would pass either is replaced by an output-too-large error. Answers up
// to kAlwaysAnsweredBytes go whatever the daemon holds to a connection holding at most
// kAlwaysHeldBytes, so that every client that reads its answers makes progress; beyond that, a
// connection that does not read cannot hold more than its share (without it, 256 connections
// each holding a batch of 256 small answers were 4 GiB).
constexpr std::size_t kMaxHeldAnswerBytes = 64 * 1024 * 1024;
constexpr std::size_t kMaxDaemonAnswerBytes = 512 * 1024 * 1024;
constexpr std::size_t kAlwaysAnsweredBytes = 64 * 1024;
constexpr std::size_t kAlwaysHeldBytes = 1024 * 1024;
std::atomic<std::size_t> allHeldAnswerBytes{0};
constexpr auto as_tuple_awaitable = asio::as_tuple(use_awaitable);

// A request id as JSON text: its key for $/cancelRequest and its name in the log. Integers, the
// usual ids, without a serializer.
std::string idText(const json::value& id) {
  if (id.is_int64()) return std::to_string(id.get_int64());
  if (id.is_uint64()) return std::to_string(id.get_uint64());
  return protocol::writeJson(id);
}

void logIfThrew(std::uint64_t connection, const char* what, std::exception_ptr error) {
  if (!error) return;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    spdlog::error("conn={} {} ended with an exception: {}", connection, what, e.what());
  }
}
}  // namespace

Session::Session(Socket socket, std::uint64_t id, PeerCredentials peer, RoleSet roles,
                 Dispatcher& dispatcher, const protocol::WireLimits& limits)
    : socket_(std::move(socket)),
      id_(id),
      peer_(peer),
      roles_(roles),
      dispatcher_(dispatcher),
      limits_(limits),
      framer_(limits.maxMessageBytes),
      wake_(socket_.get_executor()),
      writeWake_(socket_.get_executor()) {}

asio::awaitable<void> Session::run() {
  auto self = shared_from_this();
  asio::co_spawn(socket_.get_executor(), writeLoop(self),
                 [id = id_](std::exception_ptr e) { logIfThrew(id, "writer", e); });
  co_await readLoop();
  // Answer what is in flight (unless the client is gone), then close.
  while (!peerGone_ && (inFlight_ > 0 || !queue_.empty() || writing_)) {
    watchHangup();
    co_await waitForWake();
  }
  stopWatchingHangup();
  if (peerGone_) cancelAll();
  while (!requests_.empty()) co_await waitForWake();
  boost::system::error_code ignored;
  socket_.shutdown(Socket::shutdown_both, ignored);
  socket_.close(ignored);
  writeWake_.cancel();
  spdlog::debug("conn={} closed", id_);
  runCloseHooks();
}

Session::~Session() {
  runCloseHooks();
  // Lines held back by this connection's budget that no later line of it will report.
  if (const std::uint64_t withheld = logBudget_.takeWithheld(); withheld > 0) {
    if (std::string note; allowClientLine(note)) {
      spdlog::warn("conn={} ended; {} line(s) about it before its end were not logged{}", id_,
                   withheld, note);
    }
  }
}

Session::AnswerCharge::AnswerCharge(std::size_t bytes) : bytes_(bytes) {
  allHeldAnswerBytes.fetch_add(bytes);
}

Session::AnswerCharge::~AnswerCharge() { allHeldAnswerBytes.fetch_sub(bytes_); }

std::size_t Session::AnswerCharge::total() { return allHeldAnswerBytes.load(); }

std::string Session::answerLine(const json::value& response) {
  std::string text = protocol::encodeLine(response);
  const std::size_t held = queuedBytes_ + batchBytes_;
  const std::size_t daemonHeld = AnswerCharge::total();
  // The daemon-wide bound does not apply to admins: other clients filling it must not cut the
  // operator off (an admin's connections still have the per-connection bound).
  const bool daemonRoom =
      roles_.has(Role::admin) || daemonHeld + text.size() <= kMaxDaemonAnswerBytes;
  if ((text.size() <= kAlwaysAnsweredBytes && (held <= kAlwaysHeldBytes || daemonRoom)) ||
      (held + text.size() <= kMaxHeldAnswerBytes && daemonRoom)) {
    return text;
  }
  const bool connection = held + text.size() > kMaxHeldAnswerBytes;
  const bool alone = text.size() > kMaxHeldAnswerBytes;
  if (std::string note; allowClientLine(logBudget_, note)) {
    spdlog::warn(
        "conn={} an answer of {} bytes was replaced by output-too-large: {} bytes of answers "
        "are waiting to be read {}{}",
        id_, text.size(), connection ? held : daemonHeld,
        connection ? "on this connection" : "in the daemon", note);
  }
  const json::value* id = response.is_object() ? response.as_object().if_contains("id") : nullptr;
  auto error = app_error::error(
      app_error::kOutputTooLarge, "output-too-large",
      "the answer is " + std::to_string(text.size()) + " bytes, " +
          (alone ? "more than any answer may hold (" + std::to_string(kMaxHeldAnswerBytes) +
                       " bytes); ask for less"
           : connection ? "and this connection already holds " + std::to_string(held) +
                              " bytes of answers it has not read (the limit is " +
                              std::to_string(kMaxHeldAnswerBytes) + ")"
                        : "and the daemon already holds " + std::to_string(daemonHeld) +
                              " bytes of answers its clients have not read (the limit is " +
                              std::to_string(kMaxDaemonAnswerBytes) + ")") +
          (alone ? "" : "; read the answers first, or ask for less at once"));
  return protocol::encodeLine(
      protocol::errorResponse(id != nullptr ? *id : json::value(nullptr), error));
}

void Session::holdInBatch(BatchState& batch, std::size_t index, const json::value& response) {
  std::string text = answerLine(response);
  text.pop_back();  // the LF: the entries are joined into one line
  batch.bytes += text.size();
  batchBytes_ += text.size();
  AnswerCharge charge(text.size());
  batch.responses[index] = HeldAnswer{std::move(text), std::move(charge)};
}

void Session::onClose(std::function<void()> hook) {
  if (closed_) {
    hook();
    return;
  }
  closeHooks_.push_back(std::move(hook));
}

void Session::runCloseHooks() {
  closed_ = true;
  auto hooks = std::move(closeHooks_);
  closeHooks_.clear();
  for (auto& hook : hooks) {
    try {
      hook();
    } catch (const std::exception& e) {
      spdlog::error("conn={} a close hook threw: {}", id_, e.what());
    }
  }
}

asio::awaitable<void> Session::waitForWake() {
  wake_.expires_at(asio::steady_timer::time_point::max());
  co_await wake_.async_wait(as_tuple_awaitable);
}

void Session::wake() { wake_.cancel(); }

asio::awaitable<void> Session::readLoop() {
  for (;;) {
    std::string_view line;
    for (;;) {
      if (stopReading_ || peerGone_) co_return;
      auto status = framer_.next(line);
      if (status == protocol::LineFramer::Status::needMore) break;
      if (status == protocol::LineFramer::Status::tooLong) {
        auto error = protocol::makeError(
            protocol::rpc_error::kInvalidRequest, "limit-exceeded",
            "a message is longer than the limit of " + std::to_string(limits_.maxMessageBytes) +
                " bytes; the connection is closed");
        if (std::string note; allowClientLine(note)) {
          spdlog::warn("conn={} message over {} bytes; closing{}", id_, limits_.maxMessageBytes,
                       note);
        }
        enqueue(protocol::encodeLine(protocol::errorResponse(nullptr, error)), 0);
        stopReading_ = true;
        co_return;
      }
      auto decoded = co_await decode(line);
      // A large line is parsed elsewhere: the connection may have ended meanwhile. One whose
      // shutdown began is still served what it sent before (when there is room for it).
      if (peerGone_ || aborted_) co_return;
      // A cancel notification takes no slot and gets no answer: served even when the connection
      // is full, so that a client can still stop what it waits for.
      if (isCancelNotification(decoded)) {
        handle(std::move(decoded), 1);  // its slot is released at once
        continue;
      }
      const std::size_t slots = slotsFor(decoded);
      // Backpressure: nothing more is served until answers are written, except the cancel
      // notifications that follow.
      bool parkedCancelled = false;
      bool eofSeen = false;
      notCancelAt_ = std::string::npos;
      while (!roomFor(slots) && !stopReading_ && !peerGone_) {
        if (serveCancelNotifications(decoded)) {
          parkedCancelled = true;
          break;
        }
        watchHangup();
        if (!eofSeen) watchReadable();
        co_await waitForWake();
        if (readableFired_) eofSeen = !readAvailable();
      }
      stopWatchingHangup();
      stopWatchingReadable();
      if (peerGone_ || aborted_ || (stopReading_ && !roomFor(slots))) co_return;
      if (!parkedCancelled) handle(std::move(decoded), slots);
      // Cancels that named what was not running yet, read while it waited.
      auto deferred = std::move(deferredCancels_);
      deferredCancels_.clear();
      for (auto& cancel : deferred) handle(std::move(cancel), 1);
    }
    if (stopReading_ || peerGone_) co_return;
    auto space = framer_.prepare(kReadChunk);
    auto [ec, n] = co_await socket_.async_read_some(asio::buffer(space.data(), space.size()),
                                                    as_tuple_awaitable);
    framer_.commit(n);
    if (ec) {
      if (ec == asio::error::eof && !stopReading_) {
        // A last line without its newline still counts.
        if (framer_.buffered() > 0) {
          framer_.append("\n");
          stopReading_ = true;  // serve what is buffered, then stop
          std::string_view last;
          while (framer_.next(last) == protocol::LineFramer::Status::line) {
            auto decoded = co_await decode(last);
            const std::size_t slots = slotsFor(decoded);
            while (!roomFor(slots) && !peerGone_ && !aborted_) {
              watchHangup();
              co_await waitForWake();
            }
            if (peerGone_ || aborted_) break;
            handle(std::move(decoded), slots);
          }
        }
        // EOF with POLLHUP: the client closed, not just its sending half.
        if (peerHungUp()) peerGone();
      } else if (ec != asio::error::eof && ec != asio::error::operation_aborted) {
        spdlog::debug("conn={} read failed: {}", id_, ec.message());
        peerGone();
      }
      stopReading_ = true;
      co_return;
    }
  }
}

asio::awaitable<Session::Decoded> Session::decode(std::string_view line) {
  if (largeDecodes_ == nullptr || line.size() < kInlineDecodeBytes) {
    co_return protocol::decodeMessage(line, limits_);
  }
  // `line` stays put meanwhile: only this coroutine reads the framer. A parse still queued when
  // the connection is aborted or gone is skipped (shutdown does not wait for it).
  try {
    co_return co_await largeDecodes_->run([&]() -> Decoded {
      if (abandonDecodes_.load() || allDecodesAbandoned_.load()) {
        return protocol::makeError(protocol::rpc_error::kInternalError, "internal",
                                   "the request was not read: the connection is closing");
      }
      return protocol::decodeMessage(line, limits_);
    });
  } catch (const boost::system::system_error&) {
    // The job was abandoned (the connection is being torn down): nothing is served from it.
    stopReading_ = true;
    co_return protocol::makeError(protocol::rpc_error::kInternalError, "internal",
                                  "the request was not read: the connection is closing");
  }
}

void Session::watchHangup() {
  if (watchingHangup_ || peerGone_ || !socket_.is_open()) return;
  watchingHangup_ = true;
  socket_.async_wait(
      Socket::wait_error,
      asio::bind_cancellation_slot(hangupWatch_.slot(),
                                   [self = shared_from_this()](boost::system::error_code ec) {
                                     self->watchingHangup_ = false;
                                     if (ec == asio::error::operation_aborted || self->peerGone_)
                                       return;
                                     // HUP (both directions closed) or an error: nobody reads the
                                     // answers.
                                     if (self->peerHungUp()) {
                                       self->peerGone();
                                     } else {
                                       self->watchHangup();
                                     }
                                   }));
  // epoll reports the hang-up as an edge: one that came before the wait was queued shows here.
  if (peerHungUp()) peerGone();
}

void Session::stopWatchingHangup() {
  // The wait would keep every later read from completing at once (Asio reads speculatively only
  // while no such wait is queued).
  if (watchingHangup_) hangupWatch_.emit(asio::cancellation_type::total);
}

bool Session::isCancelNotification(const Decoded& decoded) {
  if (!decoded || decoded->batch) return false;
  const auto* request = std::get_if<protocol::Request>(&decoded->entries.front());
  return request != nullptr && request->method == "$/cancelRequest" && !request->id;
}

bool Session::serveCancelNotifications(const Decoded& parked) {
  // Nothing new since the line after the parked one was found to be something else.
  if (framer_.buffered() == notCancelAt_) return false;
  const protocol::Request* parkedRequest =
      parked && !parked->batch ? std::get_if<protocol::Request>(&parked->entries.front()) : nullptr;
  std::string_view next;
  while (framer_.peek(next) == protocol::LineFramer::Status::line) {
    if (next.size() >= kInlineDecodeBytes) {  // no cancel is that long: not parsed here
      notCancelAt_ = framer_.buffered();
      return false;
    }
    auto decoded = protocol::decodeMessage(next, limits_);
    const json::value* target = nullptr;
    if (isCancelNotification(decoded)) {
      const auto& params = std::get<protocol::Request>(decoded->entries.front()).params;
      target = params.is_object() ? params.as_object().if_contains("id") : nullptr;
    }
    const bool valid =
        target != nullptr && (target->is_string() || target->is_number() || target->is_null());
    const bool namesParked = valid && parkedRequest != nullptr && parkedRequest->id &&
                             idText(*parkedRequest->id) == idText(*target);
    const bool namesRunning = valid && requestKeysById_.count(idText(*target)) > 0;
    // Anything else waits its turn, in order: a cancel naming what is not running yet (an
    // entry of a parked batch, a request still to come) must come after it; an answer to the
    // parked request past the limits waits for room (at most one answer goes over them).
    const bool roomForAnswer =
        inFlight_ <= limits_.maxInFlight && queuedBytes_ <= kMaxQueuedAnswerBytes;
    if (valid && !namesRunning && !namesParked && deferredCancels_.size() < kMaxDeferredCancels) {
      // Names what is not running yet (an entry of a parked batch): served right after the
      // parked message, in order; the cancels behind it still go ahead.
      framer_.skip();
      deferredCancels_.push_back(std::move(decoded));
      continue;
    }
    if (!(namesRunning || (namesParked && roomForAnswer))) {
      notCancelAt_ = framer_.buffered();
      return false;
    }
    framer_.skip();
    if (namesParked) {
      // The parked request never started: it is answered as cancelled, taking the slot its
      // answer needs past the limit. Running requests with the same id are cancelled too.
      spdlog::debug("conn={} $/cancelRequest {}: cancelled before it was served", id_,
                    idText(*target));
      ++inFlight_;
      enqueue(answerLine(protocol::errorResponse(
                  *parkedRequest->id,
                  app_error::error(app_error::kCancelled, "cancelled",
                                   "the request was cancelled before it was served"))),
              1);
      if (namesRunning) handle(std::move(decoded), 1);
      return true;
    }
    handle(std::move(decoded), 1);  // a notification: its slot is released at once
  }
  return false;
}

void Session::watchReadable() {
  std::string_view next;
  // Only while no other line waits here: what is read then is bounded by one line's limit.
  if (watchingReadable_ || peerGone_ || !socket_.is_open() ||
      framer_.peek(next) != protocol::LineFramer::Status::needMore) {
    return;
  }
  watchingReadable_ = true;
  readableFired_ = false;
  const std::uint64_t generation = ++readableGeneration_;
  socket_.async_wait(Socket::wait_read,
                     asio::bind_cancellation_slot(
                         readableWatch_.slot(),
                         [self = shared_from_this(), generation](boost::system::error_code ec) {
                           // A wait stopped meanwhile (another may be queued already).
                           if (generation != self->readableGeneration_) return;
                           self->watchingReadable_ = false;
                           if (ec) return;
                           self->readableFired_ = true;
                           self->wake();
                         }));
}

void Session::stopWatchingReadable() {
  // As for the hang-up watch: a queued wait would keep the read loop's reads from completing
  // at once. Its completion, if still to run, is stale from here.
  if (!watchingReadable_) return;
  watchingReadable_ = false;
  ++readableGeneration_;
  readableWatch_.emit(asio::cancellation_type::total);
}

bool Session::readAvailable() {
  readableFired_ = false;
  boost::system::error_code ec;
  const std::size_t available = socket_.available(ec);
  if (ec || available == 0) return false;
  auto space = framer_.prepare(std::min(available, kReadChunk));
  const std::size_t n = socket_.read_some(asio::buffer(space.data(), space.size()), ec);
  framer_.commit(ec ? 0 : n);
  return !ec;
}

bool Session::peerHungUp() const {
  pollfd descriptor{const_cast<Socket&>(socket_).native_handle(), 0, 0};
  return ::poll(&descriptor, 1, 0) == 1 && (descriptor.revents & (POLLHUP | POLLERR)) != 0;
}

std::size_t Session::slotsFor(const Decoded& decoded) {
  // Each entry of a batch is a request in flight, and an answer to hold until it is written.
  return decoded && decoded->batch ? std::max<std::size_t>(decoded->entries.size(), 1) : 1;
}

bool Session::roomFor(std::size_t slots) const {
  // A batch larger than the whole limit is served alone.
  const bool slotsFree = inFlight_ == 0 || inFlight_ + slots <= limits_.maxInFlight;
  return slotsFree && queuedBytes_ <= kMaxQueuedAnswerBytes;
}

void Session::handle(Decoded decoded, std::size_t slots) {
  inFlight_ += slots;
  if (!decoded) {
    if (std::string note; allowClientLine(logBudget_, note)) {
      spdlog::warn("conn={} {} ({}){}", id_, logText(decoded.error().detail, 300),
                   decoded.error().kind, note);
    }
    enqueue(protocol::encodeLine(protocol::errorResponse(nullptr, decoded.error())), slots);
    return;
  }
  if (!decoded->batch) {
    auto& entry = decoded->entries.front();
    if (auto* invalid = std::get_if<protocol::InvalidEntry>(&entry)) {
      if (std::string note; allowClientLine(logBudget_, note)) {
        spdlog::warn("conn={} invalid request: {}{}", id_, logText(invalid->error.detail, 300),
                     note);
      }
      enqueue(protocol::encodeLine(protocol::errorResponse(invalid->id, invalid->error)), 1);
      return;
    }
    spawnRequest(std::move(std::get<protocol::Request>(entry)), nullptr, 0);
    return;
  }
  auto batch = std::make_shared<BatchState>();
  batch->slots = slots;
  batch->responses.resize(decoded->entries.size());
  // One more than the entries, held until every entry is spawned: an entry may finish inside
  // spawnRequest (a method that never suspends, $/cancelRequest), and the batch is answered
  // once, after the last.
  batch->remaining = decoded->entries.size() + 1;
  for (std::size_t i = 0; i < decoded->entries.size(); ++i) {
    auto& entry = decoded->entries[i];
    if (auto* invalid = std::get_if<protocol::InvalidEntry>(&entry)) {
      holdInBatch(*batch, i, protocol::errorResponse(invalid->id, invalid->error));
      --batch->remaining;
    } else {
      spawnRequest(std::move(std::get<protocol::Request>(entry)), batch, i);
    }
  }
  if (--batch->remaining == 0) finishBatch(*batch);
}

bool Session::cancelById(const json::value& id) {
  auto [begin, end] = requestKeysById_.equal_range(idText(id));
  bool found = false;
  for (auto it = begin; it != end; ++it) {
    if (auto request = requests_.find(it->second); request != requests_.end()) {
      request->second->emit(asio::cancellation_type::terminal);
      found = true;
    }
  }
  return found;
}

void Session::spawnRequest(protocol::Request request, std::shared_ptr<BatchState> batch,
                           std::size_t index) {
  // $/cancelRequest {id} is handled here, on the connection, not by the method table: it reaches
  // only this connection's requests.
  if (request.method == "$/cancelRequest") {
    const auto* target = request.params.is_object() ? request.params.as_object().if_contains("id") : nullptr;
    std::optional<json::value> response;
    if (target == nullptr || !(target->is_string() || target->is_number() || target->is_null())) {
      if (request.id) {
        response = protocol::errorResponse(
            *request.id,
            protocol::makeError(
                protocol::rpc_error::kInvalidParams, "invalid-params",
                "params.id: the id (string, number or null) of a request on this connection"));
      }
    } else {
      bool cancelled = cancelById(*target);
      spdlog::debug("conn={} $/cancelRequest {}: {}", id_, protocol::writeJson(*target),
                    cancelled ? "cancelled" : "no such request in flight");
      if (request.id) {
        response = protocol::resultResponse(*request.id, json::object{{"cancelled", cancelled}});
      }
    }
    if (batch) {
      if (response) holdInBatch(*batch, index, *response);
      if (--batch->remaining == 0) finishBatch(*batch);
    } else if (response) {
      enqueue(answerLine(*response), 1);
    } else {
      releaseSlots(1);
    }
    return;
  }
  auto key = nextRequestKey_++;
  auto signal = std::make_shared<asio::cancellation_signal>();
  requests_.emplace(key, signal);
  std::optional<std::string> text;
  if (request.id) {
    text = idText(*request.id);
    requestKeysById_.emplace(*text, key);
  }
  asio::co_spawn(socket_.get_executor(),
                 serveRequest(shared_from_this(), std::move(request), std::move(text),
                              std::move(batch), index, key),
                 // The signal holds the request coroutine's cancellation state, which the
                 // coroutine touches until its very end (after serveRequest() erased it from
                 // requests_): the handler keeps it, and lets it go only in a later handler on
                 // the strand, once the coroutine is gone.
                 asio::bind_cancellation_slot(
                     signal->slot(),
                     [id = id_, signal, executor = socket_.get_executor()](std::exception_ptr e) {
                       logIfThrew(id, "request", e);
                       asio::post(executor, [signal] {});
                     }));
}

asio::awaitable<void> Session::serveRequest(std::shared_ptr<Session> self, protocol::Request request,
                                            std::optional<std::string> idText,
                                            std::shared_ptr<BatchState> batch, std::size_t index,
                                            std::uint64_t key) {
  CallContext context;
  context.connectionId = id_;
  context.requestId = logText(idText.value_or("-"), 64);  // for log lines
  context.logBudget = &logBudget_;
  context.peer = peer_;
  context.roles = roles_;
  context.session = self;
  auto response = co_await dispatcher_.serve(context, std::move(request));
  requests_.erase(key);
  if (idText) {
    auto [begin, end] = requestKeysById_.equal_range(*idText);
    for (auto it = begin; it != end; ++it) {
      if (it->second == key) {
        requestKeysById_.erase(it);
        break;
      }
    }
  }
  if (batch) {
    if (response && !peerGone_) holdInBatch(*batch, index, *response);
    if (--batch->remaining == 0) finishBatch(*batch);
  } else if (response && !peerGone_) {
    enqueue(answerLine(*response), 1);
  } else {
    releaseSlots(1);
  }
  wake();
}

void Session::finishBatch(BatchState& batch) {
  std::string line;
  bool any = false;
  if (!peerGone_) {
    line.reserve(batch.bytes + batch.responses.size() + 2);
    line += '[';
    for (const auto& response : batch.responses) {
      if (!response) continue;
      if (any) line += ',';
      line += response->text;
      any = true;
    }
    line += "]\n";
  }
  batchBytes_ -= std::min(batch.bytes, batchBytes_);
  batch.bytes = 0;
  batch.responses.clear();
  // A batch of notifications only is answered with nothing at all.
  if (!any || peerGone_) {
    releaseSlots(batch.slots);
    return;
  }
  enqueue(std::move(line), batch.slots);
}

void Session::enqueue(std::string bytes, std::size_t slots) {
  if (peerGone_) {
    releaseSlots(slots);
    return;
  }
  queuedBytes_ += bytes.size();
  AnswerCharge charge(bytes.size());
  queue_.push_back(Outgoing{std::move(bytes), slots, std::move(charge)});
  writeWake_.cancel();
}

void Session::releaseSlots(std::size_t slots) {
  inFlight_ -= std::min(slots, inFlight_);
  wake();
}

asio::awaitable<void> Session::writeLoop([[maybe_unused]] std::shared_ptr<Session> self) {
  std::vector<Outgoing> sending;
  std::vector<asio::const_buffer> buffers;
  for (;;) {
    while (queue_.empty()) {
      if (!socket_.is_open() || peerGone_) co_return;
      if (stopReading_ && inFlight_ == 0 && requests_.empty()) {
        wake();  // let run() see the drained queue
      }
      writeWake_.expires_at(asio::steady_timer::time_point::max());
      co_await writeWake_.async_wait(as_tuple_awaitable);
    }
    sending.clear();
    buffers.clear();
    std::size_t total = 0;
    while (!queue_.empty() && (sending.empty() || total < kWriteGatherBytes)) {
      total += queue_.front().bytes.size();
      sending.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    for (const auto& item : sending) buffers.emplace_back(asio::buffer(item.bytes));
    writing_ = true;
    auto [ec, n] = co_await asio::async_write(socket_, buffers, as_tuple_awaitable);
    writing_ = false;
    queuedBytes_ -= std::min(total, queuedBytes_);  // peerGone() may have zeroed it meanwhile
    std::size_t slots = 0;
    for (const auto& item : sending) slots += item.slots;
    // Written: the bytes go now (and with them their share of the daemon's answer budget), not
    // when the next write begins.
    sending.clear();
    buffers.clear();
    releaseSlots(slots);
    if (ec) {
      spdlog::debug("conn={} write failed: {}", id_, ec.message());
      peerGone();
      co_return;
    }
  }
}

void Session::cancelAll() {
  for (auto& [key, signal] : requests_) signal->emit(asio::cancellation_type::terminal);
}

void Session::peerGone() {
  if (peerGone_) return;
  peerGone_ = true;
  abandonDecodes_ = true;
  stopReading_ = true;
  if (!requests_.empty()) {
    spdlog::debug("conn={} client gone; cancelling {} request(s)", id_, requests_.size());
  }
  cancelAll();
  for (auto& item : queue_) inFlight_ -= std::min(item.slots, inFlight_);
  queue_.clear();
  queuedBytes_ = 0;
  boost::system::error_code ignored;
  socket_.cancel(ignored);
  writeWake_.cancel();
  wake();
}

void Session::notify(json::object message) {
  asio::post(socket_.get_executor(), [self = shared_from_this(), message = std::move(message)]() {
    if (self->peerGone_ || !self->socket_.is_open()) return;
    if (self->queuedBytes_ > kMaxQueuedNotificationBytes) {
      if (std::string note; allowClientLine(note)) {
        spdlog::warn("conn={} is not reading its notifications; disconnecting{}", self->id_, note);
      }
      self->peerGone();
      return;
    }
    self->enqueue(protocol::encodeLine(message), 0);
  });
}

void Session::beginShutdown() {
  asio::post(socket_.get_executor(), [self = shared_from_this()]() {
    if (self->stopReading_) return;
    self->stopReading_ = true;
    boost::system::error_code ignored;
    // Ends the pending read with EOF while writes continue.
    self->socket_.shutdown(Socket::shutdown_receive, ignored);
    self->wake();
  });
}

void Session::drop() {
  asio::post(socket_.get_executor(), [self = shared_from_this()]() { self->peerGone(); });
}

void Session::abort() {
  // Every request still running is cancelled and answered as such (-32009): the client learns
  // what became of it. The connection ends once those answers are written; one whose client
  // does not read them is left to the process's exit.
  asio::post(socket_.get_executor(), [self = shared_from_this()]() {
    self->stopReading_ = true;
    self->aborted_ = true;  // not even the last line after an EOF is served now
    self->abandonDecodes_ = true;
    boost::system::error_code ignored;
    self->socket_.shutdown(Socket::shutdown_receive, ignored);
    self->cancelAll();
    self->wake();
  });
}

}  // namespace toolhost::daemon
