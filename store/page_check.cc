#include "store/page_check.h"

#include <fcntl.h>
#include <lmdb.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string_view>
#include <thread>

extern char** environ;

namespace toolhost::store {

namespace {

struct EnvCloser {
  void operator()(MDB_env* env) const noexcept { mdb_env_close(env); }
};
struct TxnAborter {
  void operator()(MDB_txn* txn) const noexcept { mdb_txn_abort(txn); }
};
struct CursorCloser {
  void operator()(MDB_cursor* cursor) const noexcept { mdb_cursor_close(cursor); }
};

// The address range of the data file's map in this process, from /proc/self/maps, so that a
// damaged node pointing outside it is reported instead of followed. {0, 0} if not found.
std::pair<std::uintptr_t, std::uintptr_t> mapOf(const std::filesystem::path& file) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    // start-end perms offset dev inode path
    const auto slash = line.find('/');
    if (slash == std::string::npos || std::string_view(line).substr(slash) != file.native()) {
      continue;
    }
    std::uintptr_t start = 0, end = 0;
    if (std::sscanf(line.c_str(), "%zx-%zx", &start, &end) == 2) return {start, end};
  }
  return {0, 0};
}

class Walk {
 public:
  explicit Walk(const std::filesystem::path& db) : db_(db) {}

  std::vector<std::string> run() {
    MDB_env* rawEnv = nullptr;
    if (int rc = mdb_env_create(&rawEnv)) throw std::runtime_error(mdb_strerror(rc));
    std::unique_ptr<MDB_env, EnvCloser> env(rawEnv);
    // Room for every table a damaged main table might name; the daemon uses far fewer.
    mdb_env_set_maxdbs(env.get(), 4096);
    if (int rc = mdb_env_open(env.get(), db_.c_str(), MDB_RDONLY | MDB_NOTLS, 0600)) {
      // A meta page LMDB does not recognize is damage; anything else stops the check.
      if (rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH) return fail("cannot open it", rc);
      throw std::runtime_error(std::string("cannot open it: ") + mdb_strerror(rc));
    }
    // The snapshot first, then the bounds: a commit made in between (the daemon keeps writing)
    // can only move the last page and the file's end further, never before the snapshot's pages.
    MDB_txn* rawTxn = nullptr;
    if (int rc = mdb_txn_begin(env.get(), nullptr, MDB_RDONLY, &rawTxn)) {
      throw std::runtime_error(std::string("cannot begin a read: ") + mdb_strerror(rc));
    }
    std::unique_ptr<MDB_txn, TxnAborter> txn(rawTxn);
    MDB_envinfo info{};
    MDB_stat envStat{};
    if (int rc = mdb_env_info(env.get(), &info)) return fail("cannot read its meta page", rc);
    if (int rc = mdb_env_stat(env.get(), &envStat)) return fail("cannot read its meta page", rc);
    lastPage_ = info.me_last_pgno;
    const std::uint64_t used = (std::uint64_t{lastPage_} + 1) * envStat.ms_psize;
    std::error_code error;
    const auto file = std::filesystem::canonical(db_ / "data.mdb", error);
    const auto size = error ? 0 : std::filesystem::file_size(file, error);
    if (error) throw std::runtime_error("cannot read the size of data.mdb: " + error.message());
    if (size < used) {
      return fail(fmt::format("data.mdb holds {} bytes, but its pages in use take {}", size, used));
    }
    const auto [start, end] = mapOf(file);
    if (start != 0) {
      start_ = start;
      end_ = std::min<std::uintptr_t>(end, start + used);
    }

    walkFreeList(txn.get());
    MDB_dbi main = 0;
    if (int rc = mdb_dbi_open(txn.get(), nullptr, 0, &main)) return fail("no main table", rc);
    // The main table's keys name the other tables; collect them first, then walk each.
    std::vector<std::string> names;
    walkTable(txn.get(), main, "(main)", [&](const MDB_val& key, const MDB_val&) {
      names.emplace_back(static_cast<const char*>(key.mv_data), key.mv_size);
    });
    for (const auto& name : names) {
      if (problems_.size() >= kMaxPageProblems) break;
      if (name.find('\0') != std::string::npos) {
        problem(fmt::format("the main table names a table with a NUL byte in its name"));
        continue;
      }
      MDB_dbi dbi = 0;
      const int rc = mdb_dbi_open(txn.get(), name.c_str(), 0, &dbi);
      if (rc == MDB_INCOMPATIBLE) continue;  // a plain key of the main table, not a table
      if (rc != 0) {
        problem(fmt::format("table {}: cannot open it: {}", name, mdb_strerror(rc)));
        continue;
      }
      walkTable(txn.get(), dbi, name, [](const MDB_val&, const MDB_val&) {});
    }
    return std::move(problems_);
  }

