// The secrets vault in process: a round trip, carry resolution, a fresh nonce per write, rows
// bound to their key and grant (a moved or edited row does not decrypt), the key file (created
// 0600 only when nothing is stored, each accepted format, malformed ones refused), a wrong or
// missing key refused at open with nothing written, and no value in the LMDB file.
#include "policy/secrets_vault.h"
#include "protocol/json_parse.h"
#include "protocol/json_text.h"
#include "store/store.h"
#include "tests/support/catch_result.h"
#include "tests/support/temp_dir.h"

#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>


namespace fs = std::filesystem;
namespace json = boost::json;
using namespace toolhost::policy;
using toolhost::store::Store;
using toolhost::store::StorePtr;

namespace {

const std::string kRevA = "sha256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
const std::string kRevB = "sha256:BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB";
const std::string kRevC = "sha256:CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCC";
const std::string kRevD = "sha256:DDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDD";
const std::string kValue = "sk-live-9f8e7d6c5b4a-THE-VALUE";

using toolhost::testing::TempDir;

StorePtr openStore(const fs::path& stateDir) {
  toolhost::store::Options options;
  options.stateDir = stateDir;
  options.tables = SecretsVault::tables();
  auto store = Store::open(options);
  if (!store) FAIL("open failed: " << store.error().message);
  return std::move(*store);
}

std::string readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void writeFile(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

KeySource keyAt(const fs::path& path, bool mayCreate = true) {
  return KeySource{path, mayCreate, "the test key"};
}

SecretGrant grant(const std::string& revision = kRevA, const std::string& name = "api_key",
                  bool carry = false) {
  SecretGrant out;
  out.tool = "weather";
  out.revision = revision;
  out.name = name;
  out.origins = {"https://b.example", "https://a.example", "https://b.example"};
  out.carry = carry;
  return out;
}

template <class T>
T valueOf(boost::system::result<T, VaultError> result) {
  if (!result) FAIL("unexpected vault error: " << result.error().message);
  return std::move(*result);
}

// A store and a vault on it, with the key at <dir>/state/secrets.key unless told otherwise.
struct World {
  explicit World(const fs::path& stateDir, std::optional<KeySource> key = std::nullopt)
      : store(openStore(stateDir)),
        vault(valueOf(SecretsVault::open(*store, key.value_or(keyAt(stateDir / "secrets.key"))))) {}
  StorePtr store;
  std::unique_ptr<SecretsVault> vault;
};

std::string reveal(SecretsVault& vault, const std::string& revision = kRevA,
                   const std::string& name = "api_key") {
  auto revealed = valueOf(vault.reveal("weather", revision, name));
  REQUIRE(revealed.has_value());
  return std::string(revealed->value.view());
}

VaultError openError(const fs::path& stateDir, const KeySource& key) {
  auto store = openStore(stateDir);
  auto vault = SecretsVault::open(*store, key);
  REQUIRE_FALSE(vault);
  return vault.error();
}

std::string hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

std::string base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                  reinterpret_cast<const unsigned char*>(bytes.data()),
                  static_cast<int>(bytes.size()));
  return out;
}

}  // namespace

