// What code that escaped V8 in a sandbox host could still do (runtime/confinement.h): the probe
// confines itself as a host does and tries; and the daemon's hosts are confined.
#include "tests/support/daemon_process.h"
#include "tests/support/temp_dir.h"

#include <catch2/catch.hpp>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

using toolhost::testing::runProgram;
using toolhost::testing::TempDir;
namespace fs = std::filesystem;

namespace {

const std::string kProbe = TOOLHOST_CONFINEMENT_PROBE;

// "<what> ok" / "<what> denied <errno name>" lines: what -> outcome.
std::map<std::string, std::string> outcomes(const std::string& out) {
  std::map<std::string, std::string> found;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const auto space = line.find(' ');
    if (space != std::string::npos) found[line.substr(0, space)] = line.substr(space + 1);
  }
  return found;
}

struct Setup {
  TempDir dir;
  fs::path secret = dir.path() / "vault.key";
  fs::path changeable = dir.path() / "dir";
  Setup() {
    std::ofstream(secret) << "the daemon's secret";
    fs::create_directory(changeable);
    std::ofstream(changeable / "keep") << "kept";
  }
  void checkUntouched() const {
    CHECK(fs::exists(changeable / "keep"));
    CHECK_FALSE(fs::exists(changeable / "new"));
    CHECK_FALSE(fs::exists(changeable / "sub"));
  }
};

// Runs the probe in `mode` against the setup's files; what it got, by attempt.
std::map<std::string, std::string> probe(const char* mode, const Setup& setup) {
  auto run = runProgram({kProbe, mode, setup.secret.string(), setup.changeable.string()});
  INFO(run.out << run.err);
  REQUIRE(run.status == 0);
  return outcomes(run.out);
}

}  // namespace

TEST_CASE("a sandbox host under Landlock reads only what V8 needs and changes nothing",
          "[e2e][confinement]") {
  Setup setup;
  auto got = probe("files", setup);
  if (got["landlock"] != "enforced") {
    WARN("this kernel has no Landlock: the call filter alone guards files (next test)");
    return;
  }
  CHECK(got["read-secret"] == "denied EACCES");
  CHECK(got["read-parent-proc"] == "denied EACCES");
  CHECK(got["create-file"] == "denied EACCES");
  CHECK(got["unlink-file"] == "denied EACCES");
  CHECK(got["mkdir"] == "denied EACCES");
  CHECK(got["read-usr"] == "ok");
  CHECK(got["read-own-proc"] == "ok");
  setup.checkUntouched();
}

TEST_CASE(
    "a sandbox host under its call filter reaches no file, network, process or memory "
    "outside itself",
    "[e2e][confinement]") {
  Setup setup;
  auto got = probe("calls", setup);
  CHECK(got["before-read-secret"] == "ok");
  // Whatever Landlock says, the filter refuses every open.
  const char* const refused[] = {"read-secret",
                                 "read-usr",
                                 "read-own-proc",
                                 "read-parent-proc",
                                 "create-file",
                                 "unlink-file",
                                 "mkdir",
                                 "socket-unix",
                                 "socket-inet",
                                 "socketpair",
                                 "early-thread-socket",
                                 "execve",
                                 "fork",
                                 "kill-parent",
                                 "kill-group",
                                 "ptrace-parent",
                                 "read-parent-memory",
                                 "unshare-user",
                                 "io-uring",
                                 "bpf",
                                 "mmap-write-exec",
                                 "mprotect-exec",
                                 "mmap-exec",
                                 "memfd",
                                 "personality-exec",
                                 "prlimit-parent",
                                 "setpriority-parent",
                                 "setpriority-user",
                                 "setaffinity-parent",
                                 "fcntl-setown",
                                 "ioctl-fiosetown",
                                 "ioctl-tiocsti-high",
                                 "ioctl-interfaces",
                                 "inotify",
                                 "getxattr",
                                 "msgget",
                                 "fchmodat2",
                                 "thread",
                                 "pipe",
                                 "fcntl-setpipe-sz"};
  for (const char* what : refused) {
    INFO(what);
    CHECK(got[what] == "denied EPERM");
  }
  CHECK(got["newer-call"] == "denied ENOSYS");
  CHECK(got["unnamed-call"] == "denied ENOSYS");
  // What a host needs goes on working.
  const char* const allowed[] = {"kill-self",         "mmap-read-write", "getrandom",
                                 "personality-query", "prlimit-self",    "setpriority-self",
                                 "fcntl-setfl",       "ioctl-fionread",  "ioctl-tcgets",
                                 "send-inherited"};
  for (const char* what : allowed) {
    INFO(what);
    CHECK(got[what] == "ok");
  }
  setup.checkUntouched();
}

TEST_CASE("a sandbox host's call filter kills a system call of another architecture",
          "[e2e][confinement]") {
  // A sanitizer's handler would turn a fault into its report and exit code: die of it instead.
  const char* sanitizer = std::getenv("ASAN_OPTIONS");
  const std::map<std::string, std::string> env{
      {"ASAN_OPTIONS", std::string(sanitizer != nullptr ? sanitizer : "") + ":handle_segv=0"}};
  auto run = runProgram({kProbe, "int80"}, "", env);
  INFO(run.out << run.err);
  CHECK(run.out == "confined\n");
  // Some kernels (a VM's, or one booted with ia32_emulation=0) have no 32-bit entry: int 0x80
  // faults before any filter sees it, confined or not. The call must not run either way.
  auto bare = runProgram({kProbe, "int80-bare"}, "", env);
  if (bare.status == 128 + SIGSEGV && bare.out.empty()) {
    WARN("this kernel has no 32-bit system call entry; the filter's kill is not reached");
    CHECK(run.status == 128 + SIGSEGV);
  } else {
    INFO(bare.out << bare.err);
    REQUIRE(bare.out.rfind("int80 returned ", 0) == 0);
    CHECK(run.status == 128 + SIGSYS);
  }
}
