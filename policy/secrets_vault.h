// The secrets vault: values tools use but never read, encrypted at rest (AES-256-GCM, OpenSSL)
// in the LMDB tables "secrets" and "secrets_meta", keyed by (tool name, tool revision, secret
// name). Only the daemon reads a value, to put it into a request it sends for the tool.
// Thread-safe: every member may be called from any thread, concurrently (each is one short
// transaction; the key is read-only after open()).
//
// Caveats:
//  - The key comes from a file (systemd credentials, [secrets] key_file, or <stateDir>/secrets.key)
//    read once by open(). A key file is created (0600, 32 random bytes) only when it may be
//    created, is missing, and the store holds neither a secret nor a key-check row; missing with
//    rows present, unreadable, malformed or not the key the rows were written with, open() fails
//    with words naming the file, and writes nothing.
//  - A row's ciphertext is bound (GCM additional data) to its tool, revision, name and grant
//    (origins, allowBody, carry): a row copied to another key, or whose grant was edited in the
//    file, does not decrypt (VaultErrc::corrupt), so nothing is revealed.
//  - Values never appear in an error message, a log line or an exception; SecretValue wipes its
//    bytes when destroyed. Anything else a caller copies a value into is the caller's to wipe.
#pragma once

#include "store/store.h"

#include <boost/system/result.hpp>

#include <cstddef>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace toolhost::policy {

// The most any secret value may hold, whatever the configuration says ([secrets] max_value_bytes
// is checked by the daemon and may only be lower).
inline constexpr std::size_t kMaxSecretValueBytes = std::size_t{1} << 20;
inline constexpr std::size_t kMaxSecretOrigins = 32;

// Secret names: ASCII letters, digits, '_' and '-', starting with a letter, at most 64 characters
// (the rule of a manifest's capabilities.secrets).
bool isValidSecretName(std::string_view name);

enum class VaultErrc {
  keyMissing,       // the key file is missing while secrets exist (or a credential is missing)
  keyInvalid,       // unreadable, or not 32 raw bytes, 64 hex characters or 44 base64 characters
  keyMismatch,      // not the key the stored secrets were written with
  keyIo,            // the key file could not be created
  invalidArgument,  // a name with a NUL byte, an empty or oversized value, too many origins
  corrupt,          // a row that does not parse or does not decrypt
  storage,          // the store failed (see `store`)
  crypto,           // OpenSSL failed (no randomness, a cipher failure)
};

struct VaultError {
  VaultErrc code;
  std::string message;              // words naming the file or the row; never a value
  boost::system::error_code store;  // for VaultErrc::storage
};

// Where the key comes from, chosen by the daemon.
struct KeySource {
  std::filesystem::path path;
  bool mayCreate = true;    // false for a systemd credential: it must exist
  std::string description;  // "the systemd credential", "[secrets] key_file", ...
};

// A secret's value. Move-only; its bytes are wiped (OPENSSL_cleanse) when it is destroyed or
// moved from.
class SecretValue {
 public:
  SecretValue() = default;
  explicit SecretValue(std::string bytes) : bytes_(std::move(bytes)) {}
  SecretValue(SecretValue&& other) noexcept;
  SecretValue& operator=(SecretValue&& other) noexcept;
  SecretValue(const SecretValue&) = delete;
  SecretValue& operator=(const SecretValue&) = delete;
  ~SecretValue();

  std::string_view view() const { return bytes_; }
  std::size_t size() const { return bytes_.size(); }

 private:
  void wipe();
  std::string bytes_;
};

// A stored secret without its value.
struct SecretRecord {
  std::string tool;                  // tool name
  std::string revision;              // the tool revision it was set for
  std::string name;                  // secret name
  std::vector<std::string> origins;  // exact https origins it may be sent to, sorted, unique
  bool allowBody = false;            // may also be substituted in request bodies
  bool carry = false;  // revisions of the tool installed later that request it may use it
  std::string createdAt;             // RFC 3339 UTC, when it was (last) set
  // The order of the sets of this tool's secrets: each set takes one more than any row of the
  // tool holds, so the newest carried row is found whatever the clock did (two sets in one
  // millisecond, a clock stepped back). 0 in rows written before it existed (all older).
  std::uint64_t sequence = 0;
};

// What set() stores.
struct SecretGrant {
  std::string tool;
  std::string revision;
  std::string name;
  std::vector<std::string> origins;  // checked by the caller; sorted and deduplicated here
  bool allowBody = false;
  bool carry = false;
};

// How a secret resolves for one tool revision.
enum class Resolution { own, carried };
struct ResolvedSecret {
  SecretRecord record;
  Resolution resolution = Resolution::own;
};

struct RevealedSecret {
  SecretRecord record;
  SecretValue value;
};

class SecretsVault {
 public:
  // The tables this module keeps in the store (pass them to store::Options at open).
  static std::vector<std::string> tables();  // {"secrets", "secrets_meta"}

  // Reads (or creates) the key and checks it against the store. See the Caveats.
  static boost::system::result<std::unique_ptr<SecretsVault>, VaultError> open(
      store::Store& store, const KeySource& key);

  // Removes every stored secret and the record of the key they were stored with, so that the
  // next open() takes whatever key it finds (toolhostd --forget-secrets: the way on after the
  // key was lost, when nothing can read them any more). How many secrets were removed.
  static boost::system::result<std::uint64_t, VaultError> forgetAll(store::Store& store);

  ~SecretsVault();
  SecretsVault(const SecretsVault&) = delete;
  SecretsVault& operator=(const SecretsVault&) = delete;

  // Stores (or replaces) the secret of `grant` with `value`, encrypted under a fresh nonce.
  boost::system::result<SecretRecord, VaultError> set(const SecretGrant& grant,
                                                      std::string_view value);

  // Every secret (or those of one tool), ordered by tool, revision, name. Never values.
  boost::system::result<std::vector<SecretRecord>, VaultError> list(
      const std::optional<std::string>& tool) const;

  // Removes one secret; true if it existed.
  boost::system::result<bool, VaultError> erase(const std::string& tool,
                                                const std::string& revision,
                                                const std::string& name);

  // The secret `name` as revision `revision` of `tool` sees it: its own row, else the most
  // recently set carry row of one of `installedBefore`, the revisions of the tool installed
  // before `revision` (carry reaches later revisions only: a key rotated on a new revision never
  // reaches the one it replaced). nullopt when neither exists. (Whether the revision requests
  // the secret is the caller's to check first.)
  boost::system::result<std::optional<ResolvedSecret>, VaultError> tryResolve(
      const std::string& tool, const std::string& revision, const std::string& name,
      const std::vector<std::string>& installedBefore) const;

  // The row (tool, revision, name) as stored now, with its value decrypted; nullopt when it is
  // gone. The caller checks the returned grant again (it may have changed since it was listed).
  boost::system::result<std::optional<RevealedSecret>, VaultError> reveal(
      const std::string& tool, const std::string& revision, const std::string& name) const;

  const std::filesystem::path& keyPath() const { return keyPath_; }

 private:
  struct Key;
  SecretsVault(store::Store& store, std::unique_ptr<Key> key, std::filesystem::path keyPath);

  store::Store& store_;
  store::Table secrets_;  // tool \0 revision \0 name -> {nonce, ciphertext, tag, origins, ...}
  store::Table meta_;     // "key-check" -> {nonce, ciphertext, tag}
  std::unique_ptr<Key> key_;
  std::filesystem::path keyPath_;
};

}  // namespace toolhost::policy
