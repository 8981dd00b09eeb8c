#include "daemon/roles.h"

#include <grp.h>
#include <pwd.h>

#include <algorithm>
#include <array>

namespace toolhost::daemon {

namespace {
constexpr std::array kAllRoles{Role::admin, Role::agent, Role::approver, Role::host};

// Supplementary groups of a uid, looked up through NSS (the peer's own list is not on the socket).
bool uidInGroup(uid_t uid, gid_t primaryGid, gid_t group) {
  if (primaryGid == group) return true;
  std::array<char, 16384> buffer{};
  passwd entry{};
  passwd* found = nullptr;
  if (getpwuid_r(uid, &entry, buffer.data(), buffer.size(), &found) != 0 || found == nullptr) {
    return false;
  }
  int count = 64;
  std::vector<gid_t> groups(count);
  while (getgrouplist(found->pw_name, found->pw_gid, groups.data(), &count) == -1) {
    groups.resize(count);
  }
  groups.resize(count);
  return std::find(groups.begin(), groups.end(), group) != groups.end();
}
}  // namespace

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
    if (!matches && rule.gid && uidInGroup(peer.uid, peer.gid, *rule.gid)) matches = true;
    if (matches) roles.add(rule.roles);
  }
  return roles;
}

}  // namespace toolhost::daemon
