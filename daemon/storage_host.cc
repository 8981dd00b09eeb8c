#include "daemon/storage_host.h"

#include "protocol/json_text.h"

#include <spdlog/spdlog.h>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>

#include <exception>
#include <utility>
#include <vector>

namespace toolhost::daemon {
namespace json = boost::json;
using registry::StorageErrc;
using registry::StorageOp;
using runtime::HostOperation;
using runtime::HostOpFailure;

namespace {

const char* failureCode(StorageErrc code) {
  switch (code) {
    case StorageErrc::invalidArgument:
      return "invalid-argument";
    case StorageErrc::quotaExceeded:
      return "quota-exceeded";
    case StorageErrc::full:
      return "storage-full";
    case StorageErrc::failed:
      return "storage-failed";
  }
  return "storage-failed";
}

// The runtime builds the request; a shape it should never send is refused with these words.
HostOpFailure malformed(std::string_view what) {
  return {"internal", "the runtime passed a malformed storage request (" + std::string(what) + ")"};
}

json::value replyOf(const StorageOp& op, registry::StorageOpOutcome& outcome,
                    const registry::StorageQuotas& quotas) {
  switch (op.kind) {
    case StorageOp::Kind::get:
      return outcome.value ? std::move(*outcome.value) : json::value(nullptr);
    case StorageOp::Kind::set:
      return json::object{{"keys", outcome.usage.keys},
                          {"bytes", outcome.usage.bytes},
                          {"maxKeys", quotas.maxKeys},
                          {"maxBytes", quotas.maxTotalBytes}};
    case StorageOp::Kind::erase:
      return json::value(outcome.existed);
    case StorageOp::Kind::list: {
      json::array keys;
      keys.reserve(outcome.keys.size());
      for (auto& key : outcome.keys) keys.emplace_back(key);
      return keys;
    }
  }
  return nullptr;
}

}  // namespace

StorageHost::StorageHost(registry::ToolStorage& storage, const ConfigHolder& configs)
    : storage_(storage), configs_(configs), thread_([this] { run(); }) {}

StorageHost::~StorageHost() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

bool StorageHost::requested(const json::object& manifest) {
  const auto* capabilities = manifest.if_contains("capabilities");
  if (capabilities == nullptr || !capabilities->is_object()) return false;
  const auto* storage = capabilities->as_object().if_contains("storage");
  return storage != nullptr && storage->is_bool() && storage->as_bool();
}

void StorageHost::start(const registry::ToolRevision& caller, const json::value& request,
                        std::shared_ptr<HostOperation> operation) {
  if (!requested(caller.manifest)) {
    return operation->complete(
        HostOpFailure{"not-authorized",
                      "ctx.storage is not authorized: " +
                          registry::notRequestedWords(
                              caller, "ctx.storage", "add \"storage\": true to its capabilities")});
  }
  const json::object* fields = request.if_object();
  if (fields == nullptr) return operation->complete(malformed("not an object"));
  const json::value* opField = fields->if_contains("op");
  if (opField == nullptr || !opField->is_string()) return operation->complete(malformed("op"));
  const json::string& opName = opField->get_string();

  StorageOp op;
  op.tool = caller.name;
  if (opName == "get") {
    op.kind = StorageOp::Kind::get;
  } else if (opName == "set") {
    op.kind = StorageOp::Kind::set;
  } else if (opName == "delete") {
    op.kind = StorageOp::Kind::erase;
  } else if (opName == "list") {
    op.kind = StorageOp::Kind::list;
  } else {
    return operation->complete(malformed("op " + std::string(opName.subview(0, 16))));
  }
  if (op.kind != StorageOp::Kind::list) {
    const json::value* key = fields->if_contains("key");
    if (key == nullptr || !key->is_string()) return operation->complete(malformed("key"));
    op.key = std::string(key->get_string());
  }
  if (op.kind == StorageOp::Kind::set) {
    // Written here, so that what waits in the queue is bounded by max_value_bytes. The runtime
    // sends undefined as null; a missing value is the same to the tool.
    const json::value* value = fields->if_contains("value");
    op.valueJson = protocol::writeJson(value != nullptr ? *value : json::value(nullptr));
    if (auto refusal = registry::ToolStorage::checkValueSize(op.valueJson->size(),
                                                             configs_.current()->storage)) {
      return operation->complete(HostOpFailure{failureCode(refusal->code), refusal->detail});
    }
  }

  auto aborted = std::make_shared<std::atomic<bool>>(false);
  const std::size_t bytes = op.key.size() + (op.valueJson ? op.valueJson->size() : 0);
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      return operation->complete(
          HostOpFailure{"cancelled", "the daemon is shutting down; storage is closed"});
    }
    if (!queue_.empty() &&
        (queue_.size() >= kMaxQueuedOps || queuedBytes_ + bytes > kMaxQueuedBytes)) {
      return operation->complete(
          HostOpFailure{"overloaded", "too many storage operations are waiting for the disk (" +
                                          std::to_string(queue_.size()) +
                                          "); await earlier ones before starting more"});
    }
    queuedBytes_ += bytes;
    queue_.push_back(Pending{std::move(op), operation, aborted, bytes});
  }
  wake_.notify_one();
  // A call that ends (cancelled, timed out) before its turn came: its operation is skipped.
  operation->onAbort([aborted] { aborted->store(true); });
}

void StorageHost::run() {
  std::vector<Pending> batch;
  std::vector<StorageOp> ops;
  for (;;) {
    batch.clear();
    ops.clear();
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued was served
      while (!queue_.empty() && batch.size() < kMaxBatch) {
        queuedBytes_ -= queue_.front().bytes;
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    // Skip what was aborted while it waited; its completion is ignored anyway.
    std::erase_if(batch, [](const Pending& pending) {
      if (!pending.aborted->load()) return false;
      pending.operation->complete(
          HostOpFailure{"cancelled", "the call ended before the storage operation ran"});
      return true;
    });
    if (batch.empty()) continue;
    ops.reserve(batch.size());
    for (auto& pending : batch) ops.push_back(std::move(pending.op));

    const registry::StorageQuotas quotas = configs_.current()->storage;
    std::vector<registry::StorageResult<registry::StorageOpOutcome>> outcomes;
    try {
      outcomes = storage_.apply(ops, quotas);
    } catch (const std::exception& error) {
      spdlog::error("storage: {} operation(s) failed: {}", ops.size(), error.what());
      for (auto& pending : batch) {
        pending.operation->complete(HostOpFailure{
            "internal", "the daemon failed while serving storage; its log has the details"});
      }
      continue;
    }
    for (std::size_t i = 0; i < batch.size(); ++i) {
      auto& outcome = outcomes[i];
      if (!outcome) {
        batch[i].operation->complete(
            HostOpFailure{failureCode(outcome.error().code), std::move(outcome.error().detail)});
      } else {
        batch[i].operation->complete(replyOf(ops[i], *outcome, quotas));
      }
    }
  }
}

}  // namespace toolhost::daemon
