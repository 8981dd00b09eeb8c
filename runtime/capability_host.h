// What sandboxed code may ask of the rest of the daemon (ctx.resolveInvocation,
// ctx.createSubtasksResult). Implemented by the daemon with the registry and the task store.
// Called on a V8 worker thread, never while an isolate is locked, and possibly from several
// workers at once: implementations must be thread-safe and quick (short LMDB transactions).
#pragma once

#include "registry/registry.h"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <boost/system/result.hpp>

#include <string>

namespace toolhost::runtime {

class CapabilityHost {
 public:
  virtual ~CapabilityHost() = default;

  // The opaque revisions a call of tool `name` would run with: {toolRevision, settingsRevision?}.
  // Anything else in the object is dropped before the tool sees it. An error is a sentence.
  virtual boost::system::result<boost::json::object, std::string> resolveInvocation(
      const registry::ToolRevision& caller, const std::string& name) = 0;

  // Compiles and hashes the drafts (as the tool passed them, already plain JSON) into tasks.
  virtual boost::system::result<boost::json::array, std::string> createSubtasks(
      const registry::ToolRevision& caller, const boost::json::value& drafts,
      const boost::json::object& invocation) = 0;
};

}  // namespace toolhost::runtime
