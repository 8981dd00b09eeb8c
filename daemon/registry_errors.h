// Maps registry outcomes to JSON-RPC errors. Any thread.
#pragma once

#include "daemon/errors.h"
#include "daemon/method_table.h"
#include "registry/errors.h"

namespace toolhost::daemon {

inline protocol::RpcError toRpcError(const registry::RegistryError& error) {
  using registry::RegistryErrc;
  auto make = [&](int code, const char* kind) {
    return protocol::RpcError{code, std::string(app_error::message(code)), kind, error.detail};
  };
  switch (error.code) {
    case RegistryErrc::notFound: return make(app_error::kNotFound, "not-found");
    case RegistryErrc::conflict: return make(app_error::kConflict, "conflict");
    case RegistryErrc::invalidDefinition:
      return make(app_error::kInvalidDefinition, "invalid-definition");
    case RegistryErrc::invalidArguments:
      return protocol::RpcError{protocol::rpc_error::kInvalidParams, "Invalid params",
                                "invalid-arguments", error.detail};
    case RegistryErrc::reservedName: return make(app_error::kConflict, "reserved-name");
    case RegistryErrc::integrity: return make(app_error::kIntegrity, "integrity");
    case RegistryErrc::storage: return make(app_error::kStorageFull, "storage");
    case RegistryErrc::tooLarge:
      return make(app_error::kOutputTooLarge, "output-too-large");
  }
  return make(protocol::rpc_error::kInternalError, "internal");
}

inline MethodResult registryFailure(const registry::RegistryError& error) { return toRpcError(error); }

}  // namespace toolhost::daemon
