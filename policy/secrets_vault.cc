#include "policy/secrets_vault.h"

#include "policy/decisions.h"
#include "protocol/json_parse.h"
#include "protocol/json_text.h"
#include "protocol/path_trust.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <new>
#include <system_error>

namespace toolhost::policy {
namespace json = boost::json;
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kSecretsTable = "secrets";
constexpr std::string_view kMetaTable = "secrets_meta";
constexpr std::string_view kKeyCheckRow = "key-check";
// Additional data of every secret row: this tag, then tool, revision, name and the grant, each
// after one NUL byte. Of the key-check row: its own tag.
constexpr std::string_view kSecretAadTag = "toolhost.secret.v1";
constexpr std::string_view kKeyCheckAad = "toolhost.secrets-key-check.v1";
constexpr std::string_view kKeyCheckPlaintext = "toolhost secrets key check v1";

constexpr std::size_t kKeyBytes = 32;
constexpr std::size_t kNonceBytes = 12;
constexpr std::size_t kTagBytes = 16;
// A key file is never this long; refusing early keeps stray large files out of memory.
constexpr std::size_t kMaxKeyFileBytes = 256;

using Nonce = std::array<unsigned char, kNonceBytes>;
using Tag = std::array<unsigned char, kTagBytes>;

template <class T>
using Result = boost::system::result<T, VaultError>;

VaultError error(VaultErrc code, std::string message) {
  return VaultError{code, std::move(message), {}};
}

// The way on when the key is gone for good.
constexpr const char* kLostKeyAdvice =
    ". If it is lost, nothing can read those secrets: `toolhostd --forget-secrets` (with this "
    "daemon's --state-dir or --config, while it is stopped) removes them and keeps the tools, "
    "decisions and storage; then set them again";

VaultError storageError(const store::Store& store, const boost::system::error_code& ec) {
  return VaultError{VaultErrc::storage, "the secrets table: " + store.describe(ec), ec};
}

std::string errnoText(int code) { return std::generic_category().message(code); }

// ---------------------------------------------------------------------------------------------
// base64 and hex (OpenSSL's block coder, strict about the alphabet and padding)

std::string base64Encode(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  const int written = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                      reinterpret_cast<const unsigned char*>(bytes.data()),
                                      static_cast<int>(bytes.size()));
  out.resize(static_cast<std::size_t>(std::max(written, 0)));
  return out;
}

bool isBase64Char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' ||
         c == '/';
}

std::optional<std::string> base64Decode(std::string_view text) {
  if (text.size() % 4 != 0) return std::nullopt;
  std::size_t padding = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '=') {
      if (i + 2 < text.size()) return std::nullopt;  // padding only in the last two places
      ++padding;
    } else if (padding > 0 || !isBase64Char(c)) {
      return std::nullopt;
    }
  }
  std::string out(text.size() / 4 * 3, '\0');
  const int written = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                      reinterpret_cast<const unsigned char*>(text.data()),
                                      static_cast<int>(text.size()));
  if (written < 0 || static_cast<std::size_t>(written) < padding) return std::nullopt;
  out.resize(static_cast<std::size_t>(written) - padding);
  return out;
}

int hexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// ---------------------------------------------------------------------------------------------
// AES-256-GCM

struct CipherContextDeleter {
  void operator()(EVP_CIPHER_CTX* context) const { EVP_CIPHER_CTX_free(context); }
};
using CipherContext = std::unique_ptr<EVP_CIPHER_CTX, CipherContextDeleter>;

struct Sealed {
  Nonce nonce{};
  std::string ciphertext;
  Tag tag{};
};

}  // namespace

