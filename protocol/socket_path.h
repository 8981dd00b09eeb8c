// Where the daemon's socket is when nothing names it, shared by toolhostd and toolhostctl so both
// find the same one: /run/toolhost/toolhost.sock for root, $XDG_RUNTIME_DIR/toolhost/toolhost.sock,
// else /tmp/toolhost-<uid>/toolhost.sock. Any thread.
#pragma once

#include <filesystem>

namespace toolhost::protocol {

std::filesystem::path defaultSocketPath();

// --socket, else $TOOLHOST_SOCKET, else defaultSocketPath(). An empty $TOOLHOST_SOCKET (a script's
// unset variable) throws std::invalid_argument rather than mean the default: a client or daemon
// meant for one socket must not reach another's. The flag's caller refuses an empty flag.
std::filesystem::path chooseSocketPath(const std::filesystem::path& flag);

}  // namespace toolhost::protocol
