#include "protocol/socket_path.h"

#include <unistd.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace toolhost::protocol {
namespace fs = std::filesystem;

fs::path defaultSocketPath() {
  if (::geteuid() == 0) return "/run/toolhost/toolhost.sock";
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  if (runtime != nullptr && *runtime != '\0') return fs::path(runtime) / "toolhost/toolhost.sock";
  return fs::path("/tmp") / ("toolhost-" + std::to_string(::geteuid())) / "toolhost.sock";
}

fs::path chooseSocketPath(const fs::path& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv("TOOLHOST_SOCKET");
  if (env != nullptr) {
    if (*env == '\0') {
      throw std::invalid_argument(
          "TOOLHOST_SOCKET is set but empty: unset it for the default socket, or name one");
    }
    return env;
  }
  return defaultSocketPath();
}

}  // namespace toolhost::protocol
