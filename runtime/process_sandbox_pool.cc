#include "runtime/process_sandbox_pool.h"

#include "runtime/call_state.h"
#include "runtime/message_channel.h"
#include "runtime/sandbox_protocol.h"
#include "runtime/worker_threads.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/array.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <unordered_map>

extern char** environ;

namespace toolhost::runtime {
namespace asio = boost::asio;
namespace json = boost::json;

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Revisions whose Tool a host keeps cached (sent once, then named by revision).
constexpr std::size_t kMaxCachedTools = 256;
// How long a new host has to answer its first ping (it starts V8 meanwhile).
constexpr milliseconds kStartupTimeout{10000};
constexpr int kHostThreads = 2;
// Quick requests (resolveInvocation, createSubtasks) read task lineages, which can take seconds
// for a long one: on a thread of their own, they never delay other tools' operations and aborts.
constexpr int kQuickRequestThreads = 1;

// How long an honest host takes at most to answer a cancel: a call not inside V8 at that moment
// is answered at once; one inside V8 is terminated, or reported stalled within the grace (plus
// the host's polling, a quarter of the grace at most); the second grace and the second are
// slack for a loaded machine. A host past it is holding the call: it is killed.
Clock::duration cancelAnswerTime(Clock::duration grace) {
  return 2 * grace + std::chrono::seconds(1);
}

// When a cancelled call counts as held (its process is killed): past cancelAnswerTime, once the
// host has also been silent for the grace. A host that goes on sending messages is working
// through what the daemon sent before the cancel (large calls queued behind one another: the
// cancel is read only after them), not holding the call; that lasts until the call is late at
// the latest.
Clock::time_point heldAt(Clock::time_point cancelDeadline, Clock::time_point heard,
                         Clock::time_point late, Clock::duration grace) {
  if (cancelDeadline == Clock::time_point::max()) return cancelDeadline;
  return std::max(cancelDeadline, std::min(heard + grace, late));
}

const char* const kEnvironmentKept[] = {
    "TZ", "LANG", "LC_ALL", "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "TSAN_OPTIONS"};

std::uint64_t stableHash(std::string_view text) {
  std::uint64_t hash = 14695981039346656037ull;  // FNV-1a
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

std::int64_t millisBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration_cast<milliseconds>(to - from).count();
}

std::string describeStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    const char* name = ::sigdescr_np(signal);
    return "killed by signal " + std::to_string(signal) +
           (name ? std::string(" (") + name + ")" : "");
  }
  return "ended with status " + std::to_string(status);
}

CallOutcome failedOutcome(const registry::ToolRevisionPtr& tool, CallError error) {
  CallOutcome outcome;
  outcome.revision = tool ? tool->revision : "";
  outcome.result = std::move(error);
  return outcome;
}

// What to say when a thread could not be started.
std::runtime_error threadStartFailure(const char* what, const std::system_error& error) {
  return std::runtime_error(std::string("could not start a thread for ") + what + ": " +
                            error.what() + threadLimitHint(error.code()));
}

// An io_context run by `count` threads, as asio::thread_pool, except when a thread cannot be
// started: Boost 1.81's thread_pool constructor then waits forever for the threads it did start
// (they run until their work ends, and it never does); this one stops them and throws.
class ThreadPool {
 public:
  ThreadPool(int count, const char* what) {
    try {
      for (int i = 0; i < count; ++i) threads_.emplace_back([this] { io_.run(); });
    } catch (const std::system_error& error) {
      io_.stop();
      for (auto& thread : threads_) thread.join();
      throw threadStartFailure(what, error);
    }
  }
  ~ThreadPool() {
    io_.stop();
    join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  asio::io_context::executor_type get_executor() { return io_.get_executor(); }
  // Lets the threads end once everything queued has run, and waits for them.
  void join() {
    work_.reset();
    for (auto& thread : threads_) {
      if (thread.joinable()) thread.join();
    }
  }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_{io_.get_executor()};
  std::vector<std::thread> threads_;
};

// What a host writes to its stdout and stderr (its log lines, and what V8 or a sanitizer prints
// as it aborts) comes through a pipe and is logged here. A host never holds the daemon's own
// stderr: a terminal it could read from or reconfigure, a log file it could truncate, the
// journal's socket it could shut down. Lines are cut, stripped of control characters and
// rate-limited, and the pipe read at a bounded rate, so that a host taken over can neither
// flood nor forge the daemon's log, nor keep its I/O thread busy.
class HostOutput : public std::enable_shared_from_this<HostOutput> {
 public:
  static constexpr std::size_t kMaxLineBytes = 4096;
  static constexpr int kMaxLinesPerSecond = 200;
  // Past this in a second, the pipe is not read until the second is over (the host's writes
  // wait): a host cannot keep the daemon's I/O thread busy scanning its output.
  static constexpr std::size_t kMaxBytesPerSecond = std::size_t{1} << 20;

  HostOutput(const asio::any_io_executor& executor, int fd, unsigned slot, pid_t pid)
      : pipe_(asio::make_strand(executor), fd), slot_(slot), pid_(pid) {}

  void start() { asio::co_spawn(pipe_.get_executor(), read(shared_from_this()), asio::detached); }

 private:
  asio::awaitable<void> read([[maybe_unused]] std::shared_ptr<HostOutput> self) {
    std::string pending;
    std::array<char, 16 * 1024> chunk;
    bool skipping = false;  // the rest of a line already cut
    for (;;) {
      auto [error, n] =
          co_await pipe_.async_read_some(asio::buffer(chunk), asio::as_tuple(asio::use_awaitable));
      if (error) break;
      roll(Clock::now());
      bytesInWindow_ += n;
      pending.append(chunk.data(), n);
      std::size_t start = 0;
      for (std::size_t end; (end = pending.find('\n', start)) != std::string::npos;
           start = end + 1) {
        if (!skipping) line(std::string_view(pending).substr(start, end - start));
        skipping = false;
      }
      pending.erase(0, start);
      if (pending.size() > kMaxLineBytes) {
        if (!skipping) line(pending);
        skipping = true;
        pending.clear();
      }
      if (bytesInWindow_ > kMaxBytesPerSecond) {
        asio::steady_timer pause(pipe_.get_executor(), windowStart_ + std::chrono::seconds(1));
        co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
      }
    }
    if (!pending.empty() && !skipping) line(pending);
    reportDropped();
  }

  // A new second: its budgets start again.
  void roll(Clock::time_point now) {
    if (now - windowStart_ < std::chrono::seconds(1)) return;
    reportDropped();
    windowStart_ = now;
    inWindow_ = 0;
    bytesInWindow_ = 0;
  }

  void line(std::string_view text) {
    roll(Clock::now());
    if (++inWindow_ > kMaxLinesPerSecond) {
      ++dropped_;
      return;
    }
    // A host's own lines start with their level's letter (its spdlog pattern); anything else
    // (V8's fatal errors, a sanitizer's report) is worth a warning.
    auto level = spdlog::level::warn;
    if (text.size() >= 2 && text[1] == ' ') {
      static constexpr std::pair<char, spdlog::level::level_enum> kLevels[] = {
          {'T', spdlog::level::trace}, {'D', spdlog::level::debug}, {'I', spdlog::level::info},
          {'W', spdlog::level::warn},  {'E', spdlog::level::err},   {'C', spdlog::level::critical}};
      for (const auto& [letter, named] : kLevels) {
        if (text[0] == letter) {
          level = named;
          text.remove_prefix(2);
          break;
        }
      }
    }
    std::size_t cut = std::min(text.size(), kMaxLineBytes);
    // Not inside a character (continuation bytes are 10xxxxxx).
    while (cut > 0 && cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) {
      --cut;
    }
    std::string shown(text.substr(0, cut));
    for (char& c : shown) {
      const auto byte = static_cast<unsigned char>(c);
      if ((byte < 0x20 && byte != '\t') || byte == 0x7f) c = '?';
    }
    if (text.size() > kMaxLineBytes) shown += "...(cut)";
    spdlog::log(level, "sandbox process {} (slot {}): {}", pid_, slot_, shown);
  }

