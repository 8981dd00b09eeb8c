// The ArrayBuffer allocator of one sandbox: counts the bytes of live backing stores and refuses
// an allocation that would pass the sandbox's limit, telling the sandbox (which records
// arrayBufferLimit and terminates the call). Allocate runs on the thread running the isolate;
// Free may run on V8's background threads; the counters are atomic.
#pragma once

#include <v8.h>

#include <atomic>
#include <cstddef>

namespace toolhost::runtime {

class CountingAllocator final : public v8::ArrayBuffer::Allocator {
 public:
  using RefusalHook = void (*)(void* data);

  explicit CountingAllocator(std::size_t limitBytes) : limit_(limitBytes) {}

  void* Allocate(std::size_t length) override;
  void* AllocateUninitialized(std::size_t length) override;
  void Free(void* data, std::size_t length) override;

  // Called on a refused allocation; set while the isolate lives, cleared before it is disposed.
  void setRefusalHook(RefusalHook hook, void* data);

  std::size_t used() const { return used_.load(std::memory_order_relaxed); }
  std::size_t limit() const { return limit_; }
  // The most bytes live at once since the last resetPeak().
  std::size_t peak() const { return peak_.load(std::memory_order_relaxed); }
  void resetPeak() { peak_.store(used(), std::memory_order_relaxed); }

 private:
  bool reserve(std::size_t length);

  const std::size_t limit_;
  std::atomic<std::size_t> used_{0};
  std::atomic<std::size_t> peak_{0};
  std::atomic<RefusalHook> hook_{nullptr};
  std::atomic<void*> hookData_{nullptr};
};

}  // namespace toolhost::runtime
