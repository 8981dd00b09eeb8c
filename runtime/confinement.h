#pragma once

#include <string>

// What code that escaped V8 in a sandbox host process could do to the machine: as little as the
// host needs to serve its daemon over the socket it inherited. Two steps, each one-way, both
// applied by runSandboxHost (runtime/sandbox_host.cc) and by nothing else.

namespace toolhost::runtime {

struct FileConfinement {
  bool enforced = false;  // false: the kernel has no Landlock (the call filter still guards files)
  int abi = 0;            // the kernel's Landlock ABI version, when it has one
  std::string detail;     // for the log: what is in force, or why nothing is
};

// Landlock, applied while the process has a single thread (a Landlock domain covers the thread
// that enters it and the threads it starts afterwards, not those already running). From then on
// nothing can be written, created, removed, renamed or executed anywhere, no TCP port bound or
// connected (ABI 4), no signal sent and no abstract socket reached outside the process (ABI 6);
// files can be read only where V8, ICU and the C library look while the host starts: /usr, the
// process's own /proc entry, the CPU list, /etc/localtime and /dev/urandom. A kernel without
// Landlock gives `enforced` false; one that has it and refuses throws std::runtime_error.
FileConfinement confineFiles();

// A seccomp filter on every thread of the process, applied once V8 is initialized and every
// thread the host needs has started (the files V8 and the C library read as they start have
// been read by then). Refused with EPERM from then on: opening any file, every call that makes,
// changes, watches or reads the attributes of a file, sockets and pipes, executing, new
// processes and threads, acting on other processes (signals, also through a descriptor's owner;
// tracing, reading their memory, their limits, priorities and pages), System V and POSIX IPC,
// namespaces and mounts, every ioctl but five harmless ones (no typing into a terminal, no
// listing the network's interfaces), memory files, and the kernel interfaces exploits favour
// (bpf, io_uring, userfaultfd, perf events, keyrings). Calls newer than the filter (Linux
// 6.10's), or that libseccomp cannot name, fail with ENOSYS. Unless `jit`, nothing may be mapped
// or made executable, as V8 --jitless never needs to. Any other architecture's system calls
// kill the process. What stays open: the host's own memory and threads, its inherited
// descriptors (its socket to the daemon, stdin from /dev/null, its output pipe), and stat() and
// readlink() of paths (whether a file exists, its size and times). Throws std::runtime_error
// when the filter cannot be built or loaded.
void confineCalls(bool jit);

}  // namespace toolhost::runtime
