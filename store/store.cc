#include "store/store.h"

#include <fcntl.h>
#include <lmdb.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <atomic>
#include <boost/throw_exception.hpp>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace toolhost::store {
namespace {

constexpr std::string_view kSchemaVersionKey = "schema_version";
constexpr const char* kLockFileName = "toolhost.lock";
constexpr const char* kDatabaseDirName = "db";
// Written once the database has held a schema version: from then on, a database that is missing
// or empty was lost (deleted, truncated to nothing), not yet to be made.
constexpr const char* kCreatedFileName = "db.created";

// The write callback running on this thread, per Store, to turn a same-thread nested write (a
// certain deadlock on LMDB's writer mutex) into a clear std::logic_error.
thread_local const Store* tlsWriter = nullptr;

std::atomic<std::uint64_t> nextStoreId{1};

MDB_val toVal(std::string_view s) noexcept {
  return MDB_val{s.size(), const_cast<char*>(s.data())};
}

std::string_view toView(const MDB_val& v) noexcept {
  return {static_cast<const char*>(v.mv_data), v.mv_size};
}

StoreErrc classify(int rc) noexcept {
  switch (rc) {
    case MDB_MAP_FULL:
      return StoreErrc::mapFull;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return StoreErrc::diskFull;
    case EACCES:
    case EPERM:
    case EROFS:
      return StoreErrc::permissionDenied;
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
    case MDB_INVALID:
    case MDB_VERSION_MISMATCH:
    case MDB_INCOMPATIBLE:
      return StoreErrc::corrupt;
    case MDB_PANIC:
      return StoreErrc::fatal;
    case MDB_READERS_FULL:
      return StoreErrc::readersFull;
    case MDB_TXN_FULL:
    case MDB_CURSOR_FULL:
    case MDB_PAGE_FULL:
      return StoreErrc::txnFull;
    case MDB_BAD_VALSIZE:
      return StoreErrc::invalidKey;
    case MDB_DBS_FULL:
      return StoreErrc::invalidArgument;
    default:
      break;
  }
  // Other positive codes are errno values from the file system.
  if (rc > 0) return StoreErrc::ioError;
  return StoreErrc::internal;
}

// Owns a file descriptor.
class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&&) = delete;
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

struct EnvCloser {
  void operator()(MDB_env* env) const noexcept { mdb_env_close(env); }
};
using EnvPtr = std::unique_ptr<MDB_env, EnvCloser>;

// Aborts a raw transaction used during open().
struct TxnAborter {
  void operator()(MDB_txn* txn) const noexcept { mdb_txn_abort(txn); }
};
using TxnPtr = std::unique_ptr<MDB_txn, TxnAborter>;

struct CursorCloser {
  void operator()(MDB_cursor* cursor) const noexcept { mdb_cursor_close(cursor); }
};
using CursorPtr = std::unique_ptr<MDB_cursor, CursorCloser>;

OpenError openError(StoreErrc code, std::string message) {
  return OpenError{make_error_code(code), std::move(message)};
}

OpenError openErrorFromErrno(int err, const std::string& what) {
  const StoreErrc code = classify(err);
  return openError(
      code, fmt::format("{}: {} ({})", what, make_error_code(code).message(), std::strerror(err)));
}

OpenError openErrorFromMdb(int rc, const std::filesystem::path& db, const char* what) {
  const StoreErrc code = classify(rc);
  return openError(code, fmt::format("cannot {} the state database {}: {} ({})", what, db.string(),
                                     make_error_code(code).message(), mdb_strerror(rc)));
}

// Creates `dir` and missing parents with mode 0700; an existing directory is left as it is.
std::optional<OpenError> ensureDirectory(const std::filesystem::path& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return std::nullopt;
    return openError(StoreErrc::invalidArgument,
                     fmt::format("state directory {} exists but is not a directory", dir.string()));
  }
  if (errno != ENOENT) return openErrorFromErrno(errno, "cannot inspect " + dir.string());
  if (dir.has_parent_path() && dir.parent_path() != dir) {
    if (auto err = ensureDirectory(dir.parent_path())) return err;
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return openErrorFromErrno(errno, "cannot create " + dir.string());
  }
  return std::nullopt;
}

// `path` (whose lstat or fstat is `st`) must be what the store made: a directory or regular
// file (not a link), belonging to this process's user (or root), which neither its group nor
// others may write. A state directory shared with others (sticky, as /tmp) lets them make
// entries before the daemon does: a db/ of their own, with a database and reader table of their
// choosing.
std::optional<OpenError> checkMadeHere(const std::filesystem::path& path, const struct stat& st,
                                       bool directory) {
  const char* const kind = directory ? "a directory" : "a regular file";
  if (directory ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) {
    return openError(StoreErrc::permissionDenied,
                     fmt::format("{} is not {} (a link or another kind of file); the state "
                                 "database uses only what it made itself",
                                 path.string(), kind));
  }
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    return openError(
        StoreErrc::permissionDenied,
        fmt::format("{} belongs to uid {}, not to this process's user (uid {}) or "
                    "root: another user may have made it; remove it if it is not yours",
                    path.string(), st.st_uid, ::geteuid()));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return openError(StoreErrc::permissionDenied,
                     fmt::format("{} may be written by its group or by others (mode {:04o}); the "
                                 "state database keeps it private (chmod go-w)",
                                 path.string(), st.st_mode & 07777));
  }
  return std::nullopt;
}