  void reportDropped() {
    if (dropped_ == 0) return;
    spdlog::warn(
        "sandbox process {} (slot {}): {} more lines of its output within a second "
        "were left out",
        pid_, slot_, dropped_);
    dropped_ = 0;
  }

  asio::posix::stream_descriptor pipe_;
  const unsigned slot_;
  const pid_t pid_;
  Clock::time_point windowStart_{};
  int inWindow_ = 0;
  std::size_t bytesInWindow_ = 0;
  std::uint64_t dropped_ = 0;
};

// The one thread that starts and reaps host processes. PR_SET_PDEATHSIG in a host fires when the
// thread that started it ends, so that thread must live as long as the pool: this one does.
class Supervisor {
 public:
  Supervisor() try : thread_([this] { run(); }) {
  } catch (const std::system_error& error) {
    throw threadStartFailure("the sandbox hosts' supervisor", error);
  }
  ~Supervisor() { join(); }
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  void post(std::function<void()> task) {
    {
      std::lock_guard lock(mutex_);
      tasks_.push_back(std::move(task));
    }
    wake_.notify_one();
  }
  // Runs what is queued, then ends the thread.
  void join() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    while (true) {
      wake_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      try {
        task();
      } catch (const std::exception& e) {
        spdlog::error("runtime: the sandbox supervisor caught an exception: {}", e.what());
      }
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

struct Process;

// A call sent to a host and not yet answered. Under its Process's mutex.
struct PendingCall {
  registry::ToolRevisionPtr tool;
  // What the daemon sent with the call (taskId, ...). Requests the call's host makes on its
  // behalf carry the daemon's copy, never one the host names.
  json::object invocation;
  EffectiveLimits limits;
  bool ownSandbox = false;
  std::function<void(std::exception_ptr, CallOutcome)> deliver;
  // When the call went to the host. The host's wall clock starts later (when the call has its
  // sandbox), so the backstop, which counts from here, is never early: a call still queued behind
  // others of its sandbox only earns its host a liveness ping, which a live host answers.
  Clock::time_point sentAt;
  std::size_t ops = 0;        // operations of this call in Process::ops
  bool opsRefused = false;    // one was refused for passing kMaxRunningOps (logged once)
  std::size_t pausedOps = 0;  // operations of this call holding its clock paused
  Clock::time_point pausedSince;
  Clock::duration pausedTotal{};
  bool cancelRequested = false;
  // When a cancelled call must have been answered (see cancelAnswerTime); max until cancelled.
  Clock::time_point cancelDeadline = Clock::time_point::max();
  Clock::time_point cancelledAt = Clock::time_point::max();  // when its caller cancelled it

  // When the daemon's backstop considers it late; max while paused.
  Clock::time_point lateAt(Clock::duration grace) const {
    if (pausedOps > 0) return Clock::time_point::max();
    return sentAt + milliseconds(limits.wallMs) + pausedTotal + grace;
  }
  void unpause(Clock::time_point now) {
    if (pausedOps > 0 && --pausedOps == 0) pausedTotal += now - pausedSince;
  }
};

// The daemon's HostOperation for an operation a host started. Thread-safe; refers to its process
// weakly, so a host may keep it as long as it likes.
class OperationProxy final : public HostOperation {
 public:
  OperationProxy(std::weak_ptr<Process> process, std::uint64_t op)
      : process_(std::move(process)), op_(op) {}

  void complete(HostOpResult result) override;
  void pauseWallClock() override;
  void resumeWallClock() override;
  void onAbort(std::function<void()> abort) override;

  // The call ended before this operation completed: the host's abort functions, to run once.
  std::vector<std::function<void()>> abort() {
    std::lock_guard lock(mutex_);
    if (completed_ || aborted_) return {};
    aborted_ = true;
    return std::move(aborts_);
  }
  // Whether it was aborted (work queued for it need not be done).
  bool aborted() {
    std::lock_guard lock(mutex_);
    return aborted_;
  }

 private:
  const std::weak_ptr<Process> process_;
  const std::uint64_t op_;
  std::mutex mutex_;
  bool completed_ = false;
  bool aborted_ = false;
  std::vector<std::function<void()>> aborts_;
};

// One host process (one incarnation of a slot). Its channel's strand runs the I/O and the timer;
// the rest is under `mutex`.
struct Process : std::enable_shared_from_this<Process> {
  Process(std::shared_ptr<ProcessSandboxPool::Impl> impl_, unsigned slot_,
          std::shared_ptr<MessageChannel> channel_)
      : impl(std::move(impl_)),
        slot(slot_),
        channel(std::move(channel_)),
        watch(channel->strand()) {}

  const std::shared_ptr<ProcessSandboxPool::Impl> impl;  // released when the process is
  const unsigned slot;
  const std::shared_ptr<MessageChannel> channel;
  asio::steady_timer watch;  // the backstop; on the channel's strand

  mutable std::mutex mutex;
  // --- Under mutex. ---
  int pid = 0;
  bool ended = false;
  bool killRequested = false;  // ended before (or while) it was spawned
  std::map<std::uint64_t, PendingCall> calls;
  struct Op {
    std::shared_ptr<OperationProxy> proxy;
    std::uint64_t call = 0;
    bool paused = false;
  };
  std::map<std::uint64_t, Op> ops;
  // What the host said it retains (the changes it sent, applied in order), by revision.
  struct KnownSandbox {
    SandboxInfo info;
    Clock::time_point lastUsed;  // when its row was reported, less its idleMs
    std::uint64_t order = 0;     // ties in lastUsed: the later report is the later use
  };
  std::unordered_map<std::string, KnownSandbox> sandboxes;
  // Quick requests queued for the quick-request thread and not yet done: the queue outlives an
  // operation's abort, so it has a bound of its own; past it a quick request is refused as busy.
  std::size_t quickQueued = 0;
  static constexpr std::size_t kMaxQuickQueued = 1024;
  std::uint64_t sandboxReports = 0;
  void applySandboxChanges(const json::object& changes);
  // The row of `tool`'s sandbox from a result's `own` (OwnRow), added or updated.
  void applyOwnRow(const registry::ToolRevision& tool, const json::object& row);
  void reported(KnownSandbox& known);  // its row was just reported: when it was last used
  // Tools the host has cached, most recently used first.
  std::list<std::string> toolOrder;
  std::unordered_map<std::string, std::list<std::string>::iterator> toolsSent;
  // The liveness ping: the one outstanding, if any, and when the next may go.
  std::optional<std::uint64_t> ping = 0;  // the startup ping is sent with the hello
  // The Landlock ABI its pongs report it confined with, 0 for none; unset until the first.
  std::optional<int> landlockAbi;
  Clock::time_point pingDeadline = Clock::now() + kStartupTimeout;
  Clock::time_point nextPing;
  std::uint64_t pingSeq = 0;
  // When `watch` is due, as rearm last set it: a new call due no earlier needs no rearm.
  Clock::time_point watchDue = Clock::time_point::max();
  // When the host's last message arrived (Clock's count), for heldAt(). Any thread.
  std::atomic<Clock::rep> heardAt{0};
  Clock::time_point heard() const {
    return Clock::time_point(Clock::duration(heardAt.load(std::memory_order_relaxed)));
  }

  void opPaused(std::uint64_t op);
  void opResumed(std::uint64_t op);
  void opCompleted(std::uint64_t op, HostOpResult result);
};

struct ProcessSandboxPool::Impl : std::enable_shared_from_this<ProcessSandboxPool::Impl> {
  Impl(RuntimeConfig config_, CapabilityHost& host_, SandboxLaunch launch_,
       asio::any_io_executor executor_)
      : config(std::move(config_)),
        host(host_),
        launch(std::move(launch_)),
        executor(std::move(executor_)),
        grace(milliseconds(config.killGraceMs)),
        slots(config.processes + 1) {
    // `ps` should say what runs: the daemon's own path rather than "/proc/self/exe" (which is
    // still what is executed, so a binary replaced on disk by an upgrade keeps working).
    argv0 = launch.executable;
    if (argv0 == "/proc/self/exe") {
      std::error_code error;
      auto self = std::filesystem::read_symlink(argv0, error);
      if (!error) argv0 = self.string();
    }
    for (const char* name : kEnvironmentKept) {
      if (const char* value = std::getenv(name))
        environment.push_back(std::string(name) + "=" + value);
    }
  }

  const RuntimeConfig config;
  CapabilityHost& host;
  const SandboxLaunch launch;
  const asio::any_io_executor executor;
  const Clock::duration grace;
  std::string argv0;
  std::vector<std::string> environment;

  ThreadPool hostThreads{kHostThreads, "the sandbox hosts' requests"};
  ThreadPool quickRequestThreads{kQuickRequestThreads, "the sandbox hosts' quick requests"};
  Supervisor supervisor;
  std::atomic<std::uint64_t> nextCallId{1};

  struct Slot {
    std::shared_ptr<Process> process;
    std::deque<Clock::time_point> ends;  // unexpected ends within the restart window
    std::string startError;              // why the last start failed, until one succeeds
    Clock::time_point startErrorAt;
  };
  mutable std::mutex mutex;
  // --- Under mutex. ---
  bool stopping = false;
  std::vector<Slot> slots;

  // A call on its way: what the awaiting coroutine's cancellation needs to find it.
  struct Ticket {
    std::mutex mutex;
    std::weak_ptr<Process> process;
    std::uint64_t id = 0;
    bool cancelled = false;  // before it was placed
  };

  // The slot of an installed tool's revision; agents' code has the last slot to itself.
  unsigned slotOf(const std::string& revision) const {
    return static_cast<unsigned>(stableHash(revision) % config.processes);
  }
  unsigned agentSlot() const { return config.processes; }

  void submit(json::object message, registry::ToolRevisionPtr tool, const Admission& admission,
              std::function<void(std::exception_ptr, CallOutcome)> deliver,
              const std::shared_ptr<Ticket>& ticket);
  std::shared_ptr<Process> startLocked(unsigned slot);
  void spawn(const std::shared_ptr<Process>& process, int childFd);
  void reap(const std::shared_ptr<Process>& process);
  void onMessage(const std::shared_ptr<Process>& process, json::object& message);
  void handle(const std::shared_ptr<Process>& process, json::object& message);
  void cancel(const std::shared_ptr<Process>& process, std::uint64_t id);
  void rearm(const std::shared_ptr<Process>& process);
  void onWatch(const std::shared_ptr<Process>& process);
  // Ends the process: kills it, ends its calls (each with its verdict, else cancelled if its
  // caller cancelled, else `fallback`) and aborts its operations. Any thread; once.
  void end(const std::shared_ptr<Process>& process, std::map<std::uint64_t, CallError> verdicts,
           CallError fallback, const std::string& why, bool expected);
  void runAborts(std::vector<std::function<void()>> aborts);
  void shutdown();

  template <typename Token>
  auto asyncCall(json::object callMessage, registry::ToolRevisionPtr callTool,
                 Admission callAdmission, Token&& token) {
    return asio::async_initiate<Token, void(std::exception_ptr, CallOutcome)>(
        [self = shared_from_this()](auto handler, json::object message,
                                    registry::ToolRevisionPtr tool, Admission admission) {
          using Handler = decltype(handler);
          auto cancellation = asio::get_associated_cancellation_slot(handler);
          auto caller = asio::get_associated_executor(handler, self->executor);
          auto tracked = asio::prefer(caller, asio::execution::outstanding_work.tracked);
          auto ticket = std::make_shared<Ticket>();
          if (cancellation.is_connected()) {
            cancellation.assign(
                [weakImpl = std::weak_ptr<Impl>(self), ticket](asio::cancellation_type type) {
                  if ((type & asio::cancellation_type::terminal) == asio::cancellation_type::none) {
                    return;
                  }
                  std::shared_ptr<Process> process;
                  std::uint64_t id = 0;
                  {
                    std::lock_guard lock(ticket->mutex);
                    ticket->cancelled = true;
                    process = ticket->process.lock();
                    id = ticket->id;
                  }
                  auto impl = weakImpl.lock();
                  if (impl && process) impl->cancel(process, id);
                });
          }
          auto shared = std::make_shared<Handler>(std::move(handler));
          auto deliver = [shared, tracked, cancellation](std::exception_ptr error,
                                                         CallOutcome outcome) mutable {
            asio::post(tracked,
                       [shared, cancellation, error, outcome = std::move(outcome)]() mutable {
                         if (cancellation.is_connected()) cancellation.clear();
                         (*shared)(error, std::move(outcome));
                       });
          };
          self->submit(std::move(message), std::move(tool), admission, std::move(deliver), ticket);
        },
        token, std::move(callMessage), std::move(callTool), std::move(callAdmission));
  }
};

// --- OperationProxy and the process's side of its operations ---

void OperationProxy::complete(HostOpResult result) {
  {
    std::lock_guard lock(mutex_);
    if (completed_) return;
    completed_ = true;
    aborts_.clear();
    if (aborted_) return;  // the host's call ended: nobody waits for the answer
  }
  if (auto process = process_.lock()) process->opCompleted(op_, std::move(result));
}

void OperationProxy::pauseWallClock() {
  if (auto process = process_.lock()) process->opPaused(op_);
}

void OperationProxy::resumeWallClock() {
  if (auto process = process_.lock()) process->opResumed(op_);
}

void OperationProxy::onAbort(std::function<void()> abort) {
  if (!abort) return;
  {
    std::lock_guard lock(mutex_);
    if (completed_) return;
    if (!aborted_) {
      aborts_.push_back(std::move(abort));
      return;
    }
  }
  // The call already ended: run it now, on the calling thread.
  try {
    abort();
  } catch (const std::exception& e) {
    spdlog::error("runtime: aborting a host operation threw: {}", e.what());
  }
}

void Process::applySandboxChanges(const json::object& changes) {
  auto [updated, removed] = ipc::changesFromJson(changes);
  for (auto& info : updated) {
    KnownSandbox& known = sandboxes[info.revision];
    known.info = std::move(info);
    reported(known);
  }
  for (const auto& revision : removed) sandboxes.erase(revision);
  // A host retains at most maxRetained idle sandboxes, plus one busy row (not evictable) for
  // each revision with calls there, which are among the calls this daemon sent it; one that
  // reports far more is not one to believe, and the daemon's copy must not grow with it.
  if (sandboxes.size() > impl->config.maxRetained + calls.size() + 1024) {
    throw ipc::ProtocolError("the host reports " + std::to_string(sandboxes.size()) +
                             " retained sandboxes");
  }
}

void Process::applyOwnRow(const registry::ToolRevision& tool, const json::object& row) {
  KnownSandbox& known = sandboxes[tool.revision];
  if (known.info.revision.empty()) {  // a row the daemon did not have yet
    known.info.revision = tool.revision;
    known.info.name = tool.name;
  }
  ipc::readOwnRow(row, known.info);
  reported(known);
}

void Process::reported(KnownSandbox& known) {
  known.lastUsed = Clock::now() - milliseconds(known.info.idleMs);
  known.order = ++sandboxReports;
}

void Process::opPaused(std::uint64_t op) {
  std::lock_guard lock(mutex);
  auto found = ops.find(op);
  if (found == ops.end() || found->second.paused) return;
  found->second.paused = true;
  if (auto call = calls.find(found->second.call); call != calls.end()) {
    if (call->second.pausedOps++ == 0) call->second.pausedSince = Clock::now();
  }
  channel->send(json::object{{"t", "opPause"}, {"op", op}});
}

void Process::opResumed(std::uint64_t op) {
  {
    std::lock_guard lock(mutex);
    auto found = ops.find(op);
    if (found == ops.end() || !found->second.paused) return;
    found->second.paused = false;
    if (auto call = calls.find(found->second.call); call != calls.end()) {
      call->second.unpause(Clock::now());
    }
    channel->send(json::object{{"t", "opResume"}, {"op", op}});
  }
  impl->rearm(shared_from_this());
}

void Process::opCompleted(std::uint64_t op, HostOpResult result) {
  {
    std::lock_guard lock(mutex);
    auto found = ops.find(op);
    if (found == ops.end()) return;  // aborted meanwhile, or the process ended
    if (auto call = calls.find(found->second.call); call != calls.end()) {
      if (found->second.paused) call->second.unpause(Clock::now());
      --call->second.ops;
    }
    ops.erase(found);
    json::object message{{"t", "opComplete"}, {"op", op}};
    if (result) {
      message["ok"] = std::move(*result);
    } else {
      message["error"] =
          json::object{{"code", result.error().code}, {"message", result.error().message}};
    }
    channel->send(message);
  }
  impl->rearm(shared_from_this());
}

// --- Calls ---

void ProcessSandboxPool::Impl::submit(json::object message, registry::ToolRevisionPtr tool,
                                      const Admission& admission,
                                      std::function<void(std::exception_ptr, CallOutcome)> deliver,
                                      const std::shared_ptr<Ticket>& ticket) {
  const std::uint64_t id = nextCallId.fetch_add(1);
  message["id"] = id;
  const std::string& revision = tool->revision;
  const unsigned slot = admission.agentCode ? agentSlot() : slotOf(revision);
  std::shared_ptr<Process> process;
  std::optional<CallError> refused;
  bool rearmNeeded = false;
  {
    std::lock_guard lock(mutex);
    if (stopping) {
      refused = CallError{CallErrc::cancelled, "the runtime is shutting down", {}};
    } else {
      // A process that ended meanwhile (even while this ran) is replaced; one that cannot be
      // started right now refuses the call.
      for (int attempt = 0; attempt < 2 && !process && !refused; ++attempt) {
        auto candidate = slots[slot].process;
        {
          std::unique_lock<std::mutex> processLock;
          if (candidate) processLock = std::unique_lock(candidate->mutex);
          if (!candidate || candidate->ended) {
            processLock = {};
            auto& ends = slots[slot].ends;
            const auto now = Clock::now();
            const auto window = milliseconds(config.restartWindowMs);
            while (!ends.empty() && now - ends.front() >= window) ends.pop_front();
            // max_restarts restarts, so the process may end that many times and be replaced;
            // one more end within the window and calls fail fast.
            if (config.maxRestarts > 0 && ends.size() > config.maxRestarts) {
              refused =
                  CallError{CallErrc::sandboxCrashed,
                            "the sandbox process for this tool ended unexpectedly " +
                                std::to_string(ends.size()) + " times within " +
                                std::to_string(config.restartWindowMs) +
                                " ms (see the daemon's log); calls fail for another " +
                                std::to_string(millisBetween(now, ends.front() + window)) + " ms",
                            {}};
              break;
            }
            try {
              candidate = startLocked(slot);
              slots[slot].startError.clear();
            } catch (const std::exception& e) {
              spdlog::error("runtime: cannot start a sandbox process: {}", e.what());
              slots[slot].startError = e.what();
              slots[slot].startErrorAt = Clock::now();
              refused =
                  CallError{CallErrc::sandboxCrashed,
                            std::string("the sandbox process could not be started: ") + e.what(),
                            {}};
              break;
            }
            processLock = std::unique_lock(candidate->mutex);
          }
          if (candidate->ended) continue;
          if (const std::size_t waiting = candidate->channel->queued();
              waiting > ipc::kMaxQueuedCallBytes) {
            refused =
                CallError{CallErrc::overloaded,
                          "the sandbox process has not yet read " + std::to_string(waiting >> 20) +
                              " MiB of calls sent to it (limit " +
                              std::to_string(ipc::kMaxQueuedCallBytes >> 20) +
                              " MiB); retry once calls have ended",
                          {}};
            break;
          }
          // Registered before the message goes, so that the answer always finds it.
          PendingCall& call = candidate->calls[id];
          call.tool = tool;
          if (const auto* invocation = message.if_contains("invocation")) {
            call.invocation = invocation->as_object();
          }
          call.limits = admission.limits;
          call.ownSandbox = admission.ownSandbox;
          call.deliver = std::move(deliver);
          call.sentAt = Clock::now();
          rearmNeeded = call.lateAt(grace) < candidate->watchDue;
          auto sent = candidate->toolsSent.find(revision);
          if (sent != candidate->toolsSent.end()) {
            candidate->toolOrder.splice(candidate->toolOrder.begin(), candidate->toolOrder,
                                        sent->second);
          } else {
            message["tool"] = ipc::toolToJson(*tool);
            candidate->toolOrder.push_front(revision);
            candidate->toolsSent[revision] = candidate->toolOrder.begin();
            if (candidate->toolOrder.size() > kMaxCachedTools) {
              const std::string oldest = candidate->toolOrder.back();
              candidate->toolOrder.pop_back();
              candidate->toolsSent.erase(oldest);
              candidate->channel->send(json::object{{"t", "forget"}, {"revision", oldest}});
            }
          }
          candidate->channel->send(message);
          process = candidate;
        }
      }
      if (!process && !refused) {
        refused = CallError{CallErrc::sandboxCrashed,
                            "the sandbox process could not be started (see the daemon's log)",
                            {}};
      }
    }
  }
  if (refused) {
    deliver(nullptr, failedOutcome(tool, std::move(*refused)));
    return;
  }
  if (rearmNeeded) rearm(process);
  bool cancelled;
  {
    std::lock_guard lock(ticket->mutex);
    ticket->process = process;
    ticket->id = id;
    cancelled = ticket->cancelled;
  }
  if (cancelled) cancel(process, id);
}

void ProcessSandboxPool::Impl::cancel(const std::shared_ptr<Process>& process, std::uint64_t id) {
  bool rearmNeeded;
  {
    std::lock_guard lock(process->mutex);
    auto found = process->calls.find(id);
    if (found == process->calls.end() || found->second.cancelRequested) return;
    found->second.cancelRequested = true;
    found->second.cancelledAt = Clock::now();
    found->second.cancelDeadline = found->second.cancelledAt + cancelAnswerTime(grace);
    // The host answers with the call's result (cancelled). A host that is gone has already
    // ended the call; one stuck in a builtin reports it as stalled within the grace; one that
    // does neither is killed at the deadline.
    process->channel->send(json::object{{"t", "cancel"}, {"id", id}});
    rearmNeeded = found->second.cancelDeadline < process->watchDue;
  }
  if (rearmNeeded) rearm(process);
}

// --- Processes ---

std::shared_ptr<Process> ProcessSandboxPool::Impl::startLocked(unsigned slot) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    throw std::system_error(errno, std::generic_category(), "socketpair for a sandbox process");
  }
  auto channel =
      MessageChannel::create(executor, fds[0], ipc::maxMessageBytes(config),
                             ipc::maxMessageDepth(config), ipc::maxMessageValues(config));
  channel->limitQueue(ipc::kMaxQueuedToHostBytes);
  auto process = std::make_shared<Process>(shared_from_this(), slot, channel);
  slots[slot].process = process;
  // The handlers hold the process weakly: the process holds the channel, and a channel whose
  // read loop never resumes (its executor stopped first, at shutdown) keeps its handlers.
  // While the process matters, its slot (or the supervisor) holds it.
  std::weak_ptr<Process> weak = process;
  channel->start([weak](json::object message) {
                   if (auto alive = weak.lock()) alive->impl->onMessage(alive, message);
                 },
                 [weak](const std::string& reason) {
                   auto alive = weak.lock();
                   if (!alive) return;
                   alive->impl->end(
                       alive, {},
                       CallError{CallErrc::sandboxCrashed,
                                 "the sandbox process ended unexpectedly (e.g. V8 aborted on "
                                 "a fatal error; the daemon's log says why); the call's sandbox "
                                 "is gone",
                                 {}},
                       "its connection ended (" + reason + ")", false);
                 });
  auto level = spdlog::level::to_string_view(spdlog::get_level());
  channel->send(json::object{{"t", "hello"},
                             {"config", ipc::configToJson(config)},
                             {"daemonPid", static_cast<std::int64_t>(::getpid())},
                             {"slot", slot},
                             {"logLevel", std::string_view(level.data(), level.size())}});
  channel->send(json::object{{"t", "ping"}, {"seq", 0}});
  rearm(process);
  const int childFd = fds[1];
  supervisor.post([self = shared_from_this(), process, childFd] { self->spawn(process, childFd); });
  return process;
}

void ProcessSandboxPool::Impl::spawn(const std::shared_ptr<Process>& process, int childFd) {
  {
    std::lock_guard lock(process->mutex);
    if (process->killRequested) {
      ::close(childFd);
      return;
    }
  }
  // fd 3 in the child: dup2 onto itself would leave close-on-exec set, so move it first.
  if (childFd <= 3) {
    const int moved = ::fcntl(childFd, F_DUPFD_CLOEXEC, 10);
    ::close(childFd);
    childFd = moved;
  }
  std::string failure;
  pid_t pid = 0;
  int output[2] = {-1, -1};  // the host's stdout and stderr, read by HostOutput
  if (childFd < 0) {
    failure = std::string("cannot move its socket: ") + std::strerror(errno);
  } else if (::pipe2(output, O_CLOEXEC) != 0) {
    failure = std::string("cannot make a pipe for its output: ") + std::strerror(errno);
    ::close(childFd);
  } else {
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attributes;
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attributes);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, output[1], 1);
    posix_spawn_file_actions_adddup2(&actions, output[1], 2);
    posix_spawn_file_actions_adddup2(&actions, childFd, 3);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attributes, &none);
    posix_spawnattr_setsigdefault(&attributes, &all);
    // A session of its own, so no controlling terminal: with the daemon's terminal as its
    // controlling one, a host could type into the user's shell (TIOCSTI on its stderr).
    posix_spawnattr_setflags(&attributes,
                             POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSID);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(argv0.c_str()));
    for (const auto& argument : launch.arguments)
      argv.push_back(const_cast<char*>(argument.c_str()));
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (const auto& variable : environment) envp.push_back(const_cast<char*>(variable.c_str()));
    envp.push_back(nullptr);
    const int error = ::posix_spawn(&pid, launch.executable.c_str(), &actions, &attributes,
                                    argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
    ::close(childFd);
    ::close(output[1]);
    if (error != 0) {
      failure = "cannot run " + launch.executable + ": " + std::strerror(error);
      pid = 0;
      ::close(output[0]);
    } else {
      std::shared_ptr<HostOutput> reader;
      try {
        reader = std::make_shared<HostOutput>(executor, output[0], process->slot, pid);
      } catch (const std::exception& e) {
        // Not worth failing the process for: what it prints is lost.
        ::close(output[0]);
        spdlog::error("runtime: sandbox process {}: cannot read its output: {}", pid, e.what());
      }
      // The reader owns the descriptor from here, whatever start() does.
      if (reader) {
        try {
          reader->start();
        } catch (const std::exception& e) {
          spdlog::error("runtime: sandbox process {}: cannot read its output: {}", pid, e.what());
        }
      }
    }
  }
  if (!failure.empty()) {
    spdlog::error("runtime: sandbox process slot {}: {}", process->slot, failure);
    end(process, {},
        CallError{
            CallErrc::sandboxCrashed, "the sandbox process could not be started: " + failure, {}},
        failure, false);
    return;
  }
  {
    std::lock_guard lock(process->mutex);
    process->pid = pid;
    // Ended while it was being started: the reap queued behind this task collects it.
    if (process->killRequested) ::kill(pid, SIGKILL);
  }
  spdlog::debug("runtime: started sandbox process {} for slot {}", pid, process->slot);
}

