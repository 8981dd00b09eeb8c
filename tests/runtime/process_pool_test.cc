// ProcessSandboxPool end to end: real sandbox host processes (runtime_sandbox_host, started as
// toolhostd starts itself with --sandbox-host), real isolates in them, the daemon's side in this
// process. What must hold: calls behave as in process; a tool that aborts V8 or stalls it in a
// builtin costs its host process, never this one; the host is restarted; capabilities, operations
// and cancellation cross the socket; nothing leaks (fds, zombies).
#include "runtime/base64.h"
#include "runtime/call_state.h"
#include "runtime/process_sandbox_pool.h"
#include "tests/runtime/runtime_test_support.h"
#include "tests/support/temp_dir.h"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/local/connect_pair.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/json/parse.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

using namespace toolhost::runtime;
using namespace toolhost::runtime::testing;
namespace asio = boost::asio;
namespace json = boost::json;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

// The manifest member that lets a tool make quick requests (ctx.resolveInvocation, ...).
const json::object kSubtasks{{"capabilities", json::object{{"subtasks", true}}}};

constexpr std::int64_t kGraceMs = 300;

json::object limits(json::object values) { return json::object{{"limits", std::move(values)}}; }

RuntimeConfig processConfig(unsigned processes = 1) {
  RuntimeConfig config = testConfig();
  config.processes = processes;
  config.killGraceMs = kGraceMs;  // short, so the kill tests stay fast
  return config;
}

SandboxLaunch testLaunch() { return SandboxLaunch{TOOLHOST_TEST_SANDBOX_HOST, {"--sandbox-host"}}; }

// The daemon's side: an io_context run by a thread of its own (the daemon's I/O threads), a
// recording host, and the pool. The pool goes first, then the I/O.
struct ProcessFixture {
  explicit ProcessFixture(RuntimeConfig config = processConfig(), SandboxLaunch launch = testLaunch())
      : work(asio::make_work_guard(io)), runner([this] { io.run(); }) {
    pool = std::make_unique<ProcessSandboxPool>(std::move(config), host, std::move(launch),
                                                io.get_executor());
  }
  ~ProcessFixture() {
    pool.reset();
    work.reset();
    io.stop();
    runner.join();
  }
  ProcessFixture(const ProcessFixture&) = delete;
  ProcessFixture& operator=(const ProcessFixture&) = delete;

  CallOutcome call(const toolhost::registry::ToolRevisionPtr& tool,
                   const json::object& arguments = {}, CallOptions options = {}) {
    return callTool(*pool, tool, arguments, std::move(options));
  }
  int pid(std::size_t slot = 0) const { return pool->processIds().at(slot); }

  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work;
  std::thread runner;
  FakeHost host;
  std::unique_ptr<ProcessSandboxPool> pool;
};

std::int64_t millisSince(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
}

// This process's open descriptors.
std::size_t openFds() {
  std::size_t count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)entry;
    ++count;
  }
  return count;
}

std::string describeFds() {
  std::string out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    out += entry.path().filename().string() + " -> " +
           std::filesystem::read_symlink(entry.path(), error).string() + "\n";
  }
  return out;
}

// The CPU time a process has used, in clock ticks (utime + stime of /proc/PID/stat).
long cpuTicks(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  long ticks = 0;
  for (int i = 3; fields >> field && i <= 15; ++i) {
    if (i >= 14) ticks += std::stol(field);
  }
  return ticks;
}

// This process's children: pid -> state letter ('Z' for a zombie nobody reaped).
std::map<int, char> children() {
  std::map<int, char> out;
  const int self = ::getpid();
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    int parent = 0;
    rest >> state >> parent;
    if (parent == self) out[std::stoi(name)] = state;
  }
  return out;
}

// A tool whose module counts its calls.
toolhost::registry::ToolRevisionPtr counterTool(const std::string& name = "counter") {
  return makeTool("let calls = 0; export default () => ++calls;", {}, {}, name);
}

// The same tool under a fixed revision (the process a revision goes to is a hash of it).
toolhost::registry::ToolRevisionPtr withRevision(const toolhost::registry::ToolRevisionPtr& tool,
                                                 std::string revision) {
  auto copy = std::make_shared<toolhost::registry::ToolRevision>(*tool);
  copy->revision = std::move(revision);
  return copy;
}

json::value fetchReply(int status, std::string_view body) {
  return json::object{{"status", status},
                      {"statusText", "OK"},
                      {"url", "https://api.example/"},
                      {"headers", json::array{}},
                      {"bodyBase64", base64Encode(body)}};
}

// Host operations the fake host keeps, and how many of their aborts ran.
struct HeldOperations {
  std::mutex mutex;
  std::vector<std::shared_ptr<HostOperation>> operations;
  std::atomic<int> aborts{0};

  void hold(FakeHost& host) {
    host.onOperation(
        [this](const std::string&, const json::value&, std::shared_ptr<HostOperation> operation) {
          operation->onAbort([this] { ++aborts; });
          std::lock_guard lock(mutex);
          operations.push_back(std::move(operation));
        });
  }
  std::size_t size() {
    std::lock_guard lock(mutex);
    return operations.size();
  }
};

// A builtin that loops in C++ without checking for termination (V8 10.2): minutes and GBs.
const char* kStallingFill = "export default () => new Array(5e7).fill(0).length";

}  // namespace

TEST_CASE("calls run in a sandbox host process and keep their module state", "[process]") {
  ProcessFixture f;
  auto tool = makeTool(
      "let calls = 0; export default async (args, ctx) => ({n: ++calls, sum: args.a + args.b, "
      "tool: ctx.tool})");
  auto first = f.call(tool, {{"a", 2}, {"b", 40}});
  INFO(describe(first));
  REQUIRE(first.result);
  CHECK(*first.result == json::parse(R"({"n":1,"sum":42,"tool":{"name":"test-tool","revision":")" +
                                     tool->revision + R"("}})"));
  CHECK(first.revision == tool->revision);
  CHECK(first.usage.freshSandbox);
  CHECK(first.usage.heapPeakBytes > 0);
  const int pid = f.pid();
  CHECK(pid > 0);
  CHECK(pid != ::getpid());

  auto second = f.call(tool, {{"a", 1}, {"b", 1}});
  REQUIRE(second.result);
  CHECK(second.result->at("n") == 2);
  CHECK_FALSE(second.usage.freshSandbox);

  CallOptions disposable;
  disposable.mode = CallOptions::Mode::disposable;
  auto isolated = f.call(tool, {{"a", 0}, {"b", 0}}, disposable);
  REQUIRE(isolated.result);
  CHECK(isolated.result->at("n") == 1);
  CHECK(isolated.usage.freshSandbox);
  CHECK(f.call(tool, {{"a", 0}, {"b", 0}}).result->at("n") == 3);

  auto list = f.pool->list();
  REQUIRE(list.size() == 1);
  CHECK(list[0].revision == tool->revision);
  CHECK(list[0].name == "test-tool");
  CHECK(list[0].calls == 3);
  CHECK(list[0].heapBytes > 0);
  CHECK_FALSE(list[0].busy);
  CHECK(f.pid() == pid);  // one process served them all

  SECTION("console output, results of every JSON kind and large results come back intact") {
    auto echo = makeTool(R"(export default (args) => {
        console.log('got', args.text.length);
        return {text: args.text, n: 1.5, big: 2 ** 60, t: true, z: null, list: [1, 'two', {}]};
      })",
                         limits({{"outputBytes", 8 * 1024 * 1024}}));
    std::string text(3 * 1024 * 1024, 'x');
    text += "\xc3\xa9\n\"\\";
    auto outcome = f.call(echo, {{"text", text}});
    INFO(describe(outcome).substr(0, 200));
    REQUIRE(outcome.result);
    CHECK(outcome.result->at("text").as_string() == text);
    CHECK(outcome.result->at("n") == 1.5);
    CHECK(outcome.result->at("list") == json::parse(R"([1,"two",{}])"));
    CHECK(outcome.logs == "[log] got " + std::to_string(3 * 1024 * 1024 + 4) + "\n");  // UTF-16
  }
}