// checkMadeHere() for a path that may not exist yet (then nothing to judge).
std::optional<OpenError> checkIfPresent(const std::filesystem::path& path, bool directory) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::nullopt;
    return openErrorFromErrno(errno, "cannot inspect " + path.string());
  }
  return checkMadeHere(path, st, directory);
}

// Records that the database in `stateDir` exists (see kCreatedFileName), durably.
std::optional<OpenError> markCreated(const std::filesystem::path& stateDir) {
  const std::filesystem::path marker = stateDir / kCreatedFileName;
  UniqueFd fd(::open(marker.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (fd.get() < 0) return openErrorFromErrno(errno, "cannot create " + marker.string());
  const std::string text =
      "toolhost: the state database in db/ was created; if it goes missing or empty, toolhostd "
      "refuses to start rather than begin again with nothing\n";
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
      ::fsync(fd.get()) != 0) {
    return openErrorFromErrno(errno, "cannot write " + marker.string());
  }
  UniqueFd dir(::open(stateDir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0 || ::fsync(dir.get()) != 0) {
    return openErrorFromErrno(errno, "cannot sync " + stateDir.string());
  }
  return std::nullopt;
}

// The pid a lock file records, or 0.
long recordedPid(const std::filesystem::path& lockPath) {
  UniqueFd fd(::open(lockPath.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (fd.get() < 0) return 0;
  char buffer[32] = {};
  const ssize_t n = ::pread(fd.get(), buffer, sizeof buffer - 1, 0);
  long pid = 0;
  if (n > 0) std::from_chars(buffer, buffer + n, pid);
  return pid;
}

OpenError inUse(const std::filesystem::path& dir, long pid) {
  if (pid == static_cast<long>(::getpid())) {
    return openError(StoreErrc::alreadyOpen,
                     fmt::format("state directory {} is already open in this process (pid {})",
                                 dir.string(), pid));
  }
  if (pid > 0) {
    return openError(StoreErrc::locked,
                     fmt::format("state directory {} is in use by pid {}", dir.string(), pid));
  }
  return openError(StoreErrc::locked,
                   fmt::format("state directory {} is in use by another process", dir.string()));
}

// The locks that make this process the only user of the state directory: an exclusive flock(2)
// on the directory itself, which nobody removes by hand, and one on its lock file, which records
// our pid for the error message of the next would-be owner (and which daemons before the
// directory lock took alone). flock(2) locks belong to the open file description, so a second
// open() in this same process conflicts too (unlike fcntl locks, which LMDB uses and which a
// same-process second open would silently release).
struct StateLock {
  UniqueFd directory;
  UniqueFd file;
};

boost::system::result<StateLock, OpenError> lockStateDirectory(const std::filesystem::path& dir) {
  const std::filesystem::path lockPath = dir / kLockFileName;
  UniqueFd directory(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  if (directory.get() < 0) return openErrorFromErrno(errno, "cannot open " + dir.string());
  if (::flock(directory.get(), LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) return openErrorFromErrno(err, "cannot lock " + dir.string());
    // Its owner wrote its pid when it started; a lock file removed since names nobody.
    return inUse(dir, recordedPid(lockPath));
  }
  UniqueFd fd(::open(lockPath.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (fd.get() < 0) return openErrorFromErrno(errno, "cannot open " + lockPath.string());
  // What was opened, not what the path held when open() checked it.
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return openErrorFromErrno(errno, "cannot inspect " + lockPath.string());
  }
  if (auto err = checkMadeHere(lockPath, st, false)) return *err;
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) return openErrorFromErrno(err, "cannot lock " + lockPath.string());
    return inUse(dir, recordedPid(lockPath));
  }
  const std::string pid = fmt::format("{}\n", ::getpid());
  if (::ftruncate(fd.get(), 0) != 0 ||
      ::pwrite(fd.get(), pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return openErrorFromErrno(errno, "cannot write " + lockPath.string());
  }
  return StateLock{std::move(directory), std::move(fd)};
}

std::optional<std::uint32_t> parseVersion(std::string_view text) {
  std::uint32_t version = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), version);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return version;
}

// Reads the schema version without writing anything: std::nullopt for a fresh environment.
boost::system::result<std::optional<std::uint32_t>, OpenError> readSchemaVersion(
    MDB_env* env, const std::filesystem::path& db) {
  MDB_txn* raw = nullptr;
  if (int rc = mdb_txn_begin(env, nullptr, MDB_RDONLY, &raw)) {
    return openErrorFromMdb(rc, db, "read");
  }
  TxnPtr txn(raw);
  MDB_dbi meta = 0;
  int rc = mdb_dbi_open(txn.get(), std::string(kMetaTable).c_str(), 0, &meta);
  if (rc == MDB_NOTFOUND) {
    // No meta table: a fresh environment, unless something else already lives in it.
    MDB_dbi main = 0;
    MDB_stat st{};
    if ((rc = mdb_dbi_open(txn.get(), nullptr, 0, &main)) != 0 ||
        (rc = mdb_stat(txn.get(), main, &st)) != 0) {
      return openErrorFromMdb(rc, db, "read");
    }
    if (st.ms_entries != 0) {
      return openError(StoreErrc::corrupt,
                       fmt::format("{} holds an LMDB database that is not a toolhost state "
                                   "database (no schema version)",
                                   db.string()));
    }
    return std::optional<std::uint32_t>();
  }
  if (rc != 0) return openErrorFromMdb(rc, db, "read");
  MDB_val key = toVal(kSchemaVersionKey);
  MDB_val value{};
  rc = mdb_get(txn.get(), meta, &key, &value);
  if (rc == MDB_NOTFOUND) {
    return openError(StoreErrc::corrupt,
                     fmt::format("the state database {} has no schema version row", db.string()));
  }
  if (rc != 0) return openErrorFromMdb(rc, db, "read");
  const std::optional<std::uint32_t> version = parseVersion(toView(value));
  if (!version || *version == 0) {
    return openError(StoreErrc::corrupt,
                     fmt::format("the state database {} has an unreadable schema version '{}'",
                                 db.string(), toView(value)));
  }
  return std::optional<std::uint32_t>(*version);
}

std::optional<OpenError> validate(const Options& options) {
  auto invalid = [](std::string message) { return openError(StoreErrc::invalidArgument, message); };
  if (options.stateDir.empty()) return invalid("store: no state directory given");
  if (options.mapSizeMb == 0) return invalid("store: [store] map_size_mb must be at least 1");
  if (options.maxReaders == 0) return invalid("store: maxReaders must be at least 1");
  if (options.tables.size() + 1 > options.maxTables) {
    return invalid(fmt::format("store: {} tables plus '{}' exceed maxTables ({})",
                               options.tables.size(), kMetaTable, options.maxTables));
  }
  for (std::size_t i = 0; i < options.tables.size(); ++i) {
    const std::string& name = options.tables[i];
    if (name.empty() || name.find('\0') != std::string::npos) {
      return invalid("store: a table name is empty or contains NUL");
    }
    if (name == kMetaTable) {
      return invalid(fmt::format("store: the table name '{}' is reserved", kMetaTable));
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (options.tables[j] == name) {
        return invalid(fmt::format("store: table '{}' is listed twice", name));
      }
    }
  }
  return std::nullopt;
}

// Whether the file system holding `dir` has (almost) no space left for unprivileged writes.
// Whether the database's disk, or the file size limit (RLIMIT_FSIZE) of this process, leaves
// under a mebibyte for data.mdb in `dir` to grow.
bool diskNearlyFull(const std::filesystem::path& dir) {
  constexpr std::uint64_t kNearlyFullBytes = 1U << 20;
  struct rlimit fileSize {};
  struct stat data {};
  if (::getrlimit(RLIMIT_FSIZE, &fileSize) == 0 && fileSize.rlim_cur != RLIM_INFINITY &&
      ::stat((dir / "data.mdb").c_str(), &data) == 0 &&
      static_cast<std::uint64_t>(data.st_size) + kNearlyFullBytes > fileSize.rlim_cur) {
    return true;
  }
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) != 0) return false;
  return static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize < kNearlyFullBytes;
}

}  // namespace