void ProcessSandboxPool::Impl::reap(const std::shared_ptr<Process>& process) {
  int pid;
  {
    std::lock_guard lock(process->mutex);
    pid = process->pid;
  }
  if (pid <= 0) return;
  int status = 0;
  pid_t reaped;
  do {
    reaped = ::waitpid(pid, &status, 0);
  } while (reaped < 0 && errno == EINTR);
  if (reaped == pid) {
    // Our own SIGKILL (every end but a clean exit goes through one) says nothing; anything else
    // tells what happened (V8 aborts with SIGTRAP, SIGILL or SIGABRT).
    const bool ours = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    spdlog::log(ours || clean ? spdlog::level::debug : spdlog::level::warn,
                "runtime: sandbox process {} (slot {}) {}", pid, process->slot,
                describeStatus(status));
  }
  std::lock_guard lock(process->mutex);
  process->pid = 0;
}

void ProcessSandboxPool::Impl::end(const std::shared_ptr<Process>& process,
                                   std::map<std::uint64_t, CallError> verdicts, CallError fallback,
                                   const std::string& why, bool expected) {
  std::map<std::uint64_t, PendingCall> calls;
  std::map<std::uint64_t, Process::Op> ops;
  int pid;
  {
    std::lock_guard lock(process->mutex);
    if (process->ended) return;
    process->ended = true;
    process->killRequested = true;
    calls.swap(process->calls);
    ops.swap(process->ops);
    process->sandboxes.clear();
    pid = process->pid;
    // Not reaped yet (that happens on the supervisor, after this), so the pid is still ours.
    if (pid > 0) ::kill(pid, SIGKILL);
  }
  process->channel->close(why);
  asio::dispatch(process->channel->strand(), [process] { process->watch.cancel(); });
  supervisor.post([self = shared_from_this(), process] { self->reap(process); });
  if (!expected) {
    spdlog::warn("runtime: sandbox process {} (slot {}) ended: {}; {} call(s) in it ended", pid,
                 process->slot, why, calls.size());
    std::lock_guard lock(mutex);
    slots[process->slot].ends.push_back(Clock::now());
  }
  std::vector<std::function<void()>> aborts;
  for (auto& [op, entry] : ops) {
    for (auto& abort : entry.proxy->abort()) aborts.push_back(std::move(abort));
  }
  runAborts(std::move(aborts));
  const auto now = Clock::now();
  for (auto& [id, call] : calls) {
    CallError error = fallback;
    if (auto verdict = verdicts.find(id); verdict != verdicts.end()) {
      error = std::move(verdict->second);
    } else if (call.cancelRequested && fallback.code == CallErrc::sandboxCrashed) {
      error = CallError{CallErrc::cancelled, "the caller cancelled the call", {}};
    }
    CallOutcome outcome = failedOutcome(call.tool, std::move(error));
    outcome.usage.wallMs = millisBetween(call.sentAt, now);
    call.deliver(nullptr, std::move(outcome));
  }
}

