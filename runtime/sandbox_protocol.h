// The protocol between the daemon (ProcessSandboxPool) and a sandbox host process
// (runSandboxHost), and the JSON shapes of what crosses it. Pure functions; any thread.
//
// Transport: one SOCK_STREAM Unix socketpair per host process (fd 3 in the host). NDJSON: one JSON
// object per line, LF-terminated, at most kMaxMessageBytes per line (results may be large),
// written with protocol::writeJson and read with protocol::parseJson (depth bounded by
// maxMessageDepth). Every message has "t", its type. Ids are unsigned integers chosen by the side
// that creates the thing: calls by the daemon, operations ("op") by the host. A message that does
// not parse or has the wrong shape is a protocol error: the daemon kills the host, the host exits.
// The host trusts the daemon; the daemon trusts the host only as far as the calls it has in flight
// there (a request names the call it belongs to, and the daemon acts as that call's tool, never as
// a tool the host names).
//
// Daemon -> host
//   hello       {t, config: RuntimeConfig, daemonPid, slot, logLevel}       first, exactly once
//   call        {t, id, revision, tool?: Tool, arguments, mode: "retained" | "disposable",
//                limits: CallLimits, invocation, settings?: {revision, values: object},
//                checkOnly?: bool}
//               `tool` is sent the first time this host sees the revision (the host caches it
//               until `forget`); the answer is `result` {id}.
//   cancel      {t, id}             terminal cancellation of call `id` (answered by its result,
//                                   within 2 * killGraceMs + 1 s or the host is killed)
//   terminate   {t, revision}       SandboxPool::terminate (answered by `sandboxes`)
//   discard     {t, revision}       SandboxPool::discard (answered by `sandboxes`)
//   forget      {t, revision}       drop the cached Tool of `revision`
//   opPause     {t, op}             HostOperation::pauseWallClock of operation `op`
//   opResume    {t, op}             HostOperation::resumeWallClock
//   opComplete  {t, op, ok: any} | {t, op, error: {code, message}}     HostOperation::complete
//   ping        {t, seq}            answered by pong {seq}; the first (seq 0) follows the hello
//                                   and must be answered within 10 s (the host starts V8 first);
//                                   later ones go only while a started call is past its wall
//                                   clock plus killGraceMs, and must be answered within the grace
//
// Host -> daemon
//   started     {t, id}             call `id` has its sandbox: its wall clock runs from now
//   result      {t, id, outcome: Outcome, own?: OwnRow, sandboxes?: Changes} |
//               {t, id, exception: string (a bug in the host), sandboxes?: Changes}
//               `own` and `sandboxes` (applied before the outcome is delivered) keep the daemon's
//               copy of the retained-sandbox list current when the call returns: `own` is the
//               row of the call's own revision when Changes has one (the common case, and the
//               cheaper form), `sandboxes` the rest. Hosts send them in the order they took them.
//   sandboxes   {t, updated, removed}   Changes, after terminate/discard
//   stalled     {t, calls: [{id, reason: "timeout" | "cpu-limit" | "memory-limit" |
//                "array-buffer-limit" | "cancelled"}]}
//               calls told to stop at least killGraceMs ago whose thread is still inside V8
//               (SandboxPool::stalled); the daemon kills the host. Each id is reported once.
//   opStart     {t, op, call, kind, request, invocation}    CapabilityHost::startOperation, or
//               for kind "resolveInvocation" ({name}) and "createSubtasks" ({drafts})
//               CapabilityHost::startQuickRequest, answered on the daemon's quick-request
//               thread (at most 1024 queued per host; more are refused with code "busy").
//               The daemon acts with the invocation it sent with `call`; the host's copy is
//               not read.
//   opAbort     {t, op}             the call ended before operation `op` completed (onAbort)
//   pong        {t, seq}
//
// Shapes
//   Tool         {revision, name, manifest, installedAt, executionClass: "sandboxed-code" | ...}
//   CallLimits   {wallMs?, cpuMs?, heapMb?, arrayBufferMb?, stackKb?, outputBytes?}
//   Outcome      {revision, logs, usage: {wallMs, cpuMs, heapPeakBytes, freshSandbox},
//                 value: any} | {..., error: {code: callErrcName(), detail, toolError?}}
//   SandboxInfo  {revision, name, calls, heapBytes, idleMs, busy}
//   OwnRow       {calls, heapBytes, idleMs, busy}: a SandboxInfo of the call's revision
//   Changes      {updated: [SandboxInfo], removed: [revision]}   SandboxPool::changes() since the
//                last Changes sent: rows to add or replace (least recently used first), then
//                revisions to drop. The first one the host sends lists every row.
//   RuntimeConfig  every field of runtime::RuntimeConfig under its C++ name; defaults and caps
//                  as CallLimits.
#pragma once

