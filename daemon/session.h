// One client connection. Everything in a Session runs on its own strand: one reader coroutine
// that frames and decodes lines, one coroutine per request, and one writer that drains a bounded
// outgoing queue. Public members marked thread-safe post onto that strand.
#pragma once

#include "daemon/disk_thread.h"
#include "daemon/dispatcher.h"
#include "daemon/roles.h"
#include "protocol/framing.h"
#include "protocol/jsonrpc.h"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/json/object.hpp>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace toolhost::daemon {

class Session : public std::enable_shared_from_this<Session> {
 public:
  using Socket = boost::asio::local::stream_protocol::socket;

  Session(Socket socket, std::uint64_t id, PeerCredentials peer, RoleSet roles,
          Dispatcher& dispatcher, const protocol::WireLimits& limits);
  ~Session();

  // Lines of at least kInlineDecodeBytes are parsed on `thread` instead of the I/O thread, where
  // parsing megabytes (seconds, for millions of small values) would hold up every connection.
  // Set before run(); without it, every line is parsed where it is read.
  void decodeLargeOn(DiskThread* thread) { largeDecodes_ = thread; }
  static constexpr std::size_t kInlineDecodeBytes = 256 * 1024;
  // From now on, every session's large parses still queued are skipped (the daemon is exiting).
  static void abandonAllDecodes() { allDecodesAbandoned_ = true; }

  // Serves the connection until it ends. Must be spawned on the socket's executor (a strand).
  boost::asio::awaitable<void> run();

  // The limits this connection was accepted with (a reload changes them for later ones only).
  const protocol::WireLimits& limits() const { return limits_; }

  // Sends a server-to-client notification. Thread-safe. A client that stops reading while
  // notifications pile up beyond a bound is disconnected.
  void notify(boost::json::object message);
  // Stops reading new requests; the connection closes once those in flight are answered.
  // Thread-safe.
  void beginShutdown();
  // Cancels everything in flight; the connection closes once their answers (-32009) are
  // written. Thread-safe.
  void abort();
  // Closes now, dropping answers not yet written (a client that does not read). Thread-safe.
  void drop();
  // Runs `hook` once the connection has closed (or at once if it already has). Call on the
  // session's strand, e.g. from a method handler. A hook must not hold the Session.
  void onClose(std::function<void()> hook);
  // This connection serves other connections' calls (a popup host, an approver): at shutdown it
  // keeps reading until every other connection has ended, so that calls waiting on a person
  // can still finish within the grace. Thread-safe.
  void servesOthers() { servesOthers_ = true; }
  bool servingOthers() const { return servesOthers_; }

  std::uint64_t id() const { return id_; }
  Socket::executor_type executor() { return socket_.get_executor(); }
  const PeerCredentials& peer() const { return peer_; }
  RoleSet roles() const { return roles_; }
  // Bytes of answers every session holds, encoded and not yet written. Any thread.
  static std::size_t heldAnswerBytes() { return AnswerCharge::total(); }

 private:
  // Answer bytes held (encoded, not yet written) counted in every session's total, which bounds
  // them for the whole daemon; given back when the bytes are dropped.
  class AnswerCharge {
   public:
    explicit AnswerCharge(std::size_t bytes = 0);
    AnswerCharge(AnswerCharge&& other) noexcept : bytes_(std::exchange(other.bytes_, 0)) {}
    AnswerCharge& operator=(AnswerCharge&& other) noexcept {
      std::swap(bytes_, other.bytes_);
      return *this;
    }
    ~AnswerCharge();
    // Bytes held by every session of the process.
    static std::size_t total();

   private:
    std::size_t bytes_ = 0;
  };
  // A batch entry's answer, encoded as it finished (without the line's LF).
  struct HeldAnswer {
    std::string text;
    AnswerCharge charge;
  };
  struct BatchState {
    std::vector<std::optional<HeldAnswer>> responses;
    std::size_t remaining = 0;
    std::size_t slots = 0;  // in-flight slots it holds: one per entry
    std::size_t bytes = 0;  // of its answers so far (in the session's batchBytes_)
  };
  using Decoded = boost::system::result<protocol::Incoming, protocol::RpcError>;
  struct Outgoing {
    std::string bytes;
    std::size_t slots = 0;  // in-flight slots released once written
    AnswerCharge charge;
  };

