#include "runtime/sandbox_pool.h"

#include "runtime/sandbox.h"
#include "runtime/v8_platform.h"
#include "runtime/watchdog.h"
#include "runtime/worker_threads.h"

#include <spdlog/spdlog.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <variant>

namespace toolhost::runtime {
namespace asio = boost::asio;
namespace json = boost::json;

std::string_view callErrcName(CallErrc code) {
  switch (code) {
    case CallErrc::timeout:
      return "timeout";
    case CallErrc::cpuLimit:
      return "cpu-limit";
    case CallErrc::memoryLimit:
      return "memory-limit";
    case CallErrc::arrayBufferLimit:
      return "array-buffer-limit";
    case CallErrc::stackLimit:
      return "stack-limit";
    case CallErrc::outputTooLarge:
      return "output-too-large";
    case CallErrc::toolThrew:
      return "tool-threw";
    case CallErrc::invalidResult:
      return "invalid-result";
    case CallErrc::invalidModule:
      return "invalid-module";
    case CallErrc::invalidLimits:
      return "invalid-limits";
    case CallErrc::cancelled:
      return "cancelled";
    case CallErrc::overloaded:
      return "overloaded";
    case CallErrc::notRunnable:
      return "not-runnable";
    case CallErrc::sandboxCrashed:
      return "sandbox-crashed";
  }
  return "unknown";
}

namespace {

struct CallJob;
using Clock = std::chrono::steady_clock;
using Strand = asio::strand<asio::io_context::executor_type>;

std::int64_t millisSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// A call waiting for a busy sandbox (the FIFO lock of its strand). Strand only.
struct Waiter {
  explicit Waiter(const Strand& strand) : timer(strand, Clock::time_point::max()) {}
  asio::steady_timer timer;  // cancelled to wake the waiter
  bool granted = false;
  bool cancelled = false;
};

// One sandbox's place in the pool: its strand, FIFO lock and bookkeeping.
struct Slot {
  Slot(Strand strand_, std::string revision_, std::string name_, SandboxSettings settings_,
       bool retained_)
      : strand(std::move(strand_)),
        revision(std::move(revision_)),
        name(std::move(name_)),
        settings(settings_),
        retained(retained_) {}

  const Strand strand;
  const std::string revision;
  const std::string name;
  const SandboxSettings settings;  // what its sandbox is built with

  // On the strand.
  bool locked = false;
  std::deque<std::shared_ptr<Waiter>> waiters;
  std::unique_ptr<Sandbox> sandbox;

  // Under the pool's mutex.
  bool retained;            // in the pool's map
  std::size_t pending = 0;  // calls holding the slot, queued or running
  bool hasSandbox = false;  // as of the end of the last call
  std::uint64_t calls = 0;
  std::uint64_t heapBytes = 0;
  Clock::time_point lastUsed = Clock::now();
  std::weak_ptr<CallJob> running;
  // sandboxes.terminate came while calls were queued: the sandbox that exists now is destroyed
  // before the next call begins, which starts a fresh one, still retained.
  bool condemned = false;
  // The binding moved away while calls held the slot: it stays retained until the last of them
  // ends (so that they, and new calls of the revision, still run one at a time), then goes.
  bool leaving = false;
};

// Releases the slot's FIFO lock to the next live waiter when the call leaves. Strand only.
class SlotLock {
 public:
  explicit SlotLock(Slot& slot) : slot_(slot) {}
  ~SlotLock() {
    while (!slot_.waiters.empty()) {
      auto next = std::move(slot_.waiters.front());
      slot_.waiters.pop_front();
      if (next->cancelled) continue;
      next->granted = true;
      next->timer.cancel();
      return;
    }
    slot_.locked = false;
  }
  SlotLock(const SlotLock&) = delete;
  SlotLock& operator=(const SlotLock&) = delete;

 private:
  Slot& slot_;
};

// One admitted call. Shared by the caller's cancellation slot, the coroutine on the sandbox's
// strand and the pool (for shutdown).
struct CallJob : std::enable_shared_from_this<CallJob> {
  registry::ToolRevisionPtr tool;
  json::object arguments;
  bool disposable = false;
  std::uint64_t ownHeapReserved = 0;  // of ownHeapLimits, for a sandbox of its own (under mutex)
  std::shared_ptr<Slot> slot;
  std::shared_ptr<CallState> call;
  Watchdog* watchdog = nullptr;
  std::uint64_t tag = 0;  // CallOptions::tag

  // On the strand.
  std::shared_ptr<Waiter> waiter;
  bool sandboxKept = false;
  bool ran = false;
  std::uint64_t heapBytes = 0;

  const Clock::time_point admittedAt = Clock::now();

