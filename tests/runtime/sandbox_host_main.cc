// The sandbox host the process pool's tests start: what toolhostd does when started with
// --sandbox-host (runtime/sandbox_host.h), and nothing else.
#include "runtime/sandbox_host.h"

#include <cstdio>
#include <string_view>

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "--sandbox-host") {
    return toolhost::runtime::runSandboxHost(3, argc, argv);
  }
  std::fprintf(stderr, "runtime_sandbox_host: only --sandbox-host, started by the tests\n");
  return 2;
}
