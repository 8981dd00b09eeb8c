// The process-wide V8 platform: V8 requires exactly one, initialized before any isolate exists
// and disposed after the last one is gone. Constructed once by daemon/main.cc (or a test's main)
// on the main thread and outlives every isolate.
#pragma once

#include <memory>
#include <string>

namespace v8 {
class Platform;
}

namespace toolhost::runtime {

class V8Platform {
 public:
  // `workerThreads` sizes V8's own background pool (GC, compilation); 0 lets V8 choose. `jit`
  // false (RuntimeConfig's default) runs V8 --jitless: bytecode only, no executable memory made
  // at run time, no code range per isolate.
  explicit V8Platform(int workerThreads = 0, bool jit = false);
  ~V8Platform();
  V8Platform(const V8Platform&) = delete;
  V8Platform& operator=(const V8Platform&) = delete;

  v8::Platform& platform() { return *platform_; }
  // True once constructed and until destroyed.
  static bool initialized();
  // Whether the live platform runs V8 with its JIT (false before construction).
  static bool jit();
  // The live platform, or nullptr before construction and after destruction. Any thread; the
  // sandboxes use it to pump their isolates' foreground tasks and to announce isolate shutdown.
  static v8::Platform* current();

 private:
  std::unique_ptr<v8::Platform> platform_;
};

// The V8 version string, e.g. "10.2.154.26-node.37". Safe before initialization.
std::string v8Version();

}  // namespace toolhost::runtime
