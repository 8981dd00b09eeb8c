// How `import` specifiers in a tool's source name its own modules (manifest.execution.modules).
// Pure functions; any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace toolhost::runtime {

// The name (a key of `modules`) that `specifier` refers to when imported by the module named
// `importer` ("" for the tool's source, which sits at the root). "./x.js" and "../x.js" are
// relative to the importer's folder; "/x.js" and bare "x.js" or "lib/x.js" are relative to the
// root. Nullopt for anything that is not a path inside the revision: URLs and schemes
// ("node:fs", "https://..."), paths that climb above the root, empty segments, backslashes.
std::optional<std::string> resolveModuleSpecifier(std::string_view importer,
                                                  std::string_view specifier);

}  // namespace toolhost::runtime