TEST_CASE("random values and digests work in a confined sandbox host", "[process][web]") {
  ProcessFixture f;
  auto outcome = f.call(
      makeTool("export default async () => { const hex = (b) => Array.from(new Uint8Array(b), "
               "(x) => x.toString(16).padStart(2, '0')).join(''); "
               "return [crypto.getRandomValues(new Uint8Array(64)).some((x) => x !== 0), "
               "crypto.randomUUID().length, "
               "hex(await crypto.subtle.digest('SHA-256', new TextEncoder().encode('abc'))), "
               "hex(await crypto.subtle.digest('SHA-1', new Uint8Array(0)))]; }"));
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(
      *outcome.result ==
      json::parse(R"([true,36,"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",)"
                  R"("da39a3ee5e6b4b0d3255bfef95601890afd80709"])"));
}

TEST_CASE("a sandbox host holds nothing of the daemon's but its socket", "[process]") {
  // A descriptor the daemon opened without close-on-exec (as some libraries do).
  toolhost::testing::TempDir dir;
  const std::string leaky = (dir.path() / "leaky").string();
  const int open = ::open(leaky.c_str(), O_CREAT | O_RDWR, 0600);
  REQUIRE(open >= 0);
  ProcessFixture f;
  REQUIRE(f.call(counterTool()).result);
  const std::string proc = "/proc/" + std::to_string(f.pid());
  std::map<int, std::string> fds;
  for (const auto& entry : std::filesystem::directory_iterator(proc + "/fd")) {
    std::error_code error;
    fds[std::stoi(entry.path().filename().string())] =
        std::filesystem::read_symlink(entry.path(), error).string();
  }
  ::close(open);
  INFO([&] {
    std::string listed;
    for (const auto& [fd, target] : fds) listed += std::to_string(fd) + " -> " + target + "\n";
    return listed;
  }());
  CHECK(fds.at(0) == "/dev/null");
  CHECK_THAT(fds.at(3), Catch::StartsWith("socket:"));
  for (const auto& [fd, target] : fds) CHECK(target != leaky);
  std::ifstream score(proc + "/oom_score_adj");
  int adjust = 0;
  score >> adjust;
  CHECK(adjust == 1000);
}

TEST_CASE("limits and failures come through the process with their codes", "[process]") {
  ProcessFixture f;
  struct Case {
    const char* source;
    json::object limits;
    CallErrc code;
  };
  const Case cases[] = {
      {"export default () => { for (;;) {} }",
       {{"wallMs", 300}, {"cpuMs", 10000}},
       CallErrc::timeout},
      {"export default () => { for (;;) {} }",
       {{"wallMs", 10000}, {"cpuMs", 200}},
       CallErrc::cpuLimit},
      {"export default () => { const keep = []; for (;;) keep.push(new Array(100000).fill(1.5)); "
       "}",
       {{"heapMb", 16}},
       CallErrc::memoryLimit},
      {"export default () => new ArrayBuffer(64 * 1024 * 1024)",
       {{"arrayBufferMb", 8}},
       CallErrc::arrayBufferLimit},
      {"const f = () => f(); export default () => f()", {}, CallErrc::stackLimit},
      {"export default () => 'x'.repeat(5000)", {{"outputBytes", 1000}}, CallErrc::outputTooLarge},
      {"export default () => ({f() {}})", {}, CallErrc::invalidResult},
      {"export default 42", {}, CallErrc::invalidModule},
      {"export default () => new Promise(() => {})", {}, CallErrc::timeout},
  };
  for (const auto& c : cases) {
    auto outcome = f.call(makeTool(c.source, limits(c.limits)));
    INFO(c.source << "\n" << describe(outcome));
    CHECK(errc(outcome) == c.code);
  }
  SECTION("a thrown error keeps its details") {
    auto outcome = f.call(makeTool(
        "export default () => { throw Object.assign(new TypeError('bad input'), {code: 'E_BAD'}) "
        "}"));
    REQUIRE(errc(outcome) == CallErrc::toolThrew);
    CHECK(outcome.result.error().detail == "the tool threw: TypeError: bad input");
    CHECK(outcome.result.error().toolError.at("code") == "E_BAD");
    CHECK(outcome.result.error().toolError.at("name") == "TypeError");
  }
  SECTION("what the daemon refuses without asking a process") {
    auto tool = makeTool("export default () => 1", limits({{"wallMs", 1000}}));
    CallOptions looser;
    looser.limits.wallMs = 5000;
    CHECK(errc(f.call(tool, {}, looser)) == CallErrc::invalidLimits);
    auto native = std::make_shared<toolhost::registry::ToolRevision>(*tool);
    native->executionClass = toolhost::registry::ExecutionClass::trustedNative;
    CHECK(errc(f.call(native)) == CallErrc::notRunnable);
  }
  // Every limit was enforced inside the host: it is still the same process.
  const int pid = f.pid();
  CHECK(*f.call(makeTool("export default () => 'fine'")).result == "fine");
  CHECK(f.pid() == pid);
}

TEST_CASE("a fatal V8 error ends only the sandbox process, the next call restarts it",
          "[process][crash]") {
  ProcessFixture f;
  auto counter = counterTool();
  REQUIRE(*f.call(counter).result == 1);
  const int before = f.pid();
  auto fatal = makeTool("export default () => 'x'.repeat(2 ** 28).split('').length",
                        limits({{"heapMb", 16}}));
  auto outcome = f.call(fatal);
  INFO(describe(outcome));
  REQUIRE(errc(outcome) == CallErrc::sandboxCrashed);
  CHECK_THAT(outcome.result.error().detail, Catch::Contains("ended unexpectedly"));
  CHECK(outcome.revision == fatal->revision);
  CHECK(f.pool->list().empty());  // its sandboxes went with it
  // This process (the daemon) is still here, and the next call gets a new host.
  auto next = f.call(counter);
  INFO(describe(next));
  REQUIRE(next.result);
  CHECK(*next.result == 1);  // a fresh sandbox: module state did not survive
  CHECK(next.usage.freshSandbox);
  CHECK(f.pid() != before);
  CHECK(f.pid() > 0);
}

