#include "runtime/sandbox_host.h"

#include "runtime/capability_host.h"
#include "runtime/confinement.h"
#include "runtime/message_channel.h"
#include "runtime/sandbox_pool.h"
#include "runtime/sandbox_protocol.h"
#include "runtime/v8_platform.h"
#include "runtime/worker_threads.h"

#include <fcntl.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/json/array.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace toolhost::runtime {
namespace asio = boost::asio;
namespace json = boost::json;

namespace {

// Where the host keeps the daemon's id of a call inside its invocation, so that the requests the
// call's sandbox makes can name it. Removed before anything is forwarded.
constexpr std::string_view kCallKey = "toolhost.sandboxHost.call";

// Open descriptors a host may hold (RLIMIT_NOFILE).
constexpr rlim_t kMaxDescriptors = 128;

void closeInheritedFds(int keep) {
  auto closeRange = [](unsigned first, unsigned last) {
    if (first > last) return;
    if (::close_range(first, last, 0) == 0) return;
    // A kernel without close_range: close what /proc lists.
    std::vector<int> open;
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", error)) {
      const int fd = std::atoi(entry.path().filename().c_str());
      if (fd >= 0 && static_cast<unsigned>(fd) >= first && static_cast<unsigned>(fd) <= last) {
        open.push_back(fd);
      }
    }
    for (int fd : open) ::close(fd);
  };
  const auto kept = static_cast<unsigned>(keep);
  if (kept > 3) closeRange(3, kept - 1);
  closeRange(std::max(3u, kept + 1), ~0u);
}

// The invocation without the host's key, and the call id it held.
std::pair<json::object, std::uint64_t> splitInvocation(const json::object& invocation) {
  json::object forwarded = invocation;
  std::uint64_t call = 0;
  if (const auto* id = forwarded.if_contains(kCallKey)) {
    call = id->to_number<std::uint64_t>();
    forwarded.erase(kCallKey);
  }
  return {std::move(forwarded), call};
}

// The CapabilityHost of the host's SandboxPool: every request goes to the daemon.
class ForwardingHost final : public CapabilityHost {
 public:
  explicit ForwardingHost(std::shared_ptr<MessageChannel> channel) : channel_(std::move(channel)) {}

  // Quick requests travel as operations (startQuickRequest); these blocking forms are never used.
  boost::system::result<json::object, HostOpFailure> resolveInvocation(
      const registry::ToolRevision&, const std::string&, const json::object&) override {
    return HostOpFailure{"failed", "the sandbox host asks the daemon without waiting"};
  }
  boost::system::result<json::array, std::string> createSubtasks(const registry::ToolRevision&,
                                                                 const json::value&,
                                                                 const json::object&) override {
    return std::string("the sandbox host asks the daemon without waiting");
  }

  // As an operation: the daemon answers it on a thread of its own while this V8 worker serves
  // other calls.
  void startQuickRequest(const registry::ToolRevision& caller, const json::object& invocation,
                         const std::string& kind, json::value request,
                         std::shared_ptr<HostOperation> operation) override {
    startOperation(caller, invocation, kind, std::move(request), std::move(operation));
  }

  void startOperation(const registry::ToolRevision&, const json::object& invocation,
                      const std::string& kind, json::value request,
                      std::shared_ptr<HostOperation> operation) override {
    auto [forwarded, call] = splitInvocation(invocation);
    const std::uint64_t op = nextId_.fetch_add(1);
    {
      std::lock_guard lock(mutex_);
      if (closed_) {
        operation->complete(HostOpFailure{"failed", "the sandbox host lost the daemon"});
        return;
      }
      operations_[op] = operation;
    }
    channel_->send(json::object{{"t", "opStart"},
                                {"op", op},
                                {"call", call},
                                {"kind", kind},
                                {"request", std::move(request)},
                                {"invocation", std::move(forwarded)}});
    // After opStart: an abort that runs at once (the call already ended) follows the start.
    operation->onAbort([this, op] {
      if (take(op)) channel_->send(json::object{{"t", "opAbort"}, {"op", op}});
    });
  }

