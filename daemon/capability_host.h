// What sandboxed tools may ask of the core: the quick requests (ctx.resolveInvocation,
// ctx.createSubtasksResult) answered from the registry and the task store, and the operations
// (fetch, popup) mediated by the policy engine.
// Threads: every member is called on V8 worker threads, concurrently. An operation's checks that
// need no I/O (URL, destination, method, headers, body) run there, before startOperation()
// returns; the rest (authorization, the HTTPS exchange, the popup) runs as a coroutine on its own
// strand of the daemon's io_context.
// Lifetime: destroy the SandboxPool before this host, and this host before the io_context; the
// services must outlive the io_context (operations still queued there reference them).
#pragma once

#include "daemon/mediation.h"
#include "daemon/popups.h"
#include "daemon/storage_host.h"
#include "registry/registry.h"
#include "registry/tasks.h"
#include "runtime/capability_host.h"

#include <boost/asio/any_io_executor.hpp>
#include <boost/json/array.hpp>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace toolhost::daemon {

// The tasks ctx.createSubtasksResult compiled for each call, so that tools.call can answer them
// beside the result (`subtasks`): what the daemon made, which the tool's own result cannot
// forge. A call opens its entry before it runs and closes it when it ends. Any thread.
class SubtaskLedger {
 public:
  static constexpr std::size_t kMaxPerCall = 1000;  // tasks one call may make (a tasks.commit)
  // A fresh key, for the call's invocation ("subtasksKey"). `maxBytes`: what the call's subtasks
  // may take as JSON text, all together (the call's output limit: they are part of its answer).
  std::string open(std::size_t maxBytes);
  enum class Added { added, tooMany, tooLarge, closed };
  // Appends what one createSubtasksResult compiled, or nothing: past kMaxPerCall tasks, past the
  // call's bytes, or when `key` is not open (the call ended).
  Added add(const std::string& key, const boost::json::array& tasks);
  // What the call made, in order; the key is closed.
  boost::json::array close(const std::string& key);

 private:
  struct Made {
    boost::json::array tasks;
    std::size_t bytes = 0;
    std::size_t maxBytes = 0;
  };
  std::mutex mutex_;
  std::uint64_t next_ = 0;
  std::map<std::string, Made> open_;
};

struct CapabilityServices {
  registry::Registry& registry;
  registry::TaskStore& tasks;
  MediationServices mediation;
  PopupHosts& popups;
  StorageHost* storage = nullptr;  // ctx.storage (daemon/storage_host.h); null: not-authorized
  SubtaskLedger* subtasks = nullptr;  // where calls' subtasks are kept for their answers
};

class DaemonCapabilityHost final : public runtime::CapabilityHost {
 public:
  // `executor`: the daemon's io_context; each operation runs on a strand of its own made from it.
  DaemonCapabilityHost(CapabilityServices services, boost::asio::any_io_executor executor)
      : services_(services), executor_(std::move(executor)) {}

  boost::system::result<boost::json::object, runtime::HostOpFailure> resolveInvocation(
      const registry::ToolRevision& caller, const std::string& name,
      const boost::json::object& invocation) override;
  boost::system::result<boost::json::array, std::string> createSubtasks(
      const registry::ToolRevision& caller, const boost::json::value& drafts,
      const boost::json::object& invocation) override;

  // "fetch": request {url, method, headers: [[name, value]...], bodyBase64?, redirect?:
  //   "follow" | "manual" (default) | "error"}; answers {status, statusText, url, redirected,
  //   headers: [[lowercase name, value]...], bodyBase64}. Checks 1-4 and the header and body
  //   checks here, then authorization (fetch, origin, access class of the method), then the
  //   request through the HttpClient; each request a followed redirect leads to goes through
  //   all of it again. The tool's wall clock pauses while a prompt is likely to be shown (see
  //   mayPrompt()).
  // "popup": request {kind: "custom-html", html} or {kind: "origin", url}; answers what the popup
  //   host returned. Authorization (popup, "custom-html" or the url's exact origin, read), then
  //   popup.open to a popup host. The wall clock pauses for the whole popup: a person is asked.
  // "secret": request {name}; answers the placeholder (daemon/secrets_host.h), substituted by the
  //   fetch path toward the origins the secret is granted to. Without a secrets host (the
  //   mediation services' `secrets`), not-authorized.
  // "storage": request {op, key?, value?}; served per tool name by the StorageHost (see
  //   daemon/storage_host.h for the replies); without one, not-authorized.
  // Anything else: not-authorized.
  void startOperation(const registry::ToolRevision& caller, const boost::json::object& invocation,
                      const std::string& kind, boost::json::value request,
                      std::shared_ptr<runtime::HostOperation> operation) override;

 private:
  void startFetch(const registry::ToolRevision& caller, const boost::json::value& request,
                  std::shared_ptr<runtime::HostOperation> operation);
  void startPopup(const registry::ToolRevision& caller, const boost::json::value& request,
                  std::shared_ptr<runtime::HostOperation> operation);

  CapabilityServices services_;
  boost::asio::any_io_executor executor_;
};

}  // namespace toolhost::daemon