void throw_exception_from_error(const OpenError& e, const boost::source_location& loc) {
  boost::throw_exception(boost::system::system_error(e.code, e.message), loc);
}

// Everything open() prepares before the Store exists.
struct Store::Init {
  std::filesystem::path path;
  std::size_t mapSizeMb = 0;
  std::uint32_t schemaVersion = 0;
  EnvPtr env;
  StateLock lock;
  std::vector<std::string> tableNames;
  std::vector<unsigned> dbis;
  std::function<std::optional<PageCheckFailure>(const std::filesystem::path&)> checkPages;
  std::function<bool(std::string&)> allowFailureLine;
};

boost::system::result<StorePtr, OpenError> Store::open(Options options) {
  if (auto err = validate(options)) return *err;

  std::error_code fsError;
  std::filesystem::path stateDir = std::filesystem::absolute(options.stateDir, fsError);
  if (fsError) return openErrorFromErrno(fsError.value(), "cannot resolve the state directory");
  if (auto err = ensureDirectory(stateDir)) return *err;
  stateDir = std::filesystem::canonical(stateDir, fsError);
  if (fsError) return openErrorFromErrno(fsError.value(), "cannot resolve the state directory");

  const std::filesystem::path db = stateDir / kDatabaseDirName;
  for (const auto& [path, directory] :
       {std::pair{stateDir / kLockFileName, false}, std::pair{stateDir / kCreatedFileName, false},
        std::pair{db, true}, std::pair{db / "data.mdb", false},
        std::pair{db / "lock.mdb", false}}) {
    if (auto err = checkIfPresent(path, directory)) return *err;
  }

  auto lock = lockStateDirectory(stateDir);
  if (!lock) return lock.error();

  std::error_code markerError;
  const bool created = std::filesystem::exists(stateDir / kCreatedFileName, markerError);
  if (markerError) {
    return openErrorFromErrno(markerError.value(),
                              "cannot inspect " + (stateDir / kCreatedFileName).string());
  }
  // A database this directory held is gone: refused before anything is made in its place, so
  // that restoring db/ (or its data.mdb) from a backup lands where it was.
  const auto lost = [&](const std::string& what, const std::string& restore) {
    return openError(
        StoreErrc::corrupt,
        fmt::format("the state database {} is {}, but this state directory held one ({} says "
                    "so): it was deleted or truncated; {}, or remove {} to start again with an "
                    "empty state",
                    db.string(), what, kCreatedFileName, restore,
                    (stateDir / kCreatedFileName).string()));
  };
  if (created) {
    std::error_code dbError;
    const bool dbDirectory = std::filesystem::exists(db, dbError);
    if (dbError) return openErrorFromErrno(dbError.value(), "cannot inspect " + db.string());
    if (!dbDirectory) return lost("missing", "restore db/ from a backup");
    const bool dataFile = std::filesystem::exists(db / "data.mdb", dbError);
    if (dbError) return openErrorFromErrno(dbError.value(), "cannot inspect " + db.string());
    if (!dataFile) {
      return lost("missing", "restore data.mdb into " + db.string() + " from a backup");
    }
    // Empty, LMDB would write a new database into it before the check below could refuse it.
    if (std::filesystem::file_size(db / "data.mdb", dbError) == 0 && !dbError) {
      return lost("missing or empty", "restore db/ from a backup");
    }
  }

  if (auto err = ensureDirectory(db)) return *err;
  // Again, now that it exists: another user may have made it since the check above.
  if (auto err = checkIfPresent(db, true)) return *err;
  // A first open that failed part way (a full disk) can leave a data file shorter than the two
  // meta pages LMDB writes first, which it then refuses as "not an LMDB file" forever. Without
  // the marker it never held a schema version, so nothing is lost by starting it again.
  if (!created) {
    std::error_code sizeError;
    const auto size = std::filesystem::file_size(db / "data.mdb", sizeError);
    const auto pageSize = static_cast<std::uintmax_t>(::sysconf(_SC_PAGESIZE));
    if (!sizeError && size > 0 && size < 2 * pageSize) {
      spdlog::warn(
          "store: {} holds {} bytes, less than a database's first two pages: an earlier "
          "first start stopped part way; starting it again",
          (db / "data.mdb").string(), size);
      std::error_code removeError;
      std::filesystem::remove(db / "data.mdb", removeError);
      if (removeError) {
        return openErrorFromErrno(removeError.value(),
                                  "cannot remove the unfinished " + (db / "data.mdb").string());
      }
      std::filesystem::remove(db / "lock.mdb", removeError);
    }
  }

  // LMDB extends its lock file to full length without allocating it, then writes it through a
  // map: on a disk without room for it that write kills the process (SIGBUS). With its room
  // taken here first (made, or an existing short or sparse one filled in; checkIfPresent found
  // it ours, and no other process uses it while the directory is locked), a full disk is an
  // error instead. LMDB keeps a longer file as it is.
  {
    const int fd =
        ::open((db / "lock.mdb").c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
      return openErrorFromErrno(errno,
                                "cannot open the lock file of the state database " + db.string());
    }
    // A reader slot takes a cache line (64 bytes); the header a few more, well under a page.
    const auto bytes = static_cast<off_t>((options.maxReaders + 1) * 64 + 4096);
    const int err = ::posix_fallocate(fd, 0, bytes);
    ::close(fd);
    if (err != 0) {
      return openErrorFromErrno(
          err, "cannot make room for the lock file of the state database " + db.string());
    }
  }

  MDB_env* rawEnv = nullptr;
  if (int rc = mdb_env_create(&rawEnv)) return openErrorFromMdb(rc, db, "create");
  EnvPtr env(rawEnv);
  const auto mapSizeBytes = static_cast<std::size_t>(options.mapSizeMb) << 20U;
  if (int rc = mdb_env_set_mapsize(env.get(), mapSizeBytes)) {
    return openErrorFromMdb(rc, db, "size");
  }
  if (int rc = mdb_env_set_maxdbs(env.get(), options.maxTables)) {
    return openErrorFromMdb(rc, db, "configure");
  }
  if (int rc = mdb_env_set_maxreaders(env.get(), options.maxReaders)) {
    return openErrorFromMdb(rc, db, "configure");
  }
  // MDB_NOTLS: read transactions are not tied to a thread's TLS slot, so a thread may hold more
  // than one and threads of a pool can share reader slots. No MDB_NOSYNC: commits are durable.
  if (int rc = mdb_env_open(env.get(), db.c_str(), MDB_NOTLS, 0600)) {
    return openErrorFromMdb(rc, db, "open");
  }

  // A data file shorter than the pages its meta page says are in use (truncated by a full disk,
  // a bad copy, an editor) would be read through the map anyway, and touching a page past its
  // end kills the process (SIGBUS) at the first read: refuse it here instead.
  {
    MDB_envinfo info{};
    MDB_stat envStat{};
    if (int rc = mdb_env_info(env.get(), &info)) return openErrorFromMdb(rc, db, "check");
    if (int rc = mdb_env_stat(env.get(), &envStat)) return openErrorFromMdb(rc, db, "check");
    const auto used = (static_cast<std::uint64_t>(info.me_last_pgno) + 1) * envStat.ms_psize;
    const auto size = std::filesystem::file_size(db / "data.mdb", fsError);
    if (fsError)
      return openErrorFromErrno(fsError.value(), "cannot read the size of the state database");
    if (size < used) {
      return openError(StoreErrc::corrupt,
                       fmt::format("the state database {} is truncated: its file holds {} bytes, "
                                   "but its pages in use take {}; restore it from a backup",
                                   db.string(), size, used));
    }
    // Reader slots left by a process that died inside a read transaction would pin old pages
    // and make the map grow until full (and leave the check below no slot).
    int stale = 0;
    if (int rc = mdb_reader_check(env.get(), &stale)) return openErrorFromMdb(rc, db, "check");
    if (stale > 0) spdlog::warn("store: cleared {} stale reader slots in {}", stale, db.string());

    // A damaged page would kill this process at the first read that reaches it: every page is
    // read first, by a process that may die of it (a file LMDB just made has nothing to check).
    if (options.checkPages && size > 2 * std::uint64_t{envStat.ms_psize}) {
      if (auto failed = options.checkPages(db)) {
        if (failed->damaged) {
          return openError(StoreErrc::corrupt,
                           fmt::format("the state database {} is damaged: {}; restore db/ from "
                                       "a backup (mdb_dump, from lmdb-utils, may copy out what "
                                       "can still be read)",
                                       db.string(), failed->text));
        }
        return openError(StoreErrc::ioError,
                         fmt::format("cannot check the pages of the state database {}, and it "
                                     "is not read unchecked: {}",
                                     db.string(), failed->text));
      }
    }
  }

  // The version is checked in a read transaction first, so a store we refuse is not written.
  auto stored = readSchemaVersion(env.get(), db);
  if (!stored) return stored.error();
  if (!*stored && created) return lost("missing or empty", "restore db/ from a backup");
  if (*stored && **stored > kSchemaVersion) {
    return openError(StoreErrc::versionMismatch,
                     fmt::format("the state database {} has schema version {}, newer than the "
                                 "version this toolhost supports ({}); upgrade toolhost or use "
                                 "another state directory",
                                 db.string(), **stored, kSchemaVersion));
  }
  // Older versions would be migrated here, inside the write transaction below. Version 1 is the
  // first, so there is nothing older to migrate yet.

  MDB_txn* raw = nullptr;
  if (int rc = mdb_txn_begin(env.get(), nullptr, 0, &raw)) {
    return openErrorFromMdb(rc, db, "write");
  }
  TxnPtr txn(raw);
  MDB_dbi meta = 0;
  if (int rc = mdb_dbi_open(txn.get(), std::string(kMetaTable).c_str(), MDB_CREATE, &meta)) {
    return openErrorFromMdb(rc, db, "create tables in");
  }
  std::vector<unsigned> dbis;
  dbis.reserve(options.tables.size());
  for (const std::string& name : options.tables) {
    MDB_dbi dbi = 0;
    if (int rc = mdb_dbi_open(txn.get(), name.c_str(), MDB_CREATE, &dbi)) {
      return openErrorFromMdb(rc, db, "create tables in");
    }
    dbis.push_back(dbi);
  }
  if (!*stored) {
    MDB_val key = toVal(kSchemaVersionKey);
    const std::string text = std::to_string(kSchemaVersion);
    MDB_val value = toVal(text);
    if (int rc = mdb_put(txn.get(), meta, &key, &value, 0)) {
      return openErrorFromMdb(rc, db, "initialize");
    }
  }
  // Commit also keeps the table handles opened in this transaction for the environment.
  if (int rc = mdb_txn_commit(txn.release())) return openErrorFromMdb(rc, db, "initialize");
  // After the commit: a crash before it leaves no database and no marker, a fresh start again.
  // A database from before the marker existed gets one now.
  if (!created) {
    if (auto err = markCreated(stateDir)) return *err;
  }

  // The map in use: LMDB makes it as large as the file when a database outgrew the setting.
  MDB_envinfo envInfo{};
  const std::size_t mapInUseMb =
      mdb_env_info(env.get(), &envInfo) == 0 ? envInfo.me_mapsize >> 20 : options.mapSizeMb;
  spdlog::info("store: opened {} (schema version {}, map size {} MiB{}, {} tables)", db.string(),
               kSchemaVersion, mapInUseMb,
               mapInUseMb == options.mapSizeMb
                   ? ""
                   : ", as large as the database; [store] map_size_mb is " +
                         std::to_string(options.mapSizeMb),
               options.tables.size());
  Init init{stateDir,
            mapInUseMb,
            kSchemaVersion,
            std::move(env),
            std::move(*lock),
            std::move(options.tables),
            std::move(dbis),
            std::move(options.checkPages),
            std::move(options.allowFailureLine)};
  return StorePtr(new Store(std::move(init)));
}