void ProcessSandboxPool::Impl::runAborts(std::vector<std::function<void()>> aborts) {
  if (aborts.empty()) return;
  asio::post(hostThreads.get_executor(), [aborts = std::move(aborts)] {
    for (const auto& abort : aborts) {
      try {
        abort();
      } catch (const std::exception& e) {
        spdlog::error("runtime: aborting a host operation threw: {}", e.what());
      }
    }
  });
}

// --- Messages from a host ---

void ProcessSandboxPool::Impl::onMessage(const std::shared_ptr<Process>& process,
                                         json::object& message) {
  try {
    handle(process, message);
  } catch (const std::exception& e) {
    spdlog::error("runtime: sandbox process slot {} broke the protocol: {}", process->slot,
                  e.what());
    end(process, {},
        CallError{CallErrc::sandboxCrashed,
                  "the sandbox process broke the protocol and was killed; the call's sandbox is "
                  "gone",
                  {}},
        std::string("protocol error: ") + e.what(), false);
  }
}

namespace {

CallError stalledVerdict(Kill reason, const PendingCall& call) {
  const EffectiveLimits& limits = call.limits;
  const std::string killed = "; its sandbox process was killed";
  switch (reason) {
    case Kill::cpuLimit:
      return {CallErrc::cpuLimit,
              "the call did not stop at its CPU time limit of " + std::to_string(limits.cpuMs) +
                  " ms" + killed,
              {}};
    case Kill::memoryLimit:
      return {CallErrc::memoryLimit,
              "the call did not stop at its heap limit of " + std::to_string(limits.heapMb) +
                  " MiB" + killed,
              {}};
    case Kill::arrayBufferLimit:
      return {CallErrc::arrayBufferLimit,
              "the call did not stop at its ArrayBuffer limit of " +
                  std::to_string(limits.arrayBufferMb) + " MiB" + killed,
              {}};
    case Kill::cancelled:
      return {CallErrc::cancelled, "the call was cancelled and did not stop" + killed, {}};
    case Kill::timeout:
    case Kill::none:
      break;
  }
  return {CallErrc::timeout,
          "the call did not stop at its wall-clock limit of " + std::to_string(limits.wallMs) +
              " ms" + killed,
          {}};
}

const CallError kKilledForHeldCall{
    CallErrc::sandboxCrashed,
    "another call in the same sandbox process was cancelled and the process did not end it, so "
    "the process was killed; this call's sandbox is gone (calling again starts a new one)",
    {}};

const CallError kKilledForAnother{
    CallErrc::sandboxCrashed,
    "another call in the same sandbox process did not stop at its limit, so the process was "
    "killed; this call's sandbox is gone (calling again starts a new one)",
    {}};

}  // namespace