 private:
  std::vector<std::string> fail(const std::string& what, int rc = 0) {
    problem(rc != 0 ? what + ": " + mdb_strerror(rc) : what);
    return std::move(problems_);
  }

  void problem(std::string text) {
    if (problems_.size() < kMaxPageProblems) problems_.push_back(std::move(text));
  }

  // Whether `value` lies inside the pages in use (always true when the map was not found).
  bool inside(const MDB_val& value) const {
    if (start_ == 0) return true;
    const auto at = reinterpret_cast<std::uintptr_t>(value.mv_data);
    return at >= start_ && at <= end_ && value.mv_size <= end_ - at;
  }

  // Reads every byte, so that every overflow page of a large value is touched.
  void touch(const MDB_val& value) {
    const auto* bytes = static_cast<const unsigned char*>(value.mv_data);
    unsigned char sum = 0;
    for (std::size_t i = 0; i < value.mv_size; ++i) sum ^= bytes[i];
    sink_ = sink_ ^ sum;
  }

  template <class Visit>
  void walkTable(MDB_txn* txn, MDB_dbi dbi, const std::string& name, Visit&& visit) {
    MDB_stat stat{};
    if (int rc = mdb_stat(txn, dbi, &stat)) {
      problem(fmt::format("table {}: cannot read its record: {}", name, mdb_strerror(rc)));
      return;
    }
    MDB_cursor* raw = nullptr;
    if (int rc = mdb_cursor_open(txn, dbi, &raw)) {
      problem(fmt::format("table {}: cannot walk it: {}", name, mdb_strerror(rc)));
      return;
    }
    std::unique_ptr<MDB_cursor, CursorCloser> cursor(raw);
    MDB_val key{}, value{};
    std::uint64_t entries = 0;
    int rc = mdb_cursor_get(cursor.get(), &key, &value, MDB_FIRST);
    for (; rc == 0; rc = mdb_cursor_get(cursor.get(), &key, &value, MDB_NEXT)) {
      if (!inside(key) || !inside(value)) {
        problem(fmt::format("table {}: entry {} points outside the database's pages", name,
                            entries + 1));
        return;
      }
      touch(key);
      touch(value);
      visit(key, value);
      // A damaged branch can lead the walk round in a circle: never more than the record says.
      if (++entries > stat.ms_entries) break;
    }
    if (rc != 0 && rc != MDB_NOTFOUND) {
      problem(fmt::format("table {}: after {} entries: {}", name, entries, mdb_strerror(rc)));
    } else if (entries != stat.ms_entries) {
      problem(fmt::format("table {}: its record says {} entries, its pages hold {}{}", name,
                          stat.ms_entries, entries, entries > stat.ms_entries ? " or more" : ""));
    }
  }

  // LMDB's list of free pages (table 0): each entry is a count and that many page numbers, all
  // of them past the two meta pages and not past the last page in use.
  void walkFreeList(MDB_txn* txn) {
    walkTable(txn, 0, "(free pages)", [&](const MDB_val&, const MDB_val& value) {
      if (value.mv_size < sizeof(std::size_t) || value.mv_size % sizeof(std::size_t) != 0) {
        problem(fmt::format("the free page list has an entry of {} bytes", value.mv_size));
        return;
      }
      const auto* ids = static_cast<const std::size_t*>(value.mv_data);
      const std::size_t count = ids[0];
      if (count != value.mv_size / sizeof(std::size_t) - 1) {
        problem(fmt::format("the free page list has an entry of {} bytes that counts {} pages",
                            value.mv_size, count));
        return;
      }
      for (std::size_t i = 1; i <= count; ++i) {
        if (ids[i] < 2 || ids[i] > lastPage_) {
          problem(
              fmt::format("the free page list names page {}, outside the pages in use (2 to "
                          "{})",
                          ids[i], lastPage_));
          return;
        }
      }
    });
  }

  const std::filesystem::path db_;
  std::vector<std::string> problems_;
  std::size_t lastPage_ = 0;
  std::uintptr_t start_ = 0;
  std::uintptr_t end_ = 0;
  // Volatile, so that the compiler keeps the reads whose sum nothing else uses.
  volatile unsigned char sink_ = 0;
};

std::string signalName(int signal) {
  const char* name = sigabbrev_np(signal);
  return name != nullptr ? std::string("SIG") + name : "signal " + std::to_string(signal);
}

// What the child printed, on one line, shortened.
std::string shown(std::string output) {
  while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
  for (char& c : output) {
    if (c == '\n') c = ';';
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  if (output.size() > 2000) output = output.substr(0, 2000) + "...";
  return output;
}

}  // namespace

std::vector<std::string> walkDatabase(const std::filesystem::path& db) { return Walk(db).run(); }