Store::Store(Init&& init)
    : id_(nextStoreId.fetch_add(1, std::memory_order_relaxed)),
      path_(std::move(init.path)),
      mapSizeMb_(init.mapSizeMb),
      schemaVersion_(init.schemaVersion),
      env_(init.env.release()),
      lockFd_(init.lock.file.release()),
      directoryLockFd_(init.lock.directory.release()),
      tableNames_(std::move(init.tableNames)),
      dbis_(std::move(init.dbis)),
      checkPages_(std::move(init.checkPages)),
      allowFailureLine_(std::move(init.allowFailureLine)) {}

bool Store::allowFailureLine(std::string& note) const {
  note.clear();
  return !allowFailureLine_ || allowFailureLine_(note);
}

std::optional<PageCheckFailure> Store::checkPages() const {
  if (!checkPages_) return std::nullopt;
  auto failed = checkPages_(databasePath());
  // A check killed inside its read transaction leaves its reader slot behind, which would keep
  // every page freed since from being reused.
  int stale = 0;
  mdb_reader_check(env_, &stale);
  if (stale > 0) spdlog::warn("store: cleared {} stale reader slots", stale);
  return failed;
}

Store::~Store() {
  // The environment closes before the lock goes, so the next owner never overlaps with us.
  mdb_env_close(env_);
  ::close(lockFd_);
  ::close(directoryLockFd_);
}