  // --- From the daemon, on the channel's strand. ---

  void complete(const json::object& message) {
    auto operation = take(ipc::uintField(message, "op"));
    if (!operation) return;  // aborted meanwhile
    if (const auto* error = message.if_contains("error")) {
      const auto& failure = error->as_object();
      operation->complete(
          HostOpFailure{ipc::stringField(failure, "code"), ipc::stringField(failure, "message")});
    } else {
      operation->complete(HostOpResult(ipc::field(message, "ok")));
    }
  }

  void pause(const json::object& message, bool paused) {
    std::shared_ptr<HostOperation> operation;
    {
      std::lock_guard lock(mutex_);
      auto found = operations_.find(ipc::uintField(message, "op"));
      if (found == operations_.end()) return;
      operation = found->second;
    }
    if (paused) {
      operation->pauseWallClock();
    } else {
      operation->resumeWallClock();
    }
  }

  // The daemon is gone: every operation fails.
  void close() {
    std::map<std::uint64_t, std::shared_ptr<HostOperation>> operations;
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
      operations.swap(operations_);
    }
    for (auto& [op, operation] : operations) {
      operation->complete(HostOpFailure{"failed", "the sandbox host lost the daemon"});
    }
  }

 private:
  std::shared_ptr<HostOperation> take(std::uint64_t op) {
    std::lock_guard lock(mutex_);
    auto found = operations_.find(op);
    if (found == operations_.end()) return nullptr;
    auto operation = std::move(found->second);
    operations_.erase(found);
    return operation;
  }

  const std::shared_ptr<MessageChannel> channel_;
  std::atomic<std::uint64_t> nextId_{1};
  std::mutex mutex_;
  bool closed_ = false;
  std::map<std::uint64_t, std::shared_ptr<HostOperation>> operations_;  // by op
};

// The host's side of the socket. Everything here runs on the one thread running `io`.
class HostSide {
 public:
  HostSide(asio::io_context& io, int fd, FileConfinement files)
      : io_(io),
        channel_(MessageChannel::create(io.get_executor(), fd, ipc::kMaxMessageBytes,
                                        ipc::kMaxDaemonMessageDepth)),
        timer_(io),
        files_(std::move(files)) {}

  void start() {
    channel_->start([this](json::object message) { onMessage(std::move(message)); },
                    [this](const std::string& reason) { onClosed(reason); });
  }

  int exitCode() const { return exitCode_; }

 private:
  void onMessage(json::object message) {
    try {
      dispatch(message);  // may take members out of it
    } catch (const std::system_error& e) {
      // Not the message's fault: the host could not do what it asked (start its V8 threads).
      spdlog::critical("the sandbox host cannot go on: {}{}; exiting", e.what(),
                       threadLimitHint(e.code()));
      exitCode_ = 4;
      channel_->close("host failure");
    } catch (const std::exception& e) {
      spdlog::error("a message from the daemon broke the protocol ({}); exiting", e.what());
      exitCode_ = 3;
      channel_->close("protocol error");
    }
  }

  void dispatch(json::object& message) {
    const std::string type = ipc::stringField(message, "t");
    if (!pool_) {
      if (type != "hello") throw ipc::ProtocolError("the first message is not hello");
      hello(message);
    } else if (type == "call") {
      call(message);
    } else if (type == "cancel") {
      std::function<void()> cancel;
      {
        std::lock_guard lock(callsMutex_);
        auto found = calls_.find(ipc::uintField(message, "id"));
        if (found != calls_.end()) cancel = found->second;
      }
      if (cancel) cancel();
    } else if (type == "opComplete") {
      host_->complete(message);
    } else if (type == "opPause" || type == "opResume") {
      host_->pause(message, type == "opPause");
    } else if (type == "terminate") {
      pool_->terminate(ipc::stringField(message, "revision"));
      sendSandboxes();
    } else if (type == "discard") {
      pool_->discard(ipc::stringField(message, "revision"));
      sendSandboxes();
    } else if (type == "forget") {
      tools_.erase(ipc::stringField(message, "revision"));
    } else if (type == "ping") {
      channel_->send(json::object{{"t", "pong"},
                                  {"seq", ipc::field(message, "seq")},
                                  {"landlock", files_.enforced ? files_.abi : 0}});
    } else {
      throw ipc::ProtocolError("unknown message type \"" + type + "\"");
    }
  }