TEST_CASE("vault: a secret round-trips, lists never hold values, origins are sorted", "[vault]") {
  TempDir dir;
  World w(dir.state());
  auto stored = valueOf(w.vault->set(grant(), kValue));
  CHECK(stored.tool == "weather");
  CHECK(stored.revision == kRevA);
  CHECK(stored.origins == std::vector<std::string>{"https://a.example", "https://b.example"});
  CHECK_FALSE(stored.createdAt.empty());
  CHECK(reveal(*w.vault) == kValue);

  auto listed = valueOf(w.vault->list(std::nullopt));
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].name == "api_key");
  CHECK(listed[0].origins == stored.origins);
  CHECK(valueOf(w.vault->list(std::string("weather"))).size() == 1);
  CHECK(valueOf(w.vault->list(std::string("other"))).empty());

  // Replacing keeps one row; deleting removes it.
  valueOf(w.vault->set(grant(), "second value"));
  CHECK(reveal(*w.vault) == "second value");
  CHECK(valueOf(w.vault->list(std::nullopt)).size() == 1);
  CHECK(valueOf(w.vault->erase("weather", kRevA, "api_key")) == true);
  CHECK(valueOf(w.vault->erase("weather", kRevA, "api_key")) == false);
  CHECK_FALSE(valueOf(w.vault->reveal("weather", kRevA, "api_key")).has_value());

  // Values are bounded; names are checked.
  CHECK(w.vault->set(grant(), "").error().code == VaultErrc::invalidArgument);
  CHECK(w.vault->set(grant(), std::string(kMaxSecretValueBytes + 1, 'x')).error().code ==
        VaultErrc::invalidArgument);
  CHECK(w.vault->set(grant(kRevA, "1bad"), kValue).error().code == VaultErrc::invalidArgument);
  auto noOrigins = grant();
  noOrigins.origins.clear();
  CHECK(w.vault->set(noOrigins, kValue).error().code == VaultErrc::invalidArgument);
}

TEST_CASE(
    "vault: a revision resolves its own secret, else the newest carried one of an earlier revision",
    "[vault]") {
  TempDir dir;
  World w(dir.state());
  // Installed in the order A, C, B, D: A and C carry to B, nothing carries to A.
  const std::vector<std::string> beforeB{kRevA, kRevC};
  CHECK_FALSE(valueOf(w.vault->tryResolve("weather", kRevB, "api_key", beforeB)).has_value());
  valueOf(w.vault->set(grant(kRevA, "api_key", false), "from A"));
  // Without carry, another revision does not see it.
  CHECK_FALSE(valueOf(w.vault->tryResolve("weather", kRevB, "api_key", beforeB)).has_value());
  valueOf(w.vault->set(grant(kRevA, "api_key", true), "from A"));
  auto carried = valueOf(w.vault->tryResolve("weather", kRevB, "api_key", beforeB));
  REQUIRE(carried.has_value());
  CHECK(carried->resolution == Resolution::carried);
  CHECK(carried->record.revision == kRevA);
  // The most recently set carried row wins, also within one millisecond and against the order
  // of the keys (C after A, then A after C, then C again).
  valueOf(w.vault->set(grant(kRevC, "api_key", true), "from C"));
  for (int round = 0; round < 20; ++round) {
    valueOf(w.vault->set(grant(kRevA, "api_key", true), "from A"));
    carried = valueOf(w.vault->tryResolve("weather", kRevB, "api_key", beforeB));
    REQUIRE(carried.has_value());
    CHECK(carried->record.revision == kRevA);
    valueOf(w.vault->set(grant(kRevC, "api_key", true), "from C"));
    carried = valueOf(w.vault->tryResolve("weather", kRevB, "api_key", beforeB));
    REQUIRE(carried.has_value());
    CHECK(carried->record.revision == kRevC);
  }
  carried = valueOf(w.vault->tryResolve("weather", kRevB, "api_key", beforeB));
  REQUIRE(carried.has_value());
  CHECK(carried->record.revision == kRevC);
  // A row carried by a revision installed later reaches no earlier one: set on D, the newest
  // row, it does not reach B; and nothing reaches A, the first.
  valueOf(w.vault->set(grant(kRevD, "api_key", true), "from D"));
  carried = valueOf(w.vault->tryResolve("weather", kRevB, "api_key", beforeB));
  REQUIRE(carried.has_value());
  CHECK(carried->record.revision == kRevC);
  valueOf(w.vault->erase("weather", kRevA, "api_key"));
  CHECK_FALSE(valueOf(w.vault->tryResolve("weather", kRevA, "api_key", {})).has_value());
  // A row of its own comes first.
  valueOf(w.vault->set(grant(kRevB, "api_key", false), "from B"));
  auto own = valueOf(w.vault->tryResolve("weather", kRevB, "api_key", beforeB));
  REQUIRE(own.has_value());
  CHECK(own->resolution == Resolution::own);
  CHECK(reveal(*w.vault, own->record.revision) == "from B");
  // Other names and other tools never resolve.
  CHECK_FALSE(valueOf(w.vault->tryResolve("weather", kRevB, "other", beforeB)).has_value());
  CHECK_FALSE(valueOf(w.vault->tryResolve("weathe", kRevB, "api_key", beforeB)).has_value());
}

