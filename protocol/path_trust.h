// Whether a path could be changed by a user other than this process's effective user: used by
// toolhostd before it listens or keeps state in a directory that already exists, and by
// toolhostctl before it trusts the default socket under /tmp. A directory in /tmp made by another
// user, or one others may write to, lets that user put their own socket (and read what clients
// send it) or their own database and key in place of the daemon's.
#pragma once

#include <sys/types.h>

#include <boost/system/result.hpp>

#include <filesystem>
#include <optional>
#include <string>

namespace toolhost::protocol {

// Every existing component of `path` (made absolute, each prefix looked up as written, then also
// resolved through its symbolic links) must belong to the effective user or root, and a
// directory must not be writable by others, nor by its group unless that is the user's own
// private group, unless its sticky bit is set (as /tmp's is). Components that do not exist yet
// are not judged. std::nullopt when the path is trusted, else the reason, naming the component.
std::optional<std::string> untrustedPathReason(const std::filesystem::path& path);

// Creates the missing components of `dir` with `mode` (whatever the umask; and `group`, when
// given), then judges the whole path again, so that a component another user made meanwhile is
// refused too. Whether any component was made here; or why the path cannot be trusted or made.
boost::system::result<bool, std::string> makeTrustedDirectories(const std::filesystem::path& dir,
                                                                mode_t mode,
                                                                std::optional<gid_t> group = {});

}  // namespace toolhost::protocol