Table Store::table(std::string_view name) const {
  if (auto table = tryTable(name)) return *table;
  throw std::out_of_range(fmt::format("store: table '{}' was not declared at open", name));
}

std::optional<Table> Store::tryTable(std::string_view name) const noexcept {
  for (std::size_t i = 0; i < tableNames_.size(); ++i) {
    if (tableNames_[i] == name) return Table(id_, dbis_[i], &tableNames_[i]);
  }
  return std::nullopt;
}

boost::system::error_code Store::mapError(int rc, const char* op, std::string_view table) const {
  StoreErrc code = classify(rc);
  // LMDB reports a short write as EIO, which is what a disk that fills up mid-write produces;
  // tell the user about the full disk rather than a failing one.
  if (rc == EIO && diskNearlyFull(databasePath())) code = StoreErrc::diskFull;
  const boost::system::error_code ec = make_error_code(code);
  std::string note;
  if (!allowFailureLine(note)) return ec;
  const std::string where = table.empty() ? std::string() : fmt::format(" on table '{}'", table);
  if (ec == StoreErrc::mapFull) {
    spdlog::warn("store: {}{} failed: {}{}", op, where, describe(ec), note);
  } else {
    spdlog::error("store: {}{} failed: {} ({}){}", op, where, describe(ec), mdb_strerror(rc), note);
  }
  return ec;
}