TEST_CASE("a builtin that ignores termination costs its process, within the grace",
          "[process][stall]") {
  ProcessFixture f;
  auto counter = counterTool();
  REQUIRE(*f.call(counter).result == 1);
  const int before = f.pid();
  // With a 64 MiB heap the fill is still under the heap limit at its 300 ms wall limit.
  auto stall = makeTool(kStallingFill, limits({{"wallMs", 300}, {"heapMb", 64}}));

  SECTION("at its wall-clock limit") {
    const auto start = Clock::now();
    auto outcome = f.call(stall);
    const auto took = millisSince(start);
    INFO(describe(outcome) << " after " << took << " ms");
    REQUIRE(errc(outcome) == CallErrc::timeout);
    CHECK(outcome.result.error().detail ==
          "the call did not stop at its wall-clock limit of 300 ms; its sandbox process was "
          "killed");
    CHECK(took >= 300 + kGraceMs);
    CHECK(took < 300 + kGraceMs + 1500);
  }
  SECTION("at its heap limit, which it reaches first (the watchdog's grace starts there)") {
    auto small = makeTool(kStallingFill, limits({{"wallMs", 5000}, {"heapMb", 16}}));
    const auto start = Clock::now();
    auto outcome = f.call(small);
    const auto took = millisSince(start);
    INFO(describe(outcome) << " after " << took << " ms");
    REQUIRE(errc(outcome) == CallErrc::memoryLimit);
    CHECK(outcome.result.error().detail ==
          "the call did not stop at its heap limit of 16 MiB; its sandbox process was killed");
    CHECK(took < 5000);  // long before its wall clock
  }
  SECTION("the other calls of that process end with sandboxCrashed") {
    auto busy = makeTool(
        "export default () => { const end = Date.now() + 5000; while (Date.now() < end) {} }",
        limits({{"wallMs", 10000}, {"cpuMs", 10000}}), {}, "busy");
    auto outcomes = callTogether(*f.pool, {{stall, {}, {}}, {busy, {}, {}}});
    INFO(describe(outcomes[0]) << " / " << describe(outcomes[1]));
    CHECK(errc(outcomes[0]) == CallErrc::timeout);
    REQUIRE(errc(outcomes[1]) == CallErrc::sandboxCrashed);
    CHECK_THAT(outcomes[1].result.error().detail, Catch::Contains("another call"));
    CHECK(outcomes[1].usage.wallMs < 3000);
  }
  SECTION("cancelled, it is killed once the grace has passed") {
    auto patient = makeTool(kStallingFill, limits({{"wallMs", 30000}, {"heapMb", 128}}));
    const auto start = Clock::now();
    auto outcome = callAndCancel(*f.pool, patient, milliseconds(150));
    const auto took = millisSince(start);
    INFO(describe(outcome) << " after " << took << " ms");
    REQUIRE(errc(outcome) == CallErrc::cancelled);
    CHECK(outcome.result.error().detail ==
          "the call was cancelled and did not stop; its sandbox process was killed");
    CHECK(took < 150 + kGraceMs + 1500);
  }
  // The process was replaced; the daemon's side is fine.
  auto next = f.call(counter);
  INFO(describe(next));
  REQUIRE(next.result);
  CHECK(*next.result == 1);
  CHECK(f.pid() != before);
}

TEST_CASE("a sandbox host killed from outside is noticed and replaced", "[process][crash]") {
  ProcessFixture f;
  auto counter = counterTool();
  REQUIRE(*f.call(counter).result == 1);
  const int first = f.pid();
  REQUIRE(first > 0);
  // For the SIGSTOP sections: a call that outlasts its 200 ms, and the process stopped 100 ms in.
  auto slow = makeTool(
      "export default () => { const end = Date.now() + 2000; while (Date.now() < end) {} }",
      limits({{"wallMs", 200}, {"cpuMs", 10000}}), {}, "slow");
  auto stopSoon = [first] {
    return std::thread([first] {
      std::this_thread::sleep_for(milliseconds(100));
      ::kill(first, SIGSTOP);
    });
  };

  SECTION("while idle") {
    REQUIRE(::kill(first, SIGKILL) == 0);
    CHECK(waitFor([&] { return f.pid() == 0; }));  // the daemon saw it go
    auto next = f.call(counter);
    REQUIRE(next.result);
    CHECK(*next.result == 1);
    CHECK(f.pid() != first);
  }
  SECTION("while a call runs in it") {
    auto spin = makeTool("export default () => { for (;;) {} }",
                         limits({{"wallMs", 30000}, {"cpuMs", 30000}}), {}, "spin");
    std::thread killer([first] {
      std::this_thread::sleep_for(milliseconds(300));
      ::kill(first, SIGKILL);
    });
    const auto start = Clock::now();
    auto outcome = f.call(spin);
    killer.join();
    INFO(describe(outcome));
    REQUIRE(errc(outcome) == CallErrc::sandboxCrashed);
    CHECK_THAT(outcome.result.error().detail, Catch::Contains("ended unexpectedly"));
    CHECK(millisSince(start) < 15000);  // noticed, not the 30 s wall limit
    auto next = f.call(counter);
    REQUIRE(next.result);
    CHECK(*next.result == 1);
  }
  SECTION("stopped (SIGSTOP) with a call past its wall clock: the ping goes unanswered") {
    std::thread stopper = stopSoon();
    const auto start = Clock::now();
    auto outcome = f.call(slow);
    stopper.join();
    const auto took = millisSince(start);
    INFO(describe(outcome) << " after " << took << " ms");
    REQUIRE(errc(outcome) == CallErrc::timeout);
    CHECK_THAT(outcome.result.error().detail, Catch::Contains("stopped responding"));
    CHECK(took < 200 + 2 * kGraceMs + 1500);
    CHECK(*f.call(counter).result == 1);
  }
  SECTION("stopped (SIGSTOP) after its caller cancelled it: the call ends cancelled") {
    std::thread stopper = stopSoon();
    auto outcome = callAndCancel(*f.pool, slow, milliseconds(150));
    stopper.join();
    INFO(describe(outcome));
    REQUIRE(errc(outcome) == CallErrc::cancelled);
    CHECK(*f.call(counter).result == 1);
  }
}

TEST_CASE("repeated crashes make calls fail fast until the window passes", "[process][crash]") {
  RuntimeConfig config = processConfig();
  config.maxRestarts = 2;
  config.restartWindowMs = 8000;  // all three ends fall within it on a slow machine too
  ProcessFixture f(config);
  auto fatal = makeTool("export default () => 'x'.repeat(2 ** 28).split('').length",
                        limits({{"heapMb", 16}}));
  auto counter = counterTool();
  // Started, ended, restarted twice (max_restarts), ended each time: then it fails fast.
  CHECK(errc(f.call(fatal)) == CallErrc::sandboxCrashed);
  CHECK(errc(f.call(fatal)) == CallErrc::sandboxCrashed);
  CHECK(errc(f.call(fatal)) == CallErrc::sandboxCrashed);
  auto refused = f.call(counter);
  INFO(describe(refused));
  REQUIRE(errc(refused) == CallErrc::sandboxCrashed);
  const std::string detail = refused.result.error().detail;
  CHECK_THAT(detail, Catch::Contains("3 times within 8000 ms"));
  CHECK(f.pid() == 0);  // without starting anything
  // "...; calls fail for another N ms": once the oldest end has left the window, calls work.
  const auto forAnother = detail.find("for another ");
  REQUIRE(forAnother != std::string::npos);
  const long waitMs = std::stol(detail.substr(forAnother + 12));
  REQUIRE(waitMs > 0);
  REQUIRE(waitMs <= 8000);
  std::this_thread::sleep_for(milliseconds(waitMs + 100));
  auto later = f.call(counter);
  INFO(describe(later));
  CHECK(later.result);
}

TEST_CASE("cancellation crosses the socket", "[process][cancel]") {
  ProcessFixture f;
  auto tool = makeTool(
      "let calls = 0; export default (args) => { calls++; if (args.spin) for (;;) {} return calls; "
      "}",
      limits({{"wallMs", 30000}, {"cpuMs", 30000}}));
  REQUIRE(*f.call(tool).result == 1);
  const int pid = f.pid();
  asio::io_context io;
  asio::cancellation_signal signal;
  std::optional<CallOutcome> out;
  json::object args{{"spin", true}};
  asio::co_spawn(
      io, f.pool->call(tool, args, {}),
      asio::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr, CallOutcome outcome) {
        out = std::move(outcome);
      }));
  asio::steady_timer timer(io, milliseconds(200));
  auto cancelledAt = Clock::now();
  timer.async_wait([&](boost::system::error_code) {
    cancelledAt = Clock::now();
    signal.emit(asio::cancellation_type::terminal);
  });
  io.run();
  REQUIRE(out);
  INFO(describe(*out));
  REQUIRE(errc(*out) == CallErrc::cancelled);
  CHECK(out->result.error().detail == "the caller cancelled the call");
  CHECK(Clock::now() - cancelledAt < milliseconds(3000));  // at once, not after the grace
  auto next = f.call(tool);  // the cancelled call's sandbox was discarded
  CHECK(*next.result == 1);
  CHECK(f.pid() == pid);  // by the host's own watchdog: the process lives on
}

