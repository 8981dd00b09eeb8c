#include "protocol/path_trust.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace toolhost::protocol {
namespace fs = std::filesystem;

namespace {

std::string modeText(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

// Whether `gid` is the effective user's own private group: the user's primary group, named
// after the user, with no other members listed (the user private groups Debian makes), so that
// a directory writable by it (umask 002) is writable by nobody else.
bool ownPrivateGroup(gid_t gid) {
  if (gid != ::getegid()) return false;
  std::vector<char> buffer(16384);
  passwd user{};
  passwd* foundUser = nullptr;
  if (::getpwuid_r(::geteuid(), &user, buffer.data(), buffer.size(), &foundUser) != 0 ||
      foundUser == nullptr) {
    return false;
  }
  const std::string name = user.pw_name;
  group entry{};
  group* foundGroup = nullptr;
  if (::getgrgid_r(gid, &entry, buffer.data(), buffer.size(), &foundGroup) != 0 ||
      foundGroup == nullptr || name != entry.gr_name) {
    return false;
  }
  for (char** member = entry.gr_mem; member != nullptr && *member != nullptr; ++member) {
    if (name != *member) return false;
  }
  return true;
}

// The most links one judgment follows, as the kernel's own limit.
constexpr int kMaxLinks = 40;

// Why the components of the absolute `path` cannot be trusted; stops at the first that does not
// exist. Each prefix is looked up as written, so "link/.." is judged where the link leads.
// `links` counts the links followed so far.
std::optional<std::string> judge(const fs::path& path, int& links) {
  const uid_t self = ::geteuid();
  fs::path prefix;
  for (const auto& part : path) {
    prefix /= part;
    struct stat st {};
    if (::lstat(prefix.c_str(), &st) != 0) {
      if (errno == ENOENT) return std::nullopt;
      return "cannot inspect " + prefix.string() + ": " + std::strerror(errno);
    }
    if (st.st_uid != self && st.st_uid != 0) {
      return prefix.string() + " belongs to uid " + std::to_string(st.st_uid) +
             ", another user, who could replace what is under it" +
             (st.st_uid == 65534 ? " (inside a user namespace, the files of users it does not "
                                   "map, the host's root included, show as uid 65534)"
                                 : "");
    }
    // The walk goes on through where a link leads ("link/.." is the target's parent): that
    // target, the directories down to it and every link on the way (each hop judged as the
    // link it is, not only the end of the chain) must hold too.
    if (S_ISLNK(st.st_mode)) {
      if (++links > kMaxLinks) return prefix.string() + " leads through too many links";
      std::error_code ec;
      const fs::path target = fs::read_symlink(prefix, ec);
      if (ec) return "cannot read the link " + prefix.string() + ": " + ec.message();
      if (auto reason =
              judge(target.is_absolute() ? target : prefix.parent_path() / target, links)) {
        return reason;
      }
    }
    if (S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX) == 0 &&
        ((st.st_mode & S_IWOTH) != 0 ||
         ((st.st_mode & S_IWGRP) != 0 && !ownPrivateGroup(st.st_gid)))) {
      return prefix.string() + " may be written by other users (mode " + modeText(st.st_mode) +
             ") and has no sticky bit, so they could replace what is in it";
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> untrustedPathReason(const fs::path& path) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  if (ec) return "cannot make " + path.string() + " absolute: " + ec.message();
  int links = 0;
  return judge(absolute, links);
}

boost::system::result<bool, std::string> makeTrustedDirectories(const fs::path& dir, mode_t mode,
                                                                std::optional<gid_t> group) {
  if (auto reason = untrustedPathReason(dir)) return *reason;
  std::error_code ec;
  const fs::path absolute = fs::absolute(dir, ec);
  if (ec) return "cannot make " + dir.string() + " absolute: " + ec.message();
  bool created = false;
  fs::path prefix;
  for (const auto& part : absolute) {
    prefix /= part;
    if (part.empty() || part == "." || part == "..") continue;
    if (::mkdir(prefix.c_str(), 0700) != 0) {
      if (errno == EEXIST) continue;  // there before, or made meanwhile: judged below
      return "cannot create " + prefix.string() + ": " + std::strerror(errno);
    }
    created = true;
    // The mode whatever the umask, and the group before anyone of it could need it.
    if (group && ::chown(prefix.c_str(), static_cast<uid_t>(-1), *group) != 0) {
      return "cannot give " + prefix.string() + " to its group: " + std::strerror(errno);
    }
    if (::chmod(prefix.c_str(), mode) != 0) {
      return "cannot set the mode of " + prefix.string() + ": " + std::strerror(errno);
    }
  }
  // Again, now that every component exists: one another user made between the first look and
  // our mkdir is theirs.
  if (auto reason = untrustedPathReason(dir)) return *reason;
  return created;
}

}  // namespace toolhost::protocol