  mutable std::mutex mutex;
  // Delivers the outcome (on the worker thread that ran the call, or on the thread that
  // cancelled it); set before the call is launched, taken once.
  SandboxPool::Done deliver;  // under mutex
  bool delivered = false;     // under mutex
  std::string cancelDetail_;  // under mutex
  // Under mutex: the call's coroutine is suspended (not begun yet, or waiting for its sandbox, a
  // pre-warmed shell or its host operations), so nothing of V8 runs for it. A cancel then
  // answers at once, from the cancelling thread, rather than once the call's strand and a worker
  // are free, which another call's long segment can delay until that call's own limit. The
  // coroutine still ends the call on its strand afterwards, without running its JavaScript.
  bool parked = true;

  std::string cancelDetail() const {
    std::lock_guard lock(mutex);
    return cancelDetail_;
  }

  // The coroutine suspends (park) and resumes (unpark) on the strand.
  void park() {
    std::lock_guard lock(mutex);
    parked = true;
  }
  void unpark() {
    std::lock_guard lock(mutex);
    parked = false;
  }

  // The outcome's deliverer, unless it was taken already. Once.
  SandboxPool::Done takeDeliver() {
    std::lock_guard lock(mutex);
    if (delivered) return nullptr;
    delivered = true;
    return std::move(deliver);
  }

  // Any thread. Ends the call promptly: a running segment is terminated through the watchdog, a
  // wait (for the sandbox or for host operations) is woken on the strand, and a call parked
  // there is answered now.
  void cancel(std::string detail) {
    SandboxPool::Done early;
    {
      std::lock_guard lock(mutex);
      if (delivered || call->cancelRequested.load()) return;
      cancelDetail_ = detail;
      call->cancelRequested.store(true);
      if (parked) {
        delivered = true;
        early = std::move(deliver);
      }
    }
    if (early) {
      // Its operations end before its answer goes, as they do for any call.
      runAborts(abortOperations(*call), tool->name);
      CallOutcome outcome;
      outcome.revision = tool->revision;
      outcome.result = CallError{CallErrc::cancelled, std::move(detail), {}};
      outcome.usage.wallMs =
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - admittedAt).count();
      early(nullptr, std::move(outcome));
    }
    watchdog->kill(call->epoch, Kill::cancelled);
    asio::post(slot->strand, [self = shared_from_this()] {
      if (auto queued = self->waiter; queued && !queued->granted && !queued->cancelled) {
        queued->cancelled = true;
        auto& waiters = self->slot->waiters;
        waiters.erase(std::remove(waiters.begin(), waiters.end(), queued), waiters.end());
        queued->timer.cancel();
      }
      if (self->call->wake) self->call->wake();
    });
  }
};

}  // namespace

struct SandboxPool::Impl {
  Impl(RuntimeConfig config_, CapabilityHost& host_, v8::Platform& platform_)
      : config(std::move(config_)),
        host(host_),
        platform(platform_),
        work(asio::make_work_guard(io)),
        workers(config.workerStackMb * kMiB, [this] { runWorker(); }) {
    // The shell is built with what a manifest without limits gets; only a sandbox built with the
    // same settings may take it.
    if (auto base = baseLimits(json::object{}, config)) {
      spareSettings = SandboxSettings{base->heapMb, base->arrayBufferMb};
    }
  }

  RuntimeConfig config;
  CapabilityHost& host;
  v8::Platform& platform;
  Watchdog watchdog;  // outlives every sandbox (declared before the slots)
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work;

  mutable std::mutex mutex;
  std::map<std::string, std::shared_ptr<Slot>> retained;  // by revision
  // The sum of heapBytes over `retained`, kept as slots come, go and report their heap, so that
  // the budget check after every call costs nothing while the pool is within its limits.
  std::uint64_t retainedHeap = 0;
  // The heap limits of the calls in sandboxes of their own (disposable, or tighter limits than
  // the manifest's), together: while such a call waits on its host operations it holds its
  // whole heap outside every retained slot, so they are bounded by memoryBudgetMb too.
  std::uint64_t ownHeapLimits = 0;
  std::set<std::shared_ptr<CallJob>> jobs;
  bool stopping = false;
  std::function<void()> lateChange;  // set before the first call
  std::atomic<std::uint64_t> nextEpoch{1};
  // Revisions whose row in list() changed since changes(), once a consumer asked for them.
  bool trackingChanges = false;
  std::set<std::string> changed;

  void changedLocked(const std::string& revision) {
    if (trackingChanges) changed.insert(revision);
  }