// The key, in one page of its own: locked in memory where the system allows it (so it is not
// swapped out), left out of core dumps and of forked children, wiped and unmapped when the vault
// goes.
struct SecretsVault::Key {
  Key() {
    void* page =
        ::mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) throw std::bad_alloc();
    bytes = static_cast<unsigned char*>(page);
    locked = ::mlock(page, kPageBytes) == 0;  // best effort: RLIMIT_MEMLOCK may forbid it
    ::madvise(page, kPageBytes, MADV_DONTDUMP);
    ::madvise(page, kPageBytes, MADV_DONTFORK);
  }
  ~Key() {
    OPENSSL_cleanse(bytes, kPageBytes);
    if (locked) ::munlock(bytes, kPageBytes);
    ::munmap(bytes, kPageBytes);
  }
  Key(const Key&) = delete;
  Key& operator=(const Key&) = delete;

  static constexpr std::size_t kPageBytes = 4096;
  unsigned char* bytes = nullptr;
  bool locked = false;
};

namespace {

Result<Sealed> seal(const unsigned char* key, std::string_view aad, std::string_view plaintext) {
  Sealed out;
  if (RAND_bytes(out.nonce.data(), static_cast<int>(out.nonce.size())) != 1) {
    return error(VaultErrc::crypto, "the system gave no random bytes for a nonce");
  }
  CipherContext context(EVP_CIPHER_CTX_new());
  int length = 0;
  out.ciphertext.resize(plaintext.size());
  const bool ok =
      context &&
      EVP_EncryptInit_ex(context.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) == 1 &&
      EVP_CIPHER_CTX_ctrl(context.get(), EVP_CTRL_GCM_SET_IVLEN, kNonceBytes, nullptr) == 1 &&
      EVP_EncryptInit_ex(context.get(), nullptr, nullptr, key, out.nonce.data()) == 1 &&
      EVP_EncryptUpdate(context.get(), nullptr, &length,
                        reinterpret_cast<const unsigned char*>(aad.data()),
                        static_cast<int>(aad.size())) == 1 &&
      EVP_EncryptUpdate(context.get(), reinterpret_cast<unsigned char*>(out.ciphertext.data()),
                        &length, reinterpret_cast<const unsigned char*>(plaintext.data()),
                        static_cast<int>(plaintext.size())) == 1 &&
      static_cast<std::size_t>(length) == plaintext.size() &&
      EVP_EncryptFinal_ex(context.get(), nullptr, &length) == 1 &&
      EVP_CIPHER_CTX_ctrl(context.get(), EVP_CTRL_GCM_GET_TAG, kTagBytes, out.tag.data()) == 1;
  if (!ok) return error(VaultErrc::crypto, "AES-256-GCM encryption failed in OpenSSL");
  return out;
}

// The plaintext, or nullopt when the tag does not verify (wrong key, moved or edited row).
std::optional<SecretValue> unseal(const unsigned char* key, std::string_view aad,
                                  const Sealed& sealed) {
  CipherContext context(EVP_CIPHER_CTX_new());
  std::string plaintext(sealed.ciphertext.size(), '\0');
  int length = 0;
  Tag tag = sealed.tag;
  const bool ok =
      context &&
      EVP_DecryptInit_ex(context.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) == 1 &&
      EVP_CIPHER_CTX_ctrl(context.get(), EVP_CTRL_GCM_SET_IVLEN, kNonceBytes, nullptr) == 1 &&
      EVP_DecryptInit_ex(context.get(), nullptr, nullptr, key, sealed.nonce.data()) == 1 &&
      EVP_DecryptUpdate(context.get(), nullptr, &length,
                        reinterpret_cast<const unsigned char*>(aad.data()),
                        static_cast<int>(aad.size())) == 1 &&
      EVP_DecryptUpdate(context.get(), reinterpret_cast<unsigned char*>(plaintext.data()), &length,
                        reinterpret_cast<const unsigned char*>(sealed.ciphertext.data()),
                        static_cast<int>(sealed.ciphertext.size())) == 1 &&
      EVP_CIPHER_CTX_ctrl(context.get(), EVP_CTRL_GCM_SET_TAG, kTagBytes, tag.data()) == 1 &&
      EVP_DecryptFinal_ex(context.get(), nullptr, &length) == 1;
  SecretValue value(std::move(plaintext));  // wiped on every path
  if (!ok) return std::nullopt;
  return value;
}

// ---------------------------------------------------------------------------------------------
// rows

std::string rowKey(std::string_view tool, std::string_view revision, std::string_view name) {
  return store::compositeKey({tool, revision, name});
}

// What the ciphertext of a row is bound to: whoever edits the grant in the file (adds an origin,
// allows bodies, carries it) or moves the row makes it undecryptable.
std::string secretAad(const SecretRecord& record) {
  json::array origins;
  for (const auto& origin : record.origins) origins.emplace_back(origin);
  json::object grant{{"allowBody", record.allowBody},
                     {"carry", record.carry},
                     {"createdAt", record.createdAt},
                     {"origins", std::move(origins)}};
  // Rows from before the sequence have none in their AAD.
  if (record.sequence != 0) grant["sequence"] = record.sequence;
  std::string aad(kSecretAadTag);
  for (std::string_view part : {std::string_view(record.tool), std::string_view(record.revision),
                                std::string_view(record.name)}) {
    aad += '\0';
    aad += part;
  }
  aad += '\0';
  aad += protocol::writeJson(json::value(std::move(grant)));
  return aad;
}

json::object sealedJson(const Sealed& sealed) {
  return json::object{
      {"nonce", base64Encode(std::string_view(reinterpret_cast<const char*>(sealed.nonce.data()),
                                              sealed.nonce.size()))},
      {"ciphertext", base64Encode(sealed.ciphertext)},
      {"tag", base64Encode(std::string_view(reinterpret_cast<const char*>(sealed.tag.data()),
                                            sealed.tag.size()))}};
}

std::optional<Sealed> parseSealed(const json::object& row) {
  auto field = [&](std::string_view name) -> std::optional<std::string> {
    const auto* member = row.if_contains(name);
    if (member == nullptr || !member->is_string()) return std::nullopt;
    return base64Decode(member->get_string());
  };
  auto nonce = field("nonce");
  auto ciphertext = field("ciphertext");
  auto tag = field("tag");
  if (!nonce || !ciphertext || !tag || nonce->size() != kNonceBytes || tag->size() != kTagBytes) {
    return std::nullopt;
  }
  Sealed sealed;
  std::memcpy(sealed.nonce.data(), nonce->data(), kNonceBytes);
  std::memcpy(sealed.tag.data(), tag->data(), kTagBytes);
  sealed.ciphertext = std::move(*ciphertext);
  return sealed;
}

struct Row {
  SecretRecord record;
  Sealed sealed;
};

std::optional<Row> parseRow(std::string_view key, std::string_view value) {
  auto parts = store::trySplitCompositeKey(key, 3);
  if (!parts) return std::nullopt;
  auto parsed = protocol::parseJson(value);
  if (!parsed || !parsed->is_object()) return std::nullopt;
  const json::object& object = parsed->as_object();
  auto sealed = parseSealed(object);
  if (!sealed) return std::nullopt;
  Row row;
  row.record.tool = std::string((*parts)[0]);
  row.record.revision = std::string((*parts)[1]);
  row.record.name = std::string((*parts)[2]);
  const auto* origins = object.if_contains("origins");
  if (origins == nullptr || !origins->is_array()) return std::nullopt;
  for (const auto& origin : origins->get_array()) {
    if (!origin.is_string()) return std::nullopt;
    row.record.origins.emplace_back(origin.get_string());
  }
  auto flag = [&](std::string_view name) {
    const auto* member = object.if_contains(name);
    return member != nullptr && member->is_bool() && member->get_bool();
  };
  row.record.allowBody = flag("allowBody");
  row.record.carry = flag("carry");
  if (const auto* created = object.if_contains("createdAt"); created && created->is_string()) {
    row.record.createdAt = std::string(created->get_string());
  }
  if (const auto* sequence = object.if_contains("sequence")) {
    if (!sequence->is_uint64() && !(sequence->is_int64() && sequence->get_int64() >= 0)) {
      return std::nullopt;
    }
    row.record.sequence = sequence->to_number<std::uint64_t>();
  }
  row.sealed = std::move(*sealed);
  return row;
}

// Whether a was set after b: by sequence, and among rows from before the sequence by time.
bool newerThan(const SecretRecord& a, const SecretRecord& b) {
  if (a.sequence != b.sequence) return a.sequence > b.sequence;
  return a.createdAt > b.createdAt;
}

std::string rowValue(const SecretRecord& record, const Sealed& sealed) {
  json::object row = sealedJson(sealed);
  json::array origins;
  for (const auto& origin : record.origins) origins.emplace_back(origin);
  row["origins"] = std::move(origins);
  row["allowBody"] = record.allowBody;
  row["carry"] = record.carry;
  row["createdAt"] = record.createdAt;
  row["sequence"] = record.sequence;
  return protocol::writeJson(json::value(std::move(row)));
}

bool validPart(std::string_view part, std::size_t maxBytes) {
  return !part.empty() && part.size() <= maxBytes && part.find('\0') == std::string_view::npos;
}

std::optional<VaultError> checkNames(std::string_view tool, std::string_view revision,
                                     std::string_view name) {
  if (!validPart(tool, 64))
    return error(VaultErrc::invalidArgument,
                 "a tool name is 1 to 64 "
                 "characters without NUL");
  if (!validPart(revision, 128)) {
    return error(VaultErrc::invalidArgument, "a tool revision is 1 to 128 characters without NUL");
  }
  if (!isValidSecretName(name)) {
    return error(VaultErrc::invalidArgument,
                 "a secret name is letters, digits, '_' and '-', starting with a letter, at most "
                 "64 characters");
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// the key file

// 32 raw bytes, 64 hex characters, or 44 base64 characters; a trailing newline is allowed after
// the text forms. `text` is wiped by the caller.
std::optional<VaultError> parseKey(const std::string& text, unsigned char* out,
                                   const KeySource& source) {
  if (text.size() == kKeyBytes) {
    std::memcpy(out, text.data(), kKeyBytes);
    return std::nullopt;
  }
  std::string_view trimmed = text;
  if (trimmed.ends_with('\n')) trimmed.remove_suffix(1);
  if (trimmed.ends_with('\r')) trimmed.remove_suffix(1);
  if (trimmed.size() == 2 * kKeyBytes &&
      std::all_of(trimmed.begin(), trimmed.end(), [](char c) { return hexDigit(c) >= 0; })) {
    for (std::size_t i = 0; i < kKeyBytes; ++i) {
      out[i] =
          static_cast<unsigned char>(hexDigit(trimmed[2 * i]) * 16 + hexDigit(trimmed[2 * i + 1]));
    }
    return std::nullopt;
  }
  if (trimmed.size() == 44) {
    if (auto decoded = base64Decode(trimmed); decoded && decoded->size() == kKeyBytes) {
      std::memcpy(out, decoded->data(), kKeyBytes);
      OPENSSL_cleanse(decoded->data(), decoded->size());
      return std::nullopt;
    } else if (decoded) {
      OPENSSL_cleanse(decoded->data(), decoded->size());
    }
  }
  return error(VaultErrc::keyInvalid,
               "the secrets key " + source.path.string() + " (" + source.description + ") is " +
                   std::to_string(text.size()) +
                   " bytes that are not a key: it must hold exactly 32 raw bytes, 64 hex "
                   "characters, or 44 base64 characters (a trailing newline is allowed). If "
                   "secrets were stored with a key before, restore that one; else make one "
                   "with: head -c 32 /dev/urandom > " +
                   source.path.string());
}

std::optional<VaultError> readKey(const KeySource& source, unsigned char* out) {
  const std::string path = source.path.string();
  // A directory on the way that another user can write to (or a symbolic link through one)
  // lets that user put a key they know in place of this one.
  if (auto reason = protocol::untrustedPathReason(source.path)) {
    return error(VaultErrc::keyInvalid, "the secrets key " + path + " (" + source.description +
                                            ") cannot be trusted: " + *reason);
  }
  // Non-blocking: a FIFO in its place would otherwise hold the daemon's start forever; it is
  // refused below as not a regular file.
  const int fd = ::open(source.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    const int code = errno;
    return error(VaultErrc::keyInvalid, "cannot read the secrets key " + path + " (" +
                                            source.description + "): " + errnoText(code));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    return error(VaultErrc::keyInvalid,
                 "the secrets key " + path + " (" + source.description + ") is not a regular file");
  }
  if (info.st_uid != ::geteuid() && info.st_uid != 0) {
    ::close(fd);
    return error(VaultErrc::keyInvalid,
                 "the secrets key " + path + " (" + source.description + ") belongs to uid " +
                     std::to_string(info.st_uid) +
                     ", another user, who may know it; refusing a key this user does not own");
  }
  if ((info.st_mode & 0077) != 0) {
    spdlog::warn("the secrets key {} is accessible to other users (mode {:04o}); chmod 600 it",
                 path, info.st_mode & 07777);
  }
  std::array<char, kMaxKeyFileBytes + 1> buffer{};
  std::size_t size = 0;
  for (;;) {
    const ssize_t got = ::read(fd, buffer.data() + size, buffer.size() - size);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int code = errno;
      ::close(fd);
      OPENSSL_cleanse(buffer.data(), buffer.size());
      return error(VaultErrc::keyInvalid,
                   "cannot read the secrets key " + path + ": " + errnoText(code));
    }
    if (got == 0) break;
    size += static_cast<std::size_t>(got);
    if (size == buffer.size()) break;
  }
  ::close(fd);
  if (size > kMaxKeyFileBytes) {
    OPENSSL_cleanse(buffer.data(), buffer.size());
    return error(VaultErrc::keyInvalid,
                 "the secrets key " + path + " (" + source.description +
                     ") is too long to be a key: it must hold exactly 32 raw bytes, 64 hex "
                     "characters, or 44 base64 characters");
  }
  std::string text(buffer.data(), size);
  OPENSSL_cleanse(buffer.data(), buffer.size());
  auto invalid = parseKey(text, out, source);
  OPENSSL_cleanse(text.data(), text.size());
  return invalid;
}

bool writeAll(int fd, const unsigned char* bytes, std::size_t size) {
  while (size > 0) {
    const ssize_t put = ::write(fd, bytes, size);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    bytes += put;
    size -= static_cast<std::size_t>(put);
  }
  return true;
}

// Creates the key file atomically: 32 random bytes written to a temporary file (0600), synced,
// then linked to its name, which must not exist. `out` receives the key.
std::optional<VaultError> createKey(const KeySource& source, unsigned char* out) {
  const std::string path = source.path.string();
  // As readKey judges it: a key made where another user can replace it is theirs to read.
  if (auto reason = protocol::untrustedPathReason(source.path.parent_path())) {
    return error(VaultErrc::keyInvalid, "the secrets key " + path + " (" + source.description +
                                            ") cannot be trusted: " + *reason);
  }
  if (RAND_bytes(out, static_cast<int>(kKeyBytes)) != 1) {
    return error(VaultErrc::crypto, "the system gave no random bytes for a new secrets key");
  }
  const fs::path temporary = source.path.parent_path() / (source.path.filename().string() +
                                                          ".new-" + std::to_string(::getpid()));
  const int fd =
      ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    const int code = errno;
    return error(VaultErrc::keyIo,
                 "cannot create the secrets key " + path + ": " + errnoText(code));
  }
  const bool written = ::fchmod(fd, 0600) == 0 && writeAll(fd, out, kKeyBytes) && ::fsync(fd) == 0;
  const int writeErrno = errno;
  ::close(fd);
  if (!written) {
    ::unlink(temporary.c_str());
    return error(VaultErrc::keyIo,
                 "cannot write the secrets key " + path + ": " + errnoText(writeErrno));
  }
  if (::link(temporary.c_str(), source.path.c_str()) != 0) {
    const int code = errno;
    ::unlink(temporary.c_str());
    return error(VaultErrc::keyIo,
                 "cannot create the secrets key " + path + ": " + errnoText(code) +
                     (code == EEXIST ? " (another process made one meanwhile)" : ""));
  }
  ::unlink(temporary.c_str());
  const int dir = ::open(source.path.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  spdlog::info(
      "created a new secrets key {} (keep a copy: the stored secrets cannot be read "
      "without it)",
      path);
  return std::nullopt;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

bool isValidSecretName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  if (!((name[0] >= 'a' && name[0] <= 'z') || (name[0] >= 'A' && name[0] <= 'Z'))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

SecretValue::SecretValue(SecretValue&& other) noexcept : bytes_(std::move(other.bytes_)) {
  other.wipe();
}

SecretValue& SecretValue::operator=(SecretValue&& other) noexcept {
  if (this != &other) {
    wipe();
    bytes_ = std::move(other.bytes_);
    other.wipe();
  }
  return *this;
}

SecretValue::~SecretValue() { wipe(); }

void SecretValue::wipe() {
  // A moved-from std::string may keep its (short) buffer: wipe whatever it still holds.
  if (!bytes_.empty()) OPENSSL_cleanse(bytes_.data(), bytes_.size());
  bytes_.clear();
}

std::vector<std::string> SecretsVault::tables() {
  return {std::string(kSecretsTable), std::string(kMetaTable)};
}

SecretsVault::SecretsVault(store::Store& store, std::unique_ptr<Key> key, fs::path keyPath)
    : store_(store),
      secrets_(store.table(kSecretsTable)),
      meta_(store.table(kMetaTable)),
      key_(std::move(key)),
      keyPath_(std::move(keyPath)) {}

SecretsVault::~SecretsVault() = default;

Result<std::uint64_t> SecretsVault::forgetAll(store::Store& store) {
  const store::Table secrets = store.table(kSecretsTable);
  const store::Table meta = store.table(kMetaTable);
  auto removed = store.write([&](store::WriteTxn& txn) -> boost::system::result<std::uint64_t> {
    std::uint64_t count = 0;
    for (const auto table : {secrets, meta}) {
      std::vector<std::string> keys;
      txn.scan(table, store::KeyRange::all(), [&](std::string_view key, std::string_view) {
        keys.emplace_back(key);
        return true;
      });
      for (const auto& key : keys) txn.erase(table, key);
      if (table == secrets) count = keys.size();
    }
    return count;
  });
  if (!removed) return storageError(store, removed.error());
  return *removed;
}

Result<std::unique_ptr<SecretsVault>> SecretsVault::open(store::Store& store,
                                                         const KeySource& source) {
  const std::string path = source.path.string();
  const store::Table secrets = store.table(kSecretsTable);
  const store::Table meta = store.table(kMetaTable);

  // What the store holds: how many secrets, the key-check row, and the first secret (to check a
  // key against when an older store has secrets but no key-check row).
  struct Held {
    std::uint64_t secrets = 0;
    std::optional<std::string> keyCheck;
    std::optional<std::pair<std::string, std::string>> first;
  };
  auto held = store.read([&](store::ReadTxn& txn) {
    Held out;
    out.secrets = txn.count(secrets);
    out.keyCheck = txn.getCopy(meta, kKeyCheckRow);
    txn.scan(secrets, store::KeyRange::all(), [&](std::string_view key, std::string_view value) {
      out.first.emplace(std::string(key), std::string(value));
      return false;
    });
    return out;
  });
  if (!held) return storageError(store, held.error());

  auto key = std::make_unique<Key>();
  std::error_code ec;
  const auto status = fs::status(source.path, ec);
  const bool missing = !fs::exists(status);
  if (missing) {
    if (held->secrets > 0 || held->keyCheck) {
      return error(VaultErrc::keyMissing,
                   "the secrets key " + path +
                       " is missing; restore it (the stored secrets cannot be read without it)" +
                       kLostKeyAdvice);
    }
    if (!source.mayCreate) {
      return error(VaultErrc::keyMissing, "the secrets key " + path + " (" + source.description +
                                              ") is missing; provide it (32 random bytes, e.g. "
                                              "head -c 32 /dev/urandom)");
    }
    if (auto failed = createKey(source, key->bytes)) return *failed;
  } else if (auto invalid = readKey(source, key->bytes)) {
    return *invalid;
  }

  const VaultError mismatch =
      error(VaultErrc::keyMismatch,
            "the secrets key " + path +
                " does not match the one the secrets were stored with; restore that key (a "
                "backup of the file, or the credential it came from)" +
                kLostKeyAdvice);
  if (held->keyCheck) {
    auto parsed = protocol::parseJson(*held->keyCheck);
    auto sealed = parsed && parsed->is_object() ? parseSealed(parsed->as_object()) : std::nullopt;
    if (!sealed) return error(VaultErrc::corrupt, "the secrets key-check row is unreadable");
    auto plain = unseal(key->bytes, kKeyCheckAad, *sealed);
    if (!plain || plain->view() != kKeyCheckPlaintext) return mismatch;
    return std::unique_ptr<SecretsVault>(new SecretsVault(store, std::move(key), source.path));
  }
  if (held->first) {
    auto row = parseRow(held->first->first, held->first->second);
    if (!row || !unseal(key->bytes, secretAad(row->record), row->sealed)) return mismatch;
  }
  // First use of this key with this store: remember it, so a different key is caught at start.
  auto sealed = seal(key->bytes, kKeyCheckAad, kKeyCheckPlaintext);
  if (!sealed) return sealed.error();
  const std::string row = protocol::writeJson(json::value(sealedJson(*sealed)));
  auto written = store.write([&](store::WriteTxn& txn) -> boost::system::result<void> {
    txn.putIfAbsent(meta, kKeyCheckRow, row);
    return {};
  });
  if (!written) return storageError(store, written.error());
  return std::unique_ptr<SecretsVault>(new SecretsVault(store, std::move(key), source.path));
}

Result<SecretRecord> SecretsVault::set(const SecretGrant& grant, std::string_view value) {
  if (auto invalid = checkNames(grant.tool, grant.revision, grant.name)) return *invalid;
  if (value.empty() || value.size() > kMaxSecretValueBytes) {
    return error(VaultErrc::invalidArgument,
                 "a secret value is 1 to " + std::to_string(kMaxSecretValueBytes) + " bytes");
  }
  SecretRecord record;
  record.tool = grant.tool;
  record.revision = grant.revision;
  record.name = grant.name;
  record.origins = grant.origins;
  std::sort(record.origins.begin(), record.origins.end());
  record.origins.erase(std::unique(record.origins.begin(), record.origins.end()),
                       record.origins.end());
  if (record.origins.empty() || record.origins.size() > kMaxSecretOrigins) {
    return error(VaultErrc::invalidArgument,
                 "a secret is granted to 1 to " + std::to_string(kMaxSecretOrigins) + " origins");
  }
  for (const auto& origin : record.origins) {
    if (origin.empty() || origin.size() > 2048 ||
        std::any_of(origin.begin(), origin.end(),
                    [](char c) { return static_cast<unsigned char>(c) < 0x20; })) {
      return error(VaultErrc::invalidArgument, "an origin is a line of text up to 2048 bytes");
    }
  }
  record.allowBody = grant.allowBody;
  record.carry = grant.carry;
  record.createdAt = formatTime(std::chrono::system_clock::now());
  std::optional<VaultError> failed;
  auto written = store_.write([&](store::WriteTxn& txn) -> boost::system::result<bool> {
    std::uint64_t newest = 0;
    txn.scan(secrets_, store::KeyRange::prefix(store::compositePrefix({record.tool})),
             [&](std::string_view key, std::string_view stored) {
               if (auto row = parseRow(key, stored)) {
                 newest = std::max(newest, row->record.sequence);
               }
             });
    record.sequence = newest + 1;
    auto sealed = seal(key_->bytes, secretAad(record), value);
    if (!sealed) {
      failed = sealed.error();
      return false;
    }
    txn.put(secrets_, rowKey(record.tool, record.revision, record.name), rowValue(record, *sealed));
    return true;
  });
  if (!written) return storageError(store_, written.error());
  if (failed) return *failed;
  return record;
}

Result<std::vector<SecretRecord>> SecretsVault::list(const std::optional<std::string>& tool) const {
  if (tool && !validPart(*tool, 64)) return std::vector<SecretRecord>{};
  auto range =
      tool ? store::KeyRange::prefix(store::compositePrefix({*tool})) : store::KeyRange::all();
  auto rows = store_.read([&](store::ReadTxn& txn) {
    std::vector<SecretRecord> out;
    txn.scan(secrets_, range, [&](std::string_view key, std::string_view value) {
      if (auto row = parseRow(key, value)) {
        out.push_back(std::move(row->record));
      } else {
        spdlog::warn("secrets: an unreadable row ({} bytes of key) is skipped", key.size());
      }
    });
    return out;
  });
  if (!rows) return storageError(store_, rows.error());
  return std::move(*rows);
}

Result<bool> SecretsVault::erase(const std::string& tool, const std::string& revision,
                                 const std::string& name) {
  if (auto invalid = checkNames(tool, revision, name)) return *invalid;
  auto erased = store_.write([&](store::WriteTxn& txn) -> boost::system::result<bool> {
    return txn.erase(secrets_, rowKey(tool, revision, name));
  });
  if (!erased) return storageError(store_, erased.error());
  return *erased;
}

Result<std::optional<ResolvedSecret>> SecretsVault::tryResolve(
    const std::string& tool, const std::string& revision, const std::string& name,
    const std::vector<std::string>& installedBefore) const {
  if (auto invalid = checkNames(tool, revision, name)) return *invalid;
  auto found = store_.read([&](store::ReadTxn& txn) -> std::optional<ResolvedSecret> {
    const std::string own = rowKey(tool, revision, name);
    if (auto value = txn.tryGet(secrets_, own)) {
      if (auto row = parseRow(own, *value)) {
        return ResolvedSecret{std::move(row->record), Resolution::own};
      }
      spdlog::warn("secrets: the row of {} for {} of {} is unreadable", name, revision, tool);
      return std::nullopt;
    }
    // The most recently set row of an earlier revision that carries.
    std::optional<ResolvedSecret> best;
    if (installedBefore.empty()) return best;
    txn.scan(secrets_, store::KeyRange::prefix(store::compositePrefix({tool})),
             [&](std::string_view key, std::string_view value) {
               auto parts = store::trySplitCompositeKey(key, 3);
               if (!parts || (*parts)[2] != name) return;
               if (std::find(installedBefore.begin(), installedBefore.end(), (*parts)[1]) ==
                   installedBefore.end()) {
                 return;
               }
               auto row = parseRow(key, value);
               if (!row || !row->record.carry) return;
               if (!best || newerThan(row->record, best->record)) {
                 best = ResolvedSecret{std::move(row->record), Resolution::carried};
               }
             });
    return best;
  });
  if (!found) return storageError(store_, found.error());
  return std::move(*found);
}

Result<std::optional<RevealedSecret>> SecretsVault::reveal(const std::string& tool,
                                                           const std::string& revision,
                                                           const std::string& name) const {
  if (auto invalid = checkNames(tool, revision, name)) return *invalid;
  const std::string key = rowKey(tool, revision, name);
  auto stored = store_.read([&](store::ReadTxn& txn) { return txn.getCopy(secrets_, key); });
  if (!stored) return storageError(store_, stored.error());
  if (!*stored) return std::optional<RevealedSecret>();
  auto row = parseRow(key, **stored);
  if (!row) {
    return error(VaultErrc::corrupt,
                 "the stored secret " + name + " of " + tool + " (" + revision + ") is unreadable");
  }
  auto value = unseal(key_->bytes, secretAad(row->record), row->sealed);
  if (!value) {
    return error(VaultErrc::corrupt,
                 "the stored secret " + name + " of " + tool + " (" + revision +
                     ") does not decrypt: it was moved or edited in the database; set it again");
  }
  return std::optional<RevealedSecret>(RevealedSecret{std::move(row->record), std::move(*value)});
}

}  // namespace toolhost::policy