void ProcessSandboxPool::Impl::handle(const std::shared_ptr<Process>& process,
                                      json::object& message) {
  process->heardAt.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  const std::string type = ipc::stringField(message, "t");
  if (type == "result") {
    PendingCall call;
    std::vector<std::function<void()>> aborts;
    {
      std::lock_guard lock(process->mutex);
      if (const auto* changes = message.if_contains("sandboxes")) {
        if (!changes->is_object()) throw ipc::ProtocolError("\"sandboxes\" is not an object");
        process->applySandboxChanges(changes->get_object());
      }
      auto found = process->calls.find(ipc::uintField(message, "id"));
      if (found == process->calls.end()) return;
      if (const auto* own = message.if_contains("own")) {
        if (!own->is_object()) throw ipc::ProtocolError("\"own\" is not an object");
        process->applyOwnRow(*found->second.tool, own->get_object());
      }
      const std::uint64_t id = found->first;
      call = std::move(found->second);
      process->calls.erase(found);
      // An honest host aborts a call's operations before its result (or, for a call answered at
      // its cancel, just after it); none outlives its call here either way.
      for (auto op = process->ops.begin(); call.ops > 0 && op != process->ops.end();) {
        if (op->second.call != id) {
          ++op;
          continue;
        }
        for (auto& abort : op->second.proxy->abort()) aborts.push_back(std::move(abort));
        --call.ops;
        op = process->ops.erase(op);
      }
    }
    runAborts(std::move(aborts));
    if (const auto* exception = message.if_contains("exception")) {
      const std::string what = exception->is_string() ? std::string(exception->get_string()) : "";
      call.deliver(std::make_exception_ptr(std::runtime_error("the sandbox host failed: " + what)),
                   CallOutcome{});
      return;
    }
    ipc::objectField(message, "outcome");  // present, or the protocol is broken
    call.deliver(nullptr, ipc::outcomeFromJson(std::move(message["outcome"].get_object())));
  } else if (type == "sandboxes") {
    std::lock_guard lock(process->mutex);
    process->applySandboxChanges(message);
  } else if (type == "stalled") {
    std::map<std::uint64_t, CallError> verdicts;
    std::string names;
    {
      std::lock_guard lock(process->mutex);
      const auto& calls = ipc::field(message, "calls");
      if (!calls.is_array()) throw ipc::ProtocolError("\"calls\" is not an array");
      for (const auto& entry : calls.get_array()) {
        const auto& stalled = entry.as_object();
        const auto id = ipc::uintField(stalled, "id");
        const auto reason = ipc::killFromName(ipc::stringField(stalled, "reason"));
        auto found = process->calls.find(id);
        if (found == process->calls.end()) continue;
        verdicts.emplace(id, stalledVerdict(reason.value_or(Kill::timeout), found->second));
        names += (names.empty() ? "" : ", ") + found->second.tool->name;
      }
    }
    if (verdicts.empty()) return;  // they ended meanwhile after all
    end(process, std::move(verdicts), kKilledForAnother,
        "a call of " + names + " did not stop within " + std::to_string(config.killGraceMs) +
            " ms of being told to (a builtin that ignores termination); killed",
        false);
  } else if (type == "opStart") {
    const auto op = ipc::uintField(message, "op");
    const auto callId = ipc::uintField(message, "call");
    registry::ToolRevisionPtr tool;
    json::object invocation;
    bool refused = false;
    bool warnRefusal = false;
    auto proxy = std::make_shared<OperationProxy>(process, op);
    {
      std::lock_guard lock(process->mutex);
      auto found = process->calls.find(callId);
      if (found == process->calls.end()) return;  // ended: its abort follows
      tool = found->second.tool;
      invocation = found->second.invocation;
      if (process->ops.contains(op)) throw ipc::ProtocolError("an operation id used twice");
      // The host keeps to kMaxRunningOps per call; one that does not is refused here.
      if (found->second.ops >= kMaxRunningOps) {
        refused = true;
        // Said once per call: a host that keeps asking must not flood the log.
        warnRefusal = !std::exchange(found->second.opsRefused, true);
      } else {
        process->ops.emplace(op, Process::Op{proxy, callId, false});
        ++found->second.ops;
      }
    }
    if (refused) {
      if (warnRefusal) {
        spdlog::warn(
            "runtime: sandbox process slot {} asked for more than {} operations for one "
            "call of {}; refused (said once per call)",
            process->slot, kMaxRunningOps, tool->name);
      }
      json::object failure{{"code", "too-many-operations"}};
      failure["message"] = "the call already has " + std::to_string(kMaxRunningOps) +
                           " host requests outstanding";
      process->channel->send(
          json::object{{"t", "opComplete"}, {"op", op}, {"error", std::move(failure)}});
      return;
    }
    // Quick requests read task lineages, seconds for a long one: on their own thread, so that
    // they never delay other tools' operations and aborts.
    std::string kind = ipc::stringField(message, "kind");
    const bool quick = kind == kResolveInvocation || kind == kCreateSubtasks;
    if (quick) {
      bool busy = false;
      {
        std::lock_guard lock(process->mutex);
        busy = process->quickQueued >= Process::kMaxQuickQueued;
        if (!busy) ++process->quickQueued;
      }
      if (busy) {
        proxy->complete(HostOpFailure{
            "busy", "the daemon has " + std::to_string(Process::kMaxQuickQueued) +
                        " lineage requests of this sandbox process queued; try again later"});
        return;
      }
    }
    asio::post(
        quick ? quickRequestThreads.get_executor() : hostThreads.get_executor(),
        [self = shared_from_this(), process, tool, proxy, quick, invocation = std::move(invocation),
         kind = std::move(kind), request = ipc::field(message, "request")]() mutable {
          try {
            if (quick) {
              struct Dequeued {
                Process& counted;
                ~Dequeued() {
                  std::lock_guard lock(counted.mutex);
                  --counted.quickQueued;
                }
              } dequeued{*process};
              // An aborted request's answer would be dropped: skip the lineage read.
              if (!proxy->aborted()) {
                self->host.startQuickRequest(*tool, invocation, kind, std::move(request), proxy);
              }
            } else {
              self->host.startOperation(*tool, invocation, kind, std::move(request), proxy);
            }
          } catch (const std::exception& e) {
            spdlog::error("runtime: starting a host operation of {} threw: {}", tool->name,
                          e.what());
            proxy->complete(HostOpFailure{"failed", "the host failed to start the operation"});
          }
        });
  } else if (type == "opAbort") {
    std::shared_ptr<OperationProxy> proxy;
    {
      std::lock_guard lock(process->mutex);
      auto found = process->ops.find(ipc::uintField(message, "op"));
      if (found == process->ops.end()) return;
      if (auto call = process->calls.find(found->second.call); call != process->calls.end()) {
        if (found->second.paused) call->second.unpause(Clock::now());
        --call->second.ops;
      }
      proxy = found->second.proxy;
      process->ops.erase(found);
    }
    runAborts(proxy->abort());
  } else if (type == "pong") {
    {
      std::lock_guard lock(process->mutex);
      if (const auto* abi = message.if_contains("landlock"); abi && abi->is_int64()) {
        process->landlockAbi =
            static_cast<int>(std::clamp<std::int64_t>(abi->get_int64(), 0, 1000));
      }
      if (process->ping != ipc::uintField(message, "seq")) return;
      process->ping.reset();
      process->nextPing = Clock::now() + grace;
    }
    rearm(process);
  } else {
    throw ipc::ProtocolError("unknown message type \"" + type + "\"");
  }
}