TEST_CASE("a cancel of a call waiting for a worker is answered at once, and its host lives on",
          "[process][cancel]") {
  ProcessFixture f;  // two V8 workers in the host
  auto spinLimits = limits({{"wallMs", 30000}, {"cpuMs", 30000}});
  auto spinA = makeTool("export default () => { for (;;) {} }", spinLimits, {}, "spin-a");
  auto spinB = makeTool("export default () => { for (;;) {} }", spinLimits, {}, "spin-b");
  auto quick = makeTool("export default () => 'ran'", {}, {}, "quick");
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  asio::cancellation_signal signal;
  std::atomic<bool> answered{false};
  std::atomic<int> spinsEnded{0};
  std::optional<CallOutcome> out;  // read after the join
  for (const auto& spin : {spinA, spinB}) {
    asio::co_spawn(io, f.pool->call(spin, {}, {}),
                   [&](std::exception_ptr, CallOutcome) { ++spinsEnded; });
  }
  std::thread caller([&] { io.run(); });
  StopAndJoin stopAndJoin{io, caller};
  // Both workers spin (their sandboxes show busy), then the quick call comes.
  REQUIRE(waitFor([&] {
    const auto listed = f.pool->list();
    return std::count_if(listed.begin(), listed.end(),
                         [](const SandboxInfo& info) { return info.busy; }) == 2;
  }));
  asio::post(io, [&] {
    asio::co_spawn(
        io, f.pool->call(quick, {}, {}),
        asio::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr, CallOutcome outcome) {
          out = std::move(outcome);
          answered = true;
        }));
  });
  std::this_thread::sleep_for(milliseconds(200));
  REQUIRE_FALSE(answered);
  const int pid = f.pid();
  asio::post(io, [&] { signal.emit(asio::cancellation_type::terminal); });
  // Answered without a free worker (both spin for 30 s).
  const bool prompt = waitFor([&] { return answered.load(); }, milliseconds(5000));
  // Well past the daemon's deadline for the cancel: the host answered it, so it is not killed.
  std::this_thread::sleep_for(milliseconds(2 * kGraceMs + 1500));
  const int spinsEndedThen = spinsEnded.load();
  CHECK(f.pid() == pid);
  CHECK(f.pool->terminate(spinA->revision));
  CHECK(f.pool->terminate(spinB->revision));
  REQUIRE(waitFor([&] { return answered && spinsEnded == 2; }));
  work.reset();
  caller.join();
  CHECK(prompt);
  CHECK(spinsEndedThen == 0);
  REQUIRE(out);
  INFO(describe(*out));
  CHECK(errc(*out) == CallErrc::cancelled);
  // The cancelled call never ran: once a worker was free it left no sandbox, and the host said
  // so to the daemon.
  CHECK(waitFor([&] { return f.pool->list().empty(); }));
  CHECK(*f.call(quick).result == "ran");
  CHECK(f.pid() == pid);
}

TEST_CASE("quick capabilities reach the daemon's host through the socket", "[process][ctx]") {
  ProcessFixture f;
  auto tool = makeTool(R"(export default async (args, ctx) => {
      const resolved = await ctx.resolveInvocation('weather');
      let missing;
      try { await ctx.resolveInvocation('missing'); } catch (e) { missing = e.message; }
      const tasks = await ctx.createSubtasksResult([{kind: 'call', name: 'weather'}]);
      return {resolved, missing, tasks};
    })",
                       json::object{{"capabilities", json::object{{"subtasks", true}}}});
  CallOptions options;
  options.invocation = {{"taskId", "sha256:task-parent"}};
  auto outcome = f.call(tool, {}, options);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(outcome.result->at("resolved") ==
        json::parse(R"({"toolRevision":"sha256:resolved-weather",)"
                    R"("settingsRevision":"sha256:settings-weather"})"));
  CHECK_THAT(std::string(outcome.result->at("missing").as_string()),
             Catch::Contains("no tool named \"missing\""));
  CHECK(outcome.result->at("tasks").at(0).at("id") == "sha256:task-1");
  CHECK(f.host.resolved ==
        std::vector<std::string>{"test-tool -> weather", "test-tool -> missing"});
  // The invocation reaches the host as the caller gave it: nothing of the host process's own.
  REQUIRE(f.host.subtasks.size() == 1);
  CHECK(f.host.subtasks[0] ==
        R"(test-tool [{"kind":"call","name":"weather"}] {"taskId":"sha256:task-parent"})");
}

TEST_CASE("slow quick requests never hold up other tools' operations or V8 workers",
          "[process][ctx]") {
  // One V8 worker: quick requests wait for the daemon without holding it, so the fetching call
  // still runs.
  RuntimeConfig config = processConfig();
  config.workers = 1;
  ProcessFixture f(config);
  std::mutex mutex;
  std::condition_variable released;
  bool release = false;
  std::atomic<int> blocked{0};
  // A resolve that takes as long as a very long task lineage would.
  f.host.beforeResolve = [&] {
    ++blocked;
    std::unique_lock lock(mutex);
    released.wait(lock, [&] { return release; });
  };
  f.host.onOperation(
      [](const std::string&, const json::value&, std::shared_ptr<HostOperation> operation) {
        operation->complete(fetchReply(200, "fetched"));
      });
  const json::object subtasks{{"capabilities", json::object{{"subtasks", true}}}};
  const char* resolving = "export default async (args, ctx) => ctx.resolveInvocation('weather')";
  // More slow requests than the pool has threads for operations.
  std::vector<toolhost::registry::ToolRevisionPtr> resolvers;
  for (int i = 0; i < 3; ++i) resolvers.push_back(makeTool(resolving, subtasks));
  std::vector<std::thread> callers;
  for (const auto& tool : resolvers) callers.emplace_back([&f, tool] { f.call(tool); });
  REQUIRE(waitFor([&] { return blocked.load() >= 1; }));
  std::this_thread::sleep_for(milliseconds(200));  // the others queue behind it meanwhile

  auto fetcher =
      makeTool("export default async () => (await fetch('https://api.example/')).text()");
  std::atomic<bool> fetched = false;
  std::optional<CallOutcome> outcome;
  callers.emplace_back([&] {
    outcome = f.call(fetcher);
    fetched = true;
  });
  const bool prompt = waitFor([&] { return fetched.load(); }, milliseconds(5000));
  {
    std::lock_guard lock(mutex);
    release = true;
  }
  released.notify_all();
  for (auto& caller : callers) caller.join();
  CHECK(prompt);
  REQUIRE(outcome);
  INFO(describe(*outcome));
  REQUIRE(outcome->result);
  CHECK(*outcome->result == "fetched");
}

