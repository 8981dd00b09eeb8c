// Outcomes of registry and task operations that a caller must handle: values, not exceptions.
// daemon/ maps each code to one JSON-RPC error.
#pragma once

#include <boost/system/result.hpp>

#include <string>

namespace toolhost::registry {

enum class RegistryErrc {
  notFound,           // no such tool, revision, binding, settings or task
  conflict,           // e.g. moving a binding without replace: true
  invalidDefinition,  // a manifest, settings, draft or task that breaks a rule
  invalidArguments,   // call arguments that do not match the tool's parameters
  reservedName,       // a name that belongs to a built-in tool
  integrity,          // stored data that no longer matches its hash; never served
  storage,            // the state database failed (full disk, map full, I/O)
  tooLarge,           // an answer larger than any client could be sent
};

struct RegistryError {
  RegistryErrc code;
  std::string detail;  // a sentence a user can act on; names the field where there is one
};

template <typename T>
using Result = boost::system::result<T, RegistryError>;

inline RegistryError registryError(RegistryErrc code, std::string detail) {
  return RegistryError{code, std::move(detail)};
}

}  // namespace toolhost::registry