  void hello(const json::object& message) {
    const auto daemonPid = static_cast<pid_t>(ipc::uintField(message, "daemonPid"));
    if (::getppid() != daemonPid) {
      spdlog::warn("the daemon (pid {}) is gone; exiting", daemonPid);
      channel_->close("the daemon is gone");
      return;
    }
    const RuntimeConfig config = ipc::configFromJson(ipc::objectField(message, "config"));
    spdlog::set_level(spdlog::level::from_str(ipc::stringField(message, "logLevel")));
    grace_ = std::chrono::milliseconds(std::max<std::int64_t>(config.killGraceMs, 1));
    poll_ = std::clamp<std::chrono::milliseconds>(grace_ / 4, std::chrono::milliseconds(10),
                                                  std::chrono::milliseconds(250));
    if (files_.enforced) {
      spdlog::debug("confined: {}", files_.detail);
    } else {
      spdlog::info("{}", files_.detail);
    }
    platform_ = std::make_unique<V8Platform>(0, config.jit);
    host_ = std::make_unique<ForwardingHost>(channel_);
    pool_ = std::make_unique<SandboxPool>(config, *host_);
    // Every thread the host will have is running (V8's, the pool's workers and watchdog, this
    // one): the filter refuses new ones. V8 has read what it reads as it starts; the C library
    // reads the time zone once, now.
    ::tzset();
    try {
      confineCalls(config.jit);
    } catch (const std::runtime_error& e) {
      spdlog::critical("the sandbox host cannot confine itself: {}; exiting", e.what());
      exitCode_ = 5;
      channel_->close("confinement failed");
      return;
    }
    pool_->onLateChange([this] { asio::post(io_, [this] { sendSandboxes(); }); });
    spdlog::debug("serving the daemon with {} V8 worker threads", config.workers);
  }

  void call(json::object& message) {
    const std::uint64_t id = ipc::uintField(message, "id");
    const std::string revision = ipc::stringField(message, "revision");
    registry::ToolRevisionPtr tool;
    if (message.contains("tool")) {
      tool = ipc::toolFromJson(ipc::objectField(message, "tool"));
      if (tool->revision != revision) throw ipc::ProtocolError("the tool is not the revision");
      tools_[revision] = tool;
    } else {
      auto found = tools_.find(revision);
      if (found == tools_.end()) throw ipc::ProtocolError("a call of an unknown revision");
      tool = found->second;
    }
    CallOptions options;
    options.mode = ipc::stringField(message, "mode") == "disposable" ? CallOptions::Mode::disposable
                                                                     : CallOptions::Mode::retained;
    options.limits = ipc::limitsFromJson(ipc::objectField(message, "limits"));
    ipc::objectField(message, "invocation");  // checked here, taken next
    options.invocation = std::move(message["invocation"].get_object());
    options.invocation[kCallKey] = id;
    if (message.contains("settings")) {
      ipc::objectField(message, "settings");  // checked here, taken next
      json::object& settings = message["settings"].get_object();
      options.settingsRevision = ipc::stringField(settings, "revision");
      ipc::objectField(settings, "values");
      options.settings =
          std::make_shared<const json::object>(std::move(settings["values"].get_object()));
    }
    if (const auto* check = message.if_contains("checkOnly")) {
      if (!check->is_bool()) throw ipc::ProtocolError("checkOnly is not a boolean");
      options.checkOnly = check->get_bool();
    }
    options.tag = id;
    ipc::objectField(message, "arguments");  // checked here, taken below
    {
      std::lock_guard lock(callsMutex_);
      // Reserved before the call starts, so that a call that ends at once finds it to erase.
      if (!calls_.emplace(id, nullptr).second) throw ipc::ProtocolError("a call id used twice");
    }
    auto cancel =
        pool_->start(std::move(tool), std::move(message["arguments"].get_object()),
                     std::move(options), [this, id](std::exception_ptr error, CallOutcome outcome) {
                       finished(id, error, std::move(outcome));
                     });
    {
      std::lock_guard lock(callsMutex_);
      if (auto found = calls_.find(id); found != calls_.end()) found->second = std::move(cancel);
    }
    watchStalls();
  }