  // The pre-warmed shells: up to config.prewarmed Sandboxes made without a tool (isolate,
  // context, globals), built on the workers after startup and again each time one is taken, so
  // that the first call of a revision whose settings match only compiles and evaluates its
  // module. Each is taken by exactly one sandbox, never given back. Not retained sandboxes:
  // outside list(), maxRetained and memoryBudgetMb.
  std::optional<SandboxSettings> spareSettings;
  std::deque<std::unique_ptr<Sandbox>> spares;  // ready to be taken
  unsigned sparesQueued = 0;                    // builds posted to the workers, not begun
  unsigned sparesRunning = 0;                   // builds under way on a worker
  std::uint64_t sparesBuilt = 0;
  std::uint64_t sparesTaken = 0;
  // A first call waiting for a build under way, suspended on its slot's strand (its worker is
  // free meanwhile, to run another build or call). The next build to end is its shell.
  struct SpareWaiter {
    explicit SpareWaiter(const asio::any_io_executor& strand) : wake(strand) {}
    asio::steady_timer wake;       // cancelled, on the waiter's strand, once answered
    bool answered = false;         // under mutex
    std::unique_ptr<Sandbox> shell;  // under mutex: the answer (nullptr: build one yourself)
  };
  std::deque<std::shared_ptr<SpareWaiter>> spareWaiters;  // oldest first

  void requestSparesLocked() {
    if (stopping || !spareSettings) return;
    while (spares.size() + sparesQueued + sparesRunning < config.prewarmed) {
      ++sparesQueued;
      asio::post(io, [this] { buildSpare(); });
    }
  }

  // On a worker, off every strand.
  void buildSpare() {
    {
      std::lock_guard lock(mutex);
      --sparesQueued;
      if (stopping) return;
      ++sparesRunning;
    }
    std::unique_ptr<Sandbox> shell;  // declared before the lock: a shell not kept is disposed
                                     // after the mutex is released
    try {
      shell = std::make_unique<Sandbox>(nullptr, *spareSettings, watchdog, platform);
    } catch (const std::exception& e) {
      spdlog::warn("runtime: a pre-warmed sandbox could not be built: {}", e.what());
    }
    std::lock_guard lock(mutex);
    --sparesRunning;
    if (!stopping && shell) {
      if (!spareWaiters.empty()) {
        ++sparesBuilt;
        ++sparesTaken;
        answerLocked(std::move(shell));
        requestSparesLocked();
      } else if (spares.size() < config.prewarmed) {
        ++sparesBuilt;
        spares.push_back(std::move(shell));
      }
    }
    // No waiter waits for a build that will not come (this one failed, or the pool stops).
    while (spareWaiters.size() > (stopping ? 0 : sparesRunning)) answerLocked(nullptr);
  }

  void answerLocked(std::unique_ptr<Sandbox> shell) {
    auto waiter = std::move(spareWaiters.front());
    spareWaiters.pop_front();
    waiter->shell = std::move(shell);
    waiter->answered = true;
    asio::post(waiter->wake.get_executor(), [waiter] { waiter->wake.cancel(); });
  }

  // A shell if one was built with `settings` (asking for its replacement), or nullptr. With none
  // ready, a build already under way on another worker and not promised to an earlier waiter is
  // waited for, suspended: it is further along than a sandbox made now would be, and the worker
  // this call leaves is free to start the next build meanwhile.
  asio::awaitable<std::unique_ptr<Sandbox>> takeSpare(const SandboxSettings& settings,
                                                      const asio::any_io_executor& strand) {
    std::shared_ptr<SpareWaiter> waiter;
    {
      std::lock_guard lock(mutex);
      if (spareSettings != settings) co_return nullptr;
      if (!spares.empty()) {
        auto taken = std::move(spares.front());
        spares.pop_front();
        ++sparesTaken;
        requestSparesLocked();
        co_return taken;
      }
      requestSparesLocked();
      if (stopping || sparesRunning <= spareWaiters.size()) co_return nullptr;
      waiter = std::make_shared<SpareWaiter>(strand);
      spareWaiters.push_back(waiter);
    }
    for (;;) {
      {
        std::lock_guard lock(mutex);
        if (waiter->answered) co_return std::move(waiter->shell);
      }
      // The answer's cancel is posted to this strand, which this coroutine holds until it waits.
      waiter->wake.expires_at(asio::steady_timer::time_point::max());
      co_await waiter->wake.async_wait(asio::as_tuple(asio::use_awaitable));
    }
  }

  WorkerThreads workers;  // last: joined first

  void runWorker() {
    while (true) {
      try {
        io.run();
        return;
      } catch (const std::exception& e) {
        spdlog::error("runtime: a V8 worker caught an exception: {}", e.what());
      }
    }
  }

  static CallOutcome failed(const registry::ToolRevisionPtr& tool, CallErrc code,
                            std::string detail) {
    CallOutcome outcome;
    outcome.revision = tool ? tool->revision : "";
    outcome.result = CallError{code, std::move(detail), {}};
    return outcome;
  }

  std::variant<CallOutcome, std::shared_ptr<CallJob>> admit(registry::ToolRevisionPtr tool,
                                                            json::object arguments,
                                                            CallOptions options);
  asio::awaitable<bool> acquire(std::shared_ptr<CallJob> job);
  asio::awaitable<CallOutcome> run(std::shared_ptr<CallJob> job);
  void finish(const std::shared_ptr<CallJob>& job, std::exception_ptr error, CallOutcome outcome);
  void evictLocked();
  void unretainLocked(std::map<std::string, std::shared_ptr<Slot>>::iterator found);
  void disposeLocked(const std::shared_ptr<Slot>& slot);
  CallError killError(Kill kill, const CallJob& job) const;