TEST_CASE("vault: every write takes a fresh nonce, the LMDB file holds no value", "[vault]") {
  TempDir dir;
  {
    World w(dir.state());
    valueOf(w.vault->set(grant(kRevA), kValue));
    valueOf(w.vault->set(grant(kRevB), kValue));
    auto rows = w.store->read([&](toolhost::store::ReadTxn& txn) {
      std::vector<std::string> out;
      txn.scan(w.store->table("secrets"), toolhost::store::KeyRange::all(),
               [&](std::string_view, std::string_view value) { out.emplace_back(value); });
      return out;
    });
    REQUIRE(rows);
    REQUIRE(rows->size() == 2);
    auto a = toolhost::protocol::parseJson((*rows)[0])->as_object();
    auto b = toolhost::protocol::parseJson((*rows)[1])->as_object();
    CHECK(a.at("nonce") != b.at("nonce"));
    CHECK(a.at("ciphertext") != b.at("ciphertext"));
    CHECK(a.at("nonce").as_string().size() == 16);  // 12 bytes
    CHECK(a.at("tag").as_string().size() == 24);    // 16 bytes
    // Setting the same value again under the same key takes a new nonce too.
    const auto secrets = w.store->table("secrets");
    const std::string keyA = toolhost::store::compositeKey({"weather", kRevA, "api_key"});
    auto rowA = [&] {
      auto row =
          w.store->read([&](toolhost::store::ReadTxn& txn) { return txn.getCopy(secrets, keyA); });
      REQUIRE(row);
      REQUIRE(row->has_value());
      return toolhost::protocol::parseJson(**row)->as_object().at("nonce");
    };
    const auto first = rowA();
    valueOf(w.vault->set(grant(kRevA), kValue));
    CHECK(rowA() != first);
  }
  const std::string data = readFile(dir.state() / "db" / "data.mdb");
  REQUIRE(data.size() > 0);
  CHECK(data.find(kValue) == std::string::npos);
  CHECK(data.find(base64(kValue)) == std::string::npos);
  CHECK(data.find("https://a.example") != std::string::npos);  // the grant is not secret
}

TEST_CASE("vault: a row moved to another key, or whose grant was edited, does not decrypt",
          "[vault]") {
  TempDir dir;
  World w(dir.state());
  valueOf(w.vault->set(grant(kRevA), kValue));
  const auto secrets = w.store->table("secrets");
  const std::string keyA = toolhost::store::compositeKey({"weather", kRevA, "api_key"});
  const std::string keyB = toolhost::store::compositeKey({"weather", kRevB, "api_key"});
  const std::string keyOther = toolhost::store::compositeKey({"other", kRevA, "api_key"});
  auto row =
      w.store->read([&](toolhost::store::ReadTxn& txn) { return txn.getCopy(secrets, keyA); });
  REQUIRE(row);
  REQUIRE(row->has_value());
  auto copied = w.store->write([&](toolhost::store::WriteTxn& txn) -> boost::system::result<void> {
    txn.put(secrets, keyB, **row);
    txn.put(secrets, keyOther, **row);
    return {};
  });
  REQUIRE(copied);
  for (const auto& [tool, revision] : {std::pair{"weather", kRevB}, std::pair{"other", kRevA}}) {
    auto moved = w.vault->reveal(tool, revision, "api_key");
    REQUIRE_FALSE(moved);
    CHECK(moved.error().code == VaultErrc::corrupt);
    CHECK(moved.error().message.find(kValue) == std::string::npos);
  }

  // Someone with write access to the file grants the secret to their own origin.
  auto edited = toolhost::protocol::parseJson(**row)->as_object();
  edited["origins"] = json::array{"https://a.example", "https://attacker.example"};
  auto rewritten =
      w.store->write([&](toolhost::store::WriteTxn& txn) -> boost::system::result<void> {
        txn.put(secrets, keyA, toolhost::protocol::writeJson(json::value(edited)));
        return {};
      });
  REQUIRE(rewritten);
  auto tampered = w.vault->reveal("weather", kRevA, "api_key");
  REQUIRE_FALSE(tampered);
  CHECK(tampered.error().code == VaultErrc::corrupt);
  edited = toolhost::protocol::parseJson(**row)->as_object();
  edited["allowBody"] = true;
  REQUIRE(w.store->write([&](toolhost::store::WriteTxn& txn) -> boost::system::result<void> {
    txn.put(secrets, keyA, toolhost::protocol::writeJson(json::value(edited)));
    return {};
  }));
  CHECK(w.vault->reveal("weather", kRevA, "api_key").error().code == VaultErrc::corrupt);
}