TEST_CASE("host operations cross the socket: complete, pause, resume, fail and abort",
          "[process][ops]") {
  ProcessFixture f;
  std::vector<std::thread> later;
  auto joinLater = [&later] {
    for (auto& thread : later) thread.join();
    later.clear();
  };

  SECTION("a fetch completed from another thread, with the wall clock paused meanwhile") {
    f.host.onOperation([&](const std::string& kind, const json::value& request,
                           std::shared_ptr<HostOperation> operation) {
      CHECK(kind == "fetch");
      CHECK(request.at("url") == "https://prompted.example/");
      operation->pauseWallClock();  // as the policy engine does before it asks a person
      later.emplace_back([operation] {
        std::this_thread::sleep_for(milliseconds(600));
        operation->resumeWallClock();
        operation->complete(fetchReply(200, "approved"));
      });
    });
    auto tool = makeTool(R"(export default async () => {
        const text = await (await fetch('https://prompted.example/')).text();
        const end = Date.now() + 150; while (Date.now() < end) {}
        return text;
      })",
                         // Well under the 600 ms pause, with room for a loaded machine (asan).
                         limits({{"wallMs", 450}}));
    auto outcome = f.call(tool);
    joinLater();
    INFO(describe(outcome));
    REQUIRE(outcome.result);
    CHECK(*outcome.result == "approved");
    CHECK(outcome.usage.wallMs >= 740);
  }
  SECTION("a failure rejects with its code; the default host refuses") {
    auto tool = makeTool(R"(export default async (args, ctx) => {
        const codes = [];
        try { await fetch('https://x.example/'); } catch (e) { codes.push(e.code, e.message); }
        try { await ctx.storage.get('k'); } catch (e) { codes.push(e.code); }
        return codes;
      })");
    auto outcome = f.call(tool);
    INFO(describe(outcome));
    REQUIRE(outcome.result);
    CHECK(*outcome.result ==
          json::parse(R"(["not-authorized","fetch is not granted to sandboxed tools by this )"
                      R"(daemon","not-authorized"])"));
    CHECK(f.host.operations().size() == 2);
  }
  SECTION("cancelled with an operation outstanding: the host's abort runs, late answers drop") {
    HeldOperations held;
    held.hold(f.host);
    auto tool =
        makeTool("export default async () => (await fetch('https://never.example/')).status",
                 limits({{"wallMs", 30000}}));
    auto outcome = callAndCancelWhen(*f.pool, tool, [&] { return held.size() == 1; });
    INFO(describe(outcome));
    CHECK(errc(outcome) == CallErrc::cancelled);
    CHECK(waitFor([&] { return held.aborts == 1; }));
    REQUIRE(held.size() == 1);
    // Late calls from the host are harmless, and an abort registered now runs at once.
    auto operation = held.operations[0];
    operation->pauseWallClock();
    operation->resumeWallClock();
    operation->complete(fetchReply(200, "late"));
    std::atomic<bool> ran{false};
    operation->onAbort([&ran] { ran = true; });
    CHECK_FALSE(ran);  // it completed (late) first: nothing left to abort
  }
  SECTION("timed out with an operation outstanding: aborted too") {
    HeldOperations held;
    held.hold(f.host);
    auto tool = makeTool(
        "export default async (args, ctx) => ctx.popup({kind: 'origin', url: "
        "'https://x.example/'})",
        limits({{"wallMs", 300}}));
    auto outcome = f.call(tool);
    INFO(describe(outcome));
    CHECK(errc(outcome) == CallErrc::timeout);
    CHECK(waitFor([&] { return held.aborts == 1; }));
    std::atomic<bool> ran{false};
    held.operations.at(0)->onAbort([&ran] { ran = true; });
    CHECK(ran);  // the call ended first: a new abort runs at once
  }
  SECTION("the process dies with an operation outstanding: aborted") {
    HeldOperations held;
    held.hold(f.host);
    auto tool =
        makeTool("export default async () => (await fetch('https://never.example/')).status",
                 limits({{"wallMs", 30000}}));
    const int pid = f.pid();
    std::thread killer([&] {
      waitFor([&] { return held.size() == 1; });
      ::kill(f.pid() != 0 ? f.pid() : pid, SIGKILL);
    });
    auto outcome = f.call(tool);
    killer.join();
    INFO(describe(outcome));
    CHECK(errc(outcome) == CallErrc::sandboxCrashed);
    CHECK(waitFor([&] { return held.aborts == 1; }));
  }
  joinLater();
  auto healthy = f.call(makeTool("export default () => 'still here'"));
  CHECK(healthy.result);
}

TEST_CASE("list, terminate and discard reach the process of the revision", "[process]") {
  ProcessFixture f(processConfig(2));
  std::vector<toolhost::registry::ToolRevisionPtr> tools;
  for (int i = 0; i < 6; ++i) {
    tools.push_back(
        withRevision(counterTool("tool-" + std::to_string(i)), "sha256:list-" + std::to_string(i)));
    REQUIRE(*f.call(tools.back()).result == 1);
  }
  auto pids = f.pool->processIds();
  REQUIRE(pids.size() == 3);  // the two for tools, and agents' code's, never started here
  CHECK(pids[0] > 0);
  CHECK(pids[1] > 0);
  CHECK(pids[2] == 0);
  auto list = f.pool->list();
  REQUIRE(list.size() == 6);
  for (std::size_t i = 0; i < list.size(); ++i) {
    CHECK(list[i].revision == tools[i]->revision);  // least recently used first
    CHECK(list[i].calls == 1);
  }
  CHECK(f.pool->terminate(tools[0]->revision));
  CHECK_FALSE(f.pool->terminate(tools[0]->revision));
  CHECK_FALSE(f.pool->terminate("sha256:unknown"));
  f.pool->discard(tools[1]->revision);
  f.pool->discard("sha256:unknown");
  CHECK(f.pool->list().size() == 4);
  CHECK(*f.call(tools[0]).result == 1);  // both start again
  CHECK(*f.call(tools[1]).result == 1);
  CHECK(*f.call(tools[2]).result == 2);  // the others kept their state

  SECTION("terminate while a call runs: it ends as cancelled") {
    auto spin = withRevision(makeTool("export default () => { for (;;) {} }",
                                      limits({{"wallMs", 30000}, {"cpuMs", 30000}}), {}, "spin"),
                             "sha256:list-spin");
    std::thread admin([&] {
      waitFor([&] {
        for (const auto& info : f.pool->list()) {
          if (info.revision == spin->revision && info.busy) return true;
        }
        return false;
      });
      std::this_thread::sleep_for(milliseconds(100));
      CHECK(f.pool->terminate(spin->revision));
    });
    auto outcome = f.call(spin);
    admin.join();
    INFO(describe(outcome));
    REQUIRE(errc(outcome) == CallErrc::cancelled);
    CHECK(outcome.result.error().detail == "the sandbox was terminated by an administrator");
  }
}

