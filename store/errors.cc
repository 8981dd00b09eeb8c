#include "store/errors.h"

#include <string>

namespace toolhost::store {
namespace {

class StoreCategory final : public boost::system::error_category {
 public:
  // A fixed id makes codes compare equal across shared-library copies of this category.
  constexpr StoreCategory() noexcept : error_category(0x7f0a'3c1e'5d92'b401ULL) {}

  const char* name() const noexcept override { return "toolhost.store"; }

  std::string message(int ev) const override { return describe(ev); }

 private:
  static const char* describe(int ev) noexcept {
    switch (static_cast<StoreErrc>(ev)) {
      case StoreErrc::mapFull:
        return "the state database is full; raise [store] map_size_mb";
      case StoreErrc::diskFull:
        return "the disk holding the state database is full";
      case StoreErrc::ioError:
        return "I/O error on the state database (is the disk full or failing?)";
      case StoreErrc::permissionDenied:
        return "permission denied on the state directory";
      case StoreErrc::versionMismatch:
        return "the state database has a schema version this build does not know";
      case StoreErrc::locked:
        return "the state directory is in use by another process";
      case StoreErrc::alreadyOpen:
        return "the state directory is already open in this process";
      case StoreErrc::corrupt:
        return "the state database is corrupt or not a toolhost database";
      case StoreErrc::fatal:
        return "the state database hit a fatal error; restart toolhostd";
      case StoreErrc::readersFull:
        return "too many concurrent readers of the state database";
      case StoreErrc::txnFull:
        return "the transaction is too large for the state database";
      case StoreErrc::invalidKey:
        return "empty key, or key longer than the maximum key size (511 bytes)";
      case StoreErrc::invalidArgument:
        return "invalid state database options";
      case StoreErrc::aborted:
        return "the transaction was aborted";
      case StoreErrc::internal:
        return "unexpected internal error in the state database";
    }
    return "unknown state database error";
  }
};

}  // namespace

const boost::system::error_category& storeCategory() noexcept {
  static const StoreCategory category;
  return category;
}

boost::system::error_code make_error_code(StoreErrc e) noexcept {
  return {static_cast<int>(e), storeCategory()};
}

}  // namespace toolhost::store