TEST_CASE("vault: the key file is created 0600 only when nothing is stored", "[vault][key]") {
  TempDir dir;
  const fs::path keyFile = dir.state() / "secrets.key";
  {
    World w(dir.state());
    struct stat info {};
    REQUIRE(::stat(keyFile.c_str(), &info) == 0);
    CHECK((info.st_mode & 07777) == 0600);
    CHECK(info.st_size == 32);
    valueOf(w.vault->set(grant(), kValue));
  }
  const std::string key = readFile(keyFile);
  {
    // Reopened with the same key: the value reads back.
    World w(dir.state());
    CHECK(readFile(keyFile) == key);
    CHECK(reveal(*w.vault) == kValue);
  }

  SECTION("missing while secrets exist: refused, nothing created or written") {
    fs::remove(keyFile);
    const std::string before = readFile(dir.state() / "db" / "data.mdb");
    auto failed = openError(dir.state(), keyAt(keyFile));
    CHECK(failed.code == VaultErrc::keyMissing);
    CHECK_THAT(failed.message, Catch::StartsWith("the secrets key " + keyFile.string() +
                                                 " is missing; restore it (the stored secrets "
                                                 "cannot be read without it)") &&
                                   Catch::Contains("toolhostd --forget-secrets"));
    CHECK_FALSE(fs::exists(keyFile));
    CHECK(readFile(dir.state() / "db" / "data.mdb") == before);
  }
  SECTION("missing with only the key-check row left: still refused") {
    {
      World w(dir.state());
      valueOf(w.vault->erase("weather", kRevA, "api_key"));
    }
    fs::remove(keyFile);
    CHECK(openError(dir.state(), keyAt(keyFile)).code == VaultErrc::keyMissing);
    CHECK_FALSE(fs::exists(keyFile));
  }
  SECTION("a different key: refused, nothing written") {
    writeFile(keyFile, std::string(32, 'k'));
    const std::string before = readFile(dir.state() / "db" / "data.mdb");
    auto failed = openError(dir.state(), keyAt(keyFile));
    CHECK(failed.code == VaultErrc::keyMismatch);
    CHECK_THAT(failed.message, Catch::StartsWith("the secrets key " + keyFile.string() +
                                                 " does not match the one the secrets were "
                                                 "stored with; restore that key") &&
                                   Catch::Contains("toolhostd --forget-secrets"));
    CHECK(readFile(dir.state() / "db" / "data.mdb") == before);
    CHECK(readFile(keyFile) == std::string(32, 'k'));
  }
}

TEST_CASE("vault: a credential that must exist is never created", "[vault][key]") {
  TempDir dir;
  const fs::path credential = dir.path() / "credentials" / "toolhost.key";
  auto failed = openError(dir.state(), keyAt(credential, false));
  CHECK(failed.code == VaultErrc::keyMissing);
  CHECK_THAT(failed.message, Catch::Contains(credential.string()));
  CHECK_FALSE(fs::exists(credential));
}

