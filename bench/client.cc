// The load generator, the same code against the echo server and the daemon. One Unix-socket
// connection, blocking reads and writes, no threads: with 2 cores shared between client and server
// it should take as little CPU as it can (it does not parse responses beyond their id prefix).
//   - sequential: one request at a time; latency of each, send to response.
//   - throughput: K requests pipelined on the one connection; each response read sends a new
//     request until the phase's duration is over, then the rest are drained. Calls per second
//     over the phase, per-request latency under that load, and, given the server's pid, the
//     server's CPU per call (process tree utime + stime across the phase / calls).
//   - cold: fresh revisions installed, then the first tools.call of each timed, with the
//     daemon's RSS sampled at checkpoints.
#include "bench/bench.h"
#include "protocol/json_text.h"

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <thread>
#include <unordered_map>

namespace toolhost::bench {
namespace json = boost::json;

namespace {

std::int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

double processCpuSeconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) / 1e9;
}

// One connection speaking NDJSON.
class LineConnection {
 public:
  explicit LineConnection(const std::filesystem::path& socket) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    if (socket.native().size() >= sizeof address.sun_path) throw std::runtime_error("socket path too long");
    std::memcpy(address.sun_path, socket.c_str(), socket.native().size());
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      throw std::runtime_error("connect " + socket.string() + ": " + std::strerror(errno));
    }
    buffer_.resize(kChunk * 2);
  }
  ~LineConnection() { ::close(fd_); }
  LineConnection(const LineConnection&) = delete;
  LineConnection& operator=(const LineConnection&) = delete;

  void send(std::string_view bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::write(fd_, bytes.data(), bytes.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw std::runtime_error(std::string("write: ") + std::strerror(errno));
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
  }

  // One read (blocking), then `onLine` for every complete line it finished.
  template <typename OnLine>
  void readSome(OnLine&& onLine) {
    if (buffer_.size() - end_ < kChunk) {
      if (start_ > 0) {
        std::memmove(buffer_.data(), buffer_.data() + start_, end_ - start_);
        end_ -= start_;
        scanned_ -= start_;
        start_ = 0;
      }
      if (buffer_.size() - end_ < kChunk) buffer_.resize(buffer_.size() * 2);
    }
    ssize_t n;
    do {
      n = ::read(fd_, buffer_.data() + end_, buffer_.size() - end_);
    } while (n < 0 && errno == EINTR);
    if (n < 0) throw std::runtime_error(std::string("read: ") + std::strerror(errno));
    if (n == 0) throw std::runtime_error("the server closed the connection");
    end_ += static_cast<std::size_t>(n);
    while (scanned_ < end_) {
      auto* newline = static_cast<char*>(std::memchr(buffer_.data() + scanned_, '\n', end_ - scanned_));
      if (newline == nullptr) {
        scanned_ = end_;
        break;
      }
      std::size_t at = static_cast<std::size_t>(newline - buffer_.data());
      onLine(std::string_view(buffer_.data() + start_, at - start_));
      start_ = scanned_ = at + 1;
    }
    if (start_ == end_) start_ = end_ = scanned_ = 0;
  }

  std::string readLine() {
    std::string line;
    bool done = false;
    while (!done) {
      readSome([&](std::string_view text) {
        if (!done) line.assign(text);
        done = true;  // one request in flight: at most one line arrives
      });
    }
    return line;
  }

 private:
  static constexpr std::size_t kChunk = 64 * 1024;
  int fd_ = -1;
  std::string buffer_;
  std::size_t start_ = 0, end_ = 0, scanned_ = 0;
};

void appendRequest(std::string& out, std::uint64_t id, std::string_view method, std::string_view params) {
  out += R"({"jsonrpc":"2.0","id":)";
  char digits[24];
  auto [end, ec] = std::to_chars(std::begin(digits), std::end(digits), id);
  out.append(digits, end);
  out += R"(,"method":")";
  out += method;
  out += R"(","params":)";
  out += params;
  out += "}\n";
}

// Both servers answer with protocol::resultResponse: {"jsonrpc":"2.0","id":<id>,"result":...}.
constexpr std::string_view kIdPrefix = R"({"jsonrpc":"2.0","id":)";

std::uint64_t responseId(std::string_view line) {
  if (!line.starts_with(kIdPrefix)) throw std::runtime_error("unexpected response: " + std::string(line.substr(0, 300)));
  line.remove_prefix(kIdPrefix.size());
  std::uint64_t id = 0;
  auto [rest, ec] = std::from_chars(line.data(), line.data() + line.size(), id);
  std::string_view after(rest, static_cast<std::size_t>(line.data() + line.size() - rest));
  if (ec != std::errc() || !after.starts_with(R"(,"result":)")) {
    throw std::runtime_error("not a result: " + std::string(line.substr(0, 600)));
  }
  return id;
}

