// External-service tools: tools.call on an `external-service` revision forwards the call as one
// JSON-RPC request {"jsonrpc":"2.0","id":1,"method":"tools.call","params":{"name","arguments"}}
// to the manifest's endpoint, after the same mediation as fetch: the authorization of (revision,
// invoke, endpoint, write), then for https: the destination rules, pinned DNS and verified TLS of
// the HttpClient (a POST of that JSON); for unix:/path one NDJSON line over that socket and one
// line back. The JSON-RPC result is the tool's result; a JSON-RPC error is the tool's error.
// Threads: call() runs on the awaiting coroutine's executor, which must be a strand (a session's
// is); it honours terminal cancellation of that coroutine. Audits every request.
#pragma once

#include "daemon/mediation.h"
#include "daemon/method_table.h"
#include "registry/registry.h"

#include <boost/asio/awaitable.hpp>
#include <boost/json/object.hpp>

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace toolhost::daemon {

class ExternalTools {
 public:
  explicit ExternalTools(MediationServices services) : services_(services) {}

  // The daemon's own listening socket (and those made again after its file went:
  // setOwnSockets): an endpoint that is one (by path, symlink or hard link) is refused, or each
  // call would call itself again, as admin, until descriptors ran out. Any thread.
  void addOwnSocket(const std::filesystem::path& socket);
  // The files (device, inode) of the daemon's listening sockets, replacing what was known.
  void setOwnSockets(std::vector<std::pair<dev_t, ino_t>> files);

  // Forwards one call of `tool` (an external-service revision; arguments already validated).
  // The tool's limits are the manifest's wallMs (else [fetch] timeout_ms) and outputBytes (else
  // [runtime] default_output_bytes), within [runtime]'s caps; `requested` (the call's) may only
  // tighten them. The exchange (not the prompt) is bounded by wallMs, and a result whose JSON
  // text is larger than outputBytes answers output-too-large. Answers tools.call's result shape
  // {result, name, revision, usage: {wallMs}} or a JSON-RPC error.
  boost::asio::awaitable<MethodResult> call(registry::ToolRevisionPtr tool,
                                            boost::json::object arguments,
                                            runtime::CallLimits requested);

 private:
  MediationServices services_;
  bool isOwnSocket(const std::filesystem::path& path) const;

  mutable std::mutex ownMutex_;
  std::vector<std::pair<dev_t, ino_t>> ownSockets_;  // under ownMutex_
};

}  // namespace toolhost::daemon
