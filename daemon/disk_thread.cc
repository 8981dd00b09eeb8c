#include "daemon/disk_thread.h"

#include <spdlog/spdlog.h>

namespace toolhost::daemon {

DiskThread::DiskThread()
    : context_(1), keepAlive_(boost::asio::make_work_guard(context_)), thread_([this] {
        for (;;) {
          try {
            context_.run();
            return;
          } catch (const std::exception& error) {
            // run() catches what a job throws; this is a fault of the machinery itself.
            spdlog::error("disk thread: {}", error.what());
          }
        }
      }) {}

DiskThread::~DiskThread() { stop(); }

void DiskThread::stop() {
  keepAlive_.reset();
  if (thread_.joinable()) thread_.join();
}

}  // namespace toolhost::daemon