TEST_CASE("the daemon's list follows the host's evictions, failures and terminations",
          "[process][evict]") {
  RuntimeConfig config = processConfig(2);
  config.maxRetained = 2;  // per host
  ProcessFixture f(config);
  // Revisions go to a process by their hash: group what each process got, in call order.
  std::vector<toolhost::registry::ToolRevisionPtr> tools;
  for (int i = 0; i < 8; ++i) {
    tools.push_back(withRevision(counterTool("evict-" + std::to_string(i)),
                                 "sha256:evict-" + std::to_string(i)));
    REQUIRE(*f.call(tools.back()).result == 1);
  }
  auto revisions = [&] {
    std::set<std::string> out;
    for (const auto& info : f.pool->list()) out.insert(info.revision);
    return out;
  };
  // Each host keeps its 2 most recently used, and a call finds its sandbox exactly when the
  // list said it was retained.
  CHECK(revisions().size() <= 4);
  for (const auto& tool : tools) {
    INFO(tool->revision);
    const bool retained = revisions().contains(tool->revision);
    auto again = f.call(tool);
    REQUIRE(again.result);
    CHECK(again.usage.freshSandbox == !retained);
    CHECK(revisions().contains(tool->revision));
  }
  // A failed first call leaves no row; a tool that throws keeps its row with its calls counted.
  auto broken = withRevision(
      makeTool("throw new Error('no module'); export default () => 1", {}, {}, "broken"),
      "sha256:evict-broken");
  CHECK_FALSE(f.call(broken).result);
  CHECK_FALSE(revisions().contains(broken->revision));
  auto thrower =
      withRevision(makeTool("export default () => { throw new Error('no'); }", {}, {}, "thrower"),
                   "sha256:evict-thrower");
  CHECK_FALSE(f.call(thrower).result);
  CHECK_FALSE(f.call(thrower).result);
  bool found = false;
  for (const auto& info : f.pool->list()) {
    if (info.revision != thrower->revision) continue;
    found = true;
    CHECK(info.calls == 2);
    CHECK_FALSE(info.busy);
  }
  CHECK(found);
  // Terminate and discard everything listed; the list stays empty after the hosts answered.
  for (const auto& revision : revisions()) {
    CHECK(f.pool->terminate(revision));
  }
  CHECK(revisions().empty());
  auto last = f.call(tools[0]);
  auto other = f.call(tools[1]);
  REQUIRE(last.result);
  REQUIRE(other.result);
  CHECK(last.usage.freshSandbox);
  CHECK(revisions() == std::set<std::string>{tools[0]->revision, tools[1]->revision});
  f.pool->discard(tools[0]->revision);
  f.pool->discard(tools[1]->revision);
  CHECK(revisions().empty());
  CHECK(f.call(thrower).usage.freshSandbox);
  CHECK(revisions() == std::set<std::string>{thrower->revision});
}

TEST_CASE("many concurrent calls across two processes", "[process][threads]") {
  ProcessFixture f(processConfig(2));
  std::vector<toolhost::registry::ToolRevisionPtr> tools;
  for (int i = 0; i < 8; ++i) {
    tools.push_back(withRevision(
        makeTool("let calls = 0; export default (args) => { const end = Date.now() + 20; "
                 "while (Date.now() < end) {} return {n: ++calls, i: args.i}; }",
                 {}, {}, "many-" + std::to_string(i)),
        "sha256:many-" + std::to_string(i)));
  }
  std::vector<CallRequest> requests;
  for (int round = 0; round < 5; ++round) {
    for (int i = 0; i < 8; ++i) requests.push_back({tools[i], {{"i", round * 8 + i}}, {}});
  }
  const auto start = Clock::now();
  auto outcomes = callTogether(*f.pool, requests);
  INFO("took " << millisSince(start) << " ms");
  std::map<std::string, std::set<std::int64_t>> counts;
  for (std::size_t k = 0; k < outcomes.size(); ++k) {
    INFO(describe(outcomes[k]));
    REQUIRE(outcomes[k].result);
    CHECK(outcomes[k].result->at("i") == static_cast<std::int64_t>(k));
    counts[outcomes[k].revision].insert(outcomes[k].result->at("n").as_int64());
  }
  REQUIRE(counts.size() == 8);
  for (const auto& [revision, seen] : counts) {
    CHECK(seen == std::set<std::int64_t>{1, 2, 3, 4, 5});  // each revision in one process
  }
  auto pids = f.pool->processIds();
  CHECK(pids[0] > 0);
  CHECK(pids[1] > 0);
  CHECK(pids[0] != pids[1]);
  CHECK(f.pool->list().size() == 8);
}

TEST_CASE("restarts leak no descriptors and leave no zombies", "[process][leaks]") {
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  std::thread runner([&io] { io.run(); });
  FakeHost host;
  {
    // The io_context makes its reactor's descriptors on first use: count after that.
    asio::local::stream_protocol::socket a(io), b(io);
    asio::local::connect_pair(a, b);
  }
  const std::size_t fdsBefore = openFds();
  const std::string fdsListed = describeFds();
  {
    RuntimeConfig config = processConfig(2);
    config.maxRestarts = 100;
    ProcessSandboxPool pool(config, host, testLaunch(), io.get_executor());
    auto counter = withRevision(counterTool(), "sha256:leaks-counter");
    auto fatal = makeTool("export default () => 'x'.repeat(2 ** 28).split('').length",
                          limits({{"heapMb", 16}}));
    for (int i = 0; i < 3; ++i) {
      CHECK(errc(callTool(pool, fatal)) == CallErrc::sandboxCrashed);
      REQUIRE(callTool(pool, counter).result);
    }
    for (int i = 0; i < 3; ++i) {
      const auto pids = pool.processIds();
      for (int pid : pids) {
        if (pid > 0) ::kill(pid, SIGKILL);
      }
      CHECK(waitFor([&] {
        auto now = pool.processIds();
        return std::all_of(now.begin(), now.end(), [](int pid) { return pid == 0; });
      }));
      REQUIRE(callTool(pool, counter).result);
    }
    // Every process that ended has been reaped: only the live ones are children.
    CHECK(waitFor([&] {
      auto live = children();
      std::size_t running = 0;
      for (int pid : pool.processIds()) running += pid > 0 ? 1 : 0;
      return live.size() == running &&
             std::none_of(live.begin(), live.end(), [](const auto& c) { return c.second == 'Z'; });
    }));
  }
  // The pool is gone: no child left, every socket closed.
  CHECK(children().empty());
  CHECK(waitFor([&] { return openFds() == fdsBefore; }));
  INFO("fds before " << fdsListed << "\nafter " << describeFds());
  CHECK(openFds() == fdsBefore);
  work.reset();
  runner.join();
}

TEST_CASE("the pool shuts down with calls and operations in flight", "[process]") {
  asio::io_context callers;  // outlives the pool: the outcomes are delivered to it
  std::optional<CallOutcome> spinning, fetching;
  HeldOperations held;
  {
    ProcessFixture f;
    held.hold(f.host);
    json::object args;
    asio::co_spawn(callers,
                   f.pool->call(makeTool("export default () => { for (;;) {} }",
                                         limits({{"wallMs", 30000}, {"cpuMs", 30000}}), {}, "spin"),
                                args, {}),
                   [&](std::exception_ptr, CallOutcome outcome) { spinning = std::move(outcome); });
    asio::co_spawn(callers,
                   f.pool->call(makeTool("export default () => fetch('https://x.example/')", {}, {},
                                         "fetching"),
                                args, {}),
                   [&](std::exception_ptr, CallOutcome outcome) { fetching = std::move(outcome); });
    callers.run_for(milliseconds(50));
    REQUIRE(waitFor([&] { return held.size() == 1; }));
  }  // the pool's destructor ends both calls, aborts the operation, kills and reaps the process
  CHECK(held.aborts == 1);
  callers.restart();
  callers.run();
  REQUIRE(spinning);
  REQUIRE(fetching);
  CHECK(errc(*spinning) == CallErrc::cancelled);
  CHECK(errc(*fetching) == CallErrc::cancelled);
  CHECK(spinning->result.error().detail == "the runtime is shutting down");
  CHECK(children().empty());
}

// --- A host taken over by its tool ---------------------------------------------------------------
// tests/runtime/hostile_host_main.cc speaks the protocol badly on purpose, as a host process a
// tool took over through a V8 bug could.

namespace {

SandboxLaunch hostileLaunch(const std::string& scenario) {
  return SandboxLaunch{TOOLHOST_TEST_HOSTILE_HOST, {"--sandbox-host", scenario}};
}

bool noZombies() {
  return waitFor([] {
    for (const auto& [pid, state] : children()) {
      if (state == 'Z') return false;
    }
    return true;
  });
}

}  // namespace

