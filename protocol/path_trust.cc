#include "protocol/path_trust.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace toolhost::protocol {
namespace fs = std::filesystem;

namespace {

std::string modeText(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

// Why the components of the absolute, normal `path` cannot be trusted; stops at the first that
// does not exist.
std::optional<std::string> judge(const fs::path& path) {
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
             ", another user, who could replace what is under it";
    }
    if (S_ISDIR(st.st_mode) && (st.st_mode & (S_IWGRP | S_IWOTH)) != 0 &&
        (st.st_mode & S_ISVTX) == 0) {
      return prefix.string() + " may be written by other users (mode " + modeText(st.st_mode) +
             ") and has no sticky bit, so they could replace what is in it";
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> untrustedPathReason(const fs::path& path) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec).lexically_normal();
  if (ec) return "cannot make " + path.string() + " absolute: " + ec.message();
  if (auto reason = judge(absolute)) return reason;
  // Through the symbolic links (each one already judged above): where they lead must hold too.
  const fs::path resolved = fs::weakly_canonical(absolute, ec);
  if (ec) return "cannot resolve " + absolute.string() + ": " + ec.message();
  if (resolved != absolute) return judge(resolved);
  return std::nullopt;
}

}  // namespace toolhost::protocol
