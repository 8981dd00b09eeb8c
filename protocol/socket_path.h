// Where the daemon's socket is when nothing names it, shared by toolhostd and toolhostctl so both
// find the same one: /run/toolhost/toolhost.sock for root, $XDG_RUNTIME_DIR/toolhost/toolhost.sock,
// else /tmp/toolhost-<uid>/toolhost.sock. Any thread.
#pragma once

#include <filesystem>

namespace toolhost::protocol {

std::filesystem::path defaultSocketPath();

// --socket, else $TOOLHOST_SOCKET, else defaultSocketPath().
std::filesystem::path chooseSocketPath(const std::filesystem::path& flag);

}  // namespace toolhost::protocol
