// protocol::untrustedPathReason: what other users could change, on real directories.
#include "protocol/path_trust.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace fs = std::filesystem;
using toolhost::protocol::untrustedPathReason;

namespace {

struct Dir {
  Dir() {
    std::string pattern = (fs::temp_directory_path() / "th-trust-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~Dir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  fs::path path;
};

}  // namespace

TEST_CASE("a path of our own and root's directories is trusted, also where it does not exist yet",
          "[path-trust]") {
  Dir dir;
  CHECK_FALSE(untrustedPathReason(dir.path));
  CHECK_FALSE(untrustedPathReason(dir.path / "not/yet/made"));
  CHECK_FALSE(untrustedPathReason("/"));
  // /tmp may be written by everyone, but its sticky bit keeps others from replacing our entries.
  CHECK_FALSE(untrustedPathReason(fs::temp_directory_path()));
}

TEST_CASE("a directory others may write to without a sticky bit is not trusted", "[path-trust]") {
  Dir dir;
  const fs::path open = dir.path / "open";
  fs::create_directory(open);
  REQUIRE(::chmod(open.c_str(), 0777) == 0);
  auto reason = untrustedPathReason(open / "toolhost.sock");
  REQUIRE(reason);
  CHECK_THAT(*reason, Catch::Contains(open.string()) && Catch::Contains("0777"));
  REQUIRE(::chmod(open.c_str(), 01777) == 0);
  CHECK_FALSE(untrustedPathReason(open / "toolhost.sock"));
  if (::geteuid() == 0) {
    // Writable by a group that is not the user's own private group.
    REQUIRE(::chown(open.c_str(), 0, 65534) == 0);
    REQUIRE(::chmod(open.c_str(), 0770) == 0);
    CHECK(untrustedPathReason(open));
  }
}

TEST_CASE("directories are made with their mode whatever the umask, then judged again",
          "[path-trust]") {
  Dir dir;
  const mode_t previous = ::umask(002);
  auto made = toolhost::protocol::makeTrustedDirectories(dir.path / "a/b/c", 0700);
  ::umask(previous);
  REQUIRE(made);
  CHECK(*made);
  for (const char* part : {"a", "a/b", "a/b/c"}) {
    INFO(part);
    struct stat st {};
    REQUIRE(::stat((dir.path / part).c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0700);
  }
  CHECK_FALSE(untrustedPathReason(dir.path / "a/b/c"));
  auto again = toolhost::protocol::makeTrustedDirectories(dir.path / "a/b/c", 0700);
  REQUIRE(again);
  CHECK_FALSE(*again);  // nothing was missing
  // A directory others may write to is refused, made or not.
  REQUIRE(::chmod((dir.path / "a/b").c_str(), 0777) == 0);
  auto refused = toolhost::protocol::makeTrustedDirectories(dir.path / "a/b/d", 0700);
  REQUIRE_FALSE(refused);
  CHECK_THAT(refused.error(), Catch::Contains("0777"));
  CHECK_FALSE(fs::exists(dir.path / "a/b/d"));
}

TEST_CASE("a directory, file or symbolic link of another user is not trusted", "[path-trust]") {
  if (::geteuid() != 0) {
    WARN("needs root to give a directory to another uid; skipped");
    return;
  }
  Dir dir;
  const fs::path theirs = dir.path / "theirs";
  fs::create_directory(theirs);
  REQUIRE(::chmod(theirs.c_str(), 0700) == 0);
  REQUIRE(::chown(theirs.c_str(), 65534, 65534) == 0);
  auto reason = untrustedPathReason(theirs / "state");
  REQUIRE(reason);
  CHECK_THAT(*reason, Catch::Contains("uid 65534"));

  // A link of theirs could be pointed elsewhere at any time, wherever it points now.
  const fs::path link = dir.path / "link";
  fs::create_directory_symlink(dir.path, link);
  REQUIRE(::lchown(link.c_str(), 65534, 65534) == 0);
  CHECK(untrustedPathReason(link / "x"));
  // A link of ours into their directory is judged where it leads.
  const fs::path ours = dir.path / "ours";
  fs::create_directory_symlink(theirs, ours);
  CHECK(untrustedPathReason(ours / "x"));
  // "link/.." is where the link leads, then up: not the directory the link is in.
  fs::create_directory(theirs / "sub");
  REQUIRE(::chown((theirs / "sub").c_str(), 65534, 65534) == 0);
  const fs::path down = dir.path / "down";
  fs::create_directory_symlink(theirs / "sub", down);
  auto upThroughLink = untrustedPathReason(down / ".." / "state");
  REQUIRE(upThroughLink);
  CHECK_THAT(*upThroughLink, Catch::Contains("uid 65534"));
  // And a link straight to their directory: "link/.." is ours, but the walk passes through
  // theirs, which they could swap for a link of their own.
  const fs::path across = dir.path / "across";
  fs::create_directory_symlink(theirs, across);
  auto throughTheirs = untrustedPathReason(across / ".." / "state");
  REQUIRE(throughTheirs);
  CHECK_THAT(*throughTheirs, Catch::Contains("uid 65534"));
  // A chain through a link of theirs, even one that leads back to our own directory: they can
  // point it elsewhere at any time.
  fs::create_directory(dir.path / "real");
  const fs::path theirLink = dir.path / "their-link";
  fs::create_directory_symlink(dir.path / "real", theirLink);
  REQUIRE(::lchown(theirLink.c_str(), 65534, 65534) == 0);
  const fs::path chain = dir.path / "chain";
  fs::create_directory_symlink(theirLink, chain);
  for (const fs::path& through : {chain / "state", chain / ".." / "state"}) {
    INFO(through);
    auto viaTheirLink = untrustedPathReason(through);
    REQUIRE(viaTheirLink);
    CHECK_THAT(*viaTheirLink, Catch::Contains(theirLink.string() + " belongs to uid 65534"));
  }
}
