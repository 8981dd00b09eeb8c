// Access class of a fetch: whether a request only reads (GET, HEAD, OPTIONS) or may change
// something (every other method). Part of the decision key. Pure functions: any thread.
#pragma once

#include <string>
#include <string_view>

namespace toolhost::policy {

enum class AccessClass { read, write };

// "read" or "write", as shown in prompts and stored in decisions.
std::string_view accessClassName(AccessClass access);

// The method as fetch() sends it: a case-insensitive match for DELETE, GET, HEAD, OPTIONS, POST or
// PUT is uppercased (the Fetch standard's "normalize a method"); any other method, PATCH included,
// stays as given, as browsers send it.
std::string normalizeMethod(std::string_view method);

// GET, HEAD and OPTIONS (after normalizeMethod, so also "get") are read; everything else is write,
// including unknown and malformed methods: the class never errs on the side of read.
AccessClass accessClassOf(std::string_view method);

}  // namespace toolhost::policy
