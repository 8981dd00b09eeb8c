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
  Walk(const std::filesystem::path& db, bool walkPages) : db_(db), walkPages_(walkPages) {}

  // Whether a commit made meanwhile overwrote the snapshot's meta page (run() then found
  // nothing, whatever it met).
  bool raced() const { return raced_; }

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

    // Every page's header and node table first, from the roots down, reading only what lies
    // inside the pages in use: what LMDB trusts there when it writes (a page's free-space
    // bounds, its nodes' offsets, an overflow run's length) is what reads never look at.
    if (walkPages_ && start_ != 0 && end_ - start_ == used) {
      pageSize_ = envStat.ms_psize;
      walkPages(mdb_txn_id(txn.get()));
      if (raced_) return {};
      if (!problems_.empty()) return std::move(problems_);
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
        if (!seen_.empty() && seen_[ids[i]]) {
          problem(fmt::format("the free page list names page {}, which a table uses", ids[i]));
          return;
        }
      }
    });
  }

  // LMDB's on-disk layout (lmdb.h's MDB_page, MDB_node, MDB_meta, MDB_db), read by offset.
  static constexpr std::size_t kHeader = 16;  // PAGEHDRSZ: pgno, pad, flags, lower/upper
  static constexpr std::uint16_t kBranch = 0x01, kLeaf = 0x02, kOverflow = 0x04, kLeaf2 = 0x20;
  static constexpr std::uint16_t kBigData = 0x01, kSubData = 0x02, kDupData = 0x04;
  static constexpr std::size_t kDbSize = 48;      // MDB_db
  static constexpr std::size_t kDbRoot = 40;      // md_root within MDB_db
  static constexpr std::size_t kDbDepth = 6;      // md_depth (uint16)
  static constexpr std::size_t kMetaDbs = 24;     // mm_dbs within MDB_meta
  static constexpr std::size_t kMetaTxnid = 128;  // mm_txnid within MDB_meta
  static constexpr std::uint64_t kNoPage = ~std::uint64_t{0};

  template <class T>
  T read(std::uint64_t page, std::size_t offset) const {
    T value{};
    std::memcpy(&value, reinterpret_cast<const void*>(start_ + page * pageSize_ + offset),
                sizeof value);
    return value;
  }

  // From the meta page of the snapshot being read: the main table's tree, and through it every
  // table's, every page checked once.
  void walkPages(std::uint64_t txnid) {
    std::uint64_t meta = kNoPage;
    for (std::uint64_t page : {0, 1}) {
      if (read<std::uint64_t>(page, kHeader + kMetaTxnid) == txnid) meta = page;
    }
    // A writer overwrites the meta page of the snapshot two commits after it (a reader's slot
    // keeps its pages, not its meta page): found in neither, or changed by the end of the walk,
    // the roots may have been read while being written, and what the walk found says nothing.
    if (meta == kNoPage) {
      raced_ = true;
      return;
    }
    seen_.assign(lastPage_ + 1, false);
    const std::size_t freeDb = kHeader + kMetaDbs;            // mm_dbs[FREE_DBI]
    const std::size_t mainDb = kHeader + kMetaDbs + kDbSize;  // mm_dbs[MAIN_DBI]
    walkTree("(free pages)", read<std::uint64_t>(meta, freeDb + kDbRoot),
             read<std::uint16_t>(meta, freeDb + kDbDepth), 1);
    walkTree("(main)", read<std::uint64_t>(meta, mainDb + kDbRoot),
             read<std::uint16_t>(meta, mainDb + kDbDepth), 1);
    if (read<std::uint64_t>(meta, kHeader + kMetaTxnid) != txnid) raced_ = true;
  }

  // The tree under `page`, which should sit `level` of `depth` levels down.
  void walkTree(const std::string& table, std::uint64_t page, std::uint16_t depth,
                std::uint16_t level) {
    if (page == kNoPage) return;  // an empty table
    if (problems_.size() >= kMaxPageProblems) return;
    auto bad = [&](const std::string& what) {
      problem(fmt::format("table {}: page {}: {}", table, page, what));
    };
    if (page < 2 || page > lastPage_) return bad("outside the pages in use");
    if (seen_[page]) return bad("reached twice");
    seen_[page] = true;
    if (level > depth) return bad(fmt::format("deeper than the table's depth {}", depth));
    if (read<std::uint64_t>(page, 0) != page) return bad("its header names another page");
    const auto flags = read<std::uint16_t>(page, 10);
    const auto lower = read<std::uint16_t>(page, 12);
    const auto upper = read<std::uint16_t>(page, 14);
    const bool branch = (flags & kBranch) != 0;
    const bool leaf = (flags & kLeaf) != 0;
    if (branch == leaf || (flags & (kOverflow | kLeaf2)) != 0) {
      return bad(fmt::format("flags {:#x} are not a branch or leaf page's", flags));
    }
    if (branch != (level < depth)) return bad("a branch where a leaf belongs, or the reverse");
    if (lower < kHeader || lower > upper || upper > pageSize_ || (lower - kHeader) % 2 != 0) {
      return bad(fmt::format("its free space runs from {} to {}", lower, upper));
    }
    const std::size_t nodes = (lower - kHeader) / 2;
    if (branch && nodes == 0) return bad("a branch page without nodes");
    for (std::size_t i = 0; i < nodes; ++i) {
      const auto at = read<std::uint16_t>(page, kHeader + 2 * i);
      if (at < upper || at + std::size_t{8} > pageSize_) {
        return bad(fmt::format("node {} lies outside the page's node area", i));
      }
      const auto lo = read<std::uint16_t>(page, at);
      const auto hi = read<std::uint16_t>(page, at + 2);
      const auto nodeFlags = read<std::uint16_t>(page, at + 4);
      const auto keySize = read<std::uint16_t>(page, at + 6);
      const std::size_t data = at + std::size_t{8} + keySize;
      if (data > pageSize_) return bad(fmt::format("node {}'s key runs past the page", i));
      if (branch) {
        const std::uint64_t child =
            lo | (std::uint64_t{hi} << 16) | (std::uint64_t{nodeFlags} << 32);
        walkTree(table, child, depth, level + 1);
        continue;
      }
      const std::size_t size = lo | (std::size_t{hi} << 16);
      if ((nodeFlags & kBigData) != 0) {
        if (data + 8 > pageSize_) return bad(fmt::format("node {}'s value runs past the page", i));
        walkOverflow(table, read<std::uint64_t>(page, data), size);
        continue;
      }
      if (data + size > pageSize_) return bad(fmt::format("node {}'s value runs past the page", i));
      if ((nodeFlags & kSubData) != 0 && (nodeFlags & kDupData) == 0 && size == kDbSize &&
          table == "(main)") {
        const std::string name(reinterpret_cast<const char*>(start_ + page * pageSize_ + at + 8),
                               keySize);
        walkTree(name, read<std::uint64_t>(page, data + kDbRoot),
                 read<std::uint16_t>(page, data + kDbDepth), 1);
      }
    }
  }

  // A value of `size` bytes on its run of overflow pages from `page`. The run may be longer
  // than the value needs: LMDB rewrites a value in place on the run an earlier write of the same
  // transaction made, keeping its length.
  void walkOverflow(const std::string& table, std::uint64_t page, std::size_t size) {
    auto bad = [&](const std::string& what) {
      problem(fmt::format("table {}: overflow page {}: {}", table, page, what));
    };
    if (page < 2 || page > lastPage_) return bad("outside the pages in use");
    if (read<std::uint64_t>(page, 0) != page) return bad("its header names another page");
    if ((read<std::uint16_t>(page, 10) & kOverflow) == 0) return bad("not an overflow page");
    const std::uint64_t needed = (kHeader - 1 + size) / pageSize_ + 1;  // OVPAGES
    const std::uint64_t pages = read<std::uint32_t>(page, 12);
    if (pages < needed) {
      return bad(fmt::format("counts {} pages for a value that takes {}", pages, needed));
    }
    if (pages > lastPage_ + 1 - page) return bad("its run lies outside the pages in use");
    for (std::uint64_t p = page; p < page + pages; ++p) {
      if (seen_[p]) return bad("reached twice");
      seen_[p] = true;
    }
  }

  const std::filesystem::path db_;
  const bool walkPages_;
  bool raced_ = false;
  std::vector<std::string> problems_;
  std::size_t pageSize_ = 0;
  std::vector<bool> seen_;  // pages the trees reached (walkPages)
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

std::vector<std::string> walkDatabase(const std::filesystem::path& db) {
  // A database being written can race the walk of its pages; a new snapshot, then without it.
  for (int attempt = 0; attempt < 3; ++attempt) {
    Walk walk(db, true);
    auto problems = walk.run();
    if (!walk.raced()) return problems;
  }
  return Walk(db, false).run();
}

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