  // On the V8 worker thread that ran the call (or the I/O thread, for one refused at once): the
  // result goes from here, without a hop back to the I/O thread.
  void finished(std::uint64_t id, std::exception_ptr error, CallOutcome outcome) {
    bool othersRunning;
    {
      std::lock_guard lock(callsMutex_);
      calls_.erase(id);
      reported_.erase(id);
      othersRunning = !calls_.empty();
    }
    const std::string revision = outcome.revision;
    json::object message{{"t", "result"}, {"id", id}};
    if (error) {
      std::string what = "an unknown exception";
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      spdlog::error("call {} failed with an exception: {}", id, what);
      message["exception"] = what;
    } else {
      message["outcome"] = ipc::outcomeToJson(std::move(outcome));
    }
    // With the result, so that the daemon's list is current when the call returns; the call's
    // own row in the short form.
    std::lock_guard lock(reportMutex_);
    auto changes = pool_->changes();
    if (!error) {
      auto& updated = changes.updated;
      auto own = std::find_if(updated.begin(), updated.end(),
                              [&](const SandboxInfo& info) { return info.revision == revision; });
      if (own != updated.end()) {
        message["own"] = ipc::ownRowToJson(*own);
        updated.erase(own);
      }
    }
    if (auto rest = ipc::changesToJson(changes); !rest.empty()) message["sandboxes"] = std::move(rest);
    channel_->send(message, othersRunning);
  }

  void sendSandboxes() {
    std::lock_guard lock(reportMutex_);
    json::object message = ipc::changesToJson(pool_->changes());
    if (message.empty()) return;
    message["t"] = "sandboxes";
    channel_->send(message);
  }

  // While calls run, asks the pool every poll_ for calls that did not stop within the grace.
  void watchStalls() {
    {
      std::lock_guard lock(callsMutex_);
      if (watching_ || calls_.empty()) return;
    }
    watching_ = true;
    timer_.expires_after(poll_);
    timer_.async_wait([this](boost::system::error_code error) {
      watching_ = false;
      if (error || !pool_) return;
      reportStalls();
      watchStalls();
    });
  }

  void reportStalls() {
    json::array stalled;
    std::lock_guard lock(callsMutex_);
    for (const auto& call : pool_->stalled(grace_)) {
      if (!calls_.contains(call.tag) || !reported_.insert(call.tag).second) continue;
      spdlog::warn(
          "call {} was stopped ({}) more than {} ms ago and is still inside V8 (a builtin that "
          "does not check for termination); the daemon will kill this process",
          call.tag, ipc::killName(call.reason), grace_.count());
      stalled.push_back(json::object{{"id", call.tag}, {"reason", ipc::killName(call.reason)}});
    }
    if (!stalled.empty()) {
      channel_->send(json::object{{"t", "stalled"}, {"calls", std::move(stalled)}});
    }
  }

  void onClosed(const std::string& reason) {
    if (reason == "end of stream") {
      spdlog::debug("the daemon closed the connection; exiting");
    } else {
      spdlog::warn("the connection to the daemon ended ({}); exiting", reason);
      if (exitCode_ == 0) exitCode_ = 1;
    }
    if (host_) host_->close();
    timer_.cancel();
    io_.stop();
  }

  asio::io_context& io_;
  std::shared_ptr<MessageChannel> channel_;
  asio::steady_timer timer_;
  int exitCode_ = 0;