boost::system::result<std::uint64_t, Store::BackupError> Store::backup(
    const std::filesystem::path& target) const {
  namespace fs = std::filesystem;
  using Result = boost::system::result<std::uint64_t, BackupError>;
  auto refused = [](std::string why, bool exists = false) {
    return Result(BackupError{exists, std::move(why)});
  };
  if (!target.is_absolute()) return refused("the path must be absolute");
  const std::string name = target.filename().string();
  if (name.empty() || name == "." || name == "..") {
    return refused("the path must name a file, not a directory");
  }
  const std::string exists = target.string() + " already exists; a backup never replaces a file";
  struct stat there {};
  if (::lstat(target.c_str(), &there) == 0) return refused(exists, true);
  if (errno != ENOENT) return refused(target.string() + ": " + std::strerror(errno));
  const fs::path directory = target.parent_path();
  std::string partial = (directory / ("." + name + ".partial-XXXXXX")).string();
  const int fd = ::mkostemp(partial.data(), O_CLOEXEC);
  if (fd < 0) {
    return refused("cannot create a file in " + directory.string() + ": " + std::strerror(errno));
  }
  auto failed = [&](std::string why, bool present = false) {
    ::unlink(partial.c_str());
    return refused(std::move(why), present);
  };
  // 0600 whatever the umask: the copy holds everything the database does.
  if (::fchmod(fd, 0600) != 0) {
    const int error = errno;
    ::close(fd);
    return failed("cannot set the copy's mode: " + std::string(std::strerror(error)));
  }
  if (const int rc = mdb_env_copyfd2(env_, fd, 0); rc != 0) {
    ::close(fd);
    spdlog::warn("store: a backup to {} failed: {} ({})", target.string(), mdb_strerror(rc), rc);
    return failed("writing the copy failed: " + std::string(mdb_strerror(rc)));
  }
  struct stat written {};
  if (::fsync(fd) != 0 || ::fstat(fd, &written) != 0) {
    const int error = errno;
    ::close(fd);
    return failed("writing the copy failed: " + std::string(std::strerror(error)));
  }
  if (::close(fd) != 0) {
    return failed("writing the copy failed: " + std::string(std::strerror(errno)));
  }
  // Moved in without replacing: a file that appeared at the path meanwhile stays.
  if (::renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) != 0) {
    int error = errno;
    if (error == EINVAL || error == ENOSYS) {  // a file system without it: a hard link then
      error = ::link(partial.c_str(), target.c_str()) == 0 ? 0 : errno;
      ::unlink(partial.c_str());
    }
    if (error == EEXIST) return failed(exists, true);
    if (error != 0) {
      return failed("cannot name the copy " + target.string() + ": " + std::strerror(error));
    }
  }
  if (const int dir = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  return Result(boost::system::in_place_value, static_cast<std::uint64_t>(written.st_size));
}

std::string Store::describe(const boost::system::error_code& ec) const {
  if (ec == StoreErrc::mapFull) {
    return fmt::format("the state database is full (map size {} MiB); raise [store] map_size_mb",
                       mapSizeMb_);
  }
  const std::string db = databasePath().string();
  if (ec == StoreErrc::diskFull) {
    return fmt::format(
        "the disk holding the state database {} is full (or its file reached the file size "
        "limit, ulimit -f)",
        db);
  }
  if (ec == StoreErrc::ioError) {
    return fmt::format("I/O error on the state database {} (is the disk full or failing?)", db);
  }
  if (ec == StoreErrc::corrupt) {
    return fmt::format("the state database {} is corrupt or not a toolhost database", db);
  }
  if (ec == StoreErrc::permissionDenied) {
    return fmt::format("permission denied on the state directory {}", path_.string());
  }
  if (ec == StoreErrc::fatal) {
    return fmt::format("the state database {} hit a fatal error; restart toolhostd", db);
  }
  return ec.message();
}

boost::system::error_code Store::runRead(detail::FunctionRef<void(ReadTxn&)> fn) const {
  // TODO(perf): keep reset read transactions per thread and mdb_txn_renew them.
  MDB_txn* raw = nullptr;
  if (int rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &raw)) {
    return mapError(rc, "begin read", "");
  }
  ReadTxn txn(*this, raw);
  fn(txn);
  return txn.error_;
}

