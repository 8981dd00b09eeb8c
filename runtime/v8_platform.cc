#include "runtime/v8_platform.h"

#include <libplatform/libplatform.h>
#include <v8.h>

#include <sys/random.h>

#include <atomic>
#include <cerrno>
#include <stdexcept>
#include <string>

namespace toolhost::runtime {

namespace {
std::atomic<bool> gInitialized{false};
std::atomic<v8::Platform*> gPlatform{nullptr};
std::atomic<bool> gJit{false};

// V8's seeds (Math.random, hash seeds) for every isolate, from the kernel. Without a source V8
// opens /dev/urandom for each new isolate, which a sandbox host may no longer do once confined
// (runtime/confinement.h).
bool kernelEntropy(unsigned char* buffer, std::size_t length) {
  while (length > 0) {
    const ssize_t got = ::getrandom(buffer, length, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    buffer += got;
    length -= static_cast<std::size_t>(got);
  }
  return true;
}
}  // namespace

V8Platform::V8Platform(int workerThreads, bool jit) {
  if (gInitialized.exchange(true)) throw std::logic_error("the V8 platform is initialized twice");
  // Flags every sandbox shares: no code generation from strings is enforced per context; these
  // make V8 behave predictably inside a daemon. No checksum of the startup snapshot on every
  // Isolate::New (an adler32 of the whole blob, 6% of building a sandbox): the blob is part of
  // libnode's read-only mapping, and the only code caches are the preludes' own, made in memory
  // by this process (fetch_api.cc).
  std::string flags =
      "--no-expose-wasm --disallow-code-generation-from-strings --no-verify-snapshot-checksum";
  if (!jit) flags += " --jitless";
  v8::V8::SetFlagsFromString(flags.c_str(), flags.size());
  v8::V8::SetEntropySource(kernelEntropy);
  platform_ = v8::platform::NewDefaultPlatform(workerThreads);
  v8::V8::InitializePlatform(platform_.get());
  v8::V8::Initialize();
  gJit = jit;
  gPlatform = platform_.get();
}

V8Platform::~V8Platform() {
  gPlatform = nullptr;
  v8::V8::Dispose();
  v8::V8::DisposePlatform();
  gInitialized = false;
}

bool V8Platform::initialized() { return gInitialized.load(); }

bool V8Platform::jit() { return gJit.load(); }

v8::Platform* V8Platform::current() { return gPlatform.load(); }

std::string v8Version() { return v8::V8::GetVersion(); }

}  // namespace toolhost::runtime
