// toolhostctl popup-host: a popup host for scripts and desktop integrations. Subscribes with
// popup.subscribe (its result is the first line on stdout: the host is ready), prints every
// popup.open and popup.close notification as one JSON line on stdout, and sends each line read
// from stdin as the params of popup.result ({popupId, result} or {popupId, error: {code?,
// message}}). One thread.
#pragma once

#include <filesystem>

namespace toolhost::cli {

// Runs until the end of input or until the daemon closes the connection. Returns toolhostctl's
// exit code: 0 at the end of input, 1 if subscribing is refused, 3 if the connection cannot be
// made or is lost. An answer the daemon refuses is reported on stderr; the host goes on.
int runPopupHost(const std::filesystem::path& socket);

}  // namespace toolhost::cli
