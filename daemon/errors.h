// The daemon's application error codes (JSON-RPC -32000..-32099). Only daemon/ knows these; the
// services below it report outcomes as values, and daemon/ maps each to one code here.
#pragma once

#include "protocol/jsonrpc.h"

#include <string>
#include <string_view>
#include <utility>

namespace toolhost::daemon::app_error {

inline constexpr int kNotFound = -32001;
inline constexpr int kUnauthorized = -32002;     // the caller's role does not allow the method
inline constexpr int kDeniedByPolicy = -32003;
inline constexpr int kTimeout = -32004;
inline constexpr int kMemoryLimit = -32005;
inline constexpr int kCpuLimit = -32006;
inline constexpr int kOutputTooLarge = -32007;
inline constexpr int kToolThrew = -32008;
inline constexpr int kCancelled = -32009;
inline constexpr int kOverloaded = -32010;
inline constexpr int kInvalidDefinition = -32011;
inline constexpr int kConflict = -32012;
inline constexpr int kIntegrity = -32013;
inline constexpr int kUnavailable = -32014;      // shutting down, or a subsystem is not ready
inline constexpr int kStorageFull = -32015;
inline constexpr int kArrayBufferLimit = -32016;
inline constexpr int kStackLimit = -32017;
inline constexpr int kSandboxCrashed = -32018;   // the sandbox process died under the call

// The fixed error.message for each code; error.data says the specifics.
inline std::string_view message(int code) {
  switch (code) {
    case kNotFound: return "Not found";
    case kUnauthorized: return "Unauthorized";
    case kDeniedByPolicy: return "Denied by policy";
    case kTimeout: return "Timeout";
    case kMemoryLimit: return "Memory limit exceeded";
    case kCpuLimit: return "CPU limit exceeded";
    case kOutputTooLarge: return "Output too large";
    case kToolThrew: return "Tool threw";
    case kCancelled: return "Cancelled";
    case kOverloaded: return "Overloaded";
    case kInvalidDefinition: return "Invalid definition";
    case kConflict: return "Conflict";
    case kIntegrity: return "Integrity error";
    case kUnavailable: return "Unavailable";
    case kStorageFull:
      return "Storage error";  // full, or an I/O or integrity failure
    case kArrayBufferLimit: return "ArrayBuffer limit exceeded";
    case kStackLimit: return "Stack limit exceeded";
    case kSandboxCrashed: return "Sandbox crashed";
    default: return "Server error";
  }
}

// An error of one of these codes, with its fixed message.
inline protocol::RpcError error(int code, std::string kind, std::string detail) {
  return protocol::RpcError{code, std::string(message(code)), std::move(kind), std::move(detail)};
}

}  // namespace toolhost::daemon::app_error
