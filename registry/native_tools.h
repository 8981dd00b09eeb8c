// The daemon's built-in (trusted-native) tools. Their code runs with the daemon's authority, so
// each is small, reviewed, and touches nothing but its arguments. Any thread.
#pragma once

#include "registry/registry.h"

#include <vector>

namespace toolhost::registry {

// echo: returns its arguments unchanged. time-now: the current time.
std::vector<NativeTool> builtinNativeTools();

}  // namespace toolhost::registry