// --- The backstop: a started call past its wall clock plus the grace gets its process pinged;
// no answer within the grace (or to the startup ping), and the process is killed. ---

void ProcessSandboxPool::Impl::rearm(const std::shared_ptr<Process>& process) {
  asio::dispatch(process->channel->strand(), [self = shared_from_this(), process] {
    Clock::time_point next = Clock::time_point::max();
    {
      std::lock_guard lock(process->mutex);
      if (process->ended) return;
      if (process->ping) {
        next = process->pingDeadline;
      } else {
        for (const auto& [id, call] : process->calls)
          next = std::min(next, call.lateAt(self->grace));
        if (next != Clock::time_point::max()) next = std::max(next, process->nextPing);
      }
      for (const auto& [id, call] : process->calls) {
        next = std::min(next, heldAt(call.cancelDeadline, process->heard(),
                                     call.lateAt(self->grace), self->grace));
      }
      process->watchDue = next;  // in the same hold as the scan: a call added later compares
    }
    process->watch.expires_at(next);
    process->watch.async_wait([self, process](boost::system::error_code error) {
      if (!error) self->onWatch(process);
    });
  });
}

void ProcessSandboxPool::Impl::onWatch(const std::shared_ptr<Process>& process) {
  const auto now = Clock::now();
  std::map<std::uint64_t, CallError> verdicts;
  bool holding = false;  // a cancelled call not answered in time
  const std::string answerMs =
      std::to_string(std::chrono::duration_cast<milliseconds>(cancelAnswerTime(grace)).count());
  bool unresponsive = false;
  bool starting = false;
  {
    std::lock_guard lock(process->mutex);
    if (process->ended) return;
    for (const auto& [id, call] : process->calls) {
      if (heldAt(call.cancelDeadline, process->heard(), call.lateAt(grace), grace) <= now) {
        verdicts.emplace(id, CallError{CallErrc::cancelled,
                                       "the call was cancelled and its sandbox process did not end "
                                       "it within " +
                                           answerMs + " ms; the process was killed",
                                       {}});
      }
    }
    if (!verdicts.empty()) {
      holding = true;
    } else if (process->ping && now >= process->pingDeadline) {
      unresponsive = true;
      starting = *process->ping == 0;
      for (const auto& [id, call] : process->calls) {
        if (call.cancelledAt < call.lateAt(Clock::duration::zero())) {
          // Its caller cancelled it before its wall clock ran out: that is what became of it.
          verdicts.emplace(id, CallError{CallErrc::cancelled,
                                         "the call was cancelled; its sandbox process stopped "
                                         "responding (stopped or hung) and was killed",
                                         {}});
        } else if (call.lateAt(grace) <= now) {
          // Pings are answered off the V8 workers: the process as a whole stopped (SIGSTOP, a
          // hung host), whether or not the tool's code ever ran. The call is past its limit.
          verdicts.emplace(id, CallError{CallErrc::timeout,
                                         "the call passed its wall-clock limit of " +
                                             std::to_string(call.limits.wallMs) +
                                             " ms while its sandbox process stopped responding "
                                             "(stopped or hung, not necessarily the tool's doing); "
                                             "the process was killed",
                                         {}});
        }
      }
    } else if (!process->ping && now >= process->nextPing) {
      bool late = false;
      for (const auto& [id, call] : process->calls) late = late || call.lateAt(grace) <= now;
      if (late) {
        process->ping = ++process->pingSeq;
        process->pingDeadline = now + grace;
        process->channel->send(json::object{{"t", "ping"}, {"seq", *process->ping}});
      }
    }
  }
  if (holding) {
    end(process, std::move(verdicts), kKilledForHeldCall,
        "it did not answer a cancelled call within " + answerMs + " ms; killed", false);
    return;
  }
  if (unresponsive) {
    end(process, std::move(verdicts),
        CallError{CallErrc::sandboxCrashed,
                  starting ? "the sandbox process did not start (see the daemon's log)"
                           : "the sandbox process stopped responding and was killed; the call's "
                             "sandbox is gone",
                  {}},
        starting ? "it did not answer within " + std::to_string(kStartupTimeout.count()) +
                       " ms of starting; killed"
                 : "it did not answer a ping within " + std::to_string(config.killGraceMs) +
                       " ms; killed",
        false);
    return;
  }
  rearm(process);
}

