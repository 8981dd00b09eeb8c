#include "runtime/counting_allocator.h"

#include <cstdlib>

namespace toolhost::runtime {

bool CountingAllocator::reserve(std::size_t length) {
  std::size_t current = used_.load(std::memory_order_relaxed);
  do {
    if (length > limit_ || current > limit_ - length) {
      if (auto hook = hook_.load()) hook(hookData_.load());
      return false;
    }
  } while (!used_.compare_exchange_weak(current, current + length, std::memory_order_relaxed));
  std::size_t peak = peak_.load(std::memory_order_relaxed);
  while (current + length > peak &&
         !peak_.compare_exchange_weak(peak, current + length, std::memory_order_relaxed)) {
  }
  return true;
}

void* CountingAllocator::Allocate(std::size_t length) {
  if (!reserve(length)) return nullptr;
  void* data = std::calloc(length == 0 ? 1 : length, 1);
  if (data == nullptr) used_.fetch_sub(length, std::memory_order_relaxed);
  return data;
}

void* CountingAllocator::AllocateUninitialized(std::size_t length) {
  if (!reserve(length)) return nullptr;
  void* data = std::malloc(length == 0 ? 1 : length);
  if (data == nullptr) used_.fetch_sub(length, std::memory_order_relaxed);
  return data;
}

void CountingAllocator::Free(void* data, std::size_t length) {
  if (data == nullptr) return;
  std::free(data);
  used_.fetch_sub(length, std::memory_order_relaxed);
}

void CountingAllocator::setRefusalHook(RefusalHook hook, void* data) {
  hookData_.store(data);
  hook_.store(hook);
}

}  // namespace toolhost::runtime
