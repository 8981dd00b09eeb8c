// Test helper: runs something under a seccomp filter built the way systemd builds one for
// SystemCallFilter=, so tests can show the daemon and V8's JIT work under toolhost.service's filter
// (and that MemoryDenyWriteExecute= would break V8).
//
//   seccomp_run [--mdwe] SYSCALL_LIST exec PROGRAM [ARGS...]   load the filter, then exec
//   seccomp_run [--mdwe] SYSCALL_LIST v8 [jit]                 load it, then run JIT-heavy JS
//                                                              (V8 --jitless unless `jit`)
//
// SYSCALL_LIST is a file with one allowed system call name per line; any other call kills the
// process (SIGSYS; in the v8 mode after naming the call), which is stricter than the unit's
// SystemCallErrorNumber=EPERM, so nothing can fail quietly. --mdwe adds the rules of
// MemoryDenyWriteExecute=: no mapping both writable and executable, no mprotect() to executable.
#include "runtime/v8_platform.h"

#include <libplatform/libplatform.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#include <v8.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace {

// In the v8 mode a forbidden call is trapped rather than killed, to name it before exiting.
void onSigsys(int, siginfo_t* info, void*) {
  char text[96];
  char* name = seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, info->si_syscall);
  int n = std::snprintf(text, sizeof text, "seccomp_run: blocked system call %d (%s)\n",
                        info->si_syscall, name ? name : "?");
  if (n > 0) (void)!::write(STDERR_FILENO, text, static_cast<std::size_t>(n));
  _exit(128 + SIGSYS);
}

int loadFilter(const char* listPath, bool mdwe, bool trap) {
  if (trap) {
    struct sigaction action {};
    action.sa_sigaction = onSigsys;
    action.sa_flags = SA_SIGINFO;
    ::sigaction(SIGSYS, &action, nullptr);
  }
  scmp_filter_ctx filter = seccomp_init(trap ? SCMP_ACT_TRAP : SCMP_ACT_KILL_PROCESS);
  if (filter == nullptr) return -1;
  std::ifstream list(listPath);
  std::string name;
  int allowed = 0;
  while (std::getline(list, name)) {
    if (name.empty()) continue;
    int number = seccomp_syscall_resolve_name(name.c_str());
    if (number == __NR_SCMP_ERROR) continue;  // not a call on this architecture or kernel
    bool guarded = mdwe && (name == "mmap" || name == "mprotect" || name == "pkey_mprotect");
    int rc = 0;
    if (!guarded) {
      rc = seccomp_rule_add(filter, SCMP_ACT_ALLOW, number, 0);
    } else if (name == "mmap") {
      // Allowed unless both PROT_WRITE and PROT_EXEC are asked for.
      rc = seccomp_rule_add(filter, SCMP_ACT_ALLOW, number, 1,
                            SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_WRITE | PROT_EXEC, 0));
      if (rc == 0) {
        rc = seccomp_rule_add(filter, SCMP_ACT_ALLOW, number, 1,
                              SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_WRITE | PROT_EXEC, PROT_WRITE));
      }
      if (rc == 0) {
        rc = seccomp_rule_add(filter, SCMP_ACT_ALLOW, number, 1,
                              SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_WRITE | PROT_EXEC, PROT_EXEC));
      }
      if (rc == 0) {
        rc = seccomp_rule_add(
            filter, SCMP_ACT_ERRNO(EPERM), number, 1,
            SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_WRITE | PROT_EXEC, PROT_WRITE | PROT_EXEC));
      }
    } else {
      // mprotect/pkey_mprotect: allowed unless PROT_EXEC is asked for.
      rc = seccomp_rule_add(filter, SCMP_ACT_ALLOW, number, 1,
                            SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, 0));
      if (rc == 0) {
        rc = seccomp_rule_add(filter, SCMP_ACT_ERRNO(EPERM), number, 1,
                              SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC));
      }
    }
    if (rc != 0) {
      std::fprintf(stderr, "seccomp_run: cannot allow %s: %s\n", name.c_str(), std::strerror(-rc));
      seccomp_release(filter);
      return -1;
    }
    ++allowed;
  }
  if (allowed == 0) {
    std::fprintf(stderr, "seccomp_run: no system calls allowed by %s\n", listPath);
    seccomp_release(filter);
    return -1;
  }
  int rc = seccomp_load(filter);  // sets no_new_privs first, as NoNewPrivileges=yes does
  seccomp_release(filter);
  if (rc != 0)
    std::fprintf(stderr, "seccomp_run: cannot load the filter: %s\n", std::strerror(-rc));
  return rc;
}

// Optimizing compilers, regular expressions compiled to machine code, and garbage collection.
constexpr const char* kJitWorkout = R"JS(
  function hot(x) { return (x * 31 + 7) % 1000003; }
  let sum = 0;
  for (let i = 0; i < 3000000; i++) sum = (sum + hot(i)) % 1000003;
  const words = [];
  for (let i = 0; i < 20000; i++) words.push('w' + i + (i % 7 === 0 ? 'x' : ''));
  const matched = words.filter((w) => /^w\d+x$/.test(w)).length;
  const objects = [];
  for (let i = 0; i < 200000; i++) objects.push({ i, s: String(i) });
  JSON.stringify({ sum, matched, objects: objects.length });
)JS";

int runV8(bool jit) {
  toolhost::runtime::V8Platform platform(0, jit);
  std::unique_ptr<v8::ArrayBuffer::Allocator> allocator(
      v8::ArrayBuffer::Allocator::NewDefaultAllocator());
  v8::Isolate::CreateParams params;
  params.array_buffer_allocator = allocator.get();
  v8::Isolate* isolate = v8::Isolate::New(params);
  std::string out;
  {
    v8::Locker locker(isolate);
    v8::Isolate::Scope isolateScope(isolate);
    v8::HandleScope handleScope(isolate);
    v8::Local<v8::Context> context = v8::Context::New(isolate);
    v8::Context::Scope contextScope(context);
    v8::TryCatch tryCatch(isolate);
    auto code = v8::String::NewFromUtf8(isolate, kJitWorkout).ToLocalChecked();
    v8::Local<v8::Script> script;
    v8::Local<v8::Value> result;
    if (v8::Script::Compile(context, code).ToLocal(&script) &&
        script->Run(context).ToLocal(&result)) {
      v8::String::Utf8Value text(isolate, result);
      out = *text ? *text : "";
    } else {
      v8::String::Utf8Value text(isolate, tryCatch.Exception());
      out = std::string("threw: ") + (*text ? *text : "?");
    }
  }
  isolate->Dispose();
  std::printf("%s\n", out.c_str());
  return out.rfind("threw", 0) == 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  int next = 1;
  bool mdwe = false;
  if (next < argc && std::strcmp(argv[next], "--mdwe") == 0) {
    mdwe = true;
    ++next;
  }
  if (argc - next < 2) {
    std::fprintf(stderr,
                 "usage: seccomp_run [--mdwe] SYSCALL_LIST exec PROGRAM [ARGS...] | v8 [jit]\n");
    return 2;
  }
  const char* list = argv[next++];
  std::string mode = argv[next++];
  if (loadFilter(list, mdwe, mode == "v8") != 0) return 3;
  if (mode == "v8") return runV8(next < argc && std::strcmp(argv[next], "jit") == 0);
  if (mode == "exec" && next < argc) {
    ::execv(argv[next], argv + next);
    std::fprintf(stderr, "seccomp_run: cannot run %s: %s\n", argv[next], std::strerror(errno));
    return 127;
  }
  std::fprintf(stderr, "seccomp_run: unknown mode %s\n", mode.c_str());
  return 2;
}