TEST_CASE("a host that breaks the protocol is killed, and only its call fails", "[process][hostile]") {
  for (const std::string scenario :
       {"not-json", "wrong-type", "unknown-type", "too-deep", "too-many-values", "too-long",
        "sandbox-flood", "idle-overflow"}) {
    DYNAMIC_SECTION(scenario) {
      ProcessFixture f(processConfig(), hostileLaunch(scenario));
      auto tool = counterTool();
      for (int attempt = 0; attempt < 2; ++attempt) {
        const auto started = Clock::now();
        auto outcome = f.call(tool);
        INFO(describe(outcome));
        REQUIRE_FALSE(outcome.result);
        CHECK(outcome.result.error().code == CallErrc::sandboxCrashed);
        CHECK(millisSince(started) < 5000);
      }
      // Each broken host was killed and reaped; the pool still starts hosts.
      CHECK(noZombies());
      CHECK(f.pool->processIds().size() == 2);  // the tools' process and agents' code's
    }
  }
}

TEST_CASE("a host's results for other calls, and repeated results, reach nobody", "[process][hostile]") {
  ProcessFixture f(processConfig(), hostileLaunch("stray-results"));
  auto tool = counterTool();
  auto first = f.call(tool);
  INFO(describe(first));
  REQUIRE(first.result);
  CHECK(*first.result == "first");
  // This host answers so fast that its pid may not be recorded yet (spawn() sets it after
  // posix_spawn returns).
  REQUIRE(waitFor([&] { return f.pid() != 0; }));
  const int pid = f.pid();
  auto second = f.call(tool);
  REQUIRE(second.result);
  CHECK(*second.result == "first");
  CHECK(f.pid() == pid);  // strays are ignored, not a reason to kill the host
}

TEST_CASE("what a host prints is logged by the daemon, cleaned, cut and rate-limited",
          "[process][hostile]") {
  auto captured = std::make_shared<std::ostringstream>();
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(*captured);
  auto previous = spdlog::default_logger();
  auto capture = std::make_shared<spdlog::logger>("capture", sink);
  capture->set_level(spdlog::level::debug);
  capture->set_pattern("%l %v");
  spdlog::set_default_logger(capture);
  struct Restore {
    std::shared_ptr<spdlog::logger> logger;
    ~Restore() { spdlog::set_default_logger(logger); }
  } restore{previous};
  std::string text;
  {
    ProcessFixture f(processConfig(), hostileLaunch("noisy-output"));
    auto outcome = f.call(counterTool());
    INFO(describe(outcome));
    REQUIRE(outcome.result);
    CHECK(*outcome.result == "done");
    REQUIRE(waitFor([&] {
      sink->flush();
      return captured->str().find("after the flood") != std::string::npos;
    }));
    text = captured->str();
  }
  INFO(text.substr(0, 4000));
  // Its own level, its pid and slot named; no terminal control reaches the daemon's log.
  CHECK(text.find("warning sandbox process ") != std::string::npos);
  CHECK(text.find("(slot 0): ?[31mred? and ?") != std::string::npos);
  CHECK(text.find('\x1b') == std::string::npos);
  CHECK(text.find("info sandbox process ") != std::string::npos);
  // 1000 lines at once: the first 200 of the second, and a count of the rest.
  std::size_t flood = 0;
  for (std::size_t at = 0; (at = text.find("): flood ", at)) != std::string::npos; ++at) ++flood;
  CHECK(flood < 1000);
  CHECK(flood <= 200);
  CHECK(text.find("more lines of its output within a second were left out") != std::string::npos);
}

TEST_CASE("a host's output is read at a bounded rate", "[process][hostile]") {
  // 3 MiB at 1 MiB a second: the host's writes wait for the daemon, which reads the third MiB
  // two seconds after the first at the soonest (a bound that load can only lengthen).
  ProcessFixture f(processConfig(), hostileLaunch("output-flood"));
  const auto started = Clock::now();
  auto outcome = f.call(counterTool());
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(*outcome.result == "done");
  CHECK(millisSince(started) >= 1900);
}

TEST_CASE("a host cannot act for a call that is not in flight there", "[process][hostile]") {
  ProcessFixture f(processConfig(), hostileLaunch("borrowed-call"));
  auto outcome = f.call(makeTool("export default () => 1", kSubtasks));
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(*outcome.result == 0);  // nothing answered for the borrowed call's requests
  CHECK(f.host.operations().empty());
  REQUIRE(f.host.subtasks.size() == 1);  // only its own call's request reached the daemon's host
  CHECK_THAT(f.host.subtasks[0], Catch::StartsWith("test-tool []"));
}

TEST_CASE("a host's requests carry the daemon's invocation, not one the host makes up",
          "[process][hostile]") {
  ProcessFixture f(processConfig(), hostileLaunch("forged-invocation"));
  CallOptions options;
  options.invocation = {{"taskId", "sha256:task-parent"}};
  auto outcome = f.call(makeTool("export default () => 1", kSubtasks), {}, options);
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(outcome.result->at(0).at("id") == "sha256:task-1");
  REQUIRE(f.host.subtasks.size() == 1);
  CHECK(f.host.subtasks[0] == R"(test-tool [] {"taskId":"sha256:task-parent"})");
}

TEST_CASE("a host cannot start more than kMaxRunningOps operations for one call",
          "[process][hostile]") {
  ProcessFixture f(processConfig(), hostileLaunch("operation-flood"));
  HeldOperations held;
  held.hold(f.host);
  auto outcome = f.call(counterTool());
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(*outcome.result == 100 - static_cast<std::int64_t>(kMaxRunningOps));
  // The daemon starts the operations it took on threads of its own: they may reach its host
  // after the call returned, and then they are aborted at once.
  CHECK(waitFor([&] { return held.size() == kMaxRunningOps; }));
  CHECK(waitFor([&] { return held.aborts == static_cast<int>(kMaxRunningOps); }));
  std::this_thread::sleep_for(milliseconds(100));
  CHECK(held.size() == kMaxRunningOps);
}

TEST_CASE("a host's queued quick requests are bounded though it aborts them",
          "[process][hostile]") {
  ProcessFixture f(processConfig(), hostileLaunch("quick-flood"));
  // The daemon's lineage reads wait until the call is over: the requests stay queued.
  std::mutex mutex;
  std::condition_variable opened;
  bool open = false;
  f.host.beforeResolve = [&] {
    std::unique_lock lock(mutex);
    opened.wait(lock, [&] { return open; });
  };
  struct Opener {
    std::mutex& mutex;
    std::condition_variable& opened;
    bool& open;
    ~Opener() {
      {
        std::lock_guard lock(mutex);
        open = true;
      }
      opened.notify_all();
    }
  } opener{mutex, opened, open};
  auto outcome = f.call(makeTool("export default () => 1", kSubtasks));
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(*outcome.result == 1100 - 1024);
}

TEST_CASE("a host that holds a cancelled call is killed at the cancel's deadline",
          "[process][hostile][cancel]") {
  ProcessFixture f(processConfig(), hostileLaunch("silent"));
  auto tool = counterTool();
  asio::io_context io;
  asio::cancellation_signal signal;
  std::optional<CallOutcome> held, other;
  asio::co_spawn(
      io, f.pool->call(tool, {}, {}),
      asio::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr, CallOutcome outcome) {
        held = std::move(outcome);
      }));
  asio::co_spawn(io, f.pool->call(tool, {}, {}),
                 [&](std::exception_ptr, CallOutcome outcome) { other = std::move(outcome); });
  asio::steady_timer timer(io, milliseconds(200));
  auto cancelledAt = Clock::now();
  timer.async_wait([&](boost::system::error_code) {
    REQUIRE(f.pid() != 0);
    cancelledAt = Clock::now();
    signal.emit(asio::cancellation_type::terminal);
  });
  io.run();
  REQUIRE(held);
  REQUIRE(other);
  INFO(describe(*held) << " / " << describe(*other));
  REQUIRE(errc(*held) == CallErrc::cancelled);
  CHECK_THAT(held->result.error().detail, Catch::Contains("did not end it within"));
  CHECK(errc(*other) == CallErrc::sandboxCrashed);  // its host was killed with it
  // No sooner than twice the grace plus a second, and not much later.
  const auto waited = Clock::now() - cancelledAt;
  CHECK(waited >= milliseconds(2 * kGraceMs + 1000));
  CHECK(waited < milliseconds(2 * kGraceMs + 4000));
  CHECK(noZombies());
}

