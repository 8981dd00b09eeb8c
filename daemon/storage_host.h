// ctx.storage for sandboxed tools: the "storage" operation of runtime/capabilities.h, served from
// registry::ToolStorage per tool NAME. Each request is authorized against the caller's manifest
// (capabilities.storage: true; no prompt: the data is local and the tool's own), then queued to
// one thread of this host's, which runs the queued operations in arrival order, up to kMaxBatch
// of them in one LMDB transaction: one wait for the disk (fdatasync: milliseconds) for all, and
// never on an I/O thread or one of the runtime's host threads.
//
// Requests and replies (the runtime resolves the tool's promise with the reply as is):
//   {"op": "get", "key"}           -> the stored value, or null when the key has none
//   {"op": "set", "key", "value"}  -> {"keys", "bytes", "maxKeys", "maxBytes"}: the tool's usage
//                                     after the write and the quotas in force
//   {"op": "delete", "key"}        -> true if the key existed, else false
//   {"op": "list"}                 -> every key, sorted by their UTF-8 bytes
// Failures (the promise rejects with an Error whose code is): "not-authorized",
// "invalid-argument" (key empty, over max_key_bytes, control characters), "quota-exceeded" (the
// message names max_keys, max_value_bytes or max_total_bytes and the numbers), "storage-full",
// "storage-failed", "overloaded" (too much is waiting for the disk: await earlier operations
// before starting more), "cancelled" (the call ended before its turn came).
//
// Threads: start() from any thread, returning at once; operations complete on the storage
// thread. Quotas are read from the configuration in force when an operation runs (a reload
// applies [storage] at once).
// Lifetime: destroy the SandboxPool first (its calls end), then this host (it serves what is
// still queued, then joins its thread), then the ToolStorage and the Store.
#pragma once

#include "daemon/config.h"
#include "registry/registry.h"
#include "registry/tool_storage.h"
#include "runtime/capability_host.h"

#include <boost/json/value.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

namespace toolhost::daemon {

class StorageHost {
 public:
  // The most operations one transaction carries.
  static constexpr std::size_t kMaxBatch = 256;
  // What may wait for the storage thread (keys and values' JSON text, and operations); past it,
  // operations fail at once with code "overloaded". One operation is always admitted when the
  // queue is empty. Values over max_value_bytes are refused before they are queued.
  static constexpr std::size_t kMaxQueuedBytes = std::size_t{64} << 20;
  static constexpr std::size_t kMaxQueuedOps = 100000;

  StorageHost(registry::ToolStorage& storage, const ConfigHolder& configs);
  ~StorageHost();
  StorageHost(const StorageHost&) = delete;
  StorageHost& operator=(const StorageHost&) = delete;

  // Checks `request` and the caller's manifest, then queues the operation.
  void start(const registry::ToolRevision& caller, const boost::json::value& request,
             std::shared_ptr<runtime::HostOperation> operation);

  // Whether the manifest requests capabilities.storage.
  static bool requested(const boost::json::object& manifest);

 private:
  struct Pending {
    registry::StorageOp op;
    std::shared_ptr<runtime::HostOperation> operation;
    std::shared_ptr<std::atomic<bool>> aborted;
    std::size_t bytes = 0;  // counted in queuedBytes_ while queued
  };

  void run();

  registry::ToolStorage& storage_;
  const ConfigHolder& configs_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Pending> queue_;
  std::size_t queuedBytes_ = 0;
  bool stopping_ = false;
  std::thread thread_;  // last: started once everything above is ready
};

}  // namespace toolhost::daemon
