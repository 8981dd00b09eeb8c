#include "runtime/confinement.h"

#include <fcntl.h>
#include <linux/landlock.h>
#include <linux/sockios.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>

namespace toolhost::runtime {

namespace {

// --- Landlock. Debian 12's headers stop at ABI 2: what later ABIs added is spelled out here, as
// the kernel's uapi defines it. ---

struct RulesetAttr {
  std::uint64_t handledAccessFs = 0;
  std::uint64_t handledAccessNet = 0;  // ABI 4
  std::uint64_t scoped = 0;            // ABI 6
};

constexpr std::uint64_t kFsAbi1 = (1ULL << 13) - 1;            // EXECUTE .. MAKE_SYM
constexpr std::uint64_t kFsRefer = 1ULL << 13;                 // ABI 2
constexpr std::uint64_t kFsTruncate = 1ULL << 14;              // ABI 3
constexpr std::uint64_t kFsIoctlDev = 1ULL << 15;              // ABI 5
constexpr std::uint64_t kNetBindTcp = 1ULL << 0;               // ABI 4
constexpr std::uint64_t kNetConnectTcp = 1ULL << 1;            // ABI 4
constexpr std::uint64_t kScopeAbstractUnixSocket = 1ULL << 0;  // ABI 6
constexpr std::uint64_t kScopeSignal = 1ULL << 1;              // ABI 6

constexpr std::uint64_t kReadFile = LANDLOCK_ACCESS_FS_READ_FILE;
constexpr std::uint64_t kReadDir = LANDLOCK_ACCESS_FS_READ_DIR;

// Where a sandbox host may read. /proc/self resolves to this process's own entry when the rule
// is made, so no other process's (the daemon's memory, its open files) is reachable through it.
constexpr const char* kReadable[] = {"/usr", "/proc/self", "/sys/devices/system/cpu",
                                     "/etc/localtime", "/dev/urandom"};

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::runtime_error landlockFailure(const char* what) {
  return std::runtime_error(std::string("Landlock: ") + what + ": " + std::strerror(errno));
}

// --- seccomp ---

// Refused outright (EPERM), whatever their arguments.
constexpr const char* kRefused[] = {
    // files: opened, made, changed or removed by name (fds the host holds stay usable), their
    // extended attributes read, or watched
    "open", "openat", "openat2", "creat", "name_to_handle_at", "open_by_handle_at", "uselib",
    "mknod", "mknodat", "link", "linkat", "symlink", "symlinkat", "unlink", "unlinkat", "rename",
    "renameat", "renameat2", "mkdir", "mkdirat", "rmdir", "chmod", "fchmod", "fchmodat",
    "fchmodat2", "chown", "fchown", "lchown", "fchownat", "truncate", "utime", "utimes",
    "utimensat", "futimesat", "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr",
    "fremovexattr", "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr",
    "inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark",
    // the network, and other local sockets or pipes than the ones to the daemon
    "socket", "socketpair", "pipe", "pipe2", "connect", "bind", "listen", "accept", "accept4",
    // programs and processes
    "execve", "execveat", "fork", "vfork", "tkill",
    // other processes: their memory, descriptors, pages, priorities
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open", "pidfd_getfd",
    "pidfd_send_signal", "process_madvise", "process_mrelease", "move_pages", "migrate_pages",
    "ioprio_set",
    // System V and POSIX IPC objects, which other processes of the user share
    "shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop",
    "semtimedop", "semctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
    "mq_getsetattr",
    // namespaces and mounts
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    // kernel interfaces that exploits favour and a host never needs; memory files (executable
    // aliases of writable memory)
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "keyctl", "add_key", "request_key", "memfd_create", "memfd_secret"};

// Calls that act on the caller when their first argument is 0 and on another process otherwise
// (resource limits, scheduling): refused unless 0.
constexpr const char* kSelfByZero[] = {"prlimit64", "sched_setscheduler", "sched_setparam",
                                       "sched_setattr", "sched_setaffinity"};

// Signals go to this process only: refused when the target (the first argument) is another.
constexpr const char* kSignalsToSelfOnly[] = {"kill", "tgkill", "rt_sigqueueinfo",
                                              "rt_tgsigqueueinfo"};

// fcntl commands that would have the kernel signal another process (F_SETOWN, F_SETOWN_EX,
// F_SETSIG), watch a directory or file (F_NOTIFY, F_SETLEASE), or grow a pipe's buffer out of
// the user's share (F_SETPIPE_SZ).
constexpr scmp_datum_t kRefusedFcntl[] = {F_SETOWN, F_SETOWN_EX, F_SETSIG,
                                          F_NOTIFY, F_SETLEASE,  F_SETPIPE_SZ};

// ioctl requests a host may make: whether a descriptor is a terminal (TCGETS), bytes waiting
// (FIONREAD), blocking (FIONBIO), close-on-exec (FIONCLEX, FIOCLEX). Any other is refused:
// typing into or taking a terminal, a socket's signal owner, the network interfaces' names and
// addresses (SIOCGIFCONF).
constexpr scmp_datum_t kAllowedIoctl[] = {TCGETS, FIONREAD, FIONBIO, FIONCLEX, FIOCLEX};
// The filter refuses every request between them one by one (confineCalls): a few dozen rules
// where these requests sit close together, as on x86-64 and arm64.
static_assert(std::max({TCGETS, FIONREAD, FIONBIO, FIONCLEX, FIOCLEX}) -
                      std::min({TCGETS, FIONREAD, FIONBIO, FIONCLEX, FIOCLEX}) <
                  256,
              "the allowed ioctl requests are far apart here: refuse the others another way");

// The newest system call this filter was written against (mseal, Linux 6.10; since 5.1 new
// calls have one number on every architecture). Later ones, and any libseccomp cannot name (so
// that a rule by name above would have missed it), fail with ENOSYS, as on a kernel without
// them: a deny list cannot judge calls it has never seen.
constexpr int kNewestKnownCall = 462;
constexpr int kLastFutureCall = 511;

struct FilterDeleter {
  void operator()(void* filter) const { seccomp_release(filter); }
};

void check(int rc, const std::string& what) {
  if (rc != 0) {
    throw std::runtime_error("system call filter: " + what + ": " + std::strerror(-rc));
  }
}

}  // namespace

FileConfinement confineFiles() {
  FileConfinement result;
  const long abi =
      ::syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  if (abi < 1) {
    result.detail = std::string("Landlock is unavailable (") + std::strerror(errno) +
                    "): the system call filter alone keeps the sandbox host from files";
    return result;
  }
  result.abi = static_cast<int>(abi);
  RulesetAttr attr;
  attr.handledAccessFs = kFsAbi1;
  std::size_t attrSize = sizeof(std::uint64_t);
  if (abi >= 2) attr.handledAccessFs |= kFsRefer;
  if (abi >= 3) attr.handledAccessFs |= kFsTruncate;
  if (abi >= 4) {
    attr.handledAccessNet = kNetBindTcp | kNetConnectTcp;
    attrSize = 2 * sizeof(std::uint64_t);
  }
  if (abi >= 5) attr.handledAccessFs |= kFsIoctlDev;
  if (abi >= 6) {
    attr.scoped = kScopeAbstractUnixSocket | kScopeSignal;
    attrSize = sizeof(RulesetAttr);
  }
  const Fd ruleset(static_cast<int>(::syscall(SYS_landlock_create_ruleset, &attr, attrSize, 0)));
  if (ruleset.get() < 0) throw landlockFailure("creating the ruleset");
  for (const char* path : kReadable) {
    const Fd target(::open(path, O_PATH | O_CLOEXEC));
    if (target.get() < 0) continue;  // not on this machine: nothing to read there
    struct stat info {};
    if (::fstat(target.get(), &info) != 0) throw landlockFailure(path);
    landlock_path_beneath_attr rule{};
    rule.allowed_access = S_ISDIR(info.st_mode) ? (kReadFile | kReadDir) : kReadFile;
    rule.parent_fd = target.get();
    if (::syscall(SYS_landlock_add_rule, ruleset.get(), LANDLOCK_RULE_PATH_BENEATH, &rule, 0) !=
        0) {
      throw landlockFailure(path);
    }
  }
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) throw landlockFailure("no_new_privs");
  if (::syscall(SYS_landlock_restrict_self, ruleset.get(), 0) != 0) {
    throw landlockFailure("entering the domain");
  }
  result.enforced = true;
  result.detail = "Landlock ABI " + std::to_string(abi) +
                  ": nothing writable or executable, reads only of what V8 and the C library "
                  "need";
  return result;
}