void ProcessSandboxPool::Impl::shutdown() {
  std::vector<std::shared_ptr<Process>> processes;
  {
    std::lock_guard lock(mutex);
    stopping = true;
    for (auto& slot : slots) {
      if (slot.process) processes.push_back(std::move(slot.process));
      slot.process.reset();
    }
  }
  for (const auto& process : processes) {
    end(process, {}, CallError{CallErrc::cancelled, "the runtime is shutting down", {}},
        "the runtime is shutting down", true);
  }
  supervisor.join();   // every process killed and reaped
  quickRequestThreads.join();
  hostThreads.join();  // every host request and abort has run
}

// --- ProcessSandboxPool ---

ProcessSandboxPool::ProcessSandboxPool(RuntimeConfig config, CapabilityHost& host,
                                       SandboxLaunch launch, asio::any_io_executor executor) {
  checkRuntimeConfig(config);
  if (launch.executable.empty()) {
    throw std::invalid_argument("the sandbox host executable is not set");
  }
  impl_ = std::make_shared<Impl>(std::move(config), host, std::move(launch), std::move(executor));
}

ProcessSandboxPool::~ProcessSandboxPool() { impl_->shutdown(); }

const RuntimeConfig& ProcessSandboxPool::config() const { return impl_->config; }

asio::awaitable<CallOutcome> ProcessSandboxPool::call(registry::ToolRevisionPtr tool,
                                                      json::object arguments,
                                                      CallOptions options) {
  // Already cancelled: the co_await below would throw; answer like any other cancelled call.
  auto state = co_await asio::this_coro::cancellation_state;
  if (state.cancelled() != asio::cancellation_type::none) {
    co_return failedOutcome(tool,
                            CallError{CallErrc::cancelled, "the caller cancelled the call", {}});
  }
  if (!tool) throw std::invalid_argument("ProcessSandboxPool::call without a tool revision");
  auto admission = admitCall(*tool, options, impl_->config);
  if (!admission) co_return failedOutcome(tool, std::move(admission.error()));
  json::object message{
      {"t", "call"},
      {"revision", tool->revision},
      {"mode", options.mode == CallOptions::Mode::disposable ? "disposable" : "retained"},
      {"limits", ipc::limitsToJson(options.limits)}};
  message.emplace("arguments", std::move(arguments));
  message.emplace("invocation", std::move(options.invocation));
  if (options.checkOnly) message.emplace("checkOnly", true);
  if (options.settings != nullptr) {
    message.emplace("settings", json::object{{"revision", options.settingsRevision},
                                             {"values", *options.settings}});
  }
  co_return co_await impl_->asyncCall(std::move(message), std::move(tool), *admission,
                                      asio::use_awaitable);
}