  // Runs an admitted job on its sandbox's strand; job->deliver gets the outcome. Called only
  // from outside that strand (start() and asyncCall(), on an I/O thread or a test's), so the
  // coroutine never runs inside its caller (see the end of run()).
  void launch(const std::shared_ptr<CallJob>& job) {
    asio::co_spawn(job->slot->strand, run(job),
                   [this, job](std::exception_ptr error, CallOutcome outcome) {
                     finish(job, error, std::move(outcome));
                   });
  }

  template <typename Token>
  auto asyncCall(std::shared_ptr<CallJob> admitted, Token&& token) {
    return asio::async_initiate<Token, void(std::exception_ptr, CallOutcome)>(
        [this](auto handler, std::shared_ptr<CallJob> job) {
          using Handler = decltype(handler);
          auto cancellation = asio::get_associated_cancellation_slot(handler);
          auto executor = asio::get_associated_executor(handler, io.get_executor());
          auto tracked = asio::prefer(executor, asio::execution::outstanding_work.tracked);
          auto shared = std::make_shared<Handler>(std::move(handler));
          job->deliver = [shared, tracked, cancellation](std::exception_ptr error,
                                                         CallOutcome outcome) mutable {
            asio::post(tracked,
                       [shared, cancellation, error, outcome = std::move(outcome)]() mutable {
                         if (cancellation.is_connected()) cancellation.clear();
                         (*shared)(error, std::move(outcome));
                       });
          };
          // After the deliverer: a cancel may use it at once.
          if (cancellation.is_connected()) {
            cancellation.assign([job](asio::cancellation_type type) {
              if ((type & asio::cancellation_type::terminal) != asio::cancellation_type::none) {
                job->cancel("the caller cancelled the call");
              }
            });
          }
          launch(job);
        },
        token, std::move(admitted));
  }
};

SandboxPool::SandboxPool(RuntimeConfig config, CapabilityHost& host) {
  v8::Platform* platform = V8Platform::current();
  if (platform == nullptr) throw std::logic_error("SandboxPool needs a live V8Platform");
  checkRuntimeConfig(config);
  impl_ = std::make_unique<Impl>(std::move(config), host, *platform);
  try {
    for (unsigned i = 0; i < impl_->config.workers; ++i) impl_->workers.add();
  } catch (...) {
    impl_->work.reset();
    impl_->workers.join();
    throw;
  }
  std::lock_guard lock(impl_->mutex);
  impl_->requestSparesLocked();
}

SandboxPool::~SandboxPool() {
  std::vector<std::shared_ptr<CallJob>> live;
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
    live.assign(impl_->jobs.begin(), impl_->jobs.end());
    while (!impl_->spareWaiters.empty()) impl_->answerLocked(nullptr);
  }
  for (const auto& job : live) job->cancel("the runtime is shutting down");
  live.clear();
  impl_->work.reset();
  impl_->workers.join();
  // The workers are gone: what is left is disposed on this thread.
  std::lock_guard lock(impl_->mutex);
  for (auto& [revision, slot] : impl_->retained) slot->sandbox.reset();
  impl_->retained.clear();
  impl_->retainedHeap = 0;
  impl_->spares.clear();
}

const RuntimeConfig& SandboxPool::config() const { return impl_->config; }

asio::awaitable<CallOutcome> SandboxPool::call(registry::ToolRevisionPtr tool,
                                               json::object arguments, CallOptions options) {
  // Already cancelled: the co_await below would throw; answer like any other cancelled call.
  // (Nothing suspends between this check and that co_await, so no cancel can slip in between.)
  auto state = co_await asio::this_coro::cancellation_state;
  if (state.cancelled() != asio::cancellation_type::none) {
    co_return Impl::failed(tool, CallErrc::cancelled, "the caller cancelled the call");
  }
  auto admitted = impl_->admit(std::move(tool), std::move(arguments), std::move(options));
  if (auto* outcome = std::get_if<CallOutcome>(&admitted)) co_return std::move(*outcome);
  co_return co_await impl_->asyncCall(std::get<std::shared_ptr<CallJob>>(std::move(admitted)),
                                      asio::use_awaitable);
}

std::function<void()> SandboxPool::start(registry::ToolRevisionPtr tool, json::object arguments,
                                         CallOptions options, Done done) {
  auto admitted = impl_->admit(std::move(tool), std::move(arguments), std::move(options));
  if (auto* outcome = std::get_if<CallOutcome>(&admitted)) {
    done(nullptr, std::move(*outcome));
    return [] {};
  }
  auto job = std::get<std::shared_ptr<CallJob>>(std::move(admitted));
  job->deliver = std::move(done);
  impl_->launch(job);
  return [weak = std::weak_ptr<CallJob>(job)] {
    if (auto live = weak.lock()) live->cancel("the caller cancelled the call");
  };
}