boost::system::error_code Store::runWrite(detail::FunctionRef<bool(WriteTxn&)> fn) {
  if (tlsWriter == this) {
    throw std::logic_error("store: write() called inside a write callback on the same thread");
  }
  std::lock_guard<std::mutex> lock(writeMutex_);
  boost::system::error_code ec = writeOnce(fn);
  // LMDB reuses the pages a commit freed only from the commit after the next one (the snapshot
  // before it stays readable until then), so right after a write that freed room (a clear, a
  // delete) the next one may still not fit. One small commit moves that along; then the write is
  // tried once more, its callback run again from the start (callbacks act only through their
  // transaction, whose first attempt left nothing behind).
  // The same holds on a full disk: the file cannot grow, so only freed pages make room.
  if ((ec == StoreErrc::mapFull || ec == StoreErrc::diskFull) && nudge()) ec = writeOnce(fn);
  if (ec == StoreErrc::mapFull || ec == StoreErrc::diskFull) writesFull_.store(true);
  if (ec == StoreErrc::ioError || ec == StoreErrc::permissionDenied || ec == StoreErrc::fatal ||
      ec == StoreErrc::corrupt) {
    writesFailing_.store(ec.value());
  }
  return ec;
}

bool Store::nudge() {
  MDB_txn* raw = nullptr;
  if (mdb_txn_begin(env_, nullptr, 0, &raw) != 0) return false;
  MDB_dbi meta = 0;
  const std::string version = std::to_string(schemaVersion_);
  MDB_val key = toVal(kSchemaVersionKey);
  MDB_val value = toVal(version);
  if (mdb_dbi_open(raw, std::string(kMetaTable).c_str(), 0, &meta) != 0 ||
      mdb_put(raw, meta, &key, &value, 0) != 0) {
    mdb_txn_abort(raw);
    return false;
  }
  return mdb_txn_commit(raw) == 0;
}

boost::system::error_code Store::writeOnce(detail::FunctionRef<bool(WriteTxn&)> fn) {
  MDB_txn* raw = nullptr;
  if (int rc = mdb_txn_begin(env_, nullptr, 0, &raw)) return mapError(rc, "begin write", "");
  WriteTxn txn(*this, raw);
  struct WriterMark {
    const Store* previous;
    explicit WriterMark(const Store* self) : previous(std::exchange(tlsWriter, self)) {}
    ~WriterMark() { tlsWriter = previous; }
  } mark(this);
  const bool commit = fn(txn);
  if (txn.error_) return txn.error_;  // poisoned: the destructor aborts
  if (!commit) return {};             // the callback's error is returned by write()
  const bool wrote = txn.wrote_;
  auto ec = txn.commit();
  // Only a commit that needed room says there is room again.
  if (!ec && wrote) {
    writesFull_.store(false);
    writesFailing_.store(0);
  }
  return ec;
}

boost::system::result<Stats> Store::stats() const {
  Stats stats;
  stats.path = path_;
  stats.schemaVersion = schemaVersion_;
  stats.writesFull = writesFull_.load();
  if (const int failing = writesFailing_.load(); failing != 0) {
    stats.writesFailing = make_error_code(static_cast<StoreErrc>(failing));
  }
  MDB_envinfo info{};
  MDB_stat envStat{};
  if (int rc = mdb_env_info(env_, &info)) return mapError(rc, "stats", "");
  if (int rc = mdb_env_stat(env_, &envStat)) return mapError(rc, "stats", "");
  stats.mapSizeBytes = info.me_mapsize;
  stats.pageSize = envStat.ms_psize;
  stats.usedBytes = (static_cast<std::uint64_t>(info.me_last_pgno) + 1) * envStat.ms_psize;
  stats.readersUsed = info.me_numreaders;
  stats.maxReaders = info.me_maxreaders;
  auto counted = read([&](ReadTxn& txn) {
    for (std::size_t i = 0; i < tableNames_.size(); ++i) {
      stats.tables.push_back({tableNames_[i], txn.count(Table(id_, dbis_[i], &tableNames_[i]))});
    }
  });
  if (!counted) return counted.error();
  return stats;
}

// --- ReadTxn -----------------------------------------------------------------------------------

ReadTxn::~ReadTxn() {
  if (txn_ != nullptr) mdb_txn_abort(txn_);
}

unsigned ReadTxn::dbiOf(Table table) const {
  if (table.storeId_ != store_->id_) {
    // Not naming the table: its Store may be gone, and the name with it.
    throw std::logic_error("store: a Table of another (or a destroyed) Store was used");
  }
  return table.dbi_;
}

void ReadTxn::fail(int rc, const char* op, Table table) {
  if (!error_) error_ = store_->mapError(rc, op, table.name());
}

bool ReadTxn::checkKey(std::string_view key, const char* op, Table table) {
  if (!key.empty() && key.size() <= kMaxKeySize) return true;
  if (!error_) {
    spdlog::error("store: {} on table '{}' with a key of {} bytes (allowed 1..{})", op,
                  table.name(), key.size(), kMaxKeySize);
    error_ = make_error_code(StoreErrc::invalidKey);
  }
  return false;
}

std::optional<std::string_view> ReadTxn::tryGet(Table table, std::string_view key) {
  const unsigned dbi = dbiOf(table);
  if (error_ || !checkKey(key, "get", table)) return std::nullopt;
  MDB_val k = toVal(key);
  MDB_val v{};
  const int rc = mdb_get(txn_, dbi, &k, &v);
  if (rc == MDB_NOTFOUND) return std::nullopt;
  if (rc != 0) {
    fail(rc, "get", table);
    return std::nullopt;
  }
  return toView(v);
}

std::optional<std::string> ReadTxn::getCopy(Table table, std::string_view key) {
  if (auto value = tryGet(table, key)) return std::string(*value);
  return std::nullopt;
}

