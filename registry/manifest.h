// Manifest rules beyond the JSON Schema: names, origins, module names, sizes, and what a
// manifest requests (capabilities and limits) in a comparable form. Pure functions; any thread.
#pragma once

#include "registry/errors.h"
#include "registry/registry.h"

#include <boost/json/object.hpp>

#include <set>
#include <string>

namespace toolhost::registry {

// Checks a manifest against the schema and every rule the schema cannot say; on success, the
// canonical JSON that is hashed and stored.
Result<std::string> validateManifest(const boost::json::object& manifest, const RegistryLimits& limits);

ExecutionClass executionClassOf(const boost::json::object& manifest);

// Capabilities as flat words ("fetch https://api.example read", "storage", "secret api_key").
std::set<std::string> requestedCapabilities(const boost::json::object& manifest);

// {capabilities: {added, removed}, limits: {key: {from, to}}} between two manifests.
boost::json::object describeChanges(const boost::json::object& from, const boost::json::object& to);

// True for an exact https origin in canonical form, as fetch writes it (policy::
// whyNotCanonicalOrigin): "https://host" or "https://host:port", lowercase, no default port, no
// path, query, fragment or credentials, IPv4 as a dotted quad, IPv6 as RFC 5952 writes it.
bool isCanonicalHttpsOrigin(std::string_view text);

// A module name a tool may have (manifest execution.modules, a lineage definition's modules): a
// relative path of letters, digits, '-', '_', '.', '/', at most 128 bytes, ending in .js or .mjs,
// without '..' or '//'.
bool validModuleName(std::string_view name);
inline constexpr std::string_view kModuleNameRule =
    "use a relative path of letters, digits, '-', '_', '.', '/' ending in .js or .mjs, without "
    "'..'";

}  // namespace toolhost::registry
