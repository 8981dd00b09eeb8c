#include "daemon/roles.h"

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>

namespace toolhost::daemon {

namespace {
constexpr std::array kAllRoles{Role::admin, Role::agent, Role::approver, Role::host};

}  // namespace

bool readPeerCredentials(int socket, PeerCredentials& out) {
  ucred credentials{};
  socklen_t length = sizeof credentials;
  if (::getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) return false;
  out.pid = credentials.pid;
  out.uid = credentials.uid;
  out.gid = credentials.gid;
  // The kernel says how much room the list needs when the buffer is too small.
  std::vector<gid_t> groups(64);
  for (;;) {
    socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(socket, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &bytes) == 0) {
      groups.resize(bytes / sizeof(gid_t));
      break;
    }
    // Kernels before 4.13 have no SO_PEERGROUPS: the primary group alone, never /etc/group.
    if (errno == ENOPROTOOPT) {
      groups.clear();
      break;
    }
    if (errno != ERANGE || bytes / sizeof(gid_t) <= groups.size()) return false;
    groups.resize(bytes / sizeof(gid_t));
  }
  out.groups = std::move(groups);
  return true;
}

std::vector<std::string> RoleSet::names() const {
  std::vector<std::string> out;
  for (Role role : kAllRoles) {
    if (has(role)) out.emplace_back(roleName(role));
  }
  return out;
}

std::optional<Role> parseRole(std::string_view name) {
  for (Role role : kAllRoles) {
    if (roleName(role) == name) return role;
  }
  return std::nullopt;
}

std::string_view roleName(Role role) {
  switch (role) {
    case Role::admin: return "admin";
    case Role::agent: return "agent";
    case Role::approver: return "approver";
    case Role::host: return "host";
  }
  return "unknown";
}

AccessRules AccessRules::defaultFor(uid_t daemonUid) {
  AccessRules rules;
  rules.addRule(AccessRule{daemonUid, std::nullopt, RoleSet{Role::admin}});
  return rules;
}

RoleSet AccessRules::rolesFor(const PeerCredentials& peer) const {
  RoleSet roles;
  for (const auto& rule : rules_) {
    bool matches = false;
    if (rule.uid && *rule.uid == peer.uid) matches = true;
    if (!matches && rule.gid) {
      matches = peer.gid == *rule.gid ||
                std::find(peer.groups.begin(), peer.groups.end(), *rule.gid) != peer.groups.end();
    }
    if (matches) roles.add(rule.roles);
  }
  return roles;
}

}  // namespace toolhost::daemon