  boost::asio::awaitable<void> readLoop();
  // One line decoded: where it is read, or on largeDecodes_ when it is large.
  boost::asio::awaitable<Decoded> decode(std::string_view line);
  boost::asio::awaitable<void> writeLoop(std::shared_ptr<Session> self);
  // idText: the request's id as JSON text (its key in requestKeysById_), if it has one.
  boost::asio::awaitable<void> serveRequest(std::shared_ptr<Session> self, protocol::Request request,
                                            std::optional<std::string> idText,
                                            std::shared_ptr<BatchState> batch, std::size_t index,
                                            std::uint64_t key);
  boost::asio::awaitable<void> waitForWake();

  // In-flight slots a decoded line takes, whether they are free, and serving it with them.
  static std::size_t slotsFor(const Decoded& decoded);
  bool roomFor(std::size_t slots) const;
  void handle(Decoded decoded, std::size_t slots);
  void spawnRequest(protocol::Request request, std::shared_ptr<BatchState> batch, std::size_t index);
  void finishBatch(BatchState& batch);
  // The answer as a JSON line, or an output-too-large error in its place when this connection
  // or the daemon already holds too many bytes of answers nobody read.
  std::string answerLine(const boost::json::value& response);
  // Keeps an entry's answer until its batch is answered.
  void holdInBatch(BatchState& batch, std::size_t index, const boost::json::value& response);
  void enqueue(std::string bytes, std::size_t slots);
  void releaseSlots(std::size_t slots);
  void wake();
  void cancelAll();
  // $/cancelRequest: cancels this connection's in-flight request with that id; true if found.
  bool cancelById(const boost::json::value& id);
  void peerGone();
  bool peerHungUp() const;
  // While nothing is read from the client (backpressure, or after its EOF) its hang-up would go
  // unseen until a write failed: these watch for it meanwhile (epoll's HUP, no read).
  void watchHangup();
  void stopWatchingHangup();
  // Under backpressure, cancel notifications still get through: serves those buffered right
  // after the parked message, up to the first line that is anything else; true when one
  // cancelled the parked message itself, which has then been answered. The socket is watched
  // for more of them only while no such other line is buffered, so that nothing piles up.
  bool serveCancelNotifications(const Decoded& parked);
  static bool isCancelNotification(const Decoded& decoded);
  void watchReadable();
  void stopWatchingReadable();
  // Reads what the socket holds now, without waiting; false when it was readable with nothing to
  // read (the client's EOF: the read loop finds it once there is room).
  bool readAvailable();
  void runCloseHooks();

  Socket socket_;
  std::uint64_t id_;
  PeerCredentials peer_;
  RoleSet roles_;
  Dispatcher& dispatcher_;
  protocol::WireLimits limits_;
  DiskThread* largeDecodes_ = nullptr;
  // Set when the connection is aborted or its client gone: large parses still queued are skipped.
  std::atomic<bool> abandonDecodes_{false};
  static inline std::atomic<bool> allDecodesAbandoned_{false};
  protocol::LineFramer framer_;
  LogBudget logBudget_;  // lines about this connection's bad input and failed requests

  std::atomic<bool> servesOthers_{false};
  std::size_t inFlight_ = 0;
  bool stopReading_ = false;  // shutdown, over-long line, or EOF
  bool peerGone_ = false;     // the client is gone: cancel, never write again
  bool writing_ = false;
  bool watchingHangup_ = false;
  boost::asio::cancellation_signal hangupWatch_;
  bool watchingReadable_ = false;
  bool readableFired_ = false;
  std::uint64_t readableGeneration_ = 0;
  // framer_.buffered() when the line after the parked one was last found not to be a cancel
  // that may go ahead of it (npos: not looked at since it was parked).
  std::size_t notCancelAt_ = std::string::npos;
  bool aborted_ = false;                  // the shutdown's grace ran out: nothing more is served
  std::vector<Decoded> deferredCancels_;  // see serveCancelNotifications
  boost::asio::cancellation_signal readableWatch_;
  boost::asio::steady_timer wake_;       // reader/drain waiting for a slot or the queue
  boost::asio::steady_timer writeWake_;  // writer waiting for output
  std::deque<Outgoing> queue_;
  std::size_t queuedBytes_ = 0;
  std::size_t batchBytes_ = 0;  // answers of batch entries held until their batch is answered
  std::uint64_t nextRequestKey_ = 1;
  std::map<std::uint64_t, std::shared_ptr<boost::asio::cancellation_signal>> requests_;
  std::multimap<std::string, std::uint64_t> requestKeysById_;  // JSON id text -> request key
  bool closed_ = false;
  std::vector<std::function<void()>> closeHooks_;
};

}  // namespace toolhost::daemon