TEST_CASE("vault: keys as 32 raw bytes, 64 hex or 44 base64 characters, others refused",
          "[vault][key]") {
  TempDir dir;
  std::string raw;
  for (int i = 0; i < 32; ++i) raw += static_cast<char>(i * 7 + 3);
  raw[5] = '\n';  // a raw key may hold any byte, a newline too
  const fs::path keyFile = dir.path() / "toolhost.key";
  writeFile(keyFile, raw);
  {
    World w(dir.state(), keyAt(keyFile, false));
    valueOf(w.vault->set(grant(), kValue));
  }
  // The same key in every accepted spelling opens the same secrets.
  for (const std::string& spelling :
       {raw, hex(raw), hex(raw) + "\n", base64(raw), base64(raw) + "\n", base64(raw) + "\r\n"}) {
    INFO(spelling.size() << " bytes");
    writeFile(keyFile, spelling);
    World w(dir.state(), keyAt(keyFile, false));
    CHECK(reveal(*w.vault) == kValue);
  }
  std::string upper = hex(raw);
  for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  writeFile(keyFile, upper);
  {
    World w(dir.state(), keyAt(keyFile, false));
    CHECK(reveal(*w.vault) == kValue);
  }

  for (const std::string& bad :
       {std::string(), raw.substr(0, 31), raw + "\n", hex(raw).substr(0, 63), hex(raw) + "0",
        "g" + hex(raw).substr(1), base64(raw.substr(0, 31)), base64(raw).substr(0, 43) + "!",
        std::string(300, 'a'), hex(raw) + "\n\n"}) {
    INFO(bad.size() << " bytes");
    writeFile(keyFile, bad);
    auto failed = openError(dir.state(), keyAt(keyFile, false));
    CHECK(failed.code == VaultErrc::keyInvalid);
    CHECK_THAT(failed.message, Catch::Contains(keyFile.string()));
    CHECK_THAT(failed.message, Catch::Contains("32 raw bytes, 64 hex characters, or 44 base64"));
  }
}

TEST_CASE("vault: a store with secrets but no key-check row checks the key on a secret",
          "[vault][key]") {
  TempDir dir;
  const fs::path keyFile = dir.state() / "secrets.key";
  {
    World w(dir.state());
    valueOf(w.vault->set(grant(), kValue));
    REQUIRE(w.store->write([&](toolhost::store::WriteTxn& txn) -> boost::system::result<void> {
      txn.erase(w.store->table("secrets_meta"), "key-check");
      return {};
    }));
  }
  const std::string key = readFile(keyFile);
  writeFile(keyFile, std::string(32, 'w'));
  CHECK(openError(dir.state(), keyAt(keyFile)).code == VaultErrc::keyMismatch);
  writeFile(keyFile, key);
  World w(dir.state());
  CHECK(reveal(*w.vault) == kValue);
}

TEST_CASE("vault: a key in a place others can change, or not a file, is refused at once",
          "[vault][key]") {
  TempDir dir;
  std::string raw(32, 'k');
  // Another user could swap a key in a directory everyone may write to.
  const fs::path shared = dir.path() / "shared";
  fs::create_directory(shared);
  fs::permissions(shared, fs::perms::all);  // 0777, no sticky bit
  writeFile(shared / "toolhost.key", raw);
  auto untrusted = openError(dir.state(), keyAt(shared / "toolhost.key", false));
  CHECK(untrusted.code == VaultErrc::keyInvalid);
  CHECK_THAT(untrusted.message, Catch::Contains("cannot be trusted"));
  // Nor is one made there on a first start.
  auto notMade = openError(dir.state(), keyAt(shared / "new.key", true));
  CHECK(notMade.code == VaultErrc::keyInvalid);
  CHECK_THAT(notMade.message, Catch::Contains("cannot be trusted"));
  CHECK_FALSE(fs::exists(shared / "new.key"));
  // A FIFO in the key's place: refused without waiting for a writer.
  const fs::path fifo = dir.path() / "fifo.key";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto notFile = openError(dir.state(), keyAt(fifo, false));
  CHECK(notFile.code == VaultErrc::keyInvalid);
  CHECK_THAT(notFile.message, Catch::Contains("not a regular file"));
}
