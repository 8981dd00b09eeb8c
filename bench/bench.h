// toolhost_bench: the pieces of the one benchmark run (bench/run.sh, bench/README.md). Each
// subcommand prints its figures as `key value` lines on stdout, which run.sh collects into one
// file and `report` turns into the table. Single-threaded programs unless a piece says otherwise.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace toolhost::bench {

using Clock = std::chrono::steady_clock;

// --- Figures ---------------------------------------------------------------------------------

// Nearest-rank percentile (0 < p <= 100) of durations in nanoseconds; 0 for no samples. Sorts.
double percentileNs(std::vector<std::int64_t>& samples, double p);
double meanNs(const std::vector<std::int64_t>& samples);

// Prints `key value` (value with enough digits to keep microsecond detail).
void emit(std::string_view key, double value);
void emit(std::string_view key, std::string_view value);

// --- Another process tree, from /proc --------------------------------------------------------

// CPU time (utime + stime of every thread, live or exited) and resident memory of a process and
// all its descendants, found through /proc/<pid>/task/*/children.
struct TreeSample {
  double cpuSeconds = 0;
  std::uint64_t rssKb = 0;      // VmRSS, summed
  std::uint64_t rssAnonKb = 0;  // RssAnon, summed (heap pages; VmRSS also counts mapped files)
  std::uint64_t pssKb = 0;      // Pss (smaps_rollup), summed: shared pages counted once overall
  std::size_t processes = 0;
};
TreeSample sampleTree(pid_t root);
// This process's VmRSS in KiB.
std::uint64_t selfRssKb();

// --- Subcommands -----------------------------------------------------------------------------

struct EchoServerOptions {
  std::filesystem::path socket;
  unsigned threads = 1;  // as the daemon's default [server] io_threads
  // none: answer on the I/O thread. thread / process: every line goes through a mirror (a thread
  // or a child process per connection) and back before it is answered: the floor of a hop.
  enum class Hop { none, thread, process } hop = Hop::none;
};
int runEchoServer(const EchoServerOptions& options);

struct ClientOptions {
  std::filesystem::path socket;
  std::string method = "tools.call";
  std::string params = "{}";  // JSON text, sent as is
  std::size_t warmup = 500;
  std::size_t sequential = 0;          // timed one-at-a-time calls; 0 skips the phase
  std::vector<std::size_t> inflight;   // one throughput phase per entry
  double durationSeconds = 3;          // of each throughput phase
  pid_t serverPid = 0;                 // when set: server CPU per call for every phase
  std::string prefix;                  // prepended to every key printed
};
int runClient(const ClientOptions& options);

struct ColdOptions {
  std::filesystem::path socket;
  std::size_t count = 1000;                 // fresh revisions installed and called once each
  std::vector<std::size_t> checkpoints;     // RSS sampled after this many calls
  pid_t serverPid = 0;                      // the daemon, for RSS
  std::string prefix;
};
int runCold(const ColdOptions& options);

struct V8FloorOptions {
  std::size_t warm = 20000;                 // timed warm calls
  std::size_t cold = 100;                   // timed isolate create + call cycles
  std::size_t kept = 0;                     // create + call with the isolates kept alive
  std::vector<std::size_t> isolates;        // RSS sampled after this many isolates
  std::string v8Flags;                      // extra V8 flags, for experiments (not the daemon's)
  bool jit = false;                         // V8 with its JIT, as the daemon with [runtime] jit
  std::string prefix;
};
int runV8Floor(const V8FloorOptions& options);

struct ReportOptions {
  std::filesystem::path figures;   // the `key value` lines of the whole run
  std::filesystem::path markdown;  // written too when set
};
int runReport(const ReportOptions& options);

}  // namespace toolhost::bench
