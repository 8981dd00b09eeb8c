// Test helper: confines itself as a sandbox host does (runtime/confinement.h), then acts as code
// that escaped V8 would, and prints what each attempt got: "<what> ok" or "<what> denied <errno>".
//
//   confinement_probe files SECRET DIR   after confineFiles() only (Landlock)
//   confinement_probe calls SECRET DIR   after confineFiles() and confineCalls(jit = false)
//   confinement_probe int80              after both, a 32-bit system call (the filter kills it)
//   confinement_probe int80-bare         the same call unconfined: whether this kernel has the
//                                        32-bit entry at all (without it, int 0x80 faults)
//
// SECRET is a file the probe must no longer read; DIR a directory it must no longer change, with
// a file `keep` in it. The parent (the test) stands for the daemon.
#include "runtime/confinement.h"

#include <fcntl.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/msg.h>
#include <sys/personality.h>
#include <sys/ptrace.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

namespace {

// Prints the outcome of an attempt that returns -1 with errno on failure.
void report(const char* what, long rc) {
  if (rc == -1) {
    std::printf("%s denied %s\n", what, strerrorname_np(errno));
  } else {
    std::printf("%s ok\n", what);
  }
  std::fflush(stdout);
}

long readFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char byte;
  const long n = ::read(fd, &byte, 1);
  ::close(fd);
  return n < 0 ? -1 : 0;
}

long createFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  ::close(fd);
  return 0;
}

// A thread started before the call filter: the filter must reach it too.
class EarlyThread {
 public:
  EarlyThread() : thread_([this] { run(); }) {}
  ~EarlyThread() { thread_.join(); }
  // Runs `socket()` on the early thread, once, and returns what it got.
  long trySocket() {
    std::unique_lock lock(mutex_);
    go_ = true;
    wake_.notify_all();
    wake_.wait(lock, [this] { return done_; });
    return result_;
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    wake_.wait(lock, [this] { return go_; });
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    result_ = fd < 0 ? -1 : 0;
    if (fd >= 0) ::close(fd);
    done_ = true;
    wake_.notify_all();
  }
  std::mutex mutex_;
  std::condition_variable wake_;
  bool go_ = false;
  bool done_ = false;
  long result_ = 0;
  std::thread thread_;
};

void filesystemAttempts(const std::string& secret, const std::string& dir) {
  report("read-secret", readFile(secret));
  report("read-usr", readFile("/usr/lib/os-release"));
  report("read-own-proc", readFile("/proc/self/status"));
  report("read-parent-proc", readFile("/proc/" + std::to_string(::getppid()) + "/status"));
  report("create-file", createFile(dir + "/new"));
  report("unlink-file", ::unlink((dir + "/keep").c_str()));
  report("mkdir", ::mkdir((dir + "/sub").c_str(), 0700));
}

int files(const std::string& secret, const std::string& dir) {
  const auto confined = toolhost::runtime::confineFiles();
  std::printf("landlock %s\n", confined.enforced ? "enforced" : "unavailable");
  filesystemAttempts(secret, dir);
  return 0;
}

