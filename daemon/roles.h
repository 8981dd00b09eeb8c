// Roles of a connected peer, from its SO_PEERCRED credentials and the configured access rules.
// Immutable after start-up (a reload swaps the whole AccessRules); any thread may read.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace toolhost::daemon {

enum class Role : std::uint8_t { admin = 1, agent = 2, approver = 4, host = 8 };

// A set of roles. An admin may call every method.
class RoleSet {
 public:
  RoleSet() = default;
  RoleSet(std::initializer_list<Role> roles) {
    for (Role role : roles) add(role);
  }
  void add(Role role) { bits_ |= static_cast<std::uint8_t>(role); }
  void add(RoleSet other) { bits_ |= other.bits_; }
  bool has(Role role) const { return (bits_ & static_cast<std::uint8_t>(role)) != 0; }
  bool empty() const { return bits_ == 0; }
  // True when a caller holding these roles may call a method open to `allowed` (empty: anyone).
  bool permits(RoleSet allowed) const {
    return allowed.empty() || has(Role::admin) || (bits_ & allowed.bits_) != 0;
  }
  std::vector<std::string> names() const;
  bool operator==(const RoleSet&) const = default;

 private:
  std::uint8_t bits_ = 0;
};

std::optional<Role> parseRole(std::string_view name);
std::string_view roleName(Role role);

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  // The peer process's supplementary groups (SO_PEERGROUPS), as it connected: not the groups the
  // system database lists for its user, which a process may have dropped.
  std::vector<gid_t> groups;
};

// Reads the credentials of the peer of a connected Unix socket (SO_PEERCRED, SO_PEERGROUPS).
// False with errno set when the kernel gives none.
bool readPeerCredentials(int socket, PeerCredentials& out);

// One rule: peers with this uid, or whose process is in this group (its primary group or one of
// its supplementary groups), get these roles. A rule names a user or a group, not both.
struct AccessRule {
  std::optional<uid_t> uid;
  std::optional<gid_t> gid;
  RoleSet roles;
};

class AccessRules {
 public:
  // By default only the daemon's own uid may connect, as admin.
  static AccessRules defaultFor(uid_t daemonUid);

  void addRule(AccessRule rule) { rules_.push_back(rule); }
  const std::vector<AccessRule>& rules() const { return rules_; }

  // The roles a peer holds; empty when it may not connect at all.
  RoleSet rolesFor(const PeerCredentials& peer) const;

 private:
  std::vector<AccessRule> rules_;
};

}  // namespace toolhost::daemon
