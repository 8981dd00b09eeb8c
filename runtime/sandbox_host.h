// The sandbox host process: V8 and a SandboxPool in a process of their own, supervised by the
// daemon's ProcessSandboxPool, so that a tool that aborts V8 or stalls it in a builtin costs this
// process, never the daemon. A host executable's main calls runSandboxHost when it is started as
// a sandbox host (toolhostd: argv[1] == "--sandbox-host", before anything else runs).
//
// What it does: dies with the daemon (PR_SET_PDEATHSIG, then a getppid() check against the pid
// in the daemon's hello), closes every inherited descriptor but 0-2 and `fd`, disables core
// dumps, makes itself the OOM killer's first choice (oom_score_adj 1000: the daemon shares its
// cgroup), reads its RuntimeConfig from the hello, then serves the daemon's requests
// (runtime/sandbox_protocol.h) with an in-process SandboxPool whose CapabilityHost forwards every
// request over `fd` as an operation (quick requests too, so that no V8 worker thread waits for
// the daemon): started in the daemon and completed, paused and resumed from there. Calls run
// concurrently, each with a cancellation signal of its own. It logs to stderr (the daemon's,
// inherited) with a "sandbox-host[pid]" prefix.
#pragma once

namespace toolhost::runtime {

// Serves the daemon on `fd` (a connected SOCK_STREAM Unix socket) until the socket closes, then
// ends the process with _exit (no destructor runs: a V8 thread stuck in a builtin could never be
// joined). Returns only if it cannot start at all, with the exit status to return from main.
int runSandboxHost(int fd, int argc, char** argv);

}  // namespace toolhost::runtime