int calls(const std::string& secret, const std::string& dir) {
  report("before-read-secret", readFile(secret));
  const auto confined = toolhost::runtime::confineFiles();
  std::printf("landlock %s\n", confined.enforced ? "enforced" : "unavailable");
  EarlyThread early;
  int inherited[2];  // stands for the host's socket to the daemon
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, inherited) != 0) return 1;
  toolhost::runtime::confineCalls(false);
  filesystemAttempts(secret, dir);
  report("socket-unix", ::socket(AF_UNIX, SOCK_STREAM, 0));
  report("socket-inet", ::socket(AF_INET, SOCK_STREAM, 0));
  int pair[2];
  report("socketpair", ::socketpair(AF_UNIX, SOCK_STREAM, 0, pair));
  report("early-thread-socket", early.trySocket());
  report("execve", [] {
    char* const argv[] = {const_cast<char*>("/bin/true"), nullptr};
    return static_cast<long>(::execve("/bin/true", argv, environ));
  }());
  report("fork", [] {
    const pid_t child = ::fork();
    if (child == 0) ::_exit(0);
    if (child > 0) ::waitpid(child, nullptr, 0);
    return static_cast<long>(child);
  }());
  report("thread", [] {
    pthread_t thread;
    const int error = ::pthread_create(
        &thread, nullptr, [](void*) -> void* { return nullptr; }, nullptr);
    if (error != 0) {
      errno = error;
      return -1L;
    }
    ::pthread_join(thread, nullptr);
    return 0L;
  }());
  report("pipe", [] {
    int ends[2];
    return static_cast<long>(::pipe(ends));
  }());
  report("fcntl-setpipe-sz", ::fcntl(inherited[0], F_SETPIPE_SZ, 1 << 20));
  report("kill-parent", ::kill(::getppid(), 0));
  report("kill-group", ::kill(0, 0));
  report("kill-self", ::kill(::getpid(), 0));
  report("ptrace-parent", ::ptrace(PTRACE_ATTACH, ::getppid(), nullptr, nullptr));
  char buffer[8];
  iovec local{buffer, sizeof buffer};
  iovec remote{buffer, sizeof buffer};
  report("read-parent-memory", ::process_vm_readv(::getppid(), &local, 1, &remote, 1, 0));
  report("unshare-user", ::unshare(CLONE_NEWUSER));
  report("io-uring", ::syscall(SYS_io_uring_setup, 1, nullptr));
  report("bpf", ::syscall(SYS_bpf, 0, nullptr, 0));
  void* wx =
      ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  report("mmap-write-exec", wx == MAP_FAILED ? -1 : 0);
  void* rw = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  report("mmap-read-write", rw == MAP_FAILED ? -1 : 0);
  if (rw != MAP_FAILED) report("mprotect-exec", ::mprotect(rw, 4096, PROT_READ | PROT_EXEC));
  void* rx = ::mmap(nullptr, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  report("mmap-exec", rx == MAP_FAILED ? -1 : 0);
  report("memfd", ::syscall(SYS_memfd_create, "code", 0));
  report("personality-exec", ::personality(READ_IMPLIES_EXEC));
  report("personality-query", ::personality(0xffffffff));
  const pid_t parent = ::getppid();
  rlimit limit{};
  report("prlimit-parent", ::prlimit(parent, RLIMIT_NOFILE, nullptr, &limit));
  report("prlimit-self", ::prlimit(0, RLIMIT_NOFILE, nullptr, &limit));
  report("setpriority-parent", ::setpriority(PRIO_PROCESS, static_cast<id_t>(parent), 19));
  report("setpriority-self", ::setpriority(PRIO_PROCESS, 0, 1));
  // A user with no processes: unfiltered this is ESRCH, and changes nothing either way.
  report("setpriority-user", ::setpriority(PRIO_USER, 3999999, 19));
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  CPU_SET(0, &cpus);
  report("setaffinity-parent", ::sched_setaffinity(parent, sizeof cpus, &cpus));
  report("fcntl-setown", ::fcntl(inherited[0], F_SETOWN, parent));
  report("fcntl-setfl", ::fcntl(inherited[0], F_SETFL, O_NONBLOCK));
  int owner = parent;
  report("ioctl-fiosetown", ::ioctl(inherited[0], FIOSETOWN, &owner));
  // TIOCSTI with bits above the 32 the kernel reads: refused all the same (a socket is no
  // terminal, so unfiltered this would be ENOTTY).
  char typed = 'x';
  report("ioctl-tiocsti-high", ::syscall(SYS_ioctl, inherited[0], (1UL << 32) | TIOCSTI, &typed));
  report("ioctl-interfaces", [&] {
    // The network's interfaces and addresses, through any socket.
    char names[4096];
    ifconf list{};
    list.ifc_len = sizeof names;
    list.ifc_buf = names;
    return static_cast<long>(::ioctl(inherited[0], SIOCGIFCONF, &list));
  }());
  report("ioctl-tcgets", [&] {
    termios mode{};
    // A socket is no terminal: ENOTTY is the answer a host may get.
    return ::ioctl(inherited[0], TCGETS, &mode) == -1 && errno == ENOTTY ? 0L : -1L;
  }());
  report("ioctl-fionread", [&] {
    int pending = 0;
    return static_cast<long>(::ioctl(inherited[0], FIONREAD, &pending));
  }());
  report("inotify", ::inotify_init1(IN_CLOEXEC));
  char value[16];
  report("getxattr", ::getxattr(secret.c_str(), "user.x", value, sizeof value));
  report("msgget", ::msgget(IPC_PRIVATE, 0600));
  // getxattrat (Linux 6.13), newer than the filter: as on a kernel without it.
  report("newer-call", ::syscall(463, -1, nullptr, 0, nullptr, nullptr, 0));
  // fchmodat2 (Linux 6.6), by its number: the C library here has no wrapper.
  report("fchmodat2", ::syscall(452, AT_FDCWD, secret.c_str(), 0644, 0));
  // statmount (Linux 6.8), which libseccomp here cannot name.
  report("unnamed-call", ::syscall(457, nullptr, nullptr, 0, 0));
  report("send-inherited", ::send(inherited[0], "x", 1, MSG_DONTWAIT));
  unsigned char random[16];
  report("getrandom", ::getrandom(random, sizeof random, 0));
  return 0;
}

int int80(bool confine) {
  if (confine) {
    toolhost::runtime::confineFiles();
    toolhost::runtime::confineCalls(false);
    std::printf("confined\n");
    std::fflush(stdout);
  }
  long rc = 20;  // getpid in the 32-bit table
  asm volatile("int $0x80" : "+a"(rc) : : "memory");
  std::printf("int80 returned %ld\n", rc);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  int code = 2;
  if (mode == "files" && argc == 4) {
    code = files(argv[2], argv[3]);
  } else if (mode == "calls" && argc == 4) {
    code = calls(argv[2], argv[3]);
  } else if (mode == "int80" || mode == "int80-bare") {
    code = int80(mode == "int80");
  } else {
    std::fprintf(stderr, "usage: confinement_probe files|calls SECRET DIR | int80 | int80-bare\n");
  }
  // _Exit, as a host ends: a sanitizer's leak check at exit would need ptrace and a process.
  std::fflush(stdout);
  std::_Exit(code);
}
