// Resource limits of one sandboxed call and the runtime's configuration: what a manifest asks
// for, what a caller may tighten, and what the daemon allows. Plain data and pure functions; any
// thread.
#pragma once

#include <boost/json/object.hpp>
#include <boost/system/result.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace toolhost::runtime {

inline constexpr std::int64_t kMiB = 1024 * 1024;

// Each limit, when given. In a manifest (`limits`), a request (`tools.call {limits}`) or the
// daemon's configuration (defaults, caps).
struct CallLimits {
  std::optional<std::int64_t> wallMs;         // wall clock from acquiring the sandbox to the end
  std::optional<std::int64_t> cpuMs;          // CPU time of the threads running the tool's code
  std::optional<std::int64_t> heapMb;         // V8 heap
  std::optional<std::int64_t> arrayBufferMb;  // ArrayBuffer backing stores (outside the heap)
  std::optional<std::int64_t> stackKb;        // JavaScript stack
  std::optional<std::int64_t> outputBytes;    // the result's JSON text
};

// Every limit set: what one call runs under.
struct EffectiveLimits {
  std::int64_t wallMs = 0;
  std::int64_t cpuMs = 0;
  std::int64_t heapMb = 0;
  std::int64_t arrayBufferMb = 0;
  std::int64_t stackKb = 0;
  std::int64_t outputBytes = 0;
};

// The [runtime] section of the daemon's configuration.
struct RuntimeConfig {
  unsigned workers = 2;                   // V8 worker threads
  std::size_t maxRetained = 64;           // retained sandboxes; least recently used idle evicted
  std::size_t memoryBudgetMb = 1024;      // sum of retained sandboxes' heaps; idle LRU evicted
  std::size_t maxQueuedPerSandbox = 256;  // calls waiting for one sandbox before `overloaded`
  std::size_t maxQueuedTotal = 4096;      // calls admitted at once, all sandboxes together
  std::size_t maxResultDepth = 128;       // nesting of a result (and of drafts a tool passes)
  std::size_t maxLogBytes = 64 * 1024;    // console output kept per call, then truncated
  std::size_t workerStackMb = 16;         // stack of each V8 worker thread; > caps.stackKb
  unsigned prewarmed = 2;                 // sandbox shells (isolate, context, globals) kept ready
                                          // for first calls; 0 builds every sandbox on demand
  bool jit = false;                       // V8's optimizing compilers (and executable memory);
                                          // off: bytecode interpreter only (--jitless)
  // ProcessSandboxPool only (everything above applies per sandbox process):
  unsigned processes = 1;                     // sandbox host processes; a revision always uses one
  std::int64_t killGraceMs = 2000;            // how long a call may run on past the moment it was
                                              // told to stop before its process is killed
  unsigned maxRestarts = 5;                   // unexpected ends of one process within ...
  std::int64_t restartWindowMs = 10000;       // ... this window, after which its calls fail fast
                                              // until the oldest of them leaves the window
  CallLimits defaults{60000, 30000, 64, 64, 984, 2 * kMiB};      // when the manifest says nothing
  CallLimits caps{600000, 600000, 1024, 1024, 4096, 64 * kMiB};  // the most any call may get
};

// Throws std::invalid_argument, with a sentence naming the setting, for a configuration that
// cannot work (no workers or processes, a worker stack too small for the largest stack limit).
void checkRuntimeConfig(const RuntimeConfig& config);

// The limits a call runs under: for each, min(request if given, manifest if given else default,
// cap). A request looser than the manifest's (or the default's) limit, or a request or manifest
// value that is not a positive integer, is refused with a sentence naming the field
// ("limits.wallMs: 90000 is looser than the tool's 60000").
boost::system::result<EffectiveLimits, std::string> effectiveLimits(
    const boost::json::object& manifest, const CallLimits& request, const RuntimeConfig& config);

// The limits a manifest gets when the request tightens nothing (the limits a retained sandbox of
// that revision is built with).
boost::system::result<EffectiveLimits, std::string> baseLimits(const boost::json::object& manifest,
                                                               const RuntimeConfig& config);

// For a call stopped at its limit `field` (the manifest's name: "wallMs", "heapMb", ...): when it
// ran at the daemon's cap instead of what the tool's manifest asks for, and the call asked for no
// tighter limit itself, words to add to the error naming the setting ("; the tool's manifest
// asks for 120000, which [runtime] max_wall_ms caps at 1000"); else nothing.
std::string capNote(const boost::json::object& manifest, std::string_view field,
                    const CallLimits& request, const RuntimeConfig& config);

}  // namespace toolhost::runtime