void confineCalls(bool jit) {
  // Allowed unless a rule below says otherwise; calls of another architecture (32-bit x86 through
  // int 0x80, x32) kill the process: the rules could not name them.
  std::unique_ptr<void, FilterDeleter> filter(seccomp_init(SCMP_ACT_ALLOW));
  if (!filter) throw std::runtime_error("system call filter: seccomp_init failed");
  void* f = filter.get();
  check(seccomp_attr_set(f, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS), "other architectures");
  // Every thread, including those V8 has started.
  check(seccomp_attr_set(f, SCMP_FLTATR_CTL_TSYNC, 1), "all threads");
  // A binary tree rather than a list: every system call of the host passes through the filter.
  check(seccomp_attr_set(f, SCMP_FLTATR_CTL_OPTIMIZE, 2), "optimization");
  const auto refused = SCMP_ACT_ERRNO(EPERM);
  auto number = [](const char* name) { return seccomp_syscall_resolve_name(name); };
  for (const char* name : kRefused) {
    const int call = number(name);
    if (call == __NR_SCMP_ERROR) continue;  // not a call of this architecture
    check(seccomp_rule_add(f, refused, call, 0), name);
  }
  // No new processes, and no new threads either: the host has started all it needs, and
  // threads without end would use up the user's processes (RLIMIT_NPROC, a unit's TasksMax=).
  // clone3 gets ENOSYS, as on a kernel without it, so that the C library tries clone.
  check(seccomp_rule_add(f, refused, SCMP_SYS(clone), 0), "clone");
  check(seccomp_rule_add(f, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0), "clone3");
  const auto self = static_cast<scmp_datum_t>(::getpid());
  for (const char* name : kSignalsToSelfOnly) {
    check(seccomp_rule_add(f, refused, number(name), 1, SCMP_A0(SCMP_CMP_NE, self)), name);
  }
  for (const char* name : kSelfByZero) {
    check(seccomp_rule_add(f, refused, number(name), 1, SCMP_A0(SCMP_CMP_NE, 0)), name);
  }
  // setpriority(PRIO_PROCESS, 0, ...) only: a process group or a user is others too.
  check(seccomp_rule_add(f, refused, SCMP_SYS(setpriority), 1, SCMP_A0(SCMP_CMP_NE, PRIO_PROCESS)),
        "setpriority");
  check(seccomp_rule_add(f, refused, SCMP_SYS(setpriority), 1, SCMP_A1(SCMP_CMP_NE, 0)),
        "setpriority");
  // Only the query: READ_IMPLIES_EXEC would make every readable mapping executable.
  check(seccomp_rule_add(f, refused, SCMP_SYS(personality), 1, SCMP_A0(SCMP_CMP_NE, 0xffffffffULL)),
        "personality");
  // The kernel reads these commands as 32 bits: compared as 32 bits, so that set high bits do
  // not slip past.
  for (const scmp_datum_t command : kRefusedFcntl) {
    check(seccomp_rule_add(f, refused, SCMP_SYS(fcntl), 1,
                           SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffULL, command)),
          "fcntl");
  }
  // Refused below the lowest allowed request, above the highest, and at every value between that
  // is not allowed. Compared as 64 bits: a request with high bits set (the kernel reads 32) is
  // above the highest.
  const auto [lowest, highest] =
      std::minmax_element(std::begin(kAllowedIoctl), std::end(kAllowedIoctl));
  check(seccomp_rule_add(f, refused, SCMP_SYS(ioctl), 1, SCMP_A1(SCMP_CMP_LT, *lowest)), "ioctl");
  check(seccomp_rule_add(f, refused, SCMP_SYS(ioctl), 1, SCMP_A1(SCMP_CMP_GT, *highest)), "ioctl");
  for (scmp_datum_t request = *lowest + 1; request < *highest; ++request) {
    if (std::find(std::begin(kAllowedIoctl), std::end(kAllowedIoctl), request) !=
        std::end(kAllowedIoctl)) {
      continue;
    }
    check(seccomp_rule_add(f, refused, SCMP_SYS(ioctl), 1, SCMP_A1(SCMP_CMP_EQ, request)), "ioctl");
  }
  for (int call = 0; call <= kLastFutureCall; ++call) {
    char* name = seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, call);
    const bool named = name != nullptr;
    std::free(name);
    if (call > kNewestKnownCall || !named) {
      check(seccomp_rule_add(f, SCMP_ACT_ERRNO(ENOSYS), call, 0), "newer calls");
    }
  }
  if (!jit) {
    // V8 --jitless maps no code after it has started: nothing may become executable, not even
    // read-only (a memory file mapped twice would be code written through its other mapping).
    for (const char* name : {"mmap", "mprotect", "pkey_mprotect"}) {
      check(seccomp_rule_add(f, refused, number(name), 1,
                             SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC)),
            name);
    }
  }
  check(seccomp_load(f), "loading");
}

}  // namespace toolhost::runtime