std::variant<CallOutcome, std::shared_ptr<CallJob>> SandboxPool::Impl::admit(
    registry::ToolRevisionPtr tool, json::object arguments, CallOptions options) {
  if (!tool) throw std::invalid_argument("SandboxPool::call without a tool revision");
  auto admission = admitCall(*tool, options, config);
  if (!admission) {
    CallOutcome outcome;
    outcome.revision = tool->revision;
    outcome.result = std::move(admission.error());
    return outcome;
  }
  const EffectiveLimits& base = admission->base;
  const EffectiveLimits& limits = admission->limits;

  auto job = std::make_shared<CallJob>();
  job->tool = tool;
  job->arguments = std::move(arguments);
  job->watchdog = &watchdog;
  job->tag = options.tag;
  job->call = std::make_shared<CallState>();
  CallState& call = *job->call;
  call.epoch = nextEpoch.fetch_add(1);
  call.tool = tool;
  call.limits = limits;
  call.invocation = std::move(options.invocation);
  call.checkOnly = options.checkOnly;
  if (options.settings != nullptr) {
    call.settingsRevision = std::move(options.settingsRevision);
    call.settings = std::move(options.settings);
  }
  call.host = &host;
  call.maxResultDepth = config.maxResultDepth;
  call.maxLogBytes = config.maxLogBytes;
  job->disposable = admission->ownSandbox;

  std::lock_guard lock(mutex);
  if (stopping) return failed(tool, CallErrc::cancelled, "the runtime is shutting down");
  if (jobs.size() >= config.maxQueuedTotal) {
    return failed(tool, CallErrc::overloaded,
                  "the runtime already has " + std::to_string(jobs.size()) +
                      " calls running or waiting; try again later");
  }
  if (job->disposable) {
    const std::uint64_t heap = static_cast<std::uint64_t>(limits.heapMb) * kMiB;
    const std::uint64_t budget = static_cast<std::uint64_t>(config.memoryBudgetMb) * kMiB;
    if (ownHeapLimits > 0 && ownHeapLimits + heap > budget) {
      return failed(tool, CallErrc::overloaded,
                    "calls in sandboxes of their own (disposable, or with tighter limits) already "
                    "hold heaps of up to " +
                        std::to_string(ownHeapLimits / kMiB) + " MiB of the " +
                        std::to_string(config.memoryBudgetMb) +
                        " MiB of [runtime] memory_budget_mb; try again later");
    }
    ownHeapLimits += heap;
    job->ownHeapReserved = heap;
    job->slot = std::make_shared<Slot>(asio::make_strand(io), tool->revision, tool->name,
                                       SandboxSettings{limits.heapMb, limits.arrayBufferMb}, false);
  } else {
    auto& slot = retained[tool->revision];
    if (!slot) {
      slot = std::make_shared<Slot>(asio::make_strand(io), tool->revision, tool->name,
                                    SandboxSettings{base.heapMb, base.arrayBufferMb}, true);
    } else if (slot->pending >= config.maxQueuedPerSandbox) {
      return failed(tool, CallErrc::overloaded,
                    "the sandbox of " + tool->name + " already has " +
                        std::to_string(slot->pending) + " calls running or waiting");
    }
    job->slot = slot;
    changedLocked(tool->revision);  // now busy
  }
  ++job->slot->pending;
  jobs.insert(job);
  evictLocked();
  return job;
}

asio::awaitable<bool> SandboxPool::Impl::acquire(std::shared_ptr<CallJob> job) {
  Slot& slot = *job->slot;
  if (job->call->cancelRequested.load()) co_return false;
  if (!slot.locked) {
    slot.locked = true;
    co_return true;
  }
  auto waiter = std::make_shared<Waiter>(slot.strand);
  slot.waiters.push_back(waiter);
  job->waiter = waiter;
  job->park();
  co_await waiter->timer.async_wait(asio::as_tuple(asio::use_awaitable));
  job->unpark();
  job->waiter.reset();
  co_return waiter->granted;  // granted: the lock is ours even if a cancel came meanwhile
}

CallError SandboxPool::Impl::killError(Kill kill, const CallJob& job) const {
  const EffectiveLimits& limits = job.call->limits;
  switch (kill) {
    case Kill::timeout:
      return {CallErrc::timeout,
              "the call exceeded its wall-clock limit of " + std::to_string(limits.wallMs) + " ms",
              {}};
    case Kill::cpuLimit:
      return {
          CallErrc::cpuLimit,
          "the call used more than its CPU time limit of " + std::to_string(limits.cpuMs) + " ms",
          {}};
    case Kill::memoryLimit:
      return {CallErrc::memoryLimit,
              "the tool exhausted its heap limit of " + std::to_string(job.slot->settings.heapMb) +
                  " MiB",
              {}};
    case Kill::arrayBufferLimit:
      return {CallErrc::arrayBufferLimit,
              "the tool tried to allocate more than its ArrayBuffer limit of " +
                  std::to_string(job.slot->settings.arrayBufferMb) + " MiB",
              {}};
    case Kill::cancelled:
    case Kill::none:
      break;
  }
  std::string detail = job.cancelDetail();
  return {CallErrc::cancelled, detail.empty() ? "the call was stopped" : detail, {}};
}