int runPageCheck(int argc, char** argv) {
  // Dies with the daemon; a crash here is an answer, not something to keep a core of.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  const rlimit noCore{0, 0};
  ::setrlimit(RLIMIT_CORE, &noCore);
  if (argc < 3) {
    std::fputs("usage: toolhostd --check-store <LMDB directory>\n", stderr);
    return 2;
  }
  try {
    auto problems = walkDatabase(argv[2]);
    for (const auto& problem : problems) std::printf("%s\n", problem.c_str());
    return problems.empty() ? 0 : kPageCheckFound;
  } catch (const std::exception& e) {
    std::printf("the check failed: %s\n", e.what());
    return 2;
  }
}

std::optional<PageCheckFailure> checkInChild(const PageCheckLaunch& launch,
                                             const std::filesystem::path& db) {
  auto failed = [](std::string text) { return PageCheckFailure{false, std::move(text)}; };
  int output[2] = {-1, -1};
  if (::pipe2(output, O_CLOEXEC) != 0) {
    return failed(std::string("cannot make a pipe for the check: ") + std::strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attributes;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attributes);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, output[1], 1);
  posix_spawn_file_actions_adddup2(&actions, output[1], 2);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setsigdefault(&attributes, &all);
  posix_spawnattr_setflags(&attributes,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSID);
  std::vector<std::string> arguments{launch.executable};
  arguments.insert(arguments.end(), launch.arguments.begin(), launch.arguments.end());
  arguments.push_back(db.string());
  std::vector<char*> argv;
  for (auto& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int error =
      ::posix_spawn(&pid, launch.executable.c_str(), &actions, &attributes, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  ::close(output[1]);
  if (error != 0) {
    ::close(output[0]);
    return failed("cannot run the check (" + launch.executable + "): " + std::strerror(error));
  }

  // Its report, until it closes its end or the time is up.
  std::string printed;
  bool timedOut = false;
  const auto deadline = std::chrono::steady_clock::now() + launch.timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timedOut = true;
      break;
    }
    pollfd ready{output[0], POLLIN, 0};
    const int polled =
        ::poll(&ready, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
    if (polled < 0 && errno != EINTR) break;
    if (polled <= 0) continue;
    char buffer[4096];
    const ssize_t got = ::read(output[0], buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    if (printed.size() < 65536) printed.append(buffer, static_cast<std::size_t>(got));
  }
  ::close(output[0]);
  // Its exit, within the same time: a child that closed its output may still be running.
  enum class Reaped { exited, running, lost };
  int status = 0;
  auto reap = [&](std::chrono::steady_clock::time_point until) {
    for (;;) {
      const pid_t done = ::waitpid(pid, &status, WNOHANG);
      if (done == pid) return Reaped::exited;
      if (done < 0 && errno != EINTR) return Reaped::lost;  // no longer ours to wait for
      if (std::chrono::steady_clock::now() >= until) return Reaped::running;
      ::usleep(5000);
    }
  };
  Reaped reaped = timedOut ? Reaped::running : reap(deadline);
  if (reaped == Reaped::running) {
    timedOut = true;
    ::kill(pid, SIGKILL);
    // A child in uninterruptible I/O (a failing disk) dies only when the I/O returns: wait a
    // little, then leave its reaping to a thread of its own instead of holding the caller.
    if (reap(std::chrono::steady_clock::now() + std::chrono::seconds(5)) == Reaped::running) {
      std::thread([pid] {
        int ignored = 0;
        while (::waitpid(pid, &ignored, 0) < 0 && errno == EINTR) {
        }
      }).detach();
    }
  } else if (reaped == Reaped::lost) {
    return failed("the check's exit could not be read");
  }
  if (timedOut) {
    return failed(
        fmt::format("the check of every page did not finish in {} s",
                    std::chrono::duration_cast<std::chrono::seconds>(launch.timeout).count()));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return std::nullopt;
  if (WIFEXITED(status) && WEXITSTATUS(status) == kPageCheckFound) {
    return PageCheckFailure{true, shown(printed)};
  }
  // Killed by what it read (SIGSEGV, SIGBUS, an LMDB assertion's SIGABRT): the pages could not
  // be read through. Killed by anything else (a stop during start-up, the OOM killer, someone's
  // kill), it says nothing of the pages.
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    const bool byWhatItRead = signal == SIGSEGV || signal == SIGBUS || signal == SIGABRT ||
                              signal == SIGILL || signal == SIGFPE;
    auto text = fmt::format("reading its pages killed the check ({}){}", signalName(signal),
                            printed.empty() ? "" : ": " + shown(printed));
    if (!byWhatItRead) {
      text = fmt::format("the check was killed ({}) before it finished", signalName(signal));
    }
    return PageCheckFailure{byWhatItRead, std::move(text)};
  }
  return failed(fmt::format("the check failed (exit status {}){}", WEXITSTATUS(status),
                            printed.empty() ? "" : ": " + shown(printed)));
}

}  // namespace toolhost::store