  std::chrono::milliseconds grace_{2000};
  std::chrono::milliseconds poll_{250};
  std::unique_ptr<ForwardingHost> host_;
  std::unique_ptr<V8Platform> platform_;
  std::unique_ptr<SandboxPool> pool_;
  FileConfinement files_;

  std::map<std::string, registry::ToolRevisionPtr> tools_;  // by revision
  bool watching_ = false;
  // Calls end on V8 worker threads, so these are under callsMutex_.
  std::mutex callsMutex_;
  std::map<std::uint64_t, std::function<void()>> calls_;  // by call id: what cancels it
  std::set<std::uint64_t> reported_;                       // stalled calls already reported
  // Held from SandboxPool::changes() to the send of what it returned: the daemon applies the
  // changes in the order they were taken.
  std::mutex reportMutex_;
};

}  // namespace

int runSandboxHost(int fd, int argc, char** argv) {
  (void)argc;
  (void)argv;
  // Die with the daemon (the thread that started us: its supervisor thread, which lives as long
  // as the pool). The daemon's pid in the hello closes the race with a daemon that died before
  // this line: we would have been re-parented by then.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // It never executes anything: code that escaped V8 cannot gain privileges through a setuid
  // or file-capability program either.
  ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  std::signal(SIGPIPE, SIG_IGN);
  // A crash of V8 here is expected now and then (that is why this process exists): no core
  // files, which would be slow, large and hold tool data.
  const rlimit noCore{0, 0};
  ::setrlimit(RLIMIT_CORE, &noCore);
  closeInheritedFds(fd);
  // A host needs a dozen descriptors (its socket, stdio, its event loops). The kernel counts
  // epoll watches and pipe buffers per user: with thousands of descriptors a host taken over
  // could use up the user's share and leave the daemon unable to accept clients.
  const rlimit descriptors{kMaxDescriptors, kMaxDescriptors};
  ::setrlimit(RLIMIT_NOFILE, &descriptors);
  // The daemon and its hosts share a cgroup (toolhost.service's MemoryMax=): when it runs out,
  // the kernel must pick a host, never the daemon. Raising one's own score needs no privilege.
  if (const int adjust = ::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC); adjust >= 0) {
    (void)!::write(adjust, "1000", 4);
    ::close(adjust);
  }

  auto logger = spdlog::stderr_logger_mt("sandbox-host");
  spdlog::set_default_logger(logger);
  // The level's letter and the message: the daemon reads its stdout and stderr through a pipe
  // and logs each line with its own time and format, naming the process (HostOutput).
  spdlog::set_pattern("%L %v");
  spdlog::flush_on(spdlog::level::trace);

  // Before any thread starts, so that every thread is inside the Landlock domain.
  FileConfinement files;
  try {
    files = confineFiles();
  } catch (const std::runtime_error& e) {
    spdlog::critical("the sandbox host cannot confine itself: {}; exiting", e.what());
    spdlog::default_logger()->flush();
    std::_Exit(5);
  }
  int code = 0;
  // Its I/O runs on a thread of its own: this thread's stack is whatever `ulimit -s` left it, and
  // the daemon's messages nest as deep as its [limits] max_depth (toolhostd's main() sets every
  // other thread's stack).
  std::thread ioThread;
  try {
    ioThread = std::thread([fd, &code, &files] {
      try {
        // Never destroyed (see below).
        auto* io = new asio::io_context(1);
        auto* side = new HostSide(*io, fd, std::move(files));
        side->start();
        io->run();
        code = side->exitCode();
      } catch (const std::exception& e) {
        spdlog::critical("the sandbox host failed: {}", e.what());
        code = 2;
      }
    });
    ioThread.join();
  } catch (const std::system_error& e) {
    spdlog::critical("the sandbox host could not start its I/O thread: {}", e.what());
    code = 2;
  }
  spdlog::default_logger()->flush();
  // No destructors: the pool would join V8 threads, and one stuck in a builtin never returns.
  std::_Exit(code);
}

}  // namespace toolhost::runtime