asio::awaitable<CallOutcome> SandboxPool::Impl::run(std::shared_ptr<CallJob> job) {
  Slot& slot = *job->slot;
  CallState& call = *job->call;
  CallOutcome outcome;
  outcome.revision = job->tool->revision;
  job->unpark();  // begun: from here a cancel waits for this coroutine, until it parks again

  if (!co_await acquire(job)) {
    outcome.result = killError(Kill::cancelled, *job);
    co_return outcome;
  }
  SlotLock lock(slot);
  if (call.cancelRequested.load()) {
    outcome.result = killError(Kill::cancelled, *job);
    co_return outcome;
  }
  bool condemned = false;
  {
    std::lock_guard guard(mutex);
    slot.running = job;
    std::swap(condemned, slot.condemned);
  }
  if (condemned) slot.sandbox.reset();
  const auto started = Clock::now();
  call.deadline = started + std::chrono::milliseconds(call.limits.wallMs);
  if (!slot.sandbox) {
    job->park();
    auto shell = co_await takeSpare(slot.settings, slot.strand);
    job->unpark();
    if (call.cancelRequested.load()) {  // answered while it waited; the shell goes unused
      outcome.result = killError(Kill::cancelled, *job);
      co_return outcome;
    }
    if (shell) {
      shell->adopt(job->tool);
      slot.sandbox = std::move(shell);
    } else {
      slot.sandbox = std::make_unique<Sandbox>(job->tool, slot.settings, watchdog, platform);
    }
    outcome.usage.freshSandbox = true;
  }
  Sandbox& sandbox = *slot.sandbox;
  job->ran = true;

  asio::steady_timer waker(slot.strand);
  call.wake = [&waker] { waker.cancel(); };
  {
    std::lock_guard guard(call.opsMutex);
    call.post = [strand = slot.strand](std::function<void()> fn) {
      asio::post(strand, std::move(fn));
    };
  }
  sandbox.beginCall(job->call);

  std::optional<CallError> error;
  try {
    Sandbox::Step step = sandbox.start(job->arguments);
    // The call ends when its promise settled (or it failed) and no host operation is
    // outstanding, or when it is cut short. Between segments it holds no V8 lock or handle: only
    // the timer wait below suspends, and completions, cancellation and the end of a wall-clock
    // pause wake it.
    std::optional<Sandbox::Step> failure;  // the first failure; the call still waits for its ops
    while (sandbox.kill() == Kill::none) {
      // Before anything that may run its JavaScript again (resume, the conversion of a result):
      // a cancelled call may have been answered already, while it was parked.
      if (call.cancelRequested.load()) {
        sandbox.stop(Kill::cancelled);
        break;
      }
      // Settled, and converted in that segment: whatever its getters started is aborted at
      // endCall, as for a conversion in a segment of its own.
      if (sandbox.hasResult()) break;
      if (step.progress == Sandbox::Progress::failed && !failure) failure = step;
      const bool finished = failure || step.progress == Sandbox::Progress::settled;
      if (finished && call.outstandingOps == 0) break;
      if (!finished && call.outstandingOps == 0) {
        sandbox.stop(Kill::timeout);
        error = CallError{CallErrc::timeout,
                          "the tool's promise is still pending and nothing it awaits can settle "
                          "it, so the call was ended now instead of at its wall-clock limit of " +
                              std::to_string(call.limits.wallMs) + " ms",
                          {}};
        break;
      }
      if (call.completions.empty()) {
        const CallState::WallClock clock = call.wallClock();
        if (!clock.paused && Clock::now() >= clock.deadline) {
          sandbox.stop(Kill::timeout);
          break;
        }
        // While an operation holds the clock paused there is no deadline; its resume wakes us.
        waker.expires_at(clock.paused ? Clock::time_point::max() : clock.deadline);
        job->park();
        co_await waker.async_wait(asio::as_tuple(asio::use_awaitable));
        job->unpark();
        continue;
      }
      step = sandbox.resume();
    }
    if (failure) step = *failure;
    if (!error && sandbox.kill() == Kill::none) {
      if (step.progress == Sandbox::Progress::failed) {
        error = step.error.value_or(CallError{CallErrc::cancelled, "the call was stopped", {}});
      } else {
        auto value = sandbox.result();
        if (sandbox.kill() == Kill::none) {
          if (value) {
            outcome.result = std::move(*value);
          } else {
            error = std::move(value.error());
          }
        }
      }
    }
  } catch (...) {
    sandbox.endCall();
    slot.sandbox.reset();
    throw;
  }
  const Kill kill = sandbox.kill();
  if (kill != Kill::none && (!error || error->code != CallErrc::timeout)) {
    error = killError(kill, *job);
  }
  sandbox.endCall();
  if (error) outcome.result = std::move(*error);

  outcome.usage.wallMs = millisSince(started);
  outcome.usage.cpuMs = call.cpuUsedNs / 1'000'000;
  outcome.usage.heapPeakBytes = call.heapPeakBytes;
  outcome.logs = std::move(call.logs);

  bool stillRetained;
  {
    std::lock_guard guard(mutex);
    stillRetained = slot.retained;
  }
  // Any kill or failure at the boundary discards the sandbox, so nothing of this call (a pending
  // termination, a half-built module, a stuck promise) reaches the next one. A tool that threw
  // keeps its sandbox: its state is whatever its own code left.
  const bool discard = job->disposable || !stillRetained || kill != Kill::none ||
                       (error && error->code != CallErrc::toolThrew);
  job->heapBytes = sandbox.heapBytes();
  if (discard) {
    if (error && error->code != CallErrc::toolThrew) {
      spdlog::debug("runtime: sandbox of {} ({}) discarded: {}", job->tool->name,
                    job->tool->revision, error->detail);
    }
    slot.sandbox.reset();
  }
  job->sandboxKept = static_cast<bool>(slot.sandbox);
  // A warm call that settles in its first segment never suspends, and co_spawn then posts once
  // more before its completion handler (lest a handler run inside the co_spawn call that started
  // it). Here that cannot be: launch() runs on an I/O thread, never on this strand, so the
  // body already runs in a handler of its own. The post would only wake an idle V8 worker for
  // nothing (about one context switch per call). Boost 1.81 exposes the flag co_spawn reads
  // only in asio::detail; a Boost without it fails to compile here, it cannot fail silently.
  (co_await asio::detail::awaitable_thread_has_context_switched{}) = true;
  co_return outcome;
}