TEST_CASE("a host that keeps sending is not taken to hold a cancel it has not read yet",
          "[process][hostile][cancel]") {
  // A host working through large calls queued before the cancel reads the cancel late, but its
  // other messages keep coming: killed only once the call is late (wall clock plus the grace).
  ProcessFixture f(processConfig(), hostileLaunch("chatty"));
  auto tool = makeTool("export default () => 1", limits({{"wallMs", 6000}}));
  asio::io_context io;
  asio::cancellation_signal signal;
  std::optional<CallOutcome> held;
  const auto sentAt = Clock::now();
  asio::co_spawn(
      io, f.pool->call(tool, {}, {}),
      asio::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr, CallOutcome outcome) {
        held = std::move(outcome);
      }));
  asio::steady_timer timer(io, milliseconds(200));
  timer.async_wait(
      [&](boost::system::error_code) { signal.emit(asio::cancellation_type::terminal); });
  io.run();
  REQUIRE(held);
  INFO(describe(*held));
  REQUIRE(errc(*held) == CallErrc::cancelled);
  const auto waited = Clock::now() - sentAt;
  // Past the silent host's deadline (twice the grace plus a second after the cancel), and by
  // the wall clock plus the grace and the watch's polling.
  CHECK(waited >= milliseconds(6000 + kGraceMs));
  CHECK(waited < milliseconds(6000 + kGraceMs + 3000));
  CHECK(noZombies());
}

TEST_CASE("a call's operations end with its result, even when its host did not abort them",
          "[process][hostile]") {
  ProcessFixture f(processConfig(), hostileLaunch("result-keeps-op"));
  HeldOperations held;
  held.hold(f.host);
  auto outcome = f.call(counterTool());
  INFO(describe(outcome));
  REQUIRE(outcome.result);
  CHECK(*outcome.result == "done");
  CHECK(waitFor([&] { return held.aborts == 1; }));
  CHECK(f.pid() != 0);  // not a reason to kill the host
}

TEST_CASE("many revisions with calls waiting are believed, not taken for a broken host",
          "[process]") {
  // One worker, one retained sandbox: every revision with a call admitted shows as a busy row,
  // which cannot be evicted; more of them than max_retained * 2 + 1024 is still an honest host.
  RuntimeConfig config = processConfig();
  config.workers = 1;
  config.maxRetained = 1;
  ProcessFixture f(config);
  auto spin = makeTool("export default () => { for (;;) {} }",
                       limits({{"wallMs", 60000}, {"cpuMs", 60000}}), {}, "spin");
  asio::io_context io;
  std::atomic<bool> spun{false};
  asio::co_spawn(io, f.pool->call(spin, {}, {}),
                 [&](std::exception_ptr, CallOutcome) { spun = true; });
  std::thread caller([&] { io.run(); });
  StopAndJoin stopAndJoin{io, caller};
  REQUIRE(waitFor([&] { return !f.pool->list().empty() && f.pool->list().front().busy; }));
  REQUIRE(waitFor([&] { return f.pid() != 0; }));  // 0 while the slot's process starts
  const int pid = f.pid();
  constexpr int kWaiting = 1040;
  std::atomic<int> ok{0}, failed{0};
  std::vector<toolhost::registry::ToolRevisionPtr> tools;
  for (int i = 0; i < kWaiting; ++i) {
    tools.push_back(makeTool("export default () => 'ran'", {}, {}, "waiting"));
  }
  for (const auto& tool : tools) {
    asio::post(io, [&, tool] {
      asio::co_spawn(io, f.pool->call(tool, {}, {}), [&](std::exception_ptr, CallOutcome outcome) {
        (outcome.result && *outcome.result == "ran" ? ok : failed)++;
      });
    });
  }
  // All of them reach the host and wait there, behind the spinning call.
  CHECK(waitFor([&] { return f.pool->list().size() >= kWaiting + 1; }, milliseconds(30000)));
  CHECK(f.pid() == pid);
  CHECK(f.pool->terminate(spin->revision));
  CHECK(waitFor([&] { return ok + failed == kWaiting; }, milliseconds(60000)));
  CHECK(failed == 0);
  CHECK(f.pid() == pid);
  // Every call answered before `io` goes: the pool holds work on its executor until then.
  CHECK(waitFor([&] { return spun.load(); }));
  io.stop();
  caller.join();
}

TEST_CASE("a tool that keeps swallowing its kill in import() still ends without its process",
          "[process][limits]") {
  ProcessFixture f;
  auto counter = counterTool();
  REQUIRE(*f.call(counter).result == 1);
  const int pid = f.pid();
  // V8 10.2's import() clears a termination raised in its specifier's toString; this one spends
  // nearly all its time there, so that every repeat of the kill lands in it.
  auto swallower = makeTool(
      "export default async () => { const spec = { toString() { let s = 0; "
      "for (let i = 0; i < 3e6; i++) s += i; return 'x' + s; } }; "
      "for (;;) import(spec).catch(() => 0); }",
      limits({{"wallMs", 100}, {"cpuMs", 60000}}));
  auto outcome = f.call(swallower);
  INFO(describe(outcome));
  REQUIRE(errc(outcome) == CallErrc::timeout);
  CHECK_THAT(outcome.result.error().detail, !Catch::Contains("killed"));
  CHECK(f.pid() == pid);  // the process, and the counter's sandbox in it, live on
  CHECK(*f.call(counter).result == 2);
}

TEST_CASE("a retained sandbox with a call running and others waiting is listed once", "[process]") {
  ProcessFixture f;
  auto tool = makeTool("export default (args) => { if (args.spin) for (;;) {} return 'ran'; }",
                       limits({{"wallMs", 60000}, {"cpuMs", 60000}}), {}, "spinner");
  REQUIRE(*f.call(tool).result == "ran");  // retained from here on
  asio::io_context io;
  std::atomic<int> ended{0};
  for (bool spin : {true, false}) {
    asio::co_spawn(io, f.pool->call(tool, json::object{{"spin", spin}}, {}),
                   [&](std::exception_ptr, CallOutcome) { ++ended; });
  }
  std::thread caller([&] { io.run(); });
  StopAndJoin stopAndJoin{io, caller};
  REQUIRE(waitFor([&] {
    auto rows = f.pool->list();
    return !rows.empty() && rows.front().busy;
  }));
  auto rows = f.pool->list();
  CHECK(std::count_if(rows.begin(), rows.end(), [&](const SandboxInfo& info) {
          return info.revision == tool->revision;
        }) == 1);
  CHECK(rows.size() == 1);
  // The row is busy as soon as the calls are sent; the terminate below must find the spinning
  // call running in the host (one still queued there would run in a fresh sandbox afterwards
  // and spin to its wall limit): a tenth of a second of the host's CPU is that loop.
  const long before = cpuTicks(f.pid());
  REQUIRE(waitFor([&] { return cpuTicks(f.pid()) >= before + 10; }));
  CHECK(f.pool->terminate(tool->revision));
  CHECK(waitFor([&] { return ended == 2; }));
}