#include "registry/registry.h"
#include "runtime/call_outcome.h"
#include "runtime/limits.h"
#include "runtime/sandbox_pool.h"
#include "runtime/tool_runner.h"
#include "runtime/watchdog.h"

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace toolhost::runtime::ipc {

inline constexpr std::size_t kMaxMessageBytes = std::size_t{256} * 1024 * 1024;

// Nesting allowed in a message from a host: a result or drafts nested maxResultDepth deep, inside
// the few levels of the message around it.
std::size_t maxMessageDepth(const RuntimeConfig& config);
// The longest message the daemon takes from a host: a result within the outputBytes cap, a
// request within kMaxOutstandingRequestBytes (a body as base64), twice over for the escapes of
// their strings, and room for the rest of the message; at most kMaxMessageBytes.
std::size_t maxMessageBytes(const RuntimeConfig& config);
// What the daemon queues for a host that has not read it yet, at most: room for the largest
// message it sends (a fetch's response, as base64) twice over; past it the host is killed.
inline constexpr std::size_t kMaxQueuedToHostBytes = std::size_t{512} << 20;
// A call is refused (overloaded) rather than sent while this much waits to be read by its host:
// callers that send large arguments faster than a busy host reads them get an error each, and
// the host is not killed for what kMaxQueuedToHostBytes keeps for the daemon's answers.
inline constexpr std::size_t kMaxQueuedCallBytes = std::size_t{128} << 20;
// The JSON values the daemon takes in one message from a host: a converted value of at most
// kMaxJsonValues (a result, a stored value, drafts), and the sandbox rows that may come with it.
std::size_t maxMessageValues(const RuntimeConfig& config);
// Nesting a host accepts from the daemon, which it trusts: arguments and manifests were bounded by
// the daemon's own request parser.
inline constexpr std::size_t kMaxDaemonMessageDepth = 4096;
// A sandbox row's idleMs, at most (ten years): beyond it the row is a protocol error.
inline constexpr std::int64_t kMaxIdleMs = std::int64_t{10} * 366 * 24 * 3600 * 1000;

// A message without the fields its type needs.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Field access that throws ProtocolError naming the field.
const boost::json::value& field(const boost::json::object& message, std::string_view name);
std::uint64_t uintField(const boost::json::object& message, std::string_view name);
std::string stringField(const boost::json::object& message, std::string_view name);
const boost::json::object& objectField(const boost::json::object& message, std::string_view name);

boost::json::object configToJson(const RuntimeConfig& config);
RuntimeConfig configFromJson(const boost::json::object& json);

boost::json::object limitsToJson(const CallLimits& limits);
CallLimits limitsFromJson(const boost::json::object& json);

boost::json::object toolToJson(const registry::ToolRevision& tool);
// The revision as the daemon holds it, without compiled schemas (the runtime never validates:
// the daemon did, before the call).
registry::ToolRevisionPtr toolFromJson(const boost::json::object& json);

boost::json::object outcomeToJson(CallOutcome&& outcome);  // moves the value and the logs
CallOutcome outcomeFromJson(boost::json::object&& json);   // moves the value out

boost::json::object infoToJson(const SandboxInfo& info);
SandboxInfo infoFromJson(const boost::json::object& json);
// OwnRow: a SandboxInfo without the revision and name, which the daemon knows from the call.
boost::json::object ownRowToJson(const SandboxInfo& info);
// Reads an OwnRow's fields into `info`, leaving its revision and name as they are.
void readOwnRow(const boost::json::object& json, SandboxInfo& info);

// Changes (above). Empty when nothing changed.
boost::json::object changesToJson(const SandboxPool::Changes& changes);
SandboxPool::Changes changesFromJson(const boost::json::object& json);

std::optional<CallErrc> callErrcFromName(std::string_view name);
std::string_view killName(Kill reason);
std::optional<Kill> killFromName(std::string_view name);

}  // namespace toolhost::runtime::ipc