void SandboxPool::Impl::finish(const std::shared_ptr<CallJob>& job, std::exception_ptr error,
                               CallOutcome outcome) {
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      spdlog::error("runtime: call of {} failed with an exception: {}", job->tool->name, e.what());
    } catch (...) {
      spdlog::error("runtime: call of {} failed with an unknown exception", job->tool->name);
    }
  }
  {
    std::lock_guard lock(mutex);
    Slot& slot = *job->slot;
    --slot.pending;
    jobs.erase(job);
    ownHeapLimits -= std::exchange(job->ownHeapReserved, 0);
    if (!job->disposable) changedLocked(slot.revision);
    if (job->ran) {
      ++slot.calls;
      slot.lastUsed = Clock::now();
      if (slot.retained) retainedHeap = retainedHeap - slot.heapBytes + job->heapBytes;
      slot.heapBytes = job->heapBytes;
      slot.hasSandbox = job->sandboxKept;
    }
    if (slot.pending == 0 && (slot.condemned || slot.leaving)) {
      // Terminated while calls waited, and none ran after it (cancelled, or the one running
      // kept its sandbox), or its binding moved while calls held it: it goes now.
      slot.condemned = false;
      slot.leaving = false;
      if (slot.retained) unretainLocked(retained.find(slot.revision));
      if (slot.hasSandbox) disposeLocked(job->slot);
    } else if (slot.pending == 0) {
      if (slot.retained && !slot.hasSandbox) {
        unretainLocked(retained.find(slot.revision));  // nothing left to retain (failed first call, discarded)
      } else if (!slot.retained && slot.hasSandbox) {
        disposeLocked(job->slot);  // detached while it ran
      }
    }
    evictLocked();
  }
  // Nothing to deliver for a call already answered when its cancel came while it was parked.
  if (auto deliver = job->takeDeliver()) {
    deliver(error, std::move(outcome));
  } else if (lateChange) {
    lateChange();
  }
}

void SandboxPool::onLateChange(std::function<void()> listener) {
  impl_->lateChange = std::move(listener);
}

void SandboxPool::Impl::disposeLocked(const std::shared_ptr<Slot>& slot) {
  slot->hasSandbox = false;
  asio::post(slot->strand, [slot] {
    if (!slot->locked) slot->sandbox.reset();
  });
}

void SandboxPool::Impl::unretainLocked(std::map<std::string, std::shared_ptr<Slot>>::iterator found) {
  retainedHeap -= found->second->heapBytes;
  found->second->retained = false;
  retained.erase(found);
}

