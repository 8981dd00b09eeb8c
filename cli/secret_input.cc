#include "cli/secret_input.h"

#include <termios.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstring>

namespace toolhost::cli {

namespace {

// Touched by the signal handlers: set before they are installed, read-only meanwhile.
termios savedTerminal{};
termios quietTerminal{};
volatile sig_atomic_t terminalChanged = 0;

constexpr std::array<int, 5> kRestoringSignals{SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP};

// Restores echo, then lets the signal do what it does by default (end or stop the program).
// Only async-signal-safe calls.
void restoreAndRaise(int signal) {
  if (terminalChanged != 0) tcsetattr(STDIN_FILENO, TCSAFLUSH, &savedTerminal);
  const char newline = '\n';
  [[maybe_unused]] auto ignored = ::write(STDERR_FILENO, &newline, 1);
  struct sigaction fallback {};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  sigaction(signal, &fallback, nullptr);
  sigset_t unblock;
  sigemptyset(&unblock);
  sigaddset(&unblock, signal);
  sigprocmask(SIG_UNBLOCK, &unblock, nullptr);
  raise(signal);
  // Back from a stop (SIGTSTP, then SIGCONT): echo off again, and handle the next one too.
  if (terminalChanged != 0) tcsetattr(STDIN_FILENO, TCSAFLUSH, &quietTerminal);
  struct sigaction again {};
  again.sa_handler = restoreAndRaise;
  sigemptyset(&again.sa_mask);
  sigaction(signal, &again, nullptr);
}

// Echo off for as long as it lives; the handlers above restore it if a signal ends the program.
class QuietTerminal {
 public:
  QuietTerminal() {
    if (tcgetattr(STDIN_FILENO, &savedTerminal) != 0) return;
    quietTerminal = savedTerminal;
    quietTerminal.c_lflag &= static_cast<tcflag_t>(~ECHO);
    quietTerminal.c_lflag |= ECHONL;
    for (std::size_t i = 0; i < kRestoringSignals.size(); ++i) {
      struct sigaction handler {};
      handler.sa_handler = restoreAndRaise;
      sigemptyset(&handler.sa_mask);
      sigaction(kRestoringSignals[i], &handler, &previous_[i]);
    }
    terminalChanged = 1;
    if (tcsetattr(STDIN_FILENO, TCSAFLUSH, &quietTerminal) != 0) terminalChanged = 0;
  }
  ~QuietTerminal() {
    if (terminalChanged != 0) tcsetattr(STDIN_FILENO, TCSAFLUSH, &savedTerminal);
    terminalChanged = 0;
    for (std::size_t i = 0; i < kRestoringSignals.size(); ++i) {
      sigaction(kRestoringSignals[i], &previous_[i], nullptr);
    }
  }
  QuietTerminal(const QuietTerminal&) = delete;
  QuietTerminal& operator=(const QuietTerminal&) = delete;

 private:
  std::array<struct sigaction, kRestoringSignals.size()> previous_{};
};

// Appends what `fd` gives until end of input (or a newline, when `line`), up to `limit` bytes
// plus one (so the caller sees it was too long).
bool readFrom(int fd, bool line, std::size_t limit, std::string& out, std::string& error) {
  std::array<char, 4096> buffer{};
  for (;;) {
    const std::size_t want = line ? 1 : buffer.size();
    const ssize_t got = ::read(fd, buffer.data(), want);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      error = std::string("cannot read the value: ") + std::strerror(errno);
      std::memset(buffer.data(), 0, buffer.size());
      return false;
    }
    if (got == 0) break;
    out.append(buffer.data(), static_cast<std::size_t>(got));
    if (line && out.back() == '\n') break;
    if (out.size() > limit) break;
  }
  std::memset(buffer.data(), 0, buffer.size());
  return true;
}

}  // namespace

void wipeString(std::string& text) {
  if (!text.empty()) explicit_bzero(text.data(), text.size());
  text.clear();
}

bool readSecretValue(const std::string& prompt, std::string& value, std::string& error) {
  value.clear();
  value.reserve(4096);  // few values outgrow it, so few copies are left behind by reallocation
  const bool terminal = ::isatty(STDIN_FILENO) == 1;
  if (terminal) {
    [[maybe_unused]] auto ignored = ::write(STDERR_FILENO, prompt.data(), prompt.size());
    QuietTerminal quiet;
    if (!readFrom(STDIN_FILENO, true, kMaxSecretInputBytes, value, error)) return false;
  } else if (!readFrom(STDIN_FILENO, false, kMaxSecretInputBytes, value, error)) {
    wipeString(value);
    return false;
  }
  if (!value.empty() && value.back() == '\n') value.pop_back();
  if (!value.empty() && value.back() == '\r') value.pop_back();
  if (value.size() > kMaxSecretInputBytes) {
    wipeString(value);
    error = "the value is longer than " + std::to_string(kMaxSecretInputBytes) + " bytes";
    return false;
  }
  if (value.empty()) {
    error = terminal ? "no value was typed" : "stdin held no value";
    return false;
  }
  return true;
}

}  // namespace toolhost::cli
