// Expected failures of the state database, as boost::system error codes (category
// "toolhost.store"). Plain values: usable from any thread.
#pragma once

#include <boost/system/error_code.hpp>
#include <type_traits>

namespace toolhost::store {

// Every outcome a caller of the store may have to act on. Zero is success, as for every
// error_code enum. Store::describe() adds details (map size, path) to the fixed messages.
enum class StoreErrc {
  mapFull = 1,       // MDB_MAP_FULL: the configured map size is used up
  diskFull,          // ENOSPC, EDQUOT, EFBIG while writing
  ioError,           // EIO and other OS errors while reading or writing
  permissionDenied,  // EACCES, EPERM, EROFS on the state directory
  versionMismatch,   // schema version this build does not know
  locked,            // another process holds the state directory
  alreadyOpen,       // this process already has a Store on the state directory
  corrupt,           // MDB_CORRUPTED, MDB_PAGE_NOTFOUND, MDB_INVALID, bad meta rows, foreign file
  fatal,             // MDB_PANIC: the environment is unusable until reopened
  readersFull,       // MDB_READERS_FULL: too many concurrent read transactions
  txnFull,           // MDB_TXN_FULL and friends: one transaction touched too much
  invalidKey,        // empty key, or longer than the maximum key size (511 bytes)
  invalidArgument,   // bad Options at open
  aborted,           // a write callback chose to abort (for callers without their own enum)
  internal,          // an LMDB return code this module does not expect: a bug
};

const boost::system::error_category& storeCategory() noexcept;

boost::system::error_code make_error_code(StoreErrc e) noexcept;

}  // namespace toolhost::store

template <>
struct boost::system::is_error_code_enum<toolhost::store::StoreErrc> : std::true_type {};
