#include "runtime/worker_threads.h"

#include <system_error>

namespace toolhost::runtime {

std::string threadLimitHint(const std::error_code& error) {
  if (error != std::errc::resource_unavailable_try_again) return "";
  return " (a thread could not be started: the limit on processes and threads, ulimit -u or "
         "systemd's TasksMax=, is too low)";
}

WorkerThreads::WorkerThreads(std::size_t stackBytes, std::function<void()> body)
    : stackBytes_(stackBytes), body_(std::move(body)) {}

WorkerThreads::~WorkerThreads() { join(); }

void WorkerThreads::add() {
  pthread_attr_t attributes;
  pthread_attr_init(&attributes);
  pthread_attr_setstacksize(&attributes, stackBytes_);
  pthread_t thread;
  const int error = pthread_create(&thread, &attributes, &WorkerThreads::start, this);
  pthread_attr_destroy(&attributes);
  if (error != 0) {
    throw std::system_error(error, std::generic_category(), "starting a V8 worker thread");
  }
  threads_.push_back(thread);
}

void WorkerThreads::join() {
  for (pthread_t thread : threads_) pthread_join(thread, nullptr);
  threads_.clear();
}

void* WorkerThreads::start(void* self) {
  static_cast<WorkerThreads*>(self)->body_();
  return nullptr;
}

}  // namespace toolhost::runtime