std::vector<SandboxInfo> ProcessSandboxPool::list() const {
  const auto now = Clock::now();
  struct Row {
    Clock::time_point lastUsed;
    std::uint64_t order;
    SandboxInfo info;
  };
  std::vector<Row> rows;
  std::lock_guard lock(impl_->mutex);
  for (const auto& slot : impl_->slots) {
    if (!slot.process) continue;
    const Process& process = *slot.process;
    std::lock_guard processLock(process.mutex);
    if (process.ended) continue;
    std::map<std::string, const PendingCall*> running;  // retained calls in flight, by revision
    for (const auto& [id, call] : process.calls) {
      if (!call.ownSandbox) running.emplace(call.tool->revision, &call);
    }
    for (const auto& [revision, known] : process.sandboxes) {
      SandboxInfo info = known.info;
      const bool calling = running.erase(revision) > 0;  // always: not a first call below
      info.busy = info.busy || calling;
      info.idleMs = info.busy ? 0 : millisBetween(known.lastUsed, now);
      rows.push_back({known.lastUsed, known.order, std::move(info)});
    }
    for (const auto& [revision, call] : running) {  // first calls, still running
      SandboxInfo info;
      info.revision = revision;
      info.name = call->tool->name;
      info.busy = true;
      rows.push_back({now, ~std::uint64_t{0}, std::move(info)});
    }
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::tie(a.lastUsed, a.order) < std::tie(b.lastUsed, b.order);
  });
  std::vector<SandboxInfo> out;
  out.reserve(rows.size());
  for (auto& row : rows) out.push_back(std::move(row.info));
  return out;
}

bool ProcessSandboxPool::terminate(const std::string& revision) {
  std::lock_guard lock(impl_->mutex);
  auto& process = impl_->slots[impl_->slotOf(revision)].process;
  if (!process) return false;
  std::lock_guard processLock(process->mutex);
  if (process->ended) return false;
  auto& known = process->sandboxes;
  auto found = known.find(revision);
  bool running = false;
  for (const auto& [id, call] : process->calls) {
    running = running || (!call.ownSandbox && call.tool->revision == revision);
  }
  if (found == known.end() && !running) return false;
  if (found != known.end()) known.erase(found);
  process->channel->send(json::object{{"t", "terminate"}, {"revision", revision}});
  return true;
}

void ProcessSandboxPool::discard(const std::string& revision) {
  std::lock_guard lock(impl_->mutex);
  auto& process = impl_->slots[impl_->slotOf(revision)].process;
  if (!process) return;
  std::lock_guard processLock(process->mutex);
  if (process->ended) return;
  process->sandboxes.erase(revision);
  process->channel->send(json::object{{"t", "discard"}, {"revision", revision}});
}

std::vector<ProcessSandboxPool::SlotHealth> ProcessSandboxPool::health() const {
  std::vector<SlotHealth> out;
  const auto now = Clock::now();
  const auto window = milliseconds(impl_->config.restartWindowMs);
  std::lock_guard lock(impl_->mutex);
  for (const auto& slot : impl_->slots) {
    SlotHealth health;
    health.agentCode = out.size() == impl_->agentSlot();
    if (slot.process) {
      std::lock_guard processLock(slot.process->mutex);
      if (!slot.process->ended) {
        health.pid = slot.process->pid;
        health.landlockAbi = slot.process->landlockAbi;
      }
    }
    for (const auto& end : slot.ends) {
      if (now - end < window) ++health.recentEnds;
    }
    // As the next call would judge it (see asyncCall's start of a process).
    if (impl_->config.maxRestarts > 0 && health.pid == 0 &&
        health.recentEnds > impl_->config.maxRestarts) {
      auto oldest = slot.ends.end() - static_cast<std::ptrdiff_t>(health.recentEnds);
      health.failingForMs = std::max<std::int64_t>(1, millisBetween(now, *oldest + window));
    }
    // A failed start counts while it is recent (the next call for the slot tries again).
    if (!slot.startError.empty() && now - slot.startErrorAt < window) {
      health.startError = slot.startError;
    }
    out.push_back(std::move(health));
  }
  return out;
}

std::vector<int> ProcessSandboxPool::processIds() const {
  std::vector<int> out;
  std::lock_guard lock(impl_->mutex);
  for (const auto& slot : impl_->slots) {
    int pid = 0;
    if (slot.process) {
      std::lock_guard processLock(slot.process->mutex);
      if (!slot.process->ended) pid = slot.process->pid;
    }
    out.push_back(pid);
  }
  return out;
}

}  // namespace toolhost::runtime