json::object call(LineConnection& connection, std::uint64_t id, std::string_view method, const json::value& params) {
  std::string request;
  appendRequest(request, id, method, protocol::writeJson(params));
  connection.send(request);
  auto line = connection.readLine();
  auto response = json::parse(line).as_object();
  if (!response.contains("result")) throw std::runtime_error(std::string(method) + " failed: " + line);
  return response;
}

struct PhaseCpu {
  pid_t pid;
  TreeSample serverStart;
  double clientStart;
  explicit PhaseCpu(pid_t serverPid) : pid(serverPid), clientStart(processCpuSeconds()) {
    if (pid > 0) serverStart = sampleTree(pid);
  }
  void emitPerCall(const std::string& key, std::size_t calls) const {
    if (calls == 0) return;
    const double perCall = 1e6 / static_cast<double>(calls);
    emit(key + ".client_cpu_us_per_call", (processCpuSeconds() - clientStart) * perCall);
    if (pid <= 0) return;
    auto end = sampleTree(pid);
    emit(key + ".server_cpu_us_per_call", (end.cpuSeconds - serverStart.cpuSeconds) * perCall);
    emit(key + ".server_processes", static_cast<double>(end.processes));
  }
};

void emitLatencies(const std::string& key, std::vector<std::int64_t>& latencies) {
  emit(key + ".p50_us", percentileNs(latencies, 50) / 1e3);
  emit(key + ".p90_us", percentileNs(latencies, 90) / 1e3);
  emit(key + ".p99_us", percentileNs(latencies, 99) / 1e3);
  emit(key + ".mean_us", meanNs(latencies) / 1e3);
}

}  // namespace

int runClient(const ClientOptions& options) {
  LineConnection connection(options.socket);
  std::uint64_t nextId = 1;
  std::string request;

  // The first answer, checked in full, then the warm-up (untimed).
  {
    auto first = call(connection, nextId++, options.method, json::parse(options.params));
    std::fprintf(stderr, "client: first response: %.300s\n", protocol::writeJson(first).c_str());
  }
  for (std::size_t i = 0; i < options.warmup; ++i) {
    request.clear();
    appendRequest(request, nextId, options.method, options.params);
    connection.send(request);
    if (responseId(connection.readLine()) != nextId) throw std::runtime_error("response out of order");
    ++nextId;
  }

  if (options.sequential > 0) {
    std::vector<std::int64_t> latencies;
    latencies.reserve(options.sequential);
    PhaseCpu cpu(options.serverPid);
    for (std::size_t i = 0; i < options.sequential; ++i) {
      request.clear();
      appendRequest(request, nextId, options.method, options.params);
      auto sent = nowNs();
      connection.send(request);
      auto line = connection.readLine();
      latencies.push_back(nowNs() - sent);
      if (responseId(line) != nextId) throw std::runtime_error("response out of order");
      ++nextId;
    }
    const std::string key = options.prefix + "seq";
    cpu.emitPerCall(key, options.sequential);
    emit(key + ".calls", static_cast<double>(options.sequential));
    emitLatencies(key, latencies);
  }

  for (std::size_t inflight : options.inflight) {
    const std::string key = options.prefix + "tput." + std::to_string(inflight);
    const std::uint64_t base = nextId;
    std::vector<std::int64_t> sentAt;  // by id - base
    std::vector<std::int64_t> latencies;
    sentAt.reserve(1 << 20);
    latencies.reserve(1 << 20);
    PhaseCpu cpu(options.serverPid);
    const auto start = nowNs();
    const auto deadline = start + static_cast<std::int64_t>(options.durationSeconds * 1e9);
    request.clear();
    for (std::size_t i = 0; i < inflight; ++i) {
      appendRequest(request, nextId++, options.method, options.params);
      sentAt.push_back(start);
    }
    connection.send(request);
    std::size_t outstanding = inflight, received = 0;
    while (outstanding > 0) {
      request.clear();
      std::int64_t now = 0;
      connection.readSome([&](std::string_view line) {
        if (now == 0) now = nowNs();
        const std::uint64_t id = responseId(line);
        if (id < base || id >= nextId) throw std::runtime_error("response to an unknown id");
        latencies.push_back(now - sentAt[id - base]);
        ++received;
        --outstanding;
        if (now < deadline) {
          appendRequest(request, nextId++, options.method, options.params);
          sentAt.push_back(now);
          ++outstanding;
        }
      });
      if (!request.empty()) connection.send(request);
    }
    const double seconds = static_cast<double>(nowNs() - start) / 1e9;
    cpu.emitPerCall(key, received);
    emit(key + ".calls", static_cast<double>(received));
    emit(key + ".calls_per_s", static_cast<double>(received) / seconds);
    emitLatencies(key, latencies);
  }
  return 0;
}

