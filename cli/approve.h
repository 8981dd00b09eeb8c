// toolhostctl approve: an interactive approver. Subscribes to the daemon's prompts, shows each
// undecided request in plain words on stdout, reads the answer as one line from stdin, and sends
// it with policy.decide. Works the same on a terminal and on pipes (tests and scripts feed answers
// line by line). One thread.
#pragma once

#include <filesystem>

namespace toolhost::cli {

// Runs until the end of input (with no answer left to give) or until the daemon closes the
// connection. Returns toolhostctl's exit code: 0 at the end of input, 1 if subscribing is refused,
// 3 if the connection cannot be made or is lost.
int runApprove(const std::filesystem::path& socket);

}  // namespace toolhost::cli