void SandboxPool::Impl::evictLocked() {
  const std::uint64_t budget = static_cast<std::uint64_t>(config.memoryBudgetMb) * kMiB;
  auto within = [&] { return retained.size() <= config.maxRetained && retainedHeap <= budget; };
  if (within()) return;
  std::vector<std::shared_ptr<Slot>> idle;
  for (const auto& [revision, slot] : retained) {
    if (slot->pending == 0) idle.push_back(slot);
  }
  std::sort(idle.begin(), idle.end(),
            [](const auto& a, const auto& b) { return a->lastUsed < b->lastUsed; });
  for (const auto& slot : idle) {
    if (within()) break;
    spdlog::debug("runtime: evicting the idle sandbox of {} ({})", slot->name, slot->revision);
    unretainLocked(retained.find(slot->revision));
    changedLocked(slot->revision);
    disposeLocked(slot);
  }
}

namespace {

SandboxInfo infoOf(const Slot& slot, Clock::time_point now) {
  SandboxInfo info;
  info.revision = slot.revision;
  info.name = slot.name;
  info.calls = slot.calls;
  info.heapBytes = slot.heapBytes;
  info.busy = slot.pending > 0;
  info.idleMs =
      info.busy
          ? 0
          : std::chrono::duration_cast<std::chrono::milliseconds>(now - slot.lastUsed).count();
  return info;
}

// Rows least recently used first.
std::vector<SandboxInfo> byLastUse(std::vector<const Slot*> slots, Clock::time_point now) {
  std::sort(slots.begin(), slots.end(),
            [](const Slot* a, const Slot* b) { return a->lastUsed < b->lastUsed; });
  std::vector<SandboxInfo> out;
  out.reserve(slots.size());
  for (const Slot* slot : slots) out.push_back(infoOf(*slot, now));
  return out;
}

}  // namespace

std::vector<SandboxInfo> SandboxPool::list() const {
  std::lock_guard lock(impl_->mutex);
  std::vector<const Slot*> slots;
  slots.reserve(impl_->retained.size());
  for (const auto& [revision, slot] : impl_->retained) slots.push_back(slot.get());
  return byLastUse(std::move(slots), Clock::now());
}

SandboxPool::Changes SandboxPool::changes() {
  std::lock_guard lock(impl_->mutex);
  std::vector<const Slot*> slots;
  Changes out;
  if (!impl_->trackingChanges) {
    impl_->trackingChanges = true;
    for (const auto& [revision, slot] : impl_->retained) slots.push_back(slot.get());
  } else {
    for (const auto& revision : impl_->changed) {
      auto found = impl_->retained.find(revision);
      if (found == impl_->retained.end()) {
        out.removed.push_back(revision);
      } else {
        slots.push_back(found->second.get());
      }
    }
    impl_->changed.clear();
  }
  out.updated = byLastUse(std::move(slots), Clock::now());
  return out;
}

bool SandboxPool::terminate(const std::string& revision) {
  std::shared_ptr<CallJob> running;
  {
    std::lock_guard lock(impl_->mutex);
    auto found = impl_->retained.find(revision);
    if (found == impl_->retained.end()) return false;
    auto slot = found->second;
    impl_->changedLocked(revision);
    if (slot->pending == 0) {
      impl_->unretainLocked(found);
      impl_->disposeLocked(slot);
    } else {
      // Calls wait for it: the slot stays, so that they still run one at a time, in order, and
      // new calls of the revision queue behind them (an unretained slot would run each in a
      // throwaway sandbox while new calls started a retained one beside them). The running call
      // is cancelled, which discards its sandbox; if none runs, the next call discards it.
      slot->condemned = true;
      running = slot->running.lock();
    }
  }
  if (running) running->cancel("the sandbox was terminated by an administrator");
  return true;
}

SandboxPool::Spares SandboxPool::spares() const {
  std::lock_guard lock(impl_->mutex);
  return Spares{impl_->spares.size(), impl_->sparesBuilt, impl_->sparesTaken};
}

std::vector<StalledCall> SandboxPool::stalled(std::chrono::milliseconds grace) const {
  auto overdue = impl_->watchdog.overdue(grace);
  if (overdue.empty()) return {};
  std::vector<StalledCall> out;
  std::lock_guard lock(impl_->mutex);
  for (const auto& job : impl_->jobs) {
    for (const auto& segment : overdue) {
      if (segment.epoch == job->call->epoch) out.push_back({job->tag, segment.reason});
    }
  }
  return out;
}

void SandboxPool::discard(const std::string& revision) {
  std::lock_guard lock(impl_->mutex);
  auto found = impl_->retained.find(revision);
  if (found == impl_->retained.end()) return;
  auto slot = found->second;
  if (slot->pending > 0) {
    // Calls hold it. Unretained now, the calls waiting would each run in a throwaway sandbox
    // while new calls of the revision (by revision, or resolved just before the move) started a
    // retained one beside them: two sandboxes of one revision running at once. It stays until
    // the last call holding it ends (finish()).
    slot->leaving = true;
    return;
  }
  impl_->unretainLocked(found);
  impl_->changedLocked(revision);
  impl_->disposeLocked(slot);
}

}  // namespace toolhost::runtime