int runCold(const ColdOptions& options) {
  LineConnection connection(options.socket);
  std::uint64_t nextId = 1;
  const std::string nonce = std::to_string(nowNs());
  const json::value parameters = json::parse(
      R"({"type":"object","properties":{"text":{"type":"string"},"n":{"type":"integer"}},"required":["text"]})");
  const json::value arguments = json::parse(R"({"text":"hello","n":1})");

  // Install every revision first (pipelined, 32 at a time), so that RSS before the calls
  // already holds whatever the registry keeps per installed revision.
  std::vector<std::string> revisions(options.count);
  const auto installStart = nowNs();
  {
    constexpr std::size_t kWindow = 32;
    std::size_t sent = 0, done = 0;
    std::unordered_map<std::uint64_t, std::size_t> slotOf;
    auto sendOne = [&](std::string& out) {
      json::object manifest{
          {"name", "bench-cold"},
          {"description", "benchmark: a freshly installed revision"},
          {"parameters", parameters},
          {"execution", json::object{{"class", "sandboxed-code"},
                                     {"runtime", "javascript"},
                                     {"source", "export default async (args) => args; // revision " +
                                                    std::to_string(sent) + " of run " + nonce}}}};
      slotOf[nextId] = sent++;
      appendRequest(out, nextId++, "tools.install", protocol::writeJson(json::object{{"manifest", manifest}}));
    };
    std::string out;
    while (sent < options.count && sent < kWindow) sendOne(out);
    connection.send(out);
    while (done < options.count) {
      out.clear();
      connection.readSome([&](std::string_view line) {
        auto response = json::parse(line).as_object();
        const auto* result = response.if_contains("result");
        if (result == nullptr || !result->at("created").as_bool()) {
          throw std::runtime_error("tools.install did not create a fresh revision: " + std::string(line));
        }
        revisions[slotOf.at(response.at("id").to_number<std::uint64_t>())] = result->at("revision").as_string();
        ++done;
        if (sent < options.count) sendOne(out);
      });
      if (!out.empty()) connection.send(out);
    }
  }
  emit(options.prefix + "install.us_per_revision",
       static_cast<double>(nowNs() - installStart) / 1e3 / static_cast<double>(options.count));

  auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); };
  settle();
  const TreeSample before = sampleTree(options.serverPid);
  emit(options.prefix + "rss.before_kb", static_cast<double>(before.rssKb));
  double windowCpuStart = before.cpuSeconds;  // the server's CPU over the calls only, not the pauses
  std::vector<std::int64_t> latencies;
  std::size_t windowStart = 0;  // first call since the previous checkpoint
  for (std::size_t i = 0; i < options.count; ++i) {
    auto sent = nowNs();
    auto response = call(connection, nextId++, "tools.call",
                         json::object{{"name", "bench-cold"}, {"revision", revisions[i]}, {"arguments", arguments}});
    latencies.push_back(nowNs() - sent);
    const auto& result = response.at("result");
    if (result.at("result") != arguments || !result.at("usage").at("freshSandbox").as_bool()) {
      throw std::runtime_error("the first call was not served by a fresh sandbox: " + protocol::writeJson(response));
    }
    const std::size_t calls = i + 1;
    if (std::find(options.checkpoints.begin(), options.checkpoints.end(), calls) != options.checkpoints.end()) {
      // Latencies of the calls since the previous checkpoint: the first 100, the last 900...
      std::vector<std::int64_t> window(latencies.begin() + static_cast<std::ptrdiff_t>(windowStart), latencies.end());
      emitLatencies(options.prefix + "cold." + std::to_string(calls), window);
      const double windowCpu = sampleTree(options.serverPid).cpuSeconds - windowCpuStart;
      emit(options.prefix + "cold." + std::to_string(calls) + ".server_cpu_us_per_call",
           windowCpu * 1e6 / static_cast<double>(window.size()));
      windowStart = calls;
      settle();
      const TreeSample after = sampleTree(options.serverPid);
      windowCpuStart = after.cpuSeconds;
      const std::string key = options.prefix + "rss." + std::to_string(calls);
      emit(key + ".total_kb", static_cast<double>(after.rssKb));
      emit(key + ".kb_per_sandbox", static_cast<double>(after.rssKb - before.rssKb) / static_cast<double>(calls));
      emit(key + ".anon_kb_per_sandbox",
           static_cast<double>(after.rssAnonKb - before.rssAnonKb) / static_cast<double>(calls));
      emit(key + ".pss_kb_per_sandbox",
           static_cast<double>(after.pssKb - before.pssKb) / static_cast<double>(calls));
      emit(key + ".processes", static_cast<double>(after.processes));
    }
  }
  emitLatencies(options.prefix + "cold.all", latencies);

  // Every one of them is still retained (max_retained and the budget leave room for all).
  auto listed = call(connection, nextId++, "sandboxes.list", json::object{});
  std::size_t retained = 0;
  for (const auto& sandbox : listed.at("result").at("sandboxes").as_array()) {
    if (sandbox.at("name") == "bench-cold") ++retained;
  }
  emit(options.prefix + "retained", static_cast<double>(retained));
  return 0;
}

}  // namespace toolhost::bench
