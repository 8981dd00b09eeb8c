// Threads with a chosen stack size (std::thread cannot set one): the V8 worker threads need a
// stack well beyond the largest JavaScript stack limit. Used by one owner thread.
#pragma once

#include <pthread.h>

#include <cstddef>
#include <functional>
#include <string>
#include <system_error>
#include <vector>

namespace toolhost::runtime {

// Words to add to an error about a thread that could not be started: when `error` says the
// process or thread limit was reached, which limit to raise; else nothing.
std::string threadLimitHint(const std::error_code& error);

class WorkerThreads {
 public:
  WorkerThreads(std::size_t stackBytes, std::function<void()> body);
  // Joins: the owner must first make `body` return.
  ~WorkerThreads();
  WorkerThreads(const WorkerThreads&) = delete;
  WorkerThreads& operator=(const WorkerThreads&) = delete;

  // Starts one more thread running `body`. Throws std::system_error if it cannot.
  void add();
  void join();

 private:
  static void* start(void* self);

  std::size_t stackBytes_;
  std::function<void()> body_;
  std::vector<pthread_t> threads_;
};

}  // namespace toolhost::runtime