std::pair<std::uint64_t, std::uint64_t> ReadTxn::stat(Table table, const char* op) {
  const unsigned dbi = dbiOf(table);
  if (error_) return {0, 0};
  MDB_stat st{};
  if (int rc = mdb_stat(txn_, dbi, &st)) {
    fail(rc, op, table);
    return {0, 0};
  }
  return {st.ms_entries, (st.ms_branch_pages + st.ms_leaf_pages + st.ms_overflow_pages) *
                             static_cast<std::uint64_t>(st.ms_psize)};
}

std::uint64_t ReadTxn::count(Table table) { return stat(table, "count").first; }

std::uint64_t ReadTxn::bytes(Table table) { return stat(table, "bytes").second; }

void ReadTxn::scanImpl(Table table, const KeyRange& range,
                       detail::FunctionRef<bool(std::string_view, std::string_view)> visit) {
  const unsigned dbi = dbiOf(table);
  if (error_) return;
  if (range.to && compareKeys(*range.to, range.from) <= 0) return;  // empty range
  if (range.from.size() > kMaxKeySize || (range.to && range.to->size() > kMaxKeySize)) {
    checkKey(range.from.size() > kMaxKeySize ? range.from : *range.to, "scan", table);
    return;
  }
  MDB_cursor* raw = nullptr;
  if (int rc = mdb_cursor_open(txn_, dbi, &raw)) {
    fail(rc, "scan", table);
    return;
  }
  const CursorPtr cursor(raw);
  struct ScanMark {
    int& depth;
    explicit ScanMark(int& d) : depth(++d) {}
    ~ScanMark() { --depth; }
  } mark(scanning_);

  MDB_val k{};
  MDB_val v{};
  int rc = 0;
  if (!range.reverse) {
    if (range.from.empty()) {
      rc = mdb_cursor_get(cursor.get(), &k, &v, MDB_FIRST);
    } else {
      k = toVal(range.from);
      rc = mdb_cursor_get(cursor.get(), &k, &v, MDB_SET_RANGE);
    }
    while (rc == 0) {
      const std::string_view key = toView(k);
      if (range.to && compareKeys(key, *range.to) >= 0) break;
      if (!visit(key, toView(v))) break;
      rc = mdb_cursor_get(cursor.get(), &k, &v, MDB_NEXT);
    }
  } else {
    if (range.to && !range.to->empty()) {
      // Step to the first key >= to, then one back; with none, the last key is the start.
      k = toVal(*range.to);
      rc = mdb_cursor_get(cursor.get(), &k, &v, MDB_SET_RANGE);
      if (rc == 0) {
        rc = mdb_cursor_get(cursor.get(), &k, &v, MDB_PREV);
      } else if (rc == MDB_NOTFOUND) {
        rc = mdb_cursor_get(cursor.get(), &k, &v, MDB_LAST);
      }
    } else {
      rc = mdb_cursor_get(cursor.get(), &k, &v, MDB_LAST);
    }
    while (rc == 0) {
      const std::string_view key = toView(k);
      if (compareKeys(key, range.from) < 0) break;
      if (!visit(key, toView(v))) break;
      rc = mdb_cursor_get(cursor.get(), &k, &v, MDB_PREV);
    }
  }
  if (rc != 0 && rc != MDB_NOTFOUND) fail(rc, "scan", table);
}

// --- WriteTxn ----------------------------------------------------------------------------------

void WriteTxn::checkNotScanning() const {
  if (scanning_ > 0) {
    throw std::logic_error("store: a scan visitor modified its transaction; modify after the scan");
  }
}

void WriteTxn::put(Table table, std::string_view key, std::string_view value) {
  const unsigned dbi = dbiOf(table);
  checkNotScanning();
  if (error_ || !checkKey(key, "put", table)) return;
  MDB_val k = toVal(key);
  MDB_val v = toVal(value);
  if (int rc = mdb_put(txn_, dbi, &k, &v, 0)) {
    fail(rc, "put", table);
  } else {
    wrote_ = true;
  }
}

bool WriteTxn::putIfAbsent(Table table, std::string_view key, std::string_view value) {
  const unsigned dbi = dbiOf(table);
  checkNotScanning();
  if (error_ || !checkKey(key, "put", table)) return false;
  MDB_val k = toVal(key);
  MDB_val v = toVal(value);
  const int rc = mdb_put(txn_, dbi, &k, &v, MDB_NOOVERWRITE);
  if (rc == 0) return wrote_ = true;
  if (rc != MDB_KEYEXIST) fail(rc, "put", table);
  return false;
}

bool WriteTxn::erase(Table table, std::string_view key) {
  const unsigned dbi = dbiOf(table);
  checkNotScanning();
  if (error_ || !checkKey(key, "erase", table)) return false;
  MDB_val k = toVal(key);
  const int rc = mdb_del(txn_, dbi, &k, nullptr);
  if (rc == 0) return wrote_ = true;
  if (rc != MDB_NOTFOUND) fail(rc, "erase", table);
  return false;
}

void WriteTxn::clear(Table table) {
  const unsigned dbi = dbiOf(table);
  checkNotScanning();
  if (error_) return;
  if (int rc = mdb_drop(txn_, dbi, 0)) {
    fail(rc, "clear", table);
  } else {
    wrote_ = true;
  }
}

boost::system::error_code WriteTxn::commit() {
  // mdb_txn_commit frees the transaction whether or not it succeeds.
  const int rc = mdb_txn_commit(std::exchange(txn_, nullptr));
  if (rc == 0) return {};
  return store_->mapError(rc, "commit", "");
}

}  // namespace toolhost::store
